use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;
use crate::api::{NestedControlPlaneStatus, PreflightCheck};

fn at(second: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + second).unwrap())
}

fn two_steps() -> UpgradeStatus {
    let channels = crate::channel::ChannelRegistry::load(&[]).unwrap();
    let running = RunningReleases {
        kubernetes: Some(semver::Version::new(1, 35, 4)),
        etcd: Some(semver::Version::new(3, 6, 8)),
    };
    let path = plan_path(channels.get("stable").unwrap(), &running, Some("1.37"), None).unwrap();
    record(&path)
}

fn component(name: &str, done: bool) -> ComponentProgress {
    ComponentProgress {
        component: name.into(),
        done,
        message: if done { String::new() } else { "runs 1.35.4".into() },
        failure: None,
    }
}

const HOUR: Duration = Duration::from_secs(3600);

#[test]
fn a_planned_path_starts_with_the_preflight_of_its_first_step() {
    let mut upgrade = two_steps();
    assert_eq!(upgrade.from, "1.35.4");
    assert_eq!(upgrade.target, "1.37.2");
    assert_eq!(upgrade.message, "planned 1.35.4 → 1.36.3 → 1.37.2 (etcd 3.6.8 → 3.7.0)");
    let steps: Vec<_> = upgrade
        .steps
        .iter()
        .map(|s| (s.kubernetes.as_str(), s.etcd.as_str(), s.etcd_changes, s.state.as_str()))
        .collect();
    assert_eq!(
        steps,
        [
            ("1.36.3", "3.6.8", false, "Pending"),
            ("1.37.2", "3.7.0", true, "Pending")
        ]
    );
    assert_eq!(
        advance(&mut upgrade, &[], false, None, &at(0), HOUR),
        Next::Preflight(0)
    );
}

#[test]
fn steps_run_one_at_a_time_and_record_their_durations() {
    let mut upgrade = two_steps();
    start_step(&mut upgrade, 0, &at(0));
    assert_eq!(upgrade.phase, "Upgrading");
    let waiting = [component("etcd", true), component("apiserver", false)];
    assert_eq!(
        advance(&mut upgrade, &waiting, false, None, &at(60), HOUR),
        Next::Running
    );
    assert_eq!(upgrade.current_step, Some(1));
    assert!(
        upgrade
            .message
            .contains("step 1/2 to 1.36.3: waiting for apiserver runs 1.35.4"),
        "{}",
        upgrade.message
    );
    let done = [
        component("etcd", true),
        component("apiserver", true),
        component("controller-manager", true),
    ];
    assert_eq!(
        advance(&mut upgrade, &done, false, None, &at(95), HOUR),
        Next::Preflight(1)
    );
    assert_eq!(upgrade.steps[0].state, "Succeeded");
    assert_eq!(upgrade.steps[0].duration_seconds, Some(95));
    assert_eq!(upgrade.steps[0].finish_time, Some(at(95)));
    assert_eq!(upgrade.current_step, Some(2));
    start_step(&mut upgrade, 1, &at(100));
    assert_eq!(
        advance(&mut upgrade, &done, false, None, &at(250), HOUR),
        Next::Completed
    );
    assert_eq!(upgrade.steps[1].duration_seconds, Some(150));
    assert_eq!(upgrade.phase, "Completed");
    assert_eq!(upgrade.current_step, None);
}

#[test]
fn a_hold_keeps_the_next_step_from_starting_but_not_the_running_one_from_finishing() {
    let mut upgrade = two_steps();
    assert_eq!(advance(&mut upgrade, &[], true, None, &at(0), HOUR), Next::Held);
    assert_eq!(upgrade.phase, "Held");
    assert!(upgrade.message.contains(HOLD_ANNOTATION));
    start_step(&mut upgrade, 0, &at(0));
    let done = [component("etcd", true), component("apiserver", true)];
    assert_eq!(advance(&mut upgrade, &done, true, None, &at(10), HOUR), Next::Held);
    assert_eq!(upgrade.steps[0].state, "Succeeded");
    assert_eq!(upgrade.steps[1].state, "Pending");
}

