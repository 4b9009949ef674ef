//! Tenant pods as a tenant apiserver stores them, for the syncer's tests.

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

/// An ordinary nginx pod after the tenant apiserver's admission: the service-account
/// plugin's `kube-api-access-*` volume and mounts, the default tolerations, defaults.
pub(crate) fn nginx() -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "nginx",
            "namespace": "web",
            "uid": "6f1c1b7e-5d4a-4f39-9d8e-0c2b1a9f7e61",
            "resourceVersion": "1234",
            "creationTimestamp": "2026-01-02T03:04:05Z",
            "generateName": "nginx-",
            "labels": {"app": "nginx"},
            "annotations": {"team": "web"},
            "finalizers": ["example.com/keep"],
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "nginx-7d9", "uid": "rs-uid", "controller": true}],
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1"}]
        },
        "spec": {
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "dnsPolicy": "ClusterFirst",
            "restartPolicy": "Always",
            "schedulerName": "default-scheduler",
            "priority": 0,
            "enableServiceLinks": true,
            "preemptionPolicy": "PreemptLowerPriority",
            "terminationGracePeriodSeconds": 30,
            "containers": [{
                "name": "nginx",
                "image": "nginx:1.27",
                "ports": [{"containerPort": 80, "protocol": "TCP"}],
                "env": [{"name": "GREETING", "value": "hello"}],
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
                "volumeMounts": [{"name": "kube-api-access-x7k2p", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}]
            }],
            "volumes": [{
                "name": "kube-api-access-x7k2p",
                "projected": {
                    "defaultMode": 420,
                    "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
                    ]
                }
            }],
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            ]
        }
    }))
    .expect("the fixture is a Pod")
}

/// [`nginx`] hardened to pass the restricted level.
pub(crate) fn restricted_nginx() -> Pod {
    let mut pod = nginx();
    let spec = pod.spec.as_mut().expect("spec");
    spec.security_context = Some(
        serde_json::from_value(
            json!({"runAsNonRoot": true, "runAsUser": 101, "seccompProfile": {"type": "RuntimeDefault"}}),
        )
        .expect("security context"),
    );
    spec.containers[0].security_context = Some(
        serde_json::from_value(
            json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}),
        )
        .expect("security context"),
    );
    pod
}

/// `pod` with the JSON value at `pointer` (RFC 6901) set, creating objects on the way; an
/// array index one past the end appends.
pub(crate) fn with(pod: &Pod, pointer: &str, value: Value) -> Pod {
    let mut doc = serde_json::to_value(pod).expect("a Pod serializes");
    let tokens: Vec<String> = pointer
        .trim_start_matches('/')
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect();
    let (last, parents) = tokens.split_last().expect("a pointer has a token");
    let mut at = &mut doc;
    for token in parents {
        at = match at {
            Value::Array(items) => &mut items[token.parse::<usize>().expect("an index")],
            other => other
                .as_object_mut()
                .expect("an object")
                .entry(token.clone())
                .or_insert(json!({})),
        };
    }
    match at {
        // One past the end appends, as RFC 6902's "-" does.
        Value::Array(items) => match last.parse::<usize>().expect("an index") {
            i if i == items.len() => items.push(value),
            i => items[i] = value,
        },
        other => {
            other.as_object_mut().expect("an object").insert(last.clone(), value);
        }
    }
    serde_json::from_value(doc).expect("still a Pod")
}
