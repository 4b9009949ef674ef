//! Cluster API next to the test cluster (issue 5): Cluster API's real core CRDs and its real
//! core controller manager (`cluster-api-manager`, built from `sigs.k8s.io/cluster-api` by
//! `hack/capi-assets.sh`), started once per test binary by the first test that asks for it
//! with [`capi`], plus the pieces a clusterctl test needs: the assets' `clusterctl` and a
//! local provider repository ([`ProviderRepository`]).
//!
//! The assets come from `CAPI_ASSETS` when set, else from running `hack/capi-assets.sh`
//! (which builds them once, cached). Missing assets fail the test with the reason; nothing is
//! skipped.
//!
//! Cluster API's CRDs are installed after the kube-controller-manager started, so its garbage
//! collector learns the new kinds only on its next discovery resync (every 30 s). Nothing here
//! needs that: Cluster API deletes a Cluster's control plane and infrastructure objects
//! itself, and the garbage collector only has to follow owner references to capn's kinds,
//! which it knew from the start.
//!
//! The manager's webhook server runs (it does not start without a serving certificate), but
//! no webhook configuration points the apiserver at it: the CRDs are Cluster API's bases,
//! without the conversion webhooks its kustomize overlays add.

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};

use super::net::{free_ports, http_get_blocking};
use super::poll_until;
use super::process::Process;

/// Names the directory with `cluster-api-manager`, `clusterctl` and `crds/`.
pub const ASSETS_VARIABLE: &str = "CAPI_ASSETS";
/// The Cluster API release the assets are built from (`hack/capi-assets.sh`).
pub const CAPI_VERSION: &str = "v1.14.2";
/// Set to keep the manager's directory (log, webhook certificate) after the test binary ends;
/// the same variable keeps the test cluster's.
const KEEP_VARIABLE: &str = "CAPN_KEEP_TEST_CLUSTER";
const CRD_TIMEOUT: Duration = Duration::from_secs(60);
/// Generous: the manager syncs informers for every Cluster API kind before it is ready.
const MANAGER_TIMEOUT: Duration = Duration::from_secs(120);
const POLL: Duration = Duration::from_millis(200);
const FIELD_MANAGER: &str = "capn-test";

/// Cluster API running against the test cluster; get it with [`capi`].
pub struct Capi {
    assets: PathBuf,
    log: PathBuf,
}

static CAPI: OnceLock<Result<Capi, String>> = OnceLock::new();
/// What the at-exit hook stops and removes.
static RUNNING: OnceLock<(libc::pid_t, PathBuf)> = OnceLock::new();
static STOPPING: AtomicBool = AtomicBool::new(false);

/// Cluster API of this test binary: installs its CRDs into the test cluster and starts its
/// core controller manager on first use (a few seconds), then returns the same instance.
///
/// # Panics
/// If the assets are missing or cannot be built, a CRD is not established, or the manager
/// does not become ready (the message holds its log's path and last lines). Later callers
/// panic with the same message.
pub fn capi() -> &'static Capi {
    let cluster = super::cluster();
    match CAPI.get_or_init(|| start(cluster)) {
        Ok(capi) => capi,
        Err(message) => panic!("Cluster API did not start: {message}"),
    }
}

impl Capi {
    /// The directory of `cluster-api-manager`, `clusterctl` and `crds/`.
    pub fn assets_dir(&self) -> &Path {
        &self.assets
    }

    /// The `clusterctl` built from the same Cluster API release.
    pub fn clusterctl(&self) -> PathBuf {
        self.assets.join("clusterctl")
    }

    /// Where to look when a test waiting on Cluster API fails: the log's path and its last
    /// lines that mention `namespace` (the manager serves every test of the binary).
    pub fn log_report(&self, namespace: &str) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().filter(|l| l.contains(namespace)).collect();
        format!(
            "cluster-api-manager log: {} (set {KEEP_VARIABLE}=1 to keep it); its last lines about {namespace}:\n{}",
            self.log.display(),
            lines[lines.len().saturating_sub(25)..].join("\n")
        )
    }

    /// Calls `f` every 200 ms until it returns `Some`, and returns that value.
    ///
    /// # Panics
    /// Once `timeout` has passed, with `what` and [`Capi::log_report`] for `namespace`.
    pub async fn wait_until<T, F, Fut>(&self, namespace: &str, what: &str, timeout: Duration, f: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        match poll_until(timeout, f).await {
            Some(value) => value,
            None => panic!(
                "timed out after {timeout:?} waiting until {what}\n{}",
                self.log_report(namespace)
            ),
        }
    }
}

