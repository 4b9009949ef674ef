//! The node: a real Node of the super cluster that runs ordinary pods, placed by the real
//! kube-scheduler, so that pods a syncer copies into the super cluster run for real.
//!
//! [`node()`] starts it on first use, once per test process (like [`crate::cluster`]), on a
//! thread of its own that lives as long as the process. It
//! - registers the Node `capn-node-<random>` (capacity and allocatable: 16 CPUs, 64 GiB,
//!   110 pods, or `$CAPN_TEST_NODE_MAX_PODS` like the kubelet's `--max-pods`, up to the 252
//!   addresses of its pod network; addresses: the node namespace's address on its pod
//!   network as InternalIP (where its kube-proxy serves node ports), its bridge's host-side
//!   address, where its kubelet API listens, as InternalDNS, and its name as Hostname; the
//!   kubelet's port as `kubeletEndpoint`; Ready with no pressure), renews its
//!   Lease in `kube-node-lease` and the conditions' heartbeat every 10 s;
//! - starts the real kube-scheduler of the super cluster's release against the super
//!   cluster (admin kubeconfig, leader election off) and waits for its `/healthz`, and the
//!   real kube-proxy (adaptation 9), and waits for its;
//! - plays the kubelet for every Pod whose `spec.nodeName` is the node, in any namespace:
//!   each pod runs with the runner's machinery (its own network and UTS namespaces on the
//!   node's bridge, volumes, containers as processes in their own mount namespaces, probes,
//!   restarts: see the runner's documentation, whose adaptations hold here too), and its
//!   status is written as the kubelet writes it (phase, conditions, IPs, start time,
//!   `containerStatuses`); a pod being deleted has its containers stopped (SIGTERM, SIGKILL
//!   after the grace period) and is then deleted with `gracePeriodSeconds: 0`, as the kubelet
//!   does.
//!
//! # Adaptations (the complete list, besides the runner's 1-11)
//! 1. **Images.** No image is pulled. `registry.k8s.io/e2e-test-images/agnhost:<any tag>`
//!    runs the `agnhost` binary of the super cluster's release (its entrypoint, `/agnhost`,
//!    when the container gives no `command`, with its CMD `pause` when it gives no `args`
//!    either; its `command`/`args` as given otherwise), and
//!    `registry.k8s.io/pause:<any tag>` runs `agnhost pause`. Both are taken from the release
//!    cache of `hack/kube-assets.sh` (`kubernetes-v<release>/agnhost`), as is
//!    `kube-scheduler`. The BusyBox images (`registry.k8s.io/e2e-test-images/busybox`,
//!    `busybox`) run the host's `busybox` (Debian's `busybox`, which, as Alpine's, finds
//!    commands on the PATH before its own applets): the command
//!    given, else the args, else `sh`, each an applet; so does a command of the agnhost image
//!    other than `/agnhost` (`/bin/sh -c …`: that image is Alpine's, whose tools are
//!    BusyBox's); every container of the node finds BusyBox's applets in `/bin`, as in those
//!    images (so `kubectl exec … -- cat` works), and the agnhost image's containers the
//!    host's netcat-openbsd, `dig`, `nslookup`, `curl` and `getent` in `/usr/bin`, as the
//!    image installs them (upstream's Service specs run `nc -v -t`, which BusyBox's `nc`
//!    lacks, and `curl`; its DNS specs run `dig` and `getent`), and a `/localhost.crt` and
//!    `/localhost.key` like those it holds for `porter`. `registry.k8s.io/e2e-test-images/sample-apiserver`
//!    runs the `sample-apiserver` of the super cluster's release (`k8s.io/sample-apiserver`,
//!    built with the node's binaries; [`SAMPLE_APISERVER_ENV`] names another release's, as
//!    `hack/conformance.sh` does for a tenant of another release: a sample-apiserver lists
//!    the admission APIs of its own release and never gets ready against an older
//!    apiserver), and `registry.k8s.io/etcd` the super cluster's etcd,
//!    whatever their tags (the e2e aggregator spec runs both). The e2e web server images
//!    (`registry.k8s.io/e2e-test-images/nginx` and `…/httpd`, [`WEB_SERVER_IMAGES`]) run
//!    agnhost's `netexec --http-port=80` when the container gives no command or args (the
//!    specs that use them need a ready pod answering HTTP on port 80; `/` answers 200, not
//!    nginx's page). Any other image is refused: its containers stay Waiting with reason
//!    `ErrImagePull` and a message naming the supported images. `imageID` and `containerID`
//!    are `capn-node://…` names, not digests.
//! 2. **Volumes**: the runner's (secret, configMap, emptyDir), plus `downwardAPI` and
//!    `projected` volumes with `secret`, `configMap` and `downwardAPI` sources, written once
//!    when the pod starts (not refreshed while it runs, unlike the kubelet's), and `hostPath`
//!    volumes of type `Directory`, `DirectoryOrCreate` or unset, bind-mounted from the host
//!    (read-only when the mount says so) after the kubelet's type check (runner adaptation 5:
//!    a missing `Directory` keeps the pod waiting, `hostPath type check failed: <path> is not
//!    a directory` in its container's waiting message, until the directory exists); other
//!    hostPath types are refused like other unsupported pods (below). Projected
//!    `serviceAccountToken` sources (hence the `kube-api-access-*` volume the ServiceAccount
//!    admission plugin adds unless `automountServiceAccountToken: false`), `resourceFieldRef`
//!    items and persistentVolumeClaims are refused like other unsupported pods: Waiting with
//!    reason `CreateContainerError` and the reason as message.
//! 3. **Network.** Pods get addresses on the node's own 198.18.N.0/24 bridge (the runner's
//!    network), reachable from the host. Every pod network of this host (the node's and each
//!    runner's) has a route to 198.18.0.0/15 through the host, and forwarding is enabled on
//!    each network's host-side link only (not the host's global `ip_forward`), so the node's
//!    pods and the runners' pods reach one another, but nothing else: still no default route.
//! 4. **DNS.** A node pod's `/etc/hosts` holds the names of every Service whose pods a live
//!    [`super::Runner`] of this process runs (every form, `<svc>.<ns>.svc.cluster.local`
//!    included), kept current like a runner pod's. Its `/etc/resolv.conf` is the kubelet's
//!    for `dnsPolicy: None` (the pod's `dnsConfig`: how the syncer points tenant pods at their
//!    tenant's DNS); for any other policy it holds only the ClusterFirst search path, without
//!    a nameserver: the super cluster runs no cluster DNS, so Services of the node's own pods
//!    are not resolved by name there; their ClusterIPs route (adaptation 9).
//! 5. **Status.** `initContainerStatuses`, `ephemeralContainerStatuses`, resources and
//!    `allocatedResources`, `nominatedNodeName` and readiness gates are not written; init
//!    containers are reported only through `Initialized` and the phase. The stop of a deleted
//!    pod uses the pod's `terminationGracePeriodSeconds`, not `deletionGracePeriodSeconds`.
//!    No Events are recorded. A pod that ran to its end keeps its address (and its logs, as
//!    on a kubelet) until it is deleted.
//! 6. **Kubelet API: logs, exec, port-forward.** The announced `kubeletEndpoint` serves
//!    `containerLogs` (`tailLines` and `follow` only), and `exec` and `portForward` through
//!    `capn-test-kubelet` (hack/test-kubelet: the kubelet's own streaming code; exec runs the
//!    command with nsenter in the container's namespaces and root, without a terminal), with a
//!    self-signed certificate and no client authentication; see `kubelet.rs`. No attach, no
//!    metrics. The same API serves each runner's pods on its own Node (runner adaptation
//!    12), all relayed to one `capn-test-kubelet` per test process. Tests also read a container's output with [`Node::container_log`]. No node lifecycle controller runs, so the node is never
//!    tainted; the heartbeat keeps it Ready should one run.
//! 7. **One process.** The node lives as long as the test process; its pods are killed when
//!    it exits (its directory is removed then). Pods it finds already Succeeded or Failed
//!    are not run again.
//! 8. **Node lifecycle.** The `node.kubernetes.io/not-ready` taint that the API server's
//!    admission puts on every new Node is lifted by the node itself once it is Ready (the
//!    node lifecycle controller's job, which does not run in the super cluster).
//! 9. **kube-proxy.** The real one (iptables mode, from the release cache like the
//!    scheduler; the host needs `iptables`, Debian's package) runs in the node's network
//!    namespace, not the host's, which routes the super cluster's Service CIDR for the
//!    node's pods; it masquerades all Service traffic (`masqueradeAll`: no `br_netfilter`
//!    here), so a backend sees the node namespace's address as its client; NodePorts answer
//!    on the node namespace's address ([`Node::node_port_address`]), which is the Node's
//!    InternalIP. The kubelet API is on the host's side of the pod network, which the Node
//!    names as InternalDNS and the test super cluster's apiserver prefers
//!    (`--kubelet-preferred-address-types=InternalDNS,InternalIP`), as a tenant apiserver
//!    prefers capn's kubelet API under that type. See `proxy.rs`.

