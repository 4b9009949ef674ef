//! Issue 5, "Runs as a Deployment": least-privilege RBAC, leader election, the metrics and
//! probe endpoints, and `--watch-filter`, each through capn's own entry points
//! (`capn::cli::run`, `capn::controllers::run`) against the real apiserver.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use capn::api::{NestedCluster, NestedEtcd};
use capn::channel::ChannelRegistry;
use capn::cli::{Cli, Command, LeaderElection, RunArgs};
use capn::controllers::Settings;
use capn_testkit::{cluster, free_ports, http_get, test_namespace, wait_until};
use clap::Parser as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

use crate::harness::*;

/// A `capn run` in this test's runtime, stopped (like a killed pod) when dropped.
struct Instance {
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    metrics: SocketAddr,
    probes: SocketAddr,
}

impl Instance {
    /// `capn::cli::run` with the built-in channels, on free loopback ports.
    fn start(client: Client, settings: Settings, election: Option<LeaderElection>) -> Self {
        let channels = Arc::new(ChannelRegistry::load(&[]).expect("built-in channels"));
        let [metrics, probes] = free_ports()
            .expect("free loopback ports")
            .map(|port| SocketAddr::from((Ipv4Addr::LOCALHOST, port)));
        let task = tokio::spawn(capn::cli::run(client, channels, settings, metrics, probes, election));
        Self { task, metrics, probes }
    }

    /// `/metrics`, once it answers.
    async fn metrics(&self) -> String {
        let address = self.metrics;
        wait_until("/metrics answers", CONTROLLER_STEP, || async move {
            match http_get(address, "/metrics").await {
                Ok((200, body)) => Some(body),
                _ => None,
            }
        })
        .await
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The value of one sample (`name{labels}`) of a Prometheus text exposition.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

/// Every controller for `ns` but the public CRD sync (it follows cluster-wide CRDs; as in
/// `harness::Capn::start`).
fn settings_for(ns: &str) -> Settings {
    let mut settings = Settings {
        namespace: Some(ns.to_owned()),
        ..Settings::default()
    };
    settings.enabled.public_crds = false;
    settings
}

/// The standalone example's NestedControlPlane under another name and with `labels`.
fn example_control_plane(name: &str, labels: Value) -> Value {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/nestedcontrolplane.yaml"))
        .unwrap();
    let mut ncp: Value = serde_saphyr::from_str(&text).unwrap();
    ncp["metadata"]["name"] = json!(name);
    ncp["metadata"]["labels"] = labels;
    ncp
}

/// The objects of one of `clusterctl/`'s components files as clusterctl would install them
/// into namespace `ns` (`--target-namespace`), every other variable at its default.
fn provider_components(file: &str, ns: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("clusterctl").join(file)).unwrap();
    let mut out = String::new();
    let mut rest = text.as_str();
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let end = rest[start..].find('}').expect("a closed ${...}") + start;
        let (name, default) = rest[start + 2..end]
            .split_once(":=")
            .unwrap_or((&rest[start + 2..end], ""));
        out.push_str(if name == "NAMESPACE" { ns } else { default });
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    serde_saphyr::from_multiple(&out).unwrap()
}

/// Server-side applies a cluster-scoped object.
async fn apply_cluster_scoped(client: &Client, doc: &Value) {
    let (group, version) = doc["apiVersion"].as_str().unwrap().split_once('/').unwrap();
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, doc["kind"].as_str().unwrap()));
    let name = doc["metadata"]["name"].as_str().unwrap();
    Api::<DynamicObject>::all_with(client.clone(), &ar)
        .patch(name, &PatchParams::apply("kubectl"), &Patch::Apply(doc))
        .await
        .unwrap_or_else(|e| panic!("applying {} {name}: {e}", doc["kind"]));
}

