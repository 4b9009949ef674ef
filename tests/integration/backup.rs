//! Restore refusals and the restore's rendering, on the real super cluster with a real S3
//! server (issue 10, part 4): capn checks the snapshot before any member is planned, so a
//! missing, corrupt or incompatible snapshot — or a channel without backups — leaves no
//! StatefulSet behind, only a condition that says why. A good snapshot renders the restore
//! init containers with the resolved key until every member was ready once.

use std::time::Duration;

use bytes::Bytes;
use capn::api::NestedEtcd;
use capn::backup::naming::snapshot_key;
use capn::backup::store::{Destination, Store};
use capn_testkit::s3::{self, ACCESS_KEY_ID, SECRET_ACCESS_KEY};
use capn_testkit::{mark_statefulset_ready, wait_until};
use futures::stream;
use kube::api::Api;
use serde_json::json;

use crate::harness::{Fixture, statefulset};

/// How long a test waits for a step that reads the object store: the restore check lists
/// and downloads through the S3 client, which retries with backoff, and a first look that
/// came too early is repeated after the component's requeue (30 s waiting, 60 s refused).
/// On a loaded machine that outlasts the 30 s of a plain controller step (seen twice in
/// full runs with boot tests and builds beside them); alone these steps take seconds.
const STORE_STEP: std::time::Duration = std::time::Duration::from_secs(120);

const CREDENTIALS: &str = "s3-credentials";

async fn credentials(f: &Fixture) {
    f.apply(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": CREDENTIALS},
        "stringData": {"AWS_ACCESS_KEY_ID": ACCESS_KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY}
    }))
    .await;
}

fn store(bucket: &str, prefix: &str) -> Store {
    Store::connect(Destination {
        endpoint: s3::s3().endpoint().to_string(),
        bucket: bucket.into(),
        region: "us-east-1".into(),
        prefix: prefix.into(),
        access_key_id: ACCESS_KEY_ID.into(),
        secret_access_key: SECRET_ACCESS_KEY.into(),
        session_token: None,
    })
    .unwrap()
}

/// Uploads a small "snapshot" (the restore checks run before etcd ever reads it) and
/// returns its key.
async fn upload(bucket: &str, prefix: &str, time: &str, etcd_version: &str) -> String {
    let key = snapshot_key(prefix, time.parse().unwrap());
    store(bucket, prefix)
        .upload_snapshot(
            &key,
            stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from_static(b"not really bbolt"))]),
            7,
            etcd_version,
            time,
            Vec::new(),
        )
        .await
        .unwrap();
    key
}

/// A NestedEtcd `<c>-etcd` restoring from `bucket`/`prefix` (`snapshot` or latest), and the
/// NestedControlPlane `c` that adopts it.
async fn restoring_control_plane(f: &Fixture, c: &str, bucket: &str, prefix: &str, extra: serde_json::Value) {
    let mut spec = json!({"restore": {"source": {
        "endpoint": s3::s3().endpoint(), "bucket": bucket, "prefix": prefix,
        "credentialsSecret": {"name": CREDENTIALS}
    }}});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            if k == "snapshot" {
                spec["restore"]["snapshot"] = v.clone();
            } else {
                spec.insert(k.clone(), v.clone());
            }
        }
    }
    f.apply(json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedEtcd",
        "metadata": {"name": format!("{c}-etcd")}, "spec": spec
    }))
    .await;
    f.apply(json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedControlPlane",
        "metadata": {"name": c}, "spec": {"etcd": {"name": format!("{c}-etcd")}}
    }))
    .await;
}

/// Waits for the NestedEtcd's Ready condition to be False with `reason`; returns its message.
async fn refused(f: &Fixture, name: &str, reason: &str) -> String {
    let api: Api<NestedEtcd> = Api::namespaced(f.client.clone(), &f.ns);
    wait_until(&format!("{name} is refused with {reason}"), STORE_STEP, || async {
        let etcd = api.get(name).await.ok()?;
        etcd.status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Ready" && c.status == "False" && c.reason == reason)
            .map(|c| c.message)
    })
    .await
}

