//! Counting API requests by verb and resource, in the words of the API server's audit log
//! (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`;
//! `statefulsets/status`), whether they were seen in the audit log ([`super::audit`]) or by
//! the client ([`super::counting`]). Event writes are counted apart: issue 11 budgets them
//! separately.

use std::collections::BTreeMap;
use std::fmt;

/// What one request did: its verb and resource (with `/subresource`), as the audit log
/// names them. A request outside the resource API (`/version`, `/apis`) has the verb of its
/// HTTP method and its path as the resource.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestKey {
    pub verb: String,
    pub resource: String,
}

impl RequestKey {
    pub fn new(verb: &str, resource: &str) -> Self {
        Self {
            verb: verb.to_owned(),
            resource: resource.to_owned(),
        }
    }

    /// The key of an HTTP request to the API server, derived as the API server's request
    /// info resolver does (k8s.io/apiserver `RequestInfoFactory`): `/api/v1/…` and
    /// `/apis/<group>/<version>/…`, an optional `namespaces/<ns>/`, then the resource, its
    /// name and its subresource; a GET is `watch` with `watch=true` (or `watch=1`), `get`
    /// with a name and `list` without; a DELETE without a name is `deletecollection`.
    pub fn from_http(method: &http::Method, uri: &http::Uri) -> Self {
        let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
        let rest = match segments.as_slice() {
            ["api", _version, rest @ ..] => rest,
            ["apis", _group, _version, rest @ ..] => rest,
            _ => return Self::new(&method.as_str().to_lowercase(), uri.path()),
        };
        // `namespaces/<ns>/<resource>…` is a namespaced resource; `namespaces/<name>` and
        // `namespaces/<name>/{status,finalize}` are the Namespace itself.
        let rest = match rest {
            ["namespaces", _, resource, rest @ ..] if !matches!(*resource, "status" | "finalize") => {
                [&[*resource][..], rest].concat()
            }
            _ => rest.to_vec(),
        };
        let (resource, name, subresource) = match rest.as_slice() {
            [] => return Self::new(&method.as_str().to_lowercase(), uri.path()),
            [resource] => (*resource, None, None),
            [resource, name] => (*resource, Some(*name), None),
            [resource, name, subresource, ..] => (*resource, Some(*name), Some(*subresource)),
        };
        let watching = uri
            .query()
            .unwrap_or_default()
            .split('&')
            .any(|pair| pair == "watch=true" || pair == "watch=1");
        let verb = match (method.as_str(), name) {
            ("GET", _) if watching => "watch",
            ("GET", Some(_)) => "get",
            ("GET", None) => "list",
            ("POST", _) => "create",
            ("PUT", _) => "update",
            ("PATCH", _) => "patch",
            ("DELETE", Some(_)) => "delete",
            ("DELETE", None) => "deletecollection",
            (other, _) => return Self::new(&other.to_lowercase(), &resource_name(resource, subresource)),
        };
        Self::new(verb, &resource_name(resource, subresource))
    }

    /// Whether this writes an Event (core or `events.k8s.io`), which issue 11 budgets apart.
    pub fn is_event_write(&self) -> bool {
        self.resource == "events" && matches!(self.verb.as_str(), "create" | "update" | "patch")
    }
}

fn resource_name(resource: &str, subresource: Option<&str>) -> String {
    match subresource {
        Some(subresource) => format!("{resource}/{subresource}"),
        None => resource.to_owned(),
    }
}

impl fmt::Display for RequestKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.verb, self.resource)
    }
}

/// Requests counted by [`RequestKey`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally(BTreeMap<RequestKey, u64>);

impl Tally {
    pub fn add(&mut self, key: RequestKey) {
        *self.0.entry(key).or_default() += 1;
    }

    /// The requests counted with `verb` on `resource`.
    pub fn count(&self, verb: &str, resource: &str) -> u64 {
        self.0
            .get(&RequestKey::new(verb, resource))
            .copied()
            .unwrap_or_default()
    }

    /// Every request counted.
    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    /// The Event writes among them ([`RequestKey::is_event_write`]).
    pub fn event_writes(&self) -> u64 {
        self.0
            .iter()
            .filter(|(key, _)| key.is_event_write())
            .map(|(_, n)| n)
            .sum()
    }

    /// Every request but the Event writes.
    pub fn without_event_writes(&self) -> u64 {
        self.total() - self.event_writes()
    }

    /// The `n` most frequent keys, most frequent first (ties in key order).
    pub fn top(&self, n: usize) -> Vec<(RequestKey, u64)> {
        let mut counts: Vec<(RequestKey, u64)> = self.0.iter().map(|(key, n)| (key.clone(), *n)).collect();
        counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        counts.truncate(n);
        counts
    }

