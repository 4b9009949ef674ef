//! Encryption at rest of a tenant's Secrets (docs/design.md §6 "Encryption at rest"): the
//! key capn generates, and the kube-apiserver `EncryptionConfiguration`
//! (`apiserver.config.k8s.io/v1`) that encrypts with it, kept together in the Secret
//! `<c>-encryption` like the other key material.
//!
//! **Provider: `secretbox`** (XSalsa20 and Poly1305, a 32-byte key). Of the providers that
//! need no KMS plugin, the Kubernetes documentation rates it strong and fast
//! (<https://kubernetes.io/docs/tasks/administer-cluster/encrypt-data/#providers>): `aescbc`
//! is weak (padding oracle), `aesgcm` must be rotated every 200,000 writes.
//!
//! **Providers in order:** the newest key first (it encrypts every write), older keys after
//! it (they still decrypt what they wrote), and `identity` last, so that what was stored
//! before encryption was turned on (a tenant made by an older capn) stays readable until it is
//! next written.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use ring::rand::SecureRandom;

use super::PkiError;

/// Data key of `<c>-encryption`: the `EncryptionConfiguration` file, as the apiserver reads it.
pub const ENCRYPTION_CONFIG_KEY: &str = "encryption-configuration.yaml";
/// The provider of every key capn generates.
pub const PROVIDER: &str = "secretbox";
/// The resources encrypted: Secrets (the Kubernetes documentation's example, and where a
/// tenant's credentials are).
pub const ENCRYPTED_RESOURCES: [&str; 1] = ["secrets"];
/// The length of a `secretbox` key, bytes.
const KEY_BYTES: usize = 32;

/// One `secretbox` key: its name in the configuration (`key1`) and its 32 secret bytes,
/// which never appear in `Debug` output.
#[derive(Clone, PartialEq, Eq)]
pub struct EncryptionKey {
    /// The key's name, unique within the configuration; what the apiserver writes into the
    /// prefix of every value it encrypts with it (`k8s:enc:secretbox:v1:<name>:`).
    pub name: String,
    secret: [u8; KEY_BYTES],
}

impl std::fmt::Debug for EncryptionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncryptionKey")
            .field("name", &self.name)
            .field("secret", &"<redacted>")
            .finish()
    }
}

impl EncryptionKey {
    /// A new key named `name`, from the operating system's random source.
    ///
    /// Errors: [`PkiError::Generate`] when the random source fails.
    pub fn generate(name: &str) -> Result<Self, PkiError> {
        let mut secret = [0u8; KEY_BYTES];
        ring::rand::SystemRandom::new()
            .fill(&mut secret)
            .map_err(|_| PkiError::Generate("the random source failed".to_owned()))?;
        Ok(Self {
            name: name.to_owned(),
            secret,
        })
    }

    fn secret_base64(&self) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(self.secret)
    }
}

/// The `EncryptionConfiguration` that encrypts [`ENCRYPTED_RESOURCES`] with `keys` (the
/// first encrypts, every one decrypts) and reads unencrypted values (`identity`, last).
pub fn encryption_configuration(keys: &[EncryptionKey]) -> String {
    let keys: Vec<_> = keys
        .iter()
        .map(|k| serde_json::json!({"name": k.name, "secret": k.secret_base64()}))
        .collect();
    let config = serde_json::json!({
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "EncryptionConfiguration",
        "resources": [{
            "resources": ENCRYPTED_RESOURCES,
            "providers": [{PROVIDER: {"keys": keys}}, {"identity": {}}],
        }],
    });
    serde_saphyr::to_string(&config).unwrap_or_default()
}

/// The names of the [`PROVIDER`] keys in `config`, in order (the one that encrypts first).
///
/// Errors: [`PkiError::InvalidEncryptionConfiguration`] when `config` is not an
/// `EncryptionConfiguration` with [`PROVIDER`] keys.
pub fn key_names(config: &str) -> Result<Vec<String>, PkiError> {
    let invalid = |detail: &str| PkiError::InvalidEncryptionConfiguration(detail.to_owned());
    let value: serde_json::Value = serde_saphyr::from_str(config).map_err(|e| invalid(&e.to_string()))?;
    let names: Vec<String> = value["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| r["providers"].as_array().into_iter().flatten())
        .flat_map(|p| p[PROVIDER]["keys"].as_array().into_iter().flatten())
        .filter_map(|k| k["name"].as_str().map(str::to_owned))
        .collect();
    if names.is_empty() {
        return Err(invalid(&format!("no {PROVIDER} key")));
    }
    Ok(names)
}

/// The Secret `<c>-encryption` holding `config` under [`ENCRYPTION_CONFIG_KEY`], of type
/// [`super::SECRET_TYPE`] and labelled with the cluster. No owner reference: the caller sets
/// it.
pub fn encryption_secret(name: &str, namespace: &str, cluster_name: &str, config: &str) -> Secret {
    super::secret::secret(
        name,
        namespace,
        cluster_name,
        BTreeMap::from([(ENCRYPTION_CONFIG_KEY.to_owned(), ByteString(config.as_bytes().to_vec()))]),
    )
}

/// The `EncryptionConfiguration` stored in `<c>-encryption`.
///
/// Errors: [`PkiError::MissingKey`] when [`ENCRYPTION_CONFIG_KEY`] is absent or empty.
pub fn encryption_configuration_from_secret(secret: &Secret) -> Result<String, PkiError> {
    super::secret::value(secret, ENCRYPTION_CONFIG_KEY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configuration_encrypts_secrets_with_the_first_key_and_still_reads_plain_values() {
        let (new, old) = (
            EncryptionKey::generate("key2").unwrap(),
            EncryptionKey::generate("key1").unwrap(),
        );
        let config = encryption_configuration(&[new.clone(), old]);
        let value: serde_json::Value = serde_saphyr::from_str(&config).unwrap();
        assert_eq!(value["kind"], "EncryptionConfiguration");
        assert_eq!(value["resources"][0]["resources"], serde_json::json!(["secrets"]));
        let providers = value["resources"][0]["providers"].as_array().unwrap();
        assert_eq!(providers.len(), 2);
        assert_eq!(providers[1], serde_json::json!({"identity": {}}));
        let secret = providers[0]["secretbox"]["keys"][0]["secret"].as_str().unwrap();
        use base64::Engine as _;
        assert_eq!(
            base64::engine::general_purpose::STANDARD.decode(secret).unwrap().len(),
            32
        );
        assert_eq!(secret, new.secret_base64());
        assert_eq!(key_names(&config).unwrap(), ["key2", "key1"]);
    }

    #[test]
    fn keys_are_random_and_never_shown() {
        let (a, b) = (
            EncryptionKey::generate("k").unwrap(),
            EncryptionKey::generate("k").unwrap(),
        );
        assert_ne!(a.secret, b.secret);
        let shown = format!("{a:?}");
        assert!(
            !shown.contains(&a.secret_base64()) && shown.contains("redacted"),
            "{shown}"
        );
    }

    #[test]
    fn a_configuration_without_a_key_is_refused() {
        let error = key_names("apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\n").unwrap_err();
        assert!(error.to_string().contains("no secretbox key"), "{error}");
        assert!(key_names(": not yaml [").is_err());
    }

    #[test]
    fn the_secret_holds_the_configuration() {
        let config = encryption_configuration(&[EncryptionKey::generate("key1").unwrap()]);
        let secret = encryption_secret("demo-encryption", "ns", "demo", &config);
        assert_eq!(encryption_configuration_from_secret(&secret).unwrap(), config);
    }
}
