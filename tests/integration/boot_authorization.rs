//! Issue 39 item 1 (structured authorization), on a booted control plane: a webhook
//! authorizer served by this test (HTTPS, SubjectAccessReviews) is configured through
//! `spec.authorization` before Node and RBAC; it lets a user RBAC knows nothing of list
//! ConfigMaps, and a changed configuration (a match condition that no longer sends
//! ConfigMaps to it) takes effect in the same apiserver process, without a restart. A
//! webhook whose kubeconfig Secret is missing is refused first, with a condition.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use capn::api::NestedAPIServer;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::boot::{BOOTED_STEP, Booted, StartCapn, boot_with, say};
use crate::boot_authentication::{Unrestarted, serve_https};

/// The user the webhook allows; RBAC grants it nothing.
const USER: &str = "alice";

fn authorization(match_conditions: Value) -> Value {
    json!({"spec": {"authorization": {"configuration": {"authorizers": [
        {"type": "Webhook", "name": "policy", "webhook": {
            "timeout": "3s",
            "subjectAccessReviewVersion": "v1",
            "matchConditionSubjectAccessReviewVersion": "v1",
            "failurePolicy": "NoOpinion",
            "authorizedTTL": "1s",
            "unauthorizedTTL": "1s",
            "matchConditions": match_conditions,
            "connectionInfo": {"type": "KubeConfigFile", "kubeConfigSecretRef": {"name": "policy-webhook"}},
        }},
        {"type": "Node", "name": "node"},
        {"type": "RBAC", "name": "rbac"},
    ]}}}})
}

/// Whether `USER` may list ConfigMaps in the tenant: `Some(true)` listed, `Some(false)`
/// forbidden, `None` while no apiserver answers (a roll).
async fn user_may_list(booted: &Booted, kubeconfig: &str) -> Option<bool> {
    let mut config = booted.runner.client_config(kubeconfig).await.ok()?;
    // The admin impersonates the user: authorization then asks about the user.
    config.auth_info.impersonate = Some(USER.to_owned());
    let client = kube::Client::try_from(config).ok()?;
    match Api::<ConfigMap>::namespaced(client, "default")
        .list(&ListParams::default())
        .await
    {
        Ok(_) => Some(true),
        Err(kube::Error::Api(e)) if e.code == 403 => Some(false),
        Err(_) => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_authorizer_allows_what_rbac_does_not_and_a_changed_configuration_applies_without_a_restart() {
    let booted = boot_with("authorization", None, StartCapn::InProcess).await;
    let kubeconfig = booted.kubeconfig().await;
    assert_eq!(
        user_may_list(&booted, &kubeconfig).await,
        Some(false),
        "RBAC alone forbids {USER}"
    );

    // The webhook: allows USER anything it is asked about, counts the reviews.
    let asked = Arc::new(AtomicUsize::new(0));
    let address = booted.runner.host_address();
    let listener = tokio::net::TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, 0))
        .await
        .unwrap();
    let url = format!("https://{address}:{}/authorize", listener.local_addr().unwrap().port());
    let router = axum::Router::new().route(
        "/authorize",
        axum::routing::post({
            let asked = asked.clone();
            move |axum::Json(review): axum::Json<Value>| {
                asked.fetch_add(1, Ordering::SeqCst);
                let allowed = review["spec"]["user"] == USER;
                std::future::ready(axum::Json(json!({
                    "apiVersion": "authorization.k8s.io/v1",
                    "kind": "SubjectAccessReview",
                    "status": {"allowed": allowed},
                })))
            }
        }),
    );
    let (ca, task) = serve_https(listener, address, router);

    // Configured before its kubeconfig Secret exists: refused, nothing applied.
    let apiservers = Api::<NestedAPIServer>::namespaced(booted.client.clone(), &booted.ns);
    apiservers
        .patch(
            "demo-apiserver",
            &PatchParams::default(),
            &Patch::Merge(&authorization(json!([]))),
        )
        .await
        .unwrap();
    let refused = booted
        .runner
        .wait_for("the missing webhook Secret is a condition", BOOTED_STEP, || {
            crate::harness::apiserver_refusal(&apiservers, "demo-apiserver", "AuthorizationWebhookConfigMissing")
        })
        .await;
    assert!(
        refused
            .message
            .contains("Secret policy-webhook key kubeconfig: not found"),
        "{}",
        refused.message
    );

    // The Secret: the apiserver rolls once (the flag is new) and asks the webhook.
    use base64::Engine as _;
    let webhook_kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: policy\n  cluster:\n    server: {url}\n    certificate-authority-data: {}\ncontexts:\n- name: policy\n  context:\n    cluster: policy\n    user: apiserver\ncurrent-context: policy\nusers:\n- name: apiserver\n  user: {{}}\n",
        base64::engine::general_purpose::STANDARD.encode(&ca)
    );
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "policy-webhook"},
        "stringData": {"kubeconfig": webhook_kubeconfig},
    }))
    .unwrap();
    Api::<Secret>::namespaced(booted.client.clone(), &booted.ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    booted
        .runner
        .wait_for("the webhook lets the user list ConfigMaps", BOOTED_STEP * 2, || async {
            user_may_list(&booted, &kubeconfig).await.filter(|may| *may)
        })
        .await;
    let reviews = asked.load(Ordering::SeqCst);
    assert!(reviews > 0, "the webhook was asked");
    say(&format!(
        "authorization: the webhook allowed {USER} ({reviews} SubjectAccessReviews so far)"
    ));

    // ConfigMaps no longer sent to the webhook: RBAC decides, in the same process.
    let unrestarted = Unrestarted::take(&booted).await;
    let changed = std::time::Instant::now();
    apiservers
        .patch(
            "demo-apiserver",
            &PatchParams::default(),
            &Patch::Merge(&authorization(json!([
                {"expression": "!has(request.resourceAttributes) || request.resourceAttributes.resource != 'configmaps'"}
            ]))),
        )
        .await
        .unwrap();
    booted
        .runner
        .wait_for(
            "the new configuration applies: the user is forbidden again",
            BOOTED_STEP * 3,
            || async { user_may_list(&booted, &kubeconfig).await.filter(|may| !*may) },
        )
        .await;
    say(&format!(
        "authorization: the new configuration applied {:.1?} after the change, in the same process",
        changed.elapsed()
    ));
    unrestarted.assert_same(&booted).await;
    task.abort();
    booted.stop().await;
}
