//! Structured authentication of the tenant's kube-apiserver (issue 39 item 1): Kubernetes'
//! own `AuthenticationConfiguration` (`apiserver.config.k8s.io/v1`, served by every release
//! of the `stable` channel: 1.35, 1.36, 1.37), read from `--authentication-config`
//! (<https://kubernetes.io/docs/reference/access-authn-authz/authentication/#using-authentication-configuration>).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ConfigMapKeyReference;
use super::component::FreeFormObject;

/// Who may log in to the tenant beyond its certificates and service-account tokens: JWT
/// issuers (OIDC) and the anonymous authenticator, in Kubernetes' own words. capn renders
/// the configuration into the ConfigMap `<cluster>-authentication`, mounts it and passes
/// `--authentication-config`; kube-apiserver reloads the file by itself, so a change of
/// `jwt` reaches the running apiserver without a restart (a change of `anonymous`, which
/// kube-apiserver refuses to reload, rolls it) (docs/guide/security.md "Authentication").
/// The configuration is inline or in a ConfigMap: exactly one of the two.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ApiServerAuthentication {
    /// The `AuthenticationConfiguration`, inline, without `apiVersion` and `kind`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration: Option<AuthenticationConfiguration>,
    /// The `AuthenticationConfiguration` from a ConfigMap in the NestedAPIServer's namespace:
    /// a whole `apiserver.config.k8s.io/v1` document (YAML or JSON) under `key` (default
    /// `config.yaml`), checked by the rules of `configuration`. capn copies it into the
    /// ConfigMap it owns; a change of the referenced ConfigMap reaches the running apiserver
    /// as a change of `configuration` does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration_ref: Option<ConfigMapKeyReference>,
}

/// An `apiserver.config.k8s.io/v1` `AuthenticationConfiguration`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AuthenticationConfiguration {
    /// JWT authenticators, one per issuer (at most 64; issuer URLs distinct).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jwt: Vec<JwtAuthenticator>,
    /// The anonymous authenticator (`enabled`, `conditions`), as kube-apiserver reads it.
    /// Read only at start: a change rolls the apiserver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<FreeFormObject>")]
    pub anonymous: Option<serde_json::Value>,
}

/// One JWT issuer and how its tokens map to users (`JWTAuthenticator`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct JwtAuthenticator {
    /// Where tokens come from and for whom.
    pub issuer: JwtIssuer,
    /// Rules a token's claims must pass (`claim`/`requiredValue` or CEL `expression`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(with = "Vec<FreeFormObject>")]
    pub claim_validation_rules: Vec<serde_json::Value>,
    /// How claims become the user's name, groups, uid and extra.
    pub claim_mappings: ClaimMappings,
    /// CEL rules the mapped user must pass.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(with = "Vec<FreeFormObject>")]
    pub user_validation_rules: Vec<serde_json::Value>,
}

/// A JWT issuer (`Issuer`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct JwtIssuer {
    /// The issuer URL (the tokens' `iss`): `https://`, no user, query or fragment; not the
    /// tenant's own service-account issuer.
    pub url: String,
    /// Where the discovery document is, when not under `url`.
    #[serde(default, rename = "discoveryURL", skip_serializing_if = "Option::is_none")]
    pub discovery_url: Option<String>,
    /// PEM CA bundle that signs the issuer's serving certificate; empty means the
    /// apiserver's system roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_authority: Option<String>,
    /// Accepted `aud` values; at least one.
    pub audiences: Vec<String>,
    /// `MatchAny` (required with several audiences).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience_match_policy: Option<String>,
}

/// Claim mappings (`ClaimMappings`): `username` is required.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClaimMappings {
    /// The user's name: a `claim` with a `prefix` (`""` for none), or a CEL `expression`.
    pub username: PrefixedClaimOrExpression,
    /// The user's groups: as `username`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups: Option<PrefixedClaimOrExpression>,
    /// The user's uid (`claim` or `expression`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<FreeFormObject>")]
    pub uid: Option<serde_json::Value>,
    /// Extra attributes (`key`, `valueExpression`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(with = "Vec<FreeFormObject>")]
    pub extra: Vec<serde_json::Value>,
}

/// A claim with a prefix, or a CEL expression (`PrefixedClaimOrExpression`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PrefixedClaimOrExpression {
    /// The claim (`sub`, `email`, `groups`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
    /// Put before the claim's value; required with `claim` (`""` for none), not allowed
    /// with `expression`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// A CEL expression over `claims` (`claims.email`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expression: Option<String>,
}
