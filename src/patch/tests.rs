//! Table tests of the patch rules (docs/design.md §4).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{PatchError, apply_extra_args, apply_patches};

const NS: &str = "tenant-a";

/// A rendered apiserver: a StatefulSet with two containers and a Service.
fn rendered() -> Vec<Value> {
    vec![
        json!({
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {
                "name": "c1-apiserver",
                "namespace": NS,
                "annotations": {"example.com/a~b": "old"}
            },
            "spec": {
                "serviceName": "c1-apiserver",
                "replicas": 1,
                "podManagementPolicy": "Parallel",
                "template": {
                    "spec": {
                        "securityContext": {"runAsNonRoot": true, "runAsUser": 65532},
                        "containers": [
                            {
                                "name": "kube-apiserver",
                                "image": "registry.k8s.io/kube-apiserver:v1.36.3",
                                "command": ["kube-apiserver"],
                                "args": ["--secure-port=6443", "--v=2"],
                                "env": [
                                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                                    {"name": "LOG", "value": "info"}
                                ],
                                "ports": [{"name": "https", "containerPort": 6443, "protocol": "TCP"}],
                                "volumeMounts": [
                                    {"name": "ca", "mountPath": "/etc/kubernetes/pki/ca", "readOnly": true},
                                    {"name": "sa", "mountPath": "/etc/kubernetes/pki/sa", "readOnly": true}
                                ]
                            },
                            {"name": "log-shipper", "image": "busybox:1"}
                        ],
                        "volumes": [
                            {"name": "ca", "secret": {"secretName": "c1-ca", "defaultMode": 288}},
                            {"name": "sa", "secret": {"secretName": "c1-sa"}}
                        ]
                    }
                }
            }
        }),
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "c1-apiserver", "namespace": NS},
            "spec": {
                "type": "ClusterIP",
                "ports": [{"name": "https", "port": 6443, "targetPort": "https", "protocol": "TCP"}]
            }
        }),
    ]
}

/// A strategic merge patch of the StatefulSet with `spec` as given.
fn sts_patch(spec: Value) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "c1-apiserver"},
        "spec": spec
    })
}

/// A strategic merge patch of the StatefulSet's pod spec.
fn pod_patch(pod_spec: Value) -> Value {
    sts_patch(json!({"template": {"spec": pod_spec}}))
}

const C0: &str = "/0/spec/template/spec/containers/0";

