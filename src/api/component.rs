//! The component kinds (NestedEtcd, NestedAPIServer, NestedControllerManager) and the
//! component spec and status they share (docs/design.md §2).

// kube-derive's `printcolumn(name = .., type_ = ..)` repeats keys by design.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What every component resource asks for: which release from which channel, how many
/// replicas, and the user's adjustments to the rendered manifests.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ComponentSpec {
    /// Release of the component: exact (`3.6.8`, `1.36.3`), partial (`1.36` picks the
    /// highest patch) or empty. Empty means the NestedControlPlane's `version` for the
    /// apiserver and controller-manager, and the channel's etcd default for that Kubernetes
    /// minor for etcd. A leading `v` and an image-style suffix (`3.6.8-0`) are accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Channel to render from; empty means the NestedControlPlane's channel, else `stable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// Size of the component (`small`, `medium`, `large` in the `stable` channel): a preset
    /// of the channel that sets its resources and, per component, the apiserver's
    /// `--max-requests-inflight` and `--max-mutating-requests-inflight`, the Go runtime's
    /// `GOMEMLIMIT` and `GOGC`, and the ceiling of etcd's quota. Empty means the
    /// NestedControlPlane's `size`, else the channel's default (`medium`, which renders what
    /// capn rendered before sizes). `resources`, `extraArgs`, `storage.quotaBackendBytes` and
    /// `patches` win over it (docs/guide/sizes.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,
    /// Number of members (pods). Defaults to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub replicas: Option<i32>,
    /// Compute resources of the component's main container. When set, it replaces the
    /// resources of the component's size wholesale (the `stable` channel's sizes request CPU
    /// and memory and limit memory only; see its `channel.yaml`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // Boxed: few objects set it, and every object is cached (see api::tests).
    pub resources: Option<Box<ResourceRequirements>>,
    /// PriorityClass of the component's pods. Empty means capn's own `capn-control-plane`,
    /// which the clusterctl control plane components install (`capn priority-class` prints
    /// it); name another existing PriorityClass to use that one. The PriorityClass must
    /// exist: the super cluster refuses to create pods that name a missing one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// How the members spread over the super cluster's nodes. Default: preferred, so that a
    /// one-node super cluster still runs every member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_spread: Option<TopologySpread>,
    /// Command-line flags, without the leading `--` (`v: "2"`). A flag of the same name in
    /// the rendered command or args is replaced; new flags are appended. This is how a
    /// controller is switched off (`controllers: "*,-tokencleaner"`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra_args: BTreeMap<String, String>,
    /// Changes to the rendered objects, applied in order after rendering (docs/design.md §4): a
    /// partial object (`apiVersion`, `kind`, `metadata.name`; strategic merge), or
    /// `{target: {kind, name}, jsonPatch: [...]}` (RFC 6902), or
    /// `{target: {kind, name}, mergePatch: {...}}` (RFC 7386).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(with = "Vec<FreeFormObject>")]
    pub patches: Vec<serde_json::Value>,
}

/// How a component's members spread over the super cluster. The channel renders
/// a node spread (`kubernetes.io/hostname`), a zone spread (`topology.kubernetes.io/zone`)
/// and pod anti-affinity among the members.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TopologySpread {
    /// `ScheduleAnyway` (default): members prefer distinct nodes but share one when nothing
    /// else fits. `DoNotSchedule`: every member needs a node of its own (required
    /// anti-affinity and a hard node spread); a member that finds none stays Pending. The
    /// zone spread always stays `ScheduleAnyway`, so nodes without zone labels still count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when_unsatisfiable: Option<WhenUnsatisfiable>,
}

/// Kubernetes' `TopologySpreadConstraint.whenUnsatisfiable` values. `ScheduleAnyway`
/// (default): members prefer distinct nodes but share one when nothing else fits.
/// `DoNotSchedule`: every member needs a node of its own (required anti-affinity and a hard
/// node spread). The zone spread always stays `ScheduleAnyway`.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub enum WhenUnsatisfiable {
    /// Prefer spreading; schedule anyway when it cannot be satisfied.
    #[default]
    ScheduleAnyway,
    /// Do not schedule a member where it would break the spread.
    DoNotSchedule,
}

/// Schema stand-in for an arbitrary JSON object kept as-is by the apiserver.
#[derive(JsonSchema)]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct FreeFormObject {}

