//! Subjects, usages and subject alternative names of every credential of a nested control
//! plane (docs/reference.md "Identities" and "Names clients dial (SANs)").

use std::net::{IpAddr, Ipv4Addr};

use super::{LeafSpec, PkiError};

/// Common name of the cluster CA (docs/reference.md "Identities", kubeadm).
pub const CLUSTER_CA_COMMON_NAME: &str = "kubernetes";
/// Common name of the etcd CA (docs/reference.md "Identities", kubeadm).
pub const ETCD_CA_COMMON_NAME: &str = "etcd-ca";
/// Common name of the front-proxy CA (docs/reference.md "Identities", kubeadm).
pub const FRONT_PROXY_CA_COMMON_NAME: &str = "front-proxy-ca";

/// Group that Kubernetes' default RBAC binds to `cluster-admin`.
const SYSTEM_MASTERS: &str = "system:masters";

/// What the apiserver serving certificate's SANs depend on (docs/reference.md "Names clients
/// dial").
#[derive(Clone, Copy, Debug)]
pub struct ApiServerSanInput<'a> {
    /// Cluster name `<c>`: the apiserver Service is `<c>-apiserver`.
    pub cluster_name: &'a str,
    /// Namespace `<ns>` of the control plane in the super cluster.
    pub namespace: &'a str,
    /// Tenant cluster DNS domain `<d>` (usually `cluster.local`).
    pub tenant_dns_domain: &'a str,
    /// DNS domain `<sd>` of the super cluster.
    pub super_dns_domain: &'a str,
    /// Tenant service CIDR, for example `10.96.0.0/12`; a comma-separated dual-stack list
    /// (`10.96.0.0/12,fd00::/108`) is accepted and every family's first address is added.
    pub service_cidr: &'a str,
    /// ClusterIP of the `<c>-apiserver` Service in the super cluster, once known.
    pub service_cluster_ip: Option<IpAddr>,
    /// Host of the control-plane endpoint: a DNS name, an IPv4 address or an IPv6 address
    /// (brackets allowed and stripped). `None` or empty: no endpoint yet.
    pub endpoint_host: Option<&'a str>,
    /// The user's extra SANs (`certSANs`): IP addresses or DNS names (wildcards `*.` allowed).
    pub cert_sans: &'a [String],
}

/// The apiserver serving certificate: CN `kube-apiserver`, serverAuth, and every name clients
/// dial (docs/reference.md "Names clients dial (SANs)", kubeadm):
///
/// - DNS: `kubernetes`, `kubernetes.default`, `kubernetes.default.svc`,
///   `kubernetes.default.svc.<d>`, `<c>-apiserver`, `<c>-apiserver.<ns>`,
///   `<c>-apiserver.<ns>.svc`, `<c>-apiserver.<ns>.svc.<sd>`, `localhost`, the endpoint host
///   when it is a name, every `certSANs` name;
/// - IP: the first address of each tenant service CIDR (`10.96.0.1` for `10.96.0.0/12`), the
///   `<c>-apiserver` ClusterIP, `127.0.0.1`, the endpoint host when it is an IP, every
///   `certSANs` IP.
///
/// DNS names are lower-cased (a trailing `.` is dropped); duplicates are removed keeping the
/// first occurrence.
///
/// Errors: [`PkiError::InvalidCidr`] when a service CIDR does not parse or has no room for a
/// first host address; [`PkiError::InvalidSan`] when a domain, the endpoint host or a
/// `certSANs` entry is neither an IP address nor a valid DNS name.
pub fn apiserver_leaf(input: ApiServerSanInput<'_>) -> Result<LeafSpec, PkiError> {
    let c = input.cluster_name;
    let ns = input.namespace;
    let d = dns_name(input.tenant_dns_domain, false)?;
    let sd = dns_name(input.super_dns_domain, false)?;
    let mut names = Names::default();
    for raw in [
        "kubernetes".to_string(),
        "kubernetes.default".to_string(),
        "kubernetes.default.svc".to_string(),
        format!("kubernetes.default.svc.{d}"),
        format!("{c}-apiserver"),
        format!("{c}-apiserver.{ns}"),
        format!("{c}-apiserver.{ns}.svc"),
        format!("{c}-apiserver.{ns}.svc.{sd}"),
        "localhost".to_string(),
    ] {
        names.dns(dns_name(&raw, false)?);
    }
    for ip in service_cidr_first_ips(input.service_cidr)? {
        names.ip(ip);
    }
    if let Some(ip) = input.service_cluster_ip {
        names.ip(ip);
    }
    names.ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
    if let Some(host) = input.endpoint_host.filter(|h| !h.trim().is_empty()) {
        names.any(host, false)?;
    }
    for san in input.cert_sans {
        names.any(san, true)?;
    }
    Ok(LeafSpec {
        common_name: "kube-apiserver".to_string(),
        organization: None,
        server: true,
        client: false,
        dns_names: names.dns,
        ip_addresses: names.ips,
    })
}

