//! One pass of a component reconcile, as named stages: [`read`] (the owning control plane,
//! cluster settings and version rules, from the caches) → restore and gate → decide
//! (the pure plan, [`crate::plan::plan`]) → [`apply`] (Services, then certificates, then the workloads stamped
//! with the certificates digest, then pruning) → [`observe`] (readiness, pure) → the kind's
//! follow-up (etcd: backups). Each stage either hands the next what it needs or ends the
//! pass with an [`Outcome`].

use kube::ResourceExt;
use kube::api::{Api, Patch};
use kube::runtime::reflector::ObjectRef;

use super::report::{Applied, Outcome, Readiness};
use super::{ComponentResource, Round};
use crate::api::{
    AppliedCertificates, ComponentStatus, InventoryEntry, NestedAPIServer, NestedControlPlane, NestedControllerManager,
};
use crate::apply::applyset::{
    CONTAINS_GROUP_KINDS_ANNOTATION, ID_LABEL, TOOLING_ANNOTATION, contains_group_kinds, group_kind, tooling,
};
use crate::apply::{apply_params, apply_rank, readiness};
use crate::channel::ComponentVersions;
use crate::component::ComponentKind;
use crate::controllers::component::etcd::backup::{BackupReport, RestorePlan};
use crate::controllers::round::{Gate, Now};
use crate::controllers::shared::certificates::CertificateStore;
use crate::controllers::shared::read::{
    cluster_settings, controller_reference, is_paused, owning_cluster, owning_control_plane, renewal_policy,
};
use crate::controllers::{Context, ReconcileError};
use crate::plan::{
    ClusterSettings, ComponentRequest, Plan, PlanError, Running, Upstream, certificates_digest, check, check_input,
    check_members, component_applyset_id, plan, resolve, stamp_certificates_digest,
};
use crate::status::Reason;

/// A stage's result: what the next stage needs, or the pass's [`Outcome`] now.
type Stage<T> = Result<Result<T, Outcome>, ReconcileError>;

/// Ends the pass with the stage's [`Outcome`], or goes on with its value.
macro_rules! proceed {
    ($stage:expr) => {
        match $stage? {
            Ok(value) => value,
            Err(outcome) => return Ok(outcome),
        }
    };
}

/// One pass: read → restore → gate → membership → decide → apply → observe → follow-up.
pub(super) async fn drive<K: ComponentResource>(
    object: &K,
    ctx: &Context,
    ns: &str,
    now: &Now,
) -> Result<Outcome, ReconcileError> {
    let Read { ncp, cluster, running } = proceed!(read(object, ctx, ns).await);
    if let Some(outcome) = sleep(object, ctx, ns, &ncp).await? {
        return Ok(outcome);
    }
    let (restore_vars, restore_status) = proceed!(prepare_restore(object, ctx, ns, &cluster).await);
    let referenced_policy = proceed!(read_audit_references(object, ctx, ns).await);
    let (referenced_authentication, referenced_authorization) =
        proceed!(read_access_references(object, ctx, ns, &cluster).await);
    let policy = match renewal_policy(&ncp, ctx.settings.certificate_validity) {
        Ok(policy) => policy,
        Err(message) => return Ok(Outcome::Invalid(PlanError::InvalidCertificateValidity(message))),
    };
    let upstream = match K::gate(ctx, &ncp, &cluster, ns) {
        Gate::Open(u) => u,
        Gate::Wait { reason, message } => return Ok(Outcome::Waiting { reason, message }),
    };
    let (Some(owner), Some(ncp_owner)) = (controller_reference(object), controller_reference(&*ncp)) else {
        return Err(ReconcileError::NoNamespace);
    };
    let store = CertificateStore::new(ctx, ns, &cluster.name, &ncp_owner, now.time, policy);
    let round = Round {
        ctx,
        object,
        ns,
        ncp: &ncp,
        cluster: &cluster,
        store: &store,
        now,
    };
    // etcd: the members as etcd lists them, and at most one step toward the desired count.
    let membership = K::membership(&round).await?;
    let upstream = Upstream {
        etcd_membership: membership.render.clone(),
        ..upstream
    };
    let request = ComponentRequest {
        kind: K::KIND,
        resource_name: &object.name_any(),
        spec: object.component(),
        etcd_storage: object.etcd_storage(),
        etcd_restore: restore_vars.as_ref(),
        owner,
        running,
        audit: object.audit().map(|spec| crate::plan::AuditRequest {
            spec,
            referenced: referenced_policy.as_ref(),
        }),
        authentication: object.authentication(),
        authorization: object.authorization(),
        referenced: crate::plan::ReferencedConfigurations {
            authentication: referenced_authentication.as_ref(),
            authorization: referenced_authorization.as_ref(),
        },
    };
    let plan = match plan(&ctx.channels, &cluster, &request, &upstream) {
        Ok(plan) => plan,
        Err(e) => return Ok(Outcome::from(e)),
    };
    let (plan, applied, certificates) = proceed!(apply(&round, plan).await);
    let declared = ctx.channels.get(&plan.channel).ok().and_then(|c| c.component(K::KIND));
    let (readiness, plan) = observe(declared, &applied, plan);
    let backup = match ctx.channels.get(&plan.channel) {
        Ok(channel) => K::after_apply(&round, channel, readiness.ready, &plan.etcd_endpoints).await?,
        Err(_) => BackupReport::default(),
    };
    Ok(Outcome::Applied(Applied {
        restore: restore_status,
        backup,
        service: K::service_output(&cluster, &applied),
        plan,
        readiness,
        certificates,
        next_renewal: store.next_renewal(),
        provider_readiness: declared.and_then(|d| d.readiness.as_ref()).is_some(),
        membership: Box::new(membership),
    }))
}

