//! Runner adaptation 12: Pod objects for the runner's pods, bound to a Node of the runner's
//! whose kubelet API serves them, so that a client outside the pod network reaches them
//! through the super cluster's API (`pods/portforward`, `pods/exec`, `pods/log`) as it
//! would on a real node: what capn does when the tenants' in-cluster names do not resolve
//! where it runs (`capn::reach`).
//!
//! - The Node `capn-runner-<host link>`: `spec.unschedulable` (the scheduler places nothing
//!   on it), its InternalIP the runner's host-side address, its `kubeletEndpoint` the
//!   node's kubelet port there, served by the same kubelet API as the node's (node
//!   adaptation 6). Owned by the runner's Namespace, so it goes with it; otherwise it stays
//!   (without heartbeat, unschedulable) until the test cluster ends.
//! - For each pod the runner runs, once it has an address: a Pod of the same name, as the
//!   StatefulSet controller would make it (the template, the claim volumes, hostname and
//!   subdomain, the set as controlling owner, the pod-name and revision labels), bound to
//!   that Node, with the status the kubelet would write (Running, its IP, Ready as its
//!   containers are). Its `terminationGracePeriodSeconds` is 0: nothing here waits for a
//!   kubelet's confirmation, so a deletion (capn's, after clearing a member's claim; the
//!   namespace's) is immediate; the runner then makes the object again while the pod runs.
//!   It does not shorten a pod's graceful shutdown, which the runner gives the process from
//!   the template (SIGTERM, SIGKILL after its `terminationGracePeriodSeconds`); the object of
//!   a pod the runner deletes goes at once, so the super cluster's endpoints drop it as they
//!   stop counting a terminating pod ready (what the apiserver's surge relies on: design §5).
//!   The objects do not drive the runner: it runs what the StatefulSets say, as before.
//!   `priorityClassName` is left out (the tests install no PriorityClass, which pod
//!   admission requires and StatefulSet admission does not).
//! - The namespace's `default` ServiceAccount, which admission requires of a pod (the super
//!   cluster runs no ServiceAccount controller).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};
use serde_json::json;

/// The label on the runner's Pod objects (its watch selects them).
pub(super) const LABEL: &str = "capn.test/runner-pod";
/// Field manager of the Pod objects and the Node.
const MANAGER: &str = "capn-runner";

/// The Node of the runner whose pod network's host link is `host_link`.
pub(super) fn node_name(host_link: &str) -> String {
    format!("capn-runner-{host_link}")
}

/// Registers the runner's Node `name` at `address` (see the module documentation).
///
/// # Errors
/// When the API server refuses.
pub(super) async fn register_node(
    client: &Client,
    name: &str,
    address: Ipv4Addr,
    namespace: &str,
) -> Result<(), String> {
    let nodes: Api<Node> = Api::all(client.clone());
    let params = PatchParams::apply(MANAGER).force();
    let owner = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .get(namespace)
        .await
        .map_err(|e| format!("cannot read Namespace {namespace}: {e}"))?;
    let node = json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, LABEL: "true"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Namespace", "name": namespace,
                "uid": owner.metadata.uid.unwrap_or_default()}]},
        "spec": {"unschedulable": true}});
    nodes
        .patch(name, &params, &Patch::Apply(&node))
        .await
        .map_err(|e| format!("cannot register Node {name}: {e}"))?;
    let status = json!({"apiVersion": "v1", "kind": "Node", "status": {
        "addresses": [
            {"type": "InternalIP", "address": address.to_string()},
            {"type": "Hostname", "address": name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": super::node::objects::KUBELET_PORT}},
    }});
    nodes
        .patch_status(name, &params, &Patch::Apply(&status))
        .await
        .map_err(|e| format!("cannot write the status of Node {name}: {e}"))?;
    Ok(())
}

/// Creates the `default` ServiceAccount of `namespace` unless it exists.
///
/// # Errors
/// When the API server refuses for another reason.
pub(super) async fn ensure_service_account(client: &Client, namespace: &str) -> Result<(), String> {
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "default"}})).map_err(|e| e.to_string())?;
    match Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &account)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(format!("cannot create the default ServiceAccount of {namespace}: {e}")),
    }
}

/// What one running pod's object says.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Desired {
    pub name: String,
    pub revision: String,
    pub labels: BTreeMap<String, String>,
    pub subdomain: String,
    /// The StatefulSet's name and uid.
    pub set: (String, String),
    pub ip: Ipv4Addr,
    pub ready: bool,
}

