//! The syncer on a booted tenant (docs/design.md §11): a tenant Deployment's pods become
//! super pods in the control plane's workload namespace, with the tenant's own
//! service-account tokens (accepted by the tenant apiserver, refused by the super cluster's),
//! the tenant's CA and apiserver address; their status and node come back up; a pod that
//! breaks the tenant's Pod Security level is refused with a condition and an Event; deleting
//! the Deployment removes every super object, and deleting the control plane its workload
//! namespace.

use capn::api::NestedControlPlane;
use capn::syncer::names::ControlPlaneRef;
use capn_testkit::poll_until;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Secret};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::boot::{BOOTED_STEP, Booted, StartCapn, boot_with, say};
use crate::stand_in_node::StandInNode;

/// A tenant Deployment of `replicas` agnhost `netexec` pods in namespace `ns`.
fn deployment(ns: &str, replicas: i32) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{
                    "name": "agnhost",
                    "image": "registry.k8s.io/e2e-test-images/agnhost:2.53",
                    "args": ["netexec", "--http-port=8080"]}]}}}
    }))
    .unwrap()
}

async fn tenant_client(booted: &Booted) -> Client {
    booted.nested(&booted.kubeconfig().await).await
}

/// A client of `config`'s server that authenticates with `token` only.
fn with_token(mut config: kube::Config, token: &str) -> Client {
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.to_owned().into()),
        ..Default::default()
    };
    Client::try_from(config).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_pods_run_in_the_super_cluster_and_report_back() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("capn=info")
        .with_test_writer()
        .try_init();
    let booted = boot_with("syncer", None, StartCapn::InProcess).await;
    let (client, ns) = (booted.client.clone(), booted.ns.clone());
    let tenant = tenant_client(&booted).await;
    let control_plane = ControlPlaneRef::new(&ns, "demo");
    let workloads = control_plane.workload_namespace();

    // The workload namespace, at the default Pod Security level, with its NetworkPolicy.
    let namespace = booted
        .runner
        .wait_for("the workload namespace exists", BOOTED_STEP, || async {
            Api::<Namespace>::all(client.clone())
                .get_opt(&workloads)
                .await
                .ok()
                .flatten()
        })
        .await;
    assert_eq!(namespace.labels()["pod-security.kubernetes.io/enforce"], "baseline");
    Api::<NetworkPolicy>::namespaced(client.clone(), &workloads)
        .get("tenant")
        .await
        .expect("the workload namespace's NetworkPolicy");
    let node = StandInNode::start(&client, &workloads).await;

    // A Deployment in the tenant: its pods run as super pods, and come back Running.
    Api::<Namespace>::all(tenant.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "shop"}})).unwrap(),
        )
        .await
        .unwrap();
    Api::<Deployment>::namespaced(tenant.clone(), "shop")
        .create(&PostParams::default(), &deployment("shop", 3))
        .await
        .unwrap();
    let tenant_pods = Api::<Pod>::namespaced(tenant.clone(), "shop");
    let running = booted
        .runner
        .wait_for("3 tenant pods Running", BOOTED_STEP, || async {
            let pods = tenant_pods.list(&ListParams::default()).await.ok()?.items;
            let running: Vec<Pod> = pods
                .into_iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .collect();
            (running.len() == 3).then_some(running)
        })
        .await;
    let super_pods = Api::<Pod>::namespaced(client.clone(), &workloads);
    for pod in &running {
        let super_name = format!("{}-x-shop-x-demo", pod.name_any());
        let copy = super_pods.get(&super_name).await.unwrap();
        let annotations = copy.annotations();
        assert_eq!(annotations["tenancy.x-k8s.io/uid"], pod.uid().unwrap());
        assert_eq!(annotations["tenancy.x-k8s.io/cluster"], control_plane.key());
        let spec = copy.spec.as_ref().unwrap();
        assert_eq!(spec.automount_service_account_token, Some(false));
        let env = spec.containers[0].env.clone().unwrap_or_default();
        let host = env
            .iter()
            .find(|e| e.name == "KUBERNETES_SERVICE_HOST")
            .and_then(|e| e.value.clone());
        let endpoint = Api::<NestedControlPlane>::namespaced(client.clone(), &ns)
            .get("demo")
            .await
            .unwrap()
            .spec
            .control_plane_endpoint
            .unwrap();
        assert_eq!(
            host.as_deref(),
            Some(endpoint.host.as_str()),
            "the pod talks to its own apiserver"
        );
        // The tenant pod shows the super pod's IP and is bound to a tenant Node of the super
        // node's name.
        let super_ip = copy.status.as_ref().and_then(|s| s.pod_ip.clone());
        assert_eq!(pod.status.as_ref().and_then(|s| s.pod_ip.clone()), super_ip);
        assert_eq!(
            pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
            Some(node.name())
        );
    }
    say("syncer: 3 tenant pods Running through their super pods");

    // The token the pods mount is the tenant's: its apiserver knows the pod's service
    // account, the super cluster refuses it.
    let secrets = Api::<Secret>::namespaced(client.clone(), &workloads);
    let token_secret = secrets
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|s| s.annotations().contains_key(capn::controllers::syncer::REFRESH_AT))
        .expect("a token Secret");
    let token = token_secret.data.as_ref().unwrap().values().next().unwrap().0.clone();
    let token = String::from_utf8(token).unwrap();
    let tenant_config = booted.runner.client_config(&booted.kubeconfig().await).await.unwrap();
    let review: SelfSubjectReview = Api::<SelfSubjectReview>::all(with_token(tenant_config, &token))
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .expect("the tenant apiserver accepts the pod's token");
    let user = review.status.and_then(|s| s.user_info).and_then(|u| u.username);
    assert_eq!(user.as_deref(), Some("system:serviceaccount:shop:default"));
    let refused = Api::<SelfSubjectReview>::all(with_token(capn_testkit::cluster().config(), &token))
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(e)) if e.code == 401),
        "the super cluster refuses a tenant token: {refused:?}"
    );
    // The pod trusts its own apiserver's CA.
    let root_ca = Api::<ConfigMap>::namespaced(client.clone(), &workloads)
        .get("kube-root-ca.crt-x-shop-x-demo")
        .await
        .expect("the tenant's kube-root-ca.crt is synced");
    let tenant_ca = Api::<ConfigMap>::namespaced(tenant.clone(), "shop")
        .get("kube-root-ca.crt")
        .await
        .unwrap();
    assert_eq!(root_ca.data, tenant_ca.data);

    // The tenant Node is Ready, with a Lease the syncer renews.
    let tenant_node = Api::<Node>::all(tenant.clone()).get(node.name()).await.unwrap();
    let ready = tenant_node.status.and_then(|s| s.conditions).unwrap_or_default();
    assert!(
        ready.iter().any(|c| c.type_ == "Ready" && c.status == "True"),
        "{ready:?}"
    );
    let leases = Api::<Lease>::namespaced(tenant.clone(), "kube-node-lease");
    let first = leases.get(node.name()).await.unwrap().spec.unwrap().renew_time;
    booted
        .runner
        .wait_for("the tenant Node's Lease is renewed", BOOTED_STEP, || async {
            let now = leases.get(node.name()).await.ok()?.spec?.renew_time;
            (now != first).then_some(())
        })
        .await;

    // A pod that asks for the host's network is refused: condition, Event, no super pod.
    let host_network: Pod = serde_json::from_value(json!({
        "metadata": {"name": "sneaky", "namespace": "shop"},
        "spec": {"hostNetwork": true, "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
    }))
    .unwrap();
    tenant_pods.create(&PostParams::default(), &host_network).await.unwrap();
    let refused = booted
        .runner
        .wait_for("the hostNetwork pod is refused", BOOTED_STEP, || async {
            let pod = tenant_pods.get("sneaky").await.ok()?;
            let conditions = pod.status?.conditions?;
            conditions
                .into_iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        })
        .await;
    assert_eq!(refused.reason.as_deref(), Some("HostNamespacesForbidden"));
    assert!(refused.message.unwrap_or_default().contains("hostNetwork"));
    booted
        .runner
        .wait_for("an Event says why", BOOTED_STEP, || async {
            let events = Api::<Event>::namespaced(tenant.clone(), "shop")
                .list(&ListParams::default())
                .await
                .ok()?;
            events
                .items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("HostNamespacesForbidden"))
        })
        .await;
    assert!(super_pods.get_opt("sneaky-x-shop-x-demo").await.unwrap().is_none());

    // Deleting the Deployment removes every super pod and every copy.
    Api::<Deployment>::namespaced(tenant.clone(), "shop")
        .delete("web", &DeleteParams::foreground())
        .await
        .unwrap();
    tenant_pods.delete("sneaky", &DeleteParams::default()).await.unwrap();
    booted
        .runner
        .wait_for("every super pod is gone", BOOTED_STEP, || async {
            let left = super_pods.list(&ListParams::default()).await.ok()?.items;
            left.is_empty().then_some(())
        })
        .await;
    booted
        .runner
        .wait_for("every tenant pod is gone", BOOTED_STEP, || async {
            let left = tenant_pods.list(&ListParams::default()).await.ok()?.items;
            left.is_empty().then_some(())
        })
        .await;

    // Deleting the control plane removes its workload namespace.
    Api::<NestedControlPlane>::namespaced(client.clone(), &ns)
        .delete("demo", &DeleteParams::default())
        .await
        .unwrap();
    let gone = poll_until(BOOTED_STEP, || async {
        let namespace = Api::<Namespace>::all(client.clone()).get_opt(&workloads).await.ok()?;
        namespace
            .is_none_or(|n| n.metadata.deletion_timestamp.is_some())
            .then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "the workload namespace is deleted with the control plane"
    );
    drop(node);
    booted.stop().await;
}

