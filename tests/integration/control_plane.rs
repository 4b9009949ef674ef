//! Issue "A nested control plane from one `kubectl apply`": the standalone example on a
//! real apiserver, in order, with a complete PKI.

use std::time::Duration;

use capn::api::{NestedAPIServer, NestedControlPlane, NestedControllerManager, NestedEtcd};
use capn_testkit::{cluster, mark_statefulset_ready, test_namespace, wait_until};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

use crate::harness::*;

#[tokio::test]
async fn standalone_example_comes_up_in_order_and_reports_ready() {
    let f = Fixture::new().await;
    let (client, ns) = (f.client.clone(), f.ns.clone());
    f.apply_example("examples/nestedcontrolplane.yaml").await;

    // The three component resources appear, owned by the control plane.
    wait_until("three component resources exist", CONTROLLER_STEP, || async {
        (components(&client, &ns).await.len() == 3).then_some(())
    })
    .await;
    // etcd and its secrets come first.
    make_ready_precondition(&client, &ns).await;
    for name in ["demo-ca", "demo-etcd", "demo-proxy", "demo-sa", "demo-etcd-server"] {
        assert!(
            secret(&client, &ns, name).await.is_some(),
            "secret {name} exists before etcd runs"
        );
    }
    // A StatefulSet status that reports 0/0 is not ready.
    let sts_api: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let etcd_sts = sts_api.get("demo-etcd").await.unwrap();
    let zero = json!({"status": {"observedGeneration": etcd_sts.metadata.generation, "replicas": 0,
        "readyReplicas": 0, "currentReplicas": 0, "updatedReplicas": 0, "availableReplicas": 0}});
    sts_api
        .patch_status("demo-etcd", &PatchParams::default(), &Patch::Merge(&zero))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !etcd_ready(&client, &ns, "demo-etcd").await,
        "0/0 must not count as ready"
    );
    // Nothing of the apiserver exists until etcd is ready.
    assert!(statefulset(&client, &ns, "demo-apiserver").await.is_none());
    assert!(
        Api::<Service>::namespaced(client.clone(), &ns)
            .get_opt("demo-apiserver")
            .await
            .unwrap()
            .is_none()
    );
    assert!(secret(&client, &ns, "demo-apiserver").await.is_none());
    let ncp = control_plane(&client, &ns, "demo").await;
    assert!(!ncp.status.as_ref().is_some_and(|s| s.ready));

    mark_statefulset_ready(&client, &ns, "demo-etcd").await.unwrap();
    wait_until("NestedEtcd is ready", CONTROLLER_STEP, || async {
        etcd_ready(&client, &ns, "demo-etcd").await.then_some(())
    })
    .await;
    wait_until("the apiserver StatefulSet exists", CONTROLLER_STEP, || async {
        statefulset(&client, &ns, "demo-apiserver").await.map(|_| ())
    })
    .await;
    // Nothing of the controller-manager until the apiserver is ready.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(statefulset(&client, &ns, "demo-controller-manager").await.is_none());
    assert!(
        secret(&client, &ns, "demo-controller-manager-kubeconfig")
            .await
            .is_none()
    );
    let status = control_plane(&client, &ns, "demo").await.status.unwrap();
    assert!(
        !status.ready && !status.initialized,
        "not ready before the apiserver is"
    );

    mark_statefulset_ready(&client, &ns, "demo-apiserver").await.unwrap();
    make_ready(&client, &ns, "demo-controller-manager").await;
    let ncp = wait_until("the NestedControlPlane is ready", CONTROLLER_STEP, || async {
        let ncp = control_plane(&client, &ns, "demo").await;
        ncp.status.as_ref().is_some_and(|s| s.ready).then_some(ncp)
    })
    .await;
    let status = ncp.status.unwrap();
    assert!(status.initialized);
    assert!(status.initialization.unwrap().control_plane_initialized);
    assert!(status.external_managed_control_plane);
    assert!(capn::status::is_true(&status.conditions, "Available"));
    let components = status.components.unwrap();
    for c in [
        components.etcd.unwrap(),
        components.apiserver.unwrap(),
        components.controller_manager.unwrap(),
    ] {
        assert!(c.ready && c.replicas == 1 && c.ready_replicas == 1, "{c:?}");
        assert!(c.version.is_some());
    }
    assert_eq!(status.version.as_deref(), Some("1.36.3"));
    let endpoint = ncp.spec.control_plane_endpoint.expect("endpoint filled by capn");
    assert_eq!(endpoint.host, format!("demo-apiserver.{ns}.svc"));
    assert_eq!(endpoint.port, 6443);
    f.stop().await;
}

