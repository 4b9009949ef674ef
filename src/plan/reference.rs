//! A document a NestedAPIServer names in a ConfigMap instead of writing it inline
//! (`spec.audit.policyRef`, `spec.authentication.configurationRef`,
//! `spec.authorization.configurationRef`, issue 39), read and checked as the inline field
//! is. Pure: the controller (a GET) and `capn render` (a ConfigMap document of its input)
//! find the text and hand it here.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::validate::FieldError;

/// The key of a referenced authentication or authorization configuration when
/// `configurationRef.key` is unset.
pub const CONFIGURATION_KEY: &str = "config.yaml";

/// Why a referenced document cannot be used: the reason and what is wrong, naming the
/// ConfigMap, the key and the place in the document. Displayed as `NestedAPIServer <name>:
/// <field>: ConfigMap <name> key <key>: <detail>`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("NestedAPIServer {resource}: {field}: {detail}")]
pub struct ReferenceError {
    /// The condition and Event reason: `AuditPolicyMissing`, `InvalidAuditPolicy`,
    /// `AuthenticationConfigurationMissing`, `InvalidAuthentication`, ...
    pub reason: &'static str,
    /// The NestedAPIServer's name.
    pub resource: String,
    /// The referring field (`spec.authentication.configurationRef`).
    pub field: &'static str,
    /// What is wrong, after the field.
    pub detail: String,
}

/// A key of a ConfigMap named by a field of a NestedAPIServer.
#[derive(Clone, Copy, Debug)]
pub struct Reference<'a> {
    /// The NestedAPIServer's name.
    pub resource: &'a str,
    /// The referring field (`spec.authentication.configurationRef`).
    pub field: &'static str,
    /// The ConfigMap.
    pub config_map: &'a str,
    /// Its key.
    pub key: &'a str,
}

/// What a referenced document must be: its `apiVersion` and `kind`, the reasons of a
/// missing and of an invalid one, and what to do when it is missing.
#[derive(Clone, Copy, Debug)]
pub struct Expected {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub missing_reason: &'static str,
    pub invalid_reason: &'static str,
    /// Said after `not found: ` (`create it with ... under that key`).
    pub missing_hint: &'static str,
    /// Fields of the document the type does not have are refused (a security setting
    /// that is silently dropped is worse than a refusal); the top-level `metadata` is
    /// allowed either way.
    pub strict: bool,
}

impl Reference<'_> {
    fn error(&self, reason: &'static str, detail: String) -> ReferenceError {
        ReferenceError {
            reason,
            resource: self.resource.to_owned(),
            field: self.field,
            detail: format!("ConfigMap {} key {}: {detail}", self.config_map, self.key),
        }
    }

    /// Reads `text` (`None`: the ConfigMap or the key is missing) as a `T` document of
    /// `expected`'s `apiVersion` and `kind`. Returns it and the document as JSON, without
    /// `apiVersion`, `kind` and `metadata` (the shape of the inline field).
    ///
    /// # Errors
    /// [`ReferenceError`] with `expected.missing_reason` when there is no text; with
    /// `expected.invalid_reason` when it is not YAML or JSON, of another `apiVersion` or
    /// `kind`, a field has the wrong type, or (`strict`) a field is unknown — named by its
    /// place in the document (`jwt[0].issuer.url`).
    pub fn read<T: DeserializeOwned + Serialize>(
        &self,
        text: Option<&str>,
        expected: &Expected,
    ) -> Result<(T, Value), ReferenceError> {
        let Some(text) = text else {
            return Err(self.error(expected.missing_reason, format!("not found: {}", expected.missing_hint)));
        };
        let invalid = |detail: String| self.error(expected.invalid_reason, detail);
        let mut document: Value =
            serde_saphyr::from_str(text).map_err(|e| invalid(format!("not a YAML or JSON document: {e}")))?;
        let field = |name: &str| {
            document
                .get(name)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let (api_version, kind) = (field("apiVersion"), field("kind"));
        if (api_version.as_str(), kind.as_str()) != (expected.api_version, expected.kind) {
            return Err(invalid(format!(
                "is apiVersion {api_version:?} kind {kind:?}; must be apiVersion {} kind {}",
                expected.api_version, expected.kind
            )));
        }
        if let Some(map) = document.as_object_mut() {
            for key in ["apiVersion", "kind", "metadata"] {
                map.remove(key);
            }
        }
        let typed: T =
            serde_path_to_error::deserialize(&document).map_err(|e| invalid(format!("{}: {}", e.path(), e.inner())))?;
        if expected.strict {
            let known = serde_json::to_value(&typed).unwrap_or_default();
            if let Some(path) = unknown_field(&document, &known, "") {
                return Err(invalid(format!(
                    "{path}: unknown field (a field kube-apiserver reads that capn does not know, or a misspelling)"
                )));
            }
        }
        Ok((typed, document))
    }

    /// `e`, an error of the inline field `inline` (`spec.authentication.configuration`) found
    /// in the referenced document, as an error of this reference: its path inside the
    /// document, its value and message, and its reason.
    pub fn field_error(&self, e: &FieldError, inline: &str) -> ReferenceError {
        let inside = e.path.trim_start_matches(inline).trim_start_matches('.');
        let inside = if inside.is_empty() { "(the document)" } else { inside };
        self.error(e.reason, format!("{inside}: Invalid value: {}: {}", e.value, e.message))
    }
}

