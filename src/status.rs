//! Conditions and readiness words in one place (docs/design.md §2, CAPI contract), so that no
//! reconciler invents its own: the condition types, the typed [`Reason`]s with whether each
//! is a failure (which decides an Event's type), and [`set_condition`].

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
/// why none moves (False: see the reasons whose [`Reason::conditions`] name it).
pub const UPGRADING: &str = "Upgrading";
/// True while a rotation of the encryption-at-rest key runs (`EncryptionKeyRotation`).
pub const ENCRYPTION_KEY_ROTATION: &str = "EncryptionKeyRotation";
/// Condition type on the NestedControlPlane: the last preflight before an upgrade step
/// (reasons: [`crate::upgrade::preflight_reason`]).
pub const UPGRADE_PREFLIGHT: &str = "UpgradePreflight";
/// Condition type on NestedEtcd: the members etcd lists are the desired ones (False: the
/// step under way, or why no step may be taken).
pub const MEMBERS_SYNCED: &str = "MembersSynced";
/// Condition type on NestedEtcd: True while etcd's `NOSPACE` alarm is raised (it accepts
/// only reads and deletes), with the quota and the sizes in the message.
pub const ETCD_SPACE_EXHAUSTED: &str = "EtcdSpaceExhausted";
/// Condition type on the NestedControlPlane.
pub const PUBLIC_CRDS_SYNCED: &str = "PublicCRDsSynced";
/// Condition type on the NestedControlPlane: the syncer runs the tenant's pods in the super
/// cluster (docs/design.md §11).
pub const WORKLOADS_SYNCED: &str = "WorkloadsSynced";
/// Condition type on the NestedControlPlane, set once one of capn's watches has failed:
/// False while a watch capn depends on fails (`/readyz` and `capn_watch_failing` say the
/// same), True once every watch works again.
pub const WATCHES_HEALTHY: &str = "WatchesHealthy";

/// Condition type on the NestedControlPlane: True while it sleeps (`spec.hibernation`),
/// no control-plane pod running; False while awake, falling asleep or waking up (the reason
/// says which).
pub const HIBERNATED: &str = "Hibernated";

/// Phases shown by `kubectl get` (`status.phase`).
pub mod phase {
    pub const PENDING: &str = "Pending";
    /// The control plane sleeps: the component's pods are scaled to zero, its data kept.
    pub const SLEEPING: &str = "Sleeping";
    pub const PROVISIONING: &str = "Provisioning";
    pub const READY: &str = "Ready";
    pub const FAILED: &str = "Failed";
}

/// Declares [`Reason`]: each reason once, with whether it reports a failure, the condition
/// types it is set on, and what it means (the book's table, docs/reference/conditions.md, is
/// generated from these). A reason cannot be added without saying whether it is a failure.
macro_rules! reasons {
    ($(
        $(#[$doc:meta])*
        $name:ident: $severity:ident, [$($condition:expr),* $(,)?], $meaning:literal;
    )+) => {
        /// Why a condition has its status: the `reason` word of capn's own conditions, and of
        /// the Events that report them. Errors carry reasons of their own (each error enum's
        /// `reason()`), which are always failures; see [`ConditionUpdate::error`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Reason {
            $($(#[$doc])* $name,)+
        }

        impl Reason {
            /// Every reason, in declaration order.
            pub const ALL: &[Reason] = &[$(Reason::$name),+];

            /// The reason's word in conditions and Events (`WaitingForEtcd`).
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Reason::$name => stringify!($name),)+
                }
            }

            /// Whether the reason reports a failure someone must look at (Warning Event), as
            /// opposed to waiting, progress or success (Normal Event, or none).
            pub const fn is_failure(self) -> bool {
                match self {
                    $(Reason::$name => reasons!(@failure $severity),)+
                }
            }

            /// The condition types this reason is set on (none: it names Events only).
            pub fn conditions(self) -> &'static [&'static str] {
                match self {
                    $(Reason::$name => &[$($condition),*],)+
                }
            }

            /// One sentence: what the reason means and, for a failure, what to do.
            pub const fn meaning(self) -> &'static str {
                match self {
                    $(Reason::$name => $meaning,)+
                }
            }
        }
    };
    (@failure failure) => { true };
    (@failure progress) => { false };
    (@failure success) => { false };
}

