//! The runner: plays the kubelet and the StatefulSet controller for capn's StatefulSets, so
//! that the etcd, kube-apiserver and kube-controller-manager capn rendered run for real on a
//! machine without a container runtime (issue 3).
//!
//! For every StatefulSet labelled `app.kubernetes.io/managed-by=capn` in its namespace, the
//! runner keeps pods `<name>-0..replicas` (Parallel or OrderedReady, RollingUpdate one pod at a
//! time from the highest ordinal, as the StatefulSet controller walks it: a pod made during a
//! roll runs the update revision and must be ready before an older one is deleted, which
//! capn's surge of a single apiserver relies on), and for each pod:
//! - a network namespace of its own with one address on a private bridge, and a UTS namespace
//!   whose hostname is the pod name;
//! - its volumes: Secret and ConfigMap volumes (`items`, `defaultMode`, `optional`) in the
//!   kubelet's atomic-writer layout ([`atomic_writer`]) and kept up to date while the pod
//!   runs, projected (secret, configMap, downwardAPI sources) and downwardAPI volumes
//!   ([`projected`]), emptyDir, and the StatefulSet's volume claims, with the owner and modes
//!   the kubelet gives them (`fsGroup` included), and hostPath directories (adaptation 5);
//! - for every container, a process started exactly from the container's `command` + `args`
//!   (`$(VAR)` expanded from `env` like the kubelet, downward-API `fieldRef`s and
//!   `configMapKeyRef`s included, the environment built anew at every start), in a
//!   private mount namespace whose root is the container's own directory with every
//!   `volumeMount` at its `mountPath`, as `runAsUser`/`runAsGroup` with the fsGroup, with
//!   `no_new_privs` and a read-only root when the security context asks for them;
//! - the container's own startup, readiness and liveness probes (httpGet, HTTPS without
//!   verification like the kubelet, or tcpSocket; their timing and thresholds), with restarts
//!   and the kubelet's crash back-off (10 s doubling to 5 min);
//! - the names it would resolve through cluster DNS ([`dns`]).
//!
//! It writes the StatefulSet status the StatefulSet controller would: `observedGeneration`,
//! `replicas` (pods that exist), `readyReplicas` and `availableReplicas` (pods whose every
//! container passes its readiness probe), `currentReplicas`/`updatedReplicas` and the two
//! revisions. capn's controllers therefore see real readiness and proceed on their own.
//! Deleting a StatefulSet stops its pods (SIGTERM, then SIGKILL after
//! `terminationGracePeriodSeconds`) and removes everything they had; dropping the runner
//! kills every process at once, like a node losing power, and removes the rest.
//!
//! # Adaptations (the complete list)
//! Nothing in a rendered object is changed: flags, arguments, certificate paths and mount
//! paths are used as rendered. What differs from a real node:
//! 1. **Binaries, not images.** `command[0]` runs the binary of that name of the release
//!    the image tag names (`etcd:3.6.8-0` → 3.6.8, `kube-apiserver:v1.36.3` → 1.36.3), taken
//!    from the versioned cache that `hack/kube-assets.sh` fills ([`release_cache`]:
//!    `$CAPN_ASSETS_CACHE`, else `~/.cache/capn/assets`): `kubernetes-v<X>/kube-apiserver`,
//!    `kubernetes-v<X>/kube-controller-manager`, `etcd-v<Y>/etcd`, `etcd-v<Y>/etcdutl`. So
//!    one runner runs several releases at once (a tenant at 1.35.4 beside one at 1.37.2, or
//!    an upgrade that changes every image), and none of them needs to be the super cluster's
//!    own release (`KUBEBUILDER_ASSETS`, which only the super cluster uses). The binary is
//!    bind-mounted read-only where the images keep it (`/usr/local/bin/<name>`) after
//!    checking that its `--version` is that release. A release missing from the cache is
//!    refused loudly with the command line that builds it (`KUBE_VERSION=v1.37.2
//!    hack/kube-assets.sh`, `ETCD_VERSION=v3.7.0 hack/kube-assets.sh`), and so is a binary
//!    whose `--version` differs ([`Runner::check`]); the runner never builds anything
//!    itself. `etcdutl` (the etcd image's offline tool) says its version with `etcdutl
//!    version`. capn's own image (`…/capn:v0.1.0`, which the etcd restore init containers
//!    run) maps to the `capn` binary the caller names ([`Runner::start`]: the one cargo
//!    built, `CARGO_BIN_EXE_capn`), checked against the tag with `capn --version` like the
//!    others. The rest of the
//!    container's root is a skeleton of the
//!    distroless image (`/etc/passwd`, `/etc/group`, `/etc/nsswitch.conf`, `/tmp`), with the
//!    host's CA bundle bind-mounted read-only at `/etc/ssl/certs/ca-certificates.crt`,
//!    where distroless keeps Debian's.
//! 2. **Shared libraries.** The locally built binaries are dynamically linked (the published
//!    images carry static ones), so the ELF interpreter and the libraries `ldd` lists are
//!    bind-mounted read-only at their host paths.
//! 3. **DNS from a hosts file.** No cluster DNS runs: each pod's `/etc/hosts` holds the names
//!    DNS would answer ([`dns`]), and `/etc/hosts`, `/etc/resolv.conf` and `/etc/hostname` are
//!    symbolic links into a directory the runner updates atomically. A Service name leads
//!    straight to the ready pods' addresses (there is no ClusterIP and no kube-proxy); where a
//!    Service's TCP port differs from its target port (capn's apiserver Service's 443 for
//!    `kubernetes.default`), each pod it selects when the pod starts redirects that port to
//!    the target in its own network namespace (an `iptables` REDIRECT), as the proxy of a
//!    ClusterIP would map it ([`dns::port_maps`]).
//! 4. **Network.** Pod addresses come from a private 198.18.N.0/24 (RFC 2544) on a bridge in
//!    the runner's own network namespace; the host reaches it through the interface
//!    `capn<N>`. Pods have no default route. Their one other route, to 198.18.0.0/15 through
//!    the host, reaches the other pod networks of this host (other runners', and the
//!    [`node`]'s, whose pods reach the Services a runner runs): forwarding is enabled on each
//!    network's host link `capn<N>` alone, never through the host's global `ip_forward`.
//!    Nothing else leaves the pod network.
//! 5. **Volumes.** Secret and ConfigMap volumes are written as the kubelet writes them (the
//!    payload in a timestamped `..<time>` directory, published by renaming the `..data` link
//!    over the old one, and `<key> -> ..data/<key>`), from the runner's own watch of the
//!    namespace's Secrets and ConfigMaps. While the pod runs they are refreshed faster than on
//!    a node: at once when that watch reports a change to any of them, and compared with it
//!    again every 2 s ([`VOLUME_RESYNC`]), so a change is on disk at the latest 2 s after the
//!    watch has it (the kubelet: its sync period plus cache delay, about a minute). As on a
//!    node, unchanged content writes nothing, a source that is deleted or loses an item's key
//!    leaves the files as they were (an `optional` one that is deleted empties the volume),
//!    the volume directory stays the same (so the containers' bind mounts show the new files)
//!    and a `subPath` mount keeps the file it was bound to at start. Volume claims are
//!    directories that live as long as the StatefulSet, whatever its
//!    `persistentVolumeClaimRetentionPolicy` says; [`Runner::wipe_claim`] empties one while
//!    its pod is stopped, standing in for a deleted claim replaced by a new, empty one.
//!    Projected and downwardAPI volumes are written once, when the pod starts, and not
//!    refreshed; projected `serviceAccountToken`, `clusterTrustBundle` and `podCertificate`
//!    sources, and `resourceFieldRef` items, are refused. `hostPath` volumes of type
//!    `Directory`, `DirectoryOrCreate` or unset are bind-mounted from the host at their
//!    `mountPath` (read-only when the mount says so), after the kubelet's checks: a
//!    `Directory` that is missing or not a directory keeps the pod from starting, waiting
//!    with the kubelet's `hostPath type check failed: <path> is not a directory` and checked
//!    again every second; `DirectoryOrCreate` (and, as containerd does for a missing bind
//!    source, an unset type) makes a missing directory, 0755. No fsGroup is applied to them
//!    and nothing of them is removed. Other hostPath types are refused (capn's channels
//!    render only `Directory`, for a KMS plugin's socket directory).
//! 6. **Not emulated:** Endpoints objects (the super cluster's EndpointSlice controller makes
//!    slices from the Pod objects of item 12), PID and IPC namespaces (a container sees the host's processes in its `/proc`), cgroups
//!    and resource limits, seccomp profiles, capability sets (the processes simply run as
//!    their non-root user), Service environment variables, `minReadySeconds`; a runner pod
//!    is not made from its object, so the downward API's `metadata.uid` reads empty. Refused loudly:
//!    sidecar init containers (`restartPolicy: Always`), exec/gRPC probes, host namespaces,
//!    privileged containers, other volume kinds (and hostPath types), `valueFrom` other than `fieldRef`,
//!    `configMapKeyRef` and `secretKeyRef`.
//! 7. **`configMapKeyRef`, `secretKeyRef` and `envFrom` from the watch caches.** As the
//!    kubelet, the runner builds a container's environment when it starts the container (and
//!    again at each restart), so a ConfigMap or Secret changed meanwhile reaches the next start and
//!    never a running process; a missing object or key that is not `optional` keeps the
//!    container from starting (the kubelet's `CreateContainerConfigError`) and is retried
//!    every second. The value is read from the runner's watch of the namespace's ConfigMaps
//!    and Secrets, which may lag the API by a moment, as the kubelet's watch-based managers do.
//! 8. **Hosts file for the host.** [`Runner::hosts_file`] lists every name the pods resolve,
//!    for capn's `--etcd-hosts-file` (capn dials tenant etcd members by name).
//! 9. **Claim objects.** For each claim directory the runner creates a PersistentVolumeClaim
//!    object `<template>-<pod>` (never bound: there are no PersistentVolumes), as the
//!    StatefulSet controller would. Deleting one stands for losing the disk: the pod's
//!    containers stop, the directory is emptied, the object is released (its
//!    `kubernetes.io/pvc-protection` finalizer removed, which no controller here does) and
//!    created again, and the containers start on the empty claim. Deleting the pod's
//!    object (as capn does after deleting a claim) changes nothing but the object, which
//!    item 12 makes again.
//! 10. **Init containers** run as the kubelet runs them: in order, each in its own mount
//!     namespace like a container, each to completion (exit 0) before the next and before
//!     the containers start; one that fails is restarted with the crash back-off (the pod's
//!     `restartPolicy: Always`). A pod that is deleted and made again runs them again. While
//!     they run, the pod is not ready and [`Runner::pods`] reports the init container that
//!     runs.
//! 11. **Reaching the apiserver from the host.** A client outside the pods cannot resolve the
//!     in-cluster names. [`Runner::client_config`] dials the address the name resolves to while
//!     still verifying the certificate for the name (kube's `tls_server_name`). A program that
//!     takes a kubeconfig file verbatim (the upstream e2e binary of `hack/conformance.sh`)
//!     gets [`Runner::forward`], a TCP forwarder on `127.0.0.1:<free port>` that sends each
//!     connection to the address the name resolves to at that moment, and
//!     [`forward::host_kubeconfig`], the same kubeconfig with its server set to the forwarder and
//!     `tls-server-name` to the in-cluster name. TLS stays end to end. These are the only
//!     places a kubeconfig is not used exactly as capn wrote it.
//! 12. **Pod objects and a kubelet API** ([`pod_objects`]). Each pod that runs and has an
//!     address gets a Pod object as the StatefulSet controller would make it, bound to the
//!     runner's unschedulable Node `capn-runner-<host link>`, whose kubelet API is the
//!     node's (logs, exec, port-forward; node adaptation 6) on the runner's host-side
//!     address, with the status the kubelet would write (Running, its IP, Ready as its
//!     containers are). So a client outside the pod network reaches the control plane
//!     through the super cluster's `pods/portforward`, as capn does where the in-cluster
//!     names do not resolve. Differences: `terminationGracePeriodSeconds: 0` and no
//!     `priorityClassName` (see [`pod_objects`]); the objects do not drive the runner.
//!
//! The runner needs root (namespaces, mounts, veth pairs) and iproute2's `ip`. Every process it
//! starts gets `PR_SET_PDEATHSIG(SIGKILL)`, and namespaces are held only by descriptors, so no
//! process, mount or network namespace outlives the test binary even if it is killed (only its
//! directory in the temporary directory would stay behind then).

