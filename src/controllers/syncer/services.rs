//! The services pass (docs/design.md §11 "Services"; the rules are
//! [`crate::syncer::service`]'s): every tenant Service that is copied gets its copy in the
//! workload namespace, kept as the syncer made it (a change made on the super side is
//! reverted); a copy whose tenant Service is gone, or no longer copied, is deleted (after a
//! read of the tenant confirms it, as the patrol does for pods); and each tenant Service
//! shows its copy's ClusterIP ([`SUPER_CLUSTER_IP`]). A pass reads only the caches and
//! writes only what differs; it runs when a Service changes on either side, and every
//! patrol period.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};

use super::caches::in_namespace;
use super::passes;
use super::scope::{FIELD_MANAGER, TENANT_FIELD_MANAGER, Tenant, ignore_missing, typed};
use crate::syncer::diff::{Ownership, orphans, ownership};
use crate::syncer::names::NameLimit;
use crate::syncer::names::tenancy::TenantObject;
use crate::syncer::service::{CopyState, SUPER_CLUSTER_IP, cluster_ip_changes, copy_state, service_copy};

/// Why a Service has no copy: the super cluster refused it (its quota on Services, a
/// policy).
const SUPER_CLUSTER_REFUSED: &str = "SuperClusterRefused";

/// Runs the services pass until `wakes` ends (see [`passes::run`]).
pub(super) async fn run(tenant: &Tenant, wakes: futures::stream::BoxStream<'static, ()>) {
    let ready = async {
        tenant.tenant_services.wait_until_ready().await.is_ok()
            && tenant.super_services.wait_until_ready().await.is_ok()
    };
    passes::run("services", tenant, ready, wakes, || pass(tenant)).await;
}

/// One pass: copies down, orphaned copies out, super addresses up.
async fn pass(tenant: &Tenant) -> Result<(), kube::Error> {
    let control_plane = tenant.control_plane();
    let api = Api::<Service>::namespaced(tenant.super_client.clone(), &tenant.namespace);
    let copies = in_namespace(&tenant.super_services, &tenant.namespace);
    let services = tenant.tenant_services.state();
    let mut copied = BTreeSet::new();
    for service in services.iter().filter(|s| s.metadata.deletion_timestamp.is_none()) {
        let (Ok(Some(mut copy)), Ok(identity)) = (
            service_copy(control_plane, service),
            TenantObject::of(&service.metadata),
        ) else {
            continue;
        };
        tenant.mark(&mut copy.metadata);
        let name = copy.name_any();
        let live = copies
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(name.as_str()));
        let state = live.map(
            |live| match ownership(control_plane, NameLimit::Label, &identity, &live.metadata) {
                Ownership::Ours => copy_state(&copy, live),
                Ownership::Stale => CopyState::Replace,
                Ownership::Foreign => CopyState::Current,
            },
        );
        copied.insert(identity);
        match state {
            Some(CopyState::Current) => {}
            Some(CopyState::Replace) => delete(&api, &name).await?,
            // Server-side apply makes the copy and puts it right alike, and owns every field
            // it sets, so a port or label the tenant drops later is dropped from the copy.
            None | Some(CopyState::Update) => {
                let applied = api
                    .patch(
                        &name,
                        &PatchParams::apply(FIELD_MANAGER).force(),
                        &Patch::Apply(typed(&copy)),
                    )
                    .await;
                match applied {
                    Err(kube::Error::Api(e)) if live.is_none() && (e.code == 403 || e.code == 422) => {
                        let note = format!("the super cluster refused the Service's copy: {}", e.message);
                        tenant.event(&**service, true, SUPER_CLUSTER_REFUSED, note).await;
                    }
                    other => drop(other?),
                }
            }
        }
    }
    let metadata: Vec<_> = copies.iter().map(|c| c.metadata.clone()).collect();
    for orphan in orphans(control_plane, NameLimit::Label, &metadata, &copied) {
        let Some(owner) = TenantObject::of_super(control_plane, orphan) else {
            continue;
        };
        if orphan.deletion_timestamp.is_none() && !still_copied(tenant, &owner).await? {
            tracing::info!(service = %orphan.name.as_deref().unwrap_or_default(), "deleting a Service copy whose tenant Service is gone");
            delete(&api, orphan.name.as_deref().unwrap_or_default()).await?;
        }
    }
    for (service, address) in cluster_ip_changes(control_plane, &services, &copies) {
        let shown = serde_json::json!({"metadata": {"annotations": {SUPER_CLUSTER_IP: address}}});
        let params = PatchParams {
            field_manager: Some(TENANT_FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        let tenant_api =
            Api::<Service>::namespaced(tenant.tenant_client.clone(), &service.namespace().unwrap_or_default());
        ignore_missing(
            tenant_api
                .patch(&service.name_any(), &params, &Patch::Merge(shown))
                .await
                .map(drop),
        )?;
    }
    Ok(())
}

/// Whether a read of the tenant shows the Service `owner` (same uid) still there and
/// copied: the caches may lag behind a Service made meanwhile.
async fn still_copied(tenant: &Tenant, owner: &TenantObject) -> Result<bool, kube::Error> {
    let confirmed = Api::<Service>::namespaced(tenant.tenant_client.clone(), &owner.namespace)
        .get_opt(&owner.name)
        .await?;
    Ok(confirmed.is_some_and(|s| {
        s.metadata.uid.as_deref() == Some(owner.uid.as_str())
            && s.metadata.deletion_timestamp.is_none()
            && matches!(service_copy(tenant.control_plane(), &s), Ok(Some(_)))
    }))
}

async fn delete(api: &Api<Service>, name: &str) -> Result<(), kube::Error> {
    ignore_missing(api.delete(name, &DeleteParams::default()).await.map(drop))
}
