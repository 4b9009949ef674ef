//! The availability and isolation policy the templates receive: disruption
//! budgets, spread, priority and NetworkPolicy peers. Templates hold the manifests
//! (PodDisruptionBudget, topologySpreadConstraints, NetworkPolicy); the numbers and choices
//! are computed here, so that they are tested once and every channel version agrees.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::api::{ComponentSpec, TopologySpread, WhenUnsatisfiable};
use crate::component::ComponentKind;

/// The PriorityClass components run with unless their spec names another. capn creates no
/// cluster-scoped object at run time: the clusterctl control plane components install it
/// ([`priority_class`]), and `capn priority-class` prints it for other installations.
pub const DEFAULT_PRIORITY_CLASS: &str = "capn-control-plane";

/// Value of [`DEFAULT_PRIORITY_CLASS`]: above ordinary workloads (0) and far below the
/// system classes (`system-cluster-critical` is 2 000 000 000), and below the 1 000 000 000
/// ceiling of user-defined classes, so that a platform can still rank its own classes above.
/// Hosted control plane operators use the same order of magnitude (HyperShift's
/// `hypershift-control-plane` is 100 000 000).
pub const DEFAULT_PRIORITY_VALUE: i32 = 100_000_000;

/// Namespace whose pods may reach the metrics ports when the NestedControlPlane names no
/// monitoring peers (`spec.networkPolicy.metricsFrom`): the namespace kube-prometheus and
/// most monitoring stacks install into.
pub const DEFAULT_MONITORING_NAMESPACE: &str = "monitoring";

/// Label every namespace carries with its own name (set by the API server since Kubernetes
/// 1.22, and immutable): the one namespace label a tenant cannot forge.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// Labels of capn's own pods, `key=value[,key=value]`: the default of `capn run
/// --self-labels`, and what the clusterctl Deployments put on their pods.
pub const DEFAULT_CAPN_POD_LABELS: &str = "app.kubernetes.io/name=capn";

/// capn's own pods, as the etcd and apiserver NetworkPolicies admit them: a namespace and
/// pod labels. `capn run` knows its namespace from `--self-namespace` (the downward API's
/// `POD_NAMESPACE` in the clusterctl Deployment) and its labels from `--self-labels`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CapnPods {
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
}

/// Who the NetworkPolicies admit besides the control plane itself.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NetworkPolicySettings {
    /// capn's own pods; `None` when capn runs outside the super cluster (nothing to admit).
    pub capn: Option<CapnPods>,
    /// NestedControlPlane `spec.networkPolicy.apiserverFrom`: `None` admits everyone.
    pub apiserver_from: Option<Vec<serde_json::Value>>,
    /// NestedControlPlane `spec.networkPolicy.metricsFrom`: `None` means the pods of
    /// [`DEFAULT_MONITORING_NAMESPACE`].
    pub metrics_from: Option<Vec<serde_json::Value>>,
}

/// `network_policy` in the template context.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NetworkPolicyVars {
    /// `{namespace, labels}` of capn's pods, or none.
    pub capn: Option<CapnPods>,
    /// NetworkPolicyPeers admitted to the apiserver besides the controller-manager and capn;
    /// none admits everyone.
    pub apiserver_from: Option<Vec<serde_json::Value>>,
    /// NetworkPolicyPeers admitted to the metrics ports; empty admits nobody.
    pub metrics_from: Vec<serde_json::Value>,
}

/// The NetworkPolicy peers of the template context, defaults filled in.
pub fn network_policy_vars(settings: &NetworkPolicySettings) -> NetworkPolicyVars {
    NetworkPolicyVars {
        capn: settings.capn.clone(),
        apiserver_from: settings.apiserver_from.clone(),
        metrics_from: settings.metrics_from.clone().unwrap_or_else(|| {
            vec![serde_json::json!({
                "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: DEFAULT_MONITORING_NAMESPACE}}
            })]
        }),
    }
}