mod atomic_writer;
mod dns;
pub mod forward;
pub mod node;
mod pod;
mod pod_objects;
mod probe;
mod projected;
mod sandbox;
pub mod timeline;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, PodSpec, Secret, Service};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use self::atomic_writer::Written;
pub use self::forward::Forward;
use self::pod::{Binaries, ContainerPlan, PodIdentity, SourcedVolume, Sources};
pub use self::pod::{fixture_binary, release_cache};
use self::probe::{Prober, Verdict};
use self::sandbox::{Namespaces, Network, Spawner};
use crate::poll_until;
use crate::process::terminate;

/// The label selecting capn's StatefulSets.
const MANAGED: &str = "app.kubernetes.io/managed-by=capn";
/// Field manager of the StatefulSet status the runner writes.
const STATUS_MANAGER: &str = "capn-runner";
/// The super cluster's DNS domain (capn's `--super-cluster-dns-domain` default).
const DNS_DOMAIN: &str = "cluster.local";
/// How often the runner looks again without being woken.
const RESYNC: Duration = Duration::from_millis(500);
/// How often Secret and ConfigMap volumes are compared with the watch caches without being
/// woken by a change (which refreshes them at once): the bound on a refresh that failed, and
/// on one whose wake-up was lost.
const VOLUME_RESYNC: Duration = Duration::from_secs(2);
/// How often a container is checked for having exited.
const EXIT_POLL: Duration = Duration::from_millis(200);
/// The kubelet's crash back-off: first delay and cap.
const BACKOFF_START: Duration = Duration::from_secs(10);
const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// A container that ran this long resets its back-off.
const BACKOFF_RESET: Duration = Duration::from_secs(600);
/// The API default of `terminationGracePeriodSeconds`.
const DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// The kubelet and StatefulSet controller of one namespace; see the module documentation.
pub struct Runner {
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
}

struct Shared {
    client: Client,
    /// The runner's namespace; for the node, its name (its pods are in every namespace).
    namespace: String,
    /// What the pods see as `spec.nodeName`.
    node_name: String,
    /// Whose names the pods' hosts files hold.
    hosts: HostsScope,
    /// Where the binaries come from (adaptation 1).
    binaries: Binaries,
    dir: PathBuf,
    spawner: Mutex<Option<Spawner>>,
    network: Mutex<Option<Network>>,
    host_link: String,
    host_ip: Ipv4Addr,
    services: Store<Service>,
    secrets: Store<Secret>,
    config_maps: Store<ConfigMap>,
    /// The PersistentVolumeClaim objects of the namespace ([`sync_claims`]).
    claim_objects: Store<PersistentVolumeClaim>,
    state: Mutex<State>,
    wake: Notify,
    /// Woken by every change to a Secret or ConfigMap of the namespace.
    volumes_wake: Notify,
    /// How many times [`refresh_volumes`] ran, for reports.
    volume_passes: AtomicU64,
    /// Each pod's start, step by step ([`Runner::milestones`]); apart from `state`, because
    /// pods are created under its lock.
    milestones: Mutex<Vec<timeline::Milestone>>,
    stopping: Arc<AtomicBool>,
    quiet: bool,
}

/// Whose names the pods of a runner or node resolve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HostsScope {
    /// The runner's own Services (and it publishes them in [`RUNNER_RECORDS`]).
    Own,
    /// Every runner's of this process (the node, whose pods run in any namespace).
    AllRunners,
}

/// The names the pods of every live runner of this process resolve, by the runner's host
/// link: what the node's pods resolve (node adaptation on DNS).
static RUNNER_RECORDS: Mutex<BTreeMap<String, dns::Records>> = Mutex::new(BTreeMap::new());

#[derive(Default)]
struct State {
    /// By StatefulSet uid: a set deleted and created again under the same name is another set.
    sets: BTreeMap<String, SetState>,
    problems: Vec<String>,
    events: Vec<String>,
    processes: Vec<ProcessRecord>,
    /// Running processes: pid → `pod/container`.
    live: BTreeMap<i32, String>,
    retired: Vec<RetiredPod>,
    retired_claims: Vec<PathBuf>,
    versions: BTreeMap<PathBuf, Result<String, String>>,
    libraries: BTreeMap<PathBuf, Vec<PathBuf>>,
    records: dns::Records,
    /// What [`Runner::hosts_file`] holds.
    outside_hosts: String,
    /// The claim objects the runner keeps for its claim directories, by claim name.
    claim_records: BTreeMap<String, ClaimRecord>,
}

struct SetState {
    name: String,
    update_revision: String,
    current_revision: String,
    refused: Option<String>,
    pods: BTreeMap<i32, PodHandle>,
    /// The status last written, to write only changes.
    written: Option<serde_json::Value>,
    claims: BTreeSet<PathBuf>,
    gone: bool,
}

struct PodHandle {
    name: String,
    revision: String,
    labels: BTreeMap<String, String>,
    subdomain: String,
    shared: Arc<PodShared>,
    control: watch::Sender<Control>,
    task: JoinHandle<()>,
    deleting: bool,
}

/// What a pod's task reports.
struct PodShared {
    /// `<name>` for a runner pod, `<namespace>/<name>` for the node's.
    name: String,
    /// The pod's own name: its hostname and its DNS name.
    hostname: String,
    /// Its namespace (the runner's own; any for the node).
    namespace: String,
    /// Its `/etc/resolv.conf`.
    resolv_conf: String,
    /// `Always`, `OnFailure` or `Never` (a runner pod: `Always`, its StatefulSet's).
    restart_policy: String,
    /// An init container failed under `restartPolicy: Never`: the pod has failed.
    init_failed: AtomicBool,
    /// Its StatefulSet's name.
    set: String,
    dir: PathBuf,
    ip: Mutex<Option<Ipv4Addr>>,
    net_inode: AtomicU64,
    containers: Mutex<BTreeMap<String, ContainerReport>>,
    waiting: Mutex<Option<String>>,
    hosts: Mutex<String>,
    /// Its Secret and ConfigMap volumes once written, kept up to date by
    /// [`refresh_volumes`]; emptied (under this lock) before the pod's directory is removed.
    volumes: Mutex<Vec<Refreshed>>,
    done: AtomicBool,
}

/// A Secret or ConfigMap volume the runner keeps up to date.
struct Refreshed {
    volume: SourcedVolume,
    /// How many times a changed source was written since the pod started.
    updates: u32,
    /// Why the last refresh failed (reported once), `None` after a success.
    failing: Option<String>,
}

/// A volume claim directory and the PersistentVolumeClaim object standing for it.
#[derive(Clone, Debug)]
struct ClaimRecord {
    dir: PathBuf,
    pod: String,
    /// The object was created (or found) and not deleted since.
    created: bool,
    /// The watch cache has shown the object since it was created.
    seen: bool,
}

/// A running or finished container, for reports.
#[derive(Clone, Debug, Default)]
pub struct ContainerReport {
    /// The container's name.
    pub name: String,
    /// Its process while it runs.
    pub pid: Option<i32>,
    /// It passes its readiness probe (or has none and runs).
    pub ready: bool,
    /// It passed its startup probe (or has none and runs).
    pub started: bool,
    /// How many times it was restarted.
    pub restarts: u32,
    /// How its last run ended (`exited (exit status: 1)`), if it ended.
    pub last_exit: Option<String>,
    /// The last probe failure, if any.
    pub last_probe_error: Option<String>,
    /// Its output (stdout and stderr).
    pub log: PathBuf,
    /// When the current run started (wall clock), while it runs.
    pub running_since: Option<std::time::SystemTime>,
    /// How its last run ended, if one did.
    pub terminated: Option<Termination>,
    /// It ended and its pod's restart policy does not start it again.
    pub finished: bool,
}

/// How one run of a container ended.
#[derive(Clone, Debug)]
pub struct Termination {
    /// The exit code (128 + the signal for a process killed by one).
    pub exit_code: i32,
    /// When that run started and ended (wall clock).
    pub started: std::time::SystemTime,
    pub finished: std::time::SystemTime,
}

/// A pod as the runner sees it.
#[derive(Clone, Debug)]
pub struct PodReport {
    pub name: String,
    pub ip: Option<Ipv4Addr>,
    pub ready: bool,
    pub deleting: bool,
    pub waiting: Option<String>,
    pub containers: Vec<ContainerReport>,
    /// Its Secret and ConfigMap volumes, once written.
    pub volumes: Vec<VolumeReport>,
}

/// A Secret or ConfigMap volume of a pod.
#[derive(Clone, Debug)]
pub struct VolumeReport {
    /// The volume's name in the pod template.
    pub name: String,
    /// `Secret <name>` or `ConfigMap <name>`.
    pub source: String,
    /// The directory the containers bind-mount.
    pub dir: PathBuf,
    /// How many times a change of the source was written since the pod started.
    pub updates: u32,
    /// Why the last refresh failed (the volume keeps its last content), if it did.
    pub failing: Option<String>,
}

/// A process the runner started, with what identifies it beyond its pid.
#[derive(Clone, Debug)]
pub struct ProcessRecord {
    pub pod: String,
    pub container: String,
    pub pid: i32,
    /// Field 22 of /proc/<pid>/stat: with the pid, names the process even after pid reuse.
    pub start_time: u64,
    /// Inode of its mount namespace.
    pub mount_ns: u64,
}

