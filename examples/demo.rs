//! The newcomer's first command (`hack/demo.sh` builds what is missing, then runs this):
//! a local super cluster, capn's controllers, `examples/nestedcontrolplane.yaml` applied and
//! booted for real, the nested control plane's namespaces listed through the kubeconfig capn
//! generated, a Deployment of the tenant running on the super cluster's node through capn's
//! syncer (with the last lines of one pod's log read through the tenant), and instructions to use that kubeconfig with kubectl. Everything is removed on
//! exit or Ctrl-C.
//!
//! Needs root (the runner creates network and mount namespaces), `KUBEBUILDER_ASSETS`
//! pointing at etcd, kube-apiserver and kube-controller-manager for the super cluster, and
//! the release the example names in `hack/kube-assets.sh`'s cache (`CAPN_ASSETS_CACHE` or
//! `~/.cache/capn/assets`), which the runner runs; `hack/kube-assets.sh` builds both.
//!
//! ```sh
//! hack/demo.sh
//! # or, with the binaries built:
//! KUBEBUILDER_ASSETS=$(hack/kube-assets.sh) cargo run --example demo
//! ```

// Output must never crash the demo: Ctrl-C in `hack/demo.sh | tee log` kills `tee` first,
// and a failed print must not stop the cleanup that follows. These shadow std's macros for
// this file; the kit's own messages follow `capn_testkit::ignore_stderr_errors` (`run_demo`).
macro_rules! println {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}
macro_rules! eprintln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

use std::io::Write as _;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use capn::api::{NestedAPIServer, NestedControlPlane, NestedControllerManager, NestedEtcd};
use capn_testkit::runner::Runner;
use capn_testkit::{CapnOptions, CapnProcess};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, ResourceExt};
use tokio::signal::unix::{SignalKind, signal};

/// Where the demo's control plane lives in the super cluster (as in the README's quickstart).
const NAMESPACE: &str = "tenant-a";
/// The tenant Deployment the demo runs.
const WEB_REPLICAS: usize = 3;
/// How long the boot may take before the demo gives up.
const BOOT_TIMEOUT: Duration = Duration::from_secs(600);
/// Set in the process that runs the demo (see [`main`]).
const CHILD: &str = "CAPN_DEMO_CHILD";

/// The process the terminal sees only forwards Ctrl-C. The demo runs in a child in its own
/// process group, so that Ctrl-C reaches the demo alone, which then stops everything in
/// order, instead of reaching every etcd and apiserver of the super cluster at once.
fn main() -> ExitCode {
    if std::env::var_os(CHILD).is_some() {
        return run_demo();
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "The demo needs root: it runs the nested control plane's pods in network and mount \
             namespaces of their own. Run `hack/demo.sh` (it uses sudo when needed) or \
             `sudo -E cargo run --example demo`."
        );
        return ExitCode::from(2);
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("cannot find the demo binary: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut command = Command::new(exe);
    command
        .args(std::env::args_os().skip(1))
        .env(CHILD, "1")
        .process_group(0);
    // SAFETY: prctl(2) only, between fork and exec.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
            Ok(())
        });
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("cannot start the demo: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async move {
        let (Ok(mut term), Ok(mut hup), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::hangup()),
            signal(SignalKind::interrupt()),
        ) else {
            let _ = child.wait();
            return ExitCode::FAILURE;
        };
        let mut first: Option<Instant> = None;
        loop {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
                _ = hup.recv() => {}
                () = tokio::time::sleep(Duration::from_millis(200)) => {
                    match child.try_wait() {
                        Ok(Some(status)) => {
                            return if status.success() { ExitCode::SUCCESS } else { ExitCode::FAILURE };
                        }
                        Ok(None) => continue,
                        Err(_) => return ExitCode::FAILURE,
                    }
                }
            }
            // The first signal asks for an orderly stop; one more, a while later, insists.
            // (sudo may relay the terminal's Ctrl-C a second time: that one is ignored.)
            let signal = match first {
                None => {
                    first = Some(Instant::now());
                    libc::SIGTERM
                }
                Some(at) if at.elapsed() > Duration::from_secs(2) => libc::SIGKILL,
                Some(_) => continue,
            };
            // SAFETY: signals our own child.
            unsafe {
                libc::kill(child.id() as i32, signal);
            }
        }
    })
}

