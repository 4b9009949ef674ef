//! Issue 41, item 3: `capn kubeconfig` and `capn connect` give a kubeconfig of the tenant
//! that works from the host, where the apiserver's in-cluster name does not resolve, and
//! `capn connect`'s keeps working across an apiserver roll (a new pod at a new address) and
//! a CA rotation, without the user doing anything: the file is read anew for each client,
//! as kubectl reads it on every call. The exec form of `capn kubeconfig` (printed once, before
//! the roll) keeps working across both too, with the real kubectl running capn as its
//! credential plugin, which starts the background `capn connect` itself.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::boot::{BOOTED_STEP, StartCapn, boot_with, say};
use crate::harness::{capn_binary, kubectl_dir, request_rotation};

/// A CA rotation (every phase rolls the apiserver) on two busy cores.
const ROTATION: Duration = Duration::from_secs(600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capn_connect_keeps_a_working_kubeconfig_across_an_apiserver_roll_and_a_ca_rotation() {
    let docs = vec![json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
        "kind": "NestedControlPlane",
        "metadata": {"name": "demo"},
        "spec": {"version": "1.36"},
    })];
    // capn itself runs outside the pod network too, as on a laptop.
    let booted = boot_with("connect", Some(docs), StartCapn::ProcessOutside(Vec::new())).await;
    let ns = booted.ns.clone();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("demo.kubeconfig");
    let log = dir.path().join("connect.log");
    let _connect = tokio::process::Command::new(capn_binary())
        .args(["connect", "demo", "-n", &ns, "--kubeconfig-out"])
        .arg(&file)
        .env("KUBECONFIG", capn_testkit::cluster().kubeconfig_path())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .expect("capn connect starts");

    let answers = |what: &'static str| {
        let (file, log) = (file.clone(), log.clone());
        let booted = &booted;
        async move {
            booted
                .runner
                .wait_for(what, BOOTED_STEP, || async { namespaces(&file).await })
                .await;
            say(&format!(
                "connect: {what}; capn connect said:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            ));
        }
    };
    answers("the tenant answers through capn connect's kubeconfig").await;
    let written = std::fs::read_to_string(&file).unwrap();
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&file).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "the kubeconfig holds the admin key");

    // `capn kubeconfig --direct` prints the Secret's kubeconfig, and with --server one that
    // works through any address that reaches the apiserver (here capn connect's endpoint).
    let printed = capn_kubeconfig(&ns, &["--direct"]).await;
    assert_eq!(printed, booted.kubeconfig().await);
    let server = serde_saphyr::from_str::<serde_json::Value>(&written).unwrap()["clusters"][0]["cluster"]["server"]
        .as_str()
        .unwrap()
        .to_owned();
    let pointed = dir.path().join("pointed.kubeconfig");
    std::fs::write(&pointed, capn_kubeconfig(&ns, &["--server", &server]).await).unwrap();
    assert!(
        namespaces(&pointed).await.is_some(),
        "capn kubeconfig --server {server} does not answer"
    );

    // Without flags, where the in-cluster name does not resolve (here), `capn kubeconfig`
    // prints the exec form: no key in it, the real kubectl runs capn as its credential
    // plugin, and the plugin starts the background connect. Two kubectl calls at once both
    // find no endpoint and both start one: one binds, the other exits, both calls answer.
    let state = dir.path().join("state");
    let exec = dir.path().join("exec.kubeconfig");
    let _daemon = Daemon(state.clone());
    std::fs::write(
        &exec,
        capn_kubeconfig(&ns, &["--state-dir", state.to_str().unwrap()]).await,
    )
    .unwrap();
    let printed = std::fs::read_to_string(&exec).unwrap();
    assert!(
        !printed.contains("client-key-data"),
        "the exec form holds no key:\n{printed}"
    );
    assert!(
        printed.contains("--credential"),
        "the exec form runs the plugin:\n{printed}"
    );
    assert_eq!(
        printed,
        capn_kubeconfig(&ns, &["--state-dir", state.to_str().unwrap()]).await,
        "printed twice, the same file (the same port)"
    );
    let kubectl = kubectl_dir().join("kubectl");
    let started = Instant::now();
    let (first, second) = tokio::join!(kubectl_namespaces(&kubectl, &exec), kubectl_namespaces(&kubectl, &exec));
    let cold = started.elapsed();
    let log = || std::fs::read_to_string(state.join("connect.log")).unwrap_or_default();
    assert!(
        first.is_ok() && second.is_ok(),
        "kubectl through the exec kubeconfig, two at once: {first:?} {second:?}; connect.log:\n{}",
        log()
    );
    say(&format!("connect: exec form: the background connects said:\n{}", log()));
    let pid = std::fs::read_to_string(state.join("connect.pid")).expect("the background connect's pid file");
    let started = Instant::now();
    kubectl_namespaces(&kubectl, &exec)
        .await
        .expect("kubectl with the background connect up");
    let warm = started.elapsed();
    let plugin = plugin_command(&printed);
    let started = Instant::now();
    let credential = run_plugin(&plugin).await;
    let plugin_warm = started.elapsed();
    assert_eq!(credential["kind"], "ExecCredential", "{credential}");
    say(&format!(
        "connect: exec form: two kubectl calls at once that start the background connect (pid {}) took {cold:?}; \
         one with it up {warm:?}; the plugin alone with it up {plugin_warm:?}",
        pid.trim()
    ));

    // An apiserver roll, as `kubectl rollout restart` makes one: its pod is replaced (the
    // runner starts the new revision in a new network namespace, at a new address).
    let pods: Api<Pod> = Api::namespaced(booted.client.clone(), &ns);
    let before = apiserver_pod(&pods).await.expect("the apiserver's pod");
    Api::<StatefulSet>::namespaced(booted.client.clone(), &ns)
        .patch(
            "demo-apiserver",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"metadata": {"annotations": {
                "kubectl.kubernetes.io/restartedAt": "capn-connect-test"}}}}})),
        )
        .await
        .unwrap();
    booted
        .runner
        .wait_for("the apiserver's pod is replaced", BOOTED_STEP, || async {
            let now = apiserver_pod(&pods).await?;
            (revision(&now) != revision(&before)).then_some(())
        })
        .await;
    answers("the tenant answers after the apiserver's pod was replaced").await;
    assert!(
        namespaces(&pointed).await.is_some(),
        "capn kubeconfig --server {server} no longer answers after the roll"
    );
    kubectl_answers(
        &booted,
        &kubectl,
        &exec,
        "kubectl answers through the exec form after the roll",
    )
    .await;

    // A CA rotation: the Secret changes and capn connect rewrites the file.
    request_rotation(&booted.client, &ns, "demo", "ca").await;
    booted.rotation_completed(ROTATION).await;
    booted
        .runner
        .wait_for("capn connect rewrites the kubeconfig", BOOTED_STEP, || async {
            (std::fs::read_to_string(&file).ok()? != written).then_some(())
        })
        .await;
    answers("the tenant answers after the CA rotation").await;
    // The kubeconfig printed before the rotation trusts only the old CA: it is refused now,
    // which is what capn connect spares the user.
    assert!(
        namespaces(&pointed).await.is_none(),
        "the old CA still verifies the apiserver"
    );
    // The exec form printed before the rotation works after it: its CA is a file the
    // background connect (and the plugin) keep current.
    kubectl_answers(
        &booted,
        &kubectl,
        &exec,
        "kubectl answers through the exec form after the CA rotation",
    )
    .await;
    assert_eq!(
        std::fs::read_to_string(state.join("connect.pid")).unwrap(),
        pid,
        "one background connect served it all"
    );

    // The background connect gone (stopped, idle), the next call starts another: the
    // plugin alone, cold and then warm.
    capn_connect_stop(&ns, &state).await;
    let local: std::net::SocketAddr = plugin[plugin.iter().position(|a| a == "--local-address").unwrap() + 1]
        .parse()
        .unwrap();
    booted
        .runner
        .wait_for("the background connect exits", BOOTED_STEP, || async {
            exited(&state, local).then_some(())
        })
        .await;
    let started = Instant::now();
    let credential = run_plugin(&plugin).await;
    let plugin_cold = started.elapsed();
    assert_eq!(credential["kind"], "ExecCredential", "{credential}");
    let started = Instant::now();
    run_plugin(&plugin).await;
    let plugin_warm = started.elapsed();
    let started = Instant::now();
    kubectl_namespaces(&kubectl, &exec)
        .await
        .expect("kubectl after the restart");
    let warm = started.elapsed();
    say(&format!(
        "connect: exec form: the plugin alone starting the background connect took {plugin_cold:?}, with it up \
         {plugin_warm:?}; kubectl with it up {warm:?}"
    ));

    // A background connect left without connections exits by itself (the plugin passes
    // --idle-timeout on; here a short one instead of the hour).
    capn_connect_stop(&ns, &state).await;
    booted
        .runner
        .wait_for("the background connect exits", BOOTED_STEP, || async {
            exited(&state, local).then_some(())
        })
        .await;
    let mut short = plugin.clone();
    short.extend(["--idle-timeout".to_owned(), "3s".to_owned()]);
    run_plugin(&short).await;
    let started = Instant::now();
    booted
        .runner
        .wait_for("the idle background connect exits", BOOTED_STEP, || async {
            exited(&state, local).then_some(())
        })
        .await;
    say(&format!(
        "connect: exec form: with --idle-timeout 3s the background connect exited {:?} after the plugin returned",
        started.elapsed()
    ));
    booted.stop().await;
}

