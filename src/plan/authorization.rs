//! The structured authorization of a NestedAPIServer turned into what its apiserver reads
//! (issue 39 item 1): the `apiserver.config.k8s.io/v1` `AuthorizationConfiguration` file and
//! each webhook's kubeconfig Secret, as the `authorization` render-context variable.
//!
//! kube-apiserver watches `--authorization-config` and reloads it by itself when its
//! content changes (kubernetes pkg/kubeapiserver/authorizer/reload.go: fsnotify and a
//! one-minute poll; `apiserver_authorization_config_controller_automatic_reloads_total`),
//! so the file is in a ConfigMap volume (refreshed in place by the kubelet, never a
//! `subPath`) with no digest on the pod template. A webhook's kubeconfig is read only when
//! the configuration is (re)loaded, so its Secret is mounted like the certificates and its
//! change rolls the apiserver (the digest of the Secrets the pod mounts). The flag replaces
//! `--authorization-mode`, which kube-apiserver refuses beside it.

use serde::Serialize;

use super::reference::{CONFIGURATION_KEY, Expected, Reference, ReferenceError};
use crate::api::{ApiServerAuthorization, AuthorizationConfiguration};
use crate::validate::{FieldError, Kind, check_object};

/// The `apiVersion` of the rendered `AuthorizationConfiguration`.
pub const API_VERSION: &str = "apiserver.config.k8s.io/v1";
/// The key of the configuration in `<cluster>-authorization`.
pub const KEY: &str = "authorization-config.yaml";
/// The key of a webhook's kubeconfig Secret when `kubeConfigSecretRef.key` is unset.
pub const WEBHOOK_KUBECONFIG_KEY: &str = "kubeconfig";
/// Where the webhooks' Secrets are mounted, one directory per webhook (by its index).
pub const WEBHOOK_DIR: &str = "/etc/kubernetes/authorization/webhooks";

/// What the channel templates render authorization from (`authorization` in the render
/// context; none without `spec.authorization`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AuthorizationVars {
    /// The ConfigMap capn renders the configuration into: `<cluster>-authorization`.
    pub config_map: String,
    /// Its key ([`KEY`]).
    pub key: &'static str,
    /// The configuration document (JSON, with `apiVersion` and `kind`; each webhook's
    /// `connectionInfo` is Kubernetes' `kubeConfigFile`, pointing into [`WEBHOOK_DIR`]).
    pub configuration: String,
    /// The webhooks' Secrets to mount, in the order of the authorizers.
    pub webhooks: Vec<WebhookSecretVars>,
}

/// A webhook's kubeconfig Secret and where it is mounted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WebhookSecretVars {
    /// The volume's name: `authorization-webhook-<index>`.
    pub volume: String,
    /// The Secret.
    pub secret: String,
    /// Its key holding the kubeconfig.
    pub key: String,
    /// The directory it is mounted at.
    pub dir: String,
}

/// The field that references a configuration in a ConfigMap.
pub const REFERENCE_FIELD: &str = "spec.authorization.configurationRef";
/// The inline field, whose rules a referenced configuration is checked by.
pub const INLINE_FIELD: &str = "spec.authorization.configuration";

/// Checks the field rules of `spec.authorization` of NestedAPIServer `resource_name`
/// ([`crate::validate`]: exactly one of `configuration` and `configurationRef`; unique authorizer names, exactly one `Node` and one `RBAC`, a
/// webhook exactly for `Webhook`, the versions, failure policy, timeout and connection type
/// kube-apiserver accepts).
///
/// # Errors
/// The first [`FieldError`], under its path (`spec.authorization.configuration.authorizers[0].webhook.timeout`).
pub fn check_fields(resource_name: &str, authorization: &ApiServerAuthorization) -> Result<(), FieldError> {
    let object = serde_json::json!({
        "metadata": {"name": resource_name},
        "spec": {"authorization": authorization},
    });
    check_object(Kind::NestedAPIServer, &object)
        .into_iter()
        .next()
        .map_or(Ok(()), Err)
}

/// The ConfigMap and key `configurationRef` names (the key defaults to
/// [`CONFIGURATION_KEY`]), if set.
pub fn configuration_reference(authorization: Option<&ApiServerAuthorization>) -> Option<(&str, &str)> {
    Some(
        authorization?
            .configuration_ref
            .as_ref()?
            .name_and_key(CONFIGURATION_KEY),
    )
}

