//! The engine of every [`ResourceSyncer`] (the rules are in `crate::syncer::resource`): one
//! pass over one kind copies each tenant object down when its copy is not current, brings
//! status up, reports the super cluster's refusals in the tenant, and deletes the copies
//! whose tenant object is gone once a read of the tenant confirms it. A pass reads only the
//! caches it is given and writes only what differs, so it simply runs again after every
//! change on either side and every patrol period ([`run`]).

use std::collections::BTreeSet;
use std::sync::Arc;

use kube::Resource;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::Store;

use super::caches::in_namespace;
use super::passes;
use super::scope::{FIELD_MANAGER, TENANT_FIELD_MANAGER, Tenant, ignore_missing, typed_with};
use crate::syncer::diff::{Ownership, orphans, ownership};
use crate::syncer::names::tenancy::TenantObject;
use crate::syncer::resource::ResourceSyncer;

/// The Event reason of a copy the super cluster refused (its validation, its admission, its
/// quota); the note carries the super apiserver's message.
pub(super) const SUPER_CLUSTER_REFUSED: &str = "SuperClusterRefused";
/// The Event reason of a tenant object whose copy's name is taken in the workload namespace
/// by a super object that is not its copy (the pods' reason too).
pub(super) const NAME_CONFLICT: &str = "NameConflict";

/// Runs the passes of `syncer` until `wakes` ends ([`passes::run`]): over the tenant's
/// objects in `objects` and their copies in `copies` (a cache of either side; only the
/// workload namespace's copies are looked at), once both caches have filled, then after
/// every change `wakes` reports and every patrol period.
pub(super) async fn run<S, D>(
    tenant: &Tenant,
    syncer: &S,
    objects: &Store<S::Object>,
    copies: &Store<S::Object>,
    wakes: futures::stream::BoxStream<'static, ()>,
) where
    S: ResourceSyncer,
    S::Object: Resource<DynamicType = D>,
    D: Eq + std::hash::Hash + Clone,
{
    let ready = async { objects.wait_until_ready().await.is_ok() && copies.wait_until_ready().await.is_ok() };
    let what = S::Object::kind(&syncer.dynamic_type()).into_owned();
    passes::run(&what, tenant, ready, wakes, || async {
        let live = in_namespace(copies, &tenant.namespace);
        sync(tenant, syncer, &objects.state(), &live).await
    })
    .await;
}

/// One pass of `syncer` over the tenant's `objects` and the live `copies` in the workload
/// namespace (see the module documentation).
///
/// # Errors
/// A request to either side failed otherwise than by a refusal of the copy (the pass is
/// tried again).
pub(super) async fn sync<S: ResourceSyncer>(
    tenant: &Tenant,
    syncer: &S,
    objects: &[Arc<S::Object>],
    copies: &[Arc<S::Object>],
) -> Result<(), kube::Error> {
    let api = syncer.api(tenant.super_client.clone(), &tenant.namespace);
    let mut copied = BTreeSet::new();
    for object in objects.iter().filter(|o| o.meta().deletion_timestamp.is_none()) {
        let Some(Prepared { copy, identity, live }) = prepare(tenant, syncer, object, copies) else {
            continue;
        };
        copied.insert(identity.clone());
        let name = copy.meta().name.clone().unwrap_or_default();
        let refused = match live {
            Some((live, Ownership::Ours)) if syncer.is_current(&copy, live) => {
                bring_up(tenant, syncer, object, live).await?;
                None
            }
            Some((_, Ownership::Foreign)) => {
                name_conflict(tenant, syncer, object, &name).await;
                None
            }
            Some((_, Ownership::Stale)) => {
                delete(&api, &name).await?;
                apply(syncer, &api, &name, &copy).await?.err()
            }
            Some((_, Ownership::Ours)) => apply(syncer, &api, &name, &copy).await?.err(),
            None => match apply_unseen(tenant, syncer, &api, &copy, &identity).await? {
                Unseen::Applied(_) => None,
                Unseen::Refused(refusal) => Some(refusal),
                Unseen::Foreign => {
                    name_conflict(tenant, syncer, object, &name).await;
                    None
                }
            },
        };
        if let Some(kube::Error::Api(e)) = refused {
            tracing::info!(kind = %S::Object::kind(&syncer.dynamic_type()), copy = %name, error = %e.message, "the super cluster refused a copy");
            let note = format!("the super cluster refused this object's copy: {}", e.message);
            tenant
                .event_with(&**object, &syncer.dynamic_type(), true, SUPER_CLUSTER_REFUSED, note)
                .await;
        }
    }
    delete_orphans(tenant, syncer, &api, copies, &copied).await
}

