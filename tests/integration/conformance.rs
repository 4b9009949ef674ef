//! Issue 13, part 5: upstream conformance on demand. `hack/conformance.sh` builds the
//! upstream e2e binary of a release and runs this `#[ignore]`d test, which boots a tenant of
//! that release through the runner (the boot tests' own [`boot_with`]), optionally moves it
//! to another release first, writes its admin kubeconfig in a form usable verbatim from this
//! host (runner adaptation 11: a local forwarder and `tls-server-name`), runs the e2e binary
//! against it and prints pass, fail and skip counts with every failure and its explanation.
//! Not in CI: it takes many minutes and a long Go build.
//!
//! Environment (set by the script):
//! - `CAPN_CONFORMANCE_RELEASE`: the Kubernetes release to boot (its default etcd);
//! - `CAPN_CONFORMANCE_UPGRADE_TO`: optional; the release to move the tenant to (by setting
//!   `spec.version`, so capn's own upgrade path is used) before the suite runs;
//! - `CAPN_E2E_BINARY`: the `e2e.test` to run (of the release the tenant ends on);
//! - `CAPN_CONFORMANCE_DIR`: where the kubeconfig, the e2e log and its reports go;
//! - `CAPN_CONFORMANCE_FOCUS`: optional, the `--ginkgo.focus` (default: the sig-api-machinery
//!   and sig-auth `[Conformance]` tests);
//! - `CAPN_E2E_ARGS`: optional extra arguments, split on whitespace.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use capn::api::NestedControlPlane;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::boot::{StartCapn, boot_with, release_docs, say};

/// API machinery and authn/authz conformance (`CAPN_CONFORMANCE_FOCUS` widens it, e.g. to
/// sig-apps and sig-network).
const DEFAULT_FOCUS: &str = r"\[sig-(api-machinery|auth)\].*\[Conformance\]";
/// A step of capn's upgrade, generous for a shared machine.
const UPGRADE: Duration = Duration::from_secs(1800);

fn required(name: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| panic!("{name} is not set: run this test through hack/conformance.sh"))
}

/// The control plane the suite runs against: [`release_docs`], with the tenant's service CIDR
/// the super cluster's and NodePort Services copied as such, the setting under which a
/// tenant's ClusterIPs and node ports are ones its pods can dial (docs/design.md §11
/// "Services"), as upstream's Service specs dial them; and the schedulable super nodes shown
/// at all times (`nodes.mode: Schedulable`), as the suite waits for a schedulable Node before
/// specs that make no pod of their own first (the garbage collector's [Serial] specs).
fn conformance_docs(release: &str) -> Vec<serde_json::Value> {
    let mut docs = release_docs(release);
    docs[0]["spec"]["clusterNetwork"] = json!({"services": {"cidrBlocks": [capn_testkit::SUPER_SERVICE_CIDR]}});
    docs[0]["spec"]["workloads"] = json!({"nodePortServices": true, "nodes": {"mode": "Schedulable"}});
    docs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "runs the upstream e2e suite for many minutes; use hack/conformance.sh"]
