//! The process-wide watch caches every controller reads from (docs/design.md §5: "reads come from
//! watch caches"). One watch per kind for the whole process:
//!
//! - NestedControlPlane and the three component kinds: shared reflectors
//!   (kube-runtime's `store_shared`), each controller subscribing to the kinds it needs;
//! - Secrets, **metadata only** (`PartialObjectMeta<Secret>`), kept as [`CachedSecret`]: the fields
//!   capn reads (name, resourceVersion, control plane owners, its certificate times): their
//!   resourceVersions say when a certificate must be read again, and every change or deletion of a control
//!   plane's Secret wakes that control plane's controllers within a moment, not at the next
//!   resync (a deleted CA is noticed at once).
//!
//! - the StatefulSets and Services capn applied, as [`CachedStatefulSet`] and
//!   [`CachedService`]: the few fields readiness reads, with their metadata trimmed to
//!   [`owned_metadata`];
//! - the ConfigMaps capn does not own, **metadata only** and not kept: each change is
//!   passed on ([`Caches::config_map_changes`]) so that a ConfigMap a NestedAPIServer
//!   references (an audit policy, an authentication or authorization configuration) wakes
//!   it at once;
//! - Cluster API's Clusters, when Cluster API is installed ([`ClusterCache`]): the spec
//!   fields capn reads of the Cluster that owns a control plane.
//!
//! Cached objects keep what reconciles read: `managedFields` and the last-applied
//! annotation are stripped as they arrive.

pub mod objects;

use std::future::ready;
use std::sync::Arc;

use futures::{FutureExt, TryStreamExt};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DynamicObject, PartialObjectMeta};
use kube::runtime::reflector::{self, Lookup, ObjectRef, ReflectHandle, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::api::{NestedAPIServer, NestedControlPlane, NestedControllerManager, NestedEtcd};
use crate::apply::Live;
use crate::controllers::shared::cache::objects::{
    CachedSecret, CachedService, CachedStatefulSet, api_json, owned_metadata, trim_statefulset,
};
use crate::controllers::shared::read::{CAPI_GROUP, capi_cluster_owner, cluster_name};
use crate::pki::SecretNames;
use crate::telemetry::Metrics;

/// Events a shared reflector buffers per subscriber before it waits for the slowest one.
const SHARED_BUFFER: usize = 1024;
/// Secret changes buffered for the controllers' triggers; a controller that falls further
/// behind skips the oldest (each control plane is also resynced, so nothing is lost for good).
const SECRET_EVENTS: usize = 4096;
/// ConfigMap changes buffered for the apiservers' trigger; one that falls further behind
/// skips the oldest (read again at the apiserver's next pass).
const CONFIG_MAP_CHANGES: usize = 1024;
/// Cluster spec changes buffered for the control plane controller's trigger; one that
/// falls further behind skips the oldest, seen then at the control plane's next reconcile.
const CLUSTER_CHANGES: usize = 1024;
/// Annotation `kubectl apply` leaves on objects: never read, never cached.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The caches, readable from every reconcile through [`crate::controllers::Context::caches`].
pub struct Caches {
    pub control_planes: Store<NestedControlPlane>,
    pub etcds: Store<NestedEtcd>,
    pub apiservers: Store<NestedAPIServer>,
    pub controller_managers: Store<NestedControllerManager>,
    /// Metadata of every Secret in the watched namespaces.
    pub secrets: Store<CachedSecret>,
    /// The StatefulSets capn applied (label `app.kubernetes.io/managed-by=capn`), as much
    /// as readiness and membership read ([`CachedStatefulSet`]).
    pub statefulsets: Store<CachedStatefulSet>,
    /// The Services capn applied, as much as readiness and the apiserver's address read
    /// ([`CachedService`]).
    pub services: Store<CachedService>,
    /// Cluster API's Clusters; `None` when Cluster API's `Cluster` was not served when
    /// capn started (a control plane owned by one then reads it with a GET, as it does a
    /// Cluster this cache does not hold).
    pub clusters: Option<ClusterCache>,
    secret_events: broadcast::Sender<Arc<CachedSecret>>,
    config_map_changes: broadcast::Sender<Arc<ChangedConfigMap>>,
}

/// A ConfigMap that changed, was created or deleted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangedConfigMap {
    pub namespace: String,
    pub name: String,
}

