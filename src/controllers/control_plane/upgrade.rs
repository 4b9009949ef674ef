//! The NestedControlPlane's stepped upgrade (docs/design.md §10): plans the path when the
//! requested release changes, runs the preflight before each step, starts the step (the
//! components follow [`crate::upgrade::components_version`]) and records its progress.
//! The decisions are pure ([`crate::upgrade`]); this module reads and reports.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use semver::Version;

use super::components::Components;
use super::scope::Round;
use crate::api::{NestedControlPlaneStatus, PreflightCheck, PreflightStatus, RemovedApi, UpgradeStatus};
use crate::channel::{ChannelError, DEFAULT_CHANNEL};
use crate::controllers::component::ComponentResource;
use crate::controllers::{Context, events};
use crate::plan::{ClusterSettings, resolve};
use crate::status::{ConditionUpdate, Reason, SYNCED, UPGRADE_PREFLIGHT, UPGRADING};
use crate::upgrade::preflight::{DeprecatedApi, certificate_blocker, deprecated_apis, removed_by};
use crate::upgrade::{
    ACKNOWLEDGE_ANNOTATION, ComponentProgress, HOLD_ANNOTATION, Next, RETRY_ANNOTATION, RunningReleases, acknowledged,
    advance, phase, plan_path, preflight_reason, record, record_preflight, start_step,
};

/// How often a failing preflight looks again (it reads the tenant's `/metrics`, not the
/// super cluster).
pub(super) const PREFLIGHT_RETRY: Duration = Duration::from_secs(20);

/// Moves the upgrade of the control plane one reconcile forward and sets its conditions.
/// Returns when to look again, if sooner than a component change would wake the
/// controller.
pub(super) async fn step(
    round: &Round<'_>,
    components: &Components,
    status: &mut NestedControlPlaneStatus,
) -> Option<Duration> {
    // Before the control plane first ran, the components come up on spec.version directly.
    if !status.initialized || running_version(components.apiserver.as_ref()).is_none() {
        return None;
    }
    let target = match target_release(round) {
        Ok(target) => target,
        // The NestedControlPlane's Synced condition already reports bad input; the
        // components keep their release.
        Err(e) => {
            round.set(
                status,
                ConditionUpdate::error(UPGRADING, false, e.reason(), e.to_string()),
            );
            return None;
        }
    };
    if status.upgrade.as_ref().map(|u| &u.target) != Some(&target.to_string()) {
        plan(round, components, status).await?;
    }
    let Some(mut upgrade) = status.upgrade.take() else {
        round.set(
            status,
            ConditionUpdate::new(UPGRADING, false, Reason::UpToDate, format!("runs {target}")),
        );
        return None;
    };
    let timeout = round.ctx.settings.upgrade_step_timeout;
    let hold = round.ncp.annotations().contains_key(HOLD_ANNOTATION);
    let retry = round.ncp.annotations().get(RETRY_ANNOTATION).map(String::as_str);
    let phase_before = upgrade.phase.clone();
    let progress = progress(round, components, &upgrade);
    let next = advance(&mut upgrade, &progress, hold, retry, &round.now.k8s, timeout);
    let preflight_passed = match next {
        Next::Preflight(index) => Some(preflight_and_start(round, status, &mut upgrade, index).await),
        _ => None,
    };
    if next == Next::Completed && phase_before != phase::COMPLETED {
        publish(
            round,
            Reason::UpgradeCompleted,
            format!("upgrade from {} to {} completed", upgrade.from, upgrade.target),
        )
        .await;
    }
    round.set(status, upgrading_condition(&upgrade));
    if let Some(p) = &upgrade.preflight {
        round.set(status, preflight_condition(p));
    }
    status.upgrade = Some(upgrade);
    look_again(&next, preflight_passed, timeout)
}

/// The release of a component, as it reports it.
fn running_version<K: ComponentResource>(component: Option<&K>) -> Option<Version> {
    component
        .and_then(|c| c.component_status())
        .and_then(|s| s.version.as_deref())
        .and_then(|v| Version::parse(v).ok())
}

/// The control plane's channel.
fn channel_name(cluster: &ClusterSettings) -> &str {
    cluster
        .channel
        .as_deref()
        .filter(|c| !c.is_empty())
        .unwrap_or(DEFAULT_CHANNEL)
}

/// The Kubernetes release the spec asks for, resolved in the channel.
fn target_release(round: &Round<'_>) -> Result<Version, ChannelError> {
    round.ctx.channels.get(channel_name(round.cluster)).and_then(|c| {
        c.resolve(
            crate::component::ComponentKind::ApiServer,
            round.cluster.kubernetes_version.as_deref(),
            None,
        )
    })
}