#[test]
fn strategic_merge_table() {
    struct Case {
        name: &'static str,
        patch: Value,
        /// (JSON Pointer into the whole object list, expected value; `None` = absent).
        expect: Vec<(String, Option<Value>)>,
    }
    let at = |p: &str| p.to_string();
    let c0 = |p: &str| format!("{C0}{p}");
    let cases = vec![
        Case {
            name: "merge an existing container by name",
            patch: pod_patch(json!({"containers": [{"name": "kube-apiserver", "image": "my/apiserver:1"}]})),
            expect: vec![
                (c0("/image"), Some(json!("my/apiserver:1"))),
                (c0("/command"), Some(json!(["kube-apiserver"]))),
                (
                    at("/0/spec/template/spec/containers/1/name"),
                    Some(json!("log-shipper")),
                ),
                (at("/0/spec/template/spec/containers/2"), None),
            ],
        },
        Case {
            name: "add a new container",
            patch: pod_patch(json!({"containers": [{"name": "proxy", "image": "envoy:1"}]})),
            expect: vec![
                (c0("/name"), Some(json!("kube-apiserver"))),
                (
                    at("/0/spec/template/spec/containers/1/name"),
                    Some(json!("log-shipper")),
                ),
                (
                    at("/0/spec/template/spec/containers/2"),
                    Some(json!({"name": "proxy", "image": "envoy:1"})),
                ),
            ],
        },
        Case {
            name: "env: replace one variable's value by name",
            patch: pod_patch(
                json!({"containers": [{"name": "kube-apiserver", "env": [{"name": "LOG", "value": "debug"}]}]}),
            ),
            expect: vec![
                (c0("/env/0/name"), Some(json!("POD_IP"))),
                (c0("/env/1"), Some(json!({"name": "LOG", "value": "debug"}))),
                (c0("/env/2"), None),
            ],
        },
        Case {
            name: "env: add one variable",
            patch: pod_patch(
                json!({"containers": [{"name": "kube-apiserver", "env": [{"name": "GOGC", "value": "50"}]}]}),
            ),
            expect: vec![
                (c0("/env/1"), Some(json!({"name": "LOG", "value": "info"}))),
                (c0("/env/2"), Some(json!({"name": "GOGC", "value": "50"}))),
            ],
        },
        Case {
            name: "env: $patch: delete removes one variable",
            patch: pod_patch(
                json!({"containers": [{"name": "kube-apiserver", "env": [{"name": "LOG", "$patch": "delete"}]}]}),
            ),
            expect: vec![(c0("/env/0/name"), Some(json!("POD_IP"))), (c0("/env/1"), None)],
        },
        Case {
            name: "containers: $patch: delete removes a container",
            patch: pod_patch(json!({"containers": [{"name": "log-shipper", "$patch": "delete"}]})),
            expect: vec![
                (c0("/name"), Some(json!("kube-apiserver"))),
                (at("/0/spec/template/spec/containers/1"), None),
            ],
        },
        Case {
            name: "volumes: merge by name keeps the other fields",
            patch: pod_patch(json!({"volumes": [{"name": "ca", "secret": {"secretName": "my-ca"}}]})),
            expect: vec![
                (
                    at("/0/spec/template/spec/volumes/0/secret"),
                    Some(json!({"secretName": "my-ca", "defaultMode": 288})),
                ),
                (
                    at("/0/spec/template/spec/volumes/1/secret/secretName"),
                    Some(json!("c1-sa")),
                ),
                (at("/0/spec/template/spec/volumes/2"), None),
            ],
        },
        Case {
            name: "volumes: add one by name",
            patch: pod_patch(json!({"volumes": [{"name": "audit", "emptyDir": {}}]})),
            expect: vec![
                (at("/0/spec/template/spec/volumes/1/name"), Some(json!("sa"))),
                (
                    at("/0/spec/template/spec/volumes/2"),
                    Some(json!({"name": "audit", "emptyDir": {}})),
                ),
            ],
        },
        Case {
            name: "volumeMounts: merge by mountPath (the name may change)",
            patch: pod_patch(json!({"containers": [{"name": "kube-apiserver", "volumeMounts": [
                {"mountPath": "/etc/kubernetes/pki/sa", "name": "sa2", "readOnly": false}
            ]}]})),
            expect: vec![
                (c0("/volumeMounts/0/name"), Some(json!("ca"))),
                (
                    c0("/volumeMounts/1"),
                    Some(json!({"name": "sa2", "mountPath": "/etc/kubernetes/pki/sa", "readOnly": false})),
                ),
                (c0("/volumeMounts/2"), None),
            ],
        },
        Case {
            name: "volumeMounts: add one by mountPath",
            patch: pod_patch(json!({"containers": [{"name": "kube-apiserver", "volumeMounts": [
                {"mountPath": "/var/log/audit", "name": "audit"}
            ]}]})),
            expect: vec![
                (c0("/volumeMounts/1/name"), Some(json!("sa"))),
                (
                    c0("/volumeMounts/2"),
                    Some(json!({"mountPath": "/var/log/audit", "name": "audit"})),
                ),
            ],
        },
        Case {
            name: "container ports: merge by containerPort",
            patch: pod_patch(
                json!({"containers": [{"name": "kube-apiserver", "ports": [{"containerPort": 6443, "name": "secure"}]}]}),
            ),
            expect: vec![
                (
                    c0("/ports/0"),
                    Some(json!({"name": "secure", "containerPort": 6443, "protocol": "TCP"})),
                ),
                (c0("/ports/1"), None),
            ],
        },
        Case {
            name: "container ports: add one by containerPort",
            patch: pod_patch(
                json!({"containers": [{"name": "kube-apiserver", "ports": [{"containerPort": 8080, "name": "metrics"}]}]}),
            ),
            expect: vec![
                (c0("/ports/0/name"), Some(json!("https"))),
                (c0("/ports/1"), Some(json!({"containerPort": 8080, "name": "metrics"}))),
            ],
        },
        Case {
            name: "Service ports: merge by port",
            patch: json!({
                "apiVersion": "v1", "kind": "Service", "metadata": {"name": "c1-apiserver"},
                "spec": {"ports": [{"port": 6443, "nodePort": 30443}], "type": "NodePort"}
            }),
            expect: vec![
                (at("/1/spec/type"), Some(json!("NodePort"))),
                (
                    at("/1/spec/ports/0"),
                    Some(
                        json!({"name": "https", "port": 6443, "targetPort": "https", "protocol": "TCP", "nodePort": 30443}),
                    ),
                ),
                (at("/1/spec/ports/1"), None),
            ],
        },
        Case {
            name: "args patch replaces the whole list",
            patch: pod_patch(json!({"containers": [{"name": "kube-apiserver", "args": ["--v=5"]}]})),
            expect: vec![(c0("/args"), Some(json!(["--v=5"])))],
        },
        Case {
            name: "command patch replaces the whole list",
            patch: pod_patch(json!({"containers": [{"name": "kube-apiserver", "command": ["/bin/sh", "-c"]}]})),
            expect: vec![(c0("/command"), Some(json!(["/bin/sh", "-c"])))],
        },
        Case {
            name: "null deletes a field",
            patch: sts_patch(json!({"podManagementPolicy": null})),
            expect: vec![
                (at("/0/spec/podManagementPolicy"), None),
                (at("/0/spec/serviceName"), Some(json!("c1-apiserver"))),
            ],
        },
        Case {
            name: "$patch: delete on a map deletes the map",
            patch: pod_patch(json!({"securityContext": {"$patch": "delete"}})),
            expect: vec![
                (at("/0/spec/template/spec/securityContext"), None),
                (
                    at("/0/spec/template/spec/containers/0/name"),
                    Some(json!("kube-apiserver")),
                ),
            ],
        },
        Case {
            name: "$patch: replace on a map replaces it wholesale",
            patch: pod_patch(json!({"securityContext": {"$patch": "replace", "runAsUser": 1000}})),
            expect: vec![(
                at("/0/spec/template/spec/securityContext"),
                Some(json!({"runAsUser": 1000})),
            )],
        },
        Case {
            name: "$patch: replace in a merged list replaces the list",
            patch: pod_patch(
                json!({"containers": [{"name": "kube-apiserver", "env": [{"$patch": "replace"}, {"name": "ONLY", "value": "1"}]}]}),
            ),
            expect: vec![(c0("/env"), Some(json!([{"name": "ONLY", "value": "1"}])))],
        },
        Case {
            name: "a scalar and a new map field are set, $patch: merge is the default",
            patch: sts_patch(json!({"replicas": 3, "updateStrategy": {"$patch": "merge", "type": "OnDelete"}})),
            expect: vec![
                (at("/0/spec/replicas"), Some(json!(3))),
                (at("/0/spec/updateStrategy"), Some(json!({"type": "OnDelete"}))),
            ],
        },
        Case {
            name: "an explicit matching namespace is accepted",
            patch: json!({
                "apiVersion": "apps/v1", "kind": "StatefulSet",
                "metadata": {"name": "c1-apiserver", "namespace": NS, "labels": {"team": "a"}}
            }),
            expect: vec![
                (at("/0/metadata/labels"), Some(json!({"team": "a"}))),
                (at("/0/metadata/namespace"), Some(json!(NS))),
            ],
        },
    ];
    for case in cases {
        let mut objects = rendered();
        apply_patches(&mut objects, std::slice::from_ref(&case.patch)).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        for (pointer, expected) in &case.expect {
            assert_eq!(
                objects.pointer(pointer).cloned(),
                expected.clone(),
                "{}: {pointer}",
                case.name
            );
        }
    }
}

