//! Certificates as Secrets (docs/design.md §6): look up first, create only on NotFound, re-issue a
//! leaf only when [`check_leaf`] says so, never mint a CA because a read failed.
//! Private keys are never logged, put in Events or in status.
//!
//! Reads are cheap in the steady state: a Secret is read in full only
//! when its resourceVersion in the metadata cache differs from the one capn last verified,
//! or when the certificate it holds is due for renewal. What was verified is remembered per
//! process in [`Verified`].

use crate::status::Reason;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::api::{Api, Patch};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::apply::{apply_params, create_params};
use crate::controllers::{Context, ReconcileError};
use crate::pki::encryption::{
    EncryptionKey, KmsProviders, encryption_configuration, encryption_configuration_from_secret, encryption_secret,
    key_names,
};
use crate::pki::{
    CertificateAuthority, KeyAlgorithm, KeyPairPem, LeafSpec, PkiError, RenewalPolicy, check_leaf,
    key_pair_from_secret, kubeconfig, kubeconfig_from_secret, kubeconfig_secret, service_account_key_pair, tls_secret,
};

/// Annotation on every certificate Secret capn issues: the certificate's `NotAfter`
/// (RFC 3339), readable from the metadata alone.
pub const NOT_AFTER_ANNOTATION: &str = "controlplane.cluster.x-k8s.io/certificate-not-after";
/// Annotation on every leaf Secret capn issues: when capn renews it (RFC 3339).
pub const RENEW_AFTER_ANNOTATION: &str = "controlplane.cluster.x-k8s.io/certificate-renew-after";

/// A certificate authority known by its Secret; its key is read only when something must be
/// signed or checked against it.
#[derive(Clone, Debug)]
pub struct CaRef {
    pub name: String,
    /// The Secret's resourceVersion when it was looked up: leaves verified against this
    /// version need no new check while it stays.
    pub resource_version: String,
}

/// What capn last verified about one Secret, valid while its resourceVersion stays.
#[derive(Clone, Debug, Default)]
struct Verified {
    resource_version: String,
    /// The version this one replaced when capn wrote it: while the metadata cache still
    /// shows that one (it lags behind capn's own write by a moment), this entry is newer.
    replaced: Option<String>,
    /// capn wrote this version itself.
    written: bool,
    /// SHA-256 of the data, keys in order: the input of the certificates digest (32 bytes,
    /// not its 64 hex digits: kept for every Secret capn reads).
    data: [u8; 32],
    /// The certificate's `NotAfter` (the first certificate of `tls.crt`, or of a kubeconfig).
    not_after: Option<OffsetDateTime>,
    /// The leaf was found current against `ca` for `wanted` (a hash of what it must say).
    leaf: Option<LeafVerdict>,
}

#[derive(Clone, Debug, PartialEq)]
struct LeafVerdict {
    ca: String,
    wanted: u64,
    renew_at: OffsetDateTime,
}

/// The process-wide memory of verified Secrets, keyed by a 64-bit hash of namespace and
/// name, each entry boxed: a thousand control planes verify twelve thousand Secrets, and
/// the two strings beside each ~150-byte entry in a table twice the size it holds cost
/// 3.6 MB at a thousand control planes, this about 2.
///
/// Two Secrets whose names hash alike cannot be mistaken for each other: an entry is
/// trusted only while its resourceVersion is the one the metadata cache shows for the
/// Secret looked up ([`CertificateStore::verified`]), and no two objects share a
/// resourceVersion (it is the etcd revision of the object's last write, one object per
/// revision). A collision costs a read, nothing more.
#[derive(Default)]
pub struct VerifiedSecrets(Mutex<HashMap<u64, Box<Verified>>>);

impl VerifiedSecrets {
    fn get(&self, ns: &str, name: &str) -> Option<Verified> {
        self.0
            .lock()
            .ok()?
            .get(&crate::hash64(&(ns, name)))
            .map(|v| Verified::clone(v))
    }

    fn put(&self, ns: &str, name: &str, verified: Verified) {
        if let Ok(mut map) = self.0.lock() {
            map.insert(crate::hash64(&(ns, name)), Box::new(verified));
        }
    }
}

/// The CAs' key pairs (PEM) by namespace, Secret name and resourceVersion, so that issuing
/// does not read a CA again while it is unchanged. A thousand control planes created at
/// once need all their CAs kept until their components have issued their leaves, so the
/// PEM is kept (about 1.2 KiB, not the parsed form's several) for at most
/// [`KEPT_AUTHORITIES`] CAs, least recently used first out; a CA no longer kept is read
/// again when next needed.
pub struct KeptAuthorities(Mutex<lru::LruCache<(String, String, String), KeyPairPem>>);

