//! etcd's space, pure: whether a `NOSPACE` alarm is raised, whether the data would fit the
//! quota again once defragmented, the order members are defragmented in, and when the
//! recorded sizes are worth a status write (docs/guide/etcd-operations.md).
//!
//! The recovery is etcd's own (<https://etcd.io/docs/v3.6/op-guide/maintenance/#space-quota>):
//! compact the history, defragment every member, disarm the alarm.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::api::{EtcdMemberSpace, EtcdSpaceStatus};
use crate::backup::due::{Due, Trigger, due};
use crate::backup::schedule::ScheduleError;

/// The alarm etcd raises when its database reaches the quota (`AlarmType_NOSPACE`); a
/// member's Status lists the cluster's alarms in `errors` as `memberID:<id> alarm:NOSPACE`.
pub const NOSPACE: &str = "NOSPACE";

/// The share of the quota (in 1/100) below which every member's data must be before capn
/// disarms the alarm: with less room, the next writes would raise it again at once.
pub const DISARM_BELOW_PERCENT: i64 = 90;

/// Whether a member's Status `errors` report the `NOSPACE` alarm.
pub fn reports_nospace(errors: &[String]) -> bool {
    errors.iter().any(|e| e.contains(NOSPACE))
}

/// Whether a member's Status `errors` report anything besides alarms. Alarms are the
/// cluster's, listed by every member alike: `NOSPACE` says nothing about the member that
/// reports it (it answers, it knows a leader), so it must not count as the member being
/// unhealthy, which would refuse membership changes and count towards its replacement.
pub fn reports_member_errors(errors: &[String]) -> bool {
    errors.iter().any(|e| !e.contains("alarm:"))
}

/// Whether the data would fit under the quota with room to write again: every member's
/// in-use size (after compaction, what a defragmentation shrinks its file to) below
/// [`DISARM_BELOW_PERCENT`] of the quota. `false` without any size.
pub fn fits_after_defragmentation(in_use: &[i64], quota: i64) -> bool {
    !in_use.is_empty()
        && in_use
            .iter()
            .all(|b| b.saturating_mul(100) < quota.saturating_mul(DISARM_BELOW_PERCENT))
}

/// One member to defragment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Defragmentable {
    pub name: String,
    pub id: u64,
    pub client_url: String,
}

/// The order members are defragmented in: followers first (by name), the leader last. A
/// defragmentation blocks the member's reads and writes while it rewrites its file; done on
/// the leader it stalls every write of the cluster, and a leader that stops answering
/// heartbeats may cost an election, so it goes last, after the followers proved the step.
pub fn defragmentation_order(mut members: Vec<Defragmentable>, leader: u64) -> Vec<Defragmentable> {
    members.sort_by(|a, b| (a.id == leader, &a.name).cmp(&(b.id == leader, &b.name)));
    members
}

/// What `status.etcdSpace.lastDefragmentation.trigger` says for a defragmentation on
/// `spec.defragmentation.schedule`.
pub const SCHEDULE: &str = "Schedule";
/// ... and for one because free pages reached `spec.defragmentation.thresholdPercent`.
pub const THRESHOLD: &str = "Threshold";

/// How long after any defragmentation the threshold may not fire again: a file that a
/// defragmentation did not shrink (free pages the apiserver has not compacted yet are not
/// free) would otherwise keep a member stalled every pass.
pub const THRESHOLD_PAUSE: Duration = Duration::from_secs(10 * 60);

/// Why a defragmentation (outside `NOSPACE`) is due now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DefragmentationDue {
    /// The schedule's run at this time came.
    Schedule(Timestamp),
    /// This member's free pages reached the threshold.
    Threshold { member: String, free: i64 },
}

impl DefragmentationDue {
    /// The word recorded as the defragmentation's trigger.
    pub fn trigger(&self) -> &'static str {
        match self {
            Self::Schedule(_) => SCHEDULE,
            Self::Threshold { .. } => THRESHOLD,
        }
    }
}

