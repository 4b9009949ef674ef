//! The node's kubelet API, as far as the tests need it (node adaptation 6): `GET
//! /containerLogs/{namespace}/{pod}/{container}` over TLS on the node's address and the
//! kubelet's port, which the super cluster's apiserver calls for `pods/log` (`kubectl
//! logs`). The query's `tailLines` and `follow` are honoured (a followed log is read again
//! every 200 ms until the pod is gone); `timestamps`, `previous`, `limitBytes` and the `since`
//! bounds are not. The certificate is self-signed and no client certificate is asked for
//! (the super apiserver verifies no kubelet's certificate and presents none here).
//! Exec, attach and port-forward are not served.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::runner::Shared;

/// How often a followed log is read again.
const FOLLOW_EVERY: Duration = Duration::from_millis(200);

/// Listens on `address` and serves the node's pods' logs until the process ends.
///
/// # Errors
/// The address cannot be bound or the certificate made.
pub(super) async fn start(address: SocketAddr, shared: Arc<Shared>) -> Result<(), String> {
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
        .with_state(shared);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let (acceptor, router) = (acceptor.clone(), router.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), TowerToHyperService::new(router))
                    .await;
            });
        }
    });
    Ok(())
}

async fn container_logs(
    State(shared): State<Arc<Shared>>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let key = format!("{namespace}/{pod}");
    let Some(path) = shared.container_log(&key, &container) else {
        return (
            StatusCode::NOT_FOUND,
            format!("container {container} of pod {key} is not on this node"),
        )
            .into_response();
    };
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
                shared.container_log(&key, &container)?;
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
