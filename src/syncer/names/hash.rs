//! The cut-and-hash rule that fits a name into its kind's limit, after VirtualCluster's
//! `ToSuperClusterNamespace` (cluster-api-provider-nested, `pkg/syncer/conversion/helper.go`:
//! the joined name cut to 57 characters, then `-` and 5 hex digits of its SHA-256).
//!
//! capn's form: the readable name cut to `limit - 1 - HASH_DIGITS` characters, trailing `-`
//! and `.` trimmed (a name may not end in them), then `-` and the first [`HASH_DIGITS`] hex
//! digits of the SHA-256 of the object's *identity*. Two differences from VirtualCluster,
//! both for collisions: the hash is of the identity written with `/` and `:` between its
//! parts (no Kubernetes name holds either, so distinct identities are distinct strings),
//! never of the joined name, which two identities can share; and 16 digits (64 bits) instead
//! of 5, so that finding a second name with the hash of a given one costs about 2^64 SHA-256
//! computations rather than a million.

use sha2::{Digest, Sha256};

use super::NameLimit;

/// Hex digits of the SHA-256 a hashed name ends with (64 bits).
pub const HASH_DIGITS: usize = 16;

/// `readable` cut to fit `limit` with the hash of `identity` appended (see the module
/// documentation). Where `limit` allows no dots, the readable part's dots become `-`: the
/// hash, not the readable part, tells objects apart.
pub(super) fn fit(readable: &str, identity: &str, limit: NameLimit) -> String {
    let room = limit.max_len() - 1 - HASH_DIGITS;
    let readable = if limit.allows_dots() {
        readable.to_owned()
    } else {
        readable.replace('.', "-")
    };
    let head = cut(&readable, room).trim_end_matches(['-', '.']);
    let digest = Sha256::digest(identity.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{head}-{}", &hex[..HASH_DIGITS])
}

/// Whether `name` has the shape [`fit`] gives every name: `-` and [`HASH_DIGITS`] lower-case
/// hex digits at the end. A readable name of that shape is hashed too, so that a hashed
/// name can never equal a readable one.
pub(super) fn looks_hashed(name: &str) -> bool {
    let bytes = name.as_bytes();
    bytes.len() > HASH_DIGITS
        && bytes[bytes.len() - HASH_DIGITS - 1] == b'-'
        && bytes[bytes.len() - HASH_DIGITS..]
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary
/// (names are ASCII once an API server accepted them; this never splits a character of
/// one that is not).
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let end = (0..=max).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0);
    &s[..end]
}
