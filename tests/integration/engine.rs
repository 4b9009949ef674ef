//! Issue "Versions, channels, patches and swappable providers": pruning, failing patches,
//! ordered upgrades and refused ones, on the real apiserver.

use std::time::Duration;

use capn::api::{NestedAPIServer, NestedControllerManager, NestedEtcd};
use capn_testkit::{cluster, mark_statefulset_ready, test_namespace, wait_until};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use crate::harness::*;

fn image(sts: &StatefulSet) -> String {
    sts.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0]
        .image
        .clone()
        .unwrap()
}

fn has_condition(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    type_: &str,
    status: &str,
    reason: &str,
) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == status && c.reason == reason)
}

#[tokio::test]
async fn switching_channel_versions_prunes_what_is_no_longer_rendered_and_nothing_else() {
    let f = Fixture::with_channels(&["prune-test"]).await;
    let (client, ns) = (f.client.clone(), f.ns.clone());
    f.apply(json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedEtcd",
        "metadata": {"name": "p-etcd"}, "spec": {"channel": "prune-test", "version": "3.6.8"}
    }))
    .await;
    f.apply(json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedControlPlane",
        "metadata": {"name": "p"}, "spec": {"etcd": {"name": "p-etcd"}}
    }))
    .await;
    // A user's ConfigMap with capn's labels but not in the set must survive.
    f.apply(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "users-own", "labels": {"app.kubernetes.io/managed-by": "capn", "cluster.x-k8s.io/cluster-name": "p"}}
    }))
    .await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    wait_until("3.6.8 renders its extra ConfigMap", CONTROLLER_STEP, || async {
        cms.get_opt("p-etcd-extra").await.unwrap()
    })
    .await;
    let etcd_api: Api<NestedEtcd> = Api::namespaced(client.clone(), &ns);
    let parent = etcd_api.get("p-etcd").await.unwrap();
    assert_eq!(
        parent
            .annotations()
            .get("applyset.kubernetes.io/contains-group-kinds")
            .map(String::as_str),
        Some("ConfigMap,Service,StatefulSet.apps")
    );
    etcd_api
        .patch(
            "p-etcd",
            &PatchParams::apply("kubectl"),
            &Patch::Apply(json!({
                "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedEtcd",
                "metadata": {"name": "p-etcd"}, "spec": {"channel": "prune-test", "version": "3.6.9"}
            })),
        )
        .await
        .unwrap();
    wait_until(
        "the ConfigMap 3.6.9 no longer renders is pruned",
        CONTROLLER_STEP,
        || async { cms.get_opt("p-etcd-extra").await.unwrap().is_none().then_some(()) },
    )
    .await;
    assert!(
        cms.get_opt("users-own").await.unwrap().is_some(),
        "pruning deleted an object that is not in the set"
    );
    let sts = statefulset(&client, &ns, "p-etcd")
        .await
        .expect("the StatefulSet is still rendered");
    assert_eq!(image(&sts), "registry.k8s.io/etcd:3.6.9-0");
    // The parent is annotated after the prune, in the same round: wait for it.
    wait_until(
        "the parent lists only the kinds still rendered",
        CONTROLLER_STEP,
        || async {
            let parent = etcd_api.get("p-etcd").await.unwrap();
            (parent
                .annotations()
                .get("applyset.kubernetes.io/contains-group-kinds")
                .map(String::as_str)
                == Some("Service,StatefulSet.apps"))
            .then_some(())
        },
    )
    .await;
    f.stop().await;
}

#[tokio::test]
async fn a_failing_patch_leaves_every_existing_object_unchanged() {
    let f = Fixture::new().await;
    let (client, ns) = (f.client.clone(), f.ns.clone());
    f.apply_example("examples/nestedcontrolplane.yaml").await;
    f.bring_up("demo").await;
    let before = statefulset_versions(&client, &ns).await;
    // The first patch is fine, the second targets nothing: neither may be applied.
    let api: Api<NestedAPIServer> = Api::namespaced(client.clone(), &ns);
    api.patch("demo-apiserver", &PatchParams::default(), &Patch::Merge(json!({"spec": {"patches": [
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "demo-apiserver", "annotations": {"x": "y"}}},
        {"target": {"kind": "ConfigMap", "name": "nope"}, "mergePatch": {"data": {"a": "b"}}}
    ]}})))
    .await
    .unwrap();
    let apiserver = wait_until("the apiserver reports the failing patch", CONTROLLER_STEP, || async {
        let a = api.get("demo-apiserver").await.unwrap();
        a.status
            .as_ref()
            .is_some_and(|s| has_condition(&s.conditions, "Synced", "False", "PatchTargetNotFound"))
            .then_some(a)
    })
    .await;
    let status = apiserver.status.unwrap();
    let synced = status.conditions.iter().find(|c| c.type_ == "Synced").unwrap();
    assert!(
        synced.message.contains("patch 1") && synced.message.contains("ConfigMap/nope"),
        "{}",
        synced.message
    );
    assert!(status.ready, "the running apiserver still counts as ready");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        statefulset_versions(&client, &ns).await,
        before,
        "an object changed although a patch failed"
    );
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), &ns)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(
        events
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("PatchTargetNotFound") && e.type_.as_deref() == Some("Warning")),
        "no Warning Event says why"
    );
    f.stop().await;
}