/// The Clusters of Cluster API in the watched namespaces, each trimmed to
/// [`owned_metadata`] and the spec fields capn reads (`paused`, `clusterNetwork`): every
/// reconcile of a control plane and of its components reads the Cluster that owns it
/// (paused? its service CIDR and domain), a GET each before this cache.
pub struct ClusterCache {
    /// The Clusters as last seen.
    store: Store<DynamicObject>,
    /// The version of `Cluster` the API server recommends, which the cache watches.
    resource: ApiResource,
    /// Each Cluster whose spec changed (its generation, or first seen): wakes the control
    /// planes it owns, so that unpausing a Cluster resumes them at once.
    changes: broadcast::Sender<Arc<DynamicObject>>,
}

/// Spec fields of a Cluster that capn reads (docs/design.md §1 and the CAPI contract).
const CLUSTER_SPEC_FIELDS: [&str; 2] = ["paused", "clusterNetwork"];

/// Trims a cached Cluster to what reconciles read of it.
fn cluster_spec(cluster: &mut DynamicObject) {
    owned_metadata(cluster);
    let spec: serde_json::Map<String, serde_json::Value> = CLUSTER_SPEC_FIELDS
        .iter()
        .filter_map(|field| {
            Some((
                field.to_string(),
                cluster.data.pointer(&format!("/spec/{field}"))?.clone(),
            ))
        })
        .collect();
    cluster.data = serde_json::json!({ "spec": spec });
}

/// The `Cluster` resource of Cluster API as the API server serves it, or `None` when it
/// does not (Cluster API not installed) or discovery failed (then capn reads Clusters
/// with a GET, as without this cache).
async fn capi_clusters(client: &Client) -> Option<ApiResource> {
    match kube::discovery::group(client, CAPI_GROUP).await {
        Ok(group) => group.recommended_kind("Cluster").map(|(resource, _)| resource),
        Err(kube::Error::Api(e)) if e.code == 404 => None,
        Err(error) => {
            tracing::warn!(%error, "cannot discover Cluster API's Clusters; reading them one by one");
            None
        }
    }
}

/// The change streams of the shared reflectors. Each must be polled or dropped: a shared
/// reflector waits for its slowest subscriber.
pub struct Subscriptions {
    pub control_planes: ReflectHandle<NestedControlPlane>,
    pub etcds: ReflectHandle<NestedEtcd>,
    pub apiservers: ReflectHandle<NestedAPIServer>,
    pub controller_managers: ReflectHandle<NestedControllerManager>,
    pub statefulsets: ReflectHandle<CachedStatefulSet>,
    pub services: ReflectHandle<CachedService>,
}

/// Drops everything a value holds only once: keeps the reflector tasks alive while the
/// controllers run, and stops them with the controllers.
pub struct Drivers(Vec<JoinHandle<()>>);

impl Drop for Drivers {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Strips what no reconcile reads from a cached object as it arrives.
pub(in crate::controllers) fn strip<K: Resource>(object: &mut K) {
    object.managed_fields_mut().clear();
    object.annotations_mut().remove(LAST_APPLIED);
}

/// A metadata watch event as the cache keeps it ([`CachedSecret`]).
fn cached_secret(event: watcher::Event<PartialObjectMeta<Secret>>) -> watcher::Event<CachedSecret> {
    use watcher::Event;
    match event {
        Event::Apply(secret) => Event::Apply(secret.into()),
        Event::Delete(secret) => Event::Delete(secret.into()),
        Event::Init => Event::Init,
        Event::InitApply(secret) => Event::InitApply(secret.into()),
        Event::InitDone => Event::InitDone,
    }
}

/// Label of everything capn applies.
const MANAGED: &str = "app.kubernetes.io/managed-by=capn";

/// A shared reflector of `K`: its store, one subscription, and the task driving the watch;
/// `modify` trims each object before it is cached.
fn shared<K>(
    api: Api<K>,
    config: watcher::Config,
    modify: fn(&mut K),
    metrics: &Arc<Metrics>,
) -> (Store<K>, ReflectHandle<K>, JoinHandle<()>)
where
    K: Resource<DynamicType = ()>
        + Lookup<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store_shared(SHARED_BUFFER);
    let handle = writer.subscribe().expect("a shared store hands out subscriptions");
    let metrics = metrics.clone();
    let kind = <K as Resource>::kind(&()).into_owned();
    let driver = watcher(api, config)
        .default_backoff()
        .modify(modify)
        .reflect_shared(writer)
        .for_each(move |event| {
            match event {
                Ok(_) => metrics.watch_succeeded(&kind),
                Err(error) => metrics.watch_failed(&kind, &error),
            }
            ready(())
        });
    (reader, handle, tokio::spawn(driver))
}

