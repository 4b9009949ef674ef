//! Conditions and readiness words in one place (docs/design.md §2, CAPI contract), so that no
//! reconciler invents its own.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Condition type: the component or control plane is ready.
pub const READY: &str = "Ready";
/// Condition type (CAPI v1beta2 contract): the control plane can serve.
pub const AVAILABLE: &str = "Available";
/// Condition type (CAPI v1beta2 contract): an upgrade or spec change is rolling out.
pub const ROLLING_OUT: &str = "RollingOut";
/// Condition type: the latest spec was rendered and applied (False: why not).
pub const SYNCED: &str = "Synced";
/// Condition type (CAPI v1beta2 contract): reconciliation is paused.
pub const PAUSED: &str = "Paused";
/// Condition type: the CAs and service-account key exist.
pub const CERTIFICATES_AVAILABLE: &str = "CertificatesAvailable";
/// Condition type (NestedEtcd with `spec.backup`): the last snapshot was uploaded and
/// verified (False: the reason it was not).
pub const BACKUP_SUCCEEDED: &str = "BackupSucceeded";
/// Condition types of the control plane mirroring each component.
pub const ETCD_READY: &str = "EtcdReady";
pub const APISERVER_READY: &str = "APIServerReady";
pub const CONTROLLER_MANAGER_READY: &str = "ControllerManagerReady";

/// Condition on the NestedControlPlane: True while a rotation runs (reason: the phase).
pub const CA_ROTATION: &str = "CertificateAuthorityRotation";
/// Condition type on the NestedControlPlane: a stepped upgrade is in progress (True), or
/// why none moves (False: `UpToDate`, `Completed`, `UpgradeNotAllowed`,
/// `WaitingForPreflight`, `UpgradeHeld`, `UpgradeStepFailed`).
pub const UPGRADING: &str = "Upgrading";
/// Condition type on the NestedControlPlane: the last preflight before an upgrade step
/// (reasons: [`crate::upgrade::preflight_reason`]).
pub const UPGRADE_PREFLIGHT: &str = "UpgradePreflight";
/// Condition type on NestedEtcd: the members etcd lists are the desired ones (False: the
/// step under way, or why no step may be taken).
pub const MEMBERS_SYNCED: &str = "MembersSynced";
/// Condition type on the NestedControlPlane.
pub const PUBLIC_CRDS_SYNCED: &str = "PublicCRDsSynced";

/// Phases shown by `kubectl get` (`status.phase`).
pub mod phase {
    pub const PENDING: &str = "Pending";
    pub const PROVISIONING: &str = "Provisioning";
    pub const READY: &str = "Ready";
    pub const FAILED: &str = "Failed";
}

/// A condition as a reconciler decides it, before it meets the clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConditionUpdate {
    pub type_: &'static str,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

impl ConditionUpdate {
    pub fn new(type_: &'static str, status: bool, reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            type_,
            status,
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// Sets `update` in `conditions`, keeping `lastTransitionTime` when the status did not
/// change (Kubernetes API conventions), and `now` otherwise.
pub fn set_condition(conditions: &mut Vec<Condition>, update: ConditionUpdate, generation: Option<i64>, now: &Time) {
    let status = if update.status { "True" } else { "False" }.to_string();
    let existing = conditions.iter().position(|c| c.type_ == update.type_);
    let last_transition_time = match existing.map(|i| &conditions[i]) {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => now.clone(),
    };
    let condition = Condition {
        type_: update.type_.to_string(),
        status,
        reason: update.reason,
        message: update.message,
        observed_generation: generation,
        last_transition_time,
    };
    match existing {
        Some(i) => conditions[i] = condition,
        None => conditions.push(condition),
    }
}

/// Whether `conditions` holds `type_` with status `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    conditions.iter().any(|c| c.type_ == type_ && c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Time {
        Time(s.parse().unwrap())
    }

    #[test]
    fn transition_time_moves_only_when_status_changes() {
        let mut cs = Vec::new();
        set_condition(
            &mut cs,
            ConditionUpdate::new(READY, false, "Waiting", "a"),
            Some(1),
            &t("2026-01-01T00:00:00Z"),
        );
        set_condition(
            &mut cs,
            ConditionUpdate::new(READY, false, "StillWaiting", "b"),
            Some(2),
            &t("2026-01-02T00:00:00Z"),
        );
        assert_eq!(cs.len(), 1);
        assert_eq!(cs[0].last_transition_time, t("2026-01-01T00:00:00Z"));
        assert_eq!(cs[0].reason, "StillWaiting");
        assert_eq!(cs[0].observed_generation, Some(2));
        set_condition(
            &mut cs,
            ConditionUpdate::new(READY, true, "Ready", "c"),
            Some(2),
            &t("2026-01-03T00:00:00Z"),
        );
        assert_eq!(cs[0].last_transition_time, t("2026-01-03T00:00:00Z"));
        assert!(is_true(&cs, READY));
        assert!(!is_true(&cs, AVAILABLE));
    }
}
