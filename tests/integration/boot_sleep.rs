//! Issue 40 item 2, sleep and wake (docs/design.md §12), proven on a booted tenant (the
//! runner plays the StatefulSet controller and the kubelet): `spec.hibernation.enabled`
//! scales every control-plane pod to zero, controller-manager first and etcd last, keeps
//! the data and says `Sleeping`; waking brings etcd, the apiserver and the
//! controller-manager back in that order, with every object there, a kubeconfig from before
//! the sleep still working, and a certificate renewal that fell due during the sleep done
//! before the pods came back.

use std::time::{Duration, Instant};

use capn::api::{ComponentStatus, NestedAPIServer, NestedControlPlane, NestedControllerManager, NestedEtcd};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::boot::{BOOTED_STEP, Booted, StartCapn, boot_with, say};
use crate::harness::{secret, secret_value};

/// Leaf validity: long enough that the admin kubeconfig read before the sleep is still
/// valid after wake, short enough that a renewal (at two thirds) falls due during it.
const VALIDITY_SECONDS: u64 = 300;

/// The leaf whose renewal falls due while asleep: the apiserver's serving certificate.
const LEAF: &str = "demo-apiserver";

fn cert_times(booted_secret: &k8s_openapi::api::core::v1::Secret) -> (String, i64, i64) {
    let pem = secret_value(booted_secret, "tls.crt");
    let der = crate::harness::pem_to_der(&pem);
    let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("a certificate");
    let validity = cert.validity();
    (pem, validity.not_before.timestamp(), validity.not_after.timestamp())
}

fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

async fn set_hibernation(client: &Client, ns: &str, enabled: bool) {
    Api::<NestedControlPlane>::namespaced(client.clone(), ns)
        .patch(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"hibernation": {"enabled": enabled}}})),
        )
        .await
        .unwrap();
}

async fn control_plane(client: &Client, ns: &str) -> NestedControlPlane {
    Api::<NestedControlPlane>::namespaced(client.clone(), ns)
        .get("demo")
        .await
        .unwrap()
}

/// When the component's Ready condition last changed, its reason, and its phase.
fn ready_transition(status: Option<&ComponentStatus>) -> Option<(Time, String, String)> {
    let status = status?;
    let ready = condition(&status.conditions, "Ready")?;
    Some((
        ready.last_transition_time.clone(),
        ready.reason.clone(),
        status.phase.clone().unwrap_or_default(),
    ))
}

/// [`ready_transition`] of etcd, the apiserver and the controller-manager.
async fn transitions(client: &Client, ns: &str) -> [(Time, String, String); 3] {
    let etcd = Api::<NestedEtcd>::namespaced(client.clone(), ns)
        .get("demo-etcd")
        .await
        .unwrap();
    let apiserver = Api::<NestedAPIServer>::namespaced(client.clone(), ns)
        .get("demo-apiserver")
        .await
        .unwrap();
    let cm = Api::<NestedControllerManager>::namespaced(client.clone(), ns)
        .get("demo-controller-manager")
        .await
        .unwrap();
    [
        ready_transition(etcd.status.as_ref()).expect("etcd's Ready"),
        ready_transition(apiserver.status.as_ref()).expect("the apiserver's Ready"),
        ready_transition(cm.status.as_ref()).expect("the controller-manager's Ready"),
    ]
}

