//! Issue 35's benchmark (docs/benchmarks.md, "Tenant workloads"): tenant pods run through
//! capn's syncer, on booted tenants, the super cluster's real kube-scheduler and the test
//! kit's node.
//!
//! ```sh
//! hack/bench-workloads.sh [TENANTS] [PODS] [FLOOD]    # default 3 tenants × 10 pods, a flood of 1,000
//! ```
//!
//! It boots TENANTS control planes (each with its own runner), runs the control-plane
//! controllers in this process and the syncer as `capn run --controllers syncer` (its own
//! process, for its memory and CPU, with an impersonated user for the audit log), then:
//! 1. one tenant applies a Deployment of PODS pause pods: time from the apply to PODS
//!    `Running` in the tenant, and where it went per pod (capn down: tenant pod seen → super
//!    pod created; scheduler and node: super pod created → Running; capn up: super pod
//!    Running → tenant pod Running);
//! 2. every other tenant applies the same at once: time to all Running, requests per synced
//!    pod on the super cluster and on the tenants' apiservers (the syncer's, from each API
//!    server's audit log), the syncer's RSS and CPU;
//! 3. the others scale to none; one tenant's apiserver is stopped (SIGSTOP) and the others
//!    scale back to PODS: their time to Running beside step 2's, the delay a hung tenant adds;
//! 4. the others scale to none again; that tenant, resumed, applies a Deployment of FLOOD
//!    pods that no node takes (they stay Pending) while the others scale back to PODS: their
//!    time to Running beside step 2's, the delay a tenant with a thousand pending pods adds,
//!    and the syncer's RSS once the flood is synced (its cost per pod at scale).
//!
//! 5. `kubectl exec` and `kubectl logs` into a tenant pod through capn, against the same
//!    straight to its super pod (medians), and `kubectl logs -f` throughput both ways;
//! 6. a tenant Service: time from its create to the first request a tenant pod gets answered
//!    through it, by its super address and by its name (the tenant's DNS), against a
//!    Service made straight in the super cluster (medians);
//! 7. a public custom resource (issue 37): a Widget created in a tenant, copied down, served
//!    by a stand-in operator in the super cluster: time from create to its status back in
//!    the tenant (median), and the syncer's requests per custom resource on each side.
//!
//! The node's pod network holds 252 pods: TENANTS × PODS + 2 must fit.
//!
//! Figures are printed, never asserted.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

use capn::api::{NestedAPIServer, NestedControlPlane};
use capn_testkit::requests::Tally;
use capn_testkit::runner::Runner;
use capn_testkit::{audit, test_namespace};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

#[allow(dead_code)]
#[path = "../provisioning/process.rs"]
mod process;

