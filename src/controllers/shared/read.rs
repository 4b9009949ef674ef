//! The reads shared by the reconcilers: the owning control plane, the cluster name and the
//! cluster settings (from the NestedControlPlane and, when one owns it, the CAPI Cluster).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Resource, ResourceExt};

use std::sync::Arc;

use crate::api::{CLUSTER_NAME_LABEL, CONTROL_PLANE_GROUP, NestedControlPlane};
use crate::controllers::{Context, ReconcileError};
use crate::pki::RenewalPolicy;
use crate::plan::{
    ClusterSettings, DEFAULT_DNS_DOMAIN, DEFAULT_IMAGE_REPOSITORY, DEFAULT_SERVICE_CIDR, NetworkPolicySettings,
};

/// API group of Cluster API's core types.
pub const CAPI_GROUP: &str = "cluster.x-k8s.io";
/// Annotation that pauses reconciliation of one object (CAPI contract).
pub const PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";

fn group_of(api_version: &str) -> &str {
    api_version.split_once('/').map(|(g, _)| g).unwrap_or("")
}

/// The owner reference to the CAPI `Cluster` that owns `object`, if any.
pub fn capi_cluster_owner<K: Resource>(object: &K) -> Option<&OwnerReference> {
    object
        .owner_references()
        .iter()
        .find(|o| o.kind == "Cluster" && group_of(&o.api_version) == CAPI_GROUP)
}

/// The cluster name (docs/design.md §1): the owning CAPI Cluster's name, else the object's own.
/// Before Cluster API has set its owner reference, the `cluster.x-k8s.io/cluster-name` label
/// (which Cluster API sets too, and templates should carry) names the cluster, so nothing is
/// ever created under a name that changes once the Cluster adopts the object.
pub fn cluster_name<K: Resource>(object: &K) -> String {
    capi_cluster_owner(object)
        .map(|o| o.name.clone())
        .or_else(|| {
            object
                .labels()
                .get(CLUSTER_NAME_LABEL)
                .filter(|v| !v.is_empty())
                .cloned()
        })
        .unwrap_or_else(|| object.name_any())
}

/// The NestedControlPlane that owns a component resource (by owner reference), from the
/// watch cache. `None` when there is no such owner or it no longer exists.
pub fn owning_control_plane<K: Resource>(
    ctx: &Context,
    object: &K,
    namespace: &str,
) -> Option<Arc<NestedControlPlane>> {
    let owner = object
        .owner_references()
        .iter()
        .find(|o| o.kind == "NestedControlPlane" && group_of(&o.api_version) == CONTROL_PLANE_GROUP)?;
    ctx.caches
        .control_plane(namespace, &owner.name)
        .filter(|n| n.uid().as_deref() == Some(owner.uid.as_str()))
}

/// How the leaf certificates of `ncp` are issued and renewed: its
/// `certificateValidityPeriod` (else `default_validity`, `capn run --certificate-validity`)
/// and `rolloutBefore.certificatesExpiryDays`.
///
/// # Errors
/// A message naming the field when `certificateValidityPeriod` is not a positive Go
/// duration (`8760h`, `90m`).
pub fn renewal_policy(
    ncp: &NestedControlPlane,
    default_validity: Option<std::time::Duration>,
) -> Result<RenewalPolicy, String> {
    let mut policy = RenewalPolicy::default();
    if let Some(validity) = default_validity {
        policy.validity = time::Duration::try_from(validity).unwrap_or(policy.validity);
    }
    if let Some(text) = &ncp.spec.certificate_validity_period {
        let parsed: kube::core::Duration = text.parse().map_err(|e| {
            format!("spec.certificateValidityPeriod {text:?} is not a duration like \"8760h\" or \"90m\": {e}")
        })?;
        let validity = time::Duration::try_from(std::time::Duration::from(parsed)).unwrap_or_default();
        if parsed.is_negative() || validity <= time::Duration::ZERO {
            return Err(format!("spec.certificateValidityPeriod {text:?} must be positive"));
        }
        policy.validity = validity;
    }
    policy.renew_before = ncp
        .spec
        .rollout_before
        .as_ref()
        .and_then(|r| r.certificates_expiry_days)
        .filter(|days| *days > 0)
        .map(|days| time::Duration::days(i64::from(days)));
    Ok(policy)
}

