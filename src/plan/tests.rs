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
        size: None,
        image_repository: DEFAULT_IMAGE_REPOSITORY.into(),
        service_cidr: "10.96.0.0/12".into(),
        dns_domain: "cluster.local".into(),
        super_dns_domain: "cluster.local".into(),
        network_policy: Default::default(),
        kms_endpoints: Vec::new(),
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

fn request(kind: ComponentKind, spec: &ComponentSpec) -> ComponentRequest<'_> {
    ComponentRequest {
        kind,
        resource_name: "demo",
        spec,
        etcd_storage: None,
        etcd_restore: None,
        owner: owner(kind),
        running: Running::default(),
        audit: None,
        authentication: None,
        authorization: None,
        referenced: Default::default(),
    }
}

fn plan_of(kind: ComponentKind, spec: &ComponentSpec, upstream: &Upstream) -> Result<Plan, PlanError> {
    plan(&registry(), &cluster(), &request(kind, spec), upstream)
}

fn three_endpoints() -> Upstream {
    Upstream {
        etcd_endpoints: etcd_members("demo", "tenant-a", 3)
            .into_iter()
            .map(|m| m.client_url)
            .collect(),
        ..Upstream::default()
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
    // The member list is not a flag (a flag change would roll every member) but the
    // environment, from the membership ConfigMap.
    assert_eq!(flag(sts, "initial-cluster"), None);
    assert_eq!(flag(sts, "initial-cluster-state"), None);
    let env = &sts["spec"]["template"]["spec"]["containers"][0]["env"];
    for (var, key) in [
        ("ETCD_INITIAL_CLUSTER", "initial-cluster"),
        ("ETCD_INITIAL_CLUSTER_STATE", "initial-cluster-state"),
    ] {
        let entry = env
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == var)
            .unwrap_or_else(|| panic!("{var} in {env}"));
        assert_eq!(entry["valueFrom"]["configMapKeyRef"]["name"], "demo-etcd-membership");
        assert_eq!(entry["valueFrom"]["configMapKeyRef"]["key"], key);
    }
    let membership = p
        .objects
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == "demo-etcd-membership")
        .expect("the membership ConfigMap");
    assert_eq!(membership["data"]["initial-cluster-state"], "new");
    let initial = membership["data"]["initial-cluster"].as_str().unwrap();
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
fn a_running_etcd_renders_the_membership_capn_read_not_the_spec() {
    let spec = ComponentSpec {
        replicas: Some(5),
        ..Default::default()
    };
    // Three members, the fourth added as a learner that has not started: the StatefulSet
    // grows to four and a starting member joins (`existing`) the four listed.
    let members = etcd_members("demo", "tenant-a", 4);
    let upstream = Upstream {
        etcd_membership: Some(EtcdMembership {
            statefulset_replicas: 4,
            members: members.clone(),
            initial_cluster_state: InitialClusterState::Existing,
        }),
        ..Upstream::default()
    };
    let p = plan_of(ComponentKind::Etcd, &spec, &upstream).unwrap();
    assert_eq!(find(&p, "StatefulSet")["spec"]["replicas"], 4);
    assert_eq!(p.replicas, 4);
    assert_eq!(p.etcd_endpoints.len(), 4);
    let membership = p
        .objects
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == "demo-etcd-membership")
        .unwrap();
    assert_eq!(membership["data"]["initial-cluster-state"], "existing");
    let want: Vec<String> = members.iter().map(|m| format!("{}={}", m.name, m.peer_url)).collect();
    assert_eq!(membership["data"]["initial-cluster"], want.join(","));
    // The PodDisruptionBudget follows the members that exist: 4 → 1 may be unavailable.
    assert_eq!(find(&p, "PodDisruptionBudget")["spec"]["maxUnavailable"], 1);
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
            etcd_restore: None,
            owner: owner(ComponentKind::Etcd),
            running: Running::default(),
            audit: None,
            authentication: None,
            authorization: None,
            referenced: Default::default(),
        },
        &Upstream::default(),
    )
    .unwrap();
    let sts = find(&p, "StatefulSet");
    assert!(sts["spec"].get("volumeClaimTemplates").is_none());
    let volumes = sts["spec"]["template"]["spec"]["volumes"].as_array().unwrap();
    assert!(volumes.iter().any(|v| v["name"] == "data" && v["emptyDir"].is_object()));
}

fn etcd_plan_with(version: &str, storage: &EtcdStorage) -> Result<Plan, PlanError> {
    let spec = ComponentSpec {
        version: Some(version.into()),
        ..Default::default()
    };
    plan(
        &registry(),
        &cluster(),
        &ComponentRequest {
            etcd_storage: Some(storage),
            ..request(ComponentKind::Etcd, &spec)
        },
        &Upstream::default(),
    )
}

#[test]
fn etcd_quota_is_rendered_from_the_spec_or_sized_from_the_volume_in_every_etcd_release() {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    for version in ["3.6.8", "3.7.0"] {
        let default = etcd_plan_with(version, &EtcdStorage::default()).unwrap();
        let sts = find(&default, "StatefulSet");
        // The default 1Gi volume: (1Gi - 384MB) / 2.
        assert_eq!(
            flag(sts, "quota-backend-bytes").as_deref(),
            Some("344870912"),
            "{version}"
        );
        let large = EtcdStorage {
            size: Some(Quantity("20Gi".into())),
            ..Default::default()
        };
        let sts_large = etcd_plan_with(version, &large).unwrap();
        assert_eq!(
            flag(find(&sts_large, "StatefulSet"), "quota-backend-bytes").as_deref(),
            Some("2147483648"),
            "{version}: etcd's own 2 GiB default on a large volume"
        );
        let set = EtcdStorage {
            quota_backend_bytes: Some(Quantity("8Mi".into())),
            ..Default::default()
        };
        let sts_set = etcd_plan_with(version, &set).unwrap();
        assert_eq!(
            flag(find(&sts_set, "StatefulSet"), "quota-backend-bytes").as_deref(),
            Some("8388608"),
            "{version}"
        );
    }
}

