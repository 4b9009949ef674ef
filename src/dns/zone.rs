//! What a tenant's DNS answers, as a pure function of the tenant's Services and
//! EndpointSlices: the records of the Kubernetes DNS specification
//! (<https://github.com/kubernetes/dns/blob/master/docs/specification.md>, version 1.1.0),
//! with one difference that is the point of serving it in capn: a ClusterIP Service is
//! answered with the address pods reach it at, its super copy's ClusterIP (docs/design.md
//! §11 "DNS"), not the tenant's ClusterIP, which nothing routes.
//!
//! | name (under the tenant's cluster domain `<zone>`) | answer |
//! |---|---|
//! | `<service>.<ns>.svc.<zone>`, ClusterIP | A/AAAA: the super copy's ClusterIP; SRV: one per port, target the Service's name |
//! | the same, headless | A/AAAA: every ready endpoint of its EndpointSlices; SRV: one per endpoint and port, target `<hostname or dashed address>.<service>.<ns>.svc.<zone>` |
//! | the same, ExternalName | CNAME to `externalName` (followed inside the zone; the server resolves a target outside it) |
//! | `_<port>._<protocol>.<service>.<ns>.svc.<zone>` | SRV of that named port only |
//! | `<hostname or dashed address>.<service>.<ns>.svc.<zone>`, headless | A/AAAA of that endpoint (pod DNS: `hostname` and `subdomain`) |
//! | `kubernetes.default.svc.<zone>` | the tenant apiserver as pods reach it |
//! | `<a-b-c-d>.<ns>.pod.<zone>` | A `a.b.c.d` (CoreDNS's `pods insecure`, kubeadm's default) |
//! | `<zone>`, `svc.<zone>`, `pod.<zone>`, and `<ns>.svc.<zone>`, `<ns>.pod.<zone>` of a namespace with a Service | no records, no error |
//! | any other name in the zone | NXDOMAIN |
//! | `*.svc.<super cluster domain>`, when it differs from `<zone>` | NXDOMAIN (the super cluster's Services are not the tenant's business) |
//! | any other name outside the zone | [`Resolution::Outside`]: the server forwards it |
//!
//! | `<reversed address>.in-addr.arpa`, `….ip6.arpa` | PTR of a Service's super address or a headless endpoint; NXDOMAIN for any other address (never forwarded: the super cluster's DNS would name other tenants' copies) |
//!
//! Records live [`TTL`] seconds, CoreDNS's `kubernetes` plugin default; an answer holds
//! [`MAX_ANSWERS`] records at most.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use hickory_proto::rr::rdata::{CNAME, PTR, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort, EndpointSlice};

/// How long a client may keep an answer, in seconds (CoreDNS's `kubernetes` plugin's `ttl`
/// default).
pub const TTL: u32 = 5;
/// The most records one answer holds (more could not fit a 64 KiB message anyway): a
/// headless Service with thousands of endpoints and ports costs no more than this.
pub const MAX_ANSWERS: usize = 2048;
/// The label that ties an EndpointSlice to its Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// What one tenant's DNS answers from: the tenant's objects as its watch caches hold them.
#[derive(Clone, Debug, Default)]
pub struct View {
    /// The tenant's cluster domain (`Cluster.spec.clusterNetwork.serviceDomain`), lower case,
    /// without the trailing dot.
    pub domain: String,
    /// The tenant's Services, every namespace.
    pub services: Vec<Arc<Service>>,
    /// The tenant's EndpointSlices, every namespace (those its EndpointSlice controller made
    /// hold the tenant pods' addresses, which are their super pods').
    pub slices: Vec<Arc<EndpointSlice>>,
    /// Where pods reach each ClusterIP Service, by `(namespace, name)`: its super copy's
    /// ClusterIP. A Service missing here has no address yet.
    pub addresses: BTreeMap<(String, String), IpAddr>,
    /// The tenant apiserver as pods reach it (`kubernetes.default`).
    pub apiserver: Vec<IpAddr>,
    /// The super cluster's cluster domain when it differs from the tenant's: its Services'
    /// names (`*.svc.<super domain>`) are NXDOMAIN, not forwarded, so that a tenant learns
    /// nothing of the super cluster's Services.
    pub super_domain: Option<String>,
}