#[tokio::test]
async fn a_missing_snapshot_is_refused_and_no_member_is_created() {
    let f = Fixture::new().await;
    credentials(&f).await;
    let bucket = s3::s3().bucket();
    restoring_control_plane(&f, "gone", &bucket, "nothing/here", json!({})).await;
    let message = refused(&f, "gone-etcd", "SnapshotMissing").await;
    assert!(
        message.contains("no snapshot") && message.contains("nothing was started"),
        "{message}"
    );
    // A named key that is not there says what is.
    let key = upload(&bucket, "some", "2026-12-01T03:00:00Z", "3.6.8").await;
    restoring_control_plane(
        &f,
        "named",
        &bucket,
        "some",
        json!({"snapshot": "some/etcd-snapshot-20250101T000000Z.db"}),
    )
    .await;
    let message = refused(&f, "named-etcd", "SnapshotMissing").await;
    assert!(message.contains(&key), "{message}");
    for c in ["gone", "named"] {
        assert!(statefulset(&f.client, &f.ns, &format!("{c}-etcd")).await.is_none());
    }
    f.stop().await;
}

#[tokio::test]
async fn a_corrupt_or_incompatible_snapshot_is_refused_and_no_member_is_created() {
    let f = Fixture::new().await;
    credentials(&f).await;
    let bucket = s3::s3().bucket();
    let key = upload(&bucket, "corrupt", "2026-12-01T03:00:00Z", "3.6.8").await;
    std::fs::write(s3::s3().object_file(&bucket, &key), b"not really bbolT").unwrap();
    restoring_control_plane(&f, "bad", &bucket, "corrupt", json!({})).await;
    let message = refused(&f, "bad-etcd", "SnapshotCorrupt").await;
    assert!(message.contains("sha256"), "{message}");

    upload(&bucket, "future", "2026-12-01T03:00:00Z", "4.0.1").await;
    restoring_control_plane(&f, "future", &bucket, "future", json!({})).await;
    let message = refused(&f, "future-etcd", "SnapshotVersionUnsupported").await;
    assert!(message.contains("etcd 4.0.1") && message.contains("3.6.8"), "{message}");

    upload(&bucket, "newer", "2026-12-01T03:00:00Z", "3.7.0").await;
    restoring_control_plane(&f, "newer", &bucket, "newer", json!({"version": "3.6.8"})).await;
    refused(&f, "newer-etcd", "SnapshotVersionUnsupported").await;

    // No credentials: said so, with the keys the Secret needs.
    f.apply(json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedEtcd",
        "metadata": {"name": "nocreds-etcd"}, "spec": {"restore": {"source": {
            "endpoint": s3::s3().endpoint(), "bucket": bucket, "credentialsSecret": {"name": "absent"}}}}
    }))
    .await;
    f.apply(json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedControlPlane",
        "metadata": {"name": "nocreds"}, "spec": {"etcd": {"name": "nocreds-etcd"}}
    }))
    .await;
    let message = refused(&f, "nocreds-etcd", "BackupCredentialsMissing").await;
    assert!(message.contains("AWS_ACCESS_KEY_ID"), "{message}");
    for c in ["bad", "future", "newer", "nocreds"] {
        assert!(
            statefulset(&f.client, &f.ns, &format!("{c}-etcd")).await.is_none(),
            "{c}"
        );
    }
    f.stop().await;
}

#[tokio::test]
async fn a_channel_without_backups_refuses_a_restore() {
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/channels");
    let f = Fixture::with_channels(&[examples]).await;
    credentials(&f).await;
    let bucket = s3::s3().bucket();
    upload(&bucket, "p", "2026-12-01T03:00:00Z", "3.6.8").await;
    restoring_control_plane(&f, "op", &bucket, "p", json!({"channel": "etcd-operator"})).await;
    let message = refused(&f, "op-etcd", "BackupsNotSupported").await;
    assert!(
        message.contains("etcd-operator") && message.contains("capabilities.backups"),
        "{message}"
    );
    f.stop().await;
}