#[test]
fn etcd_compacts_its_history_periodically_keeping_one_hour_in_every_etcd_release() {
    for version in ["3.6.8", "3.7.0"] {
        let p = etcd_plan_with(version, &EtcdStorage::default()).unwrap();
        let sts = find(&p, "StatefulSet");
        assert_eq!(
            flag(sts, "auto-compaction-mode").as_deref(),
            Some("periodic"),
            "{version}"
        );
        assert_eq!(
            flag(sts, "auto-compaction-retention").as_deref(),
            Some("1h"),
            "{version}"
        );
    }
}

#[test]
fn etcd_liveness_and_start_ignore_alarms_so_nospace_does_not_restart_members() {
    for version in ["3.6.8", "3.7.0"] {
        let p = etcd_plan_with(version, &EtcdStorage::default()).unwrap();
        let container = &find(&p, "StatefulSet")["spec"]["template"]["spec"]["containers"][0];
        for (probe, path) in [
            ("startupProbe", "/livez"),
            ("livenessProbe", "/livez"),
            ("readinessProbe", "/readyz"),
        ] {
            assert_eq!(container[probe]["httpGet"]["path"], path, "{version} {probe}");
        }
    }
}

#[test]
fn etcd_quota_above_its_volume_is_refused_naming_the_field() {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let storage = EtcdStorage {
        size: Some(Quantity("1Gi".into())),
        quota_backend_bytes: Some(Quantity("2Gi".into())),
        ..Default::default()
    };
    let e = etcd_plan_with("3.6.8", &storage).unwrap_err();
    assert_eq!(e.reason(), "InvalidEtcdQuota");
    assert!(
        e.to_string().contains(
            "NestedEtcd demo: spec.storage.quotaBackendBytes: Invalid value: \"2Gi\": must not exceed spec.storage.size"
        ),
        "{e}"
    );
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
/// Every release of the stable channel has its files (`<kind>.yaml` for the default
/// release, `<kind>-<version>.yaml` for the others), so that a change meant to leave what
/// renders alone (and every running tenant unrolled) proves it for each release.
#[test]
fn golden_rendered_manifests() {
    let channels = registry();
    let stable = channels.get("stable").unwrap();
    for (kind, upstream) in [
        (ComponentKind::Etcd, Upstream::default()),
        (ComponentKind::ApiServer, three_endpoints()),
        (ComponentKind::ControllerManager, Upstream::default()),
    ] {
        let default = stable.resolve(kind, None, None).unwrap();
        for version in stable.versions(kind) {
            let mut c = cluster();
            let mut spec = ComponentSpec::default();
            if *version != default {
                // etcd follows the Kubernetes minor; pin one that allows every etcd release.
                if version.major != 3 {
                    c.kubernetes_version = Some(version.to_string());
                }
                spec.version = Some(version.to_string());
            }
            let p = plan(&channels, &c, &request(kind, &spec), &upstream).unwrap();
            let file = if *version == default {
                format!("{kind}.yaml")
            } else {
                format!("{kind}-{version}.yaml")
            };
            assert_golden(&file, &p.objects);
        }
    }
}

/// Compares `objects` with `src/plan/testdata/<file>` (rewritten under `UPDATE_GOLDEN`).
fn assert_golden(file: &str, objects: &[Value]) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/plan/testdata");
    let rendered = serde_saphyr::to_string_multiple(objects).unwrap();
    let path = dir.join(file);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(&path, &rendered).unwrap();
    }
    let golden = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; run UPDATE_GOLDEN=1 cargo test --lib golden", path.display()));
    assert_eq!(
        rendered,
        golden,
        "{file} differs from {}; review and UPDATE_GOLDEN=1",
        path.display()
    );
}

// Issue 14: spread, disruption budgets, priority, resources and network isolation, as
// rendered by the stable channel.

fn plan_in(cluster: &ClusterSettings, kind: ComponentKind, spec: &ComponentSpec) -> Plan {
    let upstream = if kind == ComponentKind::ApiServer {
        three_endpoints()
    } else {
        Upstream::default()
    };
    plan(&registry(), cluster, &request(kind, spec), &upstream).unwrap_or_else(|e| panic!("{kind}: {e}"))
}

fn replicas(n: i32) -> ComponentSpec {
    ComponentSpec {
        replicas: Some(n),
        ..Default::default()
    }
}

fn pod_spec(plan: &Plan) -> &Value {
    &find(plan, "StatefulSet")["spec"]["template"]["spec"]
}

