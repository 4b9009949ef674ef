//! `capn channels validate`: every template of a channel rendered against a sample context,
//! every error reported (not just the first) with its file and line.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::{
    CapnPods, ClusterSettings, ComponentRequest, DEFAULT_DNS_DOMAIN, DEFAULT_IMAGE_REPOSITORY, DEFAULT_SERVICE_CIDR,
    NetworkPolicySettings, Running, build_context, etcd_members,
};
use crate::api::ComponentSpec;
use crate::channel::Channel;
use crate::component::ComponentKind;
use crate::render::render_templates_in;

/// Renders each template of each version of each component of `channel` on its own against
/// a sample cluster (`sample` in namespace `sample-system`, 3 replicas, resources set), and
/// again with each of the channel's sizes (without resources, so the size's are rendered),
/// and returns one line per failure: `<file>[ line N]: <what>`, each once. Empty means valid.
pub fn validate_channel(channel: &Channel) -> Vec<String> {
    let cluster = ClusterSettings {
        name: "sample".into(),
        namespace: "sample-system".into(),
        kubernetes_version: Some(channel.index.defaults.kubernetes.clone()),
        channel: Some(channel.name.clone()),
        size: None,
        image_repository: DEFAULT_IMAGE_REPOSITORY.into(),
        service_cidr: DEFAULT_SERVICE_CIDR.into(),
        dns_domain: DEFAULT_DNS_DOMAIN.into(),
        super_dns_domain: DEFAULT_DNS_DOMAIN.into(),
        // Every optional peer set, so that their template branches are rendered too.
        network_policy: NetworkPolicySettings {
            capn: Some(CapnPods {
                namespace: "capn-system".into(),
                labels: [("app.kubernetes.io/name".to_string(), "capn".to_string())].into(),
            }),
            apiserver_from: Some(vec![serde_json::json!({"ipBlock": {"cidr": "192.0.2.0/24"}})]),
            metrics_from: None,
        },
        kms_endpoints: vec!["unix:///var/run/kmsplugin/socket.sock".into()],
    };
    let spec: ComponentSpec = serde_json::from_value(serde_json::json!({
        "replicas": 3,
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}},
    }))
    .unwrap_or_default();
    let sized = ComponentSpec {
        resources: None,
        ..spec.clone()
    };
    let mut variants: Vec<(&ComponentSpec, Option<(&str, &crate::channel::Size)>)> = vec![(&spec, None)];
    variants.extend(channel.index.sizes.iter().map(|(n, s)| (&sized, Some((n.as_str(), s)))));
    let members = etcd_members(&cluster.name, &cluster.namespace, 3);
    let endpoints: Vec<String> = members.iter().map(|m| m.client_url.clone()).collect();
    let mut errors = Vec::new();
    for kind in ComponentKind::ALL {
        for (version, (spec, size)) in channel
            .versions(kind)
            .into_iter()
            .flat_map(|v| variants.iter().map(move |variant| (v, *variant)))
        {
            let request = ComponentRequest {
                kind,
                resource_name: "sample",
                spec,
                etcd_storage: None,
                etcd_restore: None,
                owner: OwnerReference::default(),
                running: Running::default(),
                audit: None,
                authentication: None,
                authorization: None,
                referenced: Default::default(),
            };
            let own_members = if kind == ComponentKind::Etcd {
                members.clone()
            } else {
                Vec::new()
            };
            let mut context = build_context(&cluster, &request, version, 3, own_members, endpoints.clone());
            super::size::apply(&mut context, kind, spec, size);
            for template in channel.templates(kind, version).unwrap_or_default() {
                if let Err(e) = render_templates_in(std::slice::from_ref(template), &context, &cluster.namespace) {
                    let e = e.to_string();
                    if !errors.contains(&e) {
                        errors.push(e);
                    }
                }
            }
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::ChannelRegistry;

    #[test]
    fn builtin_stable_channel_is_valid() {
        let registry = ChannelRegistry::load(&[]).unwrap();
        assert_eq!(validate_channel(registry.get("stable").unwrap()), Vec::<String>::new());
    }

    #[test]
    fn every_broken_template_is_reported_with_file_and_line() {
        let files = vec![
            (
                "channel.yaml".to_string(),
                "name: broken\ncomponents:\n  etcd:\n    versions: [\"3.6.8\"]\ndefaults:\n  kubernetes: \"1.36.3\"\n"
                    .to_string(),
            ),
            (
                "3.6.8/etcd/a.yaml".to_string(),
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ nmes.etcd }}\n".to_string(),
            ),
            (
                "3.6.8/etcd/b.yaml".to_string(),
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ok\n".to_string(),
            ),
            (
                "3.6.8/etcd/c.yaml".to_string(),
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\ndata: {{ 1 + }}\n".to_string(),
            ),
        ];
        let channel = Channel::from_files("broken", "test", files).unwrap();
        let errors = validate_channel(&channel);
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].contains("3.6.8/etcd/a.yaml line 4"), "{errors:?}");
        assert!(errors[1].contains("3.6.8/etcd/c.yaml"), "{errors:?}");
    }
}
