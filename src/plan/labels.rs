//! Standard labels, ownership and the namespace rule applied to every planned object.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::api::CLUSTER_NAME_LABEL;
use crate::component::ComponentKind;

/// Value of `app.kubernetes.io/managed-by` on everything capn applies.
pub const MANAGED_BY: &str = "capn";

/// Labels that select the pods of one component of one cluster:
/// `app.kubernetes.io/name` (the component) and `app.kubernetes.io/instance` (the cluster).
pub fn selector_labels(kind: ComponentKind, cluster: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), kind.as_str().to_string()),
        ("app.kubernetes.io/instance".to_string(), cluster.to_string()),
    ])
}

/// The standard labels of docs/design.md §5: the selector labels plus
/// `app.kubernetes.io/component: control-plane`, `app.kubernetes.io/managed-by: capn` and
/// `cluster.x-k8s.io/cluster-name`.
pub fn standard_labels(kind: ComponentKind, cluster: &str) -> BTreeMap<String, String> {
    let mut labels = selector_labels(kind, cluster);
    labels.insert("app.kubernetes.io/component".into(), "control-plane".into());
    labels.insert("app.kubernetes.io/managed-by".into(), MANAGED_BY.into());
    labels.insert(CLUSTER_NAME_LABEL.into(), cluster.into());
    labels
}

/// Puts `labels` (over any the template set) and `owner` as the only owner reference on
/// `object`, and fills `metadata.namespace` when the template left it out.
///
/// # Errors
/// The object's namespace when it names another namespace than `namespace`: a channel
/// may not place objects outside the cluster's namespace (docs/design.md §4).
pub fn finalize_object(
    object: &mut serde_json::Value,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    owner: &OwnerReference,
) -> Result<(), String> {
    let metadata = object
        .as_object_mut()
        .and_then(|o| o.get_mut("metadata"))
        .and_then(|m| m.as_object_mut())
        .ok_or_else(|| "has no metadata".to_string())?;
    match metadata.get("namespace").and_then(|n| n.as_str()) {
        None => {
            metadata.insert("namespace".into(), namespace.into());
        }
        Some(ns) if ns == namespace => {}
        Some(other) => {
            return Err(format!(
                "is in namespace {other:?}, not the cluster's namespace {namespace:?}"
            ));
        }
    }
    let existing = metadata.entry("labels").or_insert_with(|| serde_json::json!({}));
    if let Some(map) = existing.as_object_mut() {
        for (k, v) in labels {
            map.insert(k.clone(), v.clone().into());
        }
    }
    metadata.insert(
        "ownerReferences".into(),
        serde_json::to_value(vec![owner]).map_err(|e| e.to_string())?,
    );
    Ok(())
}
