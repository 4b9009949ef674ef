//! Issue 40, item 5, "Dashboards and alerts in the repo": `deploy/monitoring/`, checked with
//! the real `promtool` (built from its Go module by `hack/promtool-assets.sh`;
//! `PROMTOOL_ASSETS`), not by eye.
//!
//! - `rules.yaml` passes `promtool check rules`, and its unit tests (`rules.test.yaml`) pass
//!   `promtool test rules`; every alert has a test that fires it and one where it stays
//!   quiet, and points at its section of docs/operations/metrics.md.
//! - `prometheusrule.yaml` is `rules.yaml` wrapped in a PrometheusRule, generated
//!   (`UPDATE_MANIFESTS=1` rewrites it), never kept by hand.
//! - Every query of the dashboards is PromQL that promtool accepts, and their panels have
//!   unique ids.
//! - Every `capn_*` series named in the rules, their tests and the dashboards is one that
//!   capn's `/metrics` serves, so a renamed metric fails here.
//!
//! - Against the test super cluster, capn's controllers export a control plane's readiness
//!   and certificate schedule under its labels, as the alerts read them.
//!
//! Only the last test starts the super cluster; the others run promtool alone.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use serde_json::{Value, json};

const MONITORING: &str = "deploy/monitoring";
const RULES: &str = "deploy/monitoring/rules.yaml";
const RULE_TESTS: &str = "deploy/monitoring/rules.test.yaml";
const PROMETHEUS_RULE: &str = "deploy/monitoring/prometheusrule.yaml";
const DASHBOARDS: &str = "deploy/monitoring/dashboards";
const METRICS_PAGE: &str = "docs/operations/metrics.md";
/// The variable naming the directory of `promtool`.
const ASSETS_VARIABLE: &str = "PROMTOOL_ASSETS";

fn repository() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repository().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn yaml(path: &str) -> Value {
    serde_saphyr::from_str(&read(path)).unwrap_or_else(|e| panic!("{path} does not parse: {e}"))
}

/// `PROMTOOL_ASSETS`, else what `hack/promtool-assets.sh` prints: the `promtool` binary.
fn promtool() -> PathBuf {
    crate::harness::go_assets(ASSETS_VARIABLE, "promtool-assets.sh", &["promtool"]).join("promtool")
}

/// Runs `promtool` with `args` in the repository's root.
fn run_promtool(args: &[&str]) -> Output {
    let path = promtool();
    Command::new(&path)
        .args(args)
        .current_dir(repository())
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

/// Every alerting rule of a rule-groups document, by name.
fn alerts(rules: &Value) -> BTreeMap<String, Value> {
    let groups = rules["groups"].as_array().expect("groups");
    let mut out = BTreeMap::new();
    for rule in groups.iter().flat_map(|g| g["rules"].as_array().expect("rules").iter()) {
        if let Some(name) = rule["alert"].as_str() {
            assert!(
                out.insert(name.to_owned(), rule.clone()).is_none(),
                "alert {name} is defined twice"
            );
        }
    }
    out
}

/// The alerts of `rules` that `tests` (a promtool unit-test document) never expects to fire,
/// or never checks staying quiet, each with what it lacks.
fn alerts_without_tests(rules: &Value, tests: &Value) -> Vec<String> {
    let (mut fired, mut quiet) = (BTreeSet::new(), BTreeSet::new());
    for case in tests["tests"]
        .as_array()
        .expect("tests")
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().into_iter().flatten())
    {
        let name = case["alertname"].as_str().unwrap_or_default().to_owned();
        if case["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()) {
            fired.insert(name);
        } else {
            quiet.insert(name);
        }
    }
    let mut out = Vec::new();
    for name in alerts(rules).into_keys() {
        if !fired.contains(&name) {
            out.push(format!("{name}: no test expects it to fire"));
        }
        if !quiet.contains(&name) {
            out.push(format!("{name}: no test checks that it stays quiet"));
        }
    }
    out
}