impl Caches {
    /// Starts one watch per kind in `namespace` (all namespaces when `None`), the custom
    /// resources filtered by `primary` (the `--watch-filter` label selector). Returns once
    /// every cache holds its first complete list, so no reconcile mistakes a cache that is
    /// still filling for an object that does not exist.
    ///
    /// With `watch` false nothing is watched and the caches stay empty: for a process that
    /// runs none of the controllers reading them (the infrastructure provider), whose
    /// ClusterRole does not allow those watches.
    pub async fn start(
        client: &Client,
        namespace: Option<&str>,
        primary: watcher::Config,
        watch: bool,
        metrics: &Arc<Metrics>,
    ) -> (Arc<Caches>, Subscriptions, Drivers) {
        if !watch {
            let (control_planes, subscribe_cp) = reflector::store_shared(1);
            let (etcds, subscribe_etcd) = reflector::store_shared(1);
            let (apiservers, subscribe_apiserver) = reflector::store_shared(1);
            let (controller_managers, subscribe_cm) = reflector::store_shared(1);
            let (statefulsets, subscribe_sts) = reflector::store_shared(1);
            let (services, subscribe_svc) = reflector::store_shared(1);
            let subscription = "a shared store hands out subscriptions";
            let subscriptions = Subscriptions {
                control_planes: subscribe_cp.subscribe().expect(subscription),
                etcds: subscribe_etcd.subscribe().expect(subscription),
                apiservers: subscribe_apiserver.subscribe().expect(subscription),
                controller_managers: subscribe_cm.subscribe().expect(subscription),
                statefulsets: subscribe_sts.subscribe().expect(subscription),
                services: subscribe_svc.subscribe().expect(subscription),
            };
            let caches = Caches {
                control_planes,
                etcds,
                apiservers,
                controller_managers,
                secrets: reflector::store().0,
                statefulsets,
                services,
                clusters: None,
                secret_events: broadcast::channel(1).0,
                config_map_changes: broadcast::channel(1).0,
            };
            return (Arc::new(caches), subscriptions, Drivers(Vec::new()));
        }
        fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
        where
            K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
        {
            match namespace {
                Some(ns) => Api::namespaced(client.clone(), ns),
                None => Api::all(client.clone()),
            }
        }
        let (control_planes, cp_handle, cp_task) = shared(api(client, namespace), primary.clone(), strip, metrics);
        let (etcds, etcd_handle, etcd_task) = shared(api(client, namespace), primary.clone(), strip, metrics);
        let (apiservers, apiserver_handle, apiserver_task) =
            shared(api(client, namespace), primary.clone(), strip, metrics);
        let (controller_managers, cm_handle, cm_task) = shared(api(client, namespace), primary.clone(), strip, metrics);
        let managed = watcher::Config::default().labels(MANAGED);
        let (statefulsets, sts_handle, sts_task) =
            shared(api(client, namespace), managed.clone(), trim_statefulset, metrics);
        let (services, svc_handle, svc_task) = shared(api(client, namespace), managed, owned_metadata, metrics);

        let (secret_reader, secret_writer) = reflector::store();
        let (secret_events, _) = broadcast::channel(SECRET_EVENTS);
        let sender = secret_events.clone();
        let secret_metrics = metrics.clone();
        let secrets_api: Api<PartialObjectMeta<Secret>> = match namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        // `reflector` rather than `.reflect`: a CachedSecret is a reflector `Lookup`, not a
        // `Resource` (it has no ObjectMeta).
        let secret_task = tokio::spawn(
            reflector::reflector(
                secret_writer,
                watcher(secrets_api, watcher::Config::default())
                    .default_backoff()
                    .map_ok(cached_secret),
            )
            .touched_objects()
            .for_each(move |event| {
                match event {
                    // Nobody listening yet is fine: the caches still fill.
                    Ok(secret) => {
                        secret_metrics.watch_succeeded("Secret");
                        drop(sender.send(Arc::new(secret)));
                    }
                    Err(error) => secret_metrics.watch_failed("Secret", &error),
                }
                ready(())
            }),
        );
        let (config_map_changes, _) = broadcast::channel(CONFIG_MAP_CHANGES);
        let config_map_task = watch_config_maps(client, namespace, config_map_changes.clone(), metrics.clone());
        let mut tasks = vec![
            config_map_task,
            cp_task,
            etcd_task,
            apiserver_task,
            cm_task,
            sts_task,
            svc_task,
            secret_task,
        ];
        let clusters = match capi_clusters(client).await {
            Some(resource) => {
                let (cache, task) = ClusterCache::start(client, namespace, resource, primary);
                tasks.push(task);
                Some(cache)
            }
            None => None,
        };
        let caches = Arc::new(Caches {
            control_planes,
            etcds,
            apiservers,
            controller_managers,
            secrets: secret_reader,
            statefulsets,
            services,
            clusters,
            secret_events,
            config_map_changes,
        });
        let drivers = Drivers(tasks);
        let subscriptions = Subscriptions {
            control_planes: cp_handle,
            etcds: etcd_handle,
            apiservers: apiserver_handle,
            controller_managers: cm_handle,
            statefulsets: sts_handle,
            services: svc_handle,
        };
        // The subscriptions are not polled yet: the shared reflectors may only fill as far
        // as their buffers before the controllers start, so wait for the lists while
        // draining nothing but the initial events into the stores.
        // Not the Clusters': a Cluster the cache does not hold yet is read with a GET, and a
        // capn that may not list Clusters (a Role without them) must still start.
        let waits = [
            caches.control_planes.wait_until_ready().boxed(),
            caches.etcds.wait_until_ready().boxed(),
            caches.apiservers.wait_until_ready().boxed(),
            caches.controller_managers.wait_until_ready().boxed(),
            caches.secrets.wait_until_ready().boxed(),
            caches.statefulsets.wait_until_ready().boxed(),
            caches.services.wait_until_ready().boxed(),
        ];
        for wait in waits {
            if wait.await.is_err() {
                tracing::warn!("a watch cache stopped before its first list");
            }
        }
        (caches, subscriptions, drivers)
    }

