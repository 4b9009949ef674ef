//! The NestedControlPlane's stepped upgrade (docs/design.md §10): plans the path when the
//! requested release changes, runs the preflight before each step, starts the step (the
//! components follow [`crate::upgrade::components_version`]) and records its progress.
//! The decisions are pure ([`crate::upgrade`]); this module reads and reports.

use std::time::Duration;

use kube::{Resource, ResourceExt};
use semver::Version;

use crate::api::{
    NestedAPIServer, NestedControlPlane, NestedControlPlaneStatus, NestedControllerManager, NestedEtcd, PreflightCheck,
    PreflightStatus, RemovedApi,
};
use crate::channel::DEFAULT_CHANNEL;
use crate::controllers::component::ComponentResource;
use crate::controllers::round::Now;
use crate::controllers::{Context, events};
use crate::plan::{ClusterSettings, resolve};
use crate::status::{ConditionUpdate, Reason, SYNCED, UPGRADE_PREFLIGHT, UPGRADING, set_condition};
use crate::upgrade::preflight::{certificate_blocker, deprecated_apis, removed_by};
use crate::upgrade::{
    ACKNOWLEDGE_ANNOTATION, ComponentProgress, HOLD_ANNOTATION, Next, RETRY_ANNOTATION, RunningReleases, acknowledged,
    advance, phase, plan_path, preflight_reason, record, record_preflight, start_step,
};

/// How often a failing preflight looks again (it reads the tenant's `/metrics`, not the
/// super cluster).
const PREFLIGHT_RETRY: Duration = Duration::from_secs(20);

/// The component resources of one control plane, as the control plane controller read them.
pub(super) struct Components<'a> {
    pub etcd: Option<&'a NestedEtcd>,
    pub apiserver: Option<&'a NestedAPIServer>,
    pub controller_manager: Option<&'a NestedControllerManager>,
}