/// The user the syncer's requests are made as (impersonated), so the audit log tells them
/// from everyone else's.
const SYNCER_USER: &str = "bench-syncer";
/// How long any one phase may take.
const PHASE: Duration = Duration::from_secs(600);
/// The identity of the tenants' admin kubeconfig (`<cluster>-kubeconfig`), which the
/// syncer uses; the benchmark's own tenant requests impersonate [`BENCH_USER`].
const TENANT_ADMIN: &str = "kubernetes-admin";
/// Who the benchmark's own requests to a tenant are made as.
const BENCH_USER: &str = "bench-user";
/// The tenant apiservers' audit policy: the admin identity's requests (the syncer's, and the
/// benchmark's, which impersonate [`BENCH_USER`]) at the Metadata level, nothing else. The
/// log goes to the apiserver's standard output, which the runner keeps in its container log.
const TENANT_AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  users: [kubernetes-admin]
- level: None
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let tenants: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(3).max(2);
    let pods: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(10).max(1);
    let flood: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(1000).max(1);
    if tenants * pods > 250 {
        eprintln!("{tenants} tenants × {pods} pods do not fit the node's pod network (252 addresses, 2 for step 6)");
        return ExitCode::FAILURE;
    }
    let dir = match tempfile::Builder::new().prefix("capn-bench-workloads-").tempdir() {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("cannot create the benchmark's directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    let policy = dir.path().join("audit-policy.yaml");
    let audit_log = dir.path().join("audit.log");
    if let Err(e) = std::fs::write(&policy, audit::POLICY) {
        eprintln!("cannot write {}: {e}", policy.display());
        return ExitCode::FAILURE;
    }
    let flags = format!(
        "--audit-policy-file={} --audit-log-path={} --audit-log-format=json --audit-log-maxsize=1000000",
        policy.display(),
        audit_log.display()
    );
    // SAFETY: set before any other thread exists (the runtime is built below).
    unsafe {
        std::env::set_var(capn_testkit::APISERVER_ARGS_VARIABLE, flags);
        // Room on the one node for every pod that runs (PODS per tenant; at most 253).
        std::env::set_var(capn_testkit::MAX_PODS_VARIABLE, (tenants * pods + 20).to_string());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(run(tenants, pods, flood, dir.path(), &audit_log)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("the benchmark failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One booted tenant.
struct Tenant {
    ns: String,
    runner: Runner,
    client: Client,
}

async fn run(tenants: usize, pods: usize, flood: usize, dir: &Path, audit_log: &Path) -> Result<(), String> {
    let capn_binary = PathBuf::from(env!("CARGO_BIN_EXE_capn"));
    let cluster = tokio::task::spawn_blocking(capn_testkit::cluster)
        .await
        .map_err(|_| "the super cluster did not start".to_owned())?;
    let client = cluster.client();
    println!("workloads benchmark: {tenants} tenants × {pods} pause pods, a flood of {flood}");

    // The tenants, booted by capn's control-plane controllers in this process.
    let mut booted = Vec::new();
    for _ in 0..tenants {
        let ns = test_namespace(&client).await;
        // A client (an HTTP/2 connection) per runner: the API server allows 100 streams on
        // one, and twenty runners' watches would take them all.
        let runner = Runner::start(&cluster.client(), &ns, &capn_binary).await?;
        booted.push((ns, runner));
    }
    let hosts = dir.join("hosts");
    let merging = tokio::spawn(capn_testkit::runner::merge_hosts_files(
        booted.iter().map(|(_, r)| r.hosts_file()).collect(),
        hosts.clone(),
    ));
    let mut settings = capn::controllers::Settings {
        etcd_hosts_file: Some(hosts.clone()),
        ..capn::controllers::Settings::default()
    };
    settings.enabled.public_crds = false;
    settings.enabled.syncer = false;
    let channels = Arc::new(capn::channel::ChannelRegistry::load(&[]).map_err(|e| e.to_string())?);
    let control_planes = tokio::spawn(capn::controllers::run(
        client.clone(),
        channels,
        settings,
        Default::default(),
    ));
    let booting = Instant::now();
    for (ns, _) in &booted {
        audited_control_plane(&client, ns).await?;
    }
    let mut ready = Vec::new();
    for (ns, runner) in booted {
        let ncps = Api::<NestedControlPlane>::namespaced(client.clone(), &ns);
        capn_testkit::poll_until(PHASE, || async {
            ncps.get("demo").await.ok()?.status.filter(|s| s.ready).map(|_| ())
        })
        .await
        .ok_or_else(|| format!("the control plane in {ns} did not become ready"))?;
        let secret = Api::<Secret>::namespaced(client.clone(), &ns)
            .get("demo-kubeconfig")
            .await
            .map_err(|e| e.to_string())?;
        let kubeconfig =
            String::from_utf8(secret.data.unwrap_or_default()["value"].0.clone()).map_err(|e| e.to_string())?;
        let mut config = runner.client_config(&kubeconfig).await?;
        config.auth_info.impersonate = Some(BENCH_USER.to_owned());
        config.auth_info.impersonate_groups = Some(vec!["system:masters".to_owned()]);
        let tenant = Client::try_from(config).map_err(|e| e.to_string())?;
        ready.push(Tenant {
            ns,
            runner,
            client: tenant,
        });
    }
    println!("{tenants} tenants booted in {:.1?}", booting.elapsed());

    // The node, and the syncer as a process of its own.
    tokio::task::spawn_blocking(capn_testkit::node)
        .await
        .map_err(|_| "the node did not start".to_owned())?;
    let kubeconfig = dir.join("syncer.kubeconfig");
    write_impersonating_kubeconfig(cluster.kubeconfig_path(), &kubeconfig)?;
    let mut syncer = Command::new(&capn_binary)
        .args([
            "run",
            // public-crds too: step 7's tenants need capn's copy of the Widget CRD.
            "--controllers",
            "syncer,public-crds",
            "--metrics-bind-address=127.0.0.1:0",
            "--health-probe-bind-address=127.0.0.1:0",
        ])
        .arg(format!("--etcd-hosts-file={}", hosts.display()))
        // The tenant Nodes' kubelet API where every runner's pods reach this host (step 5).
        .arg(format!(
            "--kubelet-advertise-address={}",
            capn_testkit::node().address()
        ))
        .arg(format!("--kubelet-bind-address={}:0", capn_testkit::node().address()))
        .env("KUBECONFIG", &kubeconfig)
        .stdout(std::fs::File::create(dir.join("syncer.log")).map_err(|e| e.to_string())?)
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start the syncer: {e}"))?;
    let pid = syncer.id();
    let result = phases(&ready, pods, flood, pid, audit_log).await;
    let _ = syncer.kill();
    let _ = syncer.wait();
    control_planes.abort();
    merging.abort();
    drop(ready);
    result
}

async fn phases(tenants: &[Tenant], pods: usize, flood: usize, pid: u32, audit_log: &Path) -> Result<(), String> {
    // Each workload namespace made and the syncer idle before anything is measured.
    for tenant in tenants {
        let workloads = capn::syncer::names::ControlPlaneRef::new(&tenant.ns, "demo").workload_namespace();
        let api = Api::<k8s_openapi::api::core::v1::Namespace>::all(capn_testkit::cluster().client());
        capn_testkit::poll_until(PHASE, || async { api.get_opt(&workloads).await.ok().flatten() })
            .await
            .ok_or("the syncer made no workload namespace")?;
    }
    // ... and its start-up requests (workload namespaces, the workers' lists and watches)
    // over.
    until_idle(audit_log).await?;
    let idle = process::usage_of(pid)?;
    let audited_before = syncer_requests(audit_log)?.len();
    let tenant_audited_before = tenant_requests(tenants)?;

    // 1. One tenant, one Deployment.
    let first = &tenants[0];
    let timeline = one_deployment(first, pods).await?;
    println!("\n1. One tenant applies a Deployment of {pods} pause pods");
    println!("   apply → {pods} Running in the tenant: {:.2?}", timeline.total);
    println!(
        "   per pod, mean: capn down {:.0} ms, scheduler and node {:.0} ms, capn up {:.0} ms (capn's share {:.0}%)",
        timeline.down_ms,
        timeline.node_ms,
        timeline.up_ms,
        100.0 * (timeline.down_ms + timeline.up_ms) / (timeline.down_ms + timeline.node_ms + timeline.up_ms)
    );

    // 2. Every other tenant at once.
    let started = Instant::now();
    let others = &tenants[1..];
    for tenant in others {
        apply_deployment(tenant, "scale", pods).await?;
    }
    let mut per_tenant = Vec::new();
    for tenant in others {
        wait_running(tenant, "scale", pods).await?;
        per_tenant.push(started.elapsed());
    }
    let all = started.elapsed();
    let synced = pods * tenants.len();
    let requests = syncer_requests(audit_log)?;
    let during = &requests[audited_before..];
    let by_key: Tally = during.iter().map(|r| r.key.clone()).collect();
    let writes = during
        .iter()
        .filter(|r| !matches!(r.key.verb.as_str(), "get" | "list" | "watch"))
        .count();
    let busy = process::usage_of(pid)?;
    let tenant_during = tenant_requests(tenants)?.since(&tenant_audited_before);
    println!("\n2. {} more tenants apply the same at once", others.len());
    println!("   apply → all {} pods Running: {:.2?}", pods * others.len(), all);
    println!(
        "   super-cluster requests of the syncer for {synced} synced pods: {} ({:.2} per pod; {writes} writes, {:.2} per pod)",
        during.len(),
        during.len() as f64 / synced as f64,
        writes as f64 / synced as f64
    );
    print!("{}", by_key.breakdown());
    println!(
        "   tenant-apiserver requests of the syncer for the same pods: {} ({:.2} per pod)",
        tenant_during.total(),
        tenant_during.total() as f64 / synced as f64
    );
    print!("{}", tenant_during.breakdown());
    println!(
        "   syncer RSS: {:.1} MiB idle with {} tenants, {:.1} MiB with {synced} pods (+{:.1} MiB, {:.1} MiB per 1,000 pods); CPU {:.2} s for the syncing",
        idle.rss_anon_bytes as f64 / 1048576.0,
        tenants.len(),
        busy.rss_anon_bytes as f64 / 1048576.0,
        (busy.rss_anon_bytes as f64 - idle.rss_anon_bytes as f64) / 1048576.0,
        (busy.rss_anon_bytes as f64 - idle.rss_anon_bytes as f64) / 1048576.0 / synced as f64 * 1000.0,
        busy.cpu_seconds - idle.cpu_seconds
    );

    // 3. One tenant's apiserver hangs; the others run their pods again from none (the node's
    // pod network holds 253 pods, so each step starts from an empty node).
    scale_to_none(others, &workload_namespaces(others)).await?;
    let hung_pid = hang_apiserver(first)?;
    let started = Instant::now();
    for tenant in others {
        scale(tenant, "scale", pods).await?;
    }
    for tenant in others {
        wait_running(tenant, "scale", pods).await?;
    }
    let hung = started.elapsed();
    // Gone if its liveness probe restarted it meanwhile (after 80 s).
    let _ = signal(hung_pid, "CONT");
    println!(
        "\n3. Tenant {} hangs (its apiserver SIGSTOPped); the others run their {} pods again",
        first.ns, pods
    );
    println!(
        "   {} pods Running in {:.2?} (step 2, nobody hung: {:.2?} for as many)",
        pods * others.len(),
        hung,
        all
    );

    // 4. That tenant floods its queue with pods no node takes; the others run theirs again.
    scale_to_none(others, &workload_namespaces(others)).await?;
    let before_flood = process::usage_of(pid)?;
    let started = Instant::now();
    apply_deployment_on(first, "flood", flood, json!({"bench.capn.dev/no-such-node": "true"})).await?;
    // One of the others is followed pod by pod, as in step 1: capn's own delay, apart from
    // the super cluster's, which the flood loads too.
    let (followed, rest) = others.split_first().ok_or("no other tenant")?;
    let (during_flood, scaled) = tokio::join!(one_deployment(followed, pods), async {
        for tenant in rest {
            scale(tenant, "scale", pods).await?;
        }
        for tenant in rest {
            wait_running(tenant, "scale", pods).await?;
        }
        Ok::<(), String>(())
    });
    let during_flood = during_flood?;
    scaled?;
    let beside_flood = started.elapsed();
    let workload_namespace = capn::syncer::names::ControlPlaneRef::new(&first.ns, "demo").workload_namespace();
    let flood_pods = Api::<Pod>::namespaced(capn_testkit::cluster().client(), &workload_namespace);
    capn_testkit::poll_until(PHASE, || async {
        let synced = flood_pods
            .list_metadata(&ListParams::default().labels("app=flood"))
            .await
            .ok()?
            .items
            .len();
        (synced >= flood).then_some(())
    })
    .await
    .ok_or("the flood's pods were not all synced")?;
    let flood_synced = started.elapsed();
    let flooded = process::usage_of(pid)?;
    println!(
        "\n4. Tenant {} applies {flood} pods that no node takes (Pending); the others run their {} pods again",
        first.ns, pods
    );
    println!(
        "   {} pods Running in {:.2?} (step 2, nobody flooding: {:.2?} for as many); the flood synced in {:.2?} ({:.0} pods/s)",
        pods * others.len(),
        beside_flood,
        all,
        flood_synced,
        flood as f64 / flood_synced.as_secs_f64()
    );
    println!(
        "   per pod of tenant {}, mean: capn down {:.0} ms, scheduler and node {:.0} ms, capn up {:.0} ms (step 1, no flood: {:.0}, {:.0}, {:.0} ms)",
        followed.ns,
        during_flood.down_ms,
        during_flood.node_ms,
        during_flood.up_ms,
        timeline.down_ms,
        timeline.node_ms,
        timeline.up_ms
    );
    println!(
        "   syncer RSS {:.1} MiB with the flood synced (+{:.1} MiB for {flood} pods, {:.1} MiB per 1,000 pods); CPU {:.2} s",
        flooded.rss_anon_bytes as f64 / 1048576.0,
        (flooded.rss_anon_bytes as f64 - before_flood.rss_anon_bytes as f64) / 1048576.0,
        (flooded.rss_anon_bytes as f64 - before_flood.rss_anon_bytes as f64) / 1048576.0 / flood as f64 * 1000.0,
        flooded.cpu_seconds - before_flood.cpu_seconds
    );

    streams(followed).await?;
    services(followed).await?;
    custom_resources(tenants, followed, audit_log).await?;

    let per_pod_ms = all.as_secs_f64() * 1000.0 / (pods * others.len()) as f64;
    println!(
        "\nOn paper, 1,000 tenants × 30 pods at this slope: {:.0} super requests, {:.0} MiB of syncer memory for the pods",
        during.len() as f64 / synced as f64 * 30_000.0,
        (busy.rss_anon_bytes as f64 - idle.rss_anon_bytes as f64) / 1048576.0 / synced as f64 * 30_000.0
    );
    println!("(step 2's wall time per pod: {per_pod_ms:.0} ms on this machine's one node)");
    Ok(())
}

/// How many times each stream is timed.
const STREAM_SAMPLES: usize = 50;

/// Step 5: `kubectl exec` and `kubectl logs` into one of `tenant`'s Running `web` pods,
/// through the tenant apiserver and capn's kubelet API, and the same straight to its super
/// pod: medians.
async fn streams(tenant: &Tenant) -> Result<(), String> {
    use capn::syncer::names::{ControlPlaneRef, NameLimit};
    let pods = Api::<Pod>::namespaced(tenant.client.clone(), "default");
    let pod = pods
        .list(&ListParams::default().labels("app=web"))
        .await
        .map_err(|e| e.to_string())?
        .items
        .into_iter()
        .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .ok_or("no Running web pod to exec into")?
        .name_any();
    let control_plane = ControlPlaneRef::new(&tenant.ns, "demo");
    // kube's own client (HTTP/1.1): the test kit's speaks HTTP/2, which has no upgrade.
    let upgrades = Client::try_from(capn_testkit::cluster().config()).map_err(|e| e.to_string())?;
    let super_pods = Api::<Pod>::namespaced(upgrades, &control_plane.workload_namespace());
    let super_pod = control_plane.super_name(NameLimit::Subdomain, "default", &pod);
    let exec_through = median_ms(STREAM_SAMPLES, || exec_once(&pods, &pod)).await?;
    let exec_direct = median_ms(STREAM_SAMPLES, || exec_once(&super_pods, &super_pod)).await?;
    let logs_through = median_ms(STREAM_SAMPLES, || logs_once(&pods, &pod)).await?;
    let logs_direct = median_ms(STREAM_SAMPLES, || logs_once(&super_pods, &super_pod)).await?;
    println!(
        "\n5. Streams into a tenant pod, median of {STREAM_SAMPLES} (through the tenant apiserver and capn's kubelet API | straight to the super pod)"
    );
    println!(
        "   kubectl exec (cat the hostname): {exec_through:.1} ms | {exec_direct:.1} ms (+{:.1} ms)",
        exec_through - exec_direct
    );
    println!(
        "   kubectl logs: {logs_through:.1} ms | {logs_direct:.1} ms (+{:.1} ms)",
        logs_through - logs_direct
    );
    follow_throughput(&pods, &super_pods, &control_plane).await
}

/// Lines the `kubectl logs -f` throughput is read over (agnhost `logs-generator`'s, about 90
/// bytes each).
const FOLLOW_LINES: usize = 100_000;
/// How many times each side is followed.
const FOLLOW_SAMPLES: usize = 3;

/// `kubectl logs -f` throughput (part of step 5): a tenant pod writes [`FOLLOW_LINES`]
/// lines and ends; its log is followed from the start until every byte came, through capn
/// and straight from its super pod; medians of [`FOLLOW_SAMPLES`], in MiB/s.
async fn follow_throughput(
    pods: &Api<Pod>,
    super_pods: &Api<Pod>,
    control_plane: &capn::syncer::names::ControlPlaneRef,
) -> Result<(), String> {
    let name = "chatty";
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "agnhost",
            "image": "registry.k8s.io/e2e-test-images/agnhost:2.53",
            "args": ["logs-generator", format!("--log-lines-total={FOLLOW_LINES}"), "--run-duration=1s"]}]}
    }))
    .map_err(|e| e.to_string())?;
    pods.create(&PostParams::default(), &pod)
        .await
        .map_err(|e| format!("creating pod {name}: {e}"))?;
    capn_testkit::poll_until(PHASE, || async {
        (pods.get(name).await.ok()?.status?.phase.as_deref() == Some("Succeeded")).then_some(())
    })
    .await
    .ok_or("the logs-generator pod did not end")?;
    let super_pod = control_plane.super_name(capn::syncer::names::NameLimit::Subdomain, "default", name);
    let bytes = super_pods
        .logs(&super_pod, &kube::api::LogParams::default())
        .await
        .map_err(|e| format!("logs of {super_pod}: {e}"))?
        .len();
    let mib_per_s = |ms: f64| bytes as f64 / (1024.0 * 1024.0) / (ms / 1000.0);
    let through = median_ms(FOLLOW_SAMPLES, || follow_once(pods, name, bytes)).await?;
    let direct = median_ms(FOLLOW_SAMPLES, || follow_once(super_pods, &super_pod, bytes)).await?;
    println!(
        "   kubectl logs -f, {:.1} MiB ({FOLLOW_LINES} lines) from the start: {:.1} MiB/s | {:.1} MiB/s",
        bytes as f64 / (1024.0 * 1024.0),
        mib_per_s(through),
        mib_per_s(direct)
    );
    let _ = pods.delete(name, &Default::default()).await;
    Ok(())
}

