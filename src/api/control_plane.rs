//! NestedControlPlane: the orchestrator of one nested control plane, and the Cluster API
//! control plane provider object (v1beta2 contract, with the v1beta1 fields CAPI still reads).

// kube-derive's `printcolumn(name = .., type_ = ..)` repeats keys by design.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::api::core::v1::LocalObjectReference;
use k8s_openapi::api::networking::v1::NetworkPolicyPeer;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Desired state of a nested control plane.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "controlplane.cluster.x-k8s.io",
    version = "v1beta1",
    kind = "NestedControlPlane",
    namespaced,
    status = "NestedControlPlaneStatus",
    shortname = "ncp",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    category = "cluster-api",
    doc = "A nested Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager) running as workloads of the super cluster.",
    printcolumn(name = "Ready", type_ = "boolean", json_path = ".status.ready"),
    printcolumn(
        name = "Initialized",
        type_ = "boolean",
        json_path = ".status.initialization.controlPlaneInitialized"
    ),
    printcolumn(name = "Version", type_ = "string", json_path = ".status.version"),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".status.replicas"),
    printcolumn(name = "Hibernation", type_ = "string", json_path = ".status.hibernation.phase"),
    printcolumn(
        name = "Endpoint",
        type_ = "string",
        json_path = ".spec.controlPlaneEndpoint.host",
        priority = "1"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct NestedControlPlaneSpec {
    /// Kubernetes release of the apiserver and controller-manager (`1.36.3`, `1.36`, or
    /// empty for the channel default), unless a component pins its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Desired apiserver replicas (the scale subresource: `kubectl scale ncp/<name>`, a
    /// HorizontalPodAutoscaler, Cluster API). It overrides the NestedAPIServer's own
    /// `replicas`; left unset, capn records the NestedAPIServer's (else 1) here once, so
    /// that the scale subresource always has a value to read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub replicas: Option<i32>,
    /// Default channel of the components (default `stable`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// Size of the control plane, unless a component names its own: a preset of the channel
    /// (`small`, `medium`, `large` in `stable`; empty: the channel's default, `medium`) that
    /// sets each component's resources, the apiserver's concurrency limits, the Go runtime's
    /// memory limit and etcd's quota ceiling. Explicit fields and patches win over it
    /// (docs/guide/sizes.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,
    /// Registry and path prefix of the images (default `registry.k8s.io`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_repository: Option<String>,
    /// Extra names and IPs for the apiserver serving certificate.
    #[serde(default, rename = "certSANs", skip_serializing_if = "Vec::is_empty")]
    pub cert_sans: Vec<String>,
    /// Tenant network settings. When a Cluster API Cluster owns this object, its
    /// `spec.clusterNetwork` wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_network: Option<ClusterNetwork>,
    /// The NestedEtcd of this control plane; created when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<LocalObjectReference>,
    /// The NestedAPIServer of this control plane; created when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apiserver: Option<LocalObjectReference>,
    /// The NestedControllerManager of this control plane; created when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller_manager: Option<LocalObjectReference>,
    /// Where clients reach the apiserver. Filled by capn with the apiserver Service's
    /// in-cluster name when empty (Cluster API contract).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<ApiEndpoint>,
    /// Lifetime of the leaf certificates and kubeconfigs capn issues, as a Go duration
    /// (`8760h`; kubeadm's `certificateValidityPeriod`). Default: `capn run
    /// --certificate-validity`, else one year. Certificate authorities always get 10 years.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_validity_period: Option<String>,
    /// When certificates are renewed ahead of their expiry (Cluster API's
    /// KubeadmControlPlane `rolloutBefore`). Without it a certificate is renewed when a
    /// third of its lifetime remains.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_before: Option<RolloutBefore>,
    /// Who may connect to the control plane's pods: the channel's NetworkPolicies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<ControlPlaneNetworkPolicy>,
    /// The tenant's workloads: whether capn's syncer runs the tenant's pods in the super
    /// cluster, and the bounds they run within (docs/design.md §11). Absent: synced, at Pod
    /// Security `baseline`, with no quota and no default limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workloads: Option<Workloads>,
    /// Encryption at rest of the tenant's Secrets (docs/guide/certificates.md "Encryption
    /// at rest"): on whatever this says; this sets when its key rotates by itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<EncryptionSpec>,
    /// Putting the control plane to sleep (docs/guide/sleep.md): its etcd, apiserver and
    /// controller-manager pods scaled to zero, its data and Secrets kept, and woken again
    /// in order. Shaped like Gardener's `spec.hibernation`. Absent: always awake.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // Boxed: few objects set it, and every object is cached (see crds::tests).
    pub hibernation: Option<Box<Hibernation>>,
}

/// When the control plane sleeps (Gardener's `spec.hibernation`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Hibernation {
    /// Asleep (`true`) or awake (`false`, the default). The schedules set it at their runs,
    /// as a person would; set it yourself at any time in between.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// When to fall asleep and when to wake, on CronJob schedules in UTC.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub schedules: Vec<HibernationSchedule>,
}

