//! NestedEtcd backups and restore.
//!
//! **Backups** ([`backup_step`]): after the members were applied, the etcd controller reports
//! a finished snapshot (`status.backup`, condition `BackupSucceeded`), decides whether one
//! is due (the schedule, or the `backup-now` annotation) and, when the etcd is ready,
//! starts a snapshot job in the background ([`Backups`]: at most
//! [`MAX_CONCURRENT_SNAPSHOTS`] at once in the process). The job streams etcd's
//! `Maintenance.Snapshot` from one member into the store (multipart, hashed on the way,
//! read back and compared, then the record), and applies the retention only after that.
//! The reconcile never waits for it: it requeues at the next scheduled run, or every
//! [`JOB_POLL`] while a job runs, to report it.
//!
//! **Restore** ([`plan_restore`]): what the etcd controller settles before it plans the
//! members, when `spec.restore` names a snapshot.
//!
//! Once, before the StatefulSet exists: the channel must support backups
//! (`capabilities.backups`), the credentials Secret must hold its keys, the snapshot must
//! exist (`latest` is resolved to a key here, so every member restores the same object), its
//! etcd release must be one the target etcd can run (same major, not a newer minor), and its
//! bytes must match its record (size and SHA-256, read back in full). Any failure is a
//! condition with its reason and nothing is applied: no pod starts. The verified snapshot is
//! recorded in `status.restore.snapshot`; the templates then render the restore init
//! containers with it until every member was ready once (`status.restore.completed`), after
//! which they are no longer rendered (the members roll once, starting from their data).
//!
//! The S3 requests run in the reconcile: a restore happens once per etcd, the controller
//! runs at most 8 reconciles at once (`MAX_CONCURRENT_RECONCILES`), and a snapshot the
//! size of etcd's 8 GiB quota reads back in a minute or two on a fast link.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use semver::Version;

use crate::backup::due::{Due, Trigger, due};
use crate::status::{ConditionUpdate, Reason};

use crate::api::{BackupDestination, BackupStatus, NestedEtcd, RestoreStatus, SnapshotStatus};
use crate::backup::naming::{LATEST, normalize_prefix};
use crate::backup::store::{Destination, Store, StoreError};
use crate::backup::{ACCESS_KEY_ID, SECRET_ACCESS_KEY, SESSION_TOKEN};
use crate::channel::Channel;
use crate::component::ComponentKind;
use crate::controllers::component::Round;
use crate::controllers::{Context, ReconcileError};
use crate::plan::RestoreVars;

/// Region used to sign requests when a destination names none.
pub const DEFAULT_REGION: &str = "us-east-1";

/// What the etcd controller does about `spec.restore` this round.
#[derive(Clone, Debug, PartialEq)]
// One value per reconcile, never stored in a collection: boxing `Pending` would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum RestorePlan {
    /// No restore, or one that completed: plan the members as usual.
    None,
    /// Render the restore init containers with these values; report this status.
    Pending(RestoreVars, RestoreStatus),
    /// Refused: nothing is applied; the condition says why.
    Refused { reason: &'static str, message: String },
}

