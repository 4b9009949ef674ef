//! The control plane's pure decisions, each on its own: what the status says of the
//! components, what a pass ends with, the certificates' schedule, the rotation's and the
//! upgrade's next move.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::runtime::controller::Action;
use time::OffsetDateTime;

use super::certificates::{LeafSchedule, schedule};
use super::components::Components;
use super::report::{
    MISSING_CA_RECHECK, action, available, component_condition, component_conditions, conclude, error_condition,
    hold_progress, requeue, rolling_out, show_replicas, summaries,
};
use super::rotation::{Move, Outcome, condition, new_request, next_move, record, running};
use super::upgrade::{
    PREFLIGHT_RETRY, certificates_check, components_ready_check, look_again, removed_apis_check, upgrading_condition,
};
use crate::api::{
    CertificateAuthorityRotation, ComponentStatus, ComponentSummary, ComponentsStatus, NestedAPIServer,
    NestedControlPlaneStatus, NestedControllerManager, NestedEtcd, UpgradeStatus,
};
use crate::controllers::ReconcileError;
use crate::controllers::component::ComponentResource;
use crate::pki::KeyPairPem;
use crate::pki::rotation::{Authority, Phase};
use crate::status::{
    APISERVER_READY, AVAILABLE, CERTIFICATES_AVAILABLE, CONTROLLER_MANAGER_READY, ETCD_READY, READY, ROLLING_OUT,
    Reason, UPGRADING,
};
use crate::upgrade::{Next, phase};

fn summary(name: &str, ready: bool, replicas: i32, ready_replicas: i32, version: Option<&str>) -> ComponentSummary {
    ComponentSummary {
        name: name.into(),
        ready,
        replicas,
        ready_replicas,
        version: version.map(Into::into),
    }
}

fn time(seconds: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(seconds).unwrap())
}

fn condition_of(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: time(0),
        observed_generation: None,
    }
}

fn with_ready(reason: &str, message: &str) -> ComponentStatus {
    ComponentStatus {
        conditions: vec![condition_of(READY, "False", reason, message)],
        ..Default::default()
    }
}

fn ready(replicas: i32, version: &str) -> ComponentStatus {
    ComponentStatus {
        ready: true,
        replicas: Some(replicas),
        ready_replicas: Some(replicas),
        version: Some(version.into()),
        ..Default::default()
    }
}

/// etcd and the controller-manager ready; the apiserver as `apiserver` says.
fn components(apiserver: ComponentStatus) -> Components {
    let mut etcd = NestedEtcd::with_defaults("demo-etcd");
    etcd.status = Some(ready(3, "3.6.8"));
    let mut api = NestedAPIServer::with_defaults("demo-apiserver");
    api.status = Some(apiserver);
    let mut controller_manager = NestedControllerManager::with_defaults("demo-controller-manager");
    controller_manager.status = Some(ready(1, "1.36.3"));
    Components {
        etcd: Some(etcd),
        apiserver: Some(api),
        controller_manager: Some(controller_manager),
    }
}

#[test]
fn a_component_on_its_way_keeps_the_counts_shown_until_it_is_ready() {
    let created = summary("demo-etcd", false, 0, 0, None);
    let applied = summary("demo-etcd", false, 3, 1, Some("3.6.8"));
    let ready = summary("demo-etcd", true, 3, 3, Some("3.6.8"));
    // Its StatefulSet applied, not ready yet: nothing new to show.
    assert_eq!(hold_progress(Some(&created), applied.clone(), false), created);
    // Ready: shown whole.
    assert_eq!(hold_progress(Some(&created), ready.clone(), false), ready);
    // Nothing shown yet (the first status), or another component of the name: as it is.
    assert_eq!(hold_progress(None, applied.clone(), false), applied);
    let other = summary("other-etcd", false, 1, 0, Some("3.5.21"));
    assert_eq!(hold_progress(Some(&other), applied.clone(), false), applied);
    // A ready component that fails, or scales while ready: every count shown.
    let failing = summary("demo-etcd", false, 3, 2, Some("3.6.8"));
    assert_eq!(hold_progress(Some(&ready), failing.clone(), false), failing);
    let scaled = summary("demo-etcd", true, 5, 5, Some("3.6.8"));
    assert_eq!(hold_progress(Some(&ready), scaled.clone(), false), scaled);
    // A component that served and degrades further, or rolls out: each count shown, as
    // it changes (a failing member of three after one already failed).
    let worse = summary("demo-etcd", false, 3, 1, Some("3.6.8"));
    assert_eq!(hold_progress(Some(&failing), worse.clone(), true), worse);
    assert_eq!(hold_progress(Some(&failing), worse.clone(), false), failing);
}

