//! Issue 41 item 4, "Recipes that run as written": every `# recipe:` block of
//! docs/operations/recipes.md is run as it is, with `bash -euo pipefail -c`, by the kubectl
//! hack/kube-assets.sh builds next to the super cluster's kube-apiserver (first on `PATH`;
//! never a kubectl of the machine), with `KUBECONFIG` the test super cluster's admin
//! kubeconfig and the page's namespace `tenant-a` replaced by the test's, against a control
//! plane booted through the runner as in the demo.
//!
//! One tenant, in the page's order: booted at 1.35 with one etcd member; pause and resume;
//! renew the certificates; rotate the CA; a backup (after the test has done the page's
//! prerequisite, `spec.backup` with a real S3 server, as a user would); upgrade to 1.36;
//! restore (it replaces the control plane); scale etcd 1 → 3 on the restored tenant. The
//! restore comes before the scaling because the test runner tears a deleted StatefulSet of
//! several pods down one pod at a time and removes all its claim directories only after the
//! last, while the restored StatefulSet of the same name already runs pods on those
//! directories (seen once: members 1 and 2 lost their restored data directory and exited);
//! with one member there is nothing to race. Each block ends with `kubectl wait`s
//! that must succeed; the test also checks each outcome itself (a new serving certificate, a
//! new CA, three voting members, the release, the tenant's data as of the snapshot), so a
//! recipe that waits for the wrong thing fails here too. The page and [`RECIPES`] must name
//! the same recipes, in the same order.

use std::time::{Duration, Instant};

use capn::api::{NestedControlPlane, NestedEtcd};
use capn_testkit::cluster;
use capn_testkit::s3::{self, ACCESS_KEY_ID, SECRET_ACCESS_KEY};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::boot::{BOOTED_STEP, Booted, StartCapn, boot_with, say};
use crate::harness::{apply_doc, kubectl_dir, secret, secret_value};

/// The page, from the repository root.
const PAGE: &str = "docs/operations/recipes.md";
/// The namespace the page's commands name; replaced by the test's.
const PAGE_NAMESPACE: &str = "tenant-a";
/// The recipes the page must hold, in the order they run on one tenant.
const RECIPES: [&str; 7] = [
    "pause-and-resume",
    "renew-certificates",
    "rotate-ca",
    "backup-now",
    "upgrade-minor",
    "restore",
    "scale-etcd",
];
/// One recipe at most (its own `kubectl wait`s are the real deadlines; this only keeps a
/// hung command from hanging the test).
const RECIPE_DEADLINE: Duration = Duration::from_secs(60 * 60);
/// A ConfigMap in the tenant's `default` namespace written before the backup (the restore
/// brings it back) and one written after it (the restore must not).
const BEFORE_BACKUP: &str = "recipes-before-backup";
const AFTER_BACKUP: &str = "recipes-after-backup";

/// The `# recipe: <name>` blocks of `page`: each fenced ```` ```sh ```` block whose first line
/// is that comment, as (name, script).
fn recipes(page: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut lines = page.lines();
    while let Some(line) = lines.next() {
        if line.trim_end() != "```sh" {
            continue;
        }
        let block: Vec<&str> = lines.by_ref().take_while(|l| l.trim_end() != "```").collect();
        if let Some(name) = block.first().and_then(|first| first.strip_prefix("# recipe:")) {
            found.push((name.trim().to_string(), block.join("\n") + "\n"));
        }
    }
    found
}