/// The answer to one question.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// The name exists: these records answer the question (none: it has no records of the
    /// type asked, NOERROR with an empty answer), with these in the additional section.
    Answer {
        answers: Vec<Record>,
        additionals: Vec<Record>,
    },
    /// The name is an ExternalName Service whose target lies outside the zone: the CNAME,
    /// and the target for the server to resolve.
    Alias { cname: Box<Record>, target: Name },
    /// No such name in the zone.
    NxDomain,
    /// The name is not in the zone.
    Outside,
}

impl Resolution {
    fn records(answers: Vec<Record>) -> Self {
        Resolution::Answer {
            answers,
            additionals: Vec::new(),
        }
    }
}

/// The answer of `view` to the question (`name`, `kind`); see the module documentation.
pub fn resolve(view: &View, name: &Name, kind: RecordType) -> Resolution {
    resolve_at(view, name, kind, 0)
}

/// [`resolve`], `depth` CNAMEs into the zone.
fn resolve_at(view: &View, name: &Name, kind: RecordType, depth: u8) -> Resolution {
    let text = name.to_ascii().to_ascii_lowercase();
    let text = text.trim_end_matches('.');
    if within(text, "in-addr.arpa").is_some() || within(text, "ip6.arpa").is_some() {
        return reverse(view, name, kind);
    }
    let Some(relative) = within(text, &view.domain) else {
        let hidden = view
            .super_domain
            .as_deref()
            .is_some_and(|domain| within(text, &format!("svc.{domain}")).is_some());
        return if hidden {
            Resolution::NxDomain
        } else {
            Resolution::Outside
        };
    };
    let labels: Vec<&str> = relative.split('.').filter(|l| !l.is_empty()).collect();
    let at = Asked { view, name, kind };
    match labels.as_slice() {
        [] | ["svc" | "pod"] => Resolution::records(Vec::new()),
        // A namespace exists for DNS when it has a Service (CoreDNS answers NXDOMAIN for a
        // namespace it does not know): a search path's `<name>.svc.<zone>` must not end a
        // resolver's search with an empty answer (musl's stops there).
        [namespace, "svc" | "pod"] if at.has_namespace(namespace) => Resolution::records(Vec::new()),
        ["kubernetes", "default", "svc"] => Resolution::records(at.addresses(view.apiserver.iter().copied())),
        [service, namespace, "svc"] => at.service(namespace, service, depth),
        [port, protocol, service, namespace, "svc"] if port.starts_with('_') && protocol.starts_with('_') => {
            at.named_port(namespace, service, &port[1..], &protocol[1..])
        }
        [endpoint, service, namespace, "svc"] => at.endpoint(namespace, service, endpoint),
        [address, _, "pod"] => match pod_address(address) {
            Some(ip) => Resolution::records(at.addresses([ip])),
            None => Resolution::NxDomain,
        },
        _ => Resolution::NxDomain,
    }
}

/// `name` relative to `domain` (`""` for the domain itself), or `None` outside it.
fn within<'a>(name: &'a str, domain: &str) -> Option<&'a str> {
    if name == domain {
        return Some("");
    }
    name.strip_suffix(domain)?.strip_suffix('.')
}

/// The address of a pod name's first label: `10-1-2-3`, or an IPv6 address with `-` for `:`.
fn pod_address(label: &str) -> Option<IpAddr> {
    label
        .replace('-', ".")
        .parse::<Ipv4Addr>()
        .map(IpAddr::V4)
        .or_else(|_| label.replace('-', ":").parse::<Ipv6Addr>().map(IpAddr::V6))
        .ok()
}