/// Sleep (docs/design.md §12): while the control plane falls asleep or sleeps, and the
/// component that depends on this one is asleep already (none for the controller-manager;
/// the controller-manager for the apiserver; the apiserver for etcd), the component's
/// StatefulSets are scaled to zero, their claims retained, and nothing else is done: no
/// plan, no certificate, no membership step, no backup. The component keeps its
/// `spec.replicas`; the next apply after wake brings them back. `None`: awake.
async fn sleep<K: ComponentResource>(
    object: &K,
    ctx: &Context,
    ns: &str,
    ncp: &NestedControlPlane,
) -> Result<Option<Outcome>, ReconcileError> {
    use k8s_openapi::api::apps::v1::StatefulSet;
    let asleep = |phase: Option<&str>| phase == Some(crate::status::phase::SLEEPING);
    let successor_asleep = match K::KIND {
        ComponentKind::ControllerManager => true,
        ComponentKind::ApiServer => NestedControllerManager::reference(ncp).is_none_or(|name| {
            ctx.caches
                .controller_managers
                .get(&ObjectRef::new(name).within(ns))
                .is_none_or(|c| asleep(c.status.as_ref().and_then(|s| s.phase.as_deref())))
        }),
        ComponentKind::Etcd => NestedAPIServer::reference(ncp).is_none_or(|name| {
            ctx.caches
                .apiservers
                .get(&ObjectRef::new(name).within(ns))
                .is_none_or(|c| asleep(c.status.as_ref().and_then(|s| s.phase.as_deref())))
        }),
    };
    if !crate::hibernation::component_sleeps(ncp, successor_asleep) {
        return Ok(None);
    }
    let api: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), ns);
    let mut running = 0;
    let inventory = object
        .component_status()
        .map(|s| s.inventory.as_slice())
        .unwrap_or_default();
    for entry in inventory.iter().filter(|e| e.kind == "StatefulSet") {
        let live = ctx.caches.statefulsets.get(&ObjectRef::new(&entry.name).within(ns));
        let Some(live) = live else { continue };
        if live.spec.as_ref().and_then(|s| s.replicas) != Some(0) {
            // In one write, so that the StatefulSet controller never sees zero replicas
            // with etcd's `whenScaled: Delete`, which would delete every member's claim:
            // the data sleep must keep. The next apply after wake sets both back.
            let patch = serde_json::json!({"spec": {
                "replicas": 0,
                "persistentVolumeClaimRetentionPolicy": {"whenScaled": "Retain"},
            }});
            api.patch(&entry.name, &crate::apply::update_params(), &Patch::Merge(&patch))
                .await?;
            tracing::info!(kind = K::KIND.resource_kind(), statefulset = %entry.name, "scaled to zero: the control plane sleeps");
        }
        running += live.status.as_ref().map_or(0, |s| s.replicas);
    }
    Ok(Some(Outcome::Sleeping { running }))
}