trait Pointer {
    fn pointer(&self, pointer: &str) -> Option<&Value>;
}

impl Pointer for Vec<Value> {
    /// A JSON Pointer into the list of objects: `/0/spec/...`.
    fn pointer(&self, pointer: &str) -> Option<&Value> {
        let rest = pointer.strip_prefix('/')?;
        let (index, rest) = rest.split_once('/').unwrap_or((rest, ""));
        let object = self.get(index.parse::<usize>().ok()?)?;
        if rest.is_empty() {
            Some(object)
        } else {
            object.pointer(&format!("/{rest}"))
        }
    }
}

fn targeted(kind: &str, key: &str, body: Value) -> Value {
    json!({"target": {"kind": kind, "name": "c1-apiserver"}, key: body})
}

#[test]
fn json_patch_escapes_tilde_and_slash_in_keys() {
    let mut objects = rendered();
    let patch = targeted(
        "StatefulSet",
        "jsonPatch",
        json!([
            {"op": "test", "path": "/metadata/annotations/example.com~1a~0b", "value": "old"},
            {"op": "replace", "path": "/metadata/annotations/example.com~1a~0b", "value": "new"},
            {"op": "add", "path": "/metadata/annotations/x.io~1c~0d", "value": "added"}
        ]),
    );
    apply_patches(&mut objects, &[patch]).unwrap();
    let annotations = &objects[0]["metadata"]["annotations"];
    assert_eq!(annotations["example.com/a~b"], json!("new"));
    assert_eq!(annotations["x.io/c~d"], json!("added"));
    assert_eq!(annotations.as_object().unwrap().len(), 2);
}

