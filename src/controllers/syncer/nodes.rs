//! The tenant's Nodes: one for each super node that runs a tenant pod, made when the first
//! pod is bound to it and removed when none is left (docs/design.md §11); with
//! `spec.workloads.nodes.mode: Schedulable`, also one for each schedulable super node its
//! selector matches, at all times (read once a minute, [`schedulable`]). A tenant Node
//! carries what scheduling and `kubectl get nodes` need (the well-known labels, capacity,
//! allocatable, node info and the `Ready` condition) and the super node's `InternalIP` and
//! `ExternalIP` (where its pods run and its node ports answer); when capn serves the kubelet
//! API (`crate::kubelet`), capn's endpoint for it as `InternalDNS` with its port as the
//! kubelet endpoint, which is where the tenant apiserver asks for logs. The syncer renews its Lease in `kube-node-lease` as the kubelet
//! does (every 10 seconds, for 40), so the tenant's node lifecycle controller sees a
//! healthy node and never evicts its pods; its `Ready` condition follows the super node's.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use std::net::SocketAddr;

use k8s_openapi::api::core::v1::{DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::ObjectRef;

use super::scope::{TENANT_FIELD_MANAGER, Tenant, typed};

/// Label on every tenant Node the syncer made.
pub const VIRTUAL_NODE_LABEL: &str = "tenancy.x-k8s.io/virtual-node";
/// The super node labels a tenant Node carries (where the pod runs, for topology spread
/// and affinity; nothing that identifies super-cluster infrastructure beyond that).
const COPIED_LABELS: [&str; 6] = [
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
];
/// How often the Leases are renewed (the kubelet's `nodeLeaseRenewInterval`: a quarter of
/// the 40-second lease).
const RENEW_EVERY: Duration = Duration::from_secs(10);
/// The Lease's duration (the kubelet's `nodeLeaseDurationSeconds`).
const LEASE_SECONDS: i32 = 40;
/// How often the `Ready` condition is read again from the super node.
const STATUS_EVERY: u32 = 6;
/// A Node younger than this is never removed as unused: the pod bound to it may not be in
/// the watch cache yet.
const GRACE: Duration = Duration::from_secs(60);

/// The tenant Node for the super node `super_node`, whose kubelet API is capn's at
/// `kubelet` (none: the Node announces only its hostname).
pub(super) fn tenant_node(super_node: &Node, now: Timestamp, kubelet: Option<SocketAddr>) -> Node {
    let name = super_node.name_any();
    let mut labels: std::collections::BTreeMap<String, String> = super_node
        .labels()
        .iter()
        .filter(|(k, _)| COPIED_LABELS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    labels.insert(VIRTUAL_NODE_LABEL.to_owned(), "true".to_owned());
    let status = super_node.status.clone().unwrap_or_default();
    Node {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(NodeStatus {
            capacity: status.capacity,
            allocatable: status.allocatable,
            node_info: status.node_info,
            conditions: Some(ready(super_node, now)),
            addresses: Some(addresses(&name, super_node, kubelet)),
            daemon_endpoints: daemon_endpoints(kubelet),
            ..NodeStatus::default()
        }),
    }
}

/// The address type under which a tenant Node names capn's kubelet API, first in the
/// tenant apiserver's `--kubelet-preferred-address-types` (the `stable` channel's): the
/// apiserver then asks capn for logs, exec and port-forward, while `InternalIP` stays the
/// super node's. Its value is an IP address, which the apiserver dials as it would a name.
pub const KUBELET_ADDRESS_TYPE: &str = "InternalDNS";

/// A tenant Node's addresses (issue 36, "node-level fidelity"): the super node's
/// `InternalIP` and `ExternalIP` addresses, where the tenant's pods on it run (their
/// `status.hostIP`) and its node ports answer; capn's kubelet API endpoint, if any, as
/// [`KUBELET_ADDRESS_TYPE`]; and the hostname. The super node's own DNS names are not shown
/// (they name the platform's machines, and the type is capn's).
fn addresses(name: &str, super_node: &Node, kubelet: Option<SocketAddr>) -> Vec<NodeAddress> {
    let super_addresses = super_node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .into_iter()
        .flatten()
        .filter(|a| a.type_ == "InternalIP" || a.type_ == "ExternalIP")
        .cloned();
    let kubelet = kubelet.map(|k| NodeAddress {
        type_: KUBELET_ADDRESS_TYPE.to_owned(),
        address: k.ip().to_string(),
    });
    super_addresses
        .chain(kubelet)
        .chain([NodeAddress {
            type_: "Hostname".to_owned(),
            address: name.to_owned(),
        }])
        .collect()
}

fn daemon_endpoints(kubelet: Option<SocketAddr>) -> Option<NodeDaemonEndpoints> {
    kubelet.map(|k| NodeDaemonEndpoints {
        kubelet_endpoint: Some(DaemonEndpoint {
            port: i32::from(k.port()),
        }),
    })
}

/// The super node's `Ready` condition, heartbeat now (`Unknown` when it reports none).
fn ready(super_node: &Node, now: Timestamp) -> Vec<NodeCondition> {
    let reported = super_node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready").cloned())
        .unwrap_or(NodeCondition {
            type_: "Ready".to_owned(),
            status: "Unknown".to_owned(),
            reason: Some("NodeStatusUnknown".to_owned()),
            ..NodeCondition::default()
        });
    vec![NodeCondition {
        last_heartbeat_time: Some(Time(now)),
        ..reported
    }]
}

/// Whether a tenant pod could be scheduled on `super_node` (`spec.workloads.nodes.mode:
/// Schedulable`): `Ready`, not cordoned, and without a `NoSchedule` or `NoExecute` taint.
/// A tenant pod tolerates none of those: the syncer keeps only the tolerations of an
/// unhealthy node's taints (`crate::syncer::pod::placement::TOLERATION_KEYS`), which a
/// `Ready` node does not carry. `PreferNoSchedule` only scores, so it does not count.
pub(super) fn schedulable(super_node: &Node) -> bool {
    let spec = super_node.spec.as_ref();
    let cordoned = spec.and_then(|s| s.unschedulable).unwrap_or(false);
    let tainted = spec
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .any(|t| t.effect == "NoSchedule" || t.effect == "NoExecute");
    let ready = super_node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    ready && !cordoned && !tainted
}

/// The schedulable super nodes `selector` matches, by name (one list request).
///
/// # Errors
/// The super nodes cannot be listed.
async fn schedulable_super_nodes(
    tenant: &Tenant,
    selector: &kube::core::Selector,
) -> Result<BTreeMap<String, Node>, kube::Error> {
    let listed = Api::<Node>::all(tenant.super_client.clone())
        .list(&ListParams::default().labels_from(selector))
        .await?;
    Ok(listed
        .items
        .into_iter()
        .filter(schedulable)
        .map(|n| (n.name_any(), n))
        .collect())
}

/// Makes the tenant Node `name` (and its Lease) unless it exists; `listed` is its super
/// node when the caller has read it already.
///
/// # Errors
/// The super node cannot be read, or the tenant refuses the Node.
pub(super) async fn ensure(tenant: &Tenant, name: &str, listed: Option<&Node>) -> Result<(), kube::Error> {
    if tenant.tenant_nodes.get(&ObjectRef::new(name)).is_some() {
        return Ok(());
    }
    // Pods bound at once to a new node make it once: the others wait here, then find it
    // made (the cache may not show it yet).
    let mut made = tenant.nodes_made.lock().await;
    if made.contains(name) {
        return Ok(());
    }
    let super_node = match listed {
        Some(node) => node.clone(),
        None => Api::<Node>::all(tenant.super_client.clone()).get(name).await?,
    };
    let node = tenant_node(&super_node, Timestamp::now(), tenant.kubelet);
    let nodes = Api::<Node>::all(tenant.tenant_client.clone());
    // A Node keeps the status it is created with (the kubelet registers that way).
    let created = match nodes.create(&PostParams::default(), &node).await {
        Ok(created) => created,
        Err(kube::Error::Api(e)) if e.code == 409 => nodes.get(name).await?,
        Err(e) => return Err(e),
    };
    renew(tenant, &created).await?;
    made.insert(name.to_owned());
    Ok(())
}

/// Renews the Lease of the tenant Node `node` (creating it, owned by the Node as the
/// kubelet's is).
async fn renew(tenant: &Tenant, node: &Node) -> Result<(), kube::Error> {
    let name = node.name_any();
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some("kube-node-lease".to_owned()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".to_owned(),
                kind: "Node".to_owned(),
                name: name.clone(),
                uid: node.metadata.uid.clone().unwrap_or_default(),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(name.clone()),
            lease_duration_seconds: Some(LEASE_SECONDS),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..LeaseSpec::default()
        }),
    };
    Api::<Lease>::namespaced(tenant.tenant_client.clone(), "kube-node-lease")
        .patch(
            &name,
            &PatchParams::apply(TENANT_FIELD_MANAGER).force(),
            &Patch::Apply(typed(&lease)),
        )
        .await?;
    Ok(())
}

