//! Issue 40 item 1: etcd's space on a booted tenant. A NestedEtcd with a quota of a few MiB
//! is filled through the tenant's apiserver until etcd raises NOSPACE; capn says so on the
//! NestedEtcd (condition and Warning Event), and once the data is deleted it compacts,
//! defragments and disarms the alarm, and the tenant accepts writes again.
//!
//! Timings are printed, not asserted.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use capn::api::NestedEtcd;
use capn::status::ETCD_SPACE_EXHAUSTED;
use k8s_openapi::api::core::v1::{ConfigMap, Event};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

use crate::boot::{BOOTED_STEP, Booted, StartCapn, boot_with, say};
use crate::harness::find_listed;

/// The quota: a few MiB, filled by a handful of ConfigMaps.
const QUOTA: &str = "8Mi";

fn docs(replicas: i32) -> Vec<serde_json::Value> {
    vec![
        json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
            "kind": "NestedEtcd",
            "metadata": {"name": "demo-etcd"},
            "spec": {"replicas": replicas, "storage": {"quotaBackendBytes": QUOTA}},
        }),
        json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
            "kind": "NestedControlPlane",
            "metadata": {"name": "demo"},
            "spec": {"version": "1.36", "etcd": {"name": "demo-etcd"}},
        }),
    ]
}

/// A ConfigMap of about 900 KiB (the apiserver takes at most 1 MiB per object).
fn big(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("filler".to_owned(), "x".repeat(900 * 1024))])),
        ..ConfigMap::default()
    }
}

async fn space_condition(booted: &Booted) -> Option<Condition> {
    Api::<NestedEtcd>::namespaced(booted.client.clone(), &booted.ns)
        .get("demo-etcd")
        .await
        .ok()?
        .status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == ETCD_SPACE_EXHAUSTED)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nospace_is_reported_and_recovered_once_the_data_is_deleted_and_the_tenant_writes_again() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("capn=warn,capn::controllers::component::etcd::space=debug")
        .with_test_writer()
        .try_init();
    let booted = boot_with("etcd NOSPACE", Some(docs(1)), StartCapn::InProcess).await;
    let tenant = booted.nested(&booted.kubeconfig().await).await;
    let config_maps: Api<ConfigMap> = Api::namespaced(tenant, "default");

    // Fill until etcd refuses: each ConfigMap is about 900 KiB, the quota 8 MiB.
    let mut written = Vec::new();
    let refused_at = loop {
        assert!(
            written.len() < 40,
            "40 ConfigMaps of 900 KiB were accepted under an 8 MiB quota"
        );
        let name = format!("filler-{}", written.len());
        match config_maps.create(&PostParams::default(), &big(&name)).await {
            Ok(_) => written.push(name),
            Err(e) if e.to_string().contains("database space exceeded") => break Instant::now(),
            Err(e) => panic!("writing {name}: {e}"),
        }
    };
    say(&format!(
        "etcd NOSPACE: the tenant refused the write after {} ConfigMaps of 900 KiB: database space exceeded",
        written.len()
    ));

    // capn notices within seconds (a Warning Event), compacts and defragments; what the
    // apiserver's history and fragmentation took comes back, so the writes go on until the
    // data itself fills the quota, which capn then says, with the way out.
    let events = Api::<Event>::namespaced(booted.client.clone(), &booted.ns);
    let warned = booted
        .runner
        .wait_for("a Warning Event EtcdNoSpace", BOOTED_STEP, || async {
            find_listed(&events, |e| {
                e.type_.as_deref() == Some("Warning")
                    && e.reason.as_deref() == Some("EtcdNoSpace")
                    && e.involved_object.name.as_deref() == Some("demo-etcd")
            })
            .await
        })
        .await;
    let noticed = refused_at.elapsed();
    say(&format!(
        "etcd NOSPACE: Warning Event within {noticed:.1?} of the refused write: {}",
        warned.message.unwrap_or_default()
    ));
    let mut refused = 1;
    let deadline = Instant::now() + BOOTED_STEP;
    let data_exceeds = loop {
        if let Some(c) = space_condition(&booted)
            .await
            .filter(|c| c.status == "True" && c.reason == "EtcdDataExceedsQuota")
        {
            break c;
        }
        assert!(
            Instant::now() < deadline,
            "no EtcdSpaceExhausted=True EtcdDataExceedsQuota within {BOOTED_STEP:?}: {:?}",
            space_condition(&booted).await
        );
        let name = format!("filler-{}", written.len() + refused);
        match config_maps.create(&PostParams::default(), &big(&name)).await {
            Ok(_) => written.push(name),
            Err(e) if e.to_string().contains("database space exceeded") => refused += 1,
            Err(e) => panic!("writing {name}: {e}"),
        }
    };
    say(&format!(
        "etcd NOSPACE: {} ConfigMaps written, {refused} writes refused; condition: {}",
        written.len(),
        data_exceeds.message
    ));
    assert!(
        data_exceeds.message.contains("spec.storage.quotaBackendBytes") && data_exceeds.message.contains("8.0MiB"),
        "the message names the quota and how to raise it: {}",
        data_exceeds.message
    );

    // Deletes are accepted under NOSPACE; capn then compacts, defragments and disarms.
    let deleting = Instant::now();
    for name in &written {
        config_maps.delete(name, &DeleteParams::default()).await.unwrap();
    }
    let recovered = booted
        .runner
        .wait_for("EtcdSpaceExhausted=False", BOOTED_STEP, || async {
            space_condition(&booted).await.filter(|c| c.status == "False")
        })
        .await;
    assert_eq!(recovered.reason, "EtcdSpaceAvailable", "{recovered:?}");
    let space = Api::<NestedEtcd>::namespaced(booted.client.clone(), &booted.ns)
        .get("demo-etcd")
        .await
        .unwrap()
        .status
        .and_then(|s| s.etcd_space)
        .expect("status.etcdSpace");
    assert_eq!(space.quota_backend_bytes, 8 << 20);
    let defragmentation = space
        .last_defragmentation
        .clone()
        .expect("a defragmentation was recorded");
    assert_eq!(defragmentation.members, ["demo-etcd-0"]);
    assert_eq!(defragmentation.trigger, "NOSPACE");
    say(&format!(
        "etcd NOSPACE: disarmed {:.1?} after the deletes began; sizes now {:?}",
        deleting.elapsed(),
        space.members
    ));

    // The tenant writes again.
    let again = Instant::now();
    booted
        .runner
        .wait_for("the tenant accepts a write", BOOTED_STEP, || async {
            config_maps
                .create(&PostParams::default(), &big("after-recovery"))
                .await
                .ok()
        })
        .await;
    say(&format!(
        "etcd NOSPACE: the tenant wrote again {:.1?} after the alarm was disarmed",
        again.elapsed()
    ));
    booted.stop().await;
}

