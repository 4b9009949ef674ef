//! What capn's cache keeps of a Secret (issue 11, memory): its name, namespace,
//! resourceVersion and owners, and capn's two certificate annotations as plain fields. Kept
//! in the metadata's annotation map, those two cost a B-tree node of about half a KiB per
//! Secret; a thousand control planes cache twelve Secrets each.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PartialObjectMeta;

use super::certificates::{NOT_AFTER_ANNOTATION, RENEW_AFTER_ANNOTATION};

/// A Secret as the metadata watch cache holds it (`v1`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CachedSecret {
    /// Name, namespace, resourceVersion (is what capn verified still current) and owner
    /// references (whose control plane a change wakes); nothing else.
    pub metadata: ObjectMeta,
    /// The [`NOT_AFTER_ANNOTATION`]: when the certificate it holds expires (RFC 3339), as
    /// capn wrote it when it issued it.
    pub not_after: Option<String>,
    /// The [`RENEW_AFTER_ANNOTATION`]: when capn renews that certificate (RFC 3339).
    pub renew_after: Option<String>,
}

impl From<PartialObjectMeta<Secret>> for CachedSecret {
    fn from(secret: PartialObjectMeta<Secret>) -> Self {
        let mut meta = secret.metadata;
        let mut annotations = meta.annotations.take().unwrap_or_default();
        Self {
            metadata: ObjectMeta {
                name: meta.name.take(),
                namespace: meta.namespace.take(),
                resource_version: meta.resource_version.take(),
                owner_references: meta.owner_references.take(),
                ..ObjectMeta::default()
            },
            not_after: annotations.remove(NOT_AFTER_ANNOTATION),
            renew_after: annotations.remove(RENEW_AFTER_ANNOTATION),
        }
    }
}

impl kube::Resource for CachedSecret {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "Secret".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "secrets".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_keeps_only_what_reconciles_read() {
        let secret: PartialObjectMeta<Secret> = serde_json::from_value(serde_json::json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadata",
            "metadata": {
                "name": "demo-apiserver",
                "namespace": "tenant-a",
                "uid": "u-1",
                "resourceVersion": "42",
                "creationTimestamp": "2026-12-02T10:00:00Z",
                "labels": {"app.kubernetes.io/managed-by": "capn"},
                "annotations": {
                    NOT_AFTER_ANNOTATION: "2027-12-02T10:00:00Z",
                    RENEW_AFTER_ANNOTATION: "2027-10-02T10:00:00Z",
                    "meta.helm.sh/release-name": "other",
                },
                "ownerReferences": [{
                    "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
                    "kind": "NestedControlPlane",
                    "name": "demo",
                    "uid": "u-ncp",
                }],
                "managedFields": [{"manager": "capn", "operation": "Apply"}],
            },
        }))
        .unwrap();
        let kept = CachedSecret::from(secret);
        assert_eq!(
            serde_json::to_value(&kept.metadata).unwrap(),
            serde_json::json!({
                "name": "demo-apiserver",
                "namespace": "tenant-a",
                "resourceVersion": "42",
                "ownerReferences": [{
                    "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
                    "kind": "NestedControlPlane",
                    "name": "demo",
                    "uid": "u-ncp",
                }],
            })
        );
        assert_eq!(kept.not_after.as_deref(), Some("2027-12-02T10:00:00Z"));
        assert_eq!(kept.renew_after.as_deref(), Some("2027-10-02T10:00:00Z"));
    }
}