/// Runs forever: renews every tenant Node's Lease, follows the super nodes' `Ready`, shows
/// the schedulable super nodes (`Schedulable` mode: listed with the status, once a minute),
/// and removes the Nodes no tenant pod is bound to any more and that are not shown. A
/// failure is logged and tried again at the next tick: a tenant apiserver that is down
/// holds up only this tenant.
pub(super) async fn heartbeats(tenant: &Tenant) {
    // Both caches filled first: a Node is judged unused only against every pod.
    if tenant.tenant_nodes.wait_until_ready().await.is_err() || tenant.tenant_pods.wait_until_ready().await.is_err() {
        return;
    }
    let mut tick = tokio::time::interval(RENEW_EVERY);
    // The first round refreshes the status too: a capn that just started (another replica,
    // another port) announces its kubelet API at once, not a minute later.
    let mut round: u32 = STATUS_EVERY - 1;
    // The schedulable super nodes shown at the last status round.
    let mut shown = BTreeSet::new();
    loop {
        tick.tick().await;
        round = round.wrapping_add(1);
        let with_status = round.is_multiple_of(STATUS_EVERY);
        let listed = match &tenant.shown_nodes {
            Some(selector) if with_status => match schedulable_super_nodes(tenant, selector).await {
                Ok(listed) => Some(listed),
                Err(error) => {
                    tracing::info!(%error, "listing the schedulable super nodes failed");
                    None
                }
            },
            _ => None,
        };
        if let Some(listed) = &listed {
            shown = listed.keys().cloned().collect();
            for (name, super_node) in listed {
                if let Err(error) = ensure(tenant, name, Some(super_node)).await {
                    tracing::info!(%error, node = %name, "showing a schedulable super node failed");
                }
            }
        }
        let in_use: BTreeSet<String> = tenant
            .tenant_pods
            .state()
            .iter()
            .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
            .collect();
        for node in tenant.tenant_nodes.state() {
            let name = node.name_any();
            let result = if in_use.contains(&name) || shown.contains(&name) || young(&node) {
                let status = with_status.then(|| listed.as_ref().and_then(|l| l.get(&name)));
                beat(tenant, &node, status).await
            } else {
                remove(tenant, &node).await
            };
            if let Err(error) = result {
                tracing::info!(%error, node = %node.name_any(), "tenant Node heartbeat failed");
            }
        }
    }
}