/// Follows the log of pod `name` until `bytes` bytes came.
async fn follow_once(pods: &Api<Pod>, name: &str, bytes: usize) -> Result<(), String> {
    use futures::AsyncReadExt;
    let params = kube::api::LogParams {
        follow: true,
        ..Default::default()
    };
    let mut stream = pods
        .log_stream(name, &params)
        .await
        .map_err(|e| format!("following the log of {name}: {e}"))?;
    let mut buffer = vec![0; 256 * 1024];
    let mut read = 0;
    while read < bytes {
        let n = stream.read(&mut buffer).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err(format!("the log of {name} ended after {read} of {bytes} bytes"));
        }
        read += n;
    }
    Ok(())
}

/// How many Services step 6 times on each side.
const SERVICE_SAMPLES: usize = 5;

/// Step 6: a tenant Service over an agnhost `netexec` pod, asked for by another tenant pod
/// (netexec's `/dial`, sent from the benchmark to that pod): time from the Service's create
/// to the first answer, through capn (copy, ClusterIP shown on the tenant Service) and for a
/// Service made straight in the super cluster over the same super pod; medians.
async fn services(tenant: &Tenant) -> Result<(), String> {
    use k8s_openapi::api::core::v1::Service;
    let pods = Api::<Pod>::namespaced(tenant.client.clone(), "default");
    for (name, port) in [("echo", 8080), ("caller", 8080)] {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
            "spec": {"containers": [{"name": "agnhost",
                "image": "registry.k8s.io/e2e-test-images/agnhost:2.53",
                "args": ["netexec", format!("--http-port={port}")]}]}
        }))
        .map_err(|e| e.to_string())?;
        pods.create(&PostParams::default(), &pod)
            .await
            .map_err(|e| format!("creating pod {name}: {e}"))?;
    }
    let caller = capn_testkit::poll_until(PHASE, || async {
        let pod = pods.get("caller").await.ok()?;
        let running = pods.get("echo").await.ok()?.status?.phase.as_deref() == Some("Running");
        let status = pod.status?;
        (running && status.phase.as_deref() == Some("Running")).then_some(status.pod_ip?)
    })
    .await
    .ok_or("the echo and caller pods did not run")?;
    let caller: std::net::SocketAddr = format!("{caller}:8080").parse().map_err(|e| format!("{e}"))?;
    let tenant_services = Api::<Service>::namespaced(tenant.client.clone(), "default");
    let control_plane = capn::syncer::names::ControlPlaneRef::new(&tenant.ns, "demo");
    let super_services =
        Api::<Service>::namespaced(capn_testkit::cluster().client(), &control_plane.workload_namespace());
    let mut through = Vec::new();
    let mut by_name = Vec::new();
    let mut direct = Vec::new();
    for i in 0..SERVICE_SAMPLES {
        let name = format!("echo-{i}");
        let started = Instant::now();
        tenant_services
            .create(&PostParams::default(), &echo_service(&name, json!({"app": "echo"}))?)
            .await
            .map_err(|e| format!("creating Service {name}: {e}"))?;
        let address = soon(|| async {
            tenant_services
                .get(&name)
                .await
                .ok()?
                .annotations()
                .get(capn::syncer::service::SUPER_CLUSTER_IP)
                .cloned()
        })
        .await
        .ok_or("the tenant Service never showed its super ClusterIP")?;
        answered(caller, &address).await?;
        through.push(started.elapsed().as_secs_f64() * 1000.0);

        // The same, dialled by name: the tenant's DNS answers once the copy has an address.
        let name = format!("named-{i}");
        let started = Instant::now();
        tenant_services
            .create(&PostParams::default(), &echo_service(&name, json!({"app": "echo"}))?)
            .await
            .map_err(|e| format!("creating Service {name}: {e}"))?;
        answered(caller, &name).await?;
        by_name.push(started.elapsed().as_secs_f64() * 1000.0);

        let name = format!("straight-{i}");
        let started = Instant::now();
        let made = super_services
            .create(
                &PostParams::default(),
                &echo_service(&name, json!({"tenancy.x-k8s.io/name": "echo"}))?,
            )
            .await
            .map_err(|e| format!("creating Service {name}: {e}"))?;
        let address = made.spec.and_then(|s| s.cluster_ip).ok_or("no ClusterIP")?;
        answered(caller, &address).await?;
        direct.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    for i in 0..SERVICE_SAMPLES {
        let _ = tenant_services.delete(&format!("echo-{i}"), &Default::default()).await;
        let _ = tenant_services.delete(&format!("named-{i}"), &Default::default()).await;
        let _ = super_services
            .delete(&format!("straight-{i}"), &Default::default())
            .await;
    }
    let median = |mut times: Vec<f64>| {
        times.sort_by(f64::total_cmp);
        times[times.len() / 2]
    };
    let (through, by_name, direct) = (median(through), median(by_name), median(direct));
    println!(
        "\n6. A Service, from its create to the first request a tenant pod gets answered through it, median of {SERVICE_SAMPLES} (tenant Service through capn, by its super address | by name, through the tenant's DNS | made straight in the super cluster, by address)"
    );
    println!(
        "   {through:.0} ms | {by_name:.0} ms | {direct:.0} ms (+{:.0} ms, +{:.0} ms)",
        through - direct,
        by_name - direct
    );
    Ok(())
}

