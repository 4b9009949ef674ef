//! Sleep and wake of a nested control plane (docs/design.md §12), pure: the clock and what
//! the components report are arguments.
//!
//! - `spec.hibernation.enabled` says what is wanted; the schedules set it at their runs
//!   ([`scheduled`]), as Gardener's hibernation schedules set a Shoot's.
//! - [`decide`] turns what is wanted, the phase shown and what the components report into
//!   the next phase: `Awake` → `FallingAsleep` (controller-manager, apiserver, then etcd
//!   scale to zero) → `Sleeping` → `WakingUp` (etcd, apiserver, then controller-manager
//!   come back, each once its predecessor is ready) → `Awake`.
//! - Sleep never starts while an upgrade step or a rotation runs ([`busy`]); upgrades,
//!   rotations and backups asked for while asleep start once the control plane is awake
//!   again ([`holds_day2`]).

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::api::{HibernationSchedule, NestedControlPlane, NestedControlPlaneStatus};
use crate::backup::schedule::{Schedule, ScheduleError};
use crate::status::Reason;

/// The phases of `status.hibernation.phase`.
pub mod phase {
    pub const AWAKE: &str = "Awake";
    pub const FALLING_ASLEEP: &str = "FallingAsleep";
    pub const SLEEPING: &str = "Sleeping";
    pub const WAKING_UP: &str = "WakingUp";
}

/// How far back [`scheduled`] looks for the last run: a capn that was down for longer acts
/// on the runs of the last eight days only (a weekly schedule's last run is among them).
pub const LOOKBACK: SignedDuration = SignedDuration::from_hours(8 * 24);

/// A run of a sleep schedule: at `time`, `spec.hibernation.enabled` becomes `enabled`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub time: Timestamp,
    pub enabled: bool,
}

/// What the schedules say at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scheduled {
    /// The latest run of any schedule after the last one acted on and not after now: the
    /// one to act on. At the same moment, waking wins.
    pub latest: Option<Run>,
    /// The first run of any schedule after now: when to look again.
    pub next: Option<Timestamp>,
}

/// What `schedules` say at `now`, given the last run acted on (or the control plane's
/// creation) `since`.
///
/// # Errors
/// The first schedule that does not parse, with its path (`spec.hibernation.schedules[0].start`).
pub fn scheduled(
    schedules: &[HibernationSchedule],
    since: Timestamp,
    now: Timestamp,
) -> Result<Scheduled, (String, ScheduleError)> {
    let from = since.max(now - LOOKBACK);
    let mut result = Scheduled::default();
    for (i, schedule) in schedules.iter().enumerate() {
        for (field, value, enabled) in [("start", &schedule.start, true), ("end", &schedule.end, false)] {
            let Some(value) = value.as_deref().filter(|v| !v.trim().is_empty()) else {
                continue;
            };
            let parsed = Schedule::parse(value).map_err(|e| (format!("spec.hibernation.schedules[{i}].{field}"), e))?;
            let mut last = None;
            let mut run = parsed.next_after(from);
            while let Some(time) = run.filter(|t| *t <= now) {
                last = Some(time);
                run = parsed.next_after(time);
            }
            if let Some(time) = last {
                let later = result
                    .latest
                    .is_none_or(|l| time > l.time || (time == l.time && !enabled));
                if later {
                    result.latest = Some(Run { time, enabled });
                }
            }
            if let Some(next) = run {
                result.next = Some(result.next.map_or(next, |n| n.min(next)));
            }
        }
    }
    Ok(result)
}

/// What each component reports, in start order: etcd, apiserver, controller-manager.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ComponentState {
    /// Its pods are gone (its status phase is `Sleeping`), or it does not exist.
    pub asleep: bool,
    pub ready: bool,
}

/// The next phase, with the reason and message of the `Hibernated` condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub phase: &'static str,
    pub reason: Reason,
    pub message: String,
}

const NAMES: [&str; 3] = ["etcd", "apiserver", "controller-manager"];

/// The next phase: `wanted` is `spec.hibernation.enabled`, `shown` the phase shown
/// (`None`: never slept), `busy` the operation sleep must wait for ([`busy`]),
/// `components` etcd, apiserver and controller-manager.
pub fn decide(wanted: bool, shown: Option<&str>, busy: Option<&str>, components: [ComponentState; 3]) -> Decision {
    let shown = shown.unwrap_or(phase::AWAKE);
    let decision = |phase, reason, message: String| Decision { phase, reason, message };
    if wanted {
        if shown == phase::AWAKE
            && let Some(operation) = busy
        {
            return decision(
                phase::AWAKE,
                Reason::SleepDeferred,
                format!("sleep waits for {operation} to finish"),
            );
        }
        // Scaled down from the last: the controller-manager, the apiserver, then etcd.
        return match (0..3).rev().find(|i| !components[*i].asleep) {
            None => decision(
                phase::SLEEPING,
                Reason::Sleeping,
                "no control-plane pod runs; the data and Secrets are kept".into(),
            ),
            Some(i) => decision(
                phase::FALLING_ASLEEP,
                Reason::FallingAsleep,
                format!("waiting for the {} to scale to zero", NAMES[i]),
            ),
        };
    }
    if shown == phase::AWAKE {
        return decision(phase::AWAKE, Reason::Awake, "the control plane is awake".into());
    }
    // Woken from the first: etcd, the apiserver, then the controller-manager.
    match (0..3).find(|i| !components[*i].ready) {
        None => decision(phase::AWAKE, Reason::Awake, "the control plane is awake again".into()),
        Some(i) => decision(
            phase::WAKING_UP,
            Reason::WakingUp,
            format!("waiting for the {} to be ready", NAMES[i]),
        ),
    }
}

