//! A pod's projected ClusterTrustBundles, from the *tenant's* bundles into the ConfigMap its
//! super pod mounts (docs/design.md §11, `crate::syncer::pod::trust_bundle`).
//!
//! The tenant's bundles are watched from the first pod that needs them (`LazyWatch`: v1
//! from Kubernetes 1.37, v1beta1 or v1alpha1 where an older release enables them; a tenant
//! that serves none has no bundles). A change of any bundle wakes the pods that project
//! bundles; their passes write a ConfigMap only when its content changes.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;

use super::pod_owned;
use super::scope::{FIELD_MANAGER, Tenant, typed};
use crate::syncer::names::tenancy::TenantObject;
use crate::syncer::pod::trust_bundle::{TrustBundles, resolve};

/// Makes sure the trust bundle ConfigMap `bundles` of the tenant pod `pod` holds what the
/// tenant's ClusterTrustBundles resolve to, owned by the super pod `live` (so it goes with
/// it); a source that resolves to nothing is reported in a Warning Event `FailedMount` on
/// the tenant pod when the ConfigMap is written. Returns whether the pass must come back
/// (the bundles were not listed yet).
///
/// # Errors
/// The tenant's discovery, or the super cluster's refusal of the ConfigMap.
pub(super) async fn sync(
    tenant: &Tenant,
    tenant_pod: &Pod,
    pod: &TenantObject,
    bundles: &TrustBundles,
    live: &Pod,
) -> Result<bool, kube::Error> {
    let Some(all) = tenant.trust_bundles.bundles(&tenant.tenant_client).await? else {
        return Ok(true);
    };
    let resolved = resolve(&bundles.sources, &all);
    let owner = live.metadata.uid.clone().unwrap_or_default();
    let digest = digest(&resolved.data);
    let current = tenant
        .super_config_maps
        .get(&ObjectRef::new(&bundles.name).within(&tenant.namespace));
    let current = current
        .filter(|c| c.owner_references().iter().any(|o| o.uid == owner))
        .is_some_and(|c| c.data.clone().unwrap_or_default() == resolved.data);
    if current || tenant.trust_bundles.written_lately(&bundles.name, &owner, digest) {
        return Ok(false);
    }
    let config_map = ConfigMap {
        metadata: pod_owned::metadata(tenant, pod, live, &bundles.name, BTreeMap::new()),
        data: Some(resolved.data),
        ..ConfigMap::default()
    };
    Api::<ConfigMap>::namespaced(tenant.super_client.clone(), &tenant.namespace)
        .patch(
            &bundles.name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(typed(&config_map)),
        )
        .await?;
    tenant.trust_bundles.record(&bundles.name, &owner, digest);
    for (key, why) in &resolved.missing {
        let (volume, index) = key.rsplit_once('.').unwrap_or((key, "0"));
        let note = format!(
            "MountVolume.SetUp failed for volume {volume:?}: clusterTrustBundle source {index}: {why}; the pod waits for it"
        );
        tenant.event(tenant_pod, true, "FailedMount", note).await;
    }
    Ok(false)
}

fn digest(data: &BTreeMap<String, String>) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    data.hash(&mut hasher);
    hasher.finish()
}
