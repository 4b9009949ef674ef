//! Issue 11's benchmark (`hack/bench.sh N`): on one fresh super cluster with the API
//! server's audit log on, the floor (a logic-free client, [`floor`]), the design's floor (the
//! floor plus the least capn's API asks of any implementation, [`design_floor`]) and then
//! capn (`capn run`, [`capn_half`]) each provision N control planes, while a watch-driven
//! stand-in writes every StatefulSet's ready status for all three. It prints, side by side, the time until all
//! are ready, the requests per control plane by verb and resource as the API server's audit
//! log counted them, capn's requests in a steady-state window after that, and capn's peak
//! memory and CPU time.
//!
//! No tenant etcd runs (the stand-in writes StatefulSet status only), so every etcd member
//! capn dials must fail, and fail as fast as a running member answers: capn gets an
//! `--etcd-hosts-file` that maps each member's name to 127.0.0.2, where nothing listens and the
//! connection is refused at once. Without it the names go to the machine's DNS, whose
//! NXDOMAIN took up to a second under load, a wait a super cluster's DNS does not have.
//!
//! The floors go first, so capn runs on the cluster that already holds their objects (the
//! harder case for capn), and capn watches only its own namespace (`--namespace`).

mod capn_half;
mod cluster;
mod design_floor;
mod floor;
mod process;
mod report;
mod workload;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};

use cluster::{BenchCluster, Party};

/// capn against the API server's floor: time, requests, memory (issue 11).
#[derive(Debug, Parser)]
struct Args {
    /// Control planes each half provisions.
    control_planes: usize,
    /// Seconds capn keeps running after all are ready, its requests counted.
    #[arg(long, default_value_t = 60)]
    steady_seconds: u64,
    /// Seconds each half may take until all are ready [default: 120 + 3 per control plane].
    #[arg(long)]
    timeout_seconds: Option<u64>,
    /// Keep the working directory (audit log, capn's log, the cluster's logs).
    #[arg(long)]
    keep: bool,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// The namespaces of the two halves.
const FLOOR_NAMESPACE: &str = "bench-floor";
const DESIGN_FLOOR_NAMESPACE: &str = "bench-design-floor";
const CAPN_NAMESPACE: &str = "bench-capn";

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(report) => {
            print!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("benchmark FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<String, String> {
    if args.control_planes == 0 {
        return Err("the number of control planes must be at least 1".to_owned());
    }
    let dir = tempfile::Builder::new()
        .prefix("capn-bench-")
        .tempdir()
        .map_err(|e| format!("cannot create a working directory: {e}"))?;
    eprintln!("capn benchmark: working directory {}", dir.path().display());
    let cluster = cluster::start(dir.path())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot build a tokio runtime: {e}"))?;
    let result = runtime.block_on(measure(args, &cluster, dir.path()));
    if args.keep || result.is_err() {
        eprintln!("capn benchmark: kept {}", dir.keep().display());
    }
    result
}

async fn measure(args: &Args, cluster: &BenchCluster, dir: &std::path::Path) -> Result<String, String> {
    let count = args.control_planes;
    let timeout = Duration::from_secs(args.timeout_seconds.unwrap_or(120 + 3 * count as u64));
    let steady = Duration::from_secs(args.steady_seconds);
    let _stand_in = AbortOnDrop(tokio::spawn(capn_testkit::stand_in::run(
        cluster.client(Party::StandIn)?,
        None,
    )));
    let user = cluster.client(Party::User)?;
    for namespace in [FLOOR_NAMESPACE, DESIGN_FLOOR_NAMESPACE, CAPN_NAMESPACE] {
        create_namespace(&user, namespace).await?;
    }

    eprintln!("capn benchmark: the floor provisions {count} control planes");
    let server_cpu_at_start = cluster.server_cpu()?;
    let floor_elapsed = floor::provision(cluster.client(Party::Floor)?, FLOOR_NAMESPACE, count, timeout).await?;
    let floor_server_cpu = cluster.server_cpu()? - server_cpu_at_start;
    eprintln!("capn benchmark: the design's floor provisions {count} control planes");
    let server_cpu_at_start = cluster.server_cpu()?;
    let design_floor_elapsed = design_floor::provision(
        user.clone(),
        cluster.client(Party::DesignFloor)?,
        DESIGN_FLOOR_NAMESPACE,
        count,
        timeout,
    )
    .await?;
    let design_floor_server_cpu = cluster.server_cpu()? - server_cpu_at_start;
    eprintln!("capn benchmark: capn provisions {count} control planes, then runs {steady:?} more");
    let capn = capn_half::run(cluster, CAPN_NAMESPACE, count, timeout, steady, dir).await?;

    let requests = capn_testkit::audit::read_log(&cluster.audit_log)?;
    Ok(report::render(&report::Results {
        control_planes: count,
        steady,
        build: if cfg!(debug_assertions) { "debug" } else { "release" },
        floor_elapsed,
        floor_server_cpu,
        design_floor_elapsed,
        design_floor_server_cpu,
        capn: &capn,
        requests: &requests,
    }))
}

async fn create_namespace(client: &kube::Client, name: &str) -> Result<(), String> {
    let namespace: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).map_err(|e| e.to_string())?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .map_err(|e| format!("creating namespace {name}: {e}"))?;
    Ok(())
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
