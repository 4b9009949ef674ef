//! NestedAPIServer specifics: waits for a ready NestedEtcd and renders against the
//! endpoints it published; issues the serving certificate once the Service has its
//! ClusterIP, plus the apiserver's client certificates (etcd, kubelet, front proxy).

use crate::status::Reason;
use std::net::IpAddr;
use std::sync::Arc;

use futures::StreamExt;
use futures::stream::BoxStream;
use kube::runtime::reflector::ObjectRef;

use crate::api::{NestedAPIServer, NestedControlPlane, NestedEtcd, ServiceOutput};
use crate::component::ComponentKind;
use crate::controllers::component::{ComponentResource, component_accessors, predecessor_ready, successor_of};
use crate::controllers::round::Gate;
use crate::controllers::shared::certificates::{CertificateStore, waiting_for_ca};
use crate::controllers::{Context, ReconcileError};
use crate::pki::{
    ApiServerSanInput, SecretNames, apiserver_etcd_client_leaf, apiserver_kubelet_client_leaf, apiserver_leaf,
    front_proxy_client_leaf,
};
use crate::plan::{APISERVER_PORT, ClusterSettings, Plan, Upstream};

fn cluster_ip(applied: &[serde_json::Value], service: &str) -> Option<String> {
    applied
        .iter()
        .find(|o| o["kind"] == "Service" && o["metadata"]["name"] == service)
        .and_then(|s| s.pointer("/spec/clusterIP"))
        .and_then(|ip| ip.as_str())
        .filter(|ip| !ip.is_empty() && *ip != "None")
        .map(str::to_string)
}

/// The NestedAPIServers in `namespace` for which `reads` holds.
fn referring(
    ctx: &Context,
    namespace: &str,
    reads: impl Fn(&NestedAPIServer) -> bool,
) -> Vec<ObjectRef<NestedAPIServer>> {
    ctx.caches
        .apiservers
        .state()
        .iter()
        .filter(|a| a.metadata.namespace.as_deref() == Some(namespace) && reads(a))
        .map(|a| ObjectRef::from_obj(&**a))
        .collect()
}

/// Whether `apiserver` may read Secret `name` of its namespace: its audit webhook's, or a
/// webhook authorizer's. An authorization configuration in a ConfigMap names its Secrets
/// where the cache cannot see them, so such an apiserver reads every Secret of its
/// namespace as far as this trigger knows (a spare pass costs reads, not writes).
fn reads_secret(apiserver: &NestedAPIServer, name: &str) -> bool {
    let security = &apiserver.spec.security;
    let authorization = security.authorization.as_deref();
    security
        .audit
        .as_ref()
        .and_then(|audit| audit.webhook.as_ref())
        .is_some_and(|w| w.config_secret_ref.name == name)
        || authorization.is_some_and(|a| a.configuration_ref.is_some())
        || crate::plan::authorization::webhook_secrets(authorization.and_then(|a| a.configuration.as_ref()))
            .iter()
            .any(|(secret, _)| *secret == name)
}

/// Whether `apiserver` references ConfigMap `name` of its namespace: its audit policy,
/// authentication or authorization configuration.
fn references_config_map(apiserver: &NestedAPIServer, name: &str) -> bool {
    let security = &apiserver.spec.security;
    [
        crate::plan::audit::policy_reference(security.audit.as_deref()),
        crate::plan::authentication::configuration_reference(security.authentication.as_deref()),
        crate::plan::authorization::configuration_reference(security.authorization.as_deref()),
    ]
    .into_iter()
    .flatten()
    .any(|(config_map, _)| config_map == name)
}

impl ComponentResource for NestedAPIServer {
    component_accessors!(ComponentKind::ApiServer, apiserver, "apiserver", apiservers);

    /// Open when the control plane's NestedEtcd is ready and has published endpoints
    /// (docs/design.md §5: nothing of the apiserver exists before).
    fn gate(ctx: &Context, ncp: &NestedControlPlane, cluster: &ClusterSettings, ns: &str) -> Gate {
        match predecessor_ready::<NestedEtcd>(ctx, ncp, cluster, ns) {
            Ok(etcd) if !etcd.endpoints.is_empty() => Gate::Open(Upstream {
                etcd_endpoints: etcd.endpoints,
                ..Upstream::default()
            }),
            Ok(_) => Gate::Wait {
                reason: Reason::WaitingForEtcd,
                message: "NestedEtcd has published no endpoints".into(),
            },
            Err(message) => Gate::Wait {
                reason: Reason::WaitingForEtcd,
                message,
            },
        }
    }