/// A pod that has been deleted, and what it had.
#[derive(Clone, Debug)]
struct RetiredPod {
    name: String,
    dir: PathBuf,
    net_inode: u64,
    veth: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Control {
    Run,
    /// Containers killed and not restarted (a stopped member), until `Run` again.
    Pause,
    Delete,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Keeps the file `merged` the concatenation of several runners' hosts files
/// ([`Runner::hosts_file`]), for a capn that serves tenants of several runners (it takes one
/// `--etcd-hosts-file`); written anew (by rename) whenever one of them changes, checked every
/// 200 ms. Runs until its task is aborted.
pub async fn merge_hosts_files(files: Vec<PathBuf>, merged: PathBuf) {
    let mut last = String::new();
    loop {
        let text: String = files
            .iter()
            .filter_map(|f| std::fs::read_to_string(f).ok())
            .collect::<Vec<_>>()
            .join("\n");
        if text != last {
            let temporary = merged.with_extension("new");
            if std::fs::write(&temporary, &text).is_ok() && std::fs::rename(&temporary, &merged).is_ok() {
                last = text;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

impl Runner {
    /// Starts the runner for `namespace`, running each image's release from the release
    /// cache of `hack/kube-assets.sh` ([`release_cache`]) and capn's own image as `capn`
    /// (the binary cargo built: `env!("CARGO_BIN_EXE_capn")` in the root package's tests).
    ///
    /// # Errors
    /// Without root, without `ip`, or when the pod network cannot be created.
    pub async fn start(client: &Client, namespace: &str, capn: &Path) -> Result<Self, String> {
        Self::start_with_cache(client, namespace, &release_cache(), capn).await
    }

    /// [`Runner::start`] with the releases of another cache directory (same layout).
    ///
    /// # Errors
    /// As [`Runner::start`].
    pub async fn start_with_cache(client: &Client, namespace: &str, cache: &Path, capn: &Path) -> Result<Self, String> {
        let sets_api: Api<StatefulSet> = Api::namespaced(client.clone(), namespace);
        let services_api: Api<Service> = Api::namespaced(client.clone(), namespace);
        let claims_api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
        let (claim_objects, claims_writer) = reflector::store();
        let (sets, sets_writer) = reflector::store();
        let (services, services_writer) = reflector::store();
        let (secrets, secrets_writer) = reflector::store();
        let (config_maps, config_maps_writer) = reflector::store();
        let shared = Shared::create(
            Base {
                client: client.clone(),
                namespace: namespace.to_owned(),
                node_name: "capn-runner".to_owned(),
                hosts: HostsScope::Own,
                binaries: Binaries {
                    cache: cache.to_owned(),
                    capn: capn.to_owned(),
                    fixed: BTreeMap::new(),
                    busybox: None,
                    image_tools: Vec::new(),
                    image_files: Vec::new(),
                },
            },
            Stores {
                services,
                secrets,
                config_maps,
                claim_objects,
            },
        )?;
        let mut tasks = Vec::new();
        let watch_sets = reflector::reflector(
            sets_writer,
            watcher(sets_api, watcher::Config::default().labels(MANAGED)),
        )
        .default_backoff();
        let watch_services =
            reflector::reflector(services_writer, watcher(services_api, watcher::Config::default())).default_backoff();
        let watch_claims =
            reflector::reflector(claims_writer, watcher(claims_api, watcher::Config::default())).default_backoff();
        for stream in [
            watch_sets.map(|e| e.map(drop)).boxed(),
            watch_services.map(|e| e.map(drop)).boxed(),
            watch_claims.map(|e| e.map(drop)).boxed(),
        ] {
            let shared = shared.clone();
            tasks.push(tokio::spawn(async move {
                stream.for_each(|_| async { shared.wake.notify_one() }).await;
            }));
        }
        tasks.extend(watch_volume_sources(
            &shared,
            (Api::namespaced(client.clone(), namespace), secrets_writer),
            (Api::namespaced(client.clone(), namespace), config_maps_writer),
        ));
        // Adaptation 12: the pods' objects, on a Node of the runner's whose kubelet API
        // serves them.
        let node = pod_objects::node_name(&shared.host_link);
        pod_objects::ensure_service_account(client, namespace).await?;
        pod_objects::register_node(client, &node, shared.host_ip, namespace).await?;
        let kubelet = std::net::SocketAddr::new(shared.host_ip.into(), node::objects::KUBELET_PORT);
        tasks.push(node::kubelet::start(kubelet, shared.clone()).await?);
        let (objects, objects_writer) = reflector::store();
        let objects_api: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), namespace);
        let watch_objects = reflector::reflector(
            objects_writer,
            watcher(objects_api, watcher::Config::default().labels(pod_objects::LABEL)),
        )
        .default_backoff();
        let wake_shared = shared.clone();
        tasks.push(tokio::spawn(async move {
            watch_objects
                .for_each(|_| async { wake_shared.wake.notify_one() })
                .await;
        }));
        let loop_shared = shared.clone();
        tasks.push(tokio::spawn(async move {
            let _ = sets.wait_until_ready().await;
            let _ = loop_shared.services.wait_until_ready().await;
            // Pods read their Secret and ConfigMap volumes from these caches.
            let _ = loop_shared.secrets.wait_until_ready().await;
            let _ = loop_shared.config_maps.wait_until_ready().await;
            let _ = objects.wait_until_ready().await;
            let mut failing = Vec::new();
            loop {
                let sets = sets.state();
                reconcile(&loop_shared, &sets).await;
                let desired = desired_objects(&loop_shared);
                let shared = &loop_shared;
                let failures = pod_objects::sync(
                    &shared.client,
                    &shared.namespace,
                    &node,
                    shared.host_ip,
                    &desired,
                    &sets,
                    &objects,
                )
                .await;
                // Each failure is told once, not at every pass.
                for failure in failures.iter().filter(|f| !failing.contains(*f)) {
                    shared.event(failure.clone());
                }
                failing = failures;
                tokio::select! {
                    () = loop_shared.wake.notified() => {}
                    () = tokio::time::sleep(RESYNC) => {}
                }
            }
        }));
        let runner = Self { shared, tasks };
        runner.event(format!(
            "started for namespace {namespace}: pod network {}/24 via {} (directory {})",
            runner.shared.host_ip,
            runner.shared.host_link,
            runner.shared.dir.display()
        ));
        Ok(runner)
    }

    fn event(&self, message: String) {
        self.shared.event(message);
    }

    /// `Err` with every refusal and failure so far (a template the runner will not run, a
    /// binary whose version differs from the image's, a container that could not start).
    ///
    /// # Errors
    /// When anything went wrong.
    pub fn check(&self) -> Result<(), String> {
        let state = lock(&self.shared.state);
        if state.problems.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "the runner reported problems:\n- {}",
                state.problems.join("\n- ")
            ))
        }
    }

    /// Every refusal and failure so far, one per entry ([`Runner::check`] joins them).
    pub fn problems(&self) -> Vec<String> {
        lock(&self.shared.state).problems.clone()
    }

    /// The addresses a pod would get for `name` (a Service or pod DNS name).
    pub fn resolve(&self, name: &str) -> Vec<Ipv4Addr> {
        self.resolver()(name)
    }

    /// [`Self::resolve`] as a function that outlives this handle (for capn's tenant hook).
    pub fn resolver(&self) -> impl Fn(&str) -> Vec<Ipv4Addr> + Send + Sync + 'static {
        let shared = self.shared.clone();
        move |name| {
            lock(&shared.state)
                .records
                .get(name.trim_end_matches('.'))
                .map(|ips| ips.iter().copied().collect())
                .unwrap_or_default()
        }
    }

    /// A hosts file (`/etc/hosts` format) holding every name the pods resolve, kept current
    /// like theirs: what capn gets as `--etcd-hosts-file` (or `Settings::etcd_hosts_file`) to
    /// dial the tenant's etcd members by name from the host. Removed with the runner.
    pub fn hosts_file(&self) -> PathBuf {
        self.shared.dir.join("hosts")
    }

    /// A client configuration from a kubeconfig, used verbatim except for one thing: the
    /// server's host, an in-cluster name, is dialled at the address it resolves to (as from a
    /// pod), while the certificate is still verified for the name (`tls_server_name`).
    ///
    /// # Errors
    /// If the kubeconfig does not parse or its server name resolves to nothing yet.
    pub async fn client_config(&self, kubeconfig: &str) -> Result<kube::Config, String> {
        let parsed = kube::config::Kubeconfig::from_yaml(kubeconfig)
            .map_err(|e| format!("the kubeconfig does not parse: {e}"))?;
        let mut config = kube::Config::from_custom_kubeconfig(parsed, &Default::default())
            .await
            .map_err(|e| format!("the kubeconfig is not usable: {e}"))?;
        let url = config.cluster_url.clone();
        let host = url.host().ok_or("the kubeconfig's server has no host")?;
        if host.parse::<std::net::IpAddr>().is_err() {
            let address = self
                .resolve(host)
                .into_iter()
                .next()
                .ok_or_else(|| format!("{host} resolves to no ready pod (yet)"))?;
            let port = url.port_u16().unwrap_or(443);
            let scheme = url.scheme_str().unwrap_or("https");
            if config.tls_server_name.is_none() {
                config.tls_server_name = Some(host.to_owned());
            }
            config.cluster_url = format!("{scheme}://{address}:{port}")
                .parse()
                .map_err(|e| format!("bad URL: {e}"))?;
        }
        Ok(config)
    }

    /// Adaptation 11: a forwarder from `127.0.0.1:<free port>` to `port` of whatever `name` (an
    /// in-cluster Service or pod name) resolves to at each new connection. Use it with
    /// [`forward::host_kubeconfig`].
    ///
    /// # Errors
    /// When no local port can be bound.
    pub fn forward(&self, name: &str, port: u16) -> Result<Forward, String> {
        let shared = self.shared.clone();
        let host = name.trim_end_matches('.').to_owned();
        Forward::start(
            name.to_owned(),
            port,
            Arc::new(move || {
                lock(&shared.state)
                    .records
                    .get(&host)
                    .and_then(|ips| ips.iter().next().copied())
            }),
        )
    }

    /// Every pod start step so far, in order ([`timeline::breakdown`] reads them).
    pub fn milestones(&self) -> Vec<timeline::Milestone> {
        lock(&self.shared.milestones).clone()
    }

    /// Where the time from `applied` to `ready` went: each StatefulSet's first pod, from
    /// creation through process start and readiness to its ready status, and the shares of
    /// the components, the runner and capn ([`timeline::breakdown`]).
    pub fn boot_breakdown(&self, applied: Instant, ready: Instant) -> String {
        timeline::breakdown(applied, ready, &timeline::first_starts(&self.milestones()))
    }

    /// Every pod the runner has, by name.
    pub fn pods(&self) -> Vec<PodReport> {
        let state = lock(&self.shared.state);
        let mut pods: Vec<PodReport> = state
            .sets
            .values()
            .flat_map(|s| s.pods.values())
            .map(|p| PodReport {
                name: p.name.clone(),
                ip: *lock(&p.shared.ip),
                ready: !p.deleting && pod_ready(&p.shared),
                deleting: p.deleting,
                waiting: lock(&p.shared.waiting).clone(),
                containers: lock(&p.shared.containers).values().cloned().collect(),
                volumes: lock(&p.shared.volumes)
                    .iter()
                    .map(|r| VolumeReport {
                        name: r.volume.name.clone(),
                        source: r.volume.source.to_string(),
                        dir: r.volume.dir.clone(),
                        updates: r.updates,
                        failing: r.failing.clone(),
                    })
                    .collect(),
            })
            .collect();
        pods.sort_by(|a, b| a.name.cmp(&b.name));
        pods
    }

    /// The process of container `container` of pod `pod` while it runs (the binary itself:
    /// the runner execs the container's command in place of the process it forks), for
    /// [`crate::usage`]. `None` when there is no such pod or container, or it does not run.
    pub fn container_pid(&self, pod: &str, container: &str) -> Option<i32> {
        let state = lock(&self.shared.state);
        let pod = state
            .sets
            .values()
            .flat_map(|s| s.pods.values())
            .find(|p| p.name == pod)?;
        lock(&pod.shared.containers).values().find(|c| c.name == container)?.pid
    }

    /// The address of a pod.
    pub fn pod_ip(&self, pod: &str) -> Option<Ipv4Addr> {
        self.pods().into_iter().find(|p| p.name == pod)?.ip
    }

    /// Stops a pod's containers (SIGKILL, like a member that crashed or lost its machine) and
    /// keeps them stopped until [`Runner::resume_pod`]; the pod keeps its address and volumes.
    ///
    /// # Errors
    /// If there is no such pod.
    pub fn pause_pod(&self, pod: &str) -> Result<(), String> {
        self.control(pod, Control::Pause)
    }

    /// Starts a paused pod's containers again.
    ///
    /// # Errors
    /// If there is no such pod.
    pub fn resume_pod(&self, pod: &str) -> Result<(), String> {
        self.control(pod, Control::Run)
    }

