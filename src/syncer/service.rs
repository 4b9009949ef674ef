//! Services (docs/design.md §11 "Services"): a tenant Service's copy in the workload
//! namespace, the super ClusterIP shown back on the tenant Service, and the Service
//! environment variables of a tenant pod.
//!
//! **The mechanism is VirtualCluster's.** The tenant Service keeps the ClusterIP its own
//! apiserver gave it (from the tenant's service CIDR); the copy gets one from the super
//! cluster, which is the address its proxies route: the tenant's own when it is free there
//! ([`asking_tenant_address`]), so that the two are one where the CIDRs agree. That address
//! is recorded on the tenant Service ([`SUPER_CLUSTER_IP`]), and what a tenant pod uses to
//! find a Service gives it: its Service environment variables ([`crate::syncer::pod::env`])
//! and the tenant's DNS (`crate::dns`). vcluster's alternative, giving the tenant Service
//! the super ClusterIP itself, needs the tenant's service CIDR to be the super cluster's and
//! the tenant Service deleted and made again under the new address (a ClusterIP is
//! immutable): a tenant object replaced behind its owner's back, a new uid, a moment without
//! the Service.
//!
//! **The copy** selects the tenant's selector *and* the tenant namespace
//! ([`tenancy::NAMESPACE`], a label every synced pod carries), so it reaches only the synced
//! pods of its own tenant namespace, and has the tenant's ports, session affinity, traffic
//! policy and `publishNotReadyAddresses`. It asks for nothing that reaches beyond the
//! tenant's share of the super cluster: no `externalIPs` (which let a Service capture any
//! address's traffic, CVE-2020-8554), no node ports unless the control plane allows them
//! (`spec.workloads.nodePortServices`; otherwise a `NodePort` Service is copied as
//! `ClusterIP`), no load balancers (`LoadBalancer` is copied as `ClusterIP`), no IP families
//! (the super cluster's defaults). A headless Service (`clusterIP: None`) stays headless. An `ExternalName`
//! Service is not copied: it is a DNS alias, which the tenant's DNS serves. Neither is the
//! tenant's own `default/kubernetes`: its pods reach their apiserver through
//! `KUBERNETES_SERVICE_HOST` (`pod::set_service_env`). A Service without a selector is
//! copied without one, and its EndpointSlices with it ([`endpoints`]).

pub mod endpoints;

use std::borrow::Borrow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::diff::metadata_drift;
use super::names::tenancy::{self, MissingField, TenantObject, super_metadata};
use super::names::{ControlPlaneRef, NameLimit};
use super::pod::env::ServiceLink;
use super::resource::ResourceSyncer;

/// Annotation on a tenant Service: the ClusterIP of its copy, the address tenant pods
/// reach it at (VirtualCluster's `transparency.tenancy.x-k8s.io/clusterIP`).
pub const SUPER_CLUSTER_IP: &str = "tenancy.x-k8s.io/super-cluster-ip";

/// The ClusterIP of a headless Service.
const HEADLESS: &str = "None";
/// The type of a Service that every node serves on a port of its own.
const NODE_PORT: &str = "NodePort";
/// Annotation on a tenant Service whose copy is a `NodePort` Service: the node port of each
/// of its ports in the super cluster, `<port>/<protocol>=<node port>` comma-separated, in
/// the order of the ports (where clients outside reach it, on any super node).
pub const SUPER_NODE_PORTS: &str = "tenancy.x-k8s.io/super-node-ports";

/// The copy of the tenant Service `service` in the workload namespace of `control_plane`,
/// or `None` for a Service that is not copied (see the module documentation). With
/// `node_ports` (the control plane's `spec.workloads.nodePortServices`), a `NodePort`
/// Service's copy is a `NodePort` Service too, with the tenant's `externalTrafficPolicy`;
/// its node ports are the super cluster's to allocate ([`asking_tenant_address`] asks for
/// the tenant's).
///
/// Errors: [`MissingField`] when the Service lacks its namespace, name or uid.
pub fn service_copy(
    control_plane: &ControlPlaneRef,
    service: &Service,
    node_ports: bool,
) -> Result<Option<Service>, MissingField> {
    if !is_copied(service) {
        return Ok(None);
    }
    let identity = TenantObject::of(&service.metadata)?;
    let spec = service.spec.clone().unwrap_or_default();
    let headless = is_headless(service);
    let node_port = node_ports && !headless && spec.type_.as_deref() == Some(NODE_PORT);
    let ports = spec.ports.map(|ports| {
        ports
            .into_iter()
            .map(|port| ServicePort {
                node_port: None,
                ..port
            })
            .collect()
    });
    Ok(Some(Service {
        metadata: super_metadata(control_plane, NameLimit::Label, &service.metadata)?,
        spec: Some(ServiceSpec {
            type_: Some(if node_port { NODE_PORT } else { "ClusterIP" }.to_owned()),
            external_traffic_policy: spec.external_traffic_policy.filter(|_| node_port),
            cluster_ip: headless.then(|| HEADLESS.to_owned()),
            cluster_ips: headless.then(|| vec![HEADLESS.to_owned()]),
            selector: scoped_selector(&identity.namespace, spec.selector),
            ports,
            session_affinity: spec.session_affinity,
            session_affinity_config: spec.session_affinity_config,
            publish_not_ready_addresses: spec.publish_not_ready_addresses,
            internal_traffic_policy: spec.internal_traffic_policy,
            traffic_distribution: spec.traffic_distribution,
            ..ServiceSpec::default()
        }),
        status: None,
    }))
}

