//! capn: a Cluster API provider that runs nested Kubernetes control planes (etcd,
//! kube-apiserver, kube-controller-manager) as workloads on a super cluster, rendered from
//! versioned manifest channels.
//!
//! The modules follow the reconcile pipeline, lowest layer first (docs/developer/modules.md
//! has the map and which way each layer imports; `module_graph` tests that no two modules
//! import each other):
//!
//! - [`api`]: the CRD types, nothing else; [`crds`]: the CRDs generated from them;
//!   [`component`]: the three components and the names derived from them; [`quantity`]:
//!   Kubernetes quantities as numbers;
//! - [`validate`]: the field rules shared by the CRDs, the controllers and `capn render`;
//! - [`channel`] (load, index, resolve) · [`render`] (templates → objects) · [`patch`] (user
//!   patches, extraArgs) · [`pki`] (certificates and kubeconfigs as data) · [`plan`] (the
//!   pure desired state of one component);
//! - [`upgrade`] (stepped upgrades: path, preflight, progress) · [`backup`] (snapshot
//!   naming, schedules, retention, object storage) · [`etcd`] (the tenant etcd client) ·
//!   [`reach`] (dialling tenants directly or through the super cluster's port-forward);
//! - [`apply`] (server-side apply, ApplySets, readiness) · [`status`] (condition types and
//!   reasons) · [`client`] (the super cluster's client) · [`telemetry`];
//! - [`syncer`]: the pure core of tenant workloads (names, pod translation, admission,
//!   drift, status back to the tenant, claims and volumes); [`kubelet`]: the tenant Nodes'
//!   kubelet API (who calls, logs);
//! - [`controllers`]: the reconcilers; [`manifests`]: the clusterctl artifacts; [`cli`].

pub mod api;
pub mod apply;
pub mod backup;
pub mod channel;
pub mod cli;
pub mod client;
pub mod component;
pub mod controllers;
pub mod crds;
pub mod dns;
pub mod etcd;
pub mod hibernation;
pub mod kubelet;
pub mod manifests;
pub mod patch;
pub mod pki;
pub mod plan;
pub mod quantity;
pub mod reach;
pub mod render;
pub mod status;
pub mod syncer;
pub mod telemetry;
pub mod upgrade;
pub mod validate;

#[cfg(test)]
mod book;
#[cfg(test)]
mod doc_references;
#[cfg(test)]
mod generated;
#[cfg(test)]
mod module_graph;

/// A 64-bit hash of `value` (std's SipHash with its fixed keys, the same in every run of
/// one build): the key or fingerprint capn's in-memory memos keep instead of the strings
/// or objects themselves. Never persisted, never compared across
/// processes.
pub(crate) fn hash64<T: std::hash::Hash + ?Sized>(value: &T) -> u64 {
    use std::hash::Hasher;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}
