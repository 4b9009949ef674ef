//! Each tenant's cluster DNS (docs/design.md §11 "DNS"; the server is [`crate::dns`]'s): a
//! Service [`SERVICE_NAME`] in the workload namespace, port 53 over UDP and TCP, whose one
//! endpoint is capn at the tenant's own port. The tenant's pods get its ClusterIP as their
//! nameserver ([`crate::syncer::pod::dns`]) and capn answers from the worker's caches.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};

use super::caches::in_namespace;
use super::scope::{FIELD_MANAGER, Tenant, typed};
use crate::dns::{DnsEndpoint, Listener, Ports, View};
use crate::syncer::names::tenancy::TenantObject;
use crate::syncer::service::endpoints::{MANAGED_BY, MANAGED_BY_LABEL, SERVICE_NAME_LABEL};
use crate::syncer::service::super_addresses;

/// The name of the tenant DNS Service and its EndpointSlice in each workload namespace. No
/// synced object can have it: their names hold `-x-` or end in a hash.
pub const SERVICE_NAME: &str = "capn-dns";
/// How long the tenant apiserver's address, when its endpoint is a name, is kept between
/// lookups.
const APISERVER_LOOKUP: Duration = Duration::from_secs(30);

/// A tenant's DNS as it is exposed: the bound sockets and the Service's ClusterIP.
pub(super) struct Exposed {
    pub listener: Listener,
    pub nameserver: IpAddr,
}

/// The Service and EndpointSlice of the tenant DNS in the workload namespace `namespace`:
/// port 53 (UDP `dns`, TCP `dns-tcp`, as kube-dns names them) to capn's `advertise`
/// address at `port`. The Service has no selector, so the EndpointSlice is capn's to write
/// (`endpointslice.kubernetes.io/managed-by` the syncer, as for the copies).
pub(super) fn desired(namespace: &str, advertise: IpAddr, port: u16) -> (Service, EndpointSlice) {
    let meta = |labels: Vec<(&str, &str)>| ObjectMeta {
        name: Some(SERVICE_NAME.to_owned()),
        namespace: Some(namespace.to_owned()),
        labels: Some(
            [("app.kubernetes.io/managed-by", "capn")]
                .into_iter()
                .chain(labels)
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        ),
        ..ObjectMeta::default()
    };
    let ports = [("dns", "UDP"), ("dns-tcp", "TCP")];
    let service = Service {
        metadata: meta(Vec::new()),
        spec: Some(ServiceSpec {
            ports: Some(
                ports
                    .iter()
                    .map(|(name, protocol)| ServicePort {
                        name: Some((*name).to_owned()),
                        protocol: Some((*protocol).to_owned()),
                        port: 53,
                        target_port: Some(IntOrString::Int(i32::from(port))),
                        ..ServicePort::default()
                    })
                    .collect(),
            ),
            ..ServiceSpec::default()
        }),
        status: None,
    };
    let slice = EndpointSlice {
        metadata: meta(vec![(SERVICE_NAME_LABEL, SERVICE_NAME), (MANAGED_BY_LABEL, MANAGED_BY)]),
        address_type: if advertise.is_ipv4() { "IPv4" } else { "IPv6" }.to_owned(),
        endpoints: Some(vec![Endpoint {
            addresses: vec![advertise.to_string()],
            conditions: Some(EndpointConditions {
                ready: Some(true),
                ..EndpointConditions::default()
            }),
            ..Endpoint::default()
        }]),
        ports: Some(
            ports
                .iter()
                .map(|(name, protocol)| EndpointPort {
                    name: Some((*name).to_owned()),
                    protocol: Some((*protocol).to_owned()),
                    port: Some(i32::from(port)),
                    ..EndpointPort::default()
                })
                .collect(),
        ),
    };
    (service, slice)
}

