//! Starting the super cluster: etcd, kube-apiserver, capn's CRDs, kube-controller-manager.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use base64::Engine as _;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

use super::TestCluster;
use super::net::free_ports;
use super::process::Process;

/// The variable naming the directory with `etcd`, `kube-apiserver` and
/// `kube-controller-manager`, as for controller-runtime's envtest.
const ASSETS_VARIABLE: &str = "KUBEBUILDER_ASSETS";
/// Set to keep the cluster directory (logs, kubeconfig, etcd data) after the test binary ends.
const KEEP_VARIABLE: &str = "CAPN_KEEP_TEST_CLUSTER";
const ETCD_TIMEOUT: Duration = Duration::from_secs(30);
/// Generous: on two busy cores a debug build may compile next to the apiserver start.
const APISERVER_TIMEOUT: Duration = Duration::from_secs(120);
const CRD_TIMEOUT: Duration = Duration::from_secs(60);
const CONTROLLER_MANAGER_TIMEOUT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(100);
/// Field manager of the CRD server-side apply.
const FIELD_MANAGER: &str = "capn-test";

/// What the at-exit hook stops and removes.
struct Running {
    pids: Vec<libc::pid_t>,
    dir: PathBuf,
}

static RUNNING: OnceLock<Running> = OnceLock::new();
/// Set once the test binary exits, so the supervisor does not report the kills as crashes.
static STOPPING: AtomicBool = AtomicBool::new(false);

/// What a cluster differs in from the default test cluster, which
/// `StartOptions::default()` describes.
#[derive(Clone, Debug, Default)]
pub struct StartOptions {
    /// Appended to kube-apiserver's flags, where a later flag overrides an earlier one (the
    /// benchmark's audit log and its larger ClusterIP range).
    pub extra_apiserver_args: Vec<String>,
}

/// Variable with extra kube-apiserver flags for the cluster [`crate::cluster`] starts,
/// separated by whitespace (a benchmark's audit log; the tests set none).
pub const APISERVER_ARGS_VARIABLE: &str = "CAPN_TEST_CLUSTER_APISERVER_ARGS";

impl StartOptions {
    /// The options [`APISERVER_ARGS_VARIABLE`] asks for; the default when it is unset.
    pub fn from_env() -> Self {
        let args = std::env::var(APISERVER_ARGS_VARIABLE).unwrap_or_default();
        Self {
            extra_apiserver_args: args.split_whitespace().map(str::to_owned).collect(),
        }
    }
}

/// Starts the cluster, or says why it could not (with the failing binary's log tail).
///
/// Start-up runs on a dedicated thread that then stays alive for the rest of the test binary:
/// `PR_SET_PDEATHSIG` is tied to the forking thread, and libtest ends each test's thread when
/// the test ends. That thread also reports any binary that dies while tests run.
pub(super) fn start(options: StartOptions) -> Result<TestCluster, String> {
    if RUNNING.get().is_some() {
        // The at-exit clean-up knows one cluster per process.
        return Err("a test cluster already runs in this process".to_owned());
    }
    let assets = assets_dir()?;
    let (sender, receiver) = mpsc::channel();
    thread::Builder::new()
        .name("capn-test-cluster".to_owned())
        .spawn(move || {
            let mut processes = Vec::new();
            let result = start_on_this_thread(assets, &options, &mut processes);
            if result.is_err() {
                processes.iter_mut().for_each(Process::kill);
            }
            let started = result.is_ok();
            let _ = sender.send(result);
            if started {
                supervise(processes);
            }
        })
        .map_err(|e| format!("cannot start the test cluster thread: {e}"))?;
    receiver
        .recv()
        .map_err(|_| "the test cluster start-up thread panicked (see its message above)".to_owned())?
}

/// The assets directory from `KUBEBUILDER_ASSETS`, checked to hold the three binaries.
fn assets_dir() -> Result<PathBuf, String> {
    const HINT: &str = "the integration tests run a real etcd, kube-apiserver and \
        kube-controller-manager; build or locate them with \
        `export KUBEBUILDER_ASSETS=$(hack/kube-assets.sh)` (from the repository root)";
    let dir = std::env::var_os(ASSETS_VARIABLE)
        .filter(|dir| !dir.is_empty())
        .ok_or_else(|| format!("{ASSETS_VARIABLE} is not set: {HINT}"))?;
    let dir = PathBuf::from(dir);
    for binary in ["etcd", "kube-apiserver", "kube-controller-manager"] {
        if !dir.join(binary).is_file() {
            return Err(format!("{ASSETS_VARIABLE}={} has no {binary}: {HINT}", dir.display()));
        }
    }
    Ok(dir)
}

