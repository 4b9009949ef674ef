//! Issue 37: public custom resources synced both ways, on two booted tenants and the real
//! super cluster. A public CRD `widgets.s<n>.example.com` opts in
//! (`tenancy.x-k8s.io/sync-instances`); a stand-in for its operator (a watch in this test)
//! sets `status.phase: Ready` and `status.observedSize` on every Widget in the super
//! cluster. A Widget made in a tenant appears in the workload namespace, its status comes
//! back, an edit goes down, a super-side spec edit and a tenant-side status write are put
//! right, a Widget the super cluster refuses gets an Event in the tenant, deleting it
//! removes the copy, and two tenants' Widgets of one name never meet; a super object that
//! holds a copy's name is left alone (`NameConflict` in the tenant), and a control plane
//! that narrows the kinds to none loses its copies. capn runs with the
//! clusterctl components' RBAC, the Widgets' rights aggregated from a labelled ClusterRole.

use std::time::Instant;

use capn::syncer::names::{ControlPlaneRef, NameLimit};
use capn_testkit::counting::RequestCounter;
use futures::StreamExt;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::boot::{BOOTED_STEP, Booted, StartCapn, boot_with, say};
use crate::boot_syncer::tenant_client;
use crate::harness::find_listed;

/// How long capn must send the super cluster nothing before a step counts as done.
const QUIET: std::time::Duration = std::time::Duration::from_secs(2);

/// The public, opted-in CRD `widgets.<group>` with a `status` subresource.
fn widget_crd(group: &str) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.{group}"),
            "labels": {"tenancy.x-k8s.io/super.public": "true"},
            "annotations": {capn::syncer::custom::SYNC_INSTANCES: "true"}},
        "spec": {"group": group, "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
                    "status": {"type": "object", "properties": {
                        "phase": {"type": "string"}, "observedSize": {"type": "integer"}}}}}}}]}
    })
}

fn widget(group: &str, name: &str, size: i64) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": format!("{group}/v1"), "kind": "Widget",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"size": size}
    }))
    .unwrap()
}

/// The stand-in operator: every Widget in the super cluster gets `status.phase: Ready` and
/// its `spec.size` as `status.observedSize`.
async fn operator(client: Client, resource: ApiResource) {
    let all = Api::<DynamicObject>::all_with(client.clone(), &resource);
    let mut widgets = watcher(all, watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .boxed();
    while let Some(change) = widgets.next().await {
        let Ok(widget) = change else { continue };
        let status = json!({"phase": "Ready", "observedSize": widget.data["spec"]["size"]});
        if widget.data.get("status") == Some(&status) {
            continue;
        }
        let api = Api::<DynamicObject>::namespaced_with(client.clone(), &widget.namespace().unwrap(), &resource);
        let patch = json!({"status": status});
        let _ = api
            .patch_status(&widget.name_any(), &PatchParams::default(), &Patch::Merge(patch))
            .await;
    }
}

/// `status` of the Widget `name` once `check` accepts it.
async fn status_where(
    booted: &Booted,
    widgets: &Api<DynamicObject>,
    name: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    booted
        .runner
        .wait_for(what, BOOTED_STEP, || async {
            let status = widgets.get_opt(name).await.ok().flatten()?.data.get("status")?.clone();
            check(&status).then_some(status)
        })
        .await
}

/// The Event with `reason` about the tenant's `default/<name>`, once there is one.
async fn event_about(booted: &Booted, tenant: &Client, name: &str, reason: &str) -> Event {
    let events = Api::<Event>::namespaced(tenant.clone(), "default");
    booted
        .runner
        .wait_for(
            &format!("a {reason} Event about {name} in the tenant"),
            BOOTED_STEP,
            || async {
                find_listed(&events, |e| {
                    e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                        && e.reason.as_deref() == Some(reason)
                })
                .await
            },
        )
        .await
}

/// The super copy of `name`, once `check` accepts it.
async fn copy_where(
    booted: &Booted,
    copies: &Api<DynamicObject>,
    name: &str,
    what: &str,
    check: impl Fn(&DynamicObject) -> bool,
) -> DynamicObject {
    booted
        .runner
        .wait_for(what, BOOTED_STEP, || async {
            copies.get_opt(name).await.ok().flatten().filter(|c| check(c))
        })
        .await
}

/// The widget requests counted by `GET /metrics` of the apiserver behind `client`
/// (`apiserver_request_total` of resource `widgets`), by `verb subresource`.
async fn widget_requests(client: &Client) -> std::collections::BTreeMap<String, u64> {
    let text = client
        .request_text(http::Request::get("/metrics").body(Vec::new()).unwrap())
        .await
        .expect("GET /metrics");
    let mut out = std::collections::BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{") && l.contains("resource=\"widgets\""))
    {
        let label = |name: &str| {
            line.split(&format!("{name}=\""))
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .unwrap_or_default()
                .to_owned()
        };
        let count: u64 = line
            .rsplit(' ')
            .next()
            .and_then(|n| n.parse::<f64>().ok())
            .unwrap_or_default() as u64;
        *out.entry(format!("{} {}", label("verb"), label("subresource")).trim().to_owned())
            .or_default() += count;
    }
    out
}