fn pod_labels(plan: &Plan) -> &Value {
    &find(plan, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
}

/// The ingress rule of a NetworkPolicy that opens `port`.
fn rule_for(policy: &Value, port: i64) -> Option<&Value> {
    policy["spec"]["ingress"].as_array()?.iter().find(|r| {
        r["ports"]
            .as_array()
            .is_some_and(|ps| ps.iter().any(|p| p["port"] == port))
    })
}

const KINDS: [ComponentKind; 3] = [
    ComponentKind::Etcd,
    ComponentKind::ApiServer,
    ComponentKind::ControllerManager,
];

#[test]
fn etcd_budget_for_one_to_seven_members_keeps_quorum_and_selects_the_members() {
    // N − (⌊N/2⌋ + 1), written out: 1 and 2 members allow no disruption at all.
    let expected = [(1, 0), (2, 0), (3, 1), (4, 1), (5, 2), (6, 2), (7, 3)];
    for (n, want) in expected {
        let p = plan_in(&cluster(), ComponentKind::Etcd, &replicas(n));
        let pdb = find(&p, "PodDisruptionBudget");
        assert_eq!(pdb["apiVersion"], "policy/v1");
        assert_eq!(pdb["metadata"]["name"], "demo-etcd");
        assert_eq!(pdb["spec"]["maxUnavailable"], want, "etcd with {n} members");
        assert!(pdb["spec"].get("minAvailable").is_none());
        assert_eq!(&pdb["spec"]["selector"]["matchLabels"], pod_labels(&p));
    }
}

#[test]
fn apiserver_and_controller_manager_budgets_keep_one_replica_when_there_are_several() {
    let expected = [(1, 1), (2, 1), (3, 2), (4, 3), (5, 4), (6, 5), (7, 6)];
    for kind in [ComponentKind::ApiServer, ComponentKind::ControllerManager] {
        for (n, want) in expected {
            let p = plan_in(&cluster(), kind, &replicas(n));
            let pdb = find(&p, "PodDisruptionBudget");
            assert_eq!(pdb["spec"]["maxUnavailable"], want, "{kind} with {n} replicas");
            assert_eq!(&pdb["spec"]["selector"]["matchLabels"], pod_labels(&p));
        }
    }
}

#[test]
fn every_component_prefers_distinct_nodes_and_zones_by_default() {
    for kind in KINDS {
        let p = plan_in(&cluster(), kind, &replicas(3));
        let spec = pod_spec(&p);
        let constraints = spec["topologySpreadConstraints"].as_array().expect("spread");
        let by_key = |key: &str| {
            constraints
                .iter()
                .find(|c| c["topologyKey"] == key)
                .unwrap_or_else(|| panic!("{kind}: no spread over {key}"))
        };
        for key in ["kubernetes.io/hostname", "topology.kubernetes.io/zone"] {
            let c = by_key(key);
            assert_eq!(c["whenUnsatisfiable"], "ScheduleAnyway", "{kind} {key}");
            assert_eq!(c["maxSkew"], 1, "{kind} {key}");
            assert_eq!(&c["labelSelector"]["matchLabels"], pod_labels(&p), "{kind} {key}");
        }
        let anti = &spec["affinity"]["podAntiAffinity"];
        assert!(
            anti.get("requiredDuringSchedulingIgnoredDuringExecution").is_none(),
            "{kind}"
        );
        let preferred = &anti["preferredDuringSchedulingIgnoredDuringExecution"][0];
        assert_eq!(preferred["podAffinityTerm"]["topologyKey"], "kubernetes.io/hostname");
        assert_eq!(
            &preferred["podAffinityTerm"]["labelSelector"]["matchLabels"],
            pod_labels(&p)
        );
        // The same rules at one replica: a replica change must not roll the pods.
        let one = plan_in(&cluster(), kind, &replicas(1));
        assert_eq!(
            pod_spec(&one)["topologySpreadConstraints"],
            spec["topologySpreadConstraints"]
        );
        assert_eq!(pod_spec(&one)["affinity"], spec["affinity"]);
    }
}

#[test]
fn do_not_schedule_makes_node_spread_and_anti_affinity_required_but_never_the_zone_spread() {
    for kind in KINDS {
        let spec: ComponentSpec = serde_json::from_value(serde_json::json!({
            "replicas": 3, "topologySpread": {"whenUnsatisfiable": "DoNotSchedule"}
        }))
        .unwrap();
        let p = plan_in(&cluster(), kind, &spec);
        let pod = pod_spec(&p);
        let when = |key: &str| {
            pod["topologySpreadConstraints"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["topologyKey"] == key)
                .map(|c| c["whenUnsatisfiable"].clone())
        };
        assert_eq!(when("kubernetes.io/hostname"), Some("DoNotSchedule".into()), "{kind}");
        // A hard zone rule would refuse every node without a zone label.
        assert_eq!(
            when("topology.kubernetes.io/zone"),
            Some("ScheduleAnyway".into()),
            "{kind}"
        );
        let anti = &pod["affinity"]["podAntiAffinity"];
        assert!(anti.get("preferredDuringSchedulingIgnoredDuringExecution").is_none());
        let required = &anti["requiredDuringSchedulingIgnoredDuringExecution"][0];
        assert_eq!(required["topologyKey"], "kubernetes.io/hostname");
        assert_eq!(&required["labelSelector"]["matchLabels"], pod_labels(&p));
    }
    let bad = serde_json::from_value::<ComponentSpec>(serde_json::json!({
        "topologySpread": {"whenUnsatisfiable": "Sometimes"}
    }));
    assert!(bad.is_err(), "only Kubernetes' whenUnsatisfiable values are accepted");
}

#[test]
fn spread_defaults_change_with_a_patch_like_anything_else() {
    // Strategic merge by topologyKey: the zone rule changes, the node rule stays.
    let spec: ComponentSpec = serde_json::from_value(serde_json::json!({
        "replicas": 3,
        "patches": [{
            "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "demo-etcd"},
            "spec": {"template": {"spec": {"topologySpreadConstraints": [
                {"topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule", "minDomains": 3}
            ]}}}
        }]
    }))
    .unwrap();
    let p = plan_in(&cluster(), ComponentKind::Etcd, &spec);
    let constraints = pod_spec(&p)["topologySpreadConstraints"].as_array().unwrap();
    assert_eq!(constraints.len(), 2, "{constraints:?}");
    let zone = constraints
        .iter()
        .find(|c| c["topologyKey"] == "topology.kubernetes.io/zone")
        .unwrap();
    assert_eq!(zone["whenUnsatisfiable"], "DoNotSchedule");
    assert_eq!(zone["minDomains"], 3);
    assert_eq!(zone["maxSkew"], 1, "the rest of the rule is kept");
    let node = constraints
        .iter()
        .find(|c| c["topologyKey"] == "kubernetes.io/hostname")
        .unwrap();
    assert_eq!(node["whenUnsatisfiable"], "ScheduleAnyway");
}

#[test]
fn components_run_with_capns_priority_class_unless_they_name_another() {
    for kind in KINDS {
        let p = plan_in(&cluster(), kind, &ComponentSpec::default());
        assert_eq!(pod_spec(&p)["priorityClassName"], "capn-control-plane", "{kind}");
        let named = ComponentSpec {
            priority_class_name: Some("platform-critical".into()),
            ..Default::default()
        };
        let p = plan_in(&cluster(), kind, &named);
        assert_eq!(pod_spec(&p)["priorityClassName"], "platform-critical", "{kind}");
    }
}

#[test]
fn resources_default_to_requests_and_a_memory_limit_and_the_spec_replaces_them_wholesale() {
    for kind in KINDS {
        let p = plan_in(&cluster(), kind, &ComponentSpec::default());
        let resources = &pod_spec(&p)["containers"][0]["resources"];
        for r in ["cpu", "memory"] {
            assert!(
                resources["requests"][r].is_string(),
                "{kind}: no {r} request: {resources}"
            );
        }
        assert!(resources["limits"]["memory"].is_string(), "{kind}: {resources}");
        assert!(
            resources["limits"].get("cpu").is_none(),
            "{kind}: a CPU limit throttles the control plane: {resources}"
        );
        let own: ComponentSpec = serde_json::from_value(serde_json::json!({
            "resources": {"requests": {"cpu": "2"}}
        }))
        .unwrap();
        let p = plan_in(&cluster(), kind, &own);
        assert_eq!(
            pod_spec(&p)["containers"][0]["resources"],
            serde_json::json!({"requests": {"cpu": "2"}}),
            "{kind}: the spec's resources replace the defaults wholesale"
        );
    }
}

fn with_capn(mut c: ClusterSettings) -> ClusterSettings {
    c.network_policy.capn = Some(CapnPods {
        namespace: "capn-system".into(),
        labels: [("app.kubernetes.io/name".to_string(), "capn".to_string())].into(),
    });
    c
}

fn capn_peer() -> Value {
    serde_json::json!({
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "capn-system"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "capn"}},
    })
}

