//! The syncer (docs/design.md §11): runs each tenant's pods in the super cluster. For every
//! ready NestedControlPlane whose `spec.workloads.sync` is not `false`, a worker of its own
//! ([`worker`], sharing [`scope`]) watches the tenant's pods through the admin kubeconfig and syncs them into
//! the control plane's workload namespace ([`workload_namespace`]); one tenant's queue or
//! outage never holds up another's. When the control plane goes, or turns syncing off, its
//! workload namespace goes, and with it everything synced for it. With `--watch-filter`,
//! each capn instance syncs the tenants it reconciles.
//!
//! - [`pods`]: one tenant pod, down and up; [`references`] and [`tokens`]: what it mounts;
//! - [`nodes`]: the tenant Nodes and their Leases; [`pod_events`]: the super cluster's Events
//!   about super pods, told in the tenant about the tenant pods;
//! - [`services`]: Services and their EndpointSlices; [`dns`]: the tenant's cluster DNS;
//! - [`custom_resources`]: the instances of public CRDs that opt in ([`super_custom`] is
//!   their shared super side); [`copies`]: the engine of every
//!   `crate::syncer::resource::ResourceSyncer`;
//! - [`patrol`]: orphans, confirmed against the tenant before removal.

mod caches;
mod copies;
mod custom_resources;
mod dns;
mod lazy_watch;
mod nodes;
mod passes;
mod patrol;
mod pod_certificates;
mod pod_events;
mod pod_owned;
mod pods;
mod projection_state;
mod references;
mod scope;
mod services;
mod super_caches;
mod super_custom;
mod tokens;
mod trust_bundles;
mod volumes;
mod worker;
pub mod workload_namespace;
mod written_lately;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::{Resource, ResourceExt};

pub use nodes::{KUBELET_ADDRESS_TYPE, VIRTUAL_NODE_LABEL};
pub use tokens::REFRESH_AT;

use super_caches::SuperCaches;

use crate::api::{NestedControlPlane, Workloads};
use crate::controllers::round::Now;
use crate::controllers::shared::tenant::tenant_config;
use crate::controllers::{Context, ReconcileError, events};
use crate::status::{ConditionUpdate, Reason, WORKLOADS_SYNCED, set_condition};
use crate::syncer::admission::Level;
use crate::syncer::names::ControlPlaneRef;
use crate::syncer::names::tenancy;
use crate::syncer::pod::{ApiServerAddress, Target};

/// The read timeout of a worker's tenant client: longer than a watch request lasts (kube's
/// watcher asks for 290 s), so that an idle watch is not cut; a tenant apiserver that hangs
/// holds only its own worker's requests this long.
const WATCH_READ_TIMEOUT: Duration = Duration::from_secs(330);
/// Default of [`crate::controllers::Settings::syncer_patrol`].
pub const DEFAULT_PATROL: Duration = Duration::from_secs(60);

/// The running workers, by control plane, with what they were started from.
#[derive(Default)]
struct Workers(Mutex<HashMap<ControlPlaneRef, Worker>>);

struct Worker {
    started_from: Started,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a worker depends on: a change restarts it.
#[derive(Clone, Debug, PartialEq)]
struct Started {
    level: Level,
    workloads: Option<Workloads>,
    apiserver: ApiServerAddress,
    /// capn's kubelet API as the tenant Nodes announce it.
    kubelet: Option<std::net::SocketAddr>,
    /// The tenant's cluster domain, which its DNS serves.
    dns_domain: String,
}

/// What the syncer serves every worker with.
struct Served<'a> {
    caches: Arc<SuperCaches>,
    kubelet: Option<&'a KubeletApi>,
    /// The tenants' DNS ports, when capn serves their DNS.
    dns_ports: Option<Arc<crate::dns::Ports>>,
}

/// capn's kubelet API for the tenant Nodes: who may call, and where the Nodes say it is.
struct KubeletApi {
    tenants: Arc<crate::kubelet::Tenants>,
    announced: std::net::SocketAddr,
}

