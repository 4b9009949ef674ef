//! The last step of a component reconcile, pure: what a pass ended with ([`Outcome`]) turned
//! into the status to show and when to look again. No client, no clock of its own.

use std::time::Duration;

use kube::runtime::controller::Action;

use crate::api::{AppliedCertificates, ComponentStatus, RestoreStatus, ServiceOutput};
use crate::component::ComponentKind;
use crate::controllers::ReconcileError;
use crate::controllers::component::etcd::backup::BackupReport;
use crate::controllers::component::etcd::membership::Membership;
use crate::controllers::round::{Now, recheck_after};
use crate::plan::{Plan, PlanError};
use crate::status::{ConditionUpdate, READY, ROLLING_OUT, Reason, SYNCED, is_true, phase, set_condition};

/// What one pass ended with.
// One value per reconcile, moved once and never stored in a collection: boxing the large
// variant would buy nothing.
#[allow(clippy::large_enum_variant)]
pub(super) enum Outcome {
    Paused,
    /// Owned by a control plane whose spec does not name this component yet (it is about
    /// to: the control plane created it); no status is written.
    Unreferenced,
    Waiting {
        reason: Reason,
        message: String,
    },
    Invalid(PlanError),
    /// Refused before planning (a restore that cannot start; `reason` is the refusal's
    /// own, a failure); nothing is applied.
    Refused {
        reason: &'static str,
        message: String,
    },
    Applied(Applied),
    /// The control plane sleeps: the StatefulSets were scaled to zero and `running` pods
    /// are still there (docs/design.md §12).
    Sleeping {
        running: i32,
    },
}

impl From<PlanError> for Outcome {
    /// A plan that failed: an etcd without endpoints yet is waited for, any other error is
    /// bad input.
    fn from(error: PlanError) -> Self {
        match error {
            PlanError::NoEtcdEndpoints => Outcome::Waiting {
                reason: Reason::WaitingForEtcd,
                message: PlanError::NoEtcdEndpoints.to_string(),
            },
            e => Outcome::Invalid(e),
        }
    }
}

/// What a pass that applied its plan observed.
pub(super) struct Applied {
    /// The restore status to report (etcd), when a restore is pending or completed.
    pub restore: Option<RestoreStatus>,
    /// Backups (etcd): status, condition, when to look again.
    pub backup: BackupReport,
    pub plan: Plan,
    pub readiness: Readiness,
    pub service: Option<ServiceOutput>,
    pub certificates: AppliedCertificates,
    /// When the first of the component's certificates is renewed.
    pub next_renewal: Option<time::OffsetDateTime>,
    /// Readiness is a provider kind's, which no watch reports.
    pub provider_readiness: bool,
    /// etcd: the membership as read and changed this round (boxed: the variant is large).
    pub membership: Box<Membership>,
}

/// How ready the applied workloads are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Readiness {
    pub ready: bool,
    /// Replicas wanted (the most any deciding workload wants, at least the plan's).
    pub desired: i32,
    pub ready_replicas: i32,
}

/// The status after `outcome`, starting from the status shown (`old`), and when to look
/// again; `None` when nothing is written (paused, or not referenced yet).
///
/// Once a component has been applied, its running pods keep serving while a later spec
/// waits or is refused: `Ready` keeps describing them, `Synced` and `RollingOut` say why
/// the new spec is not applied.
pub(super) fn report(
    kind: ComponentKind,
    name: &str,
    old: &ComponentStatus,
    generation: Option<i64>,
    outcome: Outcome,
    now: &Now,
) -> Option<(ComponentStatus, Action)> {
    let mut status = old.clone();
    let running = old.version.is_some();
    let mut set = |update: ConditionUpdate| set_condition(&mut status.conditions, update, generation, &now.k8s);
    let action = match outcome {
        Outcome::Paused | Outcome::Unreferenced => return None,
        Outcome::Waiting { reason, message } => {
            if running {
                set(ConditionUpdate::new(ROLLING_OUT, true, reason, message));
            } else {
                set(ConditionUpdate::new(READY, false, reason, message));
                status.ready = false;
                status.phase = Some(phase::PENDING.into());
            }
            Action::requeue(Duration::from_secs(30))
        }
        Outcome::Invalid(err) => {
            // Bad input: nothing was applied; wait for the spec (or channel) to change.
            refuse(&mut status, running, err.reason(), &err.to_string(), generation, now);
            Action::await_change()
        }
        Outcome::Refused { reason, message } => {
            refuse(&mut status, running, reason, &message, generation, now);
            // What was missing (a snapshot, a Secret) may appear without a spec change.
            Action::requeue(Duration::from_secs(60))
        }
        Outcome::Applied(applied) => applied_status(kind, name, old, &mut status, generation, applied, now),
        Outcome::Sleeping { running } => {
            sleeping_status(&mut status, running, generation, now);
            if running > 0 {
                Action::requeue(Duration::from_secs(30))
            } else {
                Action::await_change()
            }
        }
    };
    status.observed_generation = generation;
    Some((status, action))
}

