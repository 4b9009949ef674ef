//! The reconcilers (docs/design.md §5, §7), on kube-runtime. Each follows read → plan (pure,
//! [`crate::plan`]) → apply (the only writer) → report status. By concern
//! (docs/developer/modules.md):
//!
//! - [`control_plane`]: NestedControlPlane — CAs, component resources, endpoint,
//!   `<cluster>-kubeconfig`, aggregated status; its CA [`control_plane::rotation`] and stepped
//!   [`control_plane::upgrade`].
//! - [`component`]: NestedEtcd, NestedAPIServer, NestedControllerManager — one generic
//!   reconciler behind the [`component::ComponentResource`] trait; each kind's steps in
//!   [`component::etcd`] (with its membership and backups), [`component::apiserver`] and
//!   [`component::controller_manager`].
//! - [`cluster`]: NestedCluster — the CAPI infrastructure object.
//! - [`public_crds`]: the super cluster's public CRDs, copied into every tenant.
//! - [`syncer`]: the tenants' pods, run in the super cluster (docs/design.md §11).
//! - [`shared`]: what every reconciler uses (watch caches, certificate Secrets, Events,
//!   reads, the status memo); [`round`]: what every step of a pass shares (the clock, the
//!   gate, the recheck schedule). Neither imports a reconciler.

pub mod cluster;
pub mod component;
pub mod control_plane;
mod error;
pub mod public_crds;
pub mod round;
pub mod shared;
pub mod syncer;
pub mod watch_health;

use std::sync::Arc;
use std::time::Duration;

use kube::{Client, ResourceExt};

pub use error::ReconcileError;

use crate::apply::Applier;
use crate::channel::ChannelRegistry;
use crate::telemetry::Metrics;
use component::etcd::backup;
use shared::{cache, certificates, events, status_memo};

/// Which controllers run. Each can be switched off so that an out-of-tree controller can
/// replace it (docs/design.md §7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EnabledControllers {
    pub control_plane: bool,
    pub etcd: bool,
    pub apiserver: bool,
    pub controller_manager: bool,
    pub cluster: bool,
    /// The public CRD sync (docs/design.md §7).
    pub public_crds: bool,
    /// The syncer of the tenants' workloads (docs/design.md §11).
    pub syncer: bool,
}

impl Default for EnabledControllers {
    fn default() -> Self {
        Self {
            control_plane: true,
            etcd: true,
            apiserver: true,
            controller_manager: true,
            cluster: true,
            public_crds: true,
            syncer: true,
        }
    }
}

/// Process-wide settings of the controllers.
#[derive(Clone, Debug)]
pub struct Settings {
    /// DNS domain of the super cluster (for the names tenant pods have there).
    pub super_dns_domain: String,
    /// Watch only this namespace; `None` watches all.
    pub namespace: Option<String>,
    /// Reconcile only resources labelled `cluster.x-k8s.io/watch-filter=<value>` (Cluster
    /// API's convention for several instances sharing a cluster); `None` reconciles all.
    pub watch_filter: Option<String>,
    pub enabled: EnabledControllers,
    /// Adjusts the client configuration built from a tenant's kubeconfig before the public
    /// CRD sync connects (tests reach tenants at addresses their kubeconfig cannot name).
    pub tenant_config_hook: Option<TenantConfigHook>,
    /// Lifetime of leaf certificates when a control plane does not set
    /// `certificateValidityPeriod` (`capn run --certificate-validity`); `None` is one year.
    pub certificate_validity: Option<std::time::Duration>,
    /// capn's own pods, which the tenants' NetworkPolicies admit to etcd and the apiserver;
    /// `None` when capn runs outside the super cluster.
    pub capn_pods: Option<crate::plan::CapnPods>,
    /// How long one upgrade step may take before it is marked failed, and how far ahead the
    /// preflight looks for certificate expiry and renewal (`capn run
    /// --upgrade-step-timeout`; docs/design.md §10).
    pub upgrade_step_timeout: std::time::Duration,
    /// capn's own image, which the etcd restore init containers run (`capn run
    /// --capn-image`, default [`DEFAULT_CAPN_IMAGE`]).
    pub capn_image: String,
    /// Name → address overrides for dialing tenant etcd members and apiservers (`capn run
    /// --etcd-hosts-file`, [`crate::etcd::HostsFile`]); `None` dials the names, which cluster
    /// DNS answers in a super cluster.
    pub etcd_hosts_file: Option<std::path::PathBuf>,
    /// How capn connects to tenants (`capn run --tenant-connection`, [`crate::reach`]).
    pub tenant_connection: crate::reach::TenantConnection,
    /// The super cluster's client configuration for port-forwards to tenants (HTTP/1.1
    /// upgrades); `None` allows none, so a tenant name that does not resolve is an error.
    pub super_config: Option<kube::Config>,
    /// How often the syncer's patrol runs (`capn run --syncer-patrol-interval`, default
    /// [`syncer::DEFAULT_PATROL`]).
    pub syncer_patrol: std::time::Duration,
    /// The tenant Nodes' kubelet API, served by the syncer (`capn run
    /// --kubelet-bind-address`, `--kubelet-advertise-address`; [`crate::kubelet`]); `None`
    /// serves none, and tenant Nodes name no kubelet API.
    pub kubelet: Option<crate::kubelet::KubeletEndpoint>,
    /// The tenants' cluster DNS, served by the syncer ([`crate::dns`]); `None` serves none,
    /// and tenant pods keep the DNS settings they were written with (a `ClusterFirst` pod
    /// then resolves through the super cluster's DNS, which knows no tenant Service).
    pub dns: Option<crate::dns::DnsEndpoint>,
}