pub(super) mod kubelet;
pub(super) mod objects;
mod proxy;
pub use objects::MAX_PODS_VARIABLE;
mod status;

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock, mpsc};
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::Value;

use super::pod::{self, Binaries, ImageTool, PodIdentity, repository};
use super::{
    Base, HostsScope, PodHandle, PodShared, RESYNC, Runner, SetState, Shared, Stores, delete_pod, launch, lock,
    refresh_dns, watch_volume_sources,
};

/// The image whose binary the node runs.
pub const AGNHOST_IMAGE: &str = "registry.k8s.io/e2e-test-images/agnhost";
/// The pause image, which `agnhost pause` stands for.
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause";
/// The e2e aggregator spec's sample apiserver, which the `sample-apiserver` of the super
/// cluster's release stands for (adaptation 1).
pub const SAMPLE_APISERVER_IMAGE: &str = "registry.k8s.io/e2e-test-images/sample-apiserver";
/// Environment variable naming the `sample-apiserver` binary the node runs for
/// [`SAMPLE_APISERVER_IMAGE`] instead of the super cluster release's (adaptation 1): the
/// tenant release's, so that its admission informers list APIs the tenant serves.
pub const SAMPLE_APISERVER_ENV: &str = "CAPN_NODE_SAMPLE_APISERVER";
/// etcd's image, which the super cluster's own etcd stands for, whatever its tag
/// (adaptation 1).
pub const ETCD_IMAGE: &str = "registry.k8s.io/etcd";
/// The BusyBox images, which the host's static `busybox` stands for (adaptation 1).
pub const BUSYBOX_IMAGES: [&str; 3] = [
    "registry.k8s.io/e2e-test-images/busybox",
    "busybox",
    "docker.io/library/busybox",
];
/// The e2e suite's web server images (`imageutils.Nginx`, `imageutils.Httpd`: the
/// ReplicationController lifecycle and EndpointSlice "for Pods matching a Service" specs, the
/// apps specs' `WebserverImage`), which agnhost's `netexec` on their port 80 stands for: those
/// specs need a pod that runs, gets ready and answers HTTP on port 80, not nginx itself
/// (adaptation 1).
pub const WEB_SERVER_IMAGES: [&str; 2] = [
    "registry.k8s.io/e2e-test-images/nginx",
    "registry.k8s.io/e2e-test-images/httpd",
];
/// How often the Lease and the Ready heartbeat are renewed (the kubelet's default).
const HEARTBEAT: Duration = Duration::from_secs(10);

