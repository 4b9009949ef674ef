//! The one shape of a resource syncer (docs/developer/resource-syncers.md): how a tenant
//! object of one kind maps down to its copy in the workload namespace, how the patrol
//! compares the copy with what it should be, and what of the copy's status goes back up.
//! Everything here is pure; the engine that reads the caches, writes only what differs,
//! deletes orphans and reports refusals is `controllers::syncer::copies`, the same for every
//! kind that implements this trait.
//!
//! What the engine does for every implementation, so that no syncer repeats it:
//! - a tenant object being deleted, or whose [`ResourceSyncer::copy`] is `None`, has no
//!   copy; a copy whose tenant object is gone (or re-created: another uid) is deleted once a
//!   read of the tenant apiserver confirms it (`diff::orphans`; VirtualCluster's patrol
//!   deleted live objects on a lagging cache, kubernetes-sigs/cluster-api-provider-nested#308);
//! - a live object under the copy's name that is not this tenant object's copy
//!   (`diff::Ownership::Foreign`) is never touched (a Warning Event `NameConflict` on the
//!   tenant object says so); the copy of an earlier tenant object of
//!   the same name (`Stale`) is deleted first;
//! - a copy is written with server-side apply, forced, under capn's field manager, only when
//!   [`ResourceSyncer::is_current`] says it is not current; a refusal of the super cluster
//!   (403, 422) becomes a Warning Event `SuperClusterRefused` on the tenant object, carrying
//!   the super apiserver's message, and nothing else is written for it;
//! - [`ResourceSyncer::status_up`] is written to the tenant object (its `status`
//!   subresource when the kind has one) with the `resourceVersion` it was computed from, so
//!   a concurrent tenant write is never overwritten blindly (a conflict waits for the next
//!   pass).

use std::collections::BTreeSet;

use kube::Resource;
use kube::api::Api;

use super::names::tenancy::MissingField;
use super::names::{ControlPlaneRef, NameLimit};

/// One kind the syncer copies from the tenant into the control plane's workload namespace.
/// Implement it and add the syncer to its worker (`controllers::syncer::worker`); the
/// engine does the rest (see the module documentation).
pub trait ResourceSyncer: Send + Sync {
    /// The kind: a `k8s-openapi` type, or `kube::api::DynamicObject` for a kind known at
    /// run time.
    type Object: Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync;

    /// The kind's `DynamicType` (`()` for a `k8s-openapi` type, the `ApiResource` of a
    /// dynamic one).
    fn dynamic_type(&self) -> <Self::Object as Resource>::DynamicType;

    /// The kind's objects in `namespace` through `client` (either side).
    fn api(&self, client: kube::Client, namespace: &str) -> Api<Self::Object>;

    /// Which name syntax the kind's names follow, and so its copies' names.
    fn name_limit(&self) -> NameLimit;

    /// The copy of the tenant object `object` in the workload namespace of `control_plane`
    /// (named by `control_plane.super_name`, with the tenancy metadata of
    /// `names::tenancy::super_metadata`), or `None` when this object is not copied.
    ///
    /// Errors: [`MissingField`] when the object lacks its namespace, name or uid.
    fn copy(
        &self,
        control_plane: &ControlPlaneRef,
        object: &Self::Object,
    ) -> Result<Option<Self::Object>, MissingField>;

    /// Whether the live copy `live` is as `desired` (a [`ResourceSyncer::copy`]) in
    /// everything the syncer owns; what the super cluster adds (defaults, its admission's
    /// labels) must not count, or the pass would write forever.
    fn is_current(&self, desired: &Self::Object, live: &Self::Object) -> bool;

    /// The tenant object `object` as it should be after taking its copy `copy`'s status,
    /// or `None` when there is nothing to write (the default: the kind's status stays the
    /// tenant's).
    fn status_up(&self, object: &Self::Object, copy: &Self::Object) -> Option<Self::Object> {
        let _ = (object, copy);
        None
    }

    /// The tenant objects of `object`'s namespace its copy refers to (by their tenant
    /// names), whose own copies must exist before it is made: a pod's ConfigMaps, Secrets
    /// and claims. Each is copied by the syncer of its kind ([`ReferenceKind`]), and a copy
    /// whose reference is missing in the tenant waits for it, as a kubelet waits for a
    /// volume's source. None by default.
    fn references(&self, object: &Self::Object) -> BTreeSet<Reference> {
        let _ = object;
        BTreeSet::new()
    }

    /// Whether the kind has a `status` subresource, through which [`Self::status_up`]'s
    /// writes go (otherwise the whole object is replaced).
    fn has_status_subresource(&self) -> bool {
        true
    }
}

/// The kind of a referenced tenant object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ReferenceKind {
    ConfigMap,
    Secret,
    PersistentVolumeClaim,
}

/// A tenant object a copy refers to (a pod's ConfigMap, Secret or claim), by its tenant
/// name in the namespace of the object that refers to it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Reference {
    /// What kind of object is referred to.
    pub kind: ReferenceKind,
    /// Its tenant name; the super name is `ControlPlaneRef::super_name` of it, with
    /// `NameLimit::Subdomain`.
    pub name: String,
}