#[test]
fn a_component_on_its_way_is_not_ready_in_the_same_words_at_every_step_and_a_failure_is_repeated() {
    let summary = ComponentSummary {
        name: "demo-apiserver".into(),
        ..Default::default()
    };
    let mirror = |status: Option<&ComponentStatus>| {
        component_condition(APISERVER_READY, "NestedAPIServer", Some(&summary), status)
    };
    let steps = [
        mirror(None),
        mirror(Some(&with_ready("WaitingForEtcd", "NestedEtcd demo-etcd is not ready"))),
        mirror(Some(&with_ready("Provisioning", "0/1 members ready"))),
    ];
    assert!(steps.iter().all(|s| !s.status && s.reason == Reason::NotReady.as_str()));
    assert!(steps.iter().all(|s| s.message == steps[0].message), "{steps:?}");
    let failed = mirror(Some(&with_ready(
        "InvalidVersion",
        "version 1.99 is not in channel stable",
    )));
    assert_eq!(failed.reason, "InvalidVersion");
    assert_eq!(
        failed.message,
        "NestedAPIServer demo-apiserver: version 1.99 is not in channel stable"
    );
    let ready = ComponentSummary {
        ready: true,
        ..summary.clone()
    };
    let ready = component_condition(APISERVER_READY, "NestedAPIServer", Some(&ready), None);
    assert!(ready.status);
    let missing = component_condition(APISERVER_READY, "NestedAPIServer", None, None);
    assert_eq!(missing.reason, "ComponentMissing");
}

#[test]
fn summaries_name_each_component_hold_a_first_provisioning_and_leave_out_a_missing_one() {
    let provisioning = ComponentStatus {
        replicas: Some(3),
        ready_replicas: Some(1),
        version: Some("1.36.3".into()),
        ..Default::default()
    };
    let mut without_controller_manager = components(provisioning.clone());
    without_controller_manager.controller_manager = None;
    let shown = ComponentsStatus {
        apiserver: Some(summary("demo-apiserver", false, 0, 0, None)),
        ..Default::default()
    };
    let first = summaries(Some(&shown), &without_controller_manager);
    assert_eq!(first.etcd, Some(summary("demo-etcd", true, 3, 3, Some("3.6.8"))));
    // On its first provisioning: the counts stay as shown.
    assert_eq!(first.apiserver, Some(summary("demo-apiserver", false, 0, 0, None)));
    assert_eq!(first.controller_manager, None);
    // Once it has served (RollingOut True), its counts are news.
    let mut served = provisioning;
    served
        .conditions
        .push(condition_of(ROLLING_OUT, "True", "RollingOut", "1/3 replicas updated"));
    let after = summaries(Some(&shown), &components(served));
    assert_eq!(
        after.apiserver,
        Some(summary("demo-apiserver", false, 3, 1, Some("1.36.3")))
    );
}

#[test]
fn each_component_has_its_own_ready_condition_in_etcd_apiserver_controller_manager_order() {
    let failing = components(with_ready("InvalidVersion", "version 1.99 is not in channel stable"));
    let [etcd, apiserver, controller_manager] = component_conditions(&summaries(None, &failing), &failing);
    assert_eq!((etcd.type_, etcd.status), (ETCD_READY, true));
    assert_eq!(etcd.message, "NestedEtcd demo-etcd is ready");
    assert_eq!((apiserver.type_, apiserver.status), (APISERVER_READY, false));
    assert_eq!(apiserver.reason, "InvalidVersion");
    assert_eq!(
        (controller_manager.type_, controller_manager.status),
        (CONTROLLER_MANAGER_READY, true)
    );
}