#[test]
fn json_patch_appends_with_dash_to_an_existing_array() {
    let mut objects = rendered();
    let patch = targeted(
        "StatefulSet",
        "jsonPatch",
        json!([{"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "--profiling=false"}]),
    );
    apply_patches(&mut objects, &[patch]).unwrap();
    assert_eq!(
        objects.pointer(&format!("{C0}/args")),
        Some(&json!(["--secure-port=6443", "--v=2", "--profiling=false"]))
    );
}

#[test]
fn json_patch_adding_to_a_missing_array_is_an_error() {
    let mut objects = rendered();
    let before = objects.clone();
    let patch = targeted(
        "StatefulSet",
        "jsonPatch",
        json!([{"op": "add", "path": "/spec/template/spec/tolerations/-", "value": {"operator": "Exists"}}]),
    );
    let err = apply_patches(&mut objects, &[patch]).unwrap_err();
    assert!(
        matches!(&err, PatchError::JsonPatch { index: 0, target, .. } if target == "StatefulSet/c1-apiserver"),
        "{err:?}"
    );
    assert_eq!(err.reason(), "PatchFailed");
    assert!(err.to_string().contains("tolerations"), "{err}");
    assert_eq!(objects, before);
}

#[test]
fn json_patch_failed_test_operation_is_an_error_and_undoes_earlier_operations() {
    let mut objects = rendered();
    let before = objects.clone();
    let patch = targeted(
        "StatefulSet",
        "jsonPatch",
        json!([
            {"op": "replace", "path": "/spec/replicas", "value": 3},
            {"op": "test", "path": "/spec/serviceName", "value": "other"}
        ]),
    );
    let err = apply_patches(&mut objects, &[patch]).unwrap_err();
    assert!(matches!(err, PatchError::JsonPatch { index: 0, .. }), "{err:?}");
    assert_eq!(objects, before);
}

#[test]
fn merge_patch_null_removes_a_field_and_lists_are_replaced() {
    let mut objects = rendered();
    let patch = targeted(
        "StatefulSet",
        "mergePatch",
        json!({"spec": {"podManagementPolicy": null, "template": {"spec": {"volumes": [{"name": "only", "emptyDir": {}}]}}}}),
    );
    apply_patches(&mut objects, &[patch]).unwrap();
    assert_eq!(objects.pointer("/0/spec/podManagementPolicy"), None);
    assert_eq!(objects.pointer("/0/spec/serviceName"), Some(&json!("c1-apiserver")));
    assert_eq!(
        objects.pointer("/0/spec/template/spec/volumes"),
        Some(&json!([{"name": "only", "emptyDir": {}}]))
    );
}

#[test]
fn target_with_matching_api_version_group_is_patched() {
    for api_version in ["apps/v1", "apps/v1beta2"] {
        let mut objects = rendered();
        let patch = json!({
            "target": {"kind": "StatefulSet", "name": "c1-apiserver", "apiVersion": api_version},
            "mergePatch": {"spec": {"replicas": 3}}
        });
        apply_patches(&mut objects, &[patch]).unwrap();
        assert_eq!(objects.pointer("/0/spec/replicas"), Some(&json!(3)), "{api_version}");
    }
}

#[test]
fn missing_target_is_an_error_listing_the_rendered_objects() {
    let available = vec![
        "StatefulSet/c1-apiserver".to_string(),
        "Service/c1-apiserver".to_string(),
    ];
    let cases: Vec<(&str, Value, &str, &str, Option<&str>)> = vec![
        (
            "jsonPatch on an unknown kind",
            json!({"target": {"kind": "ConfigMap", "name": "c1-apiserver"}, "jsonPatch": []}),
            "ConfigMap",
            "c1-apiserver",
            None,
        ),
        (
            "mergePatch on an unknown name",
            json!({"target": {"kind": "StatefulSet", "name": "c1-etcd"}, "mergePatch": {}}),
            "StatefulSet",
            "c1-etcd",
            None,
        ),
        (
            "target in another API group",
            json!({"target": {"kind": "StatefulSet", "name": "c1-apiserver", "apiVersion": "example.com/v1"}, "mergePatch": {}}),
            "StatefulSet",
            "c1-apiserver",
            Some("example.com/v1"),
        ),
        (
            "strategic merge on an unknown object",
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "extra"}, "data": {"a": "b"}}),
            "ConfigMap",
            "extra",
            Some("v1"),
        ),
        (
            "strategic merge in the core group does not match apps",
            json!({"apiVersion": "v1", "kind": "StatefulSet", "metadata": {"name": "c1-apiserver"}}),
            "StatefulSet",
            "c1-apiserver",
            Some("v1"),
        ),
    ];
    for (name, patch, kind, object_name, api_version) in cases {
        let mut objects = rendered();
        let before = objects.clone();
        let err = apply_patches(&mut objects, &[patch]).unwrap_err();
        assert_eq!(
            err,
            PatchError::TargetNotFound {
                index: 0,
                kind: kind.to_string(),
                name: object_name.to_string(),
                api_version: api_version.map(str::to_string),
                available: available.clone(),
            },
            "{name}"
        );
        assert_eq!(err.reason(), "PatchTargetNotFound", "{name}");
        let text = err.to_string();
        assert!(
            text.contains("StatefulSet/c1-apiserver, Service/c1-apiserver"),
            "{name}: {text}"
        );
        assert_eq!(objects, before, "{name}");
    }
}

