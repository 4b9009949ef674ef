//! Names in the super cluster: the workload namespace of a control plane, the name of every
//! object synced into it, and the tenancy labels and annotations that lead from a super
//! object back to its tenant object ([`tenancy`]). docs/design.md §11 has the why.
//!
//! **Workload namespace.** `<control plane namespace>-<control plane name>-workloads`, the
//! name as it is when (a) it fits 63 characters (a namespace is a DNS-1123 label), (b) the
//! control plane's namespace has no `-` and (c) its name no `.`; otherwise hashed
//! ([`HASH_DIGITS`] hex digits of the SHA-256 of `namespace:<ns>/<name>`, see `hash`).
//! Why (b): `team-a`/`prod` and `team`/`a-prod` both join to `team-a-prod-workloads`. With
//! (b), a readable name splits at its first `-` into the namespace and the rest, so two
//! control planes never share one; a hashed name ends in hex digits, a readable one in
//! `workloads`, so the two kinds never meet either.
//!
//! **Object names.** `<name>-x-<tenant namespace>-x-<control plane name>` (vcluster's
//! `pkg/util/translate` form), as it is when (a) it fits the kind's [`NameLimit`], (b) the
//! tenant namespace neither contains `-x-` nor starts with `x-`, (c) it does not end like a
//! hashed name (`-` and [`HASH_DIGITS`] hex digits) and (d) it has no `.` where the kind
//! allows none; otherwise hashed (the SHA-256 of
//! `object:<control plane namespace>/<control plane name>/<tenant namespace>/<name>`).
//! The separator `-x-` may appear in names, so it alone proves nothing: `a-x-b` in `c` and
//! `a` in `b-x-c` both join to `a-x-b-x-c`. Injectivity, for the one control plane whose
//! workload namespace holds the objects:
//! - readable names: strip the fixed `-x-<control plane name>`; what is left is
//!   `<name>-x-<namespace>`, and by (b) its *last* `-x-` is the separator (one starting
//!   later would lie inside the namespace or make it start with `x-`), so the pair is read
//!   back uniquely;
//! - readable against hashed: by (c) a readable name never has the hashed shape, which
//!   every hashed name has;
//! - hashed against hashed: distinct identities are distinct strings (no name holds `/` or
//!   `:`), so two names meet only if 64 bits of their SHA-256 do. Should that ever happen
//!   the tenancy annotations tell the objects apart and the syncer refuses to take over the
//!   other object (`diff::ownership`).
//!
//! Names of different tenants cannot meet at all: each control plane has its own workload
//! namespace.

mod hash;
pub mod tenancy;

pub use hash::HASH_DIGITS;

/// Suffix of every readable workload namespace.
pub const WORKLOADS_SUFFIX: &str = "-workloads";
/// Separator between the parts of a readable object name.
pub const SEPARATOR: &str = "-x-";

/// Which of Kubernetes' two name syntaxes a kind's names follow
/// (<https://kubernetes.io/docs/concepts/overview/working-with-objects/names/>).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameLimit {
    /// A DNS-1123 (or RFC 1035) label: at most 63 characters, no dots. Namespaces, Services,
    /// and every name that becomes a label value or a hostname.
    Label,
    /// A DNS-1123 subdomain: at most 253 characters, dots allowed. Pods, ConfigMaps,
    /// Secrets, PersistentVolumeClaims, ServiceAccounts.
    Subdomain,
}

impl NameLimit {
    /// The longest name allowed, in characters.
    pub const fn max_len(self) -> usize {
        match self {
            NameLimit::Label => 63,
            NameLimit::Subdomain => 253,
        }
    }

    pub(crate) const fn allows_dots(self) -> bool {
        matches!(self, NameLimit::Subdomain)
    }
}

/// The nested control plane a tenant belongs to: its NestedControlPlane's namespace and
/// name in the super cluster.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ControlPlaneRef {
    /// The NestedControlPlane's namespace in the super cluster.
    pub namespace: String,
    /// The NestedControlPlane's name.
    pub name: String,
}

impl ControlPlaneRef {
    /// The control plane `name` in `namespace`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// `<namespace>/<name>`: the value of the `tenancy.x-k8s.io/cluster` annotation.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The super-cluster namespace that holds every object synced from this tenant (see the
    /// module documentation for the rule and why it cannot collide).
    pub fn workload_namespace(&self) -> String {
        let readable = format!("{}-{}{WORKLOADS_SUFFIX}", self.namespace, self.name);
        let plain =
            readable.len() <= NameLimit::Label.max_len() && !self.namespace.contains('-') && !self.name.contains('.');
        if plain {
            readable
        } else {
            hash::fit(&readable, &format!("namespace:{}", self.key()), NameLimit::Label)
        }
    }

