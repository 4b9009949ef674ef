//! Public CRD sync: super cluster CRDs labelled `tenancy.x-k8s.io/super.public: "true"` are
//! installed, and kept current, in every ready nested control plane, through a client built
//! from that control plane's admin kubeconfig (`<cluster>-kubeconfig`). Removing the label
//! or deleting the super CRD removes the copies — only the ones capn made. The decision is
//! pure ([`decide`]); this module reads, applies and reports (`PublicCRDsSynced`).

mod decide;

pub use decide::{FIELD_MANAGER, PUBLIC_LABEL, SYNCED_LABEL, SyncAction, SyncPlan, decide, is_public, tenant_copy};

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

use crate::api::{NestedControlPlane, PublicCrdsStatus};
use crate::controllers::round::Now;
use crate::controllers::shared::tenant::tenant_client;
use crate::controllers::{Context, ReconcileError, events};
use crate::status::{ConditionUpdate, PUBLIC_CRDS_SYNCED, Reason, set_condition};

/// Runs the sync until the stream ends: every ready control plane is reconciled when it
/// changes and when any public CRD changes.
pub async fn run(ctx: Arc<Context>) {
    let crds: Api<CustomResourceDefinition> = Api::all(ctx.client.clone());
    let controller = Controller::new(ctx.api::<NestedControlPlane>(), ctx.primary_watch_config());
    let ncps = controller.store();
    controller
        // Unlabelled CRDs leave this watch as deletions, which is what removes their copies.
        // One public CRD change: every control plane looks once.
        .watches(
            crds,
            watcher::Config::default().labels(&format!("{PUBLIC_LABEL}=true")),
            move |_crd| {
                ncps.state()
                    .into_iter()
                    .map(|ncp| ObjectRef::from_obj(&*ncp))
                    .collect::<Vec<_>>()
            },
        )
        .shutdown_on_signal()
        .run(
            |ncp, ctx| async move {
                crate::controllers::instrumented(&ctx.clone(), "public-crds", reconcile(ncp, ctx)).await
            },
            |_, error, _| {
                tracing::info!(error = %error, "public CRD sync failed; backing off");
                Action::requeue(Duration::from_secs(15))
            },
            ctx,
        )
        .for_each(|_| async {})
        .await;
}

/// The public CRDs of the super cluster, from the apiserver's watch cache
/// (`resourceVersion=0`).
async fn public_crds(ctx: &Context) -> Result<Vec<CustomResourceDefinition>, ReconcileError> {
    let api: Api<CustomResourceDefinition> = Api::all(ctx.client.clone());
    let params = ListParams::default()
        .labels(&format!("{PUBLIC_LABEL}=true"))
        .match_any();
    Ok(api.list(&params).await?.items)
}

/// Syncs the public CRDs into one ready nested control plane and reports the outcome.
///
/// # Errors
/// The tenant's apiserver cannot be reached or refuses (retried with backoff; other tenants
/// are unaffected), or the super cluster fails.
pub async fn reconcile(ncp: Arc<NestedControlPlane>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let ctx_inner = &ctx;
    let ready = ncp.status.as_ref().is_some_and(|s| s.ready);
    if ncp.meta().deletion_timestamp.is_some() || !ready {
        return Ok(Action::await_change());
    }
    let ns = ncp.namespace().ok_or(ReconcileError::NoNamespace)?;
    let public = public_crds(ctx_inner).await?;
    let result = sync(ctx_inner, &ncp, &ns, &public).await;
    let now = Now::take();
    let (update, counts) = match &result {
        Ok(plan) if plan.conflicts.is_empty() => (
            ConditionUpdate::new(
                PUBLIC_CRDS_SYNCED,
                true,
                Reason::Synced,
                format!("{} public CRDs installed", plan.synced),
            ),
            PublicCrdsStatus {
                synced: plan.synced as i32,
                conflicts: Vec::new(),
            },
        ),
        Ok(plan) => (
            ConditionUpdate::new(
                PUBLIC_CRDS_SYNCED,
                false,
                Reason::TenantOwnsCRD,
                format!(
                    "{} public CRDs installed; left alone because the tenant has its own CRD of that name: {}",
                    plan.synced,
                    plan.conflicts.join(", ")
                ),
            ),
            PublicCrdsStatus {
                synced: plan.synced as i32,
                conflicts: plan.conflicts.clone(),
            },
        ),
        Err(e) => (
            ConditionUpdate::new(
                PUBLIC_CRDS_SYNCED,
                false,
                Reason::TenantUnreachable,
                format!("syncing public CRDs failed: {e}"),
            ),
            ncp.status
                .as_ref()
                .and_then(|s| s.public_crds.clone())
                .unwrap_or_default(),
        ),
    };
    let old = ncp.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
    let mut conditions = old.clone();
    set_condition(&mut conditions, update, ncp.meta().generation, &now.k8s);
    let condition = conditions.iter().find(|c| c.type_ == PUBLIC_CRDS_SYNCED).cloned();
    let previous = old.iter().find(|c| c.type_ == PUBLIC_CRDS_SYNCED);
    let previous_counts = ncp.status.as_ref().and_then(|s| s.public_crds.as_ref());
    if condition.as_ref() != previous || previous_counts != Some(&counts) {
        // Only this controller's condition and counts: the conditions list is a map by
        // type, so the NestedControlPlane controller's conditions are left as they are.
        let patch = serde_json::json!({
            "apiVersion": NestedControlPlane::api_version(&()),
            "kind": NestedControlPlane::kind(&()),
            "status": {"conditions": [condition], "publicCRDs": counts},
        });
        Api::<NestedControlPlane>::namespaced(ctx_inner.client.clone(), &ns)
            .patch_status(
                &ncp.name_any(),
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await?;
        events::publish_condition_changes(ctx_inner, &*ncp, &old, &conditions).await;
    }
    result.map(|_| Action::requeue(Duration::from_secs(600)))
}

async fn sync(
    ctx: &Context,
    ncp: &NestedControlPlane,
    ns: &str,
    public: &[CustomResourceDefinition],
) -> Result<SyncPlan, ReconcileError> {
    let client = tenant_client(ctx, ncp, ns).await?;
    let api: Api<CustomResourceDefinition> = Api::all(client);
    let tenant = api.list(&ListParams::default()).await?.items;
    let plan = decide(public, &tenant);
    for action in &plan.actions {
        match action {
            SyncAction::Apply(copy) => {
                let name = copy.name_any();
                tracing::info!(tenant = %ncp.name_any(), crd = %name, "installing public CRD");
                api.patch(
                    &name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&**copy),
                )
                .await?;
            }
            SyncAction::Delete(name) => {
                tracing::info!(tenant = %ncp.name_any(), crd = %name, "removing public CRD");
                match api.delete(name, &Default::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    Ok(plan)
}
