//! What capn's watch caches keep of the built-in kinds it watches: each
//! kind as a type of its own that deserializes only the fields a reconcile reads, so the
//! rest of an object is neither parsed nor kept. At a thousand control planes the caches
//! hold twelve Secrets, three StatefulSets and two Services per control plane; a
//! `k8s_openapi` object costs kilobytes before any of its strings.
//!
//! - [`CachedSecret`]: from the metadata watch, name, resourceVersion, control plane owners
//!   and capn's two certificate times, with no `ObjectMeta` at all;
//! - [`CachedStatefulSet`]: `spec.replicas` and the status (readiness, membership), and
//!   capn's template digest annotation (the apiserver's surge);
//! - [`CachedService`]: `spec.type`, `spec.clusterIP` and the status (readiness, the
//!   apiserver's Service address and certificate SANs).
//!
//! The other two keep their metadata as [`owned_metadata`]: what finds an object (name,
//! namespace), tells whether it changed (resourceVersion, generation) and maps it to its
//! component (owner references).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;

mod secret;
mod service;
mod statefulset;

pub use secret::{CachedSecret, Owner};
pub use service::{CachedService, CachedServiceSpec};
pub use statefulset::{CachedStatefulSet, CachedStatefulSetSpec, trim as trim_statefulset};

/// Implements [`kube::Resource`] for a namespaced cache type with a `metadata` field:
/// `cached_resource!(Type, group, version, kind, plural)`.
macro_rules! cached_resource {
    ($type:ty, $group:literal, $version:literal, $kind:literal, $plural:literal) => {
        impl kube::Resource for $type {
            type DynamicType = ();
            type Scope = k8s_openapi::NamespaceResourceScope;

            fn kind(_: &()) -> std::borrow::Cow<'_, str> {
                $kind.into()
            }
            fn group(_: &()) -> std::borrow::Cow<'_, str> {
                $group.into()
            }
            fn version(_: &()) -> std::borrow::Cow<'_, str> {
                $version.into()
            }
            fn plural(_: &()) -> std::borrow::Cow<'_, str> {
                $plural.into()
            }
            fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}
use cached_resource;

/// Trims `object`'s metadata to what reconciles read of a cached object capn applied: name,
/// namespace and uid, resourceVersion and generation (the apply short cut's "changed since"),
/// owner references (which component a change wakes) and the deletion timestamp. Labels,
/// annotations and managed fields are dropped; capn knows its own from the plan.
pub fn owned_metadata<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    *meta = ObjectMeta {
        name: meta.name.take(),
        namespace: meta.namespace.take(),
        uid: meta.uid.take(),
        resource_version: meta.resource_version.take(),
        generation: meta.generation,
        owner_references: meta.owner_references.take(),
        deletion_timestamp: meta.deletion_timestamp.take(),
        ..ObjectMeta::default()
    };
}

/// A cached `object` as JSON with its `apiVersion` and `kind`: the shape the API server
/// returns, and what [`crate::apply::readiness`], the apply short cut and the apiserver's
/// certificate read from it. `None` only when `object` does not serialize to a JSON object.
pub fn api_json<K: Resource<DynamicType = ()> + serde::Serialize>(object: &K) -> Option<serde_json::Value> {
    let mut value = serde_json::to_value(object).ok()?;
    let map = value.as_object_mut()?;
    map.insert("apiVersion".into(), K::api_version(&()).into_owned().into());
    map.insert("kind".into(), K::kind(&()).into_owned().into());
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_metadata_keeps_identity_change_and_owners_only() {
        let mut set: CachedStatefulSet = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "demo-etcd",
                "namespace": "t",
                "uid": "u-1",
                "resourceVersion": "9",
                "generation": 2,
                "labels": {"applyset.kubernetes.io/part-of": "applyset-x-v1"},
                "annotations": {"capn.cluster.x-k8s.io/certificates-digest": "abc"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "NestedEtcd", "name": "demo-etcd", "uid": "u-0"}],
                "managedFields": [{"manager": "capn", "operation": "Apply"}],
            },
        }))
        .unwrap();
        owned_metadata(&mut set);
        assert_eq!(
            serde_json::to_value(&set.metadata).unwrap(),
            serde_json::json!({
                "name": "demo-etcd",
                "namespace": "t",
                "uid": "u-1",
                "resourceVersion": "9",
                "generation": 2,
                "ownerReferences": [{"apiVersion": "v1", "kind": "NestedEtcd", "name": "demo-etcd", "uid": "u-0"}],
            })
        );
    }
}