/// Installs a provider's RBAC from its components file into `ns` — its ServiceAccount,
/// ClusterRole (renamed for this test, rules untouched), ClusterRoleBinding, leader election
/// Role and RoleBinding — and returns `capn run` as its Deployment runs it: an impersonating
/// client for the ServiceAccount and the Deployment's own arguments.
async fn provider_identity(admin: &Client, ns: &str, file: &str) -> (Client, RunArgs) {
    let objects = provider_components(file, ns);
    let unique = |name: &str| format!("{ns}-{name}");
    let mut account = None;
    let mut args = None;
    for object in objects {
        let mut object = object;
        match object["kind"].as_str().unwrap() {
            "ServiceAccount" | "Role" | "RoleBinding" => apply_doc(admin, ns, object).await,
            "ClusterRole" => {
                object["metadata"]["name"] = json!(unique(object["metadata"]["name"].as_str().unwrap()));
                apply_cluster_scoped(admin, &object).await;
            }
            "ClusterRoleBinding" => {
                object["metadata"]["name"] = json!(unique(object["metadata"]["name"].as_str().unwrap()));
                object["roleRef"]["name"] = json!(unique(object["roleRef"]["name"].as_str().unwrap()));
                apply_cluster_scoped(admin, &object).await;
            }
            "Deployment" => {
                let pod = &object["spec"]["template"]["spec"];
                account = Some(pod["serviceAccountName"].as_str().unwrap().to_owned());
                let container_args: Vec<String> = serde_json::from_value(pod["containers"][0]["args"].clone()).unwrap();
                let cli = Cli::try_parse_from(std::iter::once("capn".to_owned()).chain(container_args))
                    .unwrap_or_else(|e| panic!("the Deployment's arguments in {file}: {e}"));
                let Command::Run(run) = cli.command else {
                    panic!("the Deployment in {file} does not run `capn run`")
                };
                args = Some(run);
            }
            _ => {}
        }
    }
    let account = account.unwrap_or_else(|| panic!("no Deployment in {file}"));
    let mut config = cluster().config();
    config.auth_info.impersonate = Some(format!("system:serviceaccount:{ns}:{account}"));
    (Client::try_from(config).unwrap(), args.unwrap())
}

/// Settings and leader election from a Deployment's arguments, confined to `ns` (other tests
/// share the cluster) and with fast leases.
fn from_deployment(args: &RunArgs, ns: &str, identity: &str) -> (Settings, Option<LeaderElection>) {
    let settings = Settings {
        super_dns_domain: args.super_cluster_dns_domain.clone(),
        namespace: Some(ns.to_owned()),
        watch_filter: capn::manifests::empty_watch_filter_is_none(args.watch_filter.clone()),
        enabled: capn::cli::parse_controllers(&args.controllers).unwrap(),
        ..Settings::default()
    };
    let election = args.leader_elect.then(|| LeaderElection {
        lease: args.leader_election_id.clone(),
        namespace: ns.to_owned(),
        identity: identity.to_owned(),
        duration_seconds: 5,
    });
    (settings, election)
}

fn is_forbidden<T: std::fmt::Debug>(result: kube::Result<T>) -> bool {
    matches!(result, Err(kube::Error::Api(ref s)) if s.code == 403)
}