/// One sleep schedule: at each run of `start` capn sets `spec.hibernation.enabled` to
/// `true`, at each run of `end` to `false`. Either may be absent (a tenant that is put to
/// sleep every night and woken by hand has only `start`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HibernationSchedule {
    /// When the control plane falls asleep: a CronJob schedule (five fields, or `@daily`
    /// and the other aliases), in UTC. `0 20 * * 1-5`: at 20:00 on weekdays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<String>,
    /// When it wakes: a CronJob schedule in UTC. `0 7 * * 1-5`: at 07:00 on weekdays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<String>,
}

/// Where the control plane is between awake and asleep (docs/guide/sleep.md).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HibernationStatus {
    /// `Awake`, `FallingAsleep` (the components scale to zero: controller-manager,
    /// apiserver, then etcd), `Sleeping` (no control-plane pod runs) or `WakingUp` (etcd,
    /// apiserver, then controller-manager come back).
    pub phase: String,
    /// What the phase waits for.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// When the control plane last started falling asleep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sleep_time: Option<Time>,
    /// When it last started waking up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wake_time: Option<Time>,
    /// When it was last awake again, every component ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub awake_time: Option<Time>,
    /// The last run of a schedule acted on (`spec.hibernation.schedules`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<Time>,
}

/// When the tenant's encryption-at-rest key rotates.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EncryptionSpec {
    /// A schedule on which the key rotates, as if the annotation
    /// `controlplane.cluster.x-k8s.io/rotate-encryption-key` had been given a new value: a
    /// CronJob schedule (five fields, or `@monthly` and the other aliases), in UTC. The first
    /// run after the last rotation started (or after the control plane was made) starts
    /// one; a capn that was down across several runs rotates once. Absent: only on request.
    /// Gardener rotates its shoots' etcd encryption key every 28 days; `0 3 1 * *` rotates
    /// on the first of every month at 03:00.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_rotation_schedule: Option<String>,
    /// The resources whose stored values are encrypted, named as kube-apiserver's
    /// `EncryptionConfiguration` names them: `<resource>` for the core group (`secrets`,
    /// `configmaps`) or `<resource>.<group>` (`deployments.apps`, `widgets.example.com`);
    /// at most 64, each once, `secrets` always among them (the keys protect the tenant's
    /// credentials first). Wildcards (`*.apps`, `*.*`) are not offered: a key rotation
    /// writes every object of every listed resource again, which needs them named.
    /// Absent: `secrets`. Adding one encrypts its objects as they are next written (a key
    /// rotation writes them all); removing one does not decrypt it: it stays in the
    /// configuration, so that its encrypted objects stay readable
    /// (docs/guide/certificates.md "Encrypting more resources").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Vec<String>>,
    /// A KMS v2 plugin the platform runs on the super cluster's nodes, to encrypt every write
    /// instead of capn's own key (docs/guide/certificates.md "A KMS v2 plugin"). capn adds it
    /// first as a reader and makes it the writer once every apiserver has it; removed, it
    /// stays as a reader until the next key rotation has written everything again. Absent:
    /// capn's `secretbox` key encrypts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // Boxed: few objects set it, and every object is cached (see crds::tests).
    pub kms: Option<Box<KmsProvider>>,
}

