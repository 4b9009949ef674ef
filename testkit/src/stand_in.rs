//! A watch-driven stand-in for the kubelet and the StatefulSet controller: every StatefulSet
//! it sees whose status does not yet say "all pods ready" for its current spec gets
//! [`super::ready_status`] written at once. The request-budget test and the benchmark run it,
//! so that capn (or the benchmark's floor) waits on readiness exactly as long as the API
//! server takes to carry the news, never on a test's polling interval.

use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::ResourceExt as _;
use kube::api::{Api, Patch};
use kube::runtime::{WatchStreamExt as _, watcher};

use super::{ready_status, status_patch_params};

/// How many status writes may be in flight at once: enough that a thousand control planes do
/// not queue behind one another, few enough not to swamp a two-core machine.
const CONCURRENT_WRITES: usize = 32;

/// Runs until the returned future is dropped (or the watch stream ends), marking every
/// StatefulSet in `namespace` (all namespaces when `None`) ready. A failed write is reported
/// on stderr and retried on the object's next change or the watch's next relist.
pub async fn run(client: kube::Client, namespace: Option<String>) {
    let api: Api<StatefulSet> = match &namespace {
        Some(namespace) => Api::namespaced(client, namespace),
        None => Api::all(client),
    };
    watcher(api.clone(), watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .for_each_concurrent(CONCURRENT_WRITES, |event| {
            let api = api.clone();
            async move {
                let statefulset = match event {
                    Ok(statefulset) => statefulset,
                    Err(e) => return eprintln!("StatefulSet stand-in: watch error (retrying): {e}"),
                };
                let wanted = ready_status(&statefulset);
                if reports(&statefulset, &wanted) {
                    return;
                }
                let Some(namespace) = statefulset.namespace() else {
                    return;
                };
                let api = Api::<StatefulSet>::namespaced(api.into_client(), &namespace);
                let name = statefulset.name_any();
                match api
                    .patch_status(&name, &status_patch_params(), &Patch::Merge(&wanted))
                    .await
                {
                    Ok(_) => {}
                    // Deleted meanwhile: nothing left to stand in for.
                    Err(kube::Error::Api(status)) if status.is_not_found() => {}
                    Err(e) => eprintln!("StatefulSet stand-in: writing the status of {namespace}/{name}: {e}"),
                }
            }
        })
        .await;
}

/// Whether `statefulset`'s status already holds every field of `wanted` (a
/// [`super::ready_status`] patch), so that writing it again would change nothing.
fn reports(statefulset: &StatefulSet, wanted: &serde_json::Value) -> bool {
    let current = serde_json::to_value(&statefulset.status).unwrap_or_default();
    wanted["status"]
        .as_object()
        .is_some_and(|fields| fields.iter().all(|(field, value)| current.get(field) == Some(value)))
}