/// Reads and checks a referenced configuration: the text under `key` of ConfigMap
/// `config_map` (`None`: the ConfigMap or the key is missing), in capn's shape (a webhook
/// names its `kubeConfigSecretRef`), by the rules of the inline `configuration`
/// ([`check_fields`]).
///
/// # Errors
/// [`ReferenceError`]: `AuthorizationConfigurationMissing` when there is no text;
/// `InvalidAuthorization` when it is not YAML or JSON, not an `apiserver.config.k8s.io/v1`
/// `AuthorizationConfiguration`, has a field capn does not know (Kubernetes'
/// `kubeConfigFile` among them) or of the wrong type, or breaks a rule of the inline form
/// (named by its place in the document, `authorizers[0].webhook.timeout`).
pub fn referenced_configuration(
    resource_name: &str,
    config_map: &str,
    key: &str,
    text: Option<&str>,
) -> Result<AuthorizationConfiguration, ReferenceError> {
    let reference = Reference {
        resource: resource_name,
        field: REFERENCE_FIELD,
        config_map,
        key,
    };
    let (configuration, _) = reference.read::<AuthorizationConfiguration>(
        text,
        &Expected {
            api_version: API_VERSION,
            kind: "AuthorizationConfiguration",
            missing_reason: "AuthorizationConfigurationMissing",
            invalid_reason: "InvalidAuthorization",
            missing_hint: "create it with an apiserver.config.k8s.io/v1 AuthorizationConfiguration under that key, or set configuration inline",
            strict: true,
        },
    )?;
    let inline = ApiServerAuthorization {
        configuration: Some(configuration),
        configuration_ref: None,
    };
    check_fields(resource_name, &inline).map_err(|e| reference.field_error(&e, INLINE_FIELD))?;
    Ok(inline.configuration.unwrap_or_default())
}

/// The webhooks' Secret names and keys, in the order of the authorizers of `configuration`
/// (inline, or read from `configurationRef`).
pub fn webhook_secrets(configuration: Option<&AuthorizationConfiguration>) -> Vec<(&str, &str)> {
    configuration
        .into_iter()
        .flat_map(|c| &c.authorizers)
        .filter_map(|a| a.webhook.as_ref())
        .map(|w| {
            let reference = &w.connection_info.kube_config_secret_ref;
            (
                reference.name.as_str(),
                reference.key.as_deref().unwrap_or(WEBHOOK_KUBECONFIG_KEY),
            )
        })
        .collect()
}

