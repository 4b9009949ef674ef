//! Who is calling: a tenant apiserver, known by the client certificate its cluster CA
//! signed (`--kubelet-client-certificate`, the `apiserver-kubelet-client` identity of
//! docs/reference.md). The kubelet authenticates its apiserver the same way (its
//! `--client-ca-file`); capn serves many tenants on one port, so the CA that verifies the
//! certificate also says which tenant is calling, and with it which pods the call may name.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};

use crate::syncer::names::ControlPlaneRef;

/// A CA certificate that cannot verify clients.
#[derive(Debug, thiserror::Error)]
#[error("the cluster CA of {control_plane} cannot verify client certificates: {reason}")]
pub struct BadAuthority {
    /// `<namespace>/<name>` of the control plane.
    pub control_plane: String,
    /// What is wrong with its `tls.crt`.
    pub reason: String,
}

/// One admitted tenant: its CA certificate as admitted (PEM bytes) and their verifier.
#[derive(Debug)]
struct Admitted {
    ca_pem: Vec<u8>,
    verifier: Arc<dyn ClientCertVerifier>,
}

/// The tenants whose apiservers may call, each with a verifier of its cluster CA.
#[derive(Debug)]
pub struct Tenants {
    provider: Arc<CryptoProvider>,
    admitted: RwLock<HashMap<ControlPlaneRef, Admitted>>,
}

impl Default for Tenants {
    fn default() -> Self {
        Self {
            provider: Arc::new(rustls::crypto::ring::default_provider()),
            admitted: RwLock::default(),
        }
    }
}

impl Tenants {
    /// Admits the apiserver of `control_plane`, whose cluster CA certificate is `ca_pem`
    /// (PEM; with a CA being rotated, every certificate in it is trusted). Replaces what was
    /// admitted for it before.
    ///
    /// # Errors
    /// [`BadAuthority`] when `ca_pem` holds no certificate a verifier accepts.
    pub fn admit(&self, control_plane: &ControlPlaneRef, ca_pem: &str) -> Result<(), BadAuthority> {
        let bad = |reason: String| BadAuthority {
            control_plane: control_plane.key(),
            reason,
        };
        let mut roots = RootCertStore::empty();
        for block in x509_parser::pem::Pem::iter_from_buffer(ca_pem.as_bytes()) {
            let block = block.map_err(|e| bad(e.to_string()))?;
            roots
                .add(CertificateDer::from(block.contents))
                .map_err(|e| bad(e.to_string()))?;
        }
        if roots.is_empty() {
            return Err(bad("no certificate in tls.crt".to_owned()));
        }
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), self.provider.clone())
            .build()
            .map_err(|e| bad(e.to_string()))?;
        let admitted = Admitted {
            ca_pem: ca_pem.as_bytes().to_vec(),
            verifier,
        };
        self.write().insert(control_plane.clone(), admitted);
        Ok(())
    }

    /// Whether `control_plane` is admitted with the CA certificate `ca_pem` already.
    pub fn admitted_with(&self, control_plane: &ControlPlaneRef, ca_pem: &str) -> bool {
        self.read()
            .get(control_plane)
            .is_some_and(|a| a.ca_pem == ca_pem.as_bytes())
    }

    /// Admits `control_plane`'s apiserver no more.
    pub fn remove(&self, control_plane: &ControlPlaneRef) {
        self.write().remove(control_plane);
    }

    /// The tenant whose cluster CA signed `end_entity` (with `intermediates`), valid at
    /// `now`; `None` when no admitted CA did.
    pub fn tenant_of(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Option<ControlPlaneRef> {
        self.read()
            .iter()
            .find(|(_, a)| a.verifier.verify_client_cert(end_entity, intermediates, now).is_ok())
            .map(|(control_plane, _)| control_plane.clone())
    }

    /// [`Self::tenant_of`] a presented chain (end entity first), now.
    pub fn tenant_of_chain(&self, chain: &[CertificateDer<'_>]) -> Option<ControlPlaneRef> {
        let (end_entity, intermediates) = chain.split_first()?;
        self.tenant_of(end_entity, intermediates, UnixTime::now())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<ControlPlaneRef, Admitted>> {
        self.admitted.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<ControlPlaneRef, Admitted>> {
        self.admitted.write().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The TLS handshake's check: a client certificate is required, and accepted when an
/// admitted tenant's CA signed it.
#[derive(Debug)]
pub(super) struct TenantClients(pub Arc<Tenants>);

impl ClientCertVerifier for TenantClients {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        match self.0.tenant_of(end_entity, intermediates, now) {
            Some(_) => Ok(ClientCertVerified::assertion()),
            None => Err(rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer)),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.provider.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::{CertificateAuthority, KeyAlgorithm, apiserver_kubelet_client_leaf};

    fn der(pem: &str) -> CertificateDer<'static> {
        let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
        CertificateDer::from(block.contents)
    }

    #[test]
    fn the_ca_that_signed_the_client_certificate_names_the_tenant() {
        let now = time::OffsetDateTime::now_utc();
        // Two tenants whose CAs share a subject: the signature, not the name, tells them apart.
        let ca_a = CertificateAuthority::generate("kubernetes", now, KeyAlgorithm::EcdsaP256).unwrap();
        let ca_b = CertificateAuthority::generate("kubernetes", now, KeyAlgorithm::EcdsaP256).unwrap();
        let stranger = CertificateAuthority::generate("kubernetes", now, KeyAlgorithm::EcdsaP256).unwrap();
        let (a, b) = (ControlPlaneRef::new("teams", "a"), ControlPlaneRef::new("teams", "b"));
        let tenants = Tenants::default();
        tenants.admit(&a, ca_a.cert_pem()).unwrap();
        tenants.admit(&b, ca_b.cert_pem()).unwrap();
        let client = |ca: &CertificateAuthority| {
            der(&ca
                .issue(&apiserver_kubelet_client_leaf(), now, KeyAlgorithm::EcdsaP256)
                .unwrap()
                .cert_pem)
        };
        assert_eq!(tenants.tenant_of_chain(&[client(&ca_a)]), Some(a.clone()));
        assert_eq!(tenants.tenant_of_chain(&[client(&ca_b)]), Some(b.clone()));
        assert_eq!(
            tenants.tenant_of_chain(&[client(&stranger)]),
            None,
            "another CA's client"
        );
        assert_eq!(tenants.tenant_of_chain(&[]), None, "no certificate");
        // The CA's own certificate (public, in every kubeconfig) is not a client identity.
        assert_eq!(tenants.tenant_of_chain(&[der(ca_a.cert_pem())]), None);
        // Removed, the tenant is refused; admitted again, it is known.
        tenants.remove(&a);
        assert_eq!(tenants.tenant_of_chain(&[client(&ca_a)]), None);
        assert!(!tenants.admitted_with(&a, ca_a.cert_pem()));
        tenants.admit(&a, ca_a.cert_pem()).unwrap();
        assert!(tenants.admitted_with(&a, ca_a.cert_pem()));
        // A Secret without a certificate is an error, not a tenant that admits anyone.
        assert!(tenants.admit(&a, "not a certificate").is_err());
    }
}