#[tokio::test]
async fn the_cluster_roles_of_the_components_files_are_enough_for_the_whole_flow() {
    let admin = cluster().client();
    let ns = test_namespace(&admin).await;
    let (control_plane_client, control_plane_args) =
        provider_identity(&admin, &ns, "control-plane-components.yaml").await;
    let (infrastructure_client, infrastructure_args) =
        provider_identity(&admin, &ns, "infrastructure-components.yaml").await;
    // The identities really are confined to their roles (nodes: read, for the syncer's tenant
    // Nodes, never written; no Deployments at all).
    let super_nodes = Api::<Node>::all(control_plane_client.clone());
    assert!(super_nodes.list(&ListParams::default()).await.is_ok());
    assert!(is_forbidden(
        super_nodes
            .patch(
                // Authorization comes before the lookup: a 403 whether or not it exists.
                "capn-any-node",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"capn.test/forbidden": "x"}}})),
            )
            .await
    ));
    assert!(is_forbidden(
        Api::<Deployment>::namespaced(control_plane_client.clone(), &ns)
            .list(&ListParams::default())
            .await
    ));
    assert!(is_forbidden(
        Api::<Secret>::namespaced(infrastructure_client.clone(), &ns)
            .list(&ListParams::default())
            .await
    ));

    let (settings, election) = from_deployment(&control_plane_args, &ns, "control-plane-0");
    let _control_plane = Instance::start(control_plane_client, settings, election);
    let (settings, election) = from_deployment(&infrastructure_args, &ns, "infrastructure-0");
    let _infrastructure = Instance::start(infrastructure_client.clone(), settings, election);

    apply_example(&admin, &ns, "examples/nestedcontrolplane.yaml").await;
    apply_doc(
        &admin,
        &ns,
        json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "NestedCluster", "metadata": {"name": "demo"}, "spec": {}}),
    )
    .await;
    bring_up(&admin, &ns, "demo").await;
    assert!(secret(&admin, &ns, "demo-kubeconfig").await.is_some());
    let ncp = control_plane(&admin, &ns, "demo").await;
    let nested_cluster = wait_until("the NestedCluster is provisioned", CONTROLLER_STEP, || async {
        Api::<NestedCluster>::namespaced(admin.clone(), &ns)
            .get("demo")
            .await
            .ok()
            .filter(|c| c.status.as_ref().is_some_and(|s| s.ready))
    })
    .await;
    assert_eq!(
        nested_cluster.spec.control_plane_endpoint,
        ncp.spec.control_plane_endpoint
    );
    // Events were written with the role's permission.
    let events = wait_until(
        "capn recorded an Event on the control plane",
        CONTROLLER_STEP,
        || async {
            let events = Api::<Event>::namespaced(admin.clone(), &ns)
                .list(&ListParams::default())
                .await
                .unwrap()
                .items;
            let about_demo: Vec<Event> = events
                .into_iter()
                .filter(|e| {
                    e.regarding
                        .as_ref()
                        .is_some_and(|r| r.kind.as_deref() == Some("NestedControlPlane"))
                })
                .collect();
            (!about_demo.is_empty()).then_some(about_demo)
        },
    )
    .await;
    assert!(
        events.iter().all(|e| e.reporting_controller.as_deref() == Some("capn")),
        "{events:?}"
    );
    // Each provider held its Lease through the leader election Role.
    for (lease, holder) in [
        (&control_plane_args.leader_election_id, "control-plane-0"),
        (&infrastructure_args.leader_election_id, "infrastructure-0"),
    ] {
        let lease = Api::<Lease>::namespaced(admin.clone(), &ns).get(lease).await.unwrap();
        assert_eq!(lease.spec.and_then(|s| s.holder_identity).as_deref(), Some(holder));
    }
    // The infrastructure role never deletes a Secret (the control plane role may: a CA
    // rotation removes the `<secret>-next` it staged).
    assert!(is_forbidden(
        Api::<Secret>::namespaced(infrastructure_client, &ns)
            .delete("demo-ca", &DeleteParams::default())
            .await
    ));
}

