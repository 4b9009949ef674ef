//! Certificate authorities, leaf issuance and the checks that decide re-issuance.

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::FromDer;
use x509_parser::x509::SubjectPublicKeyInfo;

use super::keys::{generate_key, key_matches_spki, parse_private_key_pem, random_serial};
use super::{CA_VALIDITY, KeyAlgorithm, KeyPairPem, LEAF_VALIDITY, LeafSpec, NOT_BEFORE_BACKDATE, PkiError};

/// A certificate authority able to sign leaf certificates: the CA certificate, its private key
/// and both as PEM.
///
/// Either generated ([`CertificateAuthority::generate`]) or loaded from an existing Secret
/// ([`CertificateAuthority::from_pem`]); a loaded CA is used as-is, never modified or rotated
/// (docs/design.md §6). `Debug` prints the subject and fingerprint, never the key.
pub struct CertificateAuthority {
    // Boxed: the signing key is large, and the CA is passed around by value.
    issuer: Box<Issuer<'static, KeyPair>>,
    cert_der: Vec<u8>,
    pem: KeyPairPem,
}

impl fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let subject = parse_der_cert(&self.cert_der)
            .map(|c| c.subject().to_string())
            .unwrap_or_default();
        f.debug_struct("CertificateAuthority")
            .field("subject", &subject)
            .field("cert_sha256", &hex(&Sha256::digest(&self.cert_der)))
            .field("key", &"<redacted>")
            .finish()
    }
}

