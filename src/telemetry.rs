//! Logging, metrics and health probes.
//!
//! - Logs: structured `tracing` output, text or JSON, filtered by `RUST_LOG` (default `info`).
//! - Metrics (Prometheus text format on `/metrics`): `capn_reconcile_total`,
//!   `capn_reconcile_errors_total` (by controller and reason),
//!   `capn_reconcile_duration_seconds` (histogram, seconds, by controller) and
//!   `capn_managed_objects` (objects capn applied for its component resources, by controller),
//!   `capn_tenant_connections_total` (connections to tenants through the super cluster's
//!   port-forward, by `path` and `result`: `opened` or `failed`; see [`crate::reach`]),
//!   `capn_watch_failing` (1 while capn's watch of a `kind` fails, else 0); per control plane
//!   (`namespace`, `cluster`): the `capn_etcd_*` space, member and backup series,
//!   `capn_control_plane_ready` and the `capn_certificate_*` schedule
//!   (docs/operations/metrics.md lists each with its unit; the alerts of
//!   `deploy/monitoring/` are written against them).
//! - Probes: `/healthz` answers while the process serves; `/readyz` once the controllers (or,
//!   with leader election, the standby loop) are running and no watch fails (a failing
//!   watch is named in the answer's body).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tracing_subscriber::EnvFilter;

/// Installs the global log subscriber once; later calls are ignored. Text logs are coloured
/// only when standard output (where they go) is a terminal and `NO_COLOR` is unset
/// (<https://no-color.org>): a file or a pipe gets plain text.
pub fn init(json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(use_colour(
        std::io::IsTerminal::is_terminal(&std::io::stdout()),
        std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty()),
    ));
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// Whether text logs carry ANSI colour codes: only on a terminal, and never with `NO_COLOR`.
pub fn use_colour(stdout_is_terminal: bool, no_colour: bool) -> bool {
    stdout_is_terminal && !no_colour
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabel {
    controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConnectionLabels {
    path: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

/// One control plane: the finest grain capn's high-volume series have (never a member or
/// an object), so their count is bounded by the control planes capn runs.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct ControlPlaneLabels {
    namespace: String,
    cluster: String,
}

/// An etcd's space as one pass read it, for [`Metrics::set_etcd_space`]; sizes in bytes,
/// each the largest over the members that answered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EtcdSpaceFigures {
    pub db_size: i64,
    pub db_size_in_use: i64,
    pub quota: i64,
    pub nospace: bool,
}

/// An etcd's members as one pass read them, for [`Metrics::set_etcd_members`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EtcdMemberFigures {
    /// Members wanted (the NestedEtcd's replicas).
    pub members: i64,
    /// Members whose Status answered, that know a leader and report no error besides
    /// alarms (the membership step's rule for a healthy member).
    pub healthy: i64,
    /// Whether a member that answered knows a leader.
    pub has_leader: bool,
}

/// A control plane's certificates as its last pass read them, for
/// [`Metrics::set_certificates`]; times in Unix seconds, durations in seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CertificateFigures {
    /// The earliest `NotAfter` of its certificates (CAs, leaves, kubeconfigs).
    pub expiry: Option<i64>,
    /// When capn renews the next one.
    pub next_renewal: Option<i64>,
    /// How long before its `NotAfter` a leaf of the control plane's policy is renewed.
    pub renew_before: i64,
}

/// An etcd's backups as its last pass reported them, for [`Metrics::set_etcd_backup`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackupFigures {
    /// When the last verified snapshot was taken, Unix seconds.
    pub last_success: Option<i64>,
    /// The schedule's gap after that snapshot (or after the etcd's creation), seconds;
    /// `None` without a schedule.
    pub interval: Option<i64>,
    /// Whether `BackupSucceeded` is False with a failure's reason.
    pub failing: bool,
}

/// The `capn_etcd_*` series.
#[derive(Default)]
struct EtcdSeries {
    db_size: Family<ControlPlaneLabels, Gauge>,
    db_size_in_use: Family<ControlPlaneLabels, Gauge>,
    quota: Family<ControlPlaneLabels, Gauge>,
    nospace: Family<ControlPlaneLabels, Gauge>,
    defragmentations: Family<ControlPlaneLabels, Counter>,
    members: Family<ControlPlaneLabels, Gauge>,
    members_healthy: Family<ControlPlaneLabels, Gauge>,
    has_leader: Family<ControlPlaneLabels, Gauge>,
    backup_last_success: Family<ControlPlaneLabels, Gauge>,
    backup_interval: Family<ControlPlaneLabels, Gauge>,
    backup_failing: Family<ControlPlaneLabels, Gauge>,
}