/// Waits until the etcd StatefulSet exists (the first workload).
async fn make_ready_precondition(client: &kube::Client, ns: &str) {
    wait_until("the etcd StatefulSet exists", CONTROLLER_STEP, || async {
        statefulset(client, ns, "demo-etcd").await.map(|_| ())
    })
    .await;
}

#[tokio::test]
async fn kubeconfig_secret_follows_cluster_api_layout_and_trusts_the_serving_certificate() {
    let f = Fixture::new().await;
    let (client, ns) = (f.client.clone(), f.ns.clone());
    f.apply_example("examples/nestedcontrolplane.yaml").await;
    f.bring_up("demo").await;
    let secret = wait_until("demo-kubeconfig exists", CONTROLLER_STEP, || async {
        secret(&client, &ns, "demo-kubeconfig").await
    })
    .await;
    assert_eq!(secret.type_.as_deref(), Some("cluster.x-k8s.io/secret"));
    assert_eq!(
        secret.labels().get("cluster.x-k8s.io/cluster-name").map(String::as_str),
        Some("demo")
    );
    let config = kube::config::Kubeconfig::from_yaml(&secret_value(&secret, "value")).expect("a kubeconfig");
    assert_eq!(config.current_context.as_deref(), Some("demo-admin@demo"));
    let cluster_entry = config.clusters[0].cluster.as_ref().unwrap();
    assert_eq!(
        cluster_entry.server.as_deref(),
        Some(format!("https://demo-apiserver.{ns}.svc:6443").as_str())
    );
    let ca_pem = String::from_utf8(base64_decode(
        cluster_entry.certificate_authority_data.as_deref().unwrap(),
    ))
    .unwrap();
    let serving = secret_value(
        &crate::harness::secret(&client, &ns, "demo-apiserver").await.unwrap(),
        "tls.crt",
    );
    assert!(
        signed_by(&pem_to_der(&serving), &pem_to_der(&ca_pem)),
        "kubeconfig CA verifies the apiserver certificate"
    );
    // The admin identity is in system:masters, signed by the same CA.
    let user = config.auth_infos[0].auth_info.as_ref().unwrap();
    let client_pem = String::from_utf8(base64_decode(user.client_certificate_data.as_deref().unwrap())).unwrap();
    assert!(signed_by(&pem_to_der(&client_pem), &pem_to_der(&ca_pem)));
    // The controller-manager has its own identity, not the admin one.
    let kcm = crate::harness::secret(&client, &ns, "demo-controller-manager-kubeconfig")
        .await
        .unwrap();
    let kcm_config = kube::config::Kubeconfig::from_yaml(&secret_value(&kcm, "value")).unwrap();
    assert_eq!(kcm_config.auth_infos[0].name, "system:kube-controller-manager");
    f.stop().await;
}

fn base64_decode(s: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(s).unwrap()
}

