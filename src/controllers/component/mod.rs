//! The reconciler shared by NestedEtcd, NestedAPIServer and NestedControllerManager.
//!
//! read (owning NestedControlPlane, cluster settings, upstream outputs: all from the watch
//! caches) → plan (pure) → apply (Services, then certificates, then the workloads stamped
//! with the certificates digest) → report status. What differs per kind (the gate, the
//! certificates) is behind [`ComponentResource`], implemented in [`crate::controllers::component::etcd`],
//! [`crate::controllers::component::apiserver`] and [`crate::controllers::component::controller_manager`].

pub mod apiserver;
pub mod controller_manager;
pub mod etcd;

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

use crate::api::{
    AppliedCertificates, ComponentSpec, ComponentStatus, EtcdStorage, InventoryEntry, NestedAPIServer,
    NestedControlPlane, NestedControllerManager, ServiceOutput,
};
use crate::apply::applyset::{
    CONTAINS_GROUP_KINDS_ANNOTATION, ID_LABEL, TOOLING_ANNOTATION, contains_group_kinds, group_kind, tooling,
};
use crate::apply::{apply_params, apply_rank, readiness};
use crate::component::ComponentKind;
use crate::controllers::component::etcd::membership::Membership;
use crate::controllers::round::{Gate, Now, recheck_after};
use crate::controllers::shared::cache::{Caches, Subscriptions};
use crate::controllers::shared::certificates::CertificateStore;
use crate::controllers::shared::read::{
    cluster_settings, controller_reference, is_paused, owning_cluster, owning_control_plane, renewal_policy,
};
use crate::controllers::shared::status_memo;
use crate::controllers::{Context, ReconcileError, events};
use crate::plan::{
    ClusterSettings, ComponentRequest, Plan, PlanError, Running, certificates_digest, check, check_input,
    check_members, component_applyset_id, plan, resolve, stamp_certificates_digest,
};
use crate::status::{ConditionUpdate, READY, ROLLING_OUT, Reason, SYNCED, is_true, phase, set_condition};

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

    /// etcd: reads the members through etcd and takes at most one membership step (issue
    /// 10); what the plan renders for them. The others: nothing.
    fn membership(
        _ctx: &Context,
        _object: &Self,
        _store: &CertificateStore<'_>,
        _cluster: &ClusterSettings,
        _now: &Now,
    ) -> impl Future<Output = Result<Membership, ReconcileError>> + Send {
        std::future::ready(Ok(Membership::default()))
    }

    /// What must be settled before the members are planned (etcd: a pending restore, see
    /// [`crate::controllers::component::etcd::backup`]), decided against the resolved channel and release. Default:
    /// nothing.
    fn prepare(
        _ctx: &Context,
        _object: &Self,
        _ns: &str,
        _channel: &crate::channel::Channel,
        _version: &semver::Version,
    ) -> impl Future<Output = Result<crate::controllers::component::etcd::backup::RestorePlan, ReconcileError>> + Send
    {
        async { Ok(crate::controllers::component::etcd::backup::RestorePlan::None) }
    }

    /// What follows a successful apply (etcd: backups, see [`crate::controllers::component::etcd::backup::backup_step`]),
    /// with the round's certificate store, whether the component is ready and the etcd
    /// client URLs. Default: nothing.
    #[allow(clippy::too_many_arguments)]
    fn after_apply(
        _ctx: &Context,
        _object: &Self,
        _ns: &str,
        _certificates: &CertificateStore<'_>,
        _cluster: &str,
        _channel: &crate::channel::Channel,
        _ready: bool,
        _endpoints: &[String],
        _now: k8s_openapi::jiff::Timestamp,
    ) -> impl Future<Output = Result<crate::controllers::component::etcd::backup::BackupReport, ReconcileError>> + Send
    {
        async { Ok(crate::controllers::component::etcd::backup::BackupReport::default()) }
    }

    /// The Service this component publishes in its status (the apiserver's), from the
    /// objects as applied.
    fn service_output(_cluster: &ClusterSettings, _applied: &[serde_json::Value]) -> Option<ServiceOutput> {
        None
    }
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