    /// The name in the workload namespace of the tenant object `name` in the tenant
    /// namespace `namespace`, for a kind whose names follow `limit` (see the module
    /// documentation for the rule and its proof).
    pub fn super_name(&self, limit: NameLimit, namespace: &str, name: &str) -> String {
        let readable = format!("{name}{SEPARATOR}{namespace}{SEPARATOR}{}", self.name);
        let plain = readable.len() <= limit.max_len()
            && !namespace.contains(SEPARATOR)
            && !namespace.starts_with("x-")
            && !hash::looks_hashed(&readable)
            && (limit.allows_dots() || !readable.contains('.'));
        if plain {
            readable
        } else {
            let identity = format!("object:{}/{namespace}/{name}", self.key());
            hash::fit(&readable, &identity, limit)
        }
    }

    /// The name of the Secret that carries the service-account tokens of the tenant pod
    /// `pod` (uid `uid`) in `namespace`: `<the pod's readable name>-token`, always hashed
    /// with the SHA-256 of `token:<control plane>/<namespace>/<pod>/<uid>`. Always hashed,
    /// so it can never be the name of a synced tenant Secret (whose identities start with
    /// `object:`); the uid in it gives a re-created pod a new Secret, never its
    /// predecessor's tokens.
    pub fn token_secret_name(&self, namespace: &str, pod: &str, uid: &str) -> String {
        self.pod_object_name("token", namespace, pod, uid)
    }

    /// The name of the ConfigMap that carries the tenant trust bundles the tenant pod `pod`
    /// (uid `uid`) in `namespace` projects: `<the pod's readable name>-trust-bundles`,
    /// hashed like [`Self::token_secret_name`] (identity `trust-bundles:…`), for the same
    /// reasons.
    pub fn trust_bundle_config_map_name(&self, namespace: &str, pod: &str, uid: &str) -> String {
        self.pod_object_name("trust-bundles", namespace, pod, uid)
    }

    /// The name of the Secret that carries the keys and certificates of the tenant pod `pod`
    /// (uid `uid`) in `namespace` projects (`podCertificate` sources):
    /// `<the pod's readable name>-pod-certificates`, hashed like
    /// [`Self::token_secret_name`] (identity `pod-certificates:…`), for the same reasons.
    pub fn pod_certificate_secret_name(&self, namespace: &str, pod: &str, uid: &str) -> String {
        self.pod_object_name("pod-certificates", namespace, pod, uid)
    }

    /// `<pod>-x-<namespace>-x-<control plane>-<kind>`, always hashed with the SHA-256 of
    /// `<kind>:<control plane>/<namespace>/<pod>/<uid>`.
    fn pod_object_name(&self, kind: &str, namespace: &str, pod: &str, uid: &str) -> String {
        let readable = format!("{pod}{SEPARATOR}{namespace}{SEPARATOR}{}-{kind}", self.name);
        let identity = format!("{kind}:{}/{namespace}/{pod}/{uid}", self.key());
        hash::fit(&readable, &identity, NameLimit::Subdomain)
    }
}

/// Whether `value` is a valid label value: empty, or at most 63 characters of
/// alphanumerics, `-`, `_` and `.`, beginning and ending with an alphanumeric
/// (<https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#syntax-and-character-set>).
pub fn is_label_value(value: &str) -> bool {
    let bytes = value.as_bytes();
    match (bytes.first(), bytes.last()) {
        (None, _) | (_, None) => true,
        (Some(first), Some(last)) => {
            bytes.len() <= 63
                && first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes.iter().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(b))
        }
    }
}

/// Whether `value` is a DNS-1123 label: 1 to 63 lower-case alphanumerics and `-`, beginning
/// and ending with an alphanumeric (the syntax of `spec.hostname`).
pub fn is_dns_label(value: &str) -> bool {
    let bytes = value.as_bytes();
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes.first().is_some_and(alnum)
        && bytes.last().is_some_and(alnum)
        && bytes.iter().all(|b| alnum(b) || *b == b'-')
}

#[cfg(test)]
mod tests;
