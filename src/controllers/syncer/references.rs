//! The tenant objects a pod refers to (ConfigMaps, Secrets, PersistentVolumeClaims of its
//! namespace), copied under their mapped names into the workload namespace before the pod.
//! The tenant is the source of truth: a copy that differs from its tenant object (changed
//! in the tenant, or on the super side) is applied again.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, PersistentVolumeClaimSpec, Pod, PodSpec, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;

use super::scope::{FIELD_MANAGER, Tenant, typed};
use crate::syncer::diff::metadata_drift;
use crate::syncer::names::NameLimit;
use crate::syncer::names::tenancy::super_metadata;
use crate::syncer::pod::{Reference, ReferenceKind};

/// The legacy service-account token Secret type: a copy of one is made `Opaque`, so that
/// the super cluster's token controller never fills it with a super-cluster token.
const SERVICE_ACCOUNT_TOKEN_TYPE: &str = "kubernetes.io/service-account-token";

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
        let present = match reference.kind {
            ReferenceKind::ConfigMap => config_map(tenant, namespace, &reference.name).await?,
            ReferenceKind::Secret => secret(tenant, namespace, &reference.name).await?,
            ReferenceKind::PersistentVolumeClaim => claim(tenant, namespace, &reference.name).await?,
        };
        waiting |= !present;
    }
    Ok(waiting)
}

/// The copy's metadata, or `None` when the tenant object lacks its identity.
fn copy_meta(tenant: &Tenant, meta: &ObjectMeta) -> Option<ObjectMeta> {
    super_metadata(tenant.control_plane(), NameLimit::Subdomain, meta).ok()
}

async fn config_map(tenant: &Tenant, namespace: &str, name: &str) -> Result<bool, kube::Error> {
    let Some(source) = Api::<ConfigMap>::namespaced(tenant.tenant_client.clone(), namespace)
        .get_opt(name)
        .await?
    else {
        return Ok(false);
    };
    let Some(metadata) = copy_meta(tenant, &source.metadata) else {
        return Ok(false);
    };
    let copy = ConfigMap {
        metadata,
        data: source.data,
        binary_data: source.binary_data,
        immutable: None,
    };
    let live = tenant
        .super_config_maps
        .get(&ObjectRef::new(copy.metadata.name.as_deref().unwrap_or_default()).within(&tenant.namespace));
    let same = live.as_ref().map(|l| {
        l.data == copy.data
            && l.binary_data == copy.binary_data
            && metadata_drift(&copy.metadata, &l.metadata).is_empty()
    });
    apply_copy(tenant, &copy, same, source.metadata.resource_version.as_deref()).await?;
    Ok(true)
}

async fn secret(tenant: &Tenant, namespace: &str, name: &str) -> Result<bool, kube::Error> {
    let Some(source) = Api::<Secret>::namespaced(tenant.tenant_client.clone(), namespace)
        .get_opt(name)
        .await?
    else {
        return Ok(false);
    };
    let Some(metadata) = copy_meta(tenant, &source.metadata) else {
        return Ok(false);
    };
    let type_ = source
        .type_
        .filter(|t| t != SERVICE_ACCOUNT_TOKEN_TYPE)
        .or_else(|| Some("Opaque".to_owned()));
    let copy = Secret {
        metadata,
        data: source.data,
        type_,
        ..Secret::default()
    };
    let live = tenant
        .super_secrets
        .get(&ObjectRef::new(copy.metadata.name.as_deref().unwrap_or_default()).within(&tenant.namespace));
    let same = live.as_ref().map(|l| {
        l.data == copy.data && l.type_ == copy.type_ && metadata_drift(&copy.metadata, &l.metadata).is_empty()
    });
    apply_copy(tenant, &copy, same, source.metadata.resource_version.as_deref()).await?;
    Ok(true)
}

/// Applies the ConfigMap or Secret `copy` to the workload namespace when [`claim_apply`]
/// says so (`same`: whether the cached copy equals it; `version`: the tenant object's
/// `resourceVersion`).
async fn apply_copy<K>(tenant: &Tenant, copy: &K, same: Option<bool>, version: Option<&str>) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    if !claim_apply(tenant, copy.meta(), same, version.unwrap_or_default()) {
        return Ok(());
    }
    let name = copy.meta().name.clone().unwrap_or_default();
    let applied = Api::<K>::namespaced(tenant.super_client.clone(), &tenant.namespace)
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(typed(copy)),
        )
        .await;
    release_on_error(tenant, &name, applied)
}

/// How long an apply vouches for a copy the cache does not show yet.
const CACHE_LAG: Duration = Duration::from_secs(30);