/// The admin client of the control plane `name` booted beside `demo`.
async fn tenant_client_of(booted: &Booted, name: &str) -> Client {
    let secret = crate::harness::secret(&booted.client, &booted.ns, &format!("{name}-kubeconfig"))
        .await
        .unwrap_or_else(|| panic!("{name}-kubeconfig exists once {name} is ready"));
    let kubeconfig = crate::harness::secret_value(&secret, "value");
    Client::try_from(booted.runner.client_config(&kubeconfig).await.unwrap()).unwrap()
}

/// The tenant pods of `shop` that are Running, once there are `count`.
async fn running_pods(booted: &Booted, tenant: &Client, count: usize) -> Vec<Pod> {
    let pods = Api::<Pod>::namespaced(tenant.clone(), "shop");
    booted
        .runner
        .wait_for(&format!("{count} tenant pods Running"), BOOTED_STEP, || async {
            let running: Vec<Pod> = pods
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .collect();
            (running.len() == count).then_some(running)
        })
        .await
}

/// Two tenants with the same namespace, Deployment and pod names run side by side, each in
/// its own workload namespace; capn stopped abruptly while it syncs them (its task aborted
/// between requests, as SIGKILL would) converges after the restart with exactly one super
/// pod per tenant pod; a `hostPath` pod is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_with_the_same_names_converge_after_capn_is_killed_mid_sync() {
    let mut booted = boot_with("syncer, two tenants", None, StartCapn::InProcess).await;
    let (client, ns) = (booted.client.clone(), booted.ns.clone());
    crate::harness::apply_doc(
        &client,
        &ns,
        json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedControlPlane",
            "metadata": {"name": "other"}, "spec": {"version": "1.36"}}),
    )
    .await;
    let ncps = Api::<NestedControlPlane>::namespaced(client.clone(), &ns);
    booted
        .runner
        .wait_for("the second control plane is ready", BOOTED_STEP * 3, || async {
            ncps.get("other").await.ok()?.status.filter(|s| s.ready).map(|_| ())
        })
        .await;
    let tenants = [
        ("demo", tenant_client(&booted).await),
        ("other", tenant_client_of(&booted, "other").await),
    ];
    let mut nodes = Vec::new();
    for (name, tenant) in &tenants {
        let workloads = ControlPlaneRef::new(&ns, *name).workload_namespace();
        booted
            .runner
            .wait_for("the workload namespace exists", BOOTED_STEP, || async {
                Api::<Namespace>::all(client.clone())
                    .get_opt(&workloads)
                    .await
                    .ok()
                    .flatten()
            })
            .await;
        nodes.push(StandInNode::start(&client, &workloads).await);
        Api::<Namespace>::all(tenant.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": "shop"}})).unwrap(),
            )
            .await
            .unwrap();
        Api::<Deployment>::namespaced(tenant.clone(), "shop")
            .create(&PostParams::default(), &deployment("shop", 5))
            .await
            .unwrap();
    }
    // Stop capn once the first super pod exists: the rest of the sync is under way.
    let first = Api::<Pod>::namespaced(client.clone(), &ControlPlaneRef::new(&ns, "demo").workload_namespace());
    booted
        .runner
        .wait_for("a first super pod", BOOTED_STEP, || async {
            (!first.list(&ListParams::default()).await.ok()?.items.is_empty()).then_some(())
        })
        .await;
    booted.kill_and_restart_capn().await;

    for (name, tenant) in &tenants {
        let running = running_pods(&booted, tenant, 5).await;
        let control_plane = ControlPlaneRef::new(&ns, *name);
        let copies = Api::<Pod>::namespaced(client.clone(), &control_plane.workload_namespace())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        let mut copied: Vec<(String, String)> = copies
            .iter()
            .map(|p| {
                let a = p.annotations();
                assert_eq!(a["tenancy.x-k8s.io/cluster"], control_plane.key());
                (a["tenancy.x-k8s.io/name"].clone(), a["tenancy.x-k8s.io/uid"].clone())
            })
            .collect();
        let mut expected: Vec<(String, String)> = running.iter().map(|p| (p.name_any(), p.uid().unwrap())).collect();
        copied.sort();
        expected.sort();
        assert_eq!(
            copied, expected,
            "{name}: exactly one super pod per tenant pod, no duplicate, no orphan"
        );
    }
    say("syncer: two tenants with the same names converged after capn was stopped mid-sync");

    // A pod with a hostPath volume is refused.
    let (_, other) = &tenants[1];
    let host_path: Pod = serde_json::from_value(json!({
        "metadata": {"name": "reader", "namespace": "shop"},
        "spec": {"volumes": [{"name": "root", "hostPath": {"path": "/"}}],
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                "volumeMounts": [{"name": "root", "mountPath": "/host"}]}]}
    }))
    .unwrap();
    let pods = Api::<Pod>::namespaced(other.clone(), "shop");
    pods.create(&PostParams::default(), &host_path).await.unwrap();
    let refused = booted
        .runner
        .wait_for("the hostPath pod is refused", BOOTED_STEP, || async {
            let conditions = pods.get("reader").await.ok()?.status?.conditions?;
            conditions
                .into_iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        })
        .await;
    assert_eq!(refused.reason.as_deref(), Some("HostPathVolumesForbidden"));
    let other_workloads = ControlPlaneRef::new(&ns, "other").workload_namespace();
    assert!(
        Api::<Pod>::namespaced(client.clone(), &other_workloads)
            .get_opt("reader-x-shop-x-other")
            .await
            .unwrap()
            .is_none()
    );
    drop(nodes);
    booted.stop().await;
}