/// Three members: the recovery defragments the followers first and the leader last, and
/// the data written before the alarm (and not deleted) is all there afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nospace_recovery_on_three_members_defragments_the_followers_first_and_the_leader_last() {
    let booted = boot_with("etcd NOSPACE, 3 members", Some(docs(3)), StartCapn::InProcess).await;
    let tenant = booted.nested(&booted.kubeconfig().await).await;
    let config_maps: Api<ConfigMap> = Api::namespaced(tenant, "default");
    // Writes until the first refusal; what fragmentation and history took is then given
    // back by compaction and defragmentation, and the alarm disarmed.
    let mut written = Vec::new();
    loop {
        assert!(
            written.len() < 40,
            "40 ConfigMaps of 900 KiB were accepted under an 8 MiB quota"
        );
        let name = format!("filler-{}", written.len());
        match config_maps.create(&PostParams::default(), &big(&name)).await {
            Ok(_) => written.push(name),
            Err(e) if e.to_string().contains("database space exceeded") => break,
            Err(e) => panic!("writing {name}: {e}"),
        }
    }
    // At the first refusal the data alone may take 90% of the quota (then capn rightly
    // reports EtcdDataExceedsQuota and defragments nothing): delete every other ConfigMap
    // (deletes are accepted under NOSPACE) so that it fits once compacted.
    let mut kept = Vec::new();
    for (i, name) in written.into_iter().enumerate() {
        if i % 2 == 0 {
            config_maps.delete(&name, &DeleteParams::default()).await.unwrap();
        } else {
            kept.push(name);
        }
    }
    let written = kept;
    let etcds = Api::<NestedEtcd>::namespaced(booted.client.clone(), &booted.ns);
    let (defragmentation, leader) = booted
        .runner
        .wait_for(
            "a NOSPACE defragmentation of the three members",
            // One member at a time, each once the others answer with a leader: on two
            // loaded cores (a full CI run) this took longer than one step.
            BOOTED_STEP * 4,
            || async {
                let status = etcds.get("demo-etcd").await.ok()?.status?;
                let defragmentation = status.etcd_space?.last_defragmentation?;
                let leader = defragmentation.leader.clone();
                (defragmentation.members.len() == 3 && defragmentation.trigger == "NOSPACE")
                    .then_some((defragmentation, leader))
            },
        )
        .await;
    say(&format!(
        "etcd NOSPACE, 3 members: defragmented in the order {:?} (leader {leader:?}) after {} ConfigMaps",
        defragmentation.members,
        written.len()
    ));
    let mut sorted = defragmentation.members.clone();
    sorted.sort();
    assert_eq!(sorted, ["demo-etcd-0", "demo-etcd-1", "demo-etcd-2"]);
    assert_eq!(defragmentation.members.last(), leader.as_ref(), "the leader goes last");
    // Every ConfigMap acknowledged before the alarm and not deleted is still there.
    for name in &written {
        config_maps
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("{name} was acknowledged: {e}"));
    }
    booted.stop().await;
}