    /// Loses a pod's data while it is down, as a member whose machine and disk are gone:
    /// stops the pod's containers (SIGKILL), waits until none runs and empties the claim
    /// `claim` (the volume claim template's name; the directory itself stays, with its owner
    /// and mode). The pod stays stopped until [`Runner::resume_pod`], or until its claim
    /// object is deleted (then it starts on the empty claim, as a pod recreated with a new
    /// claim would).
    ///
    /// # Errors
    /// If there is no such pod, or its processes do not stop within 30 s.
    pub async fn wipe_claim(&self, pod: &str, claim: &str) -> Result<(), String> {
        let dir = self.shared.dir.join("claims").join(format!("{claim}-{pod}"));
        wipe(&self.shared, pod, &dir).await
    }

    fn control(&self, pod: &str, control: Control) -> Result<(), String> {
        set_control(&self.shared, pod, control)?;
        self.event(format!("{pod}: {control:?} requested"));
        Ok(())
    }

    /// Every process the runner ever started.
    pub fn processes(&self) -> Vec<ProcessRecord> {
        lock(&self.shared.state).processes.clone()
    }

    /// How many pods have been deleted (and cleaned up) so far.
    pub fn retired_pods(&self) -> usize {
        lock(&self.shared.state).retired.len()
    }

    /// What is left of deleted pods and StatefulSets: processes still alive, mount or network
    /// namespaces still in use, veth links, directories. Empty when nothing is left behind.
    pub fn leftovers(&self) -> Vec<String> {
        let state = lock(&self.shared.state);
        let live_pods: BTreeSet<&str> = state
            .sets
            .values()
            .flat_map(|s| s.pods.values())
            .map(|p| p.name.as_str())
            .collect();
        let in_use = namespaces_in_use();
        let mut left = Vec::new();
        for p in state.processes.iter().filter(|p| !live_pods.contains(p.pod.as_str())) {
            if process_start_time(p.pid) == Some(p.start_time) {
                left.push(format!(
                    "process {} ({}/{}) is still running",
                    p.pid, p.pod, p.container
                ));
            }
            if in_use.contains(&format!("mnt:[{}]", p.mount_ns)) {
                left.push(format!(
                    "the mount namespace of {}/{} is still in use",
                    p.pod, p.container
                ));
            }
        }
        let links = lock(&self.shared.network)
            .as_ref()
            .and_then(|n| n.node_links().ok())
            .unwrap_or_default();
        for pod in &state.retired {
            if in_use.contains(&format!("net:[{}]", pod.net_inode)) {
                left.push(format!("the network namespace of {} is still in use", pod.name));
            }
            if pod.dir.exists() {
                left.push(format!("{} still exists", pod.dir.display()));
            }
            if links.contains(&pod.veth)
                && !state.sets.values().any(|s| {
                    s.pods
                        .values()
                        .any(|p| lock(&p.shared.ip).is_some_and(|ip| format!("vp{}", ip.octets()[3]) == pod.veth))
                })
            {
                left.push(format!("veth {} of {} still exists", pod.veth, pod.name));
            }
        }
        for claim in &state.retired_claims {
            if claim.exists() {
                left.push(format!("{} still exists", claim.display()));
            }
        }
        left
    }

    /// The runner's directory (pods, claims, logs); removed when the runner is dropped.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// The host interface of the pod network; removed when the runner is dropped.
    pub fn host_link(&self) -> &str {
        &self.shared.host_link
    }

    /// This host's address on the pod network: pods reach a server listening there.
    pub fn host_address(&self) -> Ipv4Addr {
        self.shared.host_ip
    }

    /// Everything the runner knows, for a failure message: problems, events, pods, log tails.
    pub fn report(&self) -> String {
        let mut out = String::new();
        if let Err(problems) = self.check() {
            let _ = writeln!(out, "{problems}");
        }
        let events = lock(&self.shared.state).events.clone();
        let _ = writeln!(
            out,
            "volume refresh passes: {}",
            self.shared.volume_passes.load(Ordering::SeqCst)
        );
        let _ = writeln!(out, "runner events:");
        for e in events.iter().rev().take(60).rev() {
            let _ = writeln!(out, "  {e}");
        }
        for pod in self.pods() {
            let _ = writeln!(
                out,
                "pod {} ip={:?} ready={} deleting={} waiting={:?}",
                pod.name, pod.ip, pod.ready, pod.deleting, pod.waiting
            );
            for v in &pod.volumes {
                let _ = writeln!(
                    out,
                    "  volume {} from {}: updates={} failing={:?}",
                    v.name, v.source, v.updates, v.failing
                );
            }
            for c in &pod.containers {
                let _ = writeln!(
                    out,
                    "  container {} pid={:?} started={} ready={} restarts={} last_exit={:?} last_probe_error={:?}\n  last lines of {}:\n{}",
                    c.name,
                    c.pid,
                    c.started,
                    c.ready,
                    c.restarts,
                    c.last_exit,
                    c.last_probe_error,
                    c.log.display(),
                    tail(&c.log, 15)
                        .lines()
                        .map(|l| format!("    | {l}"))
                        .collect::<Vec<_>>()
                        .join("\n")
                );
            }
        }
        out
    }

    /// Polls `f` until it returns `Some` ([`poll_until`]), failing early on a runner problem.
    ///
    /// # Panics
    /// On a runner problem, or after `timeout`, with [`Runner::report`] in the message.
    pub async fn wait_for<T, F, Fut>(&self, what: &str, timeout: Duration, mut f: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        let found = poll_until(timeout, || {
            if let Err(problems) = self.check() {
                panic!("while waiting until {what}: {problems}\n{}", self.report());
            }
            f()
        })
        .await;
        found.unwrap_or_else(|| panic!("timed out after {timeout:?} waiting until {what}\n{}", self.report()))
    }
}

impl Drop for Runner {
    /// Kills every process at once (a node losing power), then removes the pod network and
    /// the runner's directory.
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        for task in &self.tasks {
            task.abort();
        }
        let mut state = lock(&self.shared.state);
        for pod in state.sets.values().flat_map(|s| s.pods.values()) {
            pod.task.abort();
            // Waits for a volume refresh in progress (its task may be mid-write on another
            // thread); none starts afterwards.
            lock(&pod.shared.volumes).clear();
        }
        for (&pid, _) in state.live.iter() {
            // SAFETY: signals and reaps our own children.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
        state.live.clear();
        drop(state);
        // Joins the spawner thread; a queued spawn sees `stopping` and starts nothing.
        lock(&self.shared.spawner).take();
        lock(&self.shared.network).take();
        lock(&RUNNER_RECORDS).remove(&self.shared.host_link);
        let _ = std::fs::remove_dir_all(&self.shared.dir);
        if !self.shared.quiet {
            eprintln!(
                "capn runner [{}]: stopped; removed {} and {}",
                self.shared.namespace,
                self.shared.dir.display(),
                self.shared.host_link
            );
        }
    }
}

/// What a [`Shared`] is, besides its watch caches.
struct Base {
    client: Client,
    namespace: String,
    node_name: String,
    hosts: HostsScope,
    binaries: Binaries,
}

/// The watch caches a [`Shared`] reads (filled by the caller's watches).
struct Stores {
    services: Store<Service>,
    secrets: Store<Secret>,
    config_maps: Store<ConfigMap>,
    claim_objects: Store<PersistentVolumeClaim>,
}

/// The Secret and ConfigMap watches (the kubelet's watch-based managers: pods read their
/// volumes from these caches, and every change wakes the refresh of the volumes), and the
/// refresh task.
fn watch_volume_sources(
    shared: &Arc<Shared>,
    (secrets_api, secrets_writer): (Api<Secret>, reflector::store::Writer<Secret>),
    (config_maps_api, config_maps_writer): (Api<ConfigMap>, reflector::store::Writer<ConfigMap>),
) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    let watch_secrets =
        reflector::reflector(secrets_writer, watcher(secrets_api, watcher::Config::default())).default_backoff();
    let watch_config_maps =
        reflector::reflector(config_maps_writer, watcher(config_maps_api, watcher::Config::default()))
            .default_backoff();
    for (kind, stream) in [
        ("Secrets", watch_secrets.map(|e| e.map(drop)).boxed()),
        ("ConfigMaps", watch_config_maps.map(|e| e.map(drop)).boxed()),
    ] {
        let shared = shared.clone();
        tasks.push(tokio::spawn(async move {
            stream
                .for_each(|event| {
                    if let Err(e) = event {
                        // Retried with back-off; meanwhile volumes keep what they have.
                        shared.event(format!("watching {kind}: {e}"));
                    }
                    shared.volumes_wake.notify_one();
                    async {}
                })
                .await;
        }));
    }
    let volumes_shared = shared.clone();
    tasks.push(tokio::spawn(async move {
        // No `wait_until_ready` here: volumes exist only once the main loop has seen these
        // caches ready, and kube-runtime 5.0's `wait_until_ready` wakes only the last of
        // several tasks waiting at once (DelayedInit polls one futures oneshot, which keeps
        // one waker), so a second waiter could sleep forever.
        loop {
            refresh_volumes(&volumes_shared);
            tokio::select! {
                () = volumes_shared.volumes_wake.notified() => {}
                () = tokio::time::sleep(VOLUME_RESYNC) => {}
            }
        }
    }));
    tasks
}

impl Shared {
    /// What `read` finds in the pod named `pod`, while the runner has the pod.
    fn with_pod<R>(&self, pod: &str, read: impl FnOnce(&PodHandle) -> Option<R>) -> Option<R> {
        let state = lock(&self.state);
        read(
            state
                .sets
                .values()
                .flat_map(|s| s.pods.values())
                .find(|p| p.name == pod)?,
        )
    }

    /// Container `container` of the pod named `pod` (its log, its process).
    fn container(&self, pod: &str, container: &str) -> Option<ContainerReport> {
        self.with_pod(pod, |p| {
            lock(&p.shared.containers)
                .values()
                .find(|c| c.name == container)
                .cloned()
        })
    }

    /// How the pods of this runner or node are keyed ([`PodShared::name`]): the key of the
    /// pod `namespace/pod` here (for another namespace than a runner's, one no pod has).
    fn pod_key(&self, namespace: &str, pod: &str) -> String {
        match self.hosts {
            HostsScope::Own if namespace == self.namespace => pod.to_owned(),
            HostsScope::Own => format!("{namespace}/{pod} (not this runner's namespace)"),
            HostsScope::AllRunners => format!("{namespace}/{pod}"),
        }
    }

    /// The address of the pod named `pod`.
    fn pod_address(&self, pod: &str) -> Option<Ipv4Addr> {
        self.with_pod(pod, |p| *lock(&p.shared.ip))
    }