fn monitoring_peer() -> Value {
    serde_json::json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}})
}

#[test]
fn etcd_admits_clients_from_its_apiservers_and_capn_peers_from_members_and_metrics_from_monitoring() {
    let c = with_capn(cluster());
    let etcd = plan_in(&c, ComponentKind::Etcd, &replicas(3));
    let apiserver = plan_in(&c, ComponentKind::ApiServer, &ComponentSpec::default());
    let policy = find(&etcd, "NetworkPolicy");
    assert_eq!(policy["apiVersion"], "networking.k8s.io/v1");
    assert_eq!(&policy["spec"]["podSelector"]["matchLabels"], pod_labels(&etcd));
    assert_eq!(policy["spec"]["policyTypes"], serde_json::json!(["Ingress"]));
    assert_eq!(policy["spec"]["ingress"].as_array().unwrap().len(), 3);
    let client = rule_for(policy, 2379).expect("client port rule");
    assert_eq!(
        client["from"],
        serde_json::json!([{"podSelector": {"matchLabels": pod_labels(&apiserver)}}, capn_peer()]),
        "the client port admits exactly this cluster's apiserver pods and capn"
    );
    let peer = rule_for(policy, 2380).expect("peer port rule");
    assert_eq!(
        peer["from"],
        serde_json::json!([{"podSelector": {"matchLabels": pod_labels(&etcd)}}])
    );
    let metrics = rule_for(policy, 2381).expect("metrics port rule");
    assert_eq!(metrics["from"], serde_json::json!([monitoring_peer()]));
    // The plain-HTTP metrics listener stays, and the probes use it.
    let container = &pod_spec(&etcd)["containers"][0];
    assert_eq!(
        flag(find(&etcd, "StatefulSet"), "listen-metrics-urls").as_deref(),
        Some("http://0.0.0.0:2381")
    );
    let metrics_port = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "metrics")
        .unwrap();
    assert_eq!(metrics_port["containerPort"], 2381);
    for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
        assert_eq!(container[probe]["httpGet"]["port"], "metrics", "{probe}");
    }
    // Without capn in the super cluster, only the apiservers.
    let alone = plan_in(&cluster(), ComponentKind::Etcd, &replicas(3));
    assert_eq!(
        rule_for(find(&alone, "NetworkPolicy"), 2379).unwrap()["from"],
        serde_json::json!([{"podSelector": {"matchLabels": pod_labels(&apiserver)}}])
    );
}

#[test]
fn the_apiserver_admits_everyone_by_default_and_a_setting_narrows_it() {
    let open = plan_in(
        &with_capn(cluster()),
        ComponentKind::ApiServer,
        &ComponentSpec::default(),
    );
    let policy = find(&open, "NetworkPolicy");
    assert_eq!(&policy["spec"]["podSelector"]["matchLabels"], pod_labels(&open));
    let rule = rule_for(policy, 6443).expect("6443 rule");
    assert!(rule.get("from").is_none(), "no `from`: every source: {rule}");
    let controller_manager = plan_in(&cluster(), ComponentKind::ControllerManager, &ComponentSpec::default());
    let cm_peer = serde_json::json!({"podSelector": {"matchLabels": pod_labels(&controller_manager)}});
    let office = serde_json::json!({"ipBlock": {"cidr": "192.0.2.0/24"}});
    let mut narrowed = with_capn(cluster());
    narrowed.network_policy.apiserver_from = Some(vec![office.clone()]);
    let p = plan_in(&narrowed, ComponentKind::ApiServer, &ComponentSpec::default());
    assert_eq!(
        rule_for(find(&p, "NetworkPolicy"), 6443).unwrap()["from"],
        serde_json::json!([cm_peer, capn_peer(), office])
    );
    // An empty list leaves only what the control plane needs, never "everyone".
    let mut closed = cluster();
    closed.network_policy.apiserver_from = Some(Vec::new());
    let p = plan_in(&closed, ComponentKind::ApiServer, &ComponentSpec::default());
    assert_eq!(
        rule_for(find(&p, "NetworkPolicy"), 6443).unwrap()["from"],
        serde_json::json!([cm_peer])
    );
}