/// What [`read`] found.
struct Read {
    ncp: std::sync::Arc<NestedControlPlane>,
    cluster: ClusterSettings,
    running: Running,
}

/// The owning control plane and its cluster settings (from the caches), and the version
/// rules, checked before waiting for a predecessor: a refused upgrade must say so at once,
/// not wait for an etcd that will never move.
async fn read<K: ComponentResource>(object: &K, ctx: &Context, ns: &str) -> Stage<Read> {
    let Some(ncp) = owning_control_plane(ctx, object, ns) else {
        return Ok(Err(Outcome::Waiting {
            reason: Reason::WaitingForControlPlane,
            message: "no NestedControlPlane owns this resource yet; reference it from one".into(),
        }));
    };
    // A component the control plane has just created, before its reference reaches the
    // control plane's spec: the reference patch wakes it again at once, and a status
    // written now ("waiting for a NestedEtcd the control plane does not name yet") would
    // be stale before anyone read it.
    if K::reference(&ncp).is_none() && object.component_status().is_none() {
        return Ok(Err(Outcome::Unreferenced));
    }
    let capi_cluster = owning_cluster(ctx, &ncp).await?;
    if is_paused(&ncp, capi_cluster.as_deref()) {
        return Ok(Err(Outcome::Paused));
    }
    let mut cluster = cluster_settings(&ncp, capi_cluster.as_deref(), &ctx.settings.super_dns_domain);
    cluster.network_policy.capn = ctx.settings.capn_pods.clone();
    // The release of the upgrade step the control plane controller started, not
    // `spec.version`: a new version moves nothing until its path is planned and its
    // preflight passed (docs/design.md §10).
    cluster.kubernetes_version = crate::upgrade::components_version(&ncp);
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
        return Ok(Err(Outcome::Invalid(e)));
    }
    Ok(Ok(Read { ncp, cluster, running }))
}

/// What must be settled before the members are planned (etcd: a pending restore): the
/// variables the templates render it with and the status to report.
async fn prepare_restore<K: ComponentResource>(
    object: &K,
    ctx: &Context,
    ns: &str,
    cluster: &ClusterSettings,
) -> Stage<(Option<crate::plan::RestoreVars>, Option<crate::api::RestoreStatus>)> {
    let resolved = match resolve(&ctx.channels, cluster, K::KIND, object.component()) {
        Ok(resolved) => resolved,
        Err(e) => return Ok(Err(Outcome::Invalid(e))),
    };
    Ok(
        match K::prepare(ctx, object, ns, &cluster.name, resolved.channel, &resolved.version).await? {
            RestorePlan::None => Ok((None, None)),
            RestorePlan::Pending(vars, status) => Ok((Some(vars), Some(status))),
            RestorePlan::Refused { reason, message } => Err(Outcome::Refused { reason, message }),
        },
    )
}

/// apiserver: what `spec.audit` references, read before planning (issue 39 item 2): the
/// policy in the ConfigMap `policyRef` names (read and checked, `None` without
/// `policyRef`), and that the webhook's Secret has its key. A missing or invalid one
/// refuses the pass (condition, Event) and nothing is applied; it is read again within a
/// minute, and a change of the ConfigMap or of the webhook Secret wakes the apiserver at
/// once.
async fn read_audit_references<K: ComponentResource>(
    object: &K,
    ctx: &Context,
    ns: &str,
) -> Stage<Option<crate::api::AuditPolicy>> {
    use k8s_openapi::api::core::v1::Secret;
    let Some(audit) = object.audit() else {
        return Ok(Ok(None));
    };
    let name = object.name_any();
    if let Err(e) = crate::plan::audit::check_fields(&name, audit) {
        return Ok(Err(Outcome::Invalid(e.into())));
    }
    let referenced = match crate::plan::audit::policy_reference(Some(audit)) {
        Some((config_map, key)) => {
            let text = config_map_text(ctx, ns, config_map, key).await?;
            match crate::plan::audit::referenced_policy(&name, config_map, key, text.as_deref()) {
                Ok(policy) => Some(policy),
                Err(e) => {
                    return Ok(Err(Outcome::Refused {
                        reason: e.reason,
                        message: e.to_string(),
                    }));
                }
            }
        }
        None => None,
    };
    if let Some(webhook) = &audit.webhook {
        let secret = &webhook.config_secret_ref.name;
        let key = webhook
            .config_secret_ref
            .key
            .as_deref()
            .unwrap_or(crate::plan::audit::WEBHOOK_CONFIG_KEY);
        let found = Api::<Secret>::namespaced(ctx.client.clone(), ns)
            .get_opt(secret)
            .await?;
        let has_key = found.is_some_and(|s| {
            s.data.as_ref().is_some_and(|d| d.contains_key(key))
                || s.string_data.as_ref().is_some_and(|d| d.contains_key(key))
        });
        if !has_key {
            return Ok(Err(Outcome::Refused {
                reason: "AuditWebhookConfigMissing",
                message: format!(
                    "NestedAPIServer {name}: spec.audit.webhook.configSecretRef: Secret {secret} key {key}: not found: create it with the webhook's kubeconfig file under that key (docs/guide/security.md \"Audit\")"
                ),
            }));
        }
    }
    Ok(Ok(referenced))
}

