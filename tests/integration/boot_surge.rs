//! Issue 40 item 6, "Rolls without an outage at one replica", proven on a booted tenant with
//! ONE apiserver: a certificate renewal roll, an upgrade step (1.35.4 → 1.36.3: the
//! channel has one patch per minor, so a patch upgrade has no target) and an etcd membership
//! step (1 → 3 members, which changes the apiserver's `--etcd-servers`) each roll the
//! apiserver surge-first (docs/design.md §5 "Surge"): a second apiserver is ready before the
//! old one goes, and the old one drains.
//!
//! Printed for each roll: probes, failures, longest outage of `/readyz` through the tenant's
//! Service. Asserted: the surge happened (two apiservers at once), the StatefulSet is back
//! at one replica, and the longest outage is within the goal of 2 s.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use capn::api::NestedControlPlane;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

use crate::boot::{Booted, StartCapn, boot_with, say, statefulset_settled};
use crate::boot_certificates::{Availability, probe};

/// One roll with its waits (two cores shared with the other tests; an upgrade rolls three
/// StatefulSets).
const ROLL: Duration = Duration::from_secs(300);
/// The goal: at most this long without an answer through a roll.
const GOAL: Duration = Duration::from_secs(2);

/// The apiserver StatefulSet's pod template, as JSON.
async fn template(booted: &Booted) -> serde_json::Value {
    let sts = Api::<StatefulSet>::namespaced(booted.client.clone(), &booted.ns)
        .get("demo-apiserver")
        .await
        .unwrap();
    serde_json::to_value(sts.spec.unwrap().template).unwrap()
}

/// Whether the apiserver's template differs from `before` and its roll is over, surge
/// included: one replica asked for and one pod, ready at the update revision.
async fn rolled_back_to_one(booted: &Booted, before: &serde_json::Value) -> Option<()> {
    let sts = Api::<StatefulSet>::namespaced(booted.client.clone(), &booted.ns)
        .get("demo-apiserver")
        .await
        .ok()?;
    let template = serde_json::to_value(&sts.spec.as_ref()?.template).ok()?;
    (statefulset_settled(&sts, 1) && template != *before).then_some(())
}

/// How many apiserver pods run at once (not being deleted), at most, until `done` (sampled
/// every 100 ms). Two means the roll surged: the runner, as the StatefulSet controller,
/// deletes the old pod only once the surge pod is ready (the moment both are ready can be
/// too short to sample; the pods' lives overlap for seconds).
async fn most_apiservers(booted: &Booted, done: &AtomicBool, most: &AtomicUsize) {
    while !done.load(Ordering::SeqCst) {
        let running = booted
            .runner
            .pods()
            .iter()
            .filter(|p| p.name.starts_with("demo-apiserver-") && !p.deleting)
            .count();
        most.fetch_max(running, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs `step` (which starts a roll and waits for what it is about), then waits for the
/// apiserver to have rolled and come back to one replica, probing `/readyz` all along.
/// Prints and returns what the prober saw and how many apiservers ran at once, at most.
async fn roll(booted: &Booted, label: &str, step: impl Future<Output = ()>) -> (Availability, usize) {
    let before = template(booted).await;
    let done = AtomicBool::new(false);
    let most = AtomicUsize::new(0);
    let started = Instant::now();
    let rolled = async {
        step.await;
        booted
            .runner
            .wait_for(
                &format!("{label}: the apiserver rolled and is back at one replica"),
                ROLL,
                || rolled_back_to_one(booted, &before),
            )
            .await;
        done.store(true, Ordering::SeqCst);
    };
    let (availability, (), ()) = tokio::join!(probe(booted, &done), rolled, most_apiservers(booted, &done, &most));
    say(&format!(
        "surge, 1 apiserver, {label}: {} probes over {:.0?}, {} failed, longest outage {:.1?}",
        availability.probes,
        started.elapsed(),
        availability.failures,
        availability.longest_outage
    ));
    (availability, most.load(Ordering::SeqCst))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boot_one_apiserver_rolls_surge_first_through_renewal_upgrade_and_membership() {
    let docs = vec![
        json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
            "kind": "NestedEtcd",
            "metadata": {"name": "demo-etcd"},
            "spec": {"replicas": 1},
        }),
        json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
            "kind": "NestedControlPlane",
            "metadata": {"name": "demo"},
            "spec": {"version": "1.35", "replicas": 1, "etcd": {"name": "demo-etcd"}},
        }),
    ];
    let booted = boot_with("surge", Some(docs), StartCapn::InProcess).await;
    let ncps: Api<NestedControlPlane> = Api::namespaced(booted.client.clone(), &booted.ns);

    // (1) A renewal roll: the apiserver's etcd client certificate, which it reads only at
    // start, re-issued now (docs/operations/recipes.md "Renew the certificates now").
    let renewal = roll(&booted, "certificate renewal", async {
        Api::<Secret>::namespaced(booted.client.clone(), &booted.ns)
            .delete("demo-apiserver-etcd-client", &DeleteParams::default())
            .await
            .unwrap();
    })
    .await;

    // (2) An upgrade step, 1.35.4 → 1.36.3: etcd, then the apiserver, then the
    // controller-manager roll.
    let upgrade = roll(&booted, "upgrade 1.35.4 → 1.36.3", async {
        ncps.patch(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"version": "1.36"}})),
        )
        .await
        .unwrap();
        booted
            .runner
            .wait_for("the upgrade to 1.36.3 completes", ROLL, || async {
                let status = ncps.get("demo").await.ok()?.status?;
                let completed = status.upgrade.as_ref().is_some_and(|u| u.phase == "Completed");
                (completed && status.ready && status.version.as_deref() == Some("1.36.3")).then_some(())
            })
            .await;
    })
    .await;

    // (3) An etcd membership step, 1 → 3 members: the apiserver rolls onto the new
    // `--etcd-servers`.
    let membership = roll(&booted, "etcd membership 1 → 3", async {
        Api::<capn::api::NestedEtcd>::namespaced(booted.client.clone(), &booted.ns)
            .patch(
                "demo-etcd",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 3}})),
            )
            .await
            .unwrap();
        crate::boot_members::settled(&booted, 3, ROLL).await;
    })
    .await;

    // Asserted once all three are measured, so that a failing run still prints every figure.
    for (label, (availability, most)) in [("renewal", renewal), ("upgrade", upgrade), ("membership", membership)] {
        assert_eq!(most, 2, "{label}: the roll surged (two apiservers at once)");
        assert!(
            availability.longest_outage <= GOAL,
            "{label}: {availability:?} (goal: at most {GOAL:?} without an answer)"
        );
    }

    // The controller-manager ran alone throughout (it never surges), so it runs without
    // leader election at one replica.
    let cm = Api::<StatefulSet>::namespaced(booted.client.clone(), &booted.ns)
        .get("demo-controller-manager")
        .await
        .unwrap();
    let spec = cm.spec.unwrap();
    assert_eq!(spec.replicas, Some(1));
    let args = spec.template.spec.unwrap().containers[0].args.clone().unwrap();
    assert!(args.iter().any(|a| a == "--leader-elect=false"), "{args:?}");
    booted.stop().await;
}