#[test]
fn changing_identity_is_an_error() {
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "strategic merge into another namespace",
            json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "c1-apiserver", "namespace": "kube-system"}}),
            "metadata.namespace",
        ),
        (
            "merge patch removing the namespace (cluster-scoped)",
            targeted("StatefulSet", "mergePatch", json!({"metadata": {"namespace": null}})),
            "metadata.namespace",
        ),
        (
            "json patch moving to another namespace",
            targeted(
                "Service",
                "jsonPatch",
                json!([{"op": "replace", "path": "/metadata/namespace", "value": "default"}]),
            ),
            "metadata.namespace",
        ),
        (
            "merge patch changing the kind",
            targeted("StatefulSet", "mergePatch", json!({"kind": "Deployment"})),
            "kind",
        ),
        (
            "json patch changing the kind",
            targeted(
                "Service",
                "jsonPatch",
                json!([{"op": "replace", "path": "/kind", "value": "ClusterRole"}]),
            ),
            "kind",
        ),
        (
            "json patch renaming",
            targeted(
                "StatefulSet",
                "jsonPatch",
                json!([{"op": "replace", "path": "/metadata/name", "value": "other"}]),
            ),
            "metadata.name",
        ),
        (
            "merge patch renaming",
            targeted("Service", "mergePatch", json!({"metadata": {"name": "other"}})),
            "metadata.name",
        ),
        (
            "strategic merge with another version of the group",
            json!({"apiVersion": "apps/v1beta2", "kind": "StatefulSet", "metadata": {"name": "c1-apiserver"}}),
            "apiVersion",
        ),
        (
            "json patch replacing the whole object",
            targeted(
                "Service",
                "jsonPatch",
                json!([{"op": "replace", "path": "", "value": {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "evil"}}}]),
            ),
            "kind",
        ),
    ];
    for (name, patch, field) in cases {
        let mut objects = rendered();
        let before = objects.clone();
        let err = apply_patches(
            &mut objects,
            &[
                json!({"mergePatch": {}, "target": {"kind": "Service", "name": "c1-apiserver"}}),
                patch,
            ],
        )
        .unwrap_err();
        assert!(
            matches!(&err, PatchError::ChangesIdentity { index: 1, field: f, .. } if *f == field),
            "{name}: {err:?}"
        );
        assert_eq!(err.reason(), "PatchChangesIdentity", "{name}");
        assert!(err.to_string().starts_with("patch 1: changes "), "{name}: {err}");
        assert_eq!(objects, before, "{name}");
    }
}

#[test]
fn invalid_patches_are_rejected() {
    let cases: Vec<(&str, Value, &str)> = vec![
        ("a string", json!("spec.replicas=3"), "not an object"),
        ("a list", json!([{"op": "add"}]), "not an object"),
        ("null", Value::Null, "not an object"),
        (
            "both jsonPatch and mergePatch",
            json!({"target": {"kind": "Service", "name": "c1-apiserver"}, "jsonPatch": [], "mergePatch": {}}),
            "both jsonPatch and mergePatch",
        ),
        (
            "target without kind",
            json!({"target": {"name": "c1-apiserver"}, "mergePatch": {}}),
            "target needs a non-empty kind",
        ),
        (
            "target without name",
            json!({"target": {"kind": "Service"}, "jsonPatch": []}),
            "target needs a non-empty name",
        ),
        (
            "target that is not an object",
            json!({"target": "Service/c1-apiserver", "jsonPatch": []}),
            "target is a string",
        ),
        (
            "target with an unknown key",
            json!({"target": {"kind": "Service", "name": "c1-apiserver", "labelSelector": "a=b"}, "jsonPatch": []}),
            "unknown key \"labelSelector\"",
        ),
        (
            "target with neither jsonPatch nor mergePatch",
            json!({"target": {"kind": "Service", "name": "c1-apiserver"}, "patch": {}}),
            "unknown key \"patch\"",
        ),
        (
            "target alone",
            json!({"target": {"kind": "Service", "name": "c1-apiserver"}}),
            "neither jsonPatch nor mergePatch",
        ),
        (
            "jsonPatch without target",
            json!({"jsonPatch": [{"op": "remove", "path": "/spec"}]}),
            "has jsonPatch but no target",
        ),
        (
            "jsonPatch that is not a list",
            json!({"target": {"kind": "Service", "name": "c1-apiserver"}, "jsonPatch": {"op": "remove"}}),
            "jsonPatch is an object",
        ),
        (
            "unknown JSON patch operation",
            json!({"target": {"kind": "Service", "name": "c1-apiserver"}, "jsonPatch": [{"op": "upsert", "path": "/spec", "value": 1}]}),
            "jsonPatch operation 0",
        ),
        (
            "mergePatch that is not an object",
            json!({"target": {"kind": "Service", "name": "c1-apiserver"}, "mergePatch": [1]}),
            "mergePatch is a list",
        ),
        (
            "partial object without metadata.name",
            json!({"apiVersion": "v1", "kind": "Service", "spec": {}}),
            "needs a non-empty metadata.name",
        ),
        (
            "partial object without apiVersion",
            json!({"kind": "Service", "metadata": {"name": "c1-apiserver"}}),
            "needs a non-empty apiVersion",
        ),
        (
            "target namespace of another namespace",
            json!({"target": {"kind": "Service", "name": "c1-apiserver", "namespace": "kube-system"}, "mergePatch": {}}),
            "target.namespace \"kube-system\"",
        ),
        (
            "unknown $patch directive",
            pod_patch(json!({"securityContext": {"$patch": "remove"}})),
            "not a strategic merge directive",
        ),
        (
            "unsupported $retainKeys directive",
            pod_patch(json!({"securityContext": {"$retainKeys": ["runAsUser"]}})),
            "$retainKeys is not supported",
        ),
        (
            "merged list element without its key",
            pod_patch(json!({"containers": [{"name": "kube-apiserver", "env": [{"value": "x"}]}]})),
            "element has no name",
        ),
        (
            "$patch: delete in a list replaced as a whole",
            pod_patch(json!({"tolerations": [{"key": "a", "$patch": "delete"}]})),
            "only meaningful in a list merged by key",
        ),
        (
            "top-level $patch: delete",
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "c1-apiserver"}, "$patch": "delete"}),
            "would delete the object",
        ),
    ];
    for (name, patch, needle) in cases {
        let mut objects = rendered();
        let before = objects.clone();
        let err = apply_patches(&mut objects, &[patch]).unwrap_err();
        assert!(
            matches!(err, PatchError::InvalidPatch { index: 0, .. }),
            "{name}: {err:?}"
        );
        assert_eq!(err.reason(), "InvalidPatch", "{name}");
        let text = err.to_string();
        assert!(text.starts_with("patch 0: "), "{name}: {text}");
        assert!(text.contains(needle), "{name}: {text:?} lacks {needle:?}");
        assert_eq!(objects, before, "{name}");
    }
}