/// Default of [`Settings::upgrade_step_timeout`]: a step rolls three StatefulSets, each
/// waiting for its pods' probes; half an hour leaves room for image pulls on a busy node.
pub const DEFAULT_UPGRADE_STEP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30 * 60);
/// The image capn's clusterctl components deploy by default (`${CAPN_IMAGE}`), for this
/// release.
pub const DEFAULT_CAPN_IMAGE: &str = concat!("ghcr.io/capn/capn:v", env!("CARGO_PKG_VERSION"));

/// See [`Settings::tenant_config_hook`].
#[derive(Clone)]
pub struct TenantConfigHook(pub Arc<TenantConfigFn>);

/// The function inside a [`TenantConfigHook`].
pub type TenantConfigFn = dyn Fn(&crate::api::NestedControlPlane, &mut kube::Config) + Send + Sync;

impl std::fmt::Debug for TenantConfigHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TenantConfigHook")
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            super_dns_domain: crate::plan::DEFAULT_DNS_DOMAIN.to_string(),
            namespace: None,
            watch_filter: None,
            enabled: EnabledControllers::default(),
            tenant_config_hook: None,
            certificate_validity: None,
            capn_pods: None,
            upgrade_step_timeout: DEFAULT_UPGRADE_STEP_TIMEOUT,
            capn_image: DEFAULT_CAPN_IMAGE.to_string(),
            etcd_hosts_file: None,
            tenant_connection: crate::reach::TenantConnection::Auto,
            super_config: None,
            dns: None,
            syncer_patrol: syncer::DEFAULT_PATROL,
            kubelet: None,
        }
    }
}

/// What every reconcile gets: the client, the applier, the channels, the settings and the
/// shared watch caches.
pub struct Context {
    pub client: Client,
    pub applier: Applier,
    pub channels: Arc<ChannelRegistry>,
    pub settings: Settings,
    pub recorder: events::Recorder,
    pub metrics: Arc<Metrics>,
    pub caches: Arc<cache::Caches>,
    /// What capn verified about certificate Secrets, per process.
    pub verified: certificates::VerifiedSecrets,
    /// The CAs capn created or read, per process (their key pairs, bounded).
    pub authorities: certificates::KeptAuthorities,
    /// The last status written per object, so a lagging cache causes no repeated write.
    pub status_memo: status_memo::StatusMemo,
    /// Clients of the tenants' etcd, cached per cluster ([`crate::etcd`]).
    pub etcd: crate::etcd::EtcdClients,
    /// How tenants are dialled ([`crate::reach`]); the etcd clients share it.
    pub reach: Arc<crate::reach::Reach>,
    /// Snapshot jobs running in the background ([`backup::Backups`]).
    pub backups: backup::Backups,
}

impl Context {
    pub fn new(
        client: Client,
        channels: Arc<ChannelRegistry>,
        settings: Settings,
        metrics: Arc<Metrics>,
        caches: Arc<cache::Caches>,
    ) -> Self {
        let reach = Arc::new(crate::reach::Reach::new(
            settings.tenant_connection,
            settings.super_config.clone(),
            metrics.clone(),
        ));
        let etcd = crate::etcd::EtcdClients::new(settings.etcd_hosts_file.clone()).with_reach(reach.clone());
        Self {
            reach,
            applier: Applier::new(client.clone()),
            recorder: events::Recorder::new(client.clone(), "capn", std::env::var("POD_NAME").ok()),
            client,
            channels,
            settings,
            metrics,
            caches,
            verified: Default::default(),
            authorities: Default::default(),
            status_memo: Default::default(),
            etcd,
            backups: Default::default(),
        }
    }