#[test]
fn available_names_the_components_that_are_not_ready() {
    let all = ComponentsStatus {
        etcd: Some(summary("demo-etcd", true, 3, 3, None)),
        apiserver: Some(summary("demo-apiserver", true, 1, 1, None)),
        controller_manager: Some(summary("demo-controller-manager", true, 1, 1, None)),
    };
    let up = available(&all);
    assert!(up.status);
    assert_eq!(up.reason, Reason::Available.as_str());
    let some = ComponentsStatus {
        apiserver: Some(summary("demo-apiserver", false, 1, 0, None)),
        controller_manager: None,
        ..all
    };
    let down = available(&some);
    assert_eq!((down.type_, down.status), (AVAILABLE, false));
    assert_eq!(down.reason, Reason::ComponentsNotReady.as_str());
    assert_eq!(down.message, "not ready: apiserver, controller-manager");
}

#[test]
fn rolling_out_repeats_every_component_that_rolls_out_and_nothing_else() {
    let quiet = rolling_out(&components(ready(1, "1.36.3")));
    assert!(!quiet.status);
    assert_eq!(quiet.reason, Reason::NotRollingOut.as_str());
    let mut rolling = components(ComponentStatus {
        conditions: vec![condition_of(ROLLING_OUT, "True", "RollingOut", "apiserver 1/2 updated")],
        ..ready(2, "1.36.3")
    });
    if let Some(etcd) = rolling.etcd.as_mut() {
        let status = etcd.status.get_or_insert_with(Default::default);
        status
            .conditions
            .push(condition_of(ROLLING_OUT, "True", "RollingOut", "etcd 2/3 updated"));
    }
    if let Some(cm) = rolling.controller_manager.as_mut() {
        let status = cm.status.get_or_insert_with(Default::default);
        status
            .conditions
            .push(condition_of(ROLLING_OUT, "False", "NotRollingOut", "settled"));
    }
    let update = rolling_out(&rolling);
    assert!(update.status);
    assert_eq!(update.message, "etcd 2/3 updated; apiserver 1/2 updated");
}

#[test]
fn the_capi_fields_follow_the_apiserver_and_initialization_stays_once_reached() {
    let mut status = NestedControlPlaneStatus::default();
    let first = ComponentsStatus {
        etcd: Some(summary("demo-etcd", true, 3, 3, None)),
        apiserver: Some(summary("demo-apiserver", true, 2, 2, Some("1.36.3"))),
        controller_manager: None,
    };
    show_replicas(&mut status, &first, "demo");
    assert!(!status.ready, "the controller-manager is missing");
    assert!(status.initialized);
    assert_eq!(status.version.as_deref(), Some("1.36.3"));
    assert_eq!(status.selector.as_deref().map(|s| s.contains("demo")), Some(true));
    let degraded = ComponentsStatus {
        apiserver: Some(summary("demo-apiserver", false, 2, 0, Some("1.36.3"))),
        ..first
    };
    show_replicas(&mut status, &degraded, "demo");
    assert!(status.initialized, "a milestone: it stays");
    assert_eq!(status.initialization.map(|i| i.control_plane_initialized), Some(true));
    assert_eq!((status.ready_replicas, status.unavailable_replicas), (Some(0), Some(2)));
}

#[test]
fn a_missing_ca_is_certificates_available_and_any_other_error_is_available_at_its_readiness() {
    let missing = error_condition(&ReconcileError::CertificateAuthorityMissing("demo-ca".into()), true);
    assert_eq!((missing.type_, missing.status), (CERTIFICATES_AVAILABLE, false));
    assert_eq!(missing.reason, "CertificateAuthorityMissing");
    assert!(missing.message.contains("demo-ca"));
    let invalid = ReconcileError::InvalidSpec("spec.certificateValidityPeriod must be positive".into());
    let while_ready = error_condition(&invalid, true);
    assert_eq!((while_ready.type_, while_ready.status), (AVAILABLE, true));
    assert_eq!(while_ready.reason, "InvalidSpec");
    assert!(!error_condition(&invalid, false).status);
}

