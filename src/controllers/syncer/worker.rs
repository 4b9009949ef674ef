//! One tenant's syncer: its watches, its work queue and its loops. Every tenant has a worker
//! of its own (a kube-runtime `Controller` over the tenant's pods, with its own queue and
//! concurrency), so a tenant with a thousand pending pods, or one whose apiserver hangs,
//! holds up only its own queue (docs/design.md §11).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node, PersistentVolume, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use super::caches::{Changes, received, reflect};
use super::scope::Tenant;
use super::super_caches::SuperCaches;
use super::{custom_resources, nodes, patrol, pod_events, pods, services, volumes};
use crate::controllers::events::Recorder;
use crate::syncer::names::ControlPlaneRef;
use crate::syncer::names::tenancy::TenantObject;
use crate::syncer::pod::references::referenced;
use crate::syncer::pod::{ReferenceKind, Target, projected_sources};
use crate::telemetry::Metrics;

/// The reconciles one tenant's worker runs at once.
const CONCURRENCY: u16 = 4;

/// The settings a worker starts from.
pub(super) struct Start {
    pub super_client: Client,
    /// The super side's shared caches, whose changes in this worker's namespace it receives.
    pub caches: Arc<SuperCaches>,
    pub tenant_client: Client,
    pub target: Target,
    pub patrol_every: Duration,
    pub metrics: Arc<Metrics>,
    /// capn's kubelet API as the tenant Nodes announce it.
    pub kubelet: Option<std::net::SocketAddr>,
    /// This instance's `--watch-filter` value (see `Tenant::mark`).
    pub watch_filter: Option<String>,
    /// The tenant's DNS, when capn serves it: its sockets, and its zone's settings.
    pub dns: Option<TenantDns>,
    /// `spec.workloads.nodePortServices`.
    pub node_port_services: bool,
    /// The selector of `spec.workloads.nodes` in mode `Schedulable`.
    pub shown_nodes: Option<kube::core::Selector>,
    /// `spec.workloads.customResources`.
    pub custom_resources: Option<Vec<String>>,
}

/// What a worker serves the tenant's DNS with.
pub(super) struct TenantDns {
    pub listener: crate::dns::Listener,
    /// The tenant's cluster domain.
    pub domain: String,
    /// The super cluster's cluster domain, when it differs from the tenant's.
    pub super_domain: Option<String>,
    pub hosts: Option<std::path::PathBuf>,
    pub upstream: crate::dns::Upstream,
}

