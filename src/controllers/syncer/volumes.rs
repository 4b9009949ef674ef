//! The volumes pass (docs/design.md §11 "Claims and volumes"; the rules are
//! [`crate::syncer::volume`]'s): every tenant claim gets its copy in the workload namespace,
//! a copy whose tenant claim is gone is deleted (after a read of the tenant confirms it), a
//! refusal is told in the tenant (all three the engine's, [`copies::sync`], with
//! [`Claims`]), and each super volume bound to a copy is shown in the tenant,
//! where the tenant's PersistentVolume controller binds the claim to it. A pass reads only
//! the caches and writes only what differs; it runs when a claim or a volume changes on
//! either side, and every patrol period.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::ObjectRef;

use super::caches::in_namespace;
use super::scope::{TENANT_FIELD_MANAGER, Tenant, ignore_missing, typed};
use super::{copies, passes};
use crate::syncer::names::tenancy::TenantObject;
use crate::syncer::volume::{Claims, VolumeChange, volume_changes};

/// Runs the volumes pass until `wakes` ends (see [`passes::run`]).
pub(super) async fn run(tenant: &Tenant, wakes: futures::stream::BoxStream<'static, ()>) {
    let ready = async {
        tenant.tenant_claims.wait_until_ready().await.is_ok()
            && tenant.tenant_volumes.wait_until_ready().await.is_ok()
            && tenant.super_claims.wait_until_ready().await.is_ok()
            && tenant.super_volumes.wait_until_ready().await.is_ok()
    };
    passes::run("volumes", tenant, ready, wakes, || pass(tenant)).await;
}

/// One pass: claims down and orphaned copies out ([`copies::sync`]), volumes up.
async fn pass(tenant: &Tenant) -> Result<(), kube::Error> {
    let control_plane = tenant.control_plane();
    let copies = in_namespace(&tenant.super_claims, &tenant.namespace);
    copies::sync(tenant, &Claims, &tenant.tenant_claims.state(), &copies).await?;
    let api = Api::<PersistentVolume>::all(tenant.tenant_client.clone());
    let changes = volume_changes(
        control_plane,
        &tenant.namespace,
        &tenant.super_volumes.state(),
        &copies,
        &tenant.tenant_volumes.state(),
    );
    for change in changes {
        match change {
            VolumeChange::Apply { volume, existing: true } => {
                let name = volume.name_any();
                api.patch(
                    &name,
                    &PatchParams::apply(TENANT_FIELD_MANAGER).force(),
                    &Patch::Apply(typed(&*volume)),
                )
                .await?;
            }
            // Made with a create, not an apply: a tenant volume of that name that the syncer
            // did not make is never taken over.
            VolumeChange::Apply {
                volume,
                existing: false,
            } => match api.create(&PostParams::default(), &volume).await {
                Err(kube::Error::Api(e)) if e.code == 409 => tracing::info!(
                    volume = %volume.name_any(),
                    "a tenant PersistentVolume of this name exists that the syncer did not make; not shown"
                ),
                other => drop(other?),
            },
            VolumeChange::Delete(name) => {
                let going = tenant
                    .tenant_volumes
                    .get(&ObjectRef::new(&name))
                    .is_some_and(|v| v.metadata.deletion_timestamp.is_some());
                if !going {
                    ignore_missing(api.delete(&name, &DeleteParams::default()).await.map(drop))?;
                }
            }
        }
    }
    Ok(())
}

/// Ensures the copy `copy` of a tenant claim exists. Returns whether it is there and is
/// this claim's (a copy of a claim deleted and made again under its name is waited out).
///
/// # Errors
/// A failed write of the super cluster.
pub(super) async fn ensure_copy(tenant: &Tenant, copy: &PersistentVolumeClaim) -> Result<bool, kube::Error> {
    let name = copy.name_any();
    if let Some(live) = tenant
        .super_claims
        .get(&ObjectRef::new(&name).within(&tenant.namespace))
    {
        let owner = |c: &PersistentVolumeClaim| TenantObject::of_super(tenant.control_plane(), &c.metadata);
        return Ok(owner(&live) == owner(copy) && live.metadata.deletion_timestamp.is_none());
    }
    let api = Api::<PersistentVolumeClaim>::namespaced(tenant.super_client.clone(), &tenant.namespace);
    match api.create(&PostParams::default(), copy).await {
        Ok(_) => Ok(true),
        // Made meanwhile (by a pod's pass, or a pass before the cache showed it), or made
        // before this instance had its `--watch-filter` label, which keeps it out of the
        // cache: this claim's copy gets the labels (and so shows in the cache); another's is
        // waited out.
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let Some(live) = api.get_opt(&name).await? else {
                return Ok(false);
            };
            let owner = |c: &PersistentVolumeClaim| TenantObject::of_super(tenant.control_plane(), &c.metadata);
            if owner(&live) != owner(copy) || live.metadata.deletion_timestamp.is_some() {
                return Ok(false);
            }
            let labels = serde_json::json!({"metadata": {"labels": copy.metadata.labels}});
            api.patch(&name, &PatchParams::default(), &Patch::Merge(labels)).await?;
            Ok(true)
        }
        Err(e) => Err(e),
    }
}

/// Removes every tenant volume the syncer made (when syncing is turned off: their super
/// volumes went with the workload namespace's claims, or are kept by the platform).
pub(super) async fn remove_all(tenant_client: &kube::Client) -> Result<(), kube::Error> {
    Api::<PersistentVolume>::all(tenant_client.clone())
        .delete_collection(
            &DeleteParams::default(),
            &kube::api::ListParams::default().labels(&format!("{}=true", crate::syncer::volume::VIRTUAL_VOLUME_LABEL)),
        )
        .await
        .map(drop)
}