impl CertificateAuthority {
    /// Generates a new self-signed CA with subject `CN=<common_name>` (docs/reference.md
    /// "Identities": `kubernetes`, `etcd-ca`, `front-proxy-ca`).
    ///
    /// Validity: `NotBefore = now - 5 min` ([`NOT_BEFORE_BACKDATE`]), `NotAfter = now + 10
    /// years` ([`CA_VALIDITY`]). Extensions: BasicConstraints CA:true (critical, no path length
    /// limit), KeyUsage keyCertSign + cRLSign + digitalSignature, SubjectKeyIdentifier. Random
    /// positive serial. Rules: kubeadm, docs/reference.md "Identities".
    ///
    /// Errors: [`PkiError::Generate`] when key generation or signing fails (for example a
    /// common name rcgen cannot encode).
    pub fn generate(common_name: &str, now: OffsetDateTime, alg: KeyAlgorithm) -> Result<Self, PkiError> {
        let key = generate_key(alg)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = distinguished_name(common_name, None);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
        ];
        params.serial_number = Some(random_serial()?);
        params.not_before = now - NOT_BEFORE_BACKDATE;
        params.not_after = now + CA_VALIDITY;
        let cert = params
            .self_signed(&key)
            .map_err(|e| PkiError::Generate(format!("CA {common_name:?}: {e}")))?;
        let pem = KeyPairPem {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        };
        let cert_der = cert.der().to_vec();
        let issuer = Issuer::from_ca_cert_der(&cert_der.as_slice().into(), key)
            .map_err(|e| PkiError::Generate(format!("CA {common_name:?}: {e}")))?;
        Ok(CertificateAuthority {
            issuer: Box::new(issuer),
            cert_der,
            pem,
        })
    }

    /// Loads an existing CA from PEM (a Secret's `tls.crt` and `tls.key`). The certificate is
    /// the first `CERTIFICATE` block of `cert_pem`; the key may be PKCS#8, PKCS#1 (`RSA PRIVATE
    /// KEY`) or SEC1 (`EC PRIVATE KEY`). The PEM strings are kept verbatim: user-supplied CAs are
    /// used as-is (docs/design.md §6), whatever their algorithm or remaining validity.
    ///
    /// Errors: [`PkiError::InvalidPem`] when either document does not parse;
    /// [`PkiError::NotCa`] when the certificate lacks BasicConstraints CA:true (kubeadm's rule);
    /// [`PkiError::UnsupportedKey`] for keys ring cannot sign with;
    /// [`PkiError::KeyMismatch`] when the key is not the certificate's.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, PkiError> {
        let cert_der = first_certificate_der(cert_pem, "CA certificate")?;
        let cert = parse_der_cert(&cert_der).map_err(|e| PkiError::invalid_pem("CA certificate", e))?;
        let is_ca = cert
            .basic_constraints()
            .map_err(|e| PkiError::invalid_pem("CA certificate", e))?
            .is_some_and(|bc| bc.value.ca);
        if !is_ca {
            return Err(PkiError::NotCa {
                subject: cert.subject().to_string(),
            });
        }
        let key = parse_private_key_pem(key_pem, "CA private key")?;
        if !key_matches_spki(&key, cert.public_key()) {
            return Err(PkiError::KeyMismatch {
                what: format!("CA {}", cert.subject()),
            });
        }
        let issuer = Issuer::from_ca_cert_der(&cert_der.as_slice().into(), key)
            .map_err(|e| PkiError::invalid_pem("CA certificate", e))?;
        Ok(CertificateAuthority {
            issuer: Box::new(issuer),
            cert_der,
            pem: KeyPairPem {
                cert_pem: cert_pem.to_string(),
                key_pem: key_pem.to_string(),
            },
        })
    }

    /// The CA certificate and key as PEM, exactly as generated or loaded (what goes into the
    /// CA's Secret).
    pub fn pem(&self) -> &KeyPairPem {
        &self.pem
    }

    /// The CA certificate as PEM (what clients trust: kubeconfig `certificate-authority-data`,
    /// `--client-ca-file`, ...).
    pub fn cert_pem(&self) -> &str {
        &self.pem.cert_pem
    }

    /// The CA certificate as DER.
    pub fn cert_der(&self) -> &[u8] {
        &self.cert_der
    }

    /// Issues a leaf certificate with a new private key of algorithm `alg`.
    ///
    /// Subject `CN=<common_name>[, O=<organization>]`; EKU serverAuth and/or clientAuth from
    /// `leaf.server`/`leaf.client`; KeyUsage digitalSignature (plus keyEncipherment for RSA
    /// keys, as kubeadm); BasicConstraints CA:false; SubjectKeyIdentifier and
    /// AuthorityKeyIdentifier; the SANs of `leaf`. Validity: `NotBefore = now - 5 min` (never
    /// copied from the CA), `NotAfter = now + 1 year` ([`LEAF_VALIDITY`]), not clipped to the
    /// CA's expiry. Random positive serial. Rules: kubeadm, docs/reference.md "Identities".
    ///
    /// Errors: [`PkiError::Generate`] when key generation or signing fails, for example a DNS
    /// name that is not ASCII.
    pub fn issue(&self, leaf: &LeafSpec, now: OffsetDateTime, alg: KeyAlgorithm) -> Result<KeyPairPem, PkiError> {
        self.issue_valid_for(leaf, now, alg, LEAF_VALIDITY)
    }

    /// [`Self::issue`] with a lifetime of `validity` instead of one year (`NotAfter = now +
    /// validity`): the `--certificate-validity` of `capn run`, or a control plane's
    /// `certificateValidityPeriod`.
    ///
    /// Errors: as [`Self::issue`].
    pub fn issue_valid_for(
        &self,
        leaf: &LeafSpec,
        now: OffsetDateTime,
        alg: KeyAlgorithm,
        validity: time::Duration,
    ) -> Result<KeyPairPem, PkiError> {
        let key = generate_key(alg)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = distinguished_name(&leaf.common_name, leaf.organization.as_deref());
        params.is_ca = IsCa::ExplicitNoCa;
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        if alg == KeyAlgorithm::Rsa2048 {
            params.key_usages.push(KeyUsagePurpose::KeyEncipherment);
        }
        if leaf.server {
            params.extended_key_usages.push(ExtendedKeyUsagePurpose::ServerAuth);
        }
        if leaf.client {
            params.extended_key_usages.push(ExtendedKeyUsagePurpose::ClientAuth);
        }
        let mut sans = Vec::with_capacity(leaf.dns_names.len() + leaf.ip_addresses.len());
        for name in &leaf.dns_names {
            let ia5 = name
                .clone()
                .try_into()
                .map_err(|e| PkiError::Generate(format!("DNS name {name:?} of {:?}: {e}", leaf.common_name)))?;
            sans.push(SanType::DnsName(ia5));
        }
        sans.extend(leaf.ip_addresses.iter().map(|ip| SanType::IpAddress(*ip)));
        params.subject_alt_names = sans;
        params.serial_number = Some(random_serial()?);
        params.not_before = now - NOT_BEFORE_BACKDATE;
        params.not_after = now + validity;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| PkiError::Generate(format!("certificate {:?}: {e}", leaf.common_name)))?;
        Ok(KeyPairPem {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Whether `cert` was signed by this CA: its issuer name is this CA's subject and its
    /// signature verifies with this CA's public key.
    fn signed(&self, cert: &X509Certificate<'_>) -> bool {
        let Ok(ca) = parse_der_cert(&self.cert_der) else {
            return false;
        };
        cert.issuer().as_raw() == ca.subject().as_raw() && cert.verify_signature(Some(ca.public_key())).is_ok()
    }
}

/// Whether an existing leaf certificate must be re-issued for `wanted`, under the default
/// [`RenewalPolicy`]. See [`check_leaf`] for the rules.
pub fn needs_reissue(existing: &KeyPairPem, ca: &CertificateAuthority, wanted: &LeafSpec, now: OffsetDateTime) -> bool {
    check_leaf(existing, ca, wanted, &RenewalPolicy::default(), now).is_none()
}

/// Checks an existing leaf certificate against `wanted`: `None` when it must be re-issued,
/// else its `NotAfter` and the time `policy` renews it ([`RenewalPolicy::renew_at`]).
/// It must be re-issued when any of:
/// - the certificate or the private key does not parse, or the key is not the certificate's;
/// - it is not signed by `ca` (another CA, for example after the CA Secret was replaced, or
///   during a CA rotation once the new CA signs);
/// - it is not yet valid at `now`, or `now` is at or past its renewal time;
/// - its CN, O, serverAuth/clientAuth usages or SAN sets differ from `wanted` (SAN order and
///   DNS letter case ignored).
///
/// The key algorithm is not compared: a key of another algorithm stays valid.
pub fn check_leaf(
    existing: &KeyPairPem,
    ca: &CertificateAuthority,
    wanted: &LeafSpec,
    policy: &RenewalPolicy,
    now: OffsetDateTime,
) -> Option<(OffsetDateTime, OffsetDateTime)> {
    let der = first_certificate_der(&existing.cert_pem, "certificate").ok()?;
    let cert = parse_der_cert(&der).ok()?;
    match parse_private_key_pem(&existing.key_pem, "private key") {
        Ok(key) if key_matches_spki(&key, cert.public_key()) => {}
        _ => return None,
    }
    if !ca.signed(&cert) {
        return None;
    }
    let validity = cert.validity();
    let not_before = OffsetDateTime::from_unix_timestamp(validity.not_before.timestamp()).ok()?;
    let not_after = OffsetDateTime::from_unix_timestamp(validity.not_after.timestamp()).ok()?;
    let renew_at = policy.renew_at(not_before, not_after);
    if now < not_before || now >= renew_at || !subject_and_usages_match(&cert, wanted) {
        return None;
    }
    Some((not_after, renew_at))
}

/// How long new leaf certificates are valid and when they are renewed.
///
/// Defaults: one year of validity (kubeadm `certificateValidityPeriod`), renewed when a third
/// of the lifetime remains (docs/reference.md "Identities").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenewalPolicy {
    /// Lifetime of a newly issued leaf (`NotAfter - now`; `NotBefore` is backdated a further
    /// [`NOT_BEFORE_BACKDATE`]).
    pub validity: time::Duration,
    /// Renew once no more than this remains, when that comes before the third-of-lifetime
    /// rule: Cluster API's `rolloutBefore.certificatesExpiryDays`, in days there.
    pub renew_before: Option<time::Duration>,
}

