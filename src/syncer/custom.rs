//! Public custom resources (docs/design.md §11 "Custom resources"): the instances a tenant
//! makes of a public CRD are copied into the workload namespace, where the super cluster's
//! operator serves them, and the copy's `status` comes back.
//!
//! **Which kinds.** A super CRD whose instances sync is public
//! (`tenancy.x-k8s.io/super.public: "true"`, so its copy is in every tenant), namespaced,
//! and opts in with the annotation [`SYNC_INSTANCES`]` = "true"`; a NestedControlPlane may
//! narrow them to a list (`spec.workloads.customResources`). Cluster-scoped CRDs never
//! sync instances: a cluster-scoped object has no tenant namespace to map, and would be one
//! object shared by every tenant of the super cluster. The tenant must hold capn's copy of
//! the CRD (a tenant's own CRD of that name is its business).
//!
//! **Who owns what.** The tenant owns `metadata` (labels, annotations) and every top-level
//! field but `status` (`spec`, and `data`-style fields of kinds without one); the super
//! cluster owns `status`. A super-side change to a field the tenant set is reverted at the
//! next pass; a field the super cluster adds (a default, a mutating webhook's) is left, so
//! the two sides never fight. A tenant-side status write is replaced by the copy's status at
//! the next pass. Objects the super cluster's operator makes beside the copy (its children)
//! are not synced up.
//!
//! **References are not rewritten.** A custom resource that names another object (a
//! Secret, a Service) names it in the tenant namespace; its copy names the same name in the
//! workload namespace, where that object is not (or is another tenant object's copy under a
//! mapped name). A kind that needs its references followed gets a syncer of its own through
//! [`crate::syncer::resource::ResourceSyncer`].

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject};
use serde_json::Value;

use super::diff::metadata_drift;
use super::names::tenancy::{MissingField, super_metadata};
use super::names::{ControlPlaneRef, NameLimit};
use super::resource::ResourceSyncer;

/// Annotation on a super CRD: `"true"` to sync the instances tenants make of it.
pub const SYNC_INSTANCES: &str = "tenancy.x-k8s.io/sync-instances";
/// Label that makes a super CRD public, and so copied into every tenant (the VirtualCluster
/// convention; `controllers::public_crds` copies them).
pub const PUBLIC_LABEL: &str = "tenancy.x-k8s.io/super.public";
/// Annotation on a copy: the tenant object's `metadata.generation` it was made from. A
/// tenant change to a field (a removal included) raises the generation, so the copy is
/// applied again and a removed field goes from it too.
pub const GENERATION: &str = "tenancy.x-k8s.io/generation";

/// A kind whose instances sync: its CRD's name, the version synced (the CRD's storage
/// version, which both sides serve: the tenant's CRD is a copy) and whether it has a
/// `status` subresource.
#[derive(Clone, Debug, PartialEq)]
pub struct SyncedKind {
    /// The CRD's `metadata.name` (`widgets.example.com`).
    pub crd: String,
    /// Group, storage version, kind and plural.
    pub resource: ApiResource,
    /// Whether the storage version has the `status` subresource.
    pub status_subresource: bool,
}

/// The kind whose instances sync for the super CRD `crd`, or `None` when it is not public,
/// not namespaced, does not opt in ([`SYNC_INSTANCES`]), or has no served storage version.
pub fn synced_kind(crd: &CustomResourceDefinition) -> Option<SyncedKind> {
    let labels = crd.metadata.labels.as_ref()?;
    let annotations = crd.metadata.annotations.as_ref()?;
    if labels.get(PUBLIC_LABEL).map(String::as_str) != Some("true")
        || annotations.get(SYNC_INSTANCES).map(String::as_str) != Some("true")
        || crd.spec.scope != "Namespaced"
    {
        return None;
    }
    let version = crd.spec.versions.iter().find(|v| v.storage && v.served)?;
    let group = &crd.spec.group;
    Some(SyncedKind {
        crd: crd.metadata.name.clone()?,
        resource: ApiResource {
            group: group.clone(),
            version: version.name.clone(),
            api_version: format!("{group}/{}", version.name),
            kind: crd.spec.names.kind.clone(),
            plural: crd.spec.names.plural.clone(),
        },
        status_subresource: version.subresources.as_ref().is_some_and(|s| s.status.is_some()),
    })
}

/// Whether `kind` syncs for a control plane that narrows the kinds to `allowed` (CRD
/// names; `None`: every kind that opts in).
pub fn allowed(kind: &SyncedKind, allowed: Option<&[String]>) -> bool {
    allowed.is_none_or(|names| names.contains(&kind.crd))
}

/// The generic syncer of one public custom resource kind.
#[derive(Clone, Debug, PartialEq)]
pub struct CustomResources(pub SyncedKind);

impl ResourceSyncer for CustomResources {
    type Object = DynamicObject;

    fn dynamic_type(&self) -> ApiResource {
        self.0.resource.clone()
    }

    fn api(&self, client: kube::Client, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(client, namespace, &self.0.resource)
    }

    /// Custom resource names are DNS-1123 subdomains (the apiserver's default for CRDs).
    fn name_limit(&self) -> NameLimit {
        NameLimit::Subdomain
    }

    /// The tenant's metadata mapped (`super_metadata`) with [`GENERATION`], and every
    /// top-level field but `status`.
    fn copy(
        &self,
        control_plane: &ControlPlaneRef,
        object: &DynamicObject,
    ) -> Result<Option<DynamicObject>, MissingField> {
        let mut metadata = super_metadata(control_plane, NameLimit::Subdomain, &object.metadata)?;
        if let Some(generation) = object.metadata.generation {
            metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(GENERATION.to_owned(), generation.to_string());
        }
        let mut data = object.data.clone();
        if let Some(fields) = data.as_object_mut() {
            fields.remove("status");
        }
        Ok(Some(DynamicObject {
            types: Some(kube::api::TypeMeta {
                api_version: self.0.resource.api_version.clone(),
                kind: self.0.resource.kind.clone(),
            }),
            metadata,
            data,
        }))
    }

    /// Current when the labels and annotations the syncer owns are as desired and every
    /// field of `desired` is in `live` with its value (fields the super cluster added do not
    /// count; see the module documentation).
    fn is_current(&self, desired: &DynamicObject, live: &DynamicObject) -> bool {
        metadata_drift(&desired.metadata, &live.metadata).is_empty() && contains(&live.data, &desired.data)
    }

    /// The tenant object with its copy's `status` (none when the copy has none), when the
    /// two differ.
    fn status_up(&self, object: &DynamicObject, copy: &DynamicObject) -> Option<DynamicObject> {
        let (have, want) = (object.data.get("status"), copy.data.get("status"));
        if have == want {
            return None;
        }
        let mut updated = object.clone();
        let fields = updated.data.as_object_mut()?;
        match want {
            Some(status) => fields.insert("status".to_owned(), status.clone()),
            None => fields.remove("status"),
        };
        updated.types.get_or_insert_with(|| kube::api::TypeMeta {
            api_version: self.0.resource.api_version.clone(),
            kind: self.0.resource.kind.clone(),
        });
        Some(updated)
    }

    fn has_status_subresource(&self) -> bool {
        self.0.status_subresource
    }
}

/// Whether `have` holds `want`: every key of an object with a value `have` holds too
/// (recursively); lists and scalars equal.
fn contains(have: &Value, want: &Value) -> bool {
    match (have, want) {
        (Value::Object(have), Value::Object(want)) => want
            .iter()
            .all(|(key, value)| have.get(key).is_some_and(|h| contains(h, value))),
        _ => have == want,
    }
}

#[cfg(test)]
mod tests;
