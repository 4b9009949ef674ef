//! Backup and restore of a booted tenant (issue 10, parts 3 and 4), with real etcd
//! processes through the runner and a real S3 server (s3s-fs):
//! 1. a tenant with about 1,000 ConfigMaps, written through its admin kubeconfig;
//! 2. a snapshot from etcd's maintenance API (`Snapshot`, through etcd's own v3 JSON gateway
//!    with the apiserver's etcd client certificate), streamed by capn's store into a
//!    multipart upload, verified (size and SHA-256 read back) and recorded;
//! 3. the control plane deleted, and a new one created with the original CA Secrets
//!    (user-supplied, as capn supports) and a NestedEtcd that restores from `latest`: capn
//!    checks the snapshot, the runner runs the restore init containers (capn's
//!    `etcd-restore fetch`, `etcdutl snapshot restore`, `etcd-restore commit`);
//! 4. every ConfigMap is back, read through the kubeconfig saved before the backup.
//!
//! Times and sizes are printed, not asserted.

use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use capn::api::{NestedControlPlane, NestedEtcd};
use capn::backup::naming::snapshot_key;
use capn::backup::store::{Destination, Store};
use futures::{AsyncBufReadExt, StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

use crate::boot::{STEP, StartCapn, boot_with, etcd_member, say};
use crate::harness::{apply_doc, secret};
use crate::support::s3::{self, ACCESS_KEY_ID, SECRET_ACCESS_KEY};

/// ConfigMaps written into the tenant before the backup.
const CONFIG_MAPS: usize = 1000;
/// The CA Secrets a restored control plane needs to keep old kubeconfigs working.
const CA_SECRETS: [&str; 4] = ["demo-ca", "demo-etcd", "demo-proxy", "demo-sa"];

/// etcd's `Maintenance.Snapshot` through its JSON gateway: newline-delimited
/// `{"result": {"header": {"revision": ..}, "blob": <base64>, ..}}` messages, as a stream of
/// bytes, and the revision of the first message.
async fn snapshot_stream(
    client: &kube::Client,
) -> (
    i64,
    impl futures::Stream<Item = Result<Bytes, std::io::Error>> + use<>,
) {
    let request = http::Request::post("/v3/maintenance/snapshot")
        .header("Content-Type", "application/json")
        .body(b"{}".to_vec())
        .unwrap();
    let reader = client.request_stream(request).await.expect("etcd answers the snapshot request");
    let mut lines = reader.lines().map_err(|e| std::io::Error::other(e.to_string())).map(|line| {
        let line = line?;
        let message: serde_json::Value =
            serde_json::from_str(&line).map_err(|e| std::io::Error::other(format!("{e}: {line:.200}")))?;
        if let Some(error) = message.get("error") {
            return Err(std::io::Error::other(format!("etcd: {error}")));
        }
        let result = &message["result"];
        let revision = result["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse::<i64>().ok())
            .unwrap_or_default();
        let blob = base64::engine::general_purpose::STANDARD
            .decode(result["blob"].as_str().unwrap_or_default())
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok((revision, Bytes::from(blob)))
    });
    let first = lines.next().await.expect("etcd sends at least one message").expect("a snapshot message");
    let revision = first.0;
    let rest = futures::stream::once(async move { Ok(first.1) }).chain(lines.map_ok(|(_, blob)| blob));
    (revision, rest)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backed_up_tenant_is_restored_into_a_new_control_plane_with_every_object() {
    let booted = boot_with("backup-restore", None, StartCapn::InProcess).await;
    let (client, ns) = (booted.client.clone(), booted.ns.clone());
    let kubeconfig = booted.kubeconfig().await;
    let tenant = booted.nested(&kubeconfig).await;

    // 1. About 1,000 ConfigMaps, 16 at a time.
    let started = Instant::now();
    let config_maps: Api<ConfigMap> = Api::namespaced(tenant.clone(), "default");
    futures::stream::iter(0..CONFIG_MAPS)
        .map(|i| {
            let api = config_maps.clone();
            async move {
                let cm: ConfigMap = serde_json::from_value(json!({
                    "metadata": {"name": format!("cm-{i:04}")},
                    "data": {"index": i.to_string(), "payload": "x".repeat(256)}
                }))
                .unwrap();
                api.create(&PostParams::default(), &cm).await.map(|_| ())
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await
        .expect("every ConfigMap is created");
    say(&format!("backup-restore: {CONFIG_MAPS} ConfigMaps written in {:.1?}", started.elapsed()));

    // 2. Snapshot → S3, verified. The S3 server also listens on the runner's host address,
    // which the restore init containers reach.
    let listener = s3::s3().serve_on(booted.runner.host_address()).expect("s3s-fs on the pod network");
    let bucket = s3::s3().bucket();
    let prefix = format!("{ns}/demo-etcd");
    let store = Store::connect(Destination {
        endpoint: listener.endpoint().to_string(),
        bucket: bucket.clone(),
        region: "us-east-1".into(),
        prefix: prefix.clone(),
        access_key_id: ACCESS_KEY_ID.into(),
        secret_access_key: SECRET_ACCESS_KEY.into(),
        session_token: None,
    })
    .unwrap();
    let etcd = etcd_member(&booted, "demo-etcd-0").await;
    let status = crate::boot::etcd_call(&etcd, "/v3/maintenance/status", json!({})).await.unwrap();
    let etcd_version = status["version"].as_str().unwrap().to_string();
    let started = Instant::now();
    let now = k8s_openapi::jiff::Timestamp::now();
    let key = snapshot_key(&prefix, now);
    let (revision, stream) = snapshot_stream(&etcd).await;
    let record = store
        .upload_snapshot(&key, stream, revision, &etcd_version, &now.to_string())
        .await
        .expect("the snapshot is uploaded and verified");
    say(&format!(
        "backup-restore: snapshot of etcd {etcd_version} at revision {revision}: {} bytes ({:.1} MiB), streamed, uploaded and verified in {:.1?}",
        record.size,
        record.size as f64 / (1024.0 * 1024.0),
        started.elapsed()
    ));

    // 3. Keep the CAs, delete the control plane, wait until nothing of it runs.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let mut kept = Vec::new();
    for name in CA_SECRETS {
        let s = secret(&client, &ns, name).await.unwrap_or_else(|| panic!("{name} exists"));
        kept.push((name, s.type_.clone(), s.data.clone().unwrap_or_default()));
    }
    Api::<NestedControlPlane>::namespaced(client.clone(), &ns)
        .delete("demo", &DeleteParams::foreground())
        .await
        .unwrap();
    let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    booted
        .runner
        .wait_for("the old control plane and its CAs are gone", STEP * 2, || async {
            let sets = statefulsets.list(&ListParams::default()).await.ok()?;
            let mut cas_gone = true;
            for name in CA_SECRETS {
                cas_gone &= secrets.get_opt(name).await.ok()?.is_none();
            }
            (sets.items.is_empty() && booted.runner.pods().is_empty() && cas_gone).then_some(())
        })
        .await;

    // 4. The same CAs (user-supplied now), the credentials, and a new control plane whose
    // etcd restores the latest snapshot.
    for (name, type_, data) in kept {
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_string()),
                ..Default::default()
            },
            type_,
            data: Some(data),
            ..Default::default()
        };
        secrets.create(&PostParams::default(), &secret).await.unwrap();
    }
    apply_doc(
        &client,
        &ns,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3-credentials"},
               "stringData": {"AWS_ACCESS_KEY_ID": ACCESS_KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY}}),
    )
    .await;
    let started = Instant::now();
    apply_doc(
        &client,
        &ns,
        json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedEtcd",
               "metadata": {"name": "demo-etcd"},
               "spec": {"restore": {"source": {"endpoint": listener.endpoint(), "bucket": bucket, "prefix": prefix,
                                                "credentialsSecret": {"name": "s3-credentials"}}}}}),
    )
    .await;
    apply_doc(
        &client,
        &ns,
        json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedControlPlane",
               "metadata": {"name": "demo"}, "spec": {"etcd": {"name": "demo-etcd"}}}),
    )
    .await;
    let ncps: Api<NestedControlPlane> = Api::namespaced(client.clone(), &ns);
    booted
        .runner
        .wait_for("the restored control plane is ready", Duration::from_secs(420), || async {
            ncps.get_opt("demo").await.ok()??.status.filter(|s| s.ready).map(|_| ())
        })
        .await;
    say(&format!(
        "backup-restore: new control plane from the snapshot (check, fetch, etcdutl restore, commit, boot) ready in {:.1?}",
        started.elapsed()
    ));
    let etcds: Api<NestedEtcd> = Api::namespaced(client.clone(), &ns);
    let restored = etcds.get("demo-etcd").await.unwrap().status.unwrap().restore.unwrap();
    assert_eq!(restored.snapshot.as_ref().unwrap().key, key);
    assert_eq!(restored.snapshot.as_ref().unwrap().sha256, record.sha256);

    // 5. The kubeconfig saved before the backup works, and every ConfigMap is back.
    let tenant = booted.nested(&kubeconfig).await;
    let config_maps: Api<ConfigMap> = Api::namespaced(tenant, "default");
    let listed = booted
        .runner
        .wait_for("the tenant answers through the old kubeconfig", STEP, || async {
            config_maps.list(&ListParams::default()).await.ok()
        })
        .await;
    let mut names: Vec<String> = listed
        .items
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .filter(|n| n.starts_with("cm-"))
        .collect();
    names.sort();
    let expected: Vec<String> = (0..CONFIG_MAPS).map(|i| format!("cm-{i:04}")).collect();
    assert_eq!(names, expected);
    let one = listed.items.iter().find(|c| c.metadata.name.as_deref() == Some("cm-0420")).unwrap();
    assert_eq!(one.data.as_ref().unwrap()["index"], "420");
    // The restore completes: the init containers go once every member was ready.
    booted
        .runner
        .wait_for("the restore is recorded as completed", STEP, || async {
            etcds.get("demo-etcd").await.ok()?.status?.restore.filter(|r| r.completed).map(|_| ())
        })
        .await;
    drop(listener);
    booted.stop().await;
}