impl Default for RenewalPolicy {
    fn default() -> Self {
        Self {
            validity: LEAF_VALIDITY,
            renew_before: None,
        }
    }
}

impl RenewalPolicy {
    /// When a certificate valid from `not_before` to `not_after` is renewed: when a third of
    /// its lifetime remains, or `renew_before` ahead of `not_after` if that is earlier — but
    /// never before a third of its lifetime has passed, so that a threshold longer than the
    /// lifetime cannot renew in a loop.
    ///
    /// The lifetime counts from `not_before` plus the [`NOT_BEFORE_BACKDATE`] capn puts
    /// before the issue time: that is slack for clock skew, not life, and would otherwise
    /// swallow a short validity (`--certificate-validity 1m`) whole.
    pub fn renew_at(&self, not_before: OffsetDateTime, not_after: OffsetDateTime) -> OffsetDateTime {
        let issued = (not_before + NOT_BEFORE_BACKDATE).min(not_after);
        let lifetime = not_after - issued;
        let not_before = issued;
        let third_left: OffsetDateTime = not_after - lifetime / 3;
        let earliest: OffsetDateTime = not_before + lifetime / 3;
        match self.renew_before {
            Some(before) => third_left.min(not_after - before).max(earliest),
            None => third_left,
        }
    }