async fn upstream_conformance() {
    let release = required("CAPN_CONFORMANCE_RELEASE");
    let upgrade_to = std::env::var("CAPN_CONFORMANCE_UPGRADE_TO")
        .ok()
        .filter(|v| !v.is_empty());
    let e2e = PathBuf::from(required("CAPN_E2E_BINARY"));
    let dir = PathBuf::from(required("CAPN_CONFORMANCE_DIR"));
    let focus = std::env::var("CAPN_CONFORMANCE_FOCUS").unwrap_or_else(|_| DEFAULT_FOCUS.to_owned());
    std::fs::create_dir_all(&dir).unwrap();

    let booted = boot_with(
        &format!("conformance {release}"),
        Some(conformance_docs(&release)),
        StartCapn::InProcess,
    )
    .await;
    // The super cluster's node, scheduler and kube-proxy: the syncer runs the suite's pods
    // (webhook servers, their Deployments) on it, as in a cluster with nodes.
    capn_testkit::node();
    let ncps: Api<NestedControlPlane> = Api::namespaced(booted.client.clone(), &booted.ns);
    if let Some(target) = &upgrade_to {
        let started = Instant::now();
        ncps.patch(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"version": target}})),
        )
        .await
        .unwrap_or_else(|e| panic!("set spec.version to {target}: {e}"));
        booted
            .runner
            .wait_for(&format!("the control plane is ready at {target}"), UPGRADE, || async {
                let ncp = ncps.get("demo").await.ok()?;
                let status = ncp.status?;
                let components = status.components?;
                let at_target = |c: &Option<capn::api::ComponentSummary>| {
                    c.as_ref()
                        .is_some_and(|c| c.ready && c.version.as_deref() == Some(target.as_str()))
                };
                let done = status.observed_generation == ncp.metadata.generation
                    && status.ready
                    && status.version.as_deref() == Some(target.as_str())
                    && components.etcd.as_ref().is_some_and(|e| e.ready)
                    && at_target(&components.apiserver)
                    && at_target(&components.controller_manager);
                done.then_some(())
            })
            .await;
        say(&format!(
            "conformance: {release} → {target} in {:.1?}",
            started.elapsed()
        ));
    }

    // The suite starts once the tenant shows a ready Node, as on a cluster whose nodes have
    // registered (`nodes.mode: Schedulable`: the super node, at the syncer's first listing).
    let tenant_nodes = Api::<k8s_openapi::api::core::v1::Node>::all(booted.nested(&booted.kubeconfig().await).await);
    booted
        .runner
        .wait_for("the tenant shows a ready Node", UPGRADE, || async {
            let listed = tenant_nodes.list(&Default::default()).await.ok()?;
            listed
                .items
                .iter()
                .any(|n| {
                    n.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
                })
                .then_some(())
        })
        .await;

    // Adaptation 11: a kubeconfig the e2e binary (client-go) uses verbatim.
    let forward = booted
        .runner
        .forward(&format!("demo-apiserver.{}.svc", booted.ns), 6443)
        .unwrap_or_else(|e| panic!("{e}"));
    let kubeconfig = capn_testkit::runner::forward::host_kubeconfig(&booted.kubeconfig().await, &forward)
        .unwrap_or_else(|e| panic!("{e}"));
    let kubeconfig_path = dir.join("kubeconfig");
    write_private(&kubeconfig_path, &kubeconfig);

    let extra: Vec<String> = std::env::var("CAPN_E2E_ARGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let specs = focused_specs(&e2e, &focus).await;
    say(&format!(
        "conformance: {} specs match the focus; running them {PARALLEL} at a time, [Serial] ones alone afterwards (logs and reports in {})",
        specs.len(),
        dir.display()
    ));
    let started = Instant::now();
    let common: Vec<String> = [
        format!("--kubeconfig={}", kubeconfig_path.display()),
        "--provider=skeleton".into(),
        "--num-nodes=0".into(),
        "--allowed-not-ready-nodes=-1".into(),
        format!("--ginkgo.focus={focus}"),
        "--ginkgo.no-color".into(),
        "--ginkgo.v".into(),
    ]
    .into_iter()
    .chain(extra)
    .collect();
    let (serial, parallel): (Vec<_>, Vec<_>) = specs
        .into_iter()
        .enumerate()
        .partition(|(_, s)| s.name.contains("[Serial]"));
    let limit = std::sync::Arc::new(tokio::sync::Semaphore::new(PARALLEL));
    let mut runs = tokio::task::JoinSet::new();
    for (i, spec) in parallel {
        let (e2e, dir, common, limit) = (e2e.clone(), dir.clone(), common.clone(), limit.clone());
        runs.spawn(async move {
            let _permit = limit.acquire_owned().await.unwrap();
            run_spec(&e2e, &dir, &common, i, &spec).await
        });
    }
    let mut reports = Vec::new();
    while let Some(report) = runs.join_next().await {
        reports.push(report.unwrap());
    }
    for (i, spec) in serial {
        reports.push(run_spec(&e2e, &dir, &common, i, &spec).await);
    }
    say(&format!("conformance: every spec ran after {:.1?}", started.elapsed()));
    // The tenant served the whole run (nothing restarted underneath the suite).
    booted.runner.check().unwrap_or_else(|e| panic!("{e}"));
    let mut summary = Summary::default();
    for report in reports {
        let one = summarize(&report).unwrap_or_else(|e| panic!("{e}"));
        summary.passed += one.passed;
        summary.skipped += one.skipped;
        summary.failed.extend(one.failed);
    }
    summary.failed.sort();
    let text = summary.render(&release, upgrade_to.as_deref());
    std::fs::write(dir.join("summary.txt"), &text).unwrap();
    say(&text);
    drop(forward);
    booted.stop().await;
    assert!(summary.passed + summary.failed.len() > 0, "the focus selected no test");
}

