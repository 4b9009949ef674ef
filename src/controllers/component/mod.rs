//! The reconciler shared by NestedEtcd, NestedAPIServer and NestedControllerManager.
//!
//! read (owning NestedControlPlane, cluster settings, upstream outputs: all from the watch
//! caches) → plan (pure) → apply (Services, then certificates, then the workloads stamped
//! with the certificates digest) → report status. What differs per kind (the gate, the
//! certificates) is behind [`ComponentResource`], implemented in [`crate::controllers::component::etcd`],
//! [`crate::controllers::component::apiserver`] and [`crate::controllers::component::controller_manager`].

pub mod apiserver;
pub mod controller_manager;
mod drive;
pub mod etcd;
mod report;

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::NamespaceResourceScope;
use kube::api::{Api, Patch};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, ReflectHandle, Store};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::api::{ComponentSpec, ComponentStatus, EtcdStorage, NestedControlPlane, ServiceOutput};
use crate::apply::apply_params;
use crate::component::ComponentKind;
use crate::controllers::component::etcd::backup::{BackupReport, RestorePlan};
use crate::controllers::component::etcd::membership::Membership;
use crate::controllers::round::{Gate, Now};
use crate::controllers::shared::cache::{Caches, Subscriptions};
use crate::controllers::shared::certificates::CertificateStore;
use crate::controllers::shared::read::owning_control_plane;
use crate::controllers::shared::status_memo;
use crate::controllers::{Context, ReconcileError, events};
use crate::plan::{ClusterSettings, Plan, resolve};

/// A component custom resource, and what its reconcile does differently from the others.
pub trait ComponentResource:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + Debug
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
    const KIND: ComponentKind;
    /// The field of NestedControlPlane `spec` holding the reference to this kind.
    const REFERENCE_FIELD: &'static str;
    fn component(&self) -> &ComponentSpec;
    fn component_status(&self) -> Option<&ComponentStatus>;
    fn etcd_storage(&self) -> Option<&EtcdStorage> {
        None
    }
    /// The reference to this kind in a NestedControlPlane's spec.
    fn reference(ncp: &NestedControlPlane) -> Option<&str>;
    /// A new resource of this kind with the default spec.
    fn with_defaults(name: &str) -> Self;
    /// The shared watch cache of this kind.
    fn cache(caches: &Caches) -> &Store<Self>;
    /// The change stream of this kind's shared watch.
    fn subscription(subscriptions: &Subscriptions) -> ReflectHandle<Self>;

    /// Whether the component may proceed (docs/design.md §5: each waits for its predecessor, ready
    /// on the release it should run), with the upstream outputs it renders against. Reads
    /// only the caches.
    fn gate(ctx: &Context, ncp: &NestedControlPlane, cluster: &ClusterSettings, ns: &str) -> Gate;

    /// Changes of the predecessor that may open the gate, as requests to reconcile this
    /// kind (no hop through the NestedControlPlane). `None` for the first component.
    fn predecessor_changes(
        ctx: &Arc<Context>,
        subscriptions: &Subscriptions,
    ) -> Option<BoxStream<'static, ObjectRef<Self>>>;

    /// Issues the component's certificates before its workloads are applied (`applied`:
    /// the objects applied so far this round, the Services).
    fn ensure_certificates(
        store: &CertificateStore<'_>,
        cluster: &ClusterSettings,
        ncp: &NestedControlPlane,
        plan: &Plan,
        applied: &[serde_json::Value],
    ) -> impl Future<Output = Result<Gate, ReconcileError>> + Send;

    /// etcd: reads the members through etcd and takes at most one membership step; what
    /// the plan renders for them. The others: nothing.
    fn membership(_round: &Round<'_, Self>) -> impl Future<Output = Result<Membership, ReconcileError>> + Send {
        std::future::ready(Ok(Membership::default()))
    }

    /// What must be settled before the members are planned (etcd: a pending restore, see
    /// [`crate::controllers::component::etcd::backup`]), decided against the resolved channel
    /// and release, for the cluster named `cluster`. Default: nothing.
    fn prepare(
        _ctx: &Context,
        _object: &Self,
        _ns: &str,
        _cluster: &str,
        _channel: &crate::channel::Channel,
        _version: &semver::Version,
    ) -> impl Future<Output = Result<RestorePlan, ReconcileError>> + Send {
        async { Ok(RestorePlan::None) }
    }

    /// What follows a successful apply (etcd: backups, see
    /// [`crate::controllers::component::etcd::backup::backup_step`]), with whether the
    /// component is ready and the etcd client URLs. Default: nothing.
    fn after_apply(
        _round: &Round<'_, Self>,
        _channel: &crate::channel::Channel,
        _ready: bool,
        _endpoints: &[String],
    ) -> impl Future<Output = Result<BackupReport, ReconcileError>> + Send {
        async { Ok(BackupReport::default()) }
    }

    /// apiserver only: `spec.audit` (issue 39 item 2). Default: none.
    fn audit(&self) -> Option<&crate::api::ApiServerAudit> {
        None
    }

    /// apiserver only: `spec.authentication` (issue 39 item 1). Default: none.
    fn authentication(&self) -> Option<&crate::api::ApiServerAuthentication> {
        None
    }

    /// apiserver only: `spec.authorization` (issue 39 item 1). Default: none.
    fn authorization(&self) -> Option<&crate::api::ApiServerAuthorization> {
        None
    }

    /// The Service this component publishes in its status (the apiserver's), from the
    /// objects as applied.
    fn service_output(_cluster: &ClusterSettings, _applied: &[serde_json::Value]) -> Option<ServiceOutput> {
        None
    }
}

