//! Projected `podCertificate` sources: certificates the *tenant's* signers issue, through a
//! Secret.
//!
//! For a `podCertificate` source the kubelet generates a private key, asks its cluster for a
//! certificate with a PodCertificateRequest (KEP-4317, GA in 1.37) and mounts the key and
//! the chain the signer issued; it asks again from the request's `beginRefreshAt`
//! (`pkg/kubelet/podcertificate`). The super kubelet would ask the super cluster's signers
//! about a pod they do not know. So the controller does the kubelet's part in the *tenant*
//! (`controllers::syncer::pod_certificates`) and writes key and chain into one Secret per
//! pod, which the super pod mounts, as it does for tokens ([`super::token`]).
//!
//! Each source becomes a projected `secret` source in the same volume with an item per path
//! the source names: `credentialBundlePath` from key `<volume>.<index>.credential-bundle`
//! (the key's PEM, then the chain's), `keyPath` from `<volume>.<index>.key`,
//! `certificateChainPath` from `<volume>.<index>.certificate-chain`; the file mode is the
//! volume's, or 0600 when the pod sets an `fsGroup` (the kubelet's rule). The source is never
//! optional: until the certificate is issued the super kubelet does not mount the volume and
//! the pod waits, as it would on a kubelet of the tenant's.
//!
//! Key types: `ECDSAP256`, `ECDSAP384` and `ED25519`, which capn's crypto library (ring)
//! generates; `RSA3072`, `RSA4096` and `ECDSAP521` are refused by admission
//! (`crate::syncer::admission`) rather than mounted with another kind of key.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{KeyToPath, PodSpec, SecretProjection, VolumeProjection};

use crate::syncer::names::ControlPlaneRef;
use crate::syncer::names::tenancy::TenantObject;

pub use crate::syncer::admission::syncable::SUPPORTED_KEY_TYPES;

/// The Secret that carries a pod's certificates, and what goes in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodCertificates {
    /// Its name in the workload namespace ([`ControlPlaneRef::pod_certificate_secret_name`]).
    pub name: String,
    /// The tenant service account the pod runs as (named in each request).
    pub service_account_name: String,
    pub sources: Vec<CertificateSource>,
}

/// One projected `podCertificate` source of the tenant pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateSource {
    /// `<volume name>.<source index>`: the prefix of its Secret keys, and how the controller
    /// tracks its requests.
    pub key: String,
    pub signer_name: String,
    /// One of [`SUPPORTED_KEY_TYPES`].
    pub key_type: String,
    /// The longest lifetime asked for, in seconds (`None`: the signer's choice).
    pub max_expiration_seconds: Option<i32>,
    /// `userAnnotations`, passed to the signer unverified.
    pub user_annotations: BTreeMap<String, String>,
}

impl CertificateSource {
    /// The Secret key of the credential bundle (key, then chain).
    pub fn bundle_key(&self) -> String {
        format!("{}.credential-bundle", self.key)
    }
    /// The Secret key of the private key (PKCS#8 PEM).
    pub fn private_key_key(&self) -> String {
        format!("{}.key", self.key)
    }
    /// The Secret key of the certificate chain (PEM).
    pub fn chain_key(&self) -> String {
        format!("{}.certificate-chain", self.key)
    }
}

/// Replaces every projected `podCertificate` source of `spec` by a source of the
/// certificate Secret of the tenant pod `identity`; `None` when the pod projects none.
pub(super) fn replace(
    spec: &mut PodSpec,
    control_plane: &ControlPlaneRef,
    identity: &TenantObject,
    service_account: &str,
) -> Option<PodCertificates> {
    let name = control_plane.pod_certificate_secret_name(&identity.namespace, &identity.name, &identity.uid);
    let fs_group = spec.security_context.as_ref().and_then(|s| s.fs_group).is_some();
    let mut found = Vec::new();
    for (key, source) in super::projected_sources_mut(spec) {
        let Some(projection) = source.pod_certificate.take() else {
            continue;
        };
        let found_source = CertificateSource {
            key: key.clone(),
            signer_name: projection.signer_name,
            key_type: projection.key_type,
            max_expiration_seconds: projection.max_expiration_seconds,
            user_annotations: projection.user_annotations.unwrap_or_default(),
        };
        let paths = [
            (projection.credential_bundle_path, found_source.bundle_key()),
            (projection.key_path, found_source.private_key_key()),
            (projection.certificate_chain_path, found_source.chain_key()),
        ];
        let items = paths
            .into_iter()
            .filter_map(|(path, key)| path.filter(|p| !p.is_empty()).map(|path| (path, key)))
            .map(|(path, key)| KeyToPath {
                key,
                path,
                mode: fs_group.then_some(0o600),
            })
            .collect();
        found.push(found_source);
        *source = VolumeProjection {
            secret: Some(SecretProjection {
                name: name.clone(),
                items: Some(items),
                optional: Some(false),
            }),
            ..VolumeProjection::default()
        };
    }
    (!found.is_empty()).then(|| PodCertificates {
        name,
        service_account_name: service_account.to_owned(),
        sources: found,
    })
}