/// The tenant's namespaces through the kubeconfig file at `path`, read anew (as kubectl
/// does); `None` while that fails.
async fn namespaces(path: &Path) -> Option<usize> {
    let text = std::fs::read_to_string(path).ok()?;
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&text).ok()?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .ok()?;
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(Duration::from_secs(10));
    let client = Client::try_from(config).ok()?;
    let list = Api::<Namespace>::all(client).list(&ListParams::default()).await.ok()?;
    Some(list.items.len())
}

/// `kubectl get namespaces` through the kubeconfig at `path`: its output, or its error.
async fn kubectl_namespaces(kubectl: &Path, path: &Path) -> Result<String, String> {
    let output = tokio::process::Command::new(kubectl)
        .args(["get", "namespaces", "-o", "name", "--request-timeout=30s"])
        .env("KUBECONFIG", path)
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| format!("running {}: {e}", kubectl.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.success() && stdout.contains("namespace/kube-system") {
        Ok(stdout)
    } else {
        Err(format!(
            "{}: {stdout}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// Waits until [`kubectl_namespaces`] answers, and says how long that took.
async fn kubectl_answers(booted: &crate::boot::Booted, kubectl: &Path, exec: &Path, what: &'static str) {
    let started = Instant::now();
    booted
        .runner
        .wait_for(what, BOOTED_STEP, || async {
            kubectl_namespaces(kubectl, exec).await.ok()
        })
        .await;
    say(&format!("connect: {what} within {:?}", started.elapsed()));
}

/// The exec plugin's command line in the exec kubeconfig `text`.
fn plugin_command(text: &str) -> Vec<String> {
    let doc: serde_json::Value = serde_saphyr::from_str(text).unwrap();
    let exec = &doc["users"][0]["user"]["exec"];
    let mut command = vec![exec["command"].as_str().unwrap().to_owned()];
    command.extend(
        exec["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_owned()),
    );
    command
}

/// Runs the plugin as kubectl does (`KUBECONFIG` unset here: the arguments pin the super
/// cluster) and returns the ExecCredential it printed.
async fn run_plugin(command: &[String]) -> serde_json::Value {
    let output = tokio::process::Command::new(&command[0])
        .args(&command[1..])
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "the plugin failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("the plugin prints an ExecCredential and nothing else")
}

/// `capn connect demo -n <ns> --stop --state-dir <state>`, which must succeed.
async fn capn_connect_stop(ns: &str, state: &Path) {
    let stopped = tokio::process::Command::new(capn_binary())
        .args(["connect", "demo", "-n", ns, "--stop", "--state-dir"])
        .arg(state)
        .env("KUBECONFIG", capn_testkit::cluster().kubeconfig_path())
        .output()
        .await
        .unwrap();
    assert!(
        stopped.status.success(),
        "capn connect --stop: {}",
        String::from_utf8_lossy(&stopped.stderr)
    );
}

/// Whether the background connect of `state` is gone: no pid file, nothing listening at
/// `local`.
fn exited(state: &Path, local: std::net::SocketAddr) -> bool {
    !state.join("connect.pid").exists() && std::net::TcpStream::connect(local).is_err()
}

/// Sends SIGTERM to the background connect whose pid `state` holds, if any.
fn stop_daemon(state: &Path) {
    if let Some(pid) = std::fs::read_to_string(state.join("connect.pid"))
        .ok()
        .and_then(|t| t.trim().parse::<i32>().ok())
    {
        // SAFETY: kill(2) with a pid and a signal number has no memory effects.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
}

/// Stops the exec form's background connect when the test ends, failed or not.
struct Daemon(PathBuf);

impl Drop for Daemon {
    fn drop(&mut self) {
        stop_daemon(&self.0);
    }
}

/// A pod's StatefulSet revision.
fn revision(pod: &Pod) -> Option<String> {
    pod.labels().get("controller-revision-hash").cloned()
}

/// The apiserver pod of the test's control plane, unless it is being deleted.
async fn apiserver_pod(pods: &Api<Pod>) -> Option<Pod> {
    let listed = pods.list(&ListParams::default()).await.ok()?;
    listed
        .items
        .into_iter()
        .find(|p| p.name_any().starts_with("demo-apiserver-") && p.metadata.deletion_timestamp.is_none())
}

/// `capn kubeconfig demo -n <ns> <extra>`'s standard output.
async fn capn_kubeconfig(ns: &str, extra: &[&str]) -> String {
    let output = tokio::process::Command::new(capn_binary())
        .args(["kubeconfig", "demo", "-n", ns])
        .args(extra)
        .env("KUBECONFIG", capn_testkit::cluster().kubeconfig_path())
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "capn kubeconfig failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}