async fn lease_holder(client: &Client, ns: &str, lease: &str) -> Option<String> {
    Api::<Lease>::namespaced(client.clone(), ns)
        .get_opt(lease)
        .await
        .unwrap()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

#[tokio::test]
async fn only_the_leader_reconciles_and_a_standby_takes_over_when_it_dies() {
    let client = cluster().client();
    let ns = test_namespace(&client).await;
    let election = |identity: &str| LeaderElection {
        lease: "capn-leader-election".into(),
        namespace: ns.clone(),
        identity: identity.into(),
        duration_seconds: 3,
    };
    let mut instances = [
        (
            "capn-a",
            Some(Instance::start(
                client.clone(),
                settings_for(&ns),
                Some(election("capn-a")),
            )),
        ),
        (
            "capn-b",
            Some(Instance::start(
                client.clone(),
                settings_for(&ns),
                Some(election("capn-b")),
            )),
        ),
    ];
    let leader = wait_until("one instance holds the Lease", CONTROLLER_STEP, || {
        lease_holder(&client, &ns, "capn-leader-election")
    })
    .await;
    let (leading, standing_by) = if leader == "capn-a" { (0, 1) } else { (1, 0) };
    assert_eq!(instances[leading].0, leader);

    apply_doc(&client, &ns, example_control_plane("demo", json!({}))).await;
    bring_up(&client, &ns, "demo").await;
    let reconciles = "capn_reconcile_total{controller=\"control-plane\"}";
    let leader_metrics = instances[leading].1.as_ref().unwrap().metrics().await;
    assert!(
        sample(&leader_metrics, reconciles).is_some_and(|n| n >= 1.0),
        "{leader_metrics}"
    );
    let standby = instances[standing_by].1.as_ref().unwrap();
    let standby_metrics = standby.metrics().await;
    assert!(
        !standby_metrics.contains("capn_reconcile_total{"),
        "the standby reconciled:\n{standby_metrics}"
    );
    // A standby is alive and ready; it just does not reconcile.
    assert_eq!(http_get(standby.probes, "/readyz").await.unwrap().0, 200);

    // The leader dies.
    let dead = instances[leading].1.take().unwrap();
    let dead_metrics = dead.metrics;
    drop(dead);
    wait_until(
        "the dead leader's metrics endpoint is gone",
        CONTROLLER_STEP,
        || async { http_get(dead_metrics, "/metrics").await.is_err().then_some(()) },
    )
    .await;
    let standby_name = instances[standing_by].0;
    wait_until(
        &format!("{standby_name} takes the Lease over"),
        CONTROLLER_STEP,
        || async {
            (lease_holder(&client, &ns, "capn-leader-election").await.as_deref() == Some(standby_name)).then_some(())
        },
    )
    .await;
    apply_doc(&client, &ns, example_control_plane("demo-2", json!({}))).await;
    bring_up(&client, &ns, "demo-2").await;
    let new_leader_metrics = instances[standing_by].1.as_ref().unwrap().metrics().await;
    assert!(
        sample(&new_leader_metrics, reconciles).is_some_and(|n| n >= 1.0),
        "{new_leader_metrics}"
    );
}

#[tokio::test]
async fn metrics_and_probes_answer_on_their_addresses() {
    let client = cluster().client();
    let ns = test_namespace(&client).await;
    let instance = Instance::start(client.clone(), settings_for(&ns), None);
    let probes = instance.probes;
    wait_until("/healthz answers ok", CONTROLLER_STEP, || async move {
        matches!(http_get(probes, "/healthz").await, Ok((200, body)) if body == "ok").then_some(())
    })
    .await;
    assert_eq!(http_get(probes, "/readyz").await.unwrap(), (200, "ok".to_owned()));
    assert_eq!(http_get(probes, "/nothing-here").await.unwrap().0, 404);
    // Nothing to reconcile in a fresh namespace yet.
    let before = instance.metrics().await;
    let reconciles = "capn_reconcile_total{controller=\"etcd\"}";
    let managed = "capn_managed_objects{controller=\"etcd\"}";
    assert_eq!(sample(&before, reconciles), None, "{before}");

    apply_example(&client, &ns, "examples/nestedcontrolplane.yaml").await;
    bring_up(&client, &ns, "demo").await;
    let etcd = Api::<NestedEtcd>::namespaced(client.clone(), &ns)
        .get("demo-etcd")
        .await
        .unwrap();
    let inventory = etcd.status.unwrap().inventory.len();
    assert!(inventory >= 2, "etcd applies at least its Service and StatefulSet");
    let after = instance.metrics().await;
    assert!(sample(&after, reconciles).is_some_and(|n| n >= 1.0), "{after}");
    assert_eq!(sample(&after, managed), Some(inventory as f64), "{after}");
    assert!(
        sample(&after, "capn_reconcile_duration_seconds_count{controller=\"etcd\"}").is_some_and(|n| n >= 1.0),
        "{after}"
    );
}

#[tokio::test]
async fn watch_filter_reconciles_only_its_own_control_planes() {
    let client = cluster().client();
    let ns = test_namespace(&client).await;
    let settings = Settings {
        watch_filter: Some("a".into()),
        ..settings_for(&ns)
    };
    let channels = Arc::new(ChannelRegistry::load(&[]).unwrap());
    let controllers = tokio::spawn(capn::controllers::run(
        client.clone(),
        channels,
        settings,
        Default::default(),
    ));
    let filter = capn::controllers::WATCH_FILTER_LABEL;
    apply_doc(&client, &ns, example_control_plane("other", json!({filter: "b"}))).await;
    apply_doc(&client, &ns, example_control_plane("demo", json!({filter: "a"}))).await;
    // Its components (created by capn, not by the user) are reconciled too.
    wait_until(
        "the instance filtering on `a` reconciles demo (labelled `a`) down to its etcd StatefulSet",
        CONTROLLER_STEP,
        || async { statefulset(&client, &ns, "demo-etcd").await },
    )
    .await;
    bring_up(&client, &ns, "demo").await;
    // "other" was created first; had the filter let it through, it would be well under way.
    tokio::time::sleep(Duration::from_secs(3)).await;
    controllers.abort();
    let other = control_plane(&client, &ns, "other").await;
    assert!(other.status.is_none(), "{:?}", other.status);
    assert!(other.spec.etcd.is_none(), "{:?}", other.spec);
    let components = components(&client, &ns).await;
    assert!(
        components.iter().all(|(_, name)| name.starts_with("demo-")),
        "{components:?}"
    );
    assert!(secret(&client, &ns, "other-ca").await.is_none());
    assert!(statefulset(&client, &ns, "other-etcd").await.is_none());
}

/// Issue 41 item 5: a watch capn depends on that fails (here: Secrets, after an RBAC change
/// took `list` and `watch` away) shows in `/readyz`, in `capn_watch_failing` and in the
/// NestedControlPlanes' `WatchesHealthy` condition, and clears once the role allows it again.
#[tokio::test]
async fn a_watch_forbidden_by_rbac_shows_in_readyz_a_metric_and_a_condition_until_allowed_again() {
    use k8s_openapi::api::rbac::v1::ClusterRole;
    // Past telemetry::WATCH_GRACE, and a watcher's backoff (at most 30 s), on a busy machine.
    const RECOVERY: Duration = Duration::from_secs(120);
    let admin = cluster().client();
    let ns = test_namespace(&admin).await;
    apply_example(&admin, &ns, "examples/nestedcontrolplane.yaml").await;
    let (client, args) = provider_identity(&admin, &ns, "control-plane-components.yaml").await;
    let roles: Api<ClusterRole> = Api::all(admin.clone());
    let role_name = format!("{ns}-capn-control-plane-manager");
    let granted = roles.get(&role_name).await.unwrap();
    let mut restricted = granted.clone();
    for rule in restricted.rules.iter_mut().flatten() {
        if rule.resources.iter().flatten().any(|r| r == "secrets") {
            rule.verbs.retain(|v| v != "list" && v != "watch");
        }
    }
    roles
        .replace(&role_name, &Default::default(), &restricted)
        .await
        .unwrap();

    let (settings, election) = from_deployment(&args, &ns, "control-plane-0");
    let instance = Instance::start(client, settings, election);
    let probes = instance.probes;
    let body = wait_until("/readyz names the failing Secret watch", RECOVERY, || async move {
        match http_get(probes, "/readyz").await {
            Ok((503, body)) if body.contains("watch of Secret failing") => Some(body),
            _ => None,
        }
    })
    .await;
    assert!(body.contains("forbidden"), "{body}");
    let failing = "capn_watch_failing{kind=\"Secret\"}";
    assert_eq!(sample(&instance.metrics().await, failing), Some(1.0));
    let ncps: Api<capn::api::NestedControlPlane> = Api::namespaced(admin.clone(), &ns);
    let watches_healthy = |want: &'static str| {
        let ncps = ncps.clone();
        async move {
            let ncp = ncps.get("demo").await.ok()?;
            let condition = ncp
                .status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "WatchesHealthy")?;
            (condition.status == want).then_some(condition)
        }
    };
    let condition = wait_until("the control plane says the watch fails", RECOVERY, || {
        watches_healthy("False")
    })
    .await;
    assert_eq!(condition.reason, "WatchFailed");
    assert!(condition.message.contains("Secret: "), "{}", condition.message);

    // The role allows it again: the watch recovers (within its backoff) and says so.
    let mut allowed = roles.get(&role_name).await.unwrap();
    allowed.rules = granted.rules.clone();
    roles.replace(&role_name, &Default::default(), &allowed).await.unwrap();
    wait_until("/readyz answers ok", RECOVERY, || async move {
        matches!(http_get(probes, "/readyz").await, Ok((200, body)) if body == "ok").then_some(())
    })
    .await;
    assert_eq!(sample(&instance.metrics().await, failing), Some(0.0));
    let condition = wait_until("the control plane says every watch works", RECOVERY, || {
        watches_healthy("True")
    })
    .await;
    assert_eq!(condition.reason, "WatchesHealthy");
    drop(instance);
    let _ = roles.delete(&role_name, &DeleteParams::default()).await;
    let binding = format!("{ns}-capn-control-plane-manager");
    let _ = Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(admin)
        .delete(&binding, &DeleteParams::default())
        .await;
}
