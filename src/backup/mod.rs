//! Backups of a tenant's etcd to S3-compatible object storage, and the fetch half of a
//! restore.
//!
//! - [`schedule`]: cron schedules (Kubernetes CronJob syntax, parsed by `croner`) and the
//!   next run, so the etcd controller requeues at that time instead of polling;
//! - [`due`]: whether a snapshot is due now (on demand or by the schedule) or when;
//! - [`naming`]: object keys, sortable by time, and the sidecar that records a snapshot's
//!   size and SHA-256;
//! - [`retention`]: which snapshots to delete after a verified upload (pure);
//! - [`store`]: the object store client (`object_store`'s S3 implementation): streaming
//!   multipart upload with the hash computed on the way, verification, listing, and the
//!   verified download a restore starts from.
//!
//! The pure parts take no clock and no client; the store is the only part that talks.

pub mod due;
pub mod naming;
pub mod retention;
pub mod schedule;
pub mod store;

/// Environment variable (and Secret key) holding the access key ID of a backup
/// destination: the AWS SDKs' own name, so a Secret made for other S3 tools fits.
pub const ACCESS_KEY_ID: &str = "AWS_ACCESS_KEY_ID";
/// Environment variable (and Secret key) holding the secret access key of a destination.
pub const SECRET_ACCESS_KEY: &str = "AWS_SECRET_ACCESS_KEY";
/// Optional Secret key with a session token (temporary credentials).
pub const SESSION_TOKEN: &str = "AWS_SESSION_TOKEN";