/// How many CAs [`KeptAuthorities`] keeps: three per control plane for a thousand control
/// planes, with room for rotations (at most about 5 MiB).
pub const KEPT_AUTHORITIES: usize = 4096;

impl Default for KeptAuthorities {
    fn default() -> Self {
        let capacity = std::num::NonZeroUsize::new(KEPT_AUTHORITIES).unwrap_or(std::num::NonZeroUsize::MIN);
        Self(Mutex::new(lru::LruCache::new(capacity)))
    }
}

impl KeptAuthorities {
    fn get(&self, ns: &str, name: &str, version: &str) -> Option<KeyPairPem> {
        self.0
            .lock()
            .ok()?
            .get(&(ns.to_string(), name.to_string(), version.to_string()))
            .cloned()
    }

    fn put(&self, ns: &str, name: &str, version: &str, pem: KeyPairPem) {
        if let Ok(mut map) = self.0.lock() {
            map.put((ns.to_string(), name.to_string(), version.to_string()), pem);
        }
    }
}

/// SHA-256 over a Secret's data, keys in order.
fn data_digest(secret: &Secret) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for (key, value) in secret.data.iter().flatten() {
        hasher.update(key.as_bytes());
        hasher.update([0]);
        hasher.update(&value.0);
        hasher.update([0]);
    }
    hasher.finalize().into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn wanted_hash(parts: &[&dyn std::fmt::Debug]) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for part in parts {
        format!("{part:?}").hash(&mut hasher);
    }
    hasher.finish()
}

fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_default()
}

/// Reads and writes the certificate Secrets of one cluster, in its namespace, for one
/// reconcile.
pub struct CertificateStore<'a> {
    ctx: &'a Context,
    api: Api<Secret>,
    namespace: &'a str,
    cluster: &'a str,
    /// Owner of the Secrets capn creates: the NestedControlPlane.
    owner: &'a OwnerReference,
    now: OffsetDateTime,
    policy: RenewalPolicy,
    /// CAs read during this reconcile.
    loaded: Mutex<HashMap<String, Arc<CertificateAuthority>>>,
    /// The earliest renewal among the leaves ensured during this reconcile.
    next_renewal: Mutex<Option<(OffsetDateTime, String)>>,
}

impl<'a> CertificateStore<'a> {
    pub fn new(
        ctx: &'a Context,
        namespace: &'a str,
        cluster: &'a str,
        owner: &'a OwnerReference,
        now: OffsetDateTime,
        policy: RenewalPolicy,
    ) -> Self {
        Self {
            ctx,
            api: Api::namespaced(ctx.client.clone(), namespace),
            namespace,
            cluster,
            owner,
            now,
            policy,
            loaded: Mutex::default(),
            next_renewal: Mutex::default(),
        }
    }