/// Merge-patches one annotation of NestedControlPlane `name`.
async fn annotate(client: &kube::Client, ns: &str, name: &str, key: &str, value: &str) {
    Api::<capn::api::NestedControlPlane>::namespaced(client.clone(), ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn an_upgrade_from_1_36_to_1_37_waits_for_its_preflight_then_rolls_etcd_then_apiserver_then_controller_manager() {
    let f = Fixture::new().await;
    let (client, ns) = (f.client.clone(), f.ns.clone());
    f.apply_example("examples/nestedcontrolplane.yaml").await;
    f.bring_up("demo").await;
    let sts = |name: &'static str| {
        let client = client.clone();
        let ns = ns.clone();
        async move { statefulset(&client, &ns, name).await.unwrap() }
    };
    assert_eq!(
        image(&sts("demo-apiserver").await),
        "registry.k8s.io/kube-apiserver:v1.36.3"
    );
    let before = statefulset_versions(&client, &ns).await;
    f.apply(json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedControlPlane",
        "metadata": {"name": "demo"}, "spec": {"version": "1.37"}
    }))
    .await;
    // No tenant apiserver runs in this test: its deprecated-API metric cannot be read, and
    // an unknown is not a pass. The step waits, and nothing moves.
    let upgrade = wait_until("the preflight stops the step", CONTROLLER_STEP, || async {
        let s = control_plane(&client, &ns, "demo").await.status?;
        (has_condition(&s.conditions, "Upgrading", "False", "WaitingForPreflight")
            && has_condition(&s.conditions, "UpgradePreflight", "False", "DeprecatedAPIUsageUnknown"))
        .then_some(s.upgrade?)
    })
    .await;
    assert_eq!(upgrade.phase, "PreflightFailed");
    assert_eq!(upgrade.current_step, Some(1));
    let preflight = upgrade.preflight.unwrap();
    assert_eq!(preflight.step, "1.37.2");
    let checks: Vec<(&str, bool)> = preflight.checks.iter().map(|c| (c.name.as_str(), c.passed)).collect();
    assert_eq!(
        checks,
        [
            ("ComponentsReady", true),
            ("Certificates", true),
            ("RemovedAPIs", false)
        ]
    );
    assert!(
        preflight.checks[2]
            .message
            .contains("upgrade-acknowledge-removed-apis=1.37"),
        "{}",
        preflight.checks[2].message
    );
    assert_eq!(
        statefulset_versions(&client, &ns).await,
        before,
        "a stopped step moved a workload"
    );
    annotate(&client, &ns, "demo", capn::upgrade::ACKNOWLEDGE_ANNOTATION, "1.37").await;
    // etcd first: kubeadm's etcd for 1.37 is 3.7.0.
    wait_until("etcd rolls to 3.7.0", CONTROLLER_STEP, || async {
        (image(&sts("demo-etcd").await) == "registry.k8s.io/etcd:3.7.0-0").then_some(())
    })
    .await;
    wait_until("the control plane reports RollingOut", CONTROLLER_STEP, || async {
        let ncp = control_plane(&client, &ns, "demo").await;
        ncp.status
            .filter(|s| capn::status::is_true(&s.conditions, "RollingOut"))
            .map(|_| ())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        image(&sts("demo-apiserver").await),
        "registry.k8s.io/kube-apiserver:v1.36.3",
        "apiserver waits for etcd"
    );
    mark_statefulset_ready(&client, &ns, "demo-etcd").await.unwrap();
    wait_until("the apiserver rolls to 1.37.2", CONTROLLER_STEP, || async {
        (image(&sts("demo-apiserver").await) == "registry.k8s.io/kube-apiserver:v1.37.2").then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        image(&sts("demo-controller-manager").await),
        "registry.k8s.io/kube-controller-manager:v1.36.3",
        "the controller-manager waits for the apiserver"
    );
    // One apiserver rolls surge-first (docs/design.md §5 "Surge"): the write that changed
    // its image asked for a second replica.
    assert_eq!(
        sts("demo-apiserver").await.spec.unwrap().replicas,
        Some(2),
        "the new release's apiserver comes up beside the old one"
    );
    // Standing in for the StatefulSet controller at each step: the surge rolls out at two,
    // then capn asks for one again, which must be reported too before the apiserver is ready.
    wait_until("the controller-manager rolls to 1.37.2", CONTROLLER_STEP, || async {
        mark_statefulset_ready(&client, &ns, "demo-apiserver").await.ok()?;
        (image(&sts("demo-controller-manager").await) == "registry.k8s.io/kube-controller-manager:v1.37.2")
            .then_some(())
    })
    .await;
    assert_eq!(
        sts("demo-apiserver").await.spec.unwrap().replicas,
        Some(1),
        "the surge ends before the controller-manager moves"
    );
    mark_statefulset_ready(&client, &ns, "demo-controller-manager")
        .await
        .unwrap();
    let status = wait_until("the control plane is ready on 1.37.2", CONTROLLER_STEP, || async {
        let s = control_plane(&client, &ns, "demo").await.status?;
        (s.ready
            && s.version.as_deref() == Some("1.37.2")
            && !capn::status::is_true(&s.conditions, "RollingOut")
            && has_condition(&s.conditions, "Upgrading", "False", "Completed"))
        .then_some(s)
    })
    .await;
    assert_eq!(
        status.components.unwrap().etcd.unwrap().version.as_deref(),
        Some("3.7.0")
    );
    let upgrade = status.upgrade.unwrap();
    assert_eq!((upgrade.from.as_str(), upgrade.target.as_str()), ("1.36.3", "1.37.2"));
    assert_eq!(upgrade.steps.len(), 1);
    assert_eq!(upgrade.steps[0].state, "Succeeded");
    assert!(upgrade.steps[0].duration_seconds.is_some() && upgrade.steps[0].finish_time.is_some());
    assert!(upgrade.preflight.unwrap().acknowledged);
    f.stop().await;
}

/// Stands in for the kubelet for every StatefulSet of `demo` until the components report
/// `kubernetes` ready (etcd moves first, then the apiserver, then the controller-manager).
async fn roll_to(client: &kube::Client, ns: &str, kubernetes: &str) {
    wait_until(
        &format!("every component runs {kubernetes}"),
        CONTROLLER_STEP * 2,
        || async {
            for name in ["demo-etcd", "demo-apiserver", "demo-controller-manager"] {
                if let Some(sts) = statefulset(client, ns, name).await
                    && sts.status.as_ref().and_then(|s| s.observed_generation) != sts.metadata.generation
                {
                    mark_statefulset_ready(client, ns, name).await.unwrap();
                }
            }
            let s = control_plane(client, ns, "demo").await.status?;
            let c = s.components?;
            (c.apiserver?.version.as_deref() == Some(kubernetes)
                && c.controller_manager.as_ref()?.version.as_deref() == Some(kubernetes)
                && c.controller_manager?.ready)
                .then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn an_upgrade_from_1_35_to_1_37_passes_through_1_36_and_a_downgrade_is_refused_before_anything_moves() {
    let f = Fixture::new().await;
    let (client, ns) = (f.client.clone(), f.ns.clone());
    f.apply(json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedControlPlane",
        "metadata": {"name": "demo", "annotations": {capn::upgrade::ACKNOWLEDGE_ANNOTATION: "1.36,1.37"}},
        "spec": {"version": "1.35"}
    }))
    .await;
    f.bring_up("demo").await;
    // Held first: the path is planned and shown, and no step starts.
    annotate(&client, &ns, "demo", capn::upgrade::HOLD_ANNOTATION, "").await;
    let before = statefulset_versions(&client, &ns).await;
    f.apply(json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedControlPlane",
        "metadata": {"name": "demo", "annotations": {capn::upgrade::ACKNOWLEDGE_ANNOTATION: "1.36,1.37"}},
        "spec": {"version": "1.37"}
    }))
    .await;
    let held = wait_until("the planned path is held", CONTROLLER_STEP, || async {
        let s = control_plane(&client, &ns, "demo").await.status?;
        has_condition(&s.conditions, "Upgrading", "False", "UpgradeHeld").then_some(s.upgrade?)
    })
    .await;
    let steps: Vec<(&str, &str, bool)> = held
        .steps
        .iter()
        .map(|s| (s.kubernetes.as_str(), s.etcd.as_str(), s.etcd_changes))
        .collect();
    assert_eq!(steps, [("1.36.3", "3.6.8", false), ("1.37.2", "3.7.0", true)]);
    assert_eq!(held.from, "1.35.4");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        statefulset_versions(&client, &ns).await,
        before,
        "a held path moved a workload"
    );
    Api::<capn::api::NestedControlPlane>::namespaced(client.clone(), &ns)
        .patch(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {capn::upgrade::HOLD_ANNOTATION: null}}})),
        )
        .await
        .unwrap();
    roll_to(&client, &ns, "1.36.3").await;
    let middle = control_plane(&client, &ns, "demo").await.status.unwrap();
    let etcd = middle.components.as_ref().unwrap().etcd.as_ref().unwrap();
    assert_eq!(etcd.version.as_deref(), Some("3.6.8"), "1.36 keeps 1.35's etcd");
    roll_to(&client, &ns, "1.37.2").await;
    let done = wait_until("the path completes", CONTROLLER_STEP, || async {
        let s = control_plane(&client, &ns, "demo").await.status?;
        (s.ready && has_condition(&s.conditions, "Upgrading", "False", "Completed")).then_some(s)
    })
    .await;
    let upgrade = done.upgrade.unwrap();
    let states: Vec<(&str, &str)> = upgrade
        .steps
        .iter()
        .map(|s| (s.kubernetes.as_str(), s.state.as_str()))
        .collect();
    assert_eq!(states, [("1.36.3", "Succeeded"), ("1.37.2", "Succeeded")]);
    assert!(
        upgrade.steps[0].finish_time <= upgrade.steps[1].start_time,
        "the second step started after the first finished"
    );
    assert_eq!(done.components.unwrap().etcd.unwrap().version.as_deref(), Some("3.7.0"));
    // kube's recorder folds Events of the same reason into one with a series count.
    let count = |events: &[k8s_openapi::api::events::v1::Event], reason: &str| -> i32 {
        events
            .iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .map(|e| e.series.as_ref().map_or(1, |s| s.count))
            .sum()
    };
    let events = wait_until("the steps are told as Events", CONTROLLER_STEP, || async {
        let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), &ns)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        (count(&events, "UpgradeStepStarted") == 2 && count(&events, "UpgradeCompleted") == 1).then_some(events)
    })
    .await;
    assert_eq!(count(&events, "UpgradePlanned"), 1);
    // The second step's Event is a repeat of the first (same reason and object, which
    // changed in between): patched as a series of 2, not created anew.
    let started: Vec<_> = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("UpgradeStepStarted"))
        .collect();
    assert_eq!(
        started.len(),
        1,
        "one UpgradeStepStarted Event with a series: {started:?}"
    );
    assert_eq!(started[0].series.as_ref().map(|s| s.count), Some(2));
    // Back to 1.36: refused before anything moves, naming the rule.
    let before = statefulset_versions(&client, &ns).await;
    f.apply(json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedControlPlane",
        "metadata": {"name": "demo", "annotations": {capn::upgrade::ACKNOWLEDGE_ANNOTATION: "1.36,1.37"}},
        "spec": {"version": "1.36"}
    }))
    .await;
    let message = wait_until("the downgrade is refused", CONTROLLER_STEP, || async {
        let s = control_plane(&client, &ns, "demo").await.status?;
        s.conditions
            .iter()
            .find(|c| c.type_ == "Upgrading" && c.status == "False" && c.reason == "UpgradeNotAllowed")
            .map(|c| c.message.clone())
    })
    .await;
    assert!(message.contains("downgrade"), "{message}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        statefulset_versions(&client, &ns).await,
        before,
        "a refused path moved a workload"
    );
    let ncp = control_plane(&client, &ns, "demo").await;
    assert!(ncp.status.unwrap().ready, "the running control plane stays ready");
    f.stop().await;
}

