//! One tenant pod, both ways (docs/design.md §11): down, its super pod with the objects it
//! refers to and its tokens; up, the super pod's status and node onto the tenant pod; and
//! its end, where the syncer plays the kubelet's last part (a terminating tenant pod is
//! removed once its super pod is gone).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Binding, Node, ObjectReference, Pod, PodCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;

use super::caches::in_namespace;
use super::scope::{FIELD_MANAGER, Tenant, typed};
use super::written_lately::CACHE_LAG;
use super::{nodes, pod_certificates, references, tokens, trust_bundles};
use crate::syncer::diff::{Ownership, ownership};
use crate::syncer::names::NameLimit;
use crate::syncer::names::tenancy::{MissingField, TenantObject};
use crate::syncer::pod::{TranslateError, keep_live_immutables};
use crate::syncer::pods::Pods;
use crate::syncer::resource::ResourceSyncer;
use crate::syncer::service::service_links;
use crate::syncer::upward::bind_to;

/// How soon a pod that waits (for a tenant object it refers to, for its super pod to go)
/// is looked at again without being woken.
const WAIT: Duration = Duration::from_secs(10);

/// The reason of a pod the super cluster's admission refused (`PodScheduled=False` and the
/// Event).
const SUPER_CLUSTER_REFUSED: &str = "SuperClusterRefused";
/// The reason of a bound pod whose super node is gone.
const NODE_LOST: &str = "NodeLost";
/// How long a new pod waits at most for a Service copy's ClusterIP (the services pass
/// makes a copy within a request or two of the Service; see `waits_for_services`).
const LINK_WAIT: Duration = Duration::from_secs(30);
/// How long a pod waits at most for the Service caches to fill (see `reconcile`).
const SERVICES_READY: Duration = Duration::from_secs(10);
/// How soon a pod waiting for a Service copy's ClusterIP is looked at again.
const LINK_RETRY: Duration = Duration::from_millis(500);
/// How soon a pod the super cluster refused is tried again.
const REFUSED_RETRY: Duration = Duration::from_secs(20);

/// Why one pod's sync failed; retried with backoff.
#[derive(Debug, thiserror::Error)]
pub(super) enum SyncError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Incomplete(#[from] MissingField),
}

impl SyncError {
    /// Short stable reason for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            SyncError::Kube(_) => "APIError",
            SyncError::Incomplete(_) => "TenantObjectIncomplete",
        }
    }
}