    /// The watcher configuration of the resources this instance reconciles
    /// (`--watch-filter`).
    pub fn primary_watch_config(&self) -> kube::runtime::watcher::Config {
        primary_watch_config(&self.settings)
    }

    /// An API for `K` in the watched namespace, or in all namespaces.
    pub fn api<K>(&self) -> kube::Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        match &self.settings.namespace {
            Some(ns) => kube::Api::namespaced(self.client.clone(), ns),
            None => kube::Api::all(self.client.clone()),
        }
    }
}

/// The most reconciles one controller runs at once (kube-runtime's `concurrency`). Each is
/// bound by the super cluster's API server, not by capn's CPU; with four controllers this
/// keeps at most 32 in flight, so that a thousand control planes created together queue in
/// capn instead of flooding the API server. 8 rather than 16: the same time to all ready
/// in the provisioning benchmark, less peak RSS (fewer requests and responses in flight at
/// once) and about one request less per control plane (more of a control plane's changes
/// coalesce into one reconcile).
pub const MAX_CONCURRENT_RECONCILES: u16 = 8;

/// The configuration every controller runs with.
pub(crate) fn controller_config() -> kube::runtime::controller::Config {
    kube::runtime::controller::Config::default().concurrency(MAX_CONCURRENT_RECONCILES)
}

/// Label that assigns a resource to one of several capn instances (CAPI convention).
pub const WATCH_FILTER_LABEL: &str = "cluster.x-k8s.io/watch-filter";

/// Runs one reconcile and records its count, duration and failure reason.
pub(crate) async fn instrumented<F>(
    ctx: &Context,
    controller: &str,
    reconcile: F,
) -> Result<kube::runtime::controller::Action, ReconcileError>
where
    F: std::future::Future<Output = Result<kube::runtime::controller::Action, ReconcileError>>,
{
    let started = std::time::Instant::now();
    let result = reconcile.await;
    ctx.metrics
        .observe(controller, started, result.as_ref().err().map(ReconcileError::reason));
    result
}

fn primary_watch_config(settings: &Settings) -> kube::runtime::watcher::Config {
    let config = kube::runtime::watcher::Config::default();
    match watch_filter_selector(settings) {
        Some(selector) => config.labels(&selector),
        None => config,
    }
}

/// The label selector of `--watch-filter` (`cluster.x-k8s.io/watch-filter=VALUE`), if set.
fn watch_filter_selector(settings: &Settings) -> Option<String> {
    settings
        .watch_filter
        .as_ref()
        .map(|value| format!("{WATCH_FILTER_LABEL}={value}"))
}

/// Runs every enabled controller until all of them stop (they stop on SIGTERM/ctrl-c, or
/// when the future is dropped). The watch caches are filled first, once for all of them.
///
/// # Panics
/// When a controller panicked (a bug): the panic is resumed here, at once, so that the
/// process ends (the release build aborts at the panic itself, `panic = "abort"`).
pub async fn run(client: Client, channels: Arc<ChannelRegistry>, settings: Settings, metrics: Arc<Metrics>) {
    use crate::api::{NestedAPIServer, NestedControllerManager, NestedEtcd};
    let enabled = settings.enabled;
    let reads_caches = enabled.control_plane || enabled.etcd || enabled.apiserver || enabled.controller_manager;
    // Beside the caches, not behind them: it reports a watch whose first list never comes.
    let health = tokio::spawn(watch_health::run(
        client.clone(),
        settings.namespace.clone(),
        watch_filter_selector(&settings),
        metrics.clone(),
    ));
    let _health = AbortOnDrop(vec![health.abort_handle()]);
    let (caches, subscriptions, _drivers) = cache::Caches::start(
        &client,
        settings.namespace.as_deref(),
        primary_watch_config(&settings),
        reads_caches,
        &metrics,
    )
    .await;
    let ctx = Arc::new(Context::new(client, channels, settings, metrics, caches));
    let mut tasks = Vec::new();
    if enabled.control_plane {
        tasks.push(tokio::spawn(control_plane::run(ctx.clone(), &subscriptions)));
    }
    if enabled.etcd {
        tasks.push(tokio::spawn(component::run::<NestedEtcd>(ctx.clone(), &subscriptions)));
    }
    if enabled.apiserver {
        tasks.push(tokio::spawn(component::run::<NestedAPIServer>(
            ctx.clone(),
            &subscriptions,
        )));
    }
    if enabled.controller_manager {
        tasks.push(tokio::spawn(component::run::<NestedControllerManager>(
            ctx.clone(),
            &subscriptions,
        )));
    }
    if enabled.cluster {
        let control_planes = reads_caches.then(|| subscriptions.control_planes.clone());
        tasks.push(tokio::spawn(cluster::run(ctx.clone(), control_planes)));
    }
    // Subscriptions nobody took must not hold up the shared watches.
    drop(subscriptions);
    if enabled.public_crds {
        tasks.push(tokio::spawn(public_crds::run(ctx.clone())));
    }
    if enabled.syncer {
        tasks.push(tokio::spawn(syncer::run(ctx.clone())));
    }
    // Not one of `tasks`: it never ends by itself, and the controllers' end (on a signal)
    // ends `run`, which aborts it.
    let forget = reads_caches.then(|| tokio::spawn(forget_deleted_control_planes(ctx.clone())));
    let _forget = AbortOnDrop(forget.iter().map(|t| t.abort_handle()).collect());
    // Abort the others when this future is dropped (tests restart controllers this way).
    let _guard = AbortOnDrop(tasks.iter().map(|t| t.abort_handle()).collect());
    join_controllers(tasks).await;
}

