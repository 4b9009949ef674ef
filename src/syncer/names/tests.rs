use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use sha2::{Digest, Sha256};

use super::tenancy::{self, TenantObject};
use super::*;

/// The first 16 hex digits of the SHA-256 of `identity`, computed here from the documented
/// rule rather than through the code under test.
fn sha_prefix(identity: &str) -> String {
    Sha256::digest(identity.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>()[..16]
        .to_string()
}

/// Every DNS-1123 label of 1..=`max` characters over `a`, `x` and `-`: the alphabet of the
/// separator, so every way of hiding `-x-` in a name or namespace is among them.
fn adversarial_labels(max: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut frontier = vec![String::new()];
    for _ in 0..max {
        let mut next = Vec::new();
        for prefix in &frontier {
            for c in ['a', 'x', '-'] {
                let s = format!("{prefix}{c}");
                if is_dns_label(&s) {
                    out.push(s.clone());
                }
                next.push(s);
            }
        }
        frontier = next;
    }
    out
}

#[test]
fn workload_namespace_is_readable_when_short_and_unambiguous() {
    let cp = ControlPlaneRef::new("default", "t1");
    assert_eq!(cp.workload_namespace(), "default-t1-workloads");
}

#[test]
fn workload_namespaces_of_control_planes_that_join_alike_differ() {
    let a = ControlPlaneRef::new("team-a", "prod").workload_namespace();
    let b = ControlPlaneRef::new("team", "a-prod").workload_namespace();
    assert_ne!(a, b);
    assert_eq!(b, "team-a-prod-workloads", "a namespace without '-' stays readable");
    assert_eq!(
        a,
        format!("team-a-prod-workloads-{}", sha_prefix("namespace:team-a/prod"))
    );
}

#[test]
fn long_workload_namespace_is_cut_and_hashed_into_a_dns_label() {
    let cp = ControlPlaneRef::new("tenants", "c".repeat(60));
    let ns = cp.workload_namespace();
    assert_eq!(ns.len(), 63);
    assert!(is_dns_label(&ns), "{ns}");
    assert!(ns.ends_with(&format!(
        "-{}",
        sha_prefix(&format!("namespace:tenants/{}", "c".repeat(60)))
    )));
    assert!(ns.starts_with("tenants-ccc"));
}

#[test]
fn workload_namespace_of_a_dotted_control_plane_name_has_no_dot() {
    let ns = ControlPlaneRef::new("default", "a.b").workload_namespace();
    assert!(is_dns_label(&ns), "{ns}");
}

#[test]
fn object_name_is_readable_when_short_and_unambiguous() {
    let cp = ControlPlaneRef::new("default", "t1");
    assert_eq!(cp.super_name(NameLimit::Subdomain, "web", "nginx"), "nginx-x-web-x-t1");
}

#[test]
fn object_names_that_join_alike_differ() {
    let cp = ControlPlaneRef::new("default", "t1");
    let a = cp.super_name(NameLimit::Subdomain, "c", "a-x-b");
    let b = cp.super_name(NameLimit::Subdomain, "b-x-c", "a");
    assert_ne!(a, b);
    assert_eq!(a, "a-x-b-x-c-x-t1");
    assert_eq!(b, format!("a-x-b-x-c-x-t1-{}", sha_prefix("object:default/t1/b-x-c/a")));
}

#[test]
fn object_names_of_adversarial_pairs_never_collide() {
    let labels = adversarial_labels(5);
    for cp_name in ["t1", "x", "t-x-1"] {
        let cp = ControlPlaneRef::new("default", cp_name);
        let mut seen: BTreeMap<String, (String, String)> = BTreeMap::new();
        for ns in &labels {
            for name in &labels {
                let mapped = cp.super_name(NameLimit::Label, ns, name);
                assert!(is_dns_label(&mapped), "{mapped}");
                if let Some(earlier) = seen.insert(mapped.clone(), (ns.clone(), name.clone())) {
                    panic!("{mapped}: {earlier:?} and ({ns}, {name}) under {cp_name}");
                }
            }
        }
        assert!(seen.len() > 5_000, "the set is large: {}", seen.len());
    }
}

#[test]
fn a_readable_name_never_has_the_hashed_shape() {
    // A control plane name that ends like a hash: every readable name would too, so every
    // name is hashed and none can equal another object's hashed name.
    let cp = ControlPlaneRef::new("default", "c-0123456789abcdef");
    let mut seen = BTreeSet::new();
    for ns in adversarial_labels(4) {
        for name in adversarial_labels(4) {
            let mapped = cp.super_name(NameLimit::Subdomain, &ns, &name);
            let readable = format!("{name}-x-{ns}-x-c-0123456789abcdef");
            assert_ne!(mapped, readable);
            assert!(seen.insert(mapped));
        }
    }
}

#[test]
fn long_object_names_fit_their_kind() {
    let cp = ControlPlaneRef::new("default", "t1");
    let name = format!("{}.{}", "a".repeat(200), "b".repeat(52));
    assert_eq!(name.len(), 253);
    let pod = cp.super_name(NameLimit::Subdomain, "web", &name);
    assert_eq!(pod.len(), 253);
    assert!(pod.ends_with(&sha_prefix(&format!("object:default/t1/web/{name}"))));
    let service = cp.super_name(NameLimit::Label, "web", &"s".repeat(63));
    assert_eq!(service.len(), 63);
    assert!(is_dns_label(&service), "{service}");
}

#[test]
fn a_cut_never_leaves_a_dash_or_dot_before_the_hash() {
    let cp = ControlPlaneRef::new("default", "t1");
    // 46 characters of room: the cut falls right after "-" or "." here.
    for name in [format!("{}-b", "a".repeat(45)), format!("{}.b", "a".repeat(235))] {
        let limit = if name.contains('.') {
            NameLimit::Subdomain
        } else {
            NameLimit::Label
        };
        let mapped = cp.super_name(limit, "web", &name);
        let head = &mapped[..mapped.len() - 17];
        assert!(!head.ends_with(['-', '.']), "{mapped}");
    }
}

#[test]
fn token_secret_name_is_never_a_synced_secret_name() {
    let cp = ControlPlaneRef::new("default", "t1");
    let token = cp.token_secret_name("web", "nginx", "uid-1");
    for secret in ["nginx", "nginx-token", "nginx-x-web-x-t1-token"] {
        assert_ne!(token, cp.super_name(NameLimit::Subdomain, "web", secret));
    }
    assert_ne!(
        token,
        cp.token_secret_name("web", "nginx", "uid-2"),
        "a re-created pod gets a new Secret"
    );
    assert!(token.starts_with("nginx-x-web-x-t1-token-"));
}

fn tenant_meta() -> ObjectMeta {
    ObjectMeta {
        name: Some("nginx".into()),
        namespace: Some("web".into()),
        uid: Some("6f1c1b7e-5d4a-4f39-9d8e-0c2b1a9f7e61".into()),
        resource_version: Some("42".into()),
        generate_name: Some("nginx-".into()),
        finalizers: Some(vec!["example.com/keep".into()]),
        owner_references: Some(vec![OwnerReference {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            name: "nginx-abc".into(),
            uid: "rs-uid".into(),
            ..OwnerReference::default()
        }]),
        labels: Some(BTreeMap::from([
            ("app".into(), "nginx".into()),
            (tenancy::NAMESPACE.into(), "forged".into()),
        ])),
        annotations: Some(BTreeMap::from([("note".into(), "kept".into())])),
        ..ObjectMeta::default()
    }
}

#[test]
fn super_metadata_keeps_only_name_namespace_labels_and_annotations() {
    let cp = ControlPlaneRef::new("default", "t1");
    let meta = tenancy::super_metadata(&cp, NameLimit::Subdomain, &tenant_meta()).unwrap();
    assert_eq!(meta.name.as_deref(), Some("nginx-x-web-x-t1"));
    assert_eq!(meta.namespace.as_deref(), Some("default-t1-workloads"));
    assert_eq!(
        (&meta.uid, &meta.resource_version, &meta.generate_name),
        (&None, &None, &None)
    );
    assert!(meta.owner_references.is_none() && meta.finalizers.is_none() && meta.managed_fields.is_none());
    let labels = meta.labels.unwrap();
    assert_eq!(labels["app"], "nginx");
    assert_eq!(
        labels[tenancy::NAMESPACE],
        "web",
        "the tenant cannot forge a tenancy label"
    );
    assert_eq!(labels[tenancy::UID], "6f1c1b7e-5d4a-4f39-9d8e-0c2b1a9f7e61");
    let annotations = meta.annotations.unwrap();
    assert_eq!(annotations[tenancy::CLUSTER], "default/t1");
    assert_eq!(annotations["note"], "kept");
    assert_eq!(annotations[tenancy::LABEL_KEYS], "app");
    assert_eq!(annotations[tenancy::ANNOTATION_KEYS], "note");
}

#[test]
fn a_name_that_is_no_label_value_is_only_an_annotation() {
    let cp = ControlPlaneRef::new("default", "t1");
    let mut tenant = tenant_meta();
    tenant.name = Some("n".repeat(64));
    let meta = tenancy::super_metadata(&cp, NameLimit::Subdomain, &tenant).unwrap();
    assert!(!meta.labels.unwrap().contains_key(tenancy::NAME));
    assert_eq!(meta.annotations.unwrap()[tenancy::NAME], "n".repeat(64));
}

#[test]
fn the_tenant_object_is_read_back_from_the_super_object() {
    let cp = ControlPlaneRef::new("default", "t1");
    let tenant = tenant_meta();
    let meta = tenancy::super_metadata(&cp, NameLimit::Subdomain, &tenant).unwrap();
    let expected = TenantObject {
        namespace: "web".into(),
        name: "nginx".into(),
        uid: "6f1c1b7e-5d4a-4f39-9d8e-0c2b1a9f7e61".into(),
    };
    assert_eq!(TenantObject::of_super(&cp, &meta), Some(expected));
    let other = ControlPlaneRef::new("default", "t2");
    assert_eq!(
        TenantObject::of_super(&other, &meta),
        None,
        "another control plane's object"
    );
    assert_eq!(TenantObject::of_super(&cp, &ObjectMeta::default()), None);
}

#[test]
fn a_tenant_object_without_uid_is_refused() {
    let cp = ControlPlaneRef::new("default", "t1");
    let mut tenant = tenant_meta();
    tenant.uid = None;
    let err = tenancy::super_metadata(&cp, NameLimit::Subdomain, &tenant).unwrap_err();
    assert_eq!(err.field, "metadata.uid");
}

#[test]
fn label_values_and_dns_labels_follow_the_kubernetes_syntax() {
    for ok in ["", "a", "a.b_c-d", &"a".repeat(63)] {
        assert!(is_label_value(ok), "{ok}");
    }
    for bad in ["-a", "a-", "a/b", &"a".repeat(64)] {
        assert!(!is_label_value(bad), "{bad}");
    }
    for ok in ["a", "a-1", &"a".repeat(63)] {
        assert!(is_dns_label(ok), "{ok}");
    }
    for bad in ["", "A", "a.b", "-a", "a-", &"a".repeat(64)] {
        assert!(!is_dns_label(bad), "{bad}");
    }
}
