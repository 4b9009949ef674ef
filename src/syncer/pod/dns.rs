//! A pod's DNS settings in the super cluster: a pod that asks for cluster DNS gets the
//! tenant's (`crate::dns`), as the kubelet would give it the cluster's
//! (`pkg/kubelet/network/dns`, `GetPodDNS`).

use k8s_openapi::api::core::v1::{PodDNSConfig, PodDNSConfigOption, PodSpec};

/// The most nameservers a pod's `resolv.conf` holds (the kubelet's and glibc's `MAXNS`).
pub const MAX_NAMESERVERS: usize = 3;
/// The most search domains a pod's `resolv.conf` holds (the kubelet's `MaxDNSSearchPaths`).
pub const MAX_SEARCHES: usize = 32;
/// The most characters of a pod's search line (the kubelet's `MaxDNSSearchListChars`).
pub const MAX_SEARCH_CHARS: usize = 2048;

/// The tenant's cluster DNS as super pods reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterDns {
    /// The address of the tenant's DNS Service in the workload namespace (an IP address).
    pub nameserver: String,
    /// The tenant's cluster domain, without the trailing dot.
    pub domain: String,
}

/// Rewrites the DNS settings of the pod in tenant namespace `namespace` for the super
/// cluster. A pod whose `dnsPolicy` is `ClusterFirst` (or unset), or
/// `ClusterFirstWithHostNet`, gets `dnsPolicy: None` with the `resolv.conf` the kubelet
/// would write for the tenant's cluster DNS: the nameserver `dns.nameserver`, the searches
/// `<namespace>.svc.<domain>`, `svc.<domain>`, `<domain>`, the option `ndots:5`, then the
/// pod's own `dnsConfig` appended (nameservers and searches after the cluster's, without
/// repeats; an option of the pod's replaces the cluster's of the same name), cut to
/// [`MAX_NAMESERVERS`], [`MAX_SEARCHES`] and [`MAX_SEARCH_CHARS`] as the kubelet cuts them
/// (`formDNSNameserversFitsLimits`, `formDNSSearchFitsLimits`). `Default` and `None`
/// pods, and every pod when `dns` is `None` (capn serves no DNS), keep theirs. The kubelet
/// also appends its node's search domains; the super node's are not the tenant's, so they
/// are left out.
pub fn rewrite(spec: &mut PodSpec, dns: Option<&ClusterDns>, namespace: &str) {
    let Some(dns) = dns else { return };
    let cluster_first = match spec.dns_policy.as_deref() {
        None | Some("" | "ClusterFirst") => spec.host_network != Some(true),
        Some("ClusterFirstWithHostNet") => true,
        _ => false,
    };
    if !cluster_first {
        return;
    }
    let own = spec.dns_config.take().unwrap_or_default();
    let mut nameservers = vec![dns.nameserver.clone()];
    append_new(&mut nameservers, own.nameservers.unwrap_or_default());
    nameservers.truncate(MAX_NAMESERVERS);
    let domain = &dns.domain;
    let mut searches = vec![
        format!("{namespace}.svc.{domain}"),
        format!("svc.{domain}"),
        domain.clone(),
    ];
    append_new(&mut searches, own.searches.unwrap_or_default());
    searches.truncate(MAX_SEARCHES);
    while searches.iter().map(|s| s.len() + 1).sum::<usize>() > MAX_SEARCH_CHARS {
        searches.pop();
    }
    let mut options = vec![PodDNSConfigOption {
        name: Some("ndots".to_owned()),
        value: Some("5".to_owned()),
    }];
    for option in own.options.unwrap_or_default() {
        match options.iter_mut().find(|o| o.name == option.name) {
            Some(same) => *same = option,
            None => options.push(option),
        }
    }
    spec.dns_policy = Some("None".to_owned());
    spec.dns_config = Some(PodDNSConfig {
        nameservers: Some(nameservers),
        searches: Some(searches),
        options: Some(options),
    });
}

fn append_new(list: &mut Vec<String>, more: Vec<String>) {
    for item in more {
        if !list.contains(&item) {
            list.push(item);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn spec(value: serde_json::Value) -> PodSpec {
        serde_json::from_value(value).unwrap()
    }

    fn tenant_dns() -> ClusterDns {
        ClusterDns {
            nameserver: "10.128.0.10".into(),
            domain: "cluster.local".into(),
        }
    }

    #[test]
    fn a_cluster_first_pod_gets_the_tenants_dns_as_the_kubelet_writes_it() {
        let mut pod = spec(json!({"containers": [], "dnsPolicy": "ClusterFirst"}));
        rewrite(&mut pod, Some(&tenant_dns()), "shop");
        assert_eq!(pod.dns_policy.as_deref(), Some("None"));
        assert_eq!(
            serde_json::to_value(pod.dns_config).unwrap(),
            json!({
                "nameservers": ["10.128.0.10"],
                "searches": ["shop.svc.cluster.local", "svc.cluster.local", "cluster.local"],
                "options": [{"name": "ndots", "value": "5"}]
            })
        );
    }

    #[test]
    fn the_pods_own_dns_config_is_appended_and_cut_to_the_kubelets_limits() {
        let mut pod = spec(json!({
            "containers": [],
            "dnsConfig": {
                "nameservers": ["10.128.0.10", "1.1.1.1", "8.8.8.8", "9.9.9.9"],
                "searches": ["svc.cluster.local", "example.com"],
                "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}]
            }
        }));
        rewrite(&mut pod, Some(&tenant_dns()), "shop");
        let mut long = spec(json!({"containers": [], "dnsConfig": {
            "searches": (0..40).map(|i| format!("{i}.{}", "x".repeat(60))).collect::<Vec<_>>()}}));
        rewrite(&mut long, Some(&tenant_dns()), "shop");
        let searches = long.dns_config.unwrap().searches.unwrap();
        assert!(searches.len() <= MAX_SEARCHES && searches.join(" ").len() <= MAX_SEARCH_CHARS);
        assert_eq!(
            searches[0], "shop.svc.cluster.local",
            "the cluster's come first and stay"
        );
        assert_eq!(
            serde_json::to_value(pod.dns_config).unwrap(),
            json!({
                "nameservers": ["10.128.0.10", "1.1.1.1", "8.8.8.8"],
                "searches": ["shop.svc.cluster.local", "svc.cluster.local", "cluster.local", "example.com"],
                "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}]
            })
        );
    }

    #[test]
    fn default_none_and_host_network_pods_and_pods_without_tenant_dns_keep_theirs() {
        let own = json!({"nameservers": ["1.1.1.1"]});
        for (policy, host_network) in [("Default", false), ("None", false), ("ClusterFirst", true)] {
            let before =
                spec(json!({"containers": [], "dnsPolicy": policy, "hostNetwork": host_network, "dnsConfig": own}));
            let mut after = before.clone();
            rewrite(&mut after, Some(&tenant_dns()), "shop");
            assert_eq!(after, before, "{policy}, hostNetwork {host_network}");
        }
        let before = spec(json!({"containers": [], "dnsPolicy": "ClusterFirst"}));
        let mut after = before.clone();
        rewrite(&mut after, None, "shop");
        assert_eq!(after, before);
        let mut with_host_net = spec(json!({"containers": [], "dnsPolicy": "ClusterFirstWithHostNet"}));
        rewrite(&mut with_host_net, Some(&tenant_dns()), "shop");
        assert_eq!(with_host_net.dns_policy.as_deref(), Some("None"));
    }
}
