//! Private keys: generation, PEM parsing (PKCS#8, PKCS#1 and SEC1) and randomness.

use std::io::Read;

use rcgen::{KeyPair, PKCS_ECDSA_P256_SHA256, PKCS_RSA_SHA256, PublicKeyData, SerialNumber};
use rsa::pkcs8::EncodePrivateKey;

use super::{KeyAlgorithm, PkiError};

/// Fills `buf` from the operating system's cryptographic random source (`/dev/urandom`, the
/// device `getrandom(2)` is backed by).
///
/// Errors: [`PkiError::Generate`] when the device cannot be read.
pub(crate) fn random_bytes(buf: &mut [u8]) -> Result<(), PkiError> {
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(buf))
        .map_err(|e| PkiError::Generate(format!("reading the system random source: {e}")))
}

/// A random, positive, non-zero 128-bit serial number (docs/reference.md: "Serial numbers random and
/// positive"; RFC 5280 allows up to 20 octets).
pub(crate) fn random_serial() -> Result<SerialNumber, PkiError> {
    let mut bytes = [0u8; 16];
    random_bytes(&mut bytes)?;
    // Top bit clear: positive. Second bit set: non-zero and exactly 16 octets in DER.
    bytes[0] = (bytes[0] & 0x7f) | 0x40;
    Ok(SerialNumber::from_slice(&bytes))
}

/// The operating system random source as an RNG for the `rsa` crate.
struct OsRandom;

impl rsa::rand_core::TryRng for OsRandom {
    type Error = std::io::Error;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        let mut b = [0u8; 4];
        self.try_fill_bytes(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        let mut b = [0u8; 8];
        self.try_fill_bytes(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(dst))
    }
}

impl rsa::rand_core::TryCryptoRng for OsRandom {}

/// Generates a new private key of the given algorithm.
///
/// ECDSA keys come from ring (through rcgen); RSA keys from the `rsa` crate (ring cannot
/// generate RSA keys) and are handed to rcgen as PKCS#8 for signing.
///
/// Errors: [`PkiError::Generate`] when the random source or the key generation fails.
pub(crate) fn generate_key(alg: KeyAlgorithm) -> Result<KeyPair, PkiError> {
    match alg {
        KeyAlgorithm::EcdsaP256 => KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)
            .map_err(|e| PkiError::Generate(format!("ECDSA P-256 key: {e}"))),
        KeyAlgorithm::Rsa2048 => {
            let key = rsa::PrivateKey::new(&mut OsRandom, 2048)
                .map_err(|e| PkiError::Generate(format!("RSA 2048 key: {e}")))?;
            let der = key
                .to_pkcs8_der()
                .map_err(|e| PkiError::Generate(format!("RSA 2048 key encoding: {e}")))?;
            KeyPair::from_pkcs8_der_and_sign_algo(&der.as_bytes().into(), &PKCS_RSA_SHA256)
                .map_err(|e| PkiError::Generate(format!("RSA 2048 key: {e}")))
        }
    }
}

/// Parses a PEM private key. Accepts PKCS#8 (`PRIVATE KEY`), PKCS#1 (`RSA PRIVATE KEY`, what
/// kubeadm and cert-manager write) and SEC1 (`EC PRIVATE KEY`, possibly preceded by an
/// `EC PARAMETERS` block, what `openssl ecparam -genkey` writes). Supported keys: RSA
/// (2048..8192 bits), ECDSA P-256 and P-384, Ed25519.
///
/// `what` names the document in errors. Errors: [`PkiError::InvalidPem`] when there is no
/// private-key block or it does not decode; [`PkiError::UnsupportedKey`] for encrypted keys
/// and algorithms ring cannot sign with.
pub(crate) fn parse_private_key_pem(pem: &str, what: &str) -> Result<KeyPair, PkiError> {
    for block in x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes()) {
        let block = block.map_err(|e| PkiError::invalid_pem(what, e))?;
        let unsupported = |detail: &str| PkiError::UnsupportedKey {
            what: what.to_string(),
            detail: detail.to_string(),
        };
        match block.label.as_str() {
            "PRIVATE KEY" => {
                return KeyPair::try_from(block.contents.as_slice())
                    .map_err(|_| unsupported("PKCS#8 key is not RSA, ECDSA P-256/P-384 or Ed25519"));
            }
            "RSA PRIVATE KEY" => {
                let pkcs8 = pkcs8_wrap(&RSA_ALGORITHM_IDENTIFIER, &block.contents);
                return KeyPair::from_pkcs8_der_and_sign_algo(&pkcs8.as_slice().into(), &PKCS_RSA_SHA256)
                    .map_err(|_| unsupported("PKCS#1 RSA key rejected (malformed, or outside 2048..8192 bits)"));
            }
            "EC PRIVATE KEY" => {
                // ring only reads PKCS#8; wrap the SEC1 structure with each supported curve's
                // algorithm identifier in turn (ring checks the curve against the key).
                for alg_id in [&EC_P256_ALGORITHM_IDENTIFIER[..], &EC_P384_ALGORITHM_IDENTIFIER[..]] {
                    let pkcs8 = pkcs8_wrap(alg_id, &block.contents);
                    if let Ok(key) = KeyPair::try_from(pkcs8.as_slice()) {
                        return Ok(key);
                    }
                }
                return Err(unsupported(
                    "SEC1 EC key is not on P-256 or P-384, or lacks its public key",
                ));
            }
            "ENCRYPTED PRIVATE KEY" => {
                return Err(unsupported("encrypted private keys are not supported"));
            }
            _ => continue,
        }
    }
    Err(PkiError::invalid_pem(what, "no PRIVATE KEY block found"))
}

