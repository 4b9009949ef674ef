//! Encryption at rest of a tenant's Secrets and the resources `spec.encryption.resources`
//! adds (docs/design.md §6 "Encryption at rest"): the key capn generates, and the
//! kube-apiserver `EncryptionConfiguration`
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
//!
//! **A KMS v2 plugin** (`spec.encryption.kms`) goes before capn's keys when it encrypts,
//! after them while it only decrypts ([`KmsProviders`]): capn's keys always stay, so what
//! they wrote stays readable and dropping the plugin needs no new key.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use ring::rand::SecureRandom;

use super::PkiError;
use crate::api::KmsProvider;

/// Data key of `<c>-encryption`: the `EncryptionConfiguration` file, as the apiserver reads it.
pub const ENCRYPTION_CONFIG_KEY: &str = "encryption-configuration.yaml";
/// The provider of every key capn generates.
pub const PROVIDER: &str = "secretbox";
/// The provider a KMS plugin is in the configuration, and `status.encryption.provider` when
/// one encrypts.
pub const KMS_PROVIDER: &str = "kms";
/// The resources encrypted when `spec.encryption.resources` is absent, and always among
/// them: Secrets (the Kubernetes documentation's example, and where a tenant's credentials
/// are).
pub const DEFAULT_RESOURCES: [&str; 1] = ["secrets"];
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

/// The KMS v2 providers of a configuration, by their place around capn's keys.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KmsProviders {
    /// The provider before capn's keys, which encrypts every write.
    pub writer: Option<KmsProvider>,
    /// Providers after capn's keys: they only decrypt what they once wrote (or, for one
    /// being added, will write once every apiserver has it).
    pub readers: Vec<KmsProvider>,
}

impl KmsProviders {
    /// Every provider, the writer first.
    pub fn all(&self) -> impl Iterator<Item = &KmsProvider> {
        self.writer.iter().chain(&self.readers)
    }
}

/// The `EncryptionConfiguration` that encrypts `resources` (one `resources` entry listing
/// them all, in order) with `keys` (the first encrypts, every one decrypts) and reads
/// unencrypted values (`identity`, last); `kms`'s writer goes before the keys and encrypts
/// instead of them, its readers after them.
pub fn encryption_configuration(keys: &[EncryptionKey], kms: &KmsProviders, resources: &[String]) -> String {
    let keys: Vec<_> = keys
        .iter()
        .map(|k| serde_json::json!({"name": k.name, "secret": k.secret_base64()}))
        .collect();
    let kms_provider = |p: &KmsProvider| {
        let mut entry = serde_json::json!({"apiVersion": "v2", "name": p.name, "endpoint": p.endpoint});
        if let Some(timeout) = &p.timeout {
            entry["timeout"] = timeout.as_str().into();
        }
        serde_json::json!({ KMS_PROVIDER: entry })
    };
    let providers: Vec<_> = kms
        .writer
        .iter()
        .map(kms_provider)
        .chain([serde_json::json!({PROVIDER: {"keys": keys}})])
        .chain(kms.readers.iter().map(kms_provider))
        .chain([serde_json::json!({"identity": {}})])
        .collect();
    let config = serde_json::json!({
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "EncryptionConfiguration",
        "resources": [{
            "resources": resources,
            "providers": providers,
        }],
    });
    serde_saphyr::to_string(&config).unwrap_or_default()
}

