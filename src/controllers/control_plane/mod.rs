//! The NestedControlPlane reconciler: CAs and the service-account key (created once, never
//! re-minted), the three component resources (created or adopted), the control plane
//! endpoint, the admin `<cluster>-kubeconfig`, and the aggregated status (CAPI contract).
//!
//! [`reconcile`] reads as its table of contents, in the shape of Cluster API's
//! KubeadmControlPlane: one [`scope::Round`] built per pass and handed to every stage, one
//! file per concern, the status decided by plain functions ([`report`]) and written once
//! at the end.

mod certificates;
mod components;
pub mod encryption_rotation;
mod hibernation;
mod report;
pub mod rotation;
mod scope;
#[cfg(test)]
mod tests;
pub mod upgrade;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, Patch};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use crate::api::{NestedControlPlane, NestedControlPlaneStatus};
use crate::apply::apply_params;
use crate::controllers::round::{Now, recheck_after};
use crate::controllers::shared::cache::Subscriptions;
use crate::controllers::shared::read::{
    cluster_name, cluster_settings, controller_reference, is_paused, owning_cluster, renewal_policy,
};
use crate::controllers::{Context, ReconcileError, events};
use crate::status::set_condition;
use scope::{Inputs, Round};

/// The NestedControlPlane controller, ready to be spawned: woken by its own changes, its
/// components', its Secrets' (a deleted CA is noticed within a moment) and its Cluster's spec.
pub fn run(ctx: Arc<Context>, subscriptions: &Subscriptions) -> impl Future<Output = ()> + Send + 'static {
    let secrets = ctx.caches.secret_triggers(|ncp: &NestedControlPlane| {
        ncp.namespace().map(|ns| ObjectRef::new(&ncp.name_any()).within(&ns))
    });
    let controller =
        Controller::for_shared_stream(subscriptions.control_planes.clone(), ctx.caches.control_planes.clone())
            // A burst of component changes (three components provisioning) becomes one
            // reconcile and one status write.
            .with_config(crate::controllers::controller_config().debounce(Duration::from_millis(250)))
            .owns_shared_stream(subscriptions.etcds.clone())
            .owns_shared_stream(subscriptions.apiservers.clone())
            .owns_shared_stream(subscriptions.controller_managers.clone())
            .reconcile_on(secrets)
            // A Cluster's spec (paused, clusterNetwork) is read from the cache: a change
            // to it (unpausing) wakes the control planes it owns.
            .reconcile_on(ctx.caches.cluster_triggers());
    async move {
        controller
            .shutdown_on_signal()
            .run(
                |ncp, ctx| async move {
                    crate::controllers::instrumented(&ctx.clone(), "control-plane", reconcile(ncp, ctx)).await
                },
                error_policy,
                ctx.clone(),
            )
            .for_each(|result| async move {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "reconcile failed");
                }
            })
            .await;
    }
}