/// A new private key of `key_type` (PKCS#8 PEM, as the kubelet's `pemEncodeKey` writes it)
/// and the stub PKCS#10 request that proves its possession (DER; an empty subject, as the
/// kubelet's `generateKeyAndProof` makes it). Errors: a key type not in
/// [`SUPPORTED_KEY_TYPES`], or the crypto library's failure.
pub fn new_key(key_type: &str) -> Result<(String, Vec<u8>), String> {
    let algorithm = match key_type {
        "ECDSAP256" => &rcgen::PKCS_ECDSA_P256_SHA256,
        "ECDSAP384" => &rcgen::PKCS_ECDSA_P384_SHA384,
        "ED25519" => &rcgen::PKCS_ED25519,
        other => {
            return Err(format!(
                "key type {other:?} is not one of {}",
                SUPPORTED_KEY_TYPES.join(", ")
            ));
        }
    };
    let key = rcgen::KeyPair::generate_for(algorithm).map_err(|e| e.to_string())?;
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    let request = params.serialize_request(&key).map_err(|e| e.to_string())?;
    Ok((key.serialize_pem(), request.der().to_vec()))
}

/// The certificate blocks of `chain` only, each re-encoded (the kubelet's
/// `cleanCertificateChain`: whatever a signer put between or in the blocks' headers is
/// dropped).
pub fn clean_chain(chain: &str) -> String {
    let config = pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF);
    pem::parse_many(chain)
        .unwrap_or_default()
        .into_iter()
        .map(|block| pem::encode_config(&pem::Pem::new("CERTIFICATE", block.into_contents()), config))
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn identity() -> TenantObject {
        TenantObject {
            namespace: "web".to_owned(),
            name: "p".to_owned(),
            uid: "uid-1".to_owned(),
        }
    }

    #[test]
    fn each_path_of_a_source_is_an_item_of_the_pods_secret_in_the_same_volume() {
        let mut spec: PodSpec = serde_json::from_value(json!({
            "containers": [{"name": "c"}],
            "securityContext": {"fsGroup": 2000},
            "volumes": [{"name": "certs", "projected": {"sources": [
                {"clusterTrustBundle": {"signerName": "example.com/s", "labelSelector": {}, "path": "ca.pem"}},
                {"podCertificate": {"signerName": "example.com/s", "keyType": "ECDSAP256",
                    "credentialBundlePath": "bundle.pem", "keyPath": "", "certificateChainPath": "chain.pem",
                    "maxExpirationSeconds": 3600, "userAnnotations": {"a": "b"}}},
            ]}}],
        }))
        .unwrap();
        let control_plane = ControlPlaneRef::new("default", "t1");
        let certificates = replace(&mut spec, &control_plane, &identity(), "reader").expect("one source");
        assert_eq!(
            certificates,
            PodCertificates {
                name: control_plane.pod_certificate_secret_name("web", "p", "uid-1"),
                service_account_name: "reader".to_owned(),
                sources: vec![CertificateSource {
                    key: "certs.1".to_owned(),
                    signer_name: "example.com/s".to_owned(),
                    key_type: "ECDSAP256".to_owned(),
                    max_expiration_seconds: Some(3600),
                    user_annotations: [("a".to_owned(), "b".to_owned())].into(),
                }],
            }
        );
        let sources = spec.volumes.as_ref().unwrap()[0]
            .projected
            .as_ref()
            .unwrap()
            .sources
            .as_ref()
            .unwrap();
        assert!(sources[0].cluster_trust_bundle.is_some(), "not this module's source");
        let secret = sources[1].secret.as_ref().expect("a secret source");
        assert_eq!(secret.name, certificates.name);
        assert_eq!(secret.optional, Some(false));
        let items: Vec<_> = secret
            .items
            .iter()
            .flatten()
            .map(|i| (i.key.as_str(), i.path.as_str(), i.mode))
            .collect();
        // No item for the empty keyPath; 0600 because of the fsGroup.
        assert_eq!(
            items,
            [
                ("certs.1.credential-bundle", "bundle.pem", Some(0o600)),
                ("certs.1.certificate-chain", "chain.pem", Some(0o600)),
            ]
        );
    }

    #[test]
    fn a_new_key_comes_with_a_request_it_signed() {
        use rcgen::PublicKeyData as _;
        use x509_parser::prelude::FromDer as _;
        for key_type in SUPPORTED_KEY_TYPES {
            let (key_pem, request) = new_key(key_type).unwrap();
            assert!(key_pem.starts_with("-----BEGIN PRIVATE KEY-----"), "{key_type}: PKCS#8");
            let key = rcgen::KeyPair::from_pem(&key_pem).unwrap();
            let (rest, csr) = x509_parser::certification_request::X509CertificationRequest::from_der(&request).unwrap();
            assert!(rest.is_empty());
            csr.verify_signature().unwrap_or_else(|e| panic!("{key_type}: {e}"));
            assert_eq!(
                csr.certification_request_info.subject_pki.raw,
                key.subject_public_key_info().as_slice(),
                "{key_type}: the request is for this key"
            );
            assert_eq!(
                csr.certification_request_info.subject.iter().count(),
                0,
                "an empty subject"
            );
        }
        assert!(
            new_key("RSA3072")
                .unwrap_err()
                .contains("ECDSAP256, ECDSAP384, ED25519")
        );
    }

    #[test]
    fn a_chain_keeps_its_certificate_blocks_only() {
        let block = |der: &[u8]| {
            pem::encode_config(
                &pem::Pem::new("CERTIFICATE", der.to_vec()),
                pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
            )
        };
        let messy = format!("leaf follows\r\n{}intermediate:\n{}", block(b"leaf"), block(b"ca"));
        assert_eq!(clean_chain(&messy), format!("{}{}", block(b"leaf"), block(b"ca")));
    }
}
