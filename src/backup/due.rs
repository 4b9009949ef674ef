//! When a NestedEtcd's next snapshot is due (pure: the clock is an argument).
//!
//! - On demand: the annotation `controlplane.cluster.x-k8s.io/backup-now` holds a value
//!   that `status.backup.lastRequest` does not: due now.
//! - Scheduled: the first run of the schedule after the last verified snapshot (or after
//!   the resource was created, when there is none) has passed: due now; otherwise the
//!   controller requeues at that run, and sends nothing before it (no polling).
//! - A capn that was down across several runs takes one snapshot, not one per missed run.
//! - Without `spec.backup` there is nowhere to put a snapshot: a new request is dropped
//!   ([`dropped_request`]), recorded as served and reported, so that a destination added
//!   later does not take a snapshot nobody is waiting for any more.

use k8s_openapi::jiff::Timestamp;

use super::schedule::{Schedule, ScheduleError};

/// Why a snapshot is taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// The `backup-now` annotation's value.
    OnDemand(String),
    /// The schedule's run at this time.
    Scheduled(Timestamp),
}

/// The decision for one NestedEtcd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Due {
    /// Take a snapshot now.
    Now(Trigger),
    /// Nothing to do before this time (the next scheduled run).
    At(Timestamp),
    /// No schedule and no request: nothing until the spec or the annotation changes.
    Never,
}

/// Decides [`Due`]. `last_snapshot` is the time of the last verified snapshot, `created`
/// the resource's creation time, `request` the annotation's value and `last_request` the
/// one served last.
///
/// # Errors
/// [`ScheduleError`] for a schedule that does not parse.
pub fn due(
    schedule: Option<&str>,
    request: Option<&str>,
    last_request: Option<&str>,
    last_snapshot: Option<Timestamp>,
    created: Timestamp,
    now: Timestamp,
) -> Result<Due, ScheduleError> {
    let schedule = schedule
        .filter(|s| !s.trim().is_empty())
        .map(Schedule::parse)
        .transpose()?;
    if let Some(request) = new_request(request, last_request) {
        return Ok(Due::Now(Trigger::OnDemand(request.to_string())));
    }
    let Some(schedule) = schedule else {
        return Ok(Due::Never);
    };
    let since = last_snapshot.unwrap_or(created);
    Ok(match schedule.next_after(since) {
        Some(run) if run <= now => Due::Now(Trigger::Scheduled(run)),
        Some(run) => Due::At(run),
        None => Due::Never,
    })
}

/// The `backup-now` value `request` when it asks for a snapshot: not empty, and not the one
/// served last (`last_request`).
fn new_request<'a>(request: Option<&'a str>, last_request: Option<&str>) -> Option<&'a str> {
    request
        .map(str::trim)
        .filter(|r| !r.is_empty() && Some(*r) != last_request)
}

/// The decision for a NestedEtcd without `spec.backup`: the `backup-now` value to drop, when
/// `request` asks for a snapshot that `last_request` has not served. The caller records it as
/// served (`status.backup.lastRequest`) and says why nothing was taken; a destination added
/// later then takes no snapshot for it. `None`: nothing asked, or already answered.
pub fn dropped_request(request: Option<&str>, last_request: Option<&str>) -> Option<String> {
    new_request(request, last_request).map(str::to_string)
}

