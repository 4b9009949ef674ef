//! The tenant objects a pod refers to (ConfigMaps, Secrets, PersistentVolumeClaims of its
//! namespace), copied under their mapped names into the workload namespace before the pod,
//! each by its kind's [`ResourceSyncer`] rules (`crate::syncer::config`, `Claims`).
//! The tenant is the source of truth: a copy that is not current (changed in the tenant,
//! or on the super side) is applied again.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};

use super::copies::{Unseen, apply_unseen, delete};
use super::scope::{CopyRecord, FIELD_MANAGER, Tenant, typed};
use super::volumes::ensure_copy;
use super::written_lately::CACHE_LAG;
use crate::syncer::config::{ConfigMaps, Secrets};
use crate::syncer::diff::{Ownership, ownership};
use crate::syncer::names::NameLimit;
use crate::syncer::names::tenancy::TenantObject;
use crate::syncer::pod::references::referenced as pod_references;
use crate::syncer::pod::{Reference, ReferenceKind};
use crate::syncer::resource::ResourceSyncer;
use crate::syncer::volume::claim_copy;

/// Copies every reference of a pod in the tenant namespace `namespace`. Returns whether one
/// of them does not exist in the tenant yet (the super pod waits for it, as a kubelet
/// would, and the pod is looked at again).
///
/// # Errors
/// A failed read of the tenant or write of the super cluster.
pub(super) async fn sync(
    tenant: &Tenant,
    namespace: &str,
    references: &BTreeSet<Reference>,
) -> Result<bool, kube::Error> {
    let mut waiting = false;
    for reference in references {
        let (name, sources) = (&reference.name, (namespace, reference.name.as_str()));
        let present = match reference.kind {
            ReferenceKind::ConfigMap => {
                copy_used(
                    tenant,
                    &ConfigMaps,
                    &tenant.tenant_config_maps,
                    &tenant.super_config_maps,
                    sources,
                )
                .await?
            }
            ReferenceKind::Secret => {
                copy_used(tenant, &Secrets, &tenant.tenant_secrets, &tenant.super_secrets, sources).await?
            }
            ReferenceKind::PersistentVolumeClaim => claim(tenant, namespace, name).await?,
        };
        waiting |= !present;
    }
    Ok(waiting)
}

/// Makes sure the copy of the tenant object `namespace/name` of `syncer`'s kind is current
/// (`sources`: the tenant's objects by metadata; `copies`: the super cache). Returns whether
/// the tenant object exists and its copy may be used: `false` when it does not (yet), or
/// when a super object of the copy's name is not its copy (the pod waits rather than
/// mount what another owner put there).
async fn copy_used<S, K>(
    tenant: &Tenant,
    syncer: &S,
    sources: &Store<PartialObjectMeta<K>>,
    copies: &Store<K>,
    (namespace, name): (&str, &str),
) -> Result<bool, kube::Error>
where
    S: ResourceSyncer<Object = K>,
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    if current(tenant, sources, copies, namespace, name) {
        return Ok(true);
    }
    let Some(source) = syncer
        .api(tenant.tenant_client.clone(), namespace)
        .get_opt(name)
        .await?
    else {
        return Ok(false);
    };
    let (Ok(Some(mut copy)), Ok(identity)) = (
        syncer.copy(tenant.control_plane(), &source),
        TenantObject::of(source.meta()),
    ) else {
        return Ok(false);
    };
    tenant.mark(copy.meta_mut());
    let live = cached(copies, tenant, &copy);
    let copy_name = copy.meta().name.clone().unwrap_or_default();
    let same = match live.as_ref().map(|l| {
        (
            l,
            ownership(tenant.control_plane(), NameLimit::Subdomain, &identity, l.meta()),
        )
    }) {
        Some((_, Ownership::Foreign)) => {
            tracing::info!(kind = %K::kind(&()), copy = %copy_name, "a super object of the copy's name is not this tenant object's copy; the pods using it wait");
            return Ok(false);
        }
        Some((_, Ownership::Stale)) => {
            delete(&syncer.api(tenant.super_client.clone(), &tenant.namespace), &copy_name).await?;
            None
        }
        Some((live, Ownership::Ours)) => Some(syncer.is_current(&copy, live)),
        None => None,
    };
    apply_copy(
        tenant,
        syncer,
        &copy,
        (live.as_deref().filter(|_| same.is_some()), same),
        (source.meta(), &identity),
    )
    .await
}

