//! The floor: a client without logic that provisions the same control planes with the least
//! a client must send. Per control plane it server-side-applies 12 Secrets of about 2 KiB
//! (issue 11's floor; capn writes 11 today, the twelfth stands for the etcd health-check
//! client identity kubeadm also issues), then the objects capn's own `plan()` renders (as
//! `capn render` does), in the etcd → apiserver → controller-manager order, waiting after
//! each component until its StatefulSet is ready. All control planes go at once; readiness
//! comes from one shared StatefulSet watch, not from polling.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use base64::Engine as _;
use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::ResourceExt as _;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use serde_json::Value;
use tokio::sync::watch;

use crate::workload;

/// Field manager of everything the floor applies.
const FIELD_MANAGER: &str = "bench-floor";
/// Secrets per control plane, and their size.
const SECRETS: usize = 12;
const SECRET_BYTES: usize = 2048;
/// The components in the order they are applied, as `app.kubernetes.io/name` labels them.
const COMPONENTS: [&str; 3] = ["etcd", "apiserver", "controller-manager"];

/// One control plane, rendered: its Secrets, its component resources (NestedEtcd,
/// NestedAPIServer, NestedControllerManager, owned by the NestedControlPlane), then its
/// objects per component in order (owned by their component resource). Offline, every owner
/// reference lacks the owner's uid.
pub struct Rendered {
    pub secrets: Vec<Value>,
    pub resources: Vec<Value>,
    pub components: Vec<Vec<Value>>,
}

/// Provisions `count` control planes in `namespace` and returns how long that took, from
/// the first request to the last StatefulSet ready. Rendering happens before the clock
/// starts: it costs the API server nothing.
///
/// # Errors
/// Rendering or a request fails, or not everything is ready within `timeout`.
pub async fn provision(
    client: kube::Client,
    namespace: &str,
    count: usize,
    timeout: Duration,
) -> Result<Duration, String> {
    let Prepared { rendered, ready, watch } = prepare(&client, namespace, count)?;
    let started = Instant::now();
    let all = futures::future::try_join_all(
        rendered
            .iter()
            .map(|control_plane| provision_one(&client, control_plane, ready.clone())),
    );
    let outcome = tokio::time::timeout(timeout, all).await;
    let elapsed = started.elapsed();
    watch.abort();
    outcome.map_err(|_| {
        let ready = ready.borrow().len();
        format!(
            "the floor: {ready} of {} StatefulSets ready after {timeout:?}",
            3 * count
        )
    })??;
    Ok(elapsed)
}

/// What a half needs before its clock starts: its control planes rendered (rendering costs
/// the API server nothing), and the ready StatefulSets of its namespace kept current by one
/// watch until `watch` is aborted.
pub struct Prepared {
    pub rendered: Vec<Rendered>,
    pub ready: watch::Receiver<HashSet<String>>,
    pub watch: tokio::task::JoinHandle<()>,
}

/// Renders `count` control planes for `namespace` and starts its StatefulSet watch.
///
/// # Errors
/// A control plane does not render.
pub fn prepare(client: &kube::Client, namespace: &str, count: usize) -> Result<Prepared, String> {
    let channels = capn::channel::ChannelRegistry::load(&[]).map_err(|e| format!("built-in channels: {e}"))?;
    let rendered = (0..count)
        .map(|index| render(&channels, namespace, index))
        .collect::<Result<_, _>>()?;
    let (ready, watch) = watch_ready_statefulsets(client.clone(), namespace);
    Ok(Prepared { rendered, ready, watch })
}

/// Control plane `index` in `namespace` as `capn render` renders it, with the floor's 12
/// Secrets of [`SECRET_BYTES`].
///
/// # Errors
/// The example does not render (a broken checkout).
pub fn render(channels: &capn::channel::ChannelRegistry, namespace: &str, index: usize) -> Result<Rendered, String> {
    let objects = capn::cli::render_documents(
        channels,
        vec![workload::control_plane(namespace, index)?],
        &capn::cli::RenderOptions::default(),
    )
    .map_err(|e| format!("rendering {}: {e:#}", workload::name(index)))?
    .objects;
    let kind = |object: &Value| object["kind"].as_str().unwrap_or_default().to_owned();
    let mut secrets: Vec<Value> = objects.iter().filter(|o| kind(o) == "Secret").cloned().collect();
    let cluster = workload::name(index);
    while secrets.len() < SECRETS {
        secrets.push(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": format!("{cluster}-etcd-healthcheck-client"),
                "namespace": namespace,
                "labels": {capn::api::CLUSTER_NAME_LABEL: cluster},
            },
            "type": capn::pki::SECRET_TYPE,
        }));
    }
    let payload = base64::engine::general_purpose::STANDARD.encode(vec![b'x'; SECRET_BYTES / 2]);
    for secret in &mut secrets {
        secret["data"] = serde_json::json!({"tls.crt": payload, "tls.key": payload});
    }
    let components = COMPONENTS
        .iter()
        .map(|component| {
            objects
                .iter()
                .filter(|o| o.pointer("/metadata/labels/app.kubernetes.io~1name") == Some(&Value::from(*component)))
                .cloned()
                .collect()
        })
        .collect();
    let resources = objects
        .iter()
        .filter(|o| kind(o).starts_with("Nested") && kind(o) != "NestedControlPlane")
        .cloned()
        .collect();
    Ok(Rendered {
        secrets,
        resources,
        components,
    })
}

