//! The super cluster's API client: kube-client's stack, but speaking HTTP/2 when the API
//! server offers it, as client-go does (every request beyond the work is waste,
//! and so is every connection).
//!
//! kube-client 5 offers only HTTP/1.1 over TLS (kube-rs/kube#1923: HTTP/2 breaks its
//! websocket upgrades, which capn never uses on the super cluster). Over HTTP/1.1 each
//! request in flight needs a connection of its own: with capn's bounded concurrency
//! ([`crate::controllers::MAX_CONCURRENT_RECONCILES`] per controller) and one long-lived
//! watch per cached kind, a wave of 1,000 control planes held about 150 TLS connections
//! open, each with its own buffers in capn and a goroutine set in kube-apiserver. Over
//! HTTP/2 every request and watch is a stream of one connection.
//!
//! The layers are kube-client's own ([`ConfigExt`]): base URI, retry on 429/503/504 (when
//! the config asks for it, as it does by default), authentication, extra headers, and the
//! connect/read/write timeouts of the config. HTTP/2 connections send a PING after 30 s
//! without frames and are dropped when none is answered in 15 s, like client-go's
//! `ReadIdleTimeout`/`PingTimeout`, so a connection a load balancer silently dropped is
//! noticed, not waited on until every watch and request on it times out. Left out of
//! kube-client's stack: its debug-level tracing span per request, and the expiry it records
//! for a client certificate from an exec plugin (`Client::valid_until`, which capn does not
//! read).

use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::retry::RetryPolicy;
use kube::client::{Body, ClientBuilder, ConfigExt, DynBody};
use kube::{Client, Config};
use tower::retry::RetryLayer;
use tower::util::BoxService;
use tower::{BoxError, ServiceBuilder, ServiceExt};

/// Idle time after which an HTTP/2 connection is checked with a PING (client-go's
/// `ReadIdleTimeout`, 30 s).
pub const HTTP2_PING_INTERVAL: Duration = Duration::from_secs(30);
/// Time a PING has to be answered before the connection is closed (client-go's
/// `PingTimeout`, 15 s).
pub const HTTP2_PING_TIMEOUT: Duration = Duration::from_secs(15);

/// Bytes the API server may send on one stream before capn reads them: 4 MiB, Go's HTTP/2
/// transport's (`transportDefaultStreamFlow`, which client-go uses).
pub const HTTP2_STREAM_WINDOW: u32 = 4 << 20;
/// Bytes the API server may send on the whole connection before capn reads them: 1 GiB, Go's
/// (`transportDefaultConnFlow`). Far above every stream's window together, so a watch whose
/// events capn reads slowly (a shared reflector waits for its slowest subscriber) holds back
/// only its own stream, never the requests beside it. A window is credit, not a buffer:
/// memory is used only by what has arrived and not been read.
pub const HTTP2_CONNECTION_WINDOW: u32 = 1 << 30;

/// The service stack of [`builder`]: kube-client's boxed request/response service.
pub type Service = BoxService<http::Request<Body>, http::Response<Box<DynBody>>, BoxError>;

/// A client builder for the super cluster at `config`: HTTP/2 when the server's TLS
/// handshake offers it (ALPN `h2`), HTTP/1.1 otherwise; more layers can be added with
/// [`ClientBuilder::with_layer`] (the request-budget test counts requests that way).
///
/// A config with a proxy gets kube-client's own stack unchanged (HTTP/1.1), which handles
/// HTTP, HTTPS and SOCKS proxies.
///
/// # Errors
/// What kube-client's builder returns for the same config: the TLS identity or roots
/// cannot be read, the server name is invalid, or the authentication cannot be set up.
pub fn builder(config: Config) -> kube::Result<ClientBuilder<Service>> {
    stack(config, true)
}

/// The stack of [`builder`], offering HTTP/2 (`http2`) or HTTP/1.1 only. TCP segments go
/// out at once (`TCP_NODELAY`, as Go's net package sets it for client-go): a stream's small
/// frames are not held for the peer's delayed ACK.
fn stack(config: Config, http2: bool) -> kube::Result<ClientBuilder<Service>> {
    if config.proxy_url.is_some() {
        return ClientBuilder::try_from(config);
    }
    let tls = config.rustls_client_config()?;
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_nodelay(true);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    let https = match &config.tls_server_name {
        Some(name) => https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(
            name.clone()
                .try_into()
                .map_err(kube::client::RustlsTlsError::InvalidServerName)
                .map_err(kube::Error::RustlsTls)?,
        )),
        None => https,
    };
    let https = if http2 {
        https.enable_http1().enable_http2().wrap_connector(tcp)
    } else {
        https.enable_http1().wrap_connector(tcp)
    };
    let mut connector = hyper_timeout::TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let http: hyper_util::client::legacy::Client<_, Body> =
        hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .http2_keep_alive_interval(HTTP2_PING_INTERVAL)
            .http2_keep_alive_timeout(HTTP2_PING_TIMEOUT)
            .http2_keep_alive_while_idle(true)
            .http2_initial_stream_window_size(HTTP2_STREAM_WINDOW)
            .http2_initial_connection_window_size(HTTP2_CONNECTION_WINDOW)
            .build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(http)
        .map_response(|response| {
            response.map(|body| Box::new(http_body_util::BodyExt::map_err(body, BoxError::from)) as Box<DynBody>)
        })
        .boxed();
    Ok(ClientBuilder::new(service, config.default_namespace))
}

/// A client for the super cluster at `config` ([`builder`] without more layers).
///
/// # Errors
/// As [`builder`].
pub fn client(config: Config) -> kube::Result<Client> {
    Ok(builder(config)?.build())
}

/// A client for the super cluster at `config` that speaks HTTP/1.1 only, for requests that
/// upgrade the connection (exec, attach, port-forward: HTTP/2 has no `Upgrade`).
///
/// # Errors
/// As [`builder`].
pub fn upgrade_client(config: Config) -> kube::Result<Client> {
    Ok(stack(config, false)?.build())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config with a proxy keeps kube-client's own stack (which knows proxies); one
    /// without gets ours. Both build without a server.
    #[tokio::test]
    async fn builds_for_direct_and_proxied_configs() {
        let direct = Config::new("https://127.0.0.1:6443".parse().unwrap());
        assert!(builder(direct).is_ok());
        let mut proxied = Config::new("https://127.0.0.1:6443".parse().unwrap());
        proxied.proxy_url = Some("socks5://127.0.0.1:1080".parse().unwrap());
        // kube without its `socks5` feature refuses the proxy: the fallback really is
        // kube's builder, which knows that feature, not ours, which would ignore the proxy.
        let error = builder(proxied)
            .err()
            .expect("kube's builder refuses a SOCKS proxy without its feature");
        assert!(error.to_string().contains("socks5"), "{error}");
    }
}