/// The render-context `authorization` of cluster `cluster_name` from its configuration
/// (inline, or read from `configurationRef`): `None` without `spec.authorization`.
pub fn authorization_vars(
    cluster_name: &str,
    configuration: Option<&AuthorizationConfiguration>,
) -> Option<AuthorizationVars> {
    let configuration = configuration?;
    let mut webhooks = Vec::new();
    let authorizers: Vec<serde_json::Value> = configuration
        .authorizers
        .iter()
        .map(|authorizer| {
            let mut document = serde_json::to_value(authorizer).unwrap_or_default();
            if let Some(webhook) = &authorizer.webhook {
                let reference = &webhook.connection_info.kube_config_secret_ref;
                let key = reference.key.clone().unwrap_or_else(|| WEBHOOK_KUBECONFIG_KEY.into());
                let dir = format!("{WEBHOOK_DIR}/{}", webhooks.len());
                document["webhook"]["connectionInfo"] = serde_json::json!({
                    "type": webhook.connection_info.type_,
                    "kubeConfigFile": format!("{dir}/{key}"),
                });
                webhooks.push(WebhookSecretVars {
                    volume: format!("authorization-webhook-{}", webhooks.len()),
                    secret: reference.name.clone(),
                    key,
                    dir,
                });
            }
            document
        })
        .collect();
    let document = serde_json::json!({
        "apiVersion": API_VERSION,
        "kind": "AuthorizationConfiguration",
        "authorizers": authorizers,
    });
    Some(AuthorizationVars {
        config_map: format!("{cluster_name}-authorization"),
        key: KEY,
        configuration: serde_json::to_string_pretty(&document).unwrap_or_default(),
        webhooks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{AuthorizerConfiguration, SecretKeyReference, WebhookAuthorizer, WebhookConnectionInfo};

    fn plain(type_: &str, name: &str) -> AuthorizerConfiguration {
        AuthorizerConfiguration {
            type_: type_.into(),
            name: name.into(),
            webhook: None,
        }
    }

    fn webhook(name: &str, secret: &str) -> AuthorizerConfiguration {
        AuthorizerConfiguration {
            type_: "Webhook".into(),
            name: name.into(),
            webhook: Some(WebhookAuthorizer {
                timeout: "3s".into(),
                subject_access_review_version: "v1".into(),
                match_condition_subject_access_review_version: "v1".into(),
                failure_policy: "NoOpinion".into(),
                connection_info: WebhookConnectionInfo {
                    type_: "KubeConfigFile".into(),
                    kube_config_secret_ref: SecretKeyReference {
                        name: secret.into(),
                        key: None,
                    },
                },
                ..WebhookAuthorizer::default()
            }),
        }
    }

    fn with(authorizers: Vec<AuthorizerConfiguration>) -> ApiServerAuthorization {
        ApiServerAuthorization {
            configuration: Some(AuthorizationConfiguration { authorizers }),
            configuration_ref: None,
        }
    }

    fn standard() -> Vec<AuthorizerConfiguration> {
        vec![
            webhook("policy", "policy-kubeconfig"),
            plain("Node", "node"),
            plain("RBAC", "rbac"),
        ]
    }

    fn refused(authorization: &ApiServerAuthorization) -> (String, &'static str) {
        let e = check_fields("a", authorization).unwrap_err();
        (e.path, e.message)
    }

    #[test]
    fn what_kube_apiserver_refuses_at_start_is_refused_with_the_field_path() {
        assert_eq!(check_fields("a", &with(standard())), Ok(()));
        let list = "spec.authorization.configuration.authorizers";
        assert_eq!(refused(&with(vec![plain("RBAC", "rbac")])).0, list, "no Node");
        assert_eq!(refused(&with(vec![plain("Node", "node")])).0, list, "no RBAC");
        let mut twice = standard();
        twice.push(plain("RBAC", "rbac-again"));
        assert_eq!(refused(&with(twice)).0, list, "RBAC twice");
        let mut same_name = standard();
        same_name[1].name = "rbac".into();
        let (path, message) = refused(&with(same_name));
        assert_eq!(path, list);
        assert!(message.contains("unique"), "{message}");

        let mut open = standard();
        open.push(plain("AlwaysAllow", "everyone"));
        assert_eq!(refused(&with(open)).0, format!("{list}[3].type"));
        let mut bad_name = standard();
        bad_name[0].name = "Policy_1".into();
        assert_eq!(refused(&with(bad_name)).0, format!("{list}[0].name"));
        let mut webhook_without = standard();
        webhook_without[0].webhook = None;
        assert_eq!(refused(&with(webhook_without)).0, format!("{list}[0]"));
        let mut node_with_webhook = standard();
        node_with_webhook[1].webhook = standard()[0].webhook.clone();
        assert_eq!(refused(&with(node_with_webhook)).0, format!("{list}[1]"));

        let field = |f: &dyn Fn(&mut WebhookAuthorizer)| {
            let mut authorizers = standard();
            f(authorizers[0].webhook.as_mut().unwrap());
            refused(&with(authorizers)).0
        };
        let webhook = format!("{list}[0].webhook");
        assert_eq!(field(&|w| w.timeout = "31s".into()), format!("{webhook}.timeout"));
        assert_eq!(field(&|w| w.timeout = "0s".into()), format!("{webhook}.timeout"));
        assert_eq!(field(&|w| w.timeout = "three".into()), format!("{webhook}.timeout"));
        assert_eq!(
            field(&|w| w.subject_access_review_version = "v2".into()),
            format!("{webhook}.subjectAccessReviewVersion")
        );
        assert_eq!(
            field(&|w| w.match_condition_subject_access_review_version = "v1beta1".into()),
            format!("{webhook}.matchConditionSubjectAccessReviewVersion")
        );
        assert_eq!(
            field(&|w| w.failure_policy = "Allow".into()),
            format!("{webhook}.failurePolicy")
        );
        assert_eq!(
            field(&|w| w.connection_info.type_ = "InClusterConfig".into()),
            format!("{webhook}.connectionInfo.type")
        );
        assert_eq!(
            field(&|w| w.authorized_ttl = Some("forever".into())),
            format!("{webhook}.authorizedTTL")
        );
    }

    #[test]
    fn the_document_points_each_webhook_at_its_mounted_secret() {
        assert_eq!(authorization_vars("c", None), None);
        let vars = authorization_vars("c", with(standard()).configuration.as_ref()).unwrap();
        assert_eq!(vars.config_map, "c-authorization");
        let document: serde_json::Value = serde_json::from_str(&vars.configuration).unwrap();
        assert_eq!(document["apiVersion"], "apiserver.config.k8s.io/v1");
        assert_eq!(document["kind"], "AuthorizationConfiguration");
        let authorizers = document["authorizers"].as_array().unwrap();
        assert_eq!(
            authorizers
                .iter()
                .map(|a| a["type"].as_str().unwrap())
                .collect::<Vec<_>>(),
            ["Webhook", "Node", "RBAC"],
            "the order is the user's"
        );
        assert_eq!(
            authorizers[0]["webhook"]["connectionInfo"],
            serde_json::json!({
                "type": "KubeConfigFile",
                "kubeConfigFile": "/etc/kubernetes/authorization/webhooks/0/kubeconfig",
            }),
            "Kubernetes' shape: a file, no Secret reference"
        );
        assert_eq!(authorizers[0]["webhook"]["timeout"], "3s");
        assert!(authorizers[1].get("webhook").is_none());
        assert_eq!(
            vars.webhooks,
            [WebhookSecretVars {
                volume: "authorization-webhook-0".into(),
                secret: "policy-kubeconfig".into(),
                key: "kubeconfig".into(),
                dir: "/etc/kubernetes/authorization/webhooks/0".into(),
            }]
        );
        assert_eq!(
            webhook_secrets(with(standard()).configuration.as_ref()),
            [("policy-kubeconfig", "kubeconfig")]
        );
    }

    #[test]
    fn a_referenced_configuration_is_checked_by_the_inline_rules_and_renders_the_same() {
        let inline = with(standard());
        let mut document = serde_json::to_value(inline.configuration.as_ref().unwrap()).unwrap();
        document["apiVersion"] = API_VERSION.into();
        document["kind"] = "AuthorizationConfiguration".into();
        let read = referenced_configuration("a", "cm", "config.yaml", Some(&document.to_string())).unwrap();
        assert_eq!(Some(&read), inline.configuration.as_ref());
        assert_eq!(
            authorization_vars("c", Some(&read)),
            authorization_vars("c", inline.configuration.as_ref())
        );

        let mut slow = document.clone();
        slow["authorizers"][0]["webhook"]["timeout"] = "31s".into();
        let e = referenced_configuration("a", "cm", "k", Some(&slow.to_string())).unwrap_err();
        assert_eq!(e.reason, "InvalidAuthorization");
        assert_eq!(e.field, "spec.authorization.configurationRef");
        assert!(
            e.detail
                .starts_with("ConfigMap cm key k: authorizers[0].webhook.timeout: Invalid value: \"31s\": "),
            "{e}"
        );
        let mut no_rbac = document.clone();
        no_rbac["authorizers"].as_array_mut().unwrap().pop();
        let e = referenced_configuration("a", "cm", "k", Some(&no_rbac.to_string())).unwrap_err();
        assert!(e.detail.starts_with("ConfigMap cm key k: authorizers: "), "{e}");
        // Kubernetes' own shape names a file on the apiserver's pod, which capn refuses.
        let mut file = document.clone();
        file["authorizers"][0]["webhook"]["connectionInfo"] =
            serde_json::json!({"type": "KubeConfigFile", "kubeConfigFile": "/etc/webhook.kubeconfig"});
        let e = referenced_configuration("a", "cm", "k", Some(&file.to_string())).unwrap_err();
        assert!(
            e.detail.contains("authorizers[0].webhook.connectionInfo") && e.detail.contains("kubeConfigSecretRef"),
            "{e}"
        );
        let e = referenced_configuration("a", "cm", "k", None).unwrap_err();
        assert_eq!(e.reason, "AuthorizationConfigurationMissing");
    }
}
