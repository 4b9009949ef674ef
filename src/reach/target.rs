//! What an in-cluster name or address capn dials stands for in the super cluster (pure).
//!
//! capn dials a tenant's apiserver by its Service (`<service>.<namespace>.svc[.<domain>]`,
//! the kubeconfig's server), its etcd members by their pods' names under the headless
//! Service (`<pod>.<service>.<namespace>.svc[.<domain>]`, the names etcd's certificates
//! carry), and each apiserver replica by the address it advertises (the tenant's
//! `kubernetes` EndpointSlice lists pod IPs). Cluster DNS answers the names from
//! Services and pods in the same way (the DNS specification for Kubernetes,
//! <https://github.com/kubernetes/dns/blob/master/docs/specification.md>).

use std::net::IpAddr;

/// An object of the super cluster whose pods serve what capn dials.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// A Service: one of its ready pods, as `kubectl port-forward service/<name>` picks.
    Service { namespace: String, name: String },
    /// A pod by name (a StatefulSet member under its headless Service).
    Pod { namespace: String, name: String },
    /// The pod of the namespace with this address (an advertised apiserver address).
    PodIp { namespace: String, ip: IpAddr },
}

impl Target {
    /// The target of the in-cluster name `host`: `<service>.<namespace>.svc` or
    /// `<pod>.<service>.<namespace>.svc`, each with any cluster domain after `svc`; `None`
    /// for any other name (an external load balancer's, say), which is dialled as it is.
    pub fn of_name(host: &str) -> Option<Self> {
        let host = host.trim_end_matches('.');
        let labels: Vec<&str> = host.split('.').collect();
        let svc = labels.iter().position(|l| *l == "svc")?;
        if labels[..svc].iter().any(|l| l.is_empty()) {
            return None;
        }
        match labels[..svc] {
            [name, namespace] => Some(Self::Service {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            }),
            [pod, _service, namespace] => Some(Self::Pod {
                namespace: namespace.to_owned(),
                name: pod.to_owned(),
            }),
            _ => None,
        }
    }

    /// The namespace the target lives in.
    pub fn namespace(&self) -> &str {
        match self {
            Self::Service { namespace, .. } | Self::Pod { namespace, .. } | Self::PodIp { namespace, .. } => namespace,
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Service { namespace, name } => write!(f, "service {namespace}/{name}"),
            Self::Pod { namespace, name } => write!(f, "pod {namespace}/{name}"),
            Self::PodIp { namespace, ip } => write!(f, "the pod of {namespace} at {ip}"),
        }
    }
}

/// The container port a Service's `port` leads to on `pod`: the Service port's `targetPort`
/// (a number, or a name looked up among the pod's container ports), or `port` itself when
/// the Service names no such port (kubectl port-forward's rule, `getPodPortFromService`).
///
/// # Errors
/// A named target port that no container of the pod declares.
pub fn pod_port(
    service: &k8s_openapi::api::core::v1::Service,
    pod: &k8s_openapi::api::core::v1::Pod,
    port: u16,
) -> Result<u16, String> {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let ports = service.spec.as_ref().and_then(|s| s.ports.as_ref());
    let Some(service_port) = ports.into_iter().flatten().find(|p| p.port == i32::from(port)) else {
        return Ok(port);
    };
    match &service_port.target_port {
        None => Ok(port),
        Some(IntOrString::Int(n)) => u16::try_from(*n).map_err(|_| format!("target port {n} is out of range")),
        Some(IntOrString::String(name)) => pod
            .spec
            .iter()
            .flat_map(|s| &s.containers)
            .flat_map(|c| c.ports.iter().flatten())
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .ok_or_else(|| format!("no container of the pod declares the port named {name:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_and_member_names_map_to_their_objects_whatever_the_domain() {
        let service = |ns: &str, name: &str| {
            Some(Target::Service {
                namespace: ns.into(),
                name: name.into(),
            })
        };
        let pod = |ns: &str, name: &str| {
            Some(Target::Pod {
                namespace: ns.into(),
                name: name.into(),
            })
        };
        assert_eq!(
            Target::of_name("demo-apiserver.tenant-a.svc"),
            service("tenant-a", "demo-apiserver")
        );
        assert_eq!(
            Target::of_name("demo-apiserver.tenant-a.svc.cluster.local."),
            service("tenant-a", "demo-apiserver")
        );
        assert_eq!(
            Target::of_name("demo-etcd-0.demo-etcd.tenant-a.svc.corp.example"),
            pod("tenant-a", "demo-etcd-0")
        );
        for other in ["example.com", "tenant-a.svc", "a.b.c.d.svc", "localhost", ".x.svc"] {
            assert_eq!(Target::of_name(other), None, "{other}");
        }
    }

    #[test]
    fn a_service_port_leads_to_its_target_port_by_number_or_name() {
        let service: k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
            "spec": {"ports": [
                {"port": 443, "targetPort": 6443},
                {"port": 2379, "targetPort": "client"},
                {"port": 80}]}
        }))
        .unwrap();
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "spec": {"containers": [{"name": "etcd", "ports": [{"name": "client", "containerPort": 12379}]}]}
        }))
        .unwrap();
        assert_eq!(pod_port(&service, &pod, 443), Ok(6443));
        assert_eq!(pod_port(&service, &pod, 2379), Ok(12379));
        assert_eq!(pod_port(&service, &pod, 80), Ok(80));
        assert_eq!(pod_port(&service, &pod, 8080), Ok(8080));
        let no_name: k8s_openapi::api::core::v1::Pod =
            serde_json::from_value(serde_json::json!({"spec": {"containers": [{"name": "etcd"}]}})).unwrap();
        assert!(pod_port(&service, &no_name, 2379).unwrap_err().contains("client"));
    }
}
