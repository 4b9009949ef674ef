//! Issue 41, item 2, "Install in one line": the Helm chart `charts/capn` and the release
//! workflow `.github/workflows/release.yml`, checked with the real `helm` and `actionlint`
//! (built from their Go modules by `hack/helm-assets.sh`; `HELM_ASSETS`).
//!
//! The chart is linted (its values schema must refuse a bad value), rendered and compared
//! with the code it must not drift from (the CRDs, both providers' ClusterRole rules, the
//! clusterctl Deployment's pod, the PriorityClass), applied to the test super cluster (its
//! objects validated by a real apiserver), and its RBAC and arguments proven enough: `capn
//! run` with the chart's Deployment arguments, authenticated as the chart's ServiceAccount,
//! boots a control plane.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use capn::manifests::{Provider, cluster_role_rules};
use capn_testkit::{cluster, test_namespace};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::boot::{BOOTED_STEP, StartCapn, boot_with, say, whoami};
use crate::harness::{apply_cluster_doc, apply_doc};

const CHART: &str = "charts/capn";
const WORKFLOW: &str = ".github/workflows/release.yml";
/// The variable naming the directory of `helm` and `actionlint`.
const ASSETS_VARIABLE: &str = "HELM_ASSETS";

fn repository() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `HELM_ASSETS`, else what `hack/helm-assets.sh` prints; checked to hold `helm` and
/// `actionlint`.
fn assets() -> PathBuf {
    crate::harness::go_assets(ASSETS_VARIABLE, "helm-assets.sh", &["helm", "actionlint"])
}

/// Runs a binary of the assets in the repository's root.
fn tool(binary: &str, args: &[&str]) -> Output {
    let path = assets().join(binary);
    Command::new(&path)
        .args(args)
        .current_dir(repository())
        .env("HOME", std::env::temp_dir())
        .output()
        .unwrap_or_else(|e| panic!("{} does not run: {e}", path.display()))
}

/// Standard output and error of a run, for messages.
fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// `helm template <release> charts/capn --namespace <ns> --include-crds --set <set>...`,
/// parsed.
fn render(release: &str, ns: &str, sets: &[&str]) -> Vec<Value> {
    let mut args = vec!["template", release, CHART, "--namespace", ns, "--include-crds"];
    for set in sets {
        args.extend(["--set", set]);
    }
    let output = tool("helm", &args);
    assert!(output.status.success(), "helm {args:?} failed:\n{}", text(&output));
    let yaml = String::from_utf8_lossy(&output.stdout);
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&yaml).unwrap_or_else(|e| panic!("helm's output does not parse: {e}\n{yaml}"));
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

fn find<'a>(objects: &'a [Value], kind: &str) -> Option<&'a Value> {
    objects.iter().find(|o| o["kind"] == kind)
}

fn the<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    let all: Vec<&Value> = objects.iter().filter(|o| o["kind"] == kind).collect();
    assert_eq!(all.len(), 1, "the chart renders one {kind}: {all:#?}");
    all[0]
}

/// Every (apiGroup, resource, verb) a list of RBAC rules grants: equal sets grant the same,
/// however the rules are grouped.
fn grants(rules: &[Value]) -> BTreeSet<(String, String, String)> {
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .map(|s| s.as_str().unwrap_or_default().to_owned())
            .collect()
    };
    let mut out = BTreeSet::new();
    for rule in rules {
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                for verb in strings(&rule["verbs"]) {
                    out.insert((group.clone(), resource.clone(), verb));
                }
            }
        }
    }
    out
}

/// The container of a rendered Deployment.
fn container(deployment: &Value) -> &Value {
    &deployment["spec"]["template"]["spec"]["containers"][0]
}

fn args(deployment: &Value) -> Vec<String> {
    container(deployment)["args"]
        .as_array()
        .expect("the container has args")
        .iter()
        .map(|a| a.as_str().unwrap_or_default().to_owned())
        .collect()
}

/// The image the chart runs by default: the release tag of the crate's version.
fn default_image() -> String {
    format!("ghcr.io/capn/capn:v{}", env!("CARGO_PKG_VERSION"))
}

