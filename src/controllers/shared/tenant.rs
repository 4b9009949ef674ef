//! Clients of the tenants' apiservers, built from each control plane's admin kubeconfig
//! (`<cluster>-kubeconfig`), for the controllers that write inside tenants (the public CRD
//! sync, the syncer) and the upgrade preflight.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

use crate::api::NestedControlPlane;
use crate::controllers::shared::read::cluster_name;
use crate::controllers::{Context, ReconcileError};
use crate::pki::{SecretNames, kubeconfig_from_secret};

/// Builds a client for the nested control plane of `ncp` from its admin kubeconfig.
///
/// # Errors
/// A missing or unparsable kubeconfig Secret.
pub(crate) async fn tenant_client(
    ctx: &Context,
    ncp: &NestedControlPlane,
    ns: &str,
) -> Result<kube::Client, ReconcileError> {
    Ok(kube::Client::try_from(tenant_config(ctx, ncp, ns).await?)?)
}

/// The client configuration of [`tenant_client`], for callers that dial each apiserver
/// replica themselves.
///
/// # Errors
/// A missing or unparsable kubeconfig Secret.
pub(crate) async fn tenant_config(
    ctx: &Context,
    ncp: &NestedControlPlane,
    ns: &str,
) -> Result<kube::Config, ReconcileError> {
    let names = SecretNames::new(&cluster_name(ncp));
    let secret = Api::<Secret>::namespaced(ctx.client.clone(), ns)
        .get(&names.kubeconfig)
        .await?;
    let text = kubeconfig_from_secret(&secret).map_err(|source| ReconcileError::Pki {
        secret: names.kubeconfig.clone(),
        source,
    })?;
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&text)
        .map_err(|e| ReconcileError::Kube(kube::Error::InferKubeconfig(e)))?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|e| ReconcileError::Kube(kube::Error::InferKubeconfig(e)))?;
    // Outside the pod network the in-cluster names do not resolve: the hosts file
    // (`capn run --etcd-hosts-file`) maps them, or capn reaches them through the super cluster.
    if let Some((host, port)) = server_name(&config) {
        let mapped = ctx.settings.etcd_hosts_file.as_ref().and_then(|hosts| {
            crate::etcd::HostsFile::new(hosts)
                .lookup(&host)
                .map(|ip| std::net::SocketAddr::new(ip, port))
        });
        if let Some(address) = mapped {
            dial_at(&mut config, &host, address);
        }
    }
    if let Some(hook) = &ctx.settings.tenant_config_hook {
        (hook.0)(ncp, &mut config);
    }
    if let Some((host, port)) = server_name(&config)
        && let Some(address) = ctx.reach.dial(&host, port).await?
    {
        dial_at(&mut config, &host, address);
    }
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(Duration::from_secs(15));
    Ok(config)
}

/// The server's host name and port (443 when the URL has none), or `None` when the server
/// is an IP address, which needs no mapping.
fn server_name(config: &kube::Config) -> Option<(String, u16)> {
    let host = config
        .cluster_url
        .host()
        .filter(|h| h.parse::<std::net::IpAddr>().is_err())?;
    Some((host.to_owned(), config.cluster_url.port_u16().unwrap_or(443)))
}

/// Dials `address` for the server named `host` and still verifies its certificate for the
/// name (kube's `tls_server_name`).
fn dial_at(config: &mut kube::Config, host: &str, address: std::net::SocketAddr) {
    if let Ok(dialled) = format!("https://{address}").parse() {
        config.tls_server_name.get_or_insert_with(|| host.to_owned());
        config.cluster_url = dialled;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_server_is_dialled_at_an_address_and_verified_for_the_name() {
        let mut config = kube::Config::new("https://demo-apiserver.tenant-a.svc:6443".parse().unwrap());
        let (host, port) = server_name(&config).unwrap();
        assert_eq!((host.as_str(), port), ("demo-apiserver.tenant-a.svc", 6443));
        dial_at(&mut config, &host, "198.18.7.3:6443".parse().unwrap());
        assert_eq!(config.cluster_url.to_string(), "https://198.18.7.3:6443/");
        assert_eq!(config.tls_server_name.as_deref(), Some("demo-apiserver.tenant-a.svc"));
        // IPv6 addresses are bracketed.
        dial_at(&mut config, &host, "[fd00::7]:6443".parse().unwrap());
        assert_eq!(config.cluster_url.to_string(), "https://[fd00::7]:6443/");
        // A server given by address needs no mapping; a URL without a port means 443.
        assert_eq!(
            server_name(&kube::Config::new("https://198.18.7.3".parse().unwrap())),
            None
        );
        let named = kube::Config::new("https://demo.tenant-a.svc".parse().unwrap());
        assert_eq!(server_name(&named), Some(("demo.tenant-a.svc".to_owned(), 443)));
    }
}