/// The text under `key` of ConfigMap `name` in `ns`; `None` when the ConfigMap or the key
/// does not exist.
async fn config_map_text(ctx: &Context, ns: &str, name: &str, key: &str) -> Result<Option<String>, ReconcileError> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let found = Api::<ConfigMap>::namespaced(ctx.client.clone(), ns)
        .get_opt(name)
        .await?;
    Ok(found.and_then(|c| c.data).and_then(|mut d| d.remove(key)))
}

/// apiserver: what `spec.authentication` and `spec.authorization` reference, read before
/// planning (issue 39 item 1): the configurations their `configurationRef`s name (read and
/// checked by the rules of the inline form; `None` without `configurationRef`), and that
/// every webhook authorizer's kubeconfig Secret has its key. A missing or invalid one
/// refuses the pass (condition, Event naming the ConfigMap or Secret, the key and the
/// field) and nothing is applied, so no apiserver starts with a file it cannot read; it is
/// read again within a minute, and a change of the ConfigMap or Secret wakes the apiserver
/// at once.
async fn read_access_references<K: ComponentResource>(
    object: &K,
    ctx: &Context,
    ns: &str,
    cluster: &ClusterSettings,
) -> Stage<(
    Option<crate::api::AuthenticationConfiguration>,
    Option<crate::api::AuthorizationConfiguration>,
)> {
    use crate::plan::{authentication, authorization};
    use k8s_openapi::api::core::v1::Secret;
    let name = object.name_any();
    let refused = |e: crate::plan::reference::ReferenceError| {
        Ok(Err(Outcome::Refused {
            reason: e.reason,
            message: e.to_string(),
        }))
    };
    let mut referenced_authentication = None;
    if let Some(spec) = object.authentication() {
        let issuer = crate::plan::service_account_issuer(&cluster.dns_domain);
        if let Err(e) = authentication::check_fields(&name, spec, &issuer) {
            return Ok(Err(Outcome::Invalid(e.into())));
        }
        if let Some((config_map, key)) = authentication::configuration_reference(Some(spec)) {
            let text = config_map_text(ctx, ns, config_map, key).await?;
            match authentication::referenced_configuration(&name, config_map, key, text.as_deref(), &issuer) {
                Ok(configuration) => referenced_authentication = Some(configuration),
                Err(e) => return refused(e),
            }
        }
    }
    let Some(spec) = object.authorization() else {
        return Ok(Ok((referenced_authentication, None)));
    };
    if let Err(e) = authorization::check_fields(&name, spec) {
        return Ok(Err(Outcome::Invalid(e.into())));
    }
    let mut referenced_authorization = None;
    if let Some((config_map, key)) = authorization::configuration_reference(Some(spec)) {
        let text = config_map_text(ctx, ns, config_map, key).await?;
        match authorization::referenced_configuration(&name, config_map, key, text.as_deref()) {
            Ok(configuration) => referenced_authorization = Some(configuration),
            Err(e) => return refused(e),
        }
    }
    let configuration = spec.configuration.as_ref().or(referenced_authorization.as_ref());
    for (secret, key) in authorization::webhook_secrets(configuration) {
        let found = Api::<Secret>::namespaced(ctx.client.clone(), ns)
            .get_opt(secret)
            .await?;
        if !found.is_some_and(|s| s.data.as_ref().is_some_and(|d| d.contains_key(key))) {
            return Ok(Err(Outcome::Refused {
                reason: "AuthorizationWebhookConfigMissing",
                message: format!(
                    "NestedAPIServer {name}: spec.authorization: webhook kubeConfigSecretRef: Secret {secret} key {key}: not found: create it with the webhook's kubeconfig file under that key (docs/guide/security.md \"Authorization\")"
                ),
            }));
        }
    }
    Ok(Ok((referenced_authentication, referenced_authorization)))
}

