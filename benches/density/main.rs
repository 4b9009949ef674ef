//! Issue 40's benchmark (docs/benchmarks.md, "Density"): the idle footprint of a booted
//! tenant — RSS and CPU of its etcd, kube-apiserver and kube-controller-manager — for each
//! release and size of the channel, idle and under a small steady load.
//!
//! ```sh
//! hack/bench-density.sh                  # every release × small, medium, large; 300 s idle, 120 s load
//! hack/bench-density.sh --debug --releases 1.36.3 --sizes small --idle-seconds 20 --load-seconds 10
//! ```
//!
//! It boots one one-replica tenant per (release × size), all at once, through the runner
//! (real processes, one network namespace per pod), with capn's control-plane controllers
//! in this process, and waits until every one is Ready. Then:
//! 1. **idle**: every tenant is left alone for `--idle-seconds` (default 300); at its end
//!    each process's memory is read, and its CPU time over the window;
//! 2. **load**: every tenant takes `--writes-per-second` (default 10) ConfigMap writes
//!    (server-side applies of 100 ConfigMaps of 1 KiB in turn: the first 100 create, the
//!    rest update) through its own apiserver for `--load-seconds` (default 120); memory and
//!    CPU are read again at its end, CPU over the load window.
//!
//! Memory is each process tree's RSS (`VmRSS`, the process and anything it forked; the
//! binaries do not fork) and PSS (shared pages divided among the processes sharing them:
//! tenants of one release share their binaries' text); CPU is utime + stime over the window,
//! in millicores ([`capn_testkit::usage`]). CPU seconds hold when other work shares the
//! machine; wall-clock times do not, and none is printed.
//!
//! `--channels-dir DIR` loads channels from DIR over the built-in ones (a copy of `stable`
//! with sizes of its own, to measure a change of a size before making it). Figures are
//! printed, never asserted.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use capn::api::NestedControlPlane;
use capn::channel::ChannelRegistry;
use capn::component::ComponentKind;
use capn_testkit::runner::Runner;
use capn_testkit::usage::{Usage, tree_usage};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, Config};
use serde_json::json;

/// How long booting every tenant may take.
const BOOT: Duration = Duration::from_secs(900);
/// The ConfigMaps the load writes in turn.
const LOAD_OBJECTS: usize = 100;
/// Bytes of data per ConfigMap written.
const LOAD_BYTES: usize = 1024;
/// The node the "tenants per node" column fills, bytes (64 GiB, nothing reserved).
const NODE_BYTES: u64 = 64 << 30;
const MIB: f64 = (1u64 << 20) as f64;

/// The three processes of a tenant: component, pod, container.
const PROCESSES: [(ComponentKind, &str, &str); 3] = [
    (ComponentKind::Etcd, "demo-etcd-0", "etcd"),
    (ComponentKind::ApiServer, "demo-apiserver-0", "kube-apiserver"),
    (
        ComponentKind::ControllerManager,
        "demo-controller-manager-0",
        "kube-controller-manager",
    ),
];

/// What the run measures, from the command line.
struct Options {
    releases: Vec<String>,
    sizes: Vec<String>,
    idle: Duration,
    load: Duration,
    writes_per_second: u32,
    channels_dir: Option<PathBuf>,
}

fn options() -> Result<Options, String> {
    let mut options = Options {
        releases: Vec::new(),
        sizes: vec!["small".into(), "medium".into(), "large".into()],
        idle: Duration::from_secs(300),
        load: Duration::from_secs(120),
        writes_per_second: 10,
        channels_dir: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        // `cargo bench` adds `--bench`; `cargo test --bench` may add test-harness flags.
        if arg == "--bench" || !arg.starts_with("--") {
            continue;
        }
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        let seconds = |v: String| {
            v.parse::<u64>()
                .map(Duration::from_secs)
                .map_err(|e| format!("{arg} {v}: {e}"))
        };
        let list = |v: String| v.split(',').filter(|s| !s.is_empty()).map(str::to_owned).collect();
        match arg.as_str() {
            "--releases" => options.releases = list(value()?),
            "--sizes" => options.sizes = list(value()?),
            "--idle-seconds" => options.idle = seconds(value()?)?,
            "--load-seconds" => options.load = seconds(value()?)?,
            "--writes-per-second" => {
                let v = value()?;
                options.writes_per_second = v.parse().map_err(|e| format!("{arg} {v}: {e}"))?;
            }
            "--channels-dir" => options.channels_dir = Some(PathBuf::from(value()?)),
            _ => {
                return Err(format!(
                    "unknown option {arg}; options: --releases A,B --sizes A,B --idle-seconds S --load-seconds S --writes-per-second N --channels-dir DIR"
                ));
            }
        }
    }
    Ok(options)
}