/// Binds the tenant's port (the one its EndpointSlice names, when it still points at this
/// capn's address, so that a restart changes nothing in the super cluster) and applies the
/// Service and the EndpointSlice. `None` when no port of the range could be bound (logged:
/// the tenant's pods then keep the super cluster's DNS).
///
/// # Errors
/// A request to the super cluster failed.
pub(super) async fn expose(
    client: &Client,
    namespace: &str,
    endpoint: &DnsEndpoint,
    ports: &Arc<Ports>,
) -> Result<Option<Exposed>, kube::Error> {
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), namespace);
    let preferred = slices.get_opt(SERVICE_NAME).await?.and_then(|slice| {
        let ours = slice
            .endpoints
            .iter()
            .flatten()
            .flat_map(|e| &e.addresses)
            .any(|a| a.parse::<IpAddr>().ok() == Some(endpoint.advertise));
        let port = slice.ports.iter().flatten().find_map(|p| p.port)?;
        ours.then(|| u16::try_from(port).ok()).flatten()
    });
    let listener = match ports.bind(endpoint.bind, preferred) {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!(%error, %namespace, "no port for the tenant's DNS: its pods keep the super cluster's");
            return Ok(None);
        }
    };
    let (service, slice) = desired(namespace, endpoint.advertise, listener.lease.port());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let applied = Api::<Service>::namespaced(client.clone(), namespace)
        .patch(SERVICE_NAME, &params, &Patch::Apply(typed(&service)))
        .await?;
    slices
        .patch(SERVICE_NAME, &params, &Patch::Apply(typed(&slice)))
        .await?;
    let nameserver = applied
        .spec
        .and_then(|s| s.cluster_ip)
        .and_then(|ip| ip.parse::<IpAddr>().ok());
    Ok(nameserver.map(|nameserver| Exposed { listener, nameserver }))
}

/// One tenant's zone, from its worker's caches.
pub(super) struct Zone {
    pub tenant: Arc<Tenant>,
    /// The tenant's cluster domain.
    pub domain: String,
    /// The super cluster's, when it differs.
    pub super_domain: Option<String>,
    /// `--etcd-hosts-file`, through which capn reaches the tenant apiserver's name outside
    /// a super cluster (its pods' hosts files name it the same way).
    pub hosts: Option<crate::etcd::HostsFile>,
    /// The tenant apiserver's addresses as last looked up ([`Zone::look_up_apiserver`]).
    pub apiserver: Mutex<Vec<IpAddr>>,
}

impl Zone {
    /// Keeps [`Zone::apiserver`] current: the address of `controlPlaneEndpoint` (the host of
    /// `KUBERNETES_SERVICE_HOST`), looked up every [`APISERVER_LOOKUP`] when it is a name
    /// (one lookup at a time, never on a query's path). Where capn runs outside the super
    /// cluster its in-cluster name does not resolve: then the ClusterIP of the Service it
    /// names, read from the super cluster, which is what cluster DNS would answer pods.
    pub async fn look_up_apiserver(&self) {
        let host = self.tenant.target.apiserver.host.clone();
        loop {
            let found = if let Ok(ip) = host.parse::<IpAddr>() {
                vec![ip]
            } else if let Some(ip) = self.hosts.as_ref().and_then(|h| h.lookup(&host)) {
                vec![ip]
            } else {
                match tokio::net::lookup_host((host.as_str(), 0)).await {
                    Ok(found) => found.map(|a| a.ip()).collect(),
                    Err(error) => {
                        tracing::debug!(%error, %host, "tenant DNS: the apiserver's name did not resolve");
                        self.service_address(&host).await.into_iter().collect()
                    }
                }
            };
            *self.apiserver.lock().unwrap_or_else(|p| p.into_inner()) = found;
            tokio::time::sleep(APISERVER_LOOKUP).await;
        }
    }
}

impl Zone {
    /// The ClusterIP of the super cluster's Service that the in-cluster name `host` names.
    async fn service_address(&self, host: &str) -> Option<IpAddr> {
        let crate::reach::Target::Service { namespace, name } = crate::reach::Target::of_name(host)? else {
            return None;
        };
        let service =
            kube::Api::<k8s_openapi::api::core::v1::Service>::namespaced(self.tenant.super_client.clone(), &namespace)
                .get_opt(&name)
                .await
                .ok()
                .flatten()?;
        service.spec?.cluster_ip?.parse().ok()
    }
}

impl crate::dns::Source for Zone {
    async fn view(&self) -> View {
        let tenant = &self.tenant;
        let copies = in_namespace(&tenant.super_services, &tenant.namespace);
        let addresses: BTreeMap<(String, String), IpAddr> = super_addresses(tenant.control_plane(), &copies)
            .into_iter()
            .filter_map(|(TenantObject { namespace, name, .. }, ip)| Some(((namespace, name), ip.parse().ok()?)))
            .collect();
        View {
            domain: self.domain.clone(),
            services: tenant.tenant_services.state(),
            slices: tenant.tenant_slices.state(),
            addresses,
            apiserver: self.apiserver.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            super_domain: self.super_domain.clone(),
        }
    }

