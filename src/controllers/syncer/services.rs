//! The services pass (docs/design.md §11 "Services"; the rules are
//! [`crate::syncer::service`]'s): every tenant Service that is copied gets its copy in the
//! workload namespace, kept as the syncer made it (a change made on the super side is
//! reverted); the EndpointSlices of a Service without a selector are copied likewise; a copy
//! whose tenant object is gone, or no longer copied, is deleted (after a read of the tenant
//! confirms it, as the patrol does for pods); and each tenant Service shows its copy's
//! ClusterIP ([`SUPER_CLUSTER_IP`]). A pass reads only the caches and
//! writes only what differs; it runs when a Service changes on either side, and every
//! patrol period.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};

use super::caches::in_namespace;
use super::copies::{self, Prepared, SUPER_CLUSTER_REFUSED, apply, delete, delete_orphans, prepare};
use super::passes;
use super::scope::{TENANT_FIELD_MANAGER, Tenant, ignore_missing};
use crate::syncer::diff::Ownership;
use crate::syncer::service::endpoints::EndpointSlices;
use crate::syncer::service::{
    CopyState, SUPER_CLUSTER_IP, SUPER_NODE_PORTS, Services, asking_tenant_address, asking_tenant_node_ports,
    cluster_ip_changes, copy_state, keeping_live_address, node_port_changes,
};

/// Why a tenant Service's pods are reached at another address than its ClusterIP (a
/// Normal Event, once per change of the address).
const ADDRESS_DIFFERS: &str = "SuperClusterIPDiffers";
/// Where a `NodePort` Service's copy is served on the super nodes (a Normal Event, once per
/// change).
const NODE_PORTS: &str = "SuperNodePorts";

/// Runs the services pass until `wakes` ends (see [`passes::run`]).
pub(super) async fn run(tenant: &Tenant, wakes: futures::stream::BoxStream<'static, ()>) {
    let ready = async {
        tenant.tenant_services.wait_until_ready().await.is_ok()
            && tenant.super_services.wait_until_ready().await.is_ok()
    };
    passes::run("services", tenant, ready, wakes, || pass(tenant)).await;
}

/// One pass: copies down (Services, then the EndpointSlices of those without a selector),
/// orphaned copies out, super addresses up.
async fn pass(tenant: &Tenant) -> Result<(), kube::Error> {
    let services = tenant.tenant_services.state();
    let copies = in_namespace(&tenant.super_services, &tenant.namespace);
    copy_services(tenant, &services, &copies).await?;
    copy_slices(tenant, &services).await?;
    for (service, address) in cluster_ip_changes(tenant.control_plane(), &services, &copies) {
        let own = service
            .spec
            .as_ref()
            .and_then(|s| s.cluster_ip.as_deref())
            .unwrap_or_default();
        if own != address {
            let note = format!(
                "pods reach this Service at {address}, its copy's ClusterIP in the super cluster: its own ClusterIP {own} is taken there or outside the super cluster's service CIDR"
            );
            tenant.event(service, false, ADDRESS_DIFFERS, note).await;
        }
        show(tenant, service, SUPER_CLUSTER_IP, &address).await?;
    }
    for (service, ports) in node_port_changes(tenant.control_plane(), &services, &copies) {
        let note = format!("clients outside reach this Service on every super node at: {ports}");
        tenant.event(service, false, NODE_PORTS, note).await;
        show(tenant, service, SUPER_NODE_PORTS, &ports).await?;
    }
    Ok(())
}

/// Writes the annotation `key: value` on the tenant Service `service`.
async fn show(tenant: &Tenant, service: &Service, key: &str, value: &str) -> Result<(), kube::Error> {
    let shown = serde_json::json!({"metadata": {"annotations": {key: value}}});
    let params = PatchParams {
        field_manager: Some(TENANT_FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    let tenant_api = Api::<Service>::namespaced(tenant.tenant_client.clone(), &service.namespace().unwrap_or_default());
    ignore_missing(
        tenant_api
            .patch(&service.name_any(), &params, &Patch::Merge(shown))
            .await
            .map(drop),
    )
}

/// Every copied tenant Service's copy made or put right; orphans deleted.
async fn copy_services(tenant: &Tenant, services: &[Arc<Service>], copies: &[Arc<Service>]) -> Result<(), kube::Error> {
    let syncer = Services {
        node_ports: tenant.node_port_services,
    };
    let api = Api::<Service>::namespaced(tenant.super_client.clone(), &tenant.namespace);
    let mut copied = BTreeSet::new();
    for service in services.iter().filter(|s| s.metadata.deletion_timestamp.is_none()) {
        let Some(Prepared { copy, identity, live }) = prepare(tenant, &syncer, service, copies) else {
            continue;
        };
        let name = copy.name_any();
        let state = live.map(|(live, owner)| match owner {
            Ownership::Ours => copy_state(&copy, live),
            Ownership::Stale => CopyState::Replace,
            Ownership::Foreign => CopyState::Current,
        });
        copied.insert(identity);
        let refused = match (state, live) {
            (Some(CopyState::Current), _) => None,
            (Some(CopyState::Replace), _) => {
                delete(&api, &name).await?;
                None
            }
            (_, Some((live, _))) => apply(&syncer, &api, &name, &keeping_live_address(copy, live))
                .await?
                .err(),
            // A new copy asks for the tenant's own address (and node ports) first (free in
            // the super cluster's range: one address for both), then for its node ports
            // alone, then takes what it is given; only the last refusal counts.
            (_, None) => {
                let asks = [
                    asking_tenant_address(&copy, service),
                    asking_tenant_node_ports(&copy, service),
                ];
                let mut refused = None;
                for ask in asks.into_iter().flatten().chain([copy]) {
                    match apply(&syncer, &api, &name, &ask).await? {
                        Err(kube::Error::Api(e)) if e.code == 422 => refused = Some(kube::Error::Api(e)),
                        other => {
                            refused = other.err();
                            break;
                        }
                    }
                }
                refused
            }
        };
        if let (Some(kube::Error::Api(e)), None) = (refused, live) {
            let note = format!("the super cluster refused the Service's copy: {}", e.message);
            tenant.event(&**service, true, SUPER_CLUSTER_REFUSED, note).await;
        }
    }
    delete_orphans(tenant, &syncer, &api, copies, &copied).await
}

/// Every copied tenant EndpointSlice's copy made or put right, orphans deleted, a refusal
/// of the super cluster told in the tenant ([`copies::sync`]).
async fn copy_slices(tenant: &Tenant, services: &[Arc<Service>]) -> Result<(), kube::Error> {
    let copies = in_namespace(&tenant.super_slices, &tenant.namespace);
    let slices = tenant.tenant_slices.state();
    copies::sync(tenant, &EndpointSlices { services }, &slices, &copies).await
}