#[test]
fn a_pass_that_patched_the_spec_says_it_observed_the_patched_generation() {
    let mut status = NestedControlPlaneStatus {
        conditions: vec![
            Condition {
                observed_generation: Some(4),
                ..condition_of(AVAILABLE, "True", "Available", "")
            },
            Condition {
                observed_generation: Some(3),
                ..condition_of(ETCD_READY, "True", "Ready", "")
            },
        ],
        ..Default::default()
    };
    conclude(&mut status, None, Some(4), Some(5), &time(10));
    assert_eq!(status.observed_generation, Some(5));
    let generations: Vec<_> = status.conditions.iter().map(|c| c.observed_generation).collect();
    assert_eq!(generations, [Some(5), Some(3)], "only what this pass observed moves on");
    // No patch: the generation read; a failure sets its condition at that generation.
    let missing = ReconcileError::CertificateAuthorityMissing("demo-ca".into());
    conclude(&mut status, Some(&missing), Some(6), None, &time(20));
    assert_eq!(status.observed_generation, Some(6));
    let certificates = status
        .conditions
        .iter()
        .find(|c| c.type_ == CERTIFICATES_AVAILABLE)
        .unwrap();
    assert_eq!(
        (certificates.status.as_str(), certificates.observed_generation),
        ("False", Some(6))
    );
}

#[test]
fn a_missing_ca_looks_again_after_minutes_and_other_errors_go_back_to_kube_runtime() {
    let missing = action(Err(ReconcileError::CertificateAuthorityMissing("demo-ca".into())));
    assert_eq!(missing.unwrap(), Action::requeue(MISSING_CA_RECHECK));
    assert!(matches!(
        action(Err(ReconcileError::InvalidSpec("bad".into()))),
        Err(ReconcileError::InvalidSpec(_))
    ));
    assert_eq!(action(Ok(Action::await_change())).unwrap(), Action::await_change());
}

#[test]
fn the_pass_looks_again_at_the_renewal_or_sooner_when_the_upgrade_asks() {
    let hour = Duration::from_secs(3600);
    assert_eq!(requeue(hour, None), Action::requeue(hour));
    assert_eq!(
        requeue(hour, Some(Duration::from_secs(20))),
        Action::requeue(Duration::from_secs(20))
    );
    assert_eq!(
        requeue(Duration::from_secs(5), Some(hour)),
        Action::requeue(Duration::from_secs(5))
    );
}

#[test]
fn status_names_the_earliest_expiry_and_the_next_renewal_of_authorities_leaves_and_the_kubeconfig() {
    let at = |s: i64| OffsetDateTime::from_unix_timestamp(s).unwrap();
    let leaves = [
        LeafSchedule {
            secret: "demo-apiserver".into(),
            not_after: at(500),
            renew_at: Some(at(400)),
        },
        LeafSchedule {
            secret: "demo-etcd-server".into(),
            not_after: at(900),
            renew_at: None,
        },
    ];
    let (expires, renewal) = schedule(
        vec![at(1000), at(700)],
        &leaves,
        Some((at(300), "demo-kubeconfig".into())),
    );
    assert_eq!(expires, Some(time(500)));
    let renewal = renewal.unwrap();
    assert_eq!((renewal.secret.as_str(), renewal.time), ("demo-kubeconfig", time(300)));
    let (expires, renewal) = schedule(vec![at(200)], &leaves, None);
    assert_eq!(expires, Some(time(200)));
    assert_eq!(renewal.map(|r| r.secret), Some("demo-apiserver".to_string()));
    assert_eq!(schedule(Vec::new(), &[], None), (None, None));
}

fn pair(cert: &str, key: &str) -> KeyPairPem {
    KeyPairPem {
        cert_pem: format!("-----BEGIN CERTIFICATE-----\n{cert}\n-----END CERTIFICATE-----\n"),
        key_pem: format!("-----BEGIN PRIVATE KEY-----\n{key}\n-----END PRIVATE KEY-----\n"),
    }
}

fn rotation(request: &str, phase: Phase) -> CertificateAuthorityRotation {
    CertificateAuthorityRotation {
        request: request.into(),
        authority: "ca".into(),
        phase: phase.as_str().into(),
        start_time: time(0),
        phases: Vec::new(),
        message: String::new(),
    }
}

