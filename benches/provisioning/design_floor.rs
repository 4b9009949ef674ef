//! The design's floor: the floor ([`crate::floor`]) plus the least that any implementation
//! of capn's API must add to it, still without logic. It tells how much of capn's distance
//! from the floor is capn's own and how much the contract (docs/design.md §2, §7)
//! asks of whoever implements it.
//!
//! Per control plane, all at once, as the capn half does: the NestedControlPlane is applied
//! as the user (counted in neither half, as in capn's), then this client
//! - creates the NestedEtcd, NestedAPIServer and NestedControllerManager, owned by the
//!   NestedControlPlane, and patches the references and the endpoint into its spec (§2:
//!   missing components are created; `controlPlaneEndpoint` is filled);
//! - applies the floor's 12 Secrets, then each component's objects, owned by its resource,
//!   in order, waiting until its StatefulSet is ready;
//! - writes each component's status once, when it is ready, and the control plane's once at
//!   the end, each with the conditions capn reports then, and publishes one Event per
//!   resource (§7: Events on every condition change; one per resource is the least).
//!
//! Every status a user would see before Ready (Pending, Provisioning, waiting for the
//! predecessor) is left out: this is a lower bound, not a rival implementation.

use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::time::{Duration, Instant};
use tokio::sync::watch;

use crate::floor::{self, Rendered, dynamic_api};
use crate::workload;
use capn::api::{
    ComponentStatus, ComponentSummary, ComponentsStatus, ControlPlaneInitialization, InventoryEntry,
    NestedControlPlane, NestedControlPlaneStatus,
};
use capn::status::{self, ConditionUpdate, Reason};

/// Field manager of the status writes.
const FIELD_MANAGER: &str = "bench-design-floor";

/// Provisions `count` control planes in `namespace` (the NestedControlPlanes applied with
/// `user`, the rest with `client`) and returns how long that took, from the first request to
/// the last control plane's status write.
///
/// # Errors
/// Rendering or a request fails, or not everything is ready within `timeout`.
pub async fn provision(
    user: kube::Client,
    client: kube::Client,
    namespace: &str,
    count: usize,
    timeout: Duration,
) -> Result<Duration, String> {
    let floor::Prepared { rendered, ready, watch } = floor::prepare(&client, namespace, count)?;
    let started = Instant::now();
    let all =
        futures::future::try_join_all(rendered.iter().enumerate().map(|(index, control_plane)| {
            provision_one(&user, &client, namespace, index, control_plane, ready.clone())
        }));
    let outcome = tokio::time::timeout(timeout, all).await;
    let elapsed = started.elapsed();
    watch.abort();
    outcome.map_err(|_| format!("the design's floor: not all {count} control planes ready after {timeout:?}"))??;
    Ok(elapsed)
}

