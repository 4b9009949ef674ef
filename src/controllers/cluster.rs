//! The NestedCluster reconciler (CAPI infrastructure contract): provisioned as soon as the
//! control plane of the same cluster has an endpoint, which it copies.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, ListParams, Patch};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use super::component::Now;
use super::read::cluster_name;
use super::{Context, ReconcileError, events};
use crate::api::{InfrastructureInitialization, NestedCluster, NestedControlPlane};
use crate::apply::{apply_params, update_params};
use crate::status::{ConditionUpdate, READY, set_condition};

/// Runs the NestedCluster controller until the stream ends.
pub async fn run(ctx: Arc<Context>) {
    Controller::new(ctx.api::<NestedCluster>(), ctx.primary_watch_config())
        // The NestedCluster of a cluster shares its cluster name with the control plane.
        .watches(ctx.api::<NestedControlPlane>(), ctx.primary_watch_config(), |ncp| {
            let r = ObjectRef::<NestedCluster>::new(&cluster_name(&ncp));
            Some(match ncp.namespace() {
                Some(ns) => r.within(&ns),
                None => r,
            })
        })
        .shutdown_on_signal()
        .run(
            |nc, ctx| async move { super::instrumented(&ctx.clone(), "cluster", reconcile(nc, ctx)).await },
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

/// Reconciles one NestedCluster.
///
/// # Errors
/// Transient API errors.
pub async fn reconcile(nc: Arc<NestedCluster>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    if nc.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = nc.namespace().ok_or(ReconcileError::NoNamespace)?;
    let now = Now::take();
    let name = cluster_name(&*nc);
    let ncps: Api<NestedControlPlane> = Api::namespaced(ctx.client.clone(), &ns);
    let endpoint = ncps
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .find(|ncp| cluster_name(ncp) == name)
        .and_then(|ncp| ncp.spec.control_plane_endpoint);
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
        ConditionUpdate::new(READY, true, "Provisioned", "the control plane endpoint is known")
    } else {
        ConditionUpdate::new(
            READY,
            false,
            "WaitingForControlPlane",
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