fn main() -> ExitCode {
    let options = match options() {
        Ok(options) => options,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(run(options)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("the benchmark failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One booted tenant.
struct Tenant {
    release: String,
    size: String,
    ns: String,
    runner: Runner,
    /// Sum of the size's memory requests of the three components, bytes (0: none set).
    requests_bytes: u64,
    /// Per component, the size's memory request (bytes), for the table.
    requests: BTreeMap<ComponentKind, u64>,
}

/// One tenant's three processes at one moment.
#[derive(Clone, Debug, Default)]
struct Sample {
    per_process: BTreeMap<ComponentKind, Usage>,
}

impl Sample {
    fn total(&self) -> Usage {
        self.per_process.values().fold(Usage::default(), |a, b| a + *b)
    }
}

fn sample(tenant: &Tenant) -> Result<Sample, String> {
    let mut per_process = BTreeMap::new();
    for (kind, pod, container) in PROCESSES {
        let pid = tenant
            .runner
            .container_pid(pod, container)
            .ok_or_else(|| format!("{} in {} does not run", pod, tenant.ns))?;
        per_process.insert(kind, tree_usage(pid)?);
    }
    Ok(Sample { per_process })
}

/// Which releases a run measures: those asked, else every apiserver release of `stable`.
fn releases(channels: &ChannelRegistry, asked: &[String]) -> Result<Vec<String>, String> {
    if !asked.is_empty() {
        return Ok(asked.to_vec());
    }
    let stable = channels.get("stable").map_err(|e| e.to_string())?;
    Ok(stable
        .versions(ComponentKind::ApiServer)
        .into_iter()
        .map(|v| v.to_string())
        .collect())
}

/// The memory request `size` of channel `stable` gives each component, bytes.
fn size_requests(channels: &ChannelRegistry, size: &str) -> Result<BTreeMap<ComponentKind, u64>, String> {
    let stable = channels.get("stable").map_err(|e| e.to_string())?;
    let (_, found) = stable
        .resolve_size(Some(size))
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("the stable channel has no size {size}"))?;
    let mut requests = BTreeMap::new();
    for (kind, _, _) in PROCESSES {
        let bytes = found
            .component(kind)
            .and_then(|c| c.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("memory"))
            .and_then(|q| capn::quantity::quantity_bytes(&q.0))
            .unwrap_or(0);
        requests.insert(kind, bytes);
    }
    Ok(requests)
}

async fn run(options: Options) -> Result<(), String> {
    let capn_binary = PathBuf::from(env!("CARGO_BIN_EXE_capn"));
    let dirs: Vec<PathBuf> = options.channels_dir.iter().cloned().collect();
    let channels = Arc::new(ChannelRegistry::load(&dirs).map_err(|e| e.to_string())?);
    let releases = releases(&channels, &options.releases)?;
    let cluster = tokio::task::spawn_blocking(capn_testkit::cluster)
        .await
        .map_err(|_| "the super cluster did not start".to_owned())?;
    let client = cluster.client();
    println!(
        "density benchmark: releases {} × sizes {}; {} s idle, then {} writes/s for {} s",
        releases.join(", "),
        options.sizes.join(", "),
        options.idle.as_secs(),
        options.writes_per_second,
        options.load.as_secs()
    );

    // Every tenant, applied at once.
    let mut tenants = Vec::new();
    for release in &releases {
        for size in &options.sizes {
            let requests = size_requests(&channels, size)?;
            let ns = capn_testkit::test_namespace(&client).await;
            // A client (an HTTP/2 connection) per runner, as in the workloads benchmark.
            let runner = Runner::start(&cluster.client(), &ns, &capn_binary).await?;
            Api::<NestedControlPlane>::namespaced(client.clone(), &ns)
                .patch(
                    "demo",
                    &PatchParams::apply("density-bench"),
                    &Patch::Apply(json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
                        "kind": "NestedControlPlane", "metadata": {"name": "demo"},
                        "spec": {"version": release, "size": size}})),
                )
                .await
                .map_err(|e| format!("applying the control plane in {ns}: {e}"))?;
            tenants.push(Tenant {
                release: release.clone(),
                size: size.clone(),
                ns,
                runner,
                requests_bytes: requests.values().sum(),
                requests,
            });
        }
    }
    let hosts = tempfile::Builder::new()
        .prefix("capn-bench-density-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let hosts_file = hosts.path().join("hosts");
    let merging = tokio::spawn(capn_testkit::runner::merge_hosts_files(
        tenants.iter().map(|t| t.runner.hosts_file()).collect(),
        hosts_file.clone(),
    ));
    let mut settings = capn::controllers::Settings {
        etcd_hosts_file: Some(hosts_file),
        ..capn::controllers::Settings::default()
    };
    settings.enabled.public_crds = false;
    settings.enabled.syncer = false;
    let control_planes = tokio::spawn(capn::controllers::run(
        client.clone(),
        channels.clone(),
        settings,
        Default::default(),
    ));
    let result = measure(&client, &tenants, &options).await;
    control_planes.abort();
    merging.abort();
    for tenant in &tenants {
        let problems = tenant.runner.problems();
        if !problems.is_empty() {
            eprintln!("the runner of {} reported: {problems:?}", tenant.ns);
        }
    }
    drop(tenants);
    result
}

async fn measure(client: &Client, tenants: &[Tenant], options: &Options) -> Result<(), String> {
    let booting = Instant::now();
    let mut clients = Vec::new();
    for tenant in tenants {
        let ncps = Api::<NestedControlPlane>::namespaced(client.clone(), &tenant.ns);
        capn_testkit::poll_until(BOOT, || async {
            ncps.get("demo").await.ok()?.status.filter(|s| s.ready).map(|_| ())
        })
        .await
        .ok_or_else(|| {
            format!(
                "the control plane {} {} in {} did not become ready: {}",
                tenant.release,
                tenant.size,
                tenant.ns,
                tenant.runner.report()
            )
        })?;
        clients.push(tenant_client(client, tenant).await?);
    }
    println!("{} tenants Ready in {:.1?}", tenants.len(), booting.elapsed());

    // 1. Idle.
    let before: Vec<Sample> = tenants.iter().map(sample).collect::<Result<_, _>>()?;
    let started = Instant::now();
    tokio::time::sleep(options.idle).await;
    let idle_window = started.elapsed();
    let idle: Vec<Sample> = tenants.iter().map(sample).collect::<Result<_, _>>()?;

    // 2. Load.
    let started = Instant::now();
    let writers: Vec<_> = clients
        .iter()
        .map(|c| tokio::spawn(write_load(c.clone(), options.writes_per_second, options.load)))
        .collect();
    let mut written = Vec::new();
    for writer in writers {
        written.push(writer.await.map_err(|e| e.to_string())??);
    }
    let load_window = started.elapsed();
    let loaded: Vec<Sample> = tenants.iter().map(sample).collect::<Result<_, _>>()?;

    print_report(tenants, &before, &idle, &loaded, idle_window, load_window, &written);
    Ok(())
}

/// A client of the tenant's apiserver through its admin kubeconfig, dialled at the address
/// the runner gives its in-cluster name.
async fn tenant_client(client: &Client, tenant: &Tenant) -> Result<Client, String> {
    let secret = Api::<Secret>::namespaced(client.clone(), &tenant.ns)
        .get("demo-kubeconfig")
        .await
        .map_err(|e| e.to_string())?;
    let kubeconfig = secret
        .data
        .and_then(|d| d.get("value").cloned())
        .ok_or_else(|| format!("demo-kubeconfig in {} has no value", tenant.ns))?;
    let kubeconfig = String::from_utf8(kubeconfig.0).map_err(|e| e.to_string())?;
    let config: Config = tenant.runner.client_config(&kubeconfig).await?;
    Client::try_from(config).map_err(|e| e.to_string())
}

/// `per_second` server-side applies a second for `window`, to ConfigMaps `load-0` …
/// `load-99` in turn in `default`. Returns how many succeeded; a failed write ends the run.
async fn write_load(client: Client, per_second: u32, window: Duration) -> Result<u64, String> {
    let api = Api::<ConfigMap>::namespaced(client, "default");
    let params = PatchParams::apply("density-load").force();
    let filler = "x".repeat(LOAD_BYTES);
    let mut tick = tokio::time::interval(Duration::from_secs(1) / per_second.max(1));
    // A late write is made at once, so that the window holds its number of writes.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let started = Instant::now();
    let mut written = 0u64;
    while started.elapsed() < window {
        tick.tick().await;
        let name = format!("load-{}", written as usize % LOAD_OBJECTS);
        api.patch(
            &name,
            &params,
            &Patch::Apply(
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
                "data": {"n": written.to_string(), "filler": filler}}),
            ),
        )
        .await
        .map_err(|e| format!("writing {name}: {e}"))?;
        written += 1;
    }
    Ok(written)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB
}