/// What the rendered chart must be, whatever the values: the code's CRDs, the union of both
/// providers' rules, the clusterctl Deployment's pod, `capn priority-class`'s object.
fn check_against_the_code(objects: &[Value], release: &str, ns: &str, image: &str) {
    // The CRDs: the code's.
    let mut rendered: Vec<Value> = objects
        .iter()
        .filter(|o| o["kind"] == "CustomResourceDefinition")
        .cloned()
        .collect();
    let mut code: Vec<Value> = capn::crds::crds()
        .into_iter()
        .map(|c| serde_json::to_value(c).unwrap())
        .collect();
    let by_name = |v: &Value| v["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    rendered.sort_by_key(by_name);
    code.sort_by_key(by_name);
    assert_eq!(rendered.len(), code.len(), "the chart's CRDs are the code's");
    for (r, c) in rendered.iter().zip(&code) {
        assert!(r == c, "CRD {} differs from the code's", by_name(c));
    }

    // One ServiceAccount, bound cluster-wide to a ClusterRole granting exactly what both
    // providers' ClusterRoles grant (one Deployment runs both), nothing more.
    let account = the(objects, "ServiceAccount");
    let name = account["metadata"]["name"].as_str().unwrap().to_owned();
    assert_eq!(account["metadata"]["namespace"], ns);
    let named = |kind: &str, name: &str| {
        objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("the chart renders the {kind} {name}"))
    };
    let role = named("ClusterRole", &name);
    let mut union = cluster_role_rules(Provider::ControlPlane);
    union.extend(cluster_role_rules(Provider::Infrastructure));
    let chart_grants = grants(role["rules"].as_array().unwrap());
    let code_grants = grants(&union);
    assert!(
        chart_grants == code_grants,
        "the chart's ClusterRole differs from capn::manifests::cluster_role_rules of both providers:\n\
         only in the chart: {:?}\nonly in the code: {:?}",
        chart_grants.difference(&code_grants).collect::<Vec<_>>(),
        code_grants.difference(&chart_grants).collect::<Vec<_>>()
    );
    let binding = named("ClusterRoleBinding", &name);
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": name, "namespace": ns}])
    );
    // The rights on the synced custom resource kinds come by aggregation, as in the
    // clusterctl components; nothing else is cluster-wide.
    let synced_kinds = format!("{name}-synced-kinds");
    let aggregated = named("ClusterRole", &synced_kinds);
    let shipped = capn::manifests::components(Provider::ControlPlane)
        .into_iter()
        .find(|o| o["kind"] == "ClusterRole" && o["aggregationRule"].is_object())
        .expect("the clusterctl components aggregate the synced kinds' rights");
    assert_eq!(aggregated["aggregationRule"], shipped["aggregationRule"]);
    assert_eq!(
        named("ClusterRoleBinding", &synced_kinds)["subjects"],
        binding["subjects"]
    );
    assert_eq!(
        objects.iter().filter(|o| o["kind"] == "ClusterRole").count(),
        2,
        "two ClusterRoles: capn's and the synced kinds'"
    );
    for o in objects {
        let labels = &o["metadata"]["labels"];
        if o["kind"] != "CustomResourceDefinition" {
            assert_eq!(labels["app.kubernetes.io/instance"], release, "{}", o["kind"]);
            assert_eq!(labels["app.kubernetes.io/managed-by"], "Helm", "{}", o["kind"]);
            assert_eq!(labels["app.kubernetes.io/name"], "capn", "{}", o["kind"]);
        }
    }

    // The pod is the clusterctl components' pod: same security, probes, ports, env and
    // resources, with the image the chart's values name (`image`).
    let deployment = the(objects, "Deployment");
    let components = capn::manifests::components(Provider::ControlPlane);
    let shipped = find(&components, "Deployment").unwrap();
    let placeholder = container(shipped)["image"].as_str().unwrap().to_owned();
    let shipped_pod = serde_json::to_string(&shipped["spec"]["template"]["spec"])
        .unwrap()
        .replace(&placeholder, image);
    let shipped_pod: Value = serde_json::from_str(&shipped_pod).unwrap();
    let pod = &deployment["spec"]["template"]["spec"];
    for field in ["securityContext", "terminationGracePeriodSeconds"] {
        assert_eq!(pod[field], shipped_pod[field], "pod {field}");
    }
    assert_eq!(pod["serviceAccountName"], name.as_str());
    for field in [
        "securityContext",
        "env",
        "ports",
        "livenessProbe",
        "readinessProbe",
        "resources",
        "imagePullPolicy",
        "image",
    ] {
        assert_eq!(
            container(deployment)[field],
            shipped_pod["containers"][0][field],
            "container {field}"
        );
    }
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    for (k, v) in capn::plan::policy::DEFAULT_CAPN_POD_LABELS
        .split(',')
        .filter_map(|l| l.split_once('='))
    {
        assert_eq!(pod_labels[k], v, "the pods carry --self-labels' default {k}={v}");
    }
    for (k, v) in deployment["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(&pod_labels[k], v, "the selector selects the pods");
    }
    let service = the(objects, "Service");
    assert_eq!(
        service["spec"]["selector"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(service["spec"]["ports"][0]["port"], 8080);
}

/// Every file of `dir`, by name: (name, text), sorted.
fn listing(dir: &Path) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let path = e.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(&path).unwrap())
        })
        .collect();
    files.sort();
    files
}

