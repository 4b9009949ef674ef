//! One tenant's custom resource syncer (docs/design.md §11 "Custom resources"; the rules are
//! `crate::syncer::custom`'s): for every kind whose instances sync, allowed by the control
//! plane (`spec.workloads.customResources`) and whose CRD the tenant holds as capn's copy, a
//! pass of [`copies::sync`] over the tenant's instances and their copies, run again on every
//! change on either side and every patrol period. The kinds follow the super CRDs and the
//! tenant's copies of them as they change. A kind the control plane narrows away is no
//! longer copied, so its copies go, as the engine deletes a copy whose tenant object is no
//! longer copied.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use super::caches::{received, reflect_with};
use super::copies;
use super::scope::Tenant;
use super::super_caches::synced_selector;
use super::super_custom::{CustomKinds, KindCache};
use crate::controllers::public_crds::SYNCED_LABEL;
use crate::syncer::custom::{CustomResources, SyncedKind, allowed};
use crate::syncer::diff::copy_of;
use crate::syncer::names::NameLimit;

/// A kind being synced, and its pass (which holds the kind's shared cache).
struct Running {
    kind: SyncedKind,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Runs the tenant's custom resource syncer until dropped: `custom` is the shared super
/// side, `narrowed` the control plane's list of kinds, if any.
pub(super) async fn run(tenant: Arc<Tenant>, custom: Arc<CustomKinds>, narrowed: Option<Vec<String>>) {
    let mut kinds = custom.kinds.clone();
    // The CRDs capn copied into the tenant: a tenant CRD of a public name that is the
    // tenant's own (the public CRD sync leaves it alone) may say anything; its instances
    // are the tenant's business.
    let (tenant_crds, mut crd_changes) = reflect_with(
        Api::<PartialObjectMeta<CustomResourceDefinition>>::all(tenant.tenant_client.clone()),
        watcher::Config::default().labels(SYNCED_LABEL),
        (),
    );
    let mut running: HashMap<String, Running> = HashMap::new();
    let mut cleared: HashSet<String> = HashSet::new();
    loop {
        let known: Vec<SyncedKind> = kinds.borrow_and_update().values().cloned().collect();
        for kind in known.iter().filter(|kind| !allowed(kind, narrowed.as_deref())) {
            if !cleared.contains(&kind.crd) {
                match clear(&tenant, kind).await {
                    Ok(()) => drop(cleared.insert(kind.crd.clone())),
                    // Tried again at the next change of the kinds, or the worker's restart.
                    Err(error) => {
                        tracing::info!(kind = %kind.crd, %error, "could not delete the copies of a kind narrowed away");
                    }
                }
            }
        }
        let wanted: Vec<SyncedKind> = known
            .into_iter()
            .filter(|kind| allowed(kind, narrowed.as_deref()) && holds(&tenant_crds, &kind.crd))
            .collect();
        running.retain(|_, r| wanted.contains(&r.kind));
        for kind in wanted {
            running.entry(kind.crd.clone()).or_insert_with(|| Running {
                task: tokio::spawn(sync_kind(tenant.clone(), custom.cache(&kind))),
                kind,
            });
        }
        tokio::select! {
            changed = kinds.changed() => if changed.is_err() { return },
            change = crd_changes.next() => if change.is_none() { return },
        }
    }
}

/// Deletes the copies of `kind` in the tenant's workload namespace (a kind the control
/// plane's `spec.workloads.customResources` leaves out). One list, and a delete per copy.
///
/// # Errors
/// A failed request; a kind whose instances capn may not list (no aggregated rights on it)
/// is taken as having none.
async fn clear(tenant: &Tenant, kind: &SyncedKind) -> Result<(), kube::Error> {
    let api = Api::<DynamicObject>::namespaced_with(tenant.super_client.clone(), &tenant.namespace, &kind.resource);
    let selector = synced_selector(tenant.watch_filter.as_deref());
    let listed = match api.list_metadata(&ListParams::default().labels(&selector)).await {
        Err(kube::Error::Api(e)) if e.code == 403 || e.code == 404 => return Ok(()),
        other => other?,
    };
    for copy in listed
        .items
        .iter()
        .filter(|c| copy_of(tenant.control_plane(), NameLimit::Subdomain, &c.metadata).is_some())
    {
        let name = copy.metadata.name.as_deref().unwrap_or_default();
        tracing::info!(kind = %kind.crd, copy = %name, "deleting the copy of a custom resource whose kind the control plane no longer syncs");
        copies::delete(&api, name).await?;
    }
    Ok(())
}

/// Whether the tenant holds capn's copy of the CRD `name`.
fn holds(crds: &Store<PartialObjectMeta<CustomResourceDefinition>>, name: &str) -> bool {
    crds.get(&ObjectRef::new(name)).is_some()
}

/// Runs the passes of one kind for the tenant until dropped.
async fn sync_kind(tenant: Arc<Tenant>, cache: Arc<KindCache>) {
    let syncer = CustomResources(cache.kind.clone());
    let resource = cache.kind.resource.clone();
    let (objects, changes) = reflect_with(
        Api::<DynamicObject>::all_with(tenant.tenant_client.clone(), &resource),
        watcher::Config::default(),
        resource,
    );
    // The tenant's watch fails until the public CRD sync has made the CRD there; it retries.
    let wakes = futures::stream::select(
        changes.filter_map(|change| std::future::ready(change.ok().map(drop))),
        received(cache.subscribe(&tenant.namespace)).map(drop),
    )
    .boxed();
    copies::run(&tenant, &syncer, &objects, &cache.store, wakes).await;
}