/// Offline, the owner (the component resource) has no uid, and the API server refuses an
/// owner reference without one; the floor has no component resources to own anything.
fn without_owner(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(metadata) = object["metadata"].as_object_mut() {
        metadata.remove("ownerReferences");
    }
    object
}

async fn provision_one(
    client: &kube::Client,
    control_plane: &Rendered,
    mut ready: watch::Receiver<HashSet<String>>,
) -> Result<(), String> {
    for secret in &control_plane.secrets {
        apply(client, secret).await?;
    }
    for objects in &control_plane.components {
        for object in objects {
            apply(client, &without_owner(object)).await?;
        }
        wait_ready(objects, &mut ready).await?;
    }
    Ok(())
}

/// Waits until every StatefulSet among `objects` is ready.
///
/// # Errors
/// The StatefulSet watch ended.
pub async fn wait_ready(objects: &[Value], ready: &mut watch::Receiver<HashSet<String>>) -> Result<(), String> {
    let statefulsets: Vec<String> = objects
        .iter()
        .filter(|o| o["kind"] == "StatefulSet")
        .map(|o| o["metadata"]["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    ready
        .wait_for(|ready| statefulsets.iter().all(|name| ready.contains(name)))
        .await
        .map_err(|_| "the StatefulSet watch ended".to_owned())?;
    Ok(())
}

/// Server-side applies `object` as the floor's field manager and returns it as written.
///
/// # Errors
/// The object has no type, or the request fails.
pub async fn apply(client: &kube::Client, object: &Value) -> Result<DynamicObject, String> {
    let object: DynamicObject =
        serde_json::from_value(object.clone()).map_err(|e| format!("a rendered object: {e}"))?;
    let api = dynamic_api(client, &object)?;
    let namespace = object.namespace().unwrap_or_default();
    let name = object.name_any();
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&object),
    )
    .await
    .map_err(|e| {
        let kind = object.types.as_ref().map(|t| t.kind.as_str()).unwrap_or_default();
        format!("the floor applying {kind} {namespace}/{name}: {e}")
    })
}

/// The names of the StatefulSets in `namespace` that capn's readiness rule calls ready, kept
/// current by one watch until the returned task is aborted.
/// The API of `object`'s kind in its namespace.
///
/// # Errors
/// The object has no usable `apiVersion` and `kind`.
pub fn dynamic_api(client: &kube::Client, object: &DynamicObject) -> Result<Api<DynamicObject>, String> {
    let types = object.types.clone().unwrap_or_default();
    let gvk = GroupVersionKind::try_from(&types).map_err(|e| format!("an object's type: {e}"))?;
    Ok(Api::namespaced_with(
        client.clone(),
        &object.namespace().unwrap_or_default(),
        &ApiResource::from_gvk(&gvk),
    ))
}

fn watch_ready_statefulsets(
    client: kube::Client,
    namespace: &str,
) -> (watch::Receiver<HashSet<String>>, tokio::task::JoinHandle<()>) {
    let (sender, receiver) = watch::channel(HashSet::new());
    let api: Api<StatefulSet> = Api::namespaced(client, namespace);
    let task = tokio::spawn(async move {
        let mut events = std::pin::pin!(
            watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects()
        );
        while let Some(event) = events.next().await {
            let statefulset = match event {
                Ok(statefulset) => statefulset,
                Err(e) => {
                    eprintln!("the floor's StatefulSet watch (retrying): {e}");
                    continue;
                }
            };
            let ready = serde_json::to_value(&statefulset)
                .map(|object| capn::apply::readiness(&object).ready)
                .unwrap_or(false);
            if ready {
                sender.send_if_modified(|names| names.insert(statefulset.name_any()));
            }
        }
    });
    (receiver, task)
}