/// One defragmentation as the member's etcd logged it (its Maintenance server logs
/// `starting defragment` and `finished defragment`): etcd's own account, not capn's.
#[derive(Debug)]
struct LoggedDefragmentation {
    member: String,
    started: Timestamp,
    finished: Timestamp,
}

/// etcd's `ts` (zap ISO 8601: `2026-12-07T04:10:00.123Z` or `…+0000`) as a timestamp.
fn etcd_time(ts: &str) -> Option<Timestamp> {
    let ts = ts.trim();
    let bytes = ts.as_bytes();
    // `+hhmm` → `+hh:mm`, which RFC 3339 wants.
    let normal = if bytes.len() > 5
        && matches!(bytes[bytes.len() - 5], b'+' | b'-')
        && ts[ts.len() - 4..].bytes().all(|b| b.is_ascii_digit())
    {
        format!("{}:{}", &ts[..ts.len() - 2], &ts[ts.len() - 2..])
    } else {
        ts.to_owned()
    };
    normal.parse().ok()
}

/// Every defragmentation a member's etcd logged, from its container's log.
fn logged_defragmentations(booted: &Booted, member: &str) -> Vec<LoggedDefragmentation> {
    let pod = booted
        .runner
        .pods()
        .into_iter()
        .find(|p| p.name == member)
        .unwrap_or_else(|| panic!("no pod {member}"));
    let mut logged = Vec::new();
    let mut started = None;
    for container in pod.containers.iter().filter(|c| c.name == "etcd") {
        let text = std::fs::read_to_string(&container.log).unwrap_or_default();
        for line in text.lines() {
            let Ok(entry) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let ts = entry["ts"].as_str().and_then(etcd_time);
            match entry["msg"].as_str() {
                Some("starting defragment") => started = ts,
                Some("finished defragment") => {
                    if let (Some(s), Some(f)) = (started.take(), ts) {
                        logged.push(LoggedDefragmentation {
                            member: member.to_owned(),
                            started: s,
                            finished: f,
                        });
                    }
                }
                _ => {}
            }
        }
    }
    logged
}

