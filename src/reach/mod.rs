//! How capn reaches the tenants' apiservers and etcd members from wherever it runs
//! (docs/design.md §4, "Reaching tenants").
//!
//! capn dials a tenant by the in-cluster names it wrote into the tenant's kubeconfig and
//! certificates ([`target`]). In a super cluster, cluster DNS answers them and capn dials
//! them as they are (**direct**). Elsewhere (capn on a laptop, in CI, in another cluster)
//! they do not resolve, and capn reaches the pods behind them through the super cluster's
//! API instead (**port-forward**): for each target and port a listener on `127.0.0.1`,
//! each connection to it one `pods/portforward` stream to a pod that serves the target,
//! chosen when the connection opens (so an apiserver roll or an etcd member's new pod is
//! followed), as `kubectl port-forward` does. The client dials the listener and still
//! verifies the certificate for the in-cluster name (TLS stays end to end between capn and
//! the tenant), so nothing trusts the path. `--tenant-connection` chooses: `auto` (the
//! default) looks each name up once per [`DECISION_TTL`] and forwards the names that do not
//! resolve; `direct` and `port-forward` force one path. The path taken is logged when it is
//! first chosen for a name, and counted in `capn_tenant_connections_total` (by path and
//! result).
//!
//! Every dialler of a tenant goes through here: the tenant clients (public-CRD sync, the
//! syncer, the upgrade preflight's metrics per apiserver replica) and the etcd clients
//! (membership, backups, restores). `--etcd-hosts-file` still overrides a name when given
//! (the tests' stand-in for cluster DNS, which makes them take the direct path).

pub mod target;

mod forward;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

pub use forward::{Connections, listen};
pub use target::Target;

use crate::telemetry::Metrics;

/// How long the decision for one name (it resolves, or it does not) holds in `auto`.
pub const DECISION_TTL: Duration = Duration::from_secs(300);
/// How long a name's lookup may take before `auto` takes it as unresolvable.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(3);

/// How capn connects to tenants (`capn run --tenant-connection`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum TenantConnection {
    /// Direct where the in-cluster names resolve, port-forward where they do not.
    #[default]
    Auto,
    /// Always dial the names (capn runs in the super cluster).
    Direct,
    /// Always through the super cluster's `pods/portforward`.
    PortForward,
}

/// Whether `host` resolves here to at least one address within [`LOOKUP_TIMEOUT`] (`port`
/// only completes the lookup's socket address).
pub async fn resolves(host: &str, port: u16) -> bool {
    tokio::time::timeout(LOOKUP_TIMEOUT, tokio::net::lookup_host((host, port)))
        .await
        .ok()
        .and_then(Result::ok)
        .is_some_and(|mut found| found.next().is_some())
}

/// Errors of [`Reach`].
#[derive(Debug, thiserror::Error)]
pub enum ReachError {
    /// A port-forward was needed and capn has no client of the super cluster for it.
    #[error(
        "{host}:{port} does not resolve here and capn has no super-cluster client for a port-forward (see --tenant-connection)"
    )]
    NoClient { host: String, port: u16 },
    /// The local listener of a port-forward could not be opened.
    #[error("reaching {target} port {port}: cannot listen on 127.0.0.1: {source}")]
    Listen {
        target: String,
        port: u16,
        source: std::io::Error,
    },
}

/// The dialling rules of one capn process, shared by every dialler of a tenant.
pub struct Reach {
    mode: TenantConnection,
    /// The super cluster, over HTTP/1.1 (`pods/portforward` upgrades the connection).
    client: Option<kube::Client>,
    metrics: Arc<Metrics>,
    /// By name: whether it is forwarded, and since when that holds.
    decided: Mutex<HashMap<String, (bool, Instant)>>,
    /// By target and port: the local listener, and its task.
    forwards: Mutex<HashMap<(Target, u16), Listener>>,
}

/// A port-forward listener: its local address, and the task that serves it.
type Listener = (SocketAddr, tokio::task::JoinHandle<()>);

impl Reach {
    /// The rules for `mode`, forwarding through the super cluster at `super_config` (`None`:
    /// no port-forward is possible, and a name that needs one is an error).
    pub fn new(mode: TenantConnection, super_config: Option<kube::Config>, metrics: Arc<Metrics>) -> Self {
        let client = super_config.and_then(|config| match crate::client::upgrade_client(config) {
            Ok(client) => Some(client),
            Err(error) => {
                tracing::warn!(%error, "no super-cluster client for port-forwards to tenants");
                None
            }
        });
        Self {
            mode,
            client,
            metrics,
            decided: Mutex::default(),
            forwards: Mutex::default(),
        }
    }

    /// Where to dial `host:port`: `None` to dial it as it is; `Some(address)` to dial the
    /// local end of a port-forward instead, verifying the certificate for `host`. Names
    /// that are not in-cluster names ([`Target::of_name`]) and addresses are dialled as
    /// they are.
    ///
    /// # Errors
    /// [`ReachError`] when a port-forward is needed and cannot be set up.
    pub async fn dial(&self, host: &str, port: u16) -> Result<Option<SocketAddr>, ReachError> {
        let Some(target) = Target::of_name(host) else {
            return Ok(None);
        };
        if !self.forwarded(host).await {
            return Ok(None);
        }
        self.forward(host, target, port).await.map(Some)
    }