/// The operation running that sleep waits for, if any: an upgrade step, a CA rotation, an
/// encryption key rotation. Each would be left half-done by a sleep (the failure of
/// Kamaji's issue 993).
pub fn busy(status: &NestedControlPlaneStatus) -> Option<String> {
    if let Some(upgrade) = status
        .upgrade
        .as_ref()
        .filter(|u| u.phase == crate::upgrade::phase::UPGRADING)
    {
        return Some(format!("the upgrade step to {}", upgrade.target));
    }
    if let Some(rotation) = status
        .certificate_authority_rotation
        .as_ref()
        .filter(|r| r.phase != "Completed")
    {
        return Some(format!("the rotation of the {} authority", rotation.authority));
    }
    if status
        .encryption
        .as_ref()
        .and_then(|e| e.rotation.as_ref())
        .is_some_and(|r| r.phase != "Completed")
    {
        return Some("the encryption key rotation".into());
    }
    None
}

/// Whether `spec.hibernation.enabled` asks for sleep.
pub fn wanted(ncp: &NestedControlPlane) -> bool {
    ncp.spec.hibernation.as_ref().and_then(|h| h.enabled).unwrap_or(false)
}

/// The phase `status` shows (`None`: never slept).
pub fn shown(status: Option<&NestedControlPlaneStatus>) -> Option<&str> {
    status.and_then(|s| s.hibernation.as_ref()).map(|h| h.phase.as_str())
}

/// Whether the components are asked to scale to zero: the control plane is falling asleep
/// or sleeps (each still waits for its successor, see [`component_sleeps`]).
pub fn components_sleep(ncp: &NestedControlPlane) -> bool {
    matches!(
        shown(ncp.status.as_ref()),
        Some(phase::FALLING_ASLEEP | phase::SLEEPING)
    )
}

/// Whether a component scales to zero now: the control plane asks for it and the
/// component that depends on it (`successor_asleep`: the apiserver for etcd, the
/// controller-manager for the apiserver, none for the controller-manager) is asleep.
pub fn component_sleeps(ncp: &NestedControlPlane, successor_asleep: bool) -> bool {
    components_sleep(ncp) && successor_asleep
}