/// Plans the path from what runs to the requested release (docs/design.md §10), replacing
/// the recorded one; a step in flight is carried over. `None` when the path is refused
/// (before anything moves: the components keep following the recorded path, or what
/// runs), with the conditions that say so, or when the channel is unknown.
async fn plan(round: &Round<'_>, components: &Components, status: &mut NestedControlPlaneStatus) -> Option<()> {
    let running = RunningReleases {
        kubernetes: [
            running_version(components.apiserver.as_ref()),
            running_version(components.controller_manager.as_ref()),
        ]
        .into_iter()
        .flatten()
        .min(),
        etcd: running_version(components.etcd.as_ref()),
    };
    let pinned = components.etcd.as_ref().and_then(|e| e.component().version.as_deref());
    let channel = round.ctx.channels.get(channel_name(round.cluster)).ok()?;
    match plan_path(channel, &running, round.cluster.kubernetes_version.as_deref(), pinned) {
        Err(e) => {
            round.set(
                status,
                ConditionUpdate::error(UPGRADING, false, e.reason(), e.to_string()),
            );
            round.set(status, ConditionUpdate::error(SYNCED, false, e.reason(), e.to_string()));
            return None;
        }
        Ok(path) if path.steps.is_empty() => status.upgrade = None,
        Ok(path) => {
            let mut planned = record(&path);
            crate::upgrade::carry_step_in_flight(status.upgrade.as_deref(), &mut planned, &round.now.k8s);
            publish(
                round,
                Reason::UpgradePlanned,
                format!("upgrade planned: {}", path.summary()),
            )
            .await;
            status.upgrade = Some(Box::new(planned));
        }
    }
    Some(())
}

/// How each component stands against the step that runs (the first not yet succeeded).
fn progress(round: &Round<'_>, components: &Components, upgrade: &UpgradeStatus) -> Vec<ComponentProgress> {
    upgrade
        .steps
        .iter()
        .find(|s| s.state != crate::upgrade::state::SUCCEEDED)
        .map(|s| {
            let mut step_cluster = round.cluster.clone();
            step_cluster.kubernetes_version = Some(s.kubernetes.clone());
            component_progress(round.ctx, &step_cluster, components, s.start_time.as_ref())
        })
        .unwrap_or_default()
}

/// Runs the preflight before the step at `index` and starts the step when it passes.
/// Returns whether it passed.
async fn preflight_and_start(
    round: &Round<'_>,
    status: &NestedControlPlaneStatus,
    upgrade: &mut UpgradeStatus,
    index: usize,
) -> bool {
    let step = upgrade.steps[index].kubernetes.clone();
    let result = preflight(round, status, &step).await;
    let passed = result.passed;
    let summary = preflight_summary(&result);
    record_preflight(upgrade, result, &round.now.k8s);
    if passed {
        start_step(upgrade, index, &round.now.k8s);
        let total = upgrade.steps.len();
        let message = format!(
            "step {}/{total} to Kubernetes {step} started; preflight: {summary}",
            index + 1
        );
        publish(round, Reason::UpgradeStepStarted, message).await;
    }
    passed
}

/// An Event about the upgrade on the control plane.
async fn publish(round: &Round<'_>, reason: Reason, message: String) {
    events::publish(round.ctx, round.ncp, None, reason, message, "Upgrade").await;
}

/// The Upgrading condition of the recorded upgrade's phase.
pub(super) fn upgrading_condition(upgrade: &UpgradeStatus) -> ConditionUpdate {
    let message = upgrade.message.clone();
    match upgrade.phase.as_str() {
        phase::UPGRADING => ConditionUpdate::new(UPGRADING, true, Reason::Upgrading, message),
        phase::PREFLIGHT => ConditionUpdate::new(UPGRADING, true, Reason::Preflight, message),
        // The UpgradePreflight condition carries the warning; this one waits.
        phase::PREFLIGHT_FAILED => ConditionUpdate::new(UPGRADING, false, Reason::WaitingForPreflight, message),
        phase::HELD => ConditionUpdate::new(UPGRADING, false, Reason::UpgradeHeld, message),
        phase::FAILED => ConditionUpdate::new(UPGRADING, false, Reason::UpgradeStepFailed, message),
        _ => ConditionUpdate::new(UPGRADING, false, Reason::Completed, message),
    }
}

/// The UpgradePreflight condition of the last preflight.
fn preflight_condition(p: &PreflightStatus) -> ConditionUpdate {
    ConditionUpdate::new(
        UPGRADE_PREFLIGHT,
        p.passed,
        preflight_reason(p),
        format!("before the step to {}: {}", p.step, preflight_summary(p)),
    )
}