    /// The spawner thread, the directory and the pod network of a runner or node.
    ///
    /// # Errors
    /// Without root, or when the directory or the pod network cannot be created.
    fn create(base: Base, stores: Stores) -> Result<Arc<Self>, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("the runner needs root: it creates network and mount namespaces and veth pairs (run the tests or the demo as root)".into());
        }
        let spawner = Spawner::start()?;
        let dir = tempfile::Builder::new()
            .prefix("capn-runner-")
            .tempdir()
            .map_err(|e| format!("cannot create the runner directory: {e}"))?
            .keep();
        // It holds the pods' private keys. The pods reach their files through bind mounts,
        // never through this path.
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .map_err(|e| format!("cannot restrict {}: {e}", dir.display()))?;
        let network = match Network::create() {
            Ok(network) => network,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        Ok(Arc::new(Self {
            client: base.client,
            namespace: base.namespace,
            node_name: base.node_name,
            hosts: base.hosts,
            binaries: base.binaries,
            dir,
            spawner: Mutex::new(Some(spawner)),
            host_link: network.host_link().to_owned(),
            host_ip: network.host_address(),
            network: Mutex::new(Some(network)),
            services: stores.services,
            secrets: stores.secrets,
            config_maps: stores.config_maps,
            claim_objects: stores.claim_objects,
            state: Mutex::new(State::default()),
            wake: Notify::new(),
            volumes_wake: Notify::new(),
            volume_passes: AtomicU64::new(0),
            milestones: Mutex::default(),
            stopping: Arc::new(AtomicBool::new(false)),
            quiet: std::env::var_os("CAPN_RUNNER_QUIET").is_some_and(|v| v != "0"),
        }))
    }

    /// The watch caches the Secret and ConfigMap volumes of a pod in `namespace` are read
    /// from (the runner's hold its own namespace, the node's every namespace).
    fn sources<'a>(&'a self, namespace: &'a str) -> Sources<'a> {
        Sources {
            namespace,
            secrets: &self.secrets,
            config_maps: &self.config_maps,
        }
    }

    fn milestone(&self, set: &str, pod: &str, stage: timeline::Stage) {
        lock(&self.milestones).push(timeline::Milestone {
            at: Instant::now(),
            set: set.to_owned(),
            pod: pod.to_owned(),
            stage,
        });
    }

    fn event(&self, message: String) {
        let line = format!("{} {message}", humantime(std::time::SystemTime::now()));
        if !self.quiet {
            eprintln!("capn runner [{}]: {message}", self.namespace);
        }
        lock(&self.state).events.push(line);
    }

    fn problem(&self, message: String) {
        if !self.quiet {
            eprintln!("capn runner [{}]: PROBLEM: {message}", self.namespace);
        }
        let mut state = lock(&self.state);
        if !state.problems.contains(&message) {
            state.problems.push(message);
        }
    }
}

fn humantime(t: std::time::SystemTime) -> String {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let s = d.as_secs() % 86_400;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        s / 3600,
        s / 60 % 60,
        s % 60,
        d.subsec_millis()
    )
}

fn pod_ready(pod: &PodShared) -> bool {
    let containers = lock(&pod.containers);
    !containers.is_empty() && containers.values().all(|c| c.ready)
}

/// The objects of the pods that run and have an address (adaptation 12).
fn desired_objects(shared: &Shared) -> Vec<pod_objects::Desired> {
    let state = lock(&shared.state);
    let mut out = Vec::new();
    for (uid, set) in state.sets.iter().filter(|(_, s)| !s.gone) {
        for pod in set.pods.values() {
            if pod.deleting || pod.shared.done.load(Ordering::SeqCst) {
                continue;
            }
            let Some(ip) = *lock(&pod.shared.ip) else { continue };
            out.push(pod_objects::Desired {
                name: pod.name.clone(),
                revision: pod.revision.clone(),
                labels: pod.labels.clone(),
                subdomain: pod.subdomain.clone(),
                set: (set.name.clone(), uid.clone()),
                ip,
                ready: pod_ready(&pod.shared),
            });
        }
    }
    out
}

/// One pass: every StatefulSet's pods and status, then DNS.
async fn reconcile(shared: &Arc<Shared>, sets: &[Arc<StatefulSet>]) {
    let patches = plan_pass(shared, sets);
    sync_claims(shared).await;
    for (uid, name, status) in patches {
        let api: Api<StatefulSet> = Api::namespaced(shared.client.clone(), &shared.namespace);
        let params = PatchParams {
            field_manager: Some(STATUS_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        // The uid makes the write conditional: a StatefulSet deleted and made again under
        // the same name (while the runner's view still holds the old one) is another set,
        // and must never get the old set's ready status (the API server refuses a patch
        // whose uid differs from the object's).
        let body = serde_json::json!({ "metadata": { "uid": uid }, "status": status });
        match api.patch_status(&name, &params, &Patch::Merge(&body)).await {
            Ok(_) => {
                if status["readyReplicas"].as_i64().is_some_and(|r| r > 0) {
                    shared.milestone(&name, &format!("{name}-0"), timeline::Stage::StatusWritten);
                }
                if let Some(set) = lock(&shared.state).sets.get_mut(&uid) {
                    set.written = Some(status);
                }
            }
            // Gone, or another set under the same name now.
            Err(kube::Error::Api(e)) if matches!(e.code, 404 | 409 | 422) => {}
            Err(e) => shared.event(format!("writing the status of StatefulSet {name}: {e}")),
        }
    }
    refresh_dns(shared);
}

/// Decides (under the lock) which pods to create and delete, and which statuses to write.
fn plan_pass(shared: &Arc<Shared>, sets: &[Arc<StatefulSet>]) -> Vec<(String, String, serde_json::Value)> {
    let mut patches = Vec::new();
    // Events are emitted after the lock is released (`Shared::event` takes it).
    let mut events = Vec::new();
    let mut guard = lock(&shared.state);
    let state = &mut *guard;
    let live: BTreeMap<String, &Arc<StatefulSet>> = sets
        .iter()
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .filter_map(|s| Some((s.metadata.uid.clone()?, s)))
        .collect();
    // Sets that are gone: delete their pods; forget them once all are cleaned up.
    let mut finished_sets = Vec::new();
    for (uid, set) in state.sets.iter_mut() {
        if live.contains_key(uid) {
            continue;
        }
        if !set.gone {
            set.gone = true;
            events.push(format!("StatefulSet {} is gone: deleting its pods", set.name));
        }
        for pod in set.pods.values_mut() {
            delete_pod(pod);
        }
        set.pods.retain(|_, p| !p.shared.done.load(Ordering::SeqCst));
        if set.pods.is_empty() {
            finished_sets.push(uid.clone());
        }
    }
    for uid in finished_sets {
        if let Some(set) = state.sets.remove(&uid) {
            for claim in set.claims {
                let _ = std::fs::remove_dir_all(&claim);
                state.retired_claims.push(claim);
            }
            events.push(format!(
                "StatefulSet {}: every pod stopped and removed, with its volume claims",
                set.name
            ));
        }
    }
    // Pod names in use by any set (a replaced set waits for the old pods to go).
    let mut names_in_use: BTreeSet<String> = state
        .sets
        .values()
        .flat_map(|s| s.pods.values().map(|p| p.name.clone()))
        .collect();
    for (uid, sts) in live {
        let name = sts.name_any();
        let Some(spec) = sts.spec.as_ref() else { continue };
        let revision = format!("{name}-{:08x}", super::template_hash(&spec.template));
        let set = state.sets.entry(uid.clone()).or_insert_with(|| SetState {
            name: name.clone(),
            update_revision: String::new(),
            current_revision: revision.clone(),
            refused: None,
            pods: BTreeMap::new(),
            written: None,
            claims: BTreeSet::new(),
            gone: false,
        });
        let claim_templates: Vec<String> = spec
            .volume_claim_templates
            .iter()
            .flatten()
            .filter_map(|c| c.metadata.name.clone())
            .collect();
        let pod_spec = spec.template.spec.clone().unwrap_or_default();
        if set.update_revision != revision {
            set.update_revision = revision.clone();
            set.refused = pod::check_template(&pod_spec, &claim_templates, &shared.binaries, &mut state.versions)
                .err()
                .map(|e| format!("StatefulSet {name}: {e}"));
            if let Some(refusal) = &set.refused {
                if !state.problems.contains(refusal) {
                    state.problems.push(refusal.clone());
                }
                if !shared.quiet {
                    eprintln!("capn runner [{}]: PROBLEM: {refusal}", shared.namespace);
                }
            } else {
                for container in pod_spec.init_containers.iter().flatten().chain(&pod_spec.containers) {
                    let binary = pod::located_binary(container, &shared.binaries).ok().map(|(b, _, _)| b);
                    if let Some(binary) = binary
                        && !state.libraries.contains_key(&binary)
                    {
                        match pod::libraries(&binary) {
                            Ok(libs) => {
                                state.libraries.insert(binary, libs);
                            }
                            Err(e) => state.problems.push(e),
                        }
                    }
                }
            }
        }
        let set = state.sets.get_mut(&uid).expect("inserted above");
        set.pods.retain(|_, p| {
            let done = p.shared.done.load(Ordering::SeqCst);
            if done {
                names_in_use.remove(&p.name);
            }
            !done
        });
        if set.refused.is_some() {
            continue;
        }
        let replicas = spec.replicas.unwrap_or(1).max(0);
        let parallel = spec.pod_management_policy.as_deref() == Some("Parallel");
        let deleting = set.pods.values().any(|p| p.deleting);
        // Scale down.
        let extra: Vec<i32> = set.pods.keys().copied().filter(|o| *o >= replicas).collect();
        if parallel {
            for o in &extra {
                delete_pod(set.pods.get_mut(o).expect("listed"));
            }
        } else if !deleting && let Some(o) = extra.iter().max() {
            delete_pod(set.pods.get_mut(o).expect("listed"));
        }
        // Rolling update, one pod at a time from the highest ordinal.
        let rolling = spec
            .update_strategy
            .as_ref()
            .and_then(|s| s.type_.as_deref())
            .unwrap_or("RollingUpdate")
            == "RollingUpdate";
        let partition = spec
            .update_strategy
            .as_ref()
            .and_then(|s| s.rolling_update.as_ref())
            .and_then(|r| r.partition)
            .unwrap_or(0);
        // As the StatefulSet controller's `updateStatefulSet` (pkg/controller/statefulset):
        // OrderedReady rolls only while every pod is ready and none terminates; then, and
        // always with Parallel, it walks from the highest ordinal down to the partition,
        // deletes the first pod at an old revision that is not terminating, and stops at the
        // first that is missing, terminating or not ready. So a pod created at the update
        // revision (capn's surge pod, docs/design.md §5 "Surge") must be ready before an
        // older one goes, and an outdated pod that is not ready is still replaced.
        let settled = (0..replicas).all(|o| set.pods.get(&o).is_some_and(|p| !p.deleting && pod_ready(&p.shared)))
            && !set.pods.values().any(|p| p.deleting);
        if rolling && (parallel || settled) {
            for ordinal in (partition.max(0)..replicas).rev() {
                let Some(pod) = set.pods.get_mut(&ordinal) else { break };
                if pod.revision != revision && !pod.deleting {
                    events.push(format!("{}: template changed, replacing the pod", pod.name));
                    delete_pod(pod);
                    break;
                }
                if pod.deleting || !pod_ready(&pod.shared) {
                    break;
                }
            }
        }
        // Create missing pods.
        for ordinal in 0..replicas {
            if set.pods.contains_key(&ordinal) {
                continue;
            }
            let pod_name = format!("{name}-{ordinal}");
            if names_in_use.contains(&pod_name) {
                continue;
            }
            if !parallel && !(0..ordinal).all(|o| set.pods.get(&o).is_some_and(|p| !p.deleting && pod_ready(&p.shared)))
            {
                break;
            }
            let mut claims = BTreeMap::new();
            for template in &claim_templates {
                let claim = format!("{template}-{name}-{ordinal}");
                let dir = shared.dir.join("claims").join(&claim);
                set.claims.insert(dir.clone());
                claims.insert(template.clone(), dir.clone());
                state.claim_records.entry(claim).or_insert(ClaimRecord {
                    dir,
                    pod: pod_name.clone(),
                    created: false,
                    seen: false,
                });
            }
            let handle = start_pod(shared, sts, &pod_name, ordinal, &revision, pod_spec.clone(), claims);
            names_in_use.insert(pod_name);
            set.pods.insert(ordinal, handle);
        }
        // Status, as the StatefulSet controller computes it.
        let pods: Vec<&PodHandle> = set.pods.values().filter(|p| !p.deleting).collect();
        let count = |f: &dyn Fn(&PodHandle) -> bool| pods.iter().filter(|p| f(p)).count() as i32;
        let created = pods.len() as i32;
        let ready = count(&|p| pod_ready(&p.shared));
        let updated = count(&|p| p.revision == set.update_revision);
        if rolling && updated == created && ready == created {
            set.current_revision = set.update_revision.clone();
        }
        let current = count(&|p| p.revision == set.current_revision);
        let status = serde_json::json!({
            "observedGeneration": sts.metadata.generation,
            "replicas": created,
            "readyReplicas": ready,
            "availableReplicas": ready,
            "currentReplicas": current,
            "updatedReplicas": updated,
            "currentRevision": set.current_revision,
            "updateRevision": set.update_revision,
        });
        let already = set.written.as_ref() == Some(&status)
            || sts
                .status
                .as_ref()
                .and_then(|s| serde_json::to_value(s).ok())
                .is_some_and(|s| same_status(&s, &status));
        if !already {
            patches.push((uid.clone(), name.clone(), status));
        }
    }
    drop(guard);
    for event in events {
        shared.event(event);
    }
    patches
}

/// Whether the object's status already says what `want` says.
fn same_status(have: &serde_json::Value, want: &serde_json::Value) -> bool {
    want.as_object().is_some_and(|w| {
        w.iter()
            .all(|(k, v)| have.get(k).unwrap_or(&serde_json::Value::Null) == v)
    })
}

fn delete_pod(pod: &mut PodHandle) {
    if !pod.deleting {
        pod.deleting = true;
        pod.control.send_replace(Control::Delete);
    }
}

/// The pod's named container ports, for the Service ports that target them by name.
fn named_ports(spec: &PodSpec) -> BTreeMap<String, u16> {
    spec.containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| Some((p.name.clone()?, u16::try_from(p.container_port).ok()?)))
        .collect()
}

impl PodShared {
    /// A pod not started yet: `(name, hostname, namespace)` (the name is `<namespace>/<name>`
    /// for the node's pods), its `/etc/resolv.conf`, its restart policy, its StatefulSet (or
    /// name) for milestones, and its directory.
    fn new(
        (name, hostname, namespace): (&str, &str, &str),
        resolv_conf: String,
        restart_policy: &str,
        set: &str,
        dir: PathBuf,
    ) -> Arc<Self> {
        Arc::new(Self {
            name: name.to_owned(),
            hostname: hostname.to_owned(),
            namespace: namespace.to_owned(),
            resolv_conf,
            restart_policy: restart_policy.to_owned(),
            init_failed: AtomicBool::new(false),
            set: set.to_owned(),
            dir,
            ip: Mutex::new(None),
            net_inode: AtomicU64::new(0),
            containers: Mutex::new(BTreeMap::new()),
            waiting: Mutex::new(Some("starting".into())),
            hosts: Mutex::new(String::new()),
            volumes: Mutex::new(Vec::new()),
            done: AtomicBool::new(false),
        })
    }
}

/// Starts a pod's task ([`run_pod`]) and returns what controls it.
fn launch(
    shared: &Arc<Shared>,
    pod: &Arc<PodShared>,
    identity: PodIdentity,
    spec: PodSpec,
    claims: BTreeMap<String, PathBuf>,
) -> (watch::Sender<Control>, JoinHandle<()>) {
    let (control, receiver) = watch::channel(Control::Run);
    let task = tokio::spawn(run_pod(shared.clone(), pod.clone(), identity, spec, claims, receiver));
    (control, task)
}

/// Creates a pod's record and starts its task.
fn start_pod(
    shared: &Arc<Shared>,
    sts: &StatefulSet,
    name: &str,
    ordinal: i32,
    revision: &str,
    spec: PodSpec,
    claims: BTreeMap<String, PathBuf>,
) -> PodHandle {
    let template = sts.spec.as_ref().map(|s| &s.template);
    let mut labels = template
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    labels.insert("statefulset.kubernetes.io/pod-name".into(), name.to_owned());
    labels.insert("apps.kubernetes.io/pod-index".into(), ordinal.to_string());
    labels.insert("controller-revision-hash".into(), revision.to_owned());
    let annotations = template
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.annotations.clone())
        .unwrap_or_default();
    let subdomain = sts
        .spec
        .as_ref()
        .map(|s| s.service_name.clone().unwrap_or_default())
        .unwrap_or_default();
    let set_name = sts.name_any();
    shared.milestone(&set_name, name, timeline::Stage::PodCreated);
    let pod_shared = PodShared::new(
        (name, name, &shared.namespace),
        dns::resolv_conf(&shared.namespace, DNS_DOMAIN),
        "Always",
        &set_name,
        shared.dir.join("pods").join(name),
    );
    let identity = PodIdentity {
        name: name.to_owned(),
        namespace: shared.namespace.clone(),
        ip: Ipv4Addr::UNSPECIFIED,
        host_ip: shared.host_ip,
        node_name: shared.node_name.clone(),
        uid: String::new(),
        service_account: "default".to_owned(),
        labels: labels.clone(),
        annotations,
    };
    let (control, task) = launch(shared, &pod_shared, identity, spec, claims);
    PodHandle {
        name: name.to_owned(),
        revision: revision.to_owned(),
        labels,
        subdomain,
        shared: pod_shared,
        control,
        task,
        deleting: false,
    }
}