/// The status of a component scaled to zero for sleep, with `running` pods still there:
/// `Sleeping` once none is (its `spec.replicas` and `status.replicas` stay: they are what
/// wake brings back). etcd forgets when its members became unhealthy: their absence while
/// asleep is no loss, and member remediation must never count it (docs/design.md §12).
fn sleeping_status(status: &mut ComponentStatus, running: i32, generation: Option<i64>, now: &Now) {
    status.ready = false;
    let update = if running > 0 {
        ConditionUpdate::new(
            READY,
            false,
            Reason::FallingAsleep,
            format!("the control plane falls asleep: {running} pods still run"),
        )
    } else {
        status.phase = Some(phase::SLEEPING.into());
        status.ready_replicas = Some(0);
        status.replicas_display = Some(format!("0/{}", status.replicas.unwrap_or(0)));
        ConditionUpdate::new(
            READY,
            false,
            Reason::Sleeping,
            "the control plane sleeps: no pod runs; its data is kept",
        )
    };
    set_condition(&mut status.conditions, update, generation, &now.k8s);
    if let Some(etcd) = status.etcd.as_mut() {
        for member in &mut etcd.members {
            member.unhealthy_since = None;
        }
    }
}

/// The status after a pass that failed with `error` (an API hiccup, retried soon).
pub(super) fn report_error(
    old: &ComponentStatus,
    generation: Option<i64>,
    error: &ReconcileError,
    now: &Now,
) -> (ComponentStatus, Action) {
    let mut status = old.clone();
    let mut set = |update: ConditionUpdate| set_condition(&mut status.conditions, update, generation, &now.k8s);
    set(ConditionUpdate::error(SYNCED, false, error.reason(), error.to_string()));
    if old.version.is_none() {
        set(ConditionUpdate::error(READY, false, error.reason(), error.to_string()));
        status.ready = false;
    }
    status.observed_generation = generation;
    (status, Action::requeue(Duration::from_secs(5)))
}

/// `Synced` False with an error's reason; a component that never ran is `Failed`.
fn refuse(
    status: &mut ComponentStatus,
    running: bool,
    reason: &'static str,
    message: &str,
    generation: Option<i64>,
    now: &Now,
) {
    let mut set = |update: ConditionUpdate| set_condition(&mut status.conditions, update, generation, &now.k8s);
    set(ConditionUpdate::error(SYNCED, false, reason, message));
    if !running {
        set(ConditionUpdate::error(READY, false, reason, message));
        status.ready = false;
        status.phase = Some(phase::FAILED.into());
    }
}