/// A KMS v2 provider of kube-apiserver's `EncryptionConfiguration` (`kms` with `apiVersion:
/// v2`, GA since Kubernetes 1.29: every release of the stable channel;
/// <https://kubernetes.io/docs/tasks/administer-cluster/kms-provider/>). The plugin runs
/// outside capn, on every super-cluster node an apiserver of the tenant may run on.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct KmsProvider {
    /// The provider's name in the configuration, which kube-apiserver writes into every
    /// value it encrypts (`k8s:enc:kms:v2:<name>:`): letters, digits, `-`, `_` and `.`, at
    /// most 63, never `:`. A new name is a new provider (the old one stays a reader).
    pub name: String,
    /// The plugin's gRPC socket on the node: `unix://` and an absolute path in a directory,
    /// at most 107 bytes of path (a unix socket's limit), like
    /// `unix:///var/run/kmsplugin/socket.sock`. capn mounts the socket's directory (a
    /// `hostPath` of type `Directory`, read-only) into the apiserver pods at the same path.
    pub endpoint: String,
    /// How long the apiserver waits for the plugin on each call: a Go duration above `0s`
    /// and at most `30s`. Absent: kube-apiserver's default, 3 seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
}

/// How a tenant's pods run in the super cluster (docs/design.md §11). They all run in one
/// workload namespace of the super cluster, `<namespace>-<name>-workloads`, which carries
/// the Pod Security label, the ResourceQuota and the LimitRange set here.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Workloads {
    /// Copy the tenant's pods (and the ConfigMaps, Secrets and tokens they use) into the
    /// super cluster and their status back (default `true`). `false` for a tenant that
    /// brings its own nodes: nothing is synced and the workload namespace is removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<bool>,
    /// The Pod Security Standards level the tenant's pods must meet
    /// (<https://kubernetes.io/docs/concepts/security/pod-security-standards/>):
    /// `baseline` (default: no host namespaces, host paths, privileged containers or added
    /// capabilities) or `restricted`. A pod that breaks it is not synced and gets
    /// `PodScheduled=False` and an Event in the tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_security: Option<PodSecurityLevel>,
    /// The `hard` limits of the workload namespace's ResourceQuota (`pods`,
    /// `requests.cpu`, `limits.memory`, ...), bounding everything the tenant runs. Absent:
    /// no ResourceQuota.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_quota:
        Option<std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    /// The workload namespace's LimitRange: default requests and limits of containers that
    /// set none (a ResourceQuota on `requests.*` or `limits.*` refuses such pods without
    /// them). Absent: no LimitRange.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_range: Option<Vec<k8s_openapi::api::core::v1::LimitRangeItem>>,
    /// Let the tenant's `NodePort` Services open their node ports on the super cluster's
    /// nodes (default `false`: they are copied as `ClusterIP` Services, reached from the
    /// tenant's pods only). Each copy asks for the tenant Service's node ports and takes
    /// others when they are taken; the tenant Service's annotation
    /// `tenancy.x-k8s.io/super-node-ports` says which.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_port_services: Option<bool>,
    /// The public CRDs (by name, `widgets.example.com`) whose instances the tenant makes are
    /// copied into the super cluster, where its operator serves them, their `status` coming
    /// back. Absent: every public, namespaced CRD whose super CRD opts in with the annotation
    /// `tenancy.x-k8s.io/sync-instances: "true"`; a list narrows them (an empty list: none).
    /// Naming a CRD that does not opt in syncs nothing for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_resources: Option<Vec<String>>,
    /// Which super nodes the tenant sees as its Nodes. Absent: those its pods run on, while
    /// they run (`mode: Used`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<TenantNodes>,
}

/// Which super nodes a tenant sees as Nodes (docs/guide/workloads.md "The tenant's Nodes").
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TenantNodes {
    /// `Used` (the default): a Node for each super node that runs a tenant pod, while one
    /// runs there (VirtualCluster's design). `Schedulable`: also, at all times, one for each
    /// super node the tenant's pods could be scheduled on (`Ready`, not cordoned, no
    /// `NoSchedule` or `NoExecute` taint, which a tenant pod never tolerates) that matches
    /// `selector`, so a tenant with no pod running still sees where pods would go, as
    /// software that waits for a schedulable Node expects. It shows the tenant those nodes'
    /// names, capacity and zone labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<TenantNodesMode>,
    /// With `Schedulable`: only the super nodes whose labels match (a node pool set aside
    /// for tenants). Absent: every schedulable super node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
}

