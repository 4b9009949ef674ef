//! The reconciler shared by NestedEtcd, NestedAPIServer and NestedControllerManager.
//!
//! read (owning NestedControlPlane, cluster settings, upstream outputs) → plan (pure) →
//! apply (Services, then certificates, then the rest) → report status. The per-kind steps
//! are in [`super::etcd`], [`super::apiserver`] and [`super::controller_manager`].

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::certificates::CertificateStore;
use super::read::{cluster_settings, controller_reference, is_paused, owning_cluster, owning_control_plane};
use super::{Context, ReconcileError, apiserver, controller_manager, etcd, events};
use crate::api::{
    ComponentSpec, ComponentStatus, EtcdStorage, InventoryEntry, NestedAPIServer, NestedControlPlane,
    NestedControllerManager, NestedEtcd, ServiceOutput,
};
use crate::apply::applyset::{
    CONTAINS_GROUP_KINDS_ANNOTATION, ID_LABEL, TOOLING_ANNOTATION, contains_group_kinds, group_kind,
};
use crate::apply::{FIELD_MANAGER, apply_rank, readiness};
use crate::component::ComponentKind;
use crate::plan::{
    ClusterSettings, ComponentRequest, Plan, PlanError, Running, Upstream, check, check_input, check_members,
    component_applyset_id, plan, resolve,
};
use crate::status::{ConditionUpdate, READY, ROLLING_OUT, SYNCED, phase, set_condition};

/// A component custom resource.
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
    fn component(&self) -> &ComponentSpec;
    fn component_status(&self) -> Option<&ComponentStatus>;
    fn etcd_storage(&self) -> Option<&EtcdStorage> {
        None
    }
    /// The reference to this kind in a NestedControlPlane's spec.
    fn reference(ncp: &NestedControlPlane) -> Option<&str>;
    /// The field of NestedControlPlane `spec` holding that reference.
    const REFERENCE_FIELD: &'static str;
    /// A new resource of this kind with the default spec.
    fn with_defaults(name: &str) -> Self;
}

/// Implements [`ComponentResource`] for a component kind whose spec embeds the shared
/// component spec as `component` and whose control plane reference is `$field`.
macro_rules! component_resource {
    ($kind:ty, $component:expr, $field:ident, $json_field:literal $(, storage: $storage:ident)?) => {
        impl ComponentResource for $kind {
            const KIND: ComponentKind = $component;
            const REFERENCE_FIELD: &'static str = $json_field;
            fn component(&self) -> &ComponentSpec {
                &self.spec.component
            }
            fn component_status(&self) -> Option<&ComponentStatus> {
                self.status.as_ref()
            }
            $(fn etcd_storage(&self) -> Option<&EtcdStorage> {
                self.spec.$storage.as_ref()
            })?
            fn reference(ncp: &NestedControlPlane) -> Option<&str> {
                ncp.spec.$field.as_ref().map(|r| r.name.as_str())
            }
            fn with_defaults(name: &str) -> Self {
                Self::new(name, Default::default())
            }
        }
    };
}

component_resource!(NestedEtcd, ComponentKind::Etcd, etcd, "etcd", storage: storage);
component_resource!(NestedAPIServer, ComponentKind::ApiServer, apiserver, "apiserver");
component_resource!(
    NestedControllerManager,
    ComponentKind::ControllerManager,
    controller_manager,
    "controllerManager"
);