/// Where etcd keeps its data.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EtcdStorage {
    /// Size of each member's PersistentVolumeClaim (default `1Gi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<Quantity>,
    /// StorageClass of the claims; empty means the super cluster's default class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// Keep data in an `emptyDir` instead of a PersistentVolumeClaim. Data is lost whenever
    /// a pod is rescheduled: for tests and throw-away clusters only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ephemeral: bool,
    /// etcd's backend quota (`--quota-backend-bytes`), a quantity of bytes like `2Gi`: the
    /// database size at which etcd raises its `NOSPACE` alarm and accepts only reads and
    /// deletes. At most `size`. Default: sized from `size` as
    /// `min(2Gi, max(size / 4, (size - 384MB) / 2))`, room for two copies of the database
    /// (a defragmentation or a snapshot from the leader writes one beside it) and etcd's
    /// write-ahead log; 345MB for the default 1Gi volume; etcd's own 2Gi on ephemeral
    /// storage (docs/guide/etcd-operations.md "Quota"). etcd suggests at most 8Gi.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_backend_bytes: Option<Quantity>,
}

/// Spec of a [`NestedEtcd`]: the shared component spec plus storage.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "controlplane.cluster.x-k8s.io",
    version = "v1beta1",
    kind = "NestedEtcd",
    namespaced,
    status = "ComponentStatus",
    shortname = "netcd",
    category = "cluster-api",
    doc = "The etcd of a nested control plane.",
    printcolumn(name = "Ready", type_ = "boolean", json_path = ".status.ready"),
    printcolumn(name = "Version", type_ = "string", json_path = ".status.version"),
    printcolumn(name = "Replicas", type_ = "string", json_path = ".status.replicasDisplay"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase", priority = "1"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct NestedEtcdSpec {
    #[serde(flatten)]
    pub component: ComponentSpec,
    /// Storage of the members' data directories.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<EtcdStorage>,
    /// Scheduled and on-demand snapshots to S3-compatible object storage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // Boxed: few objects set it, and every object is cached (see api::tests).
    pub backup: Option<Box<super::EtcdBackup>>,
    /// Start from a snapshot instead of empty (only when the etcd is first created).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // Boxed: few objects set it, and every object is cached (see api::tests).
    pub restore: Option<Box<super::EtcdRestore>>,
    /// What capn does about a member that lost its data (docs/guide/etcd-membership.md).
    /// Default: it is replaced automatically.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_remediation: Option<MemberRemediation>,
    /// When capn defragments the members besides recovering from `NOSPACE`: on a schedule,
    /// and when a member's free pages pass a share of the quota
    /// (docs/guide/etcd-operations.md "Defragmentation"). Default: no schedule, threshold 25%.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // Boxed: few objects set it, and every object is cached (see api::tests).
    pub defragmentation: Option<Box<DefragmentationPolicy>>,
}

/// When etcd's members are defragmented. A defragmentation rewrites a member's database
/// file without its free pages (what compaction and deletes left behind), so the file, which
/// the quota is compared with, shrinks to the data it holds. The member serves nothing
/// while it runs (seconds for hundreds of MiB), so capn defragments one member at a time,
/// followers first and the leader last, each only while every other member answers with a
/// leader (etcd's advice: <https://etcd.io/docs/v3.6/op-guide/maintenance/#defragmentation>;
/// Gardener's etcd-druid runs it on a schedule, k0smotron on a free-space rule).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DefragmentationPolicy {
    /// A CronJob schedule (five fields or `@daily`-style, UTC), like `0 3 * * 0`. Default:
    /// none. A run missed while capn was down happens once when it is back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// Defragment when a member's free pages (`dbSize - dbSizeInUse`, after the apiserver's
    /// compaction) reach this percentage of the quota. Default 25; 0 turns it off. After a
    /// defragmentation the threshold waits 10 minutes before it may fire again, so a file
    /// that does not shrink cannot keep a member busy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub threshold_percent: Option<i32>,
}

impl DefragmentationPolicy {
    /// The default of [`Self::threshold_percent`].
    pub const DEFAULT_THRESHOLD_PERCENT: i32 = 25;

    /// The threshold, in percent of the quota; `None` when turned off.
    pub fn threshold_percent(policy: Option<&Self>) -> Option<i64> {
        let percent = policy
            .and_then(|p| p.threshold_percent)
            .unwrap_or(Self::DEFAULT_THRESHOLD_PERCENT)
            .clamp(0, 100);
        (percent > 0).then_some(i64::from(percent))
    }

    /// The schedule as written, when one is set.
    pub fn schedule(policy: Option<&Self>) -> Option<&str> {
        policy
            .and_then(|p| p.schedule.as_deref())
            .filter(|s| !s.trim().is_empty())
    }
}