#[test]
fn ambiguous_target_without_api_version_is_rejected() {
    let mut objects = rendered();
    objects.push(json!({
        "apiVersion": "example.com/v1", "kind": "StatefulSet",
        "metadata": {"name": "c1-apiserver", "namespace": NS}
    }));
    let patch =
        json!({"target": {"kind": "StatefulSet", "name": "c1-apiserver"}, "mergePatch": {"spec": {"replicas": 2}}});
    let err = apply_patches(&mut objects, std::slice::from_ref(&patch)).unwrap_err();
    assert!(matches!(err, PatchError::InvalidPatch { index: 0, .. }), "{err:?}");
    assert!(err.to_string().contains("give target.apiVersion"), "{err}");

    let chosen = json!({"target": {"kind": "StatefulSet", "name": "c1-apiserver", "apiVersion": "example.com/v1"}, "mergePatch": {"spec": {"replicas": 2}}});
    apply_patches(&mut objects, &[chosen]).unwrap();
    assert_eq!(objects.pointer("/2/spec/replicas"), Some(&json!(2)));
    assert_eq!(objects.pointer("/0/spec/replicas"), Some(&json!(1)));
}

#[test]
fn patches_apply_in_order_and_see_earlier_results() {
    let mut objects = rendered();
    let patches = [
        pod_patch(json!({"containers": [{"name": "proxy", "image": "envoy:1"}]})),
        targeted(
            "StatefulSet",
            "jsonPatch",
            json!([{"op": "replace", "path": "/spec/template/spec/containers/2/image", "value": "envoy:2"}]),
        ),
    ];
    apply_patches(&mut objects, &patches).unwrap();
    assert_eq!(
        objects.pointer("/0/spec/template/spec/containers/2/image"),
        Some(&json!("envoy:2"))
    );
}

#[test]
fn all_or_nothing_a_failing_patch_undoes_the_earlier_ones() {
    let mut objects = rendered();
    let before = objects.clone();
    let patches = [
        sts_patch(json!({"replicas": 3})),
        targeted("Service", "mergePatch", json!({"spec": {"type": "NodePort"}})),
        json!({"target": {"kind": "ConfigMap", "name": "missing"}, "mergePatch": {}}),
    ];
    let err = apply_patches(&mut objects, &patches).unwrap_err();
    assert_eq!(err.index(), Some(2));
    assert!(
        err.to_string().starts_with("patch 2: target ConfigMap/missing "),
        "{err}"
    );
    assert_eq!(objects, before);
    assert_eq!(objects.pointer("/0/spec/replicas"), Some(&json!(1)));

    // Without the failing patch, both changes land.
    apply_patches(&mut objects, &patches[..2]).unwrap();
    assert_eq!(objects.pointer("/0/spec/replicas"), Some(&json!(3)));
    assert_eq!(objects.pointer("/1/spec/type"), Some(&json!("NodePort")));
}