/// Applies the plan rank by rank: the Services, then (once the kind's certificates are
/// issued) what the workloads mount, then the workloads stamped with the digest of the
/// Secrets the processes read only at start (docs/design.md §9: a re-issued Secret rolls
/// the component); prunes only after every apply of the round succeeded. Returns the
/// objects as the API server holds them.
async fn apply<K: ComponentResource>(
    round: &Round<'_, K>,
    mut plan: Plan,
) -> Stage<(Plan, Vec<serde_json::Value>, AppliedCertificates)> {
    let Round { ctx, object, ns, .. } = *round;
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
    plan.objects.sort_by_key(apply_rank);
    let services = plan.objects.iter().take_while(|o| apply_rank(o) == 0).count();
    let mut applied = Vec::with_capacity(plan.objects.len());
    applied.extend(apply_together(ctx, &plan.objects[..services]).await?);
    let gate = K::ensure_certificates(round.store, round.cluster, round.ncp, &plan, &applied).await?;
    if let Gate::Wait { reason, message } = gate {
        return Ok(Err(Outcome::Waiting { reason, message }));
    }
    let certificates = match applied_certificates(round.store, &plan.startup_secrets).await? {
        Ok(certificates) => certificates,
        Err(missing) => {
            return Ok(Err(Outcome::Waiting {
                reason: Reason::WaitingForCertificates,
                message: format!("secret {missing} does not exist yet"),
            }));
        }
    };
    stamp_certificates_digest(&mut plan.objects[services..], &certificates.digest);
    // The apiserver is stateless: at one replica it rolls surge-first (docs/design.md §5
    // "Surge"), decided from the final template, digest included. Not etcd (members keep
    // data) nor the controller-manager (it runs without leader election at one replica, so
    // two must never run at once).
    if K::KIND == ComponentKind::ApiServer {
        for object in &mut plan.objects[services..] {
            let live = match ctx.caches.live(object) {
                crate::apply::Live::Cached(live) => live,
                crate::apply::Live::Unwatched => None,
            };
            crate::apply::surge::surge_first(object, live.as_ref());
        }
    }
    let workloads = services
        + plan.objects[services..]
            .iter()
            .take_while(|o| apply_rank(o) == 1)
            .count();
    applied.extend(apply_together(ctx, &plan.objects[services..workloads]).await?);
    applied.extend(apply_together(ctx, &plan.objects[workloads..]).await?);
    let stale: Vec<InventoryEntry> = previous.into_iter().filter(|e| !planned.contains(e)).collect();
    ctx.applier.prune(ns, &stale, &applyset).await?;
    ctx.applier.record_inventory(&applyset, &planned, shown);
    // The parent shrinks to the planned kinds once the stale ones are pruned; when nothing
    // was stale it already says so (the update above), and `object` is too old to tell.
    let planned_kinds = plan.contains_group_kinds();
    if planned_kinds != union {
        update_applyset_parent(ctx, object, ns, &applyset, &planned_kinds).await?;
    }
    Ok(Ok((plan, applied, certificates)))
}

/// How ready the applied objects are (pure): the channel's declared readiness source, or
/// the workloads (rank 2) by the built-in rules (docs/design.md §5); and the etcd endpoints
/// a provider publishes, when the channel declares where.
fn observe(declared: Option<&ComponentVersions>, applied: &[serde_json::Value], mut plan: Plan) -> (Readiness, Plan) {
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
    let readiness = Readiness {
        ready,
        desired,
        ready_replicas,
    };
    (readiness, plan)
}

/// Applies `objects` of one rank (`apply_rank`) at once, as they do not depend on one
/// another: one round trip for the lot instead of one each. Returns them as the
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