/// The KMS providers of `config`: one before its first [`PROVIDER`] entry is the writer,
/// those after it readers (capn writes one `resources` entry; the first one's providers
/// are read).
///
/// Errors: [`PkiError::InvalidEncryptionConfiguration`] when `config` is not YAML or a
/// `kms` provider lacks its name or endpoint.
pub fn kms_providers(config: &str) -> Result<KmsProviders, PkiError> {
    let invalid = |detail: String| PkiError::InvalidEncryptionConfiguration(detail);
    let value: serde_json::Value = serde_saphyr::from_str(config).map_err(|e| invalid(e.to_string()))?;
    let mut out = KmsProviders::default();
    let mut after_keys = false;
    for provider in value["resources"][0]["providers"].as_array().into_iter().flatten() {
        if provider.get(PROVIDER).is_some() {
            after_keys = true;
        }
        let Some(kms) = provider.get(KMS_PROVIDER) else {
            continue;
        };
        let field = |f: &str| kms[f].as_str().map(str::to_owned);
        let (Some(name), Some(endpoint)) = (field("name"), field("endpoint")) else {
            return Err(invalid("a kms provider without its name or endpoint".to_owned()));
        };
        let found = KmsProvider {
            name,
            endpoint,
            timeout: field("timeout"),
        };
        match (&out.writer, after_keys) {
            (None, false) => out.writer = Some(found),
            _ => out.readers.push(found),
        }
    }
    Ok(out)
}

/// The KMS providers the configuration should hold next, given `spec.encryption.kms`
/// (`spec`), those it holds (`current`) and whether every apiserver runs with the
/// configuration as it is (`converged`). One step at a time, so no apiserver ever meets a
/// value encrypted by a provider it lacks:
/// - a new provider is added as a reader first, and becomes the writer only once every
///   apiserver has it (`converged`); the writer it replaces stays as a reader;
/// - a provider the spec no longer names stops writing at once (capn's key, which every
///   apiserver has, writes instead) and stays as a reader: its values are still stored;
/// - a provider of the spec's name is changed in place (a moved socket, another timeout).
///
/// Readers go only when a key rotation drops the old keys, after writing everything again.
pub fn desired_kms(spec: Option<&KmsProvider>, current: &KmsProviders, converged: bool) -> KmsProviders {
    let mut next = current.clone();
    let Some(spec) = spec else {
        if let Some(writer) = next.writer.take() {
            next.readers.insert(0, writer);
        }
        return next;
    };
    if next.writer.as_ref().is_some_and(|w| w.name == spec.name) {
        next.writer = Some(spec.clone());
        return next;
    }
    match next.readers.iter().position(|r| r.name == spec.name) {
        Some(at) if converged && next.readers[at] == *spec => {
            next.readers.remove(at);
            if let Some(old) = next.writer.replace(spec.clone()) {
                next.readers.insert(0, old);
            }
        }
        Some(at) => next.readers[at] = spec.clone(),
        None => next.readers.push(spec.clone()),
    }
    next
}