/// How many custom resources step 7 times.
const CUSTOM_SAMPLES: usize = 10;
/// The API group of step 7's public CRD.
const WIDGET_GROUP: &str = "bench.capn.example.com";

/// Step 7: Widgets (a public CRD of the super cluster that opts in with
/// `tenancy.x-k8s.io/sync-instances`) created one after another in `tenant`; a stand-in for
/// their operator in the super cluster sets `status.phase: Ready`. The time from each create
/// to that status in the tenant (median), and the syncer's requests per Widget: on the super
/// cluster (its audit log, the syncer's user) and on the tenants' apiservers (theirs),
/// counted once the syncer is idle again.
async fn custom_resources(tenants: &[Tenant], tenant: &Tenant, audit_log: &Path) -> Result<(), String> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
    let super_client = capn_testkit::cluster().client();
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": format!("widgets.{WIDGET_GROUP}"),
            "labels": {"tenancy.x-k8s.io/super.public": "true"},
            "annotations": {"tenancy.x-k8s.io/sync-instances": "true"}},
        "spec": {"group": WIDGET_GROUP, "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
                    "status": {"type": "object", "properties": {"phase": {"type": "string"}}}}}}}]}
    }))
    .map_err(|e| e.to_string())?;
    let crds = Api::<CustomResourceDefinition>::all(super_client.clone());
    crds.create(&PostParams::default(), &crd)
        .await
        .map_err(|e| format!("creating the Widget CRD: {e}"))?;
    let resource = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(WIDGET_GROUP, "v1", "Widget"), "widgets");
    let widgets = Api::<DynamicObject>::namespaced_with(tenant.client.clone(), "default", &resource);
    capn_testkit::poll_until(PHASE, || async {
        widgets.list(&ListParams::default().limit(1)).await.ok()
    })
    .await
    .ok_or("the tenant never served capn's copy of the Widget CRD")?;
    let operator = tokio::spawn(widget_operator(super_client.clone(), resource.clone()));
    until_idle(audit_log).await?;
    let super_before = syncer_requests(audit_log)?.len();
    let tenant_before = tenant_requests(tenants)?;
    let mut times = Vec::new();
    for i in 0..CUSTOM_SAMPLES {
        let name = format!("w{i}");
        let widget: DynamicObject = serde_json::from_value(json!({
            "apiVersion": format!("{WIDGET_GROUP}/v1"), "kind": "Widget",
            "metadata": {"name": name}, "spec": {"size": i}
        }))
        .map_err(|e| e.to_string())?;
        let started = Instant::now();
        widgets
            .create(&PostParams::default(), &widget)
            .await
            .map_err(|e| format!("creating Widget {name}: {e}"))?;
        soon(|| async {
            let status = widgets.get(&name).await.ok()?.data.get("status")?.clone();
            (status["phase"] == "Ready").then_some(())
        })
        .await
        .ok_or_else(|| format!("Widget {name}'s status never came back"))?;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    until_idle(audit_log).await?;
    let super_spent: Tally = syncer_requests(audit_log)?[super_before..]
        .iter()
        .filter(|r| r.key.resource.starts_with("widgets"))
        .map(|r| r.key.clone())
        .collect();
    // The tenant's other syncer requests meanwhile (its Nodes' heartbeats) are not the
    // Widgets'.
    let tenant_spent: Tally = tenant_requests(tenants)?
        .since(&tenant_before)
        .top(usize::MAX)
        .into_iter()
        .filter(|(key, _)| key.resource.starts_with("widgets"))
        .flat_map(|(key, n)| std::iter::repeat_n(key, usize::try_from(n).unwrap_or_default()))
        .collect();
    operator.abort();
    let _ = widgets
        .delete_collection(&Default::default(), &ListParams::default())
        .await;
    let _ = crds
        .delete(&format!("widgets.{WIDGET_GROUP}"), &Default::default())
        .await;
    times.sort_by(f64::total_cmp);
    let per = |n: u64| n as f64 / CUSTOM_SAMPLES as f64;
    println!(
        "\n7. A public custom resource (Widget), created in a tenant and served by the super cluster's operator, {CUSTOM_SAMPLES} one after another"
    );
    println!(
        "   create → status back in the tenant: median {:.0} ms (fastest {:.0} ms, slowest {:.0} ms)",
        times[times.len() / 2],
        times[0],
        times[times.len() - 1]
    );
    println!(
        "   syncer requests per custom resource: {:.1} on the super cluster, {:.1} on the tenant apiserver",
        per(super_spent.total()),
        per(tenant_spent.total())
    );
    print!("   super cluster:\n{}", super_spent.breakdown());
    print!("   tenant:\n{}", tenant_spent.breakdown());
    Ok(())
}