/// The super cluster's node; get it with [`node()`].
pub struct Node {
    name: String,
    runner: Runner,
    scheduler_pid: u32,
    scheduler_log: PathBuf,
}

static NODE: OnceLock<Result<Node, String>> = OnceLock::new();

/// The node of this test process, started by the first caller (with the super cluster,
/// [`crate::cluster`], if that is not up yet) and shared by every test. Nothing runs pods
/// before it is called: a test whose pods must run calls it first (it returns at once once
/// started; the first start takes a few seconds: the Node, the scheduler's `/healthz`).
///
/// # Panics
/// When it cannot start: not root, `kube-scheduler` or `agnhost` missing from the release
/// cache (the message holds the command that builds them), the Node refused, or the scheduler
/// unhealthy. Every later caller panics with the same message.
pub fn node() -> &'static Node {
    match NODE.get_or_init(start) {
        Ok(node) => node,
        Err(message) => panic!("the test node did not start: {message}"),
    }
}

impl Node {
    /// The Node's name (`capn-node-<random>`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where its kubelet API listens (its InternalDNS): the host's address on the node's pod
    /// network, which every pod network of this host reaches.
    pub fn address(&self) -> Ipv4Addr {
        self.runner.host_address()
    }

    /// Where the node serves `NodePort` Services (its kube-proxy's `nodePortAddresses`), its
    /// InternalIP: the node namespace's address on its pod network, which the host and every
    /// pod reach.
    pub fn node_port_address(&self) -> Ipv4Addr {
        lock(&self.runner.shared.network)
            .as_ref()
            .map_or(Ipv4Addr::UNSPECIFIED, |network| network.node_address())
    }

    /// The address of the pod `namespace/name` while the node runs it.
    pub fn pod_ip(&self, namespace: &str, name: &str) -> Option<Ipv4Addr> {
        self.runner.pod_ip(&format!("{namespace}/{name}"))
    }

    /// The output so far of container `container` of pod `namespace/name` (while the node
    /// has the pod).
    pub fn container_log(&self, namespace: &str, name: &str, container: &str) -> Option<String> {
        let container = self
            .runner
            .shared
            .container(&format!("{namespace}/{name}"), container)?;
        std::fs::read_to_string(container.log).ok()
    }

    /// The pid of the kube-scheduler the node started.
    pub fn scheduler_pid(&self) -> u32 {
        self.scheduler_pid
    }

    /// The machinery that runs the pods, whose pods are named `<namespace>/<name>`: its
    /// [`Runner::pods`], [`Runner::processes`], [`Runner::leftovers`], [`Runner::check`]
    /// and [`Runner::report`] are the node's.
    pub fn runner(&self) -> &Runner {
        &self.runner
    }

    /// [`Runner::report`], with the end of the scheduler's log.
    pub fn report(&self) -> String {
        format!(
            "node {}:\n{}\nlast lines of {}:\n{}",
            self.name,
            self.runner.report(),
            self.scheduler_log.display(),
            super::tail(&self.scheduler_log, 20)
        )
    }
}

/// Starts the node on a thread that lives as long as the process (`PR_SET_PDEATHSIG` of the
/// scheduler and of the spawner thread's children is tied to it) and keeps its tasks running.
fn start() -> Result<Node, String> {
    crate::cluster();
    let (sender, receiver) = mpsc::channel();
    std::thread::Builder::new()
        .name("capn-test-node".to_owned())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime,
                Err(e) => {
                    let _ = sender.send(Err(format!("cannot build a tokio runtime: {e}")));
                    return;
                }
            };
            runtime.block_on(async move {
                let (node, mut scheduler, mut proxy) = match start_here().await {
                    Ok(started) => started,
                    Err(e) => {
                        let _ = sender.send(Err(e));
                        return;
                    }
                };
                let shared = node.runner.shared.clone();
                let _ = sender.send(Ok(node));
                // Keeps the tasks running; reports a scheduler that dies.
                loop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    if let Err(report) = scheduler.check_running() {
                        shared.problem(format!("kube-scheduler died: {report}"));
                        std::future::pending::<()>().await;
                    }
                    if let Err(report) = proxy.process.check_running() {
                        shared.problem(format!("kube-proxy died: {report}"));
                        std::future::pending::<()>().await;
                    }
                }
            });
        })
        .map_err(|e| format!("cannot start the node thread: {e}"))?;
    receiver
        .recv()
        .map_err(|_| "the node's start-up thread panicked (see its message above)".to_owned())?
}