/// Runs the syncer until the stream ends.
pub async fn run(ctx: Arc<Context>) {
    let workers = Arc::new(Workers::default());
    let (caches, routing) = SuperCaches::start(&ctx.client, ctx.settings.watch_filter.as_deref(), ctx.metrics.clone());
    let kubelet = start_kubelet_api(&ctx).await.map(Arc::new);
    let dns_ports = ctx
        .settings
        .dns
        .as_ref()
        .map(|endpoint| crate::dns::Ports::new(endpoint.ports.clone()));
    let controller = Controller::new(ctx.api::<NestedControlPlane>(), ctx.primary_watch_config());
    let store = controller.store();
    let sweep = sweep_forever(ctx.clone(), workers.clone(), store);
    let queue = controller
        .shutdown_on_signal()
        .run(
            move |ncp, ctx| {
                let (workers, caches, kubelet) = (workers.clone(), caches.clone(), kubelet.clone());
                let dns_ports = dns_ports.clone();
                async move {
                    let served = Served {
                        caches,
                        kubelet: kubelet.as_deref(),
                        dns_ports,
                    };
                    let reconciled = reconcile(ncp, ctx.clone(), &workers, served);
                    crate::controllers::instrumented(&ctx, "syncer", reconciled).await
                }
            },
            |_, error, _| {
                tracing::info!(error = %error, "syncer start failed; backing off");
                Action::requeue(Duration::from_secs(15))
            },
            ctx,
        )
        .for_each(|_| async {});
    tokio::join!(queue, sweep, routing);
}

/// Starts, restarts or stops the worker of one control plane, and reports
/// `WorkloadsSynced`.
async fn reconcile(
    ncp: Arc<NestedControlPlane>,
    ctx: Arc<Context>,
    workers: &Workers,
    served: Served<'_>,
) -> Result<Action, ReconcileError> {
    let kubelet = served.kubelet;
    let ns = ncp.namespace().ok_or(ReconcileError::NoNamespace)?;
    let control_plane = ControlPlaneRef::new(&ns, ncp.name_any());
    let workloads = ncp.spec.workloads.clone();
    let enabled = workloads.as_ref().and_then(|w| w.sync) != Some(false);
    if ncp.meta().deletion_timestamp.is_some() || !enabled {
        workers.stop(&control_plane);
        if let Some(kubelet) = kubelet {
            kubelet.tenants.remove(&control_plane);
        }
        workload_namespace::delete(&ctx.client, &control_plane).await?;
        if !enabled {
            // The tenant Nodes and PersistentVolumes the syncer made go once, when syncing
            // stops: no pod runs on the Nodes any more (the tenant's pod garbage collector
            // then removes the pods bound to them), and the volumes' claim copies went with
            // the workload namespace. A tenant that cannot be reached keeps the condition as it was, and
            // this is retried.
            if !sync_disabled_before(&ncp) {
                let tenant = kube::Client::try_from(tenant_config(&ctx, &ncp, &ns).await?)?;
                nodes::remove_all(&tenant).await?;
                volumes::remove_all(&tenant).await?;
            }
            let update = ConditionUpdate::new(
                WORKLOADS_SYNCED,
                true,
                Reason::WorkloadSyncDisabled,
                "spec.workloads.sync is false: the tenant's pods are not run by the super cluster".to_owned(),
            );
            report(&ctx, &ncp, &ns, update).await?;
        }
        return Ok(Action::await_change());
    }
    if crate::hibernation::components_sleep(&ncp) {
        // Asleep (docs/design.md §12): the tenant's apiserver goes away, so the worker stops
        // rather than retrying against it; the pods it synced keep running, unobserved, and
        // the worker starts again (and catches up) once the control plane is ready.
        workers.stop(&control_plane);
        let update = ConditionUpdate::new(
            WORKLOADS_SYNCED,
            false,
            Reason::Sleeping,
            "the control plane sleeps: the tenant's pods keep running in the super cluster, unobserved, until it wakes"
                .to_owned(),
        );
        report(&ctx, &ncp, &ns, update).await?;
        return Ok(Action::await_change());
    }
    let ready = ncp.status.as_ref().is_some_and(|s| s.ready);
    let Some(endpoint) = ncp.spec.control_plane_endpoint.clone().filter(|_| ready) else {
        return Ok(Action::await_change());
    };
    let level: Level = workloads
        .as_ref()
        .and_then(|w| w.pod_security)
        .unwrap_or_default()
        .into();
    let started = Started {
        level,
        workloads: workloads.clone(),
        apiserver: ApiServerAddress {
            host: endpoint.host.clone(),
            port: u16::try_from(endpoint.port).unwrap_or(443),
        },
        kubelet: kubelet.map(|k| k.announced),
        dns_domain: crate::controllers::shared::read::cluster_settings(
            &ncp,
            crate::controllers::shared::read::owning_cluster(&ctx, &ncp)
                .await?
                .as_deref(),
            &ctx.settings.super_dns_domain,
        )
        .dns_domain,
    };
    if let Some(kubelet) = kubelet {
        admit(&ctx, kubelet, &ncp, &ns, &control_plane).await?;
    }
    if workers.running(&control_plane, &started) {
        return Ok(Action::requeue(Duration::from_secs(300)));
    }
    let result = start(&ctx, &ncp, &ns, &control_plane, &started, workers, served).await;
    let update = match &result {
        Ok(()) => ConditionUpdate::new(
            WORKLOADS_SYNCED,
            true,
            Reason::WorkloadsSyncing,
            format!(
                "the tenant's pods run in the super cluster namespace {} at Pod Security level {}",
                control_plane.workload_namespace(),
                level.label_value()
            ),
        ),
        Err(e) => ConditionUpdate::new(
            WORKLOADS_SYNCED,
            false,
            Reason::TenantUnreachable,
            format!("the syncer could not start: {e}"),
        ),
    };
    report(&ctx, &ncp, &ns, update).await?;
    result.map(|()| Action::requeue(Duration::from_secs(300)))
}