/// Moves the upgrade of `ncp` one reconcile forward and sets its conditions. Returns when
/// to look again, if sooner than a component change would wake the controller.
pub(super) async fn step(
    ctx: &Context,
    ncp: &NestedControlPlane,
    ns: &str,
    cluster: &ClusterSettings,
    components: &Components<'_>,
    status: &mut NestedControlPlaneStatus,
    now: &Now,
) -> Option<Duration> {
    let generation = ncp.meta().generation;
    let set = |status: &mut NestedControlPlaneStatus, update: ConditionUpdate| {
        set_condition(&mut status.conditions, update, generation, &now.k8s)
    };
    let version_of = |s: Option<&crate::api::ComponentStatus>| {
        s.and_then(|s| s.version.as_deref())
            .and_then(|v| Version::parse(v).ok())
    };
    let apiserver = version_of(components.apiserver.and_then(|c| c.component_status()));
    let controller_manager = version_of(components.controller_manager.and_then(|c| c.component_status()));
    // Before the control plane first ran, the components come up on spec.version directly.
    if !status.initialized || apiserver.is_none() {
        return None;
    }
    let channel_name = cluster
        .channel
        .as_deref()
        .filter(|c| !c.is_empty())
        .unwrap_or(DEFAULT_CHANNEL);
    let target = match ctx.channels.get(channel_name).and_then(|c| {
        c.resolve(
            crate::component::ComponentKind::ApiServer,
            cluster.kubernetes_version.as_deref(),
            None,
        )
    }) {
        Ok(t) => t,
        Err(e) => {
            // The NestedControlPlane's Synced condition already reports bad input; the
            // components keep their release.
            set(
                status,
                ConditionUpdate::error(UPGRADING, false, e.reason(), e.to_string()),
            );
            return None;
        }
    };
    let target_text = target.to_string();
    if status.upgrade.as_ref().map(|u| &u.target) != Some(&target_text) {
        let running = RunningReleases {
            kubernetes: [apiserver.clone(), controller_manager.clone()]
                .into_iter()
                .flatten()
                .min(),
            etcd: version_of(components.etcd.and_then(|c| c.component_status())),
        };
        let pinned = components.etcd.and_then(|e| e.component().version.as_deref());
        let channel = ctx.channels.get(channel_name).ok()?;
        match plan_path(channel, &running, cluster.kubernetes_version.as_deref(), pinned) {
            Err(e) => {
                // Refused before anything moves: the components keep following the
                // recorded path (or what runs).
                set(
                    status,
                    ConditionUpdate::error(UPGRADING, false, e.reason(), e.to_string()),
                );
                set(status, ConditionUpdate::error(SYNCED, false, e.reason(), e.to_string()));
                return None;
            }
            Ok(path) if path.steps.is_empty() => status.upgrade = None,
            Ok(path) => {
                let mut planned = record(&path);
                crate::upgrade::carry_step_in_flight(status.upgrade.as_deref(), &mut planned, &now.k8s);
                events::publish(
                    ctx,
                    ncp,
                    None,
                    Reason::UpgradePlanned,
                    format!("upgrade planned: {}", path.summary()),
                    "Upgrade",
                )
                .await;
                status.upgrade = Some(Box::new(planned));
            }
        }
    }
    let Some(mut upgrade) = status.upgrade.take() else {
        set(
            status,
            ConditionUpdate::new(UPGRADING, false, Reason::UpToDate, format!("runs {target}")),
        );
        return None;
    };
    let hold = ncp.annotations().contains_key(HOLD_ANNOTATION);
    let retry = ncp.annotations().get(RETRY_ANNOTATION).map(String::as_str);
    let timeout = ctx.settings.upgrade_step_timeout;
    // Progress is measured against the step that runs (the first not yet succeeded).
    let progress = upgrade
        .steps
        .iter()
        .find(|s| s.state != crate::upgrade::state::SUCCEEDED)
        .map(|s| {
            let mut step_cluster = cluster.clone();
            step_cluster.kubernetes_version = Some(s.kubernetes.clone());
            let since = s.start_time.clone();
            component_progress(ctx, &step_cluster, components, since.as_ref())
        })
        .unwrap_or_default();
    let mut again = None;
    let phase_before = upgrade.phase.clone();
    let next = advance(&mut upgrade, &progress, hold, retry, &now.k8s, timeout);
    if let Next::Preflight(index) = next {
        let step = upgrade.steps[index].kubernetes.clone();
        let result = preflight(ctx, ncp, ns, status, &step, timeout, now).await;
        let passed = result.passed;
        let summary = preflight_summary(&result);
        record_preflight(&mut upgrade, result, &now.k8s);
        if passed {
            start_step(&mut upgrade, index, &now.k8s);
            let total = upgrade.steps.len();
            events::publish(
                ctx,
                ncp,
                None,
                Reason::UpgradeStepStarted,
                format!(
                    "step {}/{total} to Kubernetes {step} started; preflight: {summary}",
                    index + 1
                ),
                "Upgrade",
            )
            .await;
        } else {
            again = Some(PREFLIGHT_RETRY);
        }
    }
    if next == Next::Completed && phase_before != phase::COMPLETED {
        {
            events::publish(
                ctx,
                ncp,
                None,
                Reason::UpgradeCompleted,
                format!("upgrade from {} to {} completed", upgrade.from, upgrade.target),
                "Upgrade",
            )
            .await;
        }
    }
    let condition = match upgrade.phase.as_str() {
        phase::UPGRADING => ConditionUpdate::new(UPGRADING, true, Reason::Upgrading, upgrade.message.clone()),
        phase::PREFLIGHT => ConditionUpdate::new(UPGRADING, true, Reason::Preflight, upgrade.message.clone()),
        // The UpgradePreflight condition carries the warning; this one waits.
        phase::PREFLIGHT_FAILED => {
            ConditionUpdate::new(UPGRADING, false, Reason::WaitingForPreflight, upgrade.message.clone())
        }
        phase::HELD => ConditionUpdate::new(UPGRADING, false, Reason::UpgradeHeld, upgrade.message.clone()),
        phase::FAILED => ConditionUpdate::new(UPGRADING, false, Reason::UpgradeStepFailed, upgrade.message.clone()),
        _ => ConditionUpdate::new(UPGRADING, false, Reason::Completed, upgrade.message.clone()),
    };
    set(status, condition);
    if let Some(p) = &upgrade.preflight {
        set(
            status,
            ConditionUpdate::new(
                UPGRADE_PREFLIGHT,
                p.passed,
                preflight_reason(p),
                format!("before the step to {}: {}", p.step, preflight_summary(p)),
            ),
        );
    }
    // A running step can fail by its deadline, which no watch reports.
    if next == Next::Running {
        again = Some(timeout.min(Duration::from_secs(60)));
    }
    status.upgrade = Some(upgrade);
    again
}