#[test]
fn rules_pass_promtool_and_their_unit_tests() {
    let checked = run_promtool(&["check", "rules", RULES]);
    assert!(
        checked.status.success(),
        "promtool check rules {RULES}:\n{}",
        text(&checked)
    );
    let tested = run_promtool(&["test", "rules", RULE_TESTS]);
    assert!(
        tested.status.success(),
        "promtool test rules {RULE_TESTS}:\n{}",
        text(&tested)
    );
    println!("{}", text(&tested).trim());
    // promtool itself refuses a rule that is not PromQL: the check above means something.
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.yaml");
    std::fs::write(
        &broken,
        "groups:\n  - name: broken\n    rules:\n      - alert: Broken\n        expr: capn_control_plane_ready ==\n",
    )
    .unwrap();
    let refused = run_promtool(&["check", "rules", broken.to_str().unwrap()]);
    assert!(
        !refused.status.success(),
        "promtool accepted a broken rule:\n{}",
        text(&refused)
    );
}

#[test]
fn every_alert_has_a_unit_test_that_fires_it_and_one_that_does_not() {
    let (rules, tests) = (yaml(RULES), yaml(RULE_TESTS));
    assert!(alerts(&rules).len() >= 11, "{:?}", alerts(&rules).keys());
    let missing = alerts_without_tests(&rules, &tests);
    assert!(missing.is_empty(), "{RULE_TESTS} lacks tests:\n{}", missing.join("\n"));
    // The check finds an alert added without a test.
    let mut more = rules.clone();
    more["groups"][0]["rules"]
        .as_array_mut()
        .unwrap()
        .push(json!({"alert": "CapnUntested", "expr": "vector(1)"}));
    assert_eq!(
        alerts_without_tests(&more, &tests),
        [
            "CapnUntested: no test expects it to fire",
            "CapnUntested: no test checks that it stays quiet"
        ]
    );
}

/// A heading's anchor as mdbook makes it: lower case, spaces to dashes, other punctuation
/// dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn every_alert_has_a_severity_a_summary_and_its_section_of_the_metrics_page() {
    let page = read(METRICS_PAGE);
    let anchors: BTreeSet<String> = page
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect();
    for (name, rule) in alerts(&yaml(RULES)) {
        let severity = rule["labels"]["severity"].as_str();
        assert!(
            matches!(severity, Some("warning" | "critical")),
            "{name}: severity {severity:?}"
        );
        for annotation in ["summary", "description"] {
            assert!(
                rule["annotations"][annotation].as_str().is_some_and(|s| !s.is_empty()),
                "{name}: no {annotation}"
            );
        }
        let runbook = rule["annotations"]["runbook_url"].as_str().unwrap_or_default();
        let wanted = format!("{METRICS_PAGE}#{}", name.to_lowercase());
        assert_eq!(runbook, wanted, "{name}: runbook_url");
        assert!(
            anchors.contains(&name.to_lowercase()),
            "{name}: {METRICS_PAGE} has no heading {name} for its runbook_url"
        );
    }
}

/// `rules.yaml` as a PrometheusRule (monitoring.coreos.com/v1) of the Prometheus Operator:
/// its groups, verbatim, under `spec`.
fn prometheus_rule(rules: &str) -> String {
    let body: String = rules
        .lines()
        .skip_while(|l| l.starts_with('#'))
        .map(|l| {
            if l.is_empty() {
                "\n".to_owned()
            } else {
                format!("  {l}\n")
            }
        })
        .collect();
    format!(
        "# Generated from {RULES} by tests/integration/monitoring.rs (UPDATE_MANIFESTS=1):\n\
         # edit that file, not this one. Install: docs/operations/metrics.md \"Dashboards and alerts\".\n\
         apiVersion: monitoring.coreos.com/v1\n\
         kind: PrometheusRule\n\
         metadata:\n  \
           name: capn\n  \
           labels:\n    \
             app.kubernetes.io/name: capn\n\
         spec:\n{body}"
    )
}