/// What the node keeps besides the runner's state.
#[derive(Default)]
struct Book {
    /// Pods the node will not run, by uid: `(reason, message)` for their containers.
    refused: BTreeMap<String, (String, String)>,
    /// When the node took each pod on, by uid.
    started: BTreeMap<String, SystemTime>,
    /// The status last written, by uid.
    written: BTreeMap<String, Value>,
}

async fn start_here() -> Result<(Node, crate::process::Process, proxy::Proxy), String> {
    let client = crate::cluster().client();
    let cache = pod::release_cache();
    let (release, binaries) = objects::release_binaries(&cache)?;
    let agnhost = binaries["agnhost"].clone();
    let busybox = objects::busybox()?;
    let agnhost_tools = objects::agnhost_tools()?;
    let agnhost_files = objects::agnhost_files(&cache)?;
    // `agnhost`, and every BusyBox applet (`sh`, `cat`, `sleep`, ...), each run by the one
    // multi-call binary, which picks the applet from its argv[0].
    let mut fixed: BTreeMap<String, PathBuf> = objects::applets(&busybox)?
        .into_iter()
        .map(|applet| (applet, busybox.clone()))
        .collect();
    fixed.insert("agnhost".to_owned(), agnhost.clone());
    let sample_apiserver = match std::env::var_os(SAMPLE_APISERVER_ENV) {
        Some(path) if PathBuf::from(&path).is_file() => PathBuf::from(path),
        Some(path) => {
            return Err(format!(
                "{SAMPLE_APISERVER_ENV}={} is not a file (build a release's with \
                 `KUBE_VERSION=v<release> KUBE_NODE_BINARIES=1 hack/kube-assets.sh`)",
                PathBuf::from(path).display()
            ));
        }
        None => binaries["sample-apiserver"].clone(),
    };
    fixed.insert("sample-apiserver".to_owned(), sample_apiserver.clone());
    let etcd = crate::cluster().assets_dir().join("etcd");
    fixed.insert("etcd".to_owned(), etcd.clone());
    let name = format!(
        "capn-node-{:04x}{:04x}",
        super::sandbox::random_u16(),
        super::sandbox::random_u16()
    );
    let (secrets, secrets_writer) = reflector::store();
    let (config_maps, config_maps_writer) = reflector::store();
    let shared = Shared::create(
        Base {
            client: client.clone(),
            namespace: name.clone(),
            node_name: name.clone(),
            hosts: HostsScope::AllRunners,
            binaries: Binaries {
                cache,
                capn: PathBuf::from("/nonexistent/capn"),
                fixed,
                busybox: Some(busybox.clone()),
                image_tools: of_agnhost(&agnhost_tools),
                image_files: of_agnhost(&agnhost_files),
            },
        },
        Stores {
            services: reflector::store().0,
            secrets,
            config_maps,
            claim_objects: reflector::store().0,
        },
    )?;
    let tools = agnhost_tools.into_iter().map(|(_, binary)| binary);
    let node_binaries = [agnhost, busybox.clone(), sample_apiserver, etcd];
    for binary in node_binaries.into_iter().chain(tools) {
        let libraries = pod::libraries(&binary)?;
        lock(&shared.state).libraries.insert(binary, libraries);
    }
    let node_address = lock(&shared.network)
        .as_ref()
        .map(|network| network.node_address())
        .ok_or("the node has no pod network")?;
    let uid = objects::register(&client, &name, (node_address, shared.host_ip), &release).await?;
    let scheduler = objects::start_scheduler(&binaries["kube-scheduler"], &shared.dir).await?;
    let proxy = proxy::start(&binaries["kube-proxy"], &shared, &name).await?;
    let mut tasks = watch_volume_sources(
        &shared,
        (Api::all(client.clone()), secrets_writer),
        (Api::all(client.clone()), config_maps_writer),
    );
    let (pods, pods_writer) = reflector::store();
    let field = format!("spec.nodeName={name}");
    let watch_pods = reflector::reflector(
        pods_writer,
        watcher(
            Api::<Pod>::all(client.clone()),
            watcher::Config::default().fields(&field),
        ),
    )
    .default_backoff();
    let wake_shared = shared.clone();
    tasks.push(tokio::spawn(async move {
        watch_pods.for_each(|_| async { wake_shared.wake.notify_one() }).await;
    }));
    let beat = (client.clone(), name.clone(), shared.clone());
    tasks.push(tokio::spawn(async move {
        let (client, name, shared) = beat;
        let since = objects::time(SystemTime::now());
        loop {
            tokio::time::sleep(HEARTBEAT).await;
            if let Err(e) = objects::heartbeat(&client, &name, &uid, &since).await {
                shared.event(format!("heartbeat: {e}"));
            }
        }
    }));
    let loop_shared = shared.clone();
    tasks.push(tokio::spawn(async move {
        let _ = pods.wait_until_ready().await;
        let _ = loop_shared.secrets.wait_until_ready().await;
        let _ = loop_shared.config_maps.wait_until_ready().await;
        let mut book = Book::default();
        loop {
            reconcile(&loop_shared, &mut book, &pods).await;
            tokio::select! {
                () = loop_shared.wake.notified() => {}
                () = tokio::time::sleep(RESYNC) => {}
            }
        }
    }));
    let kubelet = std::net::SocketAddr::new(shared.host_ip.into(), objects::KUBELET_PORT);
    tasks.push(kubelet::start(kubelet, shared.clone()).await?);
    shared.event(format!(
        "node {name} registered at {} ({}); kube-scheduler pid {}, kube-proxy pid {}",
        shared.host_ip,
        shared.host_link,
        scheduler.child.id(),
        proxy.process.child.id()
    ));
    remove_at_exit(shared.dir.clone());
    let node = Node {
        name,
        scheduler_pid: scheduler.child.id(),
        scheduler_log: scheduler.log.clone(),
        runner: Runner { shared, tasks },
    };
    Ok((node, scheduler, proxy))
}