/// Starts on a dedicated thread that stays alive for the rest of the test binary, as
/// `start::start` does: `PR_SET_PDEATHSIG` is tied to the thread that forked the child.
fn start(cluster: &'static super::TestCluster) -> Result<Capi, String> {
    let assets = assets_dir()?;
    let config = cluster.config();
    let kubeconfig = cluster.kubeconfig_path().to_path_buf();
    let (sender, receiver) = mpsc::channel();
    thread::Builder::new()
        .name("capn-test-capi".to_owned())
        .spawn(move || {
            let mut manager = None;
            let result = start_on_this_thread(&assets, config, &kubeconfig, &mut manager);
            if result.is_err()
                && let Some(m) = manager.as_mut()
            {
                m.kill();
            }
            let started = result.is_ok();
            let _ = sender.send(result);
            if let (true, Some(manager)) = (started, manager) {
                supervise(manager);
            }
        })
        .map_err(|e| format!("cannot start the Cluster API thread: {e}"))?;
    receiver
        .recv()
        .map_err(|_| "the Cluster API start-up thread panicked (see its message above)".to_owned())?
}

/// `CAPI_ASSETS`, else what `hack/capi-assets.sh` prints; checked to hold what the tests use.
pub fn assets_dir() -> Result<PathBuf, String> {
    let dir = super::asset_path(ASSETS_VARIABLE, "hack/capi-assets.sh")?;
    const HINT: &str = "build or locate them with `export CAPI_ASSETS=$(hack/capi-assets.sh)`";
    for binary in ["cluster-api-manager", "clusterctl"] {
        if !dir.join(binary).is_file() {
            return Err(format!("{}: no {binary}; {HINT}", dir.display()));
        }
    }
    if crd_files(&dir.join("crds")).is_empty() {
        return Err(format!("{}/crds holds no CRD; {HINT}", dir.display()));
    }
    Ok(dir)
}

/// The YAML files of a directory, sorted.
fn crd_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// Cluster API's CRDs, parsed from the assets.
///
/// # Errors
/// A file that cannot be read or parsed.
pub fn crds(assets: &Path) -> Result<Vec<serde_json::Value>, String> {
    let mut crds = Vec::new();
    for file in crd_files(&assets.join("crds")) {
        let text = std::fs::read_to_string(&file).map_err(|e| format!("reading {}: {e}", file.display()))?;
        let docs: Vec<serde_json::Value> =
            serde_saphyr::from_multiple(&text).map_err(|e| format!("parsing {}: {e}", file.display()))?;
        crds.extend(docs.into_iter().filter(|d| d["kind"] == "CustomResourceDefinition"));
    }
    Ok(crds)
}

fn start_on_this_thread(
    assets: &Path,
    config: kube::Config,
    kubeconfig: &Path,
    manager: &mut Option<Process>,
) -> Result<Capi, String> {
    let started = Instant::now();
    let dir = tempfile::Builder::new()
        .prefix("capn-test-capi-")
        .tempdir()
        .map_err(|e| format!("cannot create the Cluster API directory: {e}"))?
        .keep();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot build a tokio runtime: {e}"))?;
    runtime.block_on(async {
        let client = kube::Client::try_from(config).map_err(|e| format!("cannot build a client: {e}"))?;
        install_crds(&client, crds(assets)?).await
    })?;
    let crds_installed = started.elapsed();

    let cert_dir = dir.join("webhook-certs");
    write_serving_certificate(&cert_dir)?;
    let [health_port, diagnostics_port, webhook_port] = free_ports()?;
    let args = vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        "--leader-elect=false".to_owned(),
        format!("--health-addr=127.0.0.1:{health_port}"),
        format!("--diagnostics-address=127.0.0.1:{diagnostics_port}"),
        "--insecure-diagnostics".to_owned(),
        format!("--webhook-port={webhook_port}"),
        format!("--webhook-cert-dir={}", cert_dir.display()),
    ];
    let process = manager.insert(Process::spawn(
        "cluster-api-manager",
        &assets.join("cluster-api-manager"),
        &args,
        &dir,
    )?);
    wait_for_readyz(process, health_port)?;
    register_at_exit(process.child.id() as libc::pid_t, dir.clone());
    eprintln!(
        "capn test cluster: Cluster API {CAPI_VERSION} core manager ready after {:.1?} (CRDs {crds_installed:.1?}); \
         log {}",
        started.elapsed(),
        process.log.display()
    );
    Ok(Capi {
        assets: assets.to_path_buf(),
        log: process.log.clone(),
    })
}

