//! The names a pod resolves, as cluster DNS would answer them, written as `/etc/hosts` lines:
//! - a Service with a ClusterIP: `<svc>.<ns>.svc[.<domain>]` → the *ready* pods behind its
//!   selector (no ClusterIP or kube-proxy here: the name leads straight to the endpoints);
//! - a headless Service: the same name → its pods (all of them with
//!   `publishNotReadyAddresses`), and `<pod>.<svc>.<ns>.svc[.<domain>]` → each pod whose
//!   `subdomain` (the StatefulSet's `serviceName`) is that Service.
//!
//! Every name is listed in each form a search path would complete (`<name>`, `<name>.<ns>`,
//! `<name>.<ns>.svc`, `<name>.<ns>.svc.<domain>`), because a hosts file is matched exactly.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

/// What DNS needs to know about one pod.
#[derive(Clone, Debug)]
pub(super) struct PodRecord {
    pub name: String,
    pub ip: Ipv4Addr,
    pub ready: bool,
    pub labels: BTreeMap<String, String>,
    /// The StatefulSet's `serviceName`.
    pub subdomain: String,
}

/// Name → addresses.
pub(super) type Records = BTreeMap<String, BTreeSet<Ipv4Addr>>;

fn selects(service: &Service, pod: &PodRecord) -> bool {
    service
        .spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .filter(|s| !s.is_empty())
        .is_some_and(|selector| selector.iter().all(|(k, v)| pod.labels.get(k) == Some(v)))
}

fn forms(name: &str, namespace: &str, domain: &str) -> [String; 4] {
    [
        name.to_owned(),
        format!("{name}.{namespace}"),
        format!("{name}.{namespace}.svc"),
        format!("{name}.{namespace}.svc.{domain}"),
    ]
}

/// The TCP ports a pod with `labels` and `named` container ports is dialled at under the
/// names of the `services` that select it, and the ports they target there, where the two
/// differ: `(port, target)` (runner adaptation 3: each becomes a redirect in the pod's
/// network namespace, as a Service's proxy would map it).
pub(super) fn port_maps(
    services: &[Service],
    labels: &BTreeMap<String, String>,
    named: &BTreeMap<String, u16>,
) -> BTreeSet<(u16, u16)> {
    let record = PodRecord {
        name: String::new(),
        ip: Ipv4Addr::UNSPECIFIED,
        ready: true,
        labels: labels.clone(),
        subdomain: String::new(),
    };
    services
        .iter()
        .filter(|s| selects(s, &record))
        .flat_map(|s| s.spec.iter().flat_map(|spec| spec.ports.iter().flatten()))
        .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
        .filter_map(|p| {
            let port = u16::try_from(p.port).ok()?;
            let target = match &p.target_port {
                None => port,
                Some(IntOrString::Int(n)) => u16::try_from(*n).ok()?,
                Some(IntOrString::String(name)) => *named.get(name)?,
            };
            (port != target).then_some((port, target))
        })
        .collect()
}

/// The records of one namespace.
pub(super) fn records(namespace: &str, domain: &str, pods: &[PodRecord], services: &[Service]) -> Records {
    let mut out = Records::new();
    for service in services {
        let Some(spec) = &service.spec else { continue };
        let svc = service.name_any();
        let headless = spec.cluster_ip.as_deref() == Some("None");
        let not_ready_too = headless && spec.publish_not_ready_addresses == Some(true);
        let members: Vec<&PodRecord> = pods
            .iter()
            .filter(|p| selects(service, p) && (p.ready || not_ready_too))
            .collect();
        for name in forms(&svc, namespace, domain) {
            let entry = out.entry(name).or_default();
            entry.extend(members.iter().map(|p| p.ip));
        }
        if headless {
            for pod in members.iter().filter(|p| p.subdomain == svc) {
                for name in forms(&format!("{}.{svc}", pod.name), namespace, domain) {
                    out.entry(name).or_default().insert(pod.ip);
                }
            }
        }
    }
    out.retain(|_, ips| !ips.is_empty());
    out
}

