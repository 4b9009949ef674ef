//! Structured authorization of the tenant's kube-apiserver (issue 39 item 1): Kubernetes'
//! own `AuthorizationConfiguration` (`apiserver.config.k8s.io/v1`, served by every release of
//! the `stable` channel: 1.35, 1.36, 1.37; the feature is GA since 1.32), read from
//! `--authorization-config`
//! (<https://kubernetes.io/docs/reference/access-authn-authz/authorization/#using-configuration-file-for-authorization>).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::component::FreeFormObject;
use super::{ConfigMapKeyReference, SecretKeyReference};

/// Who may do what in the tenant beyond RBAC: webhook authorizers, in Kubernetes' own
/// words, in the order they are asked. capn renders the configuration into the ConfigMap
/// `<cluster>-authorization`, mounts it and passes `--authorization-config` instead of
/// `--authorization-mode`; kube-apiserver reloads the file by itself, so a change of the
/// list reaches the running apiserver without a restart (a change of a webhook's kubeconfig
/// Secret, which it reads only when the file changes, rolls it)
/// (docs/guide/security.md "Authorization"). The configuration is inline or in a ConfigMap:
/// exactly one of the two.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ApiServerAuthorization {
    /// The `AuthorizationConfiguration`, inline, without `apiVersion` and `kind`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration: Option<AuthorizationConfiguration>,
    /// The `AuthorizationConfiguration` from a ConfigMap in the NestedAPIServer's namespace:
    /// a whole `apiserver.config.k8s.io/v1` document (YAML or JSON) under `key` (default
    /// `config.yaml`), in capn's shape (a webhook's `connectionInfo` names its
    /// `kubeConfigSecretRef`) and checked by the rules of `configuration`. capn copies it
    /// into the ConfigMap it owns; a change of the referenced ConfigMap reaches the running
    /// apiserver as a change of `configuration` does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration_ref: Option<ConfigMapKeyReference>,
}

/// An `apiserver.config.k8s.io/v1` `AuthorizationConfiguration`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AuthorizationConfiguration {
    /// The authorizers, asked in this order until one allows or denies. Must hold one `Node`
    /// and one `RBAC` authorizer: the tenant's nodes (capn's kubelet identities) and every
    /// component capn runs are authorized by them.
    pub authorizers: Vec<AuthorizerConfiguration>,
}

/// One authorizer (`AuthorizerConfiguration`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AuthorizerConfiguration {
    /// `Webhook`, `Node` or `RBAC`.
    #[serde(rename = "type")]
    pub type_: String,
    /// A DNS-1123 subdomain, unique in the list (its metrics and logs name it).
    pub name: String,
    /// The webhook, for type `Webhook` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<WebhookAuthorizer>,
}

/// A webhook authorizer (`WebhookConfiguration`): kube-apiserver asks it with
/// SubjectAccessReviews.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WebhookAuthorizer {
    /// How long to wait for an answer, a duration like `3s`: more than 0, at most 30s.
    pub timeout: String,
    /// The SubjectAccessReview version sent: `v1` or `v1beta1`.
    pub subject_access_review_version: String,
    /// The version `matchConditions` are written against: `v1`.
    pub match_condition_subject_access_review_version: String,
    /// `NoOpinion` (the next authorizer is asked) or `Deny`, when the webhook fails or a
    /// match condition cannot be evaluated.
    pub failure_policy: String,
    /// How long an allow is cached, a duration like `5m` (kube-apiserver's field
    /// `authorizedTTL`).
    #[serde(default, rename = "authorizedTTL", skip_serializing_if = "Option::is_none")]
    pub authorized_ttl: Option<String>,
    /// How long a deny is cached (`unauthorizedTTL`).
    #[serde(default, rename = "unauthorizedTTL", skip_serializing_if = "Option::is_none")]
    pub unauthorized_ttl: Option<String>,
    /// Whether allows are cached (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_authorized_requests: Option<bool>,
    /// Whether denies are cached (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_unauthorized_requests: Option<bool>,
    /// CEL conditions (`expression`) a request must all meet to be sent to the webhook.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(with = "Vec<FreeFormObject>")]
    pub match_conditions: Vec<serde_json::Value>,
    /// Where the webhook is.
    pub connection_info: WebhookConnectionInfo,
}

/// Where a webhook authorizer is (`WebhookConnectionInfo`). Kubernetes names a kubeconfig
/// *file*; a file on the apiserver's pod is not something a user can put there, so capn
/// takes a Secret instead, mounts it, and renders `kubeConfigFile` pointing at it — its one
/// departure from Kubernetes' shape. `InClusterConfig` is refused: it would dial the super
/// cluster with the apiserver pod's identity.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WebhookConnectionInfo {
    /// `KubeConfigFile`.
    #[serde(rename = "type")]
    pub type_: String,
    /// The Secret (in the NestedAPIServer's namespace) and key (default `kubeconfig`) holding
    /// the webhook's kubeconfig: its `clusters[].cluster.server` is the webhook's URL.
    pub kube_config_secret_ref: SecretKeyReference,
}
