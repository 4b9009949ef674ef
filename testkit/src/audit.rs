//! Reading the kube-apiserver's audit log (JSON lines of `audit.k8s.io/v1` Events), so that
//! the benchmark counts requests on the API server's side, not in the client that sends
//! them.
//!
//! [`POLICY`] logs every request at the Metadata level and omits the `RequestReceived`
//! stage. A request then appears once at `ResponseComplete`, and a watch also at
//! `ResponseStarted` (logged when the watch begins, while `ResponseComplete` comes only when
//! it ends), so [`read_log`] keeps one entry per `auditID`: open watches count too.

use std::collections::HashSet;
use std::path::Path;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use serde::Deserialize;

use super::requests::RequestKey;

/// The audit policy (`--audit-policy-file`): every request at the Metadata level (who, what,
/// when; no bodies), without the `RequestReceived` stage.
pub const POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
";

/// One request the API server received.
#[derive(Clone, Debug, PartialEq)]
pub struct AuditedRequest {
    /// The user it was made as: the impersonated user if any, else the authenticated one.
    pub identity: String,
    pub key: RequestKey,
    /// When the API server received it.
    pub received: Timestamp,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Event {
    #[serde(rename = "auditID")]
    audit_id: String,
    verb: String,
    #[serde(rename = "requestURI")]
    request_uri: String,
    user: User,
    impersonated_user: Option<User>,
    object_ref: Option<ObjectRef>,
    request_received_timestamp: MicroTime,
}

#[derive(Deserialize)]
struct User {
    username: String,
}

#[derive(Deserialize)]
struct ObjectRef {
    resource: Option<String>,
    subresource: Option<String>,
}

/// Parses one line of the audit log into its `auditID` and the request.
///
/// # Errors
/// A line that is not an audit Event, naming what is missing.
pub fn parse_line(line: &str) -> Result<(String, AuditedRequest), String> {
    let event: Event = serde_json::from_str(line).map_err(|e| format!("not an audit event ({e}): {line}"))?;
    let resource = match event.object_ref.and_then(|o| o.resource.map(|r| (r, o.subresource))) {
        Some((resource, Some(subresource))) => format!("{resource}/{subresource}"),
        Some((resource, None)) => resource,
        // A request outside the resource API (`/version`, discovery): named by its path.
        None => event.request_uri.split('?').next().unwrap_or_default().to_owned(),
    };
    let identity = event.impersonated_user.unwrap_or(event.user).username;
    Ok((
        event.audit_id,
        AuditedRequest {
            identity,
            key: RequestKey::new(&event.verb, &resource),
            received: event.request_received_timestamp.0,
        },
    ))
}

/// Every request in an audit log, once each, in the order they were logged.
///
/// # Errors
/// The file cannot be read, or a line is not an audit Event.
pub fn read_log(path: &Path) -> Result<Vec<AuditedRequest>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    parse_log(&String::from_utf8_lossy(&bytes))
}

/// [`read_log`] on the text of a log. A last line without its newline is being written
/// while the API server runs: it is left for the next read.
///
/// # Errors
/// A complete line that is not an audit Event.
pub fn parse_log(text: &str) -> Result<Vec<AuditedRequest>, String> {
    let complete = &text[..text.rfind('\n').map_or(0, |end| end + 1)];
    let mut seen = HashSet::new();
    let mut requests = Vec::new();
    for line in complete.lines().filter(|line| !line.trim().is_empty()) {
        let (id, request) = parse_line(line)?;
        if seen.insert(id) {
            requests.push(request);
        }
    }
    Ok(requests)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Shaped like kube-apiserver v1.36's log lines (trimmed of fields the parser ignores).
    const WATCH_STARTED: &str = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a1","stage":"ResponseStarted","requestURI":"/api/v1/namespaces/b/secrets?watch=true","verb":"watch","user":{"username":"capn-test-admin","groups":["system:masters","system:authenticated"]},"impersonatedUser":{"username":"bench-capn","groups":["system:masters"]},"sourceIPs":["127.0.0.1"],"objectRef":{"resource":"secrets","namespace":"b","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2026-12-01T01:02:03.123456Z","stageTimestamp":"2026-12-01T01:02:03.124000Z"}"#;
    const WATCH_COMPLETE: &str = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a1","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/b/secrets?watch=true","verb":"watch","user":{"username":"capn-test-admin"},"impersonatedUser":{"username":"bench-capn"},"objectRef":{"resource":"secrets","namespace":"b","apiVersion":"v1"},"requestReceivedTimestamp":"2026-12-01T01:02:03.123456Z"}"#;
    const STATUS_PATCH: &str = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a2","stage":"ResponseComplete","requestURI":"/apis/apps/v1/namespaces/b/statefulsets/c-etcd/status","verb":"patch","user":{"username":"capn-test-admin"},"objectRef":{"resource":"statefulsets","namespace":"b","name":"c-etcd","apiGroup":"apps","apiVersion":"v1","subresource":"status"},"requestReceivedTimestamp":"2026-12-01T01:02:04.000001Z"}"#;
    const DISCOVERY: &str = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a3","stage":"ResponseComplete","requestURI":"/apis?timeout=32s","verb":"get","user":{"username":"system:apiserver"},"requestReceivedTimestamp":"2026-12-01T01:02:05Z"}"#;

    #[test]
    fn the_impersonated_user_is_the_identity() {
        let (id, request) = parse_line(WATCH_STARTED).unwrap();
        assert_eq!(id, "a1");
        assert_eq!(request.identity, "bench-capn");
        assert_eq!(request.key, RequestKey::new("watch", "secrets"));
        assert_eq!(
            request.received,
            "2026-12-01T01:02:03.123456Z".parse::<Timestamp>().unwrap()
        );
    }

    #[test]
    fn without_impersonation_the_user_is_the_identity_and_subresources_are_kept() {
        let (_, request) = parse_line(STATUS_PATCH).unwrap();
        assert_eq!(request.identity, "capn-test-admin");
        assert_eq!(request.key, RequestKey::new("patch", "statefulsets/status"));
    }

    #[test]
    fn requests_outside_the_resource_api_are_named_by_path() {
        let (_, request) = parse_line(DISCOVERY).unwrap();
        assert_eq!(request.key, RequestKey::new("get", "/apis"));
    }

    #[test]
    fn a_watch_logged_at_two_stages_counts_once() {
        let log = [WATCH_STARTED, WATCH_COMPLETE, "", STATUS_PATCH, ""].join("\n");
        let requests = parse_log(&log).unwrap();
        let keys: Vec<String> = requests.iter().map(|r| r.key.to_string()).collect();
        assert_eq!(keys, ["watch secrets", "patch statefulsets/status"]);
    }

    #[test]
    fn a_line_still_being_written_is_left_for_later() {
        let log = format!("{STATUS_PATCH}\n{}", &DISCOVERY[..40]);
        let requests = parse_log(&log).unwrap();
        assert_eq!(requests.len(), 1);
        assert_eq!(requests[0].key, RequestKey::new("patch", "statefulsets/status"));
    }

    #[test]
    fn a_line_that_is_not_an_event_is_an_error_naming_it() {
        let error = parse_log("{\"kind\":\"Event\"}\n").unwrap_err();
        assert!(
            error.contains("not an audit event") && error.contains("{\"kind\":\"Event\"}"),
            "{error}"
        );
    }
}
