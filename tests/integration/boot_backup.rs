//! Backup and restore of a booted tenant (issue 10, parts 3 and 4), with real etcd
//! processes through the runner and a real S3 server (s3s-fs):
//! 1. a tenant with about 1,000 ConfigMaps, written through its admin kubeconfig;
//! 2. an on-demand backup (`spec.backup` and the `backup-now` annotation): capn takes the
//!    snapshot through etcd's maintenance API with its own client certificate, streams it
//!    into a multipart upload, verifies it (size and SHA-256 read back) and records it;
//! 3. the control plane deleted, and a new one created with the original CA Secrets
//!    (user-supplied, as capn supports) and a NestedEtcd that restores from `latest`: capn
//!    checks the snapshot, the runner runs the restore init containers (capn's
//!    `etcd-restore fetch`, `etcdutl snapshot restore`, `etcd-restore commit`);
//! 4. every ConfigMap is back, read through the kubeconfig saved before the backup.
//!
//! Times and sizes are printed, not asserted.

use std::time::{Duration, Instant};

use capn::api::{BACKUP_NOW_ANNOTATION, NestedControlPlane, NestedEtcd};
use capn_testkit::s3::{self, ACCESS_KEY_ID, SECRET_ACCESS_KEY};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use sha2::Digest as _;

use crate::boot::{BOOTED_STEP, StartCapn, boot_with, say};
use crate::harness::{apply_doc, secret};

