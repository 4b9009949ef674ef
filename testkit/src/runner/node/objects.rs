//! The node's objects in the super cluster (its Node and its Lease, kept current as the
//! kubelet keeps them) and the kube-scheduler it starts.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};

use crate::process::Process;

/// Field manager of what the node writes (its Node status, its pods' status).
pub(super) const MANAGER: &str = "capn-node";
/// The kubelet's default port, announced as `daemonEndpoints.kubeletEndpoint`, where the
/// node serves its logs (node adaptation 6).
pub(in crate::runner) const KUBELET_PORT: u16 = 10250;
/// The kubelet's Lease duration (`nodeLeaseDurationSeconds` default).
const LEASE_SECONDS: i32 = 40;
/// How long the scheduler may take to answer `/healthz`: generous, on two busy cores.
const SCHEDULER_TIMEOUT: Duration = Duration::from_secs(120);

/// `t` as a Kubernetes `Time` (RFC 3339, seconds).
pub(super) fn time(t: SystemTime) -> String {
    k8s_openapi::jiff::Timestamp::try_from(t)
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// `t` as a Kubernetes `MicroTime` (RFC 3339, microseconds), for the Lease.
fn micro_time(t: SystemTime) -> String {
    k8s_openapi::jiff::Timestamp::try_from(t)
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
        .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string()
}

/// Registers the Node `name`, as a kubelet of `release` (`1.36.3`): its status written at
/// once (Ready), its not-ready taint lifted, its Lease created. Its `InternalIP` is
/// `address`, where its kube-proxy serves node ports; its kubelet API is at `kubelet`, named
/// as `InternalDNS`, the type the test super cluster's apiserver prefers (node adaptation
/// 9). Returns its uid.
///
/// # Errors
/// When the API server refuses.
pub(super) async fn register(
    client: &Client,
    name: &str,
    (address, kubelet): (Ipv4Addr, Ipv4Addr),
    release: &str,
) -> Result<String, String> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": arch(),
            },
        },
    }))
    .map_err(|e| e.to_string())?;
    let created = nodes
        .create(&PostParams::default(), &node)
        .await
        .map_err(|e| format!("cannot create Node {name}: {e}"))?;
    let uid = created.metadata.uid.unwrap_or_default();
    let since = time(SystemTime::now());
    let status = serde_json::json!({ "status": {
        "capacity": capacity(),
        "allocatable": capacity(),
        "addresses": [
            {"type": "InternalIP", "address": address.to_string()},
            {"type": "InternalDNS", "address": kubelet.to_string()},
            {"type": "Hostname", "address": name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": KUBELET_PORT}},
        "nodeInfo": {
            "architecture": arch(), "bootID": "", "containerRuntimeVersion": "capn-node://0",
            "kernelVersion": "", "kubeProxyVersion": "", "kubeletVersion": format!("v{release}"), "machineID": "",
            "operatingSystem": "linux", "osImage": "capn test node", "systemUUID": "",
        },
        "conditions": conditions(&since, &since),
    }});
    patch_status(&nodes, name, &status).await?;
    // The API server's TaintNodesByCondition admission gives every new Node the
    // `node.kubernetes.io/not-ready` taint, which the node lifecycle controller (not running
    // in the super cluster) lifts once the Node is Ready: lifted here (node adaptation 6).
    let untaint = serde_json::json!({"spec": {"taints": null}});
    nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(&untaint))
        .await
        .map_err(|e| format!("cannot lift the not-ready taint of Node {name}: {e}"))?;
    heartbeat(client, name, &uid, &since).await?;
    Ok(uid)
}

/// This machine's architecture as Go names it (`amd64`, `arm64`).
fn arch() -> String {
    match std::env::consts::ARCH {
        "x86_64" => "amd64".to_owned(),
        "aarch64" => "arm64".to_owned(),
        other => other.to_owned(),
    }
}

/// The variable that sets how many pods the node takes (the kubelet's `--max-pods`;
/// default 110, the kubelet's default too): benchmarks that run hundreds of pods raise it,
/// up to the 252 pod addresses of the node's pod network.
pub const MAX_PODS_VARIABLE: &str = "CAPN_TEST_NODE_MAX_PODS";

/// The node's capacity, also its allocatable: generous, as one machine running test pods.
fn capacity() -> serde_json::Value {
    let pods = std::env::var(MAX_PODS_VARIABLE)
        .ok()
        .and_then(|v| v.parse::<u16>().ok())
        .unwrap_or(110)
        .min(crate::runner::sandbox::POD_ADDRESSES);
    serde_json::json!({"cpu": "16", "memory": "64Gi", "pods": pods.to_string(), "ephemeral-storage": "100Gi"})
}

