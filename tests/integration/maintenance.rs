//! Issue 14, "Survive the super cluster's own maintenance", on the real apiserver: the
//! PodDisruptionBudgets and NetworkPolicies of the stable channel are accepted, follow a
//! replica change and the NestedControlPlane's settings, and are pruned like every
//! rendered object; every rendered pod template passes Pod Security `restricted`.
//!
//! Limits, written down: the test super cluster runs no StatefulSet controller, no kubelet,
//! no scheduler, no disruption controller and no CNI. So no eviction is ever tried against
//! the budgets, no spread rule places a pod, and no NetworkPolicy is enforced: what is
//! proven here is that the API server stores exactly what capn rendered and admits the pods
//! the StatefulSets would create. The numbers themselves are unit-tested
//! (`capn::plan::policy`, `src/plan/tests.rs`).

use capn::api::{NestedControllerManager, NestedEtcd};
use capn::channel::ChannelRegistry;
use capn::component::ComponentKind;
use capn::controllers::Settings;
use capn::plan::{
    CapnPods, ClusterSettings, ComponentRequest, DEFAULT_IMAGE_REPOSITORY, Running, Upstream, etcd_members, plan,
};
use capn_testkit::{cluster, test_namespace, wait_until};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::harness::*;

fn capn_pods() -> CapnPods {
    CapnPods {
        namespace: "capn-system".into(),
        labels: [("app.kubernetes.io/name".to_string(), "capn".to_string())].into(),
    }
}

fn max_unavailable(pdb: &PodDisruptionBudget) -> Option<IntOrString> {
    pdb.spec.as_ref().and_then(|s| s.max_unavailable.clone())
}

/// The NetworkPolicy ingress rule of `policy` that opens `port`, as JSON.
fn rule_for(policy: &NetworkPolicy, port: i32) -> Option<Value> {
    let value = serde_json::to_value(policy).unwrap();
    value["spec"]["ingress"]
        .as_array()?
        .iter()
        .find(|r| {
            r["ports"]
                .as_array()
                .is_some_and(|ps| ps.iter().any(|p| p["port"] == port))
        })
        .cloned()
}