fn step(n: u32, what: &str) {
    println!("\n[{n}/7] {what}");
}

fn run_demo() -> ExitCode {
    capn_testkit::ignore_stderr_errors();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let code = runtime.block_on(demo());
    drop(runtime);
    // The super cluster is stopped and its directory removed by its at-exit hook.
    let _ = std::io::stdout().flush();
    code
}

async fn demo() -> ExitCode {
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        return ExitCode::FAILURE;
    };
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        return ExitCode::FAILURE;
    };
    let stop = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
            _ = hup.recv() => {}
        }
        println!("\nStopping: the nested control plane's processes, capn, the super cluster; removing their files.");
    };
    tokio::pin!(stop);
    let outcome = tokio::select! {
        outcome = boot() => outcome,
        // Dropping the boot stops what it had started.
        () = &mut stop => return ExitCode::from(130),
    };
    let running = match outcome {
        Ok(running) => running,
        Err(e) => {
            eprintln!("\nThe demo failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("\nPress Ctrl-C to stop the demo; it removes everything it started.");
    stop.await;
    let Running {
        runner,
        capn,
        connect,
        dir,
    } = running;
    drop(connect);
    drop(runner);
    capn.stop().await;
    drop(dir);
    println!("Cleaned up.");
    ExitCode::SUCCESS
}

/// What runs until Ctrl-C.
struct Running {
    runner: Runner,
    /// `capn run`, as a user runs it.
    capn: CapnProcess,
    /// `capn connect`, keeping the user's kubeconfig current (killed when dropped).
    connect: tokio::process::Child,
    /// The kubeconfig files given to the user, and capn's log.
    dir: tempfile::TempDir,
}

async fn boot() -> Result<Running, String> {
    let started = Instant::now();
    // Before anything starts: `capn run` runs it, and the runner for capn's own image.
    let binary = capn_binary()?;
    step(
        1,
        "Starting a local super cluster: etcd, kube-apiserver and kube-controller-manager from $KUBEBUILDER_ASSETS",
    );
    let cluster = tokio::task::spawn_blocking(capn_testkit::cluster)
        .await
        .map_err(|e| match e.try_into_panic() {
            Ok(panic) => panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "the super cluster did not start".to_owned()),
            Err(e) => e.to_string(),
        })?;
    let client = cluster.client();
    println!(
        "      up after {:.1?}; its kubeconfig: {}",
        started.elapsed(),
        cluster.kubeconfig_path().display()
    );

    let dir = tempfile::Builder::new()
        .prefix("capn-demo-")
        .tempdir()
        .map_err(|e| format!("cannot create the demo's directory: {e}"))?;
    give_to_sudo_user(dir.path());
    step(
        2,
        "Starting the runner: it plays the kubelet for capn's StatefulSets (each pod in its own network and mount namespaces)",
    );
    create_namespace(&client).await?;
    let runner = Runner::start(&client, NAMESPACE, &binary).await?;
    let releases = carried_releases()?;
    let (carried, missing): (Vec<_>, Vec<_>) = releases.iter().partition(|r| r.carried);
    println!(
        "      it runs the releases whose binaries hack/kube-assets.sh has built: Kubernetes {}",
        carried.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ")
    );
    if !missing.is_empty() {
        refuse_missing_releases(&client, &missing).await?;
        println!(
            "      not built here (an upgrade to them is refused at once, with the command that builds them): {}",
            missing.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ")
        );
    }

    step(
        3,
        &format!("Running capn: `capn run --namespace {NAMESPACE}` against the super cluster"),
    );
    // capn dials the tenant's etcd members by name: the runner's hosts file maps them. The
    // tenant Nodes' kubelet API (`kubectl logs`) listens where the tenant apiserver's pod
    // reaches this host.
    let options = CapnOptions {
        args: vec![
            "--etcd-hosts-file".to_owned(),
            runner.hosts_file().display().to_string(),
            format!("--kubelet-advertise-address={}", runner.host_address()),
            format!("--kubelet-bind-address={}:0", runner.host_address()),
        ],
        ..CapnOptions::default()
    };
    let capn = CapnProcess::start(
        &binary,
        cluster.kubeconfig_path(),
        NAMESPACE,
        dir.path().join("capn.log"),
        options,
    )?;
    println!(
        "      {} run --namespace {NAMESPACE} (pid {}, log {})",
        binary.display(),
        capn.pid(),
        capn.log_path().display()
    );

    step(
        4,
        "Applying examples/nestedcontrolplane.yaml and waiting for it to boot",
    );
    let applied = Instant::now();
    apply_example(&client, "examples/nestedcontrolplane.yaml").await?;
    wait_for_ready(&client, &runner, applied).await?;
    let boot_time = applied.elapsed();
    println!("      NestedControlPlane demo is ready: {boot_time:.1?} from apply to ready");
    // Where the time went: each component's process start → ready, and capn's share.
    let breakdown = runner.boot_breakdown(
        tokio::time::Instant::from_std(applied),
        tokio::time::Instant::from_std(applied + boot_time),
    );
    for line in breakdown.lines() {
        println!("      {line}");
    }

    step(
        5,
        "The nested control plane's namespaces, through the kubeconfig capn generated",
    );
    let secret = Api::<Secret>::namespaced(client.clone(), NAMESPACE)
        .get("demo-kubeconfig")
        .await
        .map_err(|e| format!("reading Secret demo-kubeconfig: {e}"))?;
    let kubeconfig = secret
        .data
        .as_ref()
        .and_then(|d| d.get("value"))
        .and_then(|v| String::from_utf8(v.0.clone()).ok())
        .ok_or("Secret demo-kubeconfig has no `value`")?;
    let config = runner.client_config(&kubeconfig).await?;
    let server_name = config.tls_server_name.clone().unwrap_or_default();
    let nested = Client::try_from(config).map_err(|e| e.to_string())?;
    let namespaces = Api::<Namespace>::all(nested)
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("listing the nested control plane's namespaces: {e}"))?;
    println!("      {:<20} {:<8} AGE", "NAME", "STATUS");
    for ns in &namespaces {
        let age = ns
            .creation_timestamp()
            .map(|t| {
                let secs = k8s_openapi::jiff::Timestamp::now().duration_since(t.0).as_secs().max(0);
                if secs < 120 {
                    format!("{secs}s")
                } else {
                    format!("{}m", secs / 60)
                }
            })
            .unwrap_or_default();
        let phase = ns.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
        println!("      {:<20} {:<8} {age}", ns.name_any(), phase);
    }

    step(
        6,
        "A Deployment in the tenant, run by the super cluster's node through capn's syncer",
    );
    run_web(&nested_for_workloads(&runner, &kubeconfig).await?).await?;

    step(
        7,
        &format!(
            "`capn connect demo -n {NAMESPACE}`: a kubeconfig for this machine that follows apiserver rolls and CA rotations"
        ),
    );
    write_kubeconfig(dir.path(), &kubeconfig)?;
    let verbatim = dir.path().join("demo.kubeconfig");
    let connected = dir.path().join("demo-connect.kubeconfig");
    let connect = start_connect(
        &binary,
        cluster.kubeconfig_path(),
        &connected,
        &dir.path().join("connect.log"),
    )
    .await?;
    let super_kubeconfig = cluster.kubeconfig_path().display();
    let logs = runner.dir().display();
    let capn_log = dir.path().join("capn.log");
    let capn_log = capn_log.display();
    let verbatim = verbatim.display();
    let connected = connected.display();
    let connect_log = dir.path().join("connect.log");
    let connect_log = connect_log.display();
    // `tenant-a` has a `-`, so the name is cut and hashed (docs/design.md §11, "Names").
    let workloads = capn::syncer::names::ControlPlaneRef::new(NAMESPACE, "demo").workload_namespace();
    println!(
        "
Use the nested control plane with kubectl
  The admin kubeconfig, exactly as capn wrote it (Secret {NAMESPACE}/demo-kubeconfig, key \"value\"):
      {verbatim}
  Its server, https://{server_name}:6443, is the apiserver Service's in-cluster name: it
  resolves inside the super cluster only. From this machine, use the copy `capn connect` keeps:
      export KUBECONFIG={connected}
      kubectl get namespaces
  It points at a local endpoint that reaches the apiserver through the super cluster's
  pods/portforward (a ready apiserver pod per connection, so it follows rolls), verifies the
  certificate for {server_name}, and is rewritten when capn renews the certificates or rotates
  the CA (log {connect_log}). Without the demo: `capn connect demo -n {NAMESPACE}` with your super
  cluster's kubeconfig; `capn kubeconfig demo -n {NAMESPACE}` prints the kubeconfig as it is.

  capn's objects in the super cluster:
      kubectl --kubeconfig {super_kubeconfig} -n {NAMESPACE} get nestedcontrolplanes,nestedetcds,nestedapiservers,nestedcontrollermanagers,statefulsets,secrets
  Logs: capn {capn_log}; the nested components {logs}/pods/<pod>/containers/<container>/log

  Run your own workload (the node runs registry.k8s.io/e2e-test-images/agnhost and
  registry.k8s.io/pause images, any tag; each pod becomes a pod of the super cluster's
  namespace {workloads}):
      kubectl create deployment hello --image=registry.k8s.io/e2e-test-images/agnhost:2.53 --replicas=3 -- /agnhost netexec --http-port=8080
      kubectl get pods -o wide
      kubectl logs deployment/hello
      kubectl port-forward deployment/hello 8080:8080 &  curl localhost:8080/hostname
      kubectl --kubeconfig {super_kubeconfig} -n {workloads} get pods

Apply to ready: {boot_time:.1?} (the whole demo so far: {:.1?}).",
        started.elapsed(),
    );
    Ok(Running {
        runner,
        capn,
        connect,
        dir,
    })
}

/// A client of the tenant from its kubeconfig, for the demo's own requests.
async fn nested_for_workloads(runner: &Runner, kubeconfig: &str) -> Result<Client, String> {
    let config = runner.client_config(kubeconfig).await?;
    Client::try_from(config).map_err(|e| e.to_string())
}

/// Starts the super cluster's node (and its kube-scheduler), creates the Deployment `web` of
/// 3 agnhost `netexec` pods in the tenant's `default` namespace, and waits until they run.
async fn run_web(tenant: &Client) -> Result<(), String> {
    let node = tokio::task::spawn_blocking(capn_testkit::node)
        .await
        .map_err(|_| "the super cluster's node did not start".to_owned())?;
    println!(
        "      node {} registered; the super cluster's kube-scheduler places pods on it",
        node.name()
    );
    let started = Instant::now();
    let web: k8s_openapi::api::apps::v1::Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"replicas": WEB_REPLICAS, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "agnhost",
                    "image": "registry.k8s.io/e2e-test-images/agnhost:2.53",
                    "command": ["/agnhost", "netexec", "--http-port=8080"]}]}}}
    }))
    .map_err(|e| e.to_string())?;
    Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(tenant.clone(), "default")
        .create(&PostParams::default(), &web)
        .await
        .map_err(|e| format!("creating the Deployment web in the tenant: {e}"))?;
    println!(
        "      kubectl create deployment web --image=registry.k8s.io/e2e-test-images/agnhost:2.53 --replicas={WEB_REPLICAS} -- /agnhost netexec --http-port=8080"
    );
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(tenant.clone(), "default");
    let running = capn_testkit::poll_until(BOOT_TIMEOUT, || async {
        let list = pods.list(&ListParams::default().labels("app=web")).await.ok()?;
        let running: Vec<_> = list
            .items
            .into_iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .collect();
        (running.len() == WEB_REPLICAS).then_some(running)
    })
    .await
    .ok_or("the tenant's pods did not reach Running")?;
    println!(
        "      {WEB_REPLICAS} pods Running in the tenant after {:.1?}:",
        started.elapsed()
    );
    println!("      {:<28} {:<8} {:<14} NODE", "NAME", "STATUS", "IP");
    for pod in &running {
        let status = pod.status.clone().unwrap_or_default();
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
        println!(
            "      {:<28} {:<8} {:<14} {node}",
            pod.name_any(),
            status.phase.unwrap_or_default(),
            status.pod_ip.unwrap_or_default()
        );
    }
    // `kubectl logs` through the tenant apiserver, which asks capn's kubelet API.
    if let Some(first) = running.first() {
        let params = kube::api::LogParams {
            tail_lines: Some(2),
            ..kube::api::LogParams::default()
        };
        let log = pods
            .logs(&first.name_any(), &params)
            .await
            .map_err(|e| format!("kubectl logs {} in the tenant: {e}", first.name_any()))?;
        println!("      kubectl logs {} --tail=2:", first.name_any());
        for line in log.lines() {
            println!("        {line}");
        }
    }
    Ok(())
}

