//! Where a tenant pod may run: what of its placement is kept, and why that cannot take it
//! out of its share of the super cluster.
//!
//! - `nodeSelector` and node affinity are kept as they are. They only narrow the nodes the
//!   scheduler considers (a required term filters, a preferred one scores); they cannot
//!   make a node eligible. What keeps tenants off nodes — taints, and the node pools an
//!   operator reserves with them — is untouched by them. The tenant's Nodes mirror the super
//!   nodes the pods run on, so the labels it selects on are the super nodes'.
//! - Tolerations are what lets a pod onto tainted nodes, so only [`TOLERATION_KEYS`] are
//!   kept: the taints of an unhealthy node, which every pod tolerates for 300 seconds by
//!   default (the DefaultTolerationSeconds admission adds them in the tenant apiserver, and
//!   would in the super cluster), so keeping them only changes how soon the tenant's own
//!   pod is evicted. Every other toleration is dropped and returned, for an Event.
//! - Pod (anti-)affinity and topology spread constraints select pods by labels. In the
//!   super cluster they would see the workload namespace, where all of the tenant's
//!   namespaces meet, or (through `namespaces`) super namespaces of the same names as the
//!   tenant's. So each term is confined to the workload namespace and to the tenant
//!   namespaces it meant, with a `tenancy.x-k8s.io/namespace In (...)` requirement on its
//!   label selector: the pod's own namespace when the term names none, the named ones,
//!   or all of the tenant's for an empty `namespaceSelector`. A term without a label
//!   selector matches no pod and stays so. (A non-empty `namespaceSelector` is refused by
//!   admission.)

use k8s_openapi::api::core::v1::{Affinity, PodAffinityTerm, PodSpec, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

use crate::syncer::names::tenancy;

/// Taint keys whose tolerations a tenant pod keeps: a node that is not ready or
/// unreachable (<https://kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration/#taint-based-evictions>).
pub const TOLERATION_KEYS: [&str; 2] = ["node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"];

/// Applies the placement rules to `spec`, the spec of a pod in the tenant namespace
/// `namespace`; returns the dropped tolerations.
pub(super) fn rewrite(spec: &mut PodSpec, namespace: &str) -> Vec<Toleration> {
    let (kept, dropped) = spec
        .tolerations
        .take()
        .unwrap_or_default()
        .into_iter()
        .partition(|t| t.key.as_deref().is_some_and(|k| TOLERATION_KEYS.contains(&k)));
    spec.tolerations = Some(kept).filter(|k: &Vec<Toleration>| !k.is_empty());
    if let Some(affinity) = spec.affinity.as_mut() {
        for term in pod_affinity_terms(affinity) {
            confine_term(term, namespace);
        }
    }
    for constraint in spec.topology_spread_constraints.iter_mut().flatten() {
        if let Some(selector) = constraint.label_selector.as_mut() {
            require_namespaces(selector, vec![namespace.to_owned()]);
        }
    }
    dropped
}

/// Every pod affinity and anti-affinity term, required and preferred.
fn pod_affinity_terms(affinity: &mut Affinity) -> Vec<&mut PodAffinityTerm> {
    let affinity_terms = affinity.pod_affinity.as_mut().map(|a| {
        (
            &mut a.required_during_scheduling_ignored_during_execution,
            &mut a.preferred_during_scheduling_ignored_during_execution,
        )
    });
    let anti_affinity_terms = affinity.pod_anti_affinity.as_mut().map(|a| {
        (
            &mut a.required_during_scheduling_ignored_during_execution,
            &mut a.preferred_during_scheduling_ignored_during_execution,
        )
    });
    let mut out = Vec::new();
    for (required, preferred) in affinity_terms.into_iter().chain(anti_affinity_terms) {
        out.extend(required.iter_mut().flatten());
        out.extend(preferred.iter_mut().flatten().map(|w| &mut w.pod_affinity_term));
    }
    out
}

/// Confines `term` to the workload namespace and to the tenant namespaces it selects.
fn confine_term(term: &mut PodAffinityTerm, own: &str) {
    let named = term.namespaces.take().unwrap_or_default();
    // An empty selector selects every namespace (the union with `namespaces` is all).
    let every = term.namespace_selector.take().is_some();
    let namespaces = match (every, named.is_empty()) {
        (true, _) => None,
        (false, false) => Some(named),
        (false, true) => Some(vec![own.to_owned()]),
    };
    if let (Some(selector), Some(namespaces)) = (term.label_selector.as_mut(), namespaces) {
        require_namespaces(selector, namespaces);
    }
}

fn require_namespaces(selector: &mut LabelSelector, namespaces: Vec<String>) {
    selector
        .match_expressions
        .get_or_insert_with(Vec::new)
        .push(LabelSelectorRequirement {
            key: tenancy::NAMESPACE.to_owned(),
            operator: "In".to_owned(),
            values: Some(namespaces),
        });
}