/// The stand-in for the Widgets' operator: every Widget in the super cluster gets
/// `status.phase: Ready`.
async fn widget_operator(client: Client, resource: kube::core::ApiResource) {
    use futures::StreamExt;
    use kube::core::DynamicObject;
    use kube::runtime::{WatchStreamExt, watcher};
    let all = Api::<DynamicObject>::all_with(client.clone(), &resource);
    let mut widgets = watcher(all, watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .boxed();
    while let Some(change) = widgets.next().await {
        let Ok(widget) = change else { continue };
        if widget.data.get("status").is_some_and(|s| s["phase"] == "Ready") {
            continue;
        }
        let api =
            Api::<DynamicObject>::namespaced_with(client.clone(), &widget.namespace().unwrap_or_default(), &resource);
        let patch = json!({"status": {"phase": "Ready"}});
        let _ = api
            .patch_status(&widget.name_any(), &PatchParams::default(), &Patch::Merge(patch))
            .await;
    }
}

/// Waits until the syncer's request count in the super cluster's audit log has stood still
/// for two seconds.
async fn until_idle(audit_log: &Path) -> Result<(), String> {
    let mut last = usize::MAX;
    let mut still = 0;
    let started = Instant::now();
    while still < 2 {
        if started.elapsed() > PHASE {
            return Err("the syncer never went idle".to_owned());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = syncer_requests(audit_log)?.len();
        still = if now == last { still + 1 } else { 0 };
        last = now;
    }
    Ok(())
}

/// A Service `name` on port 80 over the pods `selector` selects, at their port 8080.
fn echo_service(name: &str, selector: serde_json::Value) -> Result<k8s_openapi::api::core::v1::Service, String> {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"selector": selector, "ports": [{"port": 80, "targetPort": 8080}]}
    }))
    .map_err(|e| e.to_string())
}

