//! The super side of the custom resource syncer (docs/design.md §11 "Custom resources"):
//! one watch of the public CRDs, and, for every kind whose instances sync
//! (`crate::syncer::custom::synced_kind`), one watch of its copies in every workload
//! namespace, shared by all workers as [`super::super_caches`] shares the built-in kinds'
//! (for the same reason: a watch per tenant and kind would use up the HTTP/2 streams capn
//! has to the super cluster). A kind's watch starts when the first worker syncs it (a
//! tenant holds the CRD) and stops when the last one stops.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, Weak};

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, DynamicObject};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::sync::watch;

use super::caches::reflect_with;
use crate::syncer::custom::{PUBLIC_LABEL, SyncedKind, synced_kind};
use crate::telemetry::Metrics;

/// The shared cache of one kind's copies, and where its changes go.
pub(super) struct KindCache {
    pub kind: SyncedKind,
    /// Every copy of this kind the syncer made (this instance's, under `--watch-filter`).
    pub store: Store<DynamicObject>,
    routes: Arc<Mutex<HashMap<String, UnboundedSender<()>>>>,
    watch: tokio::task::JoinHandle<()>,
    /// The watch's name in the watch health (`Kind (crd)`), and where that is kept.
    label: String,
    metrics: Arc<Metrics>,
}

impl Drop for KindCache {
    /// Stops the watch; a failure it reported goes with it (the kind no longer syncs).
    fn drop(&mut self) {
        self.watch.abort();
        self.metrics.watch_succeeded(&self.label);
    }
}

impl KindCache {
    /// Starts the watch of `kind`'s copies (selected by `selector`). Its failures (a 403
    /// when capn was not granted the kind) are reported as a failing watch
    /// (`Metrics::watch_failed`: `/readyz`, `capn_watch_failing`, `WatchesHealthy`).
    fn start(client: &Client, kind: SyncedKind, selector: &str, metrics: Arc<Metrics>) -> Self {
        let api = Api::<DynamicObject>::all_with(client.clone(), &kind.resource);
        let (store, changes) = reflect_with(api, watcher::Config::default().labels(selector), kind.resource.clone());
        let routes: Arc<Mutex<HashMap<String, UnboundedSender<()>>>> = Arc::default();
        let label = format!("{} ({})", kind.resource.kind, kind.crd);
        let watch = tokio::spawn(route(changes, routes.clone(), label.clone(), metrics.clone()));
        Self {
            kind,
            store,
            routes,
            watch,
            label,
            metrics,
        }
    }

    /// The changes of this kind's copies in `namespace`, from now on (a second
    /// subscription to the same namespace replaces the first).
    pub fn subscribe(&self, namespace: &str) -> UnboundedReceiver<()> {
        let (sender, receiver) = unbounded_channel();
        lock(&self.routes).insert(namespace.to_owned(), sender);
        receiver
    }
}

/// Sends each change to the route of its namespace (a relist: to every route); a route
/// whose worker is gone is dropped. Failures of the watch are reported as the watch of
/// `label`.
async fn route(
    mut changes: futures::stream::BoxStream<'static, Result<Option<String>, watcher::Error>>,
    routes: Arc<Mutex<HashMap<String, UnboundedSender<()>>>>,
    label: String,
    metrics: Arc<Metrics>,
) {
    while let Some(change) = changes.next().await {
        let namespace = match change {
            Ok(namespace) => {
                metrics.watch_succeeded(&label);
                namespace
            }
            Err(error) => {
                metrics.watch_failed(&label, &error);
                continue;
            }
        };
        let mut routes = lock(&routes);
        match namespace {
            Some(namespace) => {
                if routes.get(&namespace).is_some_and(|r| r.send(()).is_err()) {
                    routes.remove(&namespace);
                }
            }
            None => routes.retain(|_, r| r.send(()).is_ok()),
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The kinds whose instances sync, by CRD name.
pub(super) type Kinds = Arc<BTreeMap<String, SyncedKind>>;

/// The kinds whose instances sync, and the shared caches of those some worker syncs.
pub(super) struct CustomKinds {
    /// The kinds, as the public CRDs say now.
    pub kinds: watch::Receiver<Kinds>,
    caches: Mutex<HashMap<String, Weak<KindCache>>>,
    client: Client,
    /// The label selector of the copies (`super_caches::synced_selector`).
    selector: String,
    metrics: Arc<Metrics>,
}

impl CustomKinds {
    /// Starts the watch of the public CRDs through `client`; the copies of each kind are
    /// selected by `selector`. The kinds are published while the returned future is polled.
    pub fn start(
        client: &Client,
        selector: String,
        metrics: Arc<Metrics>,
    ) -> (Arc<Self>, impl Future<Output = ()> + use<>) {
        let (sender, kinds) = watch::channel(Kinds::default());
        let (crds, mut changes) = reflect_with(
            Api::<CustomResourceDefinition>::all(client.clone()),
            watcher::Config::default().labels(&format!("{PUBLIC_LABEL}=true")),
            (),
        );
        let follow = async move {
            while let Some(change) = changes.next().await {
                if change.is_err() {
                    // The watcher retries; the public CRD sync reads the same CRDs and its
                    // reconciles report a failure.
                    continue;
                }
                let next: BTreeMap<String, SyncedKind> = crds
                    .state()
                    .iter()
                    .filter_map(|crd| synced_kind(crd))
                    .map(|kind| (kind.crd.clone(), kind))
                    .collect();
                sender.send_if_modified(|current| {
                    let changed = **current != next;
                    if changed {
                        *current = Arc::new(next);
                    }
                    changed
                });
            }
        };
        let this = Arc::new(Self {
            kinds,
            caches: Mutex::default(),
            client: client.clone(),
            selector,
            metrics,
        });
        (this, follow)
    }

    /// The shared cache of `kind`'s copies: the one a worker holds already, or a new one
    /// (its watch starts now, and stops when the last worker lets it go).
    pub fn cache(&self, kind: &SyncedKind) -> Arc<KindCache> {
        let mut caches = lock(&self.caches);
        if let Some(cache) = caches
            .get(&kind.crd)
            .and_then(Weak::upgrade)
            .filter(|cache| cache.kind == *kind)
        {
            return cache;
        }
        tracing::info!(crd = %kind.crd, "syncing the instances tenants make of a public CRD");
        let cache = Arc::new(KindCache::start(
            &self.client,
            kind.clone(),
            &self.selector,
            self.metrics.clone(),
        ));
        caches.insert(kind.crd.clone(), Arc::downgrade(&cache));
        cache
    }
}