/// `namespace/name` of a pod.
fn key(pod: &Pod) -> String {
    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())
}

/// One pass: start the new pods, stop and delete the deleted ones, write every status.
async fn reconcile(shared: &Arc<Shared>, book: &mut Book, pods: &Store<Pod>) {
    let pods = pods.state();
    let by_uid: BTreeMap<String, Arc<Pod>> = pods
        .iter()
        .filter_map(|p| Some((p.metadata.uid.clone()?, p.clone())))
        .collect();
    let mut deletions = Vec::new();
    let mut statuses = Vec::new();
    {
        let mut guard = lock(&shared.state);
        let state = &mut *guard;
        for (uid, pod) in &by_uid {
            if state.sets.contains_key(uid) || book.refused.contains_key(uid) || book.started.contains_key(uid) {
                continue;
            }
            if pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
            if matches!(phase, Some("Succeeded" | "Failed")) {
                continue;
            }
            book.started.insert(uid.clone(), SystemTime::now());
            match admit(pod, &shared.binaries, &mut state.versions) {
                Ok(spec) => {
                    let handle = start_node_pod(shared, pod, spec);
                    state.sets.insert(
                        uid.clone(),
                        SetState {
                            name: key(pod),
                            update_revision: String::new(),
                            current_revision: String::new(),
                            refused: None,
                            pods: BTreeMap::from([(0, handle)]),
                            written: None,
                            claims: BTreeSet::new(),
                            gone: false,
                        },
                    );
                }
                Err(refusal) => {
                    state
                        .events
                        .push(format!("{}: not run: {}: {}", key(pod), refusal.0, refusal.1));
                    book.refused.insert(uid.clone(), refusal);
                }
            }
        }
        // Deleted pods (or gone: force-deleted) stop; once stopped, their objects go.
        let mut finished = Vec::new();
        for (uid, set) in state.sets.iter_mut() {
            let live = by_uid.get(uid);
            let deleting = live.is_none_or(|p| p.metadata.deletion_timestamp.is_some());
            let Some(handle) = set.pods.get_mut(&0) else { continue };
            if deleting {
                delete_pod(handle);
                if handle.shared.done.load(std::sync::atomic::Ordering::SeqCst) {
                    finished.push(uid.clone());
                    if let Some(pod) = live {
                        deletions.push(pod.clone());
                    }
                }
            } else if let Some(pod) = live {
                let seen = status::Seen {
                    pod,
                    host_ip: shared.host_ip,
                    running: Some(&handle.shared),
                    refused: None,
                    start_time: book.started.get(uid).copied().unwrap_or_else(SystemTime::now),
                };
                statuses.push((pod.clone(), status::pod_status(&seen)));
            }
        }
        for uid in finished {
            state.sets.remove(&uid);
        }
    }
    for (uid, refusal) in &book.refused {
        match by_uid.get(uid) {
            Some(pod) if pod.metadata.deletion_timestamp.is_some() => deletions.push(pod.clone()),
            Some(pod) => {
                let seen = status::Seen {
                    pod,
                    host_ip: shared.host_ip,
                    running: None,
                    refused: Some(refusal),
                    start_time: book.started.get(uid).copied().unwrap_or_else(SystemTime::now),
                };
                statuses.push((pod.clone(), status::pod_status(&seen)));
            }
            None => {}
        }
    }
    book.refused
        .retain(|uid, _| by_uid.get(uid).is_some_and(|p| p.metadata.deletion_timestamp.is_none()));
    book.started.retain(|uid, _| by_uid.contains_key(uid));
    book.written.retain(|uid, _| by_uid.contains_key(uid));
    for pod in deletions {
        delete_object(shared, &pod).await;
    }
    for (pod, status) in statuses {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if book.written.get(&uid) == Some(&status) {
            continue;
        }
        if write_status(shared, &pod, &status).await {
            book.written.insert(uid, status);
        }
    }
    refresh_dns(shared);
}