/// How each component stands against the step whose cluster settings are `step_cluster`:
/// done when ready on its current generation and running the release the step asks of it
/// (its own pinned `version` if it has one); failed when it reports a refusal or an error
/// that does not pass by itself (a `Synced=False` other than an API hiccup or the skew wait
/// of the ordered upgrade) since the step started.
fn component_progress(
    ctx: &Context,
    step_cluster: &ClusterSettings,
    components: &Components<'_>,
    since: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
) -> Vec<ComponentProgress> {
    fn one<K: ComponentResource>(
        ctx: &Context,
        step_cluster: &ClusterSettings,
        component: Option<&K>,
        since: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
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
    vec![
        one(ctx, step_cluster, components.etcd, since),
        one(ctx, step_cluster, components.apiserver, since),
        one(ctx, step_cluster, components.controller_manager, since),
    ]
}

/// The checks before the step to `step` (a Kubernetes release): every component ready and
/// etcd healthy, no certificate expiring or renewed within the step's time limit, and no API
/// in use that the step's release removes (unless acknowledged).
async fn preflight(
    ctx: &Context,
    ncp: &NestedControlPlane,
    ns: &str,
    status: &NestedControlPlaneStatus,
    step: &str,
    timeout: Duration,
    now: &Now,
) -> PreflightStatus {
    let target = Version::parse(step).unwrap_or_else(|_| Version::new(0, 0, 0));
    let mut checks = Vec::new();
    // 1. Components: ready with every member. etcd's readiness is each member's own
    //    health endpoint (the StatefulSet's readiness probe), so a ready NestedEtcd with
    //    all members ready is a healthy etcd with quorum.
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
    checks.push(PreflightCheck {
        name: "ComponentsReady".into(),
        passed: not_ready.is_empty(),
        message: if not_ready.is_empty() {
            "etcd, apiserver and controller-manager are ready with every member".into()
        } else {
            format!("not ready: {}", not_ready.join(", "))
        },
    });
    // 2. Certificates.
    let to_time = |t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time| {
        time::OffsetDateTime::from_unix_timestamp(t.0.as_second()).ok()
    };
    let expiry = status.certificates_expiry_date.as_ref().and_then(to_time);
    let renewal = status
        .next_certificate_renewal
        .as_ref()
        .and_then(|r| to_time(&r.time).map(|t| (t, r.secret.as_str())));
    let margin = time::Duration::try_from(timeout).unwrap_or(time::Duration::HOUR);
    let blocker = certificate_blocker(now.time, expiry, renewal, margin);
    checks.push(PreflightCheck {
        name: "Certificates".into(),
        passed: blocker.is_none(),
        message: blocker
            .unwrap_or_else(|| format!("none expires or is renewed within {} minutes", margin.whole_minutes())),
    });
    // 3. APIs the step's release removes, from the tenant apiserver's own metric.
    let acknowledgement = acknowledged(
        ncp.annotations().get(ACKNOWLEDGE_ANNOTATION).map(String::as_str),
        &target,
    );
    let mut removed_apis = Vec::new();
    let used = tenant_metrics(ctx, ncp, ns).await.and_then(|texts| {
        let mut used = Vec::new();
        for text in texts {
            used.extend(deprecated_apis(&text).map_err(|e| e.to_string())?);
        }
        used.sort();
        used.dedup();
        Ok(used)
    });
    let check = match used {
        Ok(used) => {
            let removed = removed_by(&used, &target);
            removed_apis = removed
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
            match (names.is_empty(), acknowledgement) {
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
        Err(e) => unverified(e, acknowledgement, &target),
    };
    checks.push(PreflightCheck {
        name: "RemovedAPIs".into(),
        passed: check.0,
        message: check.1,
    });
    PreflightStatus {
        step: step.to_string(),
        passed: checks.iter().all(|c| c.passed),
        time: None,
        checks,
        removed_apis,
        acknowledged: acknowledgement,
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
async fn tenant_metrics(ctx: &Context, ncp: &NestedControlPlane, ns: &str) -> Result<Vec<String>, String> {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let config = crate::controllers::public_crds::tenant_config(ctx, ncp, ns)
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
        return Ok(vec![get(client).await?]);
    }
    let host = config.cluster_url.host().map(str::to_string);
    let mut texts = Vec::with_capacity(addresses.len());
    for (address, port) in addresses {
        let mut one = config.clone();
        one.tls_server_name = one.tls_server_name.clone().or_else(|| host.clone());
        let ip = match address.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V6(v6)) => format!("[{v6}]"),
            _ => address.clone(),
        };
        one.cluster_url = format!("https://{ip}:{port}")
            .parse()
            .map_err(|e| format!("apiserver {address}: {e}"))?;
        let client = kube::Client::try_from(one).map_err(|e| format!("apiserver {address}: {e}"))?;
        texts.push(get(client).await.map_err(|e| format!("apiserver {address}: {e}"))?);
    }
    Ok(texts)
}