reasons! {
    // Ready (components, NestedCluster), Available and the control plane's component mirrors.
    Ready: success, [READY, ETCD_READY, APISERVER_READY, CONTROLLER_MANAGER_READY],
        "The component serves with every replica ready.";
    Available: success, [AVAILABLE], "etcd, apiserver and controller-manager are ready.";
    Provisioned: success, [READY], "The NestedCluster's control plane endpoint is known.";
    Provisioning: progress, [READY], "The component was applied; its pods are not all ready yet.";
    NotReady: progress, [ETCD_READY, APISERVER_READY, CONTROLLER_MANAGER_READY],
        "The component is on its way; its own Ready condition tells the progress.";
    ComponentsNotReady: progress, [AVAILABLE, UPGRADE_PREFLIGHT],
        "Not every component is ready yet; the message names which.";
    ComponentMissing: failure, [ETCD_READY, APISERVER_READY, CONTROLLER_MANAGER_READY],
        "The component resource named in the NestedControlPlane's spec does not exist: create it or remove the reference.";
    WaitingForEtcd: progress, [READY, ROLLING_OUT, SYNCED], "The component waits for etcd to be ready.";
    WaitingForAPIServer: progress, [READY, ROLLING_OUT], "The controller-manager waits for the apiserver to be ready.";
    WaitingForService: progress, [READY, ROLLING_OUT], "The apiserver waits for its Service to have an address.";
    WaitingForCertificates: progress, [READY, ROLLING_OUT, MEMBERS_SYNCED],
        "The component waits for the control plane's CAs and Secrets.";
    WaitingForControlPlane: progress, [READY], "The NestedCluster waits for a NestedControlPlane with an endpoint.";
    // Paused
    Paused: success, [PAUSED], "Reconciliation is paused (cluster.x-k8s.io/paused or the Cluster's spec.paused).";
    NotPaused: success, [PAUSED], "Reconciliation runs.";
    // RollingOut
    RollingOut: progress, [ROLLING_OUT], "Pods that served are being replaced with the new spec or release.";
    RolledOut: success, [ROLLING_OUT], "The component runs its desired spec and release.";
    NotRollingOut: success, [ROLLING_OUT], "Every component runs its desired release.";
    // Synced, CertificatesAvailable
    Applied: success, [SYNCED], "The latest spec was rendered from the channel and applied.";
    Valid: success, [SYNCED], "The NestedControlPlane's spec follows every field rule.";
    CertificatesAvailable: success, [CERTIFICATES_AVAILABLE], "The CAs and the service-account key exist.";
    // Upgrading, UpgradePreflight
    UpToDate: success, [UPGRADING], "The control plane runs the release its spec asks for.";
    Upgrading: progress, [UPGRADING], "An upgrade step is rolling out.";
    Preflight: progress, [UPGRADING], "The checks before the next upgrade step run.";
    WaitingForPreflight: progress, [UPGRADING], "The next upgrade step waits for its preflight to pass.";
    UpgradeHeld: progress, [UPGRADING], "The upgrade waits for an acknowledgement or a change of spec; the message says which.";
    UpgradeStepFailed: failure, [UPGRADING], "An upgrade step did not complete in time: see the message and the components' conditions.";
    Completed: success, [UPGRADING, CA_ROTATION, ENCRYPTION_KEY_ROTATION], "The upgrade or rotation finished.";
    PreflightPassed: success, [UPGRADE_PREFLIGHT], "Every check before the next upgrade step passed.";
    CertificateRenewalDue: failure, [UPGRADE_PREFLIGHT],
        "A certificate expires or renews within the upgrade step timeout: let the renewal finish first.";
    DeprecatedAPIUsageUnknown: failure, [UPGRADE_PREFLIGHT],
        "The tenant apiserver's deprecated-API metric could not be read, so removed APIs cannot be ruled out.";
    RemovedAPIsInUse: failure, [UPGRADE_PREFLIGHT],
        "Clients of the tenant still use APIs the next release removes: migrate them, or acknowledge the upgrade.";
    // MembersSynced (NestedEtcd)
    MembersSynced: success, [MEMBERS_SYNCED], "etcd lists exactly the desired members.";
    AddingLearner: progress, [MEMBERS_SYNCED], "A member is being added as a learner.";
    ScalingStatefulSet: progress, [MEMBERS_SYNCED], "The etcd StatefulSet is being scaled to the next member count.";
    WaitingForLearner: progress, [MEMBERS_SYNCED], "A learner is starting and catching up.";
    PromotingLearner: progress, [MEMBERS_SYNCED], "A caught-up learner is being promoted to a voting member.";
    RemovingMember: progress, [MEMBERS_SYNCED], "A member is being removed (scale down).";
    ReplacingLostMember: progress, [MEMBERS_SYNCED], "A member that lost its data is being removed, to come back as a learner.";
    EtcdUnreachable: failure, [MEMBERS_SYNCED], "No etcd member answered; nothing is changed until etcd answers.";
    // EtcdSpaceExhausted (NestedEtcd)
    EtcdNoSpace: failure, [ETCD_SPACE_EXHAUSTED],
        "etcd raised its NOSPACE alarm and refuses writes: capn compacts its history, defragments the members one at a time and disarms the alarm.";
    EtcdDataExceedsQuota: failure, [ETCD_SPACE_EXHAUSTED],
        "After compaction the data itself fills the quota: delete data through the tenant's apiserver, or raise spec.storage.quotaBackendBytes (and spec.storage.size).";
    EtcdSpaceAvailable: success, [ETCD_SPACE_EXHAUSTED], "No NOSPACE alarm is raised: etcd accepts writes.";
    // CertificateAuthorityRotation: the phases while it runs, then Completed.
    NewAuthority: progress, [CA_ROTATION], "Rotation phase: the new authority was created.";
    TrustBoth: progress, [CA_ROTATION], "Rotation phase: every component trusts the old and the new authority.";
    SignWithNew: progress, [CA_ROTATION], "Rotation phase: every certificate is signed by the new authority.";
    DropOld: progress, [CA_ROTATION], "Rotation phase: the old authority is being dropped.";
    InvalidRotationRequest: failure, [CA_ROTATION], "The rotation annotation names no known authority: use ca, etcd, front-proxy or sa.";
    UserSuppliedAuthority: failure, [CA_ROTATION], "The authority was supplied by the user; capn does not rotate it.";
    RotationStateLost: failure, [CA_ROTATION], "The rotation's saved state was lost; the rotation starts again from its first phase.";
    AddKey: progress, [ENCRYPTION_KEY_ROTATION], "Key rotation phase: every apiserver reads with the new key.";
    EncryptWithNewKey: progress, [ENCRYPTION_KEY_ROTATION], "Key rotation phase: every apiserver encrypts with the new key.";
    RewriteSecrets: progress, [ENCRYPTION_KEY_ROTATION], "Key rotation phase: every encrypted object is written again under the new key.";
    DropOldKeys: progress, [ENCRYPTION_KEY_ROTATION], "Key rotation phase: the old keys are being dropped.";
    InvalidKeyRotationSchedule: failure, [ENCRYPTION_KEY_ROTATION],
        "spec.encryption.keyRotationSchedule is no CronJob schedule: no rotation starts on it until it is mended (the annotation still starts one).";
    // BackupSucceeded (NestedEtcd with spec.backup)
    SnapshotVerified: success, [BACKUP_SUCCEEDED], "The last snapshot was uploaded and verified.";
    BackupsNotSupported: failure, [BACKUP_SUCCEEDED], "The channel's etcd provider does not declare backups.";
    BackupCredentialsMissing: failure, [BACKUP_SUCCEEDED, SYNCED], "The Secret with the object store's credentials does not exist.";
    BackupNotConfigured: failure, [BACKUP_SUCCEEDED],
        "A backup-now request came to a NestedEtcd without spec.backup: it was dropped; set spec.backup.destination and annotate again.";
    WaitingForSnapshot: progress, [BACKUP_SUCCEEDED],
        "spec.backup is set and no snapshot was taken yet: the next comes at the schedule's next run or with a new backup-now value.";
    RestoreNotAllowed: failure, [SYNCED, READY], "A restore was asked for where it cannot run; the message says why.";
    SnapshotVersionUnsupported: failure, [SYNCED, READY], "The snapshot was taken by an etcd this channel cannot restore.";
    SnapshotKeyMissing: failure, [SYNCED, READY], "The snapshot's Secrets are encrypted with keys the control plane's <cluster>-encryption lacks.";
    // Hibernated (and Available, Ready, WorkloadsSynced while asleep)
    Sleeping: success, [HIBERNATED, AVAILABLE, READY, WORKLOADS_SYNCED],
        "The control plane sleeps (spec.hibernation): its pods are scaled to zero, its data kept; set spec.hibernation.enabled to false to wake it.";
    FallingAsleep: progress, [HIBERNATED, AVAILABLE, READY],
        "The control plane is being put to sleep: controller-manager, apiserver, then etcd scale to zero.";
    WakingUp: progress, [HIBERNATED, AVAILABLE],
        "The control plane is waking: etcd, apiserver, then controller-manager come back; held upgrades, rotations and backups start once it is awake.";
    Awake: success, [HIBERNATED], "The control plane is awake.";
    SleepDeferred: progress, [HIBERNATED],
        "Sleep was asked for while an upgrade step or a rotation runs: it falls asleep once that finishes, never half-way.";
    InvalidHibernationSchedule: failure, [HIBERNATED],
        "A spec.hibernation.schedules entry is no CronJob schedule: no run of it is acted on until it is mended.";
    // WatchesHealthy
    WatchFailed: failure, [WATCHES_HEALTHY],
        "A watch capn depends on fails (forbidden by its RBAC, a resource the API does not serve): changes go unnoticed until it recovers.";
    WatchesHealthy: success, [WATCHES_HEALTHY], "Every watch capn depends on works.";
    // PublicCRDsSynced
    Synced: success, [PUBLIC_CRDS_SYNCED], "Every public CRD of the super cluster is installed in the tenant.";
    TenantOwnsCRD: failure, [PUBLIC_CRDS_SYNCED], "The tenant has its own CRD of a public CRD's name; that one is left alone.";
    TenantUnreachable: failure, [PUBLIC_CRDS_SYNCED, WORKLOADS_SYNCED], "The tenant apiserver could not be reached.";
    // WorkloadsSynced
    WorkloadsSyncing: success, [WORKLOADS_SYNCED], "The syncer watches the tenant and runs its pods in the workload namespace.";
    WorkloadSyncDisabled: success, [WORKLOADS_SYNCED], "spec.workloads.sync is false: the tenant brings its own nodes, nothing is synced.";
    // Events of steps taken, with no condition of their own.
    UpgradePlanned: success, [], "A stepped upgrade was planned; the message lists its steps.";
    UpgradeStepStarted: progress, [], "An upgrade step started.";
    UpgradeCompleted: success, [], "The stepped upgrade reached its target release.";
    AddedLearner: progress, [], "An etcd member was added as a learner.";
    PromotedLearner: progress, [], "An etcd learner was promoted to a voting member.";
    RemovedMember: progress, [], "An etcd member was removed (scale down).";
    RemovedLostMember: progress, [], "An etcd member that lost its data was removed, to come back as a learner.";
    DefragmentedMember: progress, [], "An etcd member's database was defragmented (its free pages given back).";
    DefragmentationFailed: failure, [], "etcd refused or failed a member's defragmentation; capn tries again at its next look (every 10 seconds).";
    InvalidDefragmentationSchedule: failure, [],
        "spec.defragmentation.schedule is no CronJob schedule: no defragmentation runs on it until it is mended (the threshold still works).";
}