#[test]
fn a_terminal_component_failure_fails_the_step_without_moving_on() {
    let mut upgrade = two_steps();
    start_step(&mut upgrade, 0, &at(0));
    let mut broken = component("apiserver", false);
    broken.failure = Some("PatchTargetNotFound: ...".into());
    assert_eq!(
        advance(
            &mut upgrade,
            &[component("etcd", true), broken],
            false,
            None,
            &at(30),
            HOUR
        ),
        Next::Failed
    );
    assert_eq!(upgrade.phase, "Failed");
    assert_eq!(upgrade.steps[0].state, "Failed");
    assert!(upgrade.steps[0].message.starts_with("apiserver: PatchTargetNotFound"));
    assert!(upgrade.message.contains(RETRY_ANNOTATION), "{}", upgrade.message);
    // Failed stays failed, even once the components are done, until a retry.
    let done = [component("etcd", true), component("apiserver", true)];
    assert_eq!(advance(&mut upgrade, &done, false, None, &at(40), HOUR), Next::Failed);
    assert_eq!(components_version_of(&upgrade), "1.36.3", "no roll back");
    assert_eq!(
        advance(&mut upgrade, &done, false, Some("1"), &at(50), HOUR),
        Next::Preflight(1)
    );
    assert_eq!(upgrade.retried.as_deref(), Some("1"));
    assert_eq!(upgrade.steps[0].state, "Succeeded");
    assert_eq!(upgrade.steps[0].duration_seconds, Some(0), "timed from the retry");
}

#[test]
fn a_retry_value_acts_once_and_one_present_at_the_failure_is_spent() {
    let mut upgrade = two_steps();
    start_step(&mut upgrade, 0, &at(0));
    let waiting = [component("apiserver", false)];
    assert_eq!(
        advance(&mut upgrade, &waiting, false, Some("a"), &at(7200), HOUR),
        Next::Failed
    );
    assert!(
        upgrade.steps[0]
            .message
            .contains("not done after 7200 s (limit 3600 s): apiserver runs 1.35.4"),
        "{}",
        upgrade.steps[0].message
    );
    assert_eq!(
        advance(&mut upgrade, &waiting, false, Some("a"), &at(7201), HOUR),
        Next::Failed
    );
    assert_eq!(
        advance(&mut upgrade, &waiting, false, Some("b"), &at(7202), HOUR),
        Next::Running
    );
    assert_eq!(upgrade.steps[0].start_time, Some(at(7202)));
    assert_eq!(upgrade.steps[0].state, "Running");
    // Times out again; the same value does not retry twice.
    assert_eq!(
        advance(&mut upgrade, &waiting, false, Some("b"), &at(20000), HOUR),
        Next::Failed
    );
    assert_eq!(
        advance(&mut upgrade, &waiting, false, Some("b"), &at(20001), HOUR),
        Next::Failed
    );
    assert_eq!(
        advance(&mut upgrade, &waiting, false, Some("c"), &at(20002), HOUR),
        Next::Running
    );
}

fn components_version_of(upgrade: &UpgradeStatus) -> String {
    let mut ncp = NestedControlPlane::new("c", Default::default());
    ncp.spec.version = Some("1.37".into());
    ncp.status = Some(NestedControlPlaneStatus {
        upgrade: Some(Box::new(upgrade.clone())),
        ..Default::default()
    });
    components_version(&ncp).unwrap()
}

#[test]
fn the_components_follow_the_last_started_step() {
    let mut upgrade = two_steps();
    assert_eq!(
        components_version_of(&upgrade),
        "1.35.4",
        "before the first step: what ran"
    );
    start_step(&mut upgrade, 0, &at(0));
    assert_eq!(components_version_of(&upgrade), "1.36.3");
    let done = [component("apiserver", true)];
    advance(&mut upgrade, &done, false, None, &at(1), HOUR);
    assert_eq!(
        components_version_of(&upgrade),
        "1.36.3",
        "the next step has not passed its preflight"
    );
    start_step(&mut upgrade, 1, &at(2));
    assert_eq!(components_version_of(&upgrade), "1.37.2");
}

#[test]
fn without_a_path_an_initialized_control_plane_keeps_its_running_release() {
    let mut ncp = NestedControlPlane::new("c", Default::default());
    ncp.spec.version = Some("1.37".into());
    assert_eq!(components_version(&ncp).as_deref(), Some("1.37"), "a new control plane");
    ncp.status = Some(NestedControlPlaneStatus {
        version: Some("1.36.3".into()),
        initialized: false,
        ..Default::default()
    });
    assert_eq!(components_version(&ncp).as_deref(), Some("1.37"), "not initialized yet");
    ncp.status.as_mut().unwrap().initialized = true;
    assert_eq!(
        components_version(&ncp).as_deref(),
        Some("1.36.3"),
        "a changed spec.version waits for its path"
    );
}