/// Whether `WorkloadsSynced` already says that syncing is off.
fn sync_disabled_before(ncp: &NestedControlPlane) -> bool {
    ncp.status
        .iter()
        .flat_map(|s| &s.conditions)
        .any(|c| c.type_ == WORKLOADS_SYNCED && c.reason == Reason::WorkloadSyncDisabled.as_str())
}

/// Binds and serves capn's kubelet API when `--kubelet-advertise-address` asks for it; a
/// failure is logged and the tenant Nodes then announce none (pods still run).
async fn start_kubelet_api(ctx: &Context) -> Option<KubeletApi> {
    let endpoint = ctx.settings.kubelet.clone()?;
    let (listener, port) = match crate::kubelet::bind(&endpoint).await {
        Ok(bound) => bound,
        Err(error) => {
            tracing::error!(%error, "the tenant Nodes' kubelet API is off");
            return None;
        }
    };
    let tenants = Arc::new(crate::kubelet::Tenants::default());
    let advertise = endpoint.advertise;
    let serving = crate::kubelet::serve(listener, endpoint, tenants.clone(), ctx.client.clone());
    tokio::spawn(async move {
        if let Err(error) = serving.await {
            tracing::error!(%error, "the tenant Nodes' kubelet API stopped");
        }
    });
    let announced = std::net::SocketAddr::new(advertise, port);
    tracing::info!(%announced, "serving the tenant Nodes' kubelet API");
    Some(KubeletApi { tenants, announced })
}

/// Lets the tenant's apiserver call the kubelet API with a client certificate of its
/// cluster CA (read from `<cluster>-ca` at every reconcile, so a rotated CA is followed).
async fn admit(
    ctx: &Context,
    kubelet: &KubeletApi,
    ncp: &NestedControlPlane,
    ns: &str,
    control_plane: &ControlPlaneRef,
) -> Result<(), ReconcileError> {
    let names = crate::pki::SecretNames::new(&crate::controllers::shared::read::cluster_name(ncp));
    let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(ctx.client.clone(), ns)
        .get(&names.ca)
        .await?;
    let pem = secret
        .data
        .as_ref()
        .and_then(|d| d.get(crate::pki::TLS_CERT_KEY))
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
        .unwrap_or_default();
    if !kubelet.tenants.admitted_with(control_plane, &pem)
        && let Err(error) = kubelet.tenants.admit(control_plane, &pem)
    {
        tracing::warn!(%error, "the tenant's apiserver cannot call the kubelet API");
    }
    Ok(())
}

