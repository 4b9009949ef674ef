//! A stand-in for the super cluster's scheduler and kubelet, for the pods of one
//! namespace: a Node object that reports `Ready`, every unscheduled pod bound to it, every
//! bound pod reported `Running` and ready with an address of its own, and every deleted pod
//! removed (the kubelet's final `gracePeriodSeconds: 0` delete). Nothing runs: this proves
//! what the syncer does with the super cluster's answers, not that a pod's processes run.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

/// See the module documentation; dropping it stops the stand-in and deletes the Node.
pub struct StandInNode {
    name: String,
    client: Client,
    task: tokio::task::JoinHandle<()>,
}

impl StandInNode {
    /// Registers the Node and starts standing in for the pods of `namespace`.
    pub async fn start(client: &Client, namespace: &str) -> Self {
        let name = format!("stand-in-{namespace}");
        let name = name.get(..63).unwrap_or(&name).trim_end_matches('-').to_owned();
        let now = Timestamp::now().to_string();
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
            "status": {
                "capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                    "lastHeartbeatTime": now, "lastTransitionTime": now}]}
        }))
        .unwrap();
        Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
        let task = tokio::spawn(stand_in(client.clone(), namespace.to_owned(), name.clone()));
        Self {
            name,
            client: client.clone(),
            task,
        }
    }

    /// The Node's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for StandInNode {
    fn drop(&mut self) {
        self.task.abort();
        let (client, name) = (self.client.clone(), self.name.clone());
        tokio::spawn(async move {
            let _ = Api::<Node>::all(client).delete(&name, &DeleteParams::default()).await;
        });
    }
}

/// Looks at the namespace's pods until aborted (a failed step is tried at the next look).
async fn stand_in(client: Client, namespace: String, node: String) {
    let pods = Api::<Pod>::namespaced(client, &namespace);
    let addresses = Arc::new(AtomicU32::new(1));
    loop {
        if let Ok(list) = pods.list(&ListParams::default()).await {
            for pod in list.items {
                let _ = step(&pods, &pod, &node, &addresses).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn step(pods: &Api<Pod>, pod: &Pod, node: &str, addresses: &AtomicU32) -> kube::Result<()> {
    let name = pod.name_any();
    if pod.metadata.deletion_timestamp.is_some() {
        pods.delete(
            &name,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            },
        )
        .await?;
        return Ok(());
    }
    let bound = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some();
    if !bound {
        let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}});
        pods.create_subresource::<_, serde_json::Value>("binding", &name, &PostParams::default(), &binding)
            .await?;
        return Ok(());
    }
    if pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
        return Ok(());
    }
    let n = addresses.fetch_add(1, Ordering::Relaxed);
    let ip = format!("10.244.{}.{}", n / 250, n % 250 + 1);
    let now = Timestamp::now().to_string();
    let containers: Vec<_> = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .map(|c| {
            json!({"name": c.name, "image": c.image, "imageID": "", "ready": true, "started": true,
            "restartCount": 0, "state": {"running": {"startedAt": now}}})
        })
        .collect();
    let conditions: Vec<_> = ["PodScheduled", "Initialized", "ContainersReady", "Ready"]
        .iter()
        .map(|t| json!({"type": t, "status": "True", "lastTransitionTime": now}))
        .collect();
    let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "10.0.0.1",
        "startTime": now, "conditions": conditions, "containerStatuses": containers}});
    pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}
