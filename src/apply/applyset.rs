//! ApplySet bookkeeping (KEP-3659): every object capn applies for a component is labelled
//! as part of that component's set, and the component resource (the parent) says which
//! group-kinds the set contains, so `kubectl` and capn agree on what belongs together.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};

/// Label on every member: the id of the set it belongs to.
pub const PART_OF_LABEL: &str = "applyset.kubernetes.io/part-of";
/// Label on the parent: its set's id.
pub const ID_LABEL: &str = "applyset.kubernetes.io/id";
/// Annotation on the parent: the tool managing the set.
pub const TOOLING_ANNOTATION: &str = "applyset.kubernetes.io/tooling";
/// Annotation on the parent: the group-kinds of the members, sorted, comma-separated.
pub const CONTAINS_GROUP_KINDS_ANNOTATION: &str = "applyset.kubernetes.io/contains-group-kinds";
/// Label on a CRD whose objects may be ApplySet parents.
pub const IS_PARENT_TYPE_LABEL: &str = "applyset.kubernetes.io/is-parent-type";

/// The `applyset.kubernetes.io/tooling` value capn writes on the parents it manages:
/// `capn/v<version>` (KEP-3659: `<toolname>/<semver>`).
pub fn tooling() -> String {
    format!("capn/v{}", env!("CARGO_PKG_VERSION"))
}

/// The KEP-3659 id of the set whose parent is `name` in `namespace` of `kind` in `group`:
/// `applyset-<base64url(sha256("<name>.<namespace>.<kind>.<group>"))>-v1`.
pub fn applyset_id(name: &str, namespace: &str, kind: &str, group: &str) -> String {
    let digest = Sha256::digest(format!("{name}.{namespace}.{kind}.{group}"));
    format!("applyset-{}-v1", URL_SAFE_NO_PAD.encode(digest))
}

/// `Kind.group` (`StatefulSet.apps`), or `Kind` for the core group, as KEP-3659 writes
/// group-kinds.
pub fn group_kind(api_version: &str, kind: &str) -> String {
    match api_version.split_once('/') {
        Some((group, _)) => format!("{kind}.{group}"),
        None => kind.to_string(),
    }
}

/// The value of the contains-group-kinds annotation for `group_kinds`.
pub fn contains_group_kinds<'a>(group_kinds: impl IntoIterator<Item = &'a str>) -> String {
    let mut all: Vec<&str> = group_kinds.into_iter().collect();
    all.sort_unstable();
    all.dedup();
    all.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_matches_the_kep_example_shape_and_is_stable() {
        let id = applyset_id("demo-etcd", "ns", "NestedEtcd", "controlplane.cluster.x-k8s.io");
        assert!(id.starts_with("applyset-") && id.ends_with("-v1"), "{id}");
        // base64url of a 32-byte digest without padding is 43 characters.
        assert_eq!(id.len(), "applyset-".len() + 43 + "-v1".len());
        assert_eq!(
            id,
            applyset_id("demo-etcd", "ns", "NestedEtcd", "controlplane.cluster.x-k8s.io")
        );
        assert_ne!(
            id,
            applyset_id("demo-etcd", "other", "NestedEtcd", "controlplane.cluster.x-k8s.io")
        );
        assert!(id.len() <= 63, "label values are at most 63 characters");
    }

    #[test]
    fn group_kinds_are_kind_dot_group_sorted_and_unique() {
        assert_eq!(group_kind("apps/v1", "StatefulSet"), "StatefulSet.apps");
        assert_eq!(group_kind("v1", "Service"), "Service");
        assert_eq!(
            contains_group_kinds(["StatefulSet.apps", "Service", "Service"]),
            "Service,StatefulSet.apps"
        );
    }
}