/// Waits until the netexec pod at `caller` gets an answer from `address`:80 (its `/dial`).
async fn answered(caller: std::net::SocketAddr, address: &str) -> Result<(), String> {
    let dial = format!("/dial?request=hostname&protocol=http&host={address}&port=80&tries=1");
    soon(|| async {
        let (status, body) = capn_testkit::http_get(caller, &dial).await.ok()?;
        (status == 200 && body.contains("\"responses\"")).then_some(())
    })
    .await
    .ok_or_else(|| format!("no answer through {address}:80"))
}

/// `f`'s first `Some`, asked every 20 ms (a timing's resolution) for at most [`PHASE`].
async fn soon<T, F, Fut>(f: F) -> Option<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let started = Instant::now();
    while started.elapsed() < PHASE {
        if let Some(value) = f().await {
            return Some(value);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// The median wall time of `samples` runs of `once`, in milliseconds.
async fn median_ms<F, Fut>(samples: usize, once: F) -> Result<f64, String>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples {
        let started = Instant::now();
        once().await?;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

async fn exec_once(pods: &Api<Pod>, name: &str) -> Result<(), String> {
    let params = kube::api::AttachParams::default().stderr(false);
    let mut attached = pods
        .exec(name, ["cat", "/proc/sys/kernel/hostname"], &params)
        .await
        .map_err(|e| format!("exec into {name}: {e}"))?;
    let mut stdout = attached.stdout().ok_or("no stdout")?;
    let mut output = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut stdout, &mut output)
        .await
        .map_err(|e| e.to_string())?;
    attached.join().await.map_err(|e| e.to_string())?;
    (!output.trim().is_empty())
        .then_some(())
        .ok_or_else(|| format!("exec into {name} printed nothing"))
}

async fn logs_once(pods: &Api<Pod>, name: &str) -> Result<(), String> {
    pods.logs(name, &kube::api::LogParams::default())
        .await
        .map(drop)
        .map_err(|e| format!("logs of {name}: {e}"))
}

/// Applies the control plane `demo` in `ns`, its apiserver writing [`TENANT_AUDIT_POLICY`]'s
/// audit log to its standard output (a ConfigMap volume added by a patch, the flags by
/// `extraArgs`: what a user would do).
async fn audited_control_plane(client: &Client, ns: &str) -> Result<(), String> {
    let apply = PatchParams::apply(BENCH_USER);
    let failed = |what: &str| {
        let what = what.to_owned();
        move |e: kube::Error| format!("applying {what} in {ns}: {e}")
    };
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .patch(
            "tenant-audit-policy",
            &apply,
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "tenant-audit-policy"}, "data": {"policy.yaml": TENANT_AUDIT_POLICY}})),
        )
        .await
        .map_err(failed("the audit policy"))?;
    Api::<NestedAPIServer>::namespaced(client.clone(), ns)
        .patch(
            "demo-apiserver",
            &apply,
            &Patch::Apply(json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
                "kind": "NestedAPIServer", "metadata": {"name": "demo-apiserver"},
                "spec": {
                    "extraArgs": {"audit-policy-file": "/etc/audit/policy.yaml", "audit-log-path": "-",
                        "audit-log-format": "json"},
                    "patches": [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                        "metadata": {"name": "demo-apiserver"},
                        "spec": {"template": {"spec": {
                            "containers": [{"name": "kube-apiserver",
                                "volumeMounts": [{"name": "audit-policy", "mountPath": "/etc/audit", "readOnly": true}]}],
                            "volumes": [{"name": "audit-policy", "configMap": {"name": "tenant-audit-policy"}}]}}}}]}})),
        )
        .await
        .map_err(failed("the NestedAPIServer"))?;
    Api::<NestedControlPlane>::namespaced(client.clone(), ns)
        .patch(
            "demo",
            &apply,
            &Patch::Apply(json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
                "kind": "NestedControlPlane", "metadata": {"name": "demo"},
                "spec": {"version": "1.36", "apiserver": {"name": "demo-apiserver"}}})),
        )
        .await
        .map_err(failed("the NestedControlPlane"))
        .map(drop)
}