/// How often [`forget_deleted_control_planes`] looks: an alert on a deleted tenant stops
/// within this (plus the scrape interval).
const FORGET_DELETED_EVERY: Duration = Duration::from_secs(10);

/// Drops the metric series of control planes that no longer exist, every
/// [`FORGET_DELETED_EVERY`], by the cache of NestedControlPlanes (no request). A deleted
/// control plane is never reconciled again, so without this its series (a `0` readiness
/// that keeps `CapnControlPlaneNotReady` firing, an old certificate expiry) would stay until
/// capn restarts. Series are keyed by the control plane's namespace and cluster name
/// (docs/operations/metrics.md), which every component shares.
pub async fn forget_deleted_control_planes(ctx: Arc<Context>) {
    let mut every = tokio::time::interval(FORGET_DELETED_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let live: std::collections::HashSet<(String, String)> = ctx
            .caches
            .control_planes
            .state()
            .iter()
            .map(|ncp| (ncp.namespace().unwrap_or_default(), shared::read::cluster_name(&**ncp)))
            .collect();
        let gone = ctx
            .metrics
            .retain_control_planes(|ns, cluster| live.contains(&(ns.to_owned(), cluster.to_owned())));
        if gone > 0 {
            tracing::debug!(
                control_planes = gone,
                "dropped the metric series of deleted control planes"
            );
        }
    }
}

/// Waits until every task in `tasks` has ended, and resumes the first panic among them as
/// soon as it happens. A controller that panicked is gone for good: the panic is carried on
/// so that the process ends and its Deployment starts it again, rather than run on with the
/// probes healthy and one kind no longer reconciled.
async fn join_controllers(tasks: Vec<tokio::task::JoinHandle<()>>) {
    let mut running: futures::stream::FuturesUnordered<_> = tasks.into_iter().collect();
    while let Some(ended) = futures::StreamExt::next(&mut running).await {
        if let Err(error) = ended
            && error.is_panic()
        {
            std::panic::resume_unwind(error.into_panic());
        }
    }
}

/// Tasks aborted when this is dropped: a task spawned for something's lifetime ends with it.
pub(crate) struct AbortOnDrop(pub Vec<tokio::task::AbortHandle>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for handle in &self.0 {
            handle.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::FutureExt;

    use super::join_controllers;

    /// A panic in one controller ends the wait at once, while the others still run, and
    /// carries the panic's own message on.
    #[tokio::test]
    async fn a_panicking_controller_ends_the_wait_at_once_with_its_panic() {
        let forever = tokio::spawn(futures::future::pending::<()>());
        let panics = tokio::spawn(async { panic!("a bug in a reconciler") });
        let waited = tokio::time::timeout(
            Duration::from_secs(30),
            std::panic::AssertUnwindSafe(join_controllers(vec![forever, panics])).catch_unwind(),
        )
        .await
        .expect("the wait ends without waiting for the controller that still runs");
        let payload = waited.expect_err("the panic is resumed");
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"a bug in a reconciler"));
    }

    /// Controllers that end without a panic (on a signal) end the wait once all have.
    #[tokio::test]
    async fn controllers_that_stop_end_the_wait_once_all_have() {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let first = tokio::spawn(async {});
        let second = tokio::spawn(async move { drop(stopped.await) });
        let wait = tokio::spawn(join_controllers(vec![first, second]));
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!wait.is_finished(), "one controller still runs");
        stop.send(()).unwrap();
        wait.await.expect("no panic");
    }
}