    /// Where to dial the pod address `ip:port` in `namespace`, which capn learnt from the
    /// tenant reached at `host` (an apiserver replica's advertised address): forwarded when
    /// `host` is and a port-forward is possible, else the address itself (a pod address
    /// needs no name to be dialled, and may well be routed where capn runs).
    ///
    /// # Errors
    /// As [`Reach::dial`].
    pub async fn dial_pod_ip(
        &self,
        host: &str,
        namespace: &str,
        ip: IpAddr,
        port: u16,
    ) -> Result<Option<SocketAddr>, ReachError> {
        if self.client.is_none() || Target::of_name(host).is_none() || !self.forwarded(host).await {
            return Ok(None);
        }
        let target = Target::PodIp {
            namespace: namespace.to_owned(),
            ip,
        };
        self.forward(&format!("{ip}"), target, port).await.map(Some)
    }

    /// Whether `host` is reached through a port-forward.
    async fn forwarded(&self, host: &str) -> bool {
        match self.mode {
            TenantConnection::Direct => return false,
            TenantConnection::PortForward => return true,
            TenantConnection::Auto => {}
        }
        if let Some((forwarded, _)) = self.decisions().get(host).filter(|(_, at)| at.elapsed() < DECISION_TTL) {
            return *forwarded;
        }
        let forwarded = !resolves(host, 0).await;
        let before = self
            .decisions()
            .insert(host.to_owned(), (forwarded, Instant::now()))
            .map(|(f, _)| f);
        if before != Some(forwarded) {
            let path = if forwarded { "port-forward" } else { "direct" };
            tracing::info!(%host, path, "tenant connection path chosen: {}", if forwarded {
                "the name does not resolve here; reaching it through the super cluster's pods/portforward"
            } else {
                "the name resolves; dialling it"
            });
        }
        forwarded
    }

    /// The local listener of `target`'s `port`, opened on first use.
    async fn forward(&self, host: &str, target: Target, port: u16) -> Result<SocketAddr, ReachError> {
        let key = (target, port);
        if let Some((address, task)) = self.listeners().get(&key)
            && !task.is_finished()
        {
            return Ok(*address);
        }
        let client = self.client.clone().ok_or_else(|| ReachError::NoClient {
            host: host.to_owned(),
            port,
        })?;
        let local = SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, 0));
        let (address, task) = forward::listen(client, key.0.clone(), port, local, self.metrics.clone(), Arc::default())
            .await
            .map_err(|source| ReachError::Listen {
                target: key.0.to_string(),
                port,
                source,
            })?;
        tracing::debug!(%host, port, target = %key.0, %address, "port-forward listener opened");
        let mut listeners = self.listeners();
        // Another caller may have opened one meanwhile: the first stays, this one goes.
        if let Some((existing, running)) = listeners.get(&key)
            && !running.is_finished()
        {
            task.abort();
            return Ok(*existing);
        }
        listeners.insert(key, (address, task));
        Ok(address)
    }

    fn decisions(&self) -> MutexGuard<'_, HashMap<String, (bool, Instant)>> {
        self.decided.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn listeners(&self) -> MutexGuard<'_, HashMap<(Target, u16), Listener>> {
        self.forwards.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl std::fmt::Debug for Reach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reach")
            .field("mode", &self.mode)
            .field("port_forward", &self.client.is_some())
            .finish_non_exhaustive()
    }
}

impl Drop for Reach {
    fn drop(&mut self) {
        for (_, task) in self.listeners().values() {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn names_that_are_not_in_cluster_names_and_the_direct_mode_dial_as_they_are() {
        let reach = Reach::new(TenantConnection::PortForward, None, Arc::default());
        assert!(matches!(reach.dial("api.example.com", 443).await, Ok(None)));
        let direct = Reach::new(TenantConnection::Direct, None, Arc::default());
        assert!(matches!(
            direct.dial("demo-apiserver.tenant-a.svc", 443).await,
            Ok(None)
        ));
    }

    #[tokio::test]
    async fn a_forward_without_a_super_cluster_client_names_the_host_and_the_flag() {
        let reach = Reach::new(TenantConnection::PortForward, None, Arc::default());
        let error = reach.dial("demo-apiserver.tenant-a.svc", 443).await.unwrap_err();
        let message = error.to_string();
        assert!(message.contains("demo-apiserver.tenant-a.svc:443"), "{message}");
        assert!(message.contains("--tenant-connection"), "{message}");
    }

    #[tokio::test]
    async fn auto_dials_a_name_that_resolves_and_remembers_it() {
        let reach = Reach::new(TenantConnection::Auto, None, Arc::default());
        // `localhost.svc` is no in-cluster name; `localhost` resolves everywhere.
        assert!(!reach.forwarded("localhost").await);
        assert_eq!(reach.decisions().get("localhost").map(|(f, _)| *f), Some(false));
    }
}
