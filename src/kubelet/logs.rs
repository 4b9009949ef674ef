//! `GET /containerLogs/{namespace}/{pod}/{container}`: what the tenant apiserver asks a
//! kubelet for `kubectl logs` (the kubelet's own path and query, `pkg/kubelet/server`),
//! answered with the super pod's log from the super cluster's API (`pods/log`, which its
//! kubelet serves), streamed as it comes.

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures::AsyncReadExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, LogParams};

use super::Served;
use crate::syncer::names::NameLimit;

/// The kubelet's log query (`follow`, `previous`, `timestamps`, `tailLines`, `limitBytes`,
/// `sinceSeconds`, and `sinceTime` in RFC 3339) for `container`, as kube's [`LogParams`].
///
/// # Errors
/// A value that does not parse, naming the parameter and what it must be.
pub fn log_params(container: &str, query: &HashMap<String, String>) -> Result<LogParams, String> {
    let flag = |name: &str| -> Result<bool, String> {
        query.get(name).map_or(Ok(false), |v| match v.as_str() {
            "" | "true" | "1" => Ok(true),
            "false" | "0" => Ok(false),
            other => Err(format!("{name}={other:?}: must be true or false")),
        })
    };
    let number = |name: &str| -> Result<Option<i64>, String> {
        query
            .get(name)
            .map(|v| {
                v.parse::<i64>()
                    .ok()
                    .filter(|n| *n >= 0)
                    .ok_or_else(|| format!("{name}={v:?}: must be a whole number, 0 or more"))
            })
            .transpose()
    };
    Ok(LogParams {
        container: Some(container.to_owned()),
        follow: flag("follow")?,
        previous: flag("previous")?,
        timestamps: flag("timestamps")?,
        tail_lines: number("tailLines")?,
        limit_bytes: number("limitBytes")?,
        since_seconds: number("sinceSeconds")?,
        since_time: query
            .get("sinceTime")
            .map(|t| {
                t.parse::<k8s_openapi::jiff::Timestamp>()
                    .map_err(|e| format!("sinceTime={t:?}: must be an RFC 3339 time ({e})"))
            })
            .transpose()?,
        ..LogParams::default()
    })
}

/// The handler: the tenant pod `namespace/pod` of the calling tenant is the super pod of its
/// mapped name in its workload namespace (names are the tenant's own: no other tenant's pod
/// can be named).
pub(super) async fn container_logs(
    State(served): State<Served>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let params = match log_params(&container, &query) {
        Ok(params) => params,
        Err(message) => return (StatusCode::BAD_REQUEST, message).into_response(),
    };
    let super_pod = served.tenant.super_name(NameLimit::Subdomain, &namespace, &pod);
    let api = Api::<Pod>::namespaced(served.client.clone(), &served.tenant.workload_namespace());
    match api.log_stream(&super_pod, &params).await {
        Ok(reader) => Body::from_stream(chunks(reader)).into_response(),
        Err(kube::Error::Api(e)) => {
            let status = StatusCode::from_u16(e.code).unwrap_or(StatusCode::BAD_GATEWAY);
            // The super cluster's message names super objects; the tenant hears of its own.
            let message = if e.code == 404 {
                format!("pod {namespace}/{pod} is not running in the super cluster (not synced yet, or gone)")
            } else {
                format!(
                    "the super cluster answered {} for the log of {namespace}/{pod}/{container}",
                    e.code
                )
            };
            tracing::info!(tenant = %served.tenant.key(), %namespace, %pod, error = %e.message, "log request failed");
            (status, message).into_response()
        }
        Err(e) => {
            tracing::info!(tenant = %served.tenant.key(), %namespace, %pod, error = %e, "log request failed");
            (
                StatusCode::BAD_GATEWAY,
                format!("the super cluster could not be asked for the log: {e}"),
            )
                .into_response()
        }
    }
}

/// The bytes of `reader` as they arrive (a followed log's too), in chunks of up to 16 KiB.
fn chunks(
    reader: impl futures::AsyncBufRead + Send + Unpin + 'static,
) -> impl futures::Stream<Item = std::io::Result<Vec<u8>>> + Send {
    futures::stream::try_unfold(reader, |mut reader| async move {
        let mut buffer = vec![0; 16 * 1024];
        let read = reader.read(&mut buffer).await?;
        buffer.truncate(read);
        Ok((read > 0).then_some((buffer, reader)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn the_kubelets_log_query_becomes_the_super_clusters() {
        let params = log_params(
            "web",
            &query(&[
                ("follow", "true"),
                ("tailLines", "10"),
                ("timestamps", "1"),
                ("limitBytes", "500"),
            ]),
        )
        .unwrap();
        assert_eq!(params.container.as_deref(), Some("web"));
        assert!(params.follow && params.timestamps && !params.previous);
        assert_eq!((params.tail_lines, params.limit_bytes), (Some(10), Some(500)));
        let plain = log_params("web", &HashMap::new()).unwrap();
        assert!(!plain.follow && plain.tail_lines.is_none() && plain.since_time.is_none());
        let since = log_params("web", &query(&[("sinceTime", "2026-12-06T04:00:00Z")])).unwrap();
        assert_eq!(since.since_time.unwrap().to_string(), "2026-12-06T04:00:00Z");
    }

    #[test]
    fn a_bad_value_is_named_with_what_it_must_be() {
        let err = log_params("web", &query(&[("tailLines", "ten")])).unwrap_err();
        assert!(err.contains("tailLines") && err.contains("whole number"), "{err}");
        let err = log_params("web", &query(&[("tailLines", "-1")])).unwrap_err();
        assert!(err.contains("tailLines"), "{err}");
        let err = log_params("web", &query(&[("follow", "yes")])).unwrap_err();
        assert!(err.contains("follow") && err.contains("true or false"), "{err}");
        let err = log_params("web", &query(&[("sinceTime", "yesterday")])).unwrap_err();
        assert!(err.contains("RFC 3339"), "{err}");
    }
}
