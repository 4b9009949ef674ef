//! Tenant DNS (docs/design.md §11 "DNS"): capn answers each tenant's cluster DNS itself,
//! from the syncer's watch caches of the tenant, in the role CoreDNS plays in a cluster.
//!
//! Why capn and not a CoreDNS per tenant: a tenant Service keeps its own ClusterIP, and
//! pods reach it at its super copy's (VirtualCluster's mechanism, docs/design.md §11
//! "Services"); a stock CoreDNS would answer the tenant's address, which nothing routes
//! (VirtualCluster patched CoreDNS to read the super address from an annotation). capn
//! already watches every tenant's Services and EndpointSlices for the syncer, so answering
//! costs no process, memory or watch per tenant.
//!
//! - [`zone`]: what a tenant's DNS answers (pure: the Kubernetes DNS specification);
//! - [`server`]: UDP and TCP, forwarding names outside the zone upstream;
//! - [`ports`]: one port per tenant, which tells the tenants apart.

pub mod ports;
pub mod server;
pub mod zone;

pub use ports::{Listener, Ports};
pub use server::{Source, Upstream, serve};
pub use zone::View;

/// Where capn serves its tenants' DNS (`capn run --dns-bind-address`, `--dns-ports`,
/// `--dns-upstream`, and `--kubelet-advertise-address` for the address pods reach).
#[derive(Clone, Debug)]
pub struct DnsEndpoint {
    /// The address the tenants' servers listen on (`0.0.0.0` by default).
    pub bind: std::net::IpAddr,
    /// The address super pods reach capn at (its pod IP in a super cluster): each tenant's
    /// DNS Service's endpoint.
    pub advertise: std::net::IpAddr,
    /// The ports the tenants' servers take, one each.
    pub ports: std::ops::RangeInclusive<u16>,
    /// Where names outside a tenant's zone are forwarded.
    pub upstream: Upstream,
}