fn error_policy(ncp: Arc<NestedControlPlane>, error: &ReconcileError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(name = %ncp.name_any(), reason = error.reason(), error = %error, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

/// Reconciles one NestedControlPlane: the Paused condition, the stages unless paused
/// ([`drive`]), then the status, written once.
///
/// # Errors
/// Transient API errors, retried with backoff. A missing CA after initialization is a
/// condition, not a retry storm.
pub async fn reconcile(ncp: Arc<NestedControlPlane>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    if ncp.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = ncp.namespace().ok_or(ReconcileError::NoNamespace)?;
    let now = Now::take();
    let generation = ncp.meta().generation;
    let old = ncp.status.clone().unwrap_or_default();
    let mut status = report::begin(&old);
    let capi_cluster = owning_cluster(&ctx, &ncp).await?;
    let paused = is_paused(&ncp, capi_cluster.as_deref());
    set_condition(
        &mut status.conditions,
        report::pause_condition(paused),
        generation,
        &now.k8s,
    );
    // The generation of capn's own spec patch this pass (the component references, the
    // endpoint), when there was one.
    let mut spec_patched = None;
    let result = if paused {
        Ok(Action::await_change())
    } else {
        let cluster = cluster_settings(&ncp, capi_cluster.as_deref(), &ctx.settings.super_dns_domain);
        let inputs = Inputs {
            ncp: &ncp,
            ctx: &ctx,
            ns: &ns,
            cluster: &cluster,
            now: &now,
        };
        drive(inputs, &mut status, &mut spec_patched).await
    };
    report::conclude(&mut status, result.as_ref().err(), generation, spec_patched, &now.k8s);
    let hibernated = status
        .hibernation
        .as_ref()
        .is_some_and(|h| h.phase != crate::hibernation::phase::AWAKE);
    ctx.metrics
        .set_control_plane_ready(&ns, &cluster_name(&*ncp), status.ready, hibernated);
    write_status(&ctx, &ncp, &ns, &old, &status).await?;
    report::action(result)
}

/// One pass that is not paused: the spec checked, the round built, then the stages in
/// order. Each stage sets its own conditions in `status`; `spec_patched` receives the
/// generation of capn's own spec patch, even when a later stage fails.
async fn drive(
    inputs: Inputs<'_>,
    status: &mut NestedControlPlaneStatus,
    spec_patched: &mut Option<i64>,
) -> Result<Action, ReconcileError> {
    let Some(owner) = controller_reference(inputs.ncp) else {
        return Err(ReconcileError::NoNamespace);
    };
    let valid = report::spec_condition(inputs.ncp, inputs.cluster);
    let invalid = !valid.status;
    set_condition(
        &mut status.conditions,
        valid,
        inputs.ncp.meta().generation,
        &inputs.now.k8s,
    );
    if invalid {
        return Ok(Action::await_change());
    }
    let policy =
        renewal_policy(inputs.ncp, inputs.ctx.settings.certificate_validity).map_err(ReconcileError::InvalidSpec)?;
    let renew_window = policy.renew_window();
    let round = Round::new(inputs, &owner, policy);
    // From a request to sleep until the control plane is awake again, upgrades and
    // rotations wait: none starts on a control plane going to sleep, and one that runs
    // finishes before it falls asleep (docs/design.md §12).
    let held = hibernation::holds(round.ncp);

    // A CA rotation requested or in progress moves first: it may bring back a lost CA.
    if !held.authorities {
        rotation::step(&round, status).await?;
    }
    let mut authorities = certificates::ensure_authorities(&round, status).await?;
    let (mut components, mut references) = components::ensure(&round).await?;
    components::follow_replicas(&round, &mut components).await?;
    components::record_replicas(&round, &components, &mut references);
    let endpoint = components::endpoint(&round, &components, &mut references);
    *spec_patched = components::record(&round, references).await?;
    let kubeconfig = certificates::ensure_kubeconfig(&round, &authorities.cluster, endpoint.as_ref()).await?;
    authorities.expiry.extend(kubeconfig);
    certificates::record_schedule(&round, authorities.expiry, renew_window, status);
    report::components(&round, &components, status);
    let sleep_again = hibernation::step(&round, &components, status).await?;
    let (rotation_again, upgrade_again) = if held.day2 {
        (None, None)
    } else {
        // A key rotation waits for the apiservers, as a CA rotation waits for every component.
        let rotation_again = encryption_rotation::step(&round, status).await?;
        // A stepped upgrade moves once the components are summarized (docs/design.md §10).
        (rotation_again, upgrade::step(&round, &components, status).await)
    };
    let upgrade_again = [upgrade_again, rotation_again, sleep_again].into_iter().flatten().min();
    // Look again when the admin kubeconfig is due (the components watch their own).
    let renewal = recheck_after(&round.ncp.name_any(), round.store.next_renewal(), round.now.time);
    Ok(report::requeue(renewal, upgrade_again))
}

/// Writes `status` when it differs from what the control plane holds (`old`) and was not
/// written already, then publishes the Events of the conditions that changed.
///
/// # Errors
/// API errors.
async fn write_status(
    ctx: &Context,
    ncp: &NestedControlPlane,
    ns: &str,
    old: &NestedControlPlaneStatus,
    status: &NestedControlPlaneStatus,
) -> Result<(), ReconcileError> {
    let observed = crate::controllers::shared::status_memo::Observed::of("NestedControlPlane", ncp, old);
    if status == old || ctx.status_memo.already_written(&observed, status) {
        return Ok(());
    }
    // The public CRD sync and the watch health task own their conditions (and the sync its
    // counts); leave them out of this apply.
    let mut own = status.clone();
    own.conditions
        .retain(|c| c.type_ != crate::status::PUBLIC_CRDS_SYNCED && c.type_ != crate::status::WATCHES_HEALTHY);
    own.public_crds = None;
    let api: Api<NestedControlPlane> = Api::namespaced(ctx.client.clone(), ns);
    let patch = serde_json::json!({
        "apiVersion": NestedControlPlane::api_version(&()),
        "kind": NestedControlPlane::kind(&()),
        "status": own,
    });
    let written = api
        .patch_status(&observed.name, &apply_params(), &Patch::Apply(&patch))
        .await?;
    ctx.status_memo
        .record(&observed, status, written.resource_version().unwrap_or_default());
    events::publish_condition_changes(ctx, ncp, &old.conditions, &status.conditions).await;
    Ok(())
}