/// Tells the tenant that its object's copy name `name` is held in the workload namespace
/// by an object that is not its copy (left alone), as for a pod; the Event recorder folds a
/// repeat at every pass into one series.
async fn name_conflict<S: ResourceSyncer>(tenant: &Tenant, syncer: &S, object: &S::Object, name: &str) {
    let note = format!(
        "the super cluster already has an object {name} in {} that is not this object's copy; it is left alone",
        tenant.namespace
    );
    tenant
        .event_with(object, &syncer.dynamic_type(), true, NAME_CONFLICT, note)
        .await;
}

/// What became of a copy applied while the cache showed nothing of its name.
pub(super) enum Unseen<K> {
    /// Made (or found to be this tenant object's copy, and put right).
    Applied(K),
    /// The super cluster refused it (403, 422).
    Refused(kube::Error),
    /// An object of its name that is not its copy: left alone.
    Foreign,
}

/// Applies `copy` (of the tenant object `owner`) when the cache shows no object of its
/// name: first *without* forcing, so that an object of that name the cache does not hold (it
/// lacks the tenancy labels the caches select by: made by hand, or by another owner) is not
/// taken over; its fields held by another field manager make a conflict (409), and a read
/// then tells whose it is. This tenant object's copy (a cache that lagged) is applied
/// forced, an earlier namesake's deleted first, another object left alone.
///
/// # Errors
/// A request failed otherwise than by a refusal of the copy.
pub(super) async fn apply_unseen<S: ResourceSyncer>(
    tenant: &Tenant,
    syncer: &S,
    api: &Api<S::Object>,
    copy: &S::Object,
    owner: &TenantObject,
) -> Result<Unseen<S::Object>, kube::Error> {
    let name = copy.meta().name.clone().unwrap_or_default();
    let typed = typed_with(copy, &syncer.dynamic_type());
    match api
        .patch(&name, &PatchParams::apply(FIELD_MANAGER), &Patch::Apply(&typed))
        .await
    {
        Ok(applied) => return Ok(Unseen::Applied(applied)),
        Err(kube::Error::Api(e)) if e.code == 403 || e.code == 422 => return Ok(Unseen::Refused(kube::Error::Api(e))),
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e),
    }
    if let Some(live) = api.get_opt(&name).await? {
        match ownership(tenant.control_plane(), syncer.name_limit(), owner, live.meta()) {
            Ownership::Foreign => return Ok(Unseen::Foreign),
            Ownership::Stale => delete(api, &name).await?,
            Ownership::Ours => {}
        }
    }
    let forced = api
        .patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&typed))
        .await;
    match forced {
        Ok(applied) => Ok(Unseen::Applied(applied)),
        Err(kube::Error::Api(e)) if e.code == 403 || e.code == 422 => Ok(Unseen::Refused(kube::Error::Api(e))),
        Err(e) => Err(e),
    }
}