/// The per control plane series of the NestedControlPlane controller.
#[derive(Default)]
struct ControlPlaneSeries {
    ready: Family<ControlPlaneLabels, Gauge>,
    hibernated: Family<ControlPlaneLabels, Gauge>,
    certificate_expiry: Family<ControlPlaneLabels, Gauge>,
    certificate_renewal: Family<ControlPlaneLabels, Gauge>,
    certificate_renew_before: Family<ControlPlaneLabels, Gauge>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    controller: String,
    reason: String,
}

/// The controllers' metrics. Cheap to share (`Arc`); a default instance records into a
/// registry nobody reads, which is what tests use.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<ControllerLabel, Counter>,
    errors: Family<ErrorLabels, Counter>,
    durations: Family<ControllerLabel, Histogram>,
    managed: Family<ControllerLabel, Gauge>,
    tenant_connections: Family<ConnectionLabels, Counter>,
    watch_failing: Family<KindLabel, Gauge>,
    etcd: EtcdSeries,
    control_planes: ControlPlaneSeries,
    /// Every control plane a per control plane series was recorded for, so that
    /// [`Metrics::retain_control_planes`] can drop the series of those that are gone.
    control_planes_seen: Mutex<BTreeSet<ControlPlaneLabels>>,
    /// Objects per component resource, so the gauge is a sum that stays right on updates.
    inventory: Mutex<HashMap<(String, String), i64>>,
    ready: AtomicBool,
    /// The watches failing now: kind → the last error, and since when the watch fails.
    failing_watches: Mutex<BTreeMap<String, (String, Instant)>>,
    /// Bumped whenever a watch starts or stops failing.
    watch_changes: tokio::sync::watch::Sender<u64>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("capn");
        let reconciles = Family::<ControllerLabel, Counter>::default();
        let errors = Family::<ErrorLabels, Counter>::default();
        let durations = Family::<ControllerLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.005, 2.0, 14))
        });
        let managed = Family::<ControllerLabel, Gauge>::default();
        registry.register("reconcile", "Reconciles run, by controller", reconciles.clone());
        registry.register(
            "reconcile_errors",
            "Reconciles that failed, by controller and reason",
            errors.clone(),
        );
        registry.register_with_unit(
            "reconcile_duration",
            "Time one reconcile took, by controller",
            prometheus_client::registry::Unit::Seconds,
            durations.clone(),
        );
        registry.register(
            "managed_objects",
            "Objects capn applied for its component resources",
            managed.clone(),
        );
        let tenant_connections = Family::<ConnectionLabels, Counter>::default();
        registry.register(
            "tenant_connections",
            "Connections capn opened to tenants by a path other than dialling their names, by path and result",
            tenant_connections.clone(),
        );
        let watch_failing = Family::<KindLabel, Gauge>::default();
        registry.register(
            "watch_failing",
            "1 while capn's watch of a kind fails (forbidden by RBAC, a resource the API does not serve), else 0",
            watch_failing.clone(),
        );
        let etcd = EtcdSeries::default();
        registry.register_with_unit(
            "etcd_database_size",
            "Size of the largest member's database file (what etcd's quota is compared with), by control plane",
            prometheus_client::registry::Unit::Bytes,
            etcd.db_size.clone(),
        );
        registry.register_with_unit(
            "etcd_database_in_use",
            "Bytes of the largest member's database holding data (the rest is free pages a defragmentation gives back), by control plane",
            prometheus_client::registry::Unit::Bytes,
            etcd.db_size_in_use.clone(),
        );
        registry.register_with_unit(
            "etcd_quota",
            "The members' --quota-backend-bytes, by control plane",
            prometheus_client::registry::Unit::Bytes,
            etcd.quota.clone(),
        );
        registry.register(
            "etcd_nospace",
            "1 while etcd's NOSPACE alarm is raised (writes refused), else 0, by control plane",
            etcd.nospace.clone(),
        );
        registry.register(
            "etcd_defragmentations",
            "Members capn defragmented, by control plane",
            etcd.defragmentations.clone(),
        );
        registry.register(
            "etcd_members",
            "Members the etcd should have (its replicas), by control plane",
            etcd.members.clone(),
        );
        registry.register(
            "etcd_members_healthy",
            "Members whose Status answered, knowing a leader and reporting no error besides alarms, by control plane",
            etcd.members_healthy.clone(),
        );
        registry.register(
            "etcd_has_leader",
            "1 while a member that answered knows a leader, else 0, by control plane",
            etcd.has_leader.clone(),
        );
        registry.register_with_unit(
            "etcd_backup_last_success_timestamp",
            "When the last verified snapshot was taken (Unix time), by control plane",
            prometheus_client::registry::Unit::Seconds,
            etcd.backup_last_success.clone(),
        );
        registry.register_with_unit(
            "etcd_backup_interval",
            "The backup schedule's gap after the last snapshot, by control plane",
            prometheus_client::registry::Unit::Seconds,
            etcd.backup_interval.clone(),
        );
        registry.register(
            "etcd_backup_failing",
            "1 while BackupSucceeded is False with a failure's reason, else 0, by control plane",
            etcd.backup_failing.clone(),
        );
        let control_planes = ControlPlaneSeries::default();
        registry.register(
            "control_plane_ready",
            "1 while every component of the control plane is ready (status.ready), else 0",
            control_planes.ready.clone(),
        );
        registry.register(
            "control_plane_hibernated",
            "1 while the control plane sleeps, falls asleep or wakes up (spec.hibernation), else 0",
            control_planes.hibernated.clone(),
        );
        registry.register_with_unit(
            "certificate_expiry_timestamp",
            "The earliest NotAfter of the control plane's certificates (Unix time)",
            prometheus_client::registry::Unit::Seconds,
            control_planes.certificate_expiry.clone(),
        );
        registry.register_with_unit(
            "certificate_renewal_timestamp",
            "When capn renews the control plane's next certificate (Unix time)",
            prometheus_client::registry::Unit::Seconds,
            control_planes.certificate_renewal.clone(),
        );
        registry.register_with_unit(
            "certificate_renew_before",
            "How long before its NotAfter capn renews a leaf of the control plane's policy",
            prometheus_client::registry::Unit::Seconds,
            control_planes.certificate_renew_before.clone(),
        );
        Self {
            registry,
            etcd,
            control_planes,
            reconciles,
            errors,
            durations,
            managed,
            tenant_connections,
            watch_failing,
            control_planes_seen: Mutex::default(),
            inventory: Mutex::default(),
            ready: AtomicBool::new(false),
            failing_watches: Mutex::default(),
            watch_changes: tokio::sync::watch::Sender::new(0),
        }
    }
}