#[test]
fn metrics_ports_admit_only_the_monitoring_peers() {
    let p = plan_in(&cluster(), ComponentKind::ControllerManager, &ComponentSpec::default());
    let policy = find(&p, "NetworkPolicy");
    assert_eq!(policy["spec"]["ingress"].as_array().unwrap().len(), 1);
    assert_eq!(
        rule_for(policy, 10257).unwrap()["from"],
        serde_json::json!([monitoring_peer()])
    );
    let prometheus = serde_json::json!({
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    });
    let mut own = cluster();
    own.network_policy.metrics_from = Some(vec![prometheus.clone()]);
    for (kind, port) in [(ComponentKind::Etcd, 2381), (ComponentKind::ControllerManager, 10257)] {
        let p = plan_in(&own, kind, &ComponentSpec::default());
        assert_eq!(
            rule_for(find(&p, "NetworkPolicy"), port).unwrap()["from"],
            serde_json::json!([prometheus]),
            "{kind}"
        );
    }
    // Empty: no rule at all (an empty `from` would admit everyone).
    let mut none = cluster();
    none.network_policy.metrics_from = Some(Vec::new());
    let etcd = plan_in(&none, ComponentKind::Etcd, &ComponentSpec::default());
    assert!(rule_for(find(&etcd, "NetworkPolicy"), 2381).is_none());
    assert_eq!(
        find(&etcd, "NetworkPolicy")["spec"]["ingress"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    let cm = plan_in(&none, ComponentKind::ControllerManager, &ComponentSpec::default());
    assert_eq!(find(&cm, "NetworkPolicy")["spec"]["ingress"], serde_json::json!([]));
}

#[test]
fn every_stable_version_renders_the_same_budgets_spread_and_policies() {
    let channels = registry();
    let stable = channels.get("stable").unwrap();
    for kind in KINDS {
        let mut shapes = Vec::new();
        for version in stable.versions(kind) {
            let spec = ComponentSpec {
                version: Some(version.to_string()),
                replicas: Some(3),
                ..Default::default()
            };
            let mut c = cluster();
            // etcd follows the Kubernetes minor; pin one that allows every etcd release.
            c.kubernetes_version = Some(if version.major == 3 {
                "1.36".into()
            } else {
                version.to_string()
            });
            let p = plan_in(&c, kind, &spec);
            let kinds: Vec<&str> = p.objects.iter().map(|o| o["kind"].as_str().unwrap()).collect();
            for wanted in ["PodDisruptionBudget", "NetworkPolicy", "StatefulSet"] {
                assert!(kinds.contains(&wanted), "{kind} {version}: no {wanted} in {kinds:?}");
            }
            let pod = pod_spec(&p);
            shapes.push((
                find(&p, "PodDisruptionBudget")["spec"].clone(),
                find(&p, "NetworkPolicy")["spec"].clone(),
                pod["topologySpreadConstraints"].clone(),
                pod["affinity"].clone(),
                pod["priorityClassName"].clone(),
                pod["containers"][0]["resources"].clone(),
            ));
        }
        assert!(shapes.len() >= 2, "{kind}");
        assert!(shapes.windows(2).all(|w| w[0] == w[1]), "{kind}: versions differ");
    }
}

/// A pending restore renders three init containers, in order, with the verified key and the
/// member's own name, peer URL and the initial cluster for `etcdutl snapshot restore`; no
/// restore renders none. Both stable etcd releases render the same.
#[test]
fn a_pending_restore_renders_fetch_etcdutl_and_commit_init_containers() {
    let restore = RestoreVars {
        capn_image: "ghcr.io/capn/capn:v0.1.0".into(),
        endpoint: "http://minio.backup:9000".into(),
        bucket: "backups".into(),
        region: "us-east-1".into(),
        prefix: "tenant-a/demo-etcd".into(),
        snapshot: "tenant-a/demo-etcd/etcd-snapshot-20261201T030000Z.db".into(),
        credentials_secret: "s3-credentials".into(),
    };
    for version in ["3.6.8", "3.7.0"] {
        let spec = ComponentSpec {
            version: Some(version.into()),
            replicas: Some(3),
            ..ComponentSpec::default()
        };
        fn request<'a>(spec: &'a ComponentSpec, restore: Option<&'a RestoreVars>) -> ComponentRequest<'a> {
            ComponentRequest {
                kind: ComponentKind::Etcd,
                resource_name: "demo",
                spec,
                etcd_storage: None,
                etcd_restore: restore,
                owner: owner(ComponentKind::Etcd),
                running: Running::default(),
                audit: None,
                authentication: None,
                authorization: None,
                referenced: Default::default(),
            }
        }
        let mut kube_1_37 = cluster();
        kube_1_37.kubernetes_version = Some("1.37".into());
        let plain = plan(&registry(), &kube_1_37, &request(&spec, None), &Upstream::default()).unwrap();
        assert!(find(&plain, "StatefulSet")["spec"]["template"]["spec"]["initContainers"].is_null());

        let planned = plan(
            &registry(),
            &kube_1_37,
            &request(&spec, Some(&restore)),
            &Upstream::default(),
        )
        .unwrap();
        let sts = find(&planned, "StatefulSet");
        let init = sts["spec"]["template"]["spec"]["initContainers"].as_array().unwrap();
        let names: Vec<&str> = init.iter().map(|c| c["name"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            ["restore-fetch", "restore-snapshot", "restore-commit"],
            "{version}"
        );
        let arg_list = |c: &Value| -> Vec<String> {
            c["command"]
                .as_array()
                .unwrap()
                .iter()
                .chain(c["args"].as_array().unwrap())
                .map(|a| a.as_str().unwrap().to_string())
                .collect()
        };
        let fetch = arg_list(&init[0]);
        assert_eq!(init[0]["image"], "ghcr.io/capn/capn:v0.1.0");
        assert!(fetch.contains(&format!("--snapshot={}", restore.snapshot)), "{fetch:?}");
        assert!(
            fetch.contains(&"--data-dir=/var/lib/etcd/data".to_string()),
            "{fetch:?}"
        );
        assert_eq!(init[0]["env"][0]["valueFrom"]["secretKeyRef"]["name"], "s3-credentials");
        let etcdutl = arg_list(&init[1]);
        assert_eq!(init[1]["image"], format!("registry.k8s.io/etcd:{version}-0"));
        assert_eq!(etcdutl[..3], ["etcdutl", "snapshot", "restore"]);
        // The same token and peer URL the etcd container starts with, and the member list
        // from the same membership ConfigMap key as its ETCD_INITIAL_CLUSTER.
        let etcd_args = args(sts);
        for flag_name in ["--initial-cluster-token=", "--initial-advertise-peer-urls="] {
            let main = etcd_args.iter().find(|a| a.starts_with(flag_name)).unwrap();
            assert!(etcdutl.contains(main), "{flag_name}: {etcdutl:?} vs {main}");
        }
        assert!(
            etcdutl.contains(&"--initial-cluster=$(ETCD_INITIAL_CLUSTER)".to_string()),
            "{etcdutl:?}"
        );
        let env_ref = |container: &serde_json::Value| {
            container["env"]
                .as_array()
                .and_then(|env| env.iter().find(|e| e["name"] == "ETCD_INITIAL_CLUSTER"))
                .map(|e| e["valueFrom"]["configMapKeyRef"].clone())
        };
        let main_container = &sts["spec"]["template"]["spec"]["containers"][0];
        assert!(env_ref(&init[1]).is_some());
        assert_eq!(env_ref(&init[1]), env_ref(main_container));
        assert!(etcdutl.contains(&"--name=$(POD_NAME)".to_string()), "{etcdutl:?}");
        let commit = arg_list(&init[2]);
        assert_eq!(commit[..3], ["capn", "etcd-restore", "commit"]);
        // Every step works on the member's data volume, nothing else.
        for container in init {
            assert_eq!(container["volumeMounts"][0]["name"], "data");
            assert_eq!(container["volumeMounts"][0]["mountPath"], "/var/lib/etcd");
        }
    }
}

#[test]
fn a_new_components_first_group_kinds_are_those_its_first_round_applies() {
    let spec = ComponentSpec::default();
    let etcd = plan_of(ComponentKind::Etcd, &spec, &Upstream::default()).expect("etcd plans");
    let etcd_outputs = Upstream {
        etcd_endpoints: etcd.etcd_endpoints.clone(),
        ..Upstream::default()
    };
    for (kind, upstream) in [
        (ComponentKind::Etcd, Upstream::default()),
        (ComponentKind::ApiServer, etcd_outputs),
        (ComponentKind::ControllerManager, Upstream::default()),
    ] {
        let first_round = plan_of(kind, &spec, &upstream).expect("plans");
        let predicted = first_plan(&registry(), &cluster(), &request(kind, &spec)).map(|p| p.contains_group_kinds());
        assert_eq!(predicted, Some(first_round.contains_group_kinds()), "{kind:?}");
        // Sorted, comma-separated group-kinds of what it applies.
        let kinds: Vec<String> = first_round
            .inventory()
            .iter()
            .map(|e| crate::apply::applyset::group_kind(&e.api_version, &e.kind))
            .collect();
        for group_kind in &kinds {
            assert!(
                predicted.as_deref().unwrap().split(',').any(|k| k == group_kind),
                "{kind:?}: {group_kind}"
            );
        }
    }
    assert_eq!(
        first_plan(&registry(), &cluster(), &request(ComponentKind::Etcd, &spec))
            .map(|p| p.contains_group_kinds())
            .as_deref(),
        Some("ConfigMap,NetworkPolicy.networking.k8s.io,PodDisruptionBudget.policy,Service,StatefulSet.apps")
    );
}

#[test]
fn a_component_that_cannot_be_planned_has_no_first_plan() {
    let spec = ComponentSpec {
        version: Some("9.9.9".into()),
        ..ComponentSpec::default()
    };
    assert_eq!(
        first_plan(&registry(), &cluster(), &request(ComponentKind::ApiServer, &spec)),
        None
    );
}

// Issue 40 item 3: sizes (docs/guide/sizes.md).

/// The plan of `kind` at `version` of the stable channel, for a control plane of `size`.
fn sized_plan(kind: ComponentKind, version: &semver::Version, size: Option<&str>, spec: &ComponentSpec) -> Plan {
    let mut c = cluster();
    c.size = size.map(str::to_string);
    let mut spec = spec.clone();
    if version.major != 3 {
        c.kubernetes_version = Some(version.to_string());
    }
    spec.version = Some(version.to_string());
    plan_in(&c, kind, &spec)
}

fn env(sts: &Value) -> Vec<(String, String)> {
    sts["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| Some((e["name"].as_str()?.to_string(), e["value"].as_str()?.to_string())))
        .collect()
}

#[test]
fn every_size_renders_its_resources_flags_env_and_quota_in_every_release() {
    let channels = registry();
    let stable = channels.get("stable").unwrap();
    for (name, size) in &stable.index.sizes {
        for kind in KINDS {
            let settings = size.component(kind).cloned().unwrap_or_default();
            for version in stable.versions(kind) {
                let at = format!("{name} {kind} {version}");
                let p = sized_plan(kind, version, Some(name), &ComponentSpec::default());
                let sts = find(&p, "StatefulSet");
                let container = &sts["spec"]["template"]["spec"]["containers"][0];
                assert_eq!(
                    container["resources"],
                    serde_json::to_value(settings.resources.as_ref().unwrap()).unwrap(),
                    "{at}"
                );
                let env = env(sts);
                let go = |n: &str| env.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
                assert_eq!(
                    go("GOMEMLIMIT"),
                    settings
                        .go_mem_limit
                        .as_ref()
                        .map(|q| size::go_mem_limit(crate::quantity::quantity_bytes(&q.0).unwrap())),
                    "{at}"
                );
                assert_eq!(go("GOGC"), settings.go_gc.map(|g| g.to_string()), "{at}");
                assert_eq!(
                    flag(sts, "max-requests-inflight"),
                    settings.max_requests_inflight.map(|n| n.to_string()),
                    "{at}"
                );
                assert_eq!(
                    flag(sts, "max-mutating-requests-inflight"),
                    settings.max_mutating_requests_inflight.map(|n| n.to_string()),
                    "{at}"
                );
                for (name, value) in &settings.extra_args {
                    assert_eq!(flag(sts, name).as_ref(), Some(value), "{at}: the size's --{name}");
                    assert_eq!(
                        args(sts)
                            .iter()
                            .filter(|a| a.starts_with(&format!("--{name}=")))
                            .count(),
                        1,
                        "{at}: --{name} once"
                    );
                }
                if kind == ComponentKind::Etcd {
                    // What the space controller compares with is what renders.
                    let mut c = cluster();
                    c.size = Some(name.clone());
                    let quota = etcd_quota_bytes(&channels, &c, "demo", &ComponentSpec::default(), None).unwrap();
                    assert_eq!(flag(sts, "quota-backend-bytes"), Some(quota.to_string()), "{at}");
                }
            }
        }
    }
}

#[test]
fn the_stable_sizes_set_what_they_say() {
    let v = |s: &str| semver::Version::parse(s).unwrap();
    let default = ComponentSpec::default();
    let small = sized_plan(ComponentKind::ApiServer, &v("1.36.3"), Some("small"), &default);
    let sts = find(&small, "StatefulSet");
    assert_eq!(flag(sts, "max-requests-inflight").as_deref(), Some("100"));
    assert_eq!(flag(sts, "max-mutating-requests-inflight").as_deref(), Some("50"));
    // POD_IP (from the downward API, no value) first, then the size's.
    assert_eq!(
        env(sts),
        [
            ("GOMEMLIMIT".to_string(), "920MiB".to_string()),
            ("GOGC".into(), "25".into())
        ]
    );
    let etcd = sized_plan(ComponentKind::Etcd, &v("3.6.8"), Some("small"), &default);
    assert_eq!(
        flag(find(&etcd, "StatefulSet"), "quota-backend-bytes").as_deref(),
        Some("268435456"),
        "256Mi, under the 345 MB the default 1Gi volume leaves room for"
    );
    let large = sized_plan(ComponentKind::Etcd, &v("3.6.8"), Some("large"), &default);
    assert_eq!(
        flag(find(&large, "StatefulSet"), "quota-backend-bytes").as_deref(),
        Some("344870912"),
        "large's 4Gi ceiling: the 1Gi volume still has room for 345 MB only"
    );
    // medium is the default and renders what a control plane without a size rendered.
    for kind in KINDS {
        let version = registry().get("stable").unwrap().resolve(kind, None, None).unwrap();
        assert_eq!(
            sized_plan(kind, &version, Some("medium"), &default),
            sized_plan(kind, &version, None, &default),
            "{kind}"
        );
    }
}

#[test]
fn explicit_fields_extra_args_and_patches_win_over_the_size() {
    let mut c = cluster();
    c.size = Some("small".into());
    // The component's own size wins over its control plane's.
    let own: ComponentSpec = serde_json::from_value(serde_json::json!({"size": "large"})).unwrap();
    let p = plan_in(&c, ComponentKind::ApiServer, &own);
    assert_eq!(
        flag(find(&p, "StatefulSet"), "max-requests-inflight").as_deref(),
        Some("800")
    );
    // resources replace the size's wholesale; extraArgs replace its flags; a patch its env.
    let spec: ComponentSpec = serde_json::from_value(serde_json::json!({
        "resources": {"requests": {"cpu": "2"}},
        "extraArgs": {"max-requests-inflight": "300"},
        "patches": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "demo-apiserver"},
                     "spec": {"template": {"spec": {"containers": [{"name": "kube-apiserver",
                       "env": [{"name": "GOMEMLIMIT", "value": "700MiB"}]}]}}}}]
    }))
    .unwrap();
    let p = plan_in(&c, ComponentKind::ApiServer, &spec);
    let sts = find(&p, "StatefulSet");
    assert_eq!(
        sts["spec"]["template"]["spec"]["containers"][0]["resources"],
        serde_json::json!({"requests": {"cpu": "2"}})
    );
    assert_eq!(flag(sts, "max-requests-inflight").as_deref(), Some("300"));
    assert_eq!(
        args(sts).iter().filter(|a| a.contains("max-requests-inflight")).count(),
        1
    );
    assert_eq!(
        flag(sts, "max-mutating-requests-inflight").as_deref(),
        Some("50"),
        "the rest of the size stays"
    );
    assert!(
        env(sts).contains(&("GOMEMLIMIT".into(), "700MiB".into())),
        "{:?}",
        env(sts)
    );
    // etcd: the spec's quota wins over the size's ceiling.
    let storage = EtcdStorage {
        quota_backend_bytes: Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity("100Mi".into())),
        ..Default::default()
    };
    let p = plan(
        &registry(),
        &c,
        &ComponentRequest {
            etcd_storage: Some(&storage),
            ..request(ComponentKind::Etcd, &ComponentSpec::default())
        },
        &Upstream::default(),
    )
    .unwrap();
    assert_eq!(
        flag(find(&p, "StatefulSet"), "quota-backend-bytes").as_deref(),
        Some("104857600")
    );
}