#[test]
fn the_prometheus_rule_is_generated_from_the_rules() {
    let wanted = prometheus_rule(&read(RULES));
    let path = repository().join(PROMETHEUS_RULE);
    if std::env::var_os("UPDATE_MANIFESTS").is_some() {
        std::fs::write(&path, &wanted).unwrap();
    }
    let held = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        held == wanted,
        "{PROMETHEUS_RULE} differs from what {RULES} makes; regenerate it with `UPDATE_MANIFESTS=1 cargo test --test integration monitoring`"
    );
    let object = yaml(PROMETHEUS_RULE);
    assert_eq!(object["kind"], "PrometheusRule");
    assert_eq!(
        object["spec"],
        yaml(RULES),
        "the PrometheusRule's spec is the rule groups"
    );
}

/// The chart (`charts/capn/monitoring/`) carries copies of the rules and dashboards, since
/// helm reads only files inside the chart; `UPDATE_MANIFESTS=1` copies them again.
#[test]
fn the_charts_monitoring_files_are_copies_of_deploy_monitoring() {
    let chart = repository().join("charts/capn/monitoring");
    let mut files = vec![RULES.to_owned()];
    for entry in std::fs::read_dir(repository().join(DASHBOARDS)).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        files.push(format!("{DASHBOARDS}/{name}"));
    }
    for file in files {
        let relative = file.strip_prefix(&format!("{MONITORING}/")).unwrap().to_owned();
        let copy = chart.join(&relative);
        if std::env::var_os("UPDATE_MANIFESTS").is_some() {
            std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
            std::fs::write(&copy, read(&file)).unwrap();
        }
        assert!(
            std::fs::read_to_string(&copy).unwrap_or_default() == read(&file),
            "charts/capn/monitoring/{relative} differs from {file}; copy it with `UPDATE_MANIFESTS=1 cargo test --test integration monitoring`"
        );
    }
    let copies = std::fs::read_dir(chart.join("dashboards")).unwrap().count();
    let originals = std::fs::read_dir(repository().join(DASHBOARDS)).unwrap().count();
    assert_eq!(
        copies, originals,
        "charts/capn/monitoring/dashboards holds the dashboards, no more"
    );
}

/// Every panel of a dashboard, rows' nested panels included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    let mut stack: Vec<&Value> = dashboard["panels"].as_array().into_iter().flatten().collect();
    while let Some(panel) = stack.pop() {
        stack.extend(panel["panels"].as_array().into_iter().flatten());
        out.push(panel);
    }
    out
}

/// The dashboards, by file name.
fn dashboards() -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(repository().join(DASHBOARDS)).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.ends_with(".json"),
            "{DASHBOARDS}/{name}: only dashboards' JSON belongs there"
        );
        let parsed: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{DASHBOARDS}/{name} does not parse: {e}"));
        out.insert(name, parsed);
    }
    out
}

/// Every PromQL query of a dashboard (its panels' targets, and the selectors of its
/// `label_values(...)` variables), with Grafana's variables replaced by values of their kind
/// so that promtool can parse them.
fn queries(dashboard: &Value) -> Vec<String> {
    let mut out: Vec<String> = panels(dashboard)
        .iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter_map(|t| t["expr"].as_str().map(str::to_owned))
        .collect();
    let label_values = regex::Regex::new(r"^label_values\((.+), *[a-z_]+\)$").unwrap();
    for variable in dashboard["templating"]["list"].as_array().into_iter().flatten() {
        if variable["type"] == "query" {
            let query = variable["query"]["query"]
                .as_str()
                .or(variable["query"].as_str())
                .unwrap();
            let selector = label_values
                .captures(query)
                .unwrap_or_else(|| panic!("variable query {query:?} is not label_values(<selector>, <label>)"));
            out.push(selector[1].to_owned());
        }
    }
    out.into_iter()
        .map(|q| {
            let q = q
                .replace("$__rate_interval", "5m")
                .replace("$__range", "1h")
                .replace("$namespace", "tenant-a")
                .replace("$cluster", "demo");
            assert!(!q.contains('$'), "a Grafana variable this test does not know in {q:?}");
            q
        })
        .collect()
}