#[test]
fn error_display_names_the_patch_index_and_reason() {
    let cases: Vec<(PatchError, &str, &str)> = vec![
        (
            PatchError::InvalidPatch {
                index: 2,
                message: "is a string".into(),
            },
            "patch 2: is a string",
            "InvalidPatch",
        ),
        (
            PatchError::TargetNotFound {
                index: 3,
                kind: "ConfigMap".into(),
                name: "x".into(),
                api_version: Some("v1".into()),
                available: vec![],
            },
            "patch 3: target ConfigMap/x (apiVersion v1) is not among the rendered objects (rendered: none); a patch can only change an object the component renders",
            "PatchTargetNotFound",
        ),
        (
            PatchError::ChangesIdentity {
                index: 4,
                target: "Service/s".into(),
                field: "kind",
            },
            "patch 4: changes kind of Service/s; a patch may not change an object's apiVersion, kind, metadata.name or metadata.namespace",
            "PatchChangesIdentity",
        ),
        (
            PatchError::JsonPatch {
                index: 5,
                target: "Service/s".into(),
                message: "boom".into(),
            },
            "patch 5: JSON patch (RFC 6902) failed on Service/s: boom",
            "PatchFailed",
        ),
        (
            PatchError::InvalidExtraArg {
                flag: "--v".into(),
                message: "bad".into(),
            },
            "extraArgs \"--v\": bad",
            "InvalidExtraArgs",
        ),
    ];
    for (err, display, reason) in cases {
        assert_eq!(err.to_string(), display);
        assert_eq!(err.reason(), reason);
    }
}

#[test]
fn no_patches_leave_objects_alone() {
    let mut objects = rendered();
    apply_patches(&mut objects, &[]).unwrap();
    assert_eq!(objects, rendered());
}

// ---- extraArgs ----

fn workload(kind: &str, command: Value, args: Option<Value>) -> Value {
    let mut container = json!({"name": "main", "image": "x", "command": command});
    if let Some(args) = args {
        container["args"] = args;
    }
    json!({
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": "w", "namespace": NS},
        "spec": {"template": {"spec": {"containers": [
            container,
            {"name": "sidecar", "image": "y", "args": ["--v=1", "--foo=sidecar"]}
        ]}}}
    })
}

fn extra(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

#[test]
fn extra_args_table() {
    struct Case {
        name: &'static str,
        command: Value,
        args: Option<Value>,
        extra: BTreeMap<String, String>,
        command_after: Value,
        args_after: Option<Value>,
    }
    let cases = vec![
        Case {
            name: "replaces one flag in args in place",
            command: json!(["kube-apiserver"]),
            args: Some(json!(["--a=1", "--secure-port=6443", "--b=2"])),
            extra: extra(&[("secure-port", "7443")]),
            command_after: json!(["kube-apiserver"]),
            args_after: Some(json!(["--a=1", "--secure-port=7443", "--b=2"])),
        },
        Case {
            name: "replaces a flag in command in place, nothing appended",
            command: json!(["etcd", "--name=a", "--data-dir=/var/lib/etcd"]),
            args: Some(json!(["--v=2"])),
            extra: extra(&[("data-dir", "/data")]),
            command_after: json!(["etcd", "--name=a", "--data-dir=/data"]),
            args_after: Some(json!(["--v=2"])),
        },
        Case {
            name: "appends new flags to args in sorted key order",
            command: json!(["kcm"]),
            args: Some(json!(["--v=2"])),
            extra: extra(&[("v", "4"), ("zeta", "z"), ("controllers", "*,-tokencleaner")]),
            command_after: json!(["kcm"]),
            args_after: Some(json!(["--v=4", "--controllers=*,-tokencleaner", "--zeta=z"])),
        },
        Case {
            name: "key foo does not touch --foo-bar",
            command: json!(["x"]),
            args: Some(json!(["--foo-bar=1", "--foobar", "--foo-bar"])),
            extra: extra(&[("foo", "2")]),
            command_after: json!(["x"]),
            args_after: Some(json!(["--foo-bar=1", "--foobar", "--foo-bar", "--foo=2"])),
        },
        Case {
            name: "separate value form: --foo old becomes --foo=new",
            command: json!(["x"]),
            args: Some(json!(["--a=1", "--foo", "old", "--b=2"])),
            extra: extra(&[("foo", "new")]),
            command_after: json!(["x"]),
            args_after: Some(json!(["--a=1", "--foo=new", "--b=2"])),
        },
        Case {
            name: "bare --foo followed by another flag keeps that flag",
            command: json!(["x"]),
            args: Some(json!(["--foo", "--b=2", "-c"])),
            extra: extra(&[("foo", "new")]),
            command_after: json!(["x"]),
            args_after: Some(json!(["--foo=new", "--b=2", "-c"])),
        },
        Case {
            name: "bare --foo at the end",
            command: json!(["x", "--foo"]),
            args: Some(json!(["--b=2"])),
            extra: extra(&[("foo", "1")]),
            command_after: json!(["x", "--foo=1"]),
            args_after: Some(json!(["--b=2"])),
        },
        Case {
            name: "every occurrence is replaced, in command and args",
            command: json!(["x", "--foo=a"]),
            args: Some(json!(["--foo=b", "--c"])),
            extra: extra(&[("foo", "z")]),
            command_after: json!(["x", "--foo=z"]),
            args_after: Some(json!(["--foo=z", "--c"])),
        },
        Case {
            name: "empty value gives --foo=",
            command: json!(["x"]),
            args: Some(json!(["--foo=1"])),
            extra: extra(&[("foo", ""), ("bar", "")]),
            command_after: json!(["x"]),
            args_after: Some(json!(["--foo=", "--bar="])),
        },
        Case {
            name: "args is created when missing",
            command: json!(["x"]),
            args: None,
            extra: extra(&[("v", "3")]),
            command_after: json!(["x"]),
            args_after: Some(json!(["--v=3"])),
        },
        Case {
            name: "args null is treated as missing",
            command: json!(["x"]),
            args: Some(Value::Null),
            extra: extra(&[("v", "3")]),
            command_after: json!(["x"]),
            args_after: Some(json!(["--v=3"])),
        },
        Case {
            name: "a value with = and spaces is kept verbatim",
            command: json!(["x"]),
            args: Some(json!(["--feature-gates=A=true"])),
            extra: extra(&[("feature-gates", "A=false,B=true")]),
            command_after: json!(["x"]),
            args_after: Some(json!(["--feature-gates=A=false,B=true"])),
        },
    ];
    for kind in ["StatefulSet", "Deployment", "DaemonSet", "Job"] {
        for case in &cases {
            let mut objects = vec![
                workload(kind, case.command.clone(), case.args.clone()),
                json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "w", "namespace": NS}, "spec": {"ports": [{"port": 1}]}}),
            ];
            let service = objects[1].clone();
            apply_extra_args(&mut objects, &case.extra).unwrap_or_else(|e| panic!("{kind} {}: {e}", case.name));
            let main = &objects[0]["spec"]["template"]["spec"]["containers"][0];
            assert_eq!(main["command"], case.command_after, "{kind} {}", case.name);
            assert_eq!(main.get("args"), case.args_after.as_ref(), "{kind} {}", case.name);
            let sidecar = &objects[0]["spec"]["template"]["spec"]["containers"][1];
            assert_eq!(
                sidecar["args"],
                json!(["--v=1", "--foo=sidecar"]),
                "{kind} {}",
                case.name
            );
            assert_eq!(objects[1], service, "{kind} {}", case.name);
        }
    }
}