/// Whether every field of `want` has the same value in `got` (the server adds defaults,
/// status and metadata; lists must have the same length and contain element-wise).
fn contains(got: &serde_json::Value, want: &serde_json::Value) -> bool {
    match (got, want) {
        (serde_json::Value::Object(g), serde_json::Value::Object(w)) => {
            w.iter().all(|(k, wv)| g.get(k).is_some_and(|gv| contains(gv, wv)))
        }
        (serde_json::Value::Array(g), serde_json::Value::Array(w)) => {
            g.len() == w.len() && g.iter().zip(w).all(|(gv, wv)| contains(gv, wv))
        }
        // The apiserver normalizes quantities and the like; numbers must match exactly.
        _ => got == want,
    }
}

#[tokio::test]
async fn capn_render_prints_exactly_what_the_controllers_apply() {
    let f = Fixture::new().await;
    let (client, ns) = (f.client.clone(), f.ns.clone());
    // Cluster API is not installed in this test: the example's capn objects stand alone, and
    // their cluster-name label names the cluster (tenant-1).
    let text = std::fs::read_to_string(format!("{}/examples/cluster.yaml", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let example: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).unwrap();
    for doc in example.into_iter().filter(|d| d["kind"] != "Cluster") {
        f.apply(doc).await;
    }
    let ncp_name = "tenant-1-control-plane";
    for workload in ["tenant-1-etcd", "tenant-1-apiserver", "tenant-1-controller-manager"] {
        make_ready(&client, &ns, workload).await;
    }
    wait_until("the NestedControlPlane is ready", CONTROLLER_STEP, || async {
        control_plane(&client, &ns, ncp_name)
            .await
            .status
            .filter(|s| s.ready)
            .map(|_| ())
    })
    .await;
    // Rendered from what the server holds, uids included.
    let mut docs = vec![serde_json::to_value(control_plane(&client, &ns, ncp_name).await).unwrap()];
    for e in Api::<NestedEtcd>::namespaced(client.clone(), &ns)
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        docs.push(serde_json::to_value(e).unwrap());
    }
    for a in Api::<NestedAPIServer>::namespaced(client.clone(), &ns)
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        docs.push(serde_json::to_value(a).unwrap());
    }
    for m in Api::<NestedControllerManager>::namespaced(client.clone(), &ns)
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        docs.push(serde_json::to_value(m).unwrap());
    }
    let channels = capn::channel::ChannelRegistry::load(&[]).unwrap();
    let rendered = capn::cli::render_documents(&channels, docs, &Default::default())
        .unwrap()
        .objects;
    let workload_objects: Vec<_> = rendered
        .iter()
        .filter(|o| o["kind"] == "StatefulSet" || o["kind"] == "Service")
        .collect();
    assert_eq!(workload_objects.len(), 5, "3 StatefulSets and 2 Services rendered");
    // Rendered from what the server holds, uids included.
    let etcd_sts = statefulset(&client, &ns, "tenant-1-etcd")
        .await
        .expect("named after the cluster");
    assert_eq!(
        etcd_sts.spec.as_ref().unwrap().replicas,
        Some(3),
        "the example's 3-member etcd"
    );
    for object in workload_objects {
        let ar = kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
            object["apiVersion"]
                .as_str()
                .unwrap()
                .split_once('/')
                .map(|(g, _)| g)
                .unwrap_or(""),
            object["apiVersion"].as_str().unwrap().rsplit('/').next().unwrap(),
            object["kind"].as_str().unwrap(),
        ));
        let api: Api<kube::api::DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
        let name = object["metadata"]["name"].as_str().unwrap();
        let live = serde_json::to_value(api.get(name).await.unwrap()).unwrap();
        let object = &with_applied_digest(object, &live);
        assert!(
            contains(&live, object),
            "{} {name}: capn render differs from what the controller applied:\nrendered {object:#}\nlive {live:#}",
            object["kind"]
        );
    }
    f.stop().await;
}

