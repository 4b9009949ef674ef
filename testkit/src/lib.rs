//! capn's test kit (docs/design.md §8), shared by the integration tests (`tests/integration`),
//! the benchmark (`benches/provisioning`) and the demo (`examples/demo.rs`): one real super
//! cluster per process — etcd, kube-apiserver and kube-controller-manager from
//! `KUBEBUILDER_ASSETS`, as controller-runtime's envtest does — with capn's CRDs installed,
//! plus helpers every behaviour test needs: its own namespace, standing in for the kubelet on
//! StatefulSets, and polling with a deadline.
//!
//! The controller manager runs only the garbage collector and the namespace controller. No
//! kubelet and no StatefulSet controller run, so nothing ever becomes ready by itself: tests
//! say when with [`mark_statefulset_ready`], or start a [`runner::Runner`], which runs the pods
//! of capn's StatefulSets for real and reports their probes' verdicts.
//!
//! For counting requests (issue 11): [`requests`] names them by verb and resource,
//! [`counting`] counts what a client sends, [`audit`] reads the API server's audit log, and
//! [`stand_in`] marks every StatefulSet ready as soon as it appears, driven by a watch.
//!
//! A library cannot name the `capn` binary (`CARGO_BIN_EXE_capn` exists only in the root
//! package's tests and benches), so whatever runs it takes its path from the caller.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams, PostParams};

/// Set by [`ignore_stderr_errors`]: the kit's messages then ignore a stderr that is gone.
static IGNORE_STDERR_ERRORS: AtomicBool = AtomicBool::new(false);

/// Makes the kit's messages to stderr ignore write errors instead of panicking, for a program
/// that must outlive its stderr: the demo, where Ctrl-C in `hack/demo.sh 2>&1 | tee log` ends
/// `tee` first, and a failed print must not stop the cleanup that follows. Tests leave it off:
/// std's `eprintln!` is the only way into libtest's output capture.
pub fn ignore_stderr_errors() {
    IGNORE_STDERR_ERRORS.store(true, Ordering::Relaxed);
}

// Shadows std's macro in every module below (textual scope), for [`ignore_stderr_errors`].
macro_rules! eprintln {
    ($($arg:tt)*) => {{
        if $crate::IGNORE_STDERR_ERRORS.load(std::sync::atomic::Ordering::Relaxed) {
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr(), $($arg)*);
        } else {
            std::eprintln!($($arg)*);
        }
    }};
}

pub mod audit;
pub mod capi;
pub mod counting;
pub mod net;
pub mod process;
pub mod requests;
pub mod runner;
pub use runner::node::{MAX_PODS_VARIABLE, Node, node};
pub mod s3;
pub mod stand_in;
mod start;
pub mod usage;

pub use net::{free_ports, http_get};
pub use process::{CapnOptions, CapnProcess};
pub use start::{APISERVER_ARGS_VARIABLE, StartOptions};

/// How often [`wait_until`] asks again.
const POLL_INTERVAL: Duration = Duration::from_millis(200);
/// Prefix of the namespaces [`test_namespace`] creates.
const NAMESPACE_PREFIX: &str = "capn-test-";
/// Field manager of the StatefulSet status that [`mark_statefulset_ready`] writes.
/// The test super cluster's service CIDR (its apiserver's `--service-cluster-ip-range`): a
/// tenant whose service CIDR is this one gets dialable ClusterIPs (a Service's copy takes
/// the tenant Service's address when it is free here).
pub const SUPER_SERVICE_CIDR: &str = "10.0.0.0/24";

pub const STATEFULSET_STATUS_MANAGER: &str = "capn-test-statefulset-controller";

/// The repository's root (the kit lives in `testkit/`): where `hack/` is.
fn repository() -> &'static Path {
    let kit = Path::new(env!("CARGO_MANIFEST_DIR"));
    kit.parent().unwrap_or(kit)
}

/// The path in the environment variable `variable`, else the one the repository's `script`
/// (`hack/…-assets.sh`, which builds what is missing) prints on stdout.
///
/// # Errors
/// The variable is unset and the script cannot run or fails (with its stderr).
fn asset_path(variable: &str, script: &str) -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(variable).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    let script = repository().join(script);
    let output = std::process::Command::new(&script)
        .current_dir(repository())
        .output()
        .map_err(|e| format!("{variable} is not set and {} cannot run: {e}", script.display()))?;
    if !output.status.success() {
        return Err(format!(
            "{variable} is not set and {} failed ({}):\n{}",
            script.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()))
}

/// The running super cluster; get it with [`cluster`].
pub struct TestCluster {
    config: kube::Config,
    kubeconfig: PathBuf,
    assets: PathBuf,
    /// Each binary's name (`etcd`, `kube-apiserver`, `kube-controller-manager`) and pid.
    pids: Vec<(&'static str, u32)>,
}

static CLUSTER: OnceLock<Result<TestCluster, String>> = OnceLock::new();

/// The super cluster of this test binary, started by the first caller (3-5 s here) and
/// shared by all tests; its binaries are killed when the test binary exits.
///
/// # Panics
/// If `KUBEBUILDER_ASSETS` is unset or lacks a binary, or a binary fails to start (the
/// message holds the end of its log and the path of the log file). Every later caller panics
/// with the same message instead of starting again.
pub fn cluster() -> &'static TestCluster {
    match CLUSTER.get_or_init(|| start::start(StartOptions::from_env())) {
        Ok(cluster) => cluster,
        Err(message) => panic!("the test cluster did not start: {message}"),
    }
}

