//! Issue 41, item 3: `capn kubeconfig` and `capn connect` give a kubeconfig of the tenant
//! that works from the host, where the apiserver's in-cluster name does not resolve, and
//! `capn connect`'s keeps working across an apiserver roll (a new pod at a new address) and
//! a CA rotation, without the user doing anything: the file is read anew for each client,
//! as kubectl reads it on every call.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::boot::{BOOTED_STEP, StartCapn, boot_with, say};
use crate::harness::{capn_binary, request_rotation};

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

    // `capn kubeconfig` prints the Secret's kubeconfig, and with --server one that works
    // through any address that reaches the apiserver (here capn connect's endpoint).
    let printed = capn_kubeconfig(&ns, &[]).await;
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
