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
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};

use super::caches::in_namespace;
use super::passes;
use super::scope::{FIELD_MANAGER, TENANT_FIELD_MANAGER, Tenant, ignore_missing, typed};
use crate::syncer::diff::{Ownership, orphans, ownership};
use crate::syncer::names::NameLimit;
use crate::syncer::names::tenancy::{MissingField, TenantObject};
use crate::syncer::service::endpoints::{is_current, slice_copy};
use crate::syncer::service::{
    CopyState, SUPER_CLUSTER_IP, SUPER_NODE_PORTS, asking_tenant_address, asking_tenant_node_ports, cluster_ip_changes,
    copy_state, keeping_live_address, node_port_changes, service_copy,
};

/// Why a Service has no copy: the super cluster refused it (its quota on Services, a
/// policy).
const SUPER_CLUSTER_REFUSED: &str = "SuperClusterRefused";

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
    let control_plane = tenant.control_plane();
    let api = Api::<Service>::namespaced(tenant.super_client.clone(), &tenant.namespace);
    let mut copied = BTreeSet::new();
    for service in services.iter().filter(|s| s.metadata.deletion_timestamp.is_none()) {
        let made = service_copy(control_plane, service, tenant.node_port_services);
        let Some(Prepared { copy, identity, live }) =
            prepare(tenant, made, &service.metadata, copies, NameLimit::Label)
        else {
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
            (_, Some((live, _))) => apply(&api, &name, &keeping_live_address(copy, live)).await?.err(),
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
                    match apply(&api, &name, &ask).await? {
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
    let still = |s: &Service| matches!(service_copy(control_plane, s, tenant.node_port_services), Ok(Some(_)));
    delete_orphans(tenant, &api, copies, NameLimit::Label, &copied, still).await
}

/// Every copied tenant EndpointSlice's copy made or put right; orphans deleted.
async fn copy_slices(tenant: &Tenant, services: &[Arc<Service>]) -> Result<(), kube::Error> {
    let control_plane = tenant.control_plane();
    let api = Api::<EndpointSlice>::namespaced(tenant.super_client.clone(), &tenant.namespace);
    let copies = in_namespace(&tenant.super_slices, &tenant.namespace);
    let mut copied = BTreeSet::new();
    let slices = tenant.tenant_slices.state();
    for slice in slices.iter().filter(|s| s.metadata.deletion_timestamp.is_none()) {
        let made = slice_copy(control_plane, slice, services);
        let Some(Prepared { copy, identity, live }) =
            prepare(tenant, made, &slice.metadata, &copies, NameLimit::Subdomain)
        else {
            continue;
        };
        copied.insert(identity);
        let current = match live {
            Some((live, Ownership::Ours)) => is_current(&copy, live),
            Some((_, Ownership::Foreign)) => true,
            Some((_, Ownership::Stale)) | None => false,
        };
        // A refusal (the super cluster's validation of an address) is logged; the tenant's
        // own apiserver validated the same slice.
        if !current && let Err(error) = apply(&api, &copy.name_any(), &copy).await? {
            tracing::info!(%error, slice = %copy.name_any(), "the super cluster refused an EndpointSlice copy");
        }
    }
    let still = |s: &EndpointSlice| matches!(slice_copy(control_plane, s, services), Ok(Some(_)));
    delete_orphans(tenant, &api, &copies, NameLimit::Subdomain, &copied, still).await
}

/// What a pass needs of one tenant object that is copied: the copy (with this instance's
/// `--watch-filter` label), the tenant object's identity, and the live object of the copy's
/// name with what it is to the tenant object (`diff::ownership`).
struct Prepared<'a, K> {
    copy: K,
    identity: TenantObject,
    live: Option<(&'a K, Ownership)>,
}

/// [`Prepared`] for the tenant object of `meta` whose copy is `made`, among the live
/// `copies` (names following `limit`); `None` for an object that is not copied.
fn prepare<'a, K>(
    tenant: &Tenant,
    made: Result<Option<K>, MissingField>,
    meta: &ObjectMeta,
    copies: &'a [Arc<K>],
    limit: NameLimit,
) -> Option<Prepared<'a, K>>
where
    K: kube::Resource<DynamicType = ()>,
{
    let (Ok(Some(mut copy)), Ok(identity)) = (made, TenantObject::of(meta)) else {
        return None;
    };
    tenant.mark(copy.meta_mut());
    let name = copy.meta().name.clone();
    let live = copies.iter().find(|c| c.meta().name == name).map(|live| {
        (
            &**live,
            ownership(tenant.control_plane(), limit, &identity, live.meta()),
        )
    });
    Some(Prepared { copy, identity, live })
}

/// Deletes the copies among `copies` (names following `limit`) whose tenant object is not
/// among `copied`, once a read of the tenant confirms it is gone or no longer `still`
/// copied.
async fn delete_orphans<K>(
    tenant: &Tenant,
    api: &Api<K>,
    copies: &[Arc<K>],
    limit: NameLimit,
    copied: &BTreeSet<TenantObject>,
    still: impl Fn(&K) -> bool,
) -> Result<(), kube::Error>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let control_plane = tenant.control_plane();
    let metadata: Vec<_> = copies.iter().map(|c| c.meta().clone()).collect();
    for orphan in orphans(control_plane, limit, &metadata, copied) {
        let Some(owner) = TenantObject::of_super(control_plane, orphan) else {
            continue;
        };
        if orphan.deletion_timestamp.is_none() && !still_there(tenant, &owner, &still).await? {
            let name = orphan.name.as_deref().unwrap_or_default();
            tracing::info!(kind = %K::kind(&()), copy = %name, "deleting a copy whose tenant object is gone");
            delete(api, name).await?;
        }
    }
    Ok(())
}

/// Server-side applies `copy` (which makes it or puts it right alike, and owns every field
/// it sets, so a port or label the tenant drops later is dropped from the copy). A refusal
/// of the super cluster's admission or validation (403, 422) is returned inside `Ok`.
async fn apply<K>(api: &Api<K>, name: &str, copy: &K) -> Result<Result<(), kube::Error>, kube::Error>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api
        .patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(typed(copy)),
        )
        .await
    {
        Err(kube::Error::Api(e)) if e.code == 403 || e.code == 422 => Ok(Err(kube::Error::Api(e))),
        other => other.map(|_| Ok(())),
    }
}

/// Whether a read of the tenant shows `owner` (same uid) still there, not being deleted,
/// and `copied`: the caches may lag behind an object made meanwhile.
async fn still_there<K>(
    tenant: &Tenant,
    owner: &TenantObject,
    copied: &impl Fn(&K) -> bool,
) -> Result<bool, kube::Error>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let confirmed = Api::<K>::namespaced(tenant.tenant_client.clone(), &owner.namespace)
        .get_opt(&owner.name)
        .await?;
    Ok(confirmed.is_some_and(|o| {
        o.meta().uid.as_deref() == Some(owner.uid.as_str()) && o.meta().deletion_timestamp.is_none() && copied(&o)
    }))
}

async fn delete<K>(api: &Api<K>, name: &str) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    ignore_missing(api.delete(name, &DeleteParams::default()).await.map(drop))
}