#[tokio::test]
async fn budgets_and_network_policies_are_applied_follow_replicas_and_are_pruned() {
    let client = cluster().client();
    let ns = test_namespace(&client).await;
    let mut settings = Settings {
        namespace: Some(ns.clone()),
        capn_pods: Some(capn_pods()),
        ..Settings::default()
    };
    settings.enabled.public_crds = false;
    settings.enabled.syncer = false;
    let capn = Capn::start_with_settings(&client, settings, &["prune-test"]);
    apply_doc(
        &client,
        &ns,
        json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedEtcd",
            "metadata": {"name": "demo-etcd"}, "spec": {"replicas": 3}
        }),
    )
    .await;
    let prometheus = json!({
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    });
    let office = json!({"ipBlock": {"cidr": "192.0.2.0/24"}});
    apply_doc(
        &client,
        &ns,
        json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedControlPlane",
            "metadata": {"name": "demo"},
            "spec": {"version": "1.36", "etcd": {"name": "demo-etcd"},
                     "networkPolicy": {"apiserverFrom": [office], "metricsFrom": [prometheus]}}
        }),
    )
    .await;
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &ns);
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns);

    // etcd: three members may lose one.
    let etcd_pdb = wait_until("the etcd PodDisruptionBudget exists", CONTROLLER_STEP, || async {
        pdbs.get_opt("demo-etcd").await.unwrap()
    })
    .await;
    assert_eq!(max_unavailable(&etcd_pdb), Some(IntOrString::Int(1)));
    let etcd = Api::<NestedEtcd>::namespaced(client.clone(), &ns)
        .get("demo-etcd")
        .await
        .unwrap();
    let owner = &etcd_pdb.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("NestedEtcd", "demo-etcd", Some(true))
    );
    assert_eq!(
        etcd_pdb.labels().get("applyset.kubernetes.io/part-of"),
        etcd.labels().get("applyset.kubernetes.io/id"),
        "the budget is a member of the NestedEtcd's ApplySet"
    );
    let etcd_policy = policies.get("demo-etcd").await.unwrap();
    let client_rule = rule_for(&etcd_policy, 2379).expect("a client port rule");
    assert_eq!(
        client_rule["from"],
        json!([
            {"podSelector": {"matchLabels": {"app.kubernetes.io/instance": "demo", "app.kubernetes.io/name": "apiserver"}}},
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "capn-system"}},
             "podSelector": {"matchLabels": {"app.kubernetes.io/name": "capn"}}},
        ])
    );
    assert_eq!(rule_for(&etcd_policy, 2381).unwrap()["from"], json!([prometheus]));

    bring_up(&client, &ns, "demo").await;
    let apiserver_pdb = pdbs.get("demo-apiserver").await.unwrap();
    assert_eq!(max_unavailable(&apiserver_pdb), Some(IntOrString::Int(1)));
    assert_eq!(
        max_unavailable(&pdbs.get("demo-controller-manager").await.unwrap()),
        Some(IntOrString::Int(1))
    );
    let apiserver_rule = rule_for(&policies.get("demo-apiserver").await.unwrap(), 6443).unwrap();
    let from = apiserver_rule["from"].as_array().unwrap();
    assert!(from.contains(&office), "{apiserver_rule}");
    assert_eq!(
        from.len(),
        3,
        "controller-manager, capn and the office: {apiserver_rule}"
    );
    assert_eq!(
        rule_for(&policies.get("demo-controller-manager").await.unwrap(), 10257).unwrap()["from"],
        json!([prometheus])
    );
    let parent = Api::<capn::api::NestedAPIServer>::namespaced(client.clone(), &ns)
        .get("demo-apiserver")
        .await
        .unwrap();
    assert_eq!(
        parent
            .annotations()
            .get("applyset.kubernetes.io/contains-group-kinds")
            .map(String::as_str),
        Some("NetworkPolicy.networking.k8s.io,PodDisruptionBudget.policy,Service,StatefulSet.apps")
    );

    // A replica change updates the budget in place.
    merge_patch::<capn::api::NestedControlPlane>(&client, &ns, "demo", json!({"spec": {"replicas": 3}})).await;
    let scaled = wait_until("the apiserver budget follows 3 replicas", CONTROLLER_STEP, || async {
        let pdb = pdbs.get("demo-apiserver").await.unwrap();
        (max_unavailable(&pdb) == Some(IntOrString::Int(2))).then_some(pdb)
    })
    .await;
    assert_eq!(scaled.uid(), apiserver_pdb.uid(), "updated, not replaced");

    // Closing the metrics ports removes their rule (an empty `from` would open them).
    Api::<capn::api::NestedControlPlane>::namespaced(client.clone(), &ns)
        .patch(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"networkPolicy": {"metricsFrom": []}}})),
        )
        .await
        .unwrap();
    wait_until("the etcd metrics port admits nobody", CONTROLLER_STEP, || async {
        let policy = policies.get("demo-etcd").await.unwrap();
        (rule_for(&policy, 2381).is_none() && rule_for(&policy, 2379).is_some()).then_some(())
    })
    .await;

    // A channel that renders no budget and no policy: both are pruned, the rest stays.
    Api::<NestedEtcd>::namespaced(client.clone(), &ns)
        .patch(
            "demo-etcd",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"channel": "prune-test", "version": "3.6.9"}})),
        )
        .await
        .unwrap();
    wait_until("the etcd budget and policy are pruned", CONTROLLER_STEP, || async {
        (pdbs.get_opt("demo-etcd").await.unwrap().is_none() && policies.get_opt("demo-etcd").await.unwrap().is_none())
            .then_some(())
    })
    .await;
    assert!(statefulset(&client, &ns, "demo-etcd").await.is_some());
    assert!(
        pdbs.get_opt("demo-apiserver").await.unwrap().is_some(),
        "other sets untouched"
    );

    // Deleting a component deletes its objects (owner references, garbage collector).
    capn.stop().await;
    let kcm_pdb = pdbs.get("demo-controller-manager").await.unwrap();
    Api::<NestedControllerManager>::namespaced(client.clone(), &ns)
        .delete("demo-controller-manager", &DeleteParams::default())
        .await
        .unwrap();
    wait_until(
        "the controller-manager's budget and policy are deleted",
        CONTROLLER_STEP,
        || async {
            let pdb_gone = pdbs
                .get_opt("demo-controller-manager")
                .await
                .unwrap()
                .is_none_or(|p| p.uid() != kcm_pdb.uid());
            let policy_gone = policies.get_opt("demo-controller-manager").await.unwrap().is_none();
            (pdb_gone && policy_gone).then_some(())
        },
    )
    .await;
}

