use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::Value;

use super::*;

fn registry() -> ChannelRegistry {
    ChannelRegistry::load(&[]).expect("built-in channels load")
}

fn cluster() -> ClusterSettings {
    ClusterSettings {
        name: "demo".into(),
        namespace: "tenant-a".into(),
        kubernetes_version: Some("1.36".into()),
        channel: None,
        image_repository: DEFAULT_IMAGE_REPOSITORY.into(),
        service_cidr: "10.96.0.0/12".into(),
        dns_domain: "cluster.local".into(),
        super_dns_domain: "cluster.local".into(),
    }
}

fn owner(kind: ComponentKind) -> OwnerReference {
    OwnerReference {
        api_version: "controlplane.cluster.x-k8s.io/v1beta1".into(),
        kind: kind.resource_kind().into(),
        name: "demo".into(),
        uid: "uid-1".into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn plan_of(kind: ComponentKind, spec: &ComponentSpec, upstream: &Upstream) -> Result<Plan, PlanError> {
    plan(
        &registry(),
        &cluster(),
        &ComponentRequest {
            kind,
            resource_name: "demo",
            spec,
            etcd_storage: None,
            owner: owner(kind),
            running: Running::default(),
        },
        upstream,
    )
}

fn three_endpoints() -> Upstream {
    Upstream {
        etcd_endpoints: etcd_members("demo", "tenant-a", 3)
            .into_iter()
            .map(|m| m.client_url)
            .collect(),
    }
}

fn find<'a>(plan: &'a Plan, kind: &str) -> &'a Value {
    plan.objects
        .iter()
        .find(|o| o["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} planned"))
}