#[test]
fn extra_args_apply_to_the_rendered_apiserver() {
    let mut objects = rendered();
    apply_extra_args(&mut objects, &extra(&[("v", "5"), ("profiling", "false")])).unwrap();
    assert_eq!(
        objects.pointer(&format!("{C0}/args")),
        Some(&json!(["--secure-port=6443", "--v=5", "--profiling=false"]))
    );
    assert_eq!(
        objects.pointer(&format!("{C0}/command")),
        Some(&json!(["kube-apiserver"]))
    );
    assert_eq!(objects.pointer("/0/spec/template/spec/containers/1/args"), None);
    assert_eq!(objects[1], rendered()[1]);
}

#[test]
fn invalid_extra_arg_keys_are_rejected() {
    for key in ["", "-v", "--v", "a=b", "a b", "a\tb", "v\n"] {
        let mut objects = rendered();
        let err = apply_extra_args(&mut objects, &extra(&[("ok", "1"), (key, "1")])).unwrap_err();
        assert!(
            matches!(&err, PatchError::InvalidExtraArg { flag, .. } if flag == key),
            "{key:?}: {err:?}"
        );
        assert_eq!(err.reason(), "InvalidExtraArgs");
        assert_eq!(err.index(), None);
        assert!(err.to_string().contains("without leading dashes"), "{err}");
        assert_eq!(objects, rendered(), "{key:?}");
    }
}

#[test]
fn extra_args_on_a_container_whose_args_is_not_a_list_is_an_error_and_changes_nothing() {
    let mut objects = vec![
        workload("Deployment", json!(["x", "--v=1"]), None),
        workload("StatefulSet", json!(["x"]), Some(json!("--v=1"))),
    ];
    let before = objects.clone();
    let err = apply_extra_args(&mut objects, &extra(&[("v", "2")])).unwrap_err();
    assert!(
        matches!(&err, PatchError::InvalidExtraArg { flag, .. } if flag == "v"),
        "{err:?}"
    );
    assert!(err.to_string().contains("StatefulSet/w"), "{err}");
    assert_eq!(objects, before);
}

#[test]
fn empty_extra_args_change_nothing() {
    let mut objects = rendered();
    apply_extra_args(&mut objects, &BTreeMap::new()).unwrap();
    assert_eq!(objects, rendered());
}
