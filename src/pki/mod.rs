//! PKI of a nested control plane: certificate authorities, leaf certificates, the
//! service-account key pair, kubeconfigs and their Cluster API Secret encoding.
//!
//! Everything here is pure data in, data out: no Kubernetes client, no logging, no clock (the
//! caller passes `now`). Randomness is used only where the rules demand it (new keys and serial
//! numbers). Private keys never appear in `Debug` output or error messages.
//!
//! The rules implemented come from `docs/reference.md` ("Identities", "Names clients dial
//! (SANs)", "Cluster API secrets"), which restates kubeadm's conventions, and from
//! `docs/design.md` §6 (Secret names and encoding).
//!
//! Layout:
//! - [`CertificateAuthority`], [`needs_reissue`], [`not_after`], [`fingerprint_sha256`] and
//!   [`service_account_key_pair`]: issuing and checking certificates (`cert.rs`);
//! - [`apiserver_leaf`], [`etcd_server_leaf`] and the other `*_leaf` functions: subjects, usages
//!   and SANs of every credential (`sans.rs`);
//! - [`kubeconfig`] and [`server_url`]: kubeconfig files (`kubeconfig.rs`);
//! - [`tls_secret`], [`kubeconfig_secret`], [`key_pair_from_secret`], [`SecretNames`]: the
//!   Secret encoding (`secret.rs`);
//! - [`encryption`]: the encryption-at-rest key and its `EncryptionConfiguration`.

mod cert;
pub mod encryption;
mod keys;
mod kubeconfig;
pub mod rotation;
mod sans;
mod secret;

use std::fmt;
use std::net::IpAddr;

pub use cert::{
    CertificateAuthority, RenewalPolicy, check_leaf, fingerprint_sha256, needs_reissue, not_after,
    service_account_key_pair, verify_service_account_key_pair,
};
pub use kubeconfig::{
    APISERVER_PORT, CONTROLLER_MANAGER_USER, admin_user, apiserver_service_host, kubeconfig, server_url,
};
pub use sans::{
    ApiServerSanInput, CLUSTER_CA_COMMON_NAME, ETCD_CA_COMMON_NAME, FRONT_PROXY_CA_COMMON_NAME, admin_leaf,
    apiserver_etcd_client_leaf, apiserver_kubelet_client_leaf, apiserver_leaf, controller_manager_leaf,
    etcd_healthcheck_client_leaf, etcd_member_hosts, etcd_server_leaf, front_proxy_client_leaf, service_cidr_first_ips,
};
pub use secret::{
    CLUSTER_NAME_LABEL, KUBECONFIG_KEY, SECRET_TYPE, SecretNames, TLS_CERT_KEY, TLS_KEY_KEY, key_pair_from_secret,
    kubeconfig_from_secret, kubeconfig_secret, tls_secret,
};

/// Validity of a certificate authority: 10 years (3650 days), as kubeadm
/// (`CACertificateValidityPeriod`) and docs/reference.md "Identities".
pub const CA_VALIDITY: time::Duration = time::Duration::days(3650);

/// Validity of a leaf certificate: 1 year (365 days), as kubeadm
/// (`CertificateValidityPeriod`) and docs/reference.md "Identities".
pub const LEAF_VALIDITY: time::Duration = time::Duration::days(365);

/// How far in the past `NotBefore` is placed, to tolerate clock skew between the issuer and
/// the peers checking the certificate: 5 minutes, as kubeadm (`CertificateBackdate`).
pub const NOT_BEFORE_BACKDATE: time::Duration = time::Duration::minutes(5);

/// Algorithm of a newly generated private key (docs/design.md §6: ECDSA P-256 by default, RSA as an
/// option). Keys that already exist (user-supplied CAs, existing Secrets) keep whatever
/// algorithm they have.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KeyAlgorithm {
    /// ECDSA on NIST P-256, signatures with SHA-256. The default.
    #[default]
    EcdsaP256,
    /// RSA with a 2048-bit modulus (public exponent 65537), signatures RSASSA-PKCS1-v1_5 with
    /// SHA-256; kubeadm's default key type. Generation is noticeably slower than ECDSA.
    Rsa2048,
}