/// The status of a component whose plan was applied; returns when to look again.
fn applied_status(
    kind: ComponentKind,
    name: &str,
    old: &ComponentStatus,
    status: &mut ComponentStatus,
    generation: Option<i64>,
    applied: Applied,
    now: &Now,
) -> Action {
    let Applied {
        restore,
        backup,
        plan,
        readiness,
        service,
        certificates,
        next_renewal,
        provider_readiness,
        membership,
    } = applied;
    let Readiness {
        ready,
        desired,
        ready_replicas,
    } = readiness;
    let mut set = |update: ConditionUpdate| set_condition(&mut status.conditions, update, generation, &now.k8s);
    for condition in applied_conditions(kind, old, &plan, readiness) {
        set(condition);
    }
    if let Some(condition) = membership.condition {
        set(condition);
    }
    if let Some(condition) = backup.condition {
        set(condition);
    }
    let space = membership.space;
    if let Some(condition) = space.condition {
        set(condition);
    }
    if let Some(recorded) = space.status {
        status.etcd_space = Some(Box::new(recorded));
    }
    status.ready = ready;
    status.phase = Some(if ready { phase::READY } else { phase::PROVISIONING }.into());
    status.version = Some(plan.version.to_string());
    status.channel = Some(plan.channel.clone());
    status.replicas = Some(desired);
    status.ready_replicas = Some(ready_replicas);
    status.replicas_display = Some(format!("{ready_replicas}/{desired}"));
    status.inventory = plan.inventory();
    // During a membership change the apiserver keeps the members it has (member 0 never
    // goes, so it always reaches one); it gets the new list, and rolls once, when the
    // change is done.
    status.endpoints = if membership.render.is_none() || membership.settled || old.endpoints.is_empty() {
        plan.etcd_endpoints
    } else {
        old.endpoints.clone()
    };
    if let Some(members) = membership.status {
        status.etcd = Some(members);
    }
    status.service = service;
    status.certificates = Some(certificates);
    record_restore_and_backup(status, ready, restore, backup.status);
    let again = next_look(name, !provider_readiness, ready, next_renewal, now);
    let again = membership.requeue.map_or(again, |m| m.min(again));
    let again = space.requeue.map_or(again, |s| s.min(again));
    let again = backup.requeue.map_or(again, |b| again.min(b));
    Action::requeue(again)
}

/// The restore and backup records of an etcd: every member ran from the restored data once
/// this round's apply (the template with the restore init containers) is ready, so the
/// next round renders without them.
fn record_restore_and_backup(
    status: &mut ComponentStatus,
    ready: bool,
    restore: Option<RestoreStatus>,
    backup: Option<crate::api::BackupStatus>,
) {
    if let Some(mut restore) = restore {
        if ready && restore.snapshot.is_some() {
            restore.completed = true;
        }
        status.restore = Some(Box::new(restore));
    }
    if backup.is_some() {
        status.backup = backup.map(Box::new);
    }
}

/// When to look at an applied component again. Owned StatefulSets and Services wake it on
/// change; a provider's own kinds are not watched (`watched` false), so while such a one is
/// not ready, soon. Otherwise when the next certificate is due (a membership step or a
/// scheduled snapshot may come sooner: the caller takes the earliest).
fn next_look(
    name: &str,
    watched: bool,
    ready: bool,
    next_renewal: Option<time::OffsetDateTime>,
    now: &Now,
) -> Duration {
    if !ready && !watched {
        Duration::from_secs(10)
    } else {
        recheck_after(name, next_renewal, now.time)
    }
}