/// When to look again, sooner than a component change would: a failed preflight after
/// [`PREFLIGHT_RETRY`]; a running step by its deadline, which no watch reports.
pub(super) fn look_again(next: &Next, preflight_passed: Option<bool>, timeout: Duration) -> Option<Duration> {
    match next {
        Next::Preflight(_) if preflight_passed == Some(false) => Some(PREFLIGHT_RETRY),
        Next::Running => Some(timeout.min(Duration::from_secs(60))),
        _ => None,
    }
}

/// How each component stands against the step whose cluster settings are `step_cluster`
/// ([`progress_of`]).
fn component_progress(
    ctx: &Context,
    step_cluster: &ClusterSettings,
    components: &Components,
    since: Option<&Time>,
) -> Vec<ComponentProgress> {
    vec![
        progress_of(ctx, step_cluster, components.etcd.as_ref(), since),
        progress_of(ctx, step_cluster, components.apiserver.as_ref(), since),
        progress_of(ctx, step_cluster, components.controller_manager.as_ref(), since),
    ]
}

/// How a component stands against the step whose cluster settings are `step_cluster`:
/// done when ready on its current generation and running the release the step asks of it
/// (its own pinned `version` if it has one); failed when it reports a refusal or an error
/// that does not pass by itself (a `Synced=False` other than an API hiccup or the skew wait
/// of the ordered upgrade) since the step started.
fn progress_of<K: ComponentResource>(
    ctx: &Context,
    step_cluster: &ClusterSettings,
    component: Option<&K>,
    since: Option<&Time>,
) -> ComponentProgress {
    let name = K::KIND.as_str().to_string();
    let Some(component) = component else {
        return ComponentProgress {
            component: name,
            done: false,
            message: "does not exist".into(),
            failure: None,
        };
    };
    let expected = resolve(&ctx.channels, step_cluster, K::KIND, component.component())
        .map(|r| r.version.to_string())
        .ok();
    let status = component.component_status();
    let generation = component.meta().generation;
    let done = status.is_some_and(|s| {
        s.ready && s.observed_generation == generation && s.version.is_some() && s.version == expected
    });
    let failure = status
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == SYNCED && c.status == "False"))
        // An API hiccup passes by itself; `SkewNotAllowed` is how the controller-manager
        // waits, within a step, for the apiserver to run the new minor first.
        .filter(|c| {
            !matches!(c.reason.as_str(), "APIError" | "ApplyFailed" | "SkewNotAllowed")
                && crate::status::is_failure_reason(&c.reason)
        })
        .filter(|c| since.is_none_or(|since| c.last_transition_time >= *since))
        .map(|c| format!("{}: {}", c.reason, c.message));
    let message = match status {
        Some(s) if s.version != expected => format!(
            "runs {}, moving to {}",
            s.version.clone().unwrap_or_else(|| "nothing".into()),
            expected.clone().unwrap_or_default()
        ),
        Some(s) if !s.ready => format!("is not ready on {}", expected.clone().unwrap_or_default()),
        Some(_) => "has not observed its latest spec".into(),
        None => "has not reported".into(),
    };
    ComponentProgress {
        component: name,
        done,
        message,
        failure,
    }
}

/// The checks before the step to `step` (a Kubernetes release): every component ready and
/// etcd healthy, no certificate expiring or renewed within the step's time limit, and no API
/// in use that the step's release removes (unless acknowledged).
async fn preflight(round: &Round<'_>, status: &NestedControlPlaneStatus, step: &str) -> PreflightStatus {
    let target = Version::parse(step).unwrap_or_else(|_| Version::new(0, 0, 0));
    let timeout = round.ctx.settings.upgrade_step_timeout;
    let acknowledgement = acknowledged(
        round.ncp.annotations().get(ACKNOWLEDGE_ANNOTATION).map(String::as_str),
        &target,
    );
    // Read twice before reporting it unreadable: one dropped connection (a port-forward
    // stream, a replica restarting) is no reason for a failed preflight and its Warning.
    let metrics = match tenant_metrics(round).await {
        Ok(texts) => Ok(texts),
        Err(error) => {
            tracing::debug!(%error, "reading the tenant apiservers' metrics failed once; reading again");
            tenant_metrics(round).await
        }
    };
    let used = metrics.and_then(|texts| {
        let mut used = Vec::new();
        for text in texts {
            used.extend(deprecated_apis(&text).map_err(|e| e.to_string())?);
        }
        used.sort();
        used.dedup();
        Ok(used)
    });
    let (removed, removed_apis) = removed_apis_check(used, acknowledgement, &target);
    let checks = vec![
        components_ready_check(status),
        certificates_check(status, timeout, round.now.time),
        removed,
    ];
    PreflightStatus {
        step: step.to_string(),
        passed: checks.iter().all(|c| c.passed),
        time: None,
        checks,
        removed_apis,
        acknowledged: acknowledgement,
    }
}

