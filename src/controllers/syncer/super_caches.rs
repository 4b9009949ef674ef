//! The super cluster's side of every worker (docs/design.md §11): one watch per kind for all
//! tenants, each feeding one cache, whose changes are routed to the worker of the workload
//! namespace they happen in. The pods, ConfigMaps, Secrets and PersistentVolumeClaims the
//! syncer made are selected by the [`tenancy::NAMESPACE`] label every one of them carries
//! (and, under `--watch-filter`, by the filter's label, which the instance puts on them);
//! Events about pods are watched by field selector (the scheduler and kubelets write them,
//! unlabelled) and only those in a workload namespace are routed; PersistentVolumes are
//! cluster-scoped and unlabelled (the super cluster's provisioners make them), so all are
//! cached and a change is routed to the namespace of the claim it is bound to.
//!
//! The public CRDs, and the copies of the custom resources whose kinds sync, are watched
//! the same way ([`super::super_custom`]).
//!
//! Why shared: capn talks to the super cluster over one HTTP/2 connection, on which the
//! kube-apiserver allows 100 concurrent streams (its default since the HTTP/2 rapid-reset fix,
//! CVE-2023-44487; `--http2-max-streams-per-connection`). A watch per tenant and kind would
//! use them up at about 25 tenants, after which every request of capn's waits for a stream
//! that never frees. Shared, capn holds eight watches there however many tenants it serves,
//! and the super cluster keeps eight watchers for capn instead of eight per tenant.

use std::collections::HashMap;
use std::sync::Mutex;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event;
use kube::api::Api;
use kube::core::{PartialObjectMeta, PartialObjectMetaExt};
use kube::runtime::reflector::Store;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::caches::reflect;
use crate::syncer::names::tenancy;

/// The shared caches of the super side, and where their changes go.
pub(super) struct SuperCaches {
    /// Every super pod the syncer made, in every workload namespace.
    pub pods: Store<Pod>,
    /// Every ConfigMap copy.
    pub config_maps: Store<ConfigMap>,
    /// Every Secret copy and token Secret.
    pub secrets: Store<Secret>,
    /// Every PersistentVolumeClaim copy.
    pub claims: Store<PersistentVolumeClaim>,
    /// Every PersistentVolume of the super cluster.
    pub volumes: Store<PersistentVolume>,
    /// Every Service copy.
    pub services: Store<Service>,
    /// Every EndpointSlice copy.
    pub slices: Store<EndpointSlice>,
    /// The public custom resource kinds whose instances sync, with their shared caches.
    pub custom_kinds: std::sync::Arc<super::super_custom::CustomKinds>,
    routes: Mutex<HashMap<String, Route>>,
}

/// Where one workload namespace's changes go.
struct Route {
    pods: UnboundedSender<PartialObjectMeta<Pod>>,
    config_maps: UnboundedSender<PartialObjectMeta<ConfigMap>>,
    secrets: UnboundedSender<PartialObjectMeta<Secret>>,
    events: UnboundedSender<Event>,
    /// A claim copy or a volume bound to one changed (the volumes pass looks at them all).
    volumes: UnboundedSender<()>,
    /// A Service or EndpointSlice copy changed (the services pass looks at them all).
    services: UnboundedSender<()>,
}

/// What one worker receives: the changed objects of its workload namespace (metadata, which
/// is what wakes its pods) and the Events there. Unbounded: the router never waits for a
/// worker, so a worker that is slow or whose tenant hangs holds up no other; a worker's queue
/// takes what it is sent at once and merges repeats, so little waits here.
pub(super) struct Subscription {
    pub pods: UnboundedReceiver<PartialObjectMeta<Pod>>,
    pub config_maps: UnboundedReceiver<PartialObjectMeta<ConfigMap>>,
    pub secrets: UnboundedReceiver<PartialObjectMeta<Secret>>,
    pub events: UnboundedReceiver<Event>,
    pub volumes: UnboundedReceiver<()>,
    pub services: UnboundedReceiver<()>,
}

