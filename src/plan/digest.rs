//! The certificates digest (docs/design.md §9, "what a process reads only at start must restart
//! it"): a hash of the Secrets a component's processes read only when they start, written
//! on its pod templates, so that a re-issued certificate rolls the component.
//!
//! Which mounted Secrets are left out is the channel's to say (`reloadedSecrets` in
//! `channel.yaml`: material the process reloads by itself); every other Secret a pod template
//! mounts counts. The digest's value depends on Secrets that exist only in a cluster: the
//! pure plan carries [`DIGEST_PLACEHOLDER`], which the controllers replace and `capn render`
//! shows.

use std::collections::BTreeSet;

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Pod template annotation holding the certificates digest.
pub const CERTIFICATES_DIGEST_ANNOTATION: &str = "controlplane.cluster.x-k8s.io/certificates-digest";

/// The digest's value before the Secrets are known (`capn render`, and the plan until the
/// controller has read them).
pub const DIGEST_PLACEHOLDER: &str = "computed-in-cluster-from-the-secrets";

/// The Secrets the pod templates of `objects` mount (Secret volumes and projected Secret
/// sources), sorted.
pub fn mounted_secrets(objects: &[Value]) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for object in objects {
        let Some(volumes) = object.pointer("/spec/template/spec/volumes").and_then(Value::as_array) else {
            continue;
        };
        for volume in volumes {
            if let Some(name) = volume.pointer("/secret/secretName").and_then(Value::as_str) {
                names.insert(name.to_string());
            }
            for source in volume
                .pointer("/projected/sources")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(name) = source.pointer("/secret/name").and_then(Value::as_str) {
                    names.insert(name.to_string());
                }
            }
        }
    }
    names
}

/// The digest of Secrets given as `(name, SHA-256 of their data)`: SHA-256 over the sorted
/// pairs, hex, the first 32 characters (128 bits: a roll trigger, not a security boundary).
pub fn certificates_digest<'a>(secrets: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let sorted: BTreeSet<(&str, &str)> = secrets.into_iter().collect();
    let mut hasher = Sha256::new();
    for (name, data) in sorted {
        hasher.update(name.as_bytes());
        hasher.update(b"=");
        hasher.update(data.as_bytes());
        hasher.update(b"\n");
    }
    hasher.finalize().iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// Writes `digest` as the [`CERTIFICATES_DIGEST_ANNOTATION`] of every pod template in
/// `objects` (objects without `spec.template` are left alone).
pub fn stamp_certificates_digest(objects: &mut [Value], digest: &str) {
    for object in objects {
        let Some(template) = object.pointer_mut("/spec/template").and_then(Value::as_object_mut) else {
            continue;
        };
        let metadata = template
            .entry("metadata")
            .or_insert_with(|| Value::Object(Default::default()));
        let Some(metadata) = metadata.as_object_mut() else {
            continue;
        };
        let annotations = metadata
            .entry("annotations")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(annotations) = annotations.as_object_mut() {
            annotations.insert(CERTIFICATES_DIGEST_ANNOTATION.into(), digest.into());
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn mounted_secrets_are_secret_volumes_and_projected_sources() {
        let objects = [
            json!({"kind": "StatefulSet", "spec": {"template": {"spec": {"volumes": [
                {"name": "a", "secret": {"secretName": "s-a"}},
                {"name": "b", "emptyDir": {}},
                {"name": "c", "projected": {"sources": [{"secret": {"name": "s-c"}}, {"configMap": {"name": "cm"}}]}},
            ]}}}}),
            json!({"kind": "Service", "spec": {"ports": []}}),
            json!({"kind": "StatefulSet", "spec": {"template": {"spec": {"volumes": [
                {"name": "a", "secret": {"secretName": "s-a"}},
            ]}}}}),
        ];
        assert_eq!(
            mounted_secrets(&objects).into_iter().collect::<Vec<_>>(),
            ["s-a", "s-c"]
        );
    }

    #[test]
    fn digest_depends_on_every_secret_and_not_on_order() {
        let d = certificates_digest([("a", "1"), ("b", "2")]);
        assert_eq!(d.len(), 32);
        assert_eq!(
            d,
            certificates_digest([("b", "2"), ("a", "1")]),
            "order carries no meaning"
        );
        assert_ne!(
            d,
            certificates_digest([("a", "1"), ("b", "3")]),
            "a changed Secret changes it"
        );
        assert_ne!(d, certificates_digest([("a", "1")]), "a Secret more or less changes it");
        assert_ne!(
            certificates_digest([("ab", "c")]),
            certificates_digest([("a", "bc")]),
            "names and data are separated"
        );
    }

    #[test]
    fn stamp_annotates_pod_templates_only() {
        let mut objects = [
            json!({"kind": "StatefulSet", "spec": {"template": {"metadata": {"labels": {"x": "y"}}}}}),
            json!({"kind": "StatefulSet", "spec": {"template": {"metadata": {"annotations": {"keep": "me"}}}}}),
            json!({"kind": "Service", "spec": {}}),
        ];
        stamp_certificates_digest(&mut objects, "d1");
        assert_eq!(objects[0]["spec"]["template"]["metadata"]["labels"]["x"], "y");
        assert_eq!(
            objects[0]["spec"]["template"]["metadata"]["annotations"][CERTIFICATES_DIGEST_ANNOTATION],
            "d1"
        );
        assert_eq!(objects[1]["spec"]["template"]["metadata"]["annotations"]["keep"], "me");
        assert_eq!(
            objects[1]["spec"]["template"]["metadata"]["annotations"][CERTIFICATES_DIGEST_ANNOTATION],
            "d1"
        );
        assert_eq!(objects[2], json!({"kind": "Service", "spec": {}}));
    }
}
