//! The custom resources capn serves (docs/design.md §2), as Rust types from which the CRDs in
//! `crds/` are generated.
//!
//! `controlplane.cluster.x-k8s.io/v1beta1`: [`NestedControlPlane`], [`NestedEtcd`],
//! [`NestedAPIServer`], [`NestedControllerManager`].
//! `infrastructure.cluster.x-k8s.io/v1beta1`: [`NestedCluster`].
//! This module holds types only; behaviour lives in the controllers.

mod audit;
mod authentication;
mod authorization;
mod backup;
mod cluster;
mod component;
mod control_plane;
mod templates;

pub use audit::*;
pub use authentication::*;
pub use authorization::*;
pub use backup::*;
pub use cluster::*;
pub use component::*;
pub use control_plane::*;
pub use templates::*;

/// API group of the control plane kinds (the Cluster API control plane provider group).
pub const CONTROL_PLANE_GROUP: &str = "controlplane.cluster.x-k8s.io";
/// API group of [`NestedCluster`] (the Cluster API infrastructure provider group).
pub const INFRASTRUCTURE_GROUP: &str = "infrastructure.cluster.x-k8s.io";
/// Label naming the Cluster API cluster an object belongs to (CAPI contract).
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";

/// Labels on every CRD telling Cluster API which of our API versions implements each
/// contract version (`cluster.x-k8s.io/<contract>: <our versions>`, CAPI provider contract).
pub const CONTRACT_LABELS: [(&str, &str); 2] = [
    ("cluster.x-k8s.io/v1beta1", "v1beta1"),
    ("cluster.x-k8s.io/v1beta2", "v1beta1"),
];
