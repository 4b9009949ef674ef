//! Adaptation 11: a local TCP forwarder, so that a program which uses a kubeconfig verbatim
//! (the upstream e2e binary, kubectl) reaches a nested apiserver from the host. The host
//! cannot resolve in-cluster names; the forwarder listens on `127.0.0.1:<free port>` and
//! sends each connection to the address the name resolves to at that moment (so it follows a
//! restarted or rolled pod), and [`host_kubeconfig`] points the kubeconfig's server there
//! with `tls-server-name` set to the in-cluster name, so the certificate is still verified
//! for that name. Bytes pass through untouched: TLS is end to end.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

/// Finds where the name points now; `None` while it resolves to no ready pod.
pub(super) type Resolve = Arc<dyn Fn() -> Option<Ipv4Addr> + Send + Sync>;

/// A running forwarder; dropping it stops accepting (open connections run to their end).
pub struct Forward {
    address: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// Whether a drop wakes the accepting thread (a connection to its own address, from this
    /// namespace) and waits for it.
    joined: bool,
}

impl Forward {
    /// Listens on a free port of 127.0.0.1 and forwards every connection to `port` at the
    /// address `resolve` gives at the time of the connection.
    ///
    /// # Errors
    /// When no local port can be bound.
    pub(super) fn start(name: String, port: u16, resolve: Resolve) -> Result<Self, String> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|e| format!("cannot listen on 127.0.0.1 for {name}:{port}: {e}"))?;
        let mut forward = Self::serve(listener, name, port, resolve)?;
        forward.joined = true;
        Ok(forward)
    }

    /// Forwards every connection `listener` accepts to `port` at the address `resolve` gives.
    /// The listener may be another network namespace's (it stays there; the connections out
    /// are made in this thread's): dropping the forwarder then stops it at its next
    /// connection, without waiting for it.
    ///
    /// # Errors
    /// When the listener has no address or the thread cannot start.
    pub(crate) fn serve(listener: TcpListener, name: String, port: u16, resolve: Resolve) -> Result<Self, String> {
        let address = listener.local_addr().map_err(|e| e.to_string())?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("forward {name}"))
            .spawn(move || {
                for client in listener.incoming() {
                    if stopping.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(client) = client else { continue };
                    let Some(ip) = resolve() else {
                        // Refused like a Service without endpoints: the client retries.
                        drop(client);
                        continue;
                    };
                    match TcpStream::connect((ip, port)) {
                        Ok(upstream) => splice(client, upstream),
                        Err(_) => drop(client),
                    }
                }
            })
            .map_err(|e| format!("cannot start the forwarder thread: {e}"))?;
        Ok(Self {
            address,
            stop,
            thread: Some(thread),
            joined: false,
        })
    }

    /// Where it listens (`127.0.0.1:<port>`).
    pub fn address(&self) -> SocketAddr {
        self.address
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if !self.joined {
            return;
        }
        // Wakes the blocking accept, which then sees the flag.
        let _ = TcpStream::connect(self.address);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Copies both directions on threads of their own; the end of one direction half-closes the
/// other side, as a TCP proxy must for protocols that close one way first.
fn splice(client: TcpStream, upstream: TcpStream) {
    let pairs = [
        (client.try_clone(), upstream.try_clone()),
        (upstream.try_clone(), client.try_clone()),
    ];
    for pair in pairs {
        if let (Ok(mut from), Ok(mut to)) = pair {
            std::thread::spawn(move || {
                let mut buffer = [0u8; 16 * 1024];
                loop {
                    match from.read(&mut buffer) {
                        Ok(0) => break,
                        Ok(n) => {
                            if to.write_all(&buffer[..n]).is_err() {
                                break;
                            }
                        }
                        Err(e) if e.kind() == ErrorKind::Interrupted => {}
                        Err(_) => break,
                    }
                }
                let _ = to.shutdown(Shutdown::Write);
                let _ = from.shutdown(Shutdown::Read);
            });
        }
    }
}

/// `kubeconfig` (YAML) with every cluster's server pointed at `forward` and `tls-server-name`
/// set to the host the server named, so that it is usable verbatim from this host. JSON is
/// returned, which is valid YAML and which every kubeconfig reader accepts.
///
/// # Errors
/// When the kubeconfig does not parse or a server is not an `https://<host>:<port>` URL.
pub fn host_kubeconfig(kubeconfig: &str, forward: &Forward) -> Result<String, String> {
    let mut parsed =
        kube::config::Kubeconfig::from_yaml(kubeconfig).map_err(|e| format!("the kubeconfig does not parse: {e}"))?;
    for named in &mut parsed.clusters {
        let Some(cluster) = named.cluster.as_mut() else {
            continue;
        };
        let server = cluster.server.clone().unwrap_or_default();
        let uri: http::Uri = server
            .parse()
            .map_err(|e| format!("cluster {}: server {server:?} is not a URL: {e}", named.name))?;
        let host = uri
            .host()
            .ok_or_else(|| format!("cluster {}: server {server:?} has no host", named.name))?;
        if cluster.tls_server_name.is_none() {
            cluster.tls_server_name = Some(host.to_owned());
        }
        cluster.server = Some(format!("https://{}", forward.address()));
    }
    serde_json::to_string_pretty(&parsed).map_err(|e| format!("cannot write the kubeconfig: {e}"))
}
