//! Surge-first rolls of a one-replica StatefulSet (docs/design.md §5 "Surge"; issue 40
//! item 6): the apiserver is stateless, so a roll of a single apiserver first raises the
//! StatefulSet to two replicas in the same write that changes its pod template, and lowers it
//! back to one once both pods run the new template and are ready. Pure: the decision is made
//! from the object about to be applied and the live one the watch cache holds.
//!
//! Why this works with the real StatefulSet controller (kubernetes
//! `pkg/controller/statefulset`, `stateful_set_control.go` and `stateful_set_utils.go`):
//! - a pod it creates at ordinal ≥ `updateStrategy.rollingUpdate.partition` (0, the API's
//!   default) is made from the update revision (`newVersionedStatefulSetPod`), so the surge
//!   pod `<name>-1` runs the new template;
//! - a RollingUpdate walks the pods from the highest ordinal and waits while the one it
//!   reaches is unhealthy before deleting the next outdated one (`updateStatefulSet`; with
//!   `maxUnavailable`, the unavailable pods count against it): the old `<name>-0` is
//!   deleted only once `<name>-1` is Ready;
//! - `currentRevision` becomes `updateRevision` only when every pod is updated and ready
//!   (`completeRollingUpdate`), which is when the surge ends; lowering `replicas` then
//!   deletes the highest ordinal, the surge pod, whose graceful shutdown drains it.
//!
//! Both changes go in one write: had the template changed first, the controller could delete
//! `<name>-0` before seeing two replicas.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// StatefulSet annotation holding the digest of the pod template capn last applied
/// ([`template_digest`]): how the next pass tells a roll that starts from one that runs.
pub const TEMPLATE_DIGEST_ANNOTATION: &str = "controlplane.cluster.x-k8s.io/template-digest";

