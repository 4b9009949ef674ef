//! The kubelet API of the tenant Nodes (docs/design.md §11 "The kubelet API").
//!
//! A tenant apiserver reaches a Node's kubelet at the Node's address and
//! `daemonEndpoints.kubeletEndpoint` port for `kubectl logs` (and exec, attach,
//! port-forward). The tenant Nodes the syncer makes name capn's endpoint there
//! (`capn run --kubelet-advertise-address`), so every tenant apiserver calls capn, which
//! tells the tenant from the client certificate ([`identity`]) and answers from the super
//! cluster's API about the tenant pod's super pod. VirtualCluster's vn-agent did the same as a
//! DaemonSet on every super node, proxying to the super kubelets directly; capn answers
//! through the super cluster's API, so it needs no access to the nodes and the super
//! cluster's own authorization and audit see every call.
//!
//! Served: `GET /containerLogs/{namespace}/{pod}/{container}` ([`logs`]), and `exec`,
//! `attach` and `portForward`, whose upgraded connections are relayed to the super
//! cluster's API ([`streams`]).
//!
//! TLS: a self-signed serving certificate for the advertised address, made at start, as a
//! kubelet without a serving certificate makes one; tenant apiservers do not verify kubelet
//! certificates unless given `--kubelet-certificate-authority`, which capn's channels do not
//! set. The client certificate is required.

pub mod identity;
pub mod logs;
pub mod streams;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::Router;
use axum::routing::{any, get};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

pub use identity::Tenants;

use crate::syncer::names::ControlPlaneRef;

/// Where capn serves the kubelet API, and the address the tenant Nodes announce for it.
#[derive(Clone, Debug)]
pub struct KubeletEndpoint {
    /// The address and port to listen on (`capn run --kubelet-bind-address`, default
    /// `0.0.0.0:10250`, the kubelet's port; port 0 picks a free one).
    pub bind: SocketAddr,
    /// The address tenant apiservers dial (`--kubelet-advertise-address`, in a super cluster
    /// capn's pod IP), announced as each tenant Node's `InternalIP`.
    pub advertise: IpAddr,
    /// The super cluster's client configuration for the streams (`exec`, `attach`,
    /// `portForward`), which need HTTP/1.1 upgrades (capn's own client speaks HTTP/2);
    /// `None` answers them `501`.
    pub streams: Option<kube::Config>,
}

/// What one connection's requests are served with: the calling tenant and the super
/// cluster's client.
#[derive(Clone)]
pub(crate) struct Served {
    pub tenant: ControlPlaneRef,
    pub client: kube::Client,
    /// An HTTP/1.1 client of the super cluster, for upgrades.
    pub upgrades: Option<kube::Client>,
}

/// An error starting the kubelet API.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The listen address is taken or not this host's.
    #[error("cannot listen on {bind} for the kubelet API: {source}")]
    Bind { bind: SocketAddr, source: std::io::Error },
    /// The serving certificate could not be made or used.
    #[error("the kubelet API's serving certificate: {0}")]
    Certificate(String),
}

/// Binds the kubelet API's listener. Returns it and the port the tenant Nodes announce (the
/// one bound, when the endpoint asks for port 0).
///
/// # Errors
/// [`ServeError::Bind`].
pub async fn bind(endpoint: &KubeletEndpoint) -> Result<(TcpListener, u16), ServeError> {
    let listener = TcpListener::bind(endpoint.bind)
        .await
        .map_err(|source| ServeError::Bind {
            bind: endpoint.bind,
            source,
        })?;
    let port = listener
        .local_addr()
        .map_err(|source| ServeError::Bind {
            bind: endpoint.bind,
            source,
        })?
        .port();
    Ok((listener, port))
}

/// Serves the kubelet API of `endpoint` on `listener` for the apiservers of `tenants`,
/// answering from the super cluster through `client` (and streams through `endpoint`'s
/// HTTP/1.1 configuration), until dropped. A connection whose client certificate no
/// admitted tenant's CA signed is refused in the handshake.
///
/// # Errors
/// [`ServeError::Certificate`] when the serving certificate cannot be made.
pub async fn serve(
    listener: TcpListener,
    endpoint: KubeletEndpoint,
    tenants: Arc<Tenants>,
    client: kube::Client,
) -> Result<(), ServeError> {
    let acceptor = TlsAcceptor::from(Arc::new(server_config(endpoint.advertise, tenants.clone())?));
    let upgrades = match endpoint.streams.map(crate::client::upgrade_client).transpose() {
        Ok(upgrades) => upgrades,
        Err(error) => {
            tracing::warn!(%error, "no client for exec, attach and port-forward: they answer 501");
            None
        }
    };
    loop {
        let (tcp, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "kubelet API: accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        // Small writes (a log's last chunk, a stream's frames) go out at once, not after the
        // peer's delayed ACK (40 ms on Linux).
        let _ = tcp.set_nodelay(true);
        let (acceptor, tenants, client, upgrades) =
            (acceptor.clone(), tenants.clone(), client.clone(), upgrades.clone());
        tokio::spawn(async move {
            let tls = match acceptor.accept(tcp).await {
                Ok(tls) => tls,
                Err(error) => {
                    tracing::info!(%error, "kubelet API: TLS handshake refused");
                    return;
                }
            };
            let Some(tenant) = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| tenants.tenant_of_chain(c))
            else {
                return;
            };
            let service = TowerToHyperService::new(router(Served {
                tenant,
                client,
                upgrades,
            }));
            let served = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection_with_upgrades(TokioIo::new(tls), service)
                .await;
            if let Err(error) = served {
                tracing::debug!(%error, "kubelet API: connection ended");
            }
        });
    }
}

/// The routes of one tenant's connection.
fn router(served: Served) -> Router {
    Router::new()
        .route(
            "/containerLogs/{namespace}/{pod}/{container}",
            get(logs::container_logs),
        )
        .route("/exec/{namespace}/{pod}/{container}", any(streams::exec))
        .route("/attach/{namespace}/{pod}/{container}", any(streams::attach))
        .route("/portForward/{namespace}/{pod}", any(streams::port_forward))
        .with_state(served)
}

/// TLS with a fresh self-signed certificate for `advertise`, requiring a client certificate
/// from an admitted tenant's CA.
fn server_config(advertise: IpAddr, tenants: Arc<Tenants>) -> Result<rustls::ServerConfig, ServeError> {
    let certified = rcgen::generate_simple_self_signed(vec![advertise.to_string()])
        .map_err(|e| ServeError::Certificate(e.to_string()))?;
    let chain = vec![CertificateDer::from(certified.cert.der().to_vec())];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der()));
    rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| ServeError::Certificate(e.to_string()))?
        .with_client_cert_verifier(Arc::new(identity::TenantClients(tenants)))
        .with_single_cert(chain, key)
        .map_err(|e| ServeError::Certificate(e.to_string()))
}
