//! The pure half of the public CRD sync: what a tenant should hold, given the super
//! cluster's public CRDs and the tenant's CRDs.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceConversion, CustomResourceDefinition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Label that makes a super cluster CRD public (the VirtualCluster project's convention).
pub const PUBLIC_LABEL: &str = crate::syncer::custom::PUBLIC_LABEL;
/// Label capn puts on the tenant copies it manages; a tenant CRD without it is the tenant's.
pub const SYNCED_LABEL: &str = "controlplane.cluster.x-k8s.io/synced-from-super";
/// Field manager of the copies.
pub const FIELD_MANAGER: &str = "capn-public-crds";

/// One change to a tenant.
#[derive(Clone, Debug, PartialEq)]
pub enum SyncAction {
    /// Create or update the tenant copy.
    Apply(Box<CustomResourceDefinition>),
    /// Remove a copy capn made whose super CRD is gone or no longer public.
    Delete(String),
}

/// The outcome of [`decide`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SyncPlan {
    pub actions: Vec<SyncAction>,
    /// Public CRDs the tenant holds as its own: never overwritten or deleted.
    pub conflicts: Vec<String>,
    /// Public CRDs present and current in the tenant after the actions.
    pub synced: usize,
}

/// Whether `crd` carries the public label.
pub fn is_public(crd: &CustomResourceDefinition) -> bool {
    crd.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(PUBLIC_LABEL))
        .map(String::as_str)
        == Some("true")
}

fn is_ours(crd: &CustomResourceDefinition) -> bool {
    crd.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(SYNCED_LABEL))
}

/// The tenant copy of a public super CRD: the same spec (a conversion webhook, which would
/// call a Service of the super cluster, is replaced by `None` conversion), labels and
/// annotations, plus [`SYNCED_LABEL`]. `kubectl`'s last-applied annotation is not copied.
pub fn tenant_copy(super_crd: &CustomResourceDefinition) -> CustomResourceDefinition {
    let mut labels = super_crd.metadata.labels.clone().unwrap_or_default();
    labels.insert(SYNCED_LABEL.to_string(), "true".to_string());
    let annotations: BTreeMap<String, String> = super_crd
        .metadata
        .annotations
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k != "kubectl.kubernetes.io/last-applied-configuration")
        .collect();
    let mut spec = super_crd.spec.clone();
    if spec.conversion.as_ref().is_some_and(|c| c.strategy == "Webhook") {
        spec.conversion = Some(CustomResourceConversion {
            strategy: "None".into(),
            webhook: None,
        });
    }
    CustomResourceDefinition {
        metadata: ObjectMeta {
            name: super_crd.metadata.name.clone(),
            labels: Some(labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            ..ObjectMeta::default()
        },
        spec,
        status: None,
    }
}

fn same(copy: &CustomResourceDefinition, existing: &CustomResourceDefinition) -> bool {
    let annotations = |c: &CustomResourceDefinition| {
        c.metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .into_iter()
            .filter(|(k, _)| k != "kubectl.kubernetes.io/last-applied-configuration")
            .collect::<BTreeMap<_, _>>()
    };
    let spec = |c: &CustomResourceDefinition| serde_json::to_value(&c.spec).unwrap_or_default();
    copy.metadata.labels == existing.metadata.labels
        && annotations(copy) == annotations(existing)
        && spec(copy) == spec(existing)
}