/// Replacement of lost etcd members, named after Cluster API's
/// remediation of unhealthy machines (KubeadmControlPlane `remediationStrategy`,
/// MachineHealthCheck `unhealthyNodeConditions[].timeoutSeconds`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MemberRemediation {
    /// Whether a lost member is removed from the cluster and added back as a learner that
    /// starts on an empty data directory. Default `true`. Never while quorum is lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// How long, in seconds, a voting member must have been unreachable (no answer to
    /// etcd's Status call, or no leader known) before capn considers its data lost and
    /// replaces it. Default 300. Replacing deletes the member's claim and pod, so a member
    /// that was only down loses its data too and receives a full copy
    /// (docs/guide/etcd-membership.md "Lost members").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub unreachable_timeout_seconds: Option<i32>,
}

impl MemberRemediation {
    /// The default of [`Self::unreachable_timeout_seconds`].
    pub const DEFAULT_UNREACHABLE_TIMEOUT_SECONDS: i32 = 300;

    /// Whether lost members are replaced.
    pub fn enabled(remediation: Option<&Self>) -> bool {
        remediation.and_then(|r| r.enabled).unwrap_or(true)
    }

    /// The unreachable timeout.
    pub fn unreachable_timeout(remediation: Option<&Self>) -> std::time::Duration {
        let seconds = remediation
            .and_then(|r| r.unreachable_timeout_seconds)
            .unwrap_or(Self::DEFAULT_UNREACHABLE_TIMEOUT_SECONDS)
            .max(1);
        std::time::Duration::from_secs(u64::try_from(seconds).unwrap_or(300))
    }
}

/// Spec of a [`NestedAPIServer`].
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "controlplane.cluster.x-k8s.io",
    version = "v1beta1",
    kind = "NestedAPIServer",
    namespaced,
    status = "ComponentStatus",
    shortname = "napiserver",
    category = "cluster-api",
    doc = "The kube-apiserver of a nested control plane.",
    printcolumn(name = "Ready", type_ = "boolean", json_path = ".status.ready"),
    printcolumn(name = "Version", type_ = "string", json_path = ".status.version"),
    printcolumn(name = "Replicas", type_ = "string", json_path = ".status.replicasDisplay"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase", priority = "1"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct NestedAPIServerSpec {
    #[serde(flatten)]
    pub component: ComponentSpec,
    /// `audit`, `authentication` and `authorization` (docs/guide/security.md), flattened
    /// into the spec.
    #[serde(flatten)]
    // Boxed together: every object is cached (see api::tests), and two boxes of their own
    // would cost every object 16 bytes more than one.
    pub security: Box<ApiServerSecurity>,
}

/// The security settings of a NestedAPIServer (issue 39), which few objects set.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ApiServerSecurity {
    /// Audit logging (docs/guide/security.md "Audit"): when set, the apiserver records what
    /// its audit policy keeps to a log file and optionally a webhook. Unset: no auditing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<Box<super::ApiServerAudit>>,
    /// Structured authentication (docs/guide/security.md "Authentication"): JWT issuers and
    /// the anonymous authenticator, as Kubernetes' `AuthenticationConfiguration`. Unset:
    /// certificates, service-account and bootstrap tokens only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authentication: Option<Box<super::ApiServerAuthentication>>,
    /// Structured authorization (docs/guide/security.md "Authorization"): webhook
    /// authorizers before or after Node and RBAC, as Kubernetes' `AuthorizationConfiguration`.
    /// Unset: `Node,RBAC`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authorization: Option<Box<super::ApiServerAuthorization>>,
}

/// Spec of a [`NestedControllerManager`].
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "controlplane.cluster.x-k8s.io",
    version = "v1beta1",
    kind = "NestedControllerManager",
    namespaced,
    status = "ComponentStatus",
    shortname = "ncm",
    category = "cluster-api",
    doc = "The kube-controller-manager of a nested control plane.",
    printcolumn(name = "Ready", type_ = "boolean", json_path = ".status.ready"),
    printcolumn(name = "Version", type_ = "string", json_path = ".status.version"),
    printcolumn(name = "Replicas", type_ = "string", json_path = ".status.replicasDisplay"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase", priority = "1"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct NestedControllerManagerSpec {
    #[serde(flatten)]
    pub component: ComponentSpec,
}