/// Syncs the tenant pod `pod` (see the module documentation).
///
/// # Errors
/// A refused or failed request to either apiserver.
pub(super) async fn reconcile(pod: Arc<Pod>, tenant: &Tenant) -> Result<Action, SyncError> {
    // Until the shared super caches have listed, a missing super pod means nothing (and
    // every pod would be applied again at each start of capn).
    if tenant.super_pods.wait_until_ready().await.is_err() {
        return Ok(Action::requeue(WAIT));
    }
    // The Services a new pod's environment names come from two more caches, which never
    // hold a pod for long: past SERVICES_READY it goes without them (and says so).
    let services_known = tokio::time::timeout(SERVICES_READY, async {
        tenant.super_services.wait_until_ready().await.is_ok()
            && tenant.tenant_services.wait_until_ready().await.is_ok()
    })
    .await
    .unwrap_or(false);
    let identity = TenantObject::of(&pod.metadata)?;
    let super_name = tenant
        .control_plane()
        .super_name(NameLimit::Subdomain, &identity.namespace, &identity.name);
    // A super pod made by an earlier pass that the cache does not show yet is taken as
    // made (`written_lately`), not made again; it is looked at again once the record lapses.
    let cached = tenant
        .super_pods
        .get(&ObjectRef::new(&super_name).within(&tenant.namespace));
    let made_lately = if cached.is_some() {
        tenant.pods_made.forget(&super_name);
        None
    } else {
        tenant.pods_made.get(&super_name)
    };
    let mut next = match made_lately {
        Some(_) => Action::requeue(CACHE_LAG),
        None => Action::await_change(),
    };
    let live = cached.or(made_lately);
    match live
        .as_ref()
        .map(|l| ownership(tenant.control_plane(), NameLimit::Subdomain, &identity, &l.metadata))
    {
        Some(Ownership::Foreign) => {
            let note = format!(
                "the super cluster already has a pod {super_name} in {} that is not this pod's copy; it is left alone",
                tenant.namespace
            );
            tenant.event(&*pod, true, super::copies::NAME_CONFLICT, note).await;
            return Ok(Action::requeue(Duration::from_secs(300)));
        }
        Some(Ownership::Stale) => {
            // The copy of an earlier pod of this name: it goes first.
            delete_super(tenant, &super_name, None).await?;
            return Ok(Action::requeue(WAIT));
        }
        _ => {}
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return terminate(tenant, &pod, live.as_deref(), &super_name).await;
    }
    if is_finished(&pod) && live.is_none() {
        return Ok(Action::await_change());
    }
    // A pod the syncer bound is translated as it was before binding (its `nodeName` is the
    // syncer's, not the tenant's).
    let bound_to = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .filter(|_| bound_by_syncer(tenant, &pod));
    let source = if bound_to.is_some() {
        let mut unbound = (*pod).clone();
        if let Some(spec) = unbound.spec.as_mut() {
            spec.node_name = None;
        }
        std::borrow::Cow::Owned(unbound)
    } else {
        std::borrow::Cow::Borrowed(&*pod)
    };
    let (links, waiting) = if services_known {
        service_links(
            tenant.control_plane(),
            &identity.namespace,
            &tenant.tenant_services.state(),
            &in_namespace(&tenant.super_services, &tenant.namespace),
        )
    } else {
        if live.is_none() {
            tracing::info!(pod = %identity.name, namespace = %identity.namespace, "the Services are not cached yet: the pod's environment names none of them");
        }
        (Vec::new(), Vec::new())
    };
    if live.is_none() && waits_for_services(tenant, &pod, &waiting) {
        return Ok(Action::requeue(LINK_RETRY));
    }
    // The pod's rules (`crate::syncer::pods::Pods`, a `ResourceSyncer`): its copy, what it
    // refers to, when the copy is current, and the status that goes up.
    let syncer = Pods {
        target: &tenant.target,
        links: &links,
        now: Timestamp::now(),
    };
    let mut translation = match syncer.translate(&source) {
        Ok(t) => t,
        Err(TranslateError::MissingField(e)) => return Err(e.into()),
        Err(refused) => {
            let message = format!("not run by the super cluster: {refused}");
            return refuse(tenant, &pod, refused.reason(), message, Action::await_change()).await;
        }
    };
    tenant.mark(&mut translation.pod.metadata);
    if let Some(live) = &live {
        keep_live_immutables(&mut translation.pod, live);
    }
    // A pod stays on the node it was bound to, as pods do: a super pod deleted under a bound
    // tenant pod (evicted, deleted by hand) is made again on that node, not scheduled anew,
    // so that the tenant pod's node stays true; if that node is gone, the pod is lost with it.
    if let (None, Some(node)) = (&live, &bound_to) {
        if Api::<Node>::all(tenant.super_client.clone())
            .get_opt(node)
            .await?
            .is_none()
        {
            return lost(tenant, &pod, node).await;
        }
        if let Some(spec) = translation.pod.spec.as_mut() {
            spec.node_name = Some(node.clone());
        }
    }
    if references::sync(tenant, &identity.namespace, &syncer.references(&source)).await? {
        next = Action::requeue(WAIT);
    }
    let created = live.is_none();
    let live = match live {
        Some(live) if syncer.is_current(&translation.pod, &live) => live,
        _ => match apply_super(tenant, &super_name, &translation.pod).await {
            Ok(applied) => {
                let applied = Arc::new(applied);
                if created {
                    tenant.pods_made.record(&super_name, applied.clone());
                }
                applied
            }
            // The super cluster's admission said no to a new super pod (its ResourceQuota is
            // used up, a policy of its own): the tenant hears why, and the pod is tried
            // again, as the quota may free. (A refused update of a running one is retried.)
            Err(kube::Error::Api(e)) if created && (e.code == 403 || e.code == 422) => {
                let message = format!("the super cluster refused the pod: {}", e.message);
                return refuse(
                    tenant,
                    &pod,
                    SUPER_CLUSTER_REFUSED,
                    message,
                    Action::requeue(REFUSED_RETRY),
                )
                .await;
            }
            Err(e) => return Err(e.into()),
        },
    };
    if let Some(bundles) = &translation.trust_bundles
        && trust_bundles::sync(tenant, &pod, &identity, bundles, &live).await?
    {
        next = sooner(next, Some(WAIT));
    }
    if created && !translation.dropped_tolerations.is_empty() {
        let keys: Vec<_> = translation
            .dropped_tolerations
            .iter()
            .map(|t| t.key.clone().unwrap_or_default())
            .collect();
        let note = format!("tolerations not carried to the super cluster: {}", keys.join(", "));
        tenant.event(&*pod, false, "TolerationsDropped", note).await;
    }
    let bound = upward(tenant, &syncer, &pod, &live).await?;
    // After the way up, as the kubelet asks only for the pods bound to it: a token bound to
    // the pod then carries its Node (the apiserver's node-name and node-uid claims), and a
    // certificate request names that Node.
    if bound {
        if let Some(secret) = &translation.token_secret {
            let refresh = tokens::sync(tenant, &identity, secret, &live).await?;
            next = sooner(next, refresh);
        }
        if let Some(certificates) = &translation.certificates {
            let after = pod_certificates::sync(tenant, &pod, &identity, certificates, &live).await?;
            next = sooner(next, after);
        }
    }
    Ok(next)
}