/// What one pass ended with.
// One value per reconcile, moved once and never stored in a collection: boxing the large
// variant would buy nothing.
#[allow(clippy::large_enum_variant)]
enum Outcome {
    Paused,
    /// Owned by a control plane whose spec does not name this component yet (it is about
    /// to: the control plane created it); no status is written.
    Unreferenced,
    Waiting {
        reason: Reason,
        message: String,
    },
    Invalid(PlanError),
    /// Refused before planning (a restore that cannot start); nothing is applied.
    Refused {
        reason: &'static str,
        message: String,
    },
    Applied {
        /// The restore status to report (etcd), when a restore is pending or completed.
        restore: Option<crate::api::RestoreStatus>,
        /// Backups (etcd): status, condition, when to look again.
        backup: crate::controllers::component::etcd::backup::BackupReport,
        plan: Plan,
        ready: bool,
        desired: i32,
        ready_replicas: i32,
        service: Option<ServiceOutput>,
        certificates: AppliedCertificates,
        /// When the first of the component's certificates is renewed.
        next_renewal: Option<time::OffsetDateTime>,
        /// Readiness is a provider kind's, which no watch reports.
        provider_readiness: bool,
        /// etcd: the membership as read and changed this round (boxed: the variant is large).
        membership: Box<Membership>,
    },
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
pub async fn reconcile<K: ComponentResource>(object: Arc<K>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    if object.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = object.namespace().ok_or(ReconcileError::NoNamespace)?;
    let now = Now::take();
    let outcome = drive(&*object, &ctx, &ns, &now).await;
    let old = object.component_status().cloned().unwrap_or_default();
    let mut status = old.clone();
    let generation = object.meta().generation;
    // Once a component has been applied, its running pods keep serving while a later spec
    // waits or is refused: `Ready` keeps describing them, `Synced` and `RollingOut` say why
    // the new spec is not applied.
    let running = old.version.is_some();
    let mut set = |update: ConditionUpdate| set_condition(&mut status.conditions, update, generation, &now.k8s);
    let (action, result) = match outcome {
        Ok(Outcome::Paused | Outcome::Unreferenced) => return Ok(Action::await_change()),
        Ok(Outcome::Waiting { reason, message }) => {
            if running {
                set(ConditionUpdate::new(ROLLING_OUT, true, reason, message));
            } else {
                set(ConditionUpdate::new(READY, false, reason, message));
                status.ready = false;
                status.phase = Some(phase::PENDING.into());
            }
            (Action::requeue(Duration::from_secs(30)), Ok(()))
        }
        Ok(Outcome::Invalid(err)) => {
            // Bad input: nothing was applied; wait for the spec (or channel) to change.
            set(ConditionUpdate::error(SYNCED, false, err.reason(), err.to_string()));
            if !running {
                set(ConditionUpdate::error(READY, false, err.reason(), err.to_string()));
                status.ready = false;
                status.phase = Some(phase::FAILED.into());
            }
            (Action::await_change(), Ok(()))
        }
        Ok(Outcome::Refused { reason, message }) => {
            set(ConditionUpdate::error(SYNCED, false, reason, message.clone()));
            if !running {
                set(ConditionUpdate::error(READY, false, reason, message));
                status.ready = false;
                status.phase = Some(phase::FAILED.into());
            }
            // What was missing (a snapshot, a Secret) may appear without a spec change.
            (Action::requeue(Duration::from_secs(60)), Ok(()))
        }
        Ok(Outcome::Applied {
            restore,
            backup,
            plan,
            ready,
            desired,
            ready_replicas,
            service,
            certificates,
            next_renewal,
            provider_readiness,
            membership,
        }) => {
            let members = format!("{ready_replicas}/{desired} members ready");
            set(ConditionUpdate::new(
                SYNCED,
                true,
                Reason::Applied,
                format!("{} {} from channel {}", K::KIND, plan.version, plan.channel),
            ));
            set(if ready {
                ConditionUpdate::new(READY, true, Reason::Ready, members.clone())
            } else {
                ConditionUpdate::new(READY, false, Reason::Provisioning, members.clone())
            });
            // Rolling out means replacing pods that served: a first provisioning is not
            // one, even after its first apply recorded a version (saying so for a moment
            // cost a status write, issue 11).
            let served = is_true(&old.conditions, READY) || is_true(&old.conditions, ROLLING_OUT);
            set(if ready {
                ConditionUpdate::new(
                    ROLLING_OUT,
                    false,
                    Reason::RolledOut,
                    format!("running {}", plan.version),
                )
            } else {
                ConditionUpdate::new(
                    ROLLING_OUT,
                    served,
                    Reason::RollingOut,
                    format!("rolling out {}: {members}", plan.version),
                )
            });
            status.ready = ready;
            status.phase = Some(if ready { phase::READY } else { phase::PROVISIONING }.into());
            status.version = Some(plan.version.to_string());
            status.channel = Some(plan.channel.clone());
            status.replicas = Some(desired);
            status.ready_replicas = Some(ready_replicas);
            status.replicas_display = Some(format!("{ready_replicas}/{desired}"));
            status.inventory = plan.inventory();
            // During a membership change the apiserver keeps the members it has (member 0
            // never goes, so it always reaches one); it gets the new list, and rolls once,
            // when the change is done.
            status.endpoints = if membership.render.is_none() || membership.settled || old.endpoints.is_empty() {
                plan.etcd_endpoints.clone()
            } else {
                old.endpoints.clone()
            };
            if let Some(members) = membership.status {
                status.etcd = Some(members);
            }
            if let Some(condition) = membership.condition {
                set(condition);
            }
            status.service = service;
            status.certificates = Some(certificates);
            if let Some(mut restore) = restore {
                // Every member ran from the restored data once this round's apply (the
                // template with the restore init containers) is ready: the next round
                // renders without them.
                if ready && restore.snapshot.is_some() {
                    restore.completed = true;
                }
                status.restore = Some(Box::new(restore));
            }
            if backup.status.is_some() {
                status.backup = backup.status.map(Box::new);
            }
            if let Some(condition) = backup.condition {
                set(condition);
            }
            // Owned StatefulSets and Services wake us on change; a provider's own kinds are
            // not watched, so look again soon while one is not ready. Otherwise come back when
            // the next certificate is due.
            let again = if !ready && provider_readiness {
                Duration::from_secs(10)
            } else {
                recheck_after(&object.name_any(), next_renewal, now.time)
            };
            let again = membership.requeue.map_or(again, |m| m.min(again));
            // The next scheduled snapshot, or a running one's result.
            let again = backup.requeue.map_or(again, |b| again.min(b));
            (Action::requeue(again), Ok(()))
        }
        Err(e) => {
            set(ConditionUpdate::error(SYNCED, false, e.reason(), e.to_string()));
            if !running {
                set(ConditionUpdate::error(READY, false, e.reason(), e.to_string()));
                status.ready = false;
            }
            (Action::requeue(Duration::from_secs(5)), Err(e))
        }
    };
    status.observed_generation = generation;
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

async fn drive<K: ComponentResource>(
    object: &K,
    ctx: &Context,
    ns: &str,
    now: &Now,
) -> Result<Outcome, ReconcileError> {
    // read
    let Some(ncp) = owning_control_plane(ctx, object, ns) else {
        return Ok(Outcome::Waiting {
            reason: Reason::WaitingForControlPlane,
            message: "no NestedControlPlane owns this resource yet; reference it from one".into(),
        });
    };
    // A component the control plane has just created, before its reference reaches the
    // control plane's spec: the reference patch wakes it again at once, and a status
    // written now ("waiting for a NestedEtcd the control plane does not name yet") would
    // be stale before anyone read it.
    if K::reference(&ncp).is_none() && object.component_status().is_none() {
        return Ok(Outcome::Unreferenced);
    }
    let capi_cluster = owning_cluster(ctx, &ncp).await?;
    if is_paused(&ncp, capi_cluster.as_deref()) {
        return Ok(Outcome::Paused);
    }
    let mut cluster = cluster_settings(&ncp, capi_cluster.as_deref(), &ctx.settings.super_dns_domain);
    cluster.network_policy.capn = ctx.settings.capn_pods.clone();
    // The release of the upgrade step the control plane controller started, not
    // `spec.version`: a new version moves nothing until its path is planned and its
    // preflight passed (docs/design.md §10).
    cluster.kubernetes_version = crate::upgrade::components_version(&ncp);
    // The version rules come before waiting for a predecessor: a refused upgrade must say
    // so at once, not wait for an etcd that will never move.
    let running = running_versions::<K>(ctx, object, &ncp, ns);
    let name = object.name_any();
    if let Err(e) = check_input(&cluster, K::KIND, &name, object.component(), object.etcd_storage())
        .and_then(|()| resolve(&ctx.channels, &cluster, K::KIND, object.component()))
        .and_then(|r| {
            check(K::KIND, &r, &running)?;
            check_members(K::KIND, object.component().replicas.unwrap_or(1), &running, &r)?;
            Ok(())
        })
    {
        return Ok(Outcome::Invalid(e));
    }
    let restore_plan = match resolve(&ctx.channels, &cluster, K::KIND, object.component()) {
        Ok(resolved) => K::prepare(ctx, object, ns, resolved.channel, &resolved.version).await?,
        Err(e) => return Ok(Outcome::Invalid(e)),
    };
    let (restore_vars, restore_status) = match restore_plan {
        crate::controllers::component::etcd::backup::RestorePlan::None => (None, None),
        crate::controllers::component::etcd::backup::RestorePlan::Pending(vars, status) => (Some(vars), Some(status)),
        crate::controllers::component::etcd::backup::RestorePlan::Refused { reason, message } => {
            return Ok(Outcome::Refused { reason, message });
        }
    };
    let policy = match renewal_policy(&ncp, ctx.settings.certificate_validity) {
        Ok(policy) => policy,
        Err(message) => return Ok(Outcome::Invalid(PlanError::InvalidCertificateValidity(message))),
    };
    let mut upstream = match K::gate(ctx, &ncp, &cluster, ns) {
        Gate::Open(u) => u,
        Gate::Wait { reason, message } => return Ok(Outcome::Waiting { reason, message }),
    };
    let Some(owner) = controller_reference(object) else {
        return Err(ReconcileError::NoNamespace);
    };
    let Some(ncp_owner) = controller_reference(&*ncp) else {
        return Err(ReconcileError::NoNamespace);
    };
    let store = CertificateStore::new(ctx, ns, &cluster.name, &ncp_owner, now.time, policy);
    // etcd: the members as etcd lists them, and at most one step toward the desired count.
    let membership = K::membership(ctx, object, &store, &cluster, now).await?;
    upstream.etcd_membership = membership.render.clone();
    // decide (pure)
    let request = ComponentRequest {
        kind: K::KIND,
        resource_name: &object.name_any(),
        spec: object.component(),
        etcd_storage: object.etcd_storage(),
        etcd_restore: restore_vars.as_ref(),
        owner,
        running,
    };
    let plan = match plan(&ctx.channels, &cluster, &request, &upstream) {
        Ok(p) => p,
        Err(PlanError::NoEtcdEndpoints) => {
            return Ok(Outcome::Waiting {
                reason: Reason::WaitingForEtcd,
                message: PlanError::NoEtcdEndpoints.to_string(),
            });
        }
        Err(e) => return Ok(Outcome::Invalid(e)),
    };
    // act
    let applyset = component_applyset_id(K::KIND, &object.name_any(), ns);
    let shown = object
        .component_status()
        .map(|s| s.inventory.as_slice())
        .unwrap_or_default();
    let previous = ctx.applier.known_inventory(&applyset, shown);
    let planned = plan.inventory();
    // The parent lists the union of old and new group-kinds while both may exist (KEP-3659).
    let kinds = |entries: &[InventoryEntry]| -> Vec<String> {
        entries.iter().map(|e| group_kind(&e.api_version, &e.kind)).collect()
    };
    let union: Vec<String> = kinds(&previous).into_iter().chain(kinds(&planned)).collect();
    let union = contains_group_kinds(union.iter().map(String::as_str));
    update_applyset_parent(ctx, object, ns, &applyset, &union).await?;
    let mut plan = plan;
    plan.objects.sort_by_key(apply_rank);
    let services = plan.objects.iter().take_while(|o| apply_rank(o) == 0).count();
    let mut applied = Vec::with_capacity(plan.objects.len());
    applied.extend(apply_together(ctx, &plan.objects[..services]).await?);
    if let Gate::Wait { reason, message } = K::ensure_certificates(&store, &cluster, &ncp, &plan, &applied).await? {
        return Ok(Outcome::Waiting { reason, message });
    }
    // What the processes read only at start is in the pod templates' digest: a re-issued
    // Secret rolls the component (docs/design.md §9).
    let certificates = match applied_certificates(&store, &plan.startup_secrets).await? {
        Ok(certificates) => certificates,
        Err(missing) => {
            return Ok(Outcome::Waiting {
                reason: Reason::WaitingForCertificates,
                message: format!("secret {missing} does not exist yet"),
            });
        }
    };
    stamp_certificates_digest(&mut plan.objects[services..], &certificates.digest);
    // The rest rank by rank: what the workloads mount, then the workloads.
    let workloads = services
        + plan.objects[services..]
            .iter()
            .take_while(|o| apply_rank(o) == 1)
            .count();
    applied.extend(apply_together(ctx, &plan.objects[services..workloads]).await?);
    applied.extend(apply_together(ctx, &plan.objects[workloads..]).await?);
    // Prune only after every apply of the round succeeded.
    let stale: Vec<InventoryEntry> = previous.into_iter().filter(|e| !planned.contains(e)).collect();
    ctx.applier.prune(ns, &stale, &applyset).await?;
    ctx.applier.record_inventory(&applyset, &planned, shown);
    // The parent shrinks to the planned kinds once the stale ones are pruned; when nothing
    // was stale it already says so (the update above), and `object` is too old to tell.
    let planned_kinds = plan.contains_group_kinds();
    if planned_kinds != union {
        update_applyset_parent(ctx, object, ns, &applyset, &planned_kinds).await?;
    }
    // report
    let declared = ctx.channels.get(&plan.channel).ok().and_then(|c| c.component(K::KIND));
    let deciding: Vec<_> = match declared.and_then(|d| d.readiness.as_ref()) {
        Some(source) => applied
            .iter()
            .filter(|o| o["kind"] == source.kind.as_str())
            .map(readiness)
            .collect(),
        None => applied.iter().filter(|o| apply_rank(o) == 2).map(readiness).collect(),
    };
    let ready = !deciding.is_empty() && deciding.iter().all(|r| r.ready) && applied.iter().all(|o| readiness(o).ready);
    let desired = deciding.iter().map(|r| r.desired).max().unwrap_or(0).max(plan.replicas);
    let ready_replicas = match deciding.iter().all(|r| r.desired == 0) {
        // A provider's object has no replica counts: it is all or nothing.
        true if ready => desired,
        true => 0,
        false => deciding.iter().map(|r| r.ready_replicas).min().unwrap_or(0),
    };
    if let Some(source) = declared.and_then(|d| d.endpoints.as_ref()) {
        plan.etcd_endpoints = applied
            .iter()
            .find(|o| o["kind"] == source.kind.as_str())
            .and_then(|o| o.pointer(&source.pointer))
            .and_then(|v| v.as_array())
            .map(|urls| urls.iter().filter_map(|u| u.as_str().map(str::to_string)).collect())
            .unwrap_or_default();
    }
    let service = K::service_output(&cluster, &applied);
    let backup = match ctx.channels.get(&plan.channel) {
        Ok(channel) => {
            K::after_apply(
                ctx,
                object,
                ns,
                &store,
                &cluster.name,
                channel,
                ready,
                &plan.etcd_endpoints,
                now.k8s.0,
            )
            .await?
        }
        Err(_) => crate::controllers::component::etcd::backup::BackupReport::default(),
    };
    Ok(Outcome::Applied {
        restore: restore_status,
        backup,
        plan,
        ready,
        desired,
        ready_replicas,
        service,
        certificates,
        next_renewal: store.next_renewal(),
        provider_readiness: declared.and_then(|d| d.readiness.as_ref()).is_some(),
        membership: Box::new(membership),
    })
}

/// Applies `objects` of one rank (`apply_rank`) at once, as they do not depend on one
/// another: one round trip for the lot instead of one each (issue 11). Returns them as the
/// API server holds them, in their order.
async fn apply_together(
    ctx: &Context,
    objects: &[serde_json::Value],
) -> Result<Vec<serde_json::Value>, ReconcileError> {
    let applies = objects
        .iter()
        .map(|object| ctx.applier.apply_if_changed(object, ctx.caches.live(object)));
    Ok(futures::future::try_join_all(applies).await?)
}

/// Labels and annotates the component resource as the parent of its ApplySet; sends
/// nothing when it already says so.
async fn update_applyset_parent<K: ComponentResource>(
    ctx: &Context,
    object: &K,
    ns: &str,
    id: &str,
    group_kinds: &str,
) -> Result<(), ReconcileError> {
    let tooling = tooling();
    let has =
        |map: &std::collections::BTreeMap<String, String>, k: &str, v: &str| map.get(k).map(String::as_str) == Some(v);
    if has(object.labels(), ID_LABEL, id)
        && has(object.annotations(), TOOLING_ANNOTATION, &tooling)
        && has(object.annotations(), CONTAINS_GROUP_KINDS_ANNOTATION, group_kinds)
    {
        return Ok(());
    }
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": {
            "name": object.name_any(),
            "labels": {ID_LABEL: id},
            "annotations": {TOOLING_ANNOTATION: tooling, CONTAINS_GROUP_KINDS_ANNOTATION: group_kinds},
        },
    });
    let api: Api<K> = Api::namespaced(ctx.client.clone(), ns);
    api.patch(&object.name_any(), &apply_params(), &Patch::Apply(&patch))
        .await?;
    Ok(())
}

