//! The node's kubelet API, as far as the tests need it (node adaptation 6), over TLS on the
//! node's address and the kubelet's port, which the super cluster's apiserver calls:
//! - `GET /containerLogs/{namespace}/{pod}/{container}` for `pods/log` (`kubectl logs`):
//!   `tailLines` and `follow` are honoured (a followed log is read again every 200 ms until
//!   the pod is gone); `timestamps`, `previous`, `limitBytes` and the `since` bounds are not;
//! - `/exec/{namespace}/{pod}/{container}` and `/portForward/{namespace}/{pod}` for
//!   `pods/exec` and `pods/portforward`: relayed to `capn-test-kubelet` (hack/test-kubelet,
//!   the kubelet's own streaming code, k8s.io/cri-streaming) with the container's process
//!   and the pod's address added to the query; exec runs the command with nsenter in the
//!   container's mount, UTS, IPC and network namespaces, without a terminal; port-forward
//!   dials the pod's address. No attach.
//!
//! The certificate is self-signed and no client certificate is asked for (the super
//! apiserver verifies no kubelet's certificate and presents none here).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::runner::Shared;

/// How often a followed log is read again.
const FOLLOW_EVERY: Duration = Duration::from_millis(200);

/// Listens on `address` and serves the pods of `shared` (the node's, or a runner's: runner
/// adaptation 12) until the returned task is aborted.
///
/// # Errors
/// The address cannot be bound or the certificate made.
pub(in crate::runner) async fn start(
    address: SocketAddr,
    shared: Arc<Shared>,
) -> Result<tokio::task::JoinHandle<()>, String> {
    let streams = streams(&shared.dir)?;
    let certified = rcgen::generate_simple_self_signed(vec![address.ip().to_string()])
        .map_err(|e| format!("kubelet API certificate: {e}"))?;
    let chain = vec![CertificateDer::from(certified.cert.der().to_vec())];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der()));
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("kubelet API TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("kubelet API TLS: {e}"))?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|e| format!("kubelet API: cannot listen on {address}: {e}"))?;
    let router = Router::new()
        .route("/containerLogs/{namespace}/{pod}/{container}", get(container_logs))
        .route("/exec/{namespace}/{pod}/{container}", any(exec))
        .route("/portForward/{namespace}/{pod}", any(port_forward))
        .with_state(Kubelet { shared, streams });
    Ok(tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let (acceptor, router) = (acceptor.clone(), router.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection_with_upgrades(TokioIo::new(tls), TowerToHyperService::new(router))
                    .await;
            });
        }
    }))
}

/// What the handlers share: the node's pods, and where `capn-test-kubelet` listens.
#[derive(Clone)]
struct Kubelet {
    shared: Arc<Shared>,
    streams: SocketAddr,
}

/// The path of `capn-test-kubelet` in the cache of `hack/kube-assets.sh`.
fn streams_binary() -> std::path::PathBuf {
    super::super::pod::fixture_binary(
        "kubelet",
        [
            include_bytes!("../../../../hack/test-kubelet/go.mod"),
            include_bytes!("../../../../hack/test-kubelet/go.sum"),
            include_bytes!("../../../../hack/test-kubelet/main.go"),
        ],
    )
}

/// The address of this process's one `capn-test-kubelet`, started on first use (with its
/// log in `dir`); it serves the node and every runner, as what it needs of a pod comes with
/// each request. It is started from a thread that lives as long as the test process: a
/// child gets `PR_SET_PDEATHSIG` from the thread that starts it, and a test's runtime
/// threads end with the test.
fn streams(dir: &std::path::Path) -> Result<SocketAddr, String> {
    static STREAMS: std::sync::Mutex<Option<SocketAddr>> = std::sync::Mutex::new(None);
    let mut started = STREAMS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(address) = *started {
        return Ok(address);
    }
    let (tell, told) = std::sync::mpsc::channel();
    let dir = dir.to_owned();
    std::thread::Builder::new()
        .name("capn-test-kubelet".to_owned())
        .spawn(move || {
            let _ = tell.send(start_streams(&dir));
            loop {
                std::thread::park();
            }
        })
        .map_err(|e| format!("cannot start the thread of capn-test-kubelet: {e}"))?;
    let address = told
        .recv()
        .map_err(|_| "capn-test-kubelet's thread ended before it started".to_owned())??;
    *started = Some(address);
    Ok(address)
}

