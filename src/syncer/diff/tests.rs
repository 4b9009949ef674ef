use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;

use super::*;
use crate::syncer::admission::Level;
use crate::syncer::fixtures::{nginx, with};
use crate::syncer::names::tenancy::{self, TenantObject};
use crate::syncer::names::{ControlPlaneRef, NameLimit};
use crate::syncer::pod::{ApiServerAddress, Target, translate};

fn control_plane() -> ControlPlaneRef {
    ControlPlaneRef::new("default", "t1")
}

fn desired(tenant: &Pod) -> Pod {
    let target = Target {
        control_plane: control_plane(),
        apiserver: ApiServerAddress {
            host: "10.96.0.10".into(),
            port: 443,
        },
        level: Level::Baseline,
        dns: None,
    };
    translate(tenant, &target, &[]).expect("translates").pod
}

/// The desired pod as the super cluster stores and runs it: identity, defaults,
/// scheduling, additions of its admission, status.
fn as_the_super_cluster_fills(pod: &Pod) -> Pod {
    let filled = [
        ("/metadata/uid", json!("super-uid")),
        ("/metadata/resourceVersion", json!("99")),
        ("/metadata/creationTimestamp", json!("2026-01-02T03:04:06Z")),
        (
            "/metadata/managedFields",
            json!([{"manager": "capn", "operation": "Apply", "apiVersion": "v1"}]),
        ),
        (
            "/metadata/annotations/cni.projectcalico.org~1podIP",
            json!("10.244.1.7/32"),
        ),
        ("/metadata/labels/policy.example.com~1scanned", json!("true")),
        ("/spec/nodeName", json!("node-1")),
        ("/spec/schedulerName", json!("default-scheduler")),
        ("/spec/priority", json!(0)),
        ("/spec/enableServiceLinks", json!(true)),
        (
            "/spec/tolerations/2",
            json!({"key": "example.com/pool", "operator": "Exists"}),
        ),
        (
            "/spec/containers/0/resources",
            json!({"requests": {"cpu": "100m", "memory": "64Mi"}}),
        ),
        ("/status", json!({"phase": "Running", "podIP": "10.244.1.7"})),
    ];
    filled
        .into_iter()
        .fold(pod.clone(), |pod, (pointer, value)| with(&pod, pointer, value))
}

fn fields(drift: &[Drift]) -> Vec<(&str, Repair)> {
    drift.iter().map(|d| (d.field.as_str(), d.repair)).collect()
}

#[test]
fn a_live_pod_the_super_cluster_filled_in_has_not_drifted() {
    let desired = desired(&nginx());
    assert_eq!(pod_drift(&desired, &as_the_super_cluster_fills(&desired)), vec![]);
}

#[test]
fn a_new_image_or_deadline_of_the_tenant_is_drift_to_update() {
    let live = as_the_super_cluster_fills(&desired(&nginx()));
    let tenant = with(&nginx(), "/spec/containers/0/image", json!("nginx:1.28"));
    let tenant = with(&tenant, "/spec/activeDeadlineSeconds", json!(600));
    assert_eq!(
        fields(&pod_drift(&desired(&tenant), &live)),
        vec![
            ("spec.containers[0].image", Repair::Update),
            ("spec.activeDeadlineSeconds", Repair::Update)
        ]
    );
}

#[test]
fn an_added_toleration_and_a_removed_gate_are_drift_to_update() {
    let gated = with(
        &nginx(),
        "/spec/schedulingGates",
        json!([{"name": "example.com/quota"}]),
    );
    let live = as_the_super_cluster_fills(&desired(&gated));
    assert_eq!(
        pod_drift(&desired(&gated), &live),
        vec![],
        "the gate is there as wanted"
    );
    let ungated = with(
        &nginx(),
        "/spec/tolerations/2",
        json!({"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"}),
    );
    assert_eq!(
        fields(&pod_drift(&desired(&ungated), &live)),
        vec![
            ("spec.tolerations[2]", Repair::Update),
            ("spec.schedulingGates", Repair::Update)
        ]
    );
}

#[test]
fn changed_resources_are_drift_to_resize() {
    let sized = with(
        &nginx(),
        "/spec/containers/0/resources",
        json!({"requests": {"cpu": "100m"}, "limits": {"memory": "128Mi"}}),
    );
    let live = as_the_super_cluster_fills(&desired(&sized));
    let live = with(
        &live,
        "/spec/containers/0/resources",
        json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}}),
    );
    assert_eq!(
        pod_drift(&desired(&sized), &live),
        vec![],
        "a request the super cluster added is not the syncer's"
    );
    let resized = with(
        &nginx(),
        "/spec/containers/0/resources",
        json!({"requests": {"cpu": "200m"}, "limits": {"memory": "128Mi"}}),
    );
    assert_eq!(
        fields(&pod_drift(&desired(&resized), &live)),
        vec![("spec.containers[0].resources", Repair::Resize)]
    );
}