fn since(after: &std::collections::BTreeMap<String, u64>, before: &std::collections::BTreeMap<String, u64>) -> String {
    after
        .iter()
        .filter_map(|(key, n)| {
            let spent = n - before.get(key).copied().unwrap_or_default();
            (spent > 0).then(|| format!("{spent} {key}"))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn public_custom_resources_sync_down_and_their_status_up() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("capn=info")
        .with_test_writer()
        .try_init();
    let counter = RequestCounter::default();
    let (a, b) = tokio::join!(
        boot_with(
            "custom resources, tenant a",
            None,
            StartCapn::InProcessCountedWithPublicCrds(counter.clone())
        ),
        boot_with(
            "custom resources, tenant b",
            None,
            StartCapn::InProcessCountedWithPublicCrds(RequestCounter::default())
        ),
    );
    let group = format!("s{}.example.com", a.ns.trim_start_matches("capn-test-"));
    let crd_name = format!("widgets.{group}");
    // capn runs with the clusterctl components' RBAC: the kind's rights come from a
    // ClusterRole the platform labels for aggregation (docs/guide/public-crds.md).
    let grant = format!("capn-sync-widgets-{group}");
    crate::harness::apply_cluster_doc(
        &a.client,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": grant, "labels": {capn::manifests::SYNCED_KINDS_LABEL: "true"}},
            "rules": [{"apiGroups": [group], "resources": ["widgets"],
                "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]}),
    )
    .await;
    let super_crds = Api::<CustomResourceDefinition>::all(a.client.clone());
    super_crds
        .create(
            &PostParams::default(),
            &serde_json::from_value(widget_crd(&group)).unwrap(),
        )
        .await
        .unwrap();
    let resource = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(&group, "v1", "Widget"), "widgets");
    let operator = tokio::spawn(operator(a.client.clone(), resource.clone()));
    let (tenant_a, tenant_b) = (tenant_client(&a).await, tenant_client(&b).await);
    for (booted, tenant) in [(&a, &tenant_a), (&b, &tenant_b)] {
        let crds = Api::<CustomResourceDefinition>::all(tenant.clone());
        booted
            .runner
            .wait_for("the public CRD is established in the tenant", BOOTED_STEP, || async {
                let crd = crds.get_opt(&crd_name).await.ok().flatten()?;
                crd.status?
                    .conditions?
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
                    .then_some(())
            })
            .await;
    }
    let widgets_a = Api::<DynamicObject>::namespaced_with(tenant_a.clone(), "default", &resource);
    let widgets_b = Api::<DynamicObject>::namespaced_with(tenant_b.clone(), "default", &resource);
    let plane_a = ControlPlaneRef::new(&a.ns, "demo");
    let copies_a = Api::<DynamicObject>::namespaced_with(a.client.clone(), &plane_a.workload_namespace(), &resource);
    let copy_name = plane_a.super_name(NameLimit::Subdomain, "default", "w1");

    // Down and up, counted on both sides.
    let quiet = || async { (counter.idle_for() >= QUIET).then_some(()) };
    a.runner.wait_for("capn is quiet", BOOTED_STEP, quiet).await;
    let (super_before, tenant_before) = (counter.tally(), widget_requests(&tenant_a).await);
    let created = Instant::now();
    widgets_a
        .create(&PostParams::default(), &widget(&group, "w1", 3))
        .await
        .unwrap();
    status_where(&a, &widgets_a, "w1", "the Widget's status comes back", |s| {
        s["phase"] == "Ready"
    })
    .await;
    let round_trip = created.elapsed();
    a.runner.wait_for("capn is quiet", BOOTED_STEP, quiet).await;
    let super_spent = counter.tally().since(&super_before);
    let tenant_spent = since(&widget_requests(&tenant_a).await, &tenant_before);
    say(&format!(
        "custom resources: tenant create → status back in {round_trip:.1?}; super-cluster requests of capn: {} in all\n{}tenant-side requests (the test's create included): {tenant_spent}",
        super_spent.total(),
        super_spent.breakdown()
    ));
    assert_eq!(
        super_spent.count("patch", "widgets"),
        1,
        "one apply of the copy:\n{}",
        super_spent.breakdown()
    );
    let copy = copies_a.get(&copy_name).await.unwrap();
    assert_eq!(copy.data["spec"]["size"], 3);
    assert_eq!(copy.annotations()["tenancy.x-k8s.io/name"], "w1");

    // A tenant edit goes down, and its status comes back.
    widgets_a
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 5}})),
        )
        .await
        .unwrap();
    copy_where(&a, &copies_a, &copy_name, "the edit reaches the copy", |c| {
        c.data["spec"]["size"] == 5
    })
    .await;
    status_where(&a, &widgets_a, "w1", "the edit's status comes back", |s| {
        s["observedSize"] == 5
    })
    .await;

    // A super-side spec edit is reverted; a tenant-side status write is overwritten.
    copies_a
        .patch(
            &copy_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 99}})),
        )
        .await
        .unwrap();
    copy_where(&a, &copies_a, &copy_name, "the super-side edit is reverted", |c| {
        c.data["spec"]["size"] == 5
    })
    .await;
    widgets_a
        .patch_status(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Forged"}})),
        )
        .await
        .unwrap();
    status_where(&a, &widgets_a, "w1", "the tenant's status write is overwritten", |s| {
        s["phase"] == "Ready"
    })
    .await;

    // Two tenants, one name: two copies, each with its own spec and status.
    widgets_b
        .create(&PostParams::default(), &widget(&group, "w1", 7))
        .await
        .unwrap();
    status_where(&b, &widgets_b, "w1", "tenant b's Widget is served", |s| {
        s["observedSize"] == 7
    })
    .await;
    let plane_b = ControlPlaneRef::new(&b.ns, "demo");
    let copy_b = Api::<DynamicObject>::namespaced_with(b.client.clone(), &plane_b.workload_namespace(), &resource)
        .get(&plane_b.super_name(NameLimit::Subdomain, "default", "w1"))
        .await
        .unwrap();
    assert_eq!(copy_b.data["spec"]["size"], 7);
    assert_eq!(copies_a.get(&copy_name).await.unwrap().data["spec"]["size"], 5);
    assert_eq!(widgets_a.get("w1").await.unwrap().data["status"]["observedSize"], 5);

    // A super object already holds the name tenant b's `w2` would be copied to, and is not
    // its copy: left alone, and the tenant hears it (`NameConflict`).
    let copies_b = Api::<DynamicObject>::namespaced_with(b.client.clone(), &plane_b.workload_namespace(), &resource);
    let taken = plane_b.super_name(NameLimit::Subdomain, "default", "w2");
    let mut foreign = widget(&group, &taken, 99);
    foreign.metadata.namespace = Some(plane_b.workload_namespace());
    copies_b.create(&PostParams::default(), &foreign).await.unwrap();
    widgets_b
        .create(&PostParams::default(), &widget(&group, "w2", 2))
        .await
        .unwrap();
    let conflict = event_about(&b, &tenant_b, "w2", "NameConflict").await;
    assert!(conflict.note.unwrap_or_default().contains(&taken));
    assert_eq!(
        copies_b.get(&taken).await.unwrap().data["spec"]["size"],
        99,
        "the foreign object is untouched"
    );

    // Tenant b's control plane narrows the kinds to none: its copies go, tenant a's stay.
    Api::<capn::api::NestedControlPlane>::namespaced(b.client.clone(), &b.ns)
        .patch(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"workloads": {"customResources": []}}})),
        )
        .await
        .unwrap();
    let copy_b_name = plane_b.super_name(NameLimit::Subdomain, "default", "w1");
    b.runner
        .wait_for("a kind narrowed away loses its copies", BOOTED_STEP, || async {
            copies_b.get_opt(&copy_b_name).await.ok()?.is_none().then_some(())
        })
        .await;
    assert_eq!(
        copies_b.get(&taken).await.unwrap().data["spec"]["size"],
        99,
        "only copies go"
    );
    assert!(
        copies_a.get_opt(&copy_name).await.unwrap().is_some(),
        "tenant a keeps its copy"
    );
    copies_b.delete(&taken, &DeleteParams::default()).await.unwrap();

    // The super cluster refuses a Widget (its own admission policy): an Event in the tenant.
    let policy = format!("widgets-{group}");
    let admission = |kind: &str, spec: Value| {
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
            "metadata": {"name": policy}, "spec": spec})
    };
    let policies = [
        admission(
            "ValidatingAdmissionPolicy",
            json!({"failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{"apiGroups": [group], "apiVersions": ["*"],
                    "operations": ["CREATE", "UPDATE"], "resources": ["widgets"]}]},
                "validations": [{"expression": "object.spec.size <= 100",
                    "message": "a Widget in this super cluster has at most 100 parts"}]}),
        ),
        admission(
            "ValidatingAdmissionPolicyBinding",
            json!({"policyName": policy, "validationActions": ["Deny"]}),
        ),
    ];
    for doc in policies {
        crate::harness::apply_cluster_doc(&a.client, doc).await;
    }
    let probe = Api::<DynamicObject>::namespaced_with(a.client.clone(), &plane_a.workload_namespace(), &resource);
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    a.runner
        .wait_for("the super cluster's policy is in force", BOOTED_STEP, || async {
            let mut probing = widget(&group, "probe", 1000);
            probing.metadata.namespace = Some(plane_a.workload_namespace());
            let refused = probe.create(&dry_run, &probing).await.err()?;
            refused.to_string().contains("at most 100 parts").then_some(())
        })
        .await;
    widgets_a
        .create(&PostParams::default(), &widget(&group, "big", 1000))
        .await
        .unwrap();
    let refusal = event_about(&a, &tenant_a, "big", "SuperClusterRefused").await;
    let note = refusal.note.unwrap_or_default();
    assert!(note.contains("at most 100 parts"), "{note}");
    assert_eq!(refusal.type_.as_deref(), Some("Warning"));
    assert!(
        copies_a
            .get_opt(&plane_a.super_name(NameLimit::Subdomain, "default", "big"))
            .await
            .unwrap()
            .is_none(),
        "nothing is applied for a refused Widget"
    );

    // Deleting the tenant's Widget removes its copy.
    widgets_a.delete("w1", &DeleteParams::default()).await.unwrap();
    a.runner
        .wait_for("the copy goes with its Widget", BOOTED_STEP, || async {
            copies_a.get_opt(&copy_name).await.ok()?.is_none().then_some(())
        })
        .await;

    operator.abort();
    for (kind, plural) in [
        ("ValidatingAdmissionPolicyBinding", "validatingadmissionpolicybindings"),
        ("ValidatingAdmissionPolicy", "validatingadmissionpolicies"),
    ] {
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind),
            plural,
        );
        let _ = Api::<DynamicObject>::all_with(a.client.clone(), &resource)
            .delete(&policy, &DeleteParams::default())
            .await;
    }
    let _ = super_crds.delete(&crd_name, &DeleteParams::default()).await;
    let _ = Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(a.client.clone())
        .delete(&grant, &DeleteParams::default())
        .await;
    tokio::join!(a.stop(), b.stop());
}