async fn create_namespace(client: &Client) -> Result<(), String> {
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(NAMESPACE.to_owned()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(format!("cannot create namespace {NAMESPACE}: {e}")),
    }
}

/// Waits for the NestedControlPlane, printing each component as it becomes ready.
async fn wait_for_ready(client: &Client, runner: &Runner, applied: Instant) -> Result<(), String> {
    let ncp: Api<NestedControlPlane> = Api::namespaced(client.clone(), NAMESPACE);
    let etcd: Api<NestedEtcd> = Api::namespaced(client.clone(), NAMESPACE);
    let apiserver: Api<NestedAPIServer> = Api::namespaced(client.clone(), NAMESPACE);
    let manager: Api<NestedControllerManager> = Api::namespaced(client.clone(), NAMESPACE);
    let mut said = [false; 3];
    let deadline = Instant::now() + BOOT_TIMEOUT;
    loop {
        runner.check()?;
        let ready = [
            etcd.get_opt("demo-etcd")
                .await
                .ok()
                .flatten()
                .and_then(|e| e.status)
                .is_some_and(|s| s.ready),
            apiserver
                .get_opt("demo-apiserver")
                .await
                .ok()
                .flatten()
                .and_then(|e| e.status)
                .is_some_and(|s| s.ready),
            manager
                .get_opt("demo-controller-manager")
                .await
                .ok()
                .flatten()
                .and_then(|e| e.status)
                .is_some_and(|s| s.ready),
        ];
        for (i, name) in ["NestedEtcd", "NestedAPIServer", "NestedControllerManager"]
            .iter()
            .enumerate()
        {
            if ready[i] && !said[i] {
                said[i] = true;
                println!("      {name} ready after {:.1?}", applied.elapsed());
            }
        }
        let done = ncp
            .get_opt("demo")
            .await
            .ok()
            .flatten()
            .and_then(|n| n.status)
            .is_some_and(|s| s.ready);
        if done {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the NestedControlPlane was not ready after {BOOT_TIMEOUT:?}\n{}",
                runner.report()
            ));
        }
        // Short: the boot time printed is measured by this poll.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A Kubernetes release of the stable channel with the etcd it runs by default, and whether