    /// The Secret's metadata as last seen, or `None` when the cache has not seen it.
    pub fn secret(&self, namespace: &str, name: &str) -> Option<Arc<CachedSecret>> {
        self.secrets.get(&ObjectRef::new(name).within(namespace))
    }

    /// The cached object a planned object will become, as JSON, for the StatefulSets and
    /// Services the caches watch; [`Live::Unwatched`] for every other kind.
    pub fn live(&self, object: &serde_json::Value) -> Live {
        let s = |p: &str| object.pointer(p).and_then(|v| v.as_str()).unwrap_or_default();
        let key = |name: &str, ns: &str| (name.to_string(), ns.to_string());
        let (name, ns) = key(s("/metadata/name"), s("/metadata/namespace"));
        let json = |v: Option<serde_json::Value>| Live::Cached(v);
        match (s("/apiVersion"), s("/kind")) {
            ("apps/v1", "StatefulSet") => json(
                self.statefulsets
                    .get(&ObjectRef::new(&name).within(&ns))
                    .and_then(|o| api_json(&*o)),
            ),
            ("v1", "Service") => json(
                self.services
                    .get(&ObjectRef::new(&name).within(&ns))
                    .and_then(|o| api_json(&*o)),
            ),
            _ => Live::Unwatched,
        }
    }

    /// The NestedControlPlane `name` in `namespace`, as last seen.
    pub fn control_plane(&self, namespace: &str, name: &str) -> Option<Arc<NestedControlPlane>> {
        self.control_planes.get(&ObjectRef::new(name).within(namespace))
    }

    /// The control planes `secret` belongs to: the NestedControlPlane owning it (capn's own
    /// Secrets), else those whose cluster has a Secret of that name (docs/design.md §6), so that
    /// user-supplied Secrets without an owner count too.
    pub fn control_planes_of_secret(&self, secret: &CachedSecret) -> Vec<Arc<NestedControlPlane>> {
        let ns = secret.namespace.as_str();
        let owners: Vec<_> = secret
            .control_plane_owners
            .iter()
            .filter_map(|owner| self.control_plane(ns, &owner.name))
            .collect();
        if !owners.is_empty() {
            return owners;
        }
        let clusters: Vec<&str> = SecretNames::clusters_of(&secret.name).collect();
        if clusters.is_empty() {
            return Vec::new();
        }
        self.control_planes.state_filter(|ncp| {
            ResourceExt::namespace(ncp).as_deref() == Some(ns) && clusters.contains(&cluster_name(ncp).as_ref())
        })
    }

