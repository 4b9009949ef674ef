//! The patrol (docs/design.md §11): every `patrol_every`, from the watch caches, it removes
//! what outlived its tenant object. A super pod whose tenant pod is gone (or re-created
//! with another uid) is deleted only after a read of the tenant apiserver confirms it, not
//! on the cache's word (VirtualCluster's patrol deleted running pods when its caches
//! lagged: kubernetes-sigs/cluster-api-provider-nested#308). A copied ConfigMap or Secret
//! that no super pod refers to any more is deleted once it is older than a patrol period
//! (younger, its pod may still be on the way). Requests go out only for what differs.

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use super::caches::in_namespace;
use super::references::referenced;
use super::scope::{Tenant, ignore_missing};
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
    let super_pods = in_namespace(&tenant.super_pods, &tenant.namespace);
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
    for copy in in_namespace(&tenant.super_config_maps, &tenant.namespace) {
        if copy_of(tenant.control_plane(), NameLimit::Subdomain, &copy.metadata).is_some()
            && !config_maps.contains(&copy.name_any())
            && old(&copy.metadata)
        {
            delete::<ConfigMap>(tenant, &copy.name_any()).await?;
        }
    }
    for copy in in_namespace(&tenant.super_secrets, &tenant.namespace) {
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
    super::references::records(tenant).remove(name);
    ignore_missing(
        Api::<K>::namespaced(tenant.super_client.clone(), &tenant.namespace)
            .delete(name, &DeleteParams::default())
            .await
            .map(drop),
    )
}