/// Control-plane pods the runner runs, by component.
fn running(booted: &Booted) -> Vec<String> {
    booted
        .runner
        .pods()
        .into_iter()
        .filter(|p| p.name.starts_with("demo-"))
        .map(|p| p.name)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boot_sleep_and_wake_keep_everything_and_renew_what_fell_due() {
    let docs = vec![json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
        "kind": "NestedControlPlane",
        "metadata": {"name": "demo"},
        "spec": {"version": "1.36", "certificateValidityPeriod": format!("{VALIDITY_SECONDS}s")},
    })];
    let started = Instant::now();
    let booted = boot_with("boot_sleep", Some(docs), StartCapn::InProcess).await;
    let (client, ns) = (booted.client.clone(), booted.ns.clone());

    // Tenant objects, and a kubeconfig kept from before the sleep.
    let kubeconfig = booted.kubeconfig().await;
    let tenant = booted.nested(&kubeconfig).await;
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": "kept"}})).unwrap();
    Api::<Namespace>::all(tenant.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    let config_map: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "kept"}, "data": {"answer": "42"}})).unwrap();
    Api::<ConfigMap>::namespaced(tenant.clone(), "kept")
        .create(&PostParams::default(), &config_map)
        .await
        .unwrap();
    drop(tenant);

    let leaf = secret(&client, &ns, LEAF).await.expect("the apiserver certificate");
    let (before_pem, not_before, not_after) = cert_times(&leaf);
    // capn renews at two thirds of the lifetime counted from the issue time, which is
    // NOT_BEFORE_BACKDATE after notBefore (capn::pki::RenewalPolicy::renew_at).
    let issued = not_before + capn::pki::NOT_BEFORE_BACKDATE.whole_seconds();
    let renew_at = issued + (not_after - issued) * 2 / 3;

    // Sleep.
    let asked = Instant::now();
    set_hibernation(&client, &ns, true).await;
    let asleep = booted
        .runner
        .wait_for("the control plane sleeps", BOOTED_STEP, || async {
            let ncp = control_plane(&client, &ns).await;
            let status = ncp.status?;
            (status.hibernation.as_ref()?.phase == "Sleeping").then_some(status)
        })
        .await;
    let slept_in = asked.elapsed();
    say(&format!("boot_sleep: asked → Sleeping in {slept_in:.1?}"));
    booted
        .runner
        .wait_for("no control-plane pod runs", BOOTED_STEP, || async {
            running(&booted).is_empty().then_some(())
        })
        .await;
    let hibernated = condition(&asleep.conditions, "Hibernated").expect("Hibernated");
    assert_eq!(
        (hibernated.status.as_str(), hibernated.reason.as_str()),
        ("True", "Sleeping")
    );
    let available = condition(&asleep.conditions, "Available").expect("Available");
    assert_eq!(
        (available.status.as_str(), available.reason.as_str()),
        ("False", "Sleeping")
    );
    assert!(!asleep.ready, "status.ready is false while asleep");
    assert!(asleep.initialized, "initialized is a milestone: it stays");
    assert!(asleep.version.is_some(), "the version stays: it is what wakes");
    // Scaled down from the last: controller-manager, apiserver, etcd.
    let [etcd, apiserver, cm] = transitions(&client, &ns).await;
    for (name, (_, reason, phase)) in [("controller-manager", &cm), ("apiserver", &apiserver), ("etcd", &etcd)] {
        assert_eq!((reason.as_str(), phase.as_str()), ("Sleeping", "Sleeping"), "{name}");
    }
    assert!(
        cm.0 <= apiserver.0 && apiserver.0 <= etcd.0,
        "slept in order: controller-manager {cm:?}, apiserver {apiserver:?}, etcd {etcd:?}"
    );
    // The data is kept: the claim stays, and the StatefulSet retains claims when scaled.
    let sts = Api::<StatefulSet>::namespaced(client.clone(), &ns)
        .get("demo-etcd")
        .await
        .unwrap();
    let spec = sts.spec.unwrap();
    assert_eq!(spec.replicas, Some(0));
    assert_eq!(
        spec.persistent_volume_claim_retention_policy
            .and_then(|p| p.when_scaled)
            .as_deref(),
        Some("Retain"),
        "etcd's whenScaled: Delete would delete the members' claims at zero replicas"
    );
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns)
        .list(&Default::default())
        .await
        .unwrap();
    assert!(
        claims
            .items
            .iter()
            .any(|c| c.metadata.name.as_deref().is_some_and(|n| n.contains("demo-etcd-0"))),
        "the etcd member's claim is kept"
    );
    assert_eq!(
        asleep
            .components
            .as_ref()
            .and_then(|c| c.etcd.as_ref())
            .map(|e| e.replicas),
        Some(1),
        "the components keep their replicas"
    );

    // A renewal falls due while asleep, and nothing renews it before wake: its pods are gone.
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    };
    let wait = u64::try_from(renew_at + 5 - now()).unwrap_or(0);
    say(&format!("boot_sleep: asleep; the {LEAF} renewal falls due in {wait} s"));
    booted
        .runner
        .wait_for(
            "the renewal falls due while asleep",
            Duration::from_secs(wait + 60),
            || async { (now() > renew_at + 5).then_some(()) },
        )
        .await;
    let still = secret(&client, &ns, LEAF).await.unwrap();
    assert_eq!(secret_value(&still, "tls.crt"), before_pem, "not renewed while asleep");
    assert!(running(&booted).is_empty(), "still asleep");

    // Wake.
    let woken = Instant::now();
    set_hibernation(&client, &ns, false).await;
    let awake = booted
        .runner
        .wait_for("the control plane is awake and ready", BOOTED_STEP * 2, || async {
            let status = control_plane(&client, &ns).await.status?;
            (status.ready && status.hibernation.as_ref()?.phase == "Awake").then_some(status)
        })
        .await;
    let woke_in = woken.elapsed();
    say(&format!("boot_sleep: asked → awake and ready in {woke_in:.1?}"));
    let available = condition(&awake.conditions, "Available").unwrap();
    assert_eq!(available.status, "True");
    let hibernated = condition(&awake.conditions, "Hibernated").unwrap();
    assert_eq!(
        (hibernated.status.as_str(), hibernated.reason.as_str()),
        ("False", "Awake")
    );
    let record = awake.hibernation.unwrap();
    assert!(record.sleep_time.is_some() && record.wake_time.is_some() && record.awake_time.is_some());
    // Woken from the first: etcd, apiserver, controller-manager.
    let [etcd, apiserver, cm] = transitions(&client, &ns).await;
    for (name, (_, reason, _)) in [("etcd", &etcd), ("apiserver", &apiserver), ("controller-manager", &cm)] {
        assert_eq!(reason, "Ready", "{name}");
    }
    assert!(
        etcd.0 <= apiserver.0 && apiserver.0 <= cm.0,
        "woken in order: etcd {etcd:?}, apiserver {apiserver:?}, controller-manager {cm:?}"
    );
    // The renewal that fell due happened on wake, before the apiserver came back.
    let renewed = secret(&client, &ns, LEAF).await.unwrap();
    let (renewed_pem, renewed_not_before, _) = cert_times(&renewed);
    assert_ne!(renewed_pem, before_pem, "the renewal due during sleep happened on wake");
    assert!(renewed_not_before > not_before);
    // The kubeconfig from before the sleep works, and every object is back.
    let tenant = booted.nested(&kubeconfig).await;
    let kept = Api::<ConfigMap>::namespaced(tenant.clone(), "kept")
        .get("kept")
        .await
        .expect("the object made before the sleep, through the kubeconfig from before");
    assert_eq!(kept.data.unwrap()["answer"], "42");
    Api::<Namespace>::all(tenant).get("kept").await.unwrap();
    say(&format!(
        "boot_sleep: sleep {slept_in:.1?}, wake {woke_in:.1?}, whole test {:.0?}",
        started.elapsed()
    ));
    booted.stop().await;
}
