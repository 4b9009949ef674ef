//! The downward API shows the tenant pod, not its super copy.
//!
//! - `env[*].valueFrom.fieldRef` of `metadata.name`, `metadata.namespace`, `metadata.uid`
//!   and `spec.serviceAccountName` become literal values of the tenant pod (they never
//!   change during a pod's life, and the super pod's would be its mapped name, the
//!   workload namespace, its own uid and `default`).
//! - In `downwardAPI` volumes and projected `downwardAPI` sources, a literal cannot be
//!   written, so the items of `metadata.name`, `metadata.namespace` and `metadata.uid` read
//!   the tenancy annotation that holds the tenant value instead
//!   (`metadata.annotations['tenancy.x-k8s.io/name']`, ...), a field path the downward API
//!   accepts in volumes and env alike. The file holds the same text.
//! - `metadata.labels` and `metadata.annotations`, whole or by key, are kept: the super
//!   pod's are the tenant's plus the `tenancy.x-k8s.io/` ones (and only those; the tenant
//!   cannot set keys under that prefix), so a pod listing all of them sees those extra keys.
//! - `spec.nodeName`, `status.hostIP(s)` and `status.podIP(s)` are kept: the tenant pod is
//!   bound to the same node and reports the same addresses (`upward`).

use k8s_openapi::api::core::v1::{DownwardAPIVolumeFile, PodSpec};

use crate::syncer::names::tenancy::{self, TenantObject};

/// Rewrites the downward API references of `spec`, the spec of the tenant pod `identity`
/// with service account `service_account`.
pub(super) fn rewrite(spec: &mut PodSpec, identity: &TenantObject, service_account: &str) {
    let containers = spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten());
    for env in containers.flat_map(|c| c.env.iter_mut().flatten()) {
        let path = env
            .value_from
            .as_ref()
            .and_then(|f| f.field_ref.as_ref())
            .map(|f| f.field_path.as_str());
        let literal = match path {
            Some("metadata.name") => &identity.name,
            Some("metadata.namespace") => &identity.namespace,
            Some("metadata.uid") => &identity.uid,
            Some("spec.serviceAccountName") => service_account,
            _ => continue,
        };
        env.value = Some(literal.to_owned());
        env.value_from = None;
    }
    for volume in spec.volumes.iter_mut().flatten() {
        let plain = volume.downward_api.as_mut().and_then(|d| d.items.as_mut());
        let sources = volume.projected.as_mut().and_then(|p| p.sources.as_mut());
        let projected = sources
            .into_iter()
            .flatten()
            .filter_map(|s| s.downward_api.as_mut().and_then(|d| d.items.as_mut()));
        for item in plain.into_iter().chain(projected).flatten() {
            read_tenancy_annotation(item);
        }
    }
}

fn read_tenancy_annotation(item: &mut DownwardAPIVolumeFile) {
    let Some(field) = item.field_ref.as_mut() else { return };
    let key = match field.field_path.as_str() {
        "metadata.name" => tenancy::NAME,
        "metadata.namespace" => tenancy::NAMESPACE,
        "metadata.uid" => tenancy::UID,
        _ => return,
    };
    field.field_path = format!("metadata.annotations['{key}']");
}
