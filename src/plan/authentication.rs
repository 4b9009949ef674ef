//! The structured authentication of a NestedAPIServer turned into what its apiserver reads
//! (issue 39 item 1): the `apiserver.config.k8s.io/v1` `AuthenticationConfiguration` file,
//! as the `authentication` render-context variable.
//!
//! kube-apiserver watches `--authentication-config` and reloads it by itself (kubernetes
//! pkg/kubeapiserver/options/authentication.go: `filesystem.WatchUntil`, fsnotify and a
//! one-minute poll), except `anonymous`, which it refuses to change on reload: the file is
//! in a ConfigMap volume (refreshed in place by the kubelet, never a `subPath`), and only the
//! digest of `anonymous` is on the pod template ([`AuthenticationVars::anonymous_digest`]).
//! Every release of the `stable` channel (1.35, 1.36, 1.37) serves
//! `apiserver.config.k8s.io/v1` and has the flag (the feature gate is GA and locked on since
//! 1.34).

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::reference::{CONFIGURATION_KEY, Expected, Reference, ReferenceError};
use crate::api::{ApiServerAuthentication, AuthenticationConfiguration};
use crate::validate::{FieldError, Kind, check_object};

/// The `apiVersion` of the rendered `AuthenticationConfiguration`.
pub const API_VERSION: &str = "apiserver.config.k8s.io/v1";
/// The key of the configuration in `<cluster>-authentication`.
pub const KEY: &str = "authentication-config.yaml";

/// What the channel templates render authentication from (`authentication` in the render
/// context; none without `spec.authentication`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AuthenticationVars {
    /// The ConfigMap capn renders the configuration into: `<cluster>-authentication`.
    pub config_map: String,
    /// Its key ([`KEY`]).
    pub key: &'static str,
    /// The configuration document (JSON, with `apiVersion` and `kind`).
    pub configuration: String,
    /// SHA-256 (hex, 32 characters) of the `anonymous` part, which kube-apiserver reads
    /// only at start: on the pod template, so that changing it rolls the apiserver while a
    /// change of `jwt` does not.
    pub anonymous_digest: String,
}

/// The field that references a configuration in a ConfigMap.
pub const REFERENCE_FIELD: &str = "spec.authentication.configurationRef";
/// The inline field, whose rules a referenced configuration is checked by.
pub const INLINE_FIELD: &str = "spec.authentication.configuration";

/// Checks the field rules of `spec.authentication` of NestedAPIServer `resource_name`
/// ([`crate::validate`]: exactly one of `configuration` and `configurationRef`, and the
/// inline configuration's rules), and that no issuer is the tenant's own service-account
/// issuer `service_account_issuer` (kube-apiserver refuses an overlap at start).
///
/// # Errors
/// The first [`FieldError`], under its path (`spec.authentication.configuration.jwt[0].issuer.url`).
pub fn check_fields(
    resource_name: &str,
    authentication: &ApiServerAuthentication,
    service_account_issuer: &str,
) -> Result<(), FieldError> {
    let object = serde_json::json!({
        "metadata": {"name": resource_name},
        "spec": {"authentication": authentication},
    });
    if let Some(e) = check_object(Kind::NestedAPIServer, &object).into_iter().next() {
        return Err(e);
    }
    let jwt = authentication.configuration.iter().flat_map(|c| &c.jwt);
    for (i, jwt) in jwt.enumerate() {
        if jwt.issuer.url.trim_end_matches('/') == service_account_issuer {
            return Err(FieldError {
                kind: Kind::NestedAPIServer.as_str(),
                name: resource_name.to_owned(),
                path: format!("{INLINE_FIELD}.jwt[{i}].issuer.url"),
                value: serde_json::Value::from(jwt.issuer.url.as_str()).to_string(),
                message: "must not be the tenant's own service-account issuer (--service-account-issuer), whose tokens kube-apiserver verifies itself",
                reason: "InvalidAuthentication",
            });
        }
    }
    Ok(())
}

/// The ConfigMap and key `configurationRef` names (the key defaults to
/// [`CONFIGURATION_KEY`]), if set.
pub fn configuration_reference(authentication: Option<&ApiServerAuthentication>) -> Option<(&str, &str)> {
    Some(
        authentication?
            .configuration_ref
            .as_ref()?
            .name_and_key(CONFIGURATION_KEY),
    )
}