/// Decides [`RestorePlan`] for `etcd`, rendered from `channel` at `version`; see the module
/// documentation.
///
/// # Errors
/// Transient API errors reading the credentials Secret.
pub async fn plan_restore(
    ctx: &Context,
    etcd: &NestedEtcd,
    ns: &str,
    cluster: &str,
    channel: &Channel,
    version: &Version,
) -> Result<RestorePlan, ReconcileError> {
    let Some(restore) = etcd.spec.restore.as_ref() else {
        return Ok(RestorePlan::None);
    };
    let status = etcd.status.as_ref();
    let previous = status.and_then(|s| s.restore.as_deref().cloned()).unwrap_or_default();
    if previous.completed {
        return Ok(RestorePlan::None);
    }
    // An etcd that ran before the restore was asked for keeps its data: restore is for a
    // new etcd only.
    if status.is_some_and(|s| s.version.is_some()) && previous.snapshot.is_none() {
        return Ok(RestorePlan::Refused {
            reason: Reason::RestoreNotAllowed.as_str(),
            message: "spec.restore applies only when the etcd is first created; this etcd already runs with its own data, which a restore would never replace".into(),
        });
    }
    if !channel
        .component(ComponentKind::Etcd)
        .is_some_and(|c| c.capabilities.backups)
    {
        return Ok(RestorePlan::Refused {
            reason: Reason::BackupsNotSupported.as_str(),
            message: format!(
                "channel {} does not declare that its etcd provider supports backups and restore (channel.yaml: components.etcd.capabilities.backups); use a channel that does, like stable, or remove spec.restore",
                channel.name
            ),
        });
    }
    let capn_image = ctx.settings.capn_image.clone();
    let vars = |snapshot: &SnapshotStatus, credentials_secret: String| RestoreVars {
        capn_image: capn_image.clone(),
        endpoint: restore.source.endpoint.clone(),
        bucket: restore.source.bucket.clone(),
        region: region(&restore.source),
        prefix: normalize_prefix(restore.source.prefix.as_deref().unwrap_or_default()),
        snapshot: snapshot.key.clone(),
        credentials_secret,
    };
    // Verified before: render the same snapshot until the reconcile records that every
    // member was ready on it (`completed`).
    if let Some(snapshot) = previous.snapshot.clone() {
        let secret = restore.source.credentials_secret.name.clone();
        return Ok(RestorePlan::Pending(vars(&snapshot, secret), previous));
    }
    let store = match connect(ctx, ns, &restore.source, None).await? {
        Ok(store) => store,
        Err(refused) => return Ok(refused),
    };
    let wanted = restore.snapshot.as_deref().filter(|s| !s.is_empty()).unwrap_or(LATEST);
    let checked = async {
        let key = if wanted == LATEST {
            store.latest().await?
        } else {
            wanted.to_string()
        };
        let record = store.record(&key).await?;
        Ok::<_, StoreError>((key, record))
    }
    .await;
    let (key, record) = match checked {
        Ok(found) => found,
        Err(e) => return Ok(refused_by_store(&e, &etcd.name_any())),
    };
    if let Some(message) = version_refusal(&record.etcd_version, version, channel) {
        return Ok(RestorePlan::Refused {
            reason: Reason::SnapshotVersionUnsupported.as_str(),
            message: format!("snapshot {key}: {message}"),
        });
    }
    if let Err(e) = store.verify(&key, record.size, &record.sha256).await {
        return Ok(refused_by_store(&e, &etcd.name_any()));
    }
    if let Some(message) = missing_keys(ctx, ns, cluster, &key, &record).await? {
        return Ok(RestorePlan::Refused {
            reason: Reason::SnapshotKeyMissing.as_str(),
            message,
        });
    }
    let snapshot = SnapshotStatus {
        key: key.clone(),
        ..snapshot_status(&record)
    };
    let status = RestoreStatus {
        snapshot: Some(snapshot.clone()),
        completed: false,
    };
    Ok(RestorePlan::Pending(
        vars(&snapshot, restore.source.credentials_secret.name.clone()),
        status,
    ))
}

/// What a verified snapshot's status shows of its record.
fn snapshot_status(record: &crate::backup::naming::SnapshotRecord) -> SnapshotStatus {
    SnapshotStatus {
        time: record.taken_at.clone(),
        revision: record.revision,
        size_bytes: i64::try_from(record.size).unwrap_or(i64::MAX),
        key: record.key.clone(),
        sha256: record.sha256.clone(),
        encryption_keys: record.encryption_keys.clone(),
    }
}

/// Why snapshot `key` (its `record`) cannot be restored into cluster `cluster` as its
/// encryption key stands: the snapshot's Secrets are encrypted with keys (by identity) that
/// `<cluster>-encryption` does not hold, so the restored apiserver could read none of them.
/// `None` when it holds them all (or the snapshot names none).
///
/// # Errors
/// API errors reading the Secret.
async fn missing_keys(
    ctx: &Context,
    ns: &str,
    cluster: &str,
    key: &str,
    record: &crate::backup::naming::SnapshotRecord,
) -> Result<Option<String>, ReconcileError> {
    if record.encryption_keys.is_empty() {
        return Ok(None);
    }
    let secret = crate::pki::SecretNames::new(cluster).encryption;
    let held = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(ctx.client.clone(), ns)
        .get_opt(&secret)
        .await?
        .and_then(|s| crate::pki::encryption::encryption_configuration_from_secret(&s).ok())
        .and_then(|config| crate::pki::encryption::key_identities(&config).ok())
        .unwrap_or_default();
    let missing: Vec<&str> = record
        .encryption_keys
        .iter()
        .filter(|k| !held.contains(k))
        .map(String::as_str)
        .collect();
    if missing.is_empty() {
        return Ok(None);
    }
    let holds = if held.is_empty() {
        "does not exist or holds no key".to_owned()
    } else {
        format!("holds {}", held.join(", "))
    };
    Ok(Some(format!(
        "snapshot {key} holds the tenant's Secrets encrypted with {}, which {secret} lacks (it {holds}): put the {secret} you kept with your backups in place (docs/guide/backups.md \"Encryption keys\"); nothing was started",
        missing.join(", ")
    )))
}