/// Whether this pass applies the copy `meta`, given whether the cached copy is the same
/// (`None`: not in the cache) and the tenant object's `resourceVersion`. A cached copy that
/// differs is always applied (the tenant wins); one not cached is applied unless another
/// pass applied this version less than [`CACHE_LAG`] ago (after that the copy counts as
/// deleted and is made again). An apply is recorded.
fn claim_apply(tenant: &Tenant, meta: &ObjectMeta, same: Option<bool>, version: &str) -> bool {
    let name = meta.name.clone().unwrap_or_default();
    let mut applied = tenant
        .applied_copies
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let wanted = match same {
        Some(same) => !same,
        None => applied
            .get(&name)
            .is_none_or(|(v, at)| v != version || at.elapsed() > CACHE_LAG),
    };
    if wanted {
        applied.insert(name, (version.to_owned(), Instant::now()));
    }
    wanted
}

/// Forgets a failed apply, so that the next pass tries again.
fn release_on_error<T>(tenant: &Tenant, name: &str, result: Result<T, kube::Error>) -> Result<(), kube::Error> {
    if result.is_err() {
        tenant
            .applied_copies
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(name);
    }
    result.map(drop)
}

/// A claim's copy asks for the same storage (class, access modes, size, volume mode) and
/// nothing that names super-cluster objects: no `volumeName`, `selector` or data source,
/// which would reach volumes and objects outside the tenant's own. A claim's spec is
/// immutable but for its size, so the copy is made once.
async fn claim(tenant: &Tenant, namespace: &str, name: &str) -> Result<bool, kube::Error> {
    let Some(source) = Api::<PersistentVolumeClaim>::namespaced(tenant.tenant_client.clone(), namespace)
        .get_opt(name)
        .await?
    else {
        return Ok(false);
    };
    let Some(metadata) = copy_meta(tenant, &source.metadata) else {
        return Ok(false);
    };
    let spec = source.spec.unwrap_or_default();
    let copy = PersistentVolumeClaim {
        metadata,
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: spec.access_modes,
            resources: spec.resources,
            storage_class_name: spec.storage_class_name,
            volume_mode: spec.volume_mode,
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    };
    let api = Api::<PersistentVolumeClaim>::namespaced(tenant.super_client.clone(), &tenant.namespace);
    let name = copy.metadata.name.clone().unwrap_or_default();
    if api.get_opt(&name).await?.is_none() {
        api.patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(typed(&copy)),
        )
        .await?;
    }
    Ok(true)
}

/// The ConfigMaps and the Secrets the pods refer to (volumes, projected sources, the
/// Secrets of volume plugins, `env`, `envFrom`, `imagePullSecrets`), by name.
pub(super) fn referenced(pods: &[std::sync::Arc<Pod>]) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut config_maps = BTreeSet::new();
    let mut secrets = BTreeSet::new();
    for spec in pods.iter().filter_map(|p| p.spec.as_ref()) {
        collect(spec, &mut config_maps, &mut secrets);
    }
    (config_maps, secrets)
}

pub(super) fn collect(spec: &PodSpec, config_maps: &mut BTreeSet<String>, secrets: &mut BTreeSet<String>) {
    for volume in spec.volumes.iter().flatten() {
        config_maps.extend(volume.config_map.as_ref().map(|c| c.name.clone()));
        secrets.extend(volume.secret.as_ref().and_then(|s| s.secret_name.clone()));
        // The Secrets volume plugins read from the pod's namespace.
        let plugin_secrets = [
            volume.csi.as_ref().and_then(|v| v.node_publish_secret_ref.as_ref()),
            volume.cephfs.as_ref().and_then(|v| v.secret_ref.as_ref()),
            volume.cinder.as_ref().and_then(|v| v.secret_ref.as_ref()),
            volume.flex_volume.as_ref().and_then(|v| v.secret_ref.as_ref()),
            volume.iscsi.as_ref().and_then(|v| v.secret_ref.as_ref()),
            volume.rbd.as_ref().and_then(|v| v.secret_ref.as_ref()),
            volume.scale_io.as_ref().map(|v| &v.secret_ref),
            volume.storageos.as_ref().and_then(|v| v.secret_ref.as_ref()),
        ];
        secrets.extend(plugin_secrets.into_iter().flatten().map(|r| r.name.clone()));
        secrets.extend(volume.azure_file.as_ref().map(|v| v.secret_name.clone()));
        for source in volume.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            config_maps.extend(source.config_map.as_ref().map(|c| c.name.clone()));
            secrets.extend(source.secret.as_ref().map(|s| s.name.clone()));
        }
    }
    secrets.extend(spec.image_pull_secrets.iter().flatten().map(|s| s.name.clone()));
    let containers = spec.containers.iter().chain(spec.init_containers.iter().flatten());
    for container in containers {
        for from in container.env_from.iter().flatten() {
            config_maps.extend(from.config_map_ref.as_ref().map(|c| c.name.clone()));
            secrets.extend(from.secret_ref.as_ref().map(|s| s.name.clone()));
        }
        for value in container.env.iter().flatten().filter_map(|e| e.value_from.as_ref()) {
            config_maps.extend(value.config_map_key_ref.as_ref().map(|c| c.name.clone()));
            secrets.extend(value.secret_key_ref.as_ref().map(|s| s.name.clone()));
        }
    }
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
        let (config_maps, secrets) = referenced(&[std::sync::Arc::new(pod)]);
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