/// A pod's `/etc/hosts`: localhost, its own line as the kubelet writes it, then the records.
pub(super) fn hosts_file(pod: &PodRecord, namespace: &str, domain: &str, records: &Records) -> String {
    let mut text = String::from(
        "# Kubernetes-managed hosts file (written by the capn test runner, which stands in for cluster DNS).\n\
         127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    );
    if pod.subdomain.is_empty() {
        // A pod without a subdomain (the node's) has no DNS name of its own.
        text.push_str(&format!("{}\t{}\n", pod.ip, pod.name));
    } else {
        text.push_str(&format!(
            "{}\t{}.{}.{namespace}.svc.{domain}\t{}\n",
            pod.ip, pod.name, pod.subdomain, pod.name
        ));
    }
    for (name, ips) in records {
        for ip in ips {
            text.push_str(&format!("{ip}\t{name}\n"));
        }
    }
    text
}

/// The hosts file for clients outside the pod network (capn's `--etcd-hosts-file`): every
/// record, without a pod's own lines.
pub(super) fn outside_hosts_file(records: &Records) -> String {
    let mut text =
        String::from("# The pod network's names, written by the capn test runner for clients on the host.\n");
    for (name, ips) in records {
        for ip in ips {
            text.push_str(&format!("{ip}\t{name}\n"));
        }
    }
    text
}

/// A pod's `/etc/resolv.conf`: the search path of a ClusterFirst pod, without a nameserver
/// (nothing answers DNS here; a name missing from the hosts file fails at once).
pub(super) fn resolv_conf(namespace: &str, domain: &str) -> String {
    format!("search {namespace}.svc.{domain} svc.{domain} {domain}\noptions ndots:5\n")
}

/// A node pod's `/etc/resolv.conf`: as the kubelet writes it from `dnsConfig` for a pod with
/// `dnsPolicy: None` (its nameservers, searches and options, `name` or `name:value`);
/// [`resolv_conf`] for every other policy (the node has no cluster DNS of its own, and the
/// host's resolvers are not the pods' business).
pub(super) fn pod_resolv_conf(spec: &k8s_openapi::api::core::v1::PodSpec, namespace: &str, domain: &str) -> String {
    let Some(config) = spec
        .dns_config
        .as_ref()
        .filter(|_| spec.dns_policy.as_deref() == Some("None"))
    else {
        return resolv_conf(namespace, domain);
    };
    let mut text = String::new();
    let searches = config.searches.as_deref().unwrap_or_default();
    if !searches.is_empty() {
        text.push_str(&format!("search {}\n", searches.join(" ")));
    }
    for nameserver in config.nameservers.iter().flatten() {
        text.push_str(&format!("nameserver {nameserver}\n"));
    }
    let options: Vec<String> = config
        .options
        .iter()
        .flatten()
        .filter_map(|o| {
            let name = o.name.as_deref()?;
            Some(
                o.value
                    .as_deref()
                    .map_or_else(|| name.to_owned(), |v| format!("{name}:{v}")),
            )
        })
        .collect();
    if !options.is_empty() {
        text.push_str(&format!("options {}\n", options.join(" ")));
    }
    text
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(name: &str, ip: [u8; 4], ready: bool, app: &str, subdomain: &str) -> PodRecord {
        PodRecord {
            name: name.into(),
            ip: Ipv4Addr::from(ip),
            ready,
            labels: BTreeMap::from([("app".to_owned(), app.to_owned())]),
            subdomain: subdomain.into(),
        }
    }

    fn service(value: serde_json::Value) -> Service {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_none_pods_resolv_conf_is_its_dns_config_and_others_get_the_search_path() {
        let spec: k8s_openapi::api::core::v1::PodSpec = serde_json::from_value(json!({
            "containers": [],
            "dnsPolicy": "None",
            "dnsConfig": {
                "nameservers": ["10.96.0.10"],
                "searches": ["a.svc.cluster.local", "svc.cluster.local"],
                "options": [{"name": "ndots", "value": "5"}, {"name": "edns0"}]
            }
        }))
        .unwrap();
        assert_eq!(
            pod_resolv_conf(&spec, "a", "cluster.local"),
            "search a.svc.cluster.local svc.cluster.local\nnameserver 10.96.0.10\noptions ndots:5 edns0\n"
        );
        let first = k8s_openapi::api::core::v1::PodSpec {
            dns_policy: Some("ClusterFirst".into()),
            ..spec
        };
        assert_eq!(
            pod_resolv_conf(&first, "a", "cluster.local"),
            resolv_conf("a", "cluster.local")
        );
    }

    #[test]
    fn services_and_pods_resolve_as_cluster_dns_would() {
        let pods = [
            pod("c-etcd-0", [10, 0, 0, 2], true, "etcd", "c-etcd"),
            pod("c-etcd-1", [10, 0, 0, 3], false, "etcd", "c-etcd"),
            pod("c-apiserver-0", [10, 0, 0, 4], true, "apiserver", "c-apiserver"),
            pod("c-apiserver-1", [10, 0, 0, 5], false, "apiserver", "c-apiserver"),
        ];
        let services = [
            service(json!({"metadata": {"name": "c-etcd"}, "spec": {"clusterIP": "None",
                "publishNotReadyAddresses": true, "selector": {"app": "etcd"}}})),
            service(
                json!({"metadata": {"name": "c-apiserver"}, "spec": {"clusterIP": "10.96.0.9",
                "selector": {"app": "apiserver"}, "ports": [{"port": 6443, "targetPort": "https"}]}}),
            ),
        ];
        let records = records("ns", "cluster.local", &pods, &services);
        let ips = |name: &str| -> Vec<String> {
            records
                .get(name)
                .into_iter()
                .flatten()
                .map(ToString::to_string)
                .collect()
        };
        // Headless with publishNotReadyAddresses: every member, ready or not, and pod names.
        assert_eq!(ips("c-etcd.ns.svc"), ["10.0.0.2", "10.0.0.3"]);
        assert_eq!(ips("c-etcd-1.c-etcd.ns.svc"), ["10.0.0.3"]);
        assert_eq!(ips("c-etcd-0.c-etcd.ns.svc.cluster.local"), ["10.0.0.2"]);
        // A ClusterIP Service: its ready pods only, and no per-pod names (not headless).
        assert_eq!(ips("c-apiserver.ns.svc"), ["10.0.0.4"]);
        assert_eq!(ips("c-apiserver"), ["10.0.0.4"]);
        assert!(ips("c-apiserver-0.c-apiserver.ns.svc").is_empty());
        let hosts = hosts_file(&pods[2], "ns", "cluster.local", &records);
        assert!(hosts.contains("10.0.0.4\tc-apiserver-0.c-apiserver.ns.svc.cluster.local\tc-apiserver-0\n"));
        assert!(hosts.contains("10.0.0.2\tc-etcd-0.c-etcd.ns.svc\n"));
    }

    #[test]
    fn a_pod_is_dialled_at_the_ports_of_the_services_that_select_it() {
        let services = [service(
            json!({"metadata": {"name": "s"}, "spec": {"selector": {"app": "x"}, "ports": [
            {"name": "https", "port": 6443, "targetPort": "https"},
            {"name": "https-default", "port": 443, "targetPort": "https"},
            {"name": "dns", "port": 53, "targetPort": 5353, "protocol": "UDP"}]}}),
        )];
        let labels = BTreeMap::from([("app".to_owned(), "x".to_owned())]);
        let named = BTreeMap::from([("https".to_owned(), 6443)]);
        assert_eq!(port_maps(&services, &labels, &named), BTreeSet::from([(443, 6443)]));
        let other = BTreeMap::from([("app".to_owned(), "y".to_owned())]);
        assert!(port_maps(&services, &other, &named).is_empty());
    }
}