#[test]
fn a_label_the_tenant_removed_is_stale_and_one_the_super_cluster_added_is_not() {
    let live = as_the_super_cluster_fills(&desired(&nginx()));
    let unlabelled = with(&nginx(), "/metadata/labels", json!({}));
    let want = desired(&unlabelled);
    assert_eq!(
        stale_keys(&want.metadata, &live.metadata),
        StaleKeys {
            labels: vec!["app".into()],
            annotations: vec![],
        }
    );
    assert_eq!(
        fields(&pod_drift(&want, &live)),
        vec![
            ("metadata.labels['app']", Repair::Update),
            ("metadata.annotations['tenancy.x-k8s.io/label-keys']", Repair::Update),
        ]
    );
    let relabelled = with(&nginx(), "/metadata/labels/app", json!("web"));
    assert_eq!(
        fields(&pod_drift(&desired(&relabelled), &live)),
        vec![("metadata.labels['app']", Repair::Update)]
    );
}

fn tenant(name: &str, uid: &str) -> TenantObject {
    TenantObject {
        namespace: "web".into(),
        name: name.into(),
        uid: uid.into(),
    }
}

/// The metadata of the super copy of `object`.
fn copy(object: &TenantObject) -> ObjectMeta {
    let meta = ObjectMeta {
        namespace: Some(object.namespace.clone()),
        name: Some(object.name.clone()),
        uid: Some(object.uid.clone()),
        ..ObjectMeta::default()
    };
    tenancy::super_metadata(&control_plane(), NameLimit::Subdomain, &meta).expect("metadata")
}

#[test]
fn ownership_tells_the_copy_an_earlier_copy_and_a_foreign_object_apart() {
    let cp = control_plane();
    let current = tenant("nginx", "uid-2");
    assert_eq!(
        ownership(&cp, NameLimit::Subdomain, &current, &copy(&current)),
        Ownership::Ours
    );
    assert_eq!(
        ownership(&cp, NameLimit::Subdomain, &current, &copy(&tenant("nginx", "uid-1"))),
        Ownership::Stale
    );
    let mut other = copy(&tenant("other", "uid-3"));
    other.name = copy(&current).name;
    assert_eq!(
        ownership(&cp, NameLimit::Subdomain, &current, &other),
        Ownership::Foreign,
        "another tenant object under this name"
    );
    let unannotated = ObjectMeta {
        name: copy(&current).name,
        ..ObjectMeta::default()
    };
    assert_eq!(
        ownership(&cp, NameLimit::Subdomain, &current, &unannotated),
        Ownership::Foreign
    );
    let elsewhere = ControlPlaneRef::new("default", "t2");
    assert_eq!(
        ownership(&elsewhere, NameLimit::Subdomain, &current, &copy(&current)),
        Ownership::Foreign
    );
}

#[test]
fn orphans_are_copies_whose_tenant_object_is_gone_or_was_recreated() {
    let cp = control_plane();
    let kept = tenant("kept", "uid-1");
    let deleted = tenant("deleted", "uid-2");
    let recreated_before = tenant("recreated", "uid-3");
    let mut token_secret = copy(&kept);
    token_secret.name = Some(cp.token_secret_name("web", "kept", "uid-1"));
    let mut elsewhere = copy(&deleted);
    elsewhere
        .annotations
        .as_mut()
        .unwrap()
        .insert(tenancy::CLUSTER.into(), "default/t2".into());
    let super_objects = vec![
        copy(&kept),
        copy(&deleted),
        copy(&recreated_before),
        token_secret,
        elsewhere,
        ObjectMeta {
            name: Some("made-by-hand".into()),
            ..ObjectMeta::default()
        },
    ];
    let tenant_objects = BTreeSet::from([kept, tenant("recreated", "uid-4")]);
    let found: Vec<Option<&str>> = orphans(&cp, NameLimit::Subdomain, &super_objects, &tenant_objects)
        .into_iter()
        .map(|m| m.name.as_deref())
        .collect();
    assert_eq!(found, vec![Some("deleted-x-web-x-t1"), Some("recreated-x-web-x-t1")]);
}
