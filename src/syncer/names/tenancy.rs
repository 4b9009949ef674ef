//! The labels and annotations every synced object carries, naming its tenant object, and
//! the way back from a super object to that tenant object.
//!
//! The keys are VirtualCluster's (`tenancy.x-k8s.io/{cluster,namespace,uid}`, its
//! `pkg/syncer/constants`) plus `name`, since capn renames objects. Annotations carry every
//! value and are what the syncer reads back; labels repeat the values that are valid label
//! values (the tenant namespace always, name and uid when they fit), for selectors and for
//! `kubectl get -l`. The cluster, `<namespace>/<name>`, is never a label value (`/`).
//!
//! The tenant's own labels and annotations are copied, except any under
//! `tenancy.x-k8s.io/`: a tenant cannot forge or hide what names it. The two key lists
//! ([`LABEL_KEYS`], [`ANNOTATION_KEYS`]) record which tenant keys were copied, so a key the
//! tenant later removes is found on the super object and removed there too
//! (`diff::stale_keys`) while keys the super cluster's own admission added are left alone.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{ControlPlaneRef, NameLimit, is_label_value};

/// Prefix of every tenancy key; tenant labels and annotations under it are not copied.
pub const PREFIX: &str = "tenancy.x-k8s.io/";
/// Annotation: `<control plane namespace>/<control plane name>`.
pub const CLUSTER: &str = "tenancy.x-k8s.io/cluster";
/// Annotation and label: the tenant object's namespace.
pub const NAMESPACE: &str = "tenancy.x-k8s.io/namespace";
/// Annotation, and label when a valid label value: the tenant object's name.
pub const NAME: &str = "tenancy.x-k8s.io/name";
/// Annotation, and label when a valid label value: the tenant object's uid.
pub const UID: &str = "tenancy.x-k8s.io/uid";
/// Annotation: the tenant's label keys copied onto the super object, sorted, `,`-separated
/// (no key contains `,`).
pub const LABEL_KEYS: &str = "tenancy.x-k8s.io/label-keys";
/// Annotation: the tenant's annotation keys copied onto the super object, likewise.
pub const ANNOTATION_KEYS: &str = "tenancy.x-k8s.io/annotation-keys";

/// A tenant object by namespace, name and uid: what a super object stands for. A tenant
/// object deleted and created again under the same name is another `TenantObject`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TenantObject {
    /// `metadata.namespace` in the tenant cluster.
    pub namespace: String,
    /// `metadata.name` in the tenant cluster.
    pub name: String,
    /// `metadata.uid` in the tenant cluster.
    pub uid: String,
}

/// A tenant object without the identity the syncer needs; the field is its path.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the tenant object has no {field}; only objects the tenant apiserver stored can be synced")]
pub struct MissingField {
    /// The missing field's path (`metadata.uid`).
    pub field: &'static str,
}

impl TenantObject {
    /// The identity of a tenant object from its own metadata.
    ///
    /// Errors: [`MissingField`] when `metadata.namespace`, `metadata.name` or
    /// `metadata.uid` is empty (an object the tenant apiserver stored has all three).
    pub fn of(meta: &ObjectMeta) -> Result<Self, MissingField> {
        let field = |value: &Option<String>, field| match value.as_deref() {
            Some(v) if !v.is_empty() => Ok(v.to_owned()),
            _ => Err(MissingField { field }),
        };
        Ok(Self {
            namespace: field(&meta.namespace, "metadata.namespace")?,
            name: field(&meta.name, "metadata.name")?,
            uid: field(&meta.uid, "metadata.uid")?,
        })
    }

    /// The tenant object a super object stands for, read from its tenancy annotations;
    /// `None` when they are missing or name another control plane than `control_plane`
    /// (then the object is not the syncer's to touch).
    pub fn of_super(control_plane: &ControlPlaneRef, meta: &ObjectMeta) -> Option<Self> {
        let annotations = meta.annotations.as_ref()?;
        if annotations.get(CLUSTER)? != &control_plane.key() {
            return None;
        }
        Some(Self {
            namespace: annotations.get(NAMESPACE)?.clone(),
            name: annotations.get(NAME)?.clone(),
            uid: annotations.get(UID)?.clone(),
        })
    }
}

/// The metadata of the super copy of a tenant object: its mapped name in the workload
/// namespace, the tenant's labels and annotations with the tenancy ones, and nothing else
/// (uid, resourceVersion, generateName, ownerReferences, finalizers, managedFields and
/// timestamps belong to the tenant object; the super cluster sets its own).
///
/// Errors: [`MissingField`], as [`TenantObject::of`].
pub fn super_metadata(
    control_plane: &ControlPlaneRef,
    limit: NameLimit,
    tenant: &ObjectMeta,
) -> Result<ObjectMeta, MissingField> {
    let object = TenantObject::of(tenant)?;
    let (mut labels, label_keys) = copied(tenant.labels.as_ref());
    let (mut annotations, annotation_keys) = copied(tenant.annotations.as_ref());
    for (key, value) in [(NAMESPACE, &object.namespace), (NAME, &object.name), (UID, &object.uid)] {
        if is_label_value(value) {
            labels.insert(key.to_owned(), value.clone());
        }
        annotations.insert(key.to_owned(), value.clone());
    }
    annotations.insert(CLUSTER.to_owned(), control_plane.key());
    annotations.insert(LABEL_KEYS.to_owned(), label_keys);
    annotations.insert(ANNOTATION_KEYS.to_owned(), annotation_keys);
    Ok(ObjectMeta {
        name: Some(control_plane.super_name(limit, &object.namespace, &object.name)),
        namespace: Some(control_plane.workload_namespace()),
        labels: Some(labels),
        annotations: Some(annotations),
        ..ObjectMeta::default()
    })
}

/// The tenant's entries outside [`PREFIX`], and their keys as a key-list annotation value.
fn copied(tenant: Option<&BTreeMap<String, String>>) -> (BTreeMap<String, String>, String) {
    let kept: BTreeMap<String, String> = tenant
        .into_iter()
        .flatten()
        .filter(|(key, _)| !key.starts_with(PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let keys = kept.keys().map(String::as_str).collect::<Vec<_>>().join(",");
    (kept, keys)
}

/// The keys a key-list annotation value names.
pub fn listed_keys(value: &str) -> impl Iterator<Item = &str> {
    value.split(',').filter(|key| !key.is_empty())
}
