//! NestedCluster: the Cluster API infrastructure object of a nested cluster. It has no
//! machines; it is provisioned as soon as its control plane has an endpoint.

// kube-derive's `printcolumn(name = .., type_ = ..)` repeats keys by design.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ApiEndpoint;

/// Desired state of a nested cluster's infrastructure.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1beta1",
    kind = "NestedCluster",
    namespaced,
    status = "NestedClusterStatus",
    shortname = "nc",
    category = "cluster-api",
    doc = "Cluster API infrastructure of a nested cluster: the super cluster namespace its control plane runs in.",
    printcolumn(name = "Ready", type_ = "boolean", json_path = ".status.ready"),
    printcolumn(name = "Endpoint", type_ = "string", json_path = ".spec.controlPlaneEndpoint.host"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct NestedClusterSpec {
    /// The control plane's endpoint, copied from the NestedControlPlane by capn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<ApiEndpoint>,
}

/// Observed state of a nested cluster's infrastructure.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NestedClusterStatus {
    /// v1beta1 contract: infrastructure ready.
    #[serde(default)]
    pub ready: bool,
    /// v1beta2 contract: initialization milestones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<InfrastructureInitialization>,
    /// `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions: `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Cluster API v1beta2 `status.initialization` of an infrastructure cluster.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct InfrastructureInitialization {
    /// True once the control plane endpoint is known.
    #[serde(default)]
    pub provisioned: bool,
}