/// Whether `key` is the private half of the public key `spki` (a SubjectPublicKeyInfo):
/// compares the raw public key bits.
pub(crate) fn key_matches_spki(key: &KeyPair, spki: &x509_parser::x509::SubjectPublicKeyInfo<'_>) -> bool {
    spki.subject_public_key.data.as_ref() == key.der_bytes()
}

/// DER `AlgorithmIdentifier` for rsaEncryption (1.2.840.113549.1.1.1) with NULL parameters.
const RSA_ALGORITHM_IDENTIFIER: [u8; 15] = [
    0x30, 0x0d, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01, 0x05, 0x00,
];

/// DER `AlgorithmIdentifier` for id-ecPublicKey (1.2.840.10045.2.1) on prime256v1
/// (1.2.840.10045.3.1.7).
const EC_P256_ALGORITHM_IDENTIFIER: [u8; 21] = [
    0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03,
    0x01, 0x07,
];

/// DER `AlgorithmIdentifier` for id-ecPublicKey (1.2.840.10045.2.1) on secp384r1
/// (1.3.132.0.34).
const EC_P384_ALGORITHM_IDENTIFIER: [u8; 18] = [
    0x30, 0x10, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22,
];

/// Wraps a raw private key structure into PKCS#8 `PrivateKeyInfo` (RFC 5208):
/// `SEQUENCE { INTEGER 0, AlgorithmIdentifier, OCTET STRING key }`.
fn pkcs8_wrap(algorithm_identifier: &[u8], key: &[u8]) -> Vec<u8> {
    let mut body = vec![0x02, 0x01, 0x00];
    body.extend_from_slice(algorithm_identifier);
    body.extend(der_tlv(0x04, key));
    der_tlv(0x30, &body)
}

/// One DER tag-length-value with a definite length.
fn der_tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(content);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_lengths() {
        assert_eq!(der_tlv(0x04, &[1, 2]), vec![0x04, 0x02, 1, 2]);
        let long = vec![0u8; 300];
        let tlv = der_tlv(0x04, &long);
        assert_eq!(&tlv[..4], &[0x04, 0x82, 0x01, 0x2c]);
        assert_eq!(tlv.len(), 304);
    }

    #[test]
    fn serials_are_positive_and_sixteen_octets() {
        let serial = random_serial().unwrap().to_bytes();
        assert_eq!(serial.len(), 16);
        assert_eq!(serial[0] & 0x80, 0);
        assert_ne!(serial[0] & 0x40, 0);
    }

    #[test]
    fn rejects_garbage_and_encrypted_keys() {
        let err = parse_private_key_pem("not a pem", "k").unwrap_err();
        assert_eq!(err.reason(), "InvalidPEM");
        let enc = "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n";
        let err = parse_private_key_pem(enc, "k").unwrap_err();
        assert_eq!(err.reason(), "UnsupportedKey");
    }

    /// A SEC1 key (what `openssl ecparam -genkey` writes) is the inner OCTET STRING of the
    /// PKCS#8 document rcgen produces; unwrapping and re-reading it must give the same key.
    #[test]
    fn reads_sec1_ec_keys() {
        let key = generate_key(KeyAlgorithm::EcdsaP256).unwrap();
        let pkcs8 = key.serialized_der();
        // PrivateKeyInfo: SEQUENCE { INTEGER 0 (3 bytes), AlgorithmIdentifier (21 bytes), OCTET STRING }
        let (_, info) = x509_parser::der_parser::parse_der(pkcs8).unwrap();
        let items = info.as_sequence().unwrap();
        let sec1 = items[2].as_slice().unwrap();
        let pem = format!(
            "-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n{}",
            pem_block("EC PRIVATE KEY", sec1)
        );
        let parsed = parse_private_key_pem(&pem, "k").unwrap();
        assert_eq!(parsed.public_key_raw(), key.public_key_raw());
    }

    #[test]
    fn reads_pkcs1_rsa_keys() {
        use rsa::pkcs1::EncodeRsaPrivateKey;
        let key = rsa::PrivateKey::new(&mut OsRandom, 2048).unwrap();
        let pkcs1 = key.to_pkcs1_der().unwrap();
        let pem = pem_block("RSA PRIVATE KEY", pkcs1.as_bytes());
        let parsed = parse_private_key_pem(&pem, "k").unwrap();
        assert_eq!(parsed.algorithm(), &PKCS_RSA_SHA256);
        let pkcs8 =
            KeyPair::from_pkcs8_der_and_sign_algo(&key.to_pkcs8_der().unwrap().as_bytes().into(), &PKCS_RSA_SHA256)
                .unwrap();
        assert_eq!(parsed.public_key_raw(), pkcs8.public_key_raw());
    }

    fn pem_block(label: &str, der: &[u8]) -> String {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD.encode(der);
        let mut out = format!("-----BEGIN {label}-----\n");
        for chunk in b64.as_bytes().chunks(64) {
            out.push_str(std::str::from_utf8(chunk).unwrap());
            out.push('\n');
        }
        out.push_str(&format!("-----END {label}-----\n"));
        out
    }
}