    /// A stream of the control planes whose owning Cluster's spec changed (none without a
    /// [`ClusterCache`]).
    pub fn cluster_triggers(self: &Arc<Self>) -> impl Stream<Item = ObjectRef<NestedControlPlane>> + Send + 'static {
        let caches = self.clone();
        let changes = match &self.clusters {
            Some(clusters) => received(clusters.changes.subscribe(), "Cluster").left_stream(),
            None => futures::stream::empty().right_stream(),
        };
        changes.flat_map(move |cluster| {
            let (name, ns) = (cluster.name_any(), ResourceExt::namespace(&*cluster));
            let owned = caches.control_planes.state_filter(|ncp| {
                ResourceExt::namespace(ncp) == ns && capi_cluster_owner(ncp).is_some_and(|o| o.name == name)
            });
            futures::stream::iter(owned.into_iter().map(|ncp| ObjectRef::from_obj(&*ncp)))
        })
    }

    /// A stream of the control plane objects of kind `K` (mapped by `map`) whose Secrets
    /// changed or were deleted.
    pub fn secret_triggers<K, F>(self: &Arc<Self>, map: F) -> impl Stream<Item = ObjectRef<K>> + Send + 'static
    where
        K: Lookup<DynamicType = ()> + Clone + 'static,
        F: Fn(&NestedControlPlane) -> Option<ObjectRef<K>> + Send + Sync + 'static,
    {
        let caches = self.clone();
        received(self.secret_events.subscribe(), "Secret").flat_map(move |secret| {
            let refs: Vec<ObjectRef<K>> = caches
                .control_planes_of_secret(&secret)
                .iter()
                .filter_map(|ncp| map(ncp))
                .collect();
            futures::stream::iter(refs)
        })
    }
}

impl Caches {
    /// Every Secret change the cache sees, as it sees it (for components that mount a
    /// Secret capn does not own, like an apiserver's audit webhook configuration).
    pub fn secret_changes(&self) -> impl Stream<Item = Arc<CachedSecret>> + Send + 'static {
        received(self.secret_events.subscribe(), "Secret")
    }
}

impl Caches {
    /// Every change of a ConfigMap capn does not own, as the watch sees it (for the
    /// ConfigMaps a NestedAPIServer references).
    pub fn config_map_changes(&self) -> impl Stream<Item = Arc<ChangedConfigMap>> + Send + 'static {
        received(self.config_map_changes.subscribe(), "ConfigMap")
    }
}

/// Watches the metadata of the ConfigMaps in `namespace` (all when `None`) that capn did not
/// apply, and sends each one that changes, appears or goes to `changes`. Nothing is kept:
/// the apiserver reads a referenced ConfigMap with a GET when it is woken; a user's
/// ConfigMaps are few and seldom change, and capn's own (label
/// `app.kubernetes.io/managed-by=capn`), which change with every plan, are not watched.
fn watch_config_maps(
    client: &Client,
    namespace: Option<&str>,
    changes: broadcast::Sender<Arc<ChangedConfigMap>>,
    metrics: Arc<Metrics>,
) -> JoinHandle<()> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let api: Api<PartialObjectMeta<ConfigMap>> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let config = watcher::Config::default().labels("app.kubernetes.io/managed-by!=capn");
    tokio::spawn(
        watcher(api, config)
            .default_backoff()
            .touched_objects()
            .for_each(move |event| {
                match event {
                    // Nobody listening yet is fine.
                    Ok(config_map) => {
                        metrics.watch_succeeded("ConfigMap");
                        drop(changes.send(Arc::new(ChangedConfigMap {
                            namespace: config_map.metadata.namespace.unwrap_or_default(),
                            name: config_map.metadata.name.unwrap_or_default(),
                        })));
                    }
                    Err(error) => metrics.watch_failed("ConfigMap", &error),
                }
                ready(())
            }),
    )
}