#[tokio::test]
async fn three_member_etcd_is_listed_everywhere_and_every_dialled_host_is_certified() {
    let f = Fixture::new().await;
    let (client, ns) = (f.client.clone(), f.ns.clone());
    // A user-given NestedEtcd is adopted.
    f.apply(json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedEtcd",
        "metadata": {"name": "big-etcd"}, "spec": {"replicas": 3}
    }))
    .await;
    f.apply(json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedControlPlane",
        "metadata": {"name": "big"}, "spec": {"etcd": {"name": "big-etcd"}}
    }))
    .await;
    make_ready(&client, &ns, "big-etcd").await;
    // Members start from the membership ConfigMap (ETCD_INITIAL_CLUSTER), not from flags.
    let initial_cluster = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), &ns)
        .get("big-etcd-membership")
        .await
        .unwrap()
        .data
        .unwrap()["initial-cluster"]
        .clone();
    let mut members: Vec<&str> = initial_cluster.split(',').collect();
    members.sort();
    let expected: Vec<String> = (0..3)
        .map(|i| format!("big-etcd-{i}=https://big-etcd-{i}.big-etcd.{ns}.svc:2380"))
        .collect();
    assert_eq!(members, expected.iter().map(String::as_str).collect::<Vec<_>>());
    let etcd = Api::<NestedEtcd>::namespaced(client.clone(), &ns)
        .get("big-etcd")
        .await
        .unwrap();
    assert!(
        etcd.owner_references()
            .iter()
            .any(|o| o.kind == "NestedControlPlane" && o.name == "big"),
        "adopted"
    );

    make_ready(&client, &ns, "big-apiserver").await;
    let api_flags = flags(&statefulset(&client, &ns, "big-apiserver").await.unwrap());
    let servers: Vec<&str> = api_flags["etcd-servers"].split(',').collect();
    assert_eq!(servers.len(), 3);
    for i in 0..3 {
        assert!(
            servers.contains(&format!("https://big-etcd-{i}.big-etcd.{ns}.svc:2379").as_str()),
            "{servers:?}"
        );
    }
    let cert = pem_to_der(&secret_value(
        &secret(&client, &ns, "big-etcd-server").await.unwrap(),
        "tls.crt",
    ));
    let (dns, _) = sans(&cert);
    let urls = initial_cluster
        .split(',')
        .map(|m| m.split_once('=').unwrap().1.to_string())
        .chain(servers.iter().map(|s| s.to_string()));
    for url in urls {
        let host = url
            .trim_start_matches("https://")
            .split(':')
            .next()
            .unwrap()
            .to_string();
        assert!(
            dns.contains(&host),
            "{host} is not a SAN of the etcd certificate: {dns:?}"
        );
    }
    assert_eq!(
        usages(&cert),
        (true, true),
        "etcd certificate is for servers and clients (peers)"
    );
    f.stop().await;
}

#[tokio::test]
async fn apiserver_certificate_names_every_address_clients_dial() {
    let f = Fixture::new().await;
    let (client, ns) = (f.client.clone(), f.ns.clone());
    f.apply(json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedControlPlane",
        "metadata": {"name": "sans"},
        "spec": {
            "certSANs": ["api.example.com", "192.0.2.10"],
            "controlPlaneEndpoint": {"host": "192.0.2.20", "port": 6443},
            "clusterNetwork": {"services": {"cidrBlocks": ["10.100.0.0/16"]}, "serviceDomain": "tenant.local"}
        }
    }))
    .await;
    make_ready(&client, &ns, "sans-etcd").await;
    let cert = wait_until("the apiserver certificate exists", CONTROLLER_STEP, || async {
        secret(&client, &ns, "sans-apiserver").await
    })
    .await;
    let service = Api::<Service>::namespaced(client.clone(), &ns)
        .get("sans-apiserver")
        .await
        .unwrap();
    let cluster_ip = service.spec.unwrap().cluster_ip.unwrap();
    let (dns, ips) = sans(&pem_to_der(&secret_value(&cert, "tls.crt")));
    for name in [
        "kubernetes".to_string(),
        "kubernetes.default".into(),
        "kubernetes.default.svc".into(),
        "kubernetes.default.svc.tenant.local".into(),
        "sans-apiserver".into(),
        format!("sans-apiserver.{ns}"),
        format!("sans-apiserver.{ns}.svc"),
        format!("sans-apiserver.{ns}.svc.cluster.local"),
        "localhost".into(),
        "api.example.com".into(),
    ] {
        assert!(dns.contains(&name), "DNS SAN {name} missing: {dns:?}");
    }
    for ip in [
        cluster_ip.as_str(),
        "10.100.0.1",
        "127.0.0.1",
        "192.0.2.10",
        "192.0.2.20",
    ] {
        assert!(ips.contains(&ip.to_string()), "IP SAN {ip} missing: {ips:?}");
    }
    f.stop().await;
}

