//! The documented context every channel template is rendered with (docs/design.md §3).
//!
//! | variable | meaning |
//! |---|---|
//! | `cluster.name`, `cluster.namespace` | cluster name (CAPI Cluster, or the NCP's name) and namespace |
//! | `component.name` | `etcd`, `apiserver` or `controller-manager` |
//! | `component.resource` | name of the component resource (NestedEtcd, ...) |
//! | `component.replicas` | desired members (integer ≥ 1) |
//! | `component.version` | resolved release, without `v` (`1.36.3`, `3.6.8`) |
//! | `component.resources` | the container's ResourceRequirements object: the component's `spec.resources`, else its size's (`channel.yaml` `sizes`), else none |
//! | `component.priority_class_name` | PriorityClass of the pods: the spec's, else `capn-control-plane` |
//! | `image_repository` | registry and path prefix of the images (`registry.k8s.io`) |
//! | `names.etcd`, `names.apiserver`, `names.controller_manager` | object names: `<c>-etcd`, ... |
//! | `selector` | the pod selector labels of this component (map) |
//! | `selectors.etcd`, `selectors.apiserver`, `selectors.controller_manager` | the pod selector labels of each component of the cluster (maps), for NetworkPolicy peers |
//! | `labels` | the standard labels capn puts on every object of this component (map) |
//! | `network.service_cidr`, `network.dns_domain`, `network.super_dns_domain` | tenant service CIDR, tenant DNS domain, super cluster DNS domain |
//! | `secrets.<name>` | Secret names: `ca`, `etcd_ca`, `proxy_ca`, `sa`, `apiserver`, `apiserver_etcd_client`, `etcd_server`, `apiserver_kubelet_client`, `front_proxy_client`, `controller_manager_kubeconfig`, `kubeconfig`, `encryption` |
//! | `etcd.members` | etcd only: `[{name, host, peer_url, client_url}]` for every member (etcd lists, once it runs) |
//! | `etcd.initial_cluster`, `etcd.initial_cluster_state` | etcd only: `--initial-cluster` (`name=peer_url,...`) and `--initial-cluster-state` (`new`, or `existing` while a member joins) |
//! | `etcd.endpoints` | the etcd client URLs (apiserver: those NestedEtcd published; etcd: its own) |
//! | `etcd.storage` | `{ephemeral, size, storage_class_name, quota_backend_bytes}`; `quota_backend_bytes` (etcd only) is the `--quota-backend-bytes` in bytes, the spec's or sized from the volume under the size's ceiling ([`super::etcd_quota`]) |
//! | `etcd.restore` | while a restore is pending: `{capn_image, endpoint, bucket, region, prefix, snapshot, credentials_secret}` (the snapshot's object key, resolved and verified by capn); none otherwise |
//! | `apiserver.service`, `apiserver.port`, `apiserver.url` | apiserver Service name, port 6443, in-cluster URL |
//! | `disruption.max_unavailable` | `maxUnavailable` of the component's PodDisruptionBudget (integer ≥ 0; [`super::policy::disruption`]) |
//! | `spread.node_when_unsatisfiable`, `spread.zone_when_unsatisfiable` | `whenUnsatisfiable` of the spread over nodes and over zones (`ScheduleAnyway`, `DoNotSchedule`; [`super::policy::spread`]) |
//! | `spread.anti_affinity` | pod anti-affinity among the members: `preferred` or `required` |
//! | `network_policy.capn` | capn's own pods, `{namespace, labels}`, or none when capn runs outside the super cluster |
//! | `network_policy.apiserver_from` | NetworkPolicyPeers admitted to the apiserver besides the controller-manager and capn; none admits everyone |
//! | `network_policy.metrics_from` | NetworkPolicyPeers admitted to the metrics ports; empty admits nobody |
//! | `audit` | apiserver only, when its `spec.audit` is set (else none): `{policy_config_map, policy_key, policy, policy_digest, log: {max_size, max_backup, max_age}, webhook: {secret, key, mode} or none}` ([`super::audit`]) |
//! | `authentication` | apiserver only, when its `spec.authentication` is set (else none): `{config_map, key, configuration, anonymous_digest}` ([`super::authentication`]) |
//! | `authorization` | apiserver only, when its `spec.authorization` is set (else none): `{config_map, key, configuration, webhooks: [{volume, secret, key, dir}]}` ([`super::authorization`]) |
//! | `size.name` | the component's size (`small`), or none when the channel has no sizes ([`super::size`]) |
//! | `size.max_requests_inflight`, `size.max_mutating_requests_inflight` | apiserver: the size's `--max-requests-inflight` and `--max-mutating-requests-inflight`, or none (the process's defaults) |
//! | `size.env` | `[{name, value}]` for the main container: `GOMEMLIMIT` and `GOGC` where the size sets them; empty otherwise |
//! | `encryption.kms_sockets` | `[{volume, directory}]`: each KMS v2 plugin's socket directory on the node, mounted into the apiserver at the same path ([`EncryptionVars`]); empty without `spec.encryption.kms` |
//!
//! Non-string values should go through `tojson` in templates.

use std::collections::BTreeMap;

use serde::Serialize;

use super::policy::{DisruptionVars, NetworkPolicyVars, SpreadVars};