#[test]
fn a_rotation_starts_once_per_request_and_never_over_a_running_one() {
    assert_eq!(new_request(Some(" ca "), None), Some("ca".to_string()));
    assert_eq!(new_request(Some(""), None), None);
    assert_eq!(new_request(None, None), None);
    let done = rotation("ca", Phase::Completed);
    assert_eq!(new_request(Some("ca"), Some(&done)), None, "the request carried out");
    assert_eq!(new_request(Some("ca/2"), Some(&done)), Some("ca/2".to_string()));
    let midway = rotation("ca", Phase::TrustBoth);
    assert_eq!(new_request(Some("etcd"), Some(&midway)), None);
    assert!(running(Some(&done)).is_none());
    let (_, authority, phase) = running(Some(&midway)).unwrap();
    assert_eq!((authority, phase), (Authority::Cluster, Phase::TrustBoth));
}

/// The case `rotation::step`'s caller might have had to handle: an authority lost before
/// (or during) its rotation. The pass that finds it lost records the next phase and writes
/// nothing to its Secret; the next pass writes the new authority alone into it, before the
/// certificates stage reads it. So the rest of the pass needs nothing from the step.
#[test]
fn a_lost_authority_is_written_back_by_the_pass_after_the_one_that_records_its_phase() {
    let next = pair("NEW", "newkey");
    let mut lost = rotation("ca", Phase::NewAuthority);
    let phase = record(&mut lost, Phase::NewAuthority, Outcome::Done, true, &time(1));
    assert_eq!(phase, Some(Phase::SignWithNew), "nothing old to trust together");
    assert_eq!(lost.phase, "SignWithNew");
    assert_eq!(lost.phases.len(), 1);
    assert_eq!(
        next_move(Phase::SignWithNew, None, Some(&next)),
        Move::Write(next.clone())
    );
    // Written: the components follow, and the phase waits for them.
    assert_eq!(
        next_move(Phase::SignWithNew, Some(&next), Some(&next)),
        Move::AwaitComponents
    );
    // Lost while both were trusted: nothing to write for TrustBoth; SignWithNew writes it.
    assert_eq!(next_move(Phase::TrustBoth, None, Some(&next)), Move::Advance);
    assert_eq!(Phase::TrustBoth.next(true), Phase::SignWithNew);
    // The new authority lost too: the rotation says so and stays where it is.
    let old = pair("OLD", "oldkey");
    assert_eq!(next_move(Phase::DropOld, Some(&old), None), Move::StateLost);
    let mut stuck = rotation("ca", Phase::DropOld);
    assert_eq!(
        record(&mut stuck, Phase::DropOld, Outcome::StateLost, false, &time(2)),
        None
    );
    assert_eq!(stuck, rotation("ca", Phase::DropOld));
}

#[test]
fn a_waiting_phase_keeps_its_place_and_says_what_it_waits_for() {
    let mut waiting = rotation("etcd", Phase::TrustBoth);
    let outcome = Outcome::Waiting("waiting for NestedEtcd demo-etcd to roll".into());
    assert_eq!(
        record(&mut waiting, Phase::TrustBoth, outcome, false, &time(3)),
        Some(Phase::TrustBoth)
    );
    assert!(waiting.phases.is_empty());
    let update = condition(Authority::Etcd, "demo-etcd", Phase::TrustBoth, &waiting.message);
    assert!(update.status);
    assert_eq!(update.reason, Reason::TrustBoth.as_str());
    assert!(
        update
            .message
            .ends_with("phase TrustBoth: waiting for NestedEtcd demo-etcd to roll")
    );
    let done = condition(Authority::Etcd, "demo-etcd", Phase::Completed, "");
    assert_eq!((done.status, done.reason.as_str()), (false, "Completed"));
}

