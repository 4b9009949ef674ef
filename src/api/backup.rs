//! Backup and restore fields of [`super::NestedEtcd`].

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Annotation on a NestedEtcd that asks for one snapshot now. Its value is any short token
/// (a time, a ticket): capn takes a snapshot when the value differs from
/// `status.backup.lastRequest`, and records the value there once the snapshot is verified.
/// On a NestedEtcd without `spec.backup` a new value is dropped at once (recorded there as
/// served, with `BackupSucceeded` False, `BackupNotConfigured`, and a Warning Event).
/// `kubectl annotate netcd demo-etcd controlplane.cluster.x-k8s.io/backup-now=$(date +%s) --overwrite`.
pub const BACKUP_NOW_ANNOTATION: &str = "controlplane.cluster.x-k8s.io/backup-now";

/// Default number of complete snapshots kept per destination prefix.
pub const DEFAULT_RETENTION: i32 = 7;
/// Largest retention count: a bound, so a typo is refused instead of filling a bucket.
pub const MAX_RETENTION: i64 = 1000;

/// Scheduled snapshots of this etcd to S3-compatible object storage.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EtcdBackup {
    /// When to take a snapshot: a cron expression as in a Kubernetes CronJob (five fields:
    /// minute hour day-of-month month day-of-week, like `0 3 * * *`; or `@hourly`,
    /// `@daily`, `@weekly`, `@monthly`, `@yearly`), in UTC. Empty: only on demand (the
    /// annotation `controlplane.cluster.x-k8s.io/backup-now`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// How many complete snapshots to keep under the destination's prefix (default 7, at
    /// most 1000). Older ones are deleted only after a new snapshot was uploaded and
    /// verified; a failed upload never deletes anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<i32>,
    /// Where the snapshots go.
    pub destination: BackupDestination,
}

/// An S3-compatible bucket and prefix, and the Secret with its credentials.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BackupDestination {
    /// URL of the S3 API: `https://s3.eu-west-1.amazonaws.com`, `http://minio.backup:9000`.
    /// Requests are path-style (`<endpoint>/<bucket>/<key>`), which every S3-compatible
    /// server accepts.
    pub endpoint: String,
    /// Bucket name (S3 bucket naming rules: 3–63 lower-case letters, digits, `.` and `-`).
    pub bucket: String,
    /// Key prefix of the snapshots. Empty: `<namespace>/<NestedEtcd name>`. A restore must
    /// name the prefix the snapshots were written under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// Region used to sign requests; default `us-east-1` (what servers without regions
    /// expect).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Secret in the same namespace with the keys `AWS_ACCESS_KEY_ID` and
    /// `AWS_SECRET_ACCESS_KEY` (and optionally `AWS_SESSION_TOKEN`).
    pub credentials_secret: SecretName,
}

/// The name of a Secret in the same namespace.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SecretName {
    pub name: String,
}

/// Start this etcd from a snapshot instead of empty. Honoured only when the etcd is first
/// created (its members have no data yet); it changes nothing on a running etcd.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EtcdRestore {
    /// Where the snapshot is (prefix included: the one it was written under).
    pub source: BackupDestination,
    /// Object key of the snapshot, or `latest` (default): the newest complete snapshot
    /// under the prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
}

/// Backup state of a NestedEtcd.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BackupStatus {
    /// The last snapshot that was uploaded and verified.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_snapshot: Option<SnapshotStatus>,
    /// When the next scheduled snapshot is due (RFC 3339), if a schedule is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_scheduled: Option<String>,
    /// The value of the `backup-now` annotation last served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_request: Option<String>,
}

/// One verified snapshot.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotStatus {
    /// When it was taken (RFC 3339).
    pub time: String,
    /// etcd's revision at the snapshot.
    pub revision: i64,
    /// Size in bytes.
    pub size_bytes: i64,
    /// Object key in the bucket.
    pub key: String,
    /// SHA-256 of the object, lower-case hex.
    pub sha256: String,
    /// The encryption-at-rest keys the tenant's Secrets in it are encrypted with, by
    /// identity (`key1/sha256:<16 hex digits>`, never the key): a restore needs each of them
    /// in its `<cluster>-encryption`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub encryption_keys: Vec<String>,
}

/// Restore state of a NestedEtcd started from a snapshot.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RestoreStatus {
    /// The snapshot the members were initialised from (the key `latest` resolved to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotStatus>,
    /// True once every member started from the restored data; the restore init containers
    /// are no longer rendered after that.
    #[serde(default)]
    pub completed: bool,
}
