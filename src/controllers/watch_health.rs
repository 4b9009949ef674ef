//! Tells the NestedControlPlanes when a watch capn depends on fails (issue 41 item 5).
//!
//! A watch that fails (its list forbidden after an RBAC change, a resource the API does not
//! serve) retries with backoff and would otherwise be one log line: meanwhile changes go
//! unnoticed (a renewal due, a deleted CA, a deletion), or, at start-up, the controllers never
//! start because their caches never fill. The caches' drivers record each watch's health in
//! [`Metrics`] (`/readyz` and `capn_watch_failing` show it); this task writes it onto every
//! NestedControlPlane capn serves as the condition [`WATCHES_HEALTHY`] once it has lasted
//! [`crate::telemetry::WATCH_GRACE`] (a blip the watcher mends is not told), under a field
//! manager of its own (the conditions list is a map by type), so that `kubectl get ncp`
//! shows it too. It runs beside the caches, not behind them, since it must report while
//! they wait for a first list that does not come. A control plane gets the condition only
//! once a watch has failed, and keeps it (True) after recovery; nothing is written while
//! every watch works.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};

use crate::api::NestedControlPlane;
use crate::status::{ConditionUpdate, Reason, WATCHES_HEALTHY, set_condition};
use crate::telemetry::Metrics;

/// The field manager of the condition.
pub const FIELD_MANAGER: &str = "capn-watch-health";

/// The condition for the watches failing now (`kind` → last error).
pub fn condition(failing: &BTreeMap<String, String>) -> ConditionUpdate {
    if failing.is_empty() {
        return ConditionUpdate::new(WATCHES_HEALTHY, true, Reason::WatchesHealthy, "every watch works");
    }
    let each: Vec<String> = failing.iter().map(|(kind, error)| format!("{kind}: {error}")).collect();
    ConditionUpdate::new(
        WATCHES_HEALTHY,
        false,
        Reason::WatchFailed,
        format!(
            "capn cannot watch {}; until it can, changes to this control plane's objects of that kind go unnoticed \
             (and a capn starting up waits for them). Check capn's ClusterRole against the one it ships.",
            each.join("; ")
        ),
    )
}

/// The condition to write on `ncp`, or `None`: none when it has none and every watch
/// works, or when it already says the same.
pub fn update_for(ncp: &NestedControlPlane, failing: &BTreeMap<String, String>, now: &Time) -> Option<Condition> {
    let conditions = ncp.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
    let previous = conditions.iter().find(|c| c.type_ == WATCHES_HEALTHY);
    if previous.is_none() && failing.is_empty() {
        return None;
    }
    let mut updated = conditions.clone();
    set_condition(&mut updated, condition(failing), ncp.meta().generation, now);
    let next = updated.into_iter().find(|c| c.type_ == WATCHES_HEALTHY)?;
    let same =
        previous.is_some_and(|p| p.status == next.status && p.reason == next.reason && p.message == next.message);
    (!same).then_some(next)
}

/// Writes the condition on the control planes in `namespace` (all when `None`) matching
/// `selector` each time a watch starts or stops failing, until the process ends.
pub async fn run(client: Client, namespace: Option<String>, selector: Option<String>, metrics: Arc<Metrics>) {
    let api: Api<NestedControlPlane> = match &namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let params = match &selector {
        Some(labels) => ListParams::default().labels(labels),
        None => ListParams::default(),
    };
    let mut changes = metrics.watch_changes();
    while changes.changed().await.is_ok() {
        // A failure is told once it has lasted the grace period; a blip has mended by then.
        tokio::time::sleep(crate::telemetry::WATCH_GRACE).await;
        let failing = metrics.failing_watches();
        let listed = match api.list(&params).await {
            Ok(listed) => listed,
            Err(error) => {
                tracing::warn!(%error, "listing NestedControlPlanes to report a failing watch");
                continue;
            }
        };
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        for ncp in &listed.items {
            let Some(condition) = update_for(ncp, &failing, &now) else {
                continue;
            };
            let patch = serde_json::json!({
                "apiVersion": NestedControlPlane::api_version(&()),
                "kind": NestedControlPlane::kind(&()),
                "status": {"conditions": [condition]},
            });
            let ns = ncp.namespace().unwrap_or_default();
            let written = Api::<NestedControlPlane>::namespaced(client.clone(), &ns)
                .patch_status(
                    &ncp.name_any(),
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&patch),
                )
                .await;
            if let Err(error) = written {
                tracing::warn!(%error, name = %ncp.name_any(), namespace = %ns, "writing the WatchesHealthy condition");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ncp_with(conditions: Vec<Condition>) -> NestedControlPlane {
        let mut ncp = NestedControlPlane::new("demo", Default::default());
        ncp.status = Some(crate::api::NestedControlPlaneStatus {
            conditions,
            ..Default::default()
        });
        ncp
    }

    #[test]
    fn nothing_is_written_while_every_watch_has_worked() {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        assert_eq!(update_for(&ncp_with(Vec::new()), &BTreeMap::new(), &now), None);
    }

    #[test]
    fn a_failing_watch_is_named_then_its_recovery_told_once() {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let failing = BTreeMap::from([("Secret".to_owned(), "403 Forbidden: secrets is forbidden".to_owned())]);
        let failed = update_for(&ncp_with(Vec::new()), &failing, &now).expect("a condition");
        assert_eq!(
            (failed.status.as_str(), failed.reason.as_str()),
            ("False", "WatchFailed")
        );
        assert!(failed.message.contains("Secret: 403 Forbidden"), "{}", failed.message);
        // The same failure again: nothing to write.
        assert_eq!(update_for(&ncp_with(vec![failed.clone()]), &failing, &now), None);
        // Recovered: True, once.
        let healthy = update_for(&ncp_with(vec![failed]), &BTreeMap::new(), &now).expect("a condition");
        assert_eq!(
            (healthy.status.as_str(), healthy.reason.as_str()),
            ("True", "WatchesHealthy")
        );
        assert_eq!(update_for(&ncp_with(vec![healthy]), &BTreeMap::new(), &now), None);
    }
}