/// The resources `config` encrypts, in order (every `resources` entry's, each once); the
/// [`DEFAULT_RESOURCES`] for a configuration that names none.
///
/// Errors: [`PkiError::InvalidEncryptionConfiguration`] when `config` is not YAML.
pub fn configured_resources(config: &str) -> Result<Vec<String>, PkiError> {
    let value: serde_json::Value =
        serde_saphyr::from_str(config).map_err(|e| PkiError::InvalidEncryptionConfiguration(e.to_string()))?;
    let mut out: Vec<String> = Vec::new();
    for name in value["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| r["resources"].as_array().into_iter().flatten())
        .filter_map(serde_json::Value::as_str)
    {
        if !out.iter().any(|r| r == name) {
            out.push(name.to_owned());
        }
    }
    if out.is_empty() {
        out = DEFAULT_RESOURCES.map(str::to_owned).to_vec();
    }
    Ok(out)
}

/// The resources to encrypt: those `spec.encryption.resources` names (the
/// [`DEFAULT_RESOURCES`] when absent), `secrets` first if the list lacks it, then those
/// encrypted already (`configured`) that the spec no longer names: a resource dropped from
/// the configuration would leave its encrypted objects unreadable (the apiserver reads a
/// resource it does not list with `identity` only), so it stays.
pub fn desired_resources(spec: Option<&[String]>, configured: &[String]) -> Vec<String> {
    let mut out: Vec<String> = DEFAULT_RESOURCES.map(str::to_owned).to_vec();
    for name in spec.into_iter().flatten().chain(configured) {
        if !out.contains(name) {
            out.push(name.clone());
        }
    }
    out
}

/// The names of the [`PROVIDER`] keys in `config`, in order (the one that encrypts first).
///
/// Errors: as [`keys`].
pub fn key_names(config: &str) -> Result<Vec<String>, PkiError> {
    Ok(keys(config)?.into_iter().map(|k| k.name).collect())
}

/// Every [`PROVIDER`] key in `config`, in order (the one that encrypts first), with its
/// secret.
///
/// Errors: [`PkiError::InvalidEncryptionConfiguration`] when `config` has no key, or a key
/// that is not 32 bytes of base64.
pub fn keys(config: &str) -> Result<Vec<EncryptionKey>, PkiError> {
    let invalid = |detail: String| PkiError::InvalidEncryptionConfiguration(detail);
    let value: serde_json::Value = serde_saphyr::from_str(config).map_err(|e| invalid(e.to_string()))?;
    let mut out = Vec::new();
    for key in value["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| r["providers"].as_array().into_iter().flatten())
        .flat_map(|p| p[PROVIDER]["keys"].as_array().into_iter().flatten())
    {
        let name = key["name"].as_str().unwrap_or_default().to_owned();
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(key["secret"].as_str().unwrap_or_default())
            .map_err(|e| invalid(format!("key {name}: {e}")))?;
        let secret: [u8; KEY_BYTES] = bytes
            .try_into()
            .map_err(|_| invalid(format!("key {name} is not {KEY_BYTES} bytes")))?;
        if !out.iter().any(|k: &EncryptionKey| k.name == name) {
            out.push(EncryptionKey { name, secret });
        }
    }
    if out.is_empty() {
        return Err(invalid(format!("no {PROVIDER} key")));
    }
    Ok(out)
}

/// The identity of every key in `config` (`key1/sha256:0123456789abcdef`: its name and the
/// first 16 hex digits of the SHA-256 of its bytes), in order, then of every KMS provider
/// (`kms/<name>`): what a backup records of the keys its Secrets are encrypted with, never
/// the keys. Names alone repeat (every control plane's first key is `key1`); the digest
/// tells two keys of one name apart. A KMS provider's keys are the plugin's: capn can only
/// tell that the configuration still names it.
///
/// Errors: as [`keys`] and [`kms_providers`].
pub fn key_identities(config: &str) -> Result<Vec<String>, PkiError> {
    use sha2::Digest as _;
    let local = keys(config)?.into_iter().map(|k| {
        let digest = sha2::Sha256::digest(k.secret);
        let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
        format!("{}/sha256:{hex}", k.name)
    });
    let kms = kms_providers(config)?;
    Ok(local.chain(kms.all().map(|p| format!("kms/{}", p.name))).collect())
}

/// The name of the next key: `key<n+1>` for the highest `key<n>` among `names`.
pub fn next_key_name<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let highest = names
        .into_iter()
        .filter_map(|n| n.strip_prefix("key")?.parse::<u32>().ok())
        .max()
        .unwrap_or(0);
    format!("key{}", highest + 1)
}

/// The phases of a key rotation, in order (docs/guide/certificates.md "Rotating the key").
/// Each one that changes the configuration ends only once every apiserver runs with it, so
/// at no moment does an apiserver meet a value encrypted with a key it lacks. Ordered as
/// they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum KeyRotationPhase {
    /// The new key is added after the others: every apiserver can read with it, none
    /// writes with it yet.
    AddKey,
    /// The new key comes first: every write is encrypted with it.
    EncryptWithNewKey,
    /// Every object of the encrypted resources is written again through the tenant's
    /// apiserver, so that it is stored under the new key.
    RewriteSecrets,
    /// Only the new key is left (with `identity`).
    DropOldKeys,
    /// Done.
    Completed,
}

impl KeyRotationPhase {
    /// Every phase, in order.
    pub const ALL: [Self; 5] = [
        Self::AddKey,
        Self::EncryptWithNewKey,
        Self::RewriteSecrets,
        Self::DropOldKeys,
        Self::Completed,
    ];