/// Whether upgrades, rotations and scheduled work wait: from the moment sleep is asked for
/// (unless an operation sleep waits for runs: it finishes first) until the control plane
/// is awake again.
pub fn holds_day2(wanted: bool, phase: &str, busy: bool) -> bool {
    phase != phase::AWAKE || (wanted && !busy)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn nightly() -> Vec<HibernationSchedule> {
        vec![HibernationSchedule {
            start: Some("0 20 * * *".into()),
            end: Some("0 7 * * *".into()),
        }]
    }

    #[test]
    fn the_latest_run_after_the_last_acted_on_wins() {
        let since = t("2026-12-01T12:00:00Z");
        // Before 20:00: nothing to act on; look again at 20:00.
        let s = scheduled(&nightly(), since, t("2026-12-01T19:59:00Z")).unwrap();
        assert_eq!(s.latest, None);
        assert_eq!(s.next, Some(t("2026-12-01T20:00:00Z")));
        // At 20:00: asleep; next look at 07:00.
        let s = scheduled(&nightly(), since, t("2026-12-01T20:00:00Z")).unwrap();
        assert_eq!(
            s.latest,
            Some(Run {
                time: t("2026-12-01T20:00:00Z"),
                enabled: true
            })
        );
        assert_eq!(s.next, Some(t("2026-12-02T07:00:00Z")));
        // Acted on: the same run is not acted on again.
        let s = scheduled(&nightly(), t("2026-12-01T20:00:00Z"), t("2026-12-01T23:00:00Z")).unwrap();
        assert_eq!(s.latest, None);
        // capn was down from 19:00 until 08:00 the next day: only the wake is acted on.
        let s = scheduled(&nightly(), since, t("2026-12-02T08:00:00Z")).unwrap();
        assert_eq!(
            s.latest,
            Some(Run {
                time: t("2026-12-02T07:00:00Z"),
                enabled: false
            })
        );
    }

    #[test]
    fn a_start_without_an_end_only_puts_to_sleep_and_waking_wins_a_tie() {
        let start_only = vec![HibernationSchedule {
            start: Some("@daily".into()),
            end: None,
        }];
        let s = scheduled(&start_only, t("2026-12-01T12:00:00Z"), t("2026-12-02T06:00:00Z")).unwrap();
        assert_eq!(s.latest.map(|r| r.enabled), Some(true));
        assert_eq!(s.next, Some(t("2026-12-03T00:00:00Z")));
        let both = vec![HibernationSchedule {
            start: Some("0 * * * *".into()),
            end: Some("0 * * * *".into()),
        }];
        let s = scheduled(&both, t("2026-12-01T12:30:00Z"), t("2026-12-01T13:00:00Z")).unwrap();
        assert_eq!(s.latest.map(|r| r.enabled), Some(false));
    }

    #[test]
    fn a_long_outage_looks_back_eight_days_only_and_a_bad_schedule_names_its_path() {
        let every_minute = vec![HibernationSchedule {
            start: Some("* * * * *".into()),
            end: None,
        }];
        let s = scheduled(&every_minute, t("2025-01-01T00:00:00Z"), t("2026-12-01T00:00:30Z")).unwrap();
        assert_eq!(s.latest.map(|r| r.time), Some(t("2026-12-01T00:00:00Z")));
        let bad = vec![
            HibernationSchedule::default(),
            HibernationSchedule {
                start: None,
                end: Some("every morning".into()),
            },
        ];
        let (path, _) = scheduled(&bad, t("2026-12-01T00:00:00Z"), t("2026-12-01T00:00:00Z")).unwrap_err();
        assert_eq!(path, "spec.hibernation.schedules[1].end");
    }

    const UP: ComponentState = ComponentState {
        asleep: false,
        ready: true,
    };
    const DOWN: ComponentState = ComponentState {
        asleep: true,
        ready: false,
    };
    const STARTING: ComponentState = ComponentState {
        asleep: false,
        ready: false,
    };

    #[test]
    fn sleep_scales_down_from_the_controller_manager_and_waits_for_a_running_operation() {
        let d = decide(true, None, Some("the upgrade step to 1.37.2"), [UP; 3]);
        assert_eq!((d.phase, d.reason), (phase::AWAKE, Reason::SleepDeferred));
        let d = decide(true, None, None, [UP; 3]);
        assert_eq!(d.phase, phase::FALLING_ASLEEP);
        assert_eq!(d.message, "waiting for the controller-manager to scale to zero");
        let d = decide(true, Some(phase::FALLING_ASLEEP), None, [UP, UP, DOWN]);
        assert_eq!(d.message, "waiting for the apiserver to scale to zero");
        let d = decide(true, Some(phase::FALLING_ASLEEP), None, [UP, DOWN, DOWN]);
        assert_eq!(d.message, "waiting for the etcd to scale to zero");
        let d = decide(true, Some(phase::FALLING_ASLEEP), None, [DOWN; 3]);
        assert_eq!((d.phase, d.reason), (phase::SLEEPING, Reason::Sleeping));
        // Once falling asleep, nothing defers it (nothing new started meanwhile).
        let d = decide(true, Some(phase::SLEEPING), Some("x"), [DOWN; 3]);
        assert_eq!(d.phase, phase::SLEEPING);
    }

    #[test]
    fn wake_brings_back_etcd_first_and_is_awake_once_all_are_ready() {
        let d = decide(false, Some(phase::SLEEPING), None, [DOWN; 3]);
        assert_eq!(
            (d.phase, d.message.as_str()),
            (phase::WAKING_UP, "waiting for the etcd to be ready")
        );
        let d = decide(false, Some(phase::WAKING_UP), None, [UP, STARTING, DOWN]);
        assert_eq!(d.message, "waiting for the apiserver to be ready");
        let d = decide(false, Some(phase::WAKING_UP), None, [UP, UP, STARTING]);
        assert_eq!(d.message, "waiting for the controller-manager to be ready");
        let d = decide(false, Some(phase::WAKING_UP), None, [UP; 3]);
        assert_eq!((d.phase, d.reason), (phase::AWAKE, Reason::Awake));
        // Never slept: awake, whatever the components say.
        assert_eq!(decide(false, None, None, [STARTING; 3]).phase, phase::AWAKE);
    }

    #[test]
    fn day_two_work_waits_from_the_request_until_awake_but_a_running_operation_finishes() {
        assert!(!holds_day2(false, phase::AWAKE, false));
        assert!(holds_day2(true, phase::AWAKE, false));
        assert!(
            !holds_day2(true, phase::AWAKE, true),
            "the running operation finishes first"
        );
        assert!(holds_day2(false, phase::WAKING_UP, false));
        assert!(holds_day2(true, phase::SLEEPING, false));
    }
}