/// Where one Deployment's time went (see the module documentation).
struct Timeline {
    total: Duration,
    down_ms: f64,
    node_ms: f64,
    up_ms: f64,
}

/// Applies a Deployment in `tenant` and follows each pod on both sides every 50 ms.
async fn one_deployment(tenant: &Tenant, pods: usize) -> Result<Timeline, String> {
    let super_pods = Api::<Pod>::namespaced(
        capn_testkit::cluster().client(),
        &capn::syncer::names::ControlPlaneRef::new(&tenant.ns, "demo").workload_namespace(),
    );
    let tenant_pods = Api::<Pod>::namespaced(tenant.client.clone(), "default");
    let started = Instant::now();
    apply_deployment(tenant, "web", pods).await?;
    // Per tenant pod name: seen, super created, super Running, tenant Running.
    let mut seen: HashMap<String, [Option<Instant>; 4]> = HashMap::new();
    loop {
        if started.elapsed() > PHASE {
            return Err("the Deployment's pods did not all run".to_owned());
        }
        let now = Instant::now();
        let running = |p: &Pod| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        for p in tenant_pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .map_err(|e| e.to_string())?
            .items
        {
            let entry = seen.entry(p.name_any()).or_default();
            entry[0].get_or_insert(now);
            if running(&p) {
                entry[3].get_or_insert(now);
            }
        }
        for p in super_pods
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items
        {
            let Some(name) = p.annotations().get("tenancy.x-k8s.io/name").cloned() else {
                continue;
            };
            let entry = seen.entry(name).or_default();
            entry[1].get_or_insert(now);
            if running(&p) {
                entry[2].get_or_insert(now);
            }
        }
        let done = seen.values().filter(|e| e[3].is_some()).count();
        if done == pods {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let total = started.elapsed();
    let mean = |from: usize, to: usize| {
        let spans: Vec<f64> = seen
            .values()
            .filter_map(|e| Some(e[to]?.saturating_duration_since(e[from]?).as_secs_f64() * 1000.0))
            .collect();
        spans.iter().sum::<f64>() / spans.len().max(1) as f64
    };
    Ok(Timeline {
        total,
        down_ms: mean(0, 1),
        node_ms: mean(1, 2),
        up_ms: mean(2, 3),
    })
}

async fn apply_deployment(tenant: &Tenant, name: &str, replicas: usize) -> Result<(), String> {
    apply_deployment_on(tenant, name, replicas, json!({})).await
}

/// A Deployment of `replicas` pause pods in `tenant`'s `default` namespace, on the nodes
/// `node_selector` selects.
async fn apply_deployment_on(
    tenant: &Tenant,
    name: &str,
    replicas: usize,
    node_selector: serde_json::Value,
) -> Result<(), String> {
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"nodeSelector": node_selector,
                    "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10"}]}}}
    }))
    .map_err(|e| e.to_string())?;
    Api::<Deployment>::namespaced(tenant.client.clone(), "default")
        .create(&PostParams::default(), &deployment)
        .await
        .map(drop)
        .map_err(|e| format!("creating Deployment {name} in {}: {e}", tenant.ns))
}

