//! What a pass reports: the conditions and status fields it decides from what the stages
//! found, and the kube-runtime [`Action`] it ends with. Plain functions of their inputs (no
//! client, no clock: the pass's one `now` is handed in), each tested on its own.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::controller::Action;

use super::components::Components;
use super::scope::Round;
use crate::api::{
    ComponentStatus, ComponentSummary, ComponentsStatus, ControlPlaneInitialization, NestedControlPlane,
    NestedControlPlaneStatus,
};
use crate::controllers::ReconcileError;
use crate::plan::ClusterSettings;
use crate::status::{
    APISERVER_READY, AVAILABLE, CERTIFICATES_AVAILABLE, CONTROLLER_MANAGER_READY, ConditionUpdate, ETCD_READY, PAUSED,
    READY, ROLLING_OUT, Reason, SYNCED, is_true, set_condition,
};

/// How long a control plane whose CA is missing waits before it looks again: the CA needs
/// a human (its Secret's return wakes the controller at once), so no retry storm.
pub(super) const MISSING_CA_RECHECK: Duration = Duration::from_secs(300);

/// The status a pass starts from: the one it read, with the CAPI contract's flag that
/// this provider manages no Machines.
pub(super) fn begin(old: &NestedControlPlaneStatus) -> NestedControlPlaneStatus {
    NestedControlPlaneStatus {
        external_managed_control_plane: true,
        ..old.clone()
    }
}

/// The Paused condition (CAPI contract).
pub(super) fn pause_condition(paused: bool) -> ConditionUpdate {
    if paused {
        ConditionUpdate::new(
            PAUSED,
            true,
            Reason::Paused,
            "reconciliation is paused (cluster.x-k8s.io/paused or Cluster spec.paused)",
        )
    } else {
        ConditionUpdate::new(PAUSED, false, Reason::NotPaused, "")
    }
}

/// The Synced condition of the spec's field rules: bad input stops a pass here, before
/// anything is created or a kubeconfig points at it; the same check as admission and
/// `capn render` (crate::validate).
pub(super) fn spec_condition(ncp: &NestedControlPlane, cluster: &ClusterSettings) -> ConditionUpdate {
    match crate::plan::check_control_plane(&serde_json::to_value(ncp).unwrap_or_default(), cluster) {
        Ok(()) => ConditionUpdate::new(SYNCED, true, Reason::Valid, "the spec follows every field rule"),
        Err(e) => ConditionUpdate::error(SYNCED, false, e.reason(), e.to_string()),
    }
}

/// Summarizes the components into the control plane's status: their summaries, a
/// condition for each, the replica counts Cluster API reads (the apiserver's), Available
/// and RollingOut.
pub(super) fn components(round: &Round<'_>, components: &Components, status: &mut NestedControlPlaneStatus) {
    let summaries = summaries(status.components.as_ref(), components);
    for update in component_conditions(&summaries, components) {
        round.set(status, update);
    }
    show_replicas(status, &summaries, &round.cluster.name);
    round.set(status, available(&summaries));
    round.set(status, rolling_out(components));
    status.components = Some(summaries);
}

/// The summary of each component to show, given those the control plane shows (`shown`).
pub(super) fn summaries(shown: Option<&ComponentsStatus>, components: &Components) -> ComponentsStatus {
    let shown = shown.cloned().unwrap_or_default();
    let summary = |shown: Option<&ComponentSummary>, name: Option<String>, s: Option<&ComponentStatus>| {
        name.map(|name| {
            let current = ComponentSummary {
                name,
                ready: s.is_some_and(|s| s.ready),
                replicas: s.and_then(|s| s.replicas).unwrap_or(0),
                ready_replicas: s.and_then(|s| s.ready_replicas).unwrap_or(0),
                version: s.and_then(|s| s.version.clone()),
            };
            let served = s.is_some_and(|s| is_true(&s.conditions, ROLLING_OUT));
            hold_progress(shown, current, served)
        })
    };
    let [etcd, apiserver, controller_manager] = statuses(components);
    ComponentsStatus {
        etcd: summary(
            shown.etcd.as_ref(),
            components.etcd.as_ref().map(|c| c.name_any()),
            etcd,
        ),
        apiserver: summary(
            shown.apiserver.as_ref(),
            components.apiserver.as_ref().map(|c| c.name_any()),
            apiserver,
        ),
        controller_manager: summary(
            shown.controller_manager.as_ref(),
            components.controller_manager.as_ref().map(|c| c.name_any()),
            controller_manager,
        ),
    }
}

