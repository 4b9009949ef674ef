//! What one tenant's reconciles share (docs/design.md §11): both clients, the mapping, and
//! the watch caches of both sides. Every part of the syncer reads it; only [`super::worker`]
//! builds it.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Node, PersistentVolume, PersistentVolumeClaim, Pod, Secret, Service};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::Store;
use kube::{Client, Resource};

use super::written_lately::WrittenLately;
use crate::controllers::events::{Occurrence, Recorder};
use crate::syncer::names::ControlPlaneRef;
use crate::syncer::pod::Target;
use crate::telemetry::Metrics;

/// The field manager of everything the syncer writes in the super cluster.
pub(super) const FIELD_MANAGER: &str = crate::apply::FIELD_MANAGER;
/// The field manager of what the syncer writes in a tenant.
pub(super) const TENANT_FIELD_MANAGER: &str = "capn-syncer";

/// What one tenant's reconciles share: both clients, the mapping, and the watch caches of
/// both sides.
pub(super) struct Tenant {
    /// The super cluster.
    pub super_client: Client,
    /// The tenant's apiserver, through its admin kubeconfig.
    pub tenant_client: Client,
    /// What a tenant pod translates with: the control plane, its apiserver as pods reach
    /// it, its Pod Security level.
    pub target: Target,
    /// The workload namespace.
    pub namespace: String,
    /// Whether `NodePort` Services are copied as such (`spec.workloads.nodePortServices`).
    pub node_port_services: bool,
    /// The super nodes shown as tenant Nodes at all times when schedulable
    /// (`spec.workloads.nodes`, mode `Schedulable`); `None`: only those its pods use.
    pub shown_nodes: Option<kube::core::Selector>,
    /// capn's kubelet API as the tenant Nodes announce it (`crate::kubelet`); `None` when
    /// capn does not serve it.
    pub kubelet: Option<std::net::SocketAddr>,
    /// This capn instance's `--watch-filter` value, put on every super object the syncer
    /// makes (see [`Tenant::mark`]).
    pub watch_filter: Option<String>,
    /// The super pods of every workload namespace (the shared cache).
    pub super_pods: Store<Pod>,
    /// The super Secrets of the workload namespace (copies and token Secrets).
    pub super_secrets: Store<Secret>,
    /// The super ConfigMaps of the workload namespace (copies).
    pub super_config_maps: Store<ConfigMap>,
    /// The claim copies of every workload namespace (the shared cache).
    pub super_claims: Store<PersistentVolumeClaim>,
    /// The super cluster's PersistentVolumes (the shared cache).
    pub super_volumes: Store<PersistentVolume>,
    /// The Service copies of every workload namespace (the shared cache).
    pub super_services: Store<Service>,
    /// The tenant's Services.
    pub tenant_services: Store<Service>,
    /// The EndpointSlice copies of every workload namespace (the shared cache).
    pub super_slices: Store<k8s_openapi::api::discovery::v1::EndpointSlice>,
    /// The tenant's EndpointSlices (tenant DNS answers headless Services from them; the
    /// services pass copies those of Services without a selector).
    pub tenant_slices: Store<k8s_openapi::api::discovery::v1::EndpointSlice>,
    /// The tenant's PersistentVolumeClaims.
    pub tenant_claims: Store<PersistentVolumeClaim>,
    /// The tenant PersistentVolumes the syncer made.
    pub tenant_volumes: Store<PersistentVolume>,
    /// The tenant's pods (the worker's own queue reads from it).
    pub tenant_pods: Store<Pod>,
    /// The tenant Nodes the syncer made.
    pub tenant_nodes: Store<Node>,
    /// The tenant Nodes this worker made or found, before its cache shows them; its lock
    /// makes a new Node once when several pods are bound to it at once.
    pub nodes_made: tokio::sync::Mutex<std::collections::HashSet<String>>,
    /// The tenant's ConfigMaps and Secrets, metadata only: a pod's pass reads an object's
    /// data from the tenant only when its `resourceVersion` differs from the copy's source.
    pub tenant_config_maps: Store<PartialObjectMeta<ConfigMap>>,
    pub tenant_secrets: Store<PartialObjectMeta<Secret>>,
    /// Events in the tenant, about tenant pods.
    pub recorder: Recorder,
    /// How often the patrol looks for orphans and drift.
    pub patrol_every: Duration,
    /// The tenant's ClusterTrustBundles, watched from the first pod that projects them.
    pub trust_bundles: super::projection_state::TrustBundleCache,
    /// The tenant's PodCertificateRequests, watched from the first pod that projects a
    /// certificate, and the requests in flight.
    pub pod_certificates: super::projection_state::PodCertificateState,
    /// The super pods this worker made lately, as the super cluster returned them, until
    /// its cache shows them (a pass in between would make them again).
    pub pods_made: WrittenLately<Arc<Pod>>,
    /// The token Secrets written lately, by name (see [`Issued`]).
    pub tokens_issued: WrittenLately<Issued>,
    /// The copies applied or found current, by super name (see [`CopyRecord`]).
    pub applied_copies: std::sync::Mutex<std::collections::HashMap<String, CopyRecord>>,
    pub metrics: Arc<Metrics>,
}