#[test]
fn the_upgrading_condition_follows_the_phase_and_a_running_step_is_looked_at_by_its_deadline() {
    let upgrade = |phase: &str| UpgradeStatus {
        from: "1.35.2".into(),
        target: "1.36.3".into(),
        phase: phase.into(),
        current_step: None,
        steps: Vec::new(),
        preflight: None,
        retried: None,
        message: "step 1/1".into(),
    };
    let upgrading = upgrading_condition(&upgrade(phase::UPGRADING));
    assert_eq!((upgrading.type_, upgrading.status), (UPGRADING, true));
    assert_eq!(upgrading.message, "step 1/1");
    let failed = upgrading_condition(&upgrade(phase::FAILED));
    assert_eq!((failed.status, failed.reason.as_str()), (false, "UpgradeStepFailed"));
    let waiting = upgrading_condition(&upgrade(phase::PREFLIGHT_FAILED));
    assert_eq!(waiting.reason, Reason::WaitingForPreflight.as_str());
    let ten_minutes = Duration::from_secs(600);
    assert_eq!(
        look_again(&Next::Running, None, ten_minutes),
        Some(Duration::from_secs(60))
    );
    assert_eq!(
        look_again(&Next::Running, None, Duration::from_secs(30)),
        Some(Duration::from_secs(30))
    );
    assert_eq!(
        look_again(&Next::Preflight(0), Some(false), ten_minutes),
        Some(PREFLIGHT_RETRY)
    );
    assert_eq!(look_again(&Next::Preflight(0), Some(true), ten_minutes), None);
    assert_eq!(look_again(&Next::Held, None, ten_minutes), None);
}

#[test]
fn a_preflight_names_each_component_short_of_a_member_and_each_certificate_due_within_the_step() {
    let mut status = NestedControlPlaneStatus {
        components: Some(ComponentsStatus {
            etcd: Some(summary("demo-etcd", true, 3, 3, None)),
            apiserver: Some(summary("demo-apiserver", true, 2, 1, None)),
            controller_manager: None,
        }),
        ..Default::default()
    };
    let components = components_ready_check(&status);
    assert!(!components.passed);
    assert_eq!(
        components.message,
        "not ready: apiserver 1/2 ready, controller-manager missing"
    );
    let hour = Duration::from_secs(3600);
    let now = OffsetDateTime::from_unix_timestamp(1_000_000).unwrap();
    assert!(certificates_check(&status, hour, now).passed, "nothing due");
    status.next_certificate_renewal = Some(crate::api::CertificateRenewal {
        secret: "demo-apiserver".into(),
        time: time(1_000_000 + 1800),
    });
    let due = certificates_check(&status, hour, now);
    assert!(!due.passed);
    assert!(due.message.contains("demo-apiserver"), "{}", due.message);
    assert!(
        certificates_check(&status, Duration::from_secs(600), now).passed,
        "after a shorter step"
    );
}

#[test]
fn removed_apis_hold_the_step_unless_acknowledged_and_an_unread_metric_is_no_pass() {
    let target = semver::Version::new(1, 37, 0);
    let metrics = r#"apiserver_requested_deprecated_apis{group="networking.k8s.io",removed_release="1.37",resource="servicecidrs",subresource="",version="v1beta1"} 1"#;
    let used = crate::upgrade::preflight::deprecated_apis(metrics).unwrap();
    let (check, removed) = removed_apis_check(Ok(used.clone()), false, &target);
    assert!(!check.passed);
    assert!(
        check
            .message
            .contains("servicecidrs.v1beta1.networking.k8s.io (removed in 1.37)"),
        "{}",
        check.message
    );
    assert_eq!(removed.len(), 1);
    assert_eq!(removed[0].removed_release, "1.37");
    let (acknowledged, _) = removed_apis_check(Ok(used.clone()), true, &target);
    assert!(acknowledged.passed);
    let (earlier, removed) = removed_apis_check(Ok(used), false, &semver::Version::new(1, 36, 3));
    assert!(earlier.passed && removed.is_empty(), "1.36 still serves it");
    let (unread, removed) = removed_apis_check(Err("connection refused".into()), false, &target);
    assert!(!unread.passed && removed.is_empty());
    assert!(unread.message.contains("connection refused"));
    assert!(
        removed_apis_check(Err("connection refused".into()), true, &target)
            .0
            .passed
    );
}