    fn pki_error(secret: &str) -> impl Fn(PkiError) -> ReconcileError + '_ {
        move |source| ReconcileError::Pki {
            secret: secret.to_string(),
            source,
        }
    }

    /// The resourceVersion the metadata cache holds for Secret `name`.
    fn cached_version(&self, name: &str) -> Option<String> {
        self.ctx
            .caches
            .secret(self.namespace, name)
            .map(|m| m.resource_version.clone())
    }

    /// What was verified about `name`, if it still describes the Secret: the cache holds
    /// that version, or still the one capn's own write replaced. (A Secret the cache does
    /// not hold is read: it may have been deleted.)
    fn verified(&self, name: &str) -> Option<Verified> {
        let verified = self.ctx.verified.get(self.namespace, name)?;
        let cached = self.cached_version(name)?;
        (cached == verified.resource_version || verified.replaced.as_ref() == Some(&cached)).then_some(verified)
    }

    /// Reads Secret `name` in full and remembers its version and data digest (keeping a
    /// leaf verdict only when the version is unchanged).
    async fn fetch(&self, name: &str) -> Result<Option<Secret>, ReconcileError> {
        let secret = self.api.get_opt(name).await?;
        if let Some(secret) = &secret {
            self.remember(name, secret, None);
        }
        Ok(secret)
    }

    fn remember(&self, name: &str, secret: &Secret, leaf: Option<LeafVerdict>) {
        self.remember_as(name, secret, leaf, false);
    }

    /// [`Self::remember`]; `written` when capn itself just wrote `secret` (so the cache may
    /// still show the version it replaced, or none).
    fn remember_as(&self, name: &str, secret: &Secret, leaf: Option<LeafVerdict>, written: bool) {
        let resource_version = secret.resource_version().unwrap_or_default();
        let previous = self.ctx.verified.get(self.namespace, name);
        let replaced = written.then(|| self.cached_version(name)).flatten();
        let keep_leaf = previous
            .as_ref()
            .filter(|p| p.resource_version == resource_version)
            .and_then(|p| p.leaf.clone());
        let not_after = key_pair_from_secret(secret)
            .ok()
            .and_then(|pair| crate::pki::not_after(&pair.cert_pem).ok())
            .or_else(|| {
                kubeconfig_from_secret(secret)
                    .ok()
                    .and_then(|text| parse_kubeconfig(&text))
                    .and_then(|k| crate::pki::not_after(&k.client.cert_pem).ok())
            });
        self.ctx.verified.put(
            self.namespace,
            name,
            Verified {
                resource_version,
                replaced,
                written,
                data: data_digest(secret),
                not_after,
                leaf: leaf.or(keep_leaf),
            },
        );
    }

    /// Marks a Secret as capn's: owned by the NestedControlPlane, labelled managed-by.
    fn own(&self, mut secret: Secret) -> Secret {
        secret.metadata.owner_references = Some(vec![self.owner.clone()]);
        secret
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert("app.kubernetes.io/managed-by".into(), crate::plan::MANAGED_BY.into());
        secret
    }

    fn annotate(mut secret: Secret, not_after: OffsetDateTime, renew_at: Option<OffsetDateTime>) -> Secret {
        let annotations = secret.metadata.annotations.get_or_insert_with(Default::default);
        annotations.insert(NOT_AFTER_ANNOTATION.into(), rfc3339(not_after));
        if let Some(renew_at) = renew_at {
            annotations.insert(RENEW_AFTER_ANNOTATION.into(), rfc3339(renew_at));
        }
        secret
    }

    async fn write(&self, secret: Secret, leaf: Option<LeafVerdict>) -> Result<(), ReconcileError> {
        let secret = self.own(secret);
        let name = secret.metadata.name.clone().unwrap_or_default();
        let params = apply_params();
        let written = self.api.patch(&name, &params, &Patch::Apply(&secret)).await?;
        self.remember_as(&name, &written, leaf, true);
        Ok(())
    }

    /// Creates a Secret only if none exists; returns what the API server holds then (a
    /// concurrent creator wins, and theirs is read).
    async fn create(&self, secret: Secret) -> Result<Option<Secret>, ReconcileError> {
        let secret = self.own(secret);
        let name = secret.metadata.name.clone().unwrap_or_default();
        match self.api.create(&create_params(), &secret).await {
            Ok(created) => {
                self.remember_as(&name, &created, None, true);
                Ok(Some(created))
            }
            Err(kube::Error::Api(s)) if s.code == 409 => self.fetch(&name).await,
            Err(e) => Err(e.into()),
        }
    }

    /// Reads Secret `name` in full, unless the synced metadata cache and capn's own memory
    /// both say it does not exist: then it is a leaf about to be issued for the first time,
    /// and the read would only answer NotFound. (Not used for the CAs of an initialized
    /// control plane: their absence is always confirmed by a read.)
    async fn fetch_leaf(&self, name: &str) -> Result<Option<Secret>, ReconcileError> {
        if self.cached_version(name).is_none() && self.ctx.verified.get(self.namespace, name).is_none() {
            return Ok(None);
        }
        self.fetch(name).await
    }

    /// The CA in Secret `name`, from the metadata cache when it has seen the Secret, else
    /// from a read (the cache may lag behind a CA created a moment ago). `Ok(None)` only on
    /// a definite NotFound from the API server, never because a read failed.
    ///
    /// # Errors
    /// API errors other than NotFound.
    pub async fn require_ca(&self, name: &str) -> Result<Option<CaRef>, ReconcileError> {
        if let Some(resource_version) = self.cached_version(name) {
            return Ok(Some(CaRef {
                name: name.to_string(),
                resource_version,
            }));
        }
        Ok(self.fetch(name).await?.map(|secret| CaRef {
            name: name.to_string(),
            resource_version: secret.resource_version().unwrap_or_default(),
        }))
    }

    /// Reads and parses the CA `ca` (once per reconcile).
    ///
    /// # Errors
    /// [`ReconcileError::CertificateAuthorityMissing`] when it no longer exists; API errors;
    /// [`ReconcileError::Pki`] when the Secret does not hold a usable CA (it is then left
    /// untouched).
    pub async fn load_ca(&self, ca: &CaRef) -> Result<Arc<CertificateAuthority>, ReconcileError> {
        if let Some(loaded) = self.loaded.lock().ok().and_then(|m| m.get(&ca.name).cloned()) {
            return Ok(loaded);
        }
        let kept = &self.ctx.authorities;
        let parse = |pair: &KeyPairPem| {
            CertificateAuthority::from_pem(&pair.cert_pem, &pair.key_pem).map_err(Self::pki_error(&ca.name))
        };
        let loaded = match kept.get(self.namespace, &ca.name, &ca.resource_version) {
            Some(pair) => parse(&pair)?,
            None => {
                let Some(secret) = self.fetch(&ca.name).await? else {
                    return Err(ReconcileError::CertificateAuthorityMissing(ca.name.clone()));
                };
                let pair = key_pair_from_secret(&secret).map_err(Self::pki_error(&ca.name))?;
                let loaded = parse(&pair)?;
                kept.put(
                    self.namespace,
                    &ca.name,
                    &secret.resource_version().unwrap_or_default(),
                    pair,
                );
                loaded
            }
        };
        let loaded = Arc::new(loaded);
        if let Ok(mut m) = self.loaded.lock() {
            m.insert(ca.name.clone(), loaded.clone());
        }
        Ok(loaded)
    }

    /// The `NotAfter` of the CA's certificate, read once per version of its Secret.
    ///
    /// # Errors
    /// As [`Self::load_ca`].
    pub async fn ca_not_after(&self, ca: &CaRef) -> Result<Option<OffsetDateTime>, ReconcileError> {
        if let Some(v) = self.verified(&ca.name) {
            return Ok(v.not_after);
        }
        let loaded = self.load_ca(ca).await?;
        Ok(crate::pki::not_after(loaded.cert_pem()).ok())
    }

    /// The CA in Secret `name`, created (CN `common_name`, 10 years) only when the Secret
    /// does not exist and `may_create` is true. A user-supplied CA is used as-is.
    ///
    /// # Errors
    /// [`ReconcileError::CertificateAuthorityMissing`] when the Secret is missing and
    /// `may_create` is false (the control plane was initialized with another CA); API
    /// and PKI errors as [`Self::load_ca`].
    pub async fn ensure_ca(&self, name: &str, common_name: &str, may_create: bool) -> Result<CaRef, ReconcileError> {
        if !may_create {
            // An initialized control plane: only a read may say the CA is gone.
            return self
                .require_ca(name)
                .await?
                .ok_or_else(|| ReconcileError::CertificateAuthorityMissing(name.to_string()));
        }
        if let Some(resource_version) = self.cached_version(name) {
            return Ok(CaRef {
                name: name.to_string(),
                resource_version,
            });
        }
        // Not in the synced cache: create without reading first. A create never replaces
        // anything, so a CA the cache has not shown yet survives (409, then it is read).
        let ca = CertificateAuthority::generate(common_name, self.now, KeyAlgorithm::default())
            .map_err(Self::pki_error(name))?;
        let not_after = crate::pki::not_after(ca.cert_pem()).map_err(Self::pki_error(name))?;
        let secret = Self::annotate(
            tls_secret(name, self.namespace, self.cluster, ca.pem()),
            not_after,
            None,
        );
        let created = self
            .create(secret)
            .await?
            .ok_or_else(|| ReconcileError::CertificateAuthorityMissing(name.to_string()))?;
        let resource_version = created.resource_version().unwrap_or_default();
        if key_pair_from_secret(&created).is_ok_and(|held| held.cert_pem == ca.cert_pem()) {
            // Ours won: keep it, so that issuing does not read it back.
            tracing::info!(secret = name, cluster = self.cluster, "created certificate authority");
            self.ctx
                .authorities
                .put(self.namespace, name, &resource_version, ca.pem().clone());
        }
        Ok(CaRef {
            name: name.to_string(),
            resource_version,
        })
    }

    /// The service-account key pair in Secret `name`, created only when it does not exist
    /// and `may_create` is true (one pair, never two: docs/reference.md).
    ///
    /// # Errors
    /// As [`Self::ensure_ca`].
    pub async fn ensure_service_account_key(&self, name: &str, may_create: bool) -> Result<(), ReconcileError> {
        if self.cached_version(name).is_some() {
            return Ok(());
        }
        if !may_create {
            return match self.fetch(name).await? {
                Some(_) => Ok(()),
                None => Err(ReconcileError::CertificateAuthorityMissing(name.to_string())),
            };
        }
        // As for a CA: create without reading first; a create never replaces anything.
        let pair = service_account_key_pair(KeyAlgorithm::default()).map_err(Self::pki_error(name))?;
        self.create(tls_secret(name, self.namespace, self.cluster, &pair))
            .await?;
        Ok(())
    }

    /// Ensures `<c>-encryption` (`name`) holds the apiserver's `EncryptionConfiguration`:
    /// made with a new key (`key1`) and the KMS providers `kms` encrypting `resources` when
    /// `may_create` (the status never recorded one), otherwise read and never replaced.
    /// Returns the configuration when this pass read or made it, `None` when the metadata
    /// cache shows it (the status keeps what it recorded).
    ///
    /// # Errors
    /// [`ReconcileError::EncryptionKeyMissing`] when it is gone and `may_create` is false;
    /// a configuration without keys; API errors.
    pub async fn ensure_encryption_key(
        &self,
        name: &str,
        may_create: bool,
        kms: &KmsProviders,
        resources: &[String],
    ) -> Result<Option<String>, ReconcileError> {
        if self.cached_version(name).is_some() && !may_create {
            return Ok(None);
        }
        let existing = match self.fetch(name).await? {
            Some(secret) => Some(secret),
            None if may_create => {
                let key = EncryptionKey::generate("key1").map_err(Self::pki_error(name))?;
                let config = encryption_configuration(&[key], kms, resources);
                self.create(encryption_secret(name, self.namespace, self.cluster, &config))
                    .await?
            }
            None => return Err(ReconcileError::EncryptionKeyMissing(name.to_owned())),
        };
        let config = existing
            .as_ref()
            .map(encryption_configuration_from_secret)
            .transpose()
            .map_err(Self::pki_error(name))?
            .unwrap_or_default();
        // A configuration capn cannot read is an error here, not at the next rotation.
        key_names(&config).map_err(Self::pki_error(name))?;
        Ok(Some(config))
    }

    /// Ensures Secret `name` holds a leaf certificate for `wanted` signed by `ca`: kept when
    /// [`check_leaf`] finds it current, (re-)issued otherwise. Returns its expiry and the
    /// time it will be renewed.
    ///
    /// # Errors
    /// API errors; PKI errors while issuing.
    pub async fn ensure_leaf(
        &self,
        name: &str,
        ca: &CaRef,
        wanted: &LeafSpec,
    ) -> Result<(OffsetDateTime, OffsetDateTime), ReconcileError> {
        let times = self.ensure_leaf_inner(name, ca, wanted).await?;
        self.note_renewal(name, times.1);
        Ok(times)
    }

    async fn ensure_leaf_inner(
        &self,
        name: &str,
        ca: &CaRef,
        wanted: &LeafSpec,
    ) -> Result<(OffsetDateTime, OffsetDateTime), ReconcileError> {
        let wanted_hash = wanted_hash(&[wanted, &self.policy]);
        if let Some(kept) = self.still_current(name, ca, wanted_hash) {
            return Ok(kept);
        }
        let loaded = self.load_ca(ca).await?;
        if let Some(secret) = self.fetch_leaf(name).await?
            && let Ok(existing) = key_pair_from_secret(&secret)
            && let Some((not_after, renew_at)) = check_leaf(&existing, &loaded, wanted, &self.policy, self.now)
        {
            self.remember(name, &secret, Some(self.verdict(ca, wanted_hash, renew_at)));
            return Ok((not_after, renew_at));
        }
        let pair = loaded
            .issue_valid_for(wanted, self.now, KeyAlgorithm::default(), self.policy.validity)
            .map_err(Self::pki_error(name))?;
        let (not_after, renew_at) = self.times(name, &pair.cert_pem)?;
        tracing::info!(secret = name, cluster = self.cluster, not_after = %rfc3339(not_after), "issued certificate");
        let secret = Self::annotate(
            tls_secret(name, self.namespace, self.cluster, &pair),
            not_after,
            Some(renew_at),
        );
        self.write(secret, Some(self.verdict(ca, wanted_hash, renew_at)))
            .await?;
        Ok((not_after, renew_at))
    }

    /// The earliest renewal time of the leaves and kubeconfigs ensured so far.
    pub fn next_renewal(&self) -> Option<OffsetDateTime> {
        self.next_renewal.lock().ok()?.as_ref().map(|(at, _)| *at)
    }

    /// The earliest renewal, with the Secret it renews.
    pub fn next_renewal_of(&self) -> Option<(OffsetDateTime, String)> {
        self.next_renewal.lock().ok()?.clone()
    }

    fn note_renewal(&self, name: &str, renew_at: OffsetDateTime) {
        if let Ok(mut next) = self.next_renewal.lock()
            && next.as_ref().is_none_or(|(at, _)| renew_at < *at)
        {
            *next = Some((renew_at, name.to_string()));
        }
    }

    fn verdict(&self, ca: &CaRef, wanted: u64, renew_at: OffsetDateTime) -> LeafVerdict {
        LeafVerdict {
            ca: ca.resource_version.clone(),
            wanted,
            renew_at,
        }
    }

    /// The expiry and renewal time remembered for `name`, when nothing it was checked
    /// against has changed and its renewal is not due.
    fn still_current(&self, name: &str, ca: &CaRef, wanted: u64) -> Option<(OffsetDateTime, OffsetDateTime)> {
        let verified = self.verified(name)?;
        let leaf = verified.leaf?;
        (leaf.ca == ca.resource_version && leaf.wanted == wanted && self.now < leaf.renew_at)
            .then_some((verified.not_after?, leaf.renew_at))
    }

    fn times(&self, name: &str, cert_pem: &str) -> Result<(OffsetDateTime, OffsetDateTime), ReconcileError> {
        let not_after = crate::pki::not_after(cert_pem).map_err(Self::pki_error(name))?;
        let not_before = self.now - crate::pki::NOT_BEFORE_BACKDATE;
        Ok((not_after, self.policy.renew_at(not_before, not_after)))
    }

    /// Ensures Secret `name` holds a kubeconfig for `user` at `server_url` whose client
    /// certificate (for `wanted`) and CA are current; rewritten otherwise. Returns the
    /// client certificate's expiry and the time it will be renewed.
    ///
    /// # Errors
    /// API errors; PKI errors while issuing.
    ///
    /// With `with_signer`, the Secret also holds the CA's signing certificate alone and its
    /// key ([`SIGNING_CERT_KEY`], [`SIGNING_KEY_KEY`]): kube-controller-manager's CSR signer
    /// accepts exactly one certificate in `--cluster-signing-cert-file`, while the CA
    /// Secret's `tls.crt` holds two during a CA rotation.
    pub async fn ensure_kubeconfig(
        &self,
        name: &str,
        ca: &CaRef,
        wanted: &LeafSpec,
        user: &str,
        server_url: &str,
        with_signer: bool,
    ) -> Result<(OffsetDateTime, OffsetDateTime), ReconcileError> {
        let times = self
            .ensure_kubeconfig_inner(name, ca, wanted, user, server_url, with_signer)
            .await?;
        self.note_renewal(name, times.1);
        Ok(times)
    }

    async fn ensure_kubeconfig_inner(
        &self,
        name: &str,
        ca: &CaRef,
        wanted: &LeafSpec,
        user: &str,
        server_url: &str,
        with_signer: bool,
    ) -> Result<(OffsetDateTime, OffsetDateTime), ReconcileError> {
        let wanted_hash = wanted_hash(&[wanted, &self.policy, &user, &server_url, &with_signer]);
        if let Some(kept) = self.still_current(name, ca, wanted_hash) {
            return Ok(kept);
        }
        let loaded = self.load_ca(ca).await?;
        if let Some(secret) = self.fetch_leaf(name).await?
            && let Ok(text) = kubeconfig_from_secret(&secret)
            && let Some(current) = parse_kubeconfig(&text)
            && current.server == server_url
            && current.ca_pem == loaded.cert_pem()
            && (!with_signer || signer_of(&secret) == Some(signer(&loaded)))
            && let Some((not_after, renew_at)) = check_leaf(&current.client, &loaded, wanted, &self.policy, self.now)
        {
            self.remember(name, &secret, Some(self.verdict(ca, wanted_hash, renew_at)));
            return Ok((not_after, renew_at));
        }
        let client = loaded
            .issue_valid_for(wanted, self.now, KeyAlgorithm::default(), self.policy.validity)
            .map_err(Self::pki_error(name))?;
        let (not_after, renew_at) = self.times(name, &client.cert_pem)?;
        let config = kubeconfig(self.cluster, user, server_url, loaded.cert_pem(), &client);
        tracing::info!(
            secret = name,
            cluster = self.cluster,
            server = server_url,
            not_after = %rfc3339(not_after),
            "wrote kubeconfig"
        );
        let mut secret = Self::annotate(
            kubeconfig_secret(name, self.namespace, self.cluster, &config),
            not_after,
            Some(renew_at),
        );
        if with_signer {
            let pair = signer(&loaded);
            let data = secret.data.get_or_insert_with(Default::default);
            data.insert(SIGNING_CERT_KEY.into(), ByteString(pair.cert_pem.into_bytes()));
            data.insert(SIGNING_KEY_KEY.into(), ByteString(pair.key_pem.into_bytes()));
        }
        self.write(secret, Some(self.verdict(ca, wanted_hash, renew_at)))
            .await?;
        Ok((not_after, renew_at))
    }

    /// SHA-256 (hex) of the data of Secret `name`, read in full only when its version
    /// changed since it was last read. `Ok(None)` when it does not exist.
    ///
    /// # Errors
    /// API errors.
    pub async fn data_digest(&self, name: &str) -> Result<Option<String>, ReconcileError> {
        if let Some(v) = self.verified(name) {
            return Ok(Some(hex(&v.data)));
        }
        // A Secret capn has just written and the cache has not seen yet: its data is known.
        // (Were it deleted meanwhile, the deletion wakes the component, whose certificate
        // check reads it and issues it again, changing the digest.)
        if let Some(v) = self.ctx.verified.get(self.namespace, name)
            && v.written
            && self.cached_version(name).is_none()
        {
            return Ok(Some(hex(&v.data)));
        }
        Ok(self.fetch(name).await?.map(|secret| hex(&data_digest(&secret))))
    }
}