/// What `receiver` receives, as a stream that ends when the sender is gone; a receiver
/// that fell behind skips what it missed (logged, with the `kind` of what it carries).
fn received<T: Clone + Send + 'static>(receiver: broadcast::Receiver<T>, kind: &'static str) -> impl Stream<Item = T> {
    futures::stream::unfold(receiver, move |mut receiver| async move {
        loop {
            match receiver.recv().await {
                Ok(item) => return Some((item, receiver)),
                Err(broadcast::error::RecvError::Lagged(skipped)) => {
                    tracing::debug!(skipped, kind, "triggers lagged");
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
}

impl ClusterCache {
    /// The Cluster `name` in `namespace`, as last seen; `None` when the cache does not
    /// hold it (deleted, or never created).
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<DynamicObject>> {
        self.store
            .get(&ObjectRef::new_with(name, self.resource.clone()).within(namespace))
    }

    /// Starts the watch of `resource` (Cluster API's `Cluster`) in `namespace` (all when
    /// `None`), filtered as the control planes are (`config`: the `--watch-filter` label,
    /// Cluster API's sharding convention labels a cluster's objects alike); the returned task
    /// drives it. A Cluster the filter leaves out is read with a GET when needed.
    fn start(
        client: &Client,
        namespace: Option<&str>,
        resource: ApiResource,
        config: watcher::Config,
    ) -> (Self, JoinHandle<()>) {
        let api: Api<DynamicObject> = match namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        let writer = reflector::store::Writer::new(resource.clone());
        let store = writer.as_reader();
        let (changes, _) = broadcast::channel(CLUSTER_CHANGES);
        let sender = changes.clone();
        // The generation each Cluster was last passed on at: its status changes often
        // (Cluster API mirrors the control plane's conditions), its spec seldom.
        let mut generations = std::collections::HashMap::<String, Option<i64>>::new();
        let task = tokio::spawn(
            reflector::reflector(writer, watcher(api, config).default_backoff().modify(cluster_spec)).for_each(
                move |event| {
                    match event {
                        Ok(watcher::Event::Apply(cluster) | watcher::Event::InitApply(cluster)) => {
                            let uid = ResourceExt::uid(&cluster).unwrap_or_default();
                            let generation = cluster.metadata.generation;
                            if generations.insert(uid, generation) != Some(generation) {
                                drop(sender.send(Arc::new(cluster)));
                            }
                        }
                        Ok(watcher::Event::Delete(cluster)) => {
                            generations.remove(&ResourceExt::uid(&cluster).unwrap_or_default());
                        }
                        Ok(watcher::Event::Init | watcher::Event::InitDone) => {}
                        Err(error) => tracing::warn!(%error, "Cluster watch failed; retrying"),
                    }
                    ready(())
                },
            ),
        );
        (
            Self {
                store,
                resource,
                changes,
            },
            task,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_cluster_keeps_its_identity_and_the_spec_fields_capn_reads() {
        let resource = ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(CAPI_GROUP, "v1beta2", "Cluster"));
        let mut cluster = DynamicObject::new("tenant-1", &resource).within("t").data(serde_json::json!({
            "spec": {
                "paused": true,
                "clusterNetwork": {"services": {"cidrBlocks": ["10.96.0.0/12"]}, "serviceDomain": "tenant.local"},
                "controlPlaneRef": {"apiGroup": "controlplane.cluster.x-k8s.io", "kind": "NestedControlPlane", "name": "cp"},
                "topology": {"classRef": {"name": "big"}},
            },
            "status": {"phase": "Provisioned", "conditions": [{"type": "Ready", "status": "True"}]},
        }));
        cluster.metadata.uid = Some("u-1".into());
        cluster.metadata.generation = Some(3);
        cluster.metadata.labels = Some([("team".to_string(), "a".to_string())].into());
        cluster_spec(&mut cluster);
        assert_eq!(
            cluster.data,
            serde_json::json!({"spec": {
                "paused": true,
                "clusterNetwork": {"services": {"cidrBlocks": ["10.96.0.0/12"]}, "serviceDomain": "tenant.local"},
            }})
        );
        assert_eq!(
            (cluster.metadata.uid.as_deref(), cluster.metadata.generation),
            (Some("u-1"), Some(3))
        );
        assert!(cluster.metadata.labels.is_none());
        // What reconciles read of it reads the same as from the whole Cluster.
        let ncp = NestedControlPlane::new("cp", Default::default());
        assert!(crate::controllers::shared::read::is_paused(&ncp, Some(&cluster)));
        let settings = crate::controllers::shared::read::cluster_settings(&ncp, Some(&cluster), "cluster.local");
        assert_eq!(
            (settings.service_cidr.as_str(), settings.dns_domain.as_str()),
            ("10.96.0.0/12", "tenant.local")
        );
    }
}