/// The file a user applies, rendered offline, equals what the controllers apply from it:
/// objects without `spec`, the NestedControlPlane's `spec.replicas` (the apiserver's),
/// and a misspelt field (with `strict` off a warning, not a different result).
#[tokio::test]
async fn capn_render_reads_a_file_as_the_cluster_does() {
    let f = Fixture::new().await;
    let (client, ns) = (f.client.clone(), f.ns.clone());
    let file = vec![
        json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedEtcd",
               "metadata": {"name": "plain-etcd", "namespace": ns}}),
        json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedControlPlane",
               "metadata": {"name": "plain", "namespace": ns},
               "spec": {"replicas": 3, "verison": "1.35", "etcd": {"name": "plain-etcd"}}}),
    ];
    let channels = capn::channel::ChannelRegistry::load(&[]).unwrap();
    let lenient = capn::cli::RenderOptions {
        strict: false,
        ..Default::default()
    };
    let rendered = capn::cli::render_documents(&channels, file.clone(), &lenient).unwrap();
    assert_eq!(
        rendered.warnings,
        [format!(
            "unknown field \"spec.verison\" in NestedControlPlane {ns}/plain; did you mean spec.version?"
        )]
    );
    // Strict by default, like kubectl.
    let err = capn::cli::render_documents(&channels, file.clone(), &Default::default()).unwrap_err();
    assert_eq!(capn::cli::error_reason(&err), Some("UnknownField"));
    // kubectl apply drops the unknown field with a warning; so does a server-side apply
    // without strict field validation.
    for doc in file {
        let mut doc = doc;
        if let Some(spec) = doc.get_mut("spec").and_then(|s| s.as_object_mut()) {
            spec.remove("verison");
        }
        f.apply(doc).await;
    }
    make_ready(&client, &ns, "plain-etcd").await;
    // The control plane creates its NestedAPIServer first and gives it its replicas next:
    // mark the apiserver ready only once it has them.
    wait_until(
        "the apiserver runs the control plane's 3 replicas",
        CONTROLLER_STEP,
        || async {
            statefulset(&client, &ns, "plain-apiserver")
                .await
                .filter(|s| s.spec.as_ref().and_then(|s| s.replicas) == Some(3))
                .map(|_| ())
        },
    )
    .await;
    f.bring_up("plain").await;
    let apiserver = statefulset(&client, &ns, "plain-apiserver").await.unwrap();
    assert_eq!(
        apiserver.spec.as_ref().unwrap().replicas,
        Some(3),
        "the control plane's replicas"
    );
    for object in rendered
        .objects
        .iter()
        .filter(|o| o["kind"] == "StatefulSet" || o["kind"] == "Service")
    {
        let name = object["metadata"]["name"].as_str().unwrap();
        let live = match object["kind"].as_str() {
            Some("StatefulSet") => serde_json::to_value(statefulset(&client, &ns, name).await.unwrap()).unwrap(),
            _ => serde_json::to_value(
                Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), &ns)
                    .get(name)
                    .await
                    .unwrap(),
            )
            .unwrap(),
        };
        // Offline objects have no uids: compare everything but the owner references.
        let mut object = with_applied_digest(object, &live);
        object["metadata"].as_object_mut().unwrap().remove("ownerReferences");
        assert!(
            contains(&live, &object),
            "{name}: capn render differs from what the controller applied:\nrendered {object:#}\nlive {live:#}"
        );
    }
    f.stop().await;
}