/// Whether a component may proceed, and with which upstream outputs.
pub enum Gate {
    Open(Upstream),
    Wait { reason: &'static str, message: String },
}

/// The status of the control plane's component of kind `P` when it is ready on the release
/// it should run (design §5: each component waits for its predecessor, and during an upgrade
/// for the predecessor's new release); otherwise why not, for a wait message.
///
/// # Errors
/// API errors reading the component.
pub async fn predecessor_ready<P: ComponentResource>(
    ctx: &Context,
    ncp: &NestedControlPlane,
    cluster: &ClusterSettings,
    ns: &str,
) -> Result<Result<ComponentStatus, String>, ReconcileError> {
    let kind = P::kind(&());
    let Some(name) = P::reference(ncp) else {
        return Ok(Err(format!("the NestedControlPlane has no {kind} yet")));
    };
    let Some(component) = Api::<P>::namespaced(ctx.client.clone(), ns).get_opt(name).await? else {
        return Ok(Err(format!("{kind} {name} does not exist")));
    };
    let desired = resolve(&ctx.channels, cluster, P::KIND, component.component())
        .ok()
        .map(|r| r.version.to_string());
    let generation = component.meta().generation;
    Ok(match component.component_status() {
        Some(s) if s.ready && s.observed_generation == generation && s.version == desired => Ok(s.clone()),
        Some(s) if s.ready => Err(format!(
            "{kind} {name} runs {} and is moving to {}",
            s.version.clone().unwrap_or_default(),
            desired.unwrap_or_default()
        )),
        _ => Err(format!("{kind} {name} is not ready")),
    })
}

/// What one pass ended with.
enum Outcome {
    Paused,
    Waiting {
        reason: &'static str,
        message: String,
    },
    Invalid(PlanError),
    Applied {
        plan: Plan,
        ready: bool,
        desired: i32,
        ready_replicas: i32,
        service: Option<ServiceOutput>,
    },
}

/// One clock reading per pass, in the two shapes the code needs.
pub struct Now {
    pub time: time::OffsetDateTime,
    pub k8s: Time,
}

impl Now {
    pub fn take() -> Self {
        Self {
            time: time::OffsetDateTime::now_utc(),
            k8s: Time(k8s_openapi::jiff::Timestamp::now()),
        }
    }
}

/// Runs the controller of component kind `K` until the stream ends.
pub async fn run<K: ComponentResource>(ctx: Arc<Context>) {
    let owned = watcher::Config::default().labels("app.kubernetes.io/managed-by=capn");
    Controller::new(ctx.api::<K>(), ctx.primary_watch_config())
        .owns(ctx.api::<StatefulSet>(), owned.clone())
        .owns(ctx.api::<Service>(), owned)
        // A control plane's status change (a sibling became ready) wakes its components.
        .watches(ctx.api::<NestedControlPlane>(), ctx.primary_watch_config(), |ncp| {
            let ns = ncp.namespace();
            K::reference(&ncp).map(|name| {
                let r = ObjectRef::<K>::new(name);
                match ns {
                    Some(ns) => r.within(&ns),
                    None => r,
                }
            })
        })
        .shutdown_on_signal()
        .run(
            |object, ctx| async move { super::instrumented(&ctx.clone(), K::KIND.as_str(), reconcile(object, ctx)).await },
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
        Ok(Outcome::Paused) => return Ok(Action::await_change()),
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
            set(ConditionUpdate::new(SYNCED, false, err.reason(), err.to_string()));
            if !running {
                set(ConditionUpdate::new(READY, false, err.reason(), err.to_string()));
                status.ready = false;
                status.phase = Some(phase::FAILED.into());
            }
            (Action::await_change(), Ok(()))
        }
        Ok(Outcome::Applied {
            plan,
            ready,
            desired,
            ready_replicas,
            service,
        }) => {
            let members = format!("{ready_replicas}/{desired} members ready");
            set(ConditionUpdate::new(
                SYNCED,
                true,
                "Applied",
                format!("{} {} from channel {}", K::KIND, plan.version, plan.channel),
            ));
            set(if ready {
                ConditionUpdate::new(READY, true, "Ready", members.clone())
            } else {
                ConditionUpdate::new(READY, false, "Provisioning", members.clone())
            });
            set(if ready {
                ConditionUpdate::new(ROLLING_OUT, false, "RolledOut", format!("running {}", plan.version))
            } else {
                ConditionUpdate::new(
                    ROLLING_OUT,
                    running,
                    "RollingOut",
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
            status.endpoints = plan.etcd_endpoints.clone();
            status.service = service;
            // Owned StatefulSets and Services wake us on change; a provider's own kinds are
            // not watched, so look again soon while not ready.
            let again = if ready { 3600 } else { 10 };
            (Action::requeue(Duration::from_secs(again)), Ok(()))
        }
        Err(e) => {
            set(ConditionUpdate::new(SYNCED, false, e.reason(), e.to_string()));
            if !running {
                set(ConditionUpdate::new(READY, false, e.reason(), e.to_string()));
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
    if status != old {
        write_status(&ctx, &*object, &ns, &status).await?;
        events::publish_condition_changes(&ctx, &*object, &old.conditions, &status.conditions).await;
    }
    result.map(|()| action)
}

async fn write_status<K: ComponentResource>(
    ctx: &Context,
    object: &K,
    ns: &str,
    status: &ComponentStatus,
) -> Result<(), ReconcileError> {
    let api: Api<K> = Api::namespaced(ctx.client.clone(), ns);
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    api.patch_status(
        &object.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}

async fn drive<K: ComponentResource>(
    object: &K,
    ctx: &Context,
    ns: &str,
    now: &Now,
) -> Result<Outcome, ReconcileError> {
    // read
    let Some(ncp) = owning_control_plane(ctx, object, ns).await? else {
        return Ok(Outcome::Waiting {
            reason: "WaitingForControlPlane",
            message: "no NestedControlPlane owns this resource yet; reference it from one".into(),
        });
    };
    let capi_cluster = owning_cluster(ctx, &ncp).await?;
    if is_paused(&ncp, capi_cluster.as_ref()) {
        return Ok(Outcome::Paused);
    }
    let cluster = cluster_settings(&ncp, capi_cluster.as_ref(), &ctx.settings.super_dns_domain);
    // The version rules come before waiting for a predecessor: a refused upgrade must say
    // so at once, not wait for an etcd that will never move.
    let running = running_versions::<K>(ctx, object, &ncp, ns).await?;
    let name = object.name_any();
    if let Err(e) = check_input(&cluster, K::KIND, &name, object.component(), object.etcd_storage())
        .and_then(|()| resolve(&ctx.channels, &cluster, K::KIND, object.component()))
        .and_then(|r| check(K::KIND, &r, &running).map_err(PlanError::from))
        .and_then(|()| {
            check_members(K::KIND, object.component().replicas.unwrap_or(1), &running).map_err(PlanError::from)
        })
    {
        return Ok(Outcome::Invalid(e));
    }
    let upstream = match K::KIND {
        ComponentKind::Etcd => Gate::Open(Upstream::default()),
        ComponentKind::ApiServer => apiserver::gate(ctx, &ncp, &cluster, ns).await?,
        ComponentKind::ControllerManager => controller_manager::gate(ctx, &ncp, &cluster, ns).await?,
    };
    let upstream = match upstream {
        Gate::Open(u) => u,
        Gate::Wait { reason, message } => return Ok(Outcome::Waiting { reason, message }),
    };
    let Some(owner) = controller_reference(object) else {
        return Err(ReconcileError::NoNamespace);
    };
    // decide (pure)
    let request = ComponentRequest {
        kind: K::KIND,
        resource_name: &object.name_any(),
        spec: object.component(),
        etcd_storage: object.etcd_storage(),
        owner,
        running,
    };
    let plan = match plan(&ctx.channels, &cluster, &request, &upstream) {
        Ok(p) => p,
        Err(PlanError::NoEtcdEndpoints) => {
            return Ok(Outcome::Waiting {
                reason: "WaitingForEtcd",
                message: PlanError::NoEtcdEndpoints.to_string(),
            });
        }
        Err(e) => return Ok(Outcome::Invalid(e)),
    };
    // act
    let Some(ncp_owner) = controller_reference(&ncp) else {
        return Err(ReconcileError::NoNamespace);
    };
    let store = CertificateStore::new(ctx.client.clone(), ns, &cluster.name, &ncp_owner, now.time);
    let applyset = component_applyset_id(K::KIND, &object.name_any(), ns);
    let previous = object
        .component_status()
        .map(|s| s.inventory.clone())
        .unwrap_or_default();
    let planned = plan.inventory();
    // The parent lists the union of old and new group-kinds while both may exist (KEP-3659).
    let kinds = |entries: &[InventoryEntry]| -> Vec<String> {
        entries.iter().map(|e| group_kind(&e.api_version, &e.kind)).collect()
    };
    let union: Vec<String> = kinds(&previous).into_iter().chain(kinds(&planned)).collect();
    update_applyset_parent(
        ctx,
        object,
        ns,
        &applyset,
        &contains_group_kinds(union.iter().map(String::as_str)),
    )
    .await?;
    let mut ordered: Vec<&serde_json::Value> = plan.objects.iter().collect();
    ordered.sort_by_key(|o| apply_rank(o));
    let mut applied = Vec::with_capacity(ordered.len());
    let mut certificates_done = false;
    for object in ordered {
        if apply_rank(object) > 0 && !certificates_done {
            if let Some(wait) = ensure_certificates::<K>(&store, &cluster, &ncp, &plan, &applied).await? {
                return Ok(wait);
            }
            certificates_done = true;
        }
        applied.push(ctx.applier.apply(object).await?);
    }
    if !certificates_done && let Some(wait) = ensure_certificates::<K>(&store, &cluster, &ncp, &plan, &applied).await? {
        return Ok(wait);
    }
    // Prune only after every apply of the round succeeded.
    let stale: Vec<InventoryEntry> = previous.into_iter().filter(|e| !planned.contains(e)).collect();
    ctx.applier.prune(ns, &stale, &applyset).await?;
    let planned_kinds = kinds(&planned);
    update_applyset_parent(
        ctx,
        object,
        ns,
        &applyset,
        &contains_group_kinds(planned_kinds.iter().map(String::as_str)),
    )
    .await?;
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
    let mut plan = plan;
    if let Some(source) = declared.and_then(|d| d.endpoints.as_ref()) {
        plan.etcd_endpoints = applied
            .iter()
            .find(|o| o["kind"] == source.kind.as_str())
            .and_then(|o| o.pointer(&source.pointer))
            .and_then(|v| v.as_array())
            .map(|urls| urls.iter().filter_map(|u| u.as_str().map(str::to_string)).collect())
            .unwrap_or_default();
    }
    let service = match K::KIND {
        ComponentKind::ApiServer => apiserver::service_output(&cluster, &applied),
        _ => None,
    };
    Ok(Outcome::Applied {
        plan,
        ready,
        desired,
        ready_replicas,
        service,
    })
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
    let tooling = format!("capn/v{}", env!("CARGO_PKG_VERSION"));
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
    api.patch(
        &object.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}

/// The releases running now: this component's and the sibling the skew rules compare it with.
async fn running_versions<K: ComponentResource>(
    ctx: &Context,
    object: &K,
    ncp: &NestedControlPlane,
    ns: &str,
) -> Result<Running, ReconcileError> {
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
    match K::KIND {
        ComponentKind::ApiServer => {
            if let Some(name) = NestedControllerManager::reference(ncp) {
                let api: Api<NestedControllerManager> = Api::namespaced(ctx.client.clone(), ns);
                running.controller_manager = parse(api.get_opt(name).await?.and_then(|c| c.status).as_ref());
            }
        }
        ComponentKind::ControllerManager | ComponentKind::Etcd => {
            if let Some(name) = NestedAPIServer::reference(ncp) {
                let api: Api<NestedAPIServer> = Api::namespaced(ctx.client.clone(), ns);
                running.apiserver = parse(api.get_opt(name).await?.and_then(|c| c.status).as_ref());
            }
        }
    }
    Ok(running)
}

async fn ensure_certificates<K: ComponentResource>(
    store: &CertificateStore<'_>,
    cluster: &ClusterSettings,
    ncp: &NestedControlPlane,
    plan: &Plan,
    applied: &[serde_json::Value],
) -> Result<Option<Outcome>, ReconcileError> {
    let gate = match K::KIND {
        ComponentKind::Etcd => etcd::ensure_certificates(store, cluster, plan).await?,
        ComponentKind::ApiServer => apiserver::ensure_certificates(store, cluster, ncp, applied).await?,
        ComponentKind::ControllerManager => controller_manager::ensure_certificates(store, cluster).await?,
    };
    Ok(match gate {
        Gate::Open(_) => None,
        Gate::Wait { reason, message } => Some(Outcome::Waiting { reason, message }),
    })
}