/// How many e2e.test processes run at once. Most specs that fail here wait out a five-minute
/// timeout for a pod that never runs; run one after the other, the suite would take hours.
const PARALLEL: usize = 12;

/// One spec of the suite: where it is defined and its full name.
#[derive(Clone, Debug)]
struct Spec {
    /// `test/e2e/apimachinery/webhook.go:648`, for `--ginkgo.focus-file`.
    location: String,
    name: String,
}

/// The specs whose name matches `focus`, from `e2e.test --list-tests`
/// (`    k8s.io/kubernetes@v1.36.3/test/e2e/…/x.go:123: [sig-…] name`).
async fn focused_specs(e2e: &Path, focus: &str) -> Vec<Spec> {
    let output = tokio::process::Command::new(e2e)
        .arg("--list-tests")
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run {} --list-tests: {e}", e2e.display()));
    let focus = regex::Regex::new(focus).unwrap_or_else(|e| panic!("focus {focus:?}: {e}"));
    let specs: Vec<Spec> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let (location, name) = line.trim().split_once(": ")?;
            let location = location.split_once("/test/").map(|(_, l)| format!("test/{l}"))?;
            focus.is_match(name).then(|| Spec {
                location,
                name: name.to_owned(),
            })
        })
        .collect();
    assert!(!specs.is_empty(), "no spec of {} matches {focus}", e2e.display());
    specs
}

/// Runs one spec in its own e2e.test process and returns its ginkgo JSON report.
async fn run_spec(e2e: &Path, dir: &Path, common: &[String], i: usize, spec: &Spec) -> String {
    let report = dir.join(format!("report-{i:03}.json"));
    let log_path = dir.join(format!("e2e-{i:03}.log"));
    let log = std::fs::File::create(&log_path).unwrap();
    let status = tokio::process::Command::new(e2e)
        .args(common)
        .arg(format!("--ginkgo.focus-file={}", regex::escape(&spec.location)))
        .arg(format!("--ginkgo.json-report={}", report.display()))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .kill_on_drop(true)
        .status()
        .await
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", e2e.display()));
    std::fs::read_to_string(&report).unwrap_or_else(|e| {
        panic!(
            "{} ({status}) wrote no report for {} ({e}); the end of its log:\n{}",
            e2e.display(),
            spec.name,
            tail(&log_path, 40)
        )
    })
}

