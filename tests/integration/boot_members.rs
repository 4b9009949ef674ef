//! Issue 10, parts 1, 2 and 5: capn talks to a tenant's etcd (its own client certificate,
//! members dialed by name), changes its membership and replaces a lost member, booted with
//! real etcd processes through the runner.
//!
//! Timings and the writer's error counts are printed, not asserted.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use capn::api::{NestedAPIServer, NestedEtcd};
use capn::etcd::EtcdClients;
use capn::pki::CertificateAuthority;
use capn::status::MEMBERS_SYNCED;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use time::OffsetDateTime;

use crate::boot::{BOOTED_STEP, Booted, StartCapn, boot_with, say};
use crate::harness::{secret, secret_value};

/// The etcd CA of the booted control plane `demo`, as capn loads it.
async fn etcd_ca(client: &kube::Client, ns: &str) -> CertificateAuthority {
    let ca = secret(client, ns, "demo-etcd").await.expect("the etcd CA exists");
    CertificateAuthority::from_pem(&secret_value(&ca, "tls.crt"), &secret_value(&ca, "tls.key")).expect("a CA")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capn_reaches_tenant_etcd_by_name_with_its_own_certificate() {
    let booted = boot_with("etcd client", None, StartCapn::InProcess).await;
    let ns = booted.ns.clone();
    let ca = etcd_ca(&booted.client, &ns).await;
    let now = OffsetDateTime::now_utc();
    let clients = EtcdClients::new(Some(booted.runner.hosts_file()));
    let etcd = clients.cluster(&ns, "demo", &ca, now).unwrap();
    let url = format!("https://demo-etcd-0.demo-etcd.{ns}.svc:2379");
    let members = etcd.member_list(std::slice::from_ref(&url)).await.unwrap();
    assert_eq!(members.len(), 1, "{members:?}");
    assert_eq!(members[0].name, "demo-etcd-0");
    assert_eq!(
        members[0].peer_urls,
        vec![format!("https://demo-etcd-0.demo-etcd.{ns}.svc:2380")]
    );
    assert!(!members[0].learner);
    let status = etcd.status(&url).await.unwrap();
    assert_eq!(status.member_id, members[0].id);
    assert_eq!(status.leader, members[0].id, "a single member leads itself");
    // Issue 40: the member runs with the quota capn sized from its default 1Gi volume.
    assert_eq!(
        u64::try_from(status.db_size_quota).ok(),
        Some(capn::plan::etcd_quota::default_quota_backend_bytes(
            1 << 30,
            capn::plan::etcd_quota::ETCD_DEFAULT_QUOTA_BYTES
        )),
        "{status:?}"
    );
    say(&format!(
        "etcd client: member list and status through {url}; database {} bytes, {} in use, quota {}",
        status.db_size, status.db_size_in_use, status.db_size_quota
    ));

    // The member's certificate is verified for the name dialed: a name it does not carry,
    // mapped to the same address, is refused.
    let address = booted.runner.resolve(&format!("demo-etcd-0.demo-etcd.{ns}.svc"))[0];
    let dir = tempfile::tempdir().unwrap();
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, format!("{address} not-in-the-certificate.{ns}.svc\n")).unwrap();
    let elsewhere = EtcdClients::new(Some(hosts));
    let wrong_name = elsewhere
        .cluster(&ns, "demo", &ca, now)
        .unwrap()
        .member_list(&[format!("https://not-in-the-certificate.{ns}.svc:2379")])
        .await;
    assert!(
        wrong_name.is_err(),
        "a name outside the certificate must fail TLS: {wrong_name:?}"
    );

    // A client certificate from another CA is refused by etcd (mutual TLS).
    let stranger = CertificateAuthority::generate("etcd-ca", now, capn::pki::KeyAlgorithm::EcdsaP256).unwrap();
    let refused = clients
        .cluster(&ns, "stranger", &stranger, now)
        .unwrap()
        .member_list(std::slice::from_ref(&url))
        .await;
    assert!(refused.is_err(), "another CA's client must be refused: {refused:?}");
    booted.stop().await;
}

