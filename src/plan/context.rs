//! The documented context every channel template is rendered with (design §3).
//!
//! | variable | meaning |
//! |---|---|
//! | `cluster.name`, `cluster.namespace` | cluster name (CAPI Cluster, or the NCP's name) and namespace |
//! | `component.name` | `etcd`, `apiserver` or `controller-manager` |
//! | `component.resource` | name of the component resource (NestedEtcd, ...) |
//! | `component.replicas` | desired members (integer ≥ 1) |
//! | `component.version` | resolved release, without `v` (`1.36.3`, `3.6.8`) |
//! | `component.resources` | the container's ResourceRequirements object, or none |
//! | `image_repository` | registry and path prefix of the images (`registry.k8s.io`) |
//! | `names.etcd`, `names.apiserver`, `names.controller_manager` | object names: `<c>-etcd`, ... |
//! | `selector` | the pod selector labels of this component (map) |
//! | `labels` | the standard labels capn puts on every object of this component (map) |
//! | `network.service_cidr`, `network.dns_domain`, `network.super_dns_domain` | tenant service CIDR, tenant DNS domain, super cluster DNS domain |
//! | `secrets.<name>` | Secret names: `ca`, `etcd_ca`, `proxy_ca`, `sa`, `apiserver`, `apiserver_etcd_client`, `etcd_server`, `apiserver_kubelet_client`, `front_proxy_client`, `controller_manager_kubeconfig`, `kubeconfig` |
//! | `etcd.members` | etcd only: `[{name, host, peer_url, client_url}]` for every member |
//! | `etcd.endpoints` | the etcd client URLs (apiserver: those NestedEtcd published; etcd: its own) |
//! | `etcd.storage` | `{ephemeral, size, storage_class_name}` |
//! | `apiserver.service`, `apiserver.port`, `apiserver.url` | apiserver Service name, port 6443, in-cluster URL |
//!
//! Non-string values should go through `tojson` in templates.

use std::collections::BTreeMap;

use serde::Serialize;

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
    pub endpoints: Vec<String>,
    pub storage: StorageVars,
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
}

#[derive(Clone, Debug, Serialize)]
pub struct ApiServerVars {
    pub service: String,
    pub port: i32,
    pub url: String,
}
