//! Backup schedules: cron expressions in the syntax of Kubernetes CronJobs (five fields:
//! minute, hour, day of month, month, day of week; or `@hourly`, `@daily`, `@weekly`,
//! `@monthly`, `@yearly`), evaluated in UTC. Parsing and evaluation are the `croner`
//! crate's; this module fixes the dialect (no seconds, no years: a CronJob's schedule) and
//! turns "next run" into a requeue delay.

use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use k8s_openapi::jiff::{Timestamp, tz::TimeZone};

/// A parsed backup schedule.
#[derive(Clone, Debug)]
pub struct Schedule {
    cron: Cron,
}

/// A schedule that cannot be parsed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.message_at("spec.backup.schedule"))]
pub struct ScheduleError {
    /// The value as written.
    pub value: String,
    /// What the parser said.
    pub detail: String,
}

impl ScheduleError {
    /// What is wrong and what is allowed, for the schedule at field `path` (backups,
    /// defragmentation, key rotation and hibernation share the dialect and the words).
    pub fn message_at(&self, path: &str) -> String {
        format!(
            "{path}: Invalid value: {:?}: {}; a schedule is a cron expression of five fields (minute hour day-of-month month day-of-week, like \"0 3 * * *\"), or @hourly, @daily, @weekly, @monthly, @yearly, evaluated in UTC",
            self.value, self.detail
        )
    }

    /// Condition reason.
    pub fn reason(&self) -> &'static str {
        "InvalidBackupSchedule"
    }
}

impl Schedule {
    /// Parses `value` as a CronJob schedule.
    ///
    /// # Errors
    /// [`ScheduleError`] naming the value and what is allowed: more or fewer than five fields,
    /// a value out of range (minute 60), an unknown name.
    pub fn parse(value: &str) -> Result<Self, ScheduleError> {
        let error = |detail: String| ScheduleError {
            value: value.to_string(),
            detail,
        };
        let trimmed = value.trim();
        // Counted here as well as by croner, so the message says what is wrong.
        if !trimmed.starts_with('@') && trimmed.split_whitespace().count() != 5 {
            return Err(error(format!("it has {} fields", trimmed.split_whitespace().count())));
        }
        let parser = CronParser::builder()
            .seconds(Seconds::Disallowed)
            .year(Year::Disallowed)
            .build();
        let cron = parser.parse(trimmed).map_err(|e| error(e.to_string()))?;
        Ok(Self { cron })
    }

    /// The first run strictly after `after` (UTC), or `None` when the schedule never fires
    /// again (a date that does not exist, like `0 0 30 2 *`).
    pub fn next_after(&self, after: Timestamp) -> Option<Timestamp> {
        let zoned = after.to_zoned(TimeZone::UTC);
        self.cron
            .find_next_occurrence(&zoned, false)
            .ok()
            .map(|z| z.timestamp())
    }

    /// Whether a run is due at `now`: the first run after `last` (the previous snapshot's
    /// time, or the resource's creation when there was none) is not in the future.
    pub fn due(&self, last: Timestamp, now: Timestamp) -> bool {
        self.next_after(last).is_some_and(|next| next <= now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn daily_at_three_runs_next_at_three_utc() {
        let s = Schedule::parse("0 3 * * *").unwrap();
        assert_eq!(s.next_after(t("2026-12-01T02:59:59Z")), Some(t("2026-12-01T03:00:00Z")));
        // Strictly after: a run exactly now is the previous one; the next is tomorrow.
        assert_eq!(s.next_after(t("2026-12-01T03:00:00Z")), Some(t("2026-12-02T03:00:00Z")));
    }

    #[test]
    fn steps_ranges_and_names_follow_cron() {
        let s = Schedule::parse("*/15 8-17 * * mon-fri").unwrap();
        // 2026-12-05 is a Saturday: the next run is Monday 08:00.
        assert_eq!(s.next_after(t("2026-12-04T17:50:00Z")), Some(t("2026-12-07T08:00:00Z")));
        assert_eq!(s.next_after(t("2026-12-07T08:00:00Z")), Some(t("2026-12-07T08:15:00Z")));
    }

    #[test]
    fn aliases_are_accepted() {
        let s = Schedule::parse("@hourly").unwrap();
        assert_eq!(s.next_after(t("2026-12-01T04:10:00Z")), Some(t("2026-12-01T05:00:00Z")));
        let s = Schedule::parse("@daily").unwrap();
        assert_eq!(s.next_after(t("2026-12-01T04:10:00Z")), Some(t("2026-12-02T00:00:00Z")));
    }

    #[test]
    fn seconds_years_and_garbage_are_refused_with_the_value_and_the_syntax() {
        for bad in [
            "*/5 * * * * *",
            "0 0 3 * * * 2027",
            "0 3 * *",
            "",
            "61 * * * *",
            "0 25 * * *",
            "every day",
        ] {
            let e = Schedule::parse(bad).expect_err(bad);
            let text = e.to_string();
            assert!(text.contains(&format!("{bad:?}")), "{text}");
            assert!(text.contains("five fields"), "{text}");
            assert_eq!(e.reason(), "InvalidBackupSchedule");
        }
    }

    #[test]
    fn due_when_the_run_after_the_last_snapshot_has_passed() {
        let s = Schedule::parse("0 * * * *").unwrap();
        let last = t("2026-12-01T04:00:05Z");
        assert!(!s.due(last, t("2026-12-01T04:59:59Z")));
        assert!(s.due(last, t("2026-12-01T05:00:00Z")));
        // A capn that was down for a day takes one snapshot, not 24: due is a yes/no.
        assert!(s.due(last, t("2026-12-02T04:30:00Z")));
    }
}