#[test]
fn the_charts_crds_are_copies_of_crds_and_its_versions_are_the_crates() {
    let chart = listing(&repository().join(CHART).join("crds"));
    let crds = listing(&repository().join("crds"));
    let names = |files: &[(String, String)]| files.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&chart), names(&crds), "charts/capn/crds holds the files of crds/");
    for ((name, chart_text), (_, text)) in chart.iter().zip(&crds) {
        assert!(
            chart_text == text,
            "charts/capn/crds/{name} differs from crds/{name}: copy it (cp crds/*.yaml charts/capn/crds/)"
        );
    }
    let chart_yaml: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(repository().join(CHART).join("Chart.yaml")).unwrap()).unwrap();
    assert_eq!(chart_yaml["apiVersion"], "v2");
    assert_eq!(chart_yaml["version"], env!("CARGO_PKG_VERSION"), "Chart.yaml version");
    assert_eq!(
        chart_yaml["appVersion"],
        env!("CARGO_PKG_VERSION"),
        "Chart.yaml appVersion"
    );
}

/// The monitoring toggles render the Prometheus Operator's and Grafana's objects, and only
/// when asked: the alerts are `deploy/monitoring/rules.yaml`'s groups, the dashboards its
/// JSON files, and the ServiceMonitor scrapes the metrics Service's port.
#[test]
fn the_monitoring_values_render_the_alerts_dashboards_and_scrape_of_deploy_monitoring() {
    let (release, ns) = ("capn-watched", "capn-system");
    let defaults = render(release, ns, &[]);
    for kind in ["ServiceMonitor", "PrometheusRule", "ConfigMap"] {
        assert!(find(&defaults, kind).is_none(), "no {kind} unless asked");
    }
    let objects = render(
        release,
        ns,
        &[
            "monitoring.serviceMonitor.enabled=true",
            "monitoring.serviceMonitor.labels.release=kube-prometheus-stack",
            "monitoring.prometheusRule.enabled=true",
            "monitoring.prometheusRule.labels.release=kube-prometheus-stack",
            "monitoring.dashboards.enabled=true",
            "monitoring.dashboards.namespace=monitoring",
        ],
    );
    check_against_the_code(&objects, release, ns, &default_image());
    let deploy = repository().join("deploy/monitoring");
    let rules: Value = serde_saphyr::from_str(&std::fs::read_to_string(deploy.join("rules.yaml")).unwrap()).unwrap();
    let rule = the(&objects, "PrometheusRule");
    assert_eq!(rule["spec"], rules, "the PrometheusRule's spec is rules.yaml's groups");
    assert_eq!(rule["metadata"]["labels"]["release"], "kube-prometheus-stack");
    assert_eq!(rule["metadata"]["namespace"], ns);

    let dashboards = the(&objects, "ConfigMap");
    assert_eq!(dashboards["metadata"]["namespace"], "monitoring");
    assert_eq!(dashboards["metadata"]["labels"]["grafana_dashboard"], "1");
    let files = listing(&deploy.join("dashboards"));
    let data: Vec<(String, String)> = dashboards["data"]
        .as_object()
        .expect("the dashboards ConfigMap has data")
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(
        data, files,
        "the ConfigMap holds deploy/monitoring/dashboards/, byte for byte"
    );

    let monitor = the(&objects, "ServiceMonitor");
    assert_eq!(monitor["metadata"]["labels"]["release"], "kube-prometheus-stack");
    let service = the(&objects, "Service");
    for (key, value) in monitor["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(
            &service["metadata"]["labels"][key], value,
            "the ServiceMonitor selects the metrics Service by {key}"
        );
    }
    let port = monitor["spec"]["endpoints"][0]["port"].as_str().unwrap();
    assert!(
        service["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == port),
        "the metrics Service has the port {port} the ServiceMonitor scrapes"
    );
    // Prometheus refuses an interval that is not its duration: so does the schema.
    let bad = tool(
        "helm",
        &[
            "lint",
            "--strict",
            CHART,
            "--set",
            "monitoring.serviceMonitor.interval=30 seconds",
        ],
    );
    assert!(
        !bad.status.success(),
        "helm lint accepted a bad interval:\n{}",
        text(&bad)
    );
}

