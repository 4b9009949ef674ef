use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;

use super::{Memory, Occurrence, PRUNE_EVERY, SERIES_WINDOW, Sent, Write, key};

fn occurrence(resource_version: &str, uid: &str) -> Occurrence<'static> {
    Occurrence {
        warning: false,
        reason: "AddedLearner",
        action: "MemberAdd",
        note: format!("at {resource_version}"),
        regarding: ObjectReference {
            api_version: Some("controlplane.cluster.x-k8s.io/v1beta1".into()),
            kind: Some("NestedEtcd".into()),
            namespace: Some("tenant-a".into()),
            name: Some("demo-etcd".into()),
            uid: Some(uid.into()),
            resource_version: Some(resource_version.into()),
            ..ObjectReference::default()
        },
        related: None,
    }
}

fn pod(name: &str) -> Option<ObjectReference> {
    Some(ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some("tenant-a".into()),
        name: Some(name.into()),
        ..ObjectReference::default()
    })
}

#[test]
fn the_key_ignores_the_resource_version_and_the_note_but_not_the_object_or_the_related_one() {
    let first = occurrence("100", "u1");
    assert_eq!(key("capn", &first), key("capn", &occurrence("205", "u1")));
    assert_ne!(
        key("capn", &first),
        key("capn", &occurrence("100", "u2")),
        "another object of the name"
    );
    assert_ne!(key("capn", &first), key("other", &first), "another controller");
    let warning = Occurrence {
        warning: true,
        ..first.clone()
    };
    assert_ne!(key("capn", &first), key("capn", &warning));
    let reason = Occurrence {
        reason: "PromotedLearner",
        ..first.clone()
    };
    assert_ne!(key("capn", &first), key("capn", &reason));
    let on_0 = Occurrence {
        related: pod("demo-etcd-0"),
        ..first.clone()
    };
    let on_1 = Occurrence {
        related: pod("demo-etcd-1"),
        ..first.clone()
    };
    assert_ne!(key("capn", &on_0), key("capn", &on_1));
    assert_ne!(key("capn", &first), key("capn", &on_0));
}

#[test]
fn a_repeat_within_the_window_counts_on_the_series_and_one_after_it_is_created_anew() {
    let mut memory = Memory::default();
    let t0 = Instant::now();
    assert_eq!(memory.decide(7, t0), Write::Create);
    memory.sent.insert(
        7,
        Sent {
            name: "demo.1a".into(),
            count: 1,
            last: t0,
        },
    );
    let repeat = |count| Write::Series {
        name: "demo.1a".into(),
        count,
    };
    assert_eq!(memory.decide(7, t0 + Duration::from_secs(10)), repeat(2));
    // The window runs from the last occurrence, not the first.
    assert_eq!(memory.decide(7, t0 + SERIES_WINDOW), repeat(3));
    assert_eq!(memory.decide(8, t0 + SERIES_WINDOW), Write::Create, "another key");
    let later = t0 + SERIES_WINDOW + SERIES_WINDOW;
    assert_eq!(memory.decide(7, later), Write::Create);
}

#[test]
fn expired_series_are_forgotten_at_most_once_a_minute() {
    let mut memory = Memory::default();
    let t0 = Instant::now();
    memory.sent.insert(
        1,
        Sent {
            name: "a.1".into(),
            count: 1,
            last: t0,
        },
    );
    memory.sent.insert(
        2,
        Sent {
            name: "b.2".into(),
            count: 1,
            last: t0 + SERIES_WINDOW / 2,
        },
    );
    memory.decide(3, t0);
    assert_eq!(memory.sent.len(), 2);
    let expired = t0 + SERIES_WINDOW;
    memory.decide(3, expired);
    assert_eq!(memory.sent.len(), 1, "the first expired, the second is kept");
    memory.sent.insert(
        4,
        Sent {
            name: "c.4".into(),
            count: 1,
            last: t0,
        },
    );
    memory.decide(3, expired + PRUNE_EVERY / 2);
    assert_eq!(memory.sent.len(), 2, "no scan within a minute of the last");
    memory.decide(3, expired + PRUNE_EVERY);
    assert_eq!(memory.sent.len(), 1);
}
