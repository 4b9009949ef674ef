//! One port-forward listener: each connection to it is one `pods/portforward` stream to a
//! pod serving the target, chosen when the connection opens.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, ListParams};
use tokio::net::{TcpListener, TcpStream};

use super::target::{Target, pod_port};
use crate::telemetry::Metrics;

/// A port-forward listener on `bind` (port 0: a free one) for `target`'s `port`: each
/// connection is one `pods/portforward` stream through `client` (an HTTP/1.1 client of the
/// super cluster, [`crate::client::upgrade_client`]) to a pod serving the target when the
/// connection opens, so the listener follows the pods across rolls. Returns the bound
/// address and the task serving it (abort it to close the listener). [`super::Reach`] opens
/// one per target and port on `127.0.0.1`; `capn connect` one of its own. `connections`
/// counts the listener's connections (`capn connect --idle-timeout` reads it).
///
/// # Errors
/// `bind` cannot be bound.
pub async fn listen(
    client: kube::Client,
    target: Target,
    port: u16,
    bind: SocketAddr,
    metrics: Arc<Metrics>,
    connections: Arc<Connections>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(bind).await?;
    let address = listener.local_addr()?;
    let warned = Arc::new(Warned::default());
    let task = tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((socket, _)) => {
                    let (client, target, metrics) = (client.clone(), target.clone(), metrics.clone());
                    let warned = warned.clone();
                    let open = Connections::opened(&connections);
                    tokio::spawn(async move {
                        relay(client, target, port, socket, &metrics, &warned).await;
                        drop(open);
                    });
                }
                Err(error) => tracing::warn!(%error, %target, port, "port-forward listener: accept failed"),
            }
        }
    });
    Ok((address, task))
}

/// The connections of one listener: how many are open now, and how many it accepted in
/// all. Two counters, no more: enough to tell that a listener has been idle for a while.
#[derive(Debug, Default)]
pub struct Connections {
    open: AtomicUsize,
    accepted: AtomicU64,
}

impl Connections {
    /// The connections open now (accepted and not yet closed).
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// The connections accepted since the listener opened, closed ones included.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Counts one accepted connection, open until the returned guard is dropped (also when
    /// its task is aborted).
    fn opened(this: &Arc<Self>) -> OpenConnection {
        this.accepted.fetch_add(1, Ordering::Relaxed);
        this.open.fetch_add(1, Ordering::Relaxed);
        OpenConnection(this.clone())
    }
}

/// One open connection of [`Connections`]; dropping it closes it in the count.
struct OpenConnection(Arc<Connections>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Copies `socket` both ways through a new port-forward; a failure closes the socket (the
/// client sees its connection end) and is logged with the target, pod and port.
async fn relay(
    client: kube::Client,
    target: Target,
    port: u16,
    mut socket: TcpStream,
    metrics: &Metrics,
    warned: &Warned,
) {
    let pods = Api::<Pod>::namespaced(client.clone(), target.namespace());
    let opened = async {
        let (pod, pod_port) = pick(&client, &target, port).await?;
        let mut forwarder = pods
            .portforward(&pod, &[pod_port])
            .await
            .map_err(|e| format!("pods/portforward of {}/{pod} port {pod_port}: {e}", target.namespace()))?;
        let stream = forwarder.take_stream(pod_port).ok_or_else(|| {
            format!(
                "pods/portforward of {}/{pod}: no stream for port {pod_port}",
                target.namespace()
            )
        })?;
        Ok::<_, String>((forwarder, stream))
    };
    match opened.await {
        Ok((forwarder, mut stream)) => {
            metrics.count_tenant_connection("port-forward", true);
            let _ = tokio::io::copy_bidirectional(&mut socket, &mut stream).await;
            drop(stream);
            let _ = forwarder.join().await;
        }
        Err(error) => {
            metrics.count_tenant_connection("port-forward", false);
            if warned.again() {
                tracing::warn!(%target, port, %error, "could not reach a tenant through the super cluster \
                    (more failures of this listener within a minute are logged at debug level)");
            } else {
                tracing::debug!(%target, port, %error, "could not reach a tenant through the super cluster");
            }
        }
    }
}

/// How often a listener's failed forwards are logged as warnings: an apiserver roll fails
/// every connection until the new pod is ready (30 in a one-replica roll), which is one
/// story, not thirty (`capn_tenant_connections_total` still counts each).
const WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// When a listener last warned.
#[derive(Default)]
struct Warned(std::sync::Mutex<Option<std::time::Instant>>);

impl Warned {
    /// Whether to warn now: not within [`WARN_EVERY`] of the last warning.
    fn again(&self) -> bool {
        let mut last = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = std::time::Instant::now();
        let loud = last.is_none_or(|at| now.duration_since(at) >= WARN_EVERY);
        if loud {
            *last = Some(now);
        }
        loud
    }
}

/// The pod that serves `target`'s `port` now, and the pod's port for it.
async fn pick(client: &kube::Client, target: &Target, port: u16) -> Result<(String, u16), String> {
    let pods = Api::<Pod>::namespaced(client.clone(), target.namespace());
    match target {
        Target::Pod { name, .. } => Ok((name.clone(), port)),
        Target::PodIp { ip, .. } => {
            let params = ListParams::default().fields(&format!("status.podIP={ip}"));
            let pod = first_serving(&pods, &params, target)
                .await?
                .ok_or_else(|| format!("no running pod is {target}"))?;
            Ok((pod.metadata.name.unwrap_or_default(), port))
        }
        Target::Service { namespace, name } => {
            let service = Api::<Service>::namespaced(client.clone(), namespace)
                .get(name)
                .await
                .map_err(|e| format!("reading {target}: {e}"))?;
            let selector = service
                .spec
                .as_ref()
                .and_then(|s| s.selector.as_ref())
                .filter(|s| !s.is_empty())
                .map(|s| s.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","))
                .ok_or_else(|| format!("{target} has no selector: no pod to forward to"))?;
            let pod = first_serving(&pods, &ListParams::default().labels(&selector), target)
                .await?
                .ok_or_else(|| format!("no ready pod behind {target} (selector {selector})"))?;
            let pod_port = pod_port(&service, &pod, port).map_err(|e| format!("{target}: {e}"))?;
            Ok((pod.metadata.name.unwrap_or_default(), pod_port))
        }
    }
}

/// The first pod `params` lists that [`serves`].
async fn first_serving(pods: &Api<Pod>, params: &ListParams, target: &Target) -> Result<Option<Pod>, String> {
    let found = pods
        .list(params)
        .await
        .map_err(|e| format!("listing the pods of {target}: {e}"))?;
    Ok(found.items.into_iter().find(serves))
}

/// Whether `pod` serves: running, ready and not going away.
fn serves(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    pod.metadata.deletion_timestamp.is_none()
        && status.and_then(|s| s.phase.as_deref()) == Some("Running")
        && status
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_warns_once_per_minute() {
        let warned = Warned::default();
        assert!(warned.again(), "the first failure warns");
        assert!(!warned.again(), "the next ones within a minute do not");
        *warned.0.lock().unwrap() = Some(std::time::Instant::now() - WARN_EVERY);
        assert!(warned.again(), "a minute later it warns again");
    }

    #[test]
    fn connections_are_counted_open_until_their_guard_goes() {
        let connections = Arc::new(Connections::default());
        let first = Connections::opened(&connections);
        let second = Connections::opened(&connections);
        assert_eq!((connections.open(), connections.accepted()), (2, 2));
        drop(first);
        drop(second);
        assert_eq!((connections.open(), connections.accepted()), (0, 2));
    }
}
