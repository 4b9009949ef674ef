//! Stepped upgrades (docs/design.md §10): a NestedControlPlane asked for a release
//! more than one minor ahead passes through every minor in between, one step at a time,
//! each step the ordered upgrade of docs/design.md §5 (etcd when its release changes, then the
//! apiserver, then the controller-manager), each after a preflight.
//!
//! - [`path`]: the planner (channel, running releases, request → steps or a refusal).
//! - [`preflight`]: the pure decisions of the checks before a step.
//! - this module: which release the components run ([`components_version`]) and how the
//!   recorded path moves ([`advance`]); the controller reads and writes around them.

pub mod path;
pub mod preflight;

use crate::status::Reason;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::{NestedControlPlane, PreflightStatus, UpgradeStatus, UpgradeStepStatus};
pub use path::{PathError, RunningReleases, Step, UpgradePath, plan_path};

/// Annotation that holds the upgrade: no new step starts while it is present (the step
/// running finishes). Remove it to go on.
pub const HOLD_ANNOTATION: &str = "controlplane.cluster.x-k8s.io/upgrade-hold";
/// Annotation that retries a failed step: each new value restarts the failed step once
/// (its components are where the failure left them; nothing is rolled back).
pub const RETRY_ANNOTATION: &str = "controlplane.cluster.x-k8s.io/upgrade-retry";
/// Annotation that acknowledges removed-API findings for the listed target minors
/// (`"1.37"` or `"1.36,1.37"`): the step to such a minor starts even though the tenant used
/// an API it removes. Only that minor: a later upgrade is checked again.
pub const ACKNOWLEDGE_ANNOTATION: &str = "controlplane.cluster.x-k8s.io/upgrade-acknowledge-removed-apis";

/// Step states (`status.upgrade.steps[].state`).
pub mod state {
    pub const PENDING: &str = "Pending";
    pub const RUNNING: &str = "Running";
    pub const SUCCEEDED: &str = "Succeeded";
    pub const FAILED: &str = "Failed";
}

/// Upgrade phases (`status.upgrade.phase`).
pub mod phase {
    pub const PREFLIGHT: &str = "Preflight";
    pub const PREFLIGHT_FAILED: &str = "PreflightFailed";
    pub const HELD: &str = "Held";
    pub const UPGRADING: &str = "Upgrading";
    pub const FAILED: &str = "Failed";
    pub const COMPLETED: &str = "Completed";
}

/// The Kubernetes release the components of `ncp` are asked to run (what they resolve
/// their own releases from): the release of the upgrade step that started last; before a
/// path's first step, the release it starts from; without a recorded path, the release the
/// apiserver runs (so that a changed `spec.version` moves nothing until the control plane
/// controller has planned and checked the path); for a control plane that never ran,
/// `spec.version`.
pub fn components_version(ncp: &NestedControlPlane) -> Option<String> {
    let status = ncp.status.as_ref();
    if let Some(upgrade) = status.and_then(|s| s.upgrade.as_ref()) {
        return Some(
            upgrade
                .steps
                .iter()
                .rev()
                .find(|s| s.state != state::PENDING)
                .map(|s| s.kubernetes.clone())
                .unwrap_or_else(|| upgrade.from.clone()),
        );
    }
    match status.and_then(|s| s.version.clone()) {
        Some(running) if status.is_some_and(|s| s.initialized) => Some(running),
        _ => ncp.spec.version.clone(),
    }
}

/// A new record of `path` with every step pending.
pub fn record(path: &UpgradePath) -> UpgradeStatus {
    UpgradeStatus {
        from: path.from.to_string(),
        target: path.target.to_string(),
        phase: phase::PREFLIGHT.into(),
        current_step: Some(1),
        steps: path
            .steps
            .iter()
            .map(|s| UpgradeStepStatus {
                kubernetes: s.kubernetes.to_string(),
                etcd: s.etcd.to_string(),
                etcd_changes: s.etcd_changes,
                state: state::PENDING.into(),
                ..Default::default()
            })
            .collect(),
        message: format!("planned {}", path.summary()),
        ..Default::default()
    }
}

/// How one component stands against the running step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ComponentProgress {
    /// `etcd`, `apiserver`, `controller-manager`.
    pub component: String,
    /// Ready, on its current generation, running the release the step asks of it.
    pub done: bool,
    /// What it reports otherwise (`runs 1.35.4, moving to 1.36.3`).
    pub message: String,
    /// A refusal or error that will not pass by itself (a terminal `Synced=False`).
    pub failure: Option<String>,
}

