//! The capn half: `capn run` provisions the control planes the benchmark applies as the
//! user, and keeps running through the steady-state window.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use capn::api::NestedControlPlane;
use capn_testkit::{CapnOptions, CapnProcess};
use futures::StreamExt as _;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt as _, watcher};

use crate::cluster::{BenchCluster, Party, ServerCpu};
use crate::process::{Reconciles, Usage, reconciles, usage_of};
use crate::workload;

/// How long `capn run` may take to answer `/readyz`.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// What the capn half measured.
pub struct CapnRun {
    /// From applying the first NestedControlPlane to the last one reporting Ready.
    pub elapsed: Duration,
    /// When all were ready, and when the steady window ended (the audit log's clock).
    pub ready: Timestamp,
    pub steady_end: Timestamp,
    /// capn's usage when all were ready, and after the steady window.
    pub usage_at_ready: Usage,
    pub usage_at_end: Usage,
    /// capn's reconciles per controller when all were ready.
    pub reconciles_at_ready: Vec<Reconciles>,
    /// What kube-apiserver and etcd spent from the first apply until all were ready.
    pub server_cpu: ServerCpu,
}

/// Starts capn for `namespace`, applies `count` NestedControlPlanes, waits until all are
/// Ready (at most `timeout`), then lets capn run for `steady` and stops it.
///
/// # Errors
/// capn fails to start or exits, a request fails, or not all are ready within `timeout`
/// (with the end of capn's log).
pub async fn run(
    cluster: &BenchCluster,
    namespace: &str,
    count: usize,
    timeout: Duration,
    steady: Duration,
    dir: &Path,
) -> Result<CapnRun, String> {
    let user = cluster.client(Party::User)?;
    let kubeconfig = dir.join("capn.kubeconfig");
    cluster.write_kubeconfig(Party::Capn, &kubeconfig)?;
    let hosts = dir.join("etcd-hosts");
    std::fs::write(&hosts, workload::refusing_etcd_hosts(namespace, count))
        .map_err(|e| format!("cannot write {}: {e}", hosts.display()))?;
    // The public CRD sync stays off (CapnProcess::start), as in the demo: the stand-in's
    // control planes have no apiserver to sync to.
    let options = CapnOptions {
        args: vec!["--etcd-hosts-file".to_owned(), hosts.display().to_string()],
        reachable: true,
        ..CapnOptions::default()
    };
    let mut capn = CapnProcess::start(
        Path::new(env!("CARGO_BIN_EXE_capn")),
        &kubeconfig,
        namespace,
        dir.join("capn.log"),
        options,
    )?;
    capn.wait_ready(START_TIMEOUT).await?;
    let api: Api<NestedControlPlane> = Api::namespaced(user, namespace);
    let server_cpu_at_start = cluster.server_cpu()?;
    let clock = Instant::now();
    let ready_count = Arc::new(AtomicUsize::new(0));
    let ready = tokio::spawn(all_ready(api.clone(), count, ready_count.clone()));
    let applies = (0..count).map(|index| {
        let api = api.clone();
        async move {
            let doc = workload::control_plane(namespace, index)?;
            api.patch(
                &workload::name(index),
                &PatchParams::apply("kubectl"),
                &Patch::Apply(&doc),
            )
            .await
            .map_err(|e| format!("applying NestedControlPlane {}: {e}", workload::name(index)))
        }
    });
    futures::future::try_join_all(applies).await?;
    let outcome = tokio::time::timeout(timeout.saturating_sub(clock.elapsed()), ready).await;
    let elapsed = clock.elapsed();
    let ready_at = Timestamp::now();
    match outcome {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => return Err(e),
        Ok(Err(e)) => return Err(format!("the readiness watch panicked: {e}")),
        Err(_) => {
            capn.check_running()?;
            return Err(capn.failure(&format!(
                "did not bring all {count} control planes to Ready within {timeout:?}"
            )));
        }
    }
    let server_cpu = cluster.server_cpu()? - server_cpu_at_start;
    let usage_at_ready = usage_of(capn.pid())?;
    let metrics = capn.metrics_address().ok_or("capn serves no reachable metrics")?;
    let reconciles_at_ready = reconciles(metrics).await?;
    tokio::time::sleep(steady).await;
    capn.check_running()?;
    let usage_at_end = usage_of(capn.pid())?;
    let steady_end = Timestamp::now();
    capn.stop().await;
    Ok(CapnRun {
        elapsed,
        ready: ready_at,
        steady_end,
        usage_at_ready,
        usage_at_end,
        reconciles_at_ready,
        server_cpu,
    })
}

/// Returns once `count` NestedControlPlanes report `status.ready`, watching (not polling);
/// `so_far` tells how many do meanwhile.
async fn all_ready(api: Api<NestedControlPlane>, count: usize, so_far: Arc<AtomicUsize>) -> Result<(), String> {
    let mut ready = HashSet::new();
    let mut events = std::pin::pin!(
        watcher(api, watcher::Config::default())
            .default_backoff()
            .applied_objects()
    );
    while let Some(event) = events.next().await {
        match event {
            Ok(ncp) if ncp.status.as_ref().is_some_and(|s| s.ready) => {
                ready.insert(ncp.name_any());
                so_far.store(ready.len(), Ordering::Relaxed);
                if ready.len() >= count {
                    return Ok(());
                }
            }
            Ok(_) => {}
            Err(e) => eprintln!("the NestedControlPlane watch (retrying): {e}"),
        }
    }
    Err("the NestedControlPlane watch ended".to_owned())
}