/// Issue 40 item 1: a scheduled defragmentation of three members while a writer writes
/// through the tenant's apiserver. etcd's own logs show one member at a time, the leader
/// last; every write the apiserver acknowledged is there afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_defragmentation_of_three_members_under_a_writer_is_one_at_a_time_and_loses_no_write() {
    let mut docs = docs(3);
    // Every minute; the threshold off, so only the schedule defragments.
    docs[0]["spec"]["defragmentation"] = json!({"schedule": "* * * * *", "thresholdPercent": 0});
    docs[0]["spec"].as_object_mut().unwrap().remove("storage");
    let booted = boot_with("etcd scheduled defragmentation", Some(docs), StartCapn::InProcess).await;
    let tenant = booted.nested(&booted.kubeconfig().await).await;
    let config_maps: Api<ConfigMap> = Api::namespaced(tenant, "default");

    // The writer: small ConfigMaps one after another, counting what was acknowledged.
    let begun = Timestamp::now();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, config_maps) = (stop.clone(), config_maps.clone());
        tokio::spawn(async move {
            let (mut acknowledged, mut errors) = (Vec::new(), 0usize);
            while !stop.load(Ordering::SeqCst) {
                let name = format!("written-{}", acknowledged.len());
                let cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        ..ObjectMeta::default()
                    },
                    data: Some(BTreeMap::from([("n".to_owned(), name.clone())])),
                    ..ConfigMap::default()
                };
                match tokio::time::timeout(Duration::from_secs(10), config_maps.create(&PostParams::default(), &cm))
                    .await
                {
                    Ok(Ok(_)) => acknowledged.push(name),
                    // Committed by an attempt whose answer was lost: acknowledged now.
                    Ok(Err(kube::Error::Api(e))) if e.code == 409 => acknowledged.push(name),
                    _ => errors += 1,
                }
                // Paced, not waited on: about ten writes a second.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (acknowledged, errors)
        })
    };

    // A scheduled run that finished after the writer began, over all three members.
    let etcds = Api::<NestedEtcd>::namespaced(booted.client.clone(), &booted.ns);
    let recorded = booted
        .runner
        .wait_for(
            "a scheduled defragmentation of the three members after the writer began",
            // The schedule fires each minute; each member waits until the others answer.
            BOOTED_STEP * 2,
            || async {
                let defragmentation = etcds
                    .get("demo-etcd")
                    .await
                    .ok()?
                    .status?
                    .etcd_space?
                    .last_defragmentation?;
                let finished: Timestamp = defragmentation.time.parse().ok()?;
                (defragmentation.trigger == "Schedule" && defragmentation.members.len() == 3 && finished > begun)
                    .then_some(defragmentation)
            },
        )
        .await;
    stop.store(true, Ordering::SeqCst);
    let (acknowledged, errors) = writer.await.unwrap();

    // No acknowledged write is lost.
    let present: std::collections::BTreeSet<String> = config_maps
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    let lost: Vec<&String> = acknowledged.iter().filter(|n| !present.contains(*n)).collect();
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");

    // etcd's own logs: never two members at once, and the run capn recorded is the last
    // three that finished before its record, in its order, the leader last.
    let mut logged: Vec<LoggedDefragmentation> = ["demo-etcd-0", "demo-etcd-1", "demo-etcd-2"]
        .iter()
        .flat_map(|m| logged_defragmentations(&booted, m))
        .filter(|d| d.finished >= begun)
        .collect();
    logged.sort_by_key(|d| d.started);
    for pair in logged.windows(2) {
        assert!(
            pair[1].started >= pair[0].finished,
            "two members defragmented at once: {pair:?}"
        );
    }
    // The record's time is taken after the leader's call returned; etcd's ms-precision
    // timestamps may round up past it.
    let recorded_at: Timestamp = recorded.time.parse().unwrap();
    let slack = k8s_openapi::jiff::SignedDuration::from_secs(1);
    let before_record: Vec<&str> = logged
        .iter()
        .filter(|d| d.finished <= recorded_at + slack)
        .map(|d| d.member.as_str())
        .collect();
    let run = &before_record[before_record.len().saturating_sub(3)..];
    assert_eq!(
        run, recorded.members,
        "etcd's logs and capn's record agree on the order"
    );
    assert_eq!(
        recorded.members.last(),
        recorded.leader.as_ref(),
        "the leader goes last"
    );
    let leader_now = etcds
        .get("demo-etcd")
        .await
        .unwrap()
        .status
        .and_then(|s| s.etcd)
        .and_then(|e| e.leader);
    say(&format!(
        "etcd scheduled defragmentation: order {:?} (leader {:?}, etcd's leader now {leader_now:?}); {} defragmentations logged since the writer began, none overlapping; the writer: {} acknowledged, {errors} errors, none lost",
        recorded.members,
        recorded.leader,
        logged.len(),
        acknowledged.len()
    ));
    booted.stop().await;
}