/// Brings the Secret and ConfigMap volumes of every pod up to date with the watch caches,
/// as the kubelet's volume manager remounts them: the atomic writer writes only what changed;
/// a source that cannot be read (deleted, a key missing) leaves the last content in place.
fn refresh_volumes(shared: &Shared) {
    if shared.stopping.load(Ordering::SeqCst) {
        return;
    }
    shared.volume_passes.fetch_add(1, Ordering::SeqCst);
    let pods: Vec<Arc<PodShared>> = lock(&shared.state)
        .sets
        .values()
        .flat_map(|s| s.pods.values())
        .filter(|p| !p.deleting)
        .map(|p| p.shared.clone())
        .collect();
    let mut events = Vec::new();
    for pod in pods {
        let sources = shared.sources(&pod.namespace);
        let mut volumes = lock(&pod.volumes);
        for refreshed in volumes.iter_mut() {
            let volume = &refreshed.volume;
            match volume.refresh(&sources) {
                Ok(Written::Unchanged) => refreshed.failing = None,
                Ok(Written::Published(payload)) => {
                    refreshed.failing = None;
                    refreshed.updates += 1;
                    events.push(format!(
                        "{}: volume {} updated from {} ({payload})",
                        pod.name, volume.name, volume.source
                    ));
                }
                Err(why) => {
                    if refreshed.failing.as_ref() != Some(&why) {
                        events.push(format!(
                            "{}: volume {} not refreshed, keeping its last content: {why}",
                            pod.name, volume.name
                        ));
                        refreshed.failing = Some(why);
                    }
                }
            }
        }
    }
    for event in events {
        shared.event(event);
    }
}

/// Keeps a PersistentVolumeClaim object for every claim directory, as the StatefulSet
/// controller creates one per pod and claim template, and treats the deletion of one as the
/// loss of its data: the pod's containers stop, the directory is emptied, the object is
/// released (its `kubernetes.io/pvc-protection` finalizer removed, which no controller here
/// would do) and created again, and the containers start on the empty claim, as a pod
/// recreated with a new claim would.
async fn sync_claims(shared: &Arc<Shared>) {
    let records: Vec<(String, ClaimRecord)> = lock(&shared.state)
        .claim_records
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(shared.client.clone(), &shared.namespace);
    for (name, record) in records {
        let live = shared
            .claim_objects
            .get(&kube::runtime::reflector::ObjectRef::new(&name).within(&shared.namespace));
        let deleted = match &live {
            Some(claim) => claim.metadata.deletion_timestamp.is_some(),
            None => record.created && record.seen,
        };
        if deleted {
            shared.event(format!("claim {name} deleted: {} loses its data", record.pod));
            if let Err(e) = wipe(shared, &record.pod, &record.dir)
                .await
                .and_then(|()| set_control(shared, &record.pod, Control::Run))
            {
                shared.problem(format!("emptying claim {name}: {e}"));
            }
            if live.is_some() {
                let release = serde_json::json!({"metadata": {"finalizers": null}});
                let _ = api.patch(&name, &PatchParams::default(), &Patch::Merge(&release)).await;
            }
            if let Some(r) = lock(&shared.state).claim_records.get_mut(&name) {
                r.created = false;
                r.seen = false;
            }
            continue;
        }
        if live.is_some() {
            if let Some(r) = lock(&shared.state).claim_records.get_mut(&name) {
                r.created = true;
                r.seen = true;
            }
            continue;
        }
        if record.created {
            continue;
        }
        let claim = PersistentVolumeClaim {
            metadata: kube::api::ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::core::v1::PersistentVolumeClaimSpec {
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                resources: Some(k8s_openapi::api::core::v1::VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([(
                        "storage".to_owned(),
                        k8s_openapi::apimachinery::pkg::api::resource::Quantity("1Gi".into()),
                    )])),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        match api.create(&kube::api::PostParams::default(), &claim).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            // A claim being deleted still holds the name: created on a later pass.
            Err(_) => continue,
        }
        if let Some(r) = lock(&shared.state).claim_records.get_mut(&name) {
            r.created = true;
        }
    }
}

/// Stops `pod`'s containers and empties `dir` (keeping the directory, its owner and mode).
async fn wipe(shared: &Shared, pod: &str, dir: &Path) -> Result<(), String> {
    set_control(shared, pod, Control::Pause)?;
    let prefix = format!("{pod}/");
    let stopped = poll_until(Duration::from_secs(30), || async {
        (!lock(&shared.state).live.values().any(|p| p.starts_with(&prefix))).then_some(())
    })
    .await;
    if stopped.is_none() {
        return Err(format!("{pod}'s processes did not stop"));
    }
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries.flatten() {
        let path = entry.path();
        let removed = if path.is_dir() && !path.is_symlink() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        removed.map_err(|e| format!("{}: {e}", path.display()))?;
    }
    shared.event(format!("{pod}: claim {} emptied", dir.display()));
    Ok(())
}

/// Sends `control` to the (not deleting) pod named `pod`.
fn set_control(shared: &Shared, pod: &str, control: Control) -> Result<(), String> {
    let state = lock(&shared.state);
    let handle = state
        .sets
        .values()
        .flat_map(|s| s.pods.values())
        .find(|p| p.name == pod && !p.deleting)
        .ok_or_else(|| format!("the runner has no pod {pod}"))?;
    handle.control.send_replace(control);
    Ok(())
}

/// Rewrites every pod's hosts file when the names changed.
fn refresh_dns(shared: &Shared) {
    let services: Vec<Service> = shared.services.state().iter().map(|s| (**s).clone()).collect();
    let mut state = lock(&shared.state);
    let pods: Vec<(dns::PodRecord, Arc<PodShared>)> = state
        .sets
        .values()
        .flat_map(|s| s.pods.values())
        .filter(|p| !p.deleting)
        .filter_map(|p| {
            let ip = (*lock(&p.shared.ip))?;
            Some((
                dns::PodRecord {
                    name: p.shared.hostname.clone(),
                    ip,
                    ready: pod_ready(&p.shared),
                    labels: p.labels.clone(),
                    subdomain: p.subdomain.clone(),
                },
                p.shared.clone(),
            ))
        })
        .collect();
    let records: Vec<dns::PodRecord> = pods.iter().map(|(r, _)| r.clone()).collect();
    let mut names = dns::records(&shared.namespace, DNS_DOMAIN, &records, &services);
    match shared.hosts {
        HostsScope::Own => {
            // Checked under the registry's lock: once `Drop` has set `stopping` and removed
            // this runner's names, none comes back.
            let mut registry = lock(&RUNNER_RECORDS);
            if !shared.stopping.load(Ordering::SeqCst) {
                registry.insert(shared.host_link.clone(), names.clone());
            }
        }
        HostsScope::AllRunners => {
            names = dns::Records::new();
            for records in lock(&RUNNER_RECORDS).values() {
                for (name, ips) in records {
                    names.entry(name.clone()).or_default().extend(ips.iter().copied());
                }
            }
        }
    }
    state.records = names.clone();
    let outside = dns::outside_hosts_file(&names);
    if state.outside_hosts != outside && write_dns_file(&shared.dir, "hosts", &outside).is_ok() {
        state.outside_hosts = outside;
    }
    drop(state);
    for (record, pod) in pods {
        let text = dns::hosts_file(&record, &pod.namespace, DNS_DOMAIN, &names);
        let mut written = lock(&pod.hosts);
        if *written != text && write_dns_file(&pod.dir.join("dns"), "hosts", &text).is_ok() {
            *written = text;
        }
    }
}

/// Replaces `dir/name` atomically (write, then rename). `dir` must exist: a refresh that
/// races with the removal of a pod or runner must not make its directory again.
fn write_dns_file(dir: &Path, name: &str, text: &str) -> std::io::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text)?;
    std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
    std::fs::rename(&tmp, dir.join(name))
}