fn start_on_this_thread(
    assets: PathBuf,
    options: &StartOptions,
    processes: &mut Vec<Process>,
) -> Result<TestCluster, String> {
    let started = Instant::now();
    // What was up when, for the start-up line: shows which binary got slow.
    let mut milestones: Vec<(&str, Duration)> = Vec::new();
    let dir = tempfile::Builder::new()
        .prefix("capn-test-cluster-")
        .tempdir()
        .map_err(|e| format!("cannot create the test cluster directory: {e}"))?
        .keep();
    // Logs must survive a failed start; the at-exit hook removes the directory after a good one.
    let in_dir = |what: String| format!("{what}\n(test cluster directory: {})", dir.display());
    let [etcd_port, etcd_peer_port, apiserver_port, controller_manager_port] = free_ports().map_err(in_dir)?;

    let files = write_credentials(&dir).map_err(in_dir)?;

    let etcd_url = format!("http://127.0.0.1:{etcd_port}");
    processes.push(Process::spawn(
        "etcd",
        &assets.join("etcd"),
        &etcd_args(&dir, &etcd_url, etcd_peer_port),
        &dir,
    )?);
    wait_for_etcd(&mut processes[0], etcd_port)?;
    milestones.push(("etcd", started.elapsed()));

    let cert_dir = dir.join("apiserver-certs");
    let mut args = apiserver_args(&etcd_url, apiserver_port, &cert_dir, &files);
    args.extend(options.extra_apiserver_args.iter().cloned());
    processes.push(Process::spawn(
        "kube-apiserver",
        &assets.join("kube-apiserver"),
        &args,
        &dir,
    )?);
    let ca = wait_for_serving_ca(&mut processes[1], &cert_dir.join("apiserver.crt"))?;
    let kubeconfig = dir.join("kubeconfig");
    let server = format!("https://127.0.0.1:{apiserver_port}");
    let kubeconfig_text = kubeconfig_yaml(&server, &ca, &files.token);
    std::fs::write(&kubeconfig, &kubeconfig_text).map_err(|e| format!("cannot write {}: {e}", kubeconfig.display()))?;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot build a tokio runtime: {e}"))?;
    let config = runtime.block_on(async {
        let config = Kubeconfig::from_yaml(&kubeconfig_text)
            .map_err(|e| format!("the generated kubeconfig does not parse: {e}"))?;
        let config = kube::Config::from_custom_kubeconfig(config, &KubeConfigOptions::default())
            .await
            .map_err(|e| format!("the generated kubeconfig is not usable: {e}"))?;
        let client = kube::Client::try_from(config.clone())
            .map_err(|e| format!("cannot build a client for the apiserver: {e}"))?;
        wait_for_ok(&mut processes[1], &client, "/readyz", APISERVER_TIMEOUT).await?;
        milestones.push(("kube-apiserver", started.elapsed()));
        // Before the controller manager starts: its garbage collector finds new resource
        // types only on a 30 s discovery resync, and must know capn's kinds as owners.
        install_crds(&client)
            .await
            .map_err(|e| processes[1].failure(&format!("did not establish capn's CRDs: {e}")))?;
        milestones.push(("CRDs", started.elapsed()));
        Ok::<_, String>(config)
    })?;

    processes.push(Process::spawn(
        "kube-controller-manager",
        &assets.join("kube-controller-manager"),
        &controller_manager_args(&kubeconfig, controller_manager_port, &files),
        &dir,
    )?);
    runtime.block_on(wait_for_controller_manager(&mut processes[2], controller_manager_port))?;
    milestones.push(("kube-controller-manager", started.elapsed()));

    let pids: Vec<(&'static str, u32)> = processes.iter().map(|p| (p.name, p.child.id())).collect();
    register_at_exit(Running {
        pids: pids.iter().map(|&(_, pid)| pid as libc::pid_t).collect(),
        dir: dir.clone(),
    });
    let milestones: Vec<String> = milestones
        .iter()
        .map(|(what, when)| format!("{what} {when:.1?}"))
        .collect();
    eprintln!(
        "capn test cluster: up at {server} (ready after: {}); kubeconfig, logs and etcd data in {} \
         (set {KEEP_VARIABLE}=1 to keep them after the tests)",
        milestones.join(", "),
        dir.display()
    );
    Ok(TestCluster {
        config,
        kubeconfig,
        assets,
        pids,
    })
}

fn etcd_args(dir: &Path, etcd_url: &str, peer_port: u16) -> Vec<String> {
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    vec![
        format!("--data-dir={}", dir.join("etcd").display()),
        format!("--listen-client-urls={etcd_url}"),
        format!("--advertise-client-urls={etcd_url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        "--name=capn-test".to_owned(),
        format!("--initial-cluster=capn-test={peer_url}"),
        // A throw-away store: durability across power loss buys nothing here.
        "--unsafe-no-fsync".to_owned(),
        // One member has no peer to lose: elect it after 0.1 s, not the default 1-2 s.
        "--heartbeat-interval=10".to_owned(),
        "--election-timeout=100".to_owned(),
    ]
}

fn apiserver_args(etcd_url: &str, port: u16, cert_dir: &Path, files: &Credentials) -> Vec<String> {
    vec![
        format!("--etcd-servers={etcd_url}"),
        "--bind-address=127.0.0.1".to_owned(),
        "--advertise-address=127.0.0.1".to_owned(),
        format!("--secure-port={port}"),
        // No serving certificate given: the apiserver self-signs one into this directory.
        format!("--cert-dir={}", cert_dir.display()),
        format!("--service-account-key-file={}", files.public_key.display()),
        format!("--service-account-signing-key-file={}", files.private_key.display()),
        "--service-account-issuer=https://kubernetes.default.svc".to_owned(),
        "--authorization-mode=RBAC".to_owned(),
        format!("--token-auth-file={}", files.tokens.display()),
        format!("--service-cluster-ip-range={}", crate::SUPER_SERVICE_CIDR),
        // The test node's kubelet API (logs, exec, port-forward) is at its InternalDNS (its
        // InternalIP serves node ports; node adaptation 9); the runners' Nodes have only an
        // InternalIP; a hostname resolves nowhere.
        "--kubelet-preferred-address-types=InternalDNS,InternalIP".to_owned(),
    ]
}

fn controller_manager_args(kubeconfig: &Path, port: u16, files: &Credentials) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        // The StatefulSet controller stays off: tests write StatefulSet status as the
        // kubelet and that controller would (docs/reference.md, "Standing in for the kubelet").
        // The ResourceQuota controller runs: without the usage it records, the API server
        // refuses every pod in a namespace with a quota (the syncer's workload namespaces).
        // The PersistentVolume controller binds the syncer's claim copies to volumes, and
        // the two protection controllers lift the finalizers the API server's admission puts
        // on every claim and volume, once unused (without them no claim or volume is ever
        // deleted). The EndpointSlice controller gives Services their endpoints, which the
        // test node's kube-proxy routes ClusterIPs to. The ClusterRole aggregation controller
        // fills the aggregated ClusterRole capn ships for the synced custom resource kinds.
        // The HorizontalPodAutoscaler controller drives a control plane's scale subresource.
        "--controllers=garbagecollector,namespace,resourcequota,persistentvolume-binder,pvc-protection,pv-protection,endpointslice,clusterrole-aggregation,horizontalpodautoscaling"
            .to_owned(),
        "--leader-elect=false".to_owned(),
        "--bind-address=127.0.0.1".to_owned(),
        format!("--secure-port={port}"),
        format!("--service-account-private-key-file={}", files.private_key.display()),
    ]
}