fn young(node: &Node) -> bool {
    node.metadata.creation_timestamp.as_ref().is_none_or(|t| {
        Timestamp::now().duration_since(t.0) < k8s_openapi::jiff::SignedDuration::try_from(GRACE).unwrap_or_default()
    })
}

/// Renews `node`'s Lease; with `status` (`Some`: this round refreshes it, with its super
/// node when already listed) also its `Ready`, addresses and kubelet endpoint.
async fn beat(tenant: &Tenant, node: &Node, status: Option<Option<&Node>>) -> Result<(), kube::Error> {
    let super_node = if let Some(listed) = status {
        let found = match listed {
            Some(super_node) => Some(super_node.clone()),
            None => {
                Api::<Node>::all(tenant.super_client.clone())
                    .get_opt(&node.name_any())
                    .await?
            }
        };
        // A super node that is gone takes its tenant Node with it (the tenant's pod garbage
        // collector then removes the pods bound to it), rather than leaving it Ready.
        if found.is_none() {
            tracing::info!(node = %node.name_any(), "removing a tenant Node whose super node is gone");
            return remove(tenant, node).await;
        }
        found
    } else {
        None
    };
    renew(tenant, node).await?;
    if let Some(super_node) = super_node {
        // The kubelet endpoint too: another capn replica that took over announces its own.
        let patch = serde_json::json!({"status": {
            "conditions": ready(&super_node, Timestamp::now()),
            "addresses": addresses(&node.name_any(), &super_node, tenant.kubelet),
            "daemonEndpoints": daemon_endpoints(tenant.kubelet).unwrap_or_default(),
        }});
        Api::<Node>::all(tenant.tenant_client.clone())
            .patch_status(&node.name_any(), &PatchParams::default(), &Patch::Strategic(patch))
            .await?;
    }
    Ok(())
}