/// The components' own statuses: etcd, apiserver, controller-manager.
fn statuses(components: &Components) -> [Option<&ComponentStatus>; 3] {
    [
        components.etcd.as_ref().and_then(|c| c.status.as_ref()),
        components.apiserver.as_ref().and_then(|c| c.status.as_ref()),
        components.controller_manager.as_ref().and_then(|c| c.status.as_ref()),
    ]
}

/// The summary of a component to show, given the one the control plane shows (`shown`), the
/// component's own now (`current`), and whether it has served (`served`: its RollingOut
/// condition is True, so it is degraded or rolling out, not on its first provisioning):
/// while a component on its first provisioning is not ready and was not ready when last
/// shown, its replicas and version stay as shown. Its progress is told by its own status;
/// the control plane mirrors it at its Ready transitions, not at each step, so a
/// component's StatefulSet being applied (replicas and version set, not yet ready) costs
/// the control plane no status write of its own (one or two per provisioning, not one per
/// step of each component).
/// A component that has served is not held: its counts are news to whoever reads the
/// control plane's (Cluster API reads `readyReplicas`), shown as they change.
pub(super) fn hold_progress(
    shown: Option<&ComponentSummary>,
    current: ComponentSummary,
    served: bool,
) -> ComponentSummary {
    match shown {
        Some(shown) if !served && !shown.ready && !current.ready && shown.name == current.name => ComponentSummary {
            replicas: shown.replicas,
            ready_replicas: shown.ready_replicas,
            version: shown.version.clone(),
            ..current
        },
        _ => current,
    }
}

/// The conditions `EtcdReady`, `APIServerReady` and `ControllerManagerReady`.
pub(super) fn component_conditions(summaries: &ComponentsStatus, components: &Components) -> [ConditionUpdate; 3] {
    let [etcd, apiserver, controller_manager] = statuses(components);
    [
        component_condition(ETCD_READY, "NestedEtcd", summaries.etcd.as_ref(), etcd),
        component_condition(
            APISERVER_READY,
            "NestedAPIServer",
            summaries.apiserver.as_ref(),
            apiserver,
        ),
        component_condition(
            CONTROLLER_MANAGER_READY,
            "NestedControllerManager",
            summaries.controller_manager.as_ref(),
            controller_manager,
        ),
    ]
}

/// The control plane's condition `type_` (`EtcdReady`, ...) for its component of kind `kind`:
/// True once it is ready; a failing component's Ready reason and message word for word (it
/// needs someone); `NotReady` with a message that stays put while it is on its way (its own
/// Ready condition tells the progress: mirrored step by step, each step of each component
/// would cost the control plane a status write); `ComponentMissing` when it does not exist.
pub(super) fn component_condition(
    type_: &'static str,
    kind: &str,
    component: Option<&ComponentSummary>,
    status: Option<&ComponentStatus>,
) -> ConditionUpdate {
    let ready_condition = status.and_then(|s| s.conditions.iter().find(|c| c.type_ == READY));
    match (component, ready_condition) {
        (Some(c), _) if c.ready => {
            ConditionUpdate::new(type_, true, Reason::Ready, format!("{kind} {} is ready", c.name))
        }
        (Some(c), Some(rc)) if crate::status::failing(rc) => ConditionUpdate::mirrored(
            type_,
            false,
            rc.reason.clone(),
            format!("{kind} {}: {}", c.name, rc.message),
        ),
        (Some(c), _) => ConditionUpdate::new(
            type_,
            false,
            Reason::NotReady,
            format!(
                "{kind} {} is not ready yet; its Ready condition tells its progress",
                c.name
            ),
        ),
        (None, _) => ConditionUpdate::new(
            type_,
            false,
            Reason::ComponentMissing,
            format!("the {kind} named in spec does not exist"),
        ),
    }
}

/// The CAPI contract's fields: ready (every component), initialized (the apiserver was
/// ready once: a milestone that stays), the scale subresource's selector, and the
/// apiserver's version and replica counts.
pub(super) fn show_replicas(status: &mut NestedControlPlaneStatus, summaries: &ComponentsStatus, cluster_name: &str) {
    status.ready = [&summaries.etcd, &summaries.apiserver, &summaries.controller_manager]
        .iter()
        .all(|c| c.as_ref().is_some_and(|c| c.ready));
    let apiserver_ready = summaries.apiserver.as_ref().is_some_and(|c| c.ready);
    status.initialized = status.initialized || apiserver_ready;
    status.initialization = Some(ControlPlaneInitialization {
        control_plane_initialized: status.initialized,
    });
    status.selector = Some(
        crate::plan::selector_labels(crate::component::ComponentKind::ApiServer, cluster_name)
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(","),
    );
    if let Some(a) = &summaries.apiserver {
        status.version = a.version.clone();
        status.replicas = Some(a.replicas);
        status.ready_replicas = Some(a.ready_replicas);
        status.updated_replicas = Some(a.ready_replicas);
        status.up_to_date_replicas = Some(a.ready_replicas);
        status.unavailable_replicas = Some((a.replicas - a.ready_replicas).max(0));
    }
}

