//! The workload namespace of one tenant and what bounds it (docs/design.md §11): the Pod
//! Security label of the tenant's level, a NetworkPolicy that admits only the tenant's own
//! pods, and the ResourceQuota and LimitRange of `spec.workloads`. [`desired`] is pure;
//! [`apply`] writes it.

use k8s_openapi::api::core::v1::{
    LimitRange, LimitRangeSpec, Namespace, ResourceQuota, ResourceQuotaSpec, ServiceAccount,
};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicySpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Client, Resource};

use super::scope::typed;
use crate::api::Workloads;
use crate::component::ComponentKind;
use crate::syncer::admission::Level;
use crate::syncer::names::ControlPlaneRef;
use crate::syncer::names::tenancy;

/// Label on every workload namespace, so that orphaned ones are found without knowing
/// their control planes.
pub const WORKLOADS_LABEL: &str = "tenancy.x-k8s.io/workloads";
/// The NetworkPolicy, ResourceQuota and LimitRange of a workload namespace share this name.
pub const BOUNDS_NAME: &str = "tenant";

/// The workload namespace and its bounds, as applied.
#[derive(Clone, Debug, PartialEq)]
pub struct Desired {
    pub namespace: Namespace,
    /// The `default` ServiceAccount every super pod runs as: made here rather than left to
    /// the super cluster's ServiceAccount controller (pods are refused until it exists),
    /// and never mounting a super-cluster token.
    pub service_account: ServiceAccount,
    pub network_policy: NetworkPolicy,
    /// `None`: the tenant sets no quota, and any earlier one is deleted.
    pub resource_quota: Option<ResourceQuota>,
    /// `None`: the tenant sets no limits, and any earlier LimitRange is deleted.
    pub limit_range: Option<LimitRange>,
}

/// What the workload namespace of `control_plane` must be, with `workloads` from its spec.
///
/// Its `default` ServiceAccount mounts no token: a super pod needs no super-cluster
/// credentials, and the syncer sets `automountServiceAccountToken: false` on each pod too.
///
/// The Pod Security labels (`enforce`, and `warn`/`audit` at the same level, all at
/// `latest`) back the syncer's own admission check with the super cluster's
/// (<https://kubernetes.io/docs/concepts/security/pod-security-admission/>). The
/// NetworkPolicy selects every pod of the namespace and admits ingress only from pods of the
/// same namespace and from the tenant's own apiserver pods (those of cluster `cluster` in the
/// control plane's namespace, which call the admission webhooks, conversion webhooks and
/// aggregated APIs its pods serve): one tenant's pods never reach another's, nor another
/// tenant's apiserver them (every workload namespace has the same policy), and egress is
/// left open (tenant pods reach their own apiserver and the internet; the control planes'
/// etcd admits only its apiservers, capn and its members, through the channel's own
/// NetworkPolicies).
pub fn desired(control_plane: &ControlPlaneRef, cluster: &str, level: Level, workloads: Option<&Workloads>) -> Desired {
    let name = control_plane.workload_namespace();
    let meta = |object: &str| ObjectMeta {
        name: Some(object.to_owned()),
        namespace: Some(name.clone()),
        labels: Some([("app.kubernetes.io/managed-by".to_owned(), "capn".to_owned())].into()),
        ..ObjectMeta::default()
    };
    let psa = level.label_value();
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(
                [
                    ("app.kubernetes.io/managed-by", "capn"),
                    (WORKLOADS_LABEL, "true"),
                    ("pod-security.kubernetes.io/enforce", psa),
                    ("pod-security.kubernetes.io/enforce-version", "latest"),
                    ("pod-security.kubernetes.io/warn", psa),
                    ("pod-security.kubernetes.io/audit", psa),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            ),
            annotations: Some([(tenancy::CLUSTER.to_owned(), control_plane.key())].into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    let service_account = ServiceAccount {
        metadata: meta("default"),
        automount_service_account_token: Some(false),
        ..ServiceAccount::default()
    };
    let network_policy = NetworkPolicy {
        metadata: meta(BOUNDS_NAME),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector::default()),
            policy_types: Some(vec!["Ingress".to_owned()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(vec![
                    NetworkPolicyPeer {
                        pod_selector: Some(LabelSelector::default()),
                        ..NetworkPolicyPeer::default()
                    },
                    NetworkPolicyPeer {
                        namespace_selector: Some(LabelSelector {
                            match_labels: Some(
                                [(
                                    "kubernetes.io/metadata.name".to_owned(),
                                    control_plane.namespace.clone(),
                                )]
                                .into(),
                            ),
                            ..LabelSelector::default()
                        }),
                        pod_selector: Some(LabelSelector {
                            match_labels: Some(crate::plan::selector_labels(ComponentKind::ApiServer, cluster)),
                            ..LabelSelector::default()
                        }),
                        ..NetworkPolicyPeer::default()
                    },
                ]),
                ports: None,
            }]),
            egress: None,
        }),
    };
    let resource_quota = workloads
        .and_then(|w| w.resource_quota.clone())
        .map(|hard| ResourceQuota {
            metadata: meta(BOUNDS_NAME),
            spec: Some(ResourceQuotaSpec {
                hard: Some(hard),
                ..ResourceQuotaSpec::default()
            }),
            status: None,
        });
    let limit_range = workloads.and_then(|w| w.limit_range.clone()).map(|limits| LimitRange {
        metadata: meta(BOUNDS_NAME),
        spec: Some(LimitRangeSpec { limits }),
    });
    Desired {
        namespace,
        service_account,
        network_policy,
        resource_quota,
        limit_range,
    }
}