    /// How long before its `NotAfter` a leaf issued now under this policy is renewed
    /// ([`Self::renew_at`] of a leaf of [`Self::validity`]): the renew window, which the
    /// alert on a certificate expiring within it compares with (docs/operations/metrics.md).
    pub fn renew_window(&self) -> time::Duration {
        let issued = OffsetDateTime::UNIX_EPOCH;
        let not_after = issued + self.validity;
        not_after - self.renew_at(issued - NOT_BEFORE_BACKDATE, not_after)
    }
}

fn subject_and_usages_match(cert: &X509Certificate<'_>, wanted: &LeafSpec) -> bool {
    let subject = cert.subject();
    let (Some(cns), Some(orgs)) = (
        attribute_strings(subject.iter_common_name()),
        attribute_strings(subject.iter_organization()),
    ) else {
        return false;
    };
    let wanted_orgs: Vec<String> = wanted.organization.iter().cloned().collect();
    if cns != [wanted.common_name.clone()] || orgs != wanted_orgs {
        return false;
    }
    let (server, client) = match cert.extended_key_usage() {
        Ok(Some(eku)) => (eku.value.server_auth, eku.value.client_auth),
        Ok(None) => (false, false),
        Err(_) => return false,
    };
    if server != wanted.server || client != wanted.client {
        return false;
    }
    let mut dns = BTreeSet::new();
    let mut ips = BTreeSet::new();
    match cert.subject_alternative_name() {
        Ok(Some(san)) => {
            for name in &san.value.general_names {
                match name {
                    GeneralName::DNSName(n) => {
                        dns.insert(n.to_ascii_lowercase());
                    }
                    GeneralName::IPAddress(bytes) => match ip_from_bytes(bytes) {
                        Some(ip) => {
                            ips.insert(ip);
                        }
                        None => return false,
                    },
                    // Other name kinds are never wanted: their presence is a difference.
                    _ => return false,
                }
            }
        }
        Ok(None) => {}
        Err(_) => return false,
    }
    let wanted_dns: BTreeSet<String> = wanted.dns_names.iter().map(|n| n.to_ascii_lowercase()).collect();
    let wanted_ips: BTreeSet<IpAddr> = wanted.ip_addresses.iter().copied().collect();
    dns == wanted_dns && ips == wanted_ips
}

fn attribute_strings<'a, 'b: 'a>(
    attrs: impl Iterator<Item = &'a x509_parser::x509::AttributeTypeAndValue<'b>>,
) -> Option<Vec<String>> {
    attrs.map(|a| a.as_str().ok().map(str::to_string)).collect()
}

fn ip_from_bytes(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).ok().map(IpAddr::from),
        16 => <[u8; 16]>::try_from(bytes).ok().map(IpAddr::from),
        _ => None,
    }
}