/// Decides the changes that make `tenant` hold a current copy of every public CRD in
/// `public`: apply what is missing or differs, delete capn's copies that are no longer
/// public, and report (not touch) tenant-owned CRDs of the same name. A copy that already
/// matches needs no request, so one super CRD change costs one apply per tenant.
pub fn decide(public: &[CustomResourceDefinition], tenant: &[CustomResourceDefinition]) -> SyncPlan {
    let tenant_by_name: BTreeMap<&str, &CustomResourceDefinition> = tenant
        .iter()
        .filter_map(|c| c.metadata.name.as_deref().map(|n| (n, c)))
        .collect();
    let mut plan = SyncPlan::default();
    let mut wanted = std::collections::BTreeSet::new();
    for crd in public.iter().filter(|c| is_public(c)) {
        let Some(name) = crd.metadata.name.as_deref() else {
            continue;
        };
        wanted.insert(name);
        let copy = tenant_copy(crd);
        match tenant_by_name.get(name) {
            Some(existing) if !is_ours(existing) => plan.conflicts.push(name.to_string()),
            Some(existing) if same(&copy, existing) => plan.synced += 1,
            _ => {
                plan.actions.push(SyncAction::Apply(Box::new(copy)));
                plan.synced += 1;
            }
        }
    }
    for crd in tenant.iter().filter(|c| is_ours(c)) {
        if let Some(name) = crd.metadata.name.as_deref()
            && !wanted.contains(name)
        {
            plan.actions.push(SyncAction::Delete(name.to_string()));
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd(name: &str, labels: &[(&str, &str)], versions: &[&str]) -> CustomResourceDefinition {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": name, "labels": labels.iter().cloned().collect::<BTreeMap<_, _>>()},
            "spec": {"group": "example.com", "scope": "Namespaced",
                "names": {"kind": "Widget", "plural": "widgets"},
                "versions": versions.iter().map(|v| serde_json::json!({"name": v, "served": true, "storage": *v == versions[0],
                    "schema": {"openAPIV3Schema": {"type": "object"}}})).collect::<Vec<_>>()}
        }))
        .unwrap()
    }

    const PUBLIC: (&str, &str) = (PUBLIC_LABEL, "true");

    #[test]
    fn a_new_public_crd_is_applied_and_an_unchanged_copy_costs_nothing() {
        let super_crd = crd("widgets.example.com", &[PUBLIC], &["v1"]);
        let plan = decide(std::slice::from_ref(&super_crd), &[]);
        assert_eq!(plan.synced, 1);
        let SyncAction::Apply(copy) = &plan.actions[0] else {
            panic!("{plan:?}")
        };
        assert_eq!(copy.metadata.labels.as_ref().unwrap()[SYNCED_LABEL], "true");
        let again = decide(&[super_crd], &[(**copy).clone()]);
        assert!(again.actions.is_empty(), "{again:?}");
        assert_eq!(again.synced, 1);
    }

    #[test]
    fn a_new_version_is_applied_again() {
        let old = tenant_copy(&crd("widgets.example.com", &[PUBLIC], &["v1"]));
        let plan = decide(&[crd("widgets.example.com", &[PUBLIC], &["v1", "v2"])], &[old]);
        assert!(
            matches!(&plan.actions[..], [SyncAction::Apply(c)] if c.spec.versions.len() == 2),
            "{plan:?}"
        );
    }

    #[test]
    fn unlabelled_or_deleted_super_crds_are_removed_but_only_capns_copies() {
        let ours = tenant_copy(&crd("widgets.example.com", &[PUBLIC], &["v1"]));
        let theirs = crd("gadgets.example.com", &[], &["v1"]);
        let unlabelled = crd("widgets.example.com", &[], &["v1"]);
        let plan = decide(&[unlabelled], &[ours, theirs]);
        assert_eq!(plan.actions, vec![SyncAction::Delete("widgets.example.com".into())]);
    }

    #[test]
    fn a_tenant_owned_crd_of_the_same_name_is_a_conflict_left_untouched() {
        let tenant_own = crd("widgets.example.com", &[], &["v9"]);
        let plan = decide(&[crd("widgets.example.com", &[PUBLIC], &["v1"])], &[tenant_own]);
        assert!(plan.actions.is_empty());
        assert_eq!(plan.conflicts, vec!["widgets.example.com".to_string()]);
        assert_eq!(plan.synced, 0);
    }

    #[test]
    fn conversion_webhooks_are_not_copied() {
        let mut c = crd("widgets.example.com", &[PUBLIC], &["v1"]);
        c.spec.conversion = Some(CustomResourceConversion {
            strategy: "Webhook".into(),
            webhook: None,
        });
        assert_eq!(tenant_copy(&c).spec.conversion.unwrap().strategy, "None");
    }
}