fn region(destination: &BackupDestination) -> String {
    destination
        .region
        .clone()
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| DEFAULT_REGION.to_string())
}

fn refused_by_store(e: &StoreError, name: &str) -> RestorePlan {
    RestorePlan::Refused {
        reason: e.reason(),
        message: format!("restore of NestedEtcd {name} refused, nothing was started: {e}"),
    }
}

/// Why a snapshot written by etcd `snapshot_version` cannot start etcd `target`, if it
/// cannot: another major, or a newer minor (etcd reads its own and older storage versions,
/// never newer ones).
pub fn version_refusal(snapshot_version: &str, target: &Version, channel: &Channel) -> Option<String> {
    let listed = channel
        .component(ComponentKind::Etcd)
        .map(|c| c.versions.join(", "))
        .unwrap_or_default();
    let parsed = snapshot_version
        .trim_start_matches('v')
        .split(['-', '+'])
        .next()
        .and_then(|v| Version::parse(v).ok());
    let Some(snapshot) = parsed else {
        return Some(format!(
            "its record names etcd version {snapshot_version:?}, which is not a version; the channel runs etcd {listed}"
        ));
    };
    if snapshot.major != target.major || snapshot.minor > target.minor {
        return Some(format!(
            "written by etcd {snapshot}, which etcd {target} cannot restore (same major, and a minor no newer than the target's); channel {} runs etcd {listed}",
            channel.name
        ));
    }
    None
}

/// A store for `destination` with the credentials from its Secret, or the refusal that
/// says what is missing.
///
/// # Errors
/// Transient API errors reading the Secret.
pub async fn connect(
    ctx: &Context,
    ns: &str,
    destination: &BackupDestination,
    default_prefix: Option<&str>,
) -> Result<Result<Store, RestorePlan>, ReconcileError> {
    let name = &destination.credentials_secret.name;
    let secret = Api::<Secret>::namespaced(ctx.client.clone(), ns).get_opt(name).await?;
    let data = secret.and_then(|s| s.data).unwrap_or_default();
    let value = |key: &str| {
        data.get(key)
            .map(|b| String::from_utf8_lossy(&b.0).trim().to_string())
            .filter(|v| !v.is_empty())
    };
    let (Some(access_key_id), Some(secret_access_key)) = (value(ACCESS_KEY_ID), value(SECRET_ACCESS_KEY)) else {
        return Ok(Err(RestorePlan::Refused {
            reason: Reason::BackupCredentialsMissing.as_str(),
            message: format!(
                "secret {ns}/{name} must exist with the keys {ACCESS_KEY_ID} and {SECRET_ACCESS_KEY} (and optionally {SESSION_TOKEN})"
            ),
        }));
    };
    let prefix = destination
        .prefix
        .as_deref()
        .filter(|p| !p.is_empty())
        .or(default_prefix)
        .unwrap_or_default();
    let store = Store::connect(Destination {
        endpoint: destination.endpoint.clone(),
        bucket: destination.bucket.clone(),
        region: region(destination),
        prefix: normalize_prefix(prefix),
        access_key_id,
        secret_access_key,
        session_token: value(SESSION_TOKEN),
    });
    Ok(store.map_err(|e| RestorePlan::Refused {
        reason: e.reason(),
        message: e.to_string(),
    }))
}
// Scheduled and on-demand snapshots.