#[test]
fn helm_lints_the_chart_its_schema_refuses_bad_values_and_actionlint_passes_the_release_workflow() {
    let lint = tool("helm", &["lint", "--strict", CHART]);
    assert!(lint.status.success(), "helm lint --strict failed:\n{}", text(&lint));
    for (set, path, allowed) in [
        ("logFormat=xml", "/logFormat", "'json', 'text'"),
        (
            "tenantConnection=sideways",
            "/tenantConnection",
            "'auto', 'direct', 'port-forward'",
        ),
    ] {
        let bad = tool("helm", &["lint", "--strict", CHART, "--set", set]);
        let out = text(&bad);
        assert!(!bad.status.success(), "helm lint accepted --set {set}:\n{out}");
        assert!(
            out.contains(path) && out.contains(allowed) && out.contains("schema"),
            "helm lint --set {set} failed, but not on the values schema:\n{out}"
        );
    }
    // A value the schema does not know is refused too (a typo in a value's name).
    let typo = tool("helm", &["lint", "--strict", CHART, "--set", "logformat=text"]);
    assert!(
        !typo.status.success(),
        "helm lint accepted an unknown value:\n{}",
        text(&typo)
    );

    let workflow = tool("actionlint", &[WORKFLOW]);
    assert!(workflow.status.success(), "actionlint {WORKFLOW}:\n{}", text(&workflow));
    // actionlint does check: the same workflow with an expression naming a context that
    // does not exist is refused.
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("release.yml");
    let original = std::fs::read_to_string(repository().join(WORKFLOW)).unwrap();
    assert!(original.contains("${{ github.ref_name }}"));
    std::fs::write(
        &broken,
        original.replacen("${{ github.ref_name }}", "${{ github.no_such_field }}", 1),
    )
    .unwrap();
    let refused = tool("actionlint", &[broken.to_str().unwrap()]);
    assert!(
        !refused.status.success() && text(&refused).contains("no_such_field"),
        "actionlint passed a broken workflow:\n{}",
        text(&refused)
    );
}