async fn remove(tenant: &Tenant, node: &Node) -> Result<(), kube::Error> {
    tenant.nodes_made.lock().await.remove(&node.name_any());
    match Api::<Node>::all(tenant.tenant_client.clone())
        .delete(&node.name_any(), &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Removes every tenant Node the syncer made, through `tenant_client` (when the tenant
/// stops syncing; see [`super`]).
///
/// # Errors
/// A failed request to the tenant.
pub(super) async fn remove_all(tenant_client: &kube::Client) -> Result<(), kube::Error> {
    Api::<Node>::all(tenant_client.clone())
        .delete_collection(
            &DeleteParams::default(),
            &kube::api::ListParams::default().labels(&format!("{VIRTUAL_NODE_LABEL}=true")),
        )
        .await
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_node_shows_capacity_readiness_and_where_its_pods_run() {
        let super_node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "worker-1", "labels": {
                "kubernetes.io/hostname": "worker-1", "kubernetes.io/os": "linux",
                "node-role.kubernetes.io/infra": "", "secret.example/rack": "r7"}},
            "status": {
                "capacity": {"cpu": "8", "pods": "110"},
                "allocatable": {"cpu": "7500m", "pods": "110"},
                "addresses": [
                    {"type": "InternalIP", "address": "10.0.0.7"},
                    {"type": "InternalDNS", "address": "ip-10-0-0-7.platform.internal"},
                    {"type": "ExternalIP", "address": "203.0.113.7"},
                    {"type": "Hostname", "address": "ip-10-0-0-7"}],
                "conditions": [
                    {"type": "MemoryPressure", "status": "False"},
                    {"type": "Ready", "status": "True", "reason": "KubeletReady"}]}
        }))
        .unwrap();
        let now = Timestamp::now();
        let node = tenant_node(&super_node, now, None);
        let labels = node.labels();
        assert_eq!(labels.get(VIRTUAL_NODE_LABEL).map(String::as_str), Some("true"));
        assert_eq!(labels.get("kubernetes.io/os").map(String::as_str), Some("linux"));
        assert!(!labels.contains_key("secret.example/rack") && !labels.contains_key("node-role.kubernetes.io/infra"));
        let status = node.status.unwrap();
        assert_eq!(status.allocatable.unwrap()["cpu"].0, "7500m");
        let pairs = |addresses: Vec<NodeAddress>| -> Vec<(String, String)> {
            addresses.into_iter().map(|a| (a.type_, a.address)).collect()
        };
        let pair = |t: &str, a: &str| (t.to_owned(), a.to_owned());
        assert_eq!(
            pairs(status.addresses.unwrap()),
            [
                pair("InternalIP", "10.0.0.7"),
                pair("ExternalIP", "203.0.113.7"),
                pair("Hostname", "worker-1")
            ],
            "the super node's IPs (its pods' hostIP, its node ports), never its DNS names"
        );
        let conditions = status.conditions.unwrap();
        assert_eq!(conditions.len(), 1);
        assert_eq!(
            (conditions[0].type_.as_str(), conditions[0].status.as_str()),
            ("Ready", "True")
        );
        assert_eq!(conditions[0].last_heartbeat_time, Some(Time(now)));
        assert_eq!(status.daemon_endpoints, None);
        // With capn's kubelet API, the Node names capn's endpoint under the type the tenant
        // apiserver prefers, never the super node's kubelet.
        let node = tenant_node(&super_node, now, Some("192.0.2.9:10250".parse().unwrap()));
        let status = node.status.unwrap();
        assert_eq!(
            pairs(status.addresses.unwrap()),
            [
                pair("InternalIP", "10.0.0.7"),
                pair("ExternalIP", "203.0.113.7"),
                pair(KUBELET_ADDRESS_TYPE, "192.0.2.9"),
                pair("Hostname", "worker-1")
            ]
        );
        assert_eq!(status.daemon_endpoints.unwrap().kubelet_endpoint.unwrap().port, 10250);
    }

    #[test]
    fn a_super_node_is_schedulable_when_ready_uncordoned_and_untainted_for_pods() {
        let node = |spec: serde_json::Value, ready: &str| -> Node {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "worker-1"},
                "spec": spec,
                "status": {"conditions": [{"type": "Ready", "status": ready}]}
            }))
            .unwrap()
        };
        let taint = |effect: &str| serde_json::json!({"taints": [{"key": "pool", "value": "infra", "effect": effect}]});
        assert!(schedulable(&node(serde_json::json!({}), "True")));
        assert!(
            schedulable(&node(taint("PreferNoSchedule"), "True")),
            "PreferNoSchedule only scores"
        );
        assert!(!schedulable(&node(serde_json::json!({}), "False")), "not Ready");
        assert!(!schedulable(&node(serde_json::json!({}), "Unknown")), "not Ready");
        assert!(
            !schedulable(&node(serde_json::json!({"unschedulable": true}), "True")),
            "cordoned"
        );
        assert!(
            !schedulable(&node(taint("NoSchedule"), "True")),
            "tenant pods drop tolerations"
        );
        assert!(!schedulable(&node(taint("NoExecute"), "True")));
        let silent: Node = serde_json::from_value(serde_json::json!({"metadata": {"name": "new"}})).unwrap();
        assert!(!schedulable(&silent), "a node that reports no Ready condition");
    }

    #[test]
    fn the_channel_prefers_the_address_type_of_capns_kubelet_api() {
        for release in ["1.35.4", "1.36.3", "1.37.2"] {
            let path = format!(
                "{}/channels/stable/{release}/apiserver/statefulset.yaml",
                env!("CARGO_MANIFEST_DIR")
            );
            let template = std::fs::read_to_string(&path).unwrap();
            let flag = template
                .lines()
                .find_map(|l| l.trim().strip_prefix("- --kubelet-preferred-address-types="))
                .unwrap_or_else(|| panic!("{path} sets no --kubelet-preferred-address-types"));
            assert_eq!(flag.split(',').next(), Some(KUBELET_ADDRESS_TYPE), "{path}");
        }
    }
}