/// Makes the workload namespace and starts the worker.
async fn start(
    ctx: &Context,
    ncp: &NestedControlPlane,
    ns: &str,
    control_plane: &ControlPlaneRef,
    started: &Started,
    workers: &Workers,
    served: Served<'_>,
) -> Result<(), ReconcileError> {
    let cluster = crate::controllers::shared::read::cluster_name(ncp);
    let desired = workload_namespace::desired(control_plane, &cluster, started.level, started.workloads.as_ref());
    workload_namespace::apply(&ctx.client, &desired).await?;
    // The worker this one replaces gives its DNS port back first, so that the new one
    // takes the same port (and the DNS Service's endpoint stays as it is).
    workers.stop(control_plane);
    let exposed = match (&ctx.settings.dns, &served.dns_ports) {
        (Some(endpoint), Some(ports)) => {
            dns::expose(&ctx.client, &control_plane.workload_namespace(), endpoint, ports).await?
        }
        _ => None,
    };
    // The workers' watches idle for minutes: the read timeout of a tenant client (15 s, for
    // requests) would cut each one and make it list again.
    let mut config = tenant_config(ctx, ncp, ns).await?;
    config.read_timeout = Some(WATCH_READ_TIMEOUT);
    let tenant_client = kube::Client::try_from(config)?;
    let super_domain = Some(ctx.settings.super_dns_domain.clone()).filter(|d| *d != started.dns_domain);
    let cluster_dns = exposed.as_ref().map(|e| crate::syncer::pod::ClusterDns {
        nameserver: e.nameserver.to_string(),
        domain: started.dns_domain.clone(),
    });
    let dns = match (exposed, &ctx.settings.dns) {
        (Some(exposed), Some(endpoint)) => Some(worker::TenantDns {
            listener: exposed.listener,
            domain: started.dns_domain.clone(),
            super_domain,
            hosts: ctx.settings.etcd_hosts_file.clone(),
            upstream: endpoint.upstream.clone(),
        }),
        _ => None,
    };
    let start = worker::Start {
        super_client: ctx.client.clone(),
        caches: served.caches,
        tenant_client,
        target: Target {
            control_plane: control_plane.clone(),
            apiserver: started.apiserver.clone(),
            level: started.level,
            dns: cluster_dns,
        },
        patrol_every: ctx.settings.syncer_patrol,
        metrics: ctx.metrics.clone(),
        kubelet: started.kubelet,
        watch_filter: ctx.settings.watch_filter.clone(),
        dns,
        node_port_services: started
            .workloads
            .as_ref()
            .and_then(|w| w.node_port_services)
            .unwrap_or(false),
        custom_resources: started.workloads.as_ref().and_then(|w| w.custom_resources.clone()),
        shown_nodes: shown_nodes(started.workloads.as_ref()),
    };
    tracing::info!(tenant = %control_plane.key(), namespace = %control_plane.workload_namespace(), "syncing the tenant's workloads");
    let task = tokio::spawn(worker::run(start));
    workers.insert(
        control_plane.clone(),
        Worker {
            started_from: started.clone(),
            task,
        },
    );
    Ok(())
}

/// The selector of the super nodes a tenant sees at all times (`spec.workloads.nodes` in mode
/// `Schedulable`; an absent selector selects every node); `None` in mode `Used`. A selector
/// kube cannot read (admission refuses it, `crate::validate`) falls back to `Used`, logged.
fn shown_nodes(workloads: Option<&crate::api::Workloads>) -> Option<kube::core::Selector> {
    let nodes = workloads.and_then(|w| w.nodes.as_ref())?;
    if nodes.mode != Some(crate::api::TenantNodesMode::Schedulable) {
        return None;
    }
    match kube::core::Selector::try_from(nodes.selector.clone().unwrap_or_default()) {
        Ok(selector) => Some(selector),
        Err(error) => {
            tracing::warn!(%error, "spec.workloads.nodes.selector is not a label selector: showing the used nodes only");
            None
        }
    }
}

/// Writes `WorkloadsSynced` when it changed (only this controller's condition: the
/// conditions list is a map by type).
async fn report(
    ctx: &Context,
    ncp: &NestedControlPlane,
    ns: &str,
    update: ConditionUpdate,
) -> Result<(), ReconcileError> {
    let old = ncp.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
    let mut conditions = old.clone();
    set_condition(&mut conditions, update, ncp.meta().generation, &Now::take().k8s);
    let condition = conditions.iter().find(|c| c.type_ == WORKLOADS_SYNCED).cloned();
    if condition.as_ref() == old.iter().find(|c| c.type_ == WORKLOADS_SYNCED) {
        return Ok(());
    }
    let patch = serde_json::json!({
        "apiVersion": NestedControlPlane::api_version(&()),
        "kind": NestedControlPlane::kind(&()),
        "status": {"conditions": [condition]},
    });
    Api::<NestedControlPlane>::namespaced(ctx.client.clone(), ns)
        .patch_status(
            &ncp.name_any(),
            &PatchParams::apply("capn-syncer").force(),
            &Patch::Apply(&patch),
        )
        .await?;
    events::publish_condition_changes(ctx, ncp, &old, &conditions).await;
    Ok(())
}