impl Metrics {
    /// Records one reconcile of `controller` that started at `started`; `error` is the
    /// failure's stable reason, if it failed.
    pub fn observe(&self, controller: &str, started: Instant, error: Option<&str>) {
        let label = ControllerLabel {
            controller: controller.to_string(),
        };
        self.reconciles.get_or_create(&label).inc();
        self.durations
            .get_or_create(&label)
            .observe(started.elapsed().as_secs_f64());
        if let Some(reason) = error {
            self.errors
                .get_or_create(&ErrorLabels {
                    controller: controller.into(),
                    reason: reason.into(),
                })
                .inc();
        }
    }

    /// Records that component resource `key` (namespace/name) of `controller` now manages
    /// `count` objects.
    pub fn set_managed(&self, controller: &str, key: String, count: usize) {
        let Ok(mut inventory) = self.inventory.lock() else {
            return;
        };
        inventory.insert((controller.to_string(), key), count as i64);
        let total: i64 = inventory
            .iter()
            .filter(|((c, _), _)| c == controller)
            .map(|(_, n)| n)
            .sum();
        self.managed
            .get_or_create(&ControllerLabel {
                controller: controller.to_string(),
            })
            .set(total);
    }

    /// Records what one pass read of the etcd of control plane `cluster` in `namespace`.
    /// Read at least every 10 s ([`crate::controllers::component::etcd::space::SPACE_POLL`]).
    pub fn set_etcd_space(&self, namespace: &str, cluster: &str, figures: EtcdSpaceFigures) {
        let labels = self.control_plane(namespace, cluster);
        self.etcd.db_size.get_or_create(&labels).set(figures.db_size);
        self.etcd
            .db_size_in_use
            .get_or_create(&labels)
            .set(figures.db_size_in_use);
        self.etcd.quota.get_or_create(&labels).set(figures.quota);
        self.etcd.nospace.get_or_create(&labels).set(i64::from(figures.nospace));
    }