/// Snapshots capn takes at once, across every tenant: each holds one etcd member's
/// snapshot stream and up to [`crate::backup::store::PARTS_IN_FLIGHT`] parts of 8 MiB in
/// memory, and reads the whole database from the member, so a bound keeps a schedule that
/// fires for a thousand tenants at 03:00 from loading every etcd and the super cluster's
/// network at once. The others wait for a slot (their reconciles look again every
/// [`JOB_POLL`]).
pub const MAX_CONCURRENT_SNAPSHOTS: usize = 2;
/// While a snapshot of an etcd runs, its reconcile looks again this often, to report the
/// result (the job runs outside the reconcile, which never waits for it).
pub const JOB_POLL: std::time::Duration = std::time::Duration::from_secs(5);

/// What a finished snapshot job reports to the next reconcile.
#[derive(Clone, Debug)]
pub struct Finished {
    pub trigger: crate::backup::due::Trigger,
    /// The verified snapshot, or (reason, message).
    pub result: Result<crate::backup::naming::SnapshotRecord, (&'static str, String)>,
    /// Keys retention deleted, or why it failed (the snapshot counts all the same).
    pub retention: Result<usize, String>,
}

enum Job {
    Running,
    Done(Finished),
    /// Reported; a failure holds the next attempt until this instant.
    Failed(tokio::time::Instant),
}

/// The snapshot jobs of this process, by NestedEtcd (`namespace/name`).
#[derive(Clone)]
pub struct Backups {
    slots: Arc<tokio::sync::Semaphore>,
    jobs: Arc<std::sync::Mutex<HashMap<String, Job>>>,
}

impl Default for Backups {
    fn default() -> Self {
        Self {
            slots: Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT_SNAPSHOTS)),
            jobs: Arc::default(),
        }
    }
}

impl std::fmt::Debug for Backups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Backups")
    }
}

impl Backups {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Job>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a job of `key` runs.
    pub fn running(&self, key: &str) -> bool {
        matches!(self.lock().get(key), Some(Job::Running))
    }

    /// The result of `key`'s finished job, once (the reconcile that reports it takes it).
    pub fn take_finished(&self, key: &str) -> Option<Finished> {
        let mut jobs = self.lock();
        match jobs.remove(key) {
            Some(Job::Done(finished)) => {
                if finished.result.is_err() {
                    jobs.insert(
                        key.to_string(),
                        Job::Failed(tokio::time::Instant::now() + RETRY_AFTER_FAILURE),
                    );
                }
                Some(finished)
            }
            Some(other) => {
                jobs.insert(key.to_string(), other);
                None
            }
            None => None,
        }
    }

    /// Whether `key`'s last snapshot failed less than [`RETRY_AFTER_FAILURE`] ago.
    pub fn backing_off(&self, key: &str) -> bool {
        matches!(self.lock().get(key), Some(Job::Failed(until)) if *until > tokio::time::Instant::now())
    }

    /// Runs `job` for `key` in the background, once a slot is free.
    pub fn start<F>(&self, key: String, job: F)
    where
        F: Future<Output = Finished> + Send + 'static,
    {
        self.lock().insert(key.clone(), Job::Running);
        let (slots, jobs) = (self.slots.clone(), self.jobs.clone());
        tokio::spawn(async move {
            let _slot = slots.acquire_owned().await;
            let finished = job.await;
            jobs.lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key, Job::Done(finished));
        });
    }
}

/// What the etcd controller reports about backups this round.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BackupReport {
    /// `status.backup` as it should be now (`None`: no backup configured).
    pub status: Option<BackupStatus>,
    /// The `BackupSucceeded` condition, when there is news.
    pub condition: Option<crate::status::ConditionUpdate>,
    /// When to look again (the next scheduled run, or soon while a snapshot runs).
    pub requeue: Option<std::time::Duration>,
}

/// After a failed snapshot, the next attempt waits this long (no tight loop against a
/// destination that is down).
pub const RETRY_AFTER_FAILURE: std::time::Duration = std::time::Duration::from_secs(60);
/// The longest one snapshot job may take, upload and verification included.
pub const JOB_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1800);

