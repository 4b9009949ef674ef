//! The node's kube-proxy: the real one, of the super cluster's release, in iptables mode,
//! so that ClusterIPs route for the node's pods as in any cluster.
//!
//! It works in the node namespace (the one that holds the pod bridge), never in the host's:
//! its rules and the Service routes of its pods stay this node's, and two test processes on
//! one machine cannot overwrite each other's (each owns every `KUBE-*` chain of its
//! namespace). The node namespace routes the super cluster's Service CIDR for its pods
//! (`Network::route_services`); kube-proxy reaches the super apiserver, which listens on the
//! host's 127.0.0.1 only, through a relay listening on 127.0.0.1 there.
//!
//! Adaptations (node adaptation 9): `masqueradeAll` (a pod's packets to a ClusterIP are
//! answered through the node namespace even when the backend is on the same bridge, where
//! a kubelet's node would use the bridge's hairpin and `br_netfilter`, which this machine
//! lacks), so a backend sees the node namespace's address as the client; no conntrack
//! tuning (`conntrack` all zero: the namespace's defaults stay); NodePorts are served on
//! the node namespace's own address (`nodePortAddresses`, [`super::Node::node_port_address`]),
//! not on the Node's InternalIP, which is the host's side of the pod network. Rules are rewritten at most once a second (kube-proxy's
//! default `minSyncPeriod`): the super cluster of a test run sees Services and endpoints
//! change all the time (every booted tenant has its own), and a sync per change kept a core
//! busy with `iptables-restore`.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::api::Api;

use crate::process::Process;
use crate::runner::forward::Forward;
use crate::runner::{Shared, lock};

/// Where kube-proxy answers `/healthz`: the node namespace's own address, which the host
/// reaches over the pod network.
const HEALTHZ_PORT: u16 = 10256;
/// How long kube-proxy may take to answer `/healthz`.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A running kube-proxy and the relay it reaches the super apiserver through.
pub(super) struct Proxy {
    pub process: Process,
    _relay: Forward,
}

/// Routes the super cluster's Service CIDR through the node namespace and starts kube-proxy
/// there for the node `node_name`; returns once its `/healthz` answers.
///
/// # Errors
/// When the super cluster shows no Service CIDR, the routes cannot be made, the relay cannot
/// listen, kube-proxy does not start or stays unhealthy (the message holds its log's end).
pub(super) async fn start(binary: &Path, shared: &Shared, node_name: &str) -> Result<Proxy, String> {
    let cluster = crate::cluster();
    let cidr = service_cidr(&cluster.client()).await?;
    let api = cluster.config().cluster_url;
    let api_port = api
        .port_u16()
        .ok_or_else(|| format!("the super apiserver URL {api} has no port"))?;
    let (listener, net_fd, address) = {
        let mut network = lock(&shared.network);
        let network = network
            .as_mut()
            .ok_or_else(|| "the node has no pod network".to_owned())?;
        network.route_services(&cidr)?;
        let listener = network.listen_in_node(SocketAddr::from((Ipv4Addr::LOCALHOST, api_port)))?;
        (listener, network.node_namespace().as_raw_fd(), network.node_address())
    };
    let relay = Forward::serve(
        listener,
        "super apiserver".to_owned(),
        api_port,
        Arc::new(|| Some(Ipv4Addr::LOCALHOST)),
    )?;
    let config = shared.dir.join("kube-proxy.yaml");
    std::fs::write(&config, configuration(cluster.kubeconfig_path(), node_name, address))
        .map_err(|e| format!("cannot write {}: {e}", config.display()))?;
    let mut command = Command::new(binary);
    command
        .arg(format!("--config={}", config.display()))
        .current_dir(&shared.dir);
    // SAFETY: setns(2) only, between fork and exec.
    unsafe {
        command.pre_exec(move || {
            if libc::setns(net_fd, libc::CLONE_NEWNET) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    let mut process = Process::start("kube-proxy", command, shared.dir.join("kube-proxy.log"))?;
    // Its `/healthz` answers 200 once it has synced its rules (503 before, with JSON both
    // times).
    let healthz = SocketAddr::from((address, HEALTHZ_PORT));
    let deadline = tokio::time::Instant::now() + START_TIMEOUT;
    loop {
        process.check_running()?;
        let last = match crate::net::http_get(healthz, "/healthz").await {
            Ok((200, _)) => break,
            Ok((status, body)) => format!("{status} {body}"),
            Err(e) => e.to_string(),
        };
        if tokio::time::Instant::now() > deadline {
            return Err(process.failure(&format!("kube-proxy is not healthy at {healthz} (last: {last})")));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(Proxy { process, _relay: relay })
}

/// The super cluster's Service CIDR: the default ServiceCIDR object's first CIDR (the API
/// server makes `kubernetes` from `--service-cluster-ip-range`).
async fn service_cidr(client: &kube::Client) -> Result<String, String> {
    let api = Api::<ServiceCIDR>::all(client.clone());
    let deadline = tokio::time::Instant::now() + START_TIMEOUT;
    loop {
        let found = api
            .get_opt("kubernetes")
            .await
            .map_err(|e| format!("cannot read ServiceCIDR kubernetes: {e}"))?;
        if let Some(cidr) = found.and_then(|c| c.spec?.cidrs?.into_iter().find(|c| !c.contains(':'))) {
            return Ok(cidr);
        }
        if tokio::time::Instant::now() > deadline {
            return Err("the super cluster has no IPv4 ServiceCIDR `kubernetes`".to_owned());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// kube-proxy's configuration file (see the module documentation for each choice).
fn configuration(kubeconfig: &Path, node_name: &str, address: Ipv4Addr) -> String {
    format!(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: {kubeconfig}
hostnameOverride: {node_name}
mode: iptables
healthzBindAddress: {address}:{HEALTHZ_PORT}
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: [{address}/32]
iptables:
  masqueradeAll: true
  minSyncPeriod: 1s
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
",
        kubeconfig = kubeconfig.display()
    )
}