/// What the controller does next with a recorded path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Every step succeeded.
    Completed,
    /// A step runs; look again when a component changes.
    Running,
    /// The step at this index (0-based) is next: run its preflight, then [`start_step`].
    Preflight(usize),
    /// The hold annotation keeps the next step from starting.
    Held,
    /// A step failed; it waits for a retry or a new `spec.version`.
    Failed,
}

/// Moves the recorded path as far as `components` (measured against the running step)
/// allow: finishes the running step when every component is done, fails it on a terminal
/// component failure or when it ran longer than `timeout`, restarts a failed step when the
/// retry annotation has a new value, and says what comes next. Pure.
pub fn advance(
    upgrade: &mut UpgradeStatus,
    components: &[ComponentProgress],
    hold: bool,
    retry: Option<&str>,
    now: &Time,
    timeout: std::time::Duration,
) -> Next {
    let Some(index) = upgrade.steps.iter().position(|s| s.state != state::SUCCEEDED) else {
        upgrade.phase = phase::COMPLETED.into();
        upgrade.current_step = None;
        upgrade.message = format!("runs {}", upgrade.target);
        return Next::Completed;
    };
    upgrade.current_step = i32::try_from(index + 1).ok();
    let total = upgrade.steps.len();
    let step = &mut upgrade.steps[index];
    let label = format!("step {}/{total} to {}", index + 1, step.kubernetes);
    if step.state == state::FAILED {
        match retry {
            Some(value) if upgrade.retried.as_deref() != Some(value) => {
                upgrade.retried = Some(value.to_string());
                step.state = state::RUNNING.into();
                step.start_time = Some(now.clone());
                step.finish_time = None;
                step.duration_seconds = None;
                step.message = format!("retried ({RETRY_ANNOTATION}={value})");
            }
            _ => {
                upgrade.phase = phase::FAILED.into();
                upgrade.message = format!(
                    "{label} failed: {}; set {RETRY_ANNOTATION} to a new value to retry, or change spec.version",
                    step.message
                );
                return Next::Failed;
            }
        }
    }
    if step.state == state::PENDING {
        if hold {
            upgrade.phase = phase::HELD.into();
            upgrade.message = format!("{label} is held by {HOLD_ANNOTATION}");
            return Next::Held;
        }
        return Next::Preflight(index);
    }
    // Running.
    // A retry value already present when a step fails is spent: only a new one retries.
    let spent = retry.map(str::to_string);
    let finish = |step: &mut UpgradeStepStatus, state: &str, message: String| {
        step.state = state.into();
        step.finish_time = Some(now.clone());
        step.duration_seconds = step
            .start_time
            .as_ref()
            .map(|start| (now.0.as_second() - start.0.as_second()).max(0));
        step.message = message;
    };
    if let Some(failed) = components.iter().find(|c| c.failure.is_some()) {
        let message = format!("{}: {}", failed.component, failed.failure.clone().unwrap_or_default());
        finish(step, state::FAILED, message);
        upgrade.retried = spent;
        return advance(upgrade, components, hold, retry, now, timeout);
    }
    if components.iter().all(|c| c.done) {
        finish(step, state::SUCCEEDED, String::new());
        return advance(upgrade, &[], hold, retry, now, timeout);
    }
    let elapsed = step
        .start_time
        .as_ref()
        .map(|start| now.0.as_second() - start.0.as_second())
        .unwrap_or(0);
    let waiting: Vec<String> = components
        .iter()
        .filter(|c| !c.done)
        .map(|c| format!("{} {}", c.component, c.message))
        .collect();
    if u64::try_from(elapsed).is_ok_and(|e| e > timeout.as_secs()) {
        let message = format!(
            "not done after {} s (limit {} s): {}",
            elapsed,
            timeout.as_secs(),
            waiting.join("; ")
        );
        finish(step, state::FAILED, message);
        upgrade.retried = spent;
        return advance(upgrade, components, hold, retry, now, timeout);
    }
    step.message = waiting.join("; ");
    upgrade.phase = phase::UPGRADING.into();
    upgrade.message = format!("{label}: waiting for {}", waiting.join("; "));
    Next::Running
}

