//! The `capn` binary as a user runs it: `render` and `channels validate` output, and logs
//! written to a pipe.

use std::process::Command;
use std::time::Duration;

use capn_testkit::{cluster, test_namespace};

fn capn(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_capn"))
        .args(args)
        .output()
        .expect("capn runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn file(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let path = dir.path().join(name);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

const NCP: &str =
    "apiVersion: controlplane.cluster.x-k8s.io/v1beta1\nkind: NestedControlPlane\nmetadata:\n  name: demo\n";

#[test]
fn render_refuses_a_bad_field_with_its_reason_path_and_rule() {
    let dir = tempfile::tempdir().unwrap();
    let path = file(
        &dir,
        "ncp.yaml",
        &format!("{NCP}spec:\n  controlPlaneEndpoint:\n    host: api.example.com\n    port: 70000\n"),
    );
    let (ok, stdout, stderr) = capn(&["render", "-f", &path]);
    assert!(!ok, "{stdout}");
    assert!(
        stdout.is_empty(),
        "nothing is printed when anything is refused: {stdout}"
    );
    assert_eq!(
        stderr.trim(),
        "error: InvalidEndpoint: NestedControlPlane demo: spec.controlPlaneEndpoint.port: Invalid value: 70000: must be a TCP port between 1 and 65535"
    );
}

#[test]
fn render_refuses_unknown_fields_and_strict_false_warns_about_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = file(&dir, "ncp.yaml", &format!("{NCP}spec:\n  verison: \"1.35\"\n"));
    let (ok, stdout, stderr) = capn(&["render", "-f", &path]);
    assert!(!ok && stdout.is_empty(), "{stdout}");
    assert_eq!(
        stderr.trim(),
        "error: UnknownField: NestedControlPlane demo: spec.verison: unknown field; did you mean spec.version? (--strict=false makes unknown fields warnings)"
    );
    let (ok, stdout, stderr) = capn(&["render", "--strict=false", "-f", &path]);
    assert!(ok, "{stderr}");
    assert_eq!(
        stderr.trim(),
        "Warning: unknown field \"spec.verison\" in NestedControlPlane default/demo; did you mean spec.version?"
    );
    assert!(stdout.contains("kind: StatefulSet"), "the defaults still render");
    let (ok, _, _) = capn(&["render", "--strict", "-f", &path]);
    assert!(!ok, "--strict alone is the default");
}

/// A file with several problems: each is reported, with its reason, object and field, in one
/// run; a misspelt kind is named with the kind meant.
#[test]
fn render_reports_every_problem_in_one_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = file(
        &dir,
        "ncp.yaml",
        &format!(
            "{NCP}spec:\n  certSANs: [\"bad san!\"]\n  clusterNetwork:\n    services:\n      cidrBlocks: [\"10.0.0.0/8\"]\n---\napiVersion: controlplane.cluster.x-k8s.io/v1beta1\nkind: NestedEtcd\nmetadata:\n  name: demo-etcd\nspec:\n  replicas: three\n---\napiVersion: controlplane.cluster.x-k8s.io/v1beta1\nkind: NestedApiServer\nmetadata:\n  name: demo-apiserver\n"
        ),
    );
    let (ok, stdout, stderr) = capn(&["render", "-f", &path]);
    assert!(!ok && stdout.is_empty(), "{stdout}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 4, "{stderr}");
    for (line, start) in lines.iter().zip([
        "error: InvalidSAN: NestedControlPlane demo: spec.certSANs[0]: Invalid value: \"bad san!\"",
        "error: InvalidServiceCIDR: NestedControlPlane demo: spec.clusterNetwork.services.cidrBlocks[0]: Invalid value: \"10.0.0.0/8\"",
        "error: InvalidType: NestedEtcd demo-etcd: spec.replicas: Invalid value: \"three\": must be of type integer",
        "error: UnknownKind: NestedApiServer demo-apiserver: kind: \"NestedApiServer\" is not a kind of controlplane.cluster.x-k8s.io/v1beta1; did you mean NestedAPIServer?",
    ]) {
        assert!(line.starts_with(start), "{line:?} does not start with {start:?}");
    }
}

#[test]
fn render_refuses_the_same_object_twice() {
    let dir = tempfile::tempdir().unwrap();
    let path = file(
        &dir,
        "ncp.yaml",
        &format!("{NCP}---\n{NCP}spec:\n  version: \"1.36\"\n"),
    );
    let (ok, _, stderr) = capn(&["render", "-f", &path]);
    assert!(!ok);
    assert!(
        stderr.contains("DuplicateObject: NestedControlPlane default/demo is in the file twice (documents 1 and 2)"),
        "{stderr}"
    );
}

#[test]
fn channels_validate_names_the_undefined_variable_and_its_line() {
    let dir = tempfile::tempdir().unwrap();
    file(
        &dir,
        "typo/channel.yaml",
        "name: typo\ncomponents:\n  etcd:\n    versions: [\"3.6.8\"]\ndefaults:\n  kubernetes: \"1.36.3\"\n",
    );
    file(
        &dir,
        "typo/3.6.8/etcd/service.yaml",
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {{ names.etcd }}\nspec:\n  clusterIP: None\n  selector: {{ selectr | tojson }}\n",
    );
    file(
        &dir,
        "typo/3.6.8/etcd/rbac.yaml",
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: {{ names.etcd }}\n",
    );
    let (ok, stdout, _) = capn(&["channels", "validate", &dir.path().join("typo").display().to_string()]);
    assert!(!ok);
    assert!(
        stdout.contains("typo: template 3.6.8/etcd/service.yaml line 7: undefined variable `selectr`"),
        "{stdout}"
    );
    assert!(
        stdout.contains("typo: template 3.6.8/etcd/rbac.yaml line 2: ClusterRole sample-etcd is cluster-scoped"),
        "{stdout}"
    );
}

#[tokio::test]
async fn text_logs_into_a_pipe_carry_no_colour_codes() {
    let client = cluster().client();
    let ns = test_namespace(&client).await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_capn"))
        .args([
            "run",
            "--namespace",
            &ns,
            "--controllers",
            "control-plane",
            "--metrics-bind-address",
            "127.0.0.1:0",
            "--health-probe-bind-address",
            "127.0.0.1:0",
        ])
        .env("KUBECONFIG", cluster().kubeconfig_path())
        .env_remove("NO_COLOR")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    // Reads until capn logs that it starts (or its output ends).
    let reader = tokio::task::spawn_blocking(move || {
        let mut seen = Vec::new();
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
            let Ok(line) = line else { break };
            let started = line.contains("starting capn");
            seen.push(line);
            if started {
                break;
            }
        }
        seen
    });
    let seen = tokio::time::timeout(Duration::from_secs(30), reader).await;
    child.kill().unwrap();
    child.wait().unwrap();
    let seen = seen.expect("capn logs that it starts within 30 s").unwrap();
    let line = seen.last().cloned().unwrap_or_default();
    assert!(line.contains("INFO"), "{line}");
    assert!(
        seen.iter().all(|l| !l.contains('\u{1b}')),
        "ANSI escape codes in piped logs: {seen:?}"
    );
}