/// Available: every component ready, or the ones that are not.
pub(super) fn available(summaries: &ComponentsStatus) -> ConditionUpdate {
    let not_ready: Vec<&str> = [
        ("etcd", &summaries.etcd),
        ("apiserver", &summaries.apiserver),
        ("controller-manager", &summaries.controller_manager),
    ]
    .iter()
    .filter(|(_, c)| !c.as_ref().is_some_and(|c| c.ready))
    .map(|(n, _)| *n)
    .collect();
    if not_ready.is_empty() {
        ConditionUpdate::new(
            AVAILABLE,
            true,
            Reason::Available,
            "etcd, apiserver and controller-manager are ready",
        )
    } else {
        ConditionUpdate::new(
            AVAILABLE,
            false,
            Reason::ComponentsNotReady,
            format!("not ready: {}", not_ready.join(", ")),
        )
    }
}

/// RollingOut: the messages of the components' own RollingOut conditions that are True.
pub(super) fn rolling_out(components: &Components) -> ConditionUpdate {
    let rolling: Vec<String> = statuses(components)
        .into_iter()
        .flatten()
        .flat_map(|s| {
            s.conditions
                .iter()
                .filter(|c| c.type_ == ROLLING_OUT && c.status == "True")
        })
        .map(|c| c.message.clone())
        .collect();
    if rolling.is_empty() {
        ConditionUpdate::new(
            ROLLING_OUT,
            false,
            Reason::NotRollingOut,
            "every component runs its desired release",
        )
    } else {
        ConditionUpdate::new(ROLLING_OUT, true, Reason::RollingOut, rolling.join("; "))
    }
}

/// The condition a failed pass sets: a missing CA is CertificatesAvailable's; any other
/// error is Available's, whose status stays what the components make it (`ready`).
pub(super) fn error_condition(error: &ReconcileError, ready: bool) -> ConditionUpdate {
    match error {
        ReconcileError::CertificateAuthorityMissing(_) | ReconcileError::EncryptionKeyMissing(_) => {
            ConditionUpdate::error(CERTIFICATES_AVAILABLE, false, error.reason(), error.to_string())
        }
        _ => ConditionUpdate::error(AVAILABLE, ready, error.reason(), error.to_string()),
    }
}

/// Sets the error condition of a failed pass, and the generation the status observed: the
/// one the pass read (`read`), or, when capn's own spec patch was the only change since
/// (`spec_patched`), that one. Saying so now saves the status write that would otherwise
/// only move observedGeneration on.
pub(super) fn conclude(
    status: &mut NestedControlPlaneStatus,
    error: Option<&ReconcileError>,
    read: Option<i64>,
    spec_patched: Option<i64>,
    now: &Time,
) {
    if let Some(e) = error {
        let update = error_condition(e, status.ready);
        set_condition(&mut status.conditions, update, read, now);
    }
    let mut generation = read;
    if let Some(patched) = spec_patched {
        for condition in status.conditions.iter_mut().filter(|c| c.observed_generation == read) {
            condition.observed_generation = Some(patched);
        }
        generation = Some(patched);
    }
    status.observed_generation = generation;
}

/// When a pass that went through every stage looks again: when the admin kubeconfig is
/// due (`renewal`; the components watch their own), or sooner when the upgrade asks.
pub(super) fn requeue(renewal: Duration, upgrade: Option<Duration>) -> Action {
    Action::requeue(upgrade.map_or(renewal, |u| u.min(renewal)))
}

/// What kube-runtime is told: a missing CA looks again after [`MISSING_CA_RECHECK`], not
/// with the error backoff; anything else as it is.
///
/// # Errors
/// The pass's error, other than a missing CA.
pub(super) fn action(result: Result<Action, ReconcileError>) -> Result<Action, ReconcileError> {
    match result {
        Err(ReconcileError::CertificateAuthorityMissing(_)) => Ok(Action::requeue(MISSING_CA_RECHECK)),
        other => other,
    }
}