/// The backup step of the etcd controller, after the members were applied: report a
/// finished snapshot, decide whether one is due ([`crate::backup::due`]) and start it in the
/// background when the etcd is ready; see [`Backups`] for the bound.
///
/// # Errors
/// Transient API errors (the credentials Secret, the etcd CA).
pub async fn backup_step(
    round: &Round<'_, NestedEtcd>,
    channel: &Channel,
    ready: bool,
    endpoints: &[String],
) -> Result<BackupReport, ReconcileError> {
    let etcd = round.object;
    let Some(backup) = etcd.spec.backup.as_ref() else {
        return Ok(without_destination(round).await);
    };
    let key = format!("{}/{}", round.ns, etcd.name_any());
    let mut status = etcd
        .status
        .as_ref()
        .and_then(|s| s.backup.as_deref().cloned())
        .unwrap_or_default();
    let mut report = BackupReport::default();
    if !channel
        .component(ComponentKind::Etcd)
        .is_some_and(|c| c.capabilities.backups)
    {
        report.condition = Some(refusal(
            Reason::BackupsNotSupported.as_str(),
            format!(
                "channel {} does not declare that its etcd provider supports backups (channel.yaml: components.etcd.capabilities.backups); no snapshot is taken",
                channel.name
            ),
        ));
        report.status = Some(status);
        return Ok(report);
    }
    report.condition = record_finished(round.ctx, &key, &mut status);
    match schedule(round, backup, &key, &mut status, ready) {
        Err(condition) => report.condition = Some(condition),
        Ok((requeue, trigger)) => {
            report.requeue = requeue;
            if let Some(trigger) = trigger
                && let Some(condition) = start_snapshot(round, backup, endpoints, key, trigger).await?
            {
                report.condition = Some(condition);
            }
        }
    }
    if report.condition.is_none() && previous_reason(etcd) == Some(Reason::BackupNotConfigured.as_str()) {
        // The destination came after a dropped request: the refusal is history now.
        report.condition = Some(ConditionUpdate::new(
            BACKUP_SUCCEEDED,
            false,
            Reason::WaitingForSnapshot,
            "spec.backup is set and no snapshot was taken yet: the next comes at the schedule's next run or with a new backup-now value",
        ));
    }
    report.status = Some(status);
    Ok(report)
}

/// What the `capn_etcd_backup_*` series show after a pass reported `report` on `etcd`:
/// the last verified snapshot's time, the schedule's gap after it
/// ([`crate::backup::due::interval`]) and whether `BackupSucceeded` reports a failure (the
/// pass's news, else the condition as it stands). `None` without `spec.backup`: no series.
pub fn backup_figures(etcd: &NestedEtcd, report: &BackupReport) -> Option<crate::telemetry::BackupFigures> {
    let backup = etcd.spec.backup.as_ref()?;
    let last_success = report
        .status
        .as_ref()
        .and_then(|s| s.last_snapshot.as_ref())
        .and_then(|s| s.time.parse::<Timestamp>().ok());
    let created = etcd.creation_timestamp().map(|t| t.0);
    let failing = match &report.condition {
        Some(news) => news.failing(),
        None => etcd
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == BACKUP_SUCCEEDED))
            .is_some_and(crate::status::failing),
    };
    Some(crate::telemetry::BackupFigures {
        last_success: last_success.map(|t| t.as_second()),
        interval: last_success
            .or(created)
            .and_then(|since| crate::backup::due::interval(backup.schedule.as_deref(), since)),
        failing,
    })
}

/// The reason of the NestedEtcd's `BackupSucceeded` condition as it stands.
fn previous_reason(etcd: &NestedEtcd) -> Option<&str> {
    etcd.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == BACKUP_SUCCEEDED)
        .map(|c| c.reason.as_str())
}

/// A NestedEtcd without `spec.backup`: a new `backup-now` request
/// ([`crate::backup::due::dropped_request`]) is answered at once and dropped. It is recorded
/// as served in `status.backup.lastRequest` (so that a destination added later takes no
/// snapshot for it), and `BackupSucceeded` is False with `BackupNotConfigured`, whose Warning
/// Event the status change sends; when that condition already stood (a second request), the
/// Event is sent here, since the condition does not change.
async fn without_destination(round: &Round<'_, NestedEtcd>) -> BackupReport {
    let etcd = round.object;
    let mut status = etcd
        .status
        .as_ref()
        .and_then(|s| s.backup.as_deref().cloned())
        .unwrap_or_default();
    let request = etcd
        .annotations()
        .get(crate::api::BACKUP_NOW_ANNOTATION)
        .map(String::as_str);
    let Some(request) = crate::backup::due::dropped_request(request, status.last_request.as_deref()) else {
        return BackupReport::default();
    };
    let message = format!(
        "backup-now request {request:?} dropped: NestedEtcd {} has no spec.backup, so there is nowhere to put a snapshot; set spec.backup.destination (endpoint, bucket, credentialsSecret; see docs/guide/backups.md) and annotate again with a new value",
        etcd.name_any()
    );
    if previous_reason(etcd) == Some(Reason::BackupNotConfigured.as_str()) {
        let note = format!("{BACKUP_SUCCEEDED} is False: {message}");
        crate::controllers::events::publish(round.ctx, etcd, None, Reason::BackupNotConfigured, note, "Backup").await;
    }
    status.last_request = Some(request);
    BackupReport {
        status: Some(status),
        condition: Some(refusal(Reason::BackupNotConfigured.as_str(), message)),
        requeue: None,
    }
}

