//! Backups against a real S3-compatible server (issue 10, part 3 and the fetch step of
//! part 4): `s3s-fs` on loopback (testkit/src/s3.rs), capn's store code as the
//! etcd controller uses it, and the `capn etcd-restore fetch` binary as the restore init
//! container runs it. No kube-apiserver is involved.

use std::process::Command;

use bytes::Bytes;
use capn::backup::naming::{sidecar_key, snapshot_key};
use capn::backup::retention::keys_to_delete;
use capn::backup::store::{Destination, PART_SIZE, Store};
use capn_testkit::s3::{self, ACCESS_KEY_ID, SECRET_ACCESS_KEY};
use futures::stream;
use k8s_openapi::jiff::Timestamp;
use sha2::{Digest, Sha256};

fn store(bucket: &str, prefix: &str) -> Store {
    Store::connect(Destination {
        endpoint: s3::s3().endpoint().to_string(),
        bucket: bucket.to_string(),
        region: "us-east-1".to_string(),
        prefix: prefix.to_string(),
        access_key_id: ACCESS_KEY_ID.to_string(),
        secret_access_key: SECRET_ACCESS_KEY.to_string(),
        session_token: None,
    })
    .unwrap()
}

/// `len` bytes that do not repeat with the part size (xorshift), so a part stored twice or
/// out of order changes the hash.
fn payload(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The payload as a stream of 64 KiB chunks, as etcd's snapshot RPC delivers it.
fn chunks(data: &[u8]) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + use<> {
    let parts: Vec<Result<Bytes, std::io::Error>> =
        data.chunks(64 * 1024).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
    stream::iter(parts)
}

fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

fn at(s: &str) -> Timestamp {
    s.parse().unwrap()
}

/// Runs `capn etcd-restore fetch` as the init container would; returns (success, stdout+stderr).
fn fetch_with_binary(bucket: &str, prefix: &str, snapshot: &str, work: &std::path::Path) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_capn"))
        .args([
            "etcd-restore",
            "fetch",
            "--endpoint",
            s3::s3().endpoint(),
            "--bucket",
            bucket,
        ])
        .args(["--prefix", prefix, "--snapshot", snapshot])
        .arg("--data-dir")
        .arg(work.join("data"))
        .arg("--work-dir")
        .arg(work.join("restore"))
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY)
        .output()
        .unwrap();
    (
        output.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

#[tokio::test]
async fn a_snapshot_streams_in_parts_is_verified_and_comes_back_byte_for_byte() {
    let bucket = s3::s3().bucket();
    let store = store(&bucket, "tenant/etcd");
    // Two and a half parts: the multipart path with a short last part.
    let data = payload(PART_SIZE * 5 / 2, 7);
    let key = snapshot_key("tenant/etcd", at("2026-12-01T04:00:00Z"));
    let record = store
        .upload_snapshot(&key, chunks(&data), 4242, "3.6.8", "2026-12-01T04:00:00Z", Vec::new())
        .await
        .unwrap();
    assert_eq!(record.size, data.len() as u64);
    assert_eq!(record.sha256, sha256_hex(&data));
    assert_eq!(record.revision, 4242);
    // What the server holds is the payload, and the sidecar says so.
    assert_eq!(std::fs::read(s3::s3().object_file(&bucket, &key)).unwrap(), data);
    let listed = store.list_keys().await.unwrap();
    assert_eq!(listed, vec![key.clone(), sidecar_key(&key)]);
    assert_eq!(store.record(&key).await.unwrap(), record);
    assert_eq!(store.latest().await.unwrap(), key);

    let work = tempfile::tempdir().unwrap();
    let (ok, out) = fetch_with_binary(&bucket, "tenant/etcd", "latest", work.path());
    assert!(ok, "{out}");
    assert_eq!(std::fs::read(work.path().join("restore/snapshot.db")).unwrap(), data);
    // A second run (a restarted init container) keeps the verified file.
    let (ok, out) = fetch_with_binary(&bucket, "tenant/etcd", &key, work.path());
    assert!(ok, "{out}");
    assert_eq!(std::fs::read(work.path().join("restore/snapshot.db")).unwrap(), data);
}

#[tokio::test]
async fn a_corrupt_snapshot_is_refused_and_nothing_is_left_to_restore_from() {
    let bucket = s3::s3().bucket();
    let store = store(&bucket, "p");
    let data = payload(300 * 1024, 11);
    let key = snapshot_key("p", at("2026-12-01T05:00:00Z"));
    store
        .upload_snapshot(&key, chunks(&data), 1, "3.6.8", "2026-12-01T05:00:00Z", Vec::new())
        .await
        .unwrap();
    // One flipped byte on the server's disk, same size.
    let mut corrupt = data.clone();
    corrupt[1000] ^= 0xff;
    std::fs::write(s3::s3().object_file(&bucket, &key), &corrupt).unwrap();

    let work = tempfile::tempdir().unwrap();
    let (ok, out) = fetch_with_binary(&bucket, "p", &key, work.path());
    assert!(!ok, "a corrupt snapshot was accepted: {out}");
    assert!(out.contains("SnapshotCorrupt") && out.contains("sha256"), "{out}");
    assert!(!work.path().join("restore/snapshot.db").exists());
    assert!(!work.path().join("restore/snapshot.partial").exists());
    // The controller's check says the same.
    let record = store.record(&key).await.unwrap();
    let err = store.verify(&key, record.size, &record.sha256).await.unwrap_err();
    assert_eq!(err.reason(), "SnapshotCorrupt", "{err}");
}

#[tokio::test]
async fn a_missing_snapshot_is_refused_naming_what_is_there() {
    let bucket = s3::s3().bucket();
    let work = tempfile::tempdir().unwrap();
    let (ok, out) = fetch_with_binary(&bucket, "nothing/here", "latest", work.path());
    assert!(!ok, "{out}");
    assert!(out.contains("SnapshotMissing") && out.contains("no snapshot"), "{out}");

    let store = store(&bucket, "p");
    let key = snapshot_key("p", at("2026-12-01T06:00:00Z"));
    store
        .upload_snapshot(
            &key,
            chunks(&payload(1000, 3)),
            1,
            "3.6.8",
            "2026-12-01T06:00:00Z",
            Vec::new(),
        )
        .await
        .unwrap();
    let absent = snapshot_key("p", at("2026-11-30T06:00:00Z"));
    let (ok, out) = fetch_with_binary(&bucket, "p", &absent, work.path());
    assert!(!ok, "{out}");
    assert!(out.contains("SnapshotMissing") && out.contains(&key), "{out}");
}

#[tokio::test]
async fn a_failed_upload_leaves_no_backup_and_retention_deletes_only_older_snapshots() {
    let bucket = s3::s3().bucket();
    let store = store(&bucket, "r");
    let mut keys = Vec::new();
    for day in 1..=4 {
        let time = format!("2026-12-0{day}T03:00:00Z");
        let key = snapshot_key("r", at(&time));
        store
            .upload_snapshot(
                &key,
                chunks(&payload(2048, day)),
                day as i64,
                "3.6.8",
                &time,
                Vec::new(),
            )
            .await
            .unwrap();
        keys.push(key);
    }
    // Day 5: the snapshot stream breaks after the first part.
    let failed = snapshot_key("r", at("2026-12-05T03:00:00Z"));
    let data = payload(PART_SIZE + 100, 5);
    let broken = stream::iter(vec![
        Ok(Bytes::copy_from_slice(&data[..PART_SIZE])),
        Err(std::io::Error::other("etcd went away")),
    ]);
    let err = store
        .upload_snapshot(&failed, broken, 5, "3.6.8", "2026-12-05T03:00:00Z", Vec::new())
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "SnapshotStreamFailed", "{err}");
    let listed = store.list_keys().await.unwrap();
    assert!(!listed.contains(&sidecar_key(&failed)), "{listed:?}");
    // Nothing was deleted by the failure, and day 4 is still the latest backup.
    for key in &keys {
        assert!(listed.contains(key) && listed.contains(&sidecar_key(key)), "{listed:?}");
    }
    assert_eq!(store.latest().await.unwrap(), keys[3]);

    // Day 6 succeeds; retention 2 keeps days 6 and 4.
    let verified = snapshot_key("r", at("2026-12-06T03:00:00Z"));
    store
        .upload_snapshot(
            &verified,
            chunks(&payload(2048, 6)),
            6,
            "3.6.8",
            "2026-12-06T03:00:00Z",
            Vec::new(),
        )
        .await
        .unwrap();
    let listed = store.list_keys().await.unwrap();
    let delete = keys_to_delete(&listed, &verified, 2);
    store.delete_keys(&delete).await.unwrap();
    let mut left = store.list_keys().await.unwrap();
    left.sort();
    let mut expected = vec![
        keys[3].clone(),
        sidecar_key(&keys[3]),
        verified.clone(),
        sidecar_key(&verified),
    ];
    expected.sort();
    assert_eq!(left, expected);
}