/// Millicores of CPU between two readings over `window`.
fn millicores(before: f64, after: f64, window: Duration) -> f64 {
    (after - before).max(0.0) / window.as_secs_f64() * 1000.0
}

fn print_report(
    tenants: &[Tenant],
    before: &[Sample],
    idle: &[Sample],
    loaded: &[Sample],
    idle_window: Duration,
    load_window: Duration,
    written: &[u64],
) {
    println!(
        "\nIdle: {:.0} s after Ready; load: {:.0} s of ConfigMap applies ({:.1} writes/s per tenant achieved, mean)",
        idle_window.as_secs_f64(),
        load_window.as_secs_f64(),
        written.iter().sum::<u64>() as f64 / written.len().max(1) as f64 / load_window.as_secs_f64()
    );
    println!(
        "RSS in MiB (VmRSS, each process tree), idle / under load; CPU in millicores (utime + stime over the window), idle / under load.\n"
    );
    println!(
        "| release | size | etcd RSS | apiserver RSS | controller-manager RSS | **total RSS** | of it anonymous, idle | etcd CPU | apiserver CPU | controller-manager CPU | total CPU | memory requests | tenants per 64 GiB: by idle RSS / by requests |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (i, tenant) in tenants.iter().enumerate() {
        let (b, s, l) = (&before[i], &idle[i], &loaded[i]);
        let mut row = format!("| {} | {} |", tenant.release, tenant.size);
        for (kind, _, _) in PROCESSES {
            row += &format!(
                " {:.0} / {:.0} |",
                mib(s.per_process[&kind].rss_bytes),
                mib(l.per_process[&kind].rss_bytes)
            );
        }
        let (st, lt) = (s.total(), l.total());
        row += &format!(
            " **{:.0} / {:.0}** | {:.0} |",
            mib(st.rss_bytes),
            mib(lt.rss_bytes),
            mib(st.rss_anon_bytes)
        );
        for (kind, _, _) in PROCESSES {
            row += &format!(
                " {:.0} / {:.0} |",
                millicores(
                    b.per_process[&kind].cpu_seconds,
                    s.per_process[&kind].cpu_seconds,
                    idle_window
                ),
                millicores(
                    s.per_process[&kind].cpu_seconds,
                    l.per_process[&kind].cpu_seconds,
                    load_window
                ),
            );
        }
        row += &format!(
            " {:.0} / {:.0} |",
            millicores(b.total().cpu_seconds, st.cpu_seconds, idle_window),
            millicores(st.cpu_seconds, lt.cpu_seconds, load_window),
        );
        let requests: Vec<String> = PROCESSES
            .iter()
            .map(|(kind, _, _)| format!("{:.0}", mib(tenant.requests[kind])))
            .collect();
        row += &format!(" {} = {:.0} MiB |", requests.join(" + "), mib(tenant.requests_bytes));
        let per_node = |bytes: u64| NODE_BYTES.checked_div(bytes).map_or("–".to_owned(), |n| n.to_string());
        row += &format!(" {} / {} |", per_node(st.rss_bytes), per_node(tenant.requests_bytes));
        println!("{row}");
    }
    println!("\nPer process, idle (MiB): RSS = anonymous + file-backed");
    for (i, tenant) in tenants.iter().enumerate() {
        let parts: Vec<String> = PROCESSES
            .iter()
            .map(|(kind, _, container)| {
                let u = idle[i].per_process[kind];
                format!(
                    "{container} {:.0} = {:.0} + {:.0} (PSS {:.0})",
                    mib(u.rss_bytes),
                    mib(u.rss_anon_bytes),
                    mib(u.rss_file_bytes),
                    mib(u.pss_bytes)
                )
            })
            .collect();
        println!("  {} {}: {}", tenant.release, tenant.size, parts.join("; "));
    }
    println!(
        "\nPeers, published (not measured here): k0smotron about 210 MiB and 0.4 core per control plane with etcd under load; vcluster apiserver 250–280 MiB + etcd 60–150 MiB."
    );
    println!(
        "A scheduler places pods by their memory requests, not by what they use: the second figure of the last column is what fits; the first, what the node's memory would hold (nothing reserved for the system)."
    );
}