/// Writes `object` as [`ResourceSyncer::status_up`] wants it after its copy `live`, if it
/// wants anything. A conflict (the tenant object changed since the cache saw it) waits for
/// the next pass, which that change wakes.
async fn bring_up<S: ResourceSyncer>(
    tenant: &Tenant,
    syncer: &S,
    object: &S::Object,
    live: &S::Object,
) -> Result<(), kube::Error> {
    let Some(updated) = syncer.status_up(object, live) else {
        return Ok(());
    };
    let meta = updated.meta();
    let (namespace, name) = (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    );
    let api = syncer.api(tenant.tenant_client.clone(), &namespace);
    let params = PostParams {
        field_manager: Some(TENANT_FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    };
    let written = if syncer.has_status_subresource() {
        api.replace_status(&name, &params, &updated).await.map(drop)
    } else {
        api.replace(&name, &params, &updated).await.map(drop)
    };
    match written {
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => Ok(()),
        other => other,
    }
}

/// What a pass needs of one tenant object that is copied: the copy (with this instance's
/// `--watch-filter` label), the tenant object's identity, and the live object of the copy's
/// name with what it is to the tenant object (`diff::ownership`).
pub(super) struct Prepared<'a, K> {
    pub copy: K,
    pub identity: TenantObject,
    pub live: Option<(&'a K, Ownership)>,
}

/// [`Prepared`] for the tenant object `object` among the live `copies`; `None` for an
/// object that is not copied (or lacks its identity).
pub(super) fn prepare<'a, S: ResourceSyncer>(
    tenant: &Tenant,
    syncer: &S,
    object: &S::Object,
    copies: &'a [Arc<S::Object>],
) -> Option<Prepared<'a, S::Object>> {
    let (Ok(Some(mut copy)), Ok(identity)) = (
        syncer.copy(tenant.control_plane(), object),
        TenantObject::of(object.meta()),
    ) else {
        return None;
    };
    tenant.mark(copy.meta_mut());
    let name = copy.meta().name.clone();
    let live = copies.iter().find(|c| c.meta().name == name).map(|live| {
        (
            &**live,
            ownership(tenant.control_plane(), syncer.name_limit(), &identity, live.meta()),
        )
    });
    Some(Prepared { copy, identity, live })
}

/// Deletes the copies among `copies` whose tenant object is not among `copied`, once a read
/// of the tenant confirms it is gone, being deleted, or no longer copied.
pub(super) async fn delete_orphans<S: ResourceSyncer>(
    tenant: &Tenant,
    syncer: &S,
    api: &Api<S::Object>,
    copies: &[Arc<S::Object>],
    copied: &BTreeSet<TenantObject>,
) -> Result<(), kube::Error> {
    let control_plane = tenant.control_plane();
    let metadata: Vec<_> = copies.iter().map(|c| c.meta().clone()).collect();
    for orphan in orphans(control_plane, syncer.name_limit(), &metadata, copied) {
        let Some(owner) = TenantObject::of_super(control_plane, orphan) else {
            continue;
        };
        if orphan.deletion_timestamp.is_none() && !still_there(tenant, syncer, &owner).await? {
            let name = orphan.name.as_deref().unwrap_or_default();
            tracing::info!(kind = %S::Object::kind(&syncer.dynamic_type()), copy = %name, "deleting a copy whose tenant object is gone");
            delete(api, name).await?;
        }
    }
    Ok(())
}

/// Server-side applies `copy` (which makes it or puts it right alike, and owns every field
/// it sets, so a field the tenant drops later is dropped from the copy). A refusal of the
/// super cluster's admission or validation (403, 422) is returned inside `Ok`.
pub(super) async fn apply<S: ResourceSyncer>(
    syncer: &S,
    api: &Api<S::Object>,
    name: &str,
    copy: &S::Object,
) -> Result<Result<(), kube::Error>, kube::Error> {
    let typed = typed_with(copy, &syncer.dynamic_type());
    match api
        .patch(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(typed))
        .await
    {
        Err(kube::Error::Api(e)) if e.code == 403 || e.code == 422 => Ok(Err(kube::Error::Api(e))),
        other => other.map(|_| Ok(())),
    }
}

/// Whether a read of the tenant shows `owner` (same uid) still there, not being deleted,
/// and copied: the caches may lag behind an object made meanwhile.
async fn still_there<S: ResourceSyncer>(
    tenant: &Tenant,
    syncer: &S,
    owner: &TenantObject,
) -> Result<bool, kube::Error> {
    let confirmed = syncer
        .api(tenant.tenant_client.clone(), &owner.namespace)
        .get_opt(&owner.name)
        .await?;
    Ok(confirmed.is_some_and(|o| {
        o.meta().uid.as_deref() == Some(owner.uid.as_str())
            && o.meta().deletion_timestamp.is_none()
            && matches!(syncer.copy(tenant.control_plane(), &o), Ok(Some(_)))
    }))
}

pub(super) async fn delete<K>(api: &Api<K>, name: &str) -> Result<(), kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    ignore_missing(api.delete(name, &DeleteParams::default()).await.map(drop))
}