/// Which super nodes a tenant sees as Nodes: `Used` (the default), those its pods run on,
/// while they run; `Schedulable`, also every schedulable super node `selector` matches, at
/// all times.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub enum TenantNodesMode {
    /// The super nodes the tenant's pods run on, while they run.
    #[default]
    Used,
    /// Those, and every schedulable super node `selector` matches, at all times.
    Schedulable,
}

/// A Pod Security Standards level, spelt as the `pod-security.kubernetes.io/enforce` label
/// spells it.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PodSecurityLevel {
    /// Prevents known privilege escalations; an ordinary image such as nginx runs.
    #[default]
    Baseline,
    /// Baseline plus the hardening rules: non-root, no privilege escalation, all
    /// capabilities dropped, a seccomp profile.
    Restricted,
}

/// How the tenant's apiserver encrypts what it stores in etcd.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EncryptionStatus {
    /// The provider that encrypts every write: `secretbox` (capn's key) or `kms` (the
    /// plugin of `spec.encryption.kms`).
    pub provider: String,
    /// The name of the key that encrypts every write (never the key itself): capn's
    /// (`key1`), or the KMS provider's name.
    pub key: String,
    /// The KMS v2 providers `<cluster>-encryption` holds, the one that encrypts first when
    /// `provider` is `kms`; the others only decrypt what they wrote. The apiservers mount
    /// each one's socket directory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kms: Vec<KmsProvider>,
    /// The resources the configuration in `<cluster>-encryption` encrypts (`secrets`, and
    /// those of `spec.encryption.resources`); a change rolls the apiservers to it.
    pub resources: Vec<String>,
    /// The key rotation in progress, or the last one (requested with the annotation
    /// `controlplane.cluster.x-k8s.io/rotate-encryption-key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotation: Option<EncryptionKeyRotation>,
}

/// A rotation of the encryption-at-rest key (docs/guide/certificates.md "Rotating the key").
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EncryptionKeyRotation {
    /// The annotation's value that requested it (a scheduled rotation keeps the last
    /// one's); the same value again requests nothing.
    pub request: String,
    /// The new key's name (`key2`).
    pub key: String,
    /// `AddKey`, `EncryptWithNewKey`, `RewriteSecrets`, `DropOldKeys` or `Completed`.
    pub phase: String,
    /// When the rotation started.
    pub start_time: Time,
    /// The phases finished, with when.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<RotationPhaseRecord>,
    /// What the phase waits for.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Objects written again under the new key (`RewriteSecrets`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewritten: Option<i64>,
    /// The run of `spec.encryption.keyRotationSchedule` that started it; absent when the
    /// annotation did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled: Option<Time>,
}

/// Cluster API's `rolloutBefore`: renew ahead of certificate expiry.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RolloutBefore {
    /// Renew a certificate (and roll the components that read it at start) once it expires
    /// within this many days, if that comes before a third of its lifetime remains; never
    /// before a third of its lifetime has passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub certificates_expiry_days: Option<i32>,
}

/// The peers the channel's NetworkPolicies admit, besides what the control plane
/// needs itself (etcd admits only its apiservers, capn and its own members; the apiserver
/// always admits its controller-manager and capn). Peers are Kubernetes
/// `NetworkPolicyPeer`s, so `namespaceSelector`, `podSelector` and `ipBlock` work as in a
/// NetworkPolicy.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ControlPlaneNetworkPolicy {
    /// Who may reach the apiserver's port 6443. Absent: everyone the super cluster's network
    /// lets through. A list (even empty) narrows it to those peers; include Cluster API's
    /// controllers and whoever uses the tenant's kubeconfig.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apiserver_from: Option<Vec<NetworkPolicyPeer>>,
    /// Who may reach the metrics ports (etcd 2381, plain HTTP; controller-manager 10257).
    /// Absent: every pod in the namespace `monitoring`. Empty: nobody (the kubelet's probes
    /// come from the node and are always admitted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_from: Option<Vec<NetworkPolicyPeer>>,
}

/// Tenant network settings, shaped like Cluster API's `Cluster.spec.clusterNetwork`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNetwork {
    /// Service network of the tenant; the first CIDR is used (default `10.96.0.0/12`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services: Option<NetworkRanges>,
    /// DNS domain of the tenant's services (default `cluster.local`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_domain: Option<String>,
}

/// A list of CIDR blocks.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkRanges {
    #[serde(default)]
    pub cidr_blocks: Vec<String>,
}