    /// Records the members of the etcd of control plane `cluster` in `namespace` as one pass
    /// read them (with the space, at least every 10 s while the etcd runs).
    pub fn set_etcd_members(&self, namespace: &str, cluster: &str, figures: EtcdMemberFigures) {
        let labels = self.control_plane(namespace, cluster);
        self.etcd.members.get_or_create(&labels).set(figures.members);
        self.etcd.members_healthy.get_or_create(&labels).set(figures.healthy);
        self.etcd
            .has_leader
            .get_or_create(&labels)
            .set(i64::from(figures.has_leader));
    }

    /// Records the backups of the etcd of control plane `cluster` as its last pass reported
    /// them. A figure that is `None` removes its series (no snapshot yet, no schedule);
    /// `None` (no `spec.backup`) removes all three.
    pub fn set_etcd_backup(&self, namespace: &str, cluster: &str, figures: Option<BackupFigures>) {
        let labels = self.control_plane(namespace, cluster);
        set_or_remove(
            &self.etcd.backup_last_success,
            &labels,
            figures.and_then(|f| f.last_success),
        );
        set_or_remove(&self.etcd.backup_interval, &labels, figures.and_then(|f| f.interval));
        set_or_remove(
            &self.etcd.backup_failing,
            &labels,
            figures.map(|f| i64::from(f.failing)),
        );
    }

    /// Records whether control plane `cluster` in `namespace` is ready, and whether it is
    /// hibernated (not awake: asleep, falling asleep or waking up), which the alerts on
    /// readiness and backups leave alone (deploy/monitoring/rules.yaml).
    pub fn set_control_plane_ready(&self, namespace: &str, cluster: &str, ready: bool, hibernated: bool) {
        let labels = self.control_plane(namespace, cluster);
        self.control_planes.ready.get_or_create(&labels).set(i64::from(ready));
        self.control_planes
            .hibernated
            .get_or_create(&labels)
            .set(i64::from(hibernated));
    }

    /// Records the certificate schedule of control plane `cluster` in `namespace`. A time
    /// that is `None` removes its series.
    pub fn set_certificates(&self, namespace: &str, cluster: &str, figures: CertificateFigures) {
        let labels = self.control_plane(namespace, cluster);
        let series = &self.control_planes;
        set_or_remove(&series.certificate_expiry, &labels, figures.expiry);
        set_or_remove(&series.certificate_renewal, &labels, figures.next_renewal);
        series
            .certificate_renew_before
            .get_or_create(&labels)
            .set(figures.renew_before);
    }

    /// Counts one member of `cluster`'s etcd defragmented.
    pub fn count_etcd_defragmentation(&self, namespace: &str, cluster: &str) {
        self.etcd
            .defragmentations
            .get_or_create(&self.control_plane(namespace, cluster))
            .inc();
    }

    /// Counts one connection to a tenant through `path` (`port-forward`) that `opened` or
    /// failed.
    pub fn count_tenant_connection(&self, path: &str, opened: bool) {
        self.tenant_connections
            .get_or_create(&ConnectionLabels {
                path: path.to_owned(),
                result: if opened { "opened" } else { "failed" }.to_owned(),
            })
            .inc();
    }

    /// Records that the watch of `kind` failed with `error` (each failed attempt; the watch
    /// retries with backoff).
    pub fn watch_failed(&self, kind: &str, error: &dyn std::fmt::Display) {
        let new = {
            let mut failing = self.watches();
            let since = failing.get(kind).map_or_else(Instant::now, |(_, since)| *since);
            failing.insert(kind.to_owned(), (error.to_string(), since)).is_none()
        };
        if new {
            tracing::warn!(%kind, %error, "a watch capn depends on fails: /readyz reports it until it recovers");
            self.watch_failing.get_or_create(&kind_label(kind)).set(1);
            self.watch_changes.send_modify(|n| *n += 1);
        }
    }

    /// Records that the watch of `kind` delivered an event: it works (again).
    pub fn watch_succeeded(&self, kind: &str) {
        let mut failing = self.watches();
        if failing.is_empty() || failing.remove(kind).is_none() {
            return;
        }
        drop(failing);
        tracing::info!(%kind, "a failing watch recovered");
        self.watch_failing.get_or_create(&kind_label(kind)).set(0);
        self.watch_changes.send_modify(|n| *n += 1);
    }

