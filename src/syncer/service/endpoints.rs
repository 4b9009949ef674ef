//! The endpoints of a tenant Service without a selector: its EndpointSlices, made by the
//! tenant (or by the tenant's EndpointSlice mirroring controller from its Endpoints), are
//! copied for the Service's copy, whose own super controllers make none (it has no
//! selector either).
//!
//! A copy names the Service's copy (`kubernetes.io/service-name`) and is marked managed by
//! the syncer (`endpointslice.kubernetes.io/managed-by`), so the super cluster's mirroring
//! controller leaves it alone. It has the tenant's address type, ports and endpoints
//! (addresses, conditions, hostname) and nothing that names super-cluster objects or
//! places: no `targetRef`, `nodeName`, `zone` or hints. The addresses are the tenant's: a
//! selector-less Service exists to point at addresses no pod selector reaches (a database
//! outside the cluster). They give a tenant no reach its pods lack: the super cluster's
//! proxies send the traffic from the tenant's own pods, and its API server refuses loopback
//! and link-local addresses. EndpointSlices of a Service with a selector are not copied:
//! the super cluster's EndpointSlice controller makes the copy's from the synced pods.

use std::borrow::Borrow;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};

use super::is_copied;
use crate::syncer::diff::metadata_drift;
use crate::syncer::names::tenancy::{MissingField, super_metadata};
use crate::syncer::names::{ControlPlaneRef, NameLimit};
use crate::syncer::resource::ResourceSyncer;

/// Label: the Service an EndpointSlice serves.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Label: the controller that manages an EndpointSlice.
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// The syncer's value of [`MANAGED_BY_LABEL`] on the copies it makes.
pub const MANAGED_BY: &str = "syncer.capn.x-k8s.io";

/// The copy of the tenant EndpointSlice `slice`, or `None` when it is not copied: it
/// serves no Service among `tenant_services` (its namespace's), or one that is not copied
/// or has a selector.
///
/// Errors: [`MissingField`] when the slice lacks its namespace, name or uid.
pub fn slice_copy(
    control_plane: &ControlPlaneRef,
    slice: &EndpointSlice,
    tenant_services: &[impl Borrow<Service>],
) -> Result<Option<EndpointSlice>, MissingField> {
    let namespace = slice.metadata.namespace.as_deref();
    let Some(service_name) = slice.metadata.labels.as_ref().and_then(|l| l.get(SERVICE_NAME_LABEL)) else {
        return Ok(None);
    };
    let served = tenant_services
        .iter()
        .map(Borrow::borrow)
        .find(|s| s.metadata.namespace.as_deref() == namespace && s.metadata.name.as_ref() == Some(service_name));
    let selector_less = |s: &Service| {
        s.spec
            .as_ref()
            .and_then(|spec| spec.selector.as_ref())
            .is_none_or(|selector| selector.is_empty())
    };
    if !served.is_some_and(|s| is_copied(s) && selector_less(s)) {
        return Ok(None);
    }
    let mut metadata = super_metadata(control_plane, NameLimit::Subdomain, &slice.metadata)?;
    let labels = metadata.labels.get_or_insert_with(Default::default);
    let service_copy = control_plane.super_name(NameLimit::Label, namespace.unwrap_or_default(), service_name);
    labels.insert(SERVICE_NAME_LABEL.to_owned(), service_copy);
    labels.insert(MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned());
    let endpoints = slice.endpoints.as_ref().map(|endpoints| {
        endpoints
            .iter()
            .map(|e| Endpoint {
                addresses: e.addresses.clone(),
                conditions: e.conditions.clone(),
                hostname: e.hostname.clone(),
                ..Endpoint::default()
            })
            .collect()
    });
    Ok(Some(EndpointSlice {
        metadata,
        address_type: slice.address_type.clone(),
        endpoints,
        ports: slice.ports.clone(),
    }))
}

/// Whether the live copy `live` is as `desired` (its labels and annotations the syncer's,
/// its address type, endpoints and ports).
pub fn is_current(desired: &EndpointSlice, live: &EndpointSlice) -> bool {
    metadata_drift(&desired.metadata, &live.metadata).is_empty()
        && desired.address_type == live.address_type
        && desired.endpoints == live.endpoints
        && desired.ports == live.ports
}

