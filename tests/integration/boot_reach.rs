//! Issue 41, item 1: capn reaches a tenant from where its in-cluster names do not resolve.
//!
//! capn runs as `capn run` with neither the runner's hosts file nor the tests' tenant hook,
//! so `demo-apiserver.<ns>.svc` and `demo-etcd-<i>.demo-etcd.<ns>.svc` resolve nowhere it
//! looks; its default `--tenant-connection=auto` must notice and go through the super
//! cluster's `pods/portforward` of the control plane's pods (which the runner gives objects
//! and a kubelet API: runner adaptation 12). Each feature that dials the tenant is driven
//! once: the public-CRD sync (tenant apiserver by its Service), the stepped-upgrade
//! preflight (every apiserver replica's `/metrics` at its advertised pod address) and an
//! etcd scale from 1 to 3 members (each member by its pod's name).

use std::time::Duration;

use capn::api::{NestedControlPlane, NestedEtcd};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::boot::{BOOTED_STEP, StartCapn, boot_with, say};
use crate::boot_members::settled;
use crate::public_crds::crd;

/// One upgrade step (three StatefulSets rolled) or a membership change, on two busy cores.
const LONG_STEP: Duration = Duration::from_secs(600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capn_outside_the_pod_network_reaches_the_tenant_through_the_super_clusters_port_forward() {
    let docs = vec![
        json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
            "kind": "NestedEtcd",
            "metadata": {"name": "demo-etcd"},
            "spec": {"replicas": 1},
        }),
        json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
            "kind": "NestedControlPlane",
            "metadata": {"name": "demo"},
            "spec": {"version": "1.35", "etcd": {"name": "demo-etcd"}},
        }),
    ];
    // `*` after the harness's `*,-public-crds`: every controller, the public-CRD sync too.
    let args = vec!["--controllers=*".to_owned()];
    let booted = boot_with("reach", Some(docs), StartCapn::ProcessOutside(args)).await;
    let (client, ns) = (booted.client.clone(), booted.ns.clone());

    // Public-CRD sync: a public CRD of the super cluster appears in the tenant.
    let suffix = ns.trim_start_matches("capn-test-").to_owned();
    let name = format!("gizmos.r{suffix}.example.com");
    let supers: Api<CustomResourceDefinition> = Api::all(client.clone());
    let doc = crd(&name, "gizmos", "Gizmo", true, &["v1"]);
    supers
        .patch(&name, &PatchParams::apply("platform-team").force(), &Patch::Apply(&doc))
        .await
        .unwrap();
    let tenant = booted.nested(&booted.kubeconfig().await).await;
    let tenant_crds: Api<CustomResourceDefinition> = Api::all(tenant);
    booted
        .runner
        .wait_for("the public CRD reaches the tenant", BOOTED_STEP, || async {
            tenant_crds.get_opt(&name).await.ok().flatten().map(drop)
        })
        .await;
    say("reach: public CRD synced into the tenant");

    // Stepped upgrade: the preflight reads each apiserver replica's metrics, then the step
    // rolls the tenant to 1.36.
    let ncps: Api<NestedControlPlane> = Api::namespaced(client.clone(), &ns);
    ncps.patch(
        "demo",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"version": "1.36"}})),
    )
    .await
    .unwrap();
    booted
        .runner
        .wait_for("the upgrade to 1.36 completes", LONG_STEP, || async {
            let status = ncps.get("demo").await.ok()?.status?;
            // A failed preflight is tried again every 20 s (a dropped forward passes);
            // only a failed step stops the upgrade.
            if let Some(u) = status.upgrade.as_ref().filter(|u| u.phase == "Failed") {
                panic!("the upgrade stopped: {}", u.message);
            }
            let completed = status.upgrade.as_ref().is_some_and(|u| u.phase == "Completed");
            (completed && status.ready && status.version.as_deref() == Some("1.36.3")).then_some(())
        })
        .await;
    say("reach: upgraded 1.35 → 1.36 after a preflight through port-forwards");

    // etcd membership: 1 → 3 members, each added and promoted through its own pod.
    Api::<NestedEtcd>::namespaced(client.clone(), &ns)
        .patch(
            "demo-etcd",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    let status = settled(&booted, 3, LONG_STEP).await;
    say(&format!(
        "reach: etcd at {} voting members",
        status.etcd.map(|e| e.members.len()).unwrap_or_default()
    ));

    // The path was chosen, and said so, for the names capn dials.
    let log = booted.capn_log().expect("capn runs as a process");
    let chosen: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("tenant connection path chosen"))
        .collect();
    assert!(
        chosen
            .iter()
            .any(|l| l.contains(&format!("demo-apiserver.{ns}.svc")) && l.contains("port-forward")),
        "no port-forward chosen for the apiserver: {chosen:#?}"
    );
    assert!(
        chosen
            .iter()
            .any(|l| l.contains(&format!("demo-etcd-0.demo-etcd.{ns}.svc")) && l.contains("port-forward")),
        "no port-forward chosen for the etcd member: {chosen:#?}"
    );
    assert!(
        !chosen.iter().any(|l| l.contains("\"direct\"")),
        "a name resolved outside the pod network: {chosen:#?}"
    );
    // And counted: the metric shows the forwards opened (each connection is one).
    let metrics = served_metrics(&log).await;
    let opened = metrics
        .lines()
        .find_map(|l| l.strip_prefix(r#"capn_tenant_connections_total{path="port-forward",result="opened"} "#))
        .and_then(|v| v.trim().parse::<f64>().ok());
    assert!(
        opened.is_some_and(|n| n >= 2.0),
        "capn_tenant_connections_total does not count the forwards: {opened:?}\n{metrics}"
    );
    say(&format!(
        "reach: {} port-forward connections opened",
        opened.unwrap_or_default()
    ));
    supers.delete(&name, &Default::default()).await.unwrap();
    booted.stop().await;
}

/// `/metrics` of the capn process whose JSON log is `log`, at the address it logged binding
/// (the tests' capn binds port 0).
async fn served_metrics(log: &str) -> String {
    let address: std::net::SocketAddr = log
        .lines()
        .filter(|l| l.contains("serving /metrics"))
        .find_map(|l| {
            serde_json::from_str::<serde_json::Value>(l).ok()?["fields"]["addr"]
                .as_str()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("capn did not log where it serves /metrics"));
    let (status, body) = capn_testkit::http_get(address, "/metrics")
        .await
        .expect("/metrics answers");
    assert_eq!(status, 200, "{body}");
    body
}