/// What every stage of one component reconcile works with, read once and handed to each
/// (Cluster API's KubeadmControlPlane calls it the scope): the object, its namespace and
/// owning control plane, the cluster settings, the round's certificate store and clock.
pub struct Round<'a, K> {
    pub ctx: &'a Context,
    pub object: &'a K,
    pub ns: &'a str,
    pub ncp: &'a NestedControlPlane,
    pub cluster: &'a ClusterSettings,
    pub store: &'a CertificateStore<'a>,
    pub now: &'a Now,
}

/// Implements the plain accessors of [`ComponentResource`] for a component kind whose spec
/// embeds the shared component spec as `component` and whose control plane reference is
/// `$field`; used inside each kind's `impl` block.
macro_rules! component_accessors {
    ($component:expr, $field:ident, $json_field:literal, $cache:ident $(, storage: $storage:ident)?) => {
        const KIND: $crate::component::ComponentKind = $component;
        const REFERENCE_FIELD: &'static str = $json_field;
        fn component(&self) -> &$crate::api::ComponentSpec {
            &self.spec.component
        }
        fn component_status(&self) -> Option<&$crate::api::ComponentStatus> {
            self.status.as_ref()
        }
        $(fn etcd_storage(&self) -> Option<&$crate::api::EtcdStorage> {
            self.spec.$storage.as_ref()
        })?
        fn reference(ncp: &$crate::api::NestedControlPlane) -> Option<&str> {
            ncp.spec.$field.as_ref().map(|r| r.name.as_str())
        }
        fn with_defaults(name: &str) -> Self {
            Self::new(name, Default::default())
        }
        fn cache(caches: &$crate::controllers::shared::cache::Caches) -> &kube::runtime::reflector::Store<Self> {
            &caches.$cache
        }
        fn subscription(
            subscriptions: &$crate::controllers::shared::cache::Subscriptions,
        ) -> kube::runtime::reflector::ReflectHandle<Self> {
            subscriptions.$cache.clone()
        }
    };
}
pub(crate) use component_accessors;

/// The status of the control plane's component of kind `P` when it is ready on the release
/// it should run (docs/design.md §5: each component waits for its predecessor, and during an upgrade
/// for the predecessor's new release); otherwise why not, for a wait message. Reads the cache.
pub fn predecessor_ready<P: ComponentResource>(
    ctx: &Context,
    ncp: &NestedControlPlane,
    cluster: &ClusterSettings,
    ns: &str,
) -> Result<ComponentStatus, String> {
    let kind = P::kind(&());
    let Some(name) = P::reference(ncp) else {
        return Err(format!("the NestedControlPlane has no {kind} yet"));
    };
    let Some(component) = P::cache(&ctx.caches).get(&ObjectRef::new(name).within(ns)) else {
        return Err(format!("{kind} {name} does not exist"));
    };
    let desired = resolve(&ctx.channels, cluster, P::KIND, component.component())
        .ok()
        .map(|r| r.version.to_string());
    let generation = component.meta().generation;
    match component.component_status() {
        Some(s) if s.ready && s.observed_generation == generation && s.version == desired => Ok(s.clone()),
        Some(s) if s.ready => Err(format!(
            "{kind} {name} runs {} and is moving to {}",
            s.version.clone().unwrap_or_default(),
            desired.unwrap_or_default()
        )),
        _ => Err(format!("{kind} {name} is not ready")),
    }
}