/// An endpoint's name under its Service: its `hostname`, or its address with `-` for `.`
/// and `:` (CoreDNS's form).
fn endpoint_label(hostname: Option<&str>, address: IpAddr) -> String {
    match hostname.filter(|h| !h.is_empty()) {
        Some(hostname) => hostname.to_ascii_lowercase(),
        None => address.to_string().replace(['.', ':'], "-"),
    }
}

/// One question, with what answers it.
struct Asked<'a> {
    view: &'a View,
    name: &'a Name,
    kind: RecordType,
}

/// One ready endpoint address of a headless Service, with its ports.
struct Member<'a> {
    label: String,
    address: IpAddr,
    ports: &'a [EndpointPort],
}

impl Asked<'_> {
    /// Address records of `addresses` under the asked name, of the asked family.
    fn addresses(&self, addresses: impl IntoIterator<Item = IpAddr>) -> Vec<Record> {
        address_records(self.name, self.kind, addresses)
    }

    fn has_namespace(&self, namespace: &str) -> bool {
        self.view
            .services
            .iter()
            .any(|s| s.metadata.namespace.as_deref() == Some(namespace))
    }

    fn find(&self, namespace: &str, name: &str) -> Option<&Service> {
        self.view
            .services
            .iter()
            .map(|s| &**s)
            .find(|s| s.metadata.namespace.as_deref() == Some(namespace) && s.metadata.name.as_deref() == Some(name))
    }

    /// The FQDN of `<service>.<namespace>.svc.<zone>`, with `prefix.` before it.
    fn fqdn(&self, prefix: &str, service: &str, namespace: &str) -> Option<Name> {
        Name::from_ascii(format!("{prefix}{service}.{namespace}.svc.{}.", self.view.domain)).ok()
    }

    fn service(&self, namespace: &str, name: &str, depth: u8) -> Resolution {
        let Some(service) = self.find(namespace, name) else {
            return Resolution::NxDomain;
        };
        let spec = service.spec.clone().unwrap_or_default();
        if spec.type_.as_deref() == Some("ExternalName") {
            return self.external(spec.external_name.as_deref().unwrap_or_default(), depth);
        }
        if is_headless(service) {
            let members = self.members(namespace, name);
            if self.kind == RecordType::SRV {
                return self.member_srv(namespace, name, &members, |_| true);
            }
            return Resolution::records(self.addresses(members.iter().map(|m| m.address)));
        }
        let address = self
            .view
            .addresses
            .get(&(namespace.to_owned(), name.to_owned()))
            .copied();
        if self.kind == RecordType::SRV {
            let Some(target) = self.fqdn("", name, namespace) else {
                return Resolution::records(Vec::new());
            };
            let ports = spec.ports.unwrap_or_default();
            let answers = ports
                .iter()
                .filter_map(|p| u16::try_from(p.port).ok())
                .map(|port| srv(self.name, port, &target))
                .collect();
            let additionals = address_records(&target, RecordType::ANY, address);
            return Resolution::Answer { answers, additionals };
        }
        Resolution::records(self.addresses(address))
    }

    /// An ExternalName Service: the CNAME, and the target's records when it lies in the zone.
    fn external(&self, target: &str, depth: u8) -> Resolution {
        let Ok(target) = Name::from_ascii(format!("{}.", target.trim_end_matches('.'))) else {
            return Resolution::NxDomain;
        };
        let cname = Record::from_rdata(self.name.clone(), TTL, RData::CNAME(CNAME(target.clone())));
        // One CNAME is followed; a chain of ExternalName Services (or a loop) ends there.
        if self.kind == RecordType::CNAME || depth > 0 {
            return Resolution::records(vec![cname]);
        }
        match resolve_at(self.view, &target, self.kind, depth + 1) {
            Resolution::Outside => Resolution::Alias {
                cname: Box::new(cname),
                target,
            },
            Resolution::Answer { answers, additionals } => {
                let mut all = vec![cname];
                all.extend(answers);
                Resolution::Answer {
                    answers: all,
                    additionals,
                }
            }
            _ => Resolution::records(vec![cname]),
        }
    }

    /// `_<port>._<protocol>.<service>…`: the SRV records of that named port.
    fn named_port(&self, namespace: &str, name: &str, port: &str, protocol: &str) -> Resolution {
        let Some(service) = self.find(namespace, name) else {
            return Resolution::NxDomain;
        };
        let matches = |p_name: Option<&str>, p_protocol: Option<&str>| {
            p_name.is_some_and(|n| n.eq_ignore_ascii_case(port))
                && p_protocol.unwrap_or("TCP").eq_ignore_ascii_case(protocol)
        };
        if is_headless(service) {
            let members = self.members(namespace, name);
            let exists = members
                .iter()
                .flat_map(|m| m.ports)
                .any(|p| matches(p.name.as_deref(), p.protocol.as_deref()));
            if !exists {
                return Resolution::NxDomain;
            }
            if self.kind != RecordType::SRV {
                return Resolution::records(Vec::new());
            }
            return self.member_srv(namespace, name, &members, |p| {
                matches(p.name.as_deref(), p.protocol.as_deref())
            });
        }
        let ports = service.spec.as_ref().and_then(|s| s.ports.clone()).unwrap_or_default();
        let Some(port) = ports
            .iter()
            .find(|p| matches(p.name.as_deref(), p.protocol.as_deref()))
            .and_then(|p| u16::try_from(p.port).ok())
        else {
            return Resolution::NxDomain;
        };
        let Some(target) = self.fqdn("", name, namespace) else {
            return Resolution::NxDomain;
        };
        if self.kind != RecordType::SRV {
            return Resolution::records(Vec::new());
        }
        let address = self
            .view
            .addresses
            .get(&(namespace.to_owned(), name.to_owned()))
            .copied();
        Resolution::Answer {
            answers: vec![srv(self.name, port, &target)],
            additionals: address_records(&target, RecordType::ANY, address),
        }
    }

    /// `<endpoint>.<service>…` of a headless Service: that endpoint's addresses.
    fn endpoint(&self, namespace: &str, name: &str, endpoint: &str) -> Resolution {
        if !self.find(namespace, name).is_some_and(is_headless) {
            return Resolution::NxDomain;
        }
        let addresses: BTreeSet<IpAddr> = self
            .members(namespace, name)
            .into_iter()
            .filter(|m| m.label == endpoint)
            .map(|m| m.address)
            .collect();
        if addresses.is_empty() {
            return Resolution::NxDomain;
        }
        Resolution::records(self.addresses(addresses))
    }

    /// SRV records of `members`' ports that `wanted`, each targetting the member's name, and
    /// the members' addresses as additionals.
    fn member_srv(
        &self,
        namespace: &str,
        name: &str,
        members: &[Member<'_>],
        wanted: impl Fn(&EndpointPort) -> bool,
    ) -> Resolution {
        let mut answers = Vec::new();
        let mut additionals = Vec::new();
        for member in members {
            let Some(target) = self.fqdn(&format!("{}.", member.label), name, namespace) else {
                continue;
            };
            let ports: Vec<u16> = member
                .ports
                .iter()
                .filter(|p| wanted(p))
                .filter_map(|p| p.port.and_then(|p| u16::try_from(p).ok()))
                .collect();
            if ports.is_empty() {
                continue;
            }
            answers.extend(ports.iter().map(|port| srv(self.name, *port, &target)));
            additionals.extend(address_records(&target, RecordType::ANY, [member.address]));
            if answers.len() >= MAX_ANSWERS {
                answers.truncate(MAX_ANSWERS);
                break;
            }
        }
        Resolution::Answer { answers, additionals }
    }

    /// The ready endpoint addresses of the Service `namespace/name` (an endpoint whose
    /// `ready` is unset counts as ready, as the EndpointSlice API says), each address once.
    fn members(&self, namespace: &str, name: &str) -> Vec<Member<'_>> {
        let mut seen = BTreeSet::new();
        let mut members = Vec::new();
        for slice in self.view.slices.iter().filter(|s| {
            s.metadata.namespace.as_deref() == Some(namespace)
                && s.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(SERVICE_NAME_LABEL))
                    .map(String::as_str)
                    == Some(name)
        }) {
            let ports = slice.ports.as_deref().unwrap_or_default();
            for endpoint in slice.endpoints.iter().flatten().filter(|e| is_ready(e)) {
                for address in endpoint.addresses.iter().filter_map(|a| a.parse::<IpAddr>().ok()) {
                    if seen.insert(address) {
                        members.push(Member {
                            label: endpoint_label(endpoint.hostname.as_deref(), address),
                            address,
                            ports,
                        });
                    }
                }
            }
        }
        members
    }
}