#[tokio::test]
async fn a_verified_snapshot_renders_the_restore_until_every_member_was_ready_once() {
    let f = Fixture::new().await;
    credentials(&f).await;
    let bucket = s3::s3().bucket();
    upload(&bucket, "t", "2026-12-01T03:00:00Z", "3.6.8").await;
    let newest = upload(&bucket, "t", "2026-12-02T03:00:00Z", "3.6.8").await;
    restoring_control_plane(&f, "r", &bucket, "t", json!({"replicas": 3})).await;
    let init_names = |sts: &k8s_openapi::api::apps::v1::StatefulSet| -> Vec<String> {
        sts.spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|s| s.init_containers.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|c| c.name)
            .collect()
    };
    let sts = wait_until("the etcd StatefulSet is applied", STORE_STEP, || async {
        statefulset(&f.client, &f.ns, "r-etcd").await
    })
    .await;
    assert_eq!(
        init_names(&sts),
        ["restore-fetch", "restore-snapshot", "restore-commit"]
    );
    let fetch_args = sts
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .init_containers
        .as_ref()
        .unwrap()[0]
        .args
        .clone()
        .unwrap();
    // `latest` was resolved once, to the newest complete snapshot.
    assert!(fetch_args.contains(&format!("--snapshot={newest}")), "{fetch_args:?}");
    let api: Api<NestedEtcd> = Api::namespaced(f.client.clone(), &f.ns);
    // The StatefulSet is applied before the status that records the restore is written.
    let restore = wait_until("the status records the verified snapshot", STORE_STEP, || async {
        let restore = api.get("r-etcd").await.ok()?.status?.restore?;
        restore.snapshot.is_some().then_some(restore)
    })
    .await;
    assert_eq!(restore.snapshot.as_ref().unwrap().key, newest);
    assert!(!restore.completed);
    // Every member ready once: the restore is complete and the init containers go.
    mark_statefulset_ready(&f.client, &f.ns, "r-etcd").await.unwrap();
    wait_until(
        "the restore is recorded as completed",
        Duration::from_secs(60),
        || async {
            let status = api.get("r-etcd").await.ok()?.status?;
            status.restore.filter(|r| r.completed).map(|_| ())
        },
    )
    .await;
    wait_until(
        "the restore init containers are no longer rendered",
        STORE_STEP,
        || async {
            let sts = statefulset(&f.client, &f.ns, "r-etcd").await?;
            init_names(&sts).is_empty().then_some(())
        },
    )
    .await;
    f.stop().await;
}

/// The CRD's rules (generated from `src/validate`) refuse bad backup fields at admission,
/// with the same message `capn` uses.
#[tokio::test]
async fn admission_refuses_bad_backup_fields_with_the_rules_message() {
    use kube::api::{Patch, PatchParams};
    let f = Fixture::new().await;
    let api: Api<NestedEtcd> = Api::namespaced(f.client.clone(), &f.ns);
    let dry_run = PatchParams {
        dry_run: true,
        ..PatchParams::apply("kubectl")
    };
    let destination = json!({"endpoint": "https://s3.eu-west-1.amazonaws.com", "bucket": "capn-backups",
                             "credentialsSecret": {"name": "s3"}});
    let with = |backup: serde_json::Value| {
        json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedEtcd",
               "metadata": {"name": "e"}, "spec": {"backup": backup}})
    };
    let mut good = destination.clone();
    good["prefix"] = json!("tenant-a");
    api.patch(
        "e",
        &dry_run,
        &Patch::Apply(with(
            json!({"schedule": "0 3 * * *", "retention": 3, "destination": good}),
        )),
    )
    .await
    .expect("a good backup spec is admitted");
    let mut bad_endpoint = destination.clone();
    bad_endpoint["endpoint"] = json!("s3.amazonaws.com");
    let mut bad_bucket = destination.clone();
    bad_bucket["bucket"] = json!("Backups");
    for (backup, message) in [
        (
            json!({"schedule": "*/5 * * * * *", "destination": destination}),
            "five fields",
        ),
        (
            json!({"retention": 0, "destination": destination}),
            "between 1 and 1000",
        ),
        (json!({"destination": bad_endpoint}), "URL of an S3 API"),
        (json!({"destination": bad_bucket}), "S3 bucket name"),
    ] {
        let err = api
            .patch("e", &dry_run, &Patch::Apply(with(backup.clone())))
            .await
            .expect_err(&format!("{backup} must be refused"));
        assert!(err.to_string().contains(message), "{backup}: {err}");
    }
    f.stop().await;
}

/// The `BackupSucceeded` condition of the NestedEtcd `name` once it is False with `reason`:
/// its message and `status.backup.lastRequest`.
async fn backup_condition(f: &Fixture, name: &str, reason: &str) -> (String, Option<String>) {
    let api: Api<NestedEtcd> = Api::namespaced(f.client.clone(), &f.ns);
    wait_until(
        &format!("{name} reports BackupSucceeded {reason}"),
        STORE_STEP,
        || async {
            let status = api.get(name).await.ok()?.status?;
            let message = status
                .conditions
                .iter()
                .find(|c| c.type_ == "BackupSucceeded" && c.status == "False" && c.reason == reason)?
                .message
                .clone();
            Some((message, status.backup.and_then(|b| b.last_request)))
        },
    )
    .await
}

