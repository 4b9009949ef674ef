//! The NestedCluster reconciler (CAPI infrastructure contract): provisioned as soon as the
//! control plane of the same cluster has an endpoint, which it copies.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, Patch};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, ReflectHandle, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};

use crate::api::{InfrastructureInitialization, NestedCluster, NestedControlPlane};
use crate::apply::{apply_params, update_params};
use crate::controllers::round::Now;
use crate::controllers::shared::read::cluster_name;
use crate::controllers::{Context, ReconcileError, events};
use crate::status::{ConditionUpdate, READY, Reason, set_condition};

/// Runs the NestedCluster controller until the stream ends. It reads the control planes
/// from a cache and is woken by their changes: the process-wide one through
/// `control_planes` when this process runs the control plane controllers too, else a
/// watch of its own (the infrastructure provider alone). A LIST of the namespace's
/// control planes per reconcile cost 12 requests for one Cluster API cluster, each
/// answering with every control plane of the namespace.
pub async fn run(ctx: Arc<Context>, control_planes: Option<ReflectHandle<NestedControlPlane>>) {
    // The NestedCluster of a cluster shares its cluster name with the control plane.
    fn nested_cluster_of(ncp: &NestedControlPlane) -> Option<ObjectRef<NestedCluster>> {
        let r = ObjectRef::<NestedCluster>::new(&cluster_name(ncp));
        Some(match ncp.namespace() {
            Some(ns) => r.within(&ns),
            None => r,
        })
    }
    let controller = Controller::new(ctx.api::<NestedCluster>(), ctx.primary_watch_config());
    let (store, controller) = match control_planes {
        Some(handle) => (
            ctx.caches.control_planes.clone(),
            controller.watches_shared_stream(handle, |ncp| nested_cluster_of(&ncp)),
        ),
        None => {
            let (store, writer) = reflector::store();
            let changes = watcher(ctx.api::<NestedControlPlane>(), ctx.primary_watch_config())
                .default_backoff()
                .modify(crate::controllers::shared::cache::strip)
                .reflect(writer)
                .touched_objects();
            (store, controller.watches_stream(changes, |ncp| nested_cluster_of(&ncp)))
        }
    };
    controller
        .shutdown_on_signal()
        .run(
            move |nc, ctx| {
                let store = store.clone();
                async move { crate::controllers::instrumented(&ctx.clone(), "cluster", reconcile(nc, ctx, store)).await }
            },
            error_policy,
            ctx.clone(),
        )
        .for_each(|_| async {})
        .await;
}

fn error_policy(nc: Arc<NestedCluster>, error: &ReconcileError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(name = %nc.name_any(), error = %error, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

/// Reconciles one NestedCluster, reading its control plane from `control_planes`.
///
/// # Errors
/// Transient API errors.
pub async fn reconcile(
    nc: Arc<NestedCluster>,
    ctx: Arc<Context>,
    control_planes: Store<NestedControlPlane>,
) -> Result<Action, ReconcileError> {
    if nc.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = nc.namespace().ok_or(ReconcileError::NoNamespace)?;
    let now = Now::take();
    let name = cluster_name(&*nc);
    // Not before the cache holds its first list: a control plane not seen yet is not a
    // control plane without an endpoint.
    if control_planes.wait_until_ready().await.is_err() {
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    let endpoint = control_planes
        .find(|ncp| ncp.namespace().as_deref() == Some(ns.as_str()) && cluster_name(ncp) == name)
        .and_then(|ncp| ncp.spec.control_plane_endpoint.clone());
    let api: Api<NestedCluster> = Api::namespaced(ctx.client.clone(), &ns);
    if let Some(e) = &endpoint
        && nc.spec.control_plane_endpoint.as_ref() != Some(e)
    {
        let patch = serde_json::json!({"spec": {"controlPlaneEndpoint": e}});
        api.patch(&nc.name_any(), &update_params(), &Patch::Merge(&patch))
            .await?;
    }
    let old = nc.status.clone().unwrap_or_default();
    let mut status = old.clone();
    let provisioned = endpoint.is_some();
    status.ready = provisioned;
    status.initialization = Some(InfrastructureInitialization { provisioned });
    status.observed_generation = nc.meta().generation;
    let update = if provisioned {
        ConditionUpdate::new(READY, true, Reason::Provisioned, "the control plane endpoint is known")
    } else {
        ConditionUpdate::new(
            READY,
            false,
            Reason::WaitingForControlPlane,
            format!("no NestedControlPlane of cluster {name} has an endpoint yet"),
        )
    };
    set_condition(&mut status.conditions, update, nc.meta().generation, &now.k8s);
    if status != old {
        let patch = serde_json::json!({
            "apiVersion": NestedCluster::api_version(&()),
            "kind": NestedCluster::kind(&()),
            "status": status,
        });
        api.patch_status(&nc.name_any(), &apply_params(), &Patch::Apply(&patch))
            .await?;
        events::publish_condition_changes(&ctx, &*nc, &old.conditions, &status.conditions).await;
    }
    Ok(if provisioned {
        Action::await_change()
    } else {
        Action::requeue(Duration::from_secs(30))
    })
}
