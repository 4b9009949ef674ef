//! NestedControllerManager specifics: waits for a ready NestedAPIServer; gives the
//! controller-manager its own kubeconfig identity (`system:kube-controller-manager`,
//! never the admin one) pointing at the apiserver Service.

use super::certificates::{CertificateStore, waiting_for_ca};
use super::component::{Gate, predecessor_ready};
use super::{Context, ReconcileError};
use crate::api::{NestedAPIServer, NestedControlPlane};
use crate::pki::{CONTROLLER_MANAGER_USER, SecretNames, apiserver_service_host, controller_manager_leaf, server_url};
use crate::plan::{APISERVER_PORT, ClusterSettings, Upstream};

/// Open when the control plane's NestedAPIServer is ready (design §5 order).
///
/// # Errors
/// API errors reading the NestedAPIServer.
pub async fn gate(
    ctx: &Context,
    ncp: &NestedControlPlane,
    cluster: &ClusterSettings,
    ns: &str,
) -> Result<Gate, ReconcileError> {
    // The controller-manager is never newer than the apiserver: it follows its release.
    Ok(
        match predecessor_ready::<NestedAPIServer>(ctx, ncp, cluster, ns).await? {
            Ok(_) => Gate::Open(Upstream::default()),
            Err(message) => Gate::Wait {
                reason: "WaitingForAPIServer",
                message,
            },
        },
    )
}

/// Writes `<c>-controller-manager-kubeconfig`.
///
/// # Errors
/// API and PKI errors.
pub async fn ensure_certificates(
    store: &CertificateStore<'_>,
    cluster: &ClusterSettings,
) -> Result<Gate, ReconcileError> {
    let names = SecretNames::new(&cluster.name);
    let Some(ca) = store.require_ca(&names.ca).await? else {
        return Ok(waiting_for_ca(&names.ca));
    };
    let server = server_url(
        &apiserver_service_host(&cluster.name, &cluster.namespace),
        APISERVER_PORT as u16,
    );
    store
        .ensure_kubeconfig(
            &names.controller_manager_kubeconfig,
            &ca,
            &controller_manager_leaf(),
            CONTROLLER_MANAGER_USER,
            &server,
        )
        .await?;
    Ok(Gate::Open(Upstream::default()))
}