/// The first field of `document` that `known` (the document read as its type and written
/// back) lacks, as a path (`jwt[0].issuer.egress`). An empty value (`null`, `[]`, `{}`) is
/// not reported: a type drops empty lists and unset fields when it writes them back.
fn unknown_field(document: &Value, known: &Value, path: &str) -> Option<String> {
    let join = |key: &str| {
        if path.is_empty() {
            key.to_owned()
        } else {
            format!("{path}.{key}")
        }
    };
    let empty = |v: &Value| match v {
        Value::Null => true,
        Value::Array(items) => items.is_empty(),
        Value::Object(map) => map.is_empty(),
        _ => false,
    };
    match (document, known) {
        (Value::Object(map), Value::Object(known_map)) => {
            map.iter().find_map(|(key, value)| match known_map.get(key) {
                Some(k) => unknown_field(value, k, &join(key)),
                None if empty(value) => None,
                None => Some(join(key)),
            })
        }
        (Value::Object(map), _) => map.iter().find(|(_, v)| !empty(v)).map(|(key, _)| join(key)),
        (Value::Array(items), Value::Array(known_items)) => items
            .iter()
            .zip(known_items)
            .enumerate()
            .find_map(|(i, (item, k))| unknown_field(item, k, &format!("{path}[{i}]"))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::AuthenticationConfiguration;

    const EXPECTED: Expected = Expected {
        api_version: "apiserver.config.k8s.io/v1",
        kind: "AuthenticationConfiguration",
        missing_reason: "Missing",
        invalid_reason: "Invalid",
        missing_hint: "create it",
        strict: true,
    };

    fn reference() -> Reference<'static> {
        Reference {
            resource: "a",
            field: "spec.authentication.configurationRef",
            config_map: "cm",
            key: "config.yaml",
        }
    }

    fn read(text: &str) -> Result<AuthenticationConfiguration, ReferenceError> {
        reference().read(Some(text), &EXPECTED).map(|(typed, _)| typed)
    }

    #[test]
    fn a_document_reads_as_its_type_and_what_is_wrong_is_named_by_its_place() {
        let good = "apiVersion: apiserver.config.k8s.io/v1\nkind: AuthenticationConfiguration\njwt:\n- issuer: {url: https://a.example, audiences: [t]}\n  claimMappings: {username: {claim: sub, prefix: ''}}\n  claimValidationRules: []\n";
        let read_back = read(good).unwrap();
        assert_eq!(read_back.jwt[0].issuer.url, "https://a.example");
        assert_eq!(read_back.jwt[0].claim_mappings.username.prefix.as_deref(), Some(""));

        let missing = reference()
            .read::<AuthenticationConfiguration>(None, &EXPECTED)
            .unwrap_err();
        assert_eq!(missing.reason, "Missing");
        assert_eq!(
            missing.to_string(),
            "NestedAPIServer a: spec.authentication.configurationRef: ConfigMap cm key config.yaml: not found: create it"
        );
        let wrong_kind =
            read("apiVersion: apiserver.config.k8s.io/v1\nkind: AuthorizationConfiguration\n").unwrap_err();
        assert_eq!(wrong_kind.reason, "Invalid");
        assert!(
            wrong_kind
                .detail
                .ends_with("must be apiVersion apiserver.config.k8s.io/v1 kind AuthenticationConfiguration"),
            "{}",
            wrong_kind.detail
        );
        assert!(read(": [").unwrap_err().detail.contains("not a YAML or JSON document"));
        let wrong_type = read(&good.replace("audiences: [t]", "audiences: t")).unwrap_err();
        assert!(
            wrong_type
                .detail
                .starts_with("ConfigMap cm key config.yaml: jwt[0].issuer.audiences: "),
            "{}",
            wrong_type.detail
        );
        let unknown = read(&good.replace("audiences: [t]", "audiences: [t], egress: controlplane")).unwrap_err();
        assert!(
            unknown
                .detail
                .starts_with("ConfigMap cm key config.yaml: jwt[0].issuer.egress: unknown field"),
            "{}",
            unknown.detail
        );
    }

    #[test]
    fn unknown_fields_are_found_at_any_depth_but_empty_ones_are_not() {
        let known = serde_json::json!({"a": {"b": [{"c": 1}]}});
        assert_eq!(unknown_field(&known, &known, ""), None);
        assert_eq!(
            unknown_field(&serde_json::json!({"a": {"b": [{"c": 1, "d": 2}]}}), &known, ""),
            Some("a.b[0].d".into())
        );
        assert_eq!(
            unknown_field(
                &serde_json::json!({"a": {"b": [{"c": 1}], "e": [], "f": null}}),
                &known,
                ""
            ),
            None
        );
    }
}