/// the demo's runner has both (`hack/kube-assets.sh`'s cache, runner adaptation 1).
struct Release {
    kubernetes: String,
    etcd: String,
    carried: bool,
}

impl std::fmt::Display for Release {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (etcd {})", self.kubernetes, self.etcd)
    }
}

/// The stable channel's releases, each with whether the runner can run it.
fn carried_releases() -> Result<Vec<Release>, String> {
    let registry = capn::channel::ChannelRegistry::load(&[]).map_err(|e| e.to_string())?;
    let stable = registry.get("stable").map_err(|e| e.to_string())?;
    let cache = capn_testkit::runner::release_cache();
    let built = |dir: String, binaries: &[&str]| binaries.iter().all(|b| cache.join(&dir).join(b).is_file());
    let mut releases = Vec::new();
    for version in stable.versions(capn::component::ComponentKind::ApiServer) {
        let etcd = stable
            .index
            .etcd_for(version)
            .map(|c| c.etcd.clone())
            .ok_or_else(|| format!("the stable channel names no etcd for Kubernetes {version}"))?;
        let carried = built(
            format!("kubernetes-v{version}"),
            &["kube-apiserver", "kube-controller-manager"],
        ) && built(format!("etcd-v{etcd}"), &["etcd"]);
        releases.push(Release {
            kubernetes: version.to_string(),
            etcd,
            carried,
        });
    }
    Ok(releases)
}