/// Whether a defragmentation is due at `now`, outside `NOSPACE` recovery: the schedule's
/// first run after the last defragmentation (or after the NestedEtcd was made) has come
/// (the backups' rule, [`crate::backup::due`]), or a member's free pages
/// (`dbSize - dbSizeInUse`, bytes) reach `threshold_percent` of `quota` (bytes) and the
/// last defragmentation is [`THRESHOLD_PAUSE`] old or more.
///
/// # Errors
/// The schedule is no CronJob schedule.
pub fn defragmentation_due(
    schedule: Option<&str>,
    threshold_percent: Option<i64>,
    quota: i64,
    members: &[EtcdMemberSpace],
    last: Option<Timestamp>,
    created: Timestamp,
    now: Timestamp,
) -> Result<Option<DefragmentationDue>, ScheduleError> {
    if schedule.is_some()
        && let Due::Now(Trigger::Scheduled(run)) = due(schedule, None, None, last, created, now)?
    {
        return Ok(Some(DefragmentationDue::Schedule(run)));
    }
    let paused = last.is_some_and(|last| now.duration_since(last).unsigned_abs() < THRESHOLD_PAUSE);
    let Some(percent) = threshold_percent.filter(|_| !paused) else {
        return Ok(None);
    };
    Ok(members
        .iter()
        .map(|m| (m, m.db_size.saturating_sub(m.db_size_in_use)))
        .filter(|(_, free)| free.saturating_mul(100) >= quota.saturating_mul(percent))
        .max_by_key(|(_, free)| *free)
        .map(|(m, free)| DefragmentationDue::Threshold {
            member: m.name.clone(),
            free,
        }))
}

/// Whether the sizes read now differ enough from those recorded to write them: another
/// quota, another set of members, or a size that moved by 1/64 of the quota or more.
pub fn worth_recording(recorded: Option<&EtcdSpaceStatus>, quota: i64, members: &[EtcdMemberSpace]) -> bool {
    let Some(recorded) = recorded else {
        return true;
    };
    if recorded.quota_backend_bytes != quota || recorded.members.len() != members.len() {
        return true;
    }
    let step = (quota / 64).max(1);
    recorded.members.iter().zip(members).any(|(a, b)| {
        a.name != b.name || (a.db_size - b.db_size).abs() >= step || (a.db_size_in_use - b.db_size_in_use).abs() >= step
    })
}

