//! The way up: the status a tenant pod shows for its super pod, and the node it is bound
//! to (docs/design.md §11).
//!
//! The tenant pod reports what the super cluster's kubelet reports: phase, conditions,
//! pod and host IPs, container and init container statuses, start time, reason, message
//! and resource status, copied from the super pod. Four exceptions:
//! - condition types the tenant owns are kept from the tenant pod: every type that is not
//!   one of the kubelet's, scheduler's or disruption controllers' [`SYSTEM_CONDITIONS`]
//!   (readiness-gate conditions its own controllers set, above all), and the super pod's
//!   conditions of those types are ignored;
//! - with readiness gates, `Ready` is recomputed as the kubelet computes it
//!   (`GeneratePodReadyCondition` in `pkg/kubelet/status/generate.go`): true when
//!   `ContainersReady` is and every gate's condition is true, else false with the
//!   kubelet's reasons. The super pod carries no gates (their conditions are set on the
//!   tenant pod), so its own `Ready` is `ContainersReady`;
//! - ephemeral container statuses stay the tenant's (none are synced), and
//!   `observedGeneration` is left out: the super pod's counts another object's generations;
//! - the QoS class stays the tenant's: its apiserver set it at creation and refuses any
//!   change, while the super pod's may differ (the workload namespace's LimitRange gives
//!   requests to containers that set none, making a BestEffort pod Burstable there).
//!
//! The host IP is the super node's; the tenant's Node of the same name (the controller's
//! part) carries it too.

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// Pod condition types the super cluster's kubelet, scheduler and disruption controllers
/// own (`PodConditionType` constants of `k8s.io/api/core/v1`); any other type is the
/// tenant's.
pub const SYSTEM_CONDITIONS: [&str; 8] = [
    "PodScheduled",
    "PodReadyToStartContainers",
    "Initialized",
    "ContainersReady",
    "Ready",
    "DisruptionTarget",
    "PodResizePending",
    "PodResizeInProgress",
];

/// What the controller writes to the tenant pod.
#[derive(Clone, Debug, PartialEq)]
pub struct Upward {
    /// The tenant pod's status.
    pub status: PodStatus,
    /// The node to bind the tenant pod to (a Binding): the super pod's node, once it is
    /// scheduled, while the tenant pod is unbound. A pod is bound once.
    pub bind_to: Option<String>,
}

/// The status of the tenant pod `tenant` whose super copy is `super_pod`; `now` stamps a
/// `Ready` condition that changes with the readiness gates.
pub fn tenant_status(tenant: &Pod, super_pod: &Pod, now: Timestamp) -> Upward {
    let reported = super_pod.status.clone().unwrap_or_default();
    let current = tenant.status.clone().unwrap_or_default();
    let mut conditions: Vec<PodCondition> = reported
        .conditions
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| SYSTEM_CONDITIONS.contains(&c.type_.as_str()))
        .collect();
    let tenant_owned = current
        .conditions
        .iter()
        .flatten()
        .filter(|c| !SYSTEM_CONDITIONS.contains(&c.type_.as_str()));
    conditions.extend(tenant_owned.cloned());
    let gates: Vec<&str> = tenant
        .spec
        .iter()
        .flat_map(|s| s.readiness_gates.iter().flatten())
        .map(|g| g.condition_type.as_str())
        .collect();
    if !gates.is_empty() {
        let previous = current.conditions.iter().flatten().find(|c| c.type_ == "Ready");
        let ready = ready_condition(&conditions, &gates, previous, now);
        conditions.retain(|c| c.type_ != "Ready");
        conditions.push(ready);
    }
    let status = PodStatus {
        conditions: Some(conditions).filter(|c| !c.is_empty()),
        ephemeral_container_statuses: current.ephemeral_container_statuses,
        qos_class: current.qos_class,
        observed_generation: None,
        ..reported
    };
    Upward {
        status,
        bind_to: bind_to(tenant, super_pod),
    }
}

/// The node to bind the tenant pod `tenant` to: its super pod's, once that is scheduled,
/// while the tenant pod is unbound (a pod is bound once).
pub fn bind_to(tenant: &Pod, super_pod: &Pod) -> Option<String> {
    let scheduled = super_pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .filter(|n| !n.is_empty());
    let bound = tenant
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    scheduled.filter(|_| !bound)
}

/// The kubelet's Ready condition over `conditions` with readiness gates `gates`; the
/// transition time is `previous`'s when the status did not change, else `now`.
fn ready_condition(
    conditions: &[PodCondition],
    gates: &[&str],
    previous: Option<&PodCondition>,
    now: Timestamp,
) -> PodCondition {
    let find = |type_: &str| conditions.iter().find(|c| c.type_ == type_);
    let containers = find("ContainersReady");
    let (status, reason, message) = match containers {
        Some(c) if c.status == "True" => {
            let unready: Vec<String> = gates
                .iter()
                .filter_map(|gate| match find(gate) {
                    None => Some(format!(
                        "corresponding condition of pod readiness gate \"{gate}\" does not exist."
                    )),
                    Some(c) if c.status != "True" => Some(format!(
                        "the status of pod readiness gate \"{gate}\" is not \"True\", but {}",
                        c.status
                    )),
                    Some(_) => None,
                })
                .collect();
            if unready.is_empty() {
                ("True", None, None)
            } else {
                (
                    "False",
                    Some("ReadinessGatesNotReady".to_owned()),
                    Some(unready.join(", ")),
                )
            }
        }
        Some(c) => ("False", c.reason.clone(), c.message.clone()),
        None => ("False", Some("ContainersNotReady".to_owned()), None),
    };
    let since = previous
        .filter(|p| p.status == status)
        .and_then(|p| p.last_transition_time.clone());
    PodCondition {
        type_: "Ready".to_owned(),
        status: status.to_owned(),
        reason,
        message,
        last_transition_time: Some(since.unwrap_or(Time(now))),
        ..PodCondition::default()
    }
}

#[cfg(test)]
mod tests;