/// The schedule's gap after `since` (the last verified snapshot, else the resource's
/// creation): from it to the run the next snapshot is for, in seconds. What "a backup older
/// than twice its schedule" is measured with (`capn_etcd_backup_interval_seconds`): for
/// `0 3 * * 1-5` after Friday's snapshot it is the whole weekend, not a day. `None` without
/// a schedule, for one that does not parse, or one that never runs again.
pub fn interval(schedule: Option<&str>, since: Timestamp) -> Option<i64> {
    let schedule = Schedule::parse(schedule.filter(|s| !s.trim().is_empty())?).ok()?;
    let next = schedule.next_after(since)?;
    Some(next.as_second() - since.as_second())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    const CREATED: &str = "2026-12-01T01:30:00Z";

    #[test]
    fn a_new_request_is_due_at_once_and_a_served_one_is_not() {
        let now = t("2026-12-01T02:00:00Z");
        assert_eq!(
            due(None, Some("1"), None, None, t(CREATED), now).unwrap(),
            Due::Now(Trigger::OnDemand("1".into()))
        );
        assert_eq!(
            due(None, Some("1"), Some("1"), None, t(CREATED), now).unwrap(),
            Due::Never
        );
        assert_eq!(
            due(None, Some("2"), Some("1"), None, t(CREATED), now).unwrap(),
            Due::Now(Trigger::OnDemand("2".into()))
        );
    }

    #[test]
    fn the_schedule_waits_for_its_next_run_after_the_last_snapshot() {
        let schedule = Some("0 3 * * *");
        // Never backed up: the first run after creation.
        assert_eq!(
            due(schedule, None, None, None, t(CREATED), t("2026-12-01T02:59:00Z")).unwrap(),
            Due::At(t("2026-12-01T03:00:00Z"))
        );
        assert_eq!(
            due(schedule, None, None, None, t(CREATED), t("2026-12-01T03:00:00Z")).unwrap(),
            Due::Now(Trigger::Scheduled(t("2026-12-01T03:00:00Z")))
        );
        // Backed up at 03:00:04: the next is tomorrow.
        let last = Some(t("2026-12-01T03:00:04Z"));
        assert_eq!(
            due(schedule, None, None, last, t(CREATED), t("2026-12-01T03:00:10Z")).unwrap(),
            Due::At(t("2026-12-02T03:00:00Z"))
        );
        // Down for three days: one snapshot, for the first missed run.
        assert_eq!(
            due(schedule, None, None, last, t(CREATED), t("2026-12-04T12:00:00Z")).unwrap(),
            Due::Now(Trigger::Scheduled(t("2026-12-02T03:00:00Z")))
        );
    }

    #[test]
    fn the_interval_runs_from_the_last_snapshot_to_the_run_after_it() {
        assert_eq!(interval(Some("0 3 * * *"), t("2026-12-01T03:00:04Z")), Some(86_400 - 4));
        // Friday's snapshot of a weekday schedule: the next is Monday's.
        assert_eq!(
            interval(Some("0 3 * * 1-5"), t("2026-12-04T03:00:00Z")),
            Some(3 * 86_400)
        );
        assert_eq!(interval(Some("*/15 * * * *"), t("2026-12-01T03:00:00Z")), Some(900));
        assert_eq!(interval(None, t(CREATED)), None);
        assert_eq!(interval(Some(" "), t(CREATED)), None);
        assert_eq!(interval(Some("every day"), t(CREATED)), None);
    }

    #[test]
    fn a_failed_snapshot_does_not_move_the_schedule() {
        // The last *verified* snapshot is the reference: after a failure at 03:00 the run is
        // still due, and the controller retries it (with its back-off).
        let last = Some(t("2026-11-30T03:00:02Z"));
        assert_eq!(
            due(
                Some("0 3 * * *"),
                None,
                None,
                last,
                t(CREATED),
                t("2026-12-01T03:05:00Z")
            )
            .unwrap(),
            Due::Now(Trigger::Scheduled(t("2026-12-01T03:00:00Z")))
        );
    }

    #[test]
    fn a_request_without_a_destination_is_dropped_once_and_then_served() {
        assert_eq!(dropped_request(Some("1"), None), Some("1".into()));
        assert_eq!(dropped_request(Some(" 2 "), Some("1")), Some("2".into()));
        // Recorded as served: neither dropped again nor, once a destination is set, due.
        assert_eq!(dropped_request(Some("1"), Some("1")), None);
        assert_eq!(
            due(None, Some("1"), Some("1"), None, t(CREATED), t(CREATED)).unwrap(),
            Due::Never
        );
        assert_eq!(dropped_request(None, None), None);
        assert_eq!(dropped_request(Some(" "), None), None);
    }

    #[test]
    fn no_schedule_and_no_request_is_never_and_a_bad_schedule_is_an_error() {
        assert_eq!(due(None, None, None, None, t(CREATED), t(CREATED)).unwrap(), Due::Never);
        assert_eq!(
            due(Some(" "), None, None, None, t(CREATED), t(CREATED)).unwrap(),
            Due::Never
        );
        assert!(due(Some("every day"), None, None, None, t(CREATED), t(CREATED)).is_err());
    }
}