    /// The watches failing for at least [`WATCH_GRACE`], by kind, with their last error.
    pub fn failing_watches(&self) -> BTreeMap<String, String> {
        self.watches()
            .iter()
            .filter(|(_, (_, since))| since.elapsed() >= WATCH_GRACE)
            .map(|(kind, (error, _))| (kind.clone(), error.clone()))
            .collect()
    }

    /// Changes each time a watch starts or stops failing.
    pub fn watch_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.watch_changes.subscribe()
    }

    fn watches(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, (String, Instant)>> {
        self.failing_watches
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Drops every per control plane series (`capn_etcd_*`, `capn_control_plane_*`,
    /// `capn_certificate_*`) of the control planes `exists` says are gone, so that a
    /// deleted tenant neither stays on the dashboards nor keeps an alert firing. Returns how
    /// many control planes' series went. Called by the controllers against their cache of
    /// NestedControlPlanes ([`crate::controllers::forget_deleted_control_planes`]): a deleted
    /// control plane is never reconciled again, so nothing else would remove them.
    pub fn retain_control_planes(&self, exists: impl Fn(&str, &str) -> bool) -> usize {
        let gone: Vec<ControlPlaneLabels> = {
            let mut seen = self.seen();
            let gone = seen
                .iter()
                .filter(|l| !exists(&l.namespace, &l.cluster))
                .cloned()
                .collect::<Vec<_>>();
            for labels in &gone {
                seen.remove(labels);
            }
            gone
        };
        let (etcd, cp) = (&self.etcd, &self.control_planes);
        let gauges = [
            &etcd.db_size,
            &etcd.db_size_in_use,
            &etcd.quota,
            &etcd.nospace,
            &etcd.members,
            &etcd.members_healthy,
            &etcd.has_leader,
            &etcd.backup_last_success,
            &etcd.backup_interval,
            &etcd.backup_failing,
            &cp.ready,
            &cp.hibernated,
            &cp.certificate_expiry,
            &cp.certificate_renewal,
            &cp.certificate_renew_before,
        ];
        for labels in &gone {
            for family in gauges {
                family.remove(labels);
            }
            etcd.defragmentations.remove(labels);
        }
        gone.len()
    }

    /// The labels of control plane `cluster` in `namespace`, noted as one that has series.
    fn control_plane(&self, namespace: &str, cluster: &str) -> ControlPlaneLabels {
        let labels = ControlPlaneLabels {
            namespace: namespace.to_owned(),
            cluster: cluster.to_owned(),
        };
        let mut seen = self.seen();
        if !seen.contains(&labels) {
            seen.insert(labels.clone());
        }
        labels
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, BTreeSet<ControlPlaneLabels>> {
        self.control_planes_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Marks the process ready (`/readyz` answers 200).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// The metrics in Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Sets the series of `labels` to `value`, or removes it when there is no value: an absent
/// series is what an alert's comparison skips, where a 0 would read as 1970.
fn set_or_remove(family: &Family<ControlPlaneLabels, Gauge>, labels: &ControlPlaneLabels, value: Option<i64>) {
    match value {
        Some(value) => {
            family.get_or_create(labels).set(value);
        }
        None => {
            family.remove(labels);
        }
    }
}

async fn metrics(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.encode(),
    )
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(m): State<Arc<Metrics>>) -> (StatusCode, String) {
    let failing = m.failing_watches();
    if !failing.is_empty() {
        let lines: Vec<String> = failing
            .iter()
            .map(|(kind, error)| format!("watch of {kind} failing: {error}"))
            .collect();
        return (StatusCode::SERVICE_UNAVAILABLE, lines.join("\n"));
    }
    if m.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok".to_owned())
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready".to_owned())
    }
}

/// How long a watch must fail before `/readyz` and the control planes' `WatchesHealthy`
/// report it: a shorter failure is a blip the watcher mends by itself (a dropped stream, an
/// apiserver restart), and reporting it would flap readiness and cost two status writes per
/// control plane. `capn_watch_failing` shows every failure at once.
pub const WATCH_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

fn kind_label(kind: &str) -> KindLabel {
    KindLabel { kind: kind.to_owned() }
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `addr` until the task is dropped.
///
/// # Errors
/// When `addr` cannot be bound.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(self::metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(metrics);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    // The bound address, not the asked one: with port 0 the log is where the port shows.
    let addr = listener.local_addr()?;
    tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    axum::serve(listener, app).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_failing_watch_turns_readyz_and_its_gauge_until_it_recovers() {
        let m = Arc::new(Metrics::default());
        m.set_ready(true);
        let mut changes = m.watch_changes();
        m.watch_failed("Secret", &"secrets is forbidden");
        m.watch_failed("Secret", &"secrets is forbidden");
        assert!(changes.has_changed().unwrap());
        assert_eq!(
            *changes.borrow_and_update(),
            1,
            "one change for one watch starting to fail"
        );
        assert_eq!(
            readyz(State(m.clone())).await,
            (StatusCode::OK, "ok".to_owned()),
            "a failure younger than WATCH_GRACE is a blip"
        );
        for (_, since) in m.watches().values_mut() {
            *since -= WATCH_GRACE;
        }
        let (code, body) = readyz(State(m.clone())).await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, "watch of Secret failing: secrets is forbidden");
        assert!(
            m.encode().contains("capn_watch_failing{kind=\"Secret\"} 1"),
            "{}",
            m.encode()
        );
        m.watch_succeeded("StatefulSet");
        assert!(
            !changes.has_changed().unwrap(),
            "a watch that never failed changes nothing"
        );
        m.watch_succeeded("Secret");
        assert!(changes.has_changed().unwrap());
        assert_eq!(readyz(State(m.clone())).await, (StatusCode::OK, "ok".to_owned()));
        assert!(
            m.encode().contains("capn_watch_failing{kind=\"Secret\"} 0"),
            "{}",
            m.encode()
        );
    }

    #[test]
    fn etcd_space_is_one_series_per_control_plane() {
        let m = Metrics::default();
        let figures = EtcdSpaceFigures {
            db_size: 9_000_000,
            db_size_in_use: 7_000_000,
            quota: 8_388_608,
            nospace: true,
        };
        m.set_etcd_space("tenant-a", "demo", figures);
        m.set_etcd_space(
            "tenant-a",
            "demo",
            EtcdSpaceFigures {
                nospace: false,
                ..figures
            },
        );
        m.count_etcd_defragmentation("tenant-a", "demo");
        let text = m.encode();
        let labels = "{namespace=\"tenant-a\",cluster=\"demo\"}";
        for line in [
            format!("capn_etcd_database_size_bytes{labels} 9000000"),
            format!("capn_etcd_database_in_use_bytes{labels} 7000000"),
            format!("capn_etcd_quota_bytes{labels} 8388608"),
            format!("capn_etcd_nospace{labels} 0"),
            format!("capn_etcd_defragmentations_total{labels} 1"),
        ] {
            assert!(text.contains(&line), "{line} in\n{text}");
        }
        assert_eq!(text.matches("capn_etcd_quota_bytes{").count(), 1, "{text}");
    }

    #[test]
    fn control_plane_series_are_one_per_control_plane_and_absent_without_a_value() {
        let m = Metrics::default();
        let labels = "{namespace=\"tenant-a\",cluster=\"demo\"}";
        m.set_control_plane_ready("tenant-a", "demo", false, true);
        m.set_control_plane_ready("tenant-a", "demo", true, false);
        m.set_certificates(
            "tenant-a",
            "demo",
            CertificateFigures {
                expiry: Some(1_900_000_000),
                next_renewal: Some(1_890_000_000),
                renew_before: 10_512_000,
            },
        );
        m.set_etcd_members(
            "tenant-a",
            "demo",
            EtcdMemberFigures {
                members: 3,
                healthy: 2,
                has_leader: true,
            },
        );
        m.set_etcd_backup(
            "tenant-a",
            "demo",
            Some(BackupFigures {
                last_success: Some(1_800_000_000),
                interval: Some(3600),
                failing: true,
            }),
        );
        let text = m.encode();
        for line in [
            format!("capn_control_plane_ready{labels} 1"),
            format!("capn_control_plane_hibernated{labels} 0"),
            format!("capn_certificate_expiry_timestamp_seconds{labels} 1900000000"),
            format!("capn_certificate_renewal_timestamp_seconds{labels} 1890000000"),
            format!("capn_certificate_renew_before_seconds{labels} 10512000"),
            format!("capn_etcd_members{labels} 3"),
            format!("capn_etcd_members_healthy{labels} 2"),
            format!("capn_etcd_has_leader{labels} 1"),
            format!("capn_etcd_backup_last_success_timestamp_seconds{labels} 1800000000"),
            format!("capn_etcd_backup_interval_seconds{labels} 3600"),
            format!("capn_etcd_backup_failing{labels} 1"),
            "# TYPE capn_etcd_backup_last_success_timestamp_seconds gauge".to_owned(),
            "# UNIT capn_certificate_renew_before_seconds seconds".to_owned(),
        ] {
            assert!(text.contains(&line), "{line} in\n{text}");
        }
        assert_eq!(text.matches("capn_control_plane_ready{").count(), 1, "{text}");
        // A schedule removed, the renewal not known: their series go, the rest stay.
        m.set_etcd_backup(
            "tenant-a",
            "demo",
            Some(BackupFigures {
                last_success: Some(1_800_000_000),
                interval: None,
                failing: false,
            }),
        );
        m.set_certificates(
            "tenant-a",
            "demo",
            CertificateFigures {
                expiry: Some(1_900_000_000),
                next_renewal: None,
                renew_before: 10_512_000,
            },
        );
        let text = m.encode();
        assert!(!text.contains("capn_etcd_backup_interval_seconds{"), "{text}");
        assert!(!text.contains("capn_certificate_renewal_timestamp_seconds{"), "{text}");
        assert!(text.contains(&format!("capn_etcd_backup_failing{labels} 0")), "{text}");
        assert!(
            text.contains(&format!("capn_certificate_expiry_timestamp_seconds{labels} 1900000000")),
            "{text}"
        );
        m.set_etcd_backup("tenant-a", "demo", None);
        assert!(!m.encode().contains("capn_etcd_backup_failing{"), "spec.backup removed");
    }

    /// Every series of a control plane that is gone goes, every family at once; another's
    /// stay; and a control plane recorded again afterwards is served again.
    #[test]
    fn series_of_control_planes_that_are_gone_are_dropped() {
        let m = Metrics::default();
        for cluster in ["demo", "kept"] {
            m.set_control_plane_ready("tenant-a", cluster, false, false);
            m.set_certificates(
                "tenant-a",
                cluster,
                CertificateFigures {
                    expiry: Some(1_900_000_000),
                    next_renewal: Some(1_890_000_000),
                    renew_before: 10_512_000,
                },
            );
            m.set_etcd_space("tenant-a", cluster, EtcdSpaceFigures::default());
            m.set_etcd_members("tenant-a", cluster, EtcdMemberFigures::default());
            m.set_etcd_backup(
                "tenant-a",
                cluster,
                Some(BackupFigures {
                    last_success: Some(1),
                    interval: Some(1),
                    failing: false,
                }),
            );
            m.count_etcd_defragmentation("tenant-a", cluster);
        }
        let before = m.encode();
        let series = |text: &str, cluster: &str| {
            let labels = format!("{{namespace=\"tenant-a\",cluster=\"{cluster}\"}}");
            text.lines().filter(|l| l.contains(&labels)).count()
        };
        assert_eq!(series(&before, "demo"), 16, "{before}");
        assert_eq!(m.retain_control_planes(|_, cluster| cluster == "kept"), 1);
        let after = m.encode();
        assert_eq!(series(&after, "demo"), 0, "{after}");
        assert_eq!(series(&after, "kept"), 16, "{after}");
        assert_eq!(m.retain_control_planes(|_, cluster| cluster == "kept"), 0, "once only");
        m.set_control_plane_ready("tenant-a", "demo", true, false);
        assert_eq!(series(&m.encode(), "demo"), 2, "ready and hibernated again");
    }

    #[test]
    fn metrics_count_reconciles_errors_and_managed_objects() {
        let m = Metrics::default();
        m.observe("etcd", Instant::now(), None);
        m.observe("etcd", Instant::now(), Some("ApplyFailed"));
        m.set_managed("etcd", "ns/a".into(), 2);
        m.set_managed("etcd", "ns/b".into(), 3);
        m.set_managed("etcd", "ns/a".into(), 1);
        let text = m.encode();
        assert!(text.contains("capn_reconcile_total{controller=\"etcd\"} 2"), "{text}");
        assert!(
            text.contains("capn_reconcile_errors_total{controller=\"etcd\",reason=\"ApplyFailed\"} 1"),
            "{text}"
        );
        assert!(text.contains("capn_managed_objects{controller=\"etcd\"} 4"), "{text}");
        assert!(
            text.contains("capn_reconcile_duration_seconds_count{controller=\"etcd\"} 2"),
            "{text}"
        );
    }
}