struct Credentials {
    private_key: PathBuf,
    public_key: PathBuf,
    tokens: PathBuf,
    token: String,
}

/// The service-account key pair and the static token file with the admin token.
fn write_credentials(dir: &Path) -> Result<Credentials, String> {
    let write = |name: &str, contents: &str| {
        let path = dir.join(name);
        std::fs::write(&path, contents)
            .map(|()| path.clone())
            .map_err(|e| format!("cannot write {}: {e}", path.display()))
    };
    let key = rcgen::KeyPair::generate().map_err(|e| format!("cannot generate the service-account key: {e}"))?;
    let private_key = write("service-account.key", &key.serialize_pem())?;
    let public_key = write("service-account.pub", &key.public_key_pem())?;
    let token = random_token()?;
    // token,user,uid,"groups": system:masters passes every authorizer, RBAC included.
    let tokens = write(
        "tokens.csv",
        &format!("{token},capn-test-admin,capn-test-admin,\"system:masters\"\n"),
    )?;
    Ok(Credentials {
        private_key,
        public_key,
        tokens,
        token,
    })
}

fn random_token() -> Result<String, String> {
    let mut bytes = [0u8; 24];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| random.read_exact(&mut bytes))
        .map_err(|e| format!("cannot read /dev/urandom: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Waits until etcd answers `GET /health` with `"health":"true"` (plain HTTP/1.0 over TCP).
fn wait_for_etcd(etcd: &mut Process, port: u16) -> Result<(), String> {
    let deadline = Instant::now() + ETCD_TIMEOUT;
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    loop {
        etcd.check_running()?;
        let answer = (|| {
            let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(1))?;
            stream.set_read_timeout(Some(Duration::from_secs(2)))?;
            stream.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
            let mut answer = String::new();
            stream.read_to_string(&mut answer)?;
            Ok::<_, std::io::Error>(answer)
        })();
        let last = match answer {
            Ok(answer) if answer.contains(r#""health":"true""#) => return Ok(()),
            Ok(answer) => answer,
            Err(e) => e.to_string(),
        };
        if Instant::now() > deadline {
            return Err(etcd.failure(&format!("was not healthy after {ETCD_TIMEOUT:?} (last answer: {last})")));
        }
        thread::sleep(POLL);
    }
}

/// Waits for the apiserver's self-signed serving bundle and returns its CA certificate as PEM.
///
/// `--cert-dir` makes the apiserver write `apiserver.crt` holding the serving certificate and
/// then the CA that signed it; clients trust only the CA.
fn wait_for_serving_ca(apiserver: &mut Process, bundle: &Path) -> Result<String, String> {
    let deadline = Instant::now() + APISERVER_TIMEOUT;
    loop {
        apiserver.check_running()?;
        if let Ok(pem) = std::fs::read(bundle) {
            for block in x509_parser::pem::Pem::iter_from_buffer(&pem).flatten() {
                if block.parse_x509().is_ok_and(|cert| cert.is_ca()) {
                    return Ok(to_pem(&block.contents));
                }
            }
        }
        if Instant::now() > deadline {
            return Err(apiserver.failure(&format!(
                "wrote no CA certificate to {} within {APISERVER_TIMEOUT:?}",
                bundle.display()
            )));
        }
        thread::sleep(POLL);
    }
}

fn to_pem(der: &[u8]) -> String {
    let base64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in base64.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(line).unwrap_or_default());
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}

fn kubeconfig_yaml(server: &str, ca_pem: &str, token: &str) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: capn-test
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: capn-test-admin
  user:
    token: {token}
contexts:
- name: capn-test
  context:
    cluster: capn-test
    user: capn-test-admin
current-context: capn-test
"
    )
}