#[test]
fn a_preflight_result_keeps_its_time_until_it_changes() {
    let mut upgrade = two_steps();
    let failing = |message: &str| PreflightStatus {
        step: "1.36.3".into(),
        passed: false,
        checks: vec![PreflightCheck {
            name: "ComponentsReady".into(),
            passed: false,
            message: message.into(),
        }],
        ..Default::default()
    };
    record_preflight(&mut upgrade, failing("apiserver is not ready"), &at(0));
    assert_eq!(upgrade.phase, "PreflightFailed");
    assert_eq!(
        upgrade.message,
        "preflight before the step to 1.36.3 failed: ComponentsReady: apiserver is not ready"
    );
    record_preflight(&mut upgrade, failing("apiserver is not ready"), &at(30));
    assert_eq!(upgrade.preflight.as_ref().unwrap().time, Some(at(0)));
    record_preflight(&mut upgrade, failing("etcd is not ready"), &at(60));
    assert_eq!(upgrade.preflight.as_ref().unwrap().time, Some(at(60)));
}

#[test]
fn an_acknowledgement_names_the_minor_of_the_step() {
    let v = |s| semver::Version::parse(s).unwrap();
    assert!(acknowledged(Some("1.37"), &v("1.37.2")));
    assert!(acknowledged(Some("1.36, v1.37"), &v("1.37.2")));
    assert!(acknowledged(Some("1.37.2"), &v("1.37.2")));
    assert!(!acknowledged(Some("1.37.1"), &v("1.37.2")));
    assert!(!acknowledged(Some("1.36"), &v("1.37.2")));
    assert!(!acknowledged(Some("true"), &v("1.37.2")));
    assert!(!acknowledged(Some("1"), &v("1.37.2")));
    assert!(!acknowledged(None, &v("1.37.2")));
}

#[test]
fn the_preflight_reason_names_the_first_failing_cause() {
    let check = |name: &str, passed: bool| PreflightCheck {
        name: name.into(),
        passed,
        message: String::new(),
    };
    let mut p = PreflightStatus {
        step: "1.37.2".into(),
        checks: vec![
            check("ComponentsReady", true),
            check("Certificates", true),
            check("RemovedAPIs", true),
        ],
        passed: true,
        ..Default::default()
    };
    assert_eq!(preflight_reason(&p), crate::status::Reason::PreflightPassed);
    p.checks[2].passed = false;
    assert_eq!(preflight_reason(&p), crate::status::Reason::DeprecatedAPIUsageUnknown);
    p.removed_apis.push(crate::api::RemovedApi {
        group: "networking.k8s.io".into(),
        version: "v1beta1".into(),
        resource: "servicecidrs".into(),
        subresource: String::new(),
        removed_release: "1.37".into(),
    });
    assert_eq!(preflight_reason(&p), crate::status::Reason::RemovedAPIsInUse);
    p.checks[1].passed = false;
    assert_eq!(preflight_reason(&p), crate::status::Reason::CertificateRenewalDue);
    p.checks[0].passed = false;
    assert_eq!(preflight_reason(&p), crate::status::Reason::ComponentsNotReady);
}

#[test]
fn a_new_path_keeps_the_step_in_flight_when_it_goes_the_same_way() {
    let channels = crate::channel::ChannelRegistry::load(&[]).unwrap();
    let stable = channels.get("stable").unwrap();
    let mut old = two_steps();
    start_step(&mut old, 0, &at(0));
    // Mid-step the request changes to 1.36: the new path from 1.35.4 is the step in flight.
    let running = RunningReleases {
        kubernetes: Some(semver::Version::new(1, 35, 4)),
        etcd: Some(semver::Version::new(3, 6, 8)),
    };
    let mut planned = record(&plan_path(stable, &running, Some("1.36"), None).unwrap());
    carry_step_in_flight(Some(&old), &mut planned, &at(50));
    assert_eq!(planned.steps[0].state, "Running");
    assert_eq!(planned.steps[0].start_time, Some(at(0)), "the step keeps its clock");
    assert_eq!(components_version_of(&planned), "1.36.3", "nothing is asked to go back");
    // A failed step restarts now; a path going elsewhere starts with its preflight.
    old.steps[0].state = "Failed".into();
    let mut restarted = record(&plan_path(stable, &running, Some("1.36"), None).unwrap());
    carry_step_in_flight(Some(&old), &mut restarted, &at(60));
    assert_eq!(restarted.steps[0].start_time, Some(at(60)));
    let mut patch_only = record(&plan_path(stable, &running, Some("1.35.4"), None).unwrap());
    assert!(patch_only.steps.is_empty());
    carry_step_in_flight(Some(&old), &mut patch_only, &at(70));
    assert!(patch_only.steps.is_empty());
}