/// The `NotAfter` (expiry) of the first certificate in `cert_pem`, for status reporting and
/// renewal planning.
///
/// Errors: [`PkiError::InvalidPem`] when there is no parsable certificate.
pub fn not_after(cert_pem: &str) -> Result<OffsetDateTime, PkiError> {
    let der = first_certificate_der(cert_pem, "certificate")?;
    let cert = parse_der_cert(&der).map_err(|e| PkiError::invalid_pem("certificate", e))?;
    OffsetDateTime::from_unix_timestamp(cert.validity().not_after.timestamp())
        .map_err(|e| PkiError::invalid_pem("certificate", e))
}

/// SHA-256 of the DER of the first certificate in `cert_pem`, as 64 lowercase hex digits
/// without separators (the value `openssl x509 -fingerprint -sha256` prints, minus colons).
///
/// Errors: [`PkiError::InvalidPem`] when there is no `CERTIFICATE` block.
pub fn fingerprint_sha256(cert_pem: &str) -> Result<String, PkiError> {
    let der = first_certificate_der(cert_pem, "certificate")?;
    Ok(hex(&Sha256::digest(&der)))
}

/// Generates the service-account key pair (docs/reference.md "Identities": one pair, the apiserver
/// signs tokens with the private key and verifies them with the public key).
///
/// `cert_pem` holds the public key as `-----BEGIN PUBLIC KEY-----` (SubjectPublicKeyInfo),
/// `key_pem` the private key as PKCS#8 `-----BEGIN PRIVATE KEY-----` (docs/reference.md "Cluster
/// API secrets": `<c>-sa`).
///
/// Errors: [`PkiError::Generate`] when key generation fails.
pub fn service_account_key_pair(alg: KeyAlgorithm) -> Result<KeyPairPem, PkiError> {
    let key = generate_key(alg)?;
    Ok(KeyPairPem {
        cert_pem: key.public_key_pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Checks an existing service-account pair (for example a user-supplied `<c>-sa` Secret): the
/// private key parses and `cert_pem`'s `PUBLIC KEY` is its public half.
///
/// Errors: [`PkiError::InvalidPem`] when either part does not parse,
/// [`PkiError::UnsupportedKey`] for keys ring cannot use, [`PkiError::KeyMismatch`] when the
/// halves do not belong together.
pub fn verify_service_account_key_pair(pair: &KeyPairPem) -> Result<(), PkiError> {
    let key = parse_private_key_pem(&pair.key_pem, "service-account private key")?;
    let mut spki_der = None;
    for block in x509_parser::pem::Pem::iter_from_buffer(pair.cert_pem.as_bytes()) {
        let block = block.map_err(|e| PkiError::invalid_pem("service-account public key", e))?;
        if block.label == "PUBLIC KEY" {
            spki_der = Some(block.contents);
            break;
        }
    }
    let spki_der =
        spki_der.ok_or_else(|| PkiError::invalid_pem("service-account public key", "no PUBLIC KEY block found"))?;
    let (_, spki) = SubjectPublicKeyInfo::from_der(&spki_der)
        .map_err(|e| PkiError::invalid_pem("service-account public key", e))?;
    if key_matches_spki(&key, &spki) {
        Ok(())
    } else {
        Err(PkiError::KeyMismatch {
            what: "the service-account key pair".to_string(),
        })
    }
}

/// The DER of the first `CERTIFICATE` block of `pem`. `what` names the document in errors.
pub(crate) fn first_certificate_der(pem: &str, what: &str) -> Result<Vec<u8>, PkiError> {
    for block in x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes()) {
        let block = block.map_err(|e| PkiError::invalid_pem(what, e))?;
        if block.label == "CERTIFICATE" {
            return Ok(block.contents);
        }
    }
    Err(PkiError::invalid_pem(what, "no CERTIFICATE block found"))
}

/// Parses a DER certificate, rejecting trailing bytes.
pub(crate) fn parse_der_cert(der: &[u8]) -> Result<X509Certificate<'_>, String> {
    match x509_parser::parse_x509_certificate(der) {
        Ok(([], cert)) => Ok(cert),
        Ok(_) => Err("trailing data after the certificate".to_string()),
        Err(e) => Err(e.to_string()),
    }
}

fn distinguished_name(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    if let Some(o) = organization {
        dn.push(DnType::OrganizationName, o);
    }
    dn.push(DnType::CommonName, common_name);
    dn
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    use fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}