/// A ValidatingAdmissionPolicy of the demo's super cluster that refuses a
/// NestedControlPlane asking for a release the runner lacks, at once and with the command
/// that builds it: without it the upgrade would wait its step timeout (30 minutes) on a pod
/// that cannot start.
async fn refuse_missing_releases(client: &Client, missing: &[&Release]) -> Result<(), String> {
    let validations: Vec<serde_json::Value> = missing
        .iter()
        .map(|r| {
            let minor = r.kubernetes.rsplit_once('.').map(|(m, _)| m).unwrap_or(&r.kubernetes);
            let names = [minor, r.kubernetes.as_str()]
                .iter()
                .flat_map(|v| [format!("'{v}'"), format!("'v{v}'")])
                .collect::<Vec<_>>()
                .join(", ");
            serde_json::json!({
                "expression": format!("!has(object.spec.version) || !(object.spec.version in [{names}])"),
                "message": format!(
                    "the demo's node has no binaries of Kubernetes {r}: build them with \
                     `KUBE_NODE_BINARIES=0 KUBE_VERSION=v{k} ETCD_VERSION=v{e} hack/kube-assets.sh` \
                     (about 15 minutes on 2 cores) and start the demo again",
                    k = r.kubernetes,
                    e = r.etcd
                ),
                "reason": "Invalid",
            })
        })
        .collect();
    let name = "capn-demo-carried-releases";
    let policy = serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [capn::api::CONTROL_PLANE_GROUP], "apiVersions": ["*"],
                "operations": ["CREATE", "UPDATE"], "resources": ["nestedcontrolplanes"],
            }]},
            "validations": validations,
        },
    });
    let binding = serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    });
    for (kind, doc) in [
        ("ValidatingAdmissionPolicy", policy),
        ("ValidatingAdmissionPolicyBinding", binding),
    ] {
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind));
        Api::<DynamicObject>::all_with(client.clone(), &resource)
            .patch(name, &PatchParams::apply("capn-demo"), &Patch::Apply(&doc))
            .await
            .map_err(|e| format!("creating the {kind} {name}: {e}"))?;
    }
    Ok(())
}