/// Whether the new pod `pod` waits for the copies of Services in `waiting` to get their
/// ClusterIPs, so that its environment names them as the kubelet's would: only for a pod
/// with service links on, and only for Services made less than [`LINK_WAIT`] ago (a copy
/// the super cluster refused must not hold the pod forever; the Service has an Event).
fn waits_for_services(tenant: &Tenant, pod: &Pod, waiting: &[String]) -> bool {
    let links_on = pod.spec.as_ref().and_then(|s| s.enable_service_links) != Some(false);
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let now = Timestamp::now();
    links_on
        && waiting.iter().any(|name| {
            tenant
                .tenant_services
                .get(&ObjectRef::new(name).within(namespace))
                .and_then(|s| s.metadata.creation_timestamp.clone())
                .is_some_and(|made| now.duration_since(made.0).unsigned_abs() < LINK_WAIT)
        })
}

/// The earlier of two actions' requeues.
fn sooner(a: Action, b: Option<Duration>) -> Action {
    match b {
        Some(after) if a == Action::await_change() || after < WAIT => Action::requeue(after),
        _ => a,
    }
}

/// A pod that ran to its end: nothing more to run.
fn is_finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Whether the tenant pod's `nodeName` is a tenant Node the syncer made (it bound the pod),
/// rather than the tenant's own wish.
fn bound_by_syncer(tenant: &Tenant, pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|node| tenant.tenant_nodes.get(&ObjectRef::new(node)).is_some())
}

/// Creates or updates the super pod (server-side apply: the syncer's fields only, so the
/// super cluster's own additions stay and a label the tenant removed goes).
async fn apply_super(tenant: &Tenant, name: &str, pod: &Pod) -> Result<Pod, kube::Error> {
    let mut pod = pod.clone();
    pod.metadata.name = Some(name.to_owned());
    Api::<Pod>::namespaced(tenant.super_client.clone(), &tenant.namespace)
        .patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(typed(&pod)),
        )
        .await
}