#[test]
fn render_upgrade_path_prints_each_minor_and_refuses_what_the_channel_cannot_serve() {
    let dir = tempfile::tempdir().unwrap();
    let path = file(&dir, "ncp.yaml", &format!("{NCP}spec:\n  version: \"1.37\"\n"));
    let (ok, stdout, stderr) = capn(&["render", "--upgrade-path", "-f", &path, "--from", "1.35.4"]);
    assert!(ok, "{stderr}");
    let printed: serde_json::Value = serde_saphyr::from_str(stdout.trim_start_matches("---\n")).unwrap();
    assert_eq!(
        printed,
        serde_json::json!({
            "nestedControlPlane": "default/demo",
            "channel": "stable",
            "from": "1.35.4",
            "fromEtcd": "3.6.8",
            "target": "1.37.2",
            "path": "1.35.4 → 1.36.3 → 1.37.2 (etcd 3.6.8 → 3.7.0)",
            "steps": [
                {"kubernetes": "1.36.3", "etcd": "3.6.8", "etcdChanges": false},
                {"kubernetes": "1.37.2", "etcd": "3.7.0", "etcdChanges": true},
            ],
        })
    );
    // A downgrade is refused with the controllers' reason; nothing is printed.
    let (ok, stdout, stderr) = capn(&["render", "--upgrade-path", "-f", &path, "--from", "1.38.0"]);
    assert!(!ok && stdout.is_empty(), "{stdout}");
    assert!(
        stderr.starts_with(
            "error: UpgradeNotAllowed: NestedControlPlane demo: cannot go from Kubernetes 1.38.0 to 1.37.2"
        ),
        "{stderr}"
    );
    // Without a running release there is no path to plan.
    let (ok, _, stderr) = capn(&["render", "--upgrade-path", "-f", &path]);
    assert!(!ok);
    assert!(
        stderr.contains("UnknownRunningVersion") && stderr.contains("--from"),
        "{stderr}"
    );
    // A channel without 1.36 cannot take 1.35 to 1.37: the refusal names the missing minor.
    let channels = tempfile::tempdir().unwrap();
    let gap = channels.path().join("gap");
    std::fs::create_dir_all(&gap).unwrap();
    std::fs::write(
        gap.join("channel.yaml"),
        "name: gap\ncomponents:\n  etcd:\n    versions: [\"3.6.8\"]\n  apiserver:\n    versions: [\"1.35.4\", \"1.37.2\"]\ndefaults:\n  kubernetes: \"1.37.2\"\ncompatibility:\n  - kubernetes: \"1.35\"\n    etcd: \"3.6.8\"\n  - kubernetes: \"1.37\"\n    etcd: \"3.6.8\"\n",
    )
    .unwrap();
    for f in [
        "3.6.8/etcd/a.yaml",
        "1.35.4/apiserver/a.yaml",
        "1.37.2/apiserver/a.yaml",
    ] {
        file(&channels, &format!("gap/{f}"), "kind: ConfigMap\n");
    }
    let gapped = file(
        &dir,
        "gap.yaml",
        &format!("{NCP}spec:\n  version: \"1.37\"\n  channel: gap\n"),
    );
    let (ok, _, stderr) = capn(&[
        "render",
        "--upgrade-path",
        "-f",
        &gapped,
        "--from",
        "1.35.4",
        "--channels-dir",
        &channels.path().display().to_string(),
    ]);
    assert!(!ok);
    assert!(
        stderr.contains("UpgradeNotAllowed") && stderr.contains("carries no Kubernetes 1.36"),
        "{stderr}"
    );
}

/// The binary starts jemalloc with capn's options (`src/main.rs`: one arena, dirty pages
/// purged after a second; issue 11, 1.1 MiB less at N = 1000), which an environment that
/// sets only other options leaves in place. jemalloc prints the options it runs with at
/// exit when asked (`stats_print`).
#[test]
fn the_binary_runs_jemalloc_with_its_own_options() {
    let out = Command::new(env!("CARGO_BIN_EXE_capn"))
        .arg("--help")
        .env("_RJEM_MALLOC_CONF", "stats_print:true")
        .output()
        .expect("capn runs");
    assert!(out.status.success());
    let stats = String::from_utf8_lossy(&out.stderr);
    for option in [
        "opt.narenas: 1\n",
        "opt.dirty_decay_ms: 1000 ",
        "opt.muzzy_decay_ms: 0 ",
    ] {
        assert!(
            stats.contains(option),
            "{option:?} not in jemalloc's statistics:\n{stats}"
        );
    }
}
