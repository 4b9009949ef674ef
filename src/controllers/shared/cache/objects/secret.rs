//! What capn's cache keeps of a Secret: its name, namespace and
//! resourceVersion, the name and uid of each NestedControlPlane that owns it, and the times of
//! capn's two certificate annotations, parsed. Not an `ObjectMeta`: that is about 350 bytes
//! before any of its strings, an owner reference as many again, and a thousand control
//! planes cache twelve Secrets each. Implements the reflector's [`Lookup`] directly, which
//! is all a [`kube::runtime::reflector::Store`] needs.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::Secret;
use kube::api::PartialObjectMeta;
use kube::runtime::reflector::Lookup;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::api::NestedControlPlane;
use crate::controllers::shared::certificates::{NOT_AFTER_ANNOTATION, RENEW_AFTER_ANNOTATION};

/// A Secret as the metadata watch cache holds it (`v1`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CachedSecret {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// Is what capn verified still current.
    pub resource_version: String,
    /// The NestedControlPlanes among its owner references (whose controllers a change
    /// wakes; capn's own Secrets have one); other owners are not kept.
    pub control_plane_owners: Vec<Owner>,
    /// The [`NOT_AFTER_ANNOTATION`]: when the certificate it holds expires, as capn wrote it
    /// when it issued it. `None` without the annotation or when it is not RFC 3339.
    pub not_after: Option<OffsetDateTime>,
    /// The [`RENEW_AFTER_ANNOTATION`]: when capn renews that certificate; `None` likewise.
    pub renew_after: Option<OffsetDateTime>,
}

/// An owner of a cached Secret: the NestedControlPlane's name and uid (the uid tells capn's
/// Secret for this control plane from one left by an earlier control plane of the name).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Owner {
    /// The NestedControlPlane's name (in the Secret's namespace).
    pub name: String,
    /// Its `metadata.uid`.
    pub uid: String,
}

impl From<PartialObjectMeta<Secret>> for CachedSecret {
    fn from(secret: PartialObjectMeta<Secret>) -> Self {
        let meta = secret.metadata;
        let annotations = meta.annotations.unwrap_or_default();
        let time = |key: &str| {
            annotations
                .get(key)
                .and_then(|v| OffsetDateTime::parse(v, &Rfc3339).ok())
        };
        let control_plane = <NestedControlPlane as kube::Resource>::kind(&());
        Self {
            name: meta.name.unwrap_or_default(),
            namespace: meta.namespace.unwrap_or_default(),
            resource_version: meta.resource_version.unwrap_or_default(),
            control_plane_owners: meta
                .owner_references
                .unwrap_or_default()
                .into_iter()
                .filter(|o| o.kind == control_plane)
                .map(|o| Owner {
                    name: o.name,
                    uid: o.uid,
                })
                .collect(),
            not_after: time(NOT_AFTER_ANNOTATION),
            renew_after: time(RENEW_AFTER_ANNOTATION),
        }
    }
}

impl Lookup for CachedSecret {
    type DynamicType = ();

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
    fn name(&self) -> Option<Cow<'_, str>> {
        Some(self.name.as_str().into())
    }
    fn namespace(&self) -> Option<Cow<'_, str>> {
        Some(self.namespace.as_str().into())
    }
    fn resource_version(&self) -> Option<Cow<'_, str>> {
        Some(self.resource_version.as_str().into())
    }
    /// Not kept: nothing looks a Secret up by uid.
    fn uid(&self) -> Option<Cow<'_, str>> {
        None
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
                "ownerReferences": [
                    {
                        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
                        "kind": "NestedControlPlane",
                        "name": "demo",
                        "uid": "u-ncp",
                    },
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "other", "uid": "u-cm"},
                ],
                "managedFields": [{"manager": "capn", "operation": "Apply"}],
            },
        }))
        .unwrap();
        let at = |s: &str| Some(OffsetDateTime::parse(s, &Rfc3339).unwrap());
        assert_eq!(
            CachedSecret::from(secret),
            CachedSecret {
                name: "demo-apiserver".into(),
                namespace: "tenant-a".into(),
                resource_version: "42".into(),
                control_plane_owners: vec![Owner {
                    name: "demo".into(),
                    uid: "u-ncp".into(),
                }],
                not_after: at("2027-12-02T10:00:00Z"),
                renew_after: at("2027-10-02T10:00:00Z"),
            }
        );
    }

    #[test]
    fn a_time_that_is_not_rfc_3339_is_none() {
        let secret: PartialObjectMeta<Secret> = serde_json::from_value(serde_json::json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadata",
            "metadata": {"name": "s", "namespace": "t", "annotations": {NOT_AFTER_ANNOTATION: "next year"}},
        }))
        .unwrap();
        let cached = CachedSecret::from(secret);
        assert_eq!((cached.not_after, cached.renew_after), (None, None));
        assert!(cached.control_plane_owners.is_empty());
    }
}
