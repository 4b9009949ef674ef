//! Whose a super object is, and which super objects outlived their tenant object.
//!
//! A super object is the synced copy of a tenant object when its tenancy annotations name
//! that object under this control plane *and* its name is the one the mapping gives that
//! object: an object made for another purpose in the workload namespace (a pod's token
//! Secret, named differently) is never taken for a copy, however it is annotated.
//!
//! Orphans are copies whose tenant object is gone, a tenant object re-created under the
//! same name (another uid) included. The patrol that acts on them must confirm each
//! absence with a read of the tenant apiserver, not only of its cache: VirtualCluster's
//! patrol deleted live pods when its tenant caches lagged
//! (kubernetes-sigs/cluster-api-provider-nested#308).

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::syncer::names::tenancy::TenantObject;
use crate::syncer::names::{ControlPlaneRef, NameLimit};

/// What a live super object is to the syncer of one tenant object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// The copy of this tenant object: the syncer updates it.
    Ours,
    /// The copy of an earlier tenant object of the same namespace and name (another uid):
    /// delete it, then create the new copy.
    Stale,
    /// Not a copy of this tenant object nor of an earlier one of its name (another tenant
    /// object whose name hashed alike, or an object the syncer did not make): never
    /// touched; the controller reports a conflict.
    Foreign,
}

/// The copy of which tenant object `live` is (kind names following `limit`), if any.
pub fn copy_of(control_plane: &ControlPlaneRef, limit: NameLimit, live: &ObjectMeta) -> Option<TenantObject> {
    let tenant = TenantObject::of_super(control_plane, live)?;
    let expected = control_plane.super_name(limit, &tenant.namespace, &tenant.name);
    (live.name.as_deref() == Some(expected.as_str())).then_some(tenant)
}

/// What `live`, found under the super name of `tenant`, is to the syncer.
pub fn ownership(
    control_plane: &ControlPlaneRef,
    limit: NameLimit,
    tenant: &TenantObject,
    live: &ObjectMeta,
) -> Ownership {
    match copy_of(control_plane, limit, live) {
        Some(copy) if copy == *tenant => Ownership::Ours,
        Some(copy) if copy.namespace == tenant.namespace && copy.name == tenant.name => Ownership::Stale,
        _ => Ownership::Foreign,
    }
}

/// The super objects among `super_objects` (one kind, names following `limit`) that are
/// copies of tenant objects not in `tenant_objects`, in input order. Objects that are no
/// copy under this control plane are never orphans.
pub fn orphans<'a>(
    control_plane: &ControlPlaneRef,
    limit: NameLimit,
    super_objects: &'a [ObjectMeta],
    tenant_objects: &BTreeSet<TenantObject>,
) -> Vec<&'a ObjectMeta> {
    super_objects
        .iter()
        .filter(|live| copy_of(control_plane, limit, live).is_some_and(|tenant| !tenant_objects.contains(&tenant)))
        .collect()
}
