//! The NestedControlPlane reconciler: CAs and the service-account key (created once, never
//! re-minted), the three component resources (created or adopted), the control plane
//! endpoint, the admin `<cluster>-kubeconfig`, and the aggregated status (CAPI contract).

pub mod rotation;
pub mod upgrade;

use std::sync::Arc;
use std::time::Duration;

use std::future::Future;

use futures::StreamExt;
use kube::api::{Api, Patch};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use crate::api::{
    ApiEndpoint, CLUSTER_NAME_LABEL, CertificateRenewal, ComponentSummary, ComponentsStatus,
    ControlPlaneInitialization, NestedAPIServer, NestedControlPlane, NestedControlPlaneStatus, NestedControllerManager,
    NestedEtcd,
};
use crate::apply::applyset::{CONTAINS_GROUP_KINDS_ANNOTATION, ID_LABEL, TOOLING_ANNOTATION, tooling};
use crate::apply::{apply_params, create_params, update_params};
use crate::controllers::component::ComponentResource;
use crate::controllers::round::{Now, recheck_after};
use crate::controllers::shared::cache::Subscriptions;
use crate::controllers::shared::certificates::CertificateStore;
use crate::controllers::shared::read::{
    cluster_settings, controller_reference, is_paused, owning_cluster, renewal_policy,
};
use crate::controllers::{Context, ReconcileError, WATCH_FILTER_LABEL, events};
use crate::pki::{
    CLUSTER_CA_COMMON_NAME, ETCD_CA_COMMON_NAME, FRONT_PROXY_CA_COMMON_NAME, SecretNames, admin_leaf, admin_user,
    apiserver_service_host, server_url,
};
use crate::plan::{
    APISERVER_PORT, ClusterSettings, ComponentRequest, Plan, Running, component_applyset_id, first_plan,
};
use crate::status::{
    APISERVER_READY, AVAILABLE, CERTIFICATES_AVAILABLE, CONTROLLER_MANAGER_READY, ConditionUpdate, ETCD_READY, PAUSED,
    READY, ROLLING_OUT, Reason, SYNCED, is_true, set_condition,
};