/// Reading and writing an authority's Secret as a whole, for a CA rotation
/// ([`crate::pki::rotation`]).
impl CertificateStore<'_> {
    /// The key pair in Secret `name`, read in full; `Ok(None)` when it does not exist.
    ///
    /// # Errors
    /// API errors; [`ReconcileError::Pki`] when the Secret lacks `tls.crt` or `tls.key`.
    pub async fn read_pair(&self, name: &str) -> Result<Option<KeyPairPem>, ReconcileError> {
        match self.fetch(name).await? {
            None => Ok(None),
            Some(secret) => key_pair_from_secret(&secret).map(Some).map_err(Self::pki_error(name)),
        }
    }

    /// Writes `pair` into Secret `name` (server-side apply; capn owns it afterwards).
    ///
    /// # Errors
    /// API errors.
    pub async fn write_pair(&self, name: &str, pair: &KeyPairPem) -> Result<(), ReconcileError> {
        let mut secret = tls_secret(name, self.namespace, self.cluster, pair);
        if let Ok(not_after) = crate::pki::not_after(&pair.cert_pem) {
            secret = Self::annotate(secret, not_after, None);
        }
        tracing::info!(secret = name, cluster = self.cluster, "wrote certificate authority");
        self.write(secret, None).await
    }

    /// Creates Secret `name` holding `pair` unless it exists; returns what it holds then.
    ///
    /// # Errors
    /// API errors; PKI errors reading an existing Secret.
    pub async fn create_pair(&self, name: &str, pair: &KeyPairPem) -> Result<KeyPairPem, ReconcileError> {
        if let Some(existing) = self.read_pair(name).await? {
            return Ok(existing);
        }
        self.create(tls_secret(name, self.namespace, self.cluster, pair))
            .await?;
        self.read_pair(name)
            .await?
            .ok_or_else(|| ReconcileError::CertificateAuthorityMissing(name.to_string()))
    }

    /// The `EncryptionConfiguration` in Secret `name` (`<c>-encryption`), read in full;
    /// `Ok(None)` when it does not exist.
    ///
    /// # Errors
    /// API errors; [`ReconcileError::Pki`] when the Secret lacks its configuration.
    pub async fn read_encryption_config(&self, name: &str) -> Result<Option<String>, ReconcileError> {
        match self.fetch(name).await? {
            None => Ok(None),
            Some(secret) => encryption_configuration_from_secret(&secret)
                .map(Some)
                .map_err(Self::pki_error(name)),
        }
    }

    /// Writes `config` into Secret `name` (server-side apply; capn owns it afterwards).
    ///
    /// # Errors
    /// API errors.
    pub async fn write_encryption_config(&self, name: &str, config: &str) -> Result<(), ReconcileError> {
        tracing::info!(
            secret = name,
            cluster = self.cluster,
            "wrote the encryption configuration"
        );
        self.write(encryption_secret(name, self.namespace, self.cluster, config), None)
            .await
    }

    /// Deletes Secret `name`; gone already is fine.
    ///
    /// # Errors
    /// API errors other than NotFound.
    pub async fn delete(&self, name: &str) -> Result<(), ReconcileError> {
        match self.api.delete(name, &Default::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether Secret `name` was created by capn for this control plane (owned by it), as
    /// opposed to supplied by the user; `None` when the cache has not seen it.
    pub fn owned_by_control_plane(&self, name: &str) -> Option<bool> {
        let cached = self.ctx.caches.secret(self.namespace, name)?;
        Some(cached.control_plane_owners.iter().any(|o| o.uid == self.owner.uid))
    }
}

/// Key of the CA's signing certificate (alone) in the controller-manager's kubeconfig Secret.
pub const SIGNING_CERT_KEY: &str = "ca-signing.crt";
/// Key of the CA's signing key in the controller-manager's kubeconfig Secret.
pub const SIGNING_KEY_KEY: &str = "ca-signing.key";

/// The CA's signing certificate alone (the first of its `tls.crt`) and its key.
fn signer(ca: &CertificateAuthority) -> KeyPairPem {
    KeyPairPem {
        cert_pem: crate::pki::rotation::pem_blocks(ca.cert_pem())
            .into_iter()
            .next()
            .unwrap_or_default(),
        key_pem: ca.pem().key_pem.clone(),
    }
}

/// The signing pair a Secret holds under [`SIGNING_CERT_KEY`] and [`SIGNING_KEY_KEY`].
fn signer_of(secret: &Secret) -> Option<KeyPairPem> {
    let data = secret.data.as_ref()?;
    let text = |key: &str| String::from_utf8(data.get(key)?.0.clone()).ok();
    Some(KeyPairPem {
        cert_pem: text(SIGNING_CERT_KEY)?,
        key_pem: text(SIGNING_KEY_KEY)?,
    })
}

/// The parts of a kubeconfig capn checks before rewriting it.
struct ParsedKubeconfig {
    server: String,
    ca_pem: String,
    client: KeyPairPem,
}

fn parse_kubeconfig(text: &str) -> Option<ParsedKubeconfig> {
    let v: serde_json::Value = serde_saphyr::from_str(text).ok()?;
    let s = |p: &str| v.pointer(p).and_then(|x| x.as_str()).map(str::to_string);
    let decode = |p: &str| {
        s(p).and_then(|b| STANDARD.decode(b).ok())
            .and_then(|b| String::from_utf8(b).ok())
    };
    Some(ParsedKubeconfig {
        server: s("/clusters/0/cluster/server")?,
        ca_pem: decode("/clusters/0/cluster/certificate-authority-data")?,
        client: KeyPairPem {
            cert_pem: decode("/users/0/user/client-certificate-data")?,
            key_pem: decode("/users/0/user/client-key-data")?,
        },
    })
}

/// The wait of a component whose CA is not there yet.
pub fn waiting_for_ca(name: &str) -> crate::controllers::round::Gate {
    crate::controllers::round::Gate::Wait {
        reason: Reason::WaitingForCertificates,
        message: format!("secret {name} (a certificate authority) does not exist yet"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_ca_of_a_thousand_control_planes_is_kept_and_the_least_recently_used_goes_first() {
        let kept = KeptAuthorities::default();
        let pem = KeyPairPem {
            cert_pem: "cert".into(),
            key_pem: "key".into(),
        };
        let names = ["demo-ca", "demo-etcd", "demo-proxy"];
        for cp in 0..1000 {
            for name in names {
                kept.put(&format!("ns-{cp}"), name, "1", pem.clone());
            }
        }
        // The old memo started again empty at 256: each component then read its CAs back.
        for cp in 0..1000 {
            for name in names {
                assert!(kept.get(&format!("ns-{cp}"), name, "1").is_some(), "ns-{cp}/{name}");
            }
        }
        assert!(
            kept.get("ns-0", "demo-ca", "2").is_none(),
            "another version is not the same CA"
        );
        // Full: the CA used longest ago makes room.
        for extra in 0..KEPT_AUTHORITIES - 3000 + 1 {
            kept.put("other", &format!("ca-{extra}"), "1", pem.clone());
        }
        assert!(kept.get("ns-0", "demo-ca", "1").is_none());
        assert!(kept.get("ns-999", "demo-proxy", "1").is_some());
    }
}