/// A new path whose first step goes where the step in flight of the old path went keeps
/// that step running (its preflight passed, its components are moving; asking them to go
/// back to the path's start would be a downgrade). A failed one restarts now: a new
/// `spec.version` is the user's say to move on.
pub fn carry_step_in_flight(old: Option<&UpgradeStatus>, planned: &mut UpgradeStatus, now: &Time) {
    use state::{FAILED, RUNNING};
    let Some(old) = old else { return };
    let Some(in_flight) = old.steps.iter().find(|s| s.state == RUNNING || s.state == FAILED) else {
        return;
    };
    if let Some(first) = planned.steps.first_mut()
        && first.kubernetes == in_flight.kubernetes
    {
        first.state = RUNNING.into();
        first.start_time = if in_flight.state == RUNNING {
            in_flight.start_time.clone()
        } else {
            Some(now.clone())
        };
        planned.phase = phase::UPGRADING.into();
        planned.preflight = old.preflight.clone();
        planned.retried = old.retried.clone();
    }
}

/// Starts the step at `index` after its preflight passed.
pub fn start_step(upgrade: &mut UpgradeStatus, index: usize, now: &Time) {
    let total = upgrade.steps.len();
    if let Some(step) = upgrade.steps.get_mut(index) {
        step.state = state::RUNNING.into();
        step.start_time = Some(now.clone());
        step.message = String::new();
        upgrade.phase = phase::UPGRADING.into();
        upgrade.current_step = i32::try_from(index + 1).ok();
        upgrade.message = format!("step {}/{total} to {} started", index + 1, step.kubernetes);
    }
}

/// Records a preflight result; its time moves only when the result changes, so that a
/// preflight that keeps failing does not rewrite the status.
pub fn record_preflight(upgrade: &mut UpgradeStatus, mut result: PreflightStatus, now: &Time) {
    let same = upgrade.preflight.as_ref().is_some_and(|p| {
        p.step == result.step
            && p.passed == result.passed
            && p.checks == result.checks
            && p.removed_apis == result.removed_apis
            && p.acknowledged == result.acknowledged
    });
    result.time = match (&upgrade.preflight, same) {
        (Some(p), true) => p.time.clone(),
        _ => Some(now.clone()),
    };
    if !result.passed {
        upgrade.phase = phase::PREFLIGHT_FAILED.into();
        let failed: Vec<String> = result
            .checks
            .iter()
            .filter(|c| !c.passed)
            .map(|c| format!("{}: {}", c.name, c.message))
            .collect();
        upgrade.message = format!(
            "preflight before the step to {} failed: {}",
            result.step,
            failed.join("; ")
        );
    }
    upgrade.preflight = Some(result);
}

/// The reason of the `UpgradePreflight` condition for a preflight result: `PreflightPassed`,
/// else after the first check that failed: `ComponentsNotReady` (a wait, not a warning),
/// `CertificateRenewalDue`, `RemovedAPIsInUse` (findings listed) or
/// `DeprecatedAPIUsageUnknown` (the metric could not be read). A distinct reason per cause
/// makes a new cause a new Event (docs/design.md §7: Events on change only).
pub fn preflight_reason(preflight: &PreflightStatus) -> Reason {
    match preflight.checks.iter().find(|c| !c.passed).map(|c| c.name.as_str()) {
        None => Reason::PreflightPassed,
        Some("ComponentsReady") => Reason::ComponentsNotReady,
        Some("Certificates") => Reason::CertificateRenewalDue,
        Some(_) if preflight.removed_apis.is_empty() => Reason::DeprecatedAPIUsageUnknown,
        Some(_) => Reason::RemovedAPIsInUse,
    }
}

/// Whether the acknowledgement annotation value names the minor of `kubernetes`
/// (`1.37.2` is acknowledged by `1.37`, `v1.37` or `1.37.2` in a comma-separated list).
pub fn acknowledged(annotation: Option<&str>, kubernetes: &semver::Version) -> bool {
    annotation.is_some_and(|value| {
        value.split(',').any(|item| {
            crate::channel::RequestedVersion::parse(item).is_some_and(|r| {
                r.major == kubernetes.major
                    && r.minor == Some(kubernetes.minor)
                    && r.patch.is_none_or(|p| p == kubernetes.patch)
            })
        })
    })
}

#[cfg(test)]
mod tests;