/// Starts `capn-test-kubelet` on a free loopback port and returns its address (the first
/// line it prints). It lives as long as the test process.
fn start_streams(dir: &std::path::Path) -> Result<SocketAddr, String> {
    let binary = streams_binary();
    if !binary.is_file() {
        return Err(format!(
            "MISSING: the node's exec and port-forward need {} (built by hack/kube-assets.sh from hack/test-kubelet)",
            binary.display()
        ));
    }
    let process =
        crate::process::Process::spawn("capn-test-kubelet", &binary, &["--listen=127.0.0.1:0".to_owned()], dir)?;
    let log = process.log.clone();
    std::mem::forget(process);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(address) = text.lines().next().and_then(|l| l.trim().parse().ok()) {
            return Ok(address);
        }
        if std::time::Instant::now() > deadline {
            return Err(format!("capn-test-kubelet printed no address in 30 s: {text}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

async fn exec(
    State(kubelet): State<Kubelet>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    request: Request,
) -> Response {
    let key = kubelet.shared.pod_key(&namespace, &pod);
    let Some(pid) = kubelet.shared.container(&key, &container).and_then(|c| c.pid) else {
        let message = format!("container {container} of pod {key} is not running on this node");
        return (StatusCode::NOT_FOUND, message).into_response();
    };
    let extra = [("pid", pid.to_string()), ("pod", pod), ("container", container)];
    relay(kubelet.streams, "/exec", &extra, request).await
}

async fn port_forward(
    State(kubelet): State<Kubelet>,
    Path((namespace, pod)): Path<(String, String)>,
    request: Request,
) -> Response {
    let key = kubelet.shared.pod_key(&namespace, &pod);
    let Some(ip) = kubelet.shared.pod_address(&key) else {
        return (StatusCode::NOT_FOUND, format!("pod {key} has no address on this node")).into_response();
    };
    let extra = [("ip", ip.to_string()), ("pod", pod)];
    relay(kubelet.streams, "/portForward", &extra, request).await
}

/// Sends `request` on to `capn-test-kubelet` at `streams` (at `path`, its query with `extra`
/// added) and, once both sides switched protocols, copies the bytes both ways.
async fn relay(streams: SocketAddr, path: &str, extra: &[(&str, String)], mut request: Request) -> Response {
    // (The serializer is not Send: it is gone before the first await.)
    let query = {
        let mut query = form_urlencoded::Serializer::new(request.uri().query().unwrap_or_default().to_owned());
        for (key, value) in extra {
            query.append_pair(key, value);
        }
        query.finish()
    };
    let mut upstream = http::Request::builder()
        .method(request.method())
        .uri(format!("{path}?{query}"));
    for (name, value) in request.headers() {
        upstream = upstream.header(name, value);
    }
    let Ok(upstream) = upstream.body(http_body_util::Empty::<bytes::Bytes>::new()) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let answer = async {
        let tcp = tokio::net::TcpStream::connect(streams)
            .await
            .map_err(|e| e.to_string())?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(connection.with_upgrades());
        sender.send_request(upstream).await.map_err(|e| e.to_string())
    };
    let mut answer = match answer.await {
        Ok(answer) => answer,
        Err(e) => return (StatusCode::BAD_GATEWAY, format!("capn-test-kubelet: {e}")).into_response(),
    };
    if answer.status() != StatusCode::SWITCHING_PROTOCOLS {
        let status = answer.status();
        let body = http_body_util::BodyExt::collect(answer.into_body())
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        return (status, body).into_response();
    }
    let mut response = Response::builder().status(StatusCode::SWITCHING_PROTOCOLS);
    for (name, value) in answer.headers() {
        response = response.header(name, value);
    }
    let from_client = hyper::upgrade::on(&mut request);
    let from_streams = hyper::upgrade::on(&mut answer);
    tokio::spawn(async move {
        if let Ok((a, b)) = tokio::try_join!(from_client, from_streams) {
            let (mut a, mut b) = (TokioIo::new(a), TokioIo::new(b));
            let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
        }
    });
    response.body(Body::empty()).unwrap_or_default()
}

async fn container_logs(
    State(kubelet): State<Kubelet>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let shared = kubelet.shared;
    let key = shared.pod_key(&namespace, &pod);
    let Some(report) = shared.container(&key, &container) else {
        let message = format!("container {container} of pod {key} is not on this node");
        return (StatusCode::NOT_FOUND, message).into_response();
    };
    let path = report.log;
    let text = std::fs::read(&path).unwrap_or_default();
    let tail = query.get("tailLines").and_then(|n| n.parse::<usize>().ok());
    let start = tail.map_or(0, |lines| tail_start(&text, lines));
    let first = text[start..].to_vec();
    if query.get("follow").is_none_or(|v| v != "true" && v != "1") {
        return first.into_response();
    }
    // Followed: what is there, then what is appended, while the pod is on the node.
    let stream = futures::stream::unfold((Some(first), text.len()), move |(first, offset)| {
        let (shared, key, container, path) = (shared.clone(), key.clone(), container.clone(), path.clone());
        async move {
            if let Some(first) = first {
                return Some((Ok::<_, std::io::Error>(first), (None, offset)));
            }
            loop {
                tokio::time::sleep(FOLLOW_EVERY).await;
                shared.container(&key, &container)?;
                let text = std::fs::read(&path).ok()?;
                if text.len() > offset {
                    let next = text[offset..].to_vec();
                    return Some((Ok(next), (None, text.len())));
                }
            }
        }
    });
    Body::from_stream(stream).into_response()
}

/// Where the last `lines` lines of `text` start.
fn tail_start(text: &[u8], lines: usize) -> usize {
    if lines == 0 {
        return text.len();
    }
    let body = text.strip_suffix(b"\n").unwrap_or(text);
    body.iter()
        .enumerate()
        .rev()
        .filter(|(_, b)| **b == b'\n')
        .nth(lines - 1)
        .map_or(0, |(i, _)| i + 1)
}

#[cfg(test)]
mod tests {
    use super::tail_start;

    #[test]
    fn the_last_lines_are_cut_as_the_kubelet_cuts_them() {
        let text = b"one\ntwo\nthree\n";
        assert_eq!(&text[tail_start(text, 1)..], b"three\n");
        assert_eq!(&text[tail_start(text, 2)..], b"two\nthree\n");
        assert_eq!(&text[tail_start(text, 9)..], text);
        assert_eq!(&text[tail_start(text, 0)..], b"");
    }
}