#[tokio::test]
async fn restarting_the_controller_changes_no_certificate_and_duplicates_nothing() {
    let mut f = Fixture::new().await;
    let (client, ns) = (f.client.clone(), f.ns.clone());
    f.apply_example("examples/nestedcontrolplane.yaml").await;
    make_ready(&client, &ns, "demo-etcd").await;
    wait_until("etcd is ready", CONTROLLER_STEP, || async {
        etcd_ready(&client, &ns, "demo-etcd").await.then_some(())
    })
    .await;
    f.stop_capn().await;
    let before = secret_fingerprints(&client, &ns).await;
    assert!(before.contains_key("demo-ca") && before.contains_key("demo-etcd-server"));

    // Mid-way restart.
    f.start_capn();
    f.bring_up("demo").await;
    wait_until("demo-kubeconfig exists", CONTROLLER_STEP, || async {
        secret(&client, &ns, "demo-kubeconfig").await
    })
    .await;
    f.stop_capn().await;
    let after = secret_fingerprints(&client, &ns).await;
    for (name, fp) in &before {
        assert_eq!(after.get(name), Some(fp), "{name} changed across a restart");
    }

    // Restart at the end: nothing changes, nothing is duplicated.
    f.start_capn();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ncp = control_plane(&client, &ns, "demo").await;
    assert!(ncp.status.unwrap().ready);
    f.stop().await;
    assert_eq!(
        secret_fingerprints(&client, &ns).await,
        after,
        "a restart re-issued a certificate"
    );
    assert_eq!(
        components(&client, &ns).await.len(),
        3,
        "one component resource per kind"
    );
    let sts = Api::<StatefulSet>::namespaced(client.clone(), &ns)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(sts.items.len(), 3);
    let svc = Api::<Service>::namespaced(client.clone(), &ns)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(svc.items.len(), 2, "etcd headless and apiserver services");
}

/// Every field capn writes is recorded under its own field manager, `capn`: a create or a
/// merge patch without one is recorded as `"manager": "unknown"` (apiserver
/// `fieldmanager`), which hides from `kubectl get --show-managed-fields` who owns it.
#[tokio::test]
async fn every_field_capn_writes_is_managed_by_capn() {
    let f = Fixture::new().await;
    let (client, ns) = (f.client.clone(), f.ns.clone());
    f.apply_example("examples/nestedcontrolplane.yaml").await;
    f.bring_up("demo").await;
    f.stop().await;

    // The test's own writers: the user's apply and the StatefulSet status stand-in.
    let allowed = [
        capn::apply::FIELD_MANAGER,
        "kubectl",
        capn_testkit::STATEFULSET_STATUS_MANAGER,
    ];
    let mut objects = Vec::new();
    objects.extend(metas::<NestedControlPlane>(&client, &ns).await);
    objects.extend(metas::<NestedEtcd>(&client, &ns).await);
    objects.extend(metas::<NestedAPIServer>(&client, &ns).await);
    objects.extend(metas::<NestedControllerManager>(&client, &ns).await);
    objects.extend(metas::<Secret>(&client, &ns).await);
    objects.extend(metas::<StatefulSet>(&client, &ns).await);
    objects.extend(metas::<Service>(&client, &ns).await);
    // Only the Events capn reports: the API server's own ClusterIP repair loop may report
    // one on a Service it saw before the Service's IP was allocated (`ClusterIPNotAllocated`),
    // written under its manager `kube-apiserver`; that race is not capn's write.
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), &ns);
    objects.extend(
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reporting_controller.as_deref() == Some("capn"))
            .map(|e| ("Event".to_string(), e.name_any(), managers(&e))),
    );
    assert!(
        objects.iter().any(|(kind, _, _)| kind == "Event"),
        "capn published Events, so that their managers are checked too"
    );
    let foreign: Vec<_> = objects
        .iter()
        .flat_map(|(kind, name, managers)| {
            managers
                .iter()
                .filter(|m| !allowed.contains(&m.as_str()))
                .map(move |m| format!("{kind}/{name}: {m}"))
        })
        .collect();
    assert!(foreign.is_empty(), "fields written under another manager: {foreign:?}");
}

