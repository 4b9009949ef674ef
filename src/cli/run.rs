//! `capn run`: the controllers, the metrics and probe server, and leader election.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use kube_lease_manager::LeaseManagerBuilder;

use crate::channel::ChannelRegistry;
use crate::controllers::{AbortOnDrop, Settings};
use crate::telemetry::{Metrics, serve};

/// How `capn run` coordinates with other instances.
#[derive(Clone, Debug)]
pub struct LeaderElection {
    /// Lease name (`capn-leader-election`).
    pub lease: String,
    /// Namespace of the Lease.
    pub namespace: String,
    /// This instance's identity (the pod name when known).
    pub identity: String,
    /// Seconds a lease stays valid after its last renewal.
    pub duration_seconds: u64,
}

/// Runs capn until SIGTERM/ctrl-c: serves metrics and probes, and runs the controllers, at
/// once or, with leader election, only while this instance holds the Lease. Losing the
/// Lease ends the process with an error (its Deployment starts it again as a standby), as
/// controller-runtime managers do.
///
/// # Errors
/// When a server address cannot be bound, the Lease cannot be managed, or leadership is
/// lost.
///
/// # Panics
/// When a controller panicked (a bug; [`crate::controllers::run`]): the process ends, and
/// its Deployment starts it again.
pub async fn run(
    client: kube::Client,
    channels: Arc<ChannelRegistry>,
    settings: Settings,
    metrics_address: SocketAddr,
    probe_address: SocketAddr,
    leader_election: Option<LeaderElection>,
) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::default());
    let mut servers = vec![tokio::spawn(serve(metrics_address, metrics.clone()))];
    if probe_address != metrics_address {
        servers.push(tokio::spawn(serve(probe_address, metrics.clone())));
    }
    let _servers = AbortOnDrop(servers.iter().map(|s| s.abort_handle()).collect());
    let Some(election) = leader_election else {
        metrics.set_ready(true);
        crate::controllers::run(client, channels, settings, metrics).await;
        return Ok(());
    };
    let manager = LeaseManagerBuilder::new(client.clone(), &election.lease)
        .with_namespace(&election.namespace)
        .with_identity(&election.identity)
        .with_duration(election.duration_seconds)
        .with_grace(election.duration_seconds.div_ceil(3).max(1))
        .build()
        .await
        .context("setting up leader election")?;
    let (mut leader, lease_task) = manager.watch().await;
    // A standby is healthy and ready; it just does not reconcile.
    metrics.set_ready(true);
    tracing::info!(lease = %election.lease, namespace = %election.namespace, identity = %election.identity, "waiting for leadership");
    let shutdown = tokio::signal::ctrl_c();
    tokio::pin!(shutdown);
    loop {
        if *leader.borrow_and_update() {
            break;
        }
        tokio::select! {
            changed = leader.changed() => changed.context("leader election stopped")?,
            _ = &mut shutdown => return Ok(()),
        }
    }
    tracing::info!(identity = %election.identity, "became leader; starting controllers");
    let mut controllers = tokio::spawn(crate::controllers::run(client, channels, settings, metrics));
    let _controllers = AbortOnDrop(vec![controllers.abort_handle()]);
    loop {
        tokio::select! {
            changed = leader.changed() => {
                changed.context("leader election stopped")?;
                if !*leader.borrow_and_update() {
                    anyhow::bail!("lost leadership of lease {}/{}", election.namespace, election.lease);
                }
            }
            // The controllers end only on a signal, which ends this loop too, or on a panic.
            ended = &mut controllers => match ended {
                Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
                _ => break,
            },
            _ = &mut shutdown => break,
        }
    }
    // Dropping the receiver releases the Lease for the next leader.
    drop(leader);
    let _ = tokio::time::timeout(Duration::from_secs(5), lease_task).await;
    Ok(())
}