/// Components: ready with every member. etcd's readiness is each member's own health
/// endpoint (the StatefulSet's readiness probe), so a ready NestedEtcd with all members
/// ready is a healthy etcd with quorum.
pub(super) fn components_ready_check(status: &NestedControlPlaneStatus) -> PreflightCheck {
    let summary = status.components.clone().unwrap_or_default();
    let not_ready: Vec<String> = [
        ("etcd", &summary.etcd),
        ("apiserver", &summary.apiserver),
        ("controller-manager", &summary.controller_manager),
    ]
    .into_iter()
    .filter_map(|(name, c)| match c {
        Some(c) if c.ready && c.ready_replicas >= c.replicas => None,
        Some(c) => Some(format!("{name} {}/{} ready", c.ready_replicas, c.replicas)),
        None => Some(format!("{name} missing")),
    })
    .collect();
    PreflightCheck {
        name: "ComponentsReady".into(),
        passed: not_ready.is_empty(),
        message: if not_ready.is_empty() {
            "etcd, apiserver and controller-manager are ready with every member".into()
        } else {
            format!("not ready: {}", not_ready.join(", "))
        },
    }
}

/// Certificates: none expires or is renewed within the step's time limit (`timeout`).
pub(super) fn certificates_check(
    status: &NestedControlPlaneStatus,
    timeout: Duration,
    now: time::OffsetDateTime,
) -> PreflightCheck {
    let to_time = |t: &Time| time::OffsetDateTime::from_unix_timestamp(t.0.as_second()).ok();
    let expiry = status.certificates_expiry_date.as_ref().and_then(to_time);
    let renewal = status
        .next_certificate_renewal
        .as_ref()
        .and_then(|r| to_time(&r.time).map(|t| (t, r.secret.as_str())));
    let margin = time::Duration::try_from(timeout).unwrap_or(time::Duration::HOUR);
    let blocker = certificate_blocker(now, expiry, renewal, margin);
    PreflightCheck {
        name: "Certificates".into(),
        passed: blocker.is_none(),
        message: blocker
            .unwrap_or_else(|| format!("none expires or is renewed within {} minutes", margin.whole_minutes())),
    }
}

/// APIs the step's release removes, from the tenant apiserver's own metric (`used`, or why
/// it could not be read), unless `acknowledged`; with the removed APIs found.
pub(super) fn removed_apis_check(
    used: Result<Vec<DeprecatedApi>, String>,
    acknowledged: bool,
    target: &Version,
) -> (PreflightCheck, Vec<RemovedApi>) {
    let (passed, message, removed_apis) = match used {
        Ok(used) => {
            let removed = removed_by(&used, target);
            let removed_apis = removed
                .iter()
                .map(|a| RemovedApi {
                    group: a.group.clone(),
                    version: a.version.clone(),
                    resource: a.resource.clone(),
                    subresource: a.subresource.clone(),
                    removed_release: a.removed_release.clone(),
                })
                .collect();
            let names: Vec<String> = removed
                .iter()
                .map(|a| format!("{} (removed in {})", a.name(), a.removed_release))
                .collect();
            let (passed, message) = removed_apis_verdict(&names, acknowledged, target);
            (passed, message, removed_apis)
        }
        Err(e) => {
            let (passed, message) = unverified(e, acknowledged, target);
            (passed, message, Vec::new())
        }
    };
    let check = PreflightCheck {
        name: "RemovedAPIs".into(),
        passed,
        message,
    };
    (check, removed_apis)
}

/// Whether the removed APIs the tenant used (`names`) hold the step back, and why.
fn removed_apis_verdict(names: &[String], acknowledged: bool, target: &Version) -> (bool, String) {
    match (names.is_empty(), acknowledged) {
        (true, _) => (true, format!("the tenant used no API that {target} removes")),
        (false, true) => (
            true,
            format!("acknowledged ({ACKNOWLEDGE_ANNOTATION}): {}", names.join(", ")),
        ),
        (false, false) => (
            false,
            format!(
                "the tenant used APIs that {target} no longer serves: {}; move the clients to a served version, or acknowledge with {ACKNOWLEDGE_ANNOTATION}={}.{}",
                names.join(", "),
                target.major,
                target.minor
            ),
        ),
    }
}

