//! What capn's cache keeps of a StatefulSet: its [`super::owned_metadata`] plus capn's
//! template digest annotation (the surge of a single apiserver reads it), `spec.replicas`
//! and its status, the fields readiness and membership read. The rest of the spec, above all
//! the pod template, is neither parsed nor kept: a `k8s_openapi` StatefulSet is 2.5 KiB before
//! any of its strings, this one a fifth of that, and a thousand control planes cache three
//! each.

use k8s_openapi::api::apps::v1::StatefulSetStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use crate::apply::surge::TEMPLATE_DIGEST_ANNOTATION;

/// A StatefulSet as the watch cache holds it (`apps/v1`).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct CachedStatefulSet {
    /// Trimmed by [`trim`] as it arrives.
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<CachedStatefulSetSpec>,
    /// As the StatefulSet controller reports it (replica counts, observedGeneration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<StatefulSetStatus>,
}

/// The one spec field capn reads.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct CachedStatefulSetSpec {
    /// Desired pods; the API server defaults it to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
}

super::cached_resource!(CachedStatefulSet, "apps", "v1", "StatefulSet", "statefulsets");

/// Trims a StatefulSet as it arrives in the cache: [`super::owned_metadata`], keeping of its
/// annotations only [`TEMPLATE_DIGEST_ANNOTATION`], from which the next pass tells a roll
/// that starts from one under way (docs/design.md §5 "Surge").
pub fn trim(set: &mut CachedStatefulSet) {
    let digest = set
        .metadata
        .annotations
        .as_mut()
        .and_then(|a| a.remove(TEMPLATE_DIGEST_ANNOTATION));
    super::owned_metadata(set);
    if let Some(digest) = digest {
        set.metadata.annotations = Some([(TEMPLATE_DIGEST_ANNOTATION.to_string(), digest)].into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::readiness;

    #[test]
    fn a_statefulset_keeps_what_readiness_reads_and_drops_its_template() {
        let full = serde_json::json!({
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "demo-etcd", "namespace": "t", "generation": 2, "resourceVersion": "9"},
            "spec": {
                "replicas": 3,
                "serviceName": "demo-etcd",
                "template": {"spec": {"containers": [{"name": "etcd", "image": "registry.k8s.io/etcd:3.6.8-0"}]}},
            },
            "status": {
                "observedGeneration": 2,
                "replicas": 3,
                "readyReplicas": 3,
                "updatedReplicas": 3,
                "currentReplicas": 3,
            },
        });
        let cached: CachedStatefulSet = serde_json::from_value(full.clone()).unwrap();
        let json = crate::controllers::shared::cache::objects::api_json(&cached).unwrap();
        assert!(json.pointer("/spec/template").is_none());
        assert_eq!(json.pointer("/spec/replicas"), Some(&serde_json::json!(3)));
        assert_eq!(readiness(&json), readiness(&full));
        assert!(readiness(&json).ready);
    }

    #[test]
    fn a_statefulset_keeps_the_template_digest_and_no_other_annotation() {
        let mut set: CachedStatefulSet = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "demo-apiserver", "namespace": "t", "generation": 2,
                "annotations": {TEMPLATE_DIGEST_ANNOTATION: "abc", "other": "x"},
                "labels": {"applyset.kubernetes.io/part-of": "applyset-x-v1"}},
        }))
        .unwrap();
        trim(&mut set);
        assert_eq!(
            set.metadata.annotations,
            Some([(TEMPLATE_DIGEST_ANNOTATION.to_string(), "abc".to_string())].into())
        );
        assert_eq!(set.metadata.labels, None);
        let mut bare: CachedStatefulSet =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "demo-etcd"}})).unwrap();
        trim(&mut bare);
        assert_eq!(bare.metadata.annotations, None);
    }
}