/// `disruption` in the template context: the component's PodDisruptionBudget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct DisruptionVars {
    /// `maxUnavailable` of the budget (members that voluntary disruptions such as a node
    /// drain may take down at once).
    pub max_unavailable: i32,
}

/// The quorum of an etcd cluster of `members`: a majority, ⌊N/2⌋ + 1 (etcd's Raft).
pub fn etcd_quorum(members: i32) -> i32 {
    members / 2 + 1
}

/// `maxUnavailable` of a component's PodDisruptionBudget for `replicas` members:
///
/// - etcd: N − (⌊N/2⌋ + 1), the members that may be down while a quorum stays (0 for one
///   and two members, 1 for three and four, 2 for five and six, 3 for seven). It is the
///   largest budget that never allows losing quorum, and at least 1 from three members
///   on. The disruption controller counts members that are already not ready against it,
///   so a drain waits while one is down. With one or two members it is 0: a drain of
///   their node waits until an operator decides (docs/guide/maintenance.md
///   "Disruption budgets").
/// - apiserver and controller-manager: N − 1, at least 1: one replica stays when there
///   are several, and a single replica does not block a drain (there is nothing to keep).
pub fn disruption(kind: ComponentKind, replicas: i32) -> DisruptionVars {
    let replicas = replicas.max(1);
    DisruptionVars {
        max_unavailable: match kind {
            ComponentKind::Etcd => replicas - etcd_quorum(replicas),
            ComponentKind::ApiServer | ComponentKind::ControllerManager => (replicas - 1).max(1),
        },
    }
}

/// `spread` in the template context: the members' topologySpreadConstraints and
/// anti-affinity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct SpreadVars {
    /// `whenUnsatisfiable` of the spread over nodes (`kubernetes.io/hostname`).
    pub node_when_unsatisfiable: &'static str,
    /// `whenUnsatisfiable` of the spread over zones (`topology.kubernetes.io/zone`).
    pub zone_when_unsatisfiable: &'static str,
    /// Pod anti-affinity among the members: `required` or `preferred`.
    pub anti_affinity: &'static str,
}

/// The spread rules for a component's `topologySpread`:
///
/// - default (`ScheduleAnyway`): every rule is a preference, so a one-node super cluster
///   still runs all members;
/// - `DoNotSchedule`: the node spread is hard and the anti-affinity required: one member
///   per node, or the member stays Pending.
///
/// The zone spread is `ScheduleAnyway` in both: with `DoNotSchedule`, the scheduler
/// filters out every node that lacks the constraint's topology label, so on a super
/// cluster without zone labels no member could ever be scheduled (kube-scheduler
/// PodTopologySpread filter, "node(s) didn't match pod topology spread constraints
/// (missing required label)"). As a preference it counts only where the labels exist. The
/// scheduler also ignores, when scoring soft spread constraints, nodes missing any of their
/// keys, so without zone labels the soft node spread weighs nothing: the preferred
/// anti-affinity is what spreads the members then.
pub fn spread(topology_spread: Option<&TopologySpread>) -> SpreadVars {
    let required = topology_spread.and_then(|t| t.when_unsatisfiable) == Some(WhenUnsatisfiable::DoNotSchedule);
    SpreadVars {
        node_when_unsatisfiable: if required { "DoNotSchedule" } else { "ScheduleAnyway" },
        zone_when_unsatisfiable: "ScheduleAnyway",
        anti_affinity: if required { "required" } else { "preferred" },
    }
}

/// The PriorityClass of a component's pods: the spec's, else [`DEFAULT_PRIORITY_CLASS`].
pub fn priority_class_name(spec: &ComponentSpec) -> String {
    spec.priority_class_name
        .as_deref()
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .unwrap_or(DEFAULT_PRIORITY_CLASS)
        .to_string()
}

