//! What capn's cache keeps of a Service: its [`super::owned_metadata`],
//! `spec.type` (a `LoadBalancer` is ready once it has an ingress address), `spec.clusterIP`
//! (the apiserver's Service address, published in status and a SAN of its certificate) and
//! the status. Ports, selector and the rest of the spec are neither parsed nor kept.

use k8s_openapi::api::core::v1::ServiceStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

/// A Service as the watch cache holds it (`v1`).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct CachedService {
    /// Trimmed to [`super::owned_metadata`] as it arrives.
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<CachedServiceSpec>,
    /// As the API server reports it (`status.loadBalancer.ingress`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ServiceStatus>,
}

/// The spec fields capn reads.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedServiceSpec {
    /// `ClusterIP` (the API server's default), `NodePort`, `LoadBalancer` or `ExternalName`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// The address the API server allocated, or `None` for a headless Service.
    #[serde(default, rename = "clusterIP", skip_serializing_if = "Option::is_none")]
    pub cluster_ip: Option<String>,
}

super::cached_resource!(CachedService, "", "v1", "Service", "services");

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::readiness;

    fn service(type_: &str, ingress: serde_json::Value) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "demo-apiserver", "namespace": "t", "resourceVersion": "7"},
            "spec": {
                "type": type_,
                "clusterIP": "10.96.0.10",
                "clusterIPs": ["10.96.0.10"],
                "selector": {"app.kubernetes.io/name": "kube-apiserver"},
                "ports": [{"name": "https", "port": 6443, "targetPort": "https", "protocol": "TCP"}],
            },
            "status": {"loadBalancer": {"ingress": ingress}},
        })
    }

    #[test]
    fn a_service_keeps_what_readiness_and_the_address_read() {
        for full in [
            service("ClusterIP", serde_json::json!([])),
            service("LoadBalancer", serde_json::json!([])),
            service("LoadBalancer", serde_json::json!([{"ip": "192.0.2.1"}])),
        ] {
            let cached: CachedService = serde_json::from_value(full.clone()).unwrap();
            let json = crate::controllers::shared::cache::objects::api_json(&cached).unwrap();
            assert!(json.pointer("/spec/ports").is_none());
            assert_eq!(json.pointer("/spec/clusterIP"), full.pointer("/spec/clusterIP"));
            assert_eq!(json.pointer("/spec/type"), full.pointer("/spec/type"));
            assert_eq!(json.pointer("/metadata/resourceVersion"), Some(&serde_json::json!("7")));
            assert_eq!(readiness(&json), readiness(&full), "{full}");
        }
    }
}