#[tokio::test]
async fn a_provider_channel_renders_an_operator_resource_and_the_apiserver_follows_its_endpoints() {
    let client = cluster().client();
    let ns = test_namespace(&client).await;
    // A stand-in for the etcd operator's CRD: schema-less, every field preserved.
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "etcdclusters.operator.etcd.io"},
        "spec": {"group": "operator.etcd.io", "scope": "Namespaced",
            "names": {"kind": "EtcdCluster", "plural": "etcdclusters", "singular": "etcdcluster", "listKind": "EtcdClusterList"},
            "versions": [{"name": "v1alpha1", "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    });
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    crds.patch(
        "etcdclusters.operator.etcd.io",
        &PatchParams::apply("capn-test"),
        &Patch::Apply(&crd),
    )
    .await
    .unwrap();
    wait_until("the EtcdCluster CRD is established", CONTROLLER_STEP, || async {
        let c = crds.get("etcdclusters.operator.etcd.io").await.ok()?;
        c.status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
            .then_some(())
    })
    .await;
    let examples = format!("{}/examples/channels", env!("CARGO_MANIFEST_DIR"));
    let capn = Capn::start_with_channels(&client, &ns, &[examples.as_str()]);
    apply_doc(
        &client,
        &ns,
        json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedEtcd",
            "metadata": {"name": "ext-etcd"}, "spec": {"channel": "etcd-operator", "replicas": 3}
        }),
    )
    .await;
    apply_doc(
        &client,
        &ns,
        json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedControlPlane",
            "metadata": {"name": "ext"}, "spec": {"etcd": {"name": "ext-etcd"}}
        }),
    )
    .await;
    let ar = kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
        "operator.etcd.io",
        "v1alpha1",
        "EtcdCluster",
    ));
    let clusters: Api<kube::api::DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
    let etcd_cluster = wait_until("capn renders the EtcdCluster", CONTROLLER_STEP, || async {
        clusters.get_opt("ext-etcd").await.unwrap()
    })
    .await;
    assert_eq!(etcd_cluster.data["spec"]["size"], 3);
    assert!(
        statefulset(&client, &ns, "ext-etcd").await.is_none(),
        "no native etcd StatefulSet with this provider"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        statefulset(&client, &ns, "ext-apiserver").await.is_none(),
        "the apiserver waits for the operator"
    );
    // Play the operator: it reports the cluster available and publishes its client URLs.
    let urls = [
        "https://ext-etcd-a.example.internal:2379",
        "https://ext-etcd-b.example.internal:2379",
    ];
    clusters
        .patch_status(
            "ext-etcd",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "conditions": [{"type": "Available", "status": "True", "reason": "ClusterReady", "message": "",
                                "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                "clientURLs": urls,
            }})),
        )
        .await
        .unwrap();
    let apiserver = wait_until("the apiserver is rendered", CONTROLLER_STEP, || async {
        statefulset(&client, &ns, "ext-apiserver").await
    })
    .await;
    assert_eq!(flags(&apiserver)["etcd-servers"], urls.join(","));
    let etcd = Api::<NestedEtcd>::namespaced(client.clone(), &ns)
        .get("ext-etcd")
        .await
        .unwrap()
        .status
        .unwrap();
    assert!(etcd.ready);
    assert_eq!(etcd.endpoints, urls);
    assert_eq!(etcd.channel.as_deref(), Some("etcd-operator"));
    // The channel does not declare membership changes for this provider: a replica change
    // is refused with a condition, and the EtcdCluster keeps its size.
    let etcd_api: Api<NestedEtcd> = Api::namespaced(client.clone(), &ns);
    etcd_api
        .patch(
            "ext-etcd",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 5}})),
        )
        .await
        .unwrap();
    let refused = wait_until("the member change is refused", CONTROLLER_STEP, || async {
        let s = etcd_api.get("ext-etcd").await.unwrap().status?;
        s.conditions
            .iter()
            .find(|c| c.type_ == "Synced" && c.status == "False" && c.reason == "EtcdMembershipChangeNotSupported")
            .cloned()
    })
    .await;
    assert!(refused.message.contains("channel etcd-operator"), "{}", refused.message);
    assert_eq!(clusters.get("ext-etcd").await.unwrap().data["spec"]["size"], 3);
    capn.stop().await;
}