async fn provision_one(
    user: &kube::Client,
    client: &kube::Client,
    namespace: &str,
    index: usize,
    control_plane: &Rendered,
    mut ready: watch::Receiver<HashSet<String>>,
) -> Result<(), String> {
    let name = workload::name(index);
    let ncps: Api<NestedControlPlane> = Api::namespaced(user.clone(), namespace);
    let ncp = ncps
        .patch(
            &name,
            &PatchParams::apply("kubectl"),
            &Patch::Apply(&workload::control_plane(namespace, index)?),
        )
        .await
        .map_err(|e| format!("applying NestedControlPlane {name}: {e}"))?;
    let ncp_uid = ncp.uid().unwrap_or_default();

    // The component resources, and the references to them in the control plane's spec.
    let mut owners = Vec::new();
    let mut references = serde_json::Map::new();
    for resource in &control_plane.resources {
        let created = create(
            client,
            &with_owner_uids(resource, &[("NestedControlPlane", &name, &ncp_uid)]),
        )
        .await?;
        let kind = created.types.as_ref().map(|t| t.kind.clone()).unwrap_or_default();
        references.insert(reference_field(&kind).to_owned(), json!({"name": created.name_any()}));
        owners.push((kind, created.name_any(), created.uid().unwrap_or_default(), created));
    }
    references.insert(
        "controlPlaneEndpoint".to_owned(),
        json!({"host": format!("{name}-apiserver.{namespace}.svc"), "port": 6443}),
    );
    Api::<NestedControlPlane>::namespaced(client.clone(), namespace)
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": references})),
        )
        .await
        .map_err(|e| format!("patching NestedControlPlane {name}'s references: {e}"))?;
    let owner_uids: Vec<(&str, &str, &str)> = owners
        .iter()
        .map(|(kind, name, uid, _)| (kind.as_str(), name.as_str(), uid.as_str()))
        .collect();

    for secret in &control_plane.secrets {
        floor::apply(client, secret).await?;
    }
    let mut summaries = Vec::new();
    for objects in &control_plane.components {
        // The resource that owns this component's objects (by their owner reference).
        let owner = objects
            .first()
            .and_then(|o| o["metadata"]["ownerReferences"][0]["name"].as_str())
            .unwrap_or_default();
        let resource = owners
            .iter()
            .find_map(|(_, name, _, resource)| (name == owner).then_some(resource))
            .ok_or_else(|| format!("no component resource {owner} was rendered"))?;
        for object in objects {
            floor::apply(client, &with_owner_uids(object, &owner_uids)).await?;
        }
        floor::wait_ready(objects, &mut ready).await?;
        let status = component_status(objects);
        write_status(
            client,
            resource,
            serde_json::to_value(&status).map_err(|e| e.to_string())?,
        )
        .await?;
        publish_ready_event(client, resource).await?;
        summaries.push(ComponentSummary {
            name: resource.name_any(),
            ready: true,
            replicas: 1,
            ready_replicas: 1,
            version: status.version,
        });
    }
    let ncp_object: DynamicObject =
        serde_json::from_value(serde_json::to_value(&ncp).map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    let status = control_plane_status(summaries);
    write_status(
        client,
        &ncp_object,
        serde_json::to_value(&status).map_err(|e| e.to_string())?,
    )
    .await?;
    publish_ready_event(client, &ncp_object).await
}

/// The field of a NestedControlPlane's spec that references a component resource of `kind`.
fn reference_field(kind: &str) -> &'static str {
    match kind {
        "NestedEtcd" => "etcd",
        "NestedAPIServer" => "apiserver",
        _ => "controllerManager",
    }
}

/// `object` with the uid of each owner it references filled in from `owners` (kind, name,
/// uid); rendered offline, its references have none.
fn with_owner_uids(object: &Value, owners: &[(&str, &str, &str)]) -> Value {
    let mut object = object.clone();
    if let Some(references) = object["metadata"]["ownerReferences"].as_array_mut() {
        for reference in references {
            let owner = owners
                .iter()
                .find(|(kind, name, _)| reference["kind"] == *kind && reference["name"] == *name);
            if let Some((_, _, uid)) = owner {
                reference["uid"] = Value::from(*uid);
            }
        }
    }
    object
}

async fn create(client: &kube::Client, object: &Value) -> Result<DynamicObject, String> {
    let object: DynamicObject =
        serde_json::from_value(object.clone()).map_err(|e| format!("a rendered resource: {e}"))?;
    let api = dynamic_api(client, &object)?;
    api.create(&PostParams::default(), &object)
        .await
        .map_err(|e| format!("creating {}: {e}", object.name_any()))
}