/// Whether reconciliation of `ncp` is paused: the `cluster.x-k8s.io/paused` annotation on
/// it, or `spec.paused` on its CAPI Cluster (CAPI contract).
pub fn is_paused(ncp: &NestedControlPlane, cluster: Option<&DynamicObject>) -> bool {
    ncp.annotations().contains_key(PAUSED_ANNOTATION)
        || cluster.is_some_and(|c| c.data.pointer("/spec/paused").and_then(|p| p.as_bool()) == Some(true))
}

/// Reads the CAPI Cluster that owns `ncp`, when one does: from the watch cache
/// ([`crate::controllers::shared::cache::ClusterCache`], trimmed to the spec fields capn reads), or with a GET
/// when the cache does not hold it or Cluster API was not served as capn started. A
/// Cluster that cannot be found (deleted, or Cluster API not installed) reads as `None`.
///
/// # Errors
/// Transient API errors other than NotFound (only when it is read with a GET).
pub async fn owning_cluster(
    ctx: &Context,
    ncp: &NestedControlPlane,
) -> Result<Option<Arc<DynamicObject>>, ReconcileError> {
    let Some(owner) = capi_cluster_owner(ncp) else {
        return Ok(None);
    };
    let ns = ncp.namespace().ok_or(ReconcileError::NoNamespace)?;
    // A Cluster the cache does not hold yet (its watch event still on the way) is read, so
    // that nothing is planned without its clusterNetwork.
    if let Some(cached) = ctx.caches.clusters.as_ref().and_then(|c| c.get(&ns, &owner.name)) {
        return Ok(Some(cached));
    }
    let version = owner.api_version.split_once('/').map(|(_, v)| v).unwrap_or("v1beta2");
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(CAPI_GROUP, version, "Cluster"));
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &ar);
    Ok(api.get_opt(&owner.name).await?.map(Arc::new))
}

/// The KMS plugins the apiservers must reach: the spec's, then those the configuration
/// still holds (recorded in status).
fn kms_endpoints(ncp: &NestedControlPlane) -> Vec<String> {
    let spec = ncp.spec.encryption.as_ref().and_then(|e| e.kms.as_deref());
    let recorded = ncp.status.as_ref().and_then(|s| s.encryption.as_deref());
    spec.into_iter()
        .chain(recorded.into_iter().flat_map(|e| &e.kms))
        .map(|k| k.endpoint.clone())
        .collect()
}

/// The settings every component of `ncp` is planned with. The CAPI Cluster's
/// `spec.clusterNetwork` (service CIDR, service domain) wins over the NCP's own.
pub fn cluster_settings(
    ncp: &NestedControlPlane,
    cluster: Option<&DynamicObject>,
    super_dns_domain: &str,
) -> ClusterSettings {
    let spec = &ncp.spec;
    let network = spec.cluster_network.as_ref();
    let capi = |p: &str| {
        cluster
            .and_then(|c| c.data.pointer(p))
            .and_then(|v| v.as_str())
            .map(str::to_string)
    };
    let service_cidr = capi("/spec/clusterNetwork/services/cidrBlocks/0")
        .or_else(|| {
            network
                .and_then(|n| n.services.as_ref())
                .and_then(|s| s.cidr_blocks.first().cloned())
        })
        .unwrap_or_else(|| DEFAULT_SERVICE_CIDR.to_string());
    let dns_domain = capi("/spec/clusterNetwork/serviceDomain")
        .or_else(|| network.and_then(|n| n.service_domain.clone()))
        .unwrap_or_else(|| DEFAULT_DNS_DOMAIN.to_string());
    ClusterSettings {
        name: cluster_name(ncp),
        namespace: ncp.namespace().unwrap_or_default(),
        kubernetes_version: spec.version.clone(),
        channel: spec.channel.clone(),
        size: spec.size.clone(),
        image_repository: spec
            .image_repository
            .clone()
            .unwrap_or_else(|| DEFAULT_IMAGE_REPOSITORY.to_string()),
        service_cidr,
        dns_domain,
        super_dns_domain: super_dns_domain.to_string(),
        kms_endpoints: kms_endpoints(ncp),
        // capn's own pods are a process setting; the component controller fills them in.
        network_policy: NetworkPolicySettings {
            capn: None,
            apiserver_from: peers(spec.network_policy.as_ref().and_then(|p| p.apiserver_from.as_ref())),
            metrics_from: peers(spec.network_policy.as_ref().and_then(|p| p.metrics_from.as_ref())),
        },
    }
}