/// The kubelet's node conditions: Ready, no pressure.
fn conditions(since: &str, now: &str) -> serde_json::Value {
    let condition = |kind: &str, status: &str, reason: &str, message: &str| {
        serde_json::json!({"type": kind, "status": status, "reason": reason, "message": message,
            "lastHeartbeatTime": now, "lastTransitionTime": since})
    };
    serde_json::json!([
        condition(
            "MemoryPressure",
            "False",
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available"
        ),
        condition(
            "DiskPressure",
            "False",
            "KubeletHasNoDiskPressure",
            "kubelet has no disk pressure"
        ),
        condition(
            "PIDPressure",
            "False",
            "KubeletHasSufficientPID",
            "kubelet has sufficient PID available"
        ),
        condition("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ])
}

async fn patch_status(nodes: &Api<Node>, name: &str, status: &serde_json::Value) -> Result<(), String> {
    let params = PatchParams {
        field_manager: Some(MANAGER.to_owned()),
        ..PatchParams::default()
    };
    nodes
        .patch_status(name, &params, &Patch::Merge(status))
        .await
        .map(drop)
        .map_err(|e| format!("cannot write the status of Node {name}: {e}"))
}

/// Renews the Lease (created, owned by the Node, if missing) and the Ready condition's
/// heartbeat, as the kubelet does every 10 s.
///
/// # Errors
/// When the API server refuses.
pub(super) async fn heartbeat(client: &Client, name: &str, uid: &str, since: &str) -> Result<(), String> {
    let now = SystemTime::now();
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let spec = serde_json::json!({
        "holderIdentity": name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": micro_time(now),
    });
    let patch = serde_json::json!({ "spec": spec });
    match leases.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {
            ensure_namespace(client, "kube-node-lease").await?;
            let lease: Lease = serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid}]},
                "spec": spec,
            }))
            .map_err(|e| e.to_string())?;
            leases
                .create(&PostParams::default(), &lease)
                .await
                .map_err(|e| format!("cannot create the Lease of {name}: {e}"))?;
        }
        Err(e) => return Err(format!("cannot renew the Lease of {name}: {e}")),
    }
    let nodes: Api<Node> = Api::all(client.clone());
    let status = serde_json::json!({"status": {"conditions": conditions(since, &time(now))}});
    patch_status(&nodes, name, &status).await
}

async fn ensure_namespace(client: &Client, name: &str) -> Result<(), String> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).map_err(|e| e.to_string())?;
    match namespaces.create(&PostParams::default(), &namespace).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(format!("cannot create namespace {name}: {e}")),
    }
}

/// The super cluster's release (`1.36.3`, from its kube-apiserver's `--version`), and its
/// binaries in the release cache: `kube-scheduler` and `agnhost` next to the other Kubernetes
/// binaries of that release.
///
/// # Errors
/// When the super cluster's release cannot be told or a binary is missing (with the command
/// that builds it).
pub(super) fn release_binaries(cache: &Path) -> Result<(String, BTreeMap<&'static str, PathBuf>), String> {
    let apiserver = crate::cluster().assets_dir().join("kube-apiserver");
    let text = super::super::sandbox::run_host_command(&apiserver, &["--version"])?;
    let release = super::super::pod::parse_version(&text)
        .ok_or_else(|| format!("{} --version printed no version: {text}", apiserver.display()))?;
    let mut out = BTreeMap::new();
    for name in ["kube-scheduler", "kube-proxy", "agnhost", "sample-apiserver"] {
        let path = cache.join(format!("kubernetes-v{release}")).join(name);
        if !path.is_file() {
            return Err(format!(
                "MISSING: the node needs {} (the super cluster's release, {release}); build it with \
                 `KUBE_VERSION=v{release} hack/kube-assets.sh` (from the repository root)",
                path.display()
            ));
        }
        out.insert(name, path);
    }
    Ok((release, out))
}

/// The host's `busybox`, which stands for the BusyBox images and for the agnhost image's
/// shell and tools (adaptation 1): `/bin/busybox` or `/usr/bin/busybox` (Debian's `busybox`
/// package).
///
/// # Errors
/// When there is none, saying how to get one.
pub(super) fn busybox() -> Result<PathBuf, String> {
    host_tool(
        &["/bin/busybox", "/usr/bin/busybox"],
        "busybox (it runs the BusyBox images and the agnhost image's shell); install Debian's busybox (`apt-get install busybox`)",
    )
}

