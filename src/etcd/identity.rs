//! capn's own client certificate for a tenant's etcd.
//!
//! Minted in memory from the tenant's etcd CA (never written to a Secret, so it cannot leak
//! through the super cluster's API), valid for [`CLIENT_VALIDITY`] and replaced once a third of
//! that remains, or at once when the CA changes (a CA rotation, a restored CA Secret).
//!
//! Subject: CN [`CLIENT_COMMON_NAME`], no organization; EKU clientAuth only.
//!
//! Privilege: etcd authorizes by the certificate's CN only when etcd auth is enabled
//! (`etcdctl auth enable`; the `stable` channel does not enable it). Without auth, every
//! client certificate the etcd CA signed has full access, capn's included; that is the least
//! privilege etcd allows. With auth on, the calls capn makes (MemberList/Add/Promote/Remove,
//! Status, Snapshot) need the `root` role (etcd: "Authentication Guide", admin operations), so
//! an operator who enables auth must grant `root` to the user `capn-etcd-client`.

use time::OffsetDateTime;

use crate::pki::{CertificateAuthority, KeyAlgorithm, KeyPairPem, LeafSpec, PkiError, fingerprint_sha256};

/// The CN of capn's etcd client certificate: the etcd user name when etcd auth is on.
pub const CLIENT_COMMON_NAME: &str = "capn-etcd-client";

/// Lifetime of capn's etcd client certificate: one hour. Short, because it is never stored
/// and costs one signature to replace.
pub const CLIENT_VALIDITY: time::Duration = time::Duration::hours(1);

/// What capn's etcd client certificate says (CN, clientAuth; no SANs: a client needs none).
pub fn client_leaf() -> LeafSpec {
    LeafSpec {
        common_name: CLIENT_COMMON_NAME.to_string(),
        organization: None,
        server: false,
        client: true,
        dns_names: Vec::new(),
        ip_addresses: Vec::new(),
    }
}

/// capn's client certificate and key for one tenant etcd, and the CA bundle it trusts for the
/// members' serving certificates. `Debug` never prints the key.
#[derive(Clone, Debug)]
pub struct ClientIdentity {
    /// Certificate and private key, PEM. Secret: never log it.
    pub pair: KeyPairPem,
    /// The etcd CA's `tls.crt` as stored: during a CA rotation it holds the old and the new CA,
    /// and members may serve with a certificate of either.
    pub trust_pem: String,
    /// When the certificate expires.
    pub not_after: OffsetDateTime,
    /// When it is replaced: a third of its lifetime before [`Self::not_after`].
    pub renew_at: OffsetDateTime,
    /// SHA-256 of the CA certificate that signed it, to notice a changed CA.
    pub ca_fingerprint: String,
}

impl ClientIdentity {
    /// Issues a new identity from `ca` at `now`.
    ///
    /// # Errors
    /// [`PkiError`] when signing fails or the CA certificate does not parse.
    pub fn issue(ca: &CertificateAuthority, now: OffsetDateTime) -> Result<Self, PkiError> {
        let pair = ca.issue_valid_for(&client_leaf(), now, KeyAlgorithm::EcdsaP256, CLIENT_VALIDITY)?;
        let not_after = now + CLIENT_VALIDITY;
        Ok(Self {
            pair,
            trust_pem: ca.cert_pem().to_string(),
            not_after,
            renew_at: not_after - CLIENT_VALIDITY / 3,
            ca_fingerprint: fingerprint_sha256(ca.cert_pem())?,
        })
    }

    /// Whether this identity must be replaced at `now` for CA `ca`: due for renewal, or issued
    /// by another CA (or another trust bundle).
    pub fn stale(&self, ca: &CertificateAuthority, now: OffsetDateTime) -> bool {
        now >= self.renew_at
            || self.trust_pem != ca.cert_pem()
            || fingerprint_sha256(ca.cert_pem()).ok().as_deref() != Some(self.ca_fingerprint.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_identity_is_short_lived_client_only_and_renewed_early() {
        let now = OffsetDateTime::now_utc();
        let ca = CertificateAuthority::generate("etcd-ca", now, KeyAlgorithm::EcdsaP256).unwrap();
        let id = ClientIdentity::issue(&ca, now).unwrap();
        let (_, cert) = x509_parser::pem::parse_x509_pem(id.pair.cert_pem.as_bytes()).unwrap();
        let cert = cert.parse_x509().unwrap();
        assert_eq!(
            cert.subject().iter_common_name().next().unwrap().as_str().unwrap(),
            "capn-etcd-client"
        );
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && !eku.server_auth);
        let lifetime = cert.validity().not_after.timestamp() - now.unix_timestamp();
        assert!((3590..=3610).contains(&lifetime), "about one hour, got {lifetime} s");
        assert!(!id.stale(&ca, now));
        assert!(
            id.stale(&ca, now + time::Duration::minutes(41)),
            "renewed with 19 minutes left"
        );
        let other = CertificateAuthority::generate("etcd-ca", now, KeyAlgorithm::EcdsaP256).unwrap();
        assert!(id.stale(&other, now), "another CA replaces it at once");
    }
}