/// A removed-API check that could not read the metric: it fails unless acknowledged, since
/// an unknown is not a pass.
fn unverified(error: String, acknowledged: bool, target: &Version) -> (bool, String) {
    if acknowledged {
        (
            true,
            format!("could not read the tenant's metrics ({error}); acknowledged ({ACKNOWLEDGE_ANNOTATION})"),
        )
    } else {
        (
            false,
            format!(
                "could not read the tenant apiserver's apiserver_requested_deprecated_apis metric: {error}; acknowledge with {ACKNOWLEDGE_ANNOTATION}={}.{} to go on without it",
                target.major, target.minor
            ),
        )
    }
}

/// The preflight in one line: the checks that failed, else that all passed.
fn preflight_summary(p: &PreflightStatus) -> String {
    let failed: Vec<String> = p
        .checks
        .iter()
        .filter(|c| !c.passed)
        .map(|c| format!("{}: {}", c.name, c.message))
        .collect();
    if failed.is_empty() {
        let all: Vec<String> = p.checks.iter().map(|c| format!("{}: {}", c.name, c.message)).collect();
        all.join("; ")
    } else {
        failed.join("; ")
    }
}

/// The `/metrics` of every tenant apiserver replica, through the admin kubeconfig
/// (`system:masters` may read them). Each replica counts only the requests it served, so
/// each is read: at the addresses the tenant's own `kubernetes` EndpointSlice lists (every
/// apiserver's `--advertise-address`), verifying the certificate for the kubeconfig's
/// host; through the kubeconfig's server when the slice lists none.
async fn tenant_metrics(round: &Round<'_>) -> Result<Vec<String>, String> {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let config = crate::controllers::shared::tenant::tenant_config(round.ctx, round.ncp, round.ns)
        .await
        .map_err(|e| e.to_string())?;
    let client = kube::Client::try_from(config.clone()).map_err(|e| e.to_string())?;
    let get = |client: kube::Client| async move {
        let request = http::Request::get("/metrics")
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        client.request_text(request).await.map_err(|e| e.to_string())
    };
    let slices = kube::Api::<EndpointSlice>::namespaced(client.clone(), "default")
        .list(&kube::api::ListParams::default().labels("kubernetes.io/service-name=kubernetes"))
        .await
        .map_err(|e| e.to_string())?;
    let mut addresses = Vec::new();
    for slice in &slices.items {
        let port = slice
            .ports
            .iter()
            .flatten()
            .find_map(|p| p.port)
            .unwrap_or(crate::plan::APISERVER_PORT);
        // A replica that is going away says so (`ready: false`); it serves nobody next.
        for endpoint in slice
            .endpoints
            .iter()
            .flatten()
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
        {
            addresses.extend(endpoint.addresses.iter().map(|a| (a.clone(), port)));
        }
    }
    if addresses.is_empty() {
        let server = tenant_server(&config);
        return Ok(vec![get(client).await.map_err(|e| format!("{server}/metrics: {e}"))?]);
    }
    let host = config.cluster_url.host().map(str::to_string);
    let mut texts = Vec::with_capacity(addresses.len());
    for (address, port) in addresses {
        let mut one = config.clone();
        one.tls_server_name = one.tls_server_name.clone().or_else(|| host.clone());
        let ip: std::net::IpAddr = address.parse().map_err(|e| format!("apiserver {address}: {e}"))?;
        let port = u16::try_from(port).map_err(|e| format!("apiserver {address} port {port}: {e}"))?;
        let tenant_host = one.tls_server_name.clone().unwrap_or_default();
        let dialled = round
            .ctx
            .reach
            .dial_pod_ip(&tenant_host, round.ns, ip, port)
            .await
            .map_err(|e| e.to_string())?
            .unwrap_or(std::net::SocketAddr::new(ip, port));
        one.cluster_url = format!("https://{dialled}")
            .parse()
            .map_err(|e| format!("apiserver {address}: {e}"))?;
        let server = tenant_server(&one);
        let client = kube::Client::try_from(one).map_err(|e| format!("apiserver {address}: {e}"))?;
        texts.push(
            get(client)
                .await
                .map_err(|e| format!("apiserver {address} ({server}/metrics): {e}"))?,
        );
    }
    Ok(texts)
}

/// The server a tenant client dials, as errors name it: the in-cluster name it verifies,
/// and the address it dials when that differs (a port-forward's local end).
fn tenant_server(config: &kube::Config) -> String {
    let url = config.cluster_url.to_string();
    match &config.tls_server_name {
        Some(name) => format!("https://{name} (dialled at {})", url.trim_end_matches('/')),
        None => url.trim_end_matches('/').to_owned(),
    }
}