/// (kind, name, the managers in `managedFields`) of every `K` in `ns`.
async fn metas<K: NamespacedKind>(client: &kube::Client, ns: &str) -> Vec<(String, String, Vec<String>)> {
    Api::<K>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|o| (K::kind(&()).to_string(), o.name_any(), managers(&o)))
        .collect()
}

/// The managers in `o`'s `managedFields`.
fn managers(o: &impl ResourceExt) -> Vec<String> {
    o.managed_fields()
        .iter()
        .map(|e| e.manager.clone().unwrap_or_default())
        .collect()
}

#[tokio::test]
async fn a_no_op_reconcile_changes_nothing() {
    let f = Fixture::new().await;
    let (client, ns) = (f.client.clone(), f.ns.clone());
    f.apply_example("examples/nestedcontrolplane.yaml").await;
    f.bring_up("demo").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let versions = |items: Vec<(String, Option<String>)>| items;
    let snapshot = || async {
        let mut v = Vec::new();
        for s in Api::<StatefulSet>::namespaced(client.clone(), &ns)
            .list(&ListParams::default())
            .await
            .unwrap()
        {
            v.push((format!("sts/{}", s.name_any()), s.resource_version()));
        }
        for s in Api::<Service>::namespaced(client.clone(), &ns)
            .list(&ListParams::default())
            .await
            .unwrap()
        {
            v.push((format!("svc/{}", s.name_any()), s.resource_version()));
        }
        for s in Api::<Secret>::namespaced(client.clone(), &ns)
            .list(&ListParams::default())
            .await
            .unwrap()
        {
            v.push((format!("secret/{}", s.name_any()), s.resource_version()));
        }
        for s in Api::<NestedControlPlane>::namespaced(client.clone(), &ns)
            .list(&ListParams::default())
            .await
            .unwrap()
        {
            v.push((format!("ncp/{}", s.name_any()), s.resource_version()));
        }
        versions(v)
    };
    let before = snapshot().await;
    // Touch the control plane with an annotation: a full reconcile of everything follows.
    let api: Api<NestedControlPlane> = Api::namespaced(client.clone(), &ns);
    api.patch(
        "demo",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"touch": "1"}}})),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = snapshot().await;
    let changed: Vec<_> = before
        .iter()
        .zip(after.iter())
        .filter(|(b, a)| b != a && !b.0.starts_with("ncp/"))
        .collect();
    assert!(changed.is_empty(), "a no-op reconcile wrote {changed:?}");
    f.stop().await;
}

