//! The way up for Events (docs/design.md §11): what the super cluster reports about a super
//! pod (the scheduler's `Scheduled` and `FailedScheduling`, a kubelet's `Pulled`,
//! `FailedMount`, `BackOff`, ...) is reported in the tenant about the tenant pod, so that
//! `kubectl describe pod` in the tenant tells why a pod waits. The copy names the tenant pod
//! (its namespace, name and uid) instead of the super pod, in the note too, and keeps the
//! reason, type, action, note and reporting controller. Its name is derived from the super
//! Event's uid, so a copy is made once: a repeat (a restart of the worker replays the
//! workload namespace's Events) is refused as existing and costs one request.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc::UnboundedReceiver;

use super::scope::Tenant;
use crate::syncer::names::tenancy::TenantObject;

/// The tenant copy of `event`, about the tenant pod `pod` whose super copy is `super_pod`
/// in the workload namespace `workloads`; `None` for an Event about anything else.
pub(super) fn tenant_event(event: &Event, workloads: &str, super_pod: &str, pod: &TenantObject) -> Option<Event> {
    let regarding = event.regarding.as_ref()?;
    if regarding.kind.as_deref() != Some("Pod") || regarding.name.as_deref() != Some(super_pod) {
        return None;
    }
    let uid = event.metadata.uid.as_deref()?;
    let rename = |text: &str| {
        text.replace(
            &format!("{workloads}/{super_pod}"),
            &format!("{}/{}", pod.namespace, pod.name),
        )
        .replace(super_pod, &pod.name)
    };
    Some(Event {
        metadata: ObjectMeta {
            name: Some(format!("{}.{uid}", pod.name)),
            namespace: Some(pod.namespace.clone()),
            ..ObjectMeta::default()
        },
        regarding: Some(ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Pod".to_owned()),
            namespace: Some(pod.namespace.clone()),
            name: Some(pod.name.clone()),
            uid: Some(pod.uid.clone()),
            field_path: regarding.field_path.clone(),
            ..ObjectReference::default()
        }),
        note: event.note.as_deref().map(rename),
        event_time: event.event_time.clone().or_else(|| {
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                k8s_openapi::jiff::Timestamp::now(),
            ))
        }),
        reason: event.reason.clone(),
        type_: event.type_.clone(),
        action: event.action.clone().or_else(|| Some("Sync".to_owned())),
        reporting_controller: event
            .reporting_controller
            .clone()
            .or_else(|| Some("capn-syncer".to_owned())),
        reporting_instance: event
            .reporting_instance
            .clone()
            .or_else(|| Some("capn-syncer".to_owned())),
        ..Event::default()
    })
}

/// Copies the workload namespace's Events about super pods (as `events` receives them from
/// the shared Events watch) into the tenant until dropped. A failed copy is logged and
/// dropped (an Event is a report, not state).
pub(super) async fn run(tenant: &Tenant, mut events: UnboundedReceiver<Event>) {
    while let Some(event) = events.recv().await {
        let Some(super_pod) = event.regarding.as_ref().and_then(|r| r.name.clone()) else {
            continue;
        };
        let Some(live) = tenant
            .super_pods
            .get(&ObjectRef::new(&super_pod).within(&tenant.namespace))
        else {
            continue;
        };
        let Some(pod) = TenantObject::of_super(tenant.control_plane(), &live.metadata) else {
            continue;
        };
        let Some(copy) = tenant_event(&event, &tenant.namespace, &super_pod, &pod) else {
            continue;
        };
        match Api::<Event>::namespaced(tenant.tenant_client.clone(), &pod.namespace)
            .create(&PostParams::default(), &copy)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(error) => tracing::info!(%error, pod = %pod.name, "could not copy an Event into the tenant"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_super_pods_event_is_told_about_the_tenant_pod() {
        let event: Event = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-x-shop-x-demo.1", "namespace": "ns-demo-workloads", "uid": "e-1"},
            "regarding": {"kind": "Pod", "name": "web-x-shop-x-demo", "namespace": "ns-demo-workloads", "uid": "s-1"},
            "reason": "Scheduled", "type": "Normal", "action": "Binding", "reportingController": "default-scheduler",
            "note": "Successfully assigned ns-demo-workloads/web-x-shop-x-demo to node-1"
        }))
        .unwrap();
        let pod = TenantObject {
            namespace: "shop".into(),
            name: "web".into(),
            uid: "t-1".into(),
        };
        let copy = tenant_event(&event, "ns-demo-workloads", "web-x-shop-x-demo", &pod).unwrap();
        assert_eq!(copy.metadata.name.as_deref(), Some("web.e-1"));
        assert_eq!(copy.metadata.namespace.as_deref(), Some("shop"));
        let regarding = copy.regarding.unwrap();
        assert_eq!(
            (regarding.name.as_deref(), regarding.uid.as_deref()),
            (Some("web"), Some("t-1"))
        );
        assert_eq!(copy.note.as_deref(), Some("Successfully assigned shop/web to node-1"));
        assert_eq!(copy.reason.as_deref(), Some("Scheduled"));
        assert_eq!(copy.reporting_controller.as_deref(), Some("default-scheduler"));
        // An Event about another object is not the pod's.
        assert!(tenant_event(&event, "ns-demo-workloads", "other-x-shop-x-demo", &pod).is_none());
    }
}