    /// What was counted after `before` was taken (a tally of the same counter, earlier).
    pub fn since(&self, before: &Tally) -> Tally {
        Tally(
            self.0
                .iter()
                .map(|(key, n)| (key.clone(), n.saturating_sub(before.0.get(key).copied().unwrap_or(0))))
                .filter(|(_, n)| *n > 0)
                .collect(),
        )
    }

    /// One line per key, most frequent first: `  <count>  <verb> <resource>`.
    pub fn breakdown(&self) -> String {
        self.top(usize::MAX)
            .iter()
            .map(|(key, n)| format!("{n:>7}  {key}\n"))
            .collect()
    }
}

impl FromIterator<RequestKey> for Tally {
    fn from_iter<I: IntoIterator<Item = RequestKey>>(keys: I) -> Self {
        let mut tally = Self::default();
        keys.into_iter().for_each(|key| tally.add(key));
        tally
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(method: &str, uri: &str) -> String {
        let method = http::Method::from_bytes(method.as_bytes()).unwrap();
        RequestKey::from_http(&method, &uri.parse().unwrap()).to_string()
    }

    #[test]
    fn http_requests_get_the_audit_logs_verbs_and_resources() {
        assert_eq!(key("GET", "/api/v1/namespaces/a/secrets/demo-ca"), "get secrets");
        assert_eq!(
            key("GET", "/api/v1/namespaces/a/secrets?labelSelector=x"),
            "list secrets"
        );
        assert_eq!(
            key("GET", "/api/v1/secrets?watch=true&resourceVersion=5"),
            "watch secrets"
        );
        assert_eq!(
            key("GET", "/apis/apps/v1/namespaces/a/statefulsets?watch=1"),
            "watch statefulsets"
        );
        assert_eq!(
            key(
                "PATCH",
                "/apis/apps/v1/namespaces/a/statefulsets/demo-etcd/status?fieldManager=x"
            ),
            "patch statefulsets/status"
        );
        assert_eq!(
            key("POST", "/apis/events.k8s.io/v1/namespaces/a/events"),
            "create events"
        );
        assert_eq!(key("PUT", "/api/v1/namespaces/a/configmaps/c"), "update configmaps");
        assert_eq!(key("DELETE", "/api/v1/namespaces/a/services/s"), "delete services");
        assert_eq!(key("DELETE", "/api/v1/namespaces/a/pods"), "deletecollection pods");
    }

    #[test]
    fn namespaces_themselves_are_told_from_namespaced_resources() {
        assert_eq!(key("POST", "/api/v1/namespaces"), "create namespaces");
        assert_eq!(key("GET", "/api/v1/namespaces/a"), "get namespaces");
        assert_eq!(
            key("PUT", "/api/v1/namespaces/a/finalize"),
            "update namespaces/finalize"
        );
        assert_eq!(key("GET", "/api/v1/namespaces/a/pods"), "list pods");
    }

    #[test]
    fn cluster_scoped_and_custom_resources_keep_their_plural() {
        assert_eq!(
            key(
                "GET",
                "/apis/controlplane.cluster.x-k8s.io/v1beta1/namespaces/a/nestedetcds/demo-etcd"
            ),
            "get nestedetcds"
        );
        assert_eq!(
            key(
                "GET",
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions?watch=true"
            ),
            "watch customresourcedefinitions"
        );
    }

    #[test]
    fn paths_outside_the_resource_api_are_named_by_path() {
        assert_eq!(key("GET", "/version"), "get /version");
        assert_eq!(key("GET", "/apis"), "get /apis");
        assert_eq!(key("GET", "/apis/apps/v1"), "get /apis/apps/v1");
    }

    #[test]
    fn event_writes_are_counted_apart() {
        let tally: Tally = [
            RequestKey::new("create", "events"),
            RequestKey::new("patch", "events"),
            RequestKey::new("list", "events"),
            RequestKey::new("get", "secrets"),
            RequestKey::new("get", "secrets"),
        ]
        .into_iter()
        .collect();
        assert_eq!(tally.total(), 5);
        assert_eq!(tally.event_writes(), 2);
        assert_eq!(tally.without_event_writes(), 3);
    }

    #[test]
    fn top_orders_by_count_then_key() {
        let tally: Tally = [("get", "secrets"), ("list", "b"), ("get", "secrets"), ("list", "a")]
            .into_iter()
            .map(|(verb, resource)| RequestKey::new(verb, resource))
            .collect();
        assert_eq!(
            tally.top(2),
            vec![
                (RequestKey::new("get", "secrets"), 2),
                (RequestKey::new("list", "a"), 1)
            ]
        );
        assert_eq!(
            tally.breakdown(),
            "      2  get secrets\n      1  list a\n      1  list b\n"
        );
    }
}
