//! The Service environment variables of a pod, as the kubelet writes them
//! (`pkg/kubelet/envvars`): the syncer writes them itself, with the super ClusterIPs of
//! the tenant's Services (`crate::syncer::service`).

use k8s_openapi::api::core::v1::{EnvVar, ServicePort};

/// A Service as a pod's environment names it: its name in the tenant, the address pods
/// reach it at and its ports.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceLink {
    /// The tenant Service's name.
    pub name: String,
    /// The super ClusterIP (an IP address, IPv6 without brackets), or for the tenant's
    /// apiserver whatever `KUBERNETES_SERVICE_HOST` holds.
    pub host: String,
    /// The tenant Service's ports.
    pub ports: Vec<ServicePort>,
}

/// The Service environment variables of `links`, as the kubelet writes them
/// (`pkg/kubelet/envvars`, `FromServices`): `<NAME>_SERVICE_HOST`, `<NAME>_SERVICE_PORT`
/// (the first port), `<NAME>_SERVICE_PORT_<PORT NAME>` for each named port, and Docker's
/// link variables (`<NAME>_PORT`, `<NAME>_PORT_<port>_<PROTOCOL>` with `_PROTO`, `_PORT`
/// and `_ADDR`). A link without ports has none.
pub fn link_env(links: &[ServiceLink]) -> Vec<EnvVar> {
    let var = |name: String, value: String| EnvVar {
        name,
        value: Some(value),
        value_from: None,
    };
    let mut env = Vec::new();
    for link in links {
        let Some(first) = link.ports.first() else {
            continue;
        };
        let prefix = env_name(&link.name);
        env.push(var(format!("{prefix}_SERVICE_HOST"), link.host.clone()));
        env.push(var(format!("{prefix}_SERVICE_PORT"), first.port.to_string()));
        for port in link
            .ports
            .iter()
            .filter(|p| p.name.as_deref().is_some_and(|n| !n.is_empty()))
        {
            let name = port.name.as_deref().unwrap_or_default();
            env.push(var(
                format!("{prefix}_SERVICE_PORT_{}", env_name(name)),
                port.port.to_string(),
            ));
        }
        for (i, port) in link.ports.iter().enumerate() {
            let protocol = port.protocol.as_deref().unwrap_or("TCP");
            let url = format!("{}://{}", protocol.to_lowercase(), host_port(&link.host, port.port));
            if i == 0 {
                env.push(var(format!("{prefix}_PORT"), url.clone()));
            }
            let port_prefix = format!("{prefix}_PORT_{}_{}", port.port, protocol.to_uppercase());
            env.push(var(port_prefix.clone(), url));
            env.push(var(format!("{port_prefix}_PROTO"), protocol.to_lowercase()));
            env.push(var(format!("{port_prefix}_PORT"), port.port.to_string()));
            env.push(var(format!("{port_prefix}_ADDR"), link.host.clone()));
        }
    }
    env
}

/// A Service name as the kubelet writes it into a variable name: upper case, `-` as `_`.
fn env_name(name: &str) -> String {
    name.to_uppercase().replace('-', "_")
}

/// `host:port`, with an IPv6 address in brackets (Go's `net.JoinHostPort`).
fn host_port(host: &str, port: i32) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_environment_follows_the_kubelet_for_udp_and_ipv6() {
        let link = ServiceLink {
            name: "dns".into(),
            host: "fd00::a".into(),
            ports: vec![serde_json::from_value(json!({"port": 53, "protocol": "UDP"})).unwrap()],
        };
        let env: Vec<(String, String)> = link_env(&[link])
            .into_iter()
            .map(|e| (e.name, e.value.unwrap()))
            .collect();
        let expected: Vec<(String, String)> = [
            ("DNS_SERVICE_HOST", "fd00::a"),
            ("DNS_SERVICE_PORT", "53"),
            ("DNS_PORT", "udp://[fd00::a]:53"),
            ("DNS_PORT_53_UDP", "udp://[fd00::a]:53"),
            ("DNS_PORT_53_UDP_PROTO", "udp"),
            ("DNS_PORT_53_UDP_PORT", "53"),
            ("DNS_PORT_53_UDP_ADDR", "fd00::a"),
        ]
        .into_iter()
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(env, expected);
    }
}
