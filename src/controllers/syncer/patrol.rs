//! The patrol (docs/design.md §11): every `patrol_every`, from the watch caches, it removes
//! what outlived its tenant object. A super pod whose tenant pod is gone (or re-created
//! with another uid) is deleted only after a read of the tenant apiserver confirms it, not
//! on the cache's word (VirtualCluster's patrol deleted running pods when its caches
//! lagged: kubernetes-sigs/cluster-api-provider-nested#308). A copied ConfigMap or Secret
//! that no super pod refers to any more is deleted once it is older than a patrol period
//! (younger, its pod may still be on the way). Requests go out only for what differs.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{ConfigMap, Pod, PodSpec, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use super::scope::Tenant;
use crate::syncer::diff::copy_of;
use crate::syncer::names::NameLimit;

/// Runs the patrol forever, a round every `tenant.patrol_every` once the caches are filled.
pub(super) async fn run(tenant: &Tenant) {
    if tenant.super_pods.wait_until_ready().await.is_err() || tenant.tenant_pods.wait_until_ready().await.is_err() {
        return;
    }
    let mut tick = tokio::time::interval(tenant.patrol_every);
    loop {
        tick.tick().await;
        if let Err(error) = round(tenant).await {
            tracing::info!(%error, tenant = %tenant.control_plane().key(), "syncer patrol failed; trying again next round");
        }
    }
}

/// One round of the patrol.
async fn round(tenant: &Tenant) -> Result<(), kube::Error> {
    let super_pods = tenant.super_pods.state();
    let pods = Api::<Pod>::namespaced(tenant.super_client.clone(), &tenant.namespace);
    for live in &super_pods {
        let Some(owner) = copy_of(tenant.control_plane(), NameLimit::Subdomain, &live.metadata) else {
            continue;
        };
        let cached = tenant
            .tenant_pods
            .get(&ObjectRef::new(&owner.name).within(&owner.namespace));
        if cached.is_some_and(|p| p.metadata.uid.as_deref() == Some(owner.uid.as_str())) {
            continue;
        }
        let confirmed = Api::<Pod>::namespaced(tenant.tenant_client.clone(), &owner.namespace)
            .get_opt(&owner.name)
            .await?;
        if confirmed.is_none_or(|p| p.metadata.uid.as_deref() != Some(owner.uid.as_str())) {
            tracing::info!(pod = %live.name_any(), "deleting a super pod whose tenant pod is gone");
            ignore_missing(pods.delete(&live.name_any(), &DeleteParams::default()).await.map(drop))?;
        }
    }
    let (config_maps, secrets) = referenced(&super_pods);
    let old = |meta: &ObjectMeta| {
        meta.creation_timestamp.as_ref().is_some_and(|t| {
            Timestamp::now().duration_since(t.0) > SignedDuration::try_from(tenant.patrol_every).unwrap_or_default()
        })
    };
    for copy in tenant.super_config_maps.state() {
        if copy_of(tenant.control_plane(), NameLimit::Subdomain, &copy.metadata).is_some()
            && !config_maps.contains(&copy.name_any())
            && old(&copy.metadata)
        {
            delete::<ConfigMap>(tenant, &copy.name_any()).await?;
        }
    }
    for copy in tenant.super_secrets.state() {
        if copy_of(tenant.control_plane(), NameLimit::Subdomain, &copy.metadata).is_some()
            && !secrets.contains(&copy.name_any())
            && old(&copy.metadata)
        {
            delete::<Secret>(tenant, &copy.name_any()).await?;
        }
    }
    Ok(())
}

async fn delete<K>(tenant: &Tenant, name: &str) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    tracing::info!(kind = %K::kind(&()), %name, "deleting a copy no super pod uses");
    ignore_missing(
        Api::<K>::namespaced(tenant.super_client.clone(), &tenant.namespace)
            .delete(name, &DeleteParams::default())
            .await
            .map(drop),
    )
}

fn ignore_missing(result: Result<(), kube::Error>) -> Result<(), kube::Error> {
    match result {
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        other => other,
    }
}

/// The ConfigMaps and the Secrets the pods refer to (volumes, projected sources, `env`,
/// `envFrom`, `imagePullSecrets`), by name.
fn referenced(pods: &[std::sync::Arc<Pod>]) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut config_maps = BTreeSet::new();
    let mut secrets = BTreeSet::new();
    for spec in pods.iter().filter_map(|p| p.spec.as_ref()) {
        collect(spec, &mut config_maps, &mut secrets);
    }
    (config_maps, secrets)
}

fn collect(spec: &PodSpec, config_maps: &mut BTreeSet<String>, secrets: &mut BTreeSet<String>) {
    for volume in spec.volumes.iter().flatten() {
        config_maps.extend(volume.config_map.as_ref().map(|c| c.name.clone()));
        secrets.extend(volume.secret.as_ref().and_then(|s| s.secret_name.clone()));
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
            ["pull", "secret-env", "secret-env-from", "secret-volume", "token"]
        );
    }
}
