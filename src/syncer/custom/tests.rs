use serde_json::json;

use super::*;
use crate::syncer::names::tenancy;

fn crd(scope: &str, public: bool, opt_in: Option<&str>) -> CustomResourceDefinition {
    let mut labels = serde_json::Map::new();
    if public {
        labels.insert(PUBLIC_LABEL.into(), json!("true"));
    }
    let annotations = opt_in.map_or_else(|| json!({}), |value| json!({SYNC_INSTANCES: value}));
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com", "labels": labels, "annotations": annotations},
        "spec": {"group": "example.com", "scope": scope,
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {"name": "v1alpha1", "served": true, "storage": false,
                 "schema": {"openAPIV3Schema": {"type": "object"}}},
                {"name": "v1", "served": true, "storage": true,
                 "schema": {"openAPIV3Schema": {"type": "object"}},
                 "subresources": {"status": {}}}]}
    }))
    .unwrap()
}

fn kind() -> SyncedKind {
    synced_kind(&crd("Namespaced", true, Some("true"))).unwrap()
}

fn widget(status: Option<serde_json::Value>) -> DynamicObject {
    let mut object = json!({
        "apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "w", "namespace": "team", "uid": "u-1", "generation": 3,
            "resourceVersion": "42", "labels": {"app": "a"}},
        "spec": {"size": 3, "colour": "blue"}
    });
    if let Some(status) = status {
        object["status"] = status;
    }
    serde_json::from_value(object).unwrap()
}

fn control_plane() -> ControlPlaneRef {
    ControlPlaneRef::new("tenants", "demo")
}

#[test]
fn a_public_namespaced_crd_that_opts_in_syncs_its_storage_version() {
    let kind = kind();
    assert_eq!(kind.crd, "widgets.example.com");
    assert_eq!(kind.resource.api_version, "example.com/v1");
    assert_eq!(kind.resource.plural, "widgets");
    assert_eq!(kind.resource.kind, "Widget");
    assert!(kind.status_subresource);
}

#[test]
fn crds_that_are_cluster_scoped_private_or_not_opted_in_do_not_sync() {
    assert_eq!(synced_kind(&crd("Cluster", true, Some("true"))), None);
    assert_eq!(synced_kind(&crd("Namespaced", false, Some("true"))), None);
    assert_eq!(synced_kind(&crd("Namespaced", true, None)), None);
    assert_eq!(synced_kind(&crd("Namespaced", true, Some("false"))), None);
}

#[test]
fn a_control_plane_may_narrow_the_kinds() {
    let kind = kind();
    assert!(allowed(&kind, None));
    assert!(allowed(&kind, Some(&["widgets.example.com".to_owned()])));
    assert!(!allowed(&kind, Some(&["gadgets.example.com".to_owned()])));
    assert!(!allowed(&kind, Some(&[])));
}

#[test]
fn a_copy_is_mapped_carries_the_generation_and_leaves_status_behind() {
    let syncer = CustomResources(kind());
    let copy = syncer
        .copy(&control_plane(), &widget(Some(json!({"phase": "Ready"}))))
        .unwrap()
        .unwrap();
    assert_eq!(
        copy.metadata.name.as_deref(),
        Some(control_plane().super_name(NameLimit::Subdomain, "team", "w").as_str())
    );
    assert_eq!(copy.metadata.namespace, Some(control_plane().workload_namespace()));
    let annotations = copy.metadata.annotations.as_ref().unwrap();
    assert_eq!(annotations[GENERATION], "3");
    assert_eq!(annotations[tenancy::UID], "u-1");
    assert_eq!(copy.metadata.labels.as_ref().unwrap()["app"], "a");
    assert_eq!(copy.metadata.uid, None);
    assert_eq!(copy.metadata.resource_version, None);
    assert_eq!(copy.data, json!({"spec": {"size": 3, "colour": "blue"}}));
    assert_eq!(copy.types.unwrap().api_version, "example.com/v1");
}

#[test]
fn what_the_super_cluster_adds_is_current_what_it_changes_is_not() {
    let syncer = CustomResources(kind());
    let desired = syncer.copy(&control_plane(), &widget(None)).unwrap().unwrap();
    let mut live = desired.clone();
    live.data["spec"]["defaulted"] = json!(true);
    live.data["status"] = json!({"phase": "Ready"});
    live.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("super.example/admission".into(), "x".into());
    assert!(syncer.is_current(&desired, &live));
    let mut changed = live.clone();
    changed.data["spec"]["size"] = json!(30);
    assert!(!syncer.is_current(&desired, &changed));
    let mut relabelled = live;
    relabelled
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("app".into(), "b".into());
    assert!(!syncer.is_current(&desired, &relabelled));
}

#[test]
fn a_tenant_change_of_any_field_makes_the_copy_stale_through_its_generation() {
    let syncer = CustomResources(kind());
    let before = syncer.copy(&control_plane(), &widget(None)).unwrap().unwrap();
    let mut edited = widget(None);
    edited.data["spec"].as_object_mut().unwrap().remove("colour");
    edited.metadata.generation = Some(4);
    let after = syncer.copy(&control_plane(), &edited).unwrap().unwrap();
    // The live copy still has the removed field, so only the generation tells.
    assert!(!syncer.is_current(&after, &before));
}

#[test]
fn status_comes_up_only_when_it_differs() {
    let syncer = CustomResources(kind());
    let copy = |status| {
        let mut copy = syncer.copy(&control_plane(), &widget(None)).unwrap().unwrap();
        if let Some(status) = status {
            copy.data["status"] = status;
        }
        copy
    };
    let ready = json!({"phase": "Ready"});
    let up = syncer.status_up(&widget(None), &copy(Some(ready.clone()))).unwrap();
    assert_eq!(up.data["status"], ready);
    assert_eq!(up.data["spec"], widget(None).data["spec"]);
    assert_eq!(up.metadata.resource_version.as_deref(), Some("42"));
    assert_eq!(syncer.status_up(&widget(Some(ready.clone())), &copy(Some(ready))), None);
    // A status the tenant wrote while the copy has none is taken away.
    let cleared = syncer
        .status_up(&widget(Some(json!({"phase": "Forged"}))), &copy(None))
        .unwrap();
    assert_eq!(cleared.data.get("status"), None);
}

#[test]
fn a_tenant_object_without_identity_is_refused() {
    let mut object = widget(None);
    object.metadata.uid = None;
    let error = CustomResources(kind()).copy(&control_plane(), &object).unwrap_err();
    assert_eq!(error.field, "metadata.uid");
}