/// Runs one tenant's syncer until dropped: the watches of both sides, the pod queue, the
/// tenant Nodes' heartbeats and the patrol.
pub(super) async fn run(start: Start) {
    let namespace = start.target.control_plane.workload_namespace();
    let subscription = start.caches.subscribe(&namespace);
    // The tenant's ConfigMaps and Secrets by metadata only (kube sends metadata-only requests
    // for `PartialObjectMeta`): their changes wake the pods that use them, and their versions
    // tell a pass whether a copy is current.
    let (tenant_config_maps, tenant_config_map_events) =
        reflect(Api::all(start.tenant_client.clone()), watcher::Config::default());
    let (tenant_secrets, tenant_secret_events) =
        reflect(Api::all(start.tenant_client.clone()), watcher::Config::default());
    let (tenant_nodes, node_events) = reflect::<Node>(
        Api::all(start.tenant_client.clone()),
        watcher::Config::default().labels(&format!("{}=true", nodes::VIRTUAL_NODE_LABEL)),
    );
    // The tenant's claims, and the volumes the syncer showed there: the volumes pass's.
    let (tenant_claims, tenant_claim_changes) =
        reflect::<PersistentVolumeClaim>(Api::all(start.tenant_client.clone()), watcher::Config::default());
    let (tenant_volumes, tenant_volume_changes) = reflect::<PersistentVolume>(
        Api::all(start.tenant_client.clone()),
        watcher::Config::default().labels(&format!("{}=true", crate::syncer::volume::VIRTUAL_VOLUME_LABEL)),
    );
    // The tenant's Services: the services pass's, and the pods' environment.
    let (tenant_services, tenant_service_changes) =
        reflect::<Service>(Api::all(start.tenant_client.clone()), watcher::Config::default());
    // Their EndpointSlices: tenant DNS answers headless Services from them, and the services
    // pass copies those of Services without a selector (only their changes wake it: the
    // tenant's EndpointSlice controller's follow every pod's readiness).
    let (tenant_slices, tenant_slice_changes) = reflect::<k8s_openapi::api::discovery::v1::EndpointSlice>(
        Api::all(start.tenant_client.clone()),
        watcher::Config::default(),
    );
    let tenant_slice_changes = tenant_slice_changes.filter(|change| {
        let by_controller = change.as_ref().is_ok_and(|slice| {
            slice
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(crate::syncer::service::endpoints::MANAGED_BY_LABEL))
                .is_some_and(|by| by == "endpointslice-controller.k8s.io")
        });
        std::future::ready(!by_controller)
    });
    // The queue's own cache of tenant pods is trimmed like the others (Controller::new would
    // keep every pod's managedFields).
    let (tenant_pods, tenant_pod_changes) =
        reflect::<Pod>(Api::all(start.tenant_client.clone()), watcher::Config::default());
    // The tenant's ClusterTrustBundles and PodCertificateRequests are watched once a pod
    // projects them; their changes come through this channel.
    let (projection_changes, projection_events) = tokio::sync::mpsc::unbounded_channel();
    let controller = Controller::for_stream(tenant_pod_changes, tenant_pods.clone())
        .with_config(kube::runtime::controller::Config::default().concurrency(CONCURRENCY));
    let tenant = Arc::new(Tenant {
        recorder: Recorder::new(
            start.tenant_client.clone(),
            "capn-syncer",
            std::env::var("POD_NAME").ok(),
        ),
        super_client: start.super_client,
        tenant_client: start.tenant_client,
        target: start.target,
        namespace,
        node_port_services: start.node_port_services,
        shown_nodes: start.shown_nodes,
        kubelet: start.kubelet,
        watch_filter: start.watch_filter,
        super_pods: start.caches.pods.clone(),
        super_secrets: start.caches.secrets.clone(),
        super_config_maps: start.caches.config_maps.clone(),
        super_claims: start.caches.claims.clone(),
        super_volumes: start.caches.volumes.clone(),
        super_services: start.caches.services.clone(),
        tenant_services,
        super_slices: start.caches.slices.clone(),
        tenant_slices,
        tenant_claims,
        tenant_volumes,
        tenant_pods,
        tenant_nodes,
        nodes_made: Default::default(),
        tenant_config_maps,
        tenant_secrets,
        patrol_every: start.patrol_every,
        applied_copies: Default::default(),
        pods_made: Default::default(),
        tokens_issued: Default::default(),
        trust_bundles: super::projection_state::TrustBundleCache::new(projection_changes.clone()),
        pod_certificates: super::projection_state::PodCertificateState::new(projection_changes),
        metrics: start.metrics,
    });
    let controller = with_triggers(
        controller,
        tenant.control_plane(),
        Triggers {
            super_pods: received(subscription.pods),
            super_config_maps: received(subscription.config_maps),
            super_secrets: received(subscription.secrets),
            tenant_config_maps: tenant_config_map_events,
            tenant_secrets: tenant_secret_events,
            projections: received(projection_events),
        },
    );
    let queue = controller.run(
        |pod, tenant: Arc<Tenant>| async move {
            let started = std::time::Instant::now();
            let result = pods::reconcile(pod, &tenant).await;
            tenant
                .metrics
                .observe("syncer", started, result.as_ref().err().map(pods::SyncError::reason));
            result
        },
        |pod, error, _| {
            tracing::info!(pod = %pod.metadata.name.as_deref().unwrap_or_default(), error = %error, "pod sync failed; backing off");
            Action::requeue(Duration::from_secs(5))
        },
        tenant.clone(),
    );
    let dns = async {
        if let Some(dns) = start.dns {
            let zone = super::dns::Zone {
                tenant: tenant.clone(),
                domain: dns.domain,
                super_domain: dns.super_domain,
                hosts: dns.hosts.map(crate::etcd::HostsFile::new),
                apiserver: Default::default(),
            };
            let zone = Arc::new(zone);
            tokio::join!(
                zone.look_up_apiserver(),
                crate::dns::serve(dns.listener, zone.clone(), Arc::new(dns.upstream))
            );
        }
    };
    tokio::join!(
        dns,
        drain(node_events),
        nodes::heartbeats(&tenant),
        patrol::run(&tenant),
        pod_events::run(&tenant, subscription.events),
        // The resource syncers (`crate::syncer::resource::ResourceSyncer`), one line each:
        // pods (and, first, the ConfigMaps, Secrets and claims they use) through their queue;
        // the kinds copied one per tenant object through `copies::run`.
        queue.for_each(|_| async {}),
        volumes::run(
            &tenant,
            futures::stream::select_all([
                received(subscription.volumes).map(drop).boxed(),
                tenant_claim_changes.map(drop).boxed(),
                tenant_volume_changes.map(drop).boxed(),
            ])
            .boxed()
        ),
        custom_resources::run(
            tenant.clone(),
            start.caches.custom_kinds.clone(),
            start.custom_resources
        ),
        services::run(
            &tenant,
            futures::stream::select_all([
                received(subscription.services).map(drop).boxed(),
                tenant_service_changes.map(drop).boxed(),
                tenant_slice_changes.map(drop).boxed(),
            ])
            .boxed()
        ),
    );
}