/// A pod's life: sandbox, volumes, containers until deleted, then removal of everything.
async fn run_pod(
    shared: Arc<Shared>,
    pod: Arc<PodShared>,
    mut identity: PodIdentity,
    spec: PodSpec,
    claims: BTreeMap<String, PathBuf>,
    control: watch::Receiver<Control>,
) {
    let name = pod.name.clone();
    let result = async {
        let namespaces = Namespaces::create(Some(&pod.hostname))?;
        // Registered from its creation on: the kernel may have given this namespace the
        // inode number of another runner's retired pod, whose leftovers check would
        // otherwise see it held by no live pod while the veth is attached.
        let inode = namespaces.net_inode();
        hold_namespace("net", inode);
        pod.net_inode.store(inode, Ordering::SeqCst);
        let attached = match lock(&shared.network).as_mut() {
            Some(network) => network.attach(&namespaces),
            None => Err("the runner is stopping".to_owned()),
        };
        match attached {
            Ok(ip) => Ok::<_, String>((namespaces, ip)),
            Err(e) => {
                drop(namespaces);
                release_namespace("net", inode);
                Err(e)
            }
        }
    }
    .await;
    let (namespaces, ip) = match result {
        Ok(v) => v,
        Err(e) => {
            shared.problem(format!("{name}: cannot set up the pod network: {e}"));
            wait_for_delete(control).await;
            finish_pod(&shared, &pod, None, None);
            return;
        }
    };
    identity.ip = ip;
    if shared.hosts == HostsScope::Own {
        let services: Vec<Service> = shared.services.state().iter().map(|s| (**s).clone()).collect();
        for (port, target) in dns::port_maps(&services, &identity.labels, &named_ports(&spec)) {
            let (port, target) = (port.to_string(), target.to_string());
            let rule = [
                "-t",
                "nat",
                "-A",
                "PREROUTING",
                "-p",
                "tcp",
                "--dport",
                &port,
                "-j",
                "REDIRECT",
                "--to-ports",
                &target,
            ];
            if let Err(e) = sandbox::iptables(&namespaces.net, &rule) {
                shared.problem(format!("{name}: cannot map port {port} to {target}: {e}"));
            }
        }
    }
    let dns_dir = pod.dir.join("dns");
    if let Err(e) = std::fs::create_dir_all(&dns_dir) {
        shared.problem(format!("{name}: cannot create {}: {e}", dns_dir.display()));
    }
    let files = [
        ("resolv.conf", pod.resolv_conf.clone()),
        ("hostname", format!("{}\n", pod.hostname)),
    ];
    for (file, text) in files {
        if let Err(e) = write_dns_file(&dns_dir, file, &text) {
            shared.problem(format!("{name}: cannot write {file}: {e}"));
        }
    }
    // From now on `refresh_dns` (here and in the main loop) owns the hosts file.
    *lock(&pod.ip) = Some(ip);
    shared.event(format!("{name}: sandbox ready at {ip}"));
    refresh_dns(&shared);
    shared.wake.notify_one();

    // Volumes: retried like the kubelet retries a pod in ContainerCreating.
    let claims_dir = shared.dir.join("claims");
    let mut said = String::new();
    let volumes = loop {
        if *control.borrow() == Control::Delete {
            finish_pod(&shared, &pod, Some(ip), Some(namespaces));
            return;
        }
        match pod::materialize_volumes(
            &shared.sources(&identity.namespace),
            &identity,
            &spec,
            &claims,
            &claims_dir,
            &pod.dir,
        ) {
            Ok((volumes, sourced)) => {
                *lock(&pod.volumes) = sourced
                    .into_iter()
                    .map(|volume| Refreshed {
                        volume,
                        updates: 0,
                        failing: None,
                    })
                    .collect();
                break volumes;
            }
            Err(why) => {
                if why != said {
                    shared.event(format!("{name}: waiting for volumes: {why}"));
                    said = why.clone();
                }
                *lock(&pod.waiting) = Some(why);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };
    let libraries = lock(&shared.state).libraries.clone();
    let context = pod::PodContext {
        identity: &identity,
        volumes: &volumes,
        dns_dir: &dns_dir,
        pod_dir: &pod.dir,
        binaries: &shared.binaries,
        libraries: &libraries,
    };
    let (init_plans, plans) = match pod::plan_init_containers(&spec, &context) {
        Ok(init) => (init, pod::plan_containers(&spec, &context)),
        Err(e) => (Vec::new(), Err(e)),
    };
    let plans = match plans {
        Ok(plans) => plans,
        Err(e) => {
            shared.problem(format!("{name}: {e}"));
            wait_for_delete(control).await;
            finish_pod(&shared, &pod, Some(ip), Some(namespaces));
            return;
        }
    };
    *lock(&pod.waiting) = None;
    let grace = spec
        .termination_grace_period_seconds
        .map_or(DEFAULT_GRACE, |s| Duration::from_secs(s.max(0) as u64));
    let net = namespaces.net.as_raw_fd();
    let uts = namespaces.uts.as_ref().map(AsRawFd::as_raw_fd);
    // Init containers, in order, each to completion (restarted with back-off while it
    // fails, as the kubelet does under restartPolicy Always); the containers start after
    // the last one succeeded. An init container is reported while it runs or fails.
    for plan in init_plans {
        lock(&pod.containers).insert(
            plan.name.clone(),
            ContainerReport {
                name: plan.name.clone(),
                log: plan.launch.log.clone(),
                ..ContainerReport::default()
            },
        );
        let init_name = plan.name.clone();
        let completed = run_container(shared.clone(), pod.clone(), plan, (net, uts), control.clone(), grace).await;
        if !completed {
            finish_pod(&shared, &pod, Some(ip), Some(namespaces));
            return;
        }
        lock(&pod.containers).remove(&init_name);
    }
    {
        let mut containers = lock(&pod.containers);
        for plan in &plans {
            containers.insert(
                plan.name.clone(),
                ContainerReport {
                    name: plan.name.clone(),
                    log: plan.launch.log.clone(),
                    ..ContainerReport::default()
                },
            );
        }
    }
    futures::future::join_all(
        plans
            .into_iter()
            .map(|plan| run_container(shared.clone(), pod.clone(), plan, (net, uts), control.clone(), grace)),
    )
    .await;
    // A pod that ran to its end keeps its containers' logs until it is deleted, as a
    // kubelet does (`kubectl logs` of a Succeeded or Failed pod); with them its directory,
    // and its address until then too (a kubelet would release that at once).
    wait_for_delete(control).await;
    finish_pod(&shared, &pod, Some(ip), Some(namespaces));
}

async fn wait_for_delete(mut control: watch::Receiver<Control>) {
    while *control.borrow_and_update() != Control::Delete {
        if control.changed().await.is_err() {
            return;
        }
    }
}

/// Removes what a pod had: its veth and address, its namespaces, its directory.
fn finish_pod(shared: &Shared, pod: &PodShared, ip: Option<Ipv4Addr>, namespaces: Option<Namespaces>) {
    if let Some(ip) = ip
        && let Some(network) = lock(&shared.network).as_mut()
    {
        network.release(ip);
    }
    // Released once the namespace is gone, not before: until then its inode is still this
    // pod's, even if the kernel once gave the number to a pod retired elsewhere.
    let had_namespaces = namespaces.is_some();
    drop(namespaces);
    if had_namespaces {
        release_namespace("net", pod.net_inode.load(Ordering::SeqCst));
    }
    // Waits for a refresh in progress; none starts afterwards.
    lock(&pod.volumes).clear();
    let _ = std::fs::remove_dir_all(&pod.dir);
    lock(&shared.state).retired.push(RetiredPod {
        name: pod.name.clone(),
        dir: pod.dir.clone(),
        net_inode: pod.net_inode.load(Ordering::SeqCst),
        veth: ip.map(|ip| format!("vp{}", ip.octets()[3])).unwrap_or_default(),
    });
    pod.done.store(true, Ordering::SeqCst);
    shared.event(format!("{}: stopped and removed", pod.name));
    shared.wake.notify_one();
}

/// How one run of a container ended.
enum Ended {
    /// An init container exited 0.
    Completed,
    /// It exited (how, and its exit code: 128 + the signal for a signal).
    Exited(String, i32),
    /// A probe failed and it was killed.
    Unhealthy(String),
    Paused,
    Deleted,
}

/// A container's life: start, probe, restart with back-off, stop when told. Returns true
/// when an init container completed (exit 0); a container returns false once deleted.
async fn run_container(
    shared: Arc<Shared>,
    pod: Arc<PodShared>,
    plan: ContainerPlan,
    (net, uts): (RawFd, Option<RawFd>),
    mut control: watch::Receiver<Control>,
    grace: Duration,
) -> bool {
    let id = format!("{}/{}", pod.name, plan.name);
    let mut backoff = Duration::ZERO;
    loop {
        // Not while paused; never again once deleted.
        loop {
            match *control.borrow_and_update() {
                Control::Run => break,
                Control::Delete => return false,
                Control::Pause => {}
            }
            if control.changed().await.is_err() {
                return false;
            }
        }
        if !backoff.is_zero() {
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                _ = control.changed() => {
                    if *control.borrow() == Control::Delete { return false; }
                }
            }
        }
        // The environment as the kubelet builds it at this start (configMapKeyRef included).
        let launch = match plan.launch_now(&shared.sources(plan.namespace())) {
            Ok(launch) => launch,
            Err(why) => {
                *lock(&pod.waiting) = Some(why);
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = control.changed() => {}
                }
                continue;
            }
        };
        *lock(&pod.waiting) = None;
        let stopping = shared.stopping.clone();
        let submitted = lock(&shared.spawner).as_ref().map(|s| {
            s.submit(move || {
                if stopping.load(Ordering::SeqCst) {
                    return Err("the runner is stopping".to_owned());
                }
                sandbox::spawn_container(&launch, net, uts)
            })
        });
        let Some(Ok(receiver)) = submitted else { return false };
        let spawned = receiver
            .await
            .map_err(|_| "the runner's spawner thread dropped the start".to_owned());
        let mut child = match spawned.and_then(|r| r) {
            Ok(child) => child,
            Err(e) => {
                shared.problem(format!(
                    "{id}: {e}\nlast lines of its log:\n{}",
                    tail(&plan.launch.log, 10)
                ));
                backoff = next_backoff(backoff);
                continue;
            }
        };
        let pid = child.id() as i32;
        let record = ProcessRecord {
            pod: pod.name.clone(),
            container: plan.name.clone(),
            pid,
            start_time: process_start_time(pid).unwrap_or_default(),
            mount_ns: namespace_inode(pid, "mnt"),
        };
        let mount_ns = record.mount_ns;
        {
            let mut state = lock(&shared.state);
            hold_namespace("mnt", mount_ns);
            state.processes.push(record);
            state.live.insert(pid, id.clone());
        }
        let since = std::time::SystemTime::now();
        update(&pod, &plan.name, |c| {
            c.pid = Some(pid);
            c.started = plan.startup.is_none();
            c.ready = false;
            c.running_since = Some(since);
        });
        shared.event(format!(
            "{id}: started pid {pid}: {} {}",
            plan.launch.argv0,
            plan.launch.args.join(" ")
        ));
        if !plan.init {
            shared.milestone(&pod.set, &pod.name, timeline::Stage::ProcessStarted);
        }
        let started = Instant::now();
        let ended = supervise(&shared, &pod, &plan, &mut child, &mut control, grace).await;
        lock(&shared.state).live.remove(&pid);
        release_namespace("mnt", mount_ns);
        update(&pod, &plan.name, |c| {
            c.pid = None;
            c.ready = false;
            c.started = false;
            c.running_since = None;
        });
        shared.wake.notify_one();
        let code = exit_code(&ended);
        match ended {
            Ended::Deleted => {
                shared.event(format!("{id}: stopped"));
                return false;
            }
            Ended::Completed => {
                shared.event(format!("{id}: completed after {:.1?}", started.elapsed()));
                return true;
            }
            Ended::Paused => {
                shared.event(format!("{id}: killed and held stopped"));
                backoff = Duration::ZERO;
            }
            Ended::Exited(how, _) | Ended::Unhealthy(how) if !restarts(&pod.restart_policy, plan.init, code) => {
                update(&pod, &plan.name, |c| {
                    c.last_exit = Some(how.clone());
                    c.terminated = Some(Termination {
                        exit_code: code,
                        started: since,
                        finished: std::time::SystemTime::now(),
                    });
                    c.finished = true;
                });
                if plan.init {
                    pod.init_failed.store(true, Ordering::SeqCst);
                }
                shared.event(format!(
                    "{id}: {how}; not restarted (restartPolicy {})",
                    pod.restart_policy
                ));
                shared.wake.notify_one();
                return false;
            }
            Ended::Exited(how, _) | Ended::Unhealthy(how) => {
                update(&pod, &plan.name, |c| {
                    c.terminated = Some(Termination {
                        exit_code: code,
                        started: since,
                        finished: std::time::SystemTime::now(),
                    });
                });
                if started.elapsed() >= BACKOFF_RESET {
                    backoff = Duration::ZERO;
                }
                backoff = next_backoff(backoff);
                update(&pod, &plan.name, |c| {
                    c.restarts += 1;
                    c.last_exit = Some(how.clone());
                });
                shared.event(format!(
                    "{id}: {how}; restarting in {backoff:?}; last lines of its log:\n{}",
                    tail(&plan.launch.log, 12)
                ));
            }
        }
    }
}

