//! Object keys of snapshots and their sidecars.
//!
//! A snapshot is `<prefix>/etcd-snapshot-<UTC time>.db`, the time as `YYYYMMDDTHHMMSSZ`
//! (ISO 8601 basic format): fixed width and zero-padded, so the keys of one prefix sort by
//! time as strings, which is how S3 lists them. Beside it, `<key>.json` ([`SnapshotRecord`])
//! records its size, SHA-256, etcd revision and version. The sidecar is written only after
//! the snapshot was uploaded and verified, so a snapshot without one is an upload that did
//! not finish and is never restored from nor counted as a backup.

use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// File name prefix of every snapshot.
pub const SNAPSHOT_PREFIX: &str = "etcd-snapshot-";
/// File name suffix of every snapshot.
pub const SNAPSHOT_SUFFIX: &str = ".db";
/// Suffix the sidecar adds to its snapshot's key.
pub const SIDECAR_SUFFIX: &str = ".json";
/// Value of a restore's `snapshot` field that picks the newest complete snapshot.
pub const LATEST: &str = "latest";

/// The prefix snapshots of one etcd go under when `destination.prefix` is empty:
/// `<namespace>/<name>`, so one bucket holds many tenants.
pub fn default_prefix(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// `prefix` without leading or trailing slashes (S3 keys have no root; `a/` and `a` are the
/// same directory to a user).
pub fn normalize_prefix(prefix: &str) -> String {
    prefix.trim_matches('/').to_string()
}

/// The key of a snapshot taken at `at` under `prefix`. Seconds are the resolution: two
/// snapshots in one second would share a key, and capn takes at most one at a time per etcd.
pub fn snapshot_key(prefix: &str, at: Timestamp) -> String {
    let time = at.strftime("%Y%m%dT%H%M%SZ");
    let prefix = normalize_prefix(prefix);
    if prefix.is_empty() {
        format!("{SNAPSHOT_PREFIX}{time}{SNAPSHOT_SUFFIX}")
    } else {
        format!("{prefix}/{SNAPSHOT_PREFIX}{time}{SNAPSHOT_SUFFIX}")
    }
}

/// The key of a snapshot's sidecar.
pub fn sidecar_key(snapshot_key: &str) -> String {
    format!("{snapshot_key}{SIDECAR_SUFFIX}")
}

/// The time a snapshot key names, if `key` is a snapshot key (of any prefix).
pub fn snapshot_time(key: &str) -> Option<Timestamp> {
    let file = key.rsplit('/').next()?;
    let time = file.strip_prefix(SNAPSHOT_PREFIX)?.strip_suffix(SNAPSHOT_SUFFIX)?;
    if time.len() != 16 {
        return None;
    }
    k8s_openapi::jiff::civil::DateTime::strptime("%Y%m%dT%H%M%SZ", time)
        .ok()?
        .to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC)
        .ok()
        .map(|z| z.timestamp())
}

/// What capn knows about a verified snapshot: the sidecar object's content, and what the
/// etcd status shows of the last one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotRecord {
    /// The snapshot's object key.
    pub key: String,
    /// Size in bytes.
    pub size: u64,
    /// SHA-256 of the object, lower-case hex.
    pub sha256: String,
    /// etcd's revision when the snapshot was taken (the maintenance API's header).
    pub revision: i64,
    /// Version of the etcd server that wrote it (`3.6.8`): a restore refuses a major it
    /// cannot run.
    pub etcd_version: String,
    /// When the snapshot was taken, RFC 3339.
    pub taken_at: String,
    /// The identities of the encryption-at-rest keys the control plane had when the
    /// snapshot was taken (`crate::pki::encryption::key_identities`): a restore needs them
    /// all in its `<c>-encryption`. Empty for a snapshot of a control plane without one (or
    /// taken by an older capn).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub encryption_keys: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn keys_sort_by_time_as_strings() {
        let times = [
            "2026-12-01T09:59:59Z",
            "2026-12-01T10:00:00Z",
            "2026-12-10T00:00:00Z",
            "2027-01-01T00:00:00Z",
            "2030-02-03T04:05:06Z",
        ];
        let keys: Vec<String> = times.iter().map(|s| snapshot_key("backups/t1/", t(s))).collect();
        let mut sorted = keys.clone();
        sorted.reverse();
        sorted.sort();
        assert_eq!(sorted, keys);
        assert_eq!(keys[1], "backups/t1/etcd-snapshot-20261201T100000Z.db");
    }

    #[test]
    fn a_key_gives_back_its_time_and_other_keys_give_none() {
        let at = t("2026-12-01T03:57:12Z");
        assert_eq!(snapshot_time(&snapshot_key("/p/", at)), Some(at));
        assert_eq!(snapshot_time(&snapshot_key("", at)), Some(at));
        for other in [
            "p/etcd-snapshot-20261201T035712Z.db.json",
            "p/etcd-snapshot-2026120T035712Z.db",
            "p/notes.txt",
            "p/etcd-snapshot-20261341T035712Z.db",
        ] {
            assert_eq!(snapshot_time(other), None, "{other}");
        }
    }

    #[test]
    fn prefixes_lose_their_slashes_and_default_to_namespace_and_name() {
        assert_eq!(normalize_prefix("/a/b/"), "a/b");
        assert_eq!(default_prefix("tenant-a", "demo-etcd"), "tenant-a/demo-etcd");
        assert_eq!(sidecar_key("a/etcd-snapshot-1.db"), "a/etcd-snapshot-1.db.json");
    }
}