/// The NestedEtcd `demo-etcd` with `replicas` members and the NestedControlPlane `demo`
/// referencing it; `remediation` goes to `spec.memberRemediation`.
fn etcd_docs(replicas: i32, remediation: serde_json::Value) -> Vec<serde_json::Value> {
    vec![
        json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
            "kind": "NestedEtcd",
            "metadata": {"name": "demo-etcd"},
            "spec": {"replicas": replicas, "memberRemediation": remediation},
        }),
        json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
            "kind": "NestedControlPlane",
            "metadata": {"name": "demo"},
            "spec": {"version": "1.36", "etcd": {"name": "demo-etcd"}},
        }),
    ]
}

/// The members etcd itself lists (through capn's client), as `(name, learner)`, sorted.
async fn listed_members(booted: &Booted) -> Vec<(String, bool)> {
    let ns = &booted.ns;
    let ca = etcd_ca(&booted.client, ns).await;
    let clients = EtcdClients::new(Some(booted.runner.hosts_file()));
    let etcd = clients.cluster(ns, "demo", &ca, OffsetDateTime::now_utc()).unwrap();
    let urls: Vec<String> = (0..7)
        .map(|i| format!("https://demo-etcd-{i}.demo-etcd.{ns}.svc:2379"))
        .collect();
    let mut members: Vec<(String, bool)> = etcd
        .member_list(&urls)
        .await
        .unwrap()
        .into_iter()
        .map(|m| (m.name, m.learner))
        .collect();
    members.sort();
    members
}

/// The NestedEtcd's status once its membership is settled at `count` voting members, all
/// healthy, with the apiserver ready again (it rolls once with the new member list).
pub(crate) async fn settled(booted: &Booted, count: usize, timeout: Duration) -> capn::api::ComponentStatus {
    let etcds: Api<NestedEtcd> = Api::namespaced(booted.client.clone(), &booted.ns);
    let apiservers: Api<NestedAPIServer> = Api::namespaced(booted.client.clone(), &booted.ns);
    let statefulsets: Api<StatefulSet> = Api::namespaced(booted.client.clone(), &booted.ns);
    booted
        .runner
        .wait_for(&format!("{count} etcd members settle"), timeout, || async {
            let etcd = etcds.get("demo-etcd").await.ok()?;
            let s = etcd.status?;
            let members = s.etcd.as_ref()?;
            let done = s.observed_generation == etcd.metadata.generation
                && s.conditions
                    .iter()
                    .any(|c| c.type_ == MEMBERS_SYNCED && c.status == "True")
                && members.members.len() == count
                && members.members.iter().all(|m| m.healthy && !m.learner)
                && s.endpoints.len() == count
                && s.ready;
            let api = apiservers.get("demo-apiserver").await.ok()?.status?;
            // The apiserver has rolled onto exactly these members, and the roll is over.
            let sts = statefulsets.get("demo-apiserver").await.ok()?;
            let args = sts.spec.as_ref()?.template.spec.as_ref()?.containers[0].args.clone()?;
            let servers = args
                .iter()
                .find_map(|a| a.strip_prefix("--etcd-servers="))?
                .split(',')
                .count();
            let rolled = sts.status.as_ref().is_some_and(|st| {
                st.observed_generation == sts.metadata.generation
                    && st.ready_replicas == Some(1)
                    && st.updated_replicas == Some(1)
                    && st.current_revision == st.update_revision
            });
            (done && api.ready && servers == count && rolled).then_some(s)
        })
        .await
}