/// `copy` asking the super cluster for the tenant Service's own ClusterIP (`clusterIP`
/// and `clusterIPs`), for a new copy: where the tenant's service CIDR lies in the super
/// cluster's and the address is free there, tenant and super addresses are one, and
/// `kubectl get svc` in the tenant shows the address pods dial. `None` when the tenant
/// Service has no address of its own (headless, or not allocated yet): the super cluster
/// then picks one, as it does when it refuses this one (422: out of its range, taken).
///
/// A `NodePort` copy asks for the tenant Service's node ports too, the same way.
pub fn asking_tenant_address(copy: &Service, tenant: &Service) -> Option<Service> {
    let spec = tenant.spec.as_ref()?;
    let address = spec
        .cluster_ip
        .as_deref()
        .filter(|ip| ip.parse::<std::net::IpAddr>().is_ok())?;
    let mut copy = copy.clone();
    let copy_spec = copy.spec.get_or_insert_with(Default::default);
    copy_spec.cluster_ip = Some(address.to_owned());
    copy_spec.cluster_ips = Some(vec![address.to_owned()]);
    if copy_spec.type_.as_deref() == Some(NODE_PORT) {
        take_node_ports(copy_spec, spec);
    }
    Some(copy)
}

/// `copy` asking for the tenant Service's node ports only, for a new `NodePort` copy whose
/// ask for the tenant's address too was refused (the address is taken in the super cluster,
/// or outside its range): the node ports may still be free, and the tenant Service then
/// shows ports that answer. `None` for a copy that is no `NodePort` Service or a tenant
/// Service without node ports.
pub fn asking_tenant_node_ports(copy: &Service, tenant: &Service) -> Option<Service> {
    let spec = tenant.spec.as_ref()?;
    let mut copy = copy.clone();
    let copy_spec = copy.spec.as_mut().filter(|s| s.type_.as_deref() == Some(NODE_PORT))?;
    take_node_ports(copy_spec, spec);
    copy_spec
        .ports
        .iter()
        .flatten()
        .any(|p| p.node_port.is_some())
        .then_some(copy)
}

/// `copy` keeping the live copy's ClusterIP and, while both are `NodePort` Services, its
/// node ports (immutable or allocated: an apply that names others is refused, and one that
/// names none would give the fields up).
pub fn keeping_live_address(mut copy: Service, live: &Service) -> Service {
    if let (Some(spec), Some(live)) = (copy.spec.as_mut(), live.spec.as_ref()) {
        if spec.cluster_ip.is_none() {
            spec.cluster_ip.clone_from(&live.cluster_ip);
            spec.cluster_ips.clone_from(&live.cluster_ips);
        }
        if spec.type_.as_deref() == Some(NODE_PORT) && live.type_.as_deref() == Some(NODE_PORT) {
            take_node_ports(spec, live);
        }
    }
    copy
}

/// Gives each port of `spec` the node port of the same port (number and protocol) in
/// `from`.
fn take_node_ports(spec: &mut ServiceSpec, from: &ServiceSpec) {
    for port in spec.ports.iter_mut().flatten() {
        port.node_port = from
            .ports
            .iter()
            .flatten()
            .find(|p| p.port == port.port && p.protocol == port.protocol)
            .and_then(|p| p.node_port);
    }
}

