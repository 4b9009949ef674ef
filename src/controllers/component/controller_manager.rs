//! NestedControllerManager specifics: waits for a ready NestedAPIServer; gives the
//! controller-manager its own kubeconfig identity (`system:kube-controller-manager`,
//! never the admin one) pointing at the apiserver Service.

use crate::status::Reason;
use std::sync::Arc;

use futures::stream::BoxStream;
use kube::runtime::reflector::ObjectRef;

use crate::api::{NestedAPIServer, NestedControlPlane, NestedControllerManager};
use crate::component::ComponentKind;
use crate::controllers::component::{ComponentResource, component_accessors, predecessor_ready, successor_of};
use crate::controllers::round::Gate;
use crate::controllers::shared::certificates::{CertificateStore, waiting_for_ca};
use crate::controllers::{Context, ReconcileError};
use crate::pki::{CONTROLLER_MANAGER_USER, SecretNames, apiserver_service_host, controller_manager_leaf, server_url};
use crate::plan::{APISERVER_PORT, ClusterSettings, Plan, Upstream};

impl ComponentResource for NestedControllerManager {
    component_accessors!(
        ComponentKind::ControllerManager,
        controller_manager,
        "controllerManager",
        controller_managers
    );

    /// Open when the control plane's NestedAPIServer is ready (docs/design.md §5 order): the
    /// controller-manager is never newer than the apiserver, it follows its release.
    fn gate(ctx: &Context, ncp: &NestedControlPlane, cluster: &ClusterSettings, ns: &str) -> Gate {
        match predecessor_ready::<NestedAPIServer>(ctx, ncp, cluster, ns) {
            Ok(_) => Gate::Open(Upstream::default()),
            Err(message) => Gate::Wait {
                reason: Reason::WaitingForAPIServer,
                message,
            },
        }
    }

    fn predecessor_changes(
        ctx: &Arc<Context>,
        subscriptions: &crate::controllers::shared::cache::Subscriptions,
    ) -> Option<BoxStream<'static, ObjectRef<Self>>> {
        Some(successor_of::<NestedAPIServer, Self>(ctx, subscriptions))
    }

    /// Writes `<c>-controller-manager-kubeconfig`.
    async fn ensure_certificates(
        store: &CertificateStore<'_>,
        cluster: &ClusterSettings,
        _ncp: &NestedControlPlane,
        _plan: &Plan,
        _applied: &[serde_json::Value],
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
                true,
            )
            .await?;
        Ok(Gate::Open(Upstream::default()))
    }
}