/// Polls a reflector's stream for its store's sake.
async fn drain<K>(stream: Changes<K>) {
    stream.for_each(|_| async {}).await;
}

/// The tenant pods in `namespace` that use the ConfigMap or Secret (`kind`) `name`.
fn users_of(pods: &Store<Pod>, kind: ReferenceKind, namespace: &str, name: &str) -> Vec<ObjectRef<Pod>> {
    pods.state()
        .iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(namespace))
        .filter(|p| {
            p.spec
                .as_ref()
                .is_some_and(|spec| referenced(spec).iter().any(|r| r.kind == kind && r.name == name))
        })
        .map(|p| ObjectRef::from_obj(&**p))
        .collect()
}

/// The streams of changed objects, besides the tenant pods, that wake tenant pods.
struct Triggers {
    super_pods: Changes<PartialObjectMeta<Pod>>,
    super_config_maps: Changes<PartialObjectMeta<ConfigMap>>,
    super_secrets: Changes<PartialObjectMeta<Secret>>,
    tenant_config_maps: Changes<PartialObjectMeta<ConfigMap>>,
    tenant_secrets: Changes<PartialObjectMeta<Secret>>,
    /// A tenant ClusterTrustBundle or PodCertificateRequest changed.
    projections: Changes<()>,
}

/// The tenant pod queue `controller`, woken also by what its pods depend on.
fn with_triggers(controller: Controller<Pod>, control_plane: &ControlPlaneRef, triggers: Triggers) -> Controller<Pod> {
    // A super pod's change (its status, above all) wakes its tenant pod; a change of a
    // ConfigMap or Secret, in the tenant or of its copy, wakes the tenant pods that use it;
    // a change of a ClusterTrustBundle or PodCertificateRequest, those that project bundles
    // or certificates.
    let pods = controller.store();
    let projecting = pods.clone();
    let of_super = control_plane.clone();
    let control_plane = control_plane.clone();
    let users = move |kind: ReferenceKind| {
        let (pods, of_super) = (pods.clone(), of_super.clone());
        move |meta: &ObjectMeta, copy: bool| {
            let object = if copy {
                TenantObject::of_super(&of_super, meta).map(|t| (t.namespace, t.name))
            } else {
                meta.namespace.clone().zip(meta.name.clone())
            };
            object.map_or_else(Vec::new, |(namespace, name)| users_of(&pods, kind, &namespace, &name))
        }
    };
    let (config_map_users, secret_users) = (users(ReferenceKind::ConfigMap), users(ReferenceKind::Secret));
    let (tenant_config_map_users, tenant_secret_users) = (config_map_users.clone(), secret_users.clone());
    controller
        .watches_stream(triggers.super_pods, move |pod: PartialObjectMeta<Pod>| {
            TenantObject::of_super(&control_plane, &pod.metadata)
                .map(|t| ObjectRef::<Pod>::new(&t.name).within(&t.namespace))
        })
        .watches_stream(triggers.super_config_maps, move |c: PartialObjectMeta<ConfigMap>| {
            config_map_users(&c.metadata, true)
        })
        .watches_stream(triggers.super_secrets, move |s: PartialObjectMeta<Secret>| {
            secret_users(&s.metadata, true)
        })
        .watches_stream(triggers.tenant_config_maps, move |c: PartialObjectMeta<ConfigMap>| {
            tenant_config_map_users(&c.metadata, false)
        })
        .watches_stream(triggers.tenant_secrets, move |s: PartialObjectMeta<Secret>| {
            tenant_secret_users(&s.metadata, false)
        })
        .reconcile_on(triggers.projections.flat_map(move |_| {
            let users: Vec<_> = projecting
                .state()
                .iter()
                .filter(|p| {
                    p.spec.as_ref().is_some_and(|spec| {
                        projected_sources(spec).any(|s| s.cluster_trust_bundle.is_some() || s.pod_certificate.is_some())
                    })
                })
                .map(|p| ObjectRef::from_obj(&**p))
                .collect();
            futures::stream::iter(users)
        }))
}