/// What [`SUPER_NODE_PORTS`] says of the copy `copy`: `None` unless it is a `NodePort`
/// Service whose node ports are allocated.
pub fn super_node_ports(copy: &Service) -> Option<String> {
    let spec = copy.spec.as_ref().filter(|s| s.type_.as_deref() == Some(NODE_PORT))?;
    let ports: Option<Vec<String>> = spec
        .ports
        .iter()
        .flatten()
        .map(|p| {
            let protocol = p.protocol.as_deref().unwrap_or("TCP");
            Some(format!("{}/{protocol}={}", p.port, p.node_port?))
        })
        .collect();
    ports.filter(|p| !p.is_empty()).map(|p| p.join(","))
}

/// Whether the tenant Service has a copy (not `ExternalName`, not `default/kubernetes`).
pub(crate) fn is_copied(service: &Service) -> bool {
    let external_name = service.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("ExternalName");
    let own_apiserver = service.metadata.namespace.as_deref() == Some("default")
        && service.metadata.name.as_deref() == Some("kubernetes");
    !external_name && !own_apiserver
}

fn is_headless(service: &Service) -> bool {
    service.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some(HEADLESS)
}

/// The tenant's selector and its namespace's label; none for a Service without a selector
/// (an empty selector selects nothing in a Service, as none does).
fn scoped_selector(namespace: &str, selector: Option<BTreeMap<String, String>>) -> Option<BTreeMap<String, String>> {
    let mut selector = selector.filter(|s| !s.is_empty())?;
    selector.insert(tenancy::NAMESPACE.to_owned(), namespace.to_owned());
    Some(selector)
}

/// Services as a resource syncer: [`service_copy`] down, [`copy_state`] for the patrol
/// (their status stays the tenant's; the super address goes up as an annotation, which the
/// services pass writes). A copy's first write asks for the tenant's own address first
/// ([`asking_tenant_address`]), which the services pass does itself.
pub struct Services {
    /// `spec.workloads.nodePortServices`.
    pub node_ports: bool,
}

impl ResourceSyncer for Services {
    type Object = Service;

    fn dynamic_type(&self) {}

    fn api(&self, client: kube::Client, namespace: &str) -> kube::Api<Service> {
        kube::Api::namespaced(client, namespace)
    }

    /// A Service's name becomes a DNS label.
    fn name_limit(&self) -> NameLimit {
        NameLimit::Label
    }

    fn copy(&self, control_plane: &ControlPlaneRef, service: &Service) -> Result<Option<Service>, MissingField> {
        service_copy(control_plane, service, self.node_ports)
    }

    fn is_current(&self, desired: &Service, live: &Service) -> bool {
        copy_state(desired, live) == CopyState::Current
    }
}

/// What a services pass does with a copy that exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyState {
    /// As wanted.
    Current,
    /// Drifted in a field an update may change: apply the desired copy.
    Update,
    /// Headless where it should not be, or the other way round (a ClusterIP is immutable):
    /// delete it, and make it again.
    Replace,
}

/// How the live copy `live` stands against the `desired` one: the syncer's fields only
/// (the super cluster's ClusterIP, node-port defaults and IP families are its own).
pub fn copy_state(desired: &Service, live: &Service) -> CopyState {
    let (Some(want), Some(have)) = (desired.spec.as_ref(), live.spec.as_ref()) else {
        return CopyState::Update;
    };
    if is_headless(desired) != is_headless(live) {
        return CopyState::Replace;
    }
    let ports = |spec: &ServiceSpec| {
        spec.ports
            .iter()
            .flatten()
            .map(|p| {
                (
                    p.name.clone(),
                    p.protocol.clone().unwrap_or_else(|| "TCP".to_owned()),
                    p.port,
                    p.target_port.clone().unwrap_or(IntOrString::Int(p.port)),
                    p.app_protocol.clone(),
                )
            })
            .collect::<Vec<_>>()
    };
    let set_and_differs = |want: Option<&str>, have: Option<&str>| want.is_some() && want != have;
    let drifted = !metadata_drift(&desired.metadata, &live.metadata).is_empty()
        || want.type_ != have.type_
        || want.external_traffic_policy.is_some() && want.external_traffic_policy != have.external_traffic_policy
        || want.selector != have.selector
        || ports(want) != ports(have)
        || set_and_differs(want.session_affinity.as_deref(), have.session_affinity.as_deref())
        || (want.session_affinity_config.is_some() && want.session_affinity_config != have.session_affinity_config)
        || want.publish_not_ready_addresses.unwrap_or(false) != have.publish_not_ready_addresses.unwrap_or(false)
        || set_and_differs(
            want.internal_traffic_policy.as_deref(),
            have.internal_traffic_policy.as_deref(),
        )
        || want.traffic_distribution != have.traffic_distribution;
    if drifted { CopyState::Update } else { CopyState::Current }
}