/// A namespace where Pod Security enforces and warns at `restricted` (latest version).
async fn restricted_namespace(client: &Client) -> String {
    let ns = test_namespace(client).await;
    let labels = json!({"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
        "pod-security.kubernetes.io/warn": "restricted",
        "pod-security.kubernetes.io/warn-version": "latest",
    }}});
    Api::<Namespace>::all(client.clone())
        .patch(&ns, &PatchParams::default(), &Patch::Merge(&labels))
        .await
        .unwrap();
    ns
}

/// What capn renders for the three components of cluster `demo` in `ns`, every object as
/// the controllers would apply it.
fn rendered(ns: &str) -> Vec<Value> {
    let channels = ChannelRegistry::load(&[]).unwrap();
    let cluster = ClusterSettings {
        name: "demo".into(),
        namespace: ns.into(),
        kubernetes_version: Some("1.36".into()),
        channel: None,
        size: None,
        image_repository: DEFAULT_IMAGE_REPOSITORY.into(),
        service_cidr: "10.96.0.0/12".into(),
        dns_domain: "cluster.local".into(),
        super_dns_domain: "cluster.local".into(),
        network_policy: Default::default(),
        kms_endpoints: Vec::new(),
    };
    let spec = capn::api::ComponentSpec {
        replicas: Some(3),
        ..Default::default()
    };
    let endpoints = Upstream {
        etcd_endpoints: etcd_members("demo", ns, 3).into_iter().map(|m| m.client_url).collect(),
        ..Upstream::default()
    };
    let mut objects = Vec::new();
    for kind in [
        ComponentKind::Etcd,
        ComponentKind::ApiServer,
        ComponentKind::ControllerManager,
    ] {
        let upstream = if kind == ComponentKind::ApiServer {
            endpoints.clone()
        } else {
            Upstream::default()
        };
        let request = ComponentRequest {
            kind,
            resource_name: "demo",
            spec: &spec,
            etcd_storage: None,
            etcd_restore: None,
            owner: Default::default(),
            running: Running::default(),
            audit: None,
            authentication: None,
            authorization: None,
            referenced: Default::default(),
        };
        let p = plan(&channels, &cluster, &request, &upstream).unwrap();
        objects.extend(p.objects.into_iter().map(|mut o| {
            // No component resource exists here to own them.
            o["metadata"].as_object_mut().unwrap().remove("ownerReferences");
            o
        }));
    }
    objects
}

/// The pod the StatefulSet controller would create as member 0 of `sts`: its template, its
/// name, and a claim volume for each volume claim template.
fn first_pod(sts: &Value) -> Value {
    let name = sts["metadata"]["name"].as_str().unwrap();
    let template = &sts["spec"]["template"];
    let mut spec = template["spec"].clone();
    for claim in sts["spec"]["volumeClaimTemplates"].as_array().into_iter().flatten() {
        let claim_name = claim["metadata"]["name"].as_str().unwrap();
        spec["volumes"].as_array_mut().unwrap().push(
            json!({"name": claim_name, "persistentVolumeClaim": {"claimName": format!("{claim_name}-{name}-0")}}),
        );
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("{name}-0"), "labels": template["metadata"]["labels"]},
        "spec": spec,
    })
}