/// The releases running now: this component's and the sibling the skew rules compare it
/// with (from the cache).
fn running_versions<K: ComponentResource>(ctx: &Context, object: &K, ncp: &NestedControlPlane, ns: &str) -> Running {
    let parse = |s: Option<&ComponentStatus>| {
        s.and_then(|s| s.version.as_deref())
            .and_then(|v| semver::Version::parse(v).ok())
    };
    let mut running = Running {
        current: parse(object.component_status()),
        // Only an etcd that was applied has members whose count may not change.
        etcd_members: object
            .component_status()
            .filter(|s| s.version.is_some())
            .and_then(|s| s.replicas),
        ..Running::default()
    };
    let sibling = |name: Option<&str>, store: &dyn Fn(&str) -> Option<ComponentStatus>| name.and_then(store);
    match K::KIND {
        ComponentKind::ApiServer => {
            let status = sibling(NestedControllerManager::reference(ncp), &|name| {
                ctx.caches
                    .controller_managers
                    .get(&ObjectRef::new(name).within(ns))
                    .and_then(|c| c.status.clone())
            });
            running.controller_manager = parse(status.as_ref());
        }
        ComponentKind::ControllerManager | ComponentKind::Etcd => {
            let status = sibling(NestedAPIServer::reference(ncp), &|name| {
                ctx.caches
                    .apiservers
                    .get(&ObjectRef::new(name).within(ns))
                    .and_then(|c| c.status.clone())
            });
            running.apiserver = parse(status.as_ref());
        }
    }
    running
}

/// The digest of the Secrets the processes read only at start, or the first of them that
/// does not exist.
async fn applied_certificates(
    store: &CertificateStore<'_>,
    secrets: &[String],
) -> Result<Result<AppliedCertificates, String>, ReconcileError> {
    let mut digests = Vec::with_capacity(secrets.len());
    for name in secrets {
        match store.data_digest(name).await? {
            Some(digest) => digests.push((name.as_str(), digest)),
            None => return Ok(Err(name.clone())),
        }
    }
    Ok(Ok(AppliedCertificates {
        digest: certificates_digest(digests.iter().map(|(n, d)| (*n, d.as_str()))),
        secrets: secrets.to_vec(),
    }))
}
