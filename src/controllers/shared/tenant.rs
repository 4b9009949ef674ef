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
    if let Some(hosts) = &ctx.settings.etcd_hosts_file {
        dial_through_hosts_file(&mut config, &crate::etcd::HostsFile::new(hosts));
    }
    if let Some(hook) = &ctx.settings.tenant_config_hook {
        (hook.0)(ncp, &mut config);
    }
    dial_through_reach(&mut config, &ctx.reach).await?;
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(Duration::from_secs(15));
    Ok(config)
}

/// When the server is an in-cluster name that capn reaches through a port-forward
/// ([`crate::reach`]), dials its local end and still verifies the certificate for the name.
///
/// # Errors
/// The port-forward is needed and cannot be set up.
async fn dial_through_reach(config: &mut kube::Config, reach: &crate::reach::Reach) -> Result<(), ReconcileError> {
    let url = config.cluster_url.clone();
    let Some(host) = url.host().filter(|h| h.parse::<std::net::IpAddr>().is_err()) else {
        return Ok(());
    };
    let port = url.port_u16().unwrap_or(443);
    let address = reach.dial(host, port).await?;
    if let Some(dialled) = address.and_then(|a| format!("https://{a}").parse().ok()) {
        config.tls_server_name.get_or_insert_with(|| host.to_owned());
        config.cluster_url = dialled;
    }
    Ok(())
}

/// When the hosts file (`capn run --etcd-hosts-file`) names the server's host, dials that
/// address and still verifies the certificate for the name (kube's `tls_server_name`), as
/// for the tenant's etcd members: outside the pod network the in-cluster names of the tenant
/// apiservers do not resolve.
fn dial_through_hosts_file(config: &mut kube::Config, hosts: &crate::etcd::HostsFile) {
    let url = config.cluster_url.clone();
    let Some(host) = url.host().filter(|h| h.parse::<std::net::IpAddr>().is_err()) else {
        return;
    };
    let Some(address) = hosts.lookup(host) else {
        return;
    };
    let port = url.port_u16().unwrap_or(443);
    let dialled = match address {
        std::net::IpAddr::V4(a) => format!("https://{a}:{port}"),
        std::net::IpAddr::V6(a) => format!("https://[{a}]:{port}"),
    };
    if let Ok(dialled) = dialled.parse() {
        config.tls_server_name.get_or_insert_with(|| host.to_owned());
        config.cluster_url = dialled;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_the_hosts_file_maps_is_dialled_at_its_address_and_verified_for_the_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hosts");
        std::fs::write(&path, "198.18.7.3 demo-apiserver.tenant-a.svc\n").unwrap();
        let hosts = crate::etcd::HostsFile::new(&path);
        let mut config = kube::Config::new("https://demo-apiserver.tenant-a.svc:6443".parse().unwrap());
        dial_through_hosts_file(&mut config, &hosts);
        assert_eq!(config.cluster_url.to_string(), "https://198.18.7.3:6443/");
        assert_eq!(config.tls_server_name.as_deref(), Some("demo-apiserver.tenant-a.svc"));
        // A name the file does not know is dialled as it is.
        let mut other = kube::Config::new("https://other.tenant-a.svc:6443".parse().unwrap());
        dial_through_hosts_file(&mut other, &hosts);
        assert_eq!(other.cluster_url.host(), Some("other.tenant-a.svc"));
        assert!(other.tls_server_name.is_none());
    }
}