/// With the `stable` channel capn changes members through etcd's API (booted in
/// `boot_members`); here no etcd process runs, so capn cannot reach one and must change
/// nothing: no pod added, no member list changed.
#[tokio::test]
async fn a_member_change_of_an_etcd_capn_cannot_reach_changes_nothing() {
    let f = Fixture::new().await;
    let (client, ns) = (f.client.clone(), f.ns.clone());
    f.apply_example("examples/nestedcontrolplane.yaml").await;
    f.bring_up("demo").await;
    let before = statefulset_versions(&client, &ns).await;
    let etcd_api: Api<NestedEtcd> = Api::namespaced(client.clone(), &ns);
    etcd_api
        .patch(
            "demo-etcd",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    let status = wait_until("etcd reports it cannot make the change", CONTROLLER_STEP, || async {
        let s = etcd_api.get("demo-etcd").await.unwrap().status?;
        has_condition(&s.conditions, "MembersSynced", "False", "EtcdUnreachable").then_some(s)
    })
    .await;
    assert!(status.ready, "the running etcd still counts as ready");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        statefulset_versions(&client, &ns).await,
        before,
        "a member change without etcd touched a workload"
    );
    let sts = statefulset(&client, &ns, "demo-etcd").await.unwrap();
    assert_eq!(sts.spec.unwrap().replicas, Some(1));
    let membership = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), &ns)
        .get("demo-etcd-membership")
        .await
        .unwrap()
        .data
        .unwrap();
    assert_eq!(
        membership["initial-cluster"],
        format!("demo-etcd-0=https://demo-etcd-0.demo-etcd.{ns}.svc:2380")
    );
    assert_eq!(membership["initial-cluster-state"], "new");
    f.stop().await;
}