/// Errors of the PKI functions. Messages name the offending object but never contain key
/// material. [`PkiError::reason`] gives a short stable CamelCase reason, suitable for a
/// condition's `reason` field.
#[derive(thiserror::Error, Debug)]
pub enum PkiError {
    /// A PEM document (certificate, private key or public key) could not be decoded or parsed.
    /// `what` says which document (for example "CA certificate", "private key").
    #[error("invalid PEM in {what}: {detail}")]
    InvalidPem {
        /// Which document was being read.
        what: String,
        /// Why it was rejected.
        detail: String,
    },
    /// A private key is of a type this module cannot sign with (encrypted keys, curves other
    /// than P-256/P-384, Ed448, ...).
    #[error("unsupported private key in {what}: {detail}")]
    UnsupportedKey {
        /// Which document was being read.
        what: String,
        /// Why it was rejected.
        detail: String,
    },
    /// A private key does not belong to the certificate (or public key) it is paired with.
    #[error("the private key of {what} does not match its certificate or public key")]
    KeyMismatch {
        /// Which pair was checked.
        what: String,
    },
    /// A certificate offered as a certificate authority lacks `BasicConstraints CA:true`
    /// (kubeadm refuses such CAs too).
    #[error("certificate {subject:?} is not a CA (BasicConstraints CA:true missing)")]
    NotCa {
        /// Subject of the offending certificate.
        subject: String,
    },
    /// Generating a key or signing a certificate failed (the random source failed, or rcgen
    /// rejected the parameters, for example a name that is not ASCII).
    #[error("certificate or key generation failed: {0}")]
    Generate(String),
    /// A service CIDR could not be parsed or has no room for a first host address.
    #[error("invalid service CIDR {cidr:?}: {detail}")]
    InvalidCidr {
        /// The CIDR as given.
        cidr: String,
        /// Why it was rejected.
        detail: String,
    },
    /// A subject alternative name (certSANs entry, endpoint host, DNS domain) is neither an IP
    /// address nor a valid DNS name (RFC 1123 subdomain, optionally with a leading `*.`).
    #[error("invalid subject alternative name {value:?}: {detail}")]
    InvalidSan {
        /// The value as given.
        value: String,
        /// Why it was rejected.
        detail: String,
    },
    /// An `EncryptionConfiguration` (in `<c>-encryption`) capn cannot read its keys from.
    #[error("invalid encryption configuration: {0}")]
    InvalidEncryptionConfiguration(String),
    /// A Secret lacks a data key this module needs (`tls.crt`, `tls.key` or `value`), or the
    /// value is empty.
    #[error("secret {secret:?} has no {key:?} data")]
    MissingKey {
        /// Name of the Secret.
        secret: String,
        /// The missing data key.
        key: String,
    },
}

impl PkiError {
    /// A short, stable CamelCase reason for this error, for condition reasons and metrics
    /// labels. The values never change once released.
    pub fn reason(&self) -> &'static str {
        match self {
            PkiError::InvalidPem { .. } => "InvalidPEM",
            PkiError::UnsupportedKey { .. } => "UnsupportedKey",
            PkiError::KeyMismatch { .. } => "KeyMismatch",
            PkiError::NotCa { .. } => "NotCA",
            PkiError::Generate(_) => "GenerationFailed",
            PkiError::InvalidCidr { .. } => "InvalidServiceCIDR",
            PkiError::InvalidSan { .. } => "InvalidSAN",
            PkiError::MissingKey { .. } => "MissingSecretKey",
            PkiError::InvalidEncryptionConfiguration(_) => "InvalidEncryptionConfiguration",
        }
    }

    pub(crate) fn invalid_pem(what: &str, detail: impl fmt::Display) -> Self {
        PkiError::InvalidPem {
            what: what.to_string(),
            detail: detail.to_string(),
        }
    }
}

/// A PEM-encoded certificate and its PEM-encoded private key, as stored in a Secret's
/// `tls.crt` and `tls.key`.
///
/// For the service-account pair ([`service_account_key_pair`]) `cert_pem` holds the public key
/// (`-----BEGIN PUBLIC KEY-----`) instead of a certificate (docs/reference.md "Cluster API
/// secrets"). New private keys are PKCS#8 (`-----BEGIN PRIVATE KEY-----`).
///
/// `Debug` never prints the private key.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyPairPem {
    /// The certificate (or, for the service-account pair, the public key), PEM.
    pub cert_pem: String,
    /// The private key, PEM. Secret: never log it.
    pub key_pem: String,
}

impl fmt::Debug for KeyPairPem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fingerprint = fingerprint_sha256(&self.cert_pem).ok();
        f.debug_struct("KeyPairPem")
            .field("cert_sha256", &fingerprint)
            .field("cert_pem_len", &self.cert_pem.len())
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// What a leaf certificate must say: subject, extended key usages and subject alternative
/// names. Built by the `*_leaf` functions from the rules in docs/reference.md, consumed by
/// [`CertificateAuthority::issue`] and compared by [`needs_reissue`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeafSpec {
    /// Subject common name (CN): the identity (user name) Kubernetes and etcd see.
    pub common_name: String,
    /// Subject organization (O): the group, for example `system:masters`.
    pub organization: Option<String>,
    /// Whether the certificate may serve TLS (EKU serverAuth).
    pub server: bool,
    /// Whether the certificate may authenticate a TLS client (EKU clientAuth).
    pub client: bool,
    /// DNS subject alternative names, in the order they are written (order carries no
    /// meaning).
    pub dns_names: Vec<String>,
    /// IP subject alternative names.
    pub ip_addresses: Vec<IpAddr>,
}

#[cfg(test)]
mod tests;