/// A `BackupSucceeded` False. Every refusal is a failure: capn's own reasons and the
/// snapshot's and store's errors alike.
fn refusal(reason: &'static str, message: String) -> ConditionUpdate {
    ConditionUpdate::error(BACKUP_SUCCEEDED, false, reason, message)
}

/// The condition of a snapshot that finished since the last look, if one did; records it
/// (and the on-demand request it served) in `status`.
fn record_finished(ctx: &Context, key: &str, status: &mut BackupStatus) -> Option<ConditionUpdate> {
    let finished = ctx.backups.take_finished(key)?;
    if let Trigger::OnDemand(request) = &finished.trigger {
        // Served either way: a failed request is not retried behind the user's back; the
        // condition says it failed, and a new value asks again.
        status.last_request = Some(request.clone());
    }
    Some(match finished.result {
        Ok(record) => {
            let retention = match finished.retention {
                Ok(deleted) => format!("retention deleted {deleted} object(s)"),
                Err(e) => format!("retention failed, nothing was deleted: {e}"),
            };
            status.last_snapshot = Some(snapshot_status(&record));
            ConditionUpdate::new(
                BACKUP_SUCCEEDED,
                true,
                Reason::SnapshotVerified,
                format!(
                    "snapshot {} ({} bytes, etcd revision {}, sha256 {}) uploaded and verified; {retention}",
                    record.key, record.size, record.revision, record.sha256
                ),
            )
        }
        Err((reason, message)) => refusal(reason, message),
    })
}

/// When the next snapshot is due (recorded in `status`), when to look again, and the
/// trigger of a snapshot to start now: only when one is due, the etcd is ready, none runs
/// and the last did not just fail. `Err`: the schedule or request is invalid.
fn schedule(
    round: &Round<'_, NestedEtcd>,
    backup: &crate::api::EtcdBackup,
    key: &str,
    status: &mut BackupStatus,
    ready: bool,
) -> Result<(Option<std::time::Duration>, Option<Trigger>), ConditionUpdate> {
    let (ctx, etcd, now) = (round.ctx, round.object, round.now.k8s.0);
    let request = etcd
        .annotations()
        .get(crate::api::BACKUP_NOW_ANNOTATION)
        .map(String::as_str);
    let last_snapshot = status
        .last_snapshot
        .as_ref()
        .and_then(|s| s.time.parse::<Timestamp>().ok());
    let created = etcd.creation_timestamp().map(|t| t.0).unwrap_or(now);
    let decision = due(
        backup.schedule.as_deref(),
        request,
        status.last_request.as_deref(),
        last_snapshot,
        created,
        now,
    )
    .map_err(|e| refusal(e.reason(), e.to_string()))?;
    status.next_scheduled = match &decision {
        Due::At(at) => Some(at.to_string()),
        _ => None,
    };
    let running = ctx.backups.running(key);
    let backing_off = ctx.backups.backing_off(key);
    let requeue = match &decision {
        _ if running => Some(JOB_POLL),
        Due::At(at) => Some(std::time::Duration::from_secs(
            u64::try_from(at.as_second() - now.as_second()).unwrap_or(0).max(1),
        )),
        Due::Never => None,
        Due::Now(_) if !ready => Some(std::time::Duration::from_secs(30)),
        Due::Now(_) if backing_off => Some(RETRY_AFTER_FAILURE),
        Due::Now(_) => Some(JOB_POLL),
    };
    let trigger = match decision {
        Due::Now(trigger) if ready && !running && !backing_off => Some(trigger),
        _ => None,
    };
    Ok((requeue, trigger))
}

