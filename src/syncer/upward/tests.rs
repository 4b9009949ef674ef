use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::*;
use crate::syncer::fixtures::{nginx, with};

fn now() -> Timestamp {
    "2026-02-03T04:05:06Z".parse().unwrap()
}

fn condition(type_: &str, status: &str) -> Value {
    json!({"type": type_, "status": status, "lastTransitionTime": "2026-01-02T03:04:10Z"})
}

/// A running super pod on node-1 as its kubelet reports it.
fn running(ready: &str) -> Pod {
    let pod = with(&nginx(), "/spec/nodeName", json!("node-1"));
    with(
        &pod,
        "/status",
        json!({
            "phase": "Running",
            "conditions": [
                condition("PodReadyToStartContainers", "True"),
                condition("Initialized", "True"),
                condition("Ready", ready),
                {"type": "ContainersReady", "status": ready, "reason": if ready == "True" { Value::Null } else { json!("ContainersNotReady") }},
                condition("PodScheduled", "True"),
                condition("example.com/super-only", "True")
            ],
            "hostIP": "192.168.1.10",
            "hostIPs": [{"ip": "192.168.1.10"}],
            "podIP": "10.244.1.7",
            "podIPs": [{"ip": "10.244.1.7"}, {"ip": "fd00::7"}],
            "startTime": "2026-01-02T03:04:07Z",
            "qosClass": "BestEffort",
            "observedGeneration": 3,
            "containerStatuses": [{
                "name": "nginx", "image": "nginx:1.27", "imageID": "docker.io/library/nginx@sha256:abc",
                "containerID": "containerd://123", "ready": ready == "True", "restartCount": 0, "started": true,
                "state": {"running": {"startedAt": "2026-01-02T03:04:09Z"}}
            }]
        }),
    )
}

fn types(status: &PodStatus) -> Vec<(String, String)> {
    status
        .conditions
        .iter()
        .flatten()
        .map(|c| (c.type_.clone(), c.status.clone()))
        .collect()
}

#[test]
fn the_tenant_pod_reports_what_the_super_kubelet_reports() {
    let super_pod = running("True");
    let reported = super_pod.status.clone().unwrap();
    let status = tenant_status(&nginx(), &super_pod, now()).status;
    assert_eq!(status.phase, reported.phase);
    assert_eq!((&status.pod_ip, &status.pod_ips), (&reported.pod_ip, &reported.pod_ips));
    assert_eq!(
        (&status.host_ip, &status.host_ips),
        (&reported.host_ip, &reported.host_ips)
    );
    assert_eq!(status.container_statuses, reported.container_statuses);
    assert_eq!(status.start_time, reported.start_time);
    assert_eq!(
        status.observed_generation, None,
        "the super pod's generations are another object's"
    );
    assert!(
        !types(&status).contains(&("example.com/super-only".into(), "True".into())),
        "not a system condition"
    );
    assert_eq!(types(&status).len(), 5);
}

#[test]
fn the_tenant_pod_keeps_its_own_qos_class() {
    // The workload namespace's LimitRange gave the super pod requests: Burstable there, while
    // the tenant's apiserver made the tenant pod BestEffort, for good.
    let tenant = with(
        &nginx(),
        "/status",
        json!({"phase": "Pending", "qosClass": "BestEffort"}),
    );
    let super_pod = with(&running("True"), "/status/qosClass", json!("Burstable"));
    let status = tenant_status(&tenant, &super_pod, now()).status;
    assert_eq!(status.qos_class.as_deref(), Some("BestEffort"));
    // A tenant pod without one yet gets none from the super pod.
    assert_eq!(tenant_status(&nginx(), &super_pod, now()).status.qos_class, None);
}

#[test]
fn the_tenant_pod_is_bound_to_the_super_node_once() {
    assert_eq!(
        tenant_status(&nginx(), &running("True"), now()).bind_to.as_deref(),
        Some("node-1")
    );
    let bound = with(&nginx(), "/spec/nodeName", json!("node-1"));
    assert_eq!(tenant_status(&bound, &running("True"), now()).bind_to, None);
    let pending = with(&nginx(), "/status", json!({"phase": "Pending"}));
    assert_eq!(tenant_status(&nginx(), &pending, now()).bind_to, None);
}

#[test]
fn conditions_the_tenant_owns_are_kept_and_stale_system_ones_dropped() {
    let tenant = with(
        &nginx(),
        "/status",
        json!({"conditions": [condition("example.com/warm", "True"), condition("PodResizePending", "True")]}),
    );
    let status = tenant_status(&tenant, &running("True"), now()).status;
    let types = types(&status);
    assert!(types.contains(&("example.com/warm".into(), "True".into())));
    assert!(
        !types.iter().any(|(t, _)| t == "PodResizePending"),
        "the super pod no longer reports it"
    );
}

#[test]
fn ready_waits_for_the_readiness_gates() {
    let gated = with(
        &nginx(),
        "/spec/readinessGates",
        json!([{"conditionType": "example.com/lb"}]),
    );
    let ready = |tenant: &Pod, super_pod: &Pod| -> PodCondition {
        let status = tenant_status(tenant, super_pod, now()).status;
        status
            .conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .unwrap()
    };
    let missing = ready(&gated, &running("True"));
    assert_eq!(
        (missing.status.as_str(), missing.reason.as_deref()),
        ("False", Some("ReadinessGatesNotReady"))
    );
    assert_eq!(
        missing.message.as_deref(),
        Some("corresponding condition of pod readiness gate \"example.com/lb\" does not exist.")
    );
    assert_eq!(missing.last_transition_time, Some(Time(now())));
    let waiting = with(
        &gated,
        "/status",
        json!({"conditions": [condition("example.com/lb", "False")]}),
    );
    let waiting = ready(&waiting, &running("True"));
    assert_eq!(
        waiting.message.as_deref(),
        Some("the status of pod readiness gate \"example.com/lb\" is not \"True\", but False")
    );
    let open = with(
        &gated,
        "/status",
        json!({"conditions": [condition("example.com/lb", "True")]}),
    );
    assert_eq!(ready(&open, &running("True")).status, "True");
    let starting = ready(&open, &running("False"));
    assert_eq!(
        (starting.status.as_str(), starting.reason.as_deref()),
        ("False", Some("ContainersNotReady"))
    );
}

#[test]
fn an_unchanged_ready_condition_keeps_its_transition_time() {
    let gated = with(
        &nginx(),
        "/spec/readinessGates",
        json!([{"conditionType": "example.com/lb"}]),
    );
    let since = json!("2026-01-02T03:05:00Z");
    let tenant = with(
        &gated,
        "/status",
        json!({"conditions": [condition("example.com/lb", "True"), {"type": "Ready", "status": "True", "lastTransitionTime": since}]}),
    );
    let status = tenant_status(&tenant, &running("True"), now()).status;
    let ready = status
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.last_transition_time, Some(serde_json::from_value(since).unwrap()));
}
