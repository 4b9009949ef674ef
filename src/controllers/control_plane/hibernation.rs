//! Sleep and wake (docs/design.md §12): the schedules acted on (each run sets
//! `spec.hibernation.enabled`, as Gardener's do), the phase decided from what the
//! components report ([`crate::hibernation::decide`]), `status.hibernation` and the
//! `Hibernated` condition; while the control plane is not awake, `Available` and
//! `status.ready` say so, and upgrades and rotations wait ([`holds`]).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, Patch};

use super::components::Components;
use super::scope::Round;
use crate::api::{ComponentStatus, HibernationStatus, NestedControlPlane, NestedControlPlaneStatus};
use crate::apply::update_params;
use crate::controllers::ReconcileError;
use crate::hibernation::{self, ComponentState, phase};
use crate::status::{AVAILABLE, ConditionUpdate, HIBERNATED, Reason};

/// The longest a pass waits for the next run of a sleep schedule (a changed schedule is
/// noticed at once anyway: it changes the spec).
const SCHEDULE_RECHECK: Duration = Duration::from_secs(3600);

/// What waits this pass.
pub(super) struct Holds {
    /// Upgrades and key rotations: from a request to sleep (unless one runs, which
    /// finishes first) until the control plane is awake again.
    pub day2: bool,
    /// CA rotations: the same, except while waking up, since a rotation may be what brings
    /// back a CA lost while asleep, without which the components cannot wake.
    pub authorities: bool,
}

/// What waits this pass, from the control plane as read.
pub(super) fn holds(ncp: &NestedControlPlane) -> Holds {
    let status = ncp.status.as_ref();
    let busy = status.and_then(hibernation::busy).is_some();
    let shown = hibernation::shown(status).unwrap_or(phase::AWAKE);
    let wanted = hibernation::wanted(ncp);
    let day2 = hibernation::holds_day2(wanted, shown, busy);
    Holds {
        day2,
        authorities: day2 && (wanted || shown != phase::WAKING_UP),
    }
}

/// Acts on the schedules, decides the phase and reports it. Returns when to look again
/// for the next scheduled run. Does nothing for a control plane that never had
/// `spec.hibernation`.
///
/// # Errors
/// API errors patching `spec.hibernation.enabled`.
pub(super) async fn step(
    round: &Round<'_>,
    components: &Components,
    status: &mut NestedControlPlaneStatus,
) -> Result<Option<Duration>, ReconcileError> {
    let spec = round.ncp.spec.hibernation.as_ref();
    if spec.is_none() && status.hibernation.is_none() {
        return Ok(None);
    }
    let mut shown = status.hibernation.as_deref().cloned().unwrap_or(HibernationStatus {
        phase: phase::AWAKE.into(),
        ..HibernationStatus::default()
    });
    let mut wanted = hibernation::wanted(round.ncp);
    let now = round.now.k8s.0;
    let since = shown
        .last_schedule_time
        .as_ref()
        .map(|t| t.0)
        .or_else(|| round.ncp.metadata.creation_timestamp.as_ref().map(|t| t.0))
        .unwrap_or(now);
    let schedules = spec.map(|s| s.schedules.as_slice()).unwrap_or_default();
    let mut again = None;
    let mut invalid = None;
    match hibernation::scheduled(schedules, since, now) {
        Ok(scheduled) => {
            if let Some(run) = scheduled.latest {
                if run.enabled != wanted {
                    set_enabled(round, run.enabled).await?;
                    wanted = run.enabled;
                }
                shown.last_schedule_time = Some(Time(run.time));
            }
            again = scheduled.next.map(|next| {
                let wait = now.duration_until(next).unsigned_abs();
                wait.min(SCHEDULE_RECHECK) + Duration::from_secs(1)
            });
        }
        Err((path, e)) => {
            invalid = Some(e.message_at(&path));
        }
    }
    let busy = hibernation::busy(status);
    let decision = hibernation::decide(wanted, Some(&shown.phase), busy.as_deref(), states(components));
    let time = Some(round.now.k8s.clone());
    match (shown.phase.as_str(), decision.phase) {
        (phase::AWAKE, phase::FALLING_ASLEEP) => shown.sleep_time = time,
        (phase::FALLING_ASLEEP | phase::SLEEPING, phase::WAKING_UP) => shown.wake_time = time,
        (phase::WAKING_UP, phase::AWAKE) => shown.awake_time = time,
        _ => {}
    }
    if decision.phase != shown.phase.as_str() {
        tracing::info!(name = %round.ncp.name_any(), from = %shown.phase, to = decision.phase, "hibernation");
    }
    shown.phase = decision.phase.into();
    shown.message.clone_from(&decision.message);
    let condition = match invalid {
        Some(message) => ConditionUpdate::new(
            HIBERNATED,
            decision.phase == phase::SLEEPING,
            Reason::InvalidHibernationSchedule,
            message,
        ),
        None => ConditionUpdate::new(
            HIBERNATED,
            decision.phase == phase::SLEEPING,
            decision.reason,
            decision.message.clone(),
        ),
    };
    round.set(status, condition);
    if decision.phase != phase::AWAKE {
        // The Cluster API contract stays truthful: not available, and why.
        let reason = if decision.phase == phase::WAKING_UP {
            Reason::WakingUp
        } else {
            Reason::Sleeping
        };
        round.set(
            status,
            ConditionUpdate::new(
                AVAILABLE,
                false,
                reason,
                format!("the control plane is {}: {}", words(decision.phase), decision.message),
            ),
        );
        status.ready = false;
    }
    status.hibernation = Some(Box::new(shown));
    Ok(again)
}

/// The phase in words, for messages.
fn words(phase: &str) -> &'static str {
    match phase {
        phase::FALLING_ASLEEP => "falling asleep",
        phase::SLEEPING => "asleep",
        phase::WAKING_UP => "waking up",
        _ => "awake",
    }
}

/// What etcd, the apiserver and the controller-manager report.
fn states(components: &Components) -> [ComponentState; 3] {
    let state = |s: Option<&ComponentStatus>, exists: bool| ComponentState {
        asleep: !exists || s.is_some_and(|s| s.phase.as_deref() == Some(crate::status::phase::SLEEPING)),
        ready: s.is_some_and(|s| s.ready),
    };
    [
        state(
            components.etcd.as_ref().and_then(|c| c.status.as_ref()),
            components.etcd.is_some(),
        ),
        state(
            components.apiserver.as_ref().and_then(|c| c.status.as_ref()),
            components.apiserver.is_some(),
        ),
        state(
            components.controller_manager.as_ref().and_then(|c| c.status.as_ref()),
            components.controller_manager.is_some(),
        ),
    ]
}

/// Sets `spec.hibernation.enabled`, as a schedule's run does.
async fn set_enabled(round: &Round<'_>, enabled: bool) -> Result<(), ReconcileError> {
    let api: Api<NestedControlPlane> = Api::namespaced(round.ctx.client.clone(), round.ns);
    let patch = serde_json::json!({"spec": {"hibernation": {"enabled": enabled}}});
    api.patch(&round.ncp.name_any(), &update_params(), &Patch::Merge(&patch))
        .await?;
    tracing::info!(name = %round.ncp.name_any(), enabled, "a sleep schedule's run set spec.hibernation.enabled");
    Ok(())
}