    fn predecessor_changes(
        ctx: &Arc<Context>,
        subscriptions: &crate::controllers::shared::cache::Subscriptions,
    ) -> Option<BoxStream<'static, ObjectRef<Self>>> {
        // And a change of a Secret or ConfigMap the apiserver's security settings read
        // (capn does not own them, so the Secret triggers of the control plane miss them).
        let apiservers = ctx.clone();
        let webhook_secrets = ctx.caches.secret_changes().flat_map(move |secret| {
            let referring = referring(&apiservers, &secret.namespace, |a| reads_secret(a, &secret.name));
            futures::stream::iter(referring)
        });
        let apiservers = ctx.clone();
        let config_maps = ctx.caches.config_map_changes().flat_map(move |config_map| {
            let referring = referring(&apiservers, &config_map.namespace, |a| {
                references_config_map(a, &config_map.name)
            });
            futures::stream::iter(referring)
        });
        Some(
            futures::stream::select_all([
                successor_of::<NestedEtcd, Self>(ctx, subscriptions),
                webhook_secrets.boxed(),
                config_maps.boxed(),
            ])
            .boxed(),
        )
    }

    fn audit(&self) -> Option<&crate::api::ApiServerAudit> {
        self.spec.security.audit.as_deref()
    }

    fn authentication(&self) -> Option<&crate::api::ApiServerAuthentication> {
        self.spec.security.authentication.as_deref()
    }

    fn authorization(&self) -> Option<&crate::api::ApiServerAuthorization> {
        self.spec.security.authorization.as_deref()
    }

    /// Issues the serving certificate (SANs include the ClusterIP the super cluster
    /// assigned, the endpoint host and `certSANs`) and the three client certificates.
    /// An invalid `certSANs` entry is a PKI error.
    async fn ensure_certificates(
        store: &CertificateStore<'_>,
        cluster: &ClusterSettings,
        ncp: &NestedControlPlane,
        _plan: &Plan,
        applied: &[serde_json::Value],
    ) -> Result<Gate, ReconcileError> {
        let names = SecretNames::new(&cluster.name);
        let Some(ca) = store.require_ca(&names.ca).await? else {
            return Ok(waiting_for_ca(&names.ca));
        };
        let Some(etcd_ca) = store.require_ca(&names.etcd_ca).await? else {
            return Ok(waiting_for_ca(&names.etcd_ca));
        };
        let Some(proxy_ca) = store.require_ca(&names.proxy_ca).await? else {
            return Ok(waiting_for_ca(&names.proxy_ca));
        };
        let service = ComponentKind::ApiServer.object_name(&cluster.name);
        let service_ip: Option<IpAddr> = cluster_ip(applied, &service).and_then(|ip| ip.parse().ok());
        if service_ip.is_none() {
            return Ok(Gate::Wait {
                reason: Reason::WaitingForService,
                message: format!("Service {service} has no ClusterIP yet"),
            });
        }
        let endpoint_host = ncp.spec.control_plane_endpoint.as_ref().map(|e| e.host.as_str());
        let serving = apiserver_leaf(ApiServerSanInput {
            cluster_name: &cluster.name,
            namespace: &cluster.namespace,
            tenant_dns_domain: &cluster.dns_domain,
            super_dns_domain: &cluster.super_dns_domain,
            service_cidr: &cluster.service_cidr,
            service_cluster_ip: service_ip,
            endpoint_host,
            cert_sans: &ncp.spec.cert_sans,
        })
        .map_err(|source| ReconcileError::Pki {
            secret: names.apiserver.clone(),
            source,
        })?;
        // Four independent Secrets: sent at once, not one round trip after another.
        let (etcd_client, kubelet_client, front_proxy_client) = (
            apiserver_etcd_client_leaf(),
            apiserver_kubelet_client_leaf(),
            front_proxy_client_leaf(),
        );
        futures::try_join!(
            store.ensure_leaf(&names.apiserver, &ca, &serving),
            store.ensure_leaf(&names.apiserver_etcd_client, &etcd_ca, &etcd_client),
            store.ensure_leaf(&names.apiserver_kubelet_client, &ca, &kubelet_client),
            store.ensure_leaf(&names.front_proxy_client, &proxy_ca, &front_proxy_client),
        )?;
        Ok(Gate::Open(Upstream::default()))
    }

    /// The apiserver Service as published in status.
    fn service_output(cluster: &ClusterSettings, applied: &[serde_json::Value]) -> Option<ServiceOutput> {
        let name = ComponentKind::ApiServer.object_name(&cluster.name);
        let ip = cluster_ip(applied, &name);
        applied
            .iter()
            .any(|o| o["kind"] == "Service" && o["metadata"]["name"] == name)
            .then_some(ServiceOutput {
                name,
                cluster_ip: ip,
                port: APISERVER_PORT,
            })
    }
}