/// Deletes a stopped pod's object at once, as the kubelet does once its containers are gone
/// (conditional on its uid: a new pod of the same name is another pod).
async fn delete_object(shared: &Shared, pod: &Pod) {
    let api: Api<Pod> = Api::namespaced(shared.client.clone(), &pod.namespace().unwrap_or_default());
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&pod.name_any(), &params).await {
        Ok(_) => shared.event(format!("{}: stopped and deleted", key(pod))),
        Err(kube::Error::Api(e)) if matches!(e.code, 404 | 409) => {}
        Err(e) => shared.event(format!("{}: deleting: {e}", key(pod))),
    }
}

/// Writes the pod's status (conditional on its uid); true when written.
async fn write_status(shared: &Shared, pod: &Pod, status: &Value) -> bool {
    let api: Api<Pod> = Api::namespaced(shared.client.clone(), &pod.namespace().unwrap_or_default());
    let params = PatchParams {
        field_manager: Some(objects::MANAGER.to_owned()),
        ..PatchParams::default()
    };
    let body = serde_json::json!({"metadata": {"uid": pod.metadata.uid}, "status": status});
    match api.patch_status(&pod.name_any(), &params, &Patch::Merge(&body)).await {
        Ok(_) => true,
        Err(kube::Error::Api(e)) if matches!(e.code, 404 | 409 | 422) => false,
        Err(e) => {
            shared.event(format!("{}: writing its status: {e}", key(pod)));
            false
        }
    }
}

/// The pod's spec with each container's image replaced by the binary that stands for it
/// (adaptation 1), or why the node will not run it: `(reason, message)`.
fn admit(
    pod: &Pod,
    binaries: &Binaries,
    versions: &mut BTreeMap<PathBuf, Result<String, String>>,
) -> Result<PodSpec, (String, String)> {
    let mut spec = pod.spec.clone().unwrap_or_default();
    if let Some(volume) = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.persistent_volume_claim.is_some())
    {
        return Err((
            "CreateContainerError".to_owned(),
            format!("volume {}: the capn test node has no persistent volumes", volume.name),
        ));
    }
    for container in spec
        .init_containers
        .iter_mut()
        .flatten()
        .chain(spec.containers.iter_mut())
    {
        stand_in(container, &binaries.fixed).map_err(|e| ("ErrImagePull".to_owned(), e))?;
    }
    pod::check_template(&spec, &[], binaries, versions).map_err(|e| ("CreateContainerError".to_owned(), e))?;
    Ok(spec)
}

/// Points the container at the binary its image stands for (adaptation 1); `fixed` maps
/// `agnhost` and each BusyBox applet to the binary that runs it.
///
/// # Errors
/// For an image the node does not run, or a command its image does not hold.
fn stand_in(container: &mut Container, fixed: &BTreeMap<String, PathBuf>) -> Result<(), String> {
    let image = container.image.clone().unwrap_or_default();
    let is_applet = |base: &str| base != "agnhost" && fixed.contains_key(base);
    match repository(&image) {
        AGNHOST_IMAGE => {
            if container.command.as_ref().is_none_or(Vec::is_empty) {
                container.command = Some(vec!["/agnhost".to_owned()]);
                // The image's CMD, when the container gives no args.
                if container.args.as_ref().is_none_or(Vec::is_empty) {
                    container.args = Some(vec!["pause".to_owned()]);
                }
            }
            // The agnhost image is Alpine's: its shell and tools are BusyBox's.
            let base = pod::command_base(container)?;
            if base != "agnhost" && !is_applet(base) {
                return Err(format!(
                    "container {}: the agnhost image holds /agnhost and BusyBox's applets, not {base}",
                    container.name
                ));
            }
            Ok(())
        }
        PAUSE_IMAGE => {
            container.command = Some(vec!["/agnhost".to_owned(), "pause".to_owned()]);
            container.args = None;
            Ok(())
        }
        SAMPLE_APISERVER_IMAGE | ETCD_IMAGE => {
            let entrypoint = if repository(&image) == ETCD_IMAGE {
                "etcd"
            } else {
                "sample-apiserver"
            };
            if container.command.as_ref().is_none_or(Vec::is_empty) {
                container.command = Some(vec![format!("/{entrypoint}")]);
            }
            let base = pod::command_base(container)?;
            if base != entrypoint {
                return Err(format!(
                    "container {}: the image {image} holds only {entrypoint}, not {base}",
                    container.name
                ));
            }
            Ok(())
        }
        repository if WEB_SERVER_IMAGES.contains(&repository) => {
            // Only as the image runs itself: a command or arguments would be nginx's or
            // httpd's own, which netexec does not take.
            if container.command.as_ref().is_some_and(|c| !c.is_empty())
                || container.args.as_ref().is_some_and(|a| !a.is_empty())
            {
                return Err(format!(
                    "container {}: the test node stands in for {image} with agnhost netexec on port 80, \
                     which runs only without a command or args",
                    container.name
                ));
            }
            container.command = Some(vec!["/agnhost".to_owned()]);
            container.args = Some(
                ["netexec", "--http-port=80", "--udp-port=-1"]
                    .map(str::to_owned)
                    .to_vec(),
            );
            Ok(())
        }
        repository if BUSYBOX_IMAGES.contains(&repository) => {
            // No entrypoint; the image's command is `sh`, which a container's args replace.
            if container.command.as_ref().is_none_or(Vec::is_empty) {
                container.command = match container.args.take().filter(|a| !a.is_empty()) {
                    Some(args) => Some(args),
                    None => Some(vec!["sh".to_owned()]),
                };
            }
            let base = pod::command_base(container)?;
            if !is_applet(base) {
                return Err(format!(
                    "container {}: {base} is not a BusyBox applet of the test node's busybox",
                    container.name
                ));
            }
            Ok(())
        }
        _ => Err(format!(
            "container {}: the capn test node cannot run image {image:?}: it runs only \
             {AGNHOST_IMAGE}:<tag> (agnhost, and BusyBox's applets), {PAUSE_IMAGE}:<tag> (agnhost \
             pause), {} (BusyBox), {} (agnhost netexec on port 80), {SAMPLE_APISERVER_IMAGE}:<tag> and \
             {ETCD_IMAGE}:<tag>",
            container.name,
            BUSYBOX_IMAGES.join(", "),
            WEB_SERVER_IMAGES.join(", ")
        )),
    }
}