/// Starts a snapshot in the background: one member's snapshot is the cluster's (every
/// member holds the whole keyspace); the first listed member that capn can dial serves it.
/// Returns the condition when it cannot start (the store or etcd unreachable); nothing when
/// the etcd CA or an endpoint is not there yet.
async fn start_snapshot(
    round: &Round<'_, NestedEtcd>,
    backup: &crate::api::EtcdBackup,
    endpoints: &[String],
    key: String,
    trigger: Trigger,
) -> Result<Option<ConditionUpdate>, ReconcileError> {
    let Round { ctx, ns, store, .. } = *round;
    let cluster = round.cluster.name.as_str();
    let prefix = crate::backup::naming::default_prefix(ns, &round.object.name_any());
    let objects = match connect(ctx, ns, &backup.destination, Some(&prefix)).await? {
        Ok(objects) => objects,
        Err(RestorePlan::Refused { reason, message }) => return Ok(Some(refusal(reason, message))),
        Err(_) => unreachable!("connect refuses or connects"),
    };
    let names = crate::pki::SecretNames::new(cluster);
    let Some(ca) = store.require_ca(&names.etcd_ca).await? else {
        return Ok(None);
    };
    let ca = store.load_ca(&ca).await?;
    let Some(endpoint) = endpoints.first() else {
        return Ok(None);
    };
    let client = ctx
        .etcd
        .cluster(ns, cluster, &ca, time::OffsetDateTime::now_utc())
        .map_err(|e| ReconcileError::InvalidSpec(e.to_string()))?
        .client(endpoint)
        .await;
    let client = match client {
        Ok(client) => client,
        Err(e) => return Ok(Some(refusal(Reason::EtcdUnreachable.as_str(), e.to_string()))),
    };
    let retention = usize::try_from(backup.retention.unwrap_or(crate::api::DEFAULT_RETENTION)).unwrap_or(1);
    // The keys the Secrets in the snapshot are encrypted with, by identity (a restore
    // checks them); the configuration is read whole, so this costs one read per snapshot.
    let encryption_keys = store
        .read_encryption_config(&names.encryption)
        .await?
        .and_then(|config| crate::pki::encryption::key_identities(&config).ok())
        .unwrap_or_default();
    ctx.backups
        .start(key, snapshot_job(client, objects, retention, trigger, encryption_keys));
    Ok(None)
}

pub use crate::status::BACKUP_SUCCEEDED;