/// The exit code of a run that ended (137, as for SIGKILL, for a container killed for a
/// failed probe).
fn exit_code(ended: &Ended) -> i32 {
    match ended {
        Ended::Exited(_, code) => *code,
        _ => 137,
    }
}

/// Whether a container that ended with `code` starts again under the pod's `restartPolicy`
/// (an init container: until it succeeds, unless `Never`).
fn restarts(policy: &str, init: bool, code: i32) -> bool {
    match policy {
        "Never" => false,
        "OnFailure" => code != 0,
        _ => !init || code != 0,
    }
}

fn next_backoff(backoff: Duration) -> Duration {
    if backoff.is_zero() {
        BACKOFF_START
    } else {
        (backoff * 2).min(BACKOFF_MAX)
    }
}

fn update(pod: &PodShared, container: &str, f: impl FnOnce(&mut ContainerReport)) {
    if let Some(c) = lock(&pod.containers).get_mut(container) {
        f(c);
    }
}

/// Records the pod's Ready milestone once its last container is ready.
fn note_ready(shared: &Shared, pod: &PodShared) {
    if pod_ready(pod) {
        shared.milestone(&pod.set, &pod.name, timeline::Stage::Ready);
    }
}

/// Watches one run of a container: exit, probes, and what it is told.
async fn supervise(
    shared: &Shared,
    pod: &PodShared,
    plan: &ContainerPlan,
    child: &mut Child,
    control: &mut watch::Receiver<Control>,
    grace: Duration,
) -> Ended {
    let id = format!("{}/{}", pod.name, plan.name);
    let start = Instant::now();
    let mut startup = plan.startup.clone().map(|p| Prober::new(p, start));
    let mut readiness = plan.readiness.clone().map(|p| Prober::new(p, start));
    let mut liveness = plan.liveness.clone().map(|p| Prober::new(p, start));
    let mut started = startup.is_none();
    let mut ready = false;
    // A container without a readiness probe is ready once started; an init container never
    // is (the kubelet's pod is not Ready while one runs, so it must not count the pod in).
    if started && readiness.is_none() && !plan.init {
        ready = true;
        update(pod, &plan.name, |c| c.ready = true);
        note_ready(shared, pod);
        shared.wake.notify_one();
    }
    loop {
        match child.try_wait() {
            Ok(Some(status)) if plan.init && status.success() => return Ended::Completed,
            Ok(Some(status)) => {
                let code = status
                    .code()
                    .unwrap_or_else(|| 128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0));
                return Ended::Exited(format!("exited ({status})"), code);
            }
            Ok(None) => {}
            Err(e) => return Ended::Exited(format!("cannot be waited for ({e})"), 128),
        }
        let now = Instant::now();
        if !started {
            if let Some(p) = startup.as_mut().filter(|p| p.due(now)) {
                match p.run().await {
                    Verdict::Passing => {
                        started = true;
                        update(pod, &plan.name, |c| c.started = true);
                        shared.event(format!("{id}: startup probe passed after {:.1?}", start.elapsed()));
                        if let Some(r) = readiness.as_mut() {
                            r.trigger(start);
                        }
                        if readiness.is_none() {
                            ready = true;
                            update(pod, &plan.name, |c| c.ready = true);
                            note_ready(shared, pod);
                            shared.wake.notify_one();
                        }
                    }
                    Verdict::Failing => {
                        let why = p.last_error.clone().unwrap_or_default();
                        terminate(child, grace).await;
                        return Ended::Unhealthy(format!("startup probe failed ({why}); killed"));
                    }
                    Verdict::Unchanged => {
                        update(pod, &plan.name, |c| c.last_probe_error = p.last_error.clone());
                    }
                }
            }
            if !started {
                // The other probes wait for the startup probe; their period keeps running.
                if let Some(p) = readiness.as_mut().filter(|p| p.due(now)) {
                    p.skip();
                }
                if let Some(p) = liveness.as_mut().filter(|p| p.due(now)) {
                    p.skip();
                }
            }
        } else {
            if let Some(p) = readiness.as_mut().filter(|p| p.due(now)) {
                let verdict = p.run().await;
                let error = p.last_error.clone();
                let now_ready = match verdict {
                    Verdict::Passing => true,
                    Verdict::Failing => false,
                    Verdict::Unchanged => ready,
                };
                update(pod, &plan.name, |c| {
                    c.ready = now_ready;
                    c.last_probe_error = error.clone();
                });
                if now_ready != ready {
                    ready = now_ready;
                    shared.event(format!(
                        "{id}: {} ({:.1?} after start){}",
                        if ready { "ready" } else { "not ready" },
                        start.elapsed(),
                        error.map(|e| format!(": {e}")).unwrap_or_default()
                    ));
                    if ready {
                        note_ready(shared, pod);
                    }
                    shared.wake.notify_one();
                }
            }
            if let Some(p) = liveness.as_mut().filter(|p| p.due(now))
                && p.run().await == Verdict::Failing
            {
                let why = p.last_error.clone().unwrap_or_default();
                terminate(child, grace).await;
                return Ended::Unhealthy(format!("liveness probe failed ({why}); killed"));
            }
        }
        let next = probe::next_wake(
            started,
            [startup.as_ref(), readiness.as_ref(), liveness.as_ref()],
            Instant::now() + EXIT_POLL,
        );
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            changed = control.changed() => {
                let wanted = if changed.is_err() { Control::Delete } else { *control.borrow() };
                match wanted {
                    Control::Run => {}
                    Control::Pause => {
                        let _ = child.kill();
                        let _ = child.wait();
                        return Ended::Paused;
                    }
                    Control::Delete => {
                        terminate(child, grace).await;
                        return Ended::Deleted;
                    }
                }
            }
        }
    }
}

/// Field 22 (start time) of /proc/<pid>/stat.
fn process_start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; fields after it follow the last ')'.
    let after = stat.rsplit_once(')')?.1;
    after.split_whitespace().nth(19)?.parse().ok()
}

fn namespace_inode(pid: i32, kind: &str) -> u64 {
    std::fs::read_link(format!("/proc/{pid}/ns/{kind}"))
        .ok()
        .and_then(|l| {
            let l = l.to_string_lossy().into_owned();
            l.split_once('[')?.1.trim_end_matches(']').parse().ok()
        })
        .unwrap_or_default()
}

/// Every namespace (`net:[…]`, `mnt:[…]`) some process is in or holds a descriptor to.
/// The namespaces (`net:[inode]`, `mnt:[inode]`) that live pods of every runner in this
/// process hold, with how many hold each. The kernel reuses a freed namespace's inode
/// number, so a retired pod's number found in use is a leak only if no live pod holds it.
static LIVE_NAMESPACES: Mutex<BTreeMap<String, usize>> = Mutex::new(BTreeMap::new());

fn hold_namespace(kind: &str, inode: u64) {
    *lock(&LIVE_NAMESPACES).entry(format!("{kind}:[{inode}]")).or_default() += 1;
}

fn release_namespace(kind: &str, inode: u64) {
    let mut live = lock(&LIVE_NAMESPACES);
    let key = format!("{kind}:[{inode}]");
    if let Some(count) = live.get_mut(&key) {
        *count -= 1;
        if *count == 0 {
            live.remove(&key);
        }
    }
}

/// The namespaces in use on this machine that no live pod of any runner holds.
fn namespaces_in_use() -> BTreeSet<String> {
    let live = lock(&LIVE_NAMESPACES).clone();
    namespaces_held()
        .into_iter()
        .filter(|ns| !live.contains_key(ns))
        .collect()
}

fn namespaces_held() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in procs.flatten() {
        let path = entry.path();
        if !entry.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        for kind in ["net", "mnt"] {
            if let Ok(link) = std::fs::read_link(path.join("ns").join(kind)) {
                out.insert(link.to_string_lossy().into_owned());
            }
        }
        if let Ok(fds) = std::fs::read_dir(path.join("fd")) {
            for fd in fds.flatten() {
                if let Ok(link) = std::fs::read_link(fd.path()) {
                    let link = link.to_string_lossy().into_owned();
                    if link.starts_with("net:[") || link.starts_with("mnt:[") {
                        out.insert(link);
                    }
                }
            }
        }
    }
    out
}

fn tail(path: &Path, lines: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::restarts;

    #[test]
    fn a_container_restarts_as_its_pods_restart_policy_says() {
        // (policy, init container, exit code) → started again.
        for (policy, init, code, again) in [
            ("Always", false, 0, true),
            ("Always", false, 1, true),
            ("OnFailure", false, 0, false),
            ("OnFailure", false, 1, true),
            ("Never", false, 1, false),
            // An init container runs again until it succeeds, unless the pod never restarts.
            ("Always", true, 1, true),
            ("OnFailure", true, 1, true),
            ("Never", true, 1, false),
        ] {
            assert_eq!(restarts(policy, init, code), again, "{policy} init={init} exit {code}");
        }
    }
}
