//! Issue 39 item 1, against a real API server (no booted tenant; the booted proof of a
//! reload is `boot_authentication`): an authorization configuration in a ConfigMap
//! (`spec.authorization.configurationRef`) is refused (condition and Warning Event naming the
//! ConfigMap and key) while the ConfigMap is missing, and
//! while a webhook Secret it names is missing; once both exist capn copies it into
//! `<cluster>-authorization`, and an edit of the ConfigMap is copied again.

use capn::api::NestedAPIServer;
use capn_testkit::{mark_statefulset_ready, wait_until};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::Api;
use serde_json::{Value, json};

use crate::harness::*;

const API_VERSION: &str = "controlplane.cluster.x-k8s.io/v1beta1";

/// The `AuthorizationConfiguration` document, with a webhook before Node and RBAC when
/// `webhook` is set.
fn document(webhook: bool) -> String {
    let mut authorizers = vec![
        json!({"type": "Node", "name": "node"}),
        json!({"type": "RBAC", "name": "rbac"}),
    ];
    if webhook {
        authorizers.insert(
            0,
            json!({"type": "Webhook", "name": "policy", "webhook": {
                "timeout": "3s", "subjectAccessReviewVersion": "v1",
                "matchConditionSubjectAccessReviewVersion": "v1", "failurePolicy": "NoOpinion",
                "connectionInfo": {"type": "KubeConfigFile", "kubeConfigSecretRef": {"name": "policy-webhook"}},
            }}),
        );
    }
    // YAML, as a user writes it.
    serde_saphyr::to_string(&json!({
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AuthorizationConfiguration",
        "authorizers": authorizers,
    }))
    .unwrap()
}

fn config_map(webhook: bool) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "access"},
        "data": {"authz.yaml": document(webhook)}})
}

/// The apiserver's `Synced` condition once it is `False` with `reason`.
async fn refused(apiservers: &Api<NestedAPIServer>, reason: &str) -> Condition {
    wait_until(&format!("Synced=False {reason}"), CONTROLLER_STEP, || {
        crate::harness::apiserver_refusal(apiservers, "demo-apiserver", reason)
    })
    .await
}

/// The authorizers capn rendered into `demo-authorization`, once `done` holds for them;
/// stands in for the kubelet meanwhile, so that the apiserver gets its turn.
async fn rendered(f: &Fixture, what: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let copies = Api::<ConfigMap>::namespaced(f.client.clone(), &f.ns);
    wait_until(what, CONTROLLER_STEP * 2, || async {
        let _ = mark_statefulset_ready(&f.client, &f.ns, "demo-etcd").await;
        let copy = copies.get_opt("demo-authorization").await.ok()??;
        let text = copy.data?.remove("authorization-config.yaml")?;
        let document: Value = serde_json::from_str(&text).ok()?;
        let authorizers = document["authorizers"].as_array()?.clone();
        done(&authorizers).then_some(authorizers)
    })
    .await
}

#[tokio::test]
async fn an_authorization_configuration_from_a_config_map_is_checked_copied_and_followed() {
    let f = Fixture::new().await;
    let apiservers = Api::<NestedAPIServer>::namespaced(f.client.clone(), &f.ns);
    f.apply(
        json!({"apiVersion": API_VERSION, "kind": "NestedAPIServer", "metadata": {"name": "demo-apiserver"},
        "spec": {"authorization": {"configurationRef": {"name": "access", "key": "authz.yaml"}}}}),
    )
    .await;
    f.apply(json!({"apiVersion": API_VERSION, "kind": "NestedControlPlane", "metadata": {"name": "demo"}, "spec": {}}))
        .await;

    // No ConfigMap: refused, naming it and its key; never "no configuration".
    let missing = refused(&apiservers, "AuthorizationConfigurationMissing").await;
    assert_eq!(
        missing.message,
        "NestedAPIServer demo-apiserver: spec.authorization.configurationRef: ConfigMap access key authz.yaml: not found: create it with an apiserver.config.k8s.io/v1 AuthorizationConfiguration under that key, or set configuration inline"
    );

    let events = Api::<Event>::namespaced(f.client.clone(), &f.ns);
    let event = wait_until("an Event says so", CONTROLLER_STEP, || async {
        find_listed(&events, |e| {
            e.reason.as_deref() == Some("AuthorizationConfigurationMissing")
        })
        .await
    })
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert!(
        event
            .note
            .as_deref()
            .is_some_and(|note| note.contains("ConfigMap access key authz.yaml: not found")),
        "{event:?}"
    );

    // The ConfigMap names a webhook whose Secret is missing: refused for that now.
    let created = std::time::Instant::now();
    f.apply(config_map(true)).await;
    let no_secret = refused(&apiservers, "AuthorizationWebhookConfigMissing").await;
    eprintln!(
        "security: the created ConfigMap was read {:.1?} after its creation",
        created.elapsed()
    );
    assert!(
        no_secret
            .message
            .contains("Secret policy-webhook key kubeconfig: not found"),
        "{}",
        no_secret.message
    );

    // The Secret: the document is copied, the webhook pointing at its mounted Secret.
    f.apply(
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "policy-webhook"},
        "stringData": {"kubeconfig": "apiVersion: v1\nkind: Config\n"}}),
    )
    .await;
    let authorizers = rendered(&f, "the referenced configuration is copied", |a| a.len() == 3).await;
    assert_eq!(
        authorizers
            .iter()
            .map(|a| a["type"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["Webhook", "Node", "RBAC"]
    );
    assert_eq!(
        authorizers[0]["webhook"]["connectionInfo"],
        json!({"type": "KubeConfigFile", "kubeConfigFile": "/etc/kubernetes/authorization/webhooks/0/kubeconfig"})
    );

    // An edit of the ConfigMap (and nothing else) is copied again.
    let edited = std::time::Instant::now();
    f.apply(config_map(false)).await;
    rendered(&f, "the edited configuration is copied", |a| a.len() == 2).await;
    eprintln!(
        "security: the edited ConfigMap was copied {:.1?} after the edit",
        edited.elapsed()
    );
    f.stop().await;
}