    /// Refuses the synced pods of other workload namespaces: a pod that found capn's
    /// address could otherwise ask another tenant's port. (A source the super cluster
    /// masquerades, or a pod capn did not sync, cannot be told apart and is answered.)
    fn admits(&self, address: IpAddr) -> bool {
        !another_tenants_pod(&self.tenant.super_pods.state(), &self.tenant.namespace, address)
    }
}

/// Whether `address` is a running pod's among the synced `pods` of every workload
/// namespace, and not of `own` workload namespace. Pods on the host's network (their
/// address is their node's) and pods that ran to their end (their address may be another
/// pod's now) tell nothing.
fn another_tenants_pod(pods: &[Arc<k8s_openapi::api::core::v1::Pod>], own: &str, address: IpAddr) -> bool {
    let text = address.to_string();
    pods.iter().any(|pod| {
        let host_network = pod.spec.as_ref().and_then(|s| s.host_network) == Some(true);
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        pod.metadata.namespace.as_deref() != Some(own)
            && !host_network
            && !matches!(phase, Some("Succeeded" | "Failed"))
            && pod
                .status
                .as_ref()
                .and_then(|s| s.pod_ips.as_ref())
                .is_some_and(|ips| ips.iter().any(|ip| ip.ip == text))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dns_service_sends_port_53_to_capn_at_the_tenants_port() {
        let (service, slice) = desired("ns-workloads", "10.0.0.5".parse().unwrap(), 20_007);
        let service = serde_json::to_value(service).unwrap();
        assert_eq!(
            service["spec"]["selector"],
            serde_json::Value::Null,
            "capn writes the endpoints"
        );
        assert_eq!(
            service["spec"]["ports"],
            serde_json::json!([
                {"name": "dns", "protocol": "UDP", "port": 53, "targetPort": 20007},
                {"name": "dns-tcp", "protocol": "TCP", "port": 53, "targetPort": 20007}
            ])
        );
        let slice = serde_json::to_value(slice).unwrap();
        assert_eq!(slice["metadata"]["labels"][SERVICE_NAME_LABEL], SERVICE_NAME);
        assert_eq!(slice["metadata"]["labels"][MANAGED_BY_LABEL], MANAGED_BY);
        assert_eq!(slice["addressType"], "IPv4");
        assert_eq!(slice["endpoints"][0]["addresses"], serde_json::json!(["10.0.0.5"]));
        assert_eq!(
            slice["ports"][1],
            serde_json::json!({"name": "dns-tcp", "protocol": "TCP", "port": 20007})
        );
        let (_, six) = desired("ns-workloads", "fd00::5".parse().unwrap(), 20_007);
        assert_eq!(six.address_type, "IPv6");
    }

    #[test]
    fn only_the_pods_of_other_workload_namespaces_are_refused() {
        let pod = |namespace: &str, ip: &str| -> Arc<k8s_openapi::api::core::v1::Pod> {
            Arc::new(
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": "p", "namespace": namespace},
                    "status": {"podIP": ip, "podIPs": [{"ip": ip}]}
                }))
                .unwrap(),
            )
        };
        let mut ended = pod("b-workloads", "198.18.1.4");
        Arc::make_mut(&mut ended).status.as_mut().unwrap().phase = Some("Succeeded".into());
        let mut on_host = pod("b-workloads", "198.18.1.5");
        Arc::make_mut(&mut on_host).spec = Some(k8s_openapi::api::core::v1::PodSpec {
            host_network: Some(true),
            ..Default::default()
        });
        let pods = [
            pod("a-workloads", "198.18.1.2"),
            pod("b-workloads", "198.18.1.3"),
            ended,
            on_host,
        ];
        let refused = |ip: &str| another_tenants_pod(&pods, "a-workloads", ip.parse().unwrap());
        assert!(!refused("198.18.1.2"), "its own pod");
        assert!(refused("198.18.1.3"), "another tenant's pod");
        assert!(!refused("198.18.1.4"), "a pod that ended: its address may be reused");
        assert!(!refused("198.18.1.5"), "a pod on its node's network");
        assert!(
            !refused("198.18.1.254"),
            "an address capn cannot tell (a node, masqueraded)"
        );
    }
}
