//! The syncer's own refusals: fields a tenant pod may hold in its own cluster that have no
//! faithful copy in the super cluster (docs/design.md §11).
//!
//! - `spec.nodeName`: the super cluster's scheduler places every tenant pod, and the tenant
//!   pod is bound to the node it chose; a tenant naming a node would choose a super node
//!   (VirtualCluster refuses it as well, so DaemonSets do not run in tenants).
//! - `spec.resourceClaims`, `spec.schedulingGroup`: they name ResourceClaims and pod groups
//!   of the tenant, which are not synced.
//! - projected `podCertificate` sources of a key type the syncer cannot generate (RSA and
//!   P-521: `crate::syncer::pod::certificate`); the others are translated, as are
//!   `clusterTrustBundle` sources (`crate::syncer::pod::trust_bundle`).
//! - a pod (anti-)affinity term with a non-empty `namespaceSelector`: it selects tenant
//!   namespaces by their labels, which the super cluster does not have (`namespaces`, or an
//!   empty selector for all of the tenant's namespaces, are translated).

use k8s_openapi::api::core::v1::{PodAffinityTerm, PodSpec};

use super::{Rule, Violation};

/// The `podCertificate` key types the syncer can generate (those capn's crypto library,
/// ring, makes; `crate::syncer::pod::certificate` generates them): the API's others
/// (`RSA3072`, `RSA4096`, `ECDSAP521`) are refused.
pub const SUPPORTED_KEY_TYPES: [&str; 3] = ["ECDSAP256", "ECDSAP384", "ED25519"];

pub(super) fn check(spec: &PodSpec, out: &mut Vec<Violation>) {
    if spec.node_name.as_deref().is_some_and(|n| !n.is_empty()) {
        let message = "must be empty: the super cluster's scheduler places tenant pods, and the tenant pod is bound to the node it chose";
        out.push(Violation::new(Rule::NodeName, "spec.nodeName", message));
    }
    if spec.resource_claims.as_ref().is_some_and(|c| !c.is_empty()) {
        out.push(Violation::new(
            Rule::NotSyncable,
            "spec.resourceClaims",
            "must be empty: ResourceClaims are not synced",
        ));
    }
    if spec.scheduling_group.is_some() {
        out.push(Violation::new(
            Rule::NotSyncable,
            "spec.schedulingGroup",
            "must be unset: pod groups are not synced",
        ));
    }
    projected_sources(spec, out);
    affinity_namespace_selectors(spec, out);
}

fn projected_sources(spec: &PodSpec, out: &mut Vec<Violation>) {
    for (i, volume) in spec.volumes.iter().flatten().enumerate() {
        let sources = volume.projected.as_ref().and_then(|p| p.sources.as_ref());
        for (j, source) in sources.into_iter().flatten().enumerate() {
            let path = format!("spec.volumes[{i}].projected.sources[{j}]");
            let key_type = source.pod_certificate.as_ref().map(|c| c.key_type.as_str());
            if let Some(key_type) = key_type.filter(|k| !SUPPORTED_KEY_TYPES.contains(k)) {
                let message = format!(
                    "{key_type:?} is not a key type the syncer can generate; use one of {}",
                    SUPPORTED_KEY_TYPES.join(", ")
                );
                out.push(Violation::new(
                    Rule::NotSyncable,
                    format!("{path}.podCertificate.keyType"),
                    message,
                ));
            }
        }
    }
}

fn affinity_namespace_selectors(spec: &PodSpec, out: &mut Vec<Violation>) {
    let Some(affinity) = spec.affinity.as_ref() else { return };
    let kinds = [
        (
            "podAffinity",
            affinity.pod_affinity.as_ref().map(|a| {
                (
                    &a.required_during_scheduling_ignored_during_execution,
                    &a.preferred_during_scheduling_ignored_during_execution,
                )
            }),
        ),
        (
            "podAntiAffinity",
            affinity.pod_anti_affinity.as_ref().map(|a| {
                (
                    &a.required_during_scheduling_ignored_during_execution,
                    &a.preferred_during_scheduling_ignored_during_execution,
                )
            }),
        ),
    ];
    for (kind, terms) in kinds {
        let Some((required, preferred)) = terms else { continue };
        let required = required
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, t)| (format!("requiredDuringSchedulingIgnoredDuringExecution[{i}]"), t));
        let preferred = preferred.iter().flatten().enumerate().map(|(i, w)| {
            (
                format!("preferredDuringSchedulingIgnoredDuringExecution[{i}].podAffinityTerm"),
                &w.pod_affinity_term,
            )
        });
        for (path, term) in required.chain(preferred) {
            if selects_by_namespace_labels(term) {
                let message = "must be unset or {}: tenant namespaces have no labels in the super cluster; name them in namespaces instead";
                out.push(Violation::new(
                    Rule::NotSyncable,
                    format!("spec.affinity.{kind}.{path}.namespaceSelector"),
                    message,
                ));
            }
        }
    }
}

/// Whether the term's namespace selector has requirements (`{}` selects every namespace).
pub(crate) fn selects_by_namespace_labels(term: &PodAffinityTerm) -> bool {
    term.namespace_selector.as_ref().is_some_and(|s| {
        s.match_labels.as_ref().is_some_and(|m| !m.is_empty())
            || s.match_expressions.as_ref().is_some_and(|e| !e.is_empty())
    })
}