/// The first host address of each CIDR in `service_cidr` (comma-separated for dual-stack):
/// the network address plus one, as kubeadm's `GetAPIServerVirtualIP`. This is the ClusterIP
/// of the tenant's `kubernetes` Service: `10.96.0.1` for `10.96.0.0/12`, `fd00::1` for
/// `fd00::/108`. Host bits set in the input are ignored (`10.96.5.0/12` → `10.96.0.1`).
///
/// Errors: [`PkiError::InvalidCidr`] when the list is empty, an entry does not parse, or a
/// prefix leaves no room for a first host (`/31`, `/32`, `/127`, `/128`).
pub fn service_cidr_first_ips(service_cidr: &str) -> Result<Vec<IpAddr>, PkiError> {
    let invalid = |detail: &str| PkiError::InvalidCidr {
        cidr: service_cidr.to_string(),
        detail: detail.to_string(),
    };
    let mut out = Vec::new();
    for part in service_cidr.split(',').map(str::trim) {
        if part.is_empty() {
            return Err(invalid("empty CIDR"));
        }
        let net: ipnet::IpNet = part
            .parse()
            .map_err(|e: ipnet::AddrParseError| invalid(&format!("{part:?}: {e}")))?;
        if net.max_prefix_len() - net.prefix_len() < 2 {
            return Err(invalid(&format!("{part:?} has no room for a first host address")));
        }
        let first = match net.network() {
            IpAddr::V4(a) => IpAddr::V4((u32::from(a) + 1).into()),
            IpAddr::V6(a) => IpAddr::V6((u128::from(a) + 1).into()),
        };
        if !out.contains(&first) {
            out.push(first);
        }
    }
    Ok(out)
}

/// The host each etcd member is reached at, in member order:
/// `<c>-etcd-<i>.<c>-etcd.<ns>.svc` for `i` in `0..replicas` (docs/reference.md "etcd": the names
/// `--initial-cluster` and `--etcd-servers` use).
pub fn etcd_member_hosts(cluster_name: &str, namespace: &str, replicas: u32) -> Vec<String> {
    (0..replicas)
        .map(|i| format!("{cluster_name}-etcd-{i}.{cluster_name}-etcd.{namespace}.svc"))
        .collect()
}

/// The etcd server-and-peer certificate: CN `<c>-etcd`, serverAuth **and** clientAuth (peers
/// dial each other), shared by every member (docs/reference.md "Identities" and "Names clients
/// dial").
///
/// DNS, for each member `i` in `0..replicas`: `<c>-etcd-<i>`, `<c>-etcd-<i>.<c>-etcd`,
/// `<c>-etcd-<i>.<c>-etcd.<ns>`, `<c>-etcd-<i>.<c>-etcd.<ns>.svc`,
/// `<c>-etcd-<i>.<c>-etcd.<ns>.svc.<sd>`; then the headless Service at every depth (`<c>-etcd`,
/// `<c>-etcd.<ns>`, `<c>-etcd.<ns>.svc`, `<c>-etcd.<ns>.svc.<sd>`; docs/design.md §6 "service names
/// at all depths") and `localhost`. IP: `127.0.0.1`. A replica count change therefore changes
/// the certificate. Names are lower-cased and not otherwise validated (they derive from
/// Kubernetes object names).
pub fn etcd_server_leaf(cluster_name: &str, namespace: &str, super_dns_domain: &str, replicas: u32) -> LeafSpec {
    let c = cluster_name;
    let ns = namespace;
    let sd = super_dns_domain.trim_end_matches('.');
    let svc = format!("{c}-etcd");
    let mut names = Names::default();
    for i in 0..replicas {
        let member = format!("{c}-etcd-{i}");
        names.dns(member.clone());
        names.dns(format!("{member}.{svc}"));
        names.dns(format!("{member}.{svc}.{ns}"));
        names.dns(format!("{member}.{svc}.{ns}.svc"));
        names.dns(format!("{member}.{svc}.{ns}.svc.{sd}"));
    }
    names.dns(svc.clone());
    names.dns(format!("{svc}.{ns}"));
    names.dns(format!("{svc}.{ns}.svc"));
    names.dns(format!("{svc}.{ns}.svc.{sd}"));
    names.dns("localhost".to_string());
    names.ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
    names.dns = names.dns.into_iter().map(|n| n.to_ascii_lowercase()).collect();
    LeafSpec {
        common_name: svc,
        organization: None,
        server: true,
        client: true,
        dns_names: names.dns,
        ip_addresses: names.ips,
    }
}

