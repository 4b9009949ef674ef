//! One tenant's syncer: its watches, its work queue and its loops. Every tenant has a worker
//! of its own (a kube-runtime `Controller` over the tenant's pods, with its own queue and
//! concurrency), so a tenant with a thousand pending pods, or one whose apiserver hangs,
//! holds up only its own queue (docs/design.md §11).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret};
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};

use super::scope::Tenant;
use super::{nodes, patrol, pod_events, pods};
use crate::controllers::events::Recorder;
use crate::syncer::names::tenancy::TenantObject;
use crate::syncer::pod::Target;
use crate::telemetry::Metrics;

/// The reconciles one tenant's worker runs at once.
const CONCURRENCY: u16 = 4;

/// The settings a worker starts from.
pub(super) struct Start {
    pub super_client: Client,
    pub tenant_client: Client,
    pub target: Target,
    pub patrol_every: Duration,
    pub metrics: Arc<Metrics>,
}

/// Runs one tenant's syncer until dropped: the watches of both sides, the pod queue, the
/// tenant Nodes' heartbeats and the patrol.
pub(super) async fn run(start: Start) {
    let namespace = start.target.control_plane.workload_namespace();
    let (super_pods, super_pod_events) = reflect::<Pod>(Api::namespaced(start.super_client.clone(), &namespace));
    let (super_secrets, secret_events) = reflect::<Secret>(Api::namespaced(start.super_client.clone(), &namespace));
    let (super_config_maps, config_map_events) =
        reflect::<ConfigMap>(Api::namespaced(start.super_client.clone(), &namespace));
    let (tenant_nodes, node_events) = reflect_with::<Node>(
        Api::all(start.tenant_client.clone()),
        watcher::Config::default().labels(&format!("{}=true", nodes::VIRTUAL_NODE_LABEL)),
    );
    let controller = Controller::new(Api::<Pod>::all(start.tenant_client.clone()), watcher::Config::default())
        .with_config(kube::runtime::controller::Config::default().concurrency(CONCURRENCY));
    let control_plane = start.target.control_plane.clone();
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
        super_pods,
        super_secrets,
        super_config_maps,
        tenant_pods: controller.store(),
        tenant_nodes,
        patrol_every: start.patrol_every,
        metrics: start.metrics,
    });
    // A super pod's change (its status, above all) wakes its tenant pod.
    let controller = controller.watches_stream(super_pod_events, move |pod: Pod| {
        TenantObject::of_super(&control_plane, &pod.metadata)
            .map(|t| ObjectRef::<Pod>::new(&t.name).within(&t.namespace))
    });
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
    tokio::join!(
        queue.for_each(|_| async {}),
        drain(secret_events),
        drain(config_map_events),
        drain(node_events),
        nodes::heartbeats(&tenant),
        patrol::run(&tenant),
        pod_events::run(&tenant),
    );
}

/// A reflector on `api`: its store, and its stream of changed objects (which must be polled
/// for the store to fill).
fn reflect<K>(api: Api<K>) -> (Store<K>, futures::stream::BoxStream<'static, Result<K, watcher::Error>>)
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    reflect_with(api, watcher::Config::default())
}

fn reflect_with<K>(
    api: Api<K>,
    config: watcher::Config,
) -> (Store<K>, futures::stream::BoxStream<'static, Result<K, watcher::Error>>)
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, config).default_backoff())
        .touched_objects()
        .boxed();
    (store, stream)
}

/// Polls a reflector's stream for its store's sake.
async fn drain<K>(stream: futures::stream::BoxStream<'static, Result<K, watcher::Error>>) {
    stream.for_each(|_| async {}).await;
}
