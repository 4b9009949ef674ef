//! NestedControllerManager specifics: waits for a ready NestedAPIServer; gives the
//! controller-manager its own kubeconfig identity (`system:kube-controller-manager`,
//! never the admin one) pointing at the apiserver Service.

use kube::api::Api;

use super::certificates::{CertificateStore, waiting_for_ca};
use super::component::Gate;
use super::{Context, ReconcileError};
use crate::api::{NestedAPIServer, NestedControlPlane};
use crate::component::ComponentKind;
use crate::pki::{CONTROLLER_MANAGER_USER, SecretNames, apiserver_service_host, controller_manager_leaf, server_url};
use crate::plan::{APISERVER_PORT, ClusterSettings, Upstream, resolve};

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
    let wait = |message: String| Gate::Wait {
        reason: "WaitingForAPIServer",
        message,
    };
    let Some(name) = ncp.spec.apiserver.as_ref().map(|r| r.name.clone()) else {
        return Ok(wait("the NestedControlPlane has no NestedAPIServer yet".into()));
    };
    let api: Api<NestedAPIServer> = Api::namespaced(ctx.client.clone(), ns);
    let Some(apiserver) = api.get_opt(&name).await? else {
        return Ok(wait(format!("NestedAPIServer {name} does not exist")));
    };
    // During an upgrade the controller-manager follows only once the apiserver is ready on
    // its new release (it may never be newer than the apiserver).
    let desired = resolve(
        &ctx.channels,
        cluster,
        ComponentKind::ApiServer,
        &apiserver.spec.component,
    )
    .ok()
    .map(|r| r.version.to_string());
    let generation = apiserver.metadata.generation;
    match apiserver.status {
        Some(s) if s.ready && s.observed_generation == generation && s.version == desired => {
            Ok(Gate::Open(Upstream::default()))
        }
        Some(s) if s.ready => Ok(wait(format!(
            "NestedAPIServer {name} runs {} and is moving to {}",
            s.version.unwrap_or_default(),
            desired.unwrap_or_default()
        ))),
        _ => Ok(wait(format!("NestedAPIServer {name} is not ready"))),
    }
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
