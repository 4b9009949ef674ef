//! The watch caches of the syncer, on either side: a reflector whose objects are kept
//! without their `managedFields`, and the stream of its changes.

use futures::StreamExt;
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::mpsc::UnboundedReceiver;

/// The objects of a cache that are in `namespace`.
pub(super) fn in_namespace<K>(store: &Store<K>, namespace: &str) -> Vec<std::sync::Arc<K>>
where
    K: Resource + Clone,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
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

/// A reflector of `api` (a kind of `DynamicType` `dynamic_type`, a custom resource's
/// `ApiResource`) selected by `config`, its objects [`trim`]med: its store, and a stream
/// that tells every change, deletions included, by the namespace it happened in (`None`
/// once a full list has been read again, when changes may have been missed), and every
/// failed attempt of the watch (it retries with backoff). The stream must be polled for the
/// store to fill.
pub(super) fn reflect_with<K>(
    api: Api<K>,
    config: watcher::Config,
    dynamic_type: K::DynamicType,
) -> (
    Store<K>,
    futures::stream::BoxStream<'static, Result<Option<String>, watcher::Error>>,
)
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    let writer = reflector::store::Writer::new(dynamic_type);
    let store = writer.as_reader();
    let stream = reflector::reflector(writer, watcher(api, config).default_backoff().modify(trim))
        .filter_map(|event| {
            std::future::ready(match event {
                Ok(watcher::Event::Apply(o) | watcher::Event::Delete(o)) => Some(Ok(o.meta().namespace.clone())),
                Ok(watcher::Event::InitDone) => Some(Ok(None)),
                Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => None,
                Err(error) => Some(Err(error)),
            })
        })
        .boxed();
    (store, stream)
}

/// The messages of `receiver` as a trigger stream.
pub(super) fn received<T: Send + 'static>(receiver: UnboundedReceiver<T>) -> Changes<T> {
    futures::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|message| (Ok(message), receiver))
    })
    .boxed()
}
