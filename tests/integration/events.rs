//! capn's Event recorder against the real API server: a repeat is patched as a series, and
//! a series whose Event is gone starts over with a create.

use capn::controllers::shared::events::{Occurrence, Recorder};
use capn_testkit::{cluster, test_namespace};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

#[tokio::test]
async fn a_repeat_about_a_changed_object_is_a_series_and_a_deleted_series_starts_over() {
    let client = cluster().client();
    let ns = test_namespace(&client).await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let mut map = ConfigMap::default();
    map.metadata.name = Some("subject".into());
    let first = maps.create(&PostParams::default(), &map).await.unwrap();
    let recorder = Recorder::new(client.clone(), "capn-test", None);
    let occurrence = |object: &ConfigMap, note: &str| Occurrence {
        warning: true,
        reason: "Failed",
        action: "Reconcile",
        note: note.into(),
        regarding: object.object_ref(&()),
        related: None,
    };
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let list = || async { events.list(&ListParams::default()).await.unwrap().items };

    recorder.publish(&occurrence(&first, "first")).await.unwrap();
    // The object changes (a new resourceVersion) before the repeat.
    let changed = maps
        .patch(
            "subject",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "v"}})),
        )
        .await
        .unwrap();
    assert_ne!(first.resource_version(), changed.resource_version());
    recorder.publish(&occurrence(&changed, "second")).await.unwrap();
    let after_repeat = list().await;
    assert_eq!(
        after_repeat.len(),
        1,
        "the repeat patched the first Event: {after_repeat:?}"
    );
    let event = &after_repeat[0];
    assert_eq!(event.series.as_ref().map(|s| s.count), Some(2));
    assert_eq!(event.note.as_deref(), Some("first"), "a series keeps its first note");
    assert_eq!(event.reporting_controller.as_deref(), Some("capn-test"));
    assert_eq!(event.type_.as_deref(), Some("Warning"));

    events
        .delete(&event.name_any(), &DeleteParams::default())
        .await
        .unwrap();
    recorder.publish(&occurrence(&changed, "third")).await.unwrap();
    let after_delete = list().await;
    assert_eq!(after_delete.len(), 1, "{after_delete:?}");
    assert_ne!(after_delete[0].name_any(), event.name_any(), "a new Event");
    assert_eq!(after_delete[0].series, None);
    assert_eq!(after_delete[0].note.as_deref(), Some("third"));
}