#[tokio::test]
async fn a_read_error_on_the_ca_secret_does_not_mint_a_new_ca() {
    let admin = cluster().client();
    let ns = test_namespace(&admin).await;
    // capn runs as a user who may do everything in the namespace except read Secrets by
    // name, so every CA lookup fails with Forbidden (not NotFound).
    apply_doc(&admin, &ns, json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "no-secret-get"},
        "rules": [
            {"apiGroups": ["", "apps", "events.k8s.io", "controlplane.cluster.x-k8s.io", "infrastructure.cluster.x-k8s.io"],
             "resources": ["services", "statefulsets", "events", "nestedcontrolplanes", "nestedcontrolplanes/status",
                           "nestedetcds", "nestedetcds/status", "nestedapiservers", "nestedapiservers/status",
                           "nestedcontrollermanagers", "nestedcontrollermanagers/status", "nestedclusters", "nestedclusters/status"],
             "verbs": ["*"]},
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create", "update", "patch", "list", "watch"]}
        ]
    }))
    .await;
    apply_doc(
        &admin,
        &ns,
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "no-secret-get"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "no-secret-get"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "capn-without-secret-reads"}]
        }),
    )
    .await;
    let mut config = cluster().config();
    config.auth_info.impersonate = Some("capn-without-secret-reads".into());
    let restricted = kube::Client::try_from(config).unwrap();
    // A CA exists (the user's, or one capn made earlier). capn creates a missing CA without
    // reading first (a create never replaces anything), so the danger is a CA that exists
    // but cannot be read: it must stay exactly as it is.
    let ca =
        capn::pki::CertificateAuthority::generate("existing-ca", time::OffsetDateTime::now_utc(), Default::default())
            .unwrap();
    Api::<Secret>::namespaced(admin.clone(), &ns)
        .create(
            &Default::default(),
            &capn::pki::tls_secret("demo-ca", &ns, "demo", ca.pem()),
        )
        .await
        .unwrap();
    let capn = Capn::start(&restricted, &ns);
    apply_example(&admin, &ns, "examples/nestedcontrolplane.yaml").await;
    let ncp = wait_until("the control plane reports the failed read", CONTROLLER_STEP, || async {
        let ncp = control_plane(&admin, &ns, "demo").await;
        ncp.status
            .as_ref()
            .is_some_and(|s| s.conditions.iter().any(|c| c.reason == "APIError"))
            .then_some(ncp)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    capn.stop().await;
    let held = secret(&admin, &ns, "demo-ca")
        .await
        .expect("the CA Secret is still there");
    let cert = held.data.unwrap_or_default().get("tls.crt").map(|b| b.0.clone());
    assert_eq!(
        cert.as_deref(),
        Some(ca.cert_pem().as_bytes()),
        "the CA was replaced although it could not be read"
    );
    assert!(!ncp.status.unwrap().ready);
}

#[tokio::test]
async fn a_user_supplied_ca_is_used_as_is() {
    let mut f = Fixture::without_capn().await;
    let (client, ns) = (f.client.clone(), f.ns.clone());
    let ca =
        capn::pki::CertificateAuthority::generate("my-own-ca", time::OffsetDateTime::now_utc(), Default::default())
            .unwrap();
    let user_secret = capn::pki::tls_secret("demo-ca", &ns, "demo", ca.pem());
    let created = Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&Default::default(), &user_secret)
        .await
        .unwrap();
    f.start_capn();
    f.apply_example("examples/nestedcontrolplane.yaml").await;
    f.bring_up("demo").await;
    f.stop().await;
    let after = secret(&client, &ns, "demo-ca").await.unwrap();
    assert_eq!(after.data, created.data, "the user's CA was changed");
    assert!(
        after.owner_references().is_empty(),
        "capn took ownership of the user's CA"
    );
    let serving = secret_value(&secret(&client, &ns, "demo-apiserver").await.unwrap(), "tls.crt");
    assert!(signed_by(&pem_to_der(&serving), ca.cert_der()));
}

#[tokio::test]
async fn deleting_the_control_plane_removes_everything_capn_created() {
    let f = Fixture::new().await;
    let (client, ns) = (f.client.clone(), f.ns.clone());
    f.apply_example("examples/nestedcontrolplane.yaml").await;
    f.bring_up("demo").await;
    wait_until("demo-kubeconfig exists", CONTROLLER_STEP, || async {
        secret(&client, &ns, "demo-kubeconfig").await
    })
    .await;
    Api::<NestedControlPlane>::namespaced(client.clone(), &ns)
        .delete("demo", &DeleteParams::default())
        .await
        .unwrap();
    wait_until(
        "the garbage collector removed everything",
        Duration::from_secs(90),
        || async {
            let sts = Api::<StatefulSet>::namespaced(client.clone(), &ns)
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .len();
            let svc = Api::<Service>::namespaced(client.clone(), &ns)
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .len();
            let secrets = Api::<Secret>::namespaced(client.clone(), &ns)
                .list(&ListParams::default().labels("cluster.x-k8s.io/cluster-name=demo"))
                .await
                .unwrap()
                .items
                .len();
            let etcd = Api::<NestedEtcd>::namespaced(client.clone(), &ns)
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .len();
            let api = Api::<NestedAPIServer>::namespaced(client.clone(), &ns)
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .len();
            let cm = Api::<NestedControllerManager>::namespaced(client.clone(), &ns)
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .len();
            (sts + svc + secrets + etcd + api + cm == 0).then_some(())
        },
    )
    .await;
    f.stop().await;
}

