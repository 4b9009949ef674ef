//! etcd's space, pure: whether a `NOSPACE` alarm is raised, whether the data would fit the
//! quota again once defragmented, the order members are defragmented in, and when the
//! recorded sizes are worth a status write (docs/guide/etcd-operations.md).
//!
//! The recovery is etcd's own (<https://etcd.io/docs/v3.6/op-guide/maintenance/#space-quota>):
//! compact the history, defragment every member, disarm the alarm.

use crate::api::{EtcdMemberSpace, EtcdSpaceStatus};

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

    #[test]
    fn bytes_read_as_people_write_them() {
        assert_eq!(human(512), "512B");
        assert_eq!(human(8 << 20), "8.0MiB");
        assert_eq!(human(344_870_912), "328.9MiB");
    }
}