/// Applies `desired` (server-side apply, forced: the syncer owns these objects), deleting
/// a ResourceQuota or LimitRange the spec no longer sets.
///
/// # Errors
/// The super cluster's refusal of a write (an invalid quantity in the quota, say).
pub async fn apply(client: &Client, desired: &Desired) -> Result<(), kube::Error> {
    let params = PatchParams::apply(crate::apply::FIELD_MANAGER).force();
    let ns = desired.namespace.metadata.name.as_deref().unwrap_or_default();
    Api::<Namespace>::all(client.clone())
        .patch(ns, &params, &Patch::Apply(typed(&desired.namespace)))
        .await?;
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .patch("default", &params, &Patch::Apply(typed(&desired.service_account)))
        .await?;
    Api::<NetworkPolicy>::namespaced(client.clone(), ns)
        .patch(BOUNDS_NAME, &params, &Patch::Apply(typed(&desired.network_policy)))
        .await?;
    let quotas = Api::<ResourceQuota>::namespaced(client.clone(), ns);
    match &desired.resource_quota {
        Some(quota) => drop(quotas.patch(BOUNDS_NAME, &params, &Patch::Apply(typed(quota))).await?),
        None => delete_if_present(&quotas).await?,
    }
    let limits = Api::<LimitRange>::namespaced(client.clone(), ns);
    match &desired.limit_range {
        Some(range) => drop(limits.patch(BOUNDS_NAME, &params, &Patch::Apply(typed(range))).await?),
        None => delete_if_present(&limits).await?,
    }
    Ok(())
}

/// Deletes the workload namespace of `control_plane` (everything synced for it goes with
/// it); a namespace already gone is no error.
///
/// # Errors
/// The super cluster's refusal.
pub async fn delete(client: &Client, control_plane: &ControlPlaneRef) -> Result<(), kube::Error> {
    let api = Api::<Namespace>::all(client.clone());
    match api
        .delete(&control_plane.workload_namespace(), &DeleteParams::background())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

async fn delete_if_present<K>(api: &Api<K>) -> Result<(), kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(BOUNDS_NAME, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_namespace_carries_the_tenants_level_and_bounds_only_what_the_spec_sets() {
        let cp = ControlPlaneRef::new("tenants", "demo");
        let plain = desired(&cp, "demo", Level::Baseline, None);
        let labels = plain.namespace.metadata.labels.clone().unwrap();
        assert_eq!(labels["pod-security.kubernetes.io/enforce"], "baseline");
        assert_eq!(labels[WORKLOADS_LABEL], "true");
        assert_eq!(plain.namespace.metadata.name.as_deref(), Some("tenants-demo-workloads"));
        assert!(plain.resource_quota.is_none() && plain.limit_range.is_none());
        // Ingress only from the namespace's own pods and the tenant's own apiserver pods.
        let spec = plain.network_policy.spec.unwrap();
        let from = spec.ingress.unwrap()[0].from.clone().unwrap();
        assert!(from[0].namespace_selector.is_none() && from[0].ip_block.is_none());
        let namespace = from[1].namespace_selector.clone().unwrap().match_labels.unwrap();
        assert_eq!(namespace["kubernetes.io/metadata.name"], "tenants");
        let pods = from[1].pod_selector.clone().unwrap().match_labels.unwrap();
        assert_eq!(
            (
                pods["app.kubernetes.io/name"].as_str(),
                pods["app.kubernetes.io/instance"].as_str()
            ),
            ("apiserver", "demo"),
            "that cluster's apiservers only, not every apiserver of the namespace"
        );
        assert_eq!(from.len(), 2);
        assert_eq!(spec.policy_types.unwrap(), ["Ingress"]);

        let workloads = Workloads {
            resource_quota: Some(
                [(
                    "pods".to_owned(),
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity("10".into()),
                )]
                .into(),
            ),
            ..Workloads::default()
        };
        let bounded = desired(&cp, "demo", Level::Restricted, Some(&workloads));
        assert_eq!(
            bounded.namespace.metadata.labels.unwrap()["pod-security.kubernetes.io/enforce"],
            "restricted"
        );
        assert_eq!(
            bounded.resource_quota.unwrap().spec.unwrap().hard.unwrap()["pods"].0,
            "10"
        );
    }
}
