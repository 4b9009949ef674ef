//! What the objects the syncer makes for one super pod share (its token Secret, its trust
//! bundle ConfigMap, its certificate Secret): their metadata, owned by the super pod so that
//! the garbage collector deletes them with it, and how their refresh times become requeues.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::scope::Tenant;
use crate::syncer::names::tenancy::{self, TenantObject};

/// The metadata of the object `name` the syncer makes in the workload namespace for the
/// super pod `live` of the tenant pod `pod`: owned by `live`, labelled so that the shared
/// super caches hold it (and with this instance's watch filter), the control plane and
/// `annotations` as annotations.
pub(super) fn metadata(
    tenant: &Tenant,
    pod: &TenantObject,
    live: &Pod,
    name: &str,
    annotations: BTreeMap<String, String>,
) -> ObjectMeta {
    let mut annotations = annotations;
    annotations.insert(tenancy::CLUSTER.to_owned(), tenant.control_plane().key());
    let mut metadata = ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(tenant.namespace.clone()),
        labels: Some(
            [
                ("app.kubernetes.io/managed-by".to_owned(), "capn".to_owned()),
                (tenancy::NAMESPACE.to_owned(), pod.namespace.clone()),
            ]
            .into(),
        ),
        annotations: Some(annotations),
        owner_references: Some(vec![OwnerReference {
            api_version: "v1".to_owned(),
            kind: "Pod".to_owned(),
            name: live.name_any(),
            uid: live.metadata.uid.clone().unwrap_or_default(),
            ..OwnerReference::default()
        }]),
        ..ObjectMeta::default()
    };
    tenant.mark(&mut metadata);
    metadata
}

/// From `now` to `due`, at least a second.
pub(super) fn until(now: Timestamp, due: Timestamp) -> Duration {
    Duration::try_from(due.duration_since(now))
        .unwrap_or_default()
        .max(Duration::from_secs(1))
}