/// Reads and checks a referenced configuration: the text under `key` of ConfigMap
/// `config_map` (`None`: the ConfigMap or the key is missing), by the rules of the inline
/// `configuration` ([`check_fields`]).
///
/// # Errors
/// [`ReferenceError`]: `AuthenticationConfigurationMissing` when there is no text;
/// `InvalidAuthentication` when it is not YAML or JSON, not an `apiserver.config.k8s.io/v1`
/// `AuthenticationConfiguration`, has a field capn does not know or of the wrong type, or
/// breaks a rule of the inline form (named by its place in the document, `jwt[0].issuer.url`).
pub fn referenced_configuration(
    resource_name: &str,
    config_map: &str,
    key: &str,
    text: Option<&str>,
    service_account_issuer: &str,
) -> Result<AuthenticationConfiguration, ReferenceError> {
    let reference = Reference {
        resource: resource_name,
        field: REFERENCE_FIELD,
        config_map,
        key,
    };
    let (configuration, _) = reference.read::<AuthenticationConfiguration>(
        text,
        &Expected {
            api_version: API_VERSION,
            kind: "AuthenticationConfiguration",
            missing_reason: "AuthenticationConfigurationMissing",
            invalid_reason: "InvalidAuthentication",
            missing_hint: "create it with an apiserver.config.k8s.io/v1 AuthenticationConfiguration under that key, or set configuration inline",
            strict: true,
        },
    )?;
    let inline = ApiServerAuthentication {
        configuration: Some(configuration),
        configuration_ref: None,
    };
    check_fields(resource_name, &inline, service_account_issuer)
        .map_err(|e| reference.field_error(&e, INLINE_FIELD))?;
    Ok(inline.configuration.unwrap_or_default())
}