/// A host and port clients dial (Cluster API `APIEndpoint`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ApiEndpoint {
    /// DNS name or IP address (IPv6 without brackets).
    pub host: String,
    /// TCP port.
    pub port: i32,
}

/// Observed state of a nested control plane: the one place to see it whole.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NestedControlPlaneStatus {
    /// v1beta1 contract: all components ready.
    #[serde(default)]
    pub ready: bool,
    /// v1beta1 contract: the apiserver has been reachable once.
    #[serde(default)]
    pub initialized: bool,
    /// v1beta2 contract: initialization milestones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<ControlPlaneInitialization>,
    /// Cluster API contract: there are no Machines behind this control plane.
    #[serde(default)]
    pub external_managed_control_plane: bool,
    /// Kubernetes version the apiserver runs (resolved), Cluster API contract.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Desired apiserver replicas (Cluster API contract).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Label selector of the apiserver pods (scale subresource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Ready apiserver replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// Apiserver replicas on the current spec (v1beta1 `updatedReplicas`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_replicas: Option<i32>,
    /// Apiserver replicas on the current spec (v1beta2 `upToDateReplicas`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up_to_date_replicas: Option<i32>,
    /// Apiserver replicas not ready (v1beta1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable_replicas: Option<i32>,
    /// Per-component readiness, replicas and resolved versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub components: Option<ComponentsStatus>,
    /// Earliest expiry of the certificates capn issued for this control plane.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificates_expiry_date: Option<Time>,
    /// The next certificate capn renews, and when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_certificate_renewal: Option<CertificateRenewal>,
    /// The CA rotation in progress, or the last one (requested with the annotation
    /// `controlplane.cluster.x-k8s.io/rotate-certificate-authority`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // Boxed: few objects set it, and every object is cached (see api::tests).
    pub certificate_authority_rotation: Option<Box<CertificateAuthorityRotation>>,
    /// The stepped upgrade in progress, or the last one: the path through every minor, the
    /// current step, each finished step's times, and the preflight before the next step
    /// (docs/guide/upgrades.md). The components run the release of its current step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // Boxed: few objects set it, and every object is cached (see api::tests).
    pub upgrade: Option<Box<UpgradeStatus>>,
    /// Encryption at rest of the tenant's Secrets (docs/guide/certificates.md "Encryption at
    /// rest"): recorded once capn made (or found) the key; from then on a missing
    /// `<cluster>-encryption` is an error, never replaced by a new key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // Boxed: set once, and every object is cached (see api::tests).
    pub encryption: Option<Box<EncryptionStatus>>,
    /// Sleep and wake (`spec.hibernation`); absent on a control plane that never slept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // Boxed: few objects set it, and every object is cached (see api::tests).
    pub hibernation: Option<Box<HibernationStatus>>,
    /// `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions: `Available`, `RollingOut`, `CertificatesAvailable`, `EtcdReady`,
    /// `APIServerReady`, `ControllerManagerReady`, `Paused`, `Upgrading`,
    /// `UpgradePreflight`, `Hibernated`, `PublicCRDsSynced`. A map keyed
    /// by `type`, so that two controllers can each server-side-apply their own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Public CRDs of the super cluster installed in this control plane (written by the
    /// public CRD sync controller).
    #[serde(default, rename = "publicCRDs", skip_serializing_if = "Option::is_none")]
    pub public_crds: Option<PublicCrdsStatus>,
}

/// Cluster API v1beta2 `status.initialization` of a control plane.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ControlPlaneInitialization {
    /// True once the apiserver has been ready (never goes back to false).
    #[serde(default)]
    pub control_plane_initialized: bool,
}

/// Summary of the three components in the NestedControlPlane status.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ComponentsStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<ComponentSummary>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apiserver: Option<ComponentSummary>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller_manager: Option<ComponentSummary>,
}

/// One component as seen from the NestedControlPlane. While a component is on its way to
/// ready, `replicas`, `readyReplicas` and `version` stay as they were when it was last
/// shown (its own status tells each step); they are current at every Ready transition
/// and whenever the control plane's status is written for another reason.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ComponentSummary {
    /// Name of the component resource.
    pub name: String,
    #[serde(default)]
    pub ready: bool,
    #[serde(default)]
    pub replicas: i32,
    #[serde(default)]
    pub ready_replicas: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// What the public CRD sync did for one nested control plane.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PublicCrdsStatus {
    /// Public CRDs installed and current in the tenant.
    #[serde(default)]
    pub synced: i32,
    /// Names of public CRDs the tenant already has as its own (left untouched).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conflicts: Vec<String>,
}