/// Server-side applies `sts` with a raw request and returns the response's status and its
/// `Warning` headers (kube's typed calls do not expose headers).
async fn apply_reporting_warnings(client: &Client, ns: &str, sts: &Value) -> (u16, Vec<String>) {
    let name = sts["metadata"]["name"].as_str().unwrap();
    let request = http::Request::patch(format!(
        "/apis/apps/v1/namespaces/{ns}/statefulsets/{name}?fieldManager=capn&force=true"
    ))
    .header(http::header::CONTENT_TYPE, "application/apply-patch+yaml")
    .body(kube::client::Body::from(serde_json::to_vec(sts).unwrap()))
    .unwrap();
    let response = client.send(request).await.unwrap();
    let warnings = response
        .headers()
        .get_all(http::header::WARNING)
        .iter()
        .map(|v| v.to_str().unwrap_or_default().to_string())
        .collect();
    (response.status().as_u16(), warnings)
}

#[tokio::test]
async fn every_rendered_pod_template_is_admitted_under_restricted_pod_security() {
    let client = cluster().client();
    let ns = restricted_namespace(&client).await;
    // Pod admission looks up the pod's ServiceAccount, which no controller creates here,
    // and its PriorityClass: capn's own, exactly as the clusterctl components ship it.
    Api::<ServiceAccount>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "default"}})).unwrap(),
        )
        .await
        .unwrap();
    let class = capn::plan::policy::priority_class();
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("scheduling.k8s.io", "v1", "PriorityClass"));
    Api::<DynamicObject>::all_with(client.clone(), &ar)
        .patch(
            class["metadata"]["name"].as_str().unwrap(),
            &PatchParams::apply("capn-test"),
            &Patch::Apply(&class),
        )
        .await
        .unwrap();

    let statefulsets: Vec<Value> = rendered(&ns)
        .into_iter()
        .filter(|o| o["kind"] == "StatefulSet")
        .collect();
    assert_eq!(statefulsets.len(), 3);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let dry_run = PostParams {
        dry_run: true,
        field_manager: None,
    };
    for sts in &statefulsets {
        let pod: Pod = serde_json::from_value(first_pod(sts)).unwrap();
        let admitted = pods
            .create(&dry_run, &pod)
            .await
            .unwrap_or_else(|e| panic!("{}: refused under restricted: {e}", pod.name_any()));
        assert_eq!(
            admitted.spec.unwrap().priority_class_name.as_deref(),
            Some("capn-control-plane")
        );
    }
    // The check can fail: a template that adds a capability is refused.
    let mut bad = first_pod(&statefulsets[0]);
    bad["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] = json!(["NET_ADMIN"]);
    let refused = pods
        .create(&dry_run, &serde_json::from_value(bad).unwrap())
        .await
        .expect_err("restricted refuses an added capability");
    assert!(refused.to_string().contains("restricted"), "{refused}");

    // Enforcement applies to Pods; for workloads Pod Security only warns. No warning comes
    // back for capn's StatefulSets...
    for sts in &statefulsets {
        let (status, warnings) = apply_reporting_warnings(&client, &ns, sts).await;
        assert!(
            (200..300).contains(&status),
            "{}: HTTP {status}",
            sts["metadata"]["name"]
        );
        assert!(warnings.is_empty(), "{}: {warnings:?}", sts["metadata"]["name"]);
    }
    // ...while one that allows privilege escalation gets one.
    let mut escalating = statefulsets[0].clone();
    escalating["metadata"]["name"] = json!("escalating");
    escalating["spec"]["template"]["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] =
        json!(true);
    let (status, warnings) = apply_reporting_warnings(&client, &ns, &escalating).await;
    assert!((200..300).contains(&status), "HTTP {status}");
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("restricted") && w.contains("allowPrivilegeEscalation")),
        "{warnings:?}"
    );
    let stored: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    assert!(stored.get_opt("demo-etcd").await.unwrap().is_some());
}