    /// The phase's name in status.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::AddKey => "AddKey",
            Self::EncryptWithNewKey => "EncryptWithNewKey",
            Self::RewriteSecrets => "RewriteSecrets",
            Self::DropOldKeys => "DropOldKeys",
            Self::Completed => "Completed",
        }
    }

    /// The phase named `name`, if any.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == name)
    }

    /// The phase after this one (`Completed` stays).
    pub fn next(self) -> Self {
        let i = Self::ALL.iter().position(|p| *p == self).unwrap_or(Self::ALL.len() - 1);
        Self::ALL[(i + 1).min(Self::ALL.len() - 1)]
    }
}

/// The keys the configuration must hold in `phase` of a rotation to the key `new`, given
/// those it holds (`current`, the one that encrypts first); `None` for the phases that do not
/// change it.
pub fn keys_for_phase(
    phase: KeyRotationPhase,
    current: &[EncryptionKey],
    new: &EncryptionKey,
) -> Option<Vec<EncryptionKey>> {
    let others = current.iter().filter(|k| k.name != new.name).cloned();
    match phase {
        KeyRotationPhase::AddKey => Some(others.chain([new.clone()]).collect()),
        KeyRotationPhase::EncryptWithNewKey => Some([new.clone()].into_iter().chain(others).collect()),
        KeyRotationPhase::DropOldKeys => Some(vec![new.clone()]),
        KeyRotationPhase::RewriteSecrets | KeyRotationPhase::Completed => None,
    }
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

    fn encryption_configuration_plain(keys: &[EncryptionKey], resources: &[String]) -> String {
        encryption_configuration(keys, &KmsProviders::default(), resources)
    }

    fn secrets() -> Vec<String> {
        DEFAULT_RESOURCES.map(str::to_owned).to_vec()
    }

    #[test]
    fn the_default_configuration_is_the_one_capn_always_wrote() {
        // Written by hand from the shape capn rendered before `spec.encryption.resources`
        // existed: a tenant on the default must not see its Secret change (no apiserver roll).
        let key = EncryptionKey {
            name: "key1".into(),
            secret: [7; KEY_BYTES],
        };
        // (serde_json's maps sort their keys: `providers` before `resources`.)
        let expected = "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- providers:\n  - secretbox:\n      keys:\n      - name: key1\n        secret: BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=\n  - identity: {}\n  resources:\n  - secrets\n";
        assert_eq!(
            encryption_configuration_plain(&[key], &desired_resources(None, &[])),
            expected
        );
    }

    #[test]
    fn more_resources_are_listed_in_the_one_entry_and_read_back() {
        let listed: Vec<String> = ["secrets", "configmaps", "deployments.apps"].map(String::from).to_vec();
        let config = encryption_configuration_plain(&[EncryptionKey::generate("key1").unwrap()], &listed);
        let value: serde_json::Value = serde_saphyr::from_str(&config).unwrap();
        assert_eq!(value["resources"].as_array().unwrap().len(), 1);
        assert_eq!(
            value["resources"][0]["resources"],
            serde_json::json!(["secrets", "configmaps", "deployments.apps"])
        );
        assert_eq!(configured_resources(&config).unwrap(), listed);
        // A configuration naming no resource (none capn wrote) reads as the default.
        assert_eq!(
            configured_resources("kind: EncryptionConfiguration\n").unwrap(),
            ["secrets"]
        );
    }

    #[test]
    fn secrets_stay_first_and_a_resource_once_encrypted_stays() {
        let s = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
        assert_eq!(desired_resources(None, &s(&["secrets"])), ["secrets"]);
        assert_eq!(
            desired_resources(Some(&s(&["configmaps", "secrets"])), &s(&["secrets"])),
            ["secrets", "configmaps"]
        );
        // configmaps dropped from the spec: still encrypted, so still readable.
        assert_eq!(
            desired_resources(Some(&s(&["secrets", "events"])), &s(&["secrets", "configmaps"])),
            ["secrets", "events", "configmaps"]
        );
    }

    #[test]
    fn a_configuration_encrypts_secrets_with_the_first_key_and_still_reads_plain_values() {
        let (new, old) = (
            EncryptionKey::generate("key2").unwrap(),
            EncryptionKey::generate("key1").unwrap(),
        );
        let config = encryption_configuration_plain(&[new.clone(), old], &secrets());
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
    fn a_rotation_adds_the_key_then_writes_with_it_then_drops_the_others() {
        let (old, new) = (
            EncryptionKey::generate("key1").unwrap(),
            EncryptionKey::generate("key2").unwrap(),
        );
        let names = |keys: Option<Vec<EncryptionKey>>| keys.unwrap().into_iter().map(|k| k.name).collect::<Vec<_>>();
        let current = [old.clone()];
        assert_eq!(
            names(keys_for_phase(KeyRotationPhase::AddKey, &current, &new)),
            ["key1", "key2"]
        );
        let added = keys_for_phase(KeyRotationPhase::AddKey, &current, &new).unwrap();
        // Resumed after its write: the same configuration, not a third key.
        assert_eq!(
            names(keys_for_phase(KeyRotationPhase::AddKey, &added, &new)),
            ["key1", "key2"]
        );
        assert_eq!(
            names(keys_for_phase(KeyRotationPhase::EncryptWithNewKey, &added, &new)),
            ["key2", "key1"]
        );
        assert_eq!(keys_for_phase(KeyRotationPhase::RewriteSecrets, &added, &new), None);
        assert_eq!(
            names(keys_for_phase(KeyRotationPhase::DropOldKeys, &added, &new)),
            ["key2"]
        );
        let phases: Vec<_> = std::iter::successors(Some(KeyRotationPhase::AddKey), |p| {
            (*p != KeyRotationPhase::Completed).then(|| p.next())
        })
        .map(KeyRotationPhase::as_str)
        .collect();
        assert_eq!(
            phases,
            [
                "AddKey",
                "EncryptWithNewKey",
                "RewriteSecrets",
                "DropOldKeys",
                "Completed"
            ]
        );
        assert_eq!(
            KeyRotationPhase::parse("RewriteSecrets"),
            Some(KeyRotationPhase::RewriteSecrets)
        );
    }

    #[test]
    fn keys_are_read_back_with_their_secrets_and_named_in_sequence() {
        let (a, b) = (
            EncryptionKey::generate("key2").unwrap(),
            EncryptionKey::generate("key1").unwrap(),
        );
        let read = keys(&encryption_configuration_plain(&[a.clone(), b.clone()], &secrets())).unwrap();
        assert_eq!(read, [a, b]);
        assert_eq!(next_key_name(["key1"]), "key2");
        assert_eq!(next_key_name(["key9", "key10", "other"]), "key11");
        assert_eq!(next_key_name([]), "key1");
        let short = "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n  - secretbox:\n      keys:\n      - {name: key1, secret: c2hvcnQ=}\n";
        assert!(keys(short).unwrap_err().to_string().contains("not 32 bytes"));
    }

    #[test]
    fn an_identity_tells_two_keys_of_one_name_apart_and_shows_no_key() {
        let (a, b) = (
            EncryptionKey::generate("key1").unwrap(),
            EncryptionKey::generate("key1").unwrap(),
        );
        let (ia, ib) = (
            key_identities(&encryption_configuration_plain(std::slice::from_ref(&a), &secrets())).unwrap(),
            key_identities(&encryption_configuration_plain(&[b], &secrets())).unwrap(),
        );
        assert_ne!(ia, ib);
        assert!(
            ia[0].starts_with("key1/sha256:") && ia[0].len() == "key1/sha256:".len() + 16,
            "{ia:?}"
        );
        assert!(!ia[0].contains(&a.secret_base64()));
        assert_eq!(
            ia,
            key_identities(&encryption_configuration_plain(&[a], &secrets())).unwrap()
        );
    }

    #[test]
    fn the_secret_holds_the_configuration() {
        let config = encryption_configuration_plain(&[EncryptionKey::generate("key1").unwrap()], &secrets());
        let secret = encryption_secret("demo-encryption", "ns", "demo", &config);
        assert_eq!(encryption_configuration_from_secret(&secret).unwrap(), config);
    }

    fn plugin(name: &str, dir: &str) -> KmsProvider {
        KmsProvider {
            name: name.into(),
            endpoint: format!("unix:///var/run/{dir}/socket.sock"),
            timeout: None,
        }
    }

    #[test]
    fn a_kms_writer_goes_before_the_keys_and_its_readers_after_them() {
        let key = EncryptionKey::generate("key1").unwrap();
        let kms = KmsProviders {
            writer: Some(KmsProvider {
                timeout: Some("5s".into()),
                ..plugin("vault", "vault")
            }),
            readers: vec![plugin("old-hsm", "hsm")],
        };
        let config = encryption_configuration(std::slice::from_ref(&key), &kms, &secrets());
        let value: serde_json::Value = serde_saphyr::from_str(&config).unwrap();
        let providers = value["resources"][0]["providers"].as_array().unwrap();
        let first_field = |p: &serde_json::Value| p.as_object().unwrap().keys().next().unwrap().clone();
        assert_eq!(
            providers.iter().map(first_field).collect::<Vec<_>>(),
            ["kms", "secretbox", "kms", "identity"]
        );
        assert_eq!(
            providers[0]["kms"],
            serde_json::json!({"apiVersion": "v2", "name": "vault", "endpoint": "unix:///var/run/vault/socket.sock", "timeout": "5s"})
        );
        assert_eq!(
            providers[2]["kms"].get("timeout"),
            None,
            "no timeout: the apiserver's default"
        );
        assert_eq!(kms_providers(&config).unwrap(), kms);
        assert_eq!(keys(&config).unwrap(), [key]);
        // capn's configurations before KMS existed hold none.
        let plain = encryption_configuration_plain(&[EncryptionKey::generate("key1").unwrap()], &secrets());
        assert_eq!(kms_providers(&plain).unwrap(), KmsProviders::default());
        let identities = key_identities(&config).unwrap();
        assert!(identities[0].starts_with("key1/sha256:"), "{identities:?}");
        assert_eq!(identities[1..], ["kms/vault", "kms/old-hsm"]);
    }

    #[test]
    fn a_kms_plugin_reads_before_it_writes_and_reads_on_after_it_is_dropped() {
        let (vault, hsm) = (plugin("vault", "vault"), plugin("hsm", "hsm"));
        let none = KmsProviders::default();
        // Added: a reader first, until every apiserver has it.
        let added = desired_kms(Some(&vault), &none, false);
        assert_eq!(
            (added.writer.as_ref(), added.readers.clone()),
            (None, vec![vault.clone()])
        );
        assert_eq!(
            desired_kms(Some(&vault), &added, false),
            added,
            "waits for the apiservers"
        );
        let writing = desired_kms(Some(&vault), &added, true);
        assert_eq!(
            (writing.writer.clone(), writing.readers.len()),
            (Some(vault.clone()), 0)
        );
        assert_eq!(desired_kms(Some(&vault), &writing, true), writing, "settled");
        // Replaced by another plugin: the new one reads first, the old one keeps writing
        // until then, and reads after.
        let both = desired_kms(Some(&hsm), &writing, false);
        assert_eq!(
            (both.writer.clone(), both.readers.clone()),
            (Some(vault.clone()), vec![hsm.clone()])
        );
        let swapped = desired_kms(Some(&hsm), &both, true);
        assert_eq!(
            (swapped.writer.clone(), swapped.readers.clone()),
            (Some(hsm.clone()), vec![vault.clone()])
        );
        // Dropped: capn's key writes at once; the plugin still reads.
        let dropped = desired_kms(None, &swapped, false);
        assert_eq!(
            (dropped.writer.clone(), dropped.readers.clone()),
            (None, vec![hsm.clone(), vault.clone()])
        );
        assert_eq!(
            desired_kms(None, &dropped, true),
            dropped,
            "readers stay until a rotation drops them"
        );
        // A moved socket of the writing plugin: changed in place.
        let moved = plugin("hsm", "hsm2");
        let changed = desired_kms(Some(&moved), &swapped, false);
        assert_eq!((changed.writer, changed.readers), (Some(moved), vec![vault]));
    }
}