fn is_ready(endpoint: &Endpoint) -> bool {
    endpoint.conditions.as_ref().and_then(|c| c.ready) != Some(false)
}

fn is_headless(service: &Service) -> bool {
    service.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None")
}

fn srv(name: &Name, port: u16, target: &Name) -> Record {
    Record::from_rdata(name.clone(), TTL, RData::SRV(SRV::new(0, 100, port, target.clone())))
}

/// A and AAAA records of `addresses` named `name`: those of the family `kind` asks for
/// (both for `ANY`, none for other kinds), [`MAX_ANSWERS`] at most.
fn address_records(name: &Name, kind: RecordType, addresses: impl IntoIterator<Item = IpAddr>) -> Vec<Record> {
    addresses
        .into_iter()
        .filter(|ip| match kind {
            RecordType::A => ip.is_ipv4(),
            RecordType::AAAA => ip.is_ipv6(),
            RecordType::ANY => true,
            _ => false,
        })
        .take(MAX_ANSWERS)
        .map(|ip| Record::from_rdata(name.clone(), TTL, RData::from(ip)))
        .collect()
}

/// A reverse lookup (`<address>.in-addr.arpa`, `….ip6.arpa`): the PTR of an address the
/// tenant knows (a Service's super ClusterIP → `<svc>.<ns>.svc.<zone>`, a headless Service's
/// endpoint → `<hostname or dashed address>.<svc>.<ns>.svc.<zone>`), NXDOMAIN for any
/// other: never forwarded, as the super cluster's DNS would name other tenants' copies.
fn reverse(view: &View, name: &Name, kind: RecordType) -> Resolution {
    let Some(address) = name
        .parse_arpa_name()
        .ok()
        .filter(|net| net.prefix_len() == net.max_prefix_len())
        .map(|net| net.addr())
    else {
        return Resolution::NxDomain;
    };
    let asked = Asked { view, name, kind };
    let mut targets: Vec<String> = view
        .addresses
        .iter()
        .filter(|(_, ip)| **ip == address)
        .map(|((namespace, service), _)| format!("{service}.{namespace}.svc.{}.", view.domain))
        .collect();
    for service in view.services.iter().filter(|s| is_headless(s)) {
        let (Some(namespace), Some(service)) =
            (service.metadata.namespace.as_deref(), service.metadata.name.as_deref())
        else {
            continue;
        };
        targets.extend(
            asked
                .members(namespace, service)
                .into_iter()
                .filter(|m| m.address == address)
                .map(|m| format!("{}.{service}.{namespace}.svc.{}.", m.label, view.domain)),
        );
    }
    if targets.is_empty() {
        return Resolution::NxDomain;
    }
    let answers = if kind == RecordType::PTR || kind == RecordType::ANY {
        targets
            .iter()
            .filter_map(|t| Name::from_ascii(t).ok())
            .map(|t| Record::from_rdata(name.clone(), TTL, RData::PTR(PTR(t))))
            .collect()
    } else {
        Vec::new()
    };
    Resolution::records(answers)
}

#[cfg(test)]
mod tests;
