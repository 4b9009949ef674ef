//! Certificates as Secrets (design §6): look up first, create only on NotFound, re-issue a
//! leaf only when [`needs_reissue`] says so, never mint a CA because a read failed.
//! Private keys are never logged, put in Events or in status.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, Patch, PatchParams};
use time::OffsetDateTime;

use super::ReconcileError;
use crate::apply::FIELD_MANAGER;
use crate::pki::{
    CertificateAuthority, KeyAlgorithm, KeyPairPem, LeafSpec, PkiError, key_pair_from_secret, kubeconfig,
    kubeconfig_from_secret, kubeconfig_secret, needs_reissue, service_account_key_pair, tls_secret,
};

/// What a CA lookup found.
pub enum CaLookup {
    Found(CertificateAuthority),
    /// The Secret does not exist (a definite NotFound from the API server).
    Missing,
}

/// Reads and writes the certificate Secrets of one cluster, in its namespace.
pub struct CertificateStore<'a> {
    api: Api<Secret>,
    namespace: &'a str,
    cluster: &'a str,
    /// Owner of the Secrets capn creates: the NestedControlPlane.
    owner: &'a OwnerReference,
    now: OffsetDateTime,
}

impl<'a> CertificateStore<'a> {
    pub fn new(
        client: kube::Client,
        namespace: &'a str,
        cluster: &'a str,
        owner: &'a OwnerReference,
        now: OffsetDateTime,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace,
            cluster,
            owner,
            now,
        }
    }

    fn pki_error(secret: &str) -> impl Fn(PkiError) -> ReconcileError + '_ {
        move |source| ReconcileError::Pki {
            secret: secret.to_string(),
            source,
        }
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

    async fn write(&self, secret: Secret) -> Result<(), ReconcileError> {
        let secret = self.own(secret);
        let name = secret.metadata.name.clone().unwrap_or_default();
        let params = PatchParams::apply(FIELD_MANAGER).force();
        self.api.patch(&name, &params, &Patch::Apply(&secret)).await?;
        Ok(())
    }

    /// Creates a Secret only if none exists (a concurrent creator wins; we then read theirs).
    async fn create(&self, secret: Secret) -> Result<bool, ReconcileError> {
        let secret = self.own(secret);
        match self.api.create(&Default::default(), &secret).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Looks up the CA in Secret `name`. A read error is returned as an error (never as
    /// `Missing`), so a caller can never mint a CA because the API hiccupped.
    ///
    /// # Errors
    /// API errors other than NotFound; [`ReconcileError::Pki`] when the Secret exists but
    /// does not hold a usable CA (it is then left untouched).
    pub async fn lookup_ca(&self, name: &str) -> Result<CaLookup, ReconcileError> {
        match self.api.get_opt(name).await? {
            None => Ok(CaLookup::Missing),
            Some(secret) => {
                let pair = key_pair_from_secret(&secret).map_err(Self::pki_error(name))?;
                let ca =
                    CertificateAuthority::from_pem(&pair.cert_pem, &pair.key_pem).map_err(Self::pki_error(name))?;
                Ok(CaLookup::Found(ca))
            }
        }
    }

    /// The CA in Secret `name`, created (CN `common_name`, 10 years) only when the Secret
    /// does not exist and `may_create` is true. A user-supplied CA is used as-is.
    ///
    /// # Errors
    /// [`ReconcileError::CertificateAuthorityMissing`] when the Secret is missing and
    /// `may_create` is false (the control plane was initialized with another CA); API
    /// and PKI errors as [`Self::lookup_ca`].
    pub async fn ensure_ca(
        &self,
        name: &str,
        common_name: &str,
        may_create: bool,
    ) -> Result<CertificateAuthority, ReconcileError> {
        if let CaLookup::Found(ca) = self.lookup_ca(name).await? {
            return Ok(ca);
        }
        if !may_create {
            return Err(ReconcileError::CertificateAuthorityMissing(name.to_string()));
        }
        let ca = CertificateAuthority::generate(common_name, self.now, KeyAlgorithm::default())
            .map_err(Self::pki_error(name))?;
        tracing::info!(secret = name, cluster = self.cluster, "created certificate authority");
        if self
            .create(tls_secret(name, self.namespace, self.cluster, ca.pem()))
            .await?
        {
            return Ok(ca);
        }
        // Someone else created it meanwhile: theirs is the CA.
        match self.lookup_ca(name).await? {
            CaLookup::Found(ca) => Ok(ca),
            CaLookup::Missing => Err(ReconcileError::CertificateAuthorityMissing(name.to_string())),
        }
    }

    /// The service-account key pair in Secret `name`, created only when it does not exist
    /// and `may_create` is true (one pair, never two: reference.md).
    ///
    /// # Errors
    /// As [`Self::ensure_ca`].
    pub async fn ensure_service_account_key(&self, name: &str, may_create: bool) -> Result<(), ReconcileError> {
        if self.api.get_opt(name).await?.is_some() {
            return Ok(());
        }
        if !may_create {
            return Err(ReconcileError::CertificateAuthorityMissing(name.to_string()));
        }
        let pair = service_account_key_pair(KeyAlgorithm::default()).map_err(Self::pki_error(name))?;
        self.create(tls_secret(name, self.namespace, self.cluster, &pair))
            .await?;
        Ok(())
    }

    /// Ensures Secret `name` holds a leaf certificate for `wanted` signed by `ca`: kept when
    /// [`needs_reissue`] is false, (re-)issued otherwise. Returns its expiry.
    ///
    /// # Errors
    /// API errors; PKI errors while issuing.
    pub async fn ensure_leaf(
        &self,
        name: &str,
        ca: &CertificateAuthority,
        wanted: &LeafSpec,
    ) -> Result<OffsetDateTime, ReconcileError> {
        if let Some(secret) = self.api.get_opt(name).await?
            && let Ok(existing) = key_pair_from_secret(&secret)
            && !needs_reissue(&existing, ca, wanted, self.now)
        {
            return crate::pki::not_after(&existing.cert_pem).map_err(Self::pki_error(name));
        }
        let pair = ca
            .issue(wanted, self.now, KeyAlgorithm::default())
            .map_err(Self::pki_error(name))?;
        tracing::info!(secret = name, cluster = self.cluster, "issued certificate");
        self.write(tls_secret(name, self.namespace, self.cluster, &pair))
            .await?;
        crate::pki::not_after(&pair.cert_pem).map_err(Self::pki_error(name))
    }

    /// Ensures Secret `name` holds a kubeconfig for `user` at `server_url` whose client
    /// certificate (for `wanted`) and CA are current; rewritten otherwise. Returns the
    /// client certificate's expiry.
    ///
    /// # Errors
    /// API errors; PKI errors while issuing.
    pub async fn ensure_kubeconfig(
        &self,
        name: &str,
        ca: &CertificateAuthority,
        wanted: &LeafSpec,
        user: &str,
        server_url: &str,
    ) -> Result<OffsetDateTime, ReconcileError> {
        if let Some(secret) = self.api.get_opt(name).await?
            && let Ok(text) = kubeconfig_from_secret(&secret)
            && let Some(current) = parse_kubeconfig(&text)
            && current.server == server_url
            && current.ca_pem == ca.cert_pem()
            && !needs_reissue(&current.client, ca, wanted, self.now)
        {
            return crate::pki::not_after(&current.client.cert_pem).map_err(Self::pki_error(name));
        }
        let client = ca
            .issue(wanted, self.now, KeyAlgorithm::default())
            .map_err(Self::pki_error(name))?;
        let config = kubeconfig(self.cluster, user, server_url, ca.cert_pem(), &client);
        tracing::info!(
            secret = name,
            cluster = self.cluster,
            server = server_url,
            "wrote kubeconfig"
        );
        self.write(kubeconfig_secret(name, self.namespace, self.cluster, &config))
            .await?;
        crate::pki::not_after(&client.cert_pem).map_err(Self::pki_error(name))
    }
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

impl CertificateStore<'_> {
    /// The CA in Secret `name`, which the NestedControlPlane controller creates. `Ok(None)`
    /// while it does not exist yet (the component waits).
    ///
    /// # Errors
    /// As [`Self::lookup_ca`].
    pub async fn require_ca(&self, name: &str) -> Result<Option<CertificateAuthority>, ReconcileError> {
        Ok(match self.lookup_ca(name).await? {
            CaLookup::Found(ca) => Some(ca),
            CaLookup::Missing => None,
        })
    }
}

/// The wait of a component whose CA is not there yet.
pub fn waiting_for_ca(name: &str) -> super::component::Gate {
    super::component::Gate::Wait {
        reason: "WaitingForCertificates",
        message: format!("secret {name} (a certificate authority) does not exist yet"),
    }
}