impl Reason {
    /// The reason whose word is `word`, if it is one of capn's own (errors' reasons are not).
    pub fn parse(word: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|r| r.as_str() == word)
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether `reason` (any condition's, read back from the API or just decided) reports a
/// failure: one of capn's own failure reasons, or an error's reason, which is not one of
/// [`Reason::ALL`].
pub fn is_failure_reason(reason: &str) -> bool {
    Reason::parse(reason).is_none_or(Reason::is_failure)
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
    /// A condition with one of capn's own reasons.
    pub fn new(type_: &'static str, status: bool, reason: Reason, message: impl Into<String>) -> Self {
        Self::with_word(type_, status, reason.as_str().to_string(), message.into())
    }

    /// A condition that reports an error: the error's own `reason()` word (a failure unless
    /// it names one of [`Reason::ALL`], as `PlanError::NoEtcdEndpoints` names
    /// `WaitingForEtcd`) and its message.
    pub fn error(type_: &'static str, status: bool, reason: &'static str, message: impl Into<String>) -> Self {
        Self::with_word(type_, status, reason.to_string(), message.into())
    }

    /// A condition that repeats another object's condition reason word for word (the
    /// control plane mirroring a failing component).
    pub fn mirrored(type_: &'static str, status: bool, reason: String, message: impl Into<String>) -> Self {
        Self::with_word(type_, status, reason, message.into())
    }

    fn with_word(type_: &'static str, status: bool, reason: String, message: String) -> Self {
        Self {
            type_,
            status,
            reason,
            message,
        }
    }

    /// Whether this condition reports a failure (status False with a failure reason).
    pub fn failing(&self) -> bool {
        !self.status && is_failure_reason(&self.reason)
    }
}

/// Whether `condition` reports a failure: not True, with a failure reason
/// ([`is_failure_reason`]). Waiting, progress and success never are.
pub fn failing(condition: &Condition) -> bool {
    condition.status != "True" && is_failure_reason(&condition.reason)
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
            ConditionUpdate::new(READY, false, Reason::WaitingForEtcd, "a"),
            Some(1),
            &t("2026-01-01T00:00:00Z"),
        );
        set_condition(
            &mut cs,
            ConditionUpdate::new(READY, false, Reason::Provisioning, "b"),
            Some(2),
            &t("2026-01-02T00:00:00Z"),
        );
        assert_eq!(cs.len(), 1);
        assert_eq!(cs[0].last_transition_time, t("2026-01-01T00:00:00Z"));
        assert_eq!(cs[0].reason, "Provisioning");
        assert_eq!(cs[0].observed_generation, Some(2));
        set_condition(
            &mut cs,
            ConditionUpdate::new(READY, true, Reason::Ready, "c"),
            Some(2),
            &t("2026-01-03T00:00:00Z"),
        );
        assert_eq!(cs[0].last_transition_time, t("2026-01-03T00:00:00Z"));
        assert!(is_true(&cs, READY));
        assert!(!is_true(&cs, AVAILABLE));
    }