/// Every patrol period: stops the workers of control planes that are gone and deletes
/// their workload namespaces, and those of control planes deleted while capn was not
/// running. A control plane missing from the cache is confirmed gone with a read first
/// (it may be another capn instance's under `--watch-filter`, or the cache may lag).
async fn sweep_forever(
    ctx: Arc<Context>,
    workers: Arc<Workers>,
    store: kube::runtime::reflector::Store<NestedControlPlane>,
) {
    if store.wait_until_ready().await.is_err() {
        return;
    }
    let mut tick = tokio::time::interval(ctx.settings.syncer_patrol);
    loop {
        tick.tick().await;
        if let Err(error) = sweep(&ctx, &workers).await {
            tracing::info!(%error, "syncer sweep failed; trying again next round");
        }
    }
}

async fn sweep(ctx: &Context, workers: &Workers) -> Result<(), kube::Error> {
    let params = ListParams::default().labels(&format!("{}=true", workload_namespace::WORKLOADS_LABEL));
    for namespace in Api::<Namespace>::all(ctx.client.clone()).list(&params).await?.items {
        let Some((ns, name)) = namespace
            .annotations()
            .get(tenancy::CLUSTER)
            .and_then(|key| key.split_once('/'))
        else {
            continue;
        };
        if ctx.settings.namespace.as_deref().is_some_and(|watched| watched != ns) {
            continue;
        }
        let gone = Api::<NestedControlPlane>::namespaced(ctx.client.clone(), ns)
            .get_opt(name)
            .await?
            .is_none();
        if gone && namespace.metadata.deletion_timestamp.is_none() {
            let control_plane = ControlPlaneRef::new(ns, name);
            tracing::info!(tenant = %control_plane.key(), "removing the workloads of a control plane that is gone");
            workers.stop(&control_plane);
            workload_namespace::delete(&ctx.client, &control_plane).await?;
        }
    }
    Ok(())
}

impl Workers {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ControlPlaneRef, Worker>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a live worker of `control_plane` runs from `started`.
    fn running(&self, control_plane: &ControlPlaneRef, started: &Started) -> bool {
        self.lock()
            .get(control_plane)
            .is_some_and(|w| w.started_from == *started && !w.task.is_finished())
    }

    fn insert(&self, control_plane: ControlPlaneRef, worker: Worker) {
        self.lock().insert(control_plane, worker);
    }

    fn stop(&self, control_plane: &ControlPlaneRef) {
        self.lock().remove(control_plane);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workloads(nodes: serde_json::Value) -> Workloads {
        serde_json::from_value(serde_json::json!({"nodes": nodes})).unwrap()
    }

    #[test]
    fn only_the_schedulable_mode_shows_super_nodes_and_its_selector_narrows_them() {
        assert_eq!(shown_nodes(None), None);
        assert_eq!(shown_nodes(Some(&Workloads::default())), None);
        assert_eq!(shown_nodes(Some(&workloads(serde_json::json!({"mode": "Used"})))), None);
        let all = shown_nodes(Some(&workloads(serde_json::json!({"mode": "Schedulable"})))).unwrap();
        assert!(all.selects_all());
        let pool = shown_nodes(Some(&workloads(
            serde_json::json!({"mode": "Schedulable", "selector": {
            "matchLabels": {"pool": "tenants"},
            "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}}),
        )))
        .unwrap();
        assert_eq!(pool.to_string(), "pool=tenants,zone in (a,b)");
        // A selector only kube cannot read falls back to the used nodes (admission refuses it).
        let broken = workloads(serde_json::json!({"mode": "Schedulable", "selector": {
            "matchExpressions": [{"key": "zone", "operator": "Is"}]}}));
        assert_eq!(shown_nodes(Some(&broken)), None);
    }
}