/// The ClusterIP of a copy, once the super cluster gave it one (none for a headless one).
pub fn cluster_ip(copy: &Service) -> Option<&str> {
    copy.spec
        .as_ref()?
        .cluster_ip
        .as_deref()
        .filter(|ip| !ip.is_empty() && *ip != HEADLESS)
}

/// The links of the Services of the tenant namespace `namespace` whose copies have a
/// ClusterIP, for a pod there, sorted by name, and the names of those still waiting for
/// one. `tenant_services` may hold other namespaces' (skipped); `copies` are the workload
/// namespace's Services.
pub fn service_links(
    control_plane: &ControlPlaneRef,
    namespace: &str,
    tenant_services: &[impl Borrow<Service>],
    copies: &[impl Borrow<Service>],
) -> (Vec<ServiceLink>, Vec<String>) {
    let addresses = super_addresses(control_plane, copies);
    let mut links = Vec::new();
    let mut waiting = Vec::new();
    for service in tenant_services.iter().map(Borrow::borrow) {
        let in_namespace = service.metadata.namespace.as_deref() == Some(namespace);
        let has_ip = service
            .spec
            .as_ref()
            .and_then(|s| s.cluster_ip.as_deref())
            .is_some_and(|ip| !ip.is_empty() && ip != HEADLESS);
        if !in_namespace || !has_ip || !is_copied(service) || service.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let Ok(identity) = TenantObject::of(&service.metadata) else {
            continue;
        };
        match addresses.get(&identity) {
            Some(address) => links.push(ServiceLink {
                name: identity.name,
                host: (*address).to_owned(),
                ports: service.spec.as_ref().and_then(|s| s.ports.clone()).unwrap_or_default(),
            }),
            None => waiting.push(identity.name),
        }
    }
    links.sort_by(|a, b| a.name.cmp(&b.name));
    waiting.sort();
    (links, waiting)
}

/// The tenant Services whose copies are among `copies` and have another address than
/// [`SUPER_CLUSTER_IP`] says (or none there), each with the address to write.
pub fn cluster_ip_changes<'a>(
    control_plane: &ControlPlaneRef,
    tenant_services: &'a [impl Borrow<Service>],
    copies: &[impl Borrow<Service>],
) -> Vec<(&'a Service, String)> {
    shown_changes(control_plane, tenant_services, copies, SUPER_CLUSTER_IP, |copy| {
        cluster_ip(copy).map(str::to_owned)
    })
}

/// The tenant Services whose copies among `copies` are `NodePort` Services with other
/// node ports than [`SUPER_NODE_PORTS`] says (or none there), each with the value to write.
pub fn node_port_changes<'a>(
    control_plane: &ControlPlaneRef,
    tenant_services: &'a [impl Borrow<Service>],
    copies: &[impl Borrow<Service>],
) -> Vec<(&'a Service, String)> {
    shown_changes(
        control_plane,
        tenant_services,
        copies,
        SUPER_NODE_PORTS,
        super_node_ports,
    )
}

/// The tenant Services (not being deleted) whose annotation `key` differs from what `of`
/// says of their copy among `copies` (copies it says nothing of are skipped), each with
/// the value to write.
fn shown_changes<'a>(
    control_plane: &ControlPlaneRef,
    tenant_services: &'a [impl Borrow<Service>],
    copies: &[impl Borrow<Service>],
    key: &str,
    of: impl Fn(&Service) -> Option<String>,
) -> Vec<(&'a Service, String)> {
    let wanted: BTreeMap<TenantObject, String> = copies
        .iter()
        .map(Borrow::borrow)
        .filter_map(|copy| Some((TenantObject::of_super(control_plane, &copy.metadata)?, of(copy)?)))
        .collect();
    tenant_services
        .iter()
        .map(Borrow::borrow)
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .filter_map(|service| {
            let wanted = wanted.get(&TenantObject::of(&service.metadata).ok()?)?;
            let shown = service.metadata.annotations.as_ref().and_then(|a| a.get(key));
            (shown != Some(wanted)).then(|| (service, wanted.clone()))
        })
        .collect()
}

/// The ClusterIP of each copy among `copies` that has one, by its tenant Service: where
/// pods reach the Service (its environment variables, tenant DNS).
pub fn super_addresses<'a>(
    control_plane: &ControlPlaneRef,
    copies: &'a [impl Borrow<Service>],
) -> BTreeMap<TenantObject, &'a str> {
    copies
        .iter()
        .map(Borrow::borrow)
        .filter_map(|copy| {
            Some((
                TenantObject::of_super(control_plane, &copy.metadata)?,
                cluster_ip(copy)?,
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests;