/// The PriorityClass named [`DEFAULT_PRIORITY_CLASS`], as the clusterctl control plane
/// components ship it and `capn priority-class` prints it. Cluster-scoped, so capn never
/// applies it itself.
pub fn priority_class() -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": DEFAULT_PRIORITY_CLASS},
        "value": DEFAULT_PRIORITY_VALUE,
        "globalDefault": false,
        "preemptionPolicy": "PreemptLowerPriority",
        "description": "Nested control planes run by capn (etcd, kube-apiserver, kube-controller-manager): scheduled before, and may preempt, ordinary workloads; never system-critical pods.",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_budget_for_one_to_seven_members_never_allows_losing_quorum() {
        // N:                      1  2  3  4  5  6  7
        let expected: [i32; 7] = [0, 0, 1, 1, 2, 2, 3];
        for (n, want) in (1..=7).zip(expected) {
            let got = disruption(ComponentKind::Etcd, n).max_unavailable;
            assert_eq!(got, want, "etcd with {n} members");
            let quorum = n / 2 + 1;
            assert!(
                n - got >= quorum,
                "{n} members, {got} unavailable: quorum {quorum} lost"
            );
            if n >= 3 {
                assert!(got >= 1, "{n} members must allow one member to be drained");
            }
        }
    }

    #[test]
    fn apiserver_and_controller_manager_budgets_keep_one_replica_when_there_are_several() {
        // N:                      1  2  3  4  5  6  7
        let expected: [i32; 7] = [1, 1, 2, 3, 4, 5, 6];
        for kind in [ComponentKind::ApiServer, ComponentKind::ControllerManager] {
            for (n, want) in (1..=7).zip(expected) {
                assert_eq!(disruption(kind, n).max_unavailable, want, "{kind} with {n} replicas");
            }
        }
    }

    #[test]
    fn spread_is_preferred_by_default_and_never_hard_on_zones() {
        let preferred = SpreadVars {
            node_when_unsatisfiable: "ScheduleAnyway",
            zone_when_unsatisfiable: "ScheduleAnyway",
            anti_affinity: "preferred",
        };
        assert_eq!(spread(None), preferred);
        assert_eq!(spread(Some(&TopologySpread::default())), preferred);
        let schedule_anyway = TopologySpread {
            when_unsatisfiable: Some(WhenUnsatisfiable::ScheduleAnyway),
        };
        assert_eq!(spread(Some(&schedule_anyway)), preferred);
        let required = TopologySpread {
            when_unsatisfiable: Some(WhenUnsatisfiable::DoNotSchedule),
        };
        assert_eq!(
            spread(Some(&required)),
            SpreadVars {
                node_when_unsatisfiable: "DoNotSchedule",
                zone_when_unsatisfiable: "ScheduleAnyway",
                anti_affinity: "required",
            }
        );
    }

    #[test]
    fn priority_class_defaults_to_capns_own() {
        assert_eq!(priority_class_name(&ComponentSpec::default()), "capn-control-plane");
        let empty = ComponentSpec {
            priority_class_name: Some(" ".into()),
            ..Default::default()
        };
        assert_eq!(priority_class_name(&empty), "capn-control-plane");
        let named = ComponentSpec {
            priority_class_name: Some("platform-critical".into()),
            ..Default::default()
        };
        assert_eq!(priority_class_name(&named), "platform-critical");
        assert_eq!(priority_class()["metadata"]["name"], DEFAULT_PRIORITY_CLASS);
    }

    #[test]
    fn metrics_default_to_the_monitoring_namespace_and_an_empty_list_admits_nobody() {
        let vars = network_policy_vars(&NetworkPolicySettings::default());
        assert_eq!(
            vars.metrics_from,
            vec![
                serde_json::json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}})
            ]
        );
        assert_eq!(vars.apiserver_from, None);
        let closed = network_policy_vars(&NetworkPolicySettings {
            metrics_from: Some(Vec::new()),
            ..Default::default()
        });
        assert!(closed.metrics_from.is_empty());
    }
}
