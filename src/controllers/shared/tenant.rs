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
    if let Some(hook) = &ctx.settings.tenant_config_hook {
        (hook.0)(ncp, &mut config);
    }
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(Duration::from_secs(15));
    Ok(config)
}