/// The render-context `authentication` of cluster `cluster_name` from its configuration
/// (inline, or read from `configurationRef`): `None` without `spec.authentication`.
pub fn authentication_vars(
    cluster_name: &str,
    configuration: Option<&AuthenticationConfiguration>,
) -> Option<AuthenticationVars> {
    let configuration = configuration?;
    let mut document = serde_json::to_value(configuration).unwrap_or_default();
    if let Some(map) = document.as_object_mut() {
        map.insert("apiVersion".into(), API_VERSION.into());
        map.insert("kind".into(), "AuthenticationConfiguration".into());
    }
    let anonymous = serde_json::to_string(&configuration.anonymous).unwrap_or_default();
    Some(AuthenticationVars {
        config_map: format!("{cluster_name}-authentication"),
        key: KEY,
        configuration: serde_json::to_string_pretty(&document).unwrap_or_default(),
        anonymous_digest: Sha256::digest(anonymous.as_bytes())
            .iter()
            .take(16)
            .map(|b| format!("{b:02x}"))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ClaimMappings, ConfigMapKeyReference, JwtAuthenticator, JwtIssuer, PrefixedClaimOrExpression};

    const SA_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

    fn jwt(url: &str) -> JwtAuthenticator {
        JwtAuthenticator {
            issuer: JwtIssuer {
                url: url.into(),
                audiences: vec!["tenant".into()],
                ..JwtIssuer::default()
            },
            claim_mappings: ClaimMappings {
                username: PrefixedClaimOrExpression {
                    claim: Some("sub".into()),
                    prefix: Some("oidc:".into()),
                    expression: None,
                },
                ..ClaimMappings::default()
            },
            ..JwtAuthenticator::default()
        }
    }

    fn with(jwt: Vec<JwtAuthenticator>) -> ApiServerAuthentication {
        ApiServerAuthentication {
            configuration: Some(AuthenticationConfiguration { jwt, anonymous: None }),
            configuration_ref: None,
        }
    }

    fn refused(authentication: &ApiServerAuthentication) -> (String, &'static str) {
        let e = check_fields("a", authentication, SA_ISSUER).unwrap_err();
        (e.path, e.message)
    }

    #[test]
    fn what_kube_apiserver_refuses_at_start_is_refused_with_the_field_path() {
        assert_eq!(
            check_fields("a", &with(vec![jwt("https://issuer.example/")]), SA_ISSUER),
            Ok(())
        );
        let (path, message) = refused(&with(vec![jwt("https://a.example"), jwt("https://a.example")]));
        assert_eq!(path, "spec.authentication.configuration.jwt");
        assert!(message.contains("distinct"), "{message}");
        for url in [
            "http://a.example",
            "https://user@a.example",
            "https://a.example?x=1",
            "https://a.example#f",
            "https://",
            "a.example",
        ] {
            let (path, _) = refused(&with(vec![jwt(url)]));
            assert_eq!(path, "spec.authentication.configuration.jwt[0].issuer.url", "{url}");
        }
        let (path, message) = refused(&with(vec![jwt(SA_ISSUER)]));
        assert_eq!(path, "spec.authentication.configuration.jwt[0].issuer.url");
        assert!(message.contains("service-account issuer"), "{message}");

        let mut no_audience = jwt("https://a.example");
        no_audience.issuer.audiences.clear();
        assert_eq!(
            refused(&with(vec![no_audience])).0,
            "spec.authentication.configuration.jwt[0].issuer.audiences"
        );
        let mut no_prefix = jwt("https://a.example");
        no_prefix.claim_mappings.username.prefix = None;
        let (path, message) = refused(&with(vec![no_prefix]));
        assert_eq!(path, "spec.authentication.configuration.jwt[0].claimMappings.username");
        assert!(message.contains("prefix is required"), "{message}");
        let mut both = jwt("https://a.example");
        both.claim_mappings.username.expression = Some("claims.email".into());
        assert!(refused(&with(vec![both])).1.contains("exactly one"));
        let mut expression_with_prefix = jwt("https://a.example");
        expression_with_prefix.claim_mappings.username = PrefixedClaimOrExpression {
            claim: None,
            prefix: Some("x:".into()),
            expression: Some("claims.sub".into()),
        };
        assert!(
            refused(&with(vec![expression_with_prefix]))
                .1
                .contains("may not be set with expression")
        );
    }

    #[test]
    fn the_document_is_an_authentication_configuration_and_only_anonymous_is_digested() {
        assert_eq!(authentication_vars("c", None), None);
        let vars = |a: &ApiServerAuthentication| authentication_vars("c", a.configuration.as_ref());
        let first = vars(&with(vec![jwt("https://a.example")])).unwrap();
        assert_eq!(first.config_map, "c-authentication");
        let document: serde_json::Value = serde_json::from_str(&first.configuration).unwrap();
        assert_eq!(document["apiVersion"], "apiserver.config.k8s.io/v1");
        assert_eq!(document["kind"], "AuthenticationConfiguration");
        assert_eq!(document["jwt"][0]["claimMappings"]["username"]["prefix"], "oidc:");
        let mut other = jwt("https://a.example");
        other.claim_mappings.username.prefix = Some("sso:".into());
        let second = vars(&with(vec![other])).unwrap();
        assert_ne!(first.configuration, second.configuration);
        assert_eq!(
            first.anonymous_digest, second.anonymous_digest,
            "a JWT change is reloaded by the apiserver, so it does not touch the pod template"
        );
        let mut anonymous = with(vec![jwt("https://a.example")]);
        anonymous.configuration.as_mut().unwrap().anonymous = Some(serde_json::json!({"enabled": false}));
        assert_ne!(vars(&anonymous).unwrap().anonymous_digest, first.anonymous_digest);
    }

    #[test]
    fn a_referenced_configuration_is_checked_by_the_inline_rules_and_renders_the_same() {
        let inline = with(vec![jwt("https://a.example")]);
        // JSON, which is YAML too.
        let mut text = serde_json::to_value(inline.configuration.as_ref().unwrap()).unwrap();
        text["apiVersion"] = API_VERSION.into();
        text["kind"] = "AuthenticationConfiguration".into();
        let text = text.to_string();
        let read = referenced_configuration("a", "cm", "config.yaml", Some(&text), SA_ISSUER);
        let read = read.unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(Some(&read), inline.configuration.as_ref());
        assert_eq!(
            authentication_vars("c", Some(&read)),
            authentication_vars("c", inline.configuration.as_ref()),
            "a configuration renders the same from either source"
        );

        let document = |url: &str| {
            format!(
                "apiVersion: apiserver.config.k8s.io/v1\nkind: AuthenticationConfiguration\njwt:\n- issuer: {{url: '{url}', audiences: [t]}}\n  claimMappings: {{username: {{claim: sub, prefix: 'oidc:'}}}}\n"
            )
        };
        let e = referenced_configuration("a", "cm", "k", Some(&document("http://a.example")), SA_ISSUER).unwrap_err();
        assert_eq!(e.reason, "InvalidAuthentication");
        assert_eq!(
            e.to_string(),
            format!(
                "NestedAPIServer a: spec.authentication.configurationRef: ConfigMap cm key k: jwt[0].issuer.url: Invalid value: \"http://a.example\": {}",
                check_fields("a", &with(vec![jwt("http://a.example")]), SA_ISSUER)
                    .unwrap_err()
                    .message
            )
        );
        let e = referenced_configuration("a", "cm", "k", Some(&document(SA_ISSUER)), SA_ISSUER).unwrap_err();
        assert!(e.detail.starts_with("ConfigMap cm key k: jwt[0].issuer.url: "), "{e}");
        assert!(e.detail.contains("service-account issuer"), "{e}");
        let e = referenced_configuration("a", "cm", "k", None, SA_ISSUER).unwrap_err();
        assert_eq!(e.reason, "AuthenticationConfigurationMissing");
        assert_eq!(
            configuration_reference(Some(&ApiServerAuthentication {
                configuration: None,
                configuration_ref: Some(ConfigMapKeyReference {
                    name: "cm".into(),
                    key: None
                }),
            })),
            Some(("cm", "config.yaml"))
        );
    }

    #[test]
    fn exactly_one_source_is_required() {
        let both = ApiServerAuthentication {
            configuration_ref: Some(ConfigMapKeyReference {
                name: "cm".into(),
                key: None,
            }),
            ..with(vec![jwt("https://a.example")])
        };
        let (path, message) = refused(&both);
        assert_eq!(path, "spec.authentication");
        assert!(
            message.contains("exactly one of configuration and configurationRef"),
            "{message}"
        );
        assert_eq!(refused(&ApiServerAuthentication::default()).0, "spec.authentication");
    }
}