impl SuperCaches {
    /// Starts the eight watches on the super cluster through `client`. The caches fill while
    /// the returned future is polled (for as long as the syncer runs).
    pub fn start(
        client: &Client,
        watch_filter: Option<&str>,
        metrics: std::sync::Arc<crate::telemetry::Metrics>,
    ) -> (std::sync::Arc<Self>, impl Future<Output = ()> + use<>) {
        let synced = watcher::Config::default().labels(&synced_selector(watch_filter));
        let (pods, pod_changes) = reflect::<Pod>(Api::all(client.clone()), synced.clone());
        let (config_maps, config_map_changes) = reflect::<ConfigMap>(Api::all(client.clone()), synced.clone());
        let (secrets, secret_changes) = reflect::<Secret>(Api::all(client.clone()), synced.clone());
        let (claims, claim_changes) = reflect::<PersistentVolumeClaim>(Api::all(client.clone()), synced.clone());
        let (services, service_changes) = reflect::<Service>(Api::all(client.clone()), synced.clone());
        let (slices, slice_changes) = reflect::<EndpointSlice>(Api::all(client.clone()), synced);
        let (volumes, volume_changes) =
            reflect::<PersistentVolume>(Api::all(client.clone()), watcher::Config::default());
        let (custom_kinds, custom_kinds_follow) =
            super::super_custom::CustomKinds::start(client, synced_selector(watch_filter), metrics);
        let caches = std::sync::Arc::new(SuperCaches {
            pods,
            config_maps,
            secrets,
            claims,
            volumes,
            services,
            slices,
            custom_kinds,
            routes: Mutex::default(),
        });
        // Only Events about pods: the API server filters them (`regarding.kind` is one of
        // the Event's selectable fields), and those outside a workload namespace are dropped.
        let events = watcher(
            Api::<Event>::all(client.clone()),
            watcher::Config::default().fields("regarding.kind=Pod"),
        )
        .default_backoff()
        .applied_objects();
        let routing = {
            let caches = caches.clone();
            async move {
                tokio::join!(
                    caches.route(
                        pod_changes,
                        namespace,
                        |r| &r.pods,
                        |p: Pod| p.metadata.into_request_partial()
                    ),
                    caches.route(
                        config_map_changes,
                        namespace,
                        |r| &r.config_maps,
                        |c: ConfigMap| { c.metadata.into_request_partial() }
                    ),
                    caches.route(
                        secret_changes,
                        namespace,
                        |r| &r.secrets,
                        |s: Secret| s.metadata.into_request_partial()
                    ),
                    caches.route(events, namespace, |r| &r.events, |e: Event| e),
                    caches.route(claim_changes, namespace, |r| &r.volumes, |_| ()),
                    caches.route(volume_changes, claim_namespace, |r| &r.volumes, |_| ()),
                    caches.route(service_changes, namespace, |r| &r.services, |_| ()),
                    caches.route(slice_changes, namespace, |r| &r.services, |_| ()),
                    custom_kinds_follow,
                );
            }
        };
        (caches, routing)
    }

    /// Routes the changes of the workload namespace `namespace` to the caller, from now on
    /// (a second subscription to the same namespace replaces the first).
    pub fn subscribe(&self, namespace: &str) -> Subscription {
        let (pods, pods_rx) = unbounded_channel();
        let (config_maps, config_maps_rx) = unbounded_channel();
        let (secrets, secrets_rx) = unbounded_channel();
        let (events, events_rx) = unbounded_channel();
        let (volumes, volumes_rx) = unbounded_channel();
        let (services, services_rx) = unbounded_channel();
        self.lock().insert(
            namespace.to_owned(),
            Route {
                pods,
                config_maps,
                secrets,
                events,
                volumes,
                services,
            },
        );
        Subscription {
            pods: pods_rx,
            config_maps: config_maps_rx,
            secrets: secrets_rx,
            events: events_rx,
            volumes: volumes_rx,
            services: services_rx,
        }
    }

    /// Sends each change of `changes` to the route of the namespace `key` gives it; a route
    /// whose worker is gone is dropped.
    async fn route<K, T>(
        &self,
        changes: impl futures::Stream<Item = Result<K, watcher::Error>>,
        key: impl Fn(&K) -> Option<String>,
        sender: impl Fn(&Route) -> &UnboundedSender<T>,
        message: impl Fn(K) -> T,
    ) {
        futures::pin_mut!(changes);
        while let Some(change) = changes.next().await {
            let Ok(object) = change else { continue };
            let Some(namespace) = key(&object) else {
                continue;
            };
            let mut routes = self.lock();
            let Some(route) = routes.get(&namespace) else {
                continue;
            };
            if sender(route).send(message(object)).is_err() {
                routes.remove(&namespace);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Route>> {
        self.routes.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The label selector of the objects the syncer made: all, or with `--watch-filter` only
/// those this instance made (`Tenant::mark` puts the filter's label on each), so that each
/// instance caches its own shard.
pub(super) fn synced_selector(watch_filter: Option<&str>) -> String {
    match watch_filter {
        Some(value) => format!(
            "{},{}={value}",
            tenancy::NAMESPACE,
            crate::controllers::WATCH_FILTER_LABEL
        ),
        None => tenancy::NAMESPACE.to_owned(),
    }
}

/// The namespace an object is in.
fn namespace<K: Resource>(object: &K) -> Option<String> {
    object.meta().namespace.clone()
}

/// The namespace of the claim a volume is bound to.
fn claim_namespace(volume: &PersistentVolume) -> Option<String> {
    volume.spec.as_ref()?.claim_ref.as_ref()?.namespace.clone()
}