/// Takes one snapshot through etcd's maintenance API and streams it to the store; then
/// applies the retention. Runs outside the reconcile.
async fn snapshot_job(
    client: etcd_client::Client,
    store: Store,
    retention: usize,
    trigger: crate::backup::due::Trigger,
    encryption_keys: Vec<String>,
) -> Finished {
    use futures::StreamExt;
    let taken = Timestamp::now();
    let key = crate::backup::naming::snapshot_key(&store.destination().prefix, taken);
    let work = async {
        let mut client = client;
        // The member's revision just before the snapshot: the snapshot holds at least it.
        let (version, revision) = client
            .status()
            .await
            .map(|s| {
                (
                    s.version().to_string(),
                    s.header().map(|h| h.revision()).unwrap_or_default(),
                )
            })
            .map_err(|e| ("SnapshotStreamFailed", format!("etcd status: {e}")))?;
        let mut stream = client
            .snapshot()
            .await
            .map_err(|e| ("SnapshotStreamFailed", format!("etcd snapshot: {e}")))?;
        let first = stream
            .message()
            .await
            .map_err(|e| ("SnapshotStreamFailed", format!("etcd snapshot: {e}")))?
            .ok_or(("SnapshotStreamFailed", "etcd sent an empty snapshot".to_string()))?;
        let revision = first
            .header()
            .map(|h| h.revision())
            .filter(|r| *r > 0)
            .unwrap_or(revision);
        let head = bytes::Bytes::copy_from_slice(first.blob());
        let rest = futures::stream::unfold(Some(stream), |stream| async move {
            let mut stream = stream?;
            match stream.message().await {
                Ok(Some(message)) => Some((Ok(bytes::Bytes::copy_from_slice(message.blob())), Some(stream))),
                Ok(None) => None,
                Err(e) => Some((Err(e.to_string()), None)),
            }
        });
        let all = futures::stream::once(async move { Ok::<_, String>(head) }).chain(rest);
        store
            .upload_snapshot(&key, all, revision, &version, &taken.to_string(), encryption_keys)
            .await
            .map_err(|e| (e.reason(), e.to_string()))
    };
    let result = match tokio::time::timeout(JOB_TIMEOUT, work).await {
        Ok(result) => result,
        Err(_) => Err((
            "SnapshotTimedOut",
            format!("the snapshot took longer than {JOB_TIMEOUT:?}"),
        )),
    };
    let retention = match &result {
        Ok(record) => match store.list_keys().await {
            Ok(keys) => {
                let delete = crate::backup::retention::keys_to_delete(&keys, &record.key, retention);
                store
                    .delete_keys(&delete)
                    .await
                    .map(|()| delete.len())
                    .map_err(|e| e.to_string())
            }
            Err(e) => Err(e.to_string()),
        },
        Err(_) => Ok(0),
    };
    Finished {
        trigger,
        result,
        retention,
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::api::{ComponentStatus, EtcdBackup, NestedEtcdSpec};
    use crate::status::set_condition;

    fn time(s: &str) -> Time {
        Time(s.parse().unwrap())
    }

    /// A NestedEtcd created at 02:00 on Friday 2026-12-04, with `spec.backup` on `schedule`
    /// (none: no `spec.backup`) and `BackupSucceeded` as `condition` says.
    fn etcd(schedule: Option<Option<&str>>, condition: Option<ConditionUpdate>) -> NestedEtcd {
        let mut etcd = NestedEtcd::new(
            "demo-etcd",
            NestedEtcdSpec {
                backup: schedule.map(|s| {
                    Box::new(EtcdBackup {
                        schedule: s.map(str::to_owned),
                        ..EtcdBackup::default()
                    })
                }),
                ..NestedEtcdSpec::default()
            },
        );
        etcd.metadata.creation_timestamp = Some(time("2026-12-04T02:00:00Z"));
        let mut status = ComponentStatus::default();
        if let Some(condition) = condition {
            set_condition(&mut status.conditions, condition, None, &time("2026-12-04T02:00:00Z"));
        }
        etcd.status = Some(status);
        etcd
    }

    fn snapshot_at(time: &str) -> BackupReport {
        BackupReport {
            status: Some(BackupStatus {
                last_snapshot: Some(SnapshotStatus {
                    time: time.to_owned(),
                    ..SnapshotStatus::default()
                }),
                ..BackupStatus::default()
            }),
            ..BackupReport::default()
        }
    }

    fn failed() -> ConditionUpdate {
        refusal("SnapshotUploadFailed", "the store refused the upload".to_owned())
    }

    #[test]
    fn backup_figures_follow_the_status_the_schedule_and_the_condition() {
        let daily = Some(Some("0 3 * * *"));
        assert_eq!(backup_figures(&etcd(None, None), &BackupReport::default()), None);
        // No snapshot yet: the gap runs from the creation to the first run.
        assert_eq!(
            backup_figures(&etcd(daily, None), &BackupReport::default()),
            Some(crate::telemetry::BackupFigures {
                last_success: None,
                interval: Some(3600),
                failing: false,
            })
        );
        // A snapshot at 03:00:04 reported this pass: the gap to tomorrow's run.
        let verified = BackupReport {
            condition: Some(ConditionUpdate::new(
                BACKUP_SUCCEEDED,
                true,
                Reason::SnapshotVerified,
                "verified",
            )),
            ..snapshot_at("2026-12-04T03:00:04Z")
        };
        assert_eq!(
            backup_figures(&etcd(daily, Some(failed())), &verified),
            Some(crate::telemetry::BackupFigures {
                last_success: Some(time("2026-12-04T03:00:04Z").0.as_second()),
                interval: Some(86_400 - 4),
                failing: false,
            }),
            "the pass's news wins over the condition it replaces"
        );
        // No news: the condition as it stands; a wait is no failure.
        let standing = snapshot_at("2026-12-04T03:00:04Z");
        assert!(backup_figures(&etcd(daily, Some(failed())), &standing).unwrap().failing);
        let waiting = ConditionUpdate::new(BACKUP_SUCCEEDED, false, Reason::WaitingForSnapshot, "none yet");
        assert!(!backup_figures(&etcd(daily, Some(waiting)), &standing).unwrap().failing);
        // On demand only: no gap to measure.
        assert_eq!(
            backup_figures(&etcd(Some(None), None), &standing).unwrap().interval,
            None
        );
    }
}