/// The digest of a pod template: SHA-256 of its JSON (the same rendered template always
/// writes the same JSON), hex, the first 32 characters (a roll marker, not a security boundary).
pub fn template_digest(template: &Value) -> String {
    let digest = Sha256::digest(template.to_string().as_bytes());
    digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// Whether the live StatefulSet's roll is over: its controller saw the current generation,
/// and every pod it asked for exists, is ready and runs the update revision.
fn rolled_out(live: &Value) -> bool {
    let int = |p: &str| live.pointer(p).and_then(Value::as_i64);
    let str = |p: &str| live.pointer(p).and_then(Value::as_str);
    let replicas = int("/spec/replicas");
    int("/status/observedGeneration").is_some()
        && int("/status/observedGeneration") == int("/metadata/generation")
        && ["/status/replicas", "/status/readyReplicas", "/status/updatedReplicas"]
            .iter()
            .all(|p| int(p) == replicas)
        && str("/status/updateRevision").is_some()
        && str("/status/currentRevision") == str("/status/updateRevision")
}

/// Whether a surge could wait forever: the template keeps two of its pods off one node (a
/// required pod anti-affinity), so the surge pod might find no node; or the StatefulSet
/// does not replace its pods by itself (`updateStrategy` `OnDelete`, or a `partition` above
/// 0 that keeps `<name>-0` at the old revision), so the roll would never end.
fn surge_could_stall(desired: &Value) -> bool {
    let anti_affinity = desired
        .pointer("/spec/template/spec/affinity/podAntiAffinity/requiredDuringSchedulingIgnoredDuringExecution")
        .and_then(Value::as_array)
        .is_some_and(|terms| !terms.is_empty());
    let on_delete = desired.pointer("/spec/updateStrategy/type").and_then(Value::as_str) == Some("OnDelete");
    let partition = desired
        .pointer("/spec/updateStrategy/rollingUpdate/partition")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    anti_affinity || on_delete || partition > 0
}

/// Makes `desired`, a StatefulSet of one replica about to be applied, roll surge-first:
/// stamps [`TEMPLATE_DIGEST_ANNOTATION`] and sets `spec.replicas` to 2 while its template
/// differs from the live one's (the roll starts) and until the live one has rolled out at
/// two replicas (the roll runs); 1 otherwise, which ends the surge.
///
/// Left at one replica: anything but a StatefulSet of one replica; a StatefulSet that does
/// not exist yet or is scaled to zero (asleep: no pod serves, nothing to keep); one whose
/// surge could stall (a required pod anti-affinity, `OnDelete`, a `partition` above 0): its
/// roll stays delete-then-create.
pub fn surge_first(desired: &mut Value, live: Option<&Value>) {
    if desired["kind"] != "StatefulSet" || desired.pointer("/spec/replicas").and_then(Value::as_i64) != Some(1) {
        return;
    }
    let digest = template_digest(&desired["spec"]["template"]);
    let Some(metadata) = desired.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    let annotations = metadata
        .entry("annotations")
        .or_insert_with(|| Value::Object(Default::default()));
    if let Some(annotations) = annotations.as_object_mut() {
        annotations.insert(TEMPLATE_DIGEST_ANNOTATION.into(), digest.clone().into());
    }
    let Some(live) = live else { return };
    if surge_could_stall(desired) {
        return;
    }
    let live_replicas = live.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1);
    if live_replicas == 0 {
        return;
    }
    let live_digest = live
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(TEMPLATE_DIGEST_ANNOTATION))
        .and_then(Value::as_str);
    let starts = live_digest != Some(digest.as_str());
    let runs = live_replicas == 2 && !rolled_out(live);
    if starts || runs {
        desired["spec"]["replicas"] = 2.into();
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn desired(image: &str) -> Value {
        json!({"kind": "StatefulSet", "metadata": {"name": "demo-apiserver"},
            "spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "kube-apiserver", "image": image}]}}}})
    }

    /// The live object after capn applied `applied` (replicas and annotation as applied),
    /// at `generation`, with the status the StatefulSet controller wrote.
    fn live(applied: &Value, generation: i64, status: Value) -> Value {
        let mut live = applied.clone();
        live["metadata"]["generation"] = generation.into();
        live["status"] = status;
        live
    }

    fn replicas(v: &Value) -> i64 {
        v["spec"]["replicas"].as_i64().unwrap()
    }

    #[test]
    fn a_template_change_surges_to_two_until_both_pods_run_it_then_back_to_one() {
        // Running at v1, settled.
        let mut v1 = desired("kube-apiserver:v1.35.4");
        surge_first(&mut v1, None);
        assert_eq!(replicas(&v1), 1, "a new StatefulSet starts at one");
        let settled = json!({"observedGeneration": 1, "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1,
            "currentRevision": "r1", "updateRevision": "r1"});
        let running = live(&v1, 1, settled);
        let mut again = desired("kube-apiserver:v1.35.4");
        surge_first(&mut again, Some(&running));
        assert_eq!(replicas(&again), 1, "an unchanged template does not surge");

        // The template changes: two replicas, in the same write.
        let mut v2 = desired("kube-apiserver:v1.36.3");
        surge_first(&mut v2, Some(&running));
        assert_eq!(replicas(&v2), 2);
        assert_ne!(
            v2["metadata"]["annotations"][TEMPLATE_DIGEST_ANNOTATION],
            v1["metadata"]["annotations"][TEMPLATE_DIGEST_ANNOTATION]
        );

        // The controller has not seen it yet; then the surge pod is not ready; then the old
        // pod is replaced but the new one is not ready: still two.
        for status in [
            json!({"observedGeneration": 1, "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1,
                "currentRevision": "r1", "updateRevision": "r1"}),
            json!({"observedGeneration": 2, "replicas": 2, "readyReplicas": 1, "updatedReplicas": 1,
                "currentRevision": "r1", "updateRevision": "r2"}),
            json!({"observedGeneration": 2, "replicas": 2, "readyReplicas": 1, "updatedReplicas": 2,
                "currentRevision": "r1", "updateRevision": "r2"}),
        ] {
            let rolling = live(&v2, 2, status.clone());
            let mut next = desired("kube-apiserver:v1.36.3");
            surge_first(&mut next, Some(&rolling));
            assert_eq!(replicas(&next), 2, "{status}");
        }

        // Both pods run v2 and are ready: back to one.
        let done = live(
            &v2,
            2,
            json!({"observedGeneration": 2, "replicas": 2, "readyReplicas": 2, "updatedReplicas": 2,
                "currentRevision": "r2", "updateRevision": "r2"}),
        );
        let mut next = desired("kube-apiserver:v1.36.3");
        surge_first(&mut next, Some(&done));
        assert_eq!(replicas(&next), 1);

        // While it scales down (one asked for, two still there), it stays at one.
        let scaling = live(
            &next,
            3,
            json!({"observedGeneration": 3, "replicas": 2, "readyReplicas": 2, "updatedReplicas": 2,
                "currentRevision": "r2", "updateRevision": "r2"}),
        );
        let mut after = desired("kube-apiserver:v1.36.3");
        surge_first(&mut after, Some(&scaling));
        assert_eq!(replicas(&after), 1);
    }

    #[test]
    fn a_change_during_the_surge_keeps_two() {
        let v2 = {
            let mut v = desired("v2");
            v["spec"]["replicas"] = 2.into();
            v["metadata"]["annotations"] =
                json!({TEMPLATE_DIGEST_ANNOTATION: template_digest(&desired("v2")["spec"]["template"])});
            v
        };
        let done = live(
            &v2,
            2,
            json!({"observedGeneration": 2, "replicas": 2, "readyReplicas": 2, "updatedReplicas": 2,
                "currentRevision": "r2", "updateRevision": "r2"}),
        );
        let mut v3 = desired("v3");
        surge_first(&mut v3, Some(&done));
        assert_eq!(replicas(&v3), 2, "a new template starts another surge");
    }

    #[test]
    fn no_surge_when_nothing_serves_beyond_one_replica_or_where_it_could_stall() {
        let running = live(
            &desired("v1"),
            1,
            json!({"observedGeneration": 1, "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1,
                "currentRevision": "r1", "updateRevision": "r1"}),
        );
        // Asleep (scaled to zero by capn): waking brings one, not two.
        let mut asleep = running.clone();
        asleep["spec"]["replicas"] = 0.into();
        let mut wake = desired("v2");
        surge_first(&mut wake, Some(&asleep));
        assert_eq!(replicas(&wake), 1);
        // Three replicas already keep two serving through a roll.
        let mut three = desired("v2");
        three["spec"]["replicas"] = 3.into();
        surge_first(&mut three, Some(&running));
        assert_eq!(replicas(&three), 3);
        assert!(three["metadata"].get("annotations").is_none());
        // Another kind is left alone.
        let mut deployment = desired("v2");
        deployment["kind"] = "Deployment".into();
        surge_first(&mut deployment, Some(&running));
        assert_eq!(replicas(&deployment), 1);
        // Required anti-affinity: a second pod might find no node.
        let mut required = desired("v2");
        required["spec"]["template"]["spec"]["affinity"] = json!({"podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "kubernetes.io/hostname"}]}});
        surge_first(&mut required, Some(&running));
        assert_eq!(replicas(&required), 1);
        // A StatefulSet that does not replace its pods by itself would never end a surge.
        for strategy in [
            json!({"type": "OnDelete"}),
            json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 1}}),
        ] {
            let mut held = desired("v2");
            held["spec"]["updateStrategy"] = strategy.clone();
            surge_first(&mut held, Some(&running));
            assert_eq!(replicas(&held), 1, "{strategy}");
        }
        let mut rolling = desired("v2");
        rolling["spec"]["updateStrategy"] = json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}});
        surge_first(&mut rolling, Some(&running));
        assert_eq!(replicas(&rolling), 2);
    }

    #[test]
    fn a_statefulset_capn_applied_before_surges_were_known_surges_once() {
        // No digest annotation yet (made by an older capn): its next roll surges.
        let old = json!({"kind": "StatefulSet", "metadata": {"name": "demo-apiserver", "generation": 4},
            "spec": {"replicas": 1, "template": {}},
            "status": {"observedGeneration": 4, "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1,
                "currentRevision": "r", "updateRevision": "r"}});
        let mut next = desired("v1");
        surge_first(&mut next, Some(&old));
        assert_eq!(replicas(&next), 2);
    }

    #[test]
    fn the_digest_follows_the_template() {
        let a = template_digest(&json!({"spec": {"containers": [{"name": "a"}]}}));
        assert_eq!(a.len(), 32);
        assert_eq!(a, template_digest(&json!({"spec": {"containers": [{"name": "a"}]}})));
        assert_ne!(a, template_digest(&json!({"spec": {"containers": [{"name": "b"}]}})));
    }
}