/// Makes the Pod objects of `namespace` say what `desired` says: each made (again) when
/// missing or of another revision, its status written when its address or readiness
/// differs, and the objects of pods the runner no longer runs deleted. `have` is the watch
/// of the objects; `sets` the StatefulSets (their templates). Returns the failures.
pub(super) async fn sync(
    client: &Client,
    namespace: &str,
    node: &str,
    host_ip: Ipv4Addr,
    desired: &[Desired],
    sets: &[std::sync::Arc<StatefulSet>],
    have: &Store<Pod>,
) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let params = PatchParams::apply(MANAGER).force();
    let immediately = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    let mut failures = Vec::new();
    let current: BTreeMap<String, std::sync::Arc<Pod>> = have
        .state()
        .into_iter()
        .filter(|p| p.namespace().as_deref() == Some(namespace))
        .map(|p| (p.name_any(), p))
        .collect();
    for want in desired {
        let object = current.get(&want.name);
        let revision_of = |p: &Pod| p.labels().get("controller-revision-hash").cloned().unwrap_or_default();
        if let Some(old) = object.filter(|p| revision_of(p) != want.revision) {
            // A rolled pod: its spec cannot change in place.
            let _ = pods.delete(&old.name_any(), &immediately).await;
            continue;
        }
        if object.is_none() {
            let Some(set) = sets
                .iter()
                .find(|s| s.metadata.uid.as_deref() == Some(want.set.1.as_str()))
            else {
                continue;
            };
            if let Err(e) = pods
                .patch(&want.name, &params, &Patch::Apply(pod(want, set, node)))
                .await
            {
                failures.push(format!("Pod object {}: {e}", want.name));
                continue;
            }
        }
        let status_now = object.and_then(|p| p.status.as_ref());
        let ip_now = status_now.and_then(|s| s.pod_ip.clone());
        let ready_now = status_now
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        if object.is_some() && ip_now.as_deref() == Some(want.ip.to_string().as_str()) && ready_now == want.ready {
            continue;
        }
        if let Err(e) = pods
            .patch_status(&want.name, &params, &Patch::Apply(status(want, host_ip)))
            .await
        {
            failures.push(format!("status of Pod object {}: {e}", want.name));
        }
    }
    for name in current.keys().filter(|n| !desired.iter().any(|d| &d.name == *n)) {
        match pods.delete(name, &immediately).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => failures.push(format!("deleting Pod object {name}: {e}")),
        }
    }
    failures
}

/// The Pod object of `want`, from its StatefulSet `set`'s template.
fn pod(want: &Desired, set: &StatefulSet, node: &str) -> serde_json::Value {
    let spec = set.spec.as_ref();
    let mut pod_spec = spec.and_then(|s| s.template.spec.clone()).unwrap_or_default();
    pod_spec.node_name = Some(node.to_owned());
    pod_spec.hostname = Some(want.name.clone());
    pod_spec.subdomain = Some(want.subdomain.clone()).filter(|s| !s.is_empty());
    pod_spec.termination_grace_period_seconds = Some(0);
    pod_spec.automount_service_account_token = Some(false);
    // The tests install no PriorityClass (StatefulSets are not admitted as pods are).
    pod_spec.priority_class_name = None;
    pod_spec.priority = None;
    let volumes = pod_spec.volumes.get_or_insert_with(Vec::new);
    for claim in spec
        .and_then(|s| s.volume_claim_templates.as_ref())
        .into_iter()
        .flatten()
    {
        let template = claim.name_any();
        volumes.push(
            serde_json::from_value(json!({"name": template,
                "persistentVolumeClaim": {"claimName": format!("{template}-{}", want.name)}}))
            .unwrap_or_default(),
        );
    }
    let mut labels = want.labels.clone();
    labels.insert(LABEL.to_owned(), "true".to_owned());
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": want.name, "labels": labels,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": want.set.0,
                "uid": want.set.1, "controller": true, "blockOwnerDeletion": true}]},
        "spec": pod_spec})
}

/// The status the kubelet would write for `want` on the node at `host_ip`.
fn status(want: &Desired, host_ip: Ipv4Addr) -> serde_json::Value {
    let ready = if want.ready { "True" } else { "False" };
    json!({"apiVersion": "v1", "kind": "Pod", "status": {
    "phase": "Running",
    "hostIP": host_ip.to_string(),
    "podIP": want.ip.to_string(),
    "podIPs": [{"ip": want.ip.to_string()}],
    "conditions": [
        {"type": "PodScheduled", "status": "True"},
        {"type": "Initialized", "status": "True"},
        {"type": "ContainersReady", "status": ready},
        {"type": "Ready", "status": ready},
    ]}})
}