/// Waits until `process` answers `path` (`/readyz`, `/healthz`) with `ok` through `client`,
/// for at most `timeout`; fails at once when the process exits, and names the last answer.
pub(crate) async fn wait_for_ok(
    process: &mut Process,
    client: &kube::Client,
    path: &str,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        process.check_running()?;
        let request = http::Request::get(path).body(Vec::new()).map_err(|e| e.to_string())?;
        let last = match client.request_text(request).await {
            Ok(body) if body.trim() == "ok" => return Ok(()),
            Ok(body) => body,
            Err(e) => e.to_string(),
        };
        if Instant::now() > deadline {
            return Err(process.failure(&format!(
                "did not answer {path} with ok after {timeout:?} (last answer: {last})"
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Server-side applies `capn::crds::crds()` and waits until each one is Established.
async fn install_crds(client: &kube::Client) -> Result<(), String> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let crds = capn::crds::crds();
    for crd in &crds {
        let name = crd.metadata.name.as_deref().unwrap_or_default();
        api.patch(name, &params, &Patch::Apply(crd))
            .await
            .map_err(|e| format!("applying {name}: {e}"))?;
    }
    let deadline = Instant::now() + CRD_TIMEOUT;
    let mut last_established = None;
    for crd in &crds {
        let name = crd.metadata.name.as_deref().unwrap_or_default();
        loop {
            let current = api.get(name).await.map_err(|e| format!("reading {name}: {e}"))?;
            if let Some(at) = established_at(&current) {
                last_established = last_established.max(Some(at));
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{name} not Established after {CRD_TIMEOUT:?}: {:?}",
                    current.status
                ));
            }
            tokio::time::sleep(POLL).await;
        }
    }
    // kube-apiserver holds every create of a custom resource for 2 s while its CRD was
    // Established less than 2 s ago (apiextensions-apiserver, customresource_handler.go: so
    // that in HA another server has seen the CRD too). A super cluster's CRDs are older than
    // that; without this wait, the first provisioning after start-up (the demo's, the N = 1
    // benchmark's) counted that pause as capn's: 2.0 s for each component's create. The
    // condition's time has whole seconds, as the server's own comparison does.
    if let Some(at) = last_established {
        let age = Timestamp::now().duration_since(at);
        if let Ok(left) = Duration::try_from(CRD_JUST_CREATED - age) {
            tokio::time::sleep(left).await;
        }
    }
    Ok(())
}

/// How long kube-apiserver treats a CRD as just created, from its Established condition's
/// lastTransitionTime (apiextensions-apiserver's `justCreated`, 2 s), with 100 ms to spare.
const CRD_JUST_CREATED: SignedDuration = SignedDuration::from_millis(2100);

/// When `crd` became Established, or `None` while it is not.
fn established_at(crd: &CustomResourceDefinition) -> Option<Timestamp> {
    crd.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Established" && c.status == "True")
        .map(|c| c.last_transition_time.as_ref().map_or(Timestamp::UNIX_EPOCH, |t| t.0))
}

/// Waits for `/healthz` on the controller manager's secure port.
///
/// Its serving certificate is generated in memory and never written anywhere, so this one
/// probe skips certificate verification; `/healthz` needs no credentials.
async fn wait_for_controller_manager(controller_manager: &mut Process, port: u16) -> Result<(), String> {
    let url = format!("https://127.0.0.1:{port}")
        .parse()
        .map_err(|e| format!("bad controller manager URL: {e}"))?;
    let mut config = kube::Config::new(url);
    config.accept_invalid_certs = true;
    let client =
        kube::Client::try_from(config).map_err(|e| format!("cannot build a client for the controller manager: {e}"))?;
    wait_for_ok(controller_manager, &client, "/healthz", CONTROLLER_MANAGER_TIMEOUT).await
}

/// Runs for the rest of the test binary, keeping the children's parent thread alive and
/// reporting a binary that dies under the tests (straight to stderr: libtest would capture it).
fn supervise(mut processes: Vec<Process>) {
    loop {
        thread::sleep(Duration::from_millis(500));
        if STOPPING.load(Ordering::SeqCst) {
            continue;
        }
        processes.retain_mut(|process| match process.check_running() {
            Ok(()) => true,
            Err(report) => {
                if !STOPPING.load(Ordering::SeqCst) {
                    let _ = writeln!(
                        std::io::stderr(),
                        "capn test cluster: {report}\n(tests after this will fail)"
                    );
                }
                false
            }
        });
    }
}

fn register_at_exit(running: Running) {
    if RUNNING.set(running).is_ok() {
        // SAFETY: registers a plain function; it runs once at `exit`.
        unsafe {
            libc::atexit(stop_at_exit);
        }
    }
}

/// Kills the binaries and removes the cluster directory when the test binary exits
/// (`PR_SET_PDEATHSIG` alone would leave etcd's data behind in the temp directory).
extern "C" fn stop_at_exit() {
    STOPPING.store(true, Ordering::SeqCst);
    let Some(running) = RUNNING.get() else {
        return;
    };
    for &pid in &running.pids {
        // SAFETY: signals and reaps our own children by pid.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
    }
    if std::env::var_os(KEEP_VARIABLE).is_none_or(|keep| keep.is_empty() || keep == "0") {
        let _ = std::fs::remove_dir_all(&running.dir);
    }
}