/// The agnhost image's `(target, host path)` pairs as [`ImageTool`]s.
fn of_agnhost(pairs: &[(PathBuf, PathBuf)]) -> Vec<ImageTool> {
    pairs
        .iter()
        .map(|(target, binary)| ImageTool {
            repository: AGNHOST_IMAGE.to_owned(),
            target: target.clone(),
            binary: binary.clone(),
        })
        .collect()
}

/// The node's directory, removed when the test process exits.
static DIR: OnceLock<PathBuf> = OnceLock::new();

fn remove_at_exit(dir: PathBuf) {
    if DIR.set(dir).is_ok() {
        // SAFETY: registers a plain function; it runs once at `exit`.
        unsafe {
            libc::atexit(remove_dir);
        }
    }
}

extern "C" fn remove_dir() {
    if let Some(dir) = DIR.get() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Creates a pod's record and starts its task, as the runner's `start_pod` does for a
/// StatefulSet's pod.
fn start_node_pod(shared: &Arc<Shared>, pod: &Pod, spec: PodSpec) -> PodHandle {
    let key = key(pod);
    let name = pod.name_any();
    let namespace = pod.namespace().unwrap_or_default();
    let labels = pod.labels().clone();
    let restart_policy = spec.restart_policy.clone().unwrap_or_else(|| "Always".to_owned());
    // The kubelet's hostname: `spec.hostname` when set, else the pod's name
    // (`GeneratePodHostNameAndDomain`, pkg/kubelet/kubelet_pods.go).
    let hostname = spec
        .hostname
        .clone()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| name.clone());
    let pod_shared = PodShared::new(
        (&key, &hostname, &namespace),
        super::dns::pod_resolv_conf(&spec, &namespace, super::DNS_DOMAIN),
        &restart_policy,
        &key,
        // By uid, as the kubelet keeps `/var/lib/kubelet/pods/<uid>`: a pod deleted and made
        // again under its name at once is another pod, whose directory must not meet the
        // old one's while that is still being torn down.
        shared
            .dir
            .join("pods")
            .join(&namespace)
            .join(format!("{name}-{}", pod.metadata.uid.as_deref().unwrap_or_default())),
    );
    let identity = PodIdentity {
        name,
        namespace,
        ip: Ipv4Addr::UNSPECIFIED,
        host_ip: shared.host_ip,
        node_name: shared.node_name.clone(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        service_account: spec
            .service_account_name
            .clone()
            .unwrap_or_else(|| "default".to_owned()),
        labels: labels.clone(),
        annotations: pod.annotations().clone(),
    };
    let subdomain = spec.subdomain.clone().unwrap_or_default();
    let (control, task) = launch(shared, &pod_shared, identity, spec, BTreeMap::new());
    PodHandle {
        name: key,
        revision: String::new(),
        labels,
        subdomain,
        shared: pod_shared,
        control,
        task,
        deleting: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(image: &str, command: Option<&[&str]>, args: Option<&[&str]>) -> Container {
        let strings = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect();
        Container {
            name: "c".into(),
            image: Some(image.into()),
            command: command.map(strings),
            args: args.map(strings),
            ..Container::default()
        }
    }

    /// The node's fixed binaries: agnhost, and a few applets of a busybox.
    fn fixed() -> BTreeMap<String, PathBuf> {
        ["agnhost", "sh", "cat", "sleep", "sample-apiserver", "etcd"]
            .into_iter()
            .map(|b| (b.to_owned(), PathBuf::from(format!("/bin/{b}"))))
            .collect()
    }

    #[test]
    fn agnhost_and_pause_run_agnhost_and_other_images_are_refused() {
        assert_eq!(repository("registry.k8s.io/pause:3.10"), PAUSE_IMAGE);
        assert_eq!(
            repository("registry.k8s.io/e2e-test-images/agnhost:2.53@sha256:ab"),
            AGNHOST_IMAGE
        );
        assert_eq!(repository("localhost:5000/pause"), "localhost:5000/pause");

        // No command: the image's entrypoint, the args to it.
        let fixed = fixed();
        let mut netexec = container(&format!("{AGNHOST_IMAGE}:2.53"), None, Some(&["netexec"]));
        stand_in(&mut netexec, &fixed).expect("agnhost runs");
        assert_eq!(netexec.command, Some(vec!["/agnhost".to_owned()]));
        assert_eq!(netexec.args, Some(vec!["netexec".to_owned()]));
        // Neither: the image's CMD.
        let mut bare = container(&format!("{AGNHOST_IMAGE}:2.53"), None, None);
        stand_in(&mut bare, &fixed).expect("agnhost runs");
        assert_eq!(bare.command, Some(vec!["/agnhost".to_owned()]));
        assert_eq!(bare.args, Some(vec!["pause".to_owned()]));
        // A command is kept; one that is not agnhost is refused.
        let mut given = container(&format!("{AGNHOST_IMAGE}:2.53"), Some(&["/agnhost", "pause"]), None);
        stand_in(&mut given, &fixed).expect("agnhost runs");
        assert_eq!(given.command, Some(vec!["/agnhost".to_owned(), "pause".to_owned()]));
        // The image's shell is BusyBox's; what BusyBox lacks is refused.
        let mut shell = container(
            &format!("{AGNHOST_IMAGE}:2.53"),
            Some(&["/bin/sh", "-c", "cat x"]),
            None,
        );
        stand_in(&mut shell, &fixed).expect("the shell runs");
        let mut bash = container(&format!("{AGNHOST_IMAGE}:2.53"), Some(&["/bin/bash"]), None);
        assert!(stand_in(&mut bash, &fixed).unwrap_err().contains("not bash"));

        let mut pause = container(&format!("{PAUSE_IMAGE}:3.10"), Some(&["/pause"]), Some(&["-v"]));
        stand_in(&mut pause, &fixed).expect("pause runs");
        assert_eq!(pause.command, Some(vec!["/agnhost".to_owned(), "pause".to_owned()]));
        assert_eq!(pause.args, None);

        // The e2e web servers: netexec on port 80, only as the image runs itself.
        let mut web = container("registry.k8s.io/e2e-test-images/nginx:1.14-4", None, None);
        stand_in(&mut web, &fixed).expect("the e2e nginx image runs");
        assert_eq!(web.command, Some(vec!["/agnhost".to_owned()]));
        assert_eq!(
            web.args,
            Some(vec![
                "netexec".to_owned(),
                "--http-port=80".to_owned(),
                "--udp-port=-1".to_owned()
            ])
        );
        let mut told = container("registry.k8s.io/e2e-test-images/httpd:2.4.38-4", Some(&["httpd"]), None);
        assert!(stand_in(&mut told, &fixed).unwrap_err().contains("without a command"));

        let mut nginx = container("nginx:1.27", None, None);
        let refused = stand_in(&mut nginx, &fixed).unwrap_err();
        assert!(
            refused.contains(AGNHOST_IMAGE) && refused.contains(PAUSE_IMAGE) && refused.contains(BUSYBOX_IMAGES[0]),
            "{refused}"
        );
    }

    #[test]
    fn the_sample_apiserver_and_etcd_images_run_their_binaries_whatever_their_tags() {
        let fixed = fixed();
        let mut sample = container(
            &format!("{SAMPLE_APISERVER_IMAGE}:1.29.2"),
            None,
            Some(&["--etcd-servers=x"]),
        );
        stand_in(&mut sample, &fixed).expect("the sample apiserver runs");
        assert_eq!(sample.command, Some(vec!["/sample-apiserver".to_owned()]));
        assert_eq!(sample.args, Some(vec!["--etcd-servers=x".to_owned()]));
        let mut etcd = container(
            &format!("{ETCD_IMAGE}:3.6.6-0"),
            Some(&["/usr/local/bin/etcd", "--name=x"]),
            None,
        );
        stand_in(&mut etcd, &fixed).expect("etcd runs");
        let mut shell = container(&format!("{ETCD_IMAGE}:3.6.6-0"), Some(&["/bin/sh"]), None);
        assert!(stand_in(&mut shell, &fixed).unwrap_err().contains("holds only etcd"));
    }

    #[test]
    fn busybox_runs_its_command_its_args_or_its_shell() {
        let fixed = fixed();
        let image = format!("{}:1.37.0-1", BUSYBOX_IMAGES[0]);
        // A command runs as given.
        let mut given = container(&image, Some(&["/bin/sh", "-c", "exit 0"]), None);
        stand_in(&mut given, &fixed).expect("busybox runs");
        assert_eq!(given.command.as_ref().unwrap()[0], "/bin/sh");
        // Args without a command replace the image's command (`sh`).
        let mut args = container(&image, None, Some(&["sleep", "10"]));
        stand_in(&mut args, &fixed).expect("busybox runs");
        assert_eq!(args.command, Some(vec!["sleep".to_owned(), "10".to_owned()]));
        assert_eq!(args.args, None);
        let mut bare = container("busybox", None, None);
        stand_in(&mut bare, &fixed).expect("busybox runs");
        assert_eq!(bare.command, Some(vec!["sh".to_owned()]));
        // Not an applet.
        let mut other = container(&image, Some(&["/usr/bin/python3"]), None);
        assert!(
            stand_in(&mut other, &fixed)
                .unwrap_err()
                .contains("python3 is not a BusyBox applet")
        );
    }
}