/// NetworkPolicyPeers as the template context holds them (JSON objects).
fn peers(list: Option<&Vec<k8s_openapi::api::networking::v1::NetworkPolicyPeer>>) -> Option<Vec<serde_json::Value>> {
    list.map(|l| l.iter().filter_map(|p| serde_json::to_value(p).ok()).collect())
}

/// A controller owner reference to `object` that blocks its foreground deletion until the
/// dependents are gone. `None` when the object has no uid yet (never stored).
/// `capn render` and the controllers both use it, so their output agrees.
pub fn controller_reference<K: Resource<DynamicType = ()>>(object: &K) -> Option<OwnerReference> {
    Some(OwnerReference {
        block_owner_deletion: Some(true),
        ..object.controller_owner_ref(&())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ncp_with_owner(owner: Option<(&str, &str)>) -> NestedControlPlane {
        let mut ncp = NestedControlPlane::new("cp", Default::default());
        if let Some((api_version, kind)) = owner {
            ncp.metadata.owner_references = Some(vec![OwnerReference {
                api_version: api_version.into(),
                kind: kind.into(),
                name: "capi-cluster".into(),
                uid: "u".into(),
                ..Default::default()
            }]);
        }
        ncp
    }

    #[test]
    fn cluster_name_is_the_capi_cluster_or_the_control_plane() {
        assert_eq!(cluster_name(&ncp_with_owner(None)), "cp");
        let mut labelled = ncp_with_owner(None);
        labelled.metadata.labels = Some([(CLUSTER_NAME_LABEL.to_string(), "from-label".to_string())].into());
        assert_eq!(
            cluster_name(&labelled),
            "from-label",
            "the label names the cluster before adoption"
        );
        labelled.metadata.owner_references = ncp_with_owner(Some(("cluster.x-k8s.io/v1beta2", "Cluster")))
            .metadata
            .owner_references;
        assert_eq!(cluster_name(&labelled), "capi-cluster", "the owning Cluster wins");
        assert_eq!(
            cluster_name(&ncp_with_owner(Some(("cluster.x-k8s.io/v1beta2", "Cluster")))),
            "capi-cluster"
        );
        assert_eq!(
            cluster_name(&ncp_with_owner(Some(("cluster.x-k8s.io/v1beta1", "Cluster")))),
            "capi-cluster"
        );
        // Another group's "Cluster" is not Cluster API's.
        assert_eq!(cluster_name(&ncp_with_owner(Some(("example.com/v1", "Cluster")))), "cp");
    }

    #[test]
    fn paused_by_annotation_or_cluster() {
        let mut ncp = ncp_with_owner(None);
        assert!(!is_paused(&ncp, None));
        let cluster: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": "c"}, "spec": {"paused": true}
        }))
        .unwrap();
        assert!(is_paused(&ncp, Some(&cluster)));
        ncp.metadata.annotations = Some([(PAUSED_ANNOTATION.to_string(), String::new())].into());
        assert!(is_paused(&ncp, None));
    }
}
