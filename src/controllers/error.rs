//! The error of a reconcile, split into what retrying can fix and what it cannot.

use crate::apply::ApplyError;
use crate::pki::PkiError;

/// Why a reconcile did not finish.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The API server failed a read or write: transient, retried with backoff.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Apply(#[from] ApplyError),
    /// A certificate or key could not be parsed or made. Terminal when it concerns a
    /// user-supplied secret.
    #[error("{secret}: {source}")]
    Pki { secret: String, source: PkiError },
    /// A CA that existed is gone: capn never silently re-mints one (docs/design.md §6).
    #[error(
        "secret {0} (a certificate authority) is missing after the control plane was initialized and capn will not mint a new one: recover by restoring the Secret from a backup, or rotate it with the annotation controlplane.cluster.x-k8s.io/rotate-certificate-authority (docs/operations/troubleshooting.md \"CertificatesAvailable\")"
    )]
    CertificateAuthorityMissing(String),
    /// The encryption-at-rest key that existed is gone: a new one could not read what the old
    /// one encrypted, so capn never makes one in its place (docs/design.md §6).
    #[error(
        "secret {0} (the key the tenant's Secrets are encrypted with in its etcd) is missing and capn will not make a new one: the Secrets it encrypted could not be read with another; restore the Secret from where you keep your keys (docs/guide/certificates.md \"Encryption at rest\")"
    )]
    EncryptionKeyMissing(String),
    /// A setting of the spec is unusable; the message names the field.
    #[error("{0}")]
    InvalidSpec(String),
    #[error("object has no namespace")]
    NoNamespace,
    /// A tenant cannot be reached by any path capn has (`crate::reach`): transient.
    #[error(transparent)]
    Unreachable(#[from] crate::reach::ReachError),
}

impl ReconcileError {
    /// Short stable reason for conditions, Events and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Kube(_) => "APIError",
            Self::Apply(e) => e.reason(),
            Self::Pki { source, .. } => source.reason(),
            Self::CertificateAuthorityMissing(_) => "CertificateAuthorityMissing",
            Self::EncryptionKeyMissing(_) => "EncryptionKeyMissing",
            Self::InvalidSpec(_) => "InvalidSpec",
            Self::NoNamespace => "NoNamespace",
            Self::Unreachable(_) => "TenantUnreachable",
        }
    }
}