/// A `backup-now` request on a NestedEtcd without `spec.backup` is answered at once (a
/// Warning Event and `BackupSucceeded` False with `BackupNotConfigured`) and dropped: it is
/// recorded in `status.backup.lastRequest`, so that the destination added afterwards takes
/// no snapshot for it. The destination's credentials Secret does not exist, so a snapshot
/// attempt would show at once as `BackupCredentialsMissing`: the destination's first round
/// reports `WaitingForSnapshot` instead, and a new request afterwards does show the attempt.
#[tokio::test]
async fn a_backup_request_without_a_destination_is_answered_at_once_and_dropped() {
    use capn::api::BACKUP_NOW_ANNOTATION;
    use k8s_openapi::api::events::v1::Event;
    let f = Fixture::new().await;
    f.apply(json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedEtcd",
        "metadata": {"name": "nodest-etcd", "annotations": {BACKUP_NOW_ANNOTATION: "first"}}
    }))
    .await;
    f.apply(json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedControlPlane",
        "metadata": {"name": "nodest"}, "spec": {"etcd": {"name": "nodest-etcd"}}
    }))
    .await;
    // Ready, so that a snapshot that is due would be started.
    crate::harness::make_ready(&f.client, &f.ns, "nodest-etcd").await;

    let (message, served) = backup_condition(&f, "nodest-etcd", "BackupNotConfigured").await;
    assert!(
        message.contains("\"first\"")
            && message.contains("no spec.backup")
            && message.contains("docs/guide/backups.md"),
        "{message}"
    );
    assert_eq!(served.as_deref(), Some("first"), "recorded as served");
    let events: Api<Event> = Api::namespaced(f.client.clone(), &f.ns);
    let note = wait_until("a Warning Event BackupNotConfigured", STORE_STEP, || async {
        events
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find_map(|e| {
                let about = e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("nodest-etcd");
                (about && e.reason.as_deref() == Some("BackupNotConfigured") && e.type_.as_deref() == Some("Warning"))
                    .then_some(e.note)
                    .flatten()
            })
    })
    .await;
    assert!(note.contains("\"first\""), "{note}");
    // A second request is answered too, though the condition's reason stays.
    crate::harness::merge_patch::<NestedEtcd>(
        &f.client,
        &f.ns,
        "nodest-etcd",
        json!({"metadata": {"annotations": {BACKUP_NOW_ANNOTATION: "again"}}}),
    )
    .await;
    wait_until("a Warning Event for the second request", STORE_STEP, || async {
        let notes: Vec<String> = events
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("BackupNotConfigured"))
            .filter_map(|e| e.note)
            .collect();
        notes.iter().any(|n| n.contains("\"again\"")).then_some(())
    })
    .await;
    let api: Api<NestedEtcd> = Api::namespaced(f.client.clone(), &f.ns);
    wait_until("the second request is recorded as served", STORE_STEP, || async {
        let served = api.get("nodest-etcd").await.ok()?.status?.backup?.last_request;
        (served.as_deref() == Some("again")).then_some(())
    })
    .await;

    // A destination now: the dropped request takes no snapshot.
    crate::harness::merge_patch::<NestedEtcd>(
        &f.client,
        &f.ns,
        "nodest-etcd",
        json!({"spec": {"backup": {"destination": {
            "endpoint": "https://s3.example.com", "bucket": "capn-backups",
            "credentialsSecret": {"name": "absent"}}}}}),
    )
    .await;
    let (_, served) = backup_condition(&f, "nodest-etcd", "WaitingForSnapshot").await;
    assert_eq!(served.as_deref(), Some("again"));
    let etcd = api.get("nodest-etcd").await.unwrap();
    assert!(
        etcd.status
            .and_then(|s| s.backup)
            .is_some_and(|b| b.last_snapshot.is_none()),
        "no snapshot"
    );

    // A new request is attempted: the missing credentials say so.
    crate::harness::merge_patch::<NestedEtcd>(
        &f.client,
        &f.ns,
        "nodest-etcd",
        json!({"metadata": {"annotations": {BACKUP_NOW_ANNOTATION: "second"}}}),
    )
    .await;
    let (message, _) = backup_condition(&f, "nodest-etcd", "BackupCredentialsMissing").await;
    assert!(message.contains("absent"), "{message}");
    f.stop().await;
}