/// Writes the kubeconfig as capn wrote it, readable by its owner only (an admin credential),
/// the user who ran sudo.
fn write_kubeconfig(dir: &Path, kubeconfig: &str) -> Result<(), String> {
    let path = dir.join("demo.kubeconfig");
    std::fs::write(&path, kubeconfig).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(|e| format!("cannot chmod {}: {e}", path.display()))?;
    give_to_sudo_user(&path);
    Ok(())
}

/// Starts `capn connect demo` with the super cluster's kubeconfig, writing `kubeconfig`
/// (given to the user who ran sudo; capn connect keeps a file's owner when it rewrites it),
/// and waits until the tenant answers through it.
async fn start_connect(
    binary: &Path,
    super_kubeconfig: &Path,
    kubeconfig: &Path,
    log: &Path,
) -> Result<tokio::process::Child, String> {
    // Made first, so that the file is the user's from the start.
    std::fs::write(kubeconfig, "").map_err(|e| format!("cannot write {}: {e}", kubeconfig.display()))?;
    std::fs::set_permissions(kubeconfig, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(|e| format!("cannot chmod {}: {e}", kubeconfig.display()))?;
    give_to_sudo_user(kubeconfig);
    let stderr = std::fs::File::create(log).map_err(|e| format!("cannot write {}: {e}", log.display()))?;
    let mut child = tokio::process::Command::new(binary)
        .args(["connect", "demo", "-n", NAMESPACE, "--kubeconfig-out"])
        .arg(kubeconfig)
        .env("KUBECONFIG", super_kubeconfig)
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start capn connect: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "capn connect exited ({status}): {}",
                std::fs::read_to_string(log).unwrap_or_default()
            ));
        }
        if let Some(answered) = namespaces_through(kubeconfig).await {
            println!("      {} answers: {answered} namespaces", kubeconfig.display());
            return Ok(child);
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the tenant does not answer through {} within 60s; capn connect said: {}",
                kubeconfig.display(),
                std::fs::read_to_string(log).unwrap_or_default()
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How many namespaces the tenant lists through the kubeconfig file at `path`.
async fn namespaces_through(path: &Path) -> Option<usize> {
    let text = std::fs::read_to_string(path).ok()?;
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&text).ok()?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .ok()?;
    let client = Client::try_from(config).ok()?;
    Some(
        Api::<Namespace>::all(client)
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .len(),
    )
}