/// What the writer saw during one phase.
#[derive(Default)]
struct PhaseCount {
    ok: AtomicUsize,
    errors: AtomicUsize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_scales_1_3_5_3_1_under_writes_and_keeps_every_acknowledged_write() {
    let booted = boot_with("etcd scaling", Some(etcd_docs(1, json!({}))), StartCapn::InProcess).await;
    let ns = booted.ns.clone();
    settled(&booted, 1, BOOTED_STEP).await;
    let kubeconfig = booted.kubeconfig().await;
    // The writer: creates ConfigMaps through the tenant's kubeconfig, one after another,
    // counting acknowledged writes and errors per phase; it dials the apiserver afresh after
    // an error (a rolled apiserver pod has a new address).
    let phases: Arc<Vec<PhaseCount>> = Arc::new((0..5).map(|_| PhaseCount::default()).collect());
    let phase = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let acknowledged = Arc::new(Mutex::new(Vec::<String>::new()));
    let writer = {
        let (phases, phase, stop, acknowledged) = (phases.clone(), phase.clone(), stop.clone(), acknowledged.clone());
        let configs = booted.runner.hosts_file();
        let kubeconfig = kubeconfig.clone();
        let ns = ns.clone();
        tokio::spawn(async move {
            let mut client: Option<Api<ConfigMap>> = None;
            let mut n = 0usize;
            while !stop.load(Ordering::SeqCst) {
                if client.is_none() {
                    client = tenant_config_maps(&kubeconfig, &configs, &ns).await;
                }
                let Some(api) = &client else {
                    phases[phase.load(Ordering::SeqCst)]
                        .errors
                        .fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                };
                let name = format!("written-{n}");
                let cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        ..ObjectMeta::default()
                    },
                    ..ConfigMap::default()
                };
                let p = phase.load(Ordering::SeqCst);
                match tokio::time::timeout(Duration::from_secs(10), api.create(&PostParams::default(), &cm)).await {
                    Ok(Ok(_)) => {
                        acknowledged.lock().unwrap().push(name);
                        phases[p].ok.fetch_add(1, Ordering::SeqCst);
                        n += 1;
                    }
                    // Committed by an earlier attempt whose answer was lost: acknowledged now.
                    Ok(Err(kube::Error::Api(e))) if e.code == 409 => {
                        acknowledged.lock().unwrap().push(name);
                        n += 1;
                    }
                    _ => {
                        phases[p].errors.fetch_add(1, Ordering::SeqCst);
                        client = None;
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let etcds: Api<NestedEtcd> = Api::namespaced(booted.client.clone(), &ns);
    let mut report = Vec::new();
    for (i, target) in [3usize, 5, 3, 1].into_iter().enumerate() {
        phase.store(i + 1, Ordering::SeqCst);
        let started = Instant::now();
        etcds
            .patch(
                "demo-etcd",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": target}})),
            )
            .await
            .unwrap();
        let status = settled(&booted, target, Duration::from_secs(420)).await;
        let took = started.elapsed();
        let want: Vec<(String, bool)> = (0..target).map(|i| (format!("demo-etcd-{i}"), false)).collect();
        assert_eq!(
            listed_members(&booted).await,
            want,
            "etcd's own member list after scaling to {target}"
        );
        let names: Vec<&str> = status
            .etcd
            .as_ref()
            .unwrap()
            .members
            .iter()
            .map(|m| m.name.as_str())
            .collect();
        assert_eq!(names, want.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>());
        let sts = Api::<StatefulSet>::namespaced(booted.client.clone(), &ns)
            .get("demo-etcd")
            .await
            .unwrap();
        assert_eq!(sts.spec.unwrap().replicas, Some(i32::try_from(target).unwrap()));
        let line = format!(
            "etcd scaling: → {target} members in {took:.1?}; writer: {} acknowledged, {} errors",
            phases[i + 1].ok.load(Ordering::SeqCst),
            phases[i + 1].errors.load(Ordering::SeqCst)
        );
        say(&line);
        report.push(line);
    }
    // Each learner added has its own Event, naming its Pod as the related object: steps on
    // different members are not folded into one series (capn's Event recorder).
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(booted.client.clone(), &ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let mut added: Vec<(String, Option<i32>)> = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("AddedLearner"))
        .map(|e| {
            let pod = e.related.as_ref().and_then(|r| r.name.clone()).unwrap_or_default();
            (pod, e.series.as_ref().map(|s| s.count))
        })
        .collect();
    added.sort();
    let want: Vec<(String, Option<i32>)> = (1..5).map(|i| (format!("demo-etcd-{i}"), None)).collect();
    assert_eq!(added, want, "one AddedLearner Event per learner, each naming its Pod");
    stop.store(true, Ordering::SeqCst);
    writer.await.unwrap();
    let written = acknowledged.lock().unwrap().clone();
    assert!(written.len() > 20, "the writer kept writing: {} writes", written.len());
    let api = booted
        .runner
        .wait_for("the tenant answers after scaling", BOOTED_STEP, || async {
            let api = tenant_config_maps(&kubeconfig, &booted.runner.hosts_file(), &ns).await?;
            api.list(&ListParams::default()).await.ok().map(|l| (api, l))
        })
        .await;
    let present: std::collections::BTreeSet<String> = api.1.items.iter().map(|c| c.name_any()).collect();
    let missing: Vec<&String> = written.iter().filter(|n| !present.contains(*n)).collect();
    assert!(missing.is_empty(), "acknowledged writes lost: {missing:?}");
    say(&format!(
        "etcd scaling: {} acknowledged writes, all present; steps:\n{}",
        written.len(),
        report.join("\n")
    ));
    booted.stop().await;
}

/// The tenant's `default` ConfigMaps through `kubeconfig`, dialing the apiserver's current
/// address (the runner's hosts file), verifying its certificate for the name.
async fn tenant_config_maps(kubeconfig: &str, hosts: &std::path::Path, _ns: &str) -> Option<Api<ConfigMap>> {
    let parsed = kube::config::Kubeconfig::from_yaml(kubeconfig).ok()?;
    let mut config = kube::Config::from_custom_kubeconfig(parsed, &Default::default())
        .await
        .ok()?;
    let host = config.cluster_url.host()?.to_owned();
    let address = capn::etcd::HostsFile::new(hosts).lookup(&host)?;
    config.tls_server_name = Some(host);
    config.cluster_url = format!("https://{address}:6443").parse().ok()?;
    config.read_timeout = Some(Duration::from_secs(10));
    let client = kube::Client::try_from(config).ok()?;
    Some(Api::namespaced(client, "default"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_data_is_wiped_is_replaced_and_the_data_survives() {
    let booted = boot_with(
        "lost etcd member",
        Some(etcd_docs(3, json!({"unreachableTimeoutSeconds": 10}))),
        StartCapn::InProcess,
    )
    .await;
    let ns = booted.ns.clone();
    let before = settled(&booted, 3, BOOTED_STEP).await;
    let old_id = before
        .etcd
        .unwrap()
        .members
        .iter()
        .find(|m| m.name == "demo-etcd-1")
        .unwrap()
        .id
        .clone();
    let kubeconfig = booted.kubeconfig().await;
    let config_maps = booted
        .runner
        .wait_for("the tenant answers", BOOTED_STEP, || async {
            tenant_config_maps(&kubeconfig, &booted.runner.hosts_file(), &ns).await
        })
        .await;
    let marker = ConfigMap {
        metadata: ObjectMeta {
            name: Some("before-the-loss".into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("kept".to_owned(), "yes".to_owned())])),
        ..ConfigMap::default()
    };
    config_maps.create(&PostParams::default(), &marker).await.unwrap();

    // demo-etcd-1 goes down and its disk with it; it stays down until capn replaces it
    // (capn deletes its claim, upon which the runner starts it on an empty one).
    let lost_at = Instant::now();
    booted.runner.wipe_claim("demo-etcd-1", "data").await.unwrap();
    say("lost etcd member: stopped demo-etcd-1 and emptied its data directory");
    let etcds: Api<NestedEtcd> = Api::namespaced(booted.client.clone(), &ns);
    let replaced = booted
        .runner
        .wait_for(
            "demo-etcd-1 is replaced by a new member",
            Duration::from_secs(420),
            || async {
                let s = etcds.get("demo-etcd").await.ok()?.status?;
                let members = s.etcd?.members;
                let m = members.iter().find(|m| m.name == "demo-etcd-1")?;
                (members.len() == 3 && m.id != old_id && !m.learner && members.iter().all(|m| m.healthy))
                    .then_some(m.id.clone())
            },
        )
        .await;
    say(&format!(
        "lost etcd member: demo-etcd-1 replaced ({old_id} → {replaced}) in {:.1?}",
        lost_at.elapsed()
    ));
    assert_eq!(
        listed_members(&booted).await,
        vec![
            ("demo-etcd-0".to_owned(), false),
            ("demo-etcd-1".to_owned(), false),
            ("demo-etcd-2".to_owned(), false)
        ]
    );
    // The data is intact, and the new member holds it too: read the key from it alone.
    let read = booted
        .runner
        .wait_for("the marker reads back", BOOTED_STEP, || async {
            let api = tenant_config_maps(&kubeconfig, &booted.runner.hosts_file(), &ns).await?;
            api.get("before-the-loss").await.ok()
        })
        .await;
    assert_eq!(read.data.unwrap()["kept"], "yes");
    let ca = etcd_ca(&booted.client, &ns).await;
    let clients = EtcdClients::new(Some(booted.runner.hosts_file()));
    let etcd = clients.cluster(&ns, "demo", &ca, OffsetDateTime::now_utc()).unwrap();
    let kv = etcd
        .client(&format!("https://demo-etcd-1.demo-etcd.{ns}.svc:2379"))
        .await
        .unwrap();
    let key = "/registry/configmaps/default/before-the-loss";
    // A serializable read is answered from the member's own store.
    booted
        .runner
        .wait_for("the new member serves the marker", BOOTED_STEP, || {
            let mut kv = kv.clone();
            async move {
                let got = kv
                    .get(
                        key,
                        Some(etcd_client::GetOptions::new().with_serializable().with_count_only()),
                    )
                    .await
                    .ok()?;
                (got.count() == 1).then_some(())
            }
        })
        .await;
    booted.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_membership_change_waits_while_a_member_is_unhealthy() {
    let booted = boot_with(
        "unhealthy etcd member",
        Some(etcd_docs(3, json!({"enabled": false}))),
        StartCapn::InProcess,
    )
    .await;
    let ns = booted.ns.clone();
    settled(&booted, 3, BOOTED_STEP).await;
    booted.runner.pause_pod("demo-etcd-2").unwrap();
    let etcds: Api<NestedEtcd> = Api::namespaced(booted.client.clone(), &ns);
    etcds
        .patch(
            "demo-etcd",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 5}})),
        )
        .await
        .unwrap();
    let refused = booted
        .runner
        .wait_for("the change is refused", BOOTED_STEP, || async {
            let s = etcds.get("demo-etcd").await.ok()?.status?;
            s.conditions
                .iter()
                .find(|c| c.type_ == MEMBERS_SYNCED && c.status == "False" && c.reason == "EtcdMemberUnhealthy")
                .cloned()
        })
        .await;
    assert!(refused.message.contains("demo-etcd-2"), "{}", refused.message);
    // Nothing changed: three members in etcd, three pods.
    assert_eq!(listed_members(&booted).await.len(), 3);
    let sts = Api::<StatefulSet>::namespaced(booted.client.clone(), &ns)
        .get("demo-etcd")
        .await
        .unwrap();
    assert_eq!(sts.spec.unwrap().replicas, Some(3));
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(booted.client.clone(), &ns)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(
        events
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("EtcdMemberUnhealthy")),
        "a Warning Event says why"
    );
    booted.stop().await;
}