fn args(sts: &Value) -> Vec<String> {
    sts["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

fn flag(sts: &Value, name: &str) -> Option<String> {
    let prefix = format!("--{name}=");
    args(sts)
        .iter()
        .find_map(|a| a.strip_prefix(&prefix).map(str::to_string))
}

#[test]
fn etcd_initial_cluster_lists_every_member_with_its_peer_url() {
    let spec = ComponentSpec {
        replicas: Some(3),
        ..Default::default()
    };
    let p = plan_of(ComponentKind::Etcd, &spec, &Upstream::default()).unwrap();
    let sts = find(&p, "StatefulSet");
    let initial = flag(sts, "initial-cluster").expect("--initial-cluster");
    let mut members: Vec<&str> = initial.split(',').collect();
    members.sort();
    assert_eq!(
        members,
        vec![
            "demo-etcd-0=https://demo-etcd-0.demo-etcd.tenant-a.svc:2380",
            "demo-etcd-1=https://demo-etcd-1.demo-etcd.tenant-a.svc:2380",
            "demo-etcd-2=https://demo-etcd-2.demo-etcd.tenant-a.svc:2380",
        ]
    );
    assert_eq!(p.etcd_endpoints.len(), 3);
    assert_eq!(sts["spec"]["replicas"], 3);
}

#[test]
fn etcd_statefulset_is_parallel_with_claims_and_probes_on_the_pod() {
    let p = plan_of(ComponentKind::Etcd, &ComponentSpec::default(), &Upstream::default()).unwrap();
    let sts = find(&p, "StatefulSet");
    assert_eq!(sts["spec"]["podManagementPolicy"], "Parallel");
    assert_eq!(sts["spec"]["serviceName"], "demo-etcd");
    assert_eq!(sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"], "data");
    assert_eq!(
        sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"],
        "1Gi"
    );
    let container = &sts["spec"]["template"]["spec"]["containers"][0];
    for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
        assert!(container[probe]["httpGet"].is_object(), "{probe} missing");
        assert!(
            container[probe]["httpGet"].get("host").is_none(),
            "{probe} must dial the pod itself"
        );
    }
    assert_eq!(container["image"], format!("registry.k8s.io/etcd:{}-0", p.version));
    let svc = find(&p, "Service");
    assert_eq!(svc["spec"]["clusterIP"], "None");
    assert_eq!(svc["spec"]["publishNotReadyAddresses"], true);
    let ports: Vec<(i64, &str)> = svc["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["port"].as_i64().unwrap(), p["name"].as_str().unwrap()))
        .collect();
    assert_eq!(ports, vec![(2379, "client"), (2380, "peer")]);
}

#[test]
fn ephemeral_etcd_uses_empty_dir_and_no_claims() {
    let storage = EtcdStorage {
        ephemeral: true,
        ..Default::default()
    };
    let spec = ComponentSpec::default();
    let p = plan(
        &registry(),
        &cluster(),
        &ComponentRequest {
            kind: ComponentKind::Etcd,
            resource_name: "demo",
            spec: &spec,
            etcd_storage: Some(&storage),
            owner: owner(ComponentKind::Etcd),
            running: Running::default(),
        },
        &Upstream::default(),
    )
    .unwrap();
    let sts = find(&p, "StatefulSet");
    assert!(sts["spec"].get("volumeClaimTemplates").is_none());
    let volumes = sts["spec"]["template"]["spec"]["volumes"].as_array().unwrap();
    assert!(volumes.iter().any(|v| v["name"] == "data" && v["emptyDir"].is_object()));
}

#[test]
fn apiserver_lists_every_etcd_member_and_has_a_cluster_ip_service() {
    let p = plan_of(ComponentKind::ApiServer, &ComponentSpec::default(), &three_endpoints()).unwrap();
    let sts = find(&p, "StatefulSet");
    let servers = flag(sts, "etcd-servers").unwrap();
    assert_eq!(servers.split(',').count(), 3);
    for i in 0..3 {
        assert!(
            servers.contains(&format!("https://demo-etcd-{i}.demo-etcd.tenant-a.svc:2379")),
            "{servers}"
        );
    }
    assert_eq!(flag(sts, "service-cluster-ip-range").as_deref(), Some("10.96.0.0/12"));
    assert_eq!(
        flag(sts, "service-account-issuer").as_deref(),
        Some("https://kubernetes.default.svc.cluster.local")
    );
    let svc = find(&p, "Service");
    assert_eq!(svc["metadata"]["name"], "demo-apiserver");
    assert_eq!(svc["spec"]["type"], "ClusterIP");
    let container = &sts["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["image"],
        format!("registry.k8s.io/kube-apiserver:v{}", p.version)
    );
    assert!(container["readinessProbe"]["httpGet"].get("host").is_none());
    // The CA secrets are mounted without their private keys.
    let volumes = sts["spec"]["template"]["spec"]["volumes"].as_array().unwrap();
    let ca = volumes.iter().find(|v| v["secret"]["secretName"] == "demo-ca").unwrap();
    // 0440: owner and group may read the keys; nobody may write or execute them.
    for v in volumes.iter().filter(|v| v["secret"].is_object()) {
        assert_eq!(v["secret"]["defaultMode"], serde_json::json!(0o440), "{}", v["name"]);
    }
    assert_eq!(
        ca["secret"]["items"],
        serde_json::json!([{"key": "tls.crt", "path": "tls.crt"}])
    );
}

#[test]
fn apiserver_waits_for_etcd_endpoints() {
    let err = plan_of(
        ComponentKind::ApiServer,
        &ComponentSpec::default(),
        &Upstream::default(),
    )
    .unwrap_err();
    assert_eq!(err.reason(), "WaitingForEtcd");
}

#[test]
fn controller_manager_uses_its_own_identity_the_ca_for_signing_and_the_same_service_cidr() {
    let api = plan_of(ComponentKind::ApiServer, &ComponentSpec::default(), &three_endpoints()).unwrap();
    let one = plan_of(
        ComponentKind::ControllerManager,
        &ComponentSpec::default(),
        &Upstream::default(),
    )
    .unwrap();
    let sts = find(&one, "StatefulSet");
    assert_eq!(
        flag(sts, "kubeconfig").as_deref(),
        Some("/etc/kubernetes/controller-manager/kubeconfig")
    );
    let volumes = sts["spec"]["template"]["spec"]["volumes"].as_array().unwrap();
    let kubeconfig = volumes.iter().find(|v| v["name"] == "kubeconfig").unwrap();
    assert_eq!(kubeconfig["secret"]["secretName"], "demo-controller-manager-kubeconfig");
    // CSRs are signed with the cluster CA's signing pair, which capn copies into the
    // controller-manager's kubeconfig Secret (the signer accepts a single certificate; the
    // CA's own tls.crt holds two during a rotation). The CA volume carries no key.
    assert_eq!(
        flag(sts, "cluster-signing-cert-file").as_deref(),
        Some("/etc/kubernetes/controller-manager/ca-signing.crt")
    );
    assert_eq!(
        flag(sts, "cluster-signing-key-file").as_deref(),
        Some("/etc/kubernetes/controller-manager/ca-signing.key")
    );
    let items: Vec<&str> = kubeconfig["secret"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["key"].as_str().unwrap())
        .collect();
    assert_eq!(items, ["value", "ca-signing.crt", "ca-signing.key"]);
    let ca_volume = volumes.iter().find(|v| v["secret"]["secretName"] == "demo-ca").unwrap();
    assert_eq!(
        ca_volume["secret"]["items"],
        serde_json::json!([{"key": "tls.crt", "path": "tls.crt"}])
    );
    assert_eq!(
        flag(sts, "service-cluster-ip-range"),
        flag(find(&api, "StatefulSet"), "service-cluster-ip-range"),
        "one service CIDR for apiserver and controller-manager"
    );
    assert_eq!(flag(sts, "leader-elect").as_deref(), Some("false"));
    let three = plan_of(
        ComponentKind::ControllerManager,
        &ComponentSpec {
            replicas: Some(3),
            ..Default::default()
        },
        &Upstream::default(),
    )
    .unwrap();
    assert_eq!(
        flag(find(&three, "StatefulSet"), "leader-elect").as_deref(),
        Some("true")
    );
}

#[test]
fn extra_args_resources_and_replicas_reach_the_workload() {
    let spec: ComponentSpec = serde_json::from_value(serde_json::json!({
        "replicas": 2,
        "extraArgs": {"authorization-mode": "RBAC", "v": "4"},
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}},
    }))
    .unwrap();
    let p = plan_of(ComponentKind::ApiServer, &spec, &three_endpoints()).unwrap();
    let sts = find(&p, "StatefulSet");
    assert_eq!(sts["spec"]["replicas"], 2);
    assert_eq!(flag(sts, "authorization-mode").as_deref(), Some("RBAC"));
    assert_eq!(
        args(sts)
            .iter()
            .filter(|a| a.starts_with("--authorization-mode"))
            .count(),
        1
    );
    assert_eq!(flag(sts, "v").as_deref(), Some("4"));
    assert_eq!(
        sts["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"],
        "250m"
    );
}

#[test]
fn every_object_is_labelled_owned_and_in_the_cluster_namespace() {
    for (kind, upstream) in [
        (ComponentKind::Etcd, Upstream::default()),
        (ComponentKind::ApiServer, three_endpoints()),
        (ComponentKind::ControllerManager, Upstream::default()),
    ] {
        let p = plan_of(kind, &ComponentSpec::default(), &upstream).unwrap();
        assert!(!p.objects.is_empty());
        for o in &p.objects {
            assert_eq!(o["metadata"]["namespace"], "tenant-a");
            let labels: BTreeMap<String, String> = serde_json::from_value(o["metadata"]["labels"].clone()).unwrap();
            for (k, v) in standard_labels(kind, "demo") {
                assert_eq!(labels.get(&k), Some(&v), "{kind}: {} lacks {k}", o["kind"]);
            }
            assert_eq!(o["metadata"]["ownerReferences"][0]["uid"], "uid-1");
            assert_eq!(o["metadata"]["ownerReferences"][0]["controller"], true);
        }
    }
}

#[test]
fn unknown_version_and_channel_are_reported_with_what_exists() {
    let bad_version = ComponentSpec {
        version: Some("1.99".into()),
        ..Default::default()
    };
    let err = plan_of(ComponentKind::ApiServer, &bad_version, &three_endpoints()).unwrap_err();
    assert_eq!(err.reason(), "UnknownVersion");
    assert!(err.to_string().contains("1.36.3"), "{err}");
    let bad_channel = ComponentSpec {
        channel: Some("edge".into()),
        ..Default::default()
    };
    let err = plan_of(ComponentKind::Etcd, &bad_channel, &Upstream::default()).unwrap_err();
    assert_eq!(err.reason(), "UnknownChannel");
    assert!(err.to_string().contains("stable"), "{err}");
}

#[test]
fn planning_is_deterministic() {
    let a = plan_of(ComponentKind::ApiServer, &ComponentSpec::default(), &three_endpoints()).unwrap();
    let b = plan_of(ComponentKind::ApiServer, &ComponentSpec::default(), &three_endpoints()).unwrap();
    assert_eq!(a, b);
}

/// Golden files: a template change shows up as a reviewable diff in
/// `src/plan/testdata/`. Regenerate with `UPDATE_GOLDEN=1 cargo test --lib golden`.
#[test]
fn golden_rendered_manifests() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/plan/testdata");
    for (kind, upstream) in [
        (ComponentKind::Etcd, Upstream::default()),
        (ComponentKind::ApiServer, three_endpoints()),
        (ComponentKind::ControllerManager, Upstream::default()),
    ] {
        let p = plan_of(kind, &ComponentSpec::default(), &upstream).unwrap();
        let rendered = serde_saphyr::to_string_multiple(&p.objects).unwrap();
        let path = dir.join(format!("{kind}.yaml"));
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &rendered).unwrap();
        }
        let golden = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}; run UPDATE_GOLDEN=1 cargo test --lib golden", path.display()));
        assert_eq!(
            rendered,
            golden,
            "{kind} differs from {}; review and UPDATE_GOLDEN=1",
            path.display()
        );
    }
}