/// Creates every document of an example file in the demo's namespace, like
/// `kubectl apply -n tenant-a -f FILE` (server-side apply).
async fn apply_example(client: &Client, path: &str) -> Result<(), String> {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    let text = std::fs::read_to_string(&file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&text).map_err(|e| format!("{}: {e}", file.display()))?;
    for doc in docs.into_iter().filter(|d| !d.is_null()) {
        let api_version = doc["apiVersion"].as_str().unwrap_or_default();
        let kind = doc["kind"].as_str().unwrap_or_default();
        let name = doc["metadata"]["name"].as_str().unwrap_or_default();
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
        Api::<DynamicObject>::namespaced_with(client.clone(), NAMESPACE, &resource)
            .patch(name, &PatchParams::apply("kubectl"), &Patch::Apply(&doc))
            .await
            .map_err(|e| format!("applying {kind} {name}: {e}"))?;
        println!("      {}/{name} created", kind.to_lowercase());
    }
    Ok(())
}

/// The `capn` binary: `$CAPN_BIN`, else next to the demo's build directory
/// (`target/debug/capn`, which `hack/demo.sh` builds).
fn capn_binary() -> Result<PathBuf, String> {
    if let Some(bin) = std::env::var_os("CAPN_BIN") {
        return Ok(bin.into());
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let candidate = exe
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join("capn"))
        .filter(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "no capn binary next to {}: build it with `cargo build --bin capn` (hack/demo.sh does), or set CAPN_BIN",
                exe.display()
            )
        })?;
    Ok(candidate)
}

/// Under sudo, the files belong to the user who ran it (they hold an admin credential: they
/// stay private to that user).
fn give_to_sudo_user(path: &Path) {
    let id = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u32>().ok());
    if let (Some(uid), Some(gid)) = (id("SUDO_UID"), id("SUDO_GID")) {
        let _ = std::os::unix::fs::chown(path, Some(uid), Some(gid));
    }
}