/// The cached super object of `copy`'s name.
fn cached<K>(store: &Store<K>, tenant: &Tenant, copy: &K) -> Option<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone,
{
    store.get(&ObjectRef::new(copy.meta().name.as_deref().unwrap_or_default()).within(&tenant.namespace))
}

/// Whether the copy of the tenant object `namespace/name` is known to be current from the
/// caches alone: the tenant object's `resourceVersion` (metadata cache) and the copy's (super
/// cache) are both those this worker last applied or found equal. Spares the tenant a read
/// of the object's data at every pass of every pod that uses it.
fn current<K>(
    tenant: &Tenant,
    sources: &Store<PartialObjectMeta<K>>,
    copies: &Store<K>,
    namespace: &str,
    name: &str,
) -> bool
where
    K: Resource<DynamicType = ()> + Clone,
{
    let Some(source) = sources.get(&ObjectRef::new(name).within(namespace)) else {
        return false;
    };
    let copy_name = tenant.control_plane().super_name(NameLimit::Subdomain, namespace, name);
    let Some(copy) = copies.get(&ObjectRef::new(&copy_name).within(&tenant.namespace)) else {
        return false;
    };
    records(tenant).get(&copy_name).is_some_and(|r| {
        Some(&r.tenant_version) == source.metadata.resource_version.as_ref()
            && r.copy_version.is_some()
            && r.copy_version == copy.meta().resource_version
    })
}

/// Applies the ConfigMap or Secret `copy` of the tenant object `source` to the workload
/// namespace when [`claim_apply`] says so (`live`: the cached copy; `same`: whether it
/// equals `copy`, `None` when the cache shows none), and records the copy's version (see
/// [`CopyRecord`]). Returns whether the copy may be used: not when an object of its name
/// that the cache does not show turns out not to be its copy (`copies::apply_unseen`).
async fn apply_copy<S, K>(
    tenant: &Tenant,
    syncer: &S,
    copy: &K,
    (live, same): (Option<&K>, Option<bool>),
    (source, identity): (&ObjectMeta, &TenantObject),
) -> Result<bool, kube::Error>
where
    S: ResourceSyncer<Object = K>,
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let name = copy.meta().name.clone().unwrap_or_default();
    let version = source.resource_version.clone().unwrap_or_default();
    if same == Some(true) {
        record(
            tenant,
            &name,
            &version,
            live.and_then(|l| l.meta().resource_version.clone()),
        );
        return Ok(true);
    }
    if !claim_apply(tenant, &name, same, &version) {
        return Ok(true);
    }
    let api = Api::<K>::namespaced(tenant.super_client.clone(), &tenant.namespace);
    let applied = match same {
        Some(_) => {
            api.patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(typed(copy)),
            )
            .await
        }
        None => match apply_unseen(tenant, syncer, &api, copy, identity).await {
            Ok(Unseen::Applied(applied)) => Ok(applied),
            Ok(Unseen::Refused(refusal)) => Err(refusal),
            Ok(Unseen::Foreign) => {
                records(tenant).remove(&name);
                tracing::info!(kind = %K::kind(&()), copy = %name, "a super object of the copy's name is not this tenant object's copy; the pods using it wait");
                return Ok(false);
            }
            Err(e) => Err(e),
        },
    };
    match applied {
        Ok(applied) => {
            record(tenant, &name, &version, applied.meta().resource_version.clone());
            Ok(true)
        }
        Err(e) => {
            // Forgotten, so that the next pass tries again.
            records(tenant).remove(&name);
            Err(e)
        }
    }
}

/// Whether this pass applies the copy `name`, given whether the cached copy is the same
/// (`None`: not in the cache) and the tenant object's `resourceVersion`. A cached copy that
/// differs is always applied (the tenant wins); one not cached is applied unless another
/// pass applied this version less than [`CACHE_LAG`] ago (after that the copy counts as
/// deleted and is made again). An apply is recorded, its copy's version not yet known.
fn claim_apply(tenant: &Tenant, name: &str, same: Option<bool>, version: &str) -> bool {
    let mut records = records(tenant);
    let wanted = match same {
        Some(same) => !same,
        None => records
            .get(name)
            .is_none_or(|r| r.tenant_version != version || r.at.elapsed() > CACHE_LAG),
    };
    if wanted {
        records.insert(
            name.to_owned(),
            CopyRecord {
                tenant_version: version.to_owned(),
                copy_version: None,
                at: Instant::now(),
            },
        );
    }
    wanted
}

