//! Templates for Cluster API's ClusterClass: NestedControlPlaneTemplate and
//! NestedClusterTemplate (CAPI contract: `spec.template.spec` holds the object's spec).

// kube-derive's `printcolumn(name = .., type_ = ..)` repeats keys by design.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{NestedClusterSpec, NestedControlPlaneSpec};

/// Labels and annotations a template gives the objects made from it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMetaTemplate {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// Spec of a [`NestedControlPlaneTemplate`].
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "controlplane.cluster.x-k8s.io",
    version = "v1beta1",
    kind = "NestedControlPlaneTemplate",
    namespaced,
    shortname = "ncpt",
    category = "cluster-api",
    doc = "A template of NestedControlPlanes, for Cluster API ClusterClasses.",
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct NestedControlPlaneTemplateSpec {
    pub template: NestedControlPlaneTemplateResource,
}

/// What a NestedControlPlane made from the template looks like.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NestedControlPlaneTemplateResource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMetaTemplate>,
    #[serde(default)]
    pub spec: NestedControlPlaneSpec,
}

/// Spec of a [`NestedClusterTemplate`].
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1beta1",
    kind = "NestedClusterTemplate",
    namespaced,
    shortname = "nct",
    category = "cluster-api",
    doc = "A template of NestedClusters, for Cluster API ClusterClasses.",
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct NestedClusterTemplateSpec {
    pub template: NestedClusterTemplateResource,
}

/// What a NestedCluster made from the template looks like.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NestedClusterTemplateResource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMetaTemplate>,
    #[serde(default)]
    pub spec: NestedClusterSpec,
}