/// Bytes as people read them: `12.3MiB`.
pub fn human(bytes: i64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    #[allow(clippy::cast_precision_loss)] // display only
    let mut value = bytes as f64;
    let mut unit = 0;
    while value.abs() >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes}B")
    } else {
        format!("{value:.1}{}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nospace_is_read_from_the_status_errors() {
        assert!(reports_nospace(&["memberID:8e9e05c52164694d alarm:NOSPACE ".into()]));
        assert!(!reports_nospace(&["memberID:1 alarm:CORRUPT ".into()]));
        assert!(!reports_nospace(&[]));
    }

    #[test]
    fn an_alarm_is_not_an_error_of_the_member_that_reports_it() {
        assert!(!reports_member_errors(&[
            "memberID:8e9e05c52164694d alarm:NOSPACE ".into()
        ]));
        assert!(reports_member_errors(&["etcdserver: no leader".into()]));
        assert!(!reports_member_errors(&[]));
    }

    #[test]
    fn the_alarm_is_disarmed_only_when_every_member_fits_below_ninety_percent() {
        assert!(fits_after_defragmentation(&[10, 89], 100));
        assert!(!fits_after_defragmentation(&[10, 90], 100));
        assert!(!fits_after_defragmentation(&[], 100));
    }

    #[test]
    fn followers_are_defragmented_first_and_the_leader_last() {
        let member = |name: &str, id| Defragmentable {
            name: name.into(),
            id,
            client_url: format!("https://{name}:2379"),
        };
        let order = defragmentation_order(vec![member("e-0", 1), member("e-2", 3), member("e-1", 2)], 1);
        let names: Vec<&str> = order.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["e-1", "e-2", "e-0"]);
    }

    #[test]
    fn sizes_are_recorded_when_they_moved_by_a_sixty_fourth_of_the_quota() {
        let space = |size| EtcdMemberSpace {
            name: "e-0".into(),
            db_size: size,
            db_size_in_use: size,
        };
        let recorded = EtcdSpaceStatus {
            quota_backend_bytes: 6400,
            members: vec![space(1000)],
            last_defragmentation: None,
        };
        assert!(!worth_recording(Some(&recorded), 6400, &[space(1099)]));
        assert!(worth_recording(Some(&recorded), 6400, &[space(1100)]));
        assert!(worth_recording(Some(&recorded), 8000, &[space(1000)]));
        assert!(worth_recording(None, 6400, &[space(1000)]));
        assert!(worth_recording(Some(&recorded), 6400, &[space(1000), space(1000)]));
    }

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn sized(name: &str, db_size: i64, db_size_in_use: i64) -> EtcdMemberSpace {
        EtcdMemberSpace {
            name: name.into(),
            db_size,
            db_size_in_use,
        }
    }

    #[test]
    fn the_schedule_is_due_at_its_first_run_after_the_last_defragmentation() {
        let created = t("2026-12-01T00:00:00Z");
        let daily = Some("0 3 * * *");
        let members = [sized("e-0", 100, 100)];
        let at = |last: Option<&str>, now: &str| {
            defragmentation_due(daily, None, 1000, &members, last.map(t), created, t(now)).unwrap()
        };
        assert_eq!(at(None, "2026-12-01T02:59:00Z"), None);
        assert_eq!(
            at(None, "2026-12-01T03:00:05Z"),
            Some(DefragmentationDue::Schedule(t("2026-12-01T03:00:00Z")))
        );
        assert_eq!(at(Some("2026-12-01T03:00:07Z"), "2026-12-01T09:00:00Z"), None);
        // A capn that was down for three days runs it once.
        assert_eq!(
            at(Some("2026-12-01T03:00:07Z"), "2026-12-04T12:00:00Z"),
            Some(DefragmentationDue::Schedule(t("2026-12-02T03:00:00Z")))
        );
        assert!(
            defragmentation_due(
                Some("0 3 * *"),
                None,
                1000,
                &members,
                None,
                created,
                t("2026-12-02T00:00:00Z")
            )
            .is_err()
        );
    }

    #[test]
    fn the_threshold_fires_on_the_member_with_most_free_pages_and_pauses_after_a_defragmentation() {
        let now = t("2026-12-01T12:00:00Z");
        let created = t("2026-12-01T00:00:00Z");
        let members = [sized("e-0", 400, 200), sized("e-1", 600, 300), sized("e-2", 300, 290)];
        let due_at = |percent, last: Option<&str>| {
            defragmentation_due(None, percent, 1000, &members, last.map(t), created, now).unwrap()
        };
        // 300 free bytes of a 1000-byte quota: 30%.
        assert_eq!(
            due_at(Some(25), None),
            Some(DefragmentationDue::Threshold {
                member: "e-1".into(),
                free: 300
            })
        );
        assert_eq!(due_at(Some(30), None).map(|d| d.trigger()), Some(THRESHOLD));
        assert_eq!(due_at(Some(31), None), None);
        assert_eq!(due_at(None, None), None, "turned off");
        assert_eq!(
            due_at(Some(25), Some("2026-12-01T11:55:00Z")),
            None,
            "paused 10 minutes"
        );
        assert!(due_at(Some(25), Some("2026-12-01T11:49:59Z")).is_some());
    }

    #[test]
    fn bytes_read_as_people_write_them() {
        assert_eq!(human(512), "512B");
        assert_eq!(human(8 << 20), "8.0MiB");
        assert_eq!(human(344_870_912), "328.9MiB");
    }
}