#[test]
fn a_sizes_extra_args_set_flags_under_the_components_own() {
    // A channel whose small apiserver sets three flags through the size (issue 40: the
    // knobs without a field of their own).
    let mut channels = registry();
    let mut stable = channels.get("stable").unwrap().clone();
    let small = stable.index.sizes.get_mut("small").unwrap();
    small.apiserver.as_mut().unwrap().extra_args =
        [("watch-cache", "false"), ("max-requests-inflight", "120"), ("v", "3")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    channels.insert(stable);
    let mut c = cluster();
    c.size = Some("small".into());
    let spec: ComponentSpec = serde_json::from_value(serde_json::json!({"extraArgs": {"v": "5"}})).unwrap();
    let p = plan(
        &channels,
        &c,
        &request(ComponentKind::ApiServer, &spec),
        &three_endpoints(),
    )
    .unwrap();
    let sts = find(&p, "StatefulSet");
    // Appended (no template flag), over the size's own field, and under the component's.
    assert_eq!(flag(sts, "watch-cache").as_deref(), Some("false"));
    assert_eq!(flag(sts, "max-requests-inflight").as_deref(), Some("120"));
    assert_eq!(flag(sts, "v").as_deref(), Some("5"));
    for name in ["watch-cache", "max-requests-inflight", "v"] {
        let prefix = format!("--{name}=");
        assert_eq!(args(sts).iter().filter(|a| a.starts_with(&prefix)).count(), 1, "{name}");
    }
    // The other components of that size get none of the apiserver's flags.
    let etcd = plan(
        &channels,
        &c,
        &request(ComponentKind::Etcd, &ComponentSpec::default()),
        &Upstream::default(),
    )
    .unwrap();
    assert_eq!(flag(find(&etcd, "StatefulSet"), "watch-cache"), None);
}

#[test]
fn an_unknown_size_is_refused_naming_the_sizes_and_nothing_is_planned() {
    let mut c = cluster();
    c.size = Some("huge".into());
    for kind in KINDS {
        let upstream = if kind == ComponentKind::ApiServer {
            three_endpoints()
        } else {
            Upstream::default()
        };
        let e = plan(&registry(), &c, &request(kind, &ComponentSpec::default()), &upstream).unwrap_err();
        assert_eq!(e.reason(), "UnknownSize", "{kind}");
        assert_eq!(
            e.to_string(),
            "size \"huge\" is not in channel \"stable\"; available: large, medium, small"
        );
    }
    // A bad name is a field error, as admission says it.
    c.size = Some("Huge".into());
    let e = plan_of_in(&c, ComponentKind::Etcd).unwrap_err();
    assert_eq!(e.reason(), "InvalidSize");
    assert!(e.to_string().contains("spec.size"), "{e}");
}

fn plan_of_in(c: &ClusterSettings, kind: ComponentKind) -> Result<Plan, PlanError> {
    plan(
        &registry(),
        c,
        &request(kind, &ComponentSpec::default()),
        &Upstream::default(),
    )
}

/// Golden files of the small and large sizes at the default releases (medium is the default:
/// `<kind>.yaml`).
#[test]
fn golden_sized_manifests() {
    for size in ["small", "large"] {
        let mut c = cluster();
        c.size = Some(size.into());
        for kind in KINDS {
            let p = plan_in(&c, kind, &ComponentSpec::default());
            assert_golden(&format!("{kind}-{size}.yaml"), &p.objects);
        }
    }
}

#[test]
fn every_apiserver_release_mounts_each_kms_socket_directory_once_read_only() {
    for version in ["1.35.4", "1.36.3", "1.37.2"] {
        let cluster = ClusterSettings {
            kubernetes_version: Some(version.into()),
            kms_endpoints: [
                "unix:///var/run/vault/a.sock",
                "unix:///var/run/vault/b.sock",
                "unix:///run/hsm/kms.sock",
            ]
            .map(String::from)
            .to_vec(),
            ..cluster()
        };
        let p = plan_in(&cluster, ComponentKind::ApiServer, &ComponentSpec::default());
        let pod = pod_spec(&p);
        let host_paths: Vec<(&Value, &Value, &Value)> = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| v["hostPath"].is_object())
            .map(|v| (&v["name"], &v["hostPath"]["path"], &v["hostPath"]["type"]))
            .collect();
        assert_eq!(
            host_paths,
            [
                (
                    &serde_json::json!("kms-0"),
                    &serde_json::json!("/var/run/vault"),
                    &serde_json::json!("Directory")
                ),
                (
                    &serde_json::json!("kms-1"),
                    &serde_json::json!("/run/hsm"),
                    &serde_json::json!("Directory")
                ),
            ],
            "{version}"
        );
        let mounts = pod["containers"][0]["volumeMounts"].as_array().unwrap();
        for (name, path) in [("kms-0", "/var/run/vault"), ("kms-1", "/run/hsm")] {
            let mount = mounts.iter().find(|m| m["name"] == name).unwrap();
            assert_eq!(
                (&mount["mountPath"], &mount["readOnly"]),
                (&serde_json::json!(path), &serde_json::json!(true)),
                "{version}"
            );
        }
        // Without a plugin, no host path at all.
        let plain = plan_in(
            &cluster_without_kms(version),
            ComponentKind::ApiServer,
            &ComponentSpec::default(),
        );
        assert!(
            !pod_spec(&plain)["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v["hostPath"].is_object()),
            "{version}"
        );
    }
}

fn cluster_without_kms(version: &str) -> ClusterSettings {
    ClusterSettings {
        kubernetes_version: Some(version.into()),
        ..cluster()
    }
}