/// Records that the copy `name` at `copy_version` is made from the tenant object at
/// `tenant_version`.
fn record(tenant: &Tenant, name: &str, tenant_version: &str, copy_version: Option<String>) {
    let mut records = records(tenant);
    let at = records.get(name).map_or_else(Instant::now, |r| r.at);
    records.insert(
        name.to_owned(),
        CopyRecord {
            tenant_version: tenant_version.to_owned(),
            copy_version,
            at,
        },
    );
}

pub(super) fn records(tenant: &Tenant) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, CopyRecord>> {
    tenant
        .applied_copies
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Ensures the copy of the tenant claim `name` (its rules: [`claim_copy`]). The volumes
/// pass copies every claim; a pod's pass makes sure of its own before the super pod needs it.
async fn claim(tenant: &Tenant, namespace: &str, name: &str) -> Result<bool, kube::Error> {
    let cached = tenant.tenant_claims.get(&ObjectRef::new(name).within(namespace));
    let source = match cached {
        Some(claim) => Some((*claim).clone()),
        None => {
            Api::<PersistentVolumeClaim>::namespaced(tenant.tenant_client.clone(), namespace)
                .get_opt(name)
                .await?
        }
    };
    let Some(mut copy) = source.and_then(|claim| claim_copy(tenant.control_plane(), &claim).ok()) else {
        return Ok(false);
    };
    tenant.mark(&mut copy.metadata);
    ensure_copy(tenant, &copy).await
}

/// The ConfigMaps and the Secrets the pods refer to, by the names their specs use
/// (`crate::syncer::pod::references::referenced`: volumes, projected sources, the Secrets of
/// volume plugins, `env`, `envFrom`, `imagePullSecrets`).
pub(super) fn referenced(pods: &[Arc<Pod>]) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut config_maps = BTreeSet::new();
    let mut secrets = BTreeSet::new();
    for reference in pods.iter().filter_map(|p| p.spec.as_ref()).flat_map(pod_references) {
        match reference.kind {
            ReferenceKind::ConfigMap => config_maps.insert(reference.name),
            ReferenceKind::Secret => secrets.insert(reference.name),
            ReferenceKind::PersistentVolumeClaim => false,
        };
    }
    (config_maps, secrets)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;

    use super::*;

    #[test]
    fn every_way_a_pod_names_a_config_map_or_secret_counts_as_a_use() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {
                "imagePullSecrets": [{"name": "pull"}],
                "volumes": [
                    {"name": "a", "configMap": {"name": "cm-volume"}},
                    {"name": "b", "secret": {"secretName": "secret-volume"}},
                    {"name": "d", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "secret-csi"}}},
                    {"name": "c", "projected": {"sources": [
                        {"configMap": {"name": "cm-projected"}},
                        {"secret": {"name": "token"}}]}}],
                "initContainers": [{"name": "i", "envFrom": [{"secretRef": {"name": "secret-env-from"}}]}],
                "containers": [{"name": "c", "env": [
                    {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cm-env", "key": "k"}}},
                    {"name": "Y", "valueFrom": {"secretKeyRef": {"name": "secret-env", "key": "k"}}}],
                    "envFrom": [{"configMapRef": {"name": "cm-env-from"}}]}]}
        }))
        .unwrap();
        let (config_maps, secrets) = referenced(&[Arc::new(pod)]);
        let names = |set: BTreeSet<String>| set.into_iter().collect::<Vec<_>>();
        assert_eq!(
            names(config_maps),
            ["cm-env", "cm-env-from", "cm-projected", "cm-volume"]
        );
        assert_eq!(
            names(secrets),
            [
                "pull",
                "secret-csi",
                "secret-env",
                "secret-env-from",
                "secret-volume",
                "token"
            ]
        );
    }
}
