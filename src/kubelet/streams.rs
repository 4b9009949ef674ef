//! `exec`, `attach` and `portForward`: the tenant apiserver's upgrade request (SPDY, as
//! kube-apiserver speaks to kubelets, or WebSockets) is sent on to the super cluster's API
//! (`pods/exec`, `pods/attach`, `pods/portforward` of the tenant pod's super pod, which its
//! kubelet serves) with the query and the protocol headers it came with; once both sides
//! have switched protocols, the bytes are copied both ways unread, so whatever protocol
//! version the two ends agree on passes through.

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderName, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;

use super::Served;
use crate::syncer::names::NameLimit;

/// The request headers that carry the upgrade and the protocol negotiation.
const UPGRADE_HEADERS: [&str; 6] = [
    "connection",
    "upgrade",
    "x-stream-protocol-version",
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-protocol",
];

/// The API's query for a kubelet query: the kubelet names the streams `input`, `output` and
/// `error` and the forwarded ports `port` where the API says `stdin`, `stdout`, `stderr` and
/// `ports` (kube-apiserver's `pkg/registry/core/pod/strategy.go` maps them the other way);
/// `command`, `tty` and the rest are the same; `container` comes from the kubelet's path.
pub fn api_query(kubelet_query: Option<&str>, container: Option<&str>) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    for (key, value) in form_urlencoded::parse(kubelet_query.unwrap_or_default().as_bytes()) {
        let key = match key.as_ref() {
            "input" => "stdin",
            "output" => "stdout",
            "error" => "stderr",
            "port" => "ports",
            "container" => continue,
            other => other,
        };
        let value = match (key, value.as_ref()) {
            ("stdin" | "stdout" | "stderr" | "tty", "1") => "true",
            ("stdin" | "stdout" | "stderr" | "tty", "0") => "false",
            (_, other) => other,
        };
        query.append_pair(key, value);
    }
    if let Some(container) = container {
        query.append_pair("container", container);
    }
    query.finish()
}

/// `/exec/{namespace}/{pod}/{container}`.
pub(super) async fn exec(
    State(served): State<Served>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    request: Request,
) -> Response {
    relay(&served, "exec", &namespace, &pod, Some(&container), request).await
}

/// `/attach/{namespace}/{pod}/{container}`.
pub(super) async fn attach(
    State(served): State<Served>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    request: Request,
) -> Response {
    relay(&served, "attach", &namespace, &pod, Some(&container), request).await
}

/// `/portForward/{namespace}/{pod}`.
pub(super) async fn port_forward(
    State(served): State<Served>,
    Path((namespace, pod)): Path<(String, String)>,
    request: Request,
) -> Response {
    relay(&served, "portforward", &namespace, &pod, None, request).await
}

async fn relay(
    served: &Served,
    subresource: &str,
    namespace: &str,
    pod: &str,
    container: Option<&str>,
    mut request: Request,
) -> Response {
    let Some(upgrades) = &served.upgrades else {
        return (
            StatusCode::NOT_IMPLEMENTED,
            "this capn has no HTTP/1.1 client of the super cluster for streams",
        )
            .into_response();
    };
    let super_pod = served.tenant.super_name(NameLimit::Subdomain, namespace, pod);
    let uri = format!(
        "/api/v1/namespaces/{}/pods/{super_pod}/{subresource}?{}",
        served.tenant.workload_namespace(),
        api_query(request.uri().query(), container)
    );
    let mut upstream = http::Request::builder().method(request.method()).uri(uri);
    for name in UPGRADE_HEADERS {
        for value in request.headers().get_all(name) {
            upstream = upstream.header(name, value);
        }
    }
    let Ok(upstream) = upstream.body(kube::client::Body::empty()) else {
        return (StatusCode::BAD_REQUEST, "the request's headers cannot be sent on").into_response();
    };
    let mut answer = match upgrades.send(upstream).await {
        Ok(answer) => answer,
        Err(error) => {
            tracing::info!(tenant = %served.tenant.key(), %namespace, %pod, %error, "stream request failed");
            return (
                StatusCode::BAD_GATEWAY,
                format!("the super cluster could not be asked: {error}"),
            )
                .into_response();
        }
    };
    if answer.status() != StatusCode::SWITCHING_PROTOCOLS {
        // The super cluster's refusal (the pod is not there, no such container), its status
        // passed on; its message names super objects, so the tenant gets its own names.
        let status = answer.status();
        let detail = answer
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        tracing::info!(tenant = %served.tenant.key(), %namespace, %pod, %status, detail = %String::from_utf8_lossy(&detail), "stream refused by the super cluster");
        return (
            status,
            format!("{subresource} into {namespace}/{pod} was refused by the super cluster ({status})"),
        )
            .into_response();
    }
    let mut response = Response::builder().status(StatusCode::SWITCHING_PROTOCOLS);
    for (name, value) in answer.headers() {
        if is_negotiation(name) {
            response = response.header(name, value);
        }
    }
    let from_tenant = hyper::upgrade::on(&mut request);
    let from_super = hyper::upgrade::on(&mut answer);
    let (tenant, namespace, pod) = (served.tenant.key(), namespace.to_owned(), pod.to_owned());
    tokio::spawn(async move {
        match tokio::try_join!(from_tenant, from_super) {
            Ok((a, b)) => {
                let (mut a, mut b) = (TokioIo::new(a), TokioIo::new(b));
                if let Err(error) = tokio::io::copy_bidirectional(&mut a, &mut b).await {
                    tracing::debug!(%tenant, %namespace, %pod, %error, "stream ended");
                }
            }
            Err(error) => tracing::info!(%tenant, %namespace, %pod, %error, "stream upgrade failed"),
        }
    });
    response.body(Body::empty()).unwrap_or_default()
}

/// The response headers of a protocol switch that the tenant's side must see.
fn is_negotiation(name: &HeaderName) -> bool {
    name == header::CONNECTION
        || name == header::UPGRADE
        || name == header::SEC_WEBSOCKET_ACCEPT
        || name == header::SEC_WEBSOCKET_PROTOCOL
        || name.as_str() == "x-stream-protocol-version"
}

#[cfg(test)]
mod tests {
    use super::api_query;

    #[test]
    fn the_kubelets_stream_names_become_the_apis() {
        let query = api_query(
            Some("command=cat&command=%2Fetc%2Fhostname&input=1&output=1&error=0&tty=0"),
            Some("web"),
        );
        assert_eq!(
            query,
            "command=cat&command=%2Fetc%2Fhostname&stdin=true&stdout=true&stderr=false&tty=false&container=web"
        );
        // Port-forward: no container, ports kept; a container in the query never overrides
        // the path's.
        assert_eq!(
            api_query(Some("port=8080&port=9090&container=x"), None),
            "ports=8080&ports=9090"
        );
    }
}