/// The host's tools that stand for those the agnhost image installs besides BusyBox
/// (adaptation 1; its Dockerfile's `apk add bind-tools curl netcat-openbsd`, and musl's
/// `getent`), each as `(path in the container, host binary)`: netcat-openbsd's `nc`, bind's
/// `dig` and `nslookup`, `curl` (Debian's `netcat-openbsd`, `bind9-dnsutils` and `curl`),
/// glibc's `getent`.
///
/// # Errors
/// A tool the host lacks, saying which package has it.
pub(super) fn agnhost_tools() -> Result<Vec<(PathBuf, PathBuf)>, String> {
    let wanted: [(&str, &[&str], &str); 5] = [
        (
            "/usr/bin/nc",
            &["/bin/nc.openbsd", "/usr/bin/nc.openbsd"],
            "netcat-openbsd",
        ),
        ("/usr/bin/dig", &["/usr/bin/dig"], "bind9-dnsutils"),
        ("/usr/bin/nslookup", &["/usr/bin/nslookup"], "bind9-dnsutils"),
        ("/usr/bin/curl", &["/usr/bin/curl"], "curl"),
        ("/usr/bin/getent", &["/usr/bin/getent"], "libc-bin"),
    ];
    wanted
        .into_iter()
        .map(|(target, paths, package)| {
            let what = format!("{target} of the agnhost image; install {package} (`apt-get install {package}`)");
            host_tool(paths, &what).map(|binary| (PathBuf::from(target), binary))
        })
        .collect()
}

/// The files the agnhost image holds beside its binaries, as `(path in the container, file)`:
/// the `localhost.crt` and `localhost.key` its `porter` serves TLS with (a self-signed
/// certificate for `localhost`, made once into `cache/agnhost-files`).
///
/// # Errors
/// When they cannot be written.
pub(super) fn agnhost_files(cache: &Path) -> Result<Vec<(PathBuf, PathBuf)>, String> {
    let dir = cache.join("agnhost-files");
    let (crt, key) = (dir.join("localhost.crt"), dir.join("localhost.key"));
    if !crt.is_file() || !key.is_file() {
        let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])
            .map_err(|e| format!("cannot make the agnhost image's localhost certificate: {e}"))?;
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let write = |path: &Path, text: String| {
            std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
        };
        write(&key, certified.signing_key.serialize_pem())?;
        write(&crt, certified.cert.pem())?;
    }
    Ok(vec![("/localhost.crt".into(), crt), ("/localhost.key".into(), key)])
}

/// The first of `paths` that exists, else a MISSING error naming `what`.
fn host_tool(paths: &[&str], what: &str) -> Result<PathBuf, String> {
    paths
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| format!("MISSING: the node needs {what}"))
}

/// The applets `busybox` holds (`busybox --list`).
///
/// # Errors
/// When it does not run.
pub(super) fn applets(busybox: &Path) -> Result<Vec<String>, String> {
    let list = super::super::sandbox::run_host_command(busybox, &["--list"])?;
    Ok(list
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect())
}

/// Starts the real kube-scheduler against the super cluster (admin kubeconfig, no leader
/// election, its secure port on localhost) and waits until `/healthz` answers ok.
///
/// # Errors
/// When it does not start or does not become healthy within two minutes (with its log).
pub(super) async fn start_scheduler(binary: &Path, dir: &Path) -> Result<Process, String> {
    let kubeconfig = crate::cluster().kubeconfig_path().display().to_string();
    let [port] = crate::net::free_ports()?;
    let args = vec![
        format!("--kubeconfig={kubeconfig}"),
        format!("--authentication-kubeconfig={kubeconfig}"),
        format!("--authorization-kubeconfig={kubeconfig}"),
        // The API server of the super cluster publishes no extension-apiserver-authentication
        // ConfigMap (no request-header CA): the scheduler would complain about it every few
        // seconds.
        "--authentication-skip-lookup=true".to_owned(),
        "--leader-elect=false".to_owned(),
        "--bind-address=127.0.0.1".to_owned(),
        format!("--secure-port={port}"),
    ];
    let mut process = Process::spawn("kube-scheduler", binary, &args, dir)?;
    let url = format!("https://127.0.0.1:{port}")
        .parse()
        .map_err(|e| format!("bad scheduler URL: {e}"))?;
    // Its serving certificate is made in memory and written nowhere: this one probe skips
    // verification, as the super cluster's controller-manager probe does.
    let mut config = kube::Config::new(url);
    config.accept_invalid_certs = true;
    let client = Client::try_from(config).map_err(|e| format!("cannot build a client for the scheduler: {e}"))?;
    crate::start::wait_for_ok(&mut process, &client, "/healthz", SCHEDULER_TIMEOUT).await?;
    Ok(process)
}