/// The workload namespaces of `tenants`.
fn workload_namespaces(tenants: &[Tenant]) -> Vec<String> {
    tenants
        .iter()
        .map(|t| capn::syncer::names::ControlPlaneRef::new(&t.ns, "demo").workload_namespace())
        .collect()
}

/// Scales every tenant's `scale` Deployment to 0 and waits until no pod of it is left on
/// either side (their addresses free on the node).
async fn scale_to_none(tenants: &[Tenant], workload_namespaces: &[String]) -> Result<(), String> {
    for tenant in tenants {
        scale(tenant, "scale", 0).await?;
    }
    let super_client = capn_testkit::cluster().client();
    for (tenant, namespace) in tenants.iter().zip(workload_namespaces) {
        let tenant_pods = Api::<Pod>::namespaced(tenant.client.clone(), "default");
        let super_pods = Api::<Pod>::namespaced(super_client.clone(), namespace);
        capn_testkit::poll_until(PHASE, || async {
            let left = tenant_pods
                .list_metadata(&ListParams::default().labels("app=scale"))
                .await
                .ok()?;
            let copies = super_pods
                .list_metadata(&ListParams::default().labels("app=scale"))
                .await
                .ok()?;
            (left.items.is_empty() && copies.items.is_empty()).then_some(())
        })
        .await
        .ok_or_else(|| format!("the pods of scale in {} did not all go", tenant.ns))?;
    }
    Ok(())
}

async fn scale(tenant: &Tenant, name: &str, replicas: usize) -> Result<(), String> {
    Api::<Deployment>::namespaced(tenant.client.clone(), "default")
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await
        .map(drop)
        .map_err(|e| format!("scaling {name} in {}: {e}", tenant.ns))
}

async fn wait_running(tenant: &Tenant, name: &str, count: usize) -> Result<(), String> {
    let pods = Api::<Pod>::namespaced(tenant.client.clone(), "default");
    capn_testkit::poll_until(PHASE, || async {
        let list = pods
            .list(&ListParams::default().labels(&format!("app={name}")))
            .await
            .ok()?;
        let running = list
            .items
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        (running >= count).then_some(())
    })
    .await
    .ok_or_else(|| format!("{count} pods of {name} in {} did not run", tenant.ns))
}

/// The syncer's requests in the audit log so far, in order.
fn syncer_requests(audit_log: &Path) -> Result<Vec<audit::AuditedRequest>, String> {
    Ok(audit::read_log(audit_log)?
        .into_iter()
        .filter(|r| r.identity == SYNCER_USER)
        .collect())
}

/// The syncer's requests to the tenants' apiservers so far, counted from their audit logs.
fn tenant_requests(tenants: &[Tenant]) -> Result<Tally, String> {
    let mut tally = Tally::default();
    for tenant in tenants {
        let log = tenant_apiserver(tenant)?.log;
        let text = std::fs::read_to_string(&log).map_err(|e| format!("cannot read {}: {e}", log.display()))?;
        // The audit Events among the apiserver's own log lines (both are its output).
        let complete = &text[..text.rfind('\n').map_or(0, |end| end + 1)];
        let events: String = complete
            .lines()
            .filter(|line| line.starts_with("{\"kind\":\"Event\""))
            .map(|line| format!("{line}\n"))
            .collect();
        for request in audit::parse_log(&events)?
            .into_iter()
            .filter(|r| r.identity == TENANT_ADMIN)
        {
            tally.add(request.key);
        }
    }
    Ok(tally)
}

/// The tenant's apiserver container, as its runner reports it.
fn tenant_apiserver(tenant: &Tenant) -> Result<capn_testkit::runner::ContainerReport, String> {
    tenant
        .runner
        .pods()
        .into_iter()
        .find(|p| p.name == "demo-apiserver-0")
        .and_then(|p| p.containers.into_iter().find(|c| c.name == "kube-apiserver"))
        .ok_or_else(|| format!("the runner of {} has no demo-apiserver-0", tenant.ns))
}

/// Stops the tenant's apiserver process (SIGSTOP): it accepts connections (the kernel does)
/// and answers none, a hung apiserver. Returns its pid. (Its liveness probe restarts it
/// after 80 s, which ends the hang.)
fn hang_apiserver(tenant: &Tenant) -> Result<i32, String> {
    let pid = tenant_apiserver(tenant)?
        .pid
        .ok_or_else(|| format!("the apiserver of {} is not running", tenant.ns))?;
    signal(pid, "STOP")?;
    Ok(pid)
}

fn signal(pid: i32, signal: &str) -> Result<(), String> {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .map_err(|e| format!("kill -{signal} {pid}: {e}"))?;
    status
        .success()
        .then_some(())
        .ok_or_else(|| format!("kill -{signal} {pid}: {status}"))
}

/// The admin kubeconfig, impersonating [`SYNCER_USER`] in `system:masters`.
fn write_impersonating_kubeconfig(admin: &Path, path: &Path) -> Result<(), String> {
    let mut kubeconfig =
        kube::config::Kubeconfig::read_from(admin).map_err(|e| format!("cannot read {}: {e}", admin.display()))?;
    for named in &mut kubeconfig.auth_infos {
        let auth_info = named.auth_info.get_or_insert_with(Default::default);
        auth_info.impersonate = Some(SYNCER_USER.to_owned());
        auth_info.impersonate_groups = Some(vec!["system:masters".to_owned()]);
    }
    let text = serde_json::to_string_pretty(&kubeconfig).map_err(|e| e.to_string())?;
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}