/// Deletes the super pod `name` with `grace` seconds (its own when `None`); gone already is
/// no error.
async fn delete_super(tenant: &Tenant, name: &str, grace: Option<i64>) -> Result<(), kube::Error> {
    tenant.pods_made.forget(name);
    let params = DeleteParams {
        grace_period_seconds: grace.and_then(|g| u32::try_from(g).ok()),
        ..DeleteParams::default()
    };
    match Api::<Pod>::namespaced(tenant.super_client.clone(), &tenant.namespace)
        .delete(name, &params)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// A terminating tenant pod: its super pod is deleted with the tenant's grace period, and
/// once that is gone the tenant pod is removed (`gracePeriodSeconds: 0`, as the kubelet
/// does when the containers have stopped).
async fn terminate(tenant: &Tenant, pod: &Pod, live: Option<&Pod>, super_name: &str) -> Result<Action, SyncError> {
    match live {
        Some(live) if live.metadata.deletion_timestamp.is_none() => {
            delete_super(tenant, super_name, pod.metadata.deletion_grace_period_seconds).await?;
            Ok(Action::requeue(WAIT))
        }
        Some(_) => Ok(Action::requeue(WAIT)),
        None => {
            let params = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: pod.metadata.uid.clone(),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            let api = Api::<Pod>::namespaced(tenant.tenant_client.clone(), &pod.namespace().unwrap_or_default());
            match api.delete(&pod.name_any(), &params).await {
                Ok(_) => Ok(Action::await_change()),
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(Action::await_change()),
                Err(e) => Err(e.into()),
            }
        }
    }
}

/// A pod that does not run (a rule of the syncer's refused it, or the super cluster did):
/// `PodScheduled=False` with `reason` and `message`, and a Warning Event, both in the tenant;
/// no super object. Returns `next`.
async fn refuse(tenant: &Tenant, pod: &Pod, reason: &str, message: String, next: Action) -> Result<Action, SyncError> {
    let condition = PodCondition {
        type_: "PodScheduled".to_owned(),
        status: "False".to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(message.clone()),
        last_transition_time: Some(Time(Timestamp::now())),
        ..PodCondition::default()
    };
    let conditions = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let current = conditions.iter().find(|c| c.type_ == "PodScheduled");
    if current.is_some_and(|c| c.status == "False" && c.message.as_deref() == Some(message.as_str())) {
        return Ok(next);
    }
    let mut conditions: Vec<PodCondition> = conditions.into_iter().filter(|c| c.type_ != "PodScheduled").collect();
    conditions.push(condition);
    Api::<Pod>::namespaced(tenant.tenant_client.clone(), &pod.namespace().unwrap_or_default())
        .patch_status(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"phase": "Pending", "conditions": conditions}})),
        )
        .await?;
    tenant.event(pod, true, reason, message).await;
    Ok(next)
}

/// A bound tenant pod whose super pod and super node are both gone: `Failed` with reason
/// `NodeLost` (the node lifecycle controller's word for pods of a vanished node), and a
/// Warning Event, so that its controller replaces it.
async fn lost(tenant: &Tenant, pod: &Pod, node: &str) -> Result<Action, SyncError> {
    let message = format!("the super cluster's node {node} that ran the pod is gone, and the pod with it");
    Api::<Pod>::namespaced(tenant.tenant_client.clone(), &pod.namespace().unwrap_or_default())
        .patch_status(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"phase": "Failed", "reason": NODE_LOST, "message": message}})),
        )
        .await?;
    tenant.event(pod, true, NODE_LOST, message).await;
    Ok(Action::await_change())
}

/// The way up: the tenant pod bound to its super pod's node (whose tenant Node is made
/// first), and its status from the super pod's. Returns whether the tenant pod is bound.
async fn upward(tenant: &Tenant, syncer: &Pods<'_>, pod: &Pod, live: &Pod) -> Result<bool, kube::Error> {
    let bind_to = bind_to(pod, live);
    let api = Api::<Pod>::namespaced(tenant.tenant_client.clone(), &pod.namespace().unwrap_or_default());
    let unbound = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_none();
    let bound = !unbound || bind_to.is_some();
    if let Some(node) = bind_to.as_deref().filter(|_| unbound) {
        nodes::ensure(tenant, node, None).await?;
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(pod.name_any()),
                uid: pod.metadata.uid.clone(),
                ..ObjectMeta::default()
            },
            target: ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Node".to_owned()),
                name: Some(node.to_owned()),
                ..ObjectReference::default()
            },
        };
        match api
            .create_subresource::<_, serde_json::Value>("binding", &pod.name_any(), &PostParams::default(), &binding)
            .await
        {
            Ok(_) => {}
            // Bound already (a watch that lagged): the status below still goes up.
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    if let Some(up) = syncer.status_up(pod, live) {
        api.patch_status(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "status": up.status })),
        )
        .await?;
    }
    Ok(bound)
}