/// `rendered` with the controller's certificates digest in place of render's placeholder:
/// the digest depends on Secrets only the cluster has, so render shows a stable placeholder
/// where the controller wrote a digest; everything else must agree.
fn with_applied_digest(rendered: &serde_json::Value, live: &serde_json::Value) -> serde_json::Value {
    let mut object = rendered.clone();
    let name = rendered["metadata"]["name"].clone();
    let digest = "/spec/template/metadata/annotations/controlplane.cluster.x-k8s.io~1certificates-digest";
    if let Some(placeholder) = object.pointer_mut(digest) {
        assert_eq!(placeholder, capn::plan::DIGEST_PLACEHOLDER, "{name}");
        let applied = live.pointer(digest).and_then(|d| d.as_str()).unwrap_or_default();
        assert!(
            applied.len() == 32 && applied.bytes().all(|b| b.is_ascii_hexdigit()),
            "{name}: the controller writes a digest, not {applied:?}"
        );
        *placeholder = applied.into();
    }
    object
}

#[tokio::test]
async fn a_step_that_does_not_finish_in_time_fails_without_rolling_back_and_a_retry_restarts_it() {
    let f = Fixture::without_capn().await;
    let (client, ns) = (f.client.clone(), f.ns.clone());
    let mut settings = capn::controllers::Settings {
        namespace: Some(ns.clone()),
        upgrade_step_timeout: Duration::from_secs(10),
        ..capn::controllers::Settings::default()
    };
    settings.enabled.public_crds = false;
    settings.enabled.syncer = false;
    let capn = Capn::start_with_settings(&client, settings, &[]);
    f.apply(json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedControlPlane",
        "metadata": {"name": "demo", "annotations": {capn::upgrade::ACKNOWLEDGE_ANNOTATION: "1.37"}},
        "spec": {"version": "1.36"}
    }))
    .await;
    f.bring_up("demo").await;
    f.apply(json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedControlPlane",
        "metadata": {"name": "demo", "annotations": {capn::upgrade::ACKNOWLEDGE_ANNOTATION: "1.37"}},
        "spec": {"version": "1.37"}
    }))
    .await;
    // etcd rolls to 3.7.0 and, standing in for a kubelet whose pods never get ready, nobody
    // marks it ready: the step runs out of time.
    let failed = wait_until("the step fails", CONTROLLER_STEP, || async {
        let s = control_plane(&client, &ns, "demo").await.status?;
        has_condition(&s.conditions, "Upgrading", "False", "UpgradeStepFailed").then_some(s)
    })
    .await;
    let step = &failed.upgrade.as_ref().unwrap().steps[0];
    assert_eq!(step.state, "Failed");
    assert!(step.message.contains("not done after"), "{}", step.message);
    assert!(step.message.contains("etcd"), "{}", step.message);
    // Nothing rolls back: etcd stays on the step's release.
    let etcd = statefulset(&client, &ns, "demo-etcd").await.unwrap();
    assert_eq!(image(&etcd), "registry.k8s.io/etcd:3.7.0-0");
    let warned = wait_until("a Warning Event says the step failed", CONTROLLER_STEP, || async {
        find_listed(
            &Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), &ns),
            |e| e.reason.as_deref() == Some("UpgradeStepFailed"),
        )
        .await
    })
    .await;
    assert_eq!(warned.type_.as_deref(), Some("Warning"));
    // The components become ready; the failed step stays failed until a retry.
    mark_statefulset_ready(&client, &ns, "demo-etcd").await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let still = control_plane(&client, &ns, "demo").await.status.unwrap();
    assert_eq!(still.upgrade.unwrap().steps[0].state, "Failed");
    annotate(&client, &ns, "demo", capn::upgrade::RETRY_ANNOTATION, "1").await;
    // Retried, the step runs again: the apiserver and the controller-manager follow, each
    // made ready at once.
    wait_until("the retried step completes", CONTROLLER_STEP, || async {
        for name in ["demo-apiserver", "demo-controller-manager"] {
            if let Some(sts) = statefulset(&client, &ns, name).await
                && sts.status.as_ref().and_then(|s| s.observed_generation) != sts.metadata.generation
            {
                mark_statefulset_ready(&client, &ns, name).await.unwrap();
            }
        }
        let s = control_plane(&client, &ns, "demo").await.status?;
        let upgrade = s.upgrade?;
        (upgrade.phase == "Completed").then_some(upgrade)
    })
    .await;
    capn.stop().await;
    f.stop().await;
}