/// Starts a super cluster like [`cluster`]'s but with `options` (the benchmark's audit log),
/// for a program that is not a test binary. At most one cluster runs per process: this
/// fails if [`cluster`] or this function started one before.
///
/// # Errors
/// As [`cluster`] panics, plus the one-per-process rule.
pub fn start_cluster(options: StartOptions) -> Result<TestCluster, String> {
    start::start(options)
}

impl TestCluster {
    /// Client configuration for the admin user (group `system:masters`), trusting only the
    /// apiserver's self-signed CA.
    pub fn config(&self) -> kube::Config {
        self.config.clone()
    }

    /// A new admin client. Build one per test: a client belongs to the tokio runtime it was
    /// built on (it spawns its worker there), and each `#[tokio::test]` has its own runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn client(&self) -> kube::Client {
        capn::client::client(self.config())
            .unwrap_or_else(|e| panic!("cannot build a client for the test cluster: {e}"))
    }

    /// A kubeconfig file for the admin user, for humans and `kubectl` while tests run. It is
    /// removed with the cluster when the test binary exits unless `CAPN_KEEP_TEST_CLUSTER=1`.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The directory the binaries were taken from (`KUBEBUILDER_ASSETS`).
    pub fn assets_dir(&self) -> &Path {
        &self.assets
    }

    /// The pid of `binary` (`etcd`, `kube-apiserver` or `kube-controller-manager`), for the
    /// benchmark to read its CPU time from `/proc`; `None` for another name.
    pub fn pid(&self, binary: &str) -> Option<u32> {
        self.pids.iter().find(|(name, _)| *name == binary).map(|&(_, pid)| pid)
    }
}

/// Creates a namespace named `capn-test-<random>` and returns its name, so that tests run in
/// parallel without seeing each other's objects.
///
/// # Panics
/// If the apiserver refuses.
pub async fn test_namespace(client: &kube::Client) -> String {
    let namespace = Namespace {
        metadata: ObjectMeta {
            generate_name: Some(NAMESPACE_PREFIX.to_owned()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    let created = Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap_or_else(|e| panic!("cannot create a test namespace: {e}"));
    match created.metadata.name {
        Some(name) => name,
        None => panic!("the apiserver named no namespace: {:?}", created.metadata),
    }
}

/// Writes, through the `status` subresource, what the StatefulSet controller reports once all
/// pods run and are ready ([`ready_status`]), computed from one read of the StatefulSet; if
/// its spec changes after that read, the status written describes the older generation, and
/// so does not count as ready.
///
/// # Errors
/// Whatever the apiserver answers to the read or the patch (for example NotFound).
pub async fn mark_statefulset_ready(client: &kube::Client, namespace: &str, name: &str) -> kube::Result<()> {
    let api: Api<StatefulSet> = Api::namespaced(client.clone(), namespace);
    let statefulset = api.get(name).await?;
    api.patch_status(name, &status_patch_params(), &Patch::Merge(&ready_status(&statefulset)))
        .await?;
    Ok(())
}

/// The merge patch of `statefulset`'s status that the StatefulSet controller writes once all
/// pods run and are ready (docs/reference.md, "Standing in for the kubelet in tests"):
/// `observedGeneration = metadata.generation`, `replicas = readyReplicas = availableReplicas
/// = currentReplicas = updatedReplicas = spec.replicas`, and `currentRevision =
/// updateRevision = <name>-<hash of spec.template>`.
pub fn ready_status(statefulset: &StatefulSet) -> serde_json::Value {
    let spec = statefulset.spec.clone().unwrap_or_default();
    // The apiserver defaults spec.replicas to 1.
    let replicas = spec.replicas.unwrap_or(1);
    let name = statefulset.metadata.name.as_deref().unwrap_or_default();
    let revision = format!("{name}-{:08x}", template_hash(&spec.template));
    serde_json::json!({
        "status": {
            "observedGeneration": statefulset.metadata.generation,
            "replicas": replicas,
            "readyReplicas": replicas,
            "availableReplicas": replicas,
            "currentReplicas": replicas,
            "updatedReplicas": replicas,
            "currentRevision": revision,
            "updateRevision": revision,
        }
    })
}

/// The field manager [`mark_statefulset_ready`] and the stand-in write status with.
fn status_patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(STATEFULSET_STATUS_MANAGER.to_owned()),
        ..PatchParams::default()
    }
}

/// FNV-1a of the pod template's JSON: stable for one template, different for another, like
/// the controller revision hash the StatefulSet controller puts into revision names.
fn template_hash(template: &impl serde::Serialize) -> u32 {
    serde_json::to_vec(template)
        .unwrap_or_default()
        .iter()
        .fold(0x811c_9dc5, |hash, &byte| {
            (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
        })
}

/// Calls `f` every 200 ms until it returns `Some`, and returns that value.
///
/// # Panics
/// With `what` in the message, once `timeout` has passed, including while a call of `f`
/// hangs: a failing test reports what it waited for instead of hanging.
pub async fn wait_until<T, F, Fut>(what: &str, timeout: Duration, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    match poll_until(timeout, f).await {
        Some(value) => value,
        None => panic!("timed out after {timeout:?} waiting until {what}"),
    }
}

/// Calls `f` every 200 ms until it returns `Some` (that value), or `timeout` passes (`None`),
/// including while a call of `f` hangs.
pub async fn poll_until<T, F, Fut>(timeout: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        // `timeout_at` polls `f()` once even past the deadline, so the last chance is taken.
        if let Ok(Some(value)) = tokio::time::timeout_at(deadline, f()).await {
            return Some(value);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}