/// An apiserver that has served and degrades step by step is mirrored count by count in
/// the control plane's status (Cluster API reads its `readyReplicas`); only a first
/// provisioning is shown at its Ready transition alone (issue 11).
#[tokio::test]
async fn the_control_plane_mirrors_each_count_of_a_degrading_apiserver() {
    let f = Fixture::new().await;
    let (client, ns) = (f.client.clone(), f.ns.clone());
    f.apply_example("examples/nestedcontrolplane.yaml").await;
    merge_patch::<NestedControlPlane>(&client, &ns, "demo", json!({"spec": {"replicas": 3}})).await;
    f.bring_up("demo").await;
    let sts_api: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let ready_replicas = |n: i32| {
        let (client, ns) = (client.clone(), ns.clone());
        async move {
            wait_until(
                &format!("the control plane shows {n} ready apiserver replicas of 3"),
                CONTROLLER_STEP,
                || async {
                    let status = control_plane(&client, &ns, "demo").await.status?;
                    (status.replicas == Some(3) && status.ready_replicas == Some(n)).then_some(())
                },
            )
            .await;
        }
    };
    wait_until("the apiserver StatefulSet asks for 3", CONTROLLER_STEP, || async {
        let sts = sts_api.get("demo-apiserver").await.ok()?;
        (sts.spec?.replicas == Some(3)).then_some(())
    })
    .await;
    mark_statefulset_ready(&client, &ns, "demo-apiserver").await.unwrap();
    ready_replicas(3).await;
    for n in [2, 1] {
        sts_api
            .patch_status(
                "demo-apiserver",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"readyReplicas": n, "availableReplicas": n}})),
            )
            .await
            .unwrap();
        ready_replicas(n).await;
    }
    f.stop().await;
}

/// The control plane's scale subresource is what a HorizontalPodAutoscaler drives
/// (docs/guide/sizes.md "Autoscaling the apiservers"): the super cluster's own HPA
/// controller reads it (the `status.selector` of the apiserver pods included) and, below
/// `minReplicas`, raises `spec.replicas` through it, which capn carries to the apiserver
/// StatefulSet. No metrics API runs here, so the HPA scales by its bounds only.
#[tokio::test]
async fn a_horizontal_pod_autoscaler_drives_the_apiservers_through_the_scale_subresource() {
    let f = Fixture::new().await;
    let (client, ns) = (f.client.clone(), f.ns.clone());
    f.apply_example("examples/nestedcontrolplane.yaml").await;
    wait_until("three component resources exist", CONTROLLER_STEP, || async {
        (components(&client, &ns).await.len() == 3).then_some(())
    })
    .await;
    f.bring_up("demo").await;
    // The scale a client reads: capn recorded the apiserver's replicas, which the user left unset.
    let scale = Api::<NestedControlPlane>::namespaced(client.clone(), &ns)
        .get_scale("demo")
        .await
        .expect("GET the control plane's scale subresource");
    assert_eq!(scale.spec.and_then(|s| s.replicas), Some(1));
    let selector = scale.status.map(|s| s.selector.unwrap_or_default()).unwrap_or_default();
    assert!(selector.contains("demo"), "the apiserver pods' selector: {selector}");
    f.apply(json!({
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "demo-apiserver"},
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
                "kind": "NestedControlPlane",
                "name": "demo"
            },
            "minReplicas": 2,
            "maxReplicas": 3,
            "metrics": [{"type": "Resource", "resource": {
                "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}]
        }
    }))
    .await;
    // The HPA controller looks every 15 s.
    let step = CONTROLLER_STEP * 4;
    wait_until("the HPA raised spec.replicas to its minimum", step, || async {
        (control_plane(&client, &ns, "demo").await.spec.replicas == Some(2)).then_some(())
    })
    .await;
    wait_until("the apiserver StatefulSet has 2 replicas", step, || async {
        statefulset(&client, &ns, "demo-apiserver")
            .await
            .and_then(|s| s.spec?.replicas)
            .filter(|r| *r == 2)
    })
    .await;
    let hpa: Api<k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler> = Api::namespaced(client.clone(), &ns);
    let status = hpa.get("demo-apiserver").await.unwrap().status.unwrap_or_default();
    let able = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "AbleToScale")
        .expect("the HPA reports AbleToScale");
    assert_eq!(able.status, "True", "the HPA reads the scale subresource: {able:?}");
    f.stop().await;
}