/// Observed state of a component resource; the same shape for all three kinds, with the
/// outputs the next component needs (etcd: `endpoints`; apiserver: `service`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ComponentStatus {
    /// True when every desired member is ready on the current spec (docs/design.md §5).
    #[serde(default)]
    pub ready: bool,
    /// One word for humans: `Pending`, `Provisioning`, `Ready`, `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions: `Ready` and, on bad input, the reason the spec cannot be applied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The release resolved from `spec.version` and the channel (e.g. `3.6.8`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The channel the objects were rendered from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// Desired members.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Members ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// `ready/desired`, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas_display: Option<String>,
    /// Objects applied for this component in the last successful round.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inventory: Vec<InventoryEntry>,
    /// etcd only: the client URLs of every member, in member order
    /// (`https://<c>-etcd-0.<c>-etcd.<ns>.svc:2379`, ...). The apiserver uses all of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<String>,
    /// apiserver only: the Service in front of the apiserver pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceOutput>,
    /// The certificate material the pods were last applied with (docs/design.md §9).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificates: Option<AppliedCertificates>,
    /// etcd only: the last verified snapshot, the next scheduled one, the last on-demand
    /// request served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // Boxed: few objects set it, and every object is cached (see api::tests).
    pub backup: Option<Box<super::BackupStatus>>,
    /// etcd only: the snapshot the members were restored from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // Boxed: few objects set it, and every object is cached (see api::tests).
    pub restore: Option<Box<super::RestoreStatus>>,
    /// etcd only: the members as etcd lists them, and the leader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<EtcdClusterStatus>,
    /// etcd only: the database sizes against the quota, and the last defragmentation
    /// (docs/guide/etcd-operations.md "Status").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // Boxed: every object is cached (see api::tests).
    pub etcd_space: Option<Box<EtcdSpaceStatus>>,
}

/// How much of its quota an etcd uses, as capn last recorded it. Sizes are recorded when
/// they moved by at least 1/64 of the quota since the last record (so a busy tenant does
/// not cost a status write per look).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EtcdSpaceStatus {
    /// The members' `--quota-backend-bytes`, bytes.
    pub quota_backend_bytes: i64,
    /// Each member that answered, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<EtcdMemberSpace>,
    /// The last defragmentation capn ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_defragmentation: Option<EtcdDefragmentation>,
}

/// One member's database.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EtcdMemberSpace {
    /// The member's name (its pod's).
    pub name: String,
    /// Size of the database file, bytes: what the quota is compared with.
    pub db_size: i64,
    /// Bytes of it holding data; the rest is free pages a defragmentation gives back.
    pub db_size_in_use: i64,
}

/// A defragmentation capn ran: one member at a time, followers first, the leader last.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EtcdDefragmentation {
    /// When it finished (RFC 3339).
    pub time: String,
    /// Why: `NOSPACE` (recovering from the alarm), `Schedule` (`spec.defragmentation.schedule`)
    /// or `Threshold` (free pages reached `spec.defragmentation.thresholdPercent` of the quota).
    pub trigger: String,
    /// The members, in the order they were defragmented.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<String>,
    /// The leader when it began (defragmented last).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
}

/// The members of a running etcd, as capn last read them through etcd's API.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EtcdClusterStatus {
    /// Every member etcd lists, by ordinal.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<EtcdMemberStatus>,
    /// The leader's name, when a member knows one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
}

/// One etcd member.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EtcdMemberStatus {
    /// The member's name (its pod's), or the name its pod will have while it has not started.
    pub name: String,
    /// etcd's member ID, in hexadecimal as `etcdctl member list` prints it.
    #[serde(rename = "id")]
    pub id: String,
    /// The peer URL other members dial.
    #[serde(rename = "peerURL")]
    pub peer_url: String,
    /// A learner (non-voting, catching up) rather than a voter.
    #[serde(default)]
    pub learner: bool,
    /// It answered capn's Status call and knows a leader.
    #[serde(default)]
    pub healthy: bool,
    /// Since when it has been unhealthy (RFC 3339), while it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy_since: Option<String>,
}

/// The Secrets a component's processes read only at start, and their digest as applied to
/// the pod templates (annotation `controlplane.cluster.x-k8s.io/certificates-digest`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AppliedCertificates {
    /// The digest on the pod templates.
    pub digest: String,
    /// The Secrets it covers, sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
}

/// One applied object, as recorded in a component's inventory.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct InventoryEntry {
    pub api_version: String,
    pub kind: String,
    pub name: String,
}

/// The apiserver's Service as published in NestedAPIServer status.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ServiceOutput {
    /// Service name, in the component's namespace.
    pub name: String,
    /// ClusterIP assigned by the super cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_ip: Option<String>,
    /// Secure port (6443).
    pub port: i32,
}