#[test]
fn dashboards_parse_have_unique_panel_ids_and_queries_promtool_accepts() {
    let dashboards = dashboards();
    assert_eq!(
        dashboards.keys().collect::<Vec<_>>(),
        ["capn-control-plane.json", "capn.json"]
    );
    let mut rules = Vec::new();
    for (name, dashboard) in &dashboards {
        let ids: Vec<i64> = panels(dashboard)
            .iter()
            .map(|p| {
                p["id"]
                    .as_i64()
                    .unwrap_or_else(|| panic!("{name}: a panel without an id"))
            })
            .collect();
        let unique: BTreeSet<i64> = ids.iter().copied().collect();
        assert_eq!(unique.len(), ids.len(), "{name}: panel ids repeat: {ids:?}");
        assert!(
            dashboard["uid"].as_str().is_some_and(|u| !u.is_empty()),
            "{name}: no uid"
        );
        let queries = queries(dashboard);
        assert!(!queries.is_empty(), "{name}: no query");
        for (i, query) in queries.into_iter().enumerate() {
            rules.push(json!({"record": format!("dashboard:{}:{i}", name.trim_end_matches(".json").replace('-', "_")), "expr": query}));
        }
    }
    // Each query as a recording rule: promtool parses it as Prometheus would.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dashboards.yaml");
    let document = json!({"groups": [{"name": "dashboards", "rules": rules}]});
    std::fs::write(&file, serde_json::to_string_pretty(&document).unwrap()).unwrap();
    let checked = run_promtool(&["check", "rules", file.to_str().unwrap()]);
    assert!(
        checked.status.success(),
        "a dashboard query is not PromQL:\n{}",
        text(&checked)
    );
    println!("{} dashboard queries checked: {}", rules.len(), text(&checked).trim());
}

/// The sample names capn's `/metrics` serves: the encoding of a registry with every series
/// set once, read from its `# TYPE` lines (a counter's samples end in `_total`, a
/// histogram's in `_bucket`, `_sum` and `_count`).
fn served_metric_names() -> BTreeSet<String> {
    use capn::telemetry::{BackupFigures, CertificateFigures, EtcdMemberFigures, EtcdSpaceFigures, Metrics};
    let m = Metrics::default();
    m.observe("etcd", std::time::Instant::now(), Some("ApplyFailed"));
    m.set_managed("etcd", "ns/a".into(), 1);
    m.count_tenant_connection("port-forward", true);
    m.watch_failed("Secret", &"forbidden");
    m.set_etcd_space("ns", "c", EtcdSpaceFigures::default());
    m.count_etcd_defragmentation("ns", "c");
    m.set_etcd_members("ns", "c", EtcdMemberFigures::default());
    m.set_etcd_backup(
        "ns",
        "c",
        Some(BackupFigures {
            last_success: Some(1),
            interval: Some(1),
            failing: false,
        }),
    );
    m.set_control_plane_ready("ns", "c", true, false);
    m.set_certificates(
        "ns",
        "c",
        CertificateFigures {
            expiry: Some(1),
            next_renewal: Some(1),
            renew_before: 1,
        },
    );
    let encoded = m.encode();
    let mut names = BTreeSet::new();
    for line in encoded.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
        let (name, kind) = line.split_once(' ').unwrap();
        let suffixes: &[&str] = match kind {
            "counter" => &["_total"],
            "histogram" => &["_bucket", "_sum", "_count"],
            _ => &[""],
        };
        names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
    }
    // Each name is served with a sample, not only described.
    for name in &names {
        assert!(
            encoded
                .lines()
                .any(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} "))),
            "{name} has no sample in\n{encoded}"
        );
    }
    names
}