    fn condition(status: &str, reason: &str) -> Condition {
        Condition {
            type_: READY.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: t("2026-01-01T00:00:00Z"),
        }
    }

    #[test]
    fn waiting_progress_and_success_are_not_failures_and_errors_are() {
        for progress in [
            "WaitingForEtcd",
            "Provisioning",
            "NotReady",
            "AddingLearner",
            "UpgradeHeld",
            "RollingOut",
        ] {
            assert!(!failing(&condition("False", progress)), "{progress}");
        }
        for failure in [
            "ComponentMissing",
            "UpgradeStepFailed",
            "InvalidVersion",
            "ApplyFailed",
            "TenantUnreachable",
        ] {
            assert!(failing(&condition("False", failure)), "{failure}");
            assert!(!failing(&condition("True", failure)), "{failure} with status True");
        }
        assert!(ConditionUpdate::error(SYNCED, false, "InvalidVersion", "m").failing());
        assert!(!ConditionUpdate::error(SYNCED, false, "WaitingForEtcd", "m").failing());
        assert!(!ConditionUpdate::new(READY, false, Reason::Provisioning, "m").failing());
    }

    #[test]
    fn every_reason_has_one_word_and_a_meaning() {
        let mut words = std::collections::BTreeSet::new();
        for reason in Reason::ALL {
            assert!(words.insert(reason.as_str()), "{reason} is declared twice");
            assert_eq!(Reason::parse(reason.as_str()), Some(*reason));
            assert!(reason.meaning().ends_with('.'), "{reason}: {}", reason.meaning());
        }
        assert_eq!(Reason::parse("NoSuchReason"), None);
    }
}