/// ConfigMaps written into the tenant before the backup.
const CONFIG_MAPS: usize = 1000;
/// The CA Secrets a restored control plane needs to keep old kubeconfigs working.
const CA_SECRETS: [&str; 4] = ["demo-ca", "demo-etcd", "demo-proxy", "demo-sa"];

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
    say(&format!(
        "backup-restore: {CONFIG_MAPS} ConfigMaps written in {:.1?}",
        started.elapsed()
    ));

    // A tenant Secret, stored encrypted: it must come back readable.
    let tenant_secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "kept"}, "stringData": {"v": "restored-plain-text"}
    }))
    .unwrap();
    Api::<Secret>::namespaced(tenant.clone(), "default")
        .create(&PostParams::default(), &tenant_secret)
        .await
        .unwrap();

    // 2. Snapshot → S3, verified. The S3 server also listens on the runner's host address,
    // which the restore init containers reach.
    let listener = s3::s3()
        .serve_on(booted.runner.host_address())
        .expect("s3s-fs on the pod network");
    let bucket = s3::s3().bucket();
    let prefix = format!("{ns}/demo-etcd");
    apply_doc(
        &client,
        &ns,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3-credentials"},
               "stringData": {"AWS_ACCESS_KEY_ID": ACCESS_KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY}}),
    )
    .await;
    let etcds: Api<NestedEtcd> = Api::namespaced(client.clone(), &ns);
    let started = Instant::now();
    etcds
        .patch(
            "demo-etcd",
            &PatchParams::apply("kubectl"),
            &Patch::Apply(json!({
                "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedEtcd",
                "metadata": {"name": "demo-etcd", "annotations": {BACKUP_NOW_ANNOTATION: "before-restore"}},
                "spec": {"backup": {"retention": 3, "destination": {
                    "endpoint": listener.endpoint(), "bucket": bucket, "prefix": prefix,
                    "credentialsSecret": {"name": "s3-credentials"}}}}
            })),
        )
        .await
        .unwrap();
    let snapshot = booted
        .runner
        .wait_for(
            "capn took, uploaded and verified the requested snapshot",
            BOOTED_STEP * 2,
            || async {
                let status = etcds.get("demo-etcd").await.ok()?.status?;
                let verified = status
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "BackupSucceeded" && c.status == "True");
                let backup = status.backup?;
                (verified && backup.last_request.as_deref() == Some("before-restore")).then_some(backup.last_snapshot?)
            },
        )
        .await;
    say(&format!(
        "backup-restore: snapshot at etcd revision {}: {} bytes ({:.1} MiB), taken, uploaded and verified {:.1?} after the request",
        snapshot.revision,
        snapshot.size_bytes,
        snapshot.size_bytes as f64 / (1024.0 * 1024.0),
        started.elapsed()
    ));
    // The stored object is the one the status names, byte for byte.
    let stored = std::fs::read(s3::s3().object_file(&bucket, &snapshot.key)).expect("the snapshot is in the bucket");
    assert_eq!(stored.len() as i64, snapshot.size_bytes);
    let digest: String = sha2::Sha256::digest(&stored)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(digest, snapshot.sha256);
    // The snapshot names the key its Secrets are encrypted with (its identity, not the key).
    assert_eq!(snapshot.encryption_keys.len(), 1, "{:?}", snapshot.encryption_keys);
    assert!(snapshot.encryption_keys[0].starts_with("key1/sha256:"));

    // 3. Keep the CAs, delete the control plane, wait until nothing of it runs.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let mut kept = Vec::new();
    for name in CA_SECRETS {
        let s = secret(&client, &ns, name)
            .await
            .unwrap_or_else(|| panic!("{name} exists"));
        kept.push((name, s.type_.clone(), s.data.clone().unwrap_or_default()));
    }
    // The encryption key, kept aside as docs/guide/backups.md says (not put back at once:
    // the restore must first refuse to run without it).
    let kept_key = secret(&client, &ns, "demo-encryption")
        .await
        .expect("demo-encryption exists");
    Api::<NestedControlPlane>::namespaced(client.clone(), &ns)
        .delete("demo", &DeleteParams::foreground())
        .await
        .unwrap();
    let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let ncps_before: Api<NestedControlPlane> = Api::namespaced(client.clone(), &ns);
    booted
        .runner
        .wait_for(
            "the old control plane and its CAs are gone",
            BOOTED_STEP * 2,
            || async {
                let sets = statefulsets.list(&ListParams::default()).await.ok()?;
                // The resources themselves too: an apply must not land on one still terminating.
                if ncps_before.get_opt("demo").await.ok()?.is_some() || etcds.get_opt("demo-etcd").await.ok()?.is_some()
                {
                    return None;
                }
                let mut cas_gone = true;
                for name in CA_SECRETS {
                    cas_gone &= secrets.get_opt(name).await.ok()?.is_none();
                }
                (sets.items.is_empty() && booted.runner.pods().is_empty() && cas_gone).then_some(())
            },
        )
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
    // Without its key (the new control plane made one of its own), the restore is refused:
    // the restored apiserver could read none of the Secrets.
    let refusal = booted
        .runner
        .wait_for("the restore is refused without the key", BOOTED_STEP, || async {
            etcds
                .get_opt("demo-etcd")
                .await
                .ok()??
                .status?
                .conditions
                .into_iter()
                .find(|c| c.reason == "SnapshotKeyMissing")
        })
        .await;
    assert!(
        refusal.message.contains(&snapshot.encryption_keys[0]) && refusal.message.contains("demo-encryption"),
        "{}",
        refusal.message
    );
    // Putting the kept key in place (over the one the new control plane made) lets it go on.
    booted
        .runner
        .wait_for("the new control plane made its key", BOOTED_STEP, || async {
            secrets.get_opt("demo-encryption").await.ok()?.map(drop)
        })
        .await;
    let key_data = serde_json::json!({"data": kept_key.data});
    secrets
        .patch("demo-encryption", &PatchParams::default(), &Patch::Merge(key_data))
        .await
        .unwrap();
    let ncps: Api<NestedControlPlane> = Api::namespaced(client.clone(), &ns);
    booted
        .runner
        .wait_for(
            "the restored control plane is ready",
            Duration::from_secs(420),
            || async { ncps.get_opt("demo").await.ok()??.status.filter(|s| s.ready).map(|_| ()) },
        )
        .await;
    say(&format!(
        "backup-restore: new control plane from the snapshot (check, fetch, etcdutl restore, commit, boot) ready in {:.1?}",
        started.elapsed()
    ));
    let restored = etcds.get("demo-etcd").await.unwrap().status.unwrap().restore.unwrap();
    assert_eq!(restored.snapshot.as_ref().unwrap().key, snapshot.key);
    assert_eq!(restored.snapshot.as_ref().unwrap().sha256, snapshot.sha256);

    // 5. The kubeconfig saved before the backup works, and every ConfigMap is back.
    let tenant = booted.nested(&kubeconfig).await;
    let config_maps: Api<ConfigMap> = Api::namespaced(tenant, "default");
    let listed = booted
        .runner
        .wait_for("the tenant answers through the old kubeconfig", BOOTED_STEP, || async {
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
    let one = listed
        .items
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some("cm-0420"))
        .unwrap();
    assert_eq!(one.data.as_ref().unwrap()["index"], "420");
    let back = Api::<Secret>::namespaced(booted.nested(&kubeconfig).await, "default")
        .get("kept")
        .await
        .unwrap();
    assert_eq!(
        back.data.unwrap()["v"].0,
        b"restored-plain-text",
        "the Secret is readable with the kept key"
    );
    // The restore completes: the init containers go once every member was ready.
    booted
        .runner
        .wait_for("the restore is recorded as completed", BOOTED_STEP, || async {
            etcds
                .get("demo-etcd")
                .await
                .ok()?
                .status?
                .restore
                .filter(|r| r.completed)
                .map(|_| ())
        })
        .await;
    drop(listener);
    booted.stop().await;
}