#[test]
fn every_capn_series_the_rules_and_dashboards_name_is_one_capn_serves() {
    let served = served_metric_names();
    assert!(served.contains("capn_control_plane_ready"), "{served:?}");
    let mut sources: Vec<(String, String)> = vec![
        (RULES.to_owned(), read(RULES)),
        (RULE_TESTS.to_owned(), read(RULE_TESTS)),
    ];
    for (name, dashboard) in dashboards() {
        sources.push((format!("{DASHBOARDS}/{name}"), dashboard.to_string()));
    }
    let names = regex::Regex::new(r"\bcapn_[a-z0-9_]*[a-z0-9]\b").unwrap();
    let mut unknown = Vec::new();
    let mut used = BTreeSet::new();
    for (file, content) in &sources {
        for found in names.find_iter(content) {
            used.insert(found.as_str().to_owned());
            if !served.contains(found.as_str()) {
                unknown.push(format!("{file}: {}", found.as_str()));
            }
        }
    }
    unknown.dedup();
    assert!(
        unknown.is_empty(),
        "series capn does not serve (renamed? see src/telemetry.rs):\n{}\nserved: {served:?}",
        unknown.join("\n")
    );
    println!("{} capn series named in {MONITORING}, all served: {used:?}", used.len());
}

/// The value of the sample `line_start` (a name and its labels) in `encoded`, if served.
fn sample(encoded: &str, line_start: &str) -> Option<i64> {
    encoded
        .lines()
        .find_map(|l| l.strip_prefix(line_start))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test]
async fn a_control_plane_exports_its_readiness_and_certificate_schedule_until_it_is_deleted() {
    use crate::harness::{CONTROLLER_STEP, apply_example, bring_up};
    let client = capn_testkit::cluster().client();
    let ns = capn_testkit::test_namespace(&client).await;
    let metrics = Arc::new(capn::telemetry::Metrics::default());
    let mut settings = capn::controllers::Settings {
        namespace: Some(ns.clone()),
        ..capn::controllers::Settings::default()
    };
    settings.enabled.public_crds = false;
    settings.enabled.syncer = false;
    let channels = Arc::new(capn::channel::ChannelRegistry::load(&[]).expect("channels load"));
    let controllers = tokio::spawn(capn::controllers::run(
        client.clone(),
        channels,
        settings,
        metrics.clone(),
    ));
    apply_example(&client, &ns, "examples/nestedcontrolplane.yaml").await;
    let labels = format!("{{namespace=\"{ns}\",cluster=\"demo\"}}");
    let ready = format!("capn_control_plane_ready{labels} ");
    let read = |line: String| {
        let metrics = metrics.clone();
        async move { sample(&metrics.encode(), &line) }
    };
    let before = capn_testkit::wait_until("capn_control_plane_ready is served", CONTROLLER_STEP, || {
        read(ready.clone())
    })
    .await;
    assert_eq!(before, 0, "no component is ready yet");
    bring_up(&client, &ns, "demo").await;
    capn_testkit::wait_until("capn_control_plane_ready is 1", CONTROLLER_STEP, || {
        let read = read(ready.clone());
        async move { read.await.filter(|v| *v == 1) }
    })
    .await;
    let encoded = metrics.encode();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let value = |name: &str| {
        sample(&encoded, &format!("{name}{labels} ")).unwrap_or_else(|| panic!("no {name}{labels} in\n{encoded}"))
    };
    let (expiry, renewal, window) = (
        value("capn_certificate_expiry_timestamp_seconds"),
        value("capn_certificate_renewal_timestamp_seconds"),
        value("capn_certificate_renew_before_seconds"),
    );
    // Default policy: leaves of a year, renewed when a third remains.
    assert_eq!(window, 365 * 86_400 / 3);
    assert!(
        now < renewal && renewal < expiry,
        "now {now}, renewal {renewal}, expiry {expiry}"
    );
    assert!(
        expiry - now > window,
        "a new control plane is outside its renew window: expiry {expiry}, now {now}"
    );
    // Deleted, it leaves /metrics: no series of it keeps an alert firing.
    let ncps: kube::Api<capn::api::NestedControlPlane> = kube::Api::namespaced(client.clone(), &ns);
    ncps.delete("demo", &Default::default())
        .await
        .expect("delete the control plane");
    capn_testkit::wait_until(
        "the deleted control plane's series leave /metrics",
        // The sweep runs every 10 s.
        CONTROLLER_STEP * 3,
        || {
            let metrics = metrics.clone();
            let labels = labels.clone();
            async move { (!metrics.encode().contains(&labels)).then_some(()) }
        },
    )
    .await;
    controllers.abort();
    let _ = controllers.await;
}