/// Server-side applies `status` to `object`'s status subresource, as capn does.
async fn write_status(client: &kube::Client, object: &DynamicObject, status: Value) -> Result<(), String> {
    let types = object.types.clone().unwrap_or_default();
    let patch = json!({"apiVersion": types.api_version, "kind": types.kind, "status": status});
    dynamic_api(client, object)?
        .patch_status(
            &object.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(|e| format!("writing the status of {}: {e}", object.name_any()))?;
    Ok(())
}

/// One `events.k8s.io/v1` Event saying `object` is ready, shaped as capn's recorder's.
async fn publish_ready_event(client: &kube::Client, object: &DynamicObject) -> Result<(), String> {
    let name = object.name_any();
    let types = object.types.clone().unwrap_or_default();
    let now = Timestamp::now();
    let event: Event = serde_json::from_value(json!({
        // As client-go names them: the object's name and the time in hexadecimal.
        "metadata": {"name": format!("{name}.{:x}", now.as_nanosecond())},
        "eventTime": now.to_string(),
        "type": "Normal",
        "reason": "Ready",
        "action": "Reconcile",
        "note": format!("{} {name} is ready", types.kind),
        "reportingController": "capn",
        "reportingInstance": "bench-design-floor",
        "regarding": {
            "apiVersion": types.api_version,
            "kind": types.kind,
            "name": name,
            "namespace": object.namespace(),
            "uid": object.uid(),
        },
    }))
    .map_err(|e| format!("an Event: {e}"))?;
    Api::<Event>::namespaced(client.clone(), &object.namespace().unwrap_or_default())
        .create(&PostParams::default(), &event)
        .await
        .map_err(|e| format!("creating an Event about {name}: {e}"))?;
    Ok(())
}

/// A component's status once its one member is ready: what capn writes then.
fn component_status(objects: &[Value]) -> ComponentStatus {
    let now = Time(Timestamp::now());
    let mut conditions = Vec::new();
    for (type_, value, reason, message) in [
        (status::READY, true, Reason::Ready, "1/1 members ready"),
        (status::SYNCED, true, Reason::Applied, "every object applied"),
        (
            status::ROLLING_OUT,
            false,
            Reason::NotRollingOut,
            "every member runs the current spec",
        ),
    ] {
        status::set_condition(
            &mut conditions,
            ConditionUpdate::new(type_, value, reason, message),
            Some(1),
            &now,
        );
    }
    let label = |key: &str| {
        objects
            .iter()
            .find_map(|o| o["metadata"]["labels"][key].as_str())
            .map(str::to_owned)
    };
    ComponentStatus {
        ready: true,
        phase: Some(status::phase::READY.to_owned()),
        observed_generation: Some(1),
        conditions,
        version: label("app.kubernetes.io/version"),
        channel: Some("stable".to_owned()),
        replicas: Some(1),
        ready_replicas: Some(1),
        replicas_display: Some("1/1".to_owned()),
        inventory: objects
            .iter()
            .map(|o| InventoryEntry {
                api_version: o["apiVersion"].as_str().unwrap_or_default().to_owned(),
                kind: o["kind"].as_str().unwrap_or_default().to_owned(),
                name: o["metadata"]["name"].as_str().unwrap_or_default().to_owned(),
            })
            .collect(),
        ..ComponentStatus::default()
    }
}

/// The control plane's status once its three components are ready: what capn writes then.
fn control_plane_status(summaries: Vec<ComponentSummary>) -> NestedControlPlaneStatus {
    let now = Time(Timestamp::now());
    let mut conditions = Vec::new();
    for (type_, value, reason) in [
        (status::READY, true, Reason::Ready),
        (status::AVAILABLE, true, Reason::Available),
        (status::ROLLING_OUT, false, Reason::NotRollingOut),
        (status::PAUSED, false, Reason::NotPaused),
        (status::CERTIFICATES_AVAILABLE, true, Reason::CertificatesAvailable),
        (status::ETCD_READY, true, Reason::Ready),
        (status::APISERVER_READY, true, Reason::Ready),
        (status::CONTROLLER_MANAGER_READY, true, Reason::Ready),
    ] {
        status::set_condition(
            &mut conditions,
            ConditionUpdate::new(type_, value, reason, ""),
            Some(1),
            &now,
        );
    }
    // The control plane's version is its apiserver's (the second component).
    let version = summaries.get(1).and_then(|s| s.version.clone());
    let mut summaries = summaries.into_iter();
    NestedControlPlaneStatus {
        ready: true,
        initialized: true,
        initialization: Some(ControlPlaneInitialization {
            control_plane_initialized: true,
        }),
        external_managed_control_plane: true,
        version,
        replicas: Some(1),
        ready_replicas: Some(1),
        updated_replicas: Some(1),
        up_to_date_replicas: Some(1),
        unavailable_replicas: Some(0),
        components: Some(ComponentsStatus {
            etcd: summaries.next(),
            apiserver: summaries.next(),
            controller_manager: summaries.next(),
        }),
        observed_generation: Some(2),
        conditions,
        ..NestedControlPlaneStatus::default()
    }
}
