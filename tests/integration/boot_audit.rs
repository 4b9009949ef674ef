//! Issue 39 item 2 (audit), on a booted control plane: with `spec.audit` the tenant's
//! apiserver records a request made through the admin kubeconfig in its audit log (the file
//! the runner's apiserver writes on its `audit-log` volume), and, once a webhook is
//! configured, at a webhook receiver served by this test on the host. A webhook whose
//! Secret is missing is refused with a condition and an Event until the Secret exists. A
//! changed policy rolls the apiserver, and the new process records by it.

use std::sync::{Arc, Mutex};

use capn::api::{NestedAPIServer, NestedControlPlane};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Secret};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::boot::{BOOTED_STEP, StartCapn, boot_with, say};
use crate::boot_syncer::tenant_client;
use crate::harness::find_listed;

const API_VERSION: &str = "controlplane.cluster.x-k8s.io/v1beta1";

/// The audit events the test's webhook receiver got (the `items` of each `EventList`).
type Received = Arc<Mutex<Vec<Value>>>;

/// Serves `POST /audit` on every address of the host, port chosen by the system; the
/// runner's pods reach it at the runner's host address.
async fn webhook_receiver() -> (u16, Received, tokio::task::JoinHandle<()>) {
    let received: Received = Arc::default();
    let store = received.clone();
    let app = axum::Router::new().route(
        "/audit",
        axum::routing::post(move |axum::Json(list): axum::Json<Value>| {
            let store = store.clone();
            async move {
                let items = list["items"].as_array().cloned().unwrap_or_default();
                store.lock().unwrap().extend(items);
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (port, received, task)
}

/// The audit event of `verb` on ConfigMap `name` among `events`, if there is one.
fn event_for<'a>(events: impl IntoIterator<Item = &'a Value>, verb: &str, name: &str) -> Option<Value> {
    events
        .into_iter()
        .find(|e| e["verb"] == verb && e["objectRef"]["resource"] == "configmaps" && e["objectRef"]["name"] == name)
        .cloned()
}

/// The events in the audit log file of pod `pod`.
fn log_events(booted: &crate::boot::Booted, pod: &str) -> Vec<Value> {
    let path = booted
        .runner
        .dir()
        .join("pods")
        .join(pod)
        .join("volumes")
        .join("audit-log")
        .join("audit.log");
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn assert_admin_created(event: &Value, name: &str) {
    assert_eq!(event["verb"], "create", "{event}");
    assert_eq!(event["objectRef"]["resource"], "configmaps", "{event}");
    assert_eq!(event["objectRef"]["name"], name, "{event}");
    // The admin kubeconfig's client certificate (CN kubernetes-admin, as kubeadm's).
    assert_eq!(event["user"]["username"], "kubernetes-admin", "{event}");
    assert_eq!(
        event["level"], "Metadata",
        "the default policy records no bodies: {event}"
    );
    assert!(event.get("requestObject").is_none(), "{event}");
}

async fn create_config_map(tenant: &kube::Client, name: &str) {
    let config_map: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": name}, "data": {"a": "b"}})).unwrap();
    Api::<ConfigMap>::namespaced(tenant.clone(), "default")
        .create(&PostParams::default(), &config_map)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_to_the_tenant_are_audited_to_the_log_and_the_webhook() {
    let (port, received, receiver) = webhook_receiver().await;
    let docs = vec![
        json!({"apiVersion": API_VERSION, "kind": "NestedControlPlane", "metadata": {"name": "demo"},
            "spec": {"version": "1.36"}}),
        json!({"apiVersion": API_VERSION, "kind": "NestedAPIServer", "metadata": {"name": "demo-apiserver"},
            "spec": {"audit": {"log": {"maxSize": 10, "maxBackup": 1, "maxAge": 1}}}}),
    ];
    let booted = boot_with("audit", Some(docs), StartCapn::InProcess).await;
    let tenant = tenant_client(&booted).await;

    // The log: the default policy, a request made through the admin kubeconfig.
    create_config_map(&tenant, "audited-in-the-log").await;
    let event = booted
        .runner
        .wait_for("the request is in the audit log", BOOTED_STEP, || async {
            event_for(&log_events(&booted, "demo-apiserver-0"), "create", "audited-in-the-log")
        })
        .await;
    assert_admin_created(&event, "audited-in-the-log");
    say(&format!(
        "audit: the log holds {} events; the request: {}",
        log_events(&booted, "demo-apiserver-0").len(),
        json!({"verb": event["verb"], "resource": event["objectRef"]["resource"], "user": event["user"]["username"]})
    ));

    // A webhook whose Secret does not exist yet: refused, with a condition and an Event.
    let apiservers = Api::<NestedAPIServer>::namespaced(booted.client.clone(), &booted.ns);
    let webhook = json!({"spec": {
        "audit": {"webhook": {"configSecretRef": {"name": "audit-sink"}}},
        // Sent within a second of the request, not the default 30 s batch wait.
        "extraArgs": {"audit-webhook-batch-max-wait": "1s"},
    }});
    apiservers
        .patch("demo-apiserver", &PatchParams::default(), &Patch::Merge(&webhook))
        .await
        .unwrap();
    let condition = booted
        .runner
        .wait_for("the missing webhook Secret is a condition", BOOTED_STEP, || {
            crate::harness::apiserver_refusal(&apiservers, "demo-apiserver", "AuditWebhookConfigMissing")
        })
        .await;
    assert!(
        condition
            .message
            .contains("spec.audit.webhook.configSecretRef: Secret audit-sink key kubeconfig: not found"),
        "{}",
        condition.message
    );
    let events = Api::<Event>::namespaced(booted.client.clone(), &booted.ns);
    booted
        .runner
        .wait_for("an Event says so", BOOTED_STEP, || async {
            find_listed(&events, |e| e.reason.as_deref() == Some("AuditWebhookConfigMissing")).await
        })
        .await;
    let before = booted.runner.processes().len();

    // The Secret, a kubeconfig-format file naming the receiver: the apiserver rolls.
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: sink\n  cluster:\n    server: http://{}:{port}/audit\ncontexts:\n- name: sink\n  context:\n    cluster: sink\n    user: sink\ncurrent-context: sink\nusers:\n- name: sink\n  user: {{}}\n",
        booted.runner.host_address()
    );
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "audit-sink"},
        "stringData": {"kubeconfig": kubeconfig},
    }))
    .unwrap();
    Api::<Secret>::namespaced(booted.client.clone(), &booted.ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let ncps = Api::<NestedControlPlane>::namespaced(booted.client.clone(), &booted.ns);
    booted
        .runner
        .wait_for("the apiserver rolled with the webhook", BOOTED_STEP * 2, || async {
            let restarted = booted
                .runner
                .processes()
                .iter()
                .skip(before)
                .any(|p| p.pod == "demo-apiserver-0" && p.container == "kube-apiserver");
            let synced = apiservers
                .get("demo-apiserver")
                .await
                .ok()?
                .status?
                .conditions
                .iter()
                .any(|c| c.type_ == "Synced" && c.status == "True");
            let ready = ncps.get("demo").await.ok()?.status?.ready;
            (restarted && synced && ready).then_some(())
        })
        .await;

    let tenant = tenant_client(&booted).await;
    let event = booted
        .runner
        .wait_for("the request reaches the webhook", BOOTED_STEP, || async {
            // Made again until it arrives: the first may come before the new process serves.
            let name = "audited-at-the-webhook";
            let config_maps = Api::<ConfigMap>::namespaced(tenant.clone(), "default");
            if config_maps.get_opt(name).await.ok()?.is_none() {
                let config_map: ConfigMap = serde_json::from_value(json!({"metadata": {"name": name}})).ok()?;
                config_maps.create(&PostParams::default(), &config_map).await.ok()?;
            }
            event_for(received.lock().unwrap().iter(), "create", name)
        })
        .await;
    assert_admin_created(&event, "audited-at-the-webhook");
    say(&format!(
        "audit: the webhook received {} events; the request: {}",
        received.lock().unwrap().len(),
        json!({"verb": event["verb"], "resource": event["objectRef"]["resource"], "user": event["user"]["username"]})
    ));

    // A changed policy rolls the apiserver (it reads the policy only at start) and is what
    // the new process records: ConfigMaps no more, ServiceAccounts still.
    let digest = |sts: &k8s_openapi::api::apps::v1::StatefulSet| {
        sts.spec
            .as_ref()
            .and_then(|s| s.template.metadata.as_ref())
            .and_then(|m| m.annotations.as_ref())
            .and_then(|a| a.get("controlplane.cluster.x-k8s.io/audit-policy-digest").cloned())
    };
    let old_digest = digest(
        &crate::harness::statefulset(&booted.client, &booted.ns, "demo-apiserver")
            .await
            .unwrap(),
    );
    let before = booted.runner.processes().len();
    let policy = json!({"spec": {"audit": {"policy": {"omitStages": ["RequestReceived"], "rules": [
        {"level": "None", "resources": [{"group": "", "resources": ["configmaps"]}]},
        {"level": "Metadata"},
    ]}}}});
    apiservers
        .patch("demo-apiserver", &PatchParams::default(), &Patch::Merge(&policy))
        .await
        .unwrap();
    booted
        .runner
        .wait_for("the apiserver rolled with the new policy", BOOTED_STEP * 2, || async {
            let restarted = booted
                .runner
                .processes()
                .iter()
                .skip(before)
                .any(|p| p.pod == "demo-apiserver-0" && p.container == "kube-apiserver");
            let ready = ncps.get("demo").await.ok()?.status?.ready;
            (restarted && ready).then_some(())
        })
        .await;
    let new_digest = digest(
        &crate::harness::statefulset(&booted.client, &booted.ns, "demo-apiserver")
            .await
            .unwrap(),
    );
    assert_ne!(old_digest, new_digest, "the pod template names the new policy");
    let tenant = tenant_client(&booted).await;
    let marker = booted
        .runner
        .wait_for("a request after the change is in the new log", BOOTED_STEP, || async {
            let config_maps = Api::<ConfigMap>::namespaced(tenant.clone(), "default");
            let accounts = Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(tenant.clone(), "default");
            if config_maps.get_opt("not-audited").await.ok()?.is_none() {
                let config_map: ConfigMap =
                    serde_json::from_value(json!({"metadata": {"name": "not-audited"}})).ok()?;
                config_maps.create(&PostParams::default(), &config_map).await.ok()?;
            }
            if accounts.get_opt("audited-marker").await.ok()?.is_none() {
                let account = serde_json::from_value(json!({"metadata": {"name": "audited-marker"}})).ok()?;
                accounts.create(&PostParams::default(), &account).await.ok()?;
            }
            log_events(&booted, "demo-apiserver-0").into_iter().find(|e| {
                e["verb"] == "create"
                    && e["objectRef"]["resource"] == "serviceaccounts"
                    && e["objectRef"]["name"] == "audited-marker"
            })
        })
        .await;
    assert_eq!(marker["user"]["username"], "kubernetes-admin");
    let events = log_events(&booted, "demo-apiserver-0");
    assert!(
        !events.iter().any(|e| e["objectRef"]["resource"] == "configmaps"),
        "the new policy records no ConfigMap request"
    );
    say(&format!(
        "audit: after the policy change the new log holds {} events, none about ConfigMaps",
        events.len()
    ));
    receiver.abort();
    booted.stop().await;
}