fn page() -> String {
    let path = format!("{}/{PAGE}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The page and the test agree on the recipes (no cluster needed).
#[test]
fn the_recipes_page_holds_exactly_the_recipes_this_test_runs() {
    let names: Vec<String> = recipes(&page()).into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names, RECIPES,
        "{PAGE} and tests/integration/recipes.rs must name the same recipes in the same order"
    );
    for (name, script) in recipes(&page()) {
        let last = script.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default();
        assert!(
            last.starts_with("kubectl wait ") && last.contains("--timeout="),
            "recipe {name} ends with a kubectl wait with a timeout, not {last:?}"
        );
        for line in script.lines().filter(|l| l.trim_start().starts_with("kubectl ")) {
            assert!(
                line.contains(&format!("-n {PAGE_NAMESPACE}")),
                "recipe {name}: every kubectl command names the namespace: {line:?}"
            );
        }
    }
}

/// The parser finds blocks by their first line only, and keeps the whole block.
#[test]
fn recipe_blocks_are_found_by_their_first_line() {
    let page = "text\n```sh\n# recipe: one\nkubectl a\n```\n```sh\nkubectl b\n# recipe: no\n```\n```text\n# recipe: text\n```\n```sh\n# recipe: two\n```\n";
    assert_eq!(
        recipes(page),
        [
            ("one".to_string(), "# recipe: one\nkubectl a\n".to_string()),
            ("two".to_string(), "# recipe: two\n".to_string())
        ]
    );
}

/// What one command printed.
struct Output {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// Runs `script` with `bash -euo pipefail -c`, the release's kubectl first on `PATH` and the
/// super cluster's kubeconfig.
async fn bash(script: &str, kubectl: &std::path::Path) -> Output {
    let path = format!("{}:{}", kubectl.display(), std::env::var("PATH").unwrap_or_default());
    let child = tokio::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .env("PATH", path)
        .env("KUBECONFIG", cluster().kubeconfig_path())
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(RECIPE_DEADLINE, child).await {
        Ok(Ok(out)) => Output {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: format!("{}\n(exit: {})", String::from_utf8_lossy(&out.stderr), out.status),
        },
        Ok(Err(e)) => Output {
            ok: false,
            stdout: String::new(),
            stderr: format!("bash did not run: {e}"),
        },
        Err(_) => Output {
            ok: false,
            stdout: String::new(),
            stderr: format!("still running after {RECIPE_DEADLINE:?}: killed"),
        },
    }
}

/// A ConfigMap written into the tenant's `default` namespace, retried through a kubeconfig
/// read fresh from `demo-kubeconfig` until an apiserver answers.
async fn write_config_map(booted: &Booted, name: &str) {
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": name}, "data": {"by": "recipes"}})).unwrap();
    booted
        .runner
        .wait_for(
            &format!("ConfigMap {name} is written in the tenant"),
            BOOTED_STEP,
            || async {
                let config = booted.runner.client_config(&booted.kubeconfig().await).await.ok()?;
                let api: Api<ConfigMap> = Api::namespaced(kube::Client::try_from(config).ok()?, "default");
                match api.create(&PostParams::default(), &cm).await {
                    Ok(_) => Some(()),
                    Err(kube::Error::Api(e)) if e.code == 409 => Some(()),
                    Err(_) => None,
                }
            },
        )
        .await;
}

/// Whether the tenant has ConfigMap `name` in `default`, once an apiserver answers.
///
/// Polls without [`capn_testkit::runner::Runner::wait_for`], which fails on any problem the
/// runner reported: the restore recipe deletes etcd's retained claims after their
/// StatefulSet is gone (what a real cluster needs), and the runner, which emulates a claim's
/// deletion only under a running pod, reports that as a problem. Whether the restored etcd
/// started from the snapshot and not from the old data is what the caller checks.
async fn tenant_has_config_map(booted: &Booted, name: &str) -> bool {
    capn_testkit::poll_until(BOOTED_STEP, || async {
        let config = booted.runner.client_config(&booted.kubeconfig().await).await.ok()?;
        let api: Api<ConfigMap> = Api::namespaced(kube::Client::try_from(config).ok()?, "default");
        api.get_opt(name).await.ok().map(|found| found.is_some())
    })
    .await
    .unwrap_or_else(|| panic!("the tenant did not answer within {BOOTED_STEP:?} (reading ConfigMap {name})"))
}

/// The first certificate (PEM) of Secret `name`'s `tls.crt`.
async fn certificate(booted: &Booted, name: &str) -> String {
    let found = secret(&booted.client, &booted.ns, name)
        .await
        .unwrap_or_else(|| panic!("{name} exists"));
    secret_value(&found, "tls.crt")
}

async fn control_plane(booted: &Booted) -> NestedControlPlane {
    Api::<NestedControlPlane>::namespaced(booted.client.clone(), &booted.ns)
        .get("demo")
        .await
        .unwrap()
}

async fn etcd(booted: &Booted) -> NestedEtcd {
    Api::<NestedEtcd>::namespaced(booted.client.clone(), &booted.ns)
        .get("demo-etcd")
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_recipe_of_the_operations_page_runs_as_written_on_a_booted_control_plane() {
    let page = page();
    let recipes = recipes(&page);
    let names: Vec<&str> = recipes.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, RECIPES, "{PAGE} and this test name the same recipes");
    let kubectl = kubectl_dir();
    let version = bash("kubectl version --client", &kubectl).await;
    assert!(version.ok, "kubectl runs: {}", version.stderr);
    say(&format!(
        "recipes: {}",
        version.stdout.lines().next().unwrap_or_default()
    ));

    let started = Instant::now();
    let booted = boot_with(
        "recipes",
        Some(vec![json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
            "kind": "NestedControlPlane",
            "metadata": {"name": "demo"},
            "spec": {"version": "1.35"},
        })]),
        StartCapn::InProcess,
    )
    .await;
    let ns = booted.ns.clone();
    assert_eq!(
        control_plane(&booted).await.status.unwrap().version.as_deref(),
        Some("1.35.4")
    );
    let mut listener = None;
    let mut before = String::new();

    for (name, script) in &recipes {
        // What the page asks for before a recipe, and what the test compares after it.
        match name.as_str() {
            "renew-certificates" => before = certificate(&booted, "demo-apiserver").await,
            "rotate-ca" => before = certificate(&booted, "demo-ca").await,
            "backup-now" => {
                // The page's prerequisite: spec.backup with a destination and its credentials
                // (the S3 server also listens on the runner's host address, which the
                // restore init containers reach).
                let serving = s3::s3()
                    .serve_on(booted.runner.host_address())
                    .expect("s3s-fs on the pod network");
                apply_doc(
                    &booted.client,
                    &ns,
                    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3-credentials"},
                           "stringData": {"AWS_ACCESS_KEY_ID": ACCESS_KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY}}),
                )
                .await;
                Api::<NestedEtcd>::namespaced(booted.client.clone(), &ns)
                    .patch(
                        "demo-etcd",
                        &PatchParams::default(),
                        &Patch::Merge(json!({"spec": {"backup": {"destination": {
                            "endpoint": serving.endpoint(), "bucket": s3::s3().bucket(),
                            "prefix": format!("{ns}/demo-etcd"),
                            "credentialsSecret": {"name": "s3-credentials"}}}}})),
                    )
                    .await
                    .unwrap();
                listener = Some(serving);
                write_config_map(&booted, BEFORE_BACKUP).await;
            }
            _ => {}
        }

        let script = script.replace(PAGE_NAMESPACE, &ns);
        let began = Instant::now();
        let out = bash(&script, &kubectl).await;
        assert!(
            out.ok,
            "recipe {name} failed after {:.0?}\n--- block ---\n{script}--- stdout ---\n{}\n--- stderr ---\n{}",
            began.elapsed(),
            out.stdout,
            out.stderr
        );
        say(&format!("recipes: {name} ran in {:.1?}", began.elapsed()));
        // What the page shows after the block.
        let shown = bash(
            &format!(
                "kubectl get ncp,netcd -n {ns}; kubectl get ncp demo -n {ns} -o jsonpath='{{range .status.conditions[*]}}{{.type}}={{.status}} {{.reason}}{{\"\\n\"}}{{end}}'; kubectl get netcd demo-etcd -n {ns} -o jsonpath='{{range .status.conditions[*]}}{{.type}}={{.status}} {{.reason}}{{\"\\n\"}}{{end}}{{.status.backup}}{{\"\\n\"}}'; kubectl events -n {ns} | tail -n 25"
            ),
            &kubectl,
        )
        .await;
        say(&format!("recipes: after {name}:\n{}{}", out.stdout, shown.stdout));

        match name.as_str() {
            "pause-and-resume" => {}
            "renew-certificates" => assert_ne!(
                certificate(&booted, "demo-apiserver").await,
                before,
                "the apiserver's serving certificate was re-issued"
            ),
            "rotate-ca" => assert_ne!(certificate(&booted, "demo-ca").await, before, "the cluster CA is new"),
            "scale-etcd" => {
                let members = etcd(&booted).await.status.unwrap().etcd.unwrap().members;
                assert_eq!(members.len(), 3, "{members:?}");
                assert!(members.iter().all(|m| !m.learner && m.healthy), "{members:?}");
            }
            "backup-now" => {
                let backup = etcd(&booted).await.status.unwrap().backup.unwrap();
                let snapshot = backup.last_snapshot.expect("a verified snapshot");
                let stored = std::fs::read(s3::s3().object_file(
                    &etcd(&booted).await.spec.backup.unwrap().destination.bucket,
                    &snapshot.key,
                ))
                .expect("the snapshot is in the bucket");
                assert_eq!(stored.len() as i64, snapshot.size_bytes);
                write_config_map(&booted, AFTER_BACKUP).await;
            }
            "upgrade-minor" => {
                let status = control_plane(&booted).await.status.unwrap();
                assert_eq!(status.version.as_deref(), Some("1.36.3"));
                assert!(
                    tenant_has_config_map(&booted, AFTER_BACKUP).await,
                    "the upgrade kept the tenant's data"
                );
            }
            "restore" => {
                assert!(
                    tenant_has_config_map(&booted, BEFORE_BACKUP).await,
                    "the restore brought back what the snapshot held"
                );
                assert!(
                    !tenant_has_config_map(&booted, AFTER_BACKUP).await,
                    "the restore holds nothing written after the snapshot"
                );
                assert_eq!(
                    control_plane(&booted).await.status.unwrap().version.as_deref(),
                    Some("1.36.3")
                );
            }
            other => panic!("{PAGE} has a recipe this test does not know: {other}"),
        }
    }
    say(&format!(
        "recipes: boot and all {} recipes in {:.0?}",
        recipes.len(),
        started.elapsed()
    ));
    drop(listener);
    booted.stop().await;
}
