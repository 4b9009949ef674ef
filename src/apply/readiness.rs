//! Readiness of applied objects (docs/design.md §5), judged from what the API server returned.

use serde_json::Value;

/// Readiness of one object, with the counts that workloads report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Readiness {
    pub ready: bool,
    /// Desired replicas (workloads), else 0.
    pub desired: i32,
    /// Ready replicas (workloads), else 0.
    pub ready_replicas: i32,
}

fn int(v: &Value, pointer: &str) -> Option<i64> {
    v.pointer(pointer).and_then(Value::as_i64)
}

/// Judges `object`:
/// - StatefulSet: ready only when `status.observedGeneration` equals `metadata.generation`
///   and the ready, updated and current replica counts all equal `spec.replicas`, which
///   must be at least 1 (0/0 is not ready; docs/reference.md "Standing in for the kubelet").
/// - Deployment: likewise with ready, updated and available replicas.
/// - Service: at once; `LoadBalancer` when an ingress address is assigned.
/// - ConfigMap, Secret, ServiceAccount, Role, RoleBinding, PodDisruptionBudget,
///   NetworkPolicy: at once.
/// - Anything else: its `Ready` or `Available` condition.
pub fn readiness(object: &Value) -> Readiness {
    let kind = object.get("kind").and_then(Value::as_str).unwrap_or_default();
    let not = |desired: i32, ready_replicas: i32| Readiness {
        ready: false,
        desired,
        ready_replicas,
    };
    match kind {
        "StatefulSet" | "Deployment" => {
            let desired = int(object, "/spec/replicas").unwrap_or(1) as i32;
            let ready_replicas = int(object, "/status/readyReplicas").unwrap_or(0) as i32;
            let generation_seen = int(object, "/status/observedGeneration").is_some()
                && int(object, "/status/observedGeneration") == int(object, "/metadata/generation");
            let counts: &[&str] = if kind == "StatefulSet" {
                &[
                    "/status/readyReplicas",
                    "/status/updatedReplicas",
                    "/status/currentReplicas",
                ]
            } else {
                &[
                    "/status/readyReplicas",
                    "/status/updatedReplicas",
                    "/status/availableReplicas",
                ]
            };
            let all_counted = counts.iter().all(|p| int(object, p) == Some(desired as i64));
            if desired >= 1 && generation_seen && all_counted {
                Readiness {
                    ready: true,
                    desired,
                    ready_replicas,
                }
            } else {
                not(desired, ready_replicas)
            }
        }
        "Service" => {
            let lb = object.pointer("/spec/type").and_then(Value::as_str) == Some("LoadBalancer");
            let has_ingress = object
                .pointer("/status/loadBalancer/ingress")
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty());
            Readiness {
                ready: !lb || has_ingress,
                desired: 0,
                ready_replicas: 0,
            }
        }
        // Objects the API server acts on once stored; none of them reports a condition
        // (a PodDisruptionBudget's status describes the pods, not the budget).
        "ConfigMap"
        | "Secret"
        | "ServiceAccount"
        | "Role"
        | "RoleBinding"
        | "PodDisruptionBudget"
        | "NetworkPolicy" => Readiness {
            ready: true,
            desired: 0,
            ready_replicas: 0,
        },
        _ => {
            let ready = object
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .is_some_and(|cs| {
                    cs.iter().any(|c| {
                        matches!(c.get("type").and_then(Value::as_str), Some("Ready" | "Available"))
                            && c.get("status").and_then(Value::as_str) == Some("True")
                    })
                });
            Readiness {
                ready,
                desired: 0,
                ready_replicas: 0,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn sts(replicas: i64, generation: i64, status: Value) -> Value {
        json!({"kind": "StatefulSet", "metadata": {"generation": generation}, "spec": {"replicas": replicas}, "status": status})
    }

    #[test]
    fn statefulset_table() {
        let full = |n: i64, g: i64| {
            json!({"observedGeneration": g, "replicas": n, "readyReplicas": n, "availableReplicas": n,
                   "currentReplicas": n, "updatedReplicas": n})
        };
        let cases = [
            ("all ready", sts(3, 2, full(3, 2)), true),
            ("0/0 is never ready", sts(0, 1, full(0, 1)), false),
            ("stale generation", sts(3, 3, full(3, 2)), false),
            (
                "no observedGeneration",
                sts(
                    1,
                    1,
                    json!({"replicas": 1, "readyReplicas": 1, "currentReplicas": 1, "updatedReplicas": 1}),
                ),
                false,
            ),
            (
                "replicas only",
                sts(1, 1, json!({"observedGeneration": 1, "replicas": 1})),
                false,
            ),
            (
                "one not ready",
                sts(
                    3,
                    1,
                    json!({"observedGeneration": 1, "replicas": 3, "readyReplicas": 2, "currentReplicas": 3, "updatedReplicas": 3}),
                ),
                false,
            ),
            (
                "rolling",
                sts(
                    3,
                    1,
                    json!({"observedGeneration": 1, "replicas": 3, "readyReplicas": 3, "currentReplicas": 2, "updatedReplicas": 1}),
                ),
                false,
            ),
            ("no status", sts(1, 1, Value::Null), false),
        ];
        for (name, object, want) in cases {
            assert_eq!(readiness(&object).ready, want, "{name}");
        }
    }

    #[test]
    fn services_and_conditions() {
        assert!(readiness(&json!({"kind": "Service", "spec": {"type": "ClusterIP"}})).ready);
        assert!(!readiness(&json!({"kind": "Service", "spec": {"type": "LoadBalancer"}})).ready);
        assert!(readiness(&json!({"kind": "Service", "spec": {"type": "LoadBalancer"}, "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}})).ready);
        assert!(
            readiness(
                &json!({"kind": "EtcdCluster", "status": {"conditions": [{"type": "Available", "status": "True"}]}})
            )
            .ready
        );
        assert!(
            !readiness(
                &json!({"kind": "EtcdCluster", "status": {"conditions": [{"type": "Ready", "status": "False"}]}})
            )
            .ready
        );
        assert!(!readiness(&json!({"kind": "EtcdCluster"})).ready);
        // No condition ever comes: stored is ready (a budget with no disruptions allowed
        // describes the pods, not the budget).
        assert!(readiness(&json!({"kind": "NetworkPolicy", "spec": {}})).ready);
        assert!(
            readiness(
                &json!({"kind": "PodDisruptionBudget", "status": {"disruptionsAllowed": 0,
                "conditions": [{"type": "DisruptionAllowed", "status": "False"}]}})
            )
            .ready
        );
    }
}