/// Root of the template context.
#[derive(Clone, Debug, Serialize)]
pub struct RenderContext {
    pub cluster: ClusterVars,
    pub component: ComponentVars,
    pub image_repository: String,
    pub names: NameVars,
    pub selector: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
    pub network: NetworkVars,
    pub secrets: BTreeMap<&'static str, String>,
    pub etcd: EtcdVars,
    pub apiserver: ApiServerVars,
    pub selectors: SelectorVars,
    pub disruption: DisruptionVars,
    pub spread: SpreadVars,
    pub network_policy: NetworkPolicyVars,
    /// apiserver only: auditing, when the NestedAPIServer sets `spec.audit`.
    pub audit: Option<super::audit::AuditVars>,
    /// apiserver only: structured authentication, when the NestedAPIServer sets
    /// `spec.authentication`.
    pub authentication: Option<super::authentication::AuthenticationVars>,
    /// apiserver only: structured authorization, when the NestedAPIServer sets
    /// `spec.authorization`.
    pub authorization: Option<super::authorization::AuthorizationVars>,
    /// What the component's size sets (docs/guide/sizes.md).
    pub size: super::size::SizeVars,
    /// Encryption at rest: the KMS plugins' sockets.
    pub encryption: EncryptionVars,
}

/// The render-context `encryption`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct EncryptionVars {
    /// Each KMS v2 plugin's socket directory, once, in order.
    pub kms_sockets: Vec<KmsSocketVars>,
}

/// One KMS socket directory: a `hostPath` volume, mounted at the same path.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct KmsSocketVars {
    /// The volume's name: `kms-0`, `kms-1`, ...
    pub volume: String,
    /// The directory of the socket (`/var/run/kmsplugin` of
    /// `unix:///var/run/kmsplugin/socket.sock`).
    pub directory: String,
}

impl EncryptionVars {
    /// The socket directories of `endpoints` (`unix://` and an absolute path, as the field
    /// rules make them), each once; an endpoint of another shape has none.
    pub fn new(endpoints: &[String]) -> Self {
        let mut directories: Vec<String> = Vec::new();
        for endpoint in endpoints {
            let Some((directory, _socket)) = endpoint.strip_prefix("unix://").and_then(|p| p.rsplit_once('/')) else {
                continue;
            };
            if directory.starts_with('/') && !directories.iter().any(|d| d == directory) {
                directories.push(directory.to_owned());
            }
        }
        Self {
            kms_sockets: directories
                .into_iter()
                .enumerate()
                .map(|(i, directory)| KmsSocketVars {
                    volume: format!("kms-{i}"),
                    directory,
                })
                .collect(),
        }
    }
}

/// The pod selector labels of each component of the cluster.
#[derive(Clone, Debug, Serialize)]
pub struct SelectorVars {
    pub etcd: BTreeMap<String, String>,
    pub apiserver: BTreeMap<String, String>,
    pub controller_manager: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ClusterVars {
    pub name: String,
    pub namespace: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct ComponentVars {
    pub name: &'static str,
    pub resource: String,
    pub replicas: i32,
    pub version: String,
    pub resources: Option<serde_json::Value>,
    pub priority_class_name: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct NameVars {
    pub etcd: String,
    pub apiserver: String,
    pub controller_manager: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct NetworkVars {
    pub service_cidr: String,
    pub dns_domain: String,
    pub super_dns_domain: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct EtcdVars {
    pub members: Vec<EtcdMember>,
    /// `--initial-cluster`: `name=peer_url` of every member, comma-separated.
    pub initial_cluster: String,
    /// `--initial-cluster-state`: `new` or `existing`.
    pub initial_cluster_state: String,
    pub endpoints: Vec<String>,
    pub storage: StorageVars,
    /// Set while the members must be initialised from a snapshot before they start.
    pub restore: Option<RestoreVars>,
}

/// A pending restore, as the templates render its init containers (docs/guide/backups.md
/// "What a restore does"): capn's image fetches and verifies the snapshot, etcd's image runs
/// `etcdutl snapshot restore`, capn's image moves the result into the data directory.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct RestoreVars {
    /// capn's own image (`capn run --capn-image`), which runs `capn etcd-restore`.
    pub capn_image: String,
    pub endpoint: String,
    pub bucket: String,
    pub region: String,
    /// Key prefix, without leading or trailing `/`.
    pub prefix: String,
    /// The snapshot's object key (never `latest`: capn resolved it once, so every member
    /// restores the same snapshot).
    pub snapshot: String,
    /// Secret with `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`.
    pub credentials_secret: String,
}

/// One etcd member as the templates and the published endpoints see it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct EtcdMember {
    /// Pod name, `<c>-etcd-<i>`.
    pub name: String,
    /// `<c>-etcd-<i>.<c>-etcd.<ns>.svc`
    pub host: String,
    /// `https://<host>:2380`
    pub peer_url: String,
    /// `https://<host>:2379`
    pub client_url: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct StorageVars {
    pub ephemeral: bool,
    pub size: String,
    pub storage_class_name: Option<String>,
    /// etcd only: `--quota-backend-bytes`, in bytes ([`super::etcd_quota::quota_backend_bytes`]).
    pub quota_backend_bytes: Option<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ApiServerVars {
    pub service: String,
    pub port: i32,
    pub url: String,
}