#[test]
fn the_rendered_chart_is_the_codes_objects_with_the_arguments_its_values_ask_for() {
    let (release, ns) = ("capn-render", "capn-system");
    let defaults = render(release, ns, &[]);
    check_against_the_code(&defaults, release, ns, &default_image());
    let deployment = the(&defaults, "Deployment");
    assert_eq!(
        args(deployment),
        [
            "run",
            "--controllers=*",
            "--super-cluster-dns-domain=cluster.local",
            "--log-format=json",
            "--tenant-connection=auto",
            "--metrics-bind-address=0.0.0.0:8080",
            "--health-probe-bind-address=0.0.0.0:8081",
            "--leader-elect",
            "--leader-election-id=capn-render",
        ]
    );
    assert_eq!(deployment["spec"]["replicas"], 1);
    // Leader election: Leases in the release's namespace, as the clusterctl components'.
    let role = the(&defaults, "Role");
    assert_eq!(role["metadata"]["namespace"], ns);
    let shipped_components = capn::manifests::components(Provider::ControlPlane);
    let shipped_role = find(&shipped_components, "Role").unwrap();
    assert_eq!(role["rules"], shipped_role["rules"]);
    let role_binding = the(&defaults, "RoleBinding");
    assert_eq!(role_binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(role_binding["subjects"][0]["name"], "capn-render");
    // The PriorityClass `capn priority-class` prints, with the chart's labels.
    let mut class = the(&defaults, "PriorityClass").clone();
    class["metadata"].as_object_mut().unwrap().remove("labels");
    assert_eq!(class, capn::plan::policy::priority_class());

    // Each value reaches the arguments.
    let custom = render(
        "other",
        ns,
        &[
            "watchFilter=team-a",
            "logFormat=text",
            "tenantConnection=port-forward",
            "superClusterDnsDomain=corp.example",
            "replicas=2",
            "image.tag=dev",
            "image.repository=registry.example/capn",
        ],
    );
    check_against_the_code(&custom, "other", ns, "registry.example/capn:dev");
    let deployment = the(&custom, "Deployment");
    let custom_args = args(deployment);
    for expected in [
        "--watch-filter=team-a",
        "--log-format=text",
        "--tenant-connection=port-forward",
        "--super-cluster-dns-domain=corp.example",
        "--leader-election-id=other-capn",
    ] {
        assert!(
            custom_args.iter().any(|a| a == expected),
            "{expected} in {custom_args:?}"
        );
    }
    assert_eq!(deployment["spec"]["replicas"], 2);
    assert_eq!(container(deployment)["image"], "registry.example/capn:dev");
    let watch = render("watch", ns, &["watchFilter=x"]);
    assert!(args(the(&watch, "Deployment")).iter().any(|a| a == "--watch-filter=x"));
    assert!(
        !args(the(&defaults, "Deployment"))
            .iter()
            .any(|a| a.starts_with("--watch-filter")),
        "an empty watchFilter passes no flag"
    );

    // The toggles.
    let off = render(
        release,
        ns,
        &["leaderElection.enabled=false", "priorityClass.create=false"],
    );
    assert!(find(&off, "PriorityClass").is_none());
    assert!(find(&off, "Role").is_none() && find(&off, "RoleBinding").is_none());
    assert!(
        !args(the(&off, "Deployment"))
            .iter()
            .any(|a| a.starts_with("--leader-elect"))
    );
}

/// Server-side applies `doc` as `helm` would send it; `dry_run` validates it (schema,
/// admission) without storing it.
async fn apply_dry_run(client: &kube::Client, doc: &Value) {
    let api_version = doc["apiVersion"].as_str().unwrap();
    let kind = doc["kind"].as_str().unwrap();
    let name = doc["metadata"]["name"].as_str().unwrap();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    let api: Api<DynamicObject> = match doc["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    let mut params = PatchParams::apply("helm");
    params.dry_run = true;
    api.patch(name, &params, &Patch::Apply(doc))
        .await
        .unwrap_or_else(|e| panic!("the apiserver refuses the chart's {kind} {name}: {e}"));
}

/// The chart's objects, applied; deleted (the cluster-scoped ones and the namespace) on drop.
struct Installed {
    client: kube::Client,
    ns: String,
    cluster_scoped: Vec<(String, String)>,
}

impl Installed {
    async fn delete(self) {
        for (kind, name) in &self.cluster_scoped {
            let result = match kind.as_str() {
                "ClusterRole" => Api::<ClusterRole>::all(self.client.clone())
                    .delete(name, &DeleteParams::default())
                    .await
                    .map(drop),
                "ClusterRoleBinding" => Api::<ClusterRoleBinding>::all(self.client.clone())
                    .delete(name, &DeleteParams::default())
                    .await
                    .map(drop),
                other => panic!("the test applies no cluster-scoped {other}"),
            };
            result.unwrap_or_else(|e| panic!("deleting {kind} {name}: {e}"));
        }
        Api::<Namespace>::all(self.client.clone())
            .delete(&self.ns, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("deleting namespace {}: {e}", self.ns));
    }
}

/// Applies the rendered chart to the test cluster (CRDs excepted: the test cluster has
/// capn's). The Deployment and the PriorityClass are applied as a dry run: a stored
/// Deployment would have the test cluster schedule pods of an image no test node runs, and
/// the PriorityClass is cluster-wide under a fixed name that other tests apply and use.
async fn install(client: &kube::Client, ns: &str, objects: &[Value]) -> Installed {
    let mut installed = Installed {
        client: client.clone(),
        ns: ns.to_owned(),
        cluster_scoped: Vec::new(),
    };
    for o in objects {
        let kind = o["kind"].as_str().unwrap();
        let name = o["metadata"]["name"].as_str().unwrap().to_owned();
        match kind {
            "CustomResourceDefinition" => {}
            "Deployment" | "PriorityClass" => apply_dry_run(client, o).await,
            "ClusterRole" | "ClusterRoleBinding" => {
                apply_cluster_doc(client, o.clone()).await;
                installed.cluster_scoped.push((kind.to_owned(), name));
            }
            _ => {
                assert_eq!(
                    o["metadata"]["namespace"], ns,
                    "{kind} {name} is in the release's namespace"
                );
                apply_doc(client, ns, o.clone()).await;
            }
        }
    }
    installed
}

/// A kubeconfig of the test cluster authenticated by `token` instead of the admin's.
fn kubeconfig_with_token(token: &str) -> String {
    let admin = std::fs::read_to_string(cluster().kubeconfig_path()).unwrap();
    let mut replaced = 0;
    let text: Vec<String> = admin
        .lines()
        .map(|line| match line.split_once("token:") {
            Some((indent, _)) if indent.trim().is_empty() => {
                replaced += 1;
                format!("{indent}token: {token}")
            }
            _ => line.to_owned(),
        })
        .collect();
    assert_eq!(replaced, 1, "the test cluster's kubeconfig has one token:\n{admin}");
    text.join("\n") + "\n"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capn_run_as_the_charts_service_account_with_its_arguments_boots_a_control_plane() {
    let started = std::time::Instant::now();
    let client = cluster().client();
    // The release's own namespace (capn-system in a real install); the control plane is
    // booted in another, as tenants are.
    let release_ns = test_namespace(&client).await;
    let release = format!("capn-{}", release_ns.trim_start_matches("capn-test-"));
    let objects = render(&release, &release_ns, &[]);
    check_against_the_code(&objects, &release, &release_ns, &default_image());
    let installed = install(&client, &release_ns, &objects).await;
    say(&format!("helm: chart applied as release {release} in {release_ns}"));

    // The ServiceAccount's token, as the pod would mount it.
    let account = the(&objects, "ServiceAccount")["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let issued = Api::<ServiceAccount>::namespaced(client.clone(), &release_ns)
        .create_token_request(
            &account,
            &PostParams::default(),
            &TokenRequest {
                spec: Some(TokenRequestSpec {
                    expiration_seconds: Some(3600),
                    ..TokenRequestSpec::default()
                }),
                ..TokenRequest::default()
            },
        )
        .await
        .expect("TokenRequest for the chart's ServiceAccount");
    let token = issued.status.and_then(|s| s.token).expect("a token");
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, kubeconfig_with_token(&token)).unwrap();
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let as_chart = kube::Client::try_from(config).unwrap();
    let user = format!("system:serviceaccount:{release_ns}:{account}");
    assert_eq!(whoami(&as_chart).await.unwrap(), user);
    // The token has the chart's rights, not more: Deployments are not among them.
    let denied = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(as_chart.clone(), &release_ns)
        .list(&Default::default())
        .await;
    assert!(
        denied.as_ref().is_err_and(|e| e.to_string().contains("forbidden")),
        "the chart's ServiceAccount may list Deployments: {denied:?}"
    );

    // The Deployment's arguments, but what cannot work outside a pod: the metrics and probe
    // addresses (the harness binds loopback port 0 instead), and what the harness passes
    // itself: `run` and `--log-format=json` (the chart's default too; clap takes it once).
    // Its environment from the downward API, but POD_IP (no pod IP to serve the kubelet API
    // and tenant DNS at).
    let deployment = the(&objects, "Deployment");
    let args: Vec<String> = args(deployment)
        .into_iter()
        .filter(|a| {
            a != "run"
                && a != "--log-format=json"
                && !a.starts_with("--metrics-bind-address")
                && !a.starts_with("--health-probe-bind-address")
        })
        .collect();
    assert!(args.iter().any(|a| a == "--leader-elect"), "{args:?}");
    let pod_name = format!("{release}-outside");
    let env = vec![
        ("POD_NAME".to_owned(), pod_name.clone()),
        ("POD_NAMESPACE".to_owned(), release_ns.clone()),
        ("CAPN_IMAGE".to_owned(), default_image()),
    ];
    let booted = boot_with(
        "helm",
        None,
        StartCapn::ProcessOutsideAs {
            args,
            kubeconfig: kubeconfig.clone(),
            env,
        },
    )
    .await;
    say(&format!("helm: ready {:.1?} after the test started", started.elapsed()));

    // It led through the Lease the chart's Role allows, in the release's namespace.
    let lease = Api::<Lease>::namespaced(client.clone(), &release_ns)
        .get(&release)
        .await
        .unwrap_or_else(|e| panic!("no leader-election Lease {release} in {release_ns}: {e}"));
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some(pod_name.as_str())
    );
    // The tenant answers through the kubeconfig capn wrote.
    let readyz = booted.readyz().await;
    assert_eq!(readyz, "ok");
    // No request of capn's was refused by the super cluster's RBAC.
    let log = booted.capn_log().expect("capn runs as a process");
    let refused: Vec<&str> = log.lines().filter(|l| l.contains(&user)).collect();
    assert!(
        refused.is_empty(),
        "the super cluster refused requests of the chart's ServiceAccount:\n{}",
        refused.join("\n")
    );
    // The public-CRD sync, under the chart's rights (it lists and watches the super
    // cluster's CRDs): a public CRD reaches the tenant.
    let suffix = release_ns.trim_start_matches("capn-test-").to_owned();
    let crd_name = format!("widgets.h{suffix}.example.com");
    let supers: Api<CustomResourceDefinition> = Api::all(client.clone());
    let doc = crate::public_crds::crd(&crd_name, "widgets", "Widget", true, &["v1"]);
    supers
        .patch(
            &crd_name,
            &PatchParams::apply("platform-team").force(),
            &Patch::Apply(&doc),
        )
        .await
        .unwrap();
    let tenant_crds: Api<CustomResourceDefinition> = Api::all(booted.nested(&booted.kubeconfig().await).await);
    booted
        .runner
        .wait_for("the public CRD reaches the tenant", BOOTED_STEP, || async {
            tenant_crds.get_opt(&crd_name).await.ok().flatten().map(drop)
        })
        .await;
    let log = booted.capn_log().unwrap_or_default();
    let refused: Vec<&str> = log.lines().filter(|l| l.contains(&user)).collect();
    assert!(refused.is_empty(), "refused later:\n{}", refused.join("\n"));
    supers.delete(&crd_name, &DeleteParams::default()).await.unwrap();
    let tenant_ns = booted.ns.clone();
    booted.stop().await;
    installed.delete().await;
    Api::<Namespace>::all(client.clone())
        .delete(&tenant_ns, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting namespace {tenant_ns}: {e}"));
    say(&format!("helm: done in {:.1?}", started.elapsed()));
}