/// Server-side applies the CRDs and waits until each is Established.
async fn install_crds(client: &kube::Client, crds: Vec<serde_json::Value>) -> Result<(), String> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut names = Vec::new();
    for crd in &crds {
        let name = crd["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        api.patch(&name, &params, &Patch::Apply(crd))
            .await
            .map_err(|e| format!("applying CRD {name}: {e}"))?;
        names.push(name);
    }
    let deadline = Instant::now() + CRD_TIMEOUT;
    for name in &names {
        loop {
            let crd = api.get(name).await.map_err(|e| format!("reading CRD {name}: {e}"))?;
            let established = crd
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Established" && c.status == "True"));
            if established {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "CRD {name} not Established after {CRD_TIMEOUT:?}: {:?}",
                    crd.status
                ));
            }
            tokio::time::sleep(POLL).await;
        }
    }
    Ok(())
}

/// A self-signed serving certificate for the webhook server (`tls.crt`, `tls.key`).
fn write_serving_certificate(dir: &Path) -> Result<(), String> {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
        .map_err(|e| format!("cannot generate the webhook serving certificate: {e}"))?;
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    for (file, pem) in [
        ("tls.crt", certified.cert.pem()),
        ("tls.key", certified.signing_key.serialize_pem()),
    ] {
        std::fs::write(dir.join(file), pem).map_err(|e| format!("cannot write {file}: {e}"))?;
    }
    Ok(())
}

/// Waits until the manager's `/readyz` answers 200 (its caches synced, webhook server up).
fn wait_for_readyz(manager: &mut Process, port: u16) -> Result<(), String> {
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let deadline = Instant::now() + MANAGER_TIMEOUT;
    loop {
        manager.check_running()?;
        let last = match http_get_blocking(address, "/readyz") {
            Ok((200, _)) => return Ok(()),
            Ok((status, body)) => format!("{status} {body}"),
            Err(e) => e.to_string(),
        };
        if Instant::now() > deadline {
            return Err(manager.failure(&format!(
                "was not ready after {MANAGER_TIMEOUT:?} (last /readyz answer: {last})"
            )));
        }
        thread::sleep(POLL);
    }
}

/// Keeps the manager's parent thread alive and reports (straight to stderr) if it dies.
fn supervise(mut manager: Process) {
    loop {
        thread::sleep(Duration::from_millis(500));
        if STOPPING.load(Ordering::SeqCst) {
            continue;
        }
        if let Err(report) = manager.check_running() {
            let _ = writeln!(
                std::io::stderr(),
                "capn test cluster: {report}\n(Cluster API tests after this will fail)"
            );
            return;
        }
    }
}

fn register_at_exit(pid: libc::pid_t, dir: PathBuf) {
    if RUNNING.set((pid, dir)).is_ok() {
        // SAFETY: registers a plain function; it runs once at `exit`, before the test
        // cluster's hook (registered earlier), so the manager stops before its apiserver.
        unsafe {
            libc::atexit(stop_at_exit);
        }
    }
}