/// What a worker knows of one copy of a ConfigMap or Secret: the tenant object's
/// `resourceVersion` it was made from, the copy's own once known, and when it was applied.
/// Pods syncing at once so apply a shared copy (a namespace's `kube-root-ca.crt`) once, not
/// once each before the cache shows it, and a pass whose caches show both versions unchanged
/// reads nothing.
#[derive(Clone, Debug)]
pub(super) struct CopyRecord {
    pub tenant_version: String,
    /// The copy's `resourceVersion` as applied (or as found equal to the tenant object);
    /// `None` while the apply is in flight.
    pub copy_version: Option<String>,
    pub at: std::time::Instant,
}

/// A token Secret this worker wrote: for the super pod of uid `owner`, due for refresh at
/// `refresh_at`.
#[derive(Clone, Debug)]
pub(super) struct Issued {
    pub owner: String,
    pub refresh_at: k8s_openapi::jiff::Timestamp,
}

impl Tenant {
    /// The control plane this worker syncs.
    pub fn control_plane(&self) -> &ControlPlaneRef {
        &self.target.control_plane
    }

    /// Puts this instance's `--watch-filter` label on a super object it makes, so that the
    /// shared super caches of each instance select only its own tenants' objects
    /// (`super_caches`). The instance that syncs a tenant is the one whose filter its
    /// control plane carries, so the label is also the control plane's.
    pub fn mark(&self, meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) {
        if let Some(value) = &self.watch_filter {
            meta.labels
                .get_or_insert_with(Default::default)
                .insert(crate::controllers::WATCH_FILTER_LABEL.to_owned(), value.clone());
        }
    }

    /// Publishes an Event about the tenant object `object` in the tenant (a `Warning` when
    /// `warning`); a failure is logged, never fatal.
    pub async fn event<K: Resource<DynamicType = ()>>(&self, object: &K, warning: bool, reason: &str, note: String) {
        self.event_with(object, &(), warning, reason, note).await;
    }

    /// [`Tenant::event`] about an object of a kind of any `DynamicType`.
    pub async fn event_with<K: Resource>(
        &self,
        object: &K,
        dynamic_type: &K::DynamicType,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        let occurrence = Occurrence {
            warning,
            reason,
            action: "Sync",
            note,
            regarding: object.object_ref(dynamic_type),
            related: None,
        };
        if let Err(error) = self.recorder.publish(&occurrence).await {
            let name = object.meta().name.as_deref().unwrap_or_default();
            tracing::info!(%error, kind = %K::kind(dynamic_type), %name, "could not publish an Event in the tenant");
        }
    }
}

/// The object with its `apiVersion` and `kind`, which server-side apply requires.
pub(super) fn typed<K: Resource<DynamicType = ()> + serde::Serialize>(object: &K) -> serde_json::Value {
    typed_with(object, &())
}

/// [`typed`] for a kind of any `DynamicType` (a custom resource's `ApiResource`).
pub(super) fn typed_with<K: Resource + serde::Serialize>(
    object: &K,
    dynamic_type: &K::DynamicType,
) -> serde_json::Value {
    let mut value = serde_json::to_value(object).unwrap_or_default();
    value["apiVersion"] = K::api_version(dynamic_type).into();
    value["kind"] = K::kind(dynamic_type).into();
    value
}

/// `result`, with a 404 (the object is already gone) taken as success.
pub(super) fn ignore_missing(result: Result<(), kube::Error>) -> Result<(), kube::Error> {
    match result {
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        other => other,
    }
}
