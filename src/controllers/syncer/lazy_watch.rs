//! A watch of a tenant resource that starts with the first pass that needs it, as the
//! kubelet's `LazyInformerManager` starts its ClusterTrustBundle informer: the tenant's
//! discovery says which version serves the resource (the newest of those given), and a
//! tenant that serves none is asked again after [`RECHECK`]. Every change is told to a
//! channel, through which the worker wakes the pods that depend on the resource.

use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::mpsc::UnboundedSender;

use crate::controllers::AbortOnDrop;

/// How long a tenant found serving none of the versions is believed before its discovery
/// is asked again.
const RECHECK: Duration = Duration::from_secs(60);
/// How long a pass waits for the watch's first list before it tries again later.
const FIRST_LIST: Duration = Duration::from_secs(10);

/// A tenant resource, watched from the first [`LazyWatch::watched`].
pub(super) struct LazyWatch {
    group: &'static str,
    /// Its versions, the newest first.
    versions: &'static [&'static str],
    /// Its plural name.
    resource: &'static str,
    state: tokio::sync::Mutex<State>,
    changes: UnboundedSender<()>,
}

enum State {
    Unknown,
    NotServed(Instant),
    Watching {
        store: Store<DynamicObject>,
        resource: ApiResource,
        _watch: AbortOnDrop,
    },
}

/// What a pass finds of the resource.
pub(super) enum Watched {
    /// The tenant serves none of the versions.
    NotServed,
    /// The watch has not listed yet (after waiting a while): come back later.
    NotListed,
    /// The watch's store, and the version it watches.
    Listed {
        store: Store<DynamicObject>,
        resource: ApiResource,
    },
}

impl LazyWatch {
    /// A watch of `resource` in `group` (at the first of `versions` the tenant serves) that
    /// tells `changes` of every change, not started yet.
    pub fn new(
        group: &'static str,
        versions: &'static [&'static str],
        resource: &'static str,
        changes: UnboundedSender<()>,
    ) -> Self {
        Self {
            group,
            versions,
            resource,
            state: tokio::sync::Mutex::new(State::Unknown),
            changes,
        }
    }

    /// The resource's objects in the tenant of `client`, starting the watch when needed.
    ///
    /// # Errors
    /// The tenant's discovery failed.
    pub async fn watched(&self, client: &Client) -> Result<Watched, kube::Error> {
        let (store, resource) = {
            let mut state = self.state.lock().await;
            let stale = match &*state {
                State::Unknown => true,
                State::NotServed(at) => at.elapsed() > RECHECK,
                State::Watching { .. } => false,
            };
            if stale {
                *state = match self.served(client).await? {
                    Some(resource) => self.watch(client, resource),
                    None => State::NotServed(Instant::now()),
                };
            }
            match &*state {
                State::Watching { store, resource, .. } => (store.clone(), resource.clone()),
                _ => return Ok(Watched::NotServed),
            }
        };
        if tokio::time::timeout(FIRST_LIST, store.wait_until_ready())
            .await
            .is_err()
        {
            return Ok(Watched::NotListed);
        }
        Ok(Watched::Listed { store, resource })
    }

    /// The newest of the versions the tenant serves the resource in.
    async fn served(&self, client: &Client) -> Result<Option<ApiResource>, kube::Error> {
        let group = match kube::discovery::group(client, self.group).await {
            Ok(group) => group,
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(None),
            Err(kube::Error::Discovery(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        Ok(self.versions.iter().find_map(|version| {
            group
                .versioned_resources(version)
                .into_iter()
                .map(|(resource, _)| resource)
                .find(|r| r.plural == self.resource)
        }))
    }

    /// Starts the watch of `resource`, which lives as long as the returned state.
    fn watch(&self, client: &Client, resource: ApiResource) -> State {
        tracing::info!(version = %resource.api_version, resource = %resource.plural, "watching a tenant resource");
        let api = Api::<DynamicObject>::all_with(client.clone(), &resource);
        let writer = reflector::store::Writer::new(resource.clone());
        let store = writer.as_reader();
        let changes = self.changes.clone();
        let stream =
            reflector::reflector(writer, watcher(api, watcher::Config::default()).default_backoff()).touched_objects();
        let task = tokio::spawn(async move {
            stream
                .for_each(|_| {
                    let _ = changes.send(());
                    std::future::ready(())
                })
                .await;
        });
        State::Watching {
            store,
            resource,
            _watch: AbortOnDrop(vec![task.abort_handle()]),
        }
    }
}