/// Requests to reconcile `K` whenever its predecessor `P` changes: `P` → its owning
/// NestedControlPlane (from the cache) → the `K` that control plane references.
pub fn successor_of<P: ComponentResource, K: ComponentResource>(
    ctx: &Arc<Context>,
    subscriptions: &Subscriptions,
) -> BoxStream<'static, ObjectRef<K>> {
    let ctx = ctx.clone();
    P::subscription(subscriptions)
        .filter_map(move |predecessor| {
            let next = predecessor.namespace().and_then(|ns| {
                let ncp = owning_control_plane(&ctx, &*predecessor, &ns)?;
                K::reference(&ncp).map(|name| ObjectRef::new(name).within(&ns))
            });
            std::future::ready(next)
        })
        .boxed()
}

/// The controller of component kind `K`, ready to be spawned: woken by its own changes,
/// its StatefulSets and Services, its control plane, its predecessor and its Secrets.
pub fn run<K: ComponentResource>(
    ctx: Arc<Context>,
    subscriptions: &Subscriptions,
) -> impl Future<Output = ()> + Send + 'static {
    let secrets = ctx
        .caches
        .secret_triggers(|ncp: &NestedControlPlane| reference_of::<K>(ncp));
    let mut controller = Controller::for_shared_stream(K::subscription(subscriptions), K::cache(&ctx.caches).clone())
        .with_config(crate::controllers::controller_config())
        .owns_shared_stream(subscriptions.statefulsets.clone())
        .owns_shared_stream(subscriptions.services.clone())
        // A control plane's spec or status change (a new version, a sibling's status) wakes
        // its components.
        .watches_shared_stream(subscriptions.control_planes.clone(), |ncp| reference_of::<K>(&ncp))
        // A re-issued, changed or deleted Secret wakes the components that mount it.
        .reconcile_on(secrets);
    if let Some(predecessor) = K::predecessor_changes(&ctx, subscriptions) {
        controller = controller.reconcile_on(predecessor);
    }
    async move {
        controller
            .shutdown_on_signal()
            .run(
                |object, ctx| async move {
                    crate::controllers::instrumented(&ctx.clone(), K::KIND.as_str(), reconcile(object, ctx)).await
                },
                error_policy::<K>,
                ctx.clone(),
            )
            .for_each(|result| async move {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "reconcile failed");
                }
            })
            .await;
    }
}

/// The component of kind `K` that `ncp` references.
fn reference_of<K: ComponentResource>(ncp: &NestedControlPlane) -> Option<ObjectRef<K>> {
    let ns = ncp.namespace()?;
    K::reference(ncp).map(|name| ObjectRef::new(name).within(&ns))
}

fn error_policy<K: ComponentResource>(object: Arc<K>, error: &ReconcileError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(kind = K::KIND.resource_kind(), name = %object.name_any(), reason = error.reason(), error = %error, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

/// Reconciles one component resource.
///
/// # Errors
/// Transient errors (API, apply) for the controller to retry with backoff; bad input is
/// not an error here but a condition on the resource.
/// Reconciles one component resource: [`drive::drive`] (read → plan → apply), then
/// [`report::report`] (pure) turns what it ended with into the status, written once.
///
/// # Errors
/// Transient errors (API, apply) for the controller to retry with backoff; bad input is
/// not an error here but a condition on the resource.
pub async fn reconcile<K: ComponentResource>(object: Arc<K>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    if object.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = object.namespace().ok_or(ReconcileError::NoNamespace)?;
    let now = Now::take();
    let outcome = drive::drive(&*object, &ctx, &ns, &now).await;
    let old = object.component_status().cloned().unwrap_or_default();
    let generation = object.meta().generation;
    let (status, action, result) = match outcome {
        Ok(outcome) => match report::report(K::KIND, &object.name_any(), &old, generation, outcome, &now) {
            Some((status, action)) => (status, action, Ok(())),
            None => return Ok(Action::await_change()),
        },
        Err(e) => {
            let (status, action) = report::report_error(&old, generation, &e, &now);
            (status, action, Err(e))
        }
    };
    ctx.metrics.set_managed(
        K::KIND.as_str(),
        format!("{ns}/{}", object.name_any()),
        status.inventory.len(),
    );
    let observed = status_memo::Observed::of(K::KIND.as_str(), &*object, &old);
    if status != old && !ctx.status_memo.already_written(&observed, &status) {
        let written = write_status(&ctx, &*object, &ns, &status).await?;
        ctx.status_memo.record(&observed, &status, written);
        events::publish_condition_changes(&ctx, &*object, &old.conditions, &status.conditions).await;
    }
    result.map(|()| action)
}

async fn write_status<K: ComponentResource>(
    ctx: &Context,
    object: &K,
    ns: &str,
    status: &ComponentStatus,
) -> Result<String, ReconcileError> {
    let api: Api<K> = Api::namespaced(ctx.client.clone(), ns);
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    let written = api
        .patch_status(&object.name_any(), &apply_params(), &Patch::Apply(&patch))
        .await?;
    Ok(written.resource_version().unwrap_or_default())
}
