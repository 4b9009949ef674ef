//! The watch caches of the syncer, on either side: a reflector whose objects are kept
//! without their `managedFields`, and the stream of its changes.

use futures::StreamExt;
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};

/// The objects of a cache that are in `namespace`.
pub(super) fn in_namespace<K: Resource<DynamicType = ()> + Clone>(
    store: &Store<K>,
    namespace: &str,
) -> Vec<std::sync::Arc<K>> {
    store
        .state()
        .into_iter()
        .filter(|o| o.meta().namespace.as_deref() == Some(namespace))
        .collect()
}

/// A reflector of `api` selected by `config`, its objects [`trim`]med: its store and its
/// stream of changed objects (which must be polled for the store to fill).
pub(super) fn reflect<K>(api: Api<K>, config: watcher::Config) -> (Store<K>, Changes<K>)
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, config).default_backoff().modify(trim))
        .touched_objects()
        .boxed();
    (store, stream)
}

/// What the caches keep of an object: all but its `managedFields`, which the syncer never
/// reads and which are a large part of a pod's size.
fn trim<K: Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

/// A reflector's stream of changed objects.
pub(super) type Changes<K> = futures::stream::BoxStream<'static, Result<K, watcher::Error>>;