/// `Synced`, `Ready` and `RollingOut` of an applied component. Rolling out means replacing
/// pods that served (`old` was Ready or rolling out): a first provisioning is not one, even
/// after its first apply recorded a version (saying so for a moment would cost a status
/// write).
fn applied_conditions(
    kind: ComponentKind,
    old: &ComponentStatus,
    plan: &Plan,
    readiness: Readiness,
) -> [ConditionUpdate; 3] {
    let Readiness {
        ready,
        desired,
        ready_replicas,
    } = readiness;
    let members = format!("{ready_replicas}/{desired} members ready");
    let served = is_true(&old.conditions, READY) || is_true(&old.conditions, ROLLING_OUT);
    [
        ConditionUpdate::new(
            SYNCED,
            true,
            Reason::Applied,
            format!("{kind} {} from channel {}", plan.version, plan.channel),
        ),
        if ready {
            ConditionUpdate::new(READY, true, Reason::Ready, members.clone())
        } else {
            ConditionUpdate::new(READY, false, Reason::Provisioning, members.clone())
        },
        if ready {
            ConditionUpdate::new(
                ROLLING_OUT,
                false,
                Reason::RolledOut,
                format!("running {}", plan.version),
            )
        } else {
            ConditionUpdate::new(
                ROLLING_OUT,
                served,
                Reason::RollingOut,
                format!("rolling out {}: {members}", plan.version),
            )
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::is_true;

    fn now() -> Now {
        Now::take()
    }

    fn condition<'a>(
        status: &'a ComponentStatus,
        type_: &str,
    ) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        status.conditions.iter().find(|c| c.type_ == type_).unwrap()
    }

    fn applied(ready: bool, ready_replicas: i32) -> Applied {
        Applied {
            restore: None,
            backup: BackupReport::default(),
            plan: Plan {
                kind: ComponentKind::Etcd,
                channel: "stable".into(),
                version: semver::Version::new(3, 6, 8),
                replicas: 3,
                objects: Vec::new(),
                etcd_endpoints: vec!["https://demo-etcd-0:2379".into()],
                startup_secrets: Vec::new(),
            },
            readiness: Readiness {
                ready,
                desired: 3,
                ready_replicas,
            },
            service: None,
            certificates: AppliedCertificates::default(),
            next_renewal: None,
            provider_readiness: false,
            membership: Box::default(),
        }
    }

    #[test]
    fn a_sleeping_component_keeps_its_replicas_and_etcd_forgets_when_members_went_away() {
        let now = now();
        let old = ComponentStatus {
            ready: true,
            phase: Some(phase::READY.into()),
            replicas: Some(3),
            ready_replicas: Some(3),
            version: Some("3.6.8".into()),
            etcd: Some(crate::api::EtcdClusterStatus {
                members: vec![crate::api::EtcdMemberStatus {
                    name: "demo-etcd-2".into(),
                    id: "2".into(),
                    peer_url: String::new(),
                    learner: false,
                    healthy: false,
                    unhealthy_since: Some("2026-12-01T00:00:00Z".into()),
                }],
                leader: None,
            }),
            ..ComponentStatus::default()
        };
        let (falling, action) = report(
            ComponentKind::Etcd,
            "demo-etcd",
            &old,
            Some(1),
            Outcome::Sleeping { running: 2 },
            &now,
        )
        .unwrap();
        assert!(!falling.ready);
        assert_eq!(condition(&falling, READY).reason, "FallingAsleep");
        assert_eq!(
            falling.phase.as_deref(),
            Some(phase::READY),
            "not asleep while pods run"
        );
        assert_eq!(action, Action::requeue(Duration::from_secs(30)));
        let (asleep, action) = report(
            ComponentKind::Etcd,
            "demo-etcd",
            &falling,
            Some(1),
            Outcome::Sleeping { running: 0 },
            &now,
        )
        .unwrap();
        assert_eq!(condition(&asleep, READY).reason, "Sleeping");
        assert_eq!(asleep.phase.as_deref(), Some(phase::SLEEPING));
        assert_eq!((asleep.replicas, asleep.ready_replicas), (Some(3), Some(0)));
        assert_eq!(asleep.version.as_deref(), Some("3.6.8"));
        assert_eq!(
            asleep.etcd.unwrap().members[0].unhealthy_since,
            None,
            "a member's absence while asleep never counts toward its remediation"
        );
        assert_eq!(action, Action::await_change());
    }

    #[test]
    fn a_new_component_that_waits_is_pending_and_a_running_one_keeps_its_ready() {
        let now = now();
        let waiting = || Outcome::Waiting {
            reason: Reason::WaitingForEtcd,
            message: "etcd is not ready".into(),
        };
        let (fresh, action) = report(
            ComponentKind::ApiServer,
            "demo-apiserver",
            &ComponentStatus::default(),
            Some(1),
            waiting(),
            &now,
        )
        .unwrap();
        assert_eq!(condition(&fresh, READY).reason, "WaitingForEtcd");
        assert_eq!(fresh.phase.as_deref(), Some(phase::PENDING));
        assert_eq!(fresh.observed_generation, Some(1));
        assert_eq!(action, Action::requeue(Duration::from_secs(30)));

        let (serving, _) = report(
            ComponentKind::ApiServer,
            "demo-apiserver",
            &fresh,
            Some(1),
            waiting(),
            &now,
        )
        .unwrap();
        let running = ComponentStatus {
            version: Some("1.36.3".into()),
            ..serving
        };
        let (after, _) = report(
            ComponentKind::ApiServer,
            "demo-apiserver",
            &running,
            Some(2),
            waiting(),
            &now,
        )
        .unwrap();
        assert!(is_true(&after.conditions, ROLLING_OUT));
        assert_eq!(after.phase, running.phase, "a running component's phase stays");
    }

    #[test]
    fn bad_input_fails_a_new_component_and_waits_for_a_change() {
        let now = now();
        let outcome = Outcome::Invalid(PlanError::NoEtcdEndpoints);
        let (status, action) = report(
            ComponentKind::ApiServer,
            "a",
            &ComponentStatus::default(),
            Some(1),
            outcome,
            &now,
        )
        .unwrap();
        assert_eq!(action, Action::await_change());
        assert_eq!(condition(&status, SYNCED).status, "False");
        assert_eq!(status.phase.as_deref(), Some(phase::FAILED));
        let refused = Outcome::Refused {
            reason: "RestoreNotAllowed",
            message: "no".into(),
        };
        let (status, action) = report(
            ComponentKind::Etcd,
            "e",
            &ComponentStatus::default(),
            None,
            refused,
            &now,
        )
        .unwrap();
        assert_eq!(action, Action::requeue(Duration::from_secs(60)));
        assert_eq!(condition(&status, READY).reason, "RestoreNotAllowed");
    }

    #[test]
    fn a_provider_component_that_is_not_ready_is_looked_at_soon() {
        let now = now();
        assert_eq!(next_look("x", false, false, None, &now), Duration::from_secs(10));
        assert!(next_look("x", true, false, None, &now) >= crate::controllers::round::CERTIFICATE_RECHECK);
        assert!(next_look("x", false, true, None, &now) >= crate::controllers::round::CERTIFICATE_RECHECK);
    }

    #[test]
    fn paused_and_unreferenced_write_nothing() {
        let now = now();
        for outcome in [Outcome::Paused, Outcome::Unreferenced] {
            assert!(
                report(
                    ComponentKind::Etcd,
                    "e",
                    &ComponentStatus::default(),
                    None,
                    outcome,
                    &now
                )
                .is_none()
            );
        }
    }

    #[test]
    fn an_applied_component_reports_its_counts_and_rolls_out_only_after_it_served() {
        let now = now();
        let (provisioning, _) = report(
            ComponentKind::Etcd,
            "demo-etcd",
            &ComponentStatus::default(),
            Some(1),
            Outcome::Applied(applied(false, 1)),
            &now,
        )
        .unwrap();
        assert_eq!(condition(&provisioning, READY).reason, "Provisioning");
        assert_eq!(
            condition(&provisioning, ROLLING_OUT).status,
            "False",
            "a first provisioning is no roll"
        );
        assert_eq!(provisioning.replicas_display.as_deref(), Some("1/3"));
        let (ready, action) = report(
            ComponentKind::Etcd,
            "demo-etcd",
            &provisioning,
            Some(1),
            Outcome::Applied(applied(true, 3)),
            &now,
        )
        .unwrap();
        assert!(ready.ready && is_true(&ready.conditions, READY));
        assert_eq!(ready.version.as_deref(), Some("3.6.8"));
        assert_eq!(ready.endpoints, ["https://demo-etcd-0:2379"]);
        assert!(matches!(action, a if a != Action::await_change()));
        let (rolling, _) = report(
            ComponentKind::Etcd,
            "demo-etcd",
            &ready,
            Some(2),
            Outcome::Applied(applied(false, 2)),
            &now,
        )
        .unwrap();
        assert!(
            is_true(&rolling.conditions, ROLLING_OUT),
            "a component that served rolls out"
        );
    }

    #[test]
    fn an_error_keeps_a_running_components_ready_and_retries_soon() {
        let now = now();
        let error = ReconcileError::NoNamespace;
        let (fresh, action) = report_error(&ComponentStatus::default(), Some(1), &error, &now);
        assert_eq!(action, Action::requeue(Duration::from_secs(5)));
        assert_eq!(condition(&fresh, READY).status, "False");
        let running = ComponentStatus {
            version: Some("3.6.8".into()),
            ready: true,
            ..ComponentStatus::default()
        };
        let (after, _) = report_error(&running, Some(1), &error, &now);
        assert!(after.ready);
        assert!(after.conditions.iter().all(|c| c.type_ != READY));
    }
}