/// The NestedControlPlane controller, ready to be spawned: woken by its own changes, its
/// components', its Secrets' (a deleted CA is noticed within a moment) and its Cluster's spec.
pub fn run(ctx: Arc<Context>, subscriptions: &Subscriptions) -> impl Future<Output = ()> + Send + 'static {
    let secrets = ctx.caches.secret_triggers(|ncp: &NestedControlPlane| {
        ncp.namespace().map(|ns| ObjectRef::new(&ncp.name_any()).within(&ns))
    });
    let controller =
        Controller::for_shared_stream(subscriptions.control_planes.clone(), ctx.caches.control_planes.clone())
            // A burst of component changes (three components provisioning) becomes one
            // reconcile and one status write.
            .with_config(crate::controllers::controller_config().debounce(Duration::from_millis(250)))
            .owns_shared_stream(subscriptions.etcds.clone())
            .owns_shared_stream(subscriptions.apiservers.clone())
            .owns_shared_stream(subscriptions.controller_managers.clone())
            .reconcile_on(secrets)
            // A Cluster's spec (paused, clusterNetwork) is read from the cache: a change
            // to it (unpausing) wakes the control planes it owns.
            .reconcile_on(ctx.caches.cluster_triggers());
    async move {
        controller
            .shutdown_on_signal()
            .run(
                |ncp, ctx| async move {
                    crate::controllers::instrumented(&ctx.clone(), "control-plane", reconcile(ncp, ctx)).await
                },
                error_policy,
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

fn error_policy(ncp: Arc<NestedControlPlane>, error: &ReconcileError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(name = %ncp.name_any(), reason = error.reason(), error = %error, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

/// Reconciles one NestedControlPlane.
///
/// # Errors
/// Transient API errors, retried with backoff. A missing CA after initialization is a
/// condition, not a retry storm.
pub async fn reconcile(ncp: Arc<NestedControlPlane>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    if ncp.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = ncp.namespace().ok_or(ReconcileError::NoNamespace)?;
    let now = Now::take();
    let mut generation = ncp.meta().generation;
    let old = ncp.status.clone().unwrap_or_default();
    let mut status = old.clone();
    status.external_managed_control_plane = true;
    let capi_cluster = owning_cluster(&ctx, &ncp).await?;
    let paused = is_paused(&ncp, capi_cluster.as_deref());
    let pause = if paused {
        ConditionUpdate::new(
            PAUSED,
            true,
            Reason::Paused,
            "reconciliation is paused (cluster.x-k8s.io/paused or Cluster spec.paused)",
        )
    } else {
        ConditionUpdate::new(PAUSED, false, Reason::NotPaused, "")
    };
    set_condition(&mut status.conditions, pause, generation, &now.k8s);
    // The generation of capn's own spec patch this pass (the component references, the
    // endpoint), when there was one.
    let mut patched_generation = None;
    let result = if paused {
        Ok(Action::await_change())
    } else {
        let cluster = cluster_settings(&ncp, capi_cluster.as_deref(), &ctx.settings.super_dns_domain);
        drive(&ncp, &ctx, &ns, &cluster, &mut status, &now, &mut patched_generation).await
    };
    if let Err(e) = &result {
        let update = match e {
            ReconcileError::CertificateAuthorityMissing(_) => {
                ConditionUpdate::error(CERTIFICATES_AVAILABLE, false, e.reason(), e.to_string())
            }
            _ => ConditionUpdate::error(AVAILABLE, status.ready, e.reason(), e.to_string()),
        };
        set_condition(&mut status.conditions, update, generation, &now.k8s);
    }
    // This pass observed the spec capn itself just wrote (the patch's only change): saying
    // so now saves the status write that would otherwise only move observedGeneration on.
    if let Some(patched) = patched_generation {
        for condition in status
            .conditions
            .iter_mut()
            .filter(|c| c.observed_generation == generation)
        {
            condition.observed_generation = Some(patched);
        }
        generation = Some(patched);
    }
    status.observed_generation = generation;
    let observed = crate::controllers::shared::status_memo::Observed::of("NestedControlPlane", &*ncp, &old);
    if status != old && !ctx.status_memo.already_written(&observed, &status) {
        // The public CRD sync owns its condition and counts; leave them out of this apply.
        let mut own = status.clone();
        own.conditions.retain(|c| c.type_ != crate::status::PUBLIC_CRDS_SYNCED);
        own.public_crds = None;
        let api: Api<NestedControlPlane> = Api::namespaced(ctx.client.clone(), &ns);
        let patch = serde_json::json!({
            "apiVersion": NestedControlPlane::api_version(&()),
            "kind": NestedControlPlane::kind(&()),
            "status": own,
        });
        let written = api
            .patch_status(&observed.name, &apply_params(), &Patch::Apply(&patch))
            .await?;
        ctx.status_memo
            .record(&observed, &status, written.resource_version().unwrap_or_default());
        events::publish_condition_changes(&ctx, &*ncp, &old.conditions, &status.conditions).await;
    }
    match result {
        // A missing CA needs a human; look again now and then, without a retry storm.
        Err(ReconcileError::CertificateAuthorityMissing(_)) => Ok(Action::requeue(Duration::from_secs(300))),
        other => other,
    }
}

async fn drive(
    ncp: &NestedControlPlane,
    ctx: &Context,
    ns: &str,
    cluster: &ClusterSettings,
    status: &mut NestedControlPlaneStatus,
    now: &Now,
    patched_generation: &mut Option<i64>,
) -> Result<Action, ReconcileError> {
    let generation = ncp.meta().generation;
    let Some(owner) = controller_reference(ncp) else {
        return Err(ReconcileError::NoNamespace);
    };
    // Bad input stops here, before anything is created or a kubeconfig points at it; the
    // same check as admission and `capn render` (crate::validate).
    let valid = match crate::plan::check_control_plane(&serde_json::to_value(ncp).unwrap_or_default(), cluster) {
        Ok(()) => ConditionUpdate::new(SYNCED, true, Reason::Valid, "the spec follows every field rule"),
        Err(e) => ConditionUpdate::error(SYNCED, false, e.reason(), e.to_string()),
    };
    let invalid = !valid.status;
    set_condition(&mut status.conditions, valid, generation, &now.k8s);
    if invalid {
        return Ok(Action::await_change());
    }
    let names = SecretNames::new(&cluster.name);
    let policy = renewal_policy(ncp, ctx.settings.certificate_validity).map_err(ReconcileError::InvalidSpec)?;
    let store = CertificateStore::new(ctx, ns, &cluster.name, &owner, now.time, policy);

    // 0. A CA rotation requested or in progress moves first: it may bring back a lost CA.
    crate::controllers::control_plane::rotation::step(ctx, ncp, &store, &names, status, now).await?;

    // 1. CAs and the service-account key: created once; after that a missing one is an
    //    error for a human, never a silent re-mint (docs/design.md §6).
    let may_create = !status.initialized && !is_true(&status.conditions, CERTIFICATES_AVAILABLE);
    //    Four independent Secrets: read or created at once, not one after another.
    let (ca, etcd_ca, proxy_ca, ()) = futures::try_join!(
        store.ensure_ca(&names.ca, CLUSTER_CA_COMMON_NAME, may_create),
        store.ensure_ca(&names.etcd_ca, ETCD_CA_COMMON_NAME, may_create),
        store.ensure_ca(&names.proxy_ca, FRONT_PROXY_CA_COMMON_NAME, may_create),
        store.ensure_service_account_key(&names.sa, may_create),
    )?;
    set_condition(
        &mut status.conditions,
        ConditionUpdate::new(
            CERTIFICATES_AVAILABLE,
            true,
            Reason::CertificatesAvailable,
            "CAs and service-account key exist",
        ),
        generation,
        &now.k8s,
    );
    let mut expiry: Vec<time::OffsetDateTime> = Vec::new();
    for authority in [&ca, &etcd_ca, &proxy_ca] {
        expiry.extend(store.ca_not_after(authority).await?);
    }

    // 2. The components: created with defaults or adopted.
    //    Independent of one another: created (or adopted) at once.
    let (mut refs, mut apiserver_ref, mut controller_manager_ref) = Default::default();
    let (etcd, mut apiserver, controller_manager) = futures::try_join!(
        ensure_component::<NestedEtcd>(ctx, ncp, ns, cluster, &mut refs),
        ensure_component::<NestedAPIServer>(ctx, ncp, ns, cluster, &mut apiserver_ref),
        ensure_component::<NestedControllerManager>(ctx, ncp, ns, cluster, &mut controller_manager_ref),
    )?;
    refs.extend(apiserver_ref);
    refs.extend(controller_manager_ref);
    // The scale subresource: the control plane's replicas are the apiserver's.
    if let (Some(replicas), Some(a)) = (ncp.spec.replicas, apiserver.as_ref())
        && a.spec.component.replicas != Some(replicas)
    {
        let api: Api<NestedAPIServer> = Api::namespaced(ctx.client.clone(), ns);
        let patch = serde_json::json!({"spec": {"replicas": replicas}});
        apiserver = Some(
            api.patch(&a.name_any(), &update_params(), &Patch::Merge(&patch))
                .await?,
        );
    }

    // 3. The endpoint (CAPI contract: the control plane provider fills it): the apiserver
    //    Service's name and port, once the apiserver reports its Service or, for an
    //    apiserver created in this pass, once its first plan renders that Service. Both are
    //    known before the Service exists, and so the endpoint goes out with the references,
    //    in one patch (issue 11).
    let mut endpoint = ncp.spec.control_plane_endpoint.clone();
    let created_now = refs.contains_key(NestedAPIServer::REFERENCE_FIELD);
    let service_port = match (&endpoint, &apiserver) {
        (None, Some(a)) => apiserver_service_port(ctx, ncp, cluster, a, created_now),
        _ => None,
    };
    if let Some(port) = service_port {
        let e = ApiEndpoint {
            host: apiserver_service_host(&cluster.name, ns),
            port,
        };
        refs.insert(
            "controlPlaneEndpoint".into(),
            serde_json::to_value(&e).unwrap_or_default(),
        );
        endpoint = Some(e);
    }
    if !refs.is_empty() {
        let api: Api<NestedControlPlane> = Api::namespaced(ctx.client.clone(), ns);
        let patched = api
            .patch(
                &ncp.name_any(),
                &update_params(),
                &Patch::Merge(serde_json::json!({"spec": refs})),
            )
            .await?;
        // Exactly one more than what this pass read: nobody else changed the spec meanwhile.
        *patched_generation = patched.meta().generation.filter(|g| Some(*g - 1) == generation);
    }

    // 4. The admin kubeconfig `<c>-kubeconfig` (CAPI secret layout).
    if let Some(e) = &endpoint {
        let port = u16::try_from(e.port).unwrap_or(APISERVER_PORT as u16);
        let server = server_url(&e.host, port);
        let (admin_expiry, _) = store
            .ensure_kubeconfig(
                &names.kubeconfig,
                &ca,
                &admin_leaf(),
                &admin_user(&cluster.name),
                &server,
                false,
            )
            .await?;
        expiry.push(admin_expiry);
    }
    // The leaves the components issued say when they expire and are renewed in their
    // Secrets' annotations: read from the metadata cache, no request.
    let leaves = leaf_schedule(ctx, ns, &names);
    expiry.extend(leaves.iter().map(|l| l.not_after));
    status.certificates_expiry_date = expiry.into_iter().min().and_then(kube_time);
    let next_renewal = leaves
        .iter()
        .filter_map(|l| l.renew_at.map(|at| (at, l.secret.clone())))
        .chain(store.next_renewal_of())
        .min();
    status.next_certificate_renewal = next_renewal.as_ref().and_then(|(at, secret)| {
        kube_time(*at).map(|time| CertificateRenewal {
            secret: secret.clone(),
            time,
        })
    });

    // 5. Aggregate status.
    let shown = status.components.clone().unwrap_or_default();
    let summary = |shown: Option<&ComponentSummary>, name: Option<String>, s: Option<&crate::api::ComponentStatus>| {
        name.map(|name| {
            let current = ComponentSummary {
                name,
                ready: s.is_some_and(|s| s.ready),
                replicas: s.and_then(|s| s.replicas).unwrap_or(0),
                ready_replicas: s.and_then(|s| s.ready_replicas).unwrap_or(0),
                version: s.and_then(|s| s.version.clone()),
            };
            let served = s.is_some_and(|s| is_true(&s.conditions, ROLLING_OUT));
            hold_progress(shown, current, served)
        })
    };
    let components = ComponentsStatus {
        etcd: summary(
            shown.etcd.as_ref(),
            etcd.as_ref().map(|c| c.name_any()),
            etcd.as_ref().and_then(|c| c.status.as_ref()),
        ),
        apiserver: summary(
            shown.apiserver.as_ref(),
            apiserver.as_ref().map(|c| c.name_any()),
            apiserver.as_ref().and_then(|c| c.status.as_ref()),
        ),
        controller_manager: summary(
            shown.controller_manager.as_ref(),
            controller_manager.as_ref().map(|c| c.name_any()),
            controller_manager.as_ref().and_then(|c| c.status.as_ref()),
        ),
    };
    for (type_, kind, component, resource) in [
        (
            ETCD_READY,
            "NestedEtcd",
            &components.etcd,
            etcd.as_ref().and_then(|c| c.status.as_ref()),
        ),
        (
            APISERVER_READY,
            "NestedAPIServer",
            &components.apiserver,
            apiserver.as_ref().and_then(|c| c.status.as_ref()),
        ),
        (
            CONTROLLER_MANAGER_READY,
            "NestedControllerManager",
            &components.controller_manager,
            controller_manager.as_ref().and_then(|c| c.status.as_ref()),
        ),
    ] {
        let update = component_condition(type_, kind, component.as_ref(), resource);
        set_condition(&mut status.conditions, update, generation, &now.k8s);
    }
    let all_ready = [&components.etcd, &components.apiserver, &components.controller_manager]
        .iter()
        .all(|c| c.as_ref().is_some_and(|c| c.ready));
    let apiserver_ready = components.apiserver.as_ref().is_some_and(|c| c.ready);
    status.ready = all_ready;
    // Initialization is a milestone: once reached it stays (CAPI contract).
    status.initialized = status.initialized || apiserver_ready;
    status.initialization = Some(ControlPlaneInitialization {
        control_plane_initialized: status.initialized,
    });
    status.selector = Some(
        crate::plan::selector_labels(crate::component::ComponentKind::ApiServer, &cluster.name)
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(","),
    );
    if let Some(a) = &components.apiserver {
        status.version = a.version.clone();
        status.replicas = Some(a.replicas);
        status.ready_replicas = Some(a.ready_replicas);
        status.updated_replicas = Some(a.ready_replicas);
        status.up_to_date_replicas = Some(a.ready_replicas);
        status.unavailable_replicas = Some((a.replicas - a.ready_replicas).max(0));
    }
    let not_ready: Vec<&str> = [
        ("etcd", &components.etcd),
        ("apiserver", &components.apiserver),
        ("controller-manager", &components.controller_manager),
    ]
    .iter()
    .filter(|(_, c)| !c.as_ref().is_some_and(|c| c.ready))
    .map(|(n, _)| *n)
    .collect();
    let available = if all_ready {
        ConditionUpdate::new(
            AVAILABLE,
            true,
            Reason::Available,
            "etcd, apiserver and controller-manager are ready",
        )
    } else {
        ConditionUpdate::new(
            AVAILABLE,
            false,
            Reason::ComponentsNotReady,
            format!("not ready: {}", not_ready.join(", ")),
        )
    };
    set_condition(&mut status.conditions, available, generation, &now.k8s);
    let rolling: Vec<String> = [
        etcd.as_ref().and_then(|c| c.status.as_ref()),
        apiserver.as_ref().and_then(|c| c.status.as_ref()),
        controller_manager.as_ref().and_then(|c| c.status.as_ref()),
    ]
    .into_iter()
    .flatten()
    .flat_map(|s| {
        s.conditions
            .iter()
            .filter(|c| c.type_ == ROLLING_OUT && c.status == "True")
    })
    .map(|c| c.message.clone())
    .collect();
    let rolling_out = if rolling.is_empty() {
        ConditionUpdate::new(
            ROLLING_OUT,
            false,
            Reason::NotRollingOut,
            "every component runs its desired release",
        )
    } else {
        ConditionUpdate::new(ROLLING_OUT, true, Reason::RollingOut, rolling.join("; "))
    };
    set_condition(&mut status.conditions, rolling_out, generation, &now.k8s);
    status.components = Some(components);
    // 6. A stepped upgrade moves once the components are summarized (docs/design.md §10).
    let parts = crate::controllers::control_plane::upgrade::Components {
        etcd: etcd.as_ref(),
        apiserver: apiserver.as_ref(),
        controller_manager: controller_manager.as_ref(),
    };
    let upgrade_again =
        crate::controllers::control_plane::upgrade::step(ctx, ncp, ns, cluster, &parts, status, now).await;
    // Look again when the admin kubeconfig is due (the components watch their own).
    let again = recheck_after(&ncp.name_any(), store.next_renewal(), now.time);
    Ok(Action::requeue(upgrade_again.map_or(again, |u| u.min(again))))
}

/// The summary of a component to show, given the one the control plane shows (`shown`), the
/// component's own now (`current`), and whether it has served (`served`: its RollingOut
/// condition is True, so it is degraded or rolling out, not on its first provisioning):
/// while a component on its first provisioning is not ready and was not ready when last
/// shown, its replicas and version stay as shown. Its progress is told by its own status;
/// the control plane mirrors it at its Ready transitions, not at each step, so a
/// component's StatefulSet being applied (replicas and version set, not yet ready) costs
/// the control plane no status write of its own (issue 11: one or two per control plane).
/// A component that has served is not held: its counts are news to whoever reads the
/// control plane's (Cluster API reads `readyReplicas`), shown as they change.
fn hold_progress(shown: Option<&ComponentSummary>, current: ComponentSummary, served: bool) -> ComponentSummary {
    match shown {
        Some(shown) if !served && !shown.ready && !current.ready && shown.name == current.name => ComponentSummary {
            replicas: shown.replicas,
            ready_replicas: shown.ready_replicas,
            version: shown.version.clone(),
            ..current
        },
        _ => current,
    }
}

/// The control plane's condition `type_` (`EtcdReady`, ...) for its component of kind `kind`:
/// True once it is ready; a failing component's Ready reason and message word for word (it
/// needs someone); `NotReady` with a message that stays put while it is on its way (its own
/// Ready condition tells the progress: mirrored step by step, each step of each component
/// cost the control plane a status write, issue 11); `ComponentMissing` when it does not
/// exist.
fn component_condition(
    type_: &'static str,
    kind: &str,
    component: Option<&ComponentSummary>,
    status: Option<&crate::api::ComponentStatus>,
) -> ConditionUpdate {
    let ready_condition = status.and_then(|s| s.conditions.iter().find(|c| c.type_ == READY));
    match (component, ready_condition) {
        (Some(c), _) if c.ready => {
            ConditionUpdate::new(type_, true, Reason::Ready, format!("{kind} {} is ready", c.name))
        }
        (Some(c), Some(rc)) if crate::status::failing(rc) => ConditionUpdate::mirrored(
            type_,
            false,
            rc.reason.clone(),
            format!("{kind} {}: {}", c.name, rc.message),
        ),
        (Some(c), _) => ConditionUpdate::new(
            type_,
            false,
            Reason::NotReady,
            format!(
                "{kind} {} is not ready yet; its Ready condition tells its progress",
                c.name
            ),
        ),
        (None, _) => ConditionUpdate::new(
            type_,
            false,
            Reason::ComponentMissing,
            format!("the {kind} named in spec does not exist"),
        ),
    }
}

fn kube_time(t: time::OffsetDateTime) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time> {
    k8s_openapi::jiff::Timestamp::from_second(t.unix_timestamp())
        .ok()
        .map(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time)
}

/// What a leaf Secret's annotations say about its certificate.
struct LeafSchedule {
    secret: String,
    not_after: time::OffsetDateTime,
    renew_at: Option<time::OffsetDateTime>,
}

/// The expiry and renewal times the cluster's leaf Secrets carry (annotations written when
/// capn issued them), from the metadata cache.
fn leaf_schedule(ctx: &Context, ns: &str, names: &SecretNames) -> Vec<LeafSchedule> {
    names
        .all()
        .into_iter()
        .filter_map(|name| {
            let cached = ctx.caches.secret(ns, name)?;
            Some(LeafSchedule {
                secret: name.to_string(),
                not_after: cached.not_after?,
                renew_at: cached.renew_after,
            })
        })
        .collect()
}

/// The port of the apiserver's Service (`<c>-apiserver`): as the apiserver reports it, or,
/// for an apiserver the control plane named in this pass (`created_now`: created, or found by
/// its owner reference) that has no status yet,
/// [`APISERVER_PORT`] when its first plan renders that Service. `None` otherwise (a
/// provider's channel may render none).
fn apiserver_service_port(
    ctx: &Context,
    ncp: &NestedControlPlane,
    cluster: &ClusterSettings,
    apiserver: &NestedAPIServer,
    created_now: bool,
) -> Option<i32> {
    if let Some(service) = apiserver.status.as_ref().and_then(|s| s.service.as_ref()) {
        return Some(service.port);
    }
    if !created_now || apiserver.status.is_some() {
        return None;
    }
    let name = crate::component::ComponentKind::ApiServer.object_name(&cluster.name);
    first_plan_of(ctx, ncp, cluster, apiserver)?
        .objects
        .iter()
        .any(|o| o["kind"] == "Service" && o["metadata"]["name"] == name.as_str())
        .then_some(APISERVER_PORT)
}

/// The first round's plan of a component about to be created, or just created
/// ([`first_plan`]), with the settings its own reconcile uses.
fn first_plan_of<K: ComponentResource>(
    ctx: &Context,
    ncp: &NestedControlPlane,
    cluster: &ClusterSettings,
    fresh: &K,
) -> Option<Plan> {
    let mut cluster = cluster.clone();
    cluster.network_policy.capn = ctx.settings.capn_pods.clone();
    cluster.kubernetes_version = crate::upgrade::components_version(ncp);
    let name = fresh.name_any();
    let request = ComponentRequest {
        kind: K::KIND,
        resource_name: &name,
        spec: fresh.component(),
        etcd_storage: fresh.etcd_storage(),
        etcd_restore: None,
        // Without a uid (perhaps not created yet): nothing the control plane reads from
        // this plan, its kinds and Services, depends on it.
        owner: k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: K::api_version(&()).into_owned(),
            kind: K::kind(&()).into_owned(),
            name: name.clone(),
            uid: String::new(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        },
        running: Running::default(),
    };
    first_plan(&ctx.channels, &cluster, &request)
}

/// Finds, adopts or creates the component of kind `K`; records a new reference in `refs`.
/// `Ok(None)` when the spec names a component that does not exist (reported, not created:
/// the user asked for that one).
async fn ensure_component<K: ComponentResource>(
    ctx: &Context,
    ncp: &NestedControlPlane,
    ns: &str,
    cluster: &ClusterSettings,
    refs: &mut serde_json::Map<String, serde_json::Value>,
) -> Result<Option<K>, ReconcileError> {
    let api: Api<K> = Api::namespaced(ctx.client.clone(), ns);
    let uid = ncp.uid().unwrap_or_default();
    let owner = controller_reference(ncp).ok_or(ReconcileError::NoNamespace)?;
    let cache = K::cache(&ctx.caches);
    let component = match K::reference(ncp) {
        Some(name) => cache.get(&ObjectRef::new(name).within(ns)).map(|c| (*c).clone()),
        None => {
            // A component in the namespace that points back at this control plane.
            let existing = cache
                .find(|c| c.namespace().as_deref() == Some(ns) && c.owner_references().iter().any(|o| o.uid == uid))
                .map(|c| (*c).clone());
            let component = match existing {
                Some(c) => c,
                None => {
                    let mut fresh = K::with_defaults(&format!("{}-{}", ncp.name_any(), K::KIND.as_str()));
                    fresh.meta_mut().owner_references = Some(vec![owner.clone()]);
                    let mut labels =
                        std::collections::BTreeMap::from([(CLUSTER_NAME_LABEL.to_string(), cluster.name.clone())]);
                    // Components go to the same capn instance as their control plane.
                    if let Some(filter) = ncp.labels().get(WATCH_FILTER_LABEL) {
                        labels.insert(WATCH_FILTER_LABEL.to_string(), filter.clone());
                    }
                    if let Some(group_kinds) =
                        first_plan_of(ctx, ncp, cluster, &fresh).map(|p| p.contains_group_kinds())
                    {
                        labels.insert(
                            ID_LABEL.to_string(),
                            component_applyset_id(K::KIND, &fresh.name_any(), ns),
                        );
                        fresh.meta_mut().annotations = Some(std::collections::BTreeMap::from([
                            (TOOLING_ANNOTATION.to_string(), tooling()),
                            (CONTAINS_GROUP_KINDS_ANNOTATION.to_string(), group_kinds),
                        ]));
                    }
                    fresh.meta_mut().labels = Some(labels);
                    match api.create(&create_params(), &fresh).await {
                        Ok(c) => c,
                        Err(kube::Error::Api(s)) if s.code == 409 => api.get(&fresh.name_any()).await?,
                        Err(e) => return Err(e.into()),
                    }
                }
            };
            refs.insert(
                K::REFERENCE_FIELD.into(),
                serde_json::json!({"name": component.name_any()}),
            );
            Some(component)
        }
    };
    let Some(component) = component else {
        return Ok(None);
    };
    // Adopt: like a ReplicaSet re-associating with its Deployment, unless another
    // controller owns it. A component follows its control plane's watch filter, so that
    // the same capn instance reconciles both.
    let needs_owner = !component.owner_references().iter().any(|o| o.uid == uid)
        && !component.owner_references().iter().any(|o| o.controller == Some(true));
    let filter = ncp.labels().get(WATCH_FILTER_LABEL);
    let needs_label = filter.is_some() && component.labels().get(WATCH_FILTER_LABEL) != filter;
    if needs_owner || needs_label {
        let mut metadata = serde_json::json!({"resourceVersion": component.resource_version()});
        if needs_owner {
            let mut owners = component.owner_references().to_vec();
            owners.push(owner);
            metadata["ownerReferences"] = serde_json::to_value(owners).unwrap_or_default();
        }
        if let Some(filter) = filter.filter(|_| needs_label) {
            metadata["labels"] = serde_json::json!({WATCH_FILTER_LABEL: filter});
        }
        let adopted = api
            .patch(
                &component.name_any(),
                &update_params(),
                &Patch::Merge(&serde_json::json!({"metadata": metadata})),
            )
            .await?;
        tracing::info!(kind = K::KIND.resource_kind(), name = %adopted.name_any(), "adopted component");
        return Ok(Some(adopted));
    }
    Ok(Some(component))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ComponentStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    fn summary(name: &str, ready: bool, replicas: i32, ready_replicas: i32, version: Option<&str>) -> ComponentSummary {
        ComponentSummary {
            name: name.into(),
            ready,
            replicas,
            ready_replicas,
            version: version.map(Into::into),
        }
    }

    #[test]
    fn a_component_on_its_way_keeps_the_counts_shown_until_it_is_ready() {
        let created = summary("demo-etcd", false, 0, 0, None);
        let applied = summary("demo-etcd", false, 3, 1, Some("3.6.8"));
        let ready = summary("demo-etcd", true, 3, 3, Some("3.6.8"));
        // Its StatefulSet applied, not ready yet: nothing new to show.
        assert_eq!(hold_progress(Some(&created), applied.clone(), false), created);
        // Ready: shown whole.
        assert_eq!(hold_progress(Some(&created), ready.clone(), false), ready);
        // Nothing shown yet (the first status), or another component of the name: as it is.
        assert_eq!(hold_progress(None, applied.clone(), false), applied);
        let other = summary("other-etcd", false, 1, 0, Some("3.5.21"));
        assert_eq!(hold_progress(Some(&other), applied.clone(), false), applied);
        // A ready component that fails, or scales while ready: every count shown.
        let failing = summary("demo-etcd", false, 3, 2, Some("3.6.8"));
        assert_eq!(hold_progress(Some(&ready), failing.clone(), false), failing);
        let scaled = summary("demo-etcd", true, 5, 5, Some("3.6.8"));
        assert_eq!(hold_progress(Some(&ready), scaled.clone(), false), scaled);
        // A component that served and degrades further, or rolls out: each count shown, as
        // it changes (a failing member of three after one already failed).
        let worse = summary("demo-etcd", false, 3, 1, Some("3.6.8"));
        assert_eq!(hold_progress(Some(&failing), worse.clone(), true), worse);
        assert_eq!(hold_progress(Some(&failing), worse.clone(), false), failing);
    }

    fn with_ready(reason: &str, message: &str) -> ComponentStatus {
        ComponentStatus {
            conditions: vec![Condition {
                type_: READY.into(),
                status: "False".into(),
                reason: reason.into(),
                message: message.into(),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ),
                observed_generation: None,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_component_on_its_way_is_not_ready_in_the_same_words_at_every_step_and_a_failure_is_repeated() {
        let summary = ComponentSummary {
            name: "demo-apiserver".into(),
            ..Default::default()
        };
        let mirror = |status: Option<&ComponentStatus>| {
            component_condition(APISERVER_READY, "NestedAPIServer", Some(&summary), status)
        };
        let steps = [
            mirror(None),
            mirror(Some(&with_ready("WaitingForEtcd", "NestedEtcd demo-etcd is not ready"))),
            mirror(Some(&with_ready("Provisioning", "0/1 members ready"))),
        ];
        assert!(steps.iter().all(|s| !s.status && s.reason == Reason::NotReady.as_str()));
        assert!(steps.iter().all(|s| s.message == steps[0].message), "{steps:?}");
        let failed = mirror(Some(&with_ready(
            "InvalidVersion",
            "version 1.99 is not in channel stable",
        )));
        assert_eq!(failed.reason, "InvalidVersion");
        assert_eq!(
            failed.message,
            "NestedAPIServer demo-apiserver: version 1.99 is not in channel stable"
        );
        let ready = ComponentSummary {
            ready: true,
            ..summary.clone()
        };
        let ready = component_condition(APISERVER_READY, "NestedAPIServer", Some(&ready), None);
        assert!(ready.status);
        let missing = component_condition(APISERVER_READY, "NestedAPIServer", None, None);
        assert_eq!(missing.reason, "ComponentMissing");
    }
}