fn write_private(path: &Path, content: &str) {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    file.write_all(content.as_bytes()).unwrap();
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// What a run selected and how it went.
#[derive(Debug, Default, PartialEq)]
struct Summary {
    passed: usize,
    skipped: usize,
    /// Name, failure message, explanation (when the cause is known).
    failed: Vec<(String, String, Option<&'static str>)>,
}

impl Summary {
    fn render(&self, release: &str, upgrade_to: Option<&str>) -> String {
        let mut out = format!(
            "conformance of {}: {} ran, {} passed, {} failed, {} skipped\n",
            match upgrade_to {
                Some(target) => format!("{release} upgraded to {target}"),
                None => release.to_owned(),
            },
            self.passed + self.failed.len(),
            self.passed,
            self.failed.len(),
            self.skipped
        );
        for (name, message, why) in &self.failed {
            let first = message.lines().next().unwrap_or_default();
            out.push_str(&format!(
                "FAILED {name}\n    {first}\n    why: {}\n",
                why.unwrap_or("UNEXPLAINED: read the e2e log")
            ));
        }
        out
    }
}

/// Reads ginkgo's JSON report: one suite report with a `SpecReports` entry per spec, each
/// with its `State` (`passed`, `failed`, `skipped`, `pending`, …), `ContainerHierarchyTexts`,
/// `LeafNodeText` and `Failure.Message`. Specs the focus did not select are reported as
/// skipped; only the selected ones count, as ginkgo's own summary does.
fn summarize(report: &str) -> Result<Summary, String> {
    let suites: serde_json::Value = serde_json::from_str(report).map_err(|e| format!("report.json: {e}"))?;
    let mut summary = Summary::default();
    for suite in suites.as_array().ok_or("report.json is not a list of suite reports")? {
        for spec in suite["SpecReports"].as_array().into_iter().flatten() {
            // Setup nodes (BeforeSuite, …) have no leaf text; a failure there fails the run.
            let leaf = spec["LeafNodeText"].as_str().unwrap_or_default();
            let mut name: Vec<&str> = spec["ContainerHierarchyTexts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t.as_str())
                .collect();
            name.push(leaf);
            let name = name.join(" ").trim().to_owned();
            let name = if name.is_empty() {
                spec["LeafNodeType"].as_str().unwrap_or("setup").to_owned()
            } else {
                name
            };
            // Only `It` nodes are specs; the suite's setup and report nodes (BeforeSuite,
            // ReportAfterSuite, …) appear too and count only when they fail.
            let is_spec = spec["LeafNodeType"].as_str() == Some("It");
            match spec["State"].as_str().unwrap_or_default() {
                "passed" => summary.passed += usize::from(is_spec),
                "skipped" | "pending" => {
                    // Selected but skipped at run time (e.g. a provider check) counts; specs
                    // outside the focus carry no run time and no failure, and are left out.
                    if is_spec && spec["Failure"]["Message"].as_str().is_some_and(|m| !m.is_empty()) {
                        summary.skipped += 1;
                    }
                }
                _ => {
                    let message = spec["Failure"]["Message"].as_str().unwrap_or_default().to_owned();
                    let output = spec["CapturedGinkgoWriterOutput"].as_str().unwrap_or_default();
                    let why = explain(&message).or_else(|| refused_by_design(output));
                    summary.failed.push((name, message, why));
                }
            }
        }
    }
    Ok(summary)
}

/// Why a spec fails here, when the reason is the test setup's or a documented limit of
/// capn's, not a defect. The suite's pods run (the syncer copies them to the test node), so
/// what is left is:
/// - an image the test node does not run (node adaptation 1); the e2e framework's pod dump
///   then holds the node's message ("the capn test node cannot run image …");
/// - the DaemonSet rollback spec's demand for two schedulable nodes (the test kit has one);
/// - the "complex daemon" spec, which labels a Node for its daemon's node selector: a
///   tenant's Node labels are its own and never reach the super node;
/// - see also [`refused_by_design`].
///
/// A check for a schedulable node before a spec makes any pod ("there are currently no
/// ready, schedulable nodes in the cluster") was explained until the tenant could be shown
/// the schedulable super nodes at all times ([`conformance_docs`]); it is capn's failure now.
fn explain(message: &str) -> Option<&'static str> {
    const IMAGE: &str = "needs an image the test node does not run (node adaptation 1)";
    const TWO_NODES: &str = "needs two schedulable nodes; the test kit has one";
    const NODE_LABELS: &str = "labels a tenant Node for its daemon's node selector: a tenant's Node labels are its own and never reach the super node the pods are scheduled on (docs/design.md §11)";
    if message.contains("cannot run image") {
        Some(IMAGE)
    } else if message.contains("needs a cluster with at least 2 nodes") {
        Some(TWO_NODES)
    } else if message.contains("waiting for daemon pods to be running on new nodes") {
        Some(NODE_LABELS)
    } else {
        None
    }
}

/// Why a spec fails when its pods were refused on purpose: the spec's output (the framework's
/// dump of the namespace's Events) holds capn's refusal of a pod the tenant's workload Pod
/// Security level forbids ("not run by the super cluster: refused: … (Pod Security
/// Standards, baseline)": privileged containers, host networking, host ports). capn never
/// runs those in the super cluster, whatever the tenant asks (docs/design.md §11).
fn refused_by_design(output: &str) -> Option<&'static str> {
    (output.contains("not run by the super cluster: refused:") && output.contains("Pod Security Standards"))
        .then_some("needs a pod the workload Pod Security level refuses (privileged, host network or host port): capn never runs one in the super cluster")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_test_setups_own_limits_are_explained() {
        let image = "Timed out after 300.000s.\nExpected Pod to be in Running\n message: 'container test: the capn test node cannot run image \"nginx\"'";
        assert!(explain(image).is_some_and(|w| w.starts_with("needs an image")));
        // A tenant Node's InternalIP is its super node's: a node port that does not answer
        // there is capn's failure (it was explained while the address was capn's kubelet API).
        let node_port = "service is not reachable within 2m0s timeout on endpoint 198.19.75.1:30419 over TCP protocol";
        assert_eq!(explain(node_port), None);
        let cluster_ip = "service is not reachable within 2m0s timeout on endpoint 10.0.0.7:80 over TCP protocol";
        assert_eq!(explain(cluster_ip), None);
        let two = "Conformance test suite needs a cluster with at least 2 nodes.";
        assert!(explain(two).is_some_and(|w| w.contains("two schedulable nodes")));
        let labelled = "error waiting for daemon pods to be running on new nodes: context deadline exceeded";
        assert!(explain(labelled).is_some_and(|w| w.contains("Node labels")));
        let nodes = "there are currently no ready, schedulable nodes in the cluster";
        assert_eq!(explain(nodes), None, "the tenant is shown the schedulable super nodes");
        // A pod that does not run is capn's failure now: pods run.
        assert_eq!(
            explain("Timed out after 300s waiting for pod pod-x to be running"),
            None
        );
        assert_eq!(explain("unexpected 403"), None);
        let refused = "At 0001-01-01 - event for pod-x: { } HostNetworkForbidden: not run by the super cluster: refused: spec.hostNetwork: must be false or unset (Pod Security Standards, baseline)";
        assert!(refused_by_design(refused).is_some_and(|w| w.contains("Pod Security")));
        let other =
            "event for pod-x: { } ImageRefused: not run by the super cluster: refused: an image the policy forbids";
        assert_eq!(refused_by_design(other), None);
    }

    #[test]
    fn a_ginkgo_report_is_counted_and_failures_explained() {
        let report = json!([{
            "SpecReports": [
                {"State": "passed", "LeafNodeType": "It", "LeafNodeText": "should list",
                 "ContainerHierarchyTexts": ["[sig-api-machinery] Namespaces [Serial]"]},
                {"State": "passed", "LeafNodeType": "BeforeSuite", "LeafNodeText": ""},
                {"State": "passed", "LeafNodeType": "ReportAfterSuite", "LeafNodeText": "Kubernetes e2e JUnit report"},
                {"State": "skipped", "LeafNodeType": "It", "LeafNodeText": "outside the focus",
                 "ContainerHierarchyTexts": ["[sig-node] Pods"]},
                {"State": "skipped", "LeafNodeType": "It", "LeafNodeText": "on a provider",
                 "ContainerHierarchyTexts": ["[sig-auth] x"], "Failure": {"Message": "Only supported for providers [gce]"}},
                {"State": "failed", "LeafNodeType": "It", "LeafNodeText": "should mount a projected token",
                 "ContainerHierarchyTexts": ["[sig-auth] ServiceAccounts"],
                 "Failure": {"Message": "Timed out after 300s waiting for pod pod-x to be running"}},
                {"State": "failed", "LeafNodeType": "It", "LeafNodeText": "should do something odd",
                 "ContainerHierarchyTexts": ["[sig-api-machinery] Odd"],
                 "Failure": {"Message": "expected 1, got 2"}},
            ]
        }]);
        let summary = summarize(&report.to_string()).unwrap();
        assert_eq!(summary.passed, 1);
        assert_eq!(summary.skipped, 1);
        assert_eq!(summary.failed.len(), 2);
        assert_eq!(
            summary.failed[0].0,
            "[sig-auth] ServiceAccounts should mount a projected token"
        );
        assert!(
            summary.failed[0].2.is_none(),
            "a pod that does not run is not explained away: pods run here"
        );
        assert_eq!(summary.failed[1].2, None);
        let text = summary.render("1.36.3", None);
        assert!(
            text.starts_with("conformance of 1.36.3: 3 ran, 1 passed, 2 failed, 1 skipped\n"),
            "{text}"
        );
        assert!(text.contains("UNEXPLAINED"), "{text}");
        assert!(summarize("{}").is_err());
    }
}