extern "C" fn stop_at_exit() {
    STOPPING.store(true, Ordering::SeqCst);
    let Some((pid, dir)) = RUNNING.get() else {
        return;
    };
    // SAFETY: signals and reaps our own child by pid.
    unsafe {
        libc::kill(*pid, libc::SIGKILL);
        libc::waitpid(*pid, std::ptr::null_mut(), 0);
    }
    if std::env::var_os(KEEP_VARIABLE).is_none_or(|keep| keep.is_empty() || keep == "0") {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// A clusterctl provider repository on disk (clusterctl's "local repository": a
/// `{base}/{provider-label}/{version}/{file}` layout) and the clusterctl configuration file
/// that names it, so `clusterctl` runs offline. `$HOME` and `$XDG_CONFIG_HOME` point into it,
/// so no user configuration or override leaks in.
pub struct ProviderRepository {
    dir: tempfile::TempDir,
    providers: Vec<String>,
    cert_manager: Option<(String, String)>,
}

impl Default for ProviderRepository {
    fn default() -> Self {
        Self::new()
    }
}

impl ProviderRepository {
    /// An empty repository in a new temporary directory (removed on drop).
    ///
    /// # Panics
    /// If the directory cannot be created.
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("capn-test-clusterctl-")
            .tempdir()
            .expect("a temporary directory for the provider repository");
        Self {
            dir,
            providers: Vec::new(),
            cert_manager: None,
        }
    }

    /// Adds provider `name` of clusterctl type `type_` (`CoreProvider`,
    /// `BootstrapProvider`, `ControlPlaneProvider`, `InfrastructureProvider`) at `version`:
    /// writes `files` (name, contents) into its version directory, and registers the first
    /// one as its components file.
    ///
    /// # Panics
    /// If a file cannot be written.
    pub fn add(&mut self, name: &str, type_: &str, version: &str, files: &[(&str, String)]) -> &mut Self {
        let label = match type_ {
            "CoreProvider" => name.to_owned(),
            "BootstrapProvider" => format!("bootstrap-{name}"),
            "ControlPlaneProvider" => format!("control-plane-{name}"),
            "InfrastructureProvider" => format!("infrastructure-{name}"),
            other => panic!("unknown clusterctl provider type {other}"),
        };
        let dir = self.write(&label, version, files);
        self.providers.push(format!(
            "- name: {name}\n  type: {type_}\n  url: file://{}/{}\n",
            dir.display(),
            files[0].0
        ));
        self
    }

    /// The repository's root directory: `<root>/<provider-label>/<version>/<file>`.
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("repository")
    }

    /// Replaces the configuration's entries for provider `name` with `entries`, YAML list
    /// items as a user writes them in `clusterctl.yaml` (a documented configuration, with
    /// its URLs pointed into [`ProviderRepository::root`]).
    pub fn declare(&mut self, name: &str, entries: &str) -> &mut Self {
        let prefix = format!("- name: {name}\n");
        self.providers.retain(|p| !p.starts_with(&prefix));
        let mut entries = entries.to_owned();
        if !entries.ends_with('\n') {
            entries.push('\n');
        }
        self.providers.push(entries);
        self
    }

    /// Points clusterctl's cert-manager installation at `files` (the first is the
    /// components file) instead of cert-manager's GitHub releases.
    ///
    /// # Panics
    /// If a file cannot be written.
    pub fn cert_manager(&mut self, version: &str, files: &[(&str, String)]) -> &mut Self {
        let dir = self.write("cert-manager", version, files);
        self.cert_manager = Some((format!("file://{}/{}", dir.display(), files[0].0), version.to_owned()));
        self
    }

    fn write(&self, label: &str, version: &str, files: &[(&str, String)]) -> PathBuf {
        let dir = self.dir.path().join("repository").join(label).join(version);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        for (file, contents) in files {
            std::fs::write(dir.join(file), contents).unwrap_or_else(|e| panic!("writing {file}: {e}"));
        }
        dir
    }

    /// Writes the clusterctl configuration file and returns its path.
    ///
    /// # Panics
    /// If it cannot be written.
    pub fn config_file(&self) -> PathBuf {
        let mut text = format!("providers:\n{}", self.providers.concat());
        if let Some((url, version)) = &self.cert_manager {
            text.push_str(&format!("cert-manager:\n  url: {url}\n  version: {version}\n"));
        }
        let path = self.dir.path().join("clusterctl.yaml");
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        path
    }

    /// Runs `clusterctl` with `args` and this repository's configuration, offline (no version
    /// check), with `$HOME` inside the repository. Returns (success, stdout, stderr).
    ///
    /// # Panics
    /// If clusterctl cannot be started.
    pub async fn clusterctl(&self, capi: &Capi, args: &[&str]) -> (bool, String, String) {
        let config = self.config_file();
        let home = self.dir.path().join("home");
        std::fs::create_dir_all(&home).unwrap_or_else(|e| panic!("creating {}: {e}", home.display()));
        let output = tokio::process::Command::new(capi.clusterctl())
            .args(args)
            .arg(format!("--config={}", config.display()))
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &home)
            .env("XDG_CONFIG_HOME", home.join(".config"))
            .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
            .current_dir(self.dir.path())
            .kill_on_drop(true)
            .output()
            .await
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", capi.clusterctl().display()));
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }
}