/// The EndpointSlices of selector-less Services as a resource syncer, over the tenant
/// Services `services` (those the slices name are looked up there).
pub struct EndpointSlices<'a, S> {
    /// Every tenant Service (the slices' own namespaces' are looked up).
    pub services: &'a [S],
}

impl<S: Borrow<Service> + Send + Sync> ResourceSyncer for EndpointSlices<'_, S> {
    type Object = EndpointSlice;

    fn dynamic_type(&self) {}

    fn api(&self, client: kube::Client, namespace: &str) -> kube::Api<EndpointSlice> {
        kube::Api::namespaced(client, namespace)
    }

    fn name_limit(&self) -> NameLimit {
        NameLimit::Subdomain
    }

    fn copy(
        &self,
        control_plane: &ControlPlaneRef,
        slice: &EndpointSlice,
    ) -> Result<Option<EndpointSlice>, MissingField> {
        slice_copy(control_plane, slice, self.services)
    }

    fn is_current(&self, desired: &EndpointSlice, live: &EndpointSlice) -> bool {
        is_current(desired, live)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn control_plane() -> ControlPlaneRef {
        ControlPlaneRef::new("teams", "demo")
    }

    fn service(selector: serde_json::Value) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": "db", "namespace": "shop", "uid": "t-db"},
            "spec": {"selector": selector, "ports": [{"port": 5432}], "clusterIP": "10.96.0.9"}
        }))
        .unwrap()
    }

    fn slice() -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"name": "db-1", "namespace": "shop", "uid": "t-slice",
                "labels": {"kubernetes.io/service-name": "db",
                    "endpointslice.kubernetes.io/managed-by": "staff"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["192.0.2.10"], "conditions": {"ready": true},
                "nodeName": "node-a", "zone": "a",
                "targetRef": {"kind": "Pod", "namespace": "shop", "name": "db-0"}}],
            "ports": [{"name": "", "port": 5432, "protocol": "TCP"}]
        }))
        .unwrap()
    }

    #[test]
    fn a_selector_less_services_slice_is_copied_for_its_copy_without_super_names() {
        let copy = slice_copy(&control_plane(), &slice(), &[service(json!(null))])
            .unwrap()
            .expect("copied");
        let labels = copy.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[SERVICE_NAME_LABEL], "db-x-shop-x-demo");
        assert_eq!(
            labels[MANAGED_BY_LABEL], MANAGED_BY,
            "the super mirroring controller keeps off"
        );
        assert_eq!(copy.metadata.namespace.as_deref(), Some("teams-demo-workloads"));
        let endpoint = &copy.endpoints.as_ref().unwrap()[0];
        assert_eq!(endpoint.addresses, vec!["192.0.2.10".to_owned()]);
        assert_eq!(endpoint.conditions.as_ref().unwrap().ready, Some(true));
        assert_eq!(
            (&endpoint.node_name, &endpoint.zone, &endpoint.target_ref),
            (&None, &None, &None)
        );
        assert_eq!(copy.ports, slice().ports);
        let mut stored = copy.clone();
        stored.metadata.uid = Some("s-slice".into());
        assert!(is_current(&copy, &stored));
        stored.endpoints.as_mut().unwrap()[0].addresses = vec!["192.0.2.99".into()];
        assert!(
            !is_current(&copy, &stored),
            "a changed address on the super side is drift"
        );
    }

    #[test]
    fn slices_of_services_with_a_selector_or_of_no_copied_service_are_not_copied() {
        let selected = service(json!({"app": "db"}));
        assert_eq!(slice_copy(&control_plane(), &slice(), &[selected]), Ok(None));
        assert!(
            slice_copy(&control_plane(), &slice(), &[service(json!({}))])
                .unwrap()
                .is_some(),
            "an empty selector selects nothing: the slices are the tenant's"
        );
        let none: [Service; 0] = [];
        assert_eq!(slice_copy(&control_plane(), &slice(), &none), Ok(None));
        let mut alias = service(json!(null));
        alias.spec.as_mut().unwrap().type_ = Some("ExternalName".into());
        assert_eq!(slice_copy(&control_plane(), &slice(), &[alias]), Ok(None));
    }
}