/// One planned certificate renewal.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CertificateRenewal {
    /// The Secret holding the certificate.
    pub secret: String,
    /// When capn renews it.
    pub time: Time,
}

/// A staged rotation of one certificate authority (or of the service-account key pair).
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CertificateAuthorityRotation {
    /// The request as annotated (`ca`, `etcd`, `front-proxy`, `sa`, optionally `/<id>`).
    pub request: String,
    /// The authority rotated: `ca`, `etcd`, `front-proxy` or `sa`.
    pub authority: String,
    /// `NewAuthority`, `TrustBoth`, `SignWithNew`, `DropOld`, then `Completed`.
    pub phase: String,
    /// When the rotation started.
    pub start_time: Time,
    /// When each finished phase ended, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<RotationPhaseRecord>,
    /// What the current phase waits for.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// One finished phase of a rotation.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RotationPhaseRecord {
    pub phase: String,
    pub completion_time: Time,
}

/// A stepped upgrade: from the release that ran to the one `spec.version` asks for, one
/// minor at a time (docs/design.md §10).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeStatus {
    /// The Kubernetes release that ran when the path was planned.
    pub from: String,
    /// The Kubernetes release `spec.version` resolves to; a different one plans a new path
    /// from wherever the components are.
    pub target: String,
    /// `Preflight` (checking before a step), `PreflightFailed`, `Held`, `Upgrading`,
    /// `Failed` (a step failed: retry or hold) or `Completed`.
    pub phase: String,
    /// 1-based index in `steps` of the step running or about to run; absent once completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_step: Option<i32>,
    /// Every step of the path, in order.
    #[serde(default)]
    pub steps: Vec<UpgradeStepStatus>,
    /// The last preflight, before the step it names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preflight: Option<PreflightStatus>,
    /// The value of the `controlplane.cluster.x-k8s.io/upgrade-retry` annotation last acted
    /// on (a new value retries a failed step once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retried: Option<String>,
    /// What the upgrade waits for now.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// One step of an upgrade path.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeStepStatus {
    /// Kubernetes release of the apiserver and the controller-manager in this step.
    pub kubernetes: String,
    /// etcd release in this step.
    pub etcd: String,
    /// Whether etcd moves in this step (it moves first).
    #[serde(default)]
    pub etcd_changes: bool,
    /// `Pending`, `Running`, `Succeeded` or `Failed`.
    pub state: String,
    /// When the step started (after its preflight passed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When every component reported the step's release ready, or when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_time: Option<Time>,
    /// Seconds from start to finish.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_seconds: Option<i64>,
    /// Why it failed, or what it waits for.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// The checks run before an upgrade step starts.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PreflightStatus {
    /// The Kubernetes release of the step checked for.
    pub step: String,
    /// Whether the step may start.
    #[serde(default)]
    pub passed: bool,
    /// When this result was first seen (it is rewritten only when it changes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
    /// Each check: `ComponentsReady`, `Certificates`, `RemovedAPIs`.
    #[serde(default)]
    pub checks: Vec<PreflightCheck>,
    /// APIs the tenant requested that the step's release no longer serves (read from its
    /// apiserver's `apiserver_requested_deprecated_apis` metric).
    #[serde(default, rename = "removedAPIs", skip_serializing_if = "Vec::is_empty")]
    pub removed_apis: Vec<RemovedApi>,
    /// Whether `controlplane.cluster.x-k8s.io/upgrade-acknowledge-removed-apis` names this
    /// step's minor, so that removed-API findings do not stop it.
    #[serde(default)]
    pub acknowledged: bool,
}

/// One preflight check.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PreflightCheck {
    pub name: String,
    #[serde(default)]
    pub passed: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// A deprecated API the tenant still uses, with the release that removes it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RemovedApi {
    /// API group (empty for the core group).
    #[serde(default)]
    pub group: String,
    pub version: String,
    pub resource: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub subresource: String,
    /// `major.minor` that no longer serves it.
    pub removed_release: String,
}