fn client_leaf(common_name: &str, organization: Option<&str>) -> LeafSpec {
    LeafSpec {
        common_name: common_name.to_string(),
        organization: organization.map(str::to_string),
        server: false,
        client: true,
        dns_names: Vec::new(),
        ip_addresses: Vec::new(),
    }
}

/// The apiserver's client certificate towards etcd: CN `kube-apiserver-etcd-client`,
/// clientAuth, no SANs; signed by the etcd CA (docs/reference.md "Identities", kubeadm).
pub fn apiserver_etcd_client_leaf() -> LeafSpec {
    client_leaf("kube-apiserver-etcd-client", None)
}

/// The apiserver's client certificate towards kubelets: CN `kube-apiserver-kubelet-client`,
/// O `system:masters`, clientAuth; signed by the cluster CA (docs/reference.md "Identities").
pub fn apiserver_kubelet_client_leaf() -> LeafSpec {
    client_leaf("kube-apiserver-kubelet-client", Some(SYSTEM_MASTERS))
}

/// The apiserver's front-proxy (aggregation layer) client certificate: CN
/// `front-proxy-client` (the value of `--requestheader-allowed-names`), clientAuth; signed by
/// the front-proxy CA (docs/reference.md "Identities").
pub fn front_proxy_client_leaf() -> LeafSpec {
    client_leaf("front-proxy-client", None)
}

/// The kube-controller-manager's identity for its kubeconfig: CN
/// `system:kube-controller-manager` (bound by the default RBAC), clientAuth; signed by the
/// cluster CA (docs/reference.md "Identities").
pub fn controller_manager_leaf() -> LeafSpec {
    client_leaf("system:kube-controller-manager", None)
}

/// The admin identity of the `<c>-kubeconfig` Secret: CN `kubernetes-admin`, O
/// `system:masters`, clientAuth; signed by the cluster CA (docs/reference.md "Identities").
pub fn admin_leaf() -> LeafSpec {
    client_leaf("kubernetes-admin", Some(SYSTEM_MASTERS))
}

/// An etcd health-check client: CN `kube-etcd-healthcheck-client`, clientAuth; signed by the
/// etcd CA (docs/reference.md "Identities"). Design §6 assigns it no Secret (the probes use the
/// plain-HTTP metrics port); provided for tools that query etcd over TLS.
pub fn etcd_healthcheck_client_leaf() -> LeafSpec {
    client_leaf("kube-etcd-healthcheck-client", None)
}

/// Accumulates SANs in order, without duplicates.
#[derive(Default)]
struct Names {
    dns: Vec<String>,
    ips: Vec<IpAddr>,
}

impl Names {
    fn dns(&mut self, name: String) {
        if !self.dns.contains(&name) {
            self.dns.push(name);
        }
    }

    fn ip(&mut self, ip: IpAddr) {
        if !self.ips.contains(&ip) {
            self.ips.push(ip);
        }
    }

    /// Adds `value` as an IP SAN when it is an IP address (IPv6 brackets stripped), else as a
    /// validated DNS name.
    fn any(&mut self, value: &str, allow_wildcard: bool) -> Result<(), PkiError> {
        let trimmed = value.trim();
        let unbracketed = trimmed
            .strip_prefix('[')
            .and_then(|v| v.strip_suffix(']'))
            .unwrap_or(trimmed);
        match unbracketed.parse::<IpAddr>() {
            Ok(ip) => self.ip(ip),
            Err(_) => self.dns(dns_name(trimmed, allow_wildcard)?),
        }
        Ok(())
    }
}

/// Lower-cases `value`, drops one trailing `.`, and checks it is an RFC 1123 subdomain (at
/// most 253 characters; labels of 1..=63 of `a-z`, `0-9`, `-`, not starting or ending with
/// `-`), optionally with a leading `*.` label (kubeadm's certSANs validation).
fn dns_name(value: &str, allow_wildcard: bool) -> Result<String, PkiError> {
    let invalid = |detail: &str| PkiError::InvalidSan {
        value: value.to_string(),
        detail: detail.to_string(),
    };
    let name = value.trim().trim_end_matches('.').to_ascii_lowercase();
    if name.is_empty() {
        return Err(invalid("empty name"));
    }
    if name.len() > 253 {
        return Err(invalid("longer than 253 characters"));
    }
    let rest = match name.strip_prefix("*.") {
        Some(rest) if allow_wildcard => rest,
        Some(_) => return Err(invalid("wildcards are only allowed in certSANs")),
        None => name.as_str(),
    };
    for label in rest.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(invalid(
                "not an IP address nor an RFC 1123 DNS name (labels of a-z, 0-9 and '-', 1 to 63 characters)",
            ));
        }
    }
    Ok(name)
}
