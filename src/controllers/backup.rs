//! NestedEtcd restore (issue 10, part 4): what the etcd controller settles before it plans
//! the members, when `spec.restore` names a snapshot.
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
//! runs at most 16 reconciles at once, and a snapshot the size of etcd's 8 GiB quota reads
//! back in a minute or two on a fast link.

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::Api;
use semver::Version;

use super::{Context, ReconcileError};
use crate::api::{BackupDestination, NestedEtcd, RestoreStatus, SnapshotStatus};
use crate::backup::naming::{LATEST, normalize_prefix};
use crate::backup::store::{Destination, Store, StoreError};
use crate::backup::{ACCESS_KEY_ID, SECRET_ACCESS_KEY, SESSION_TOKEN};
use crate::channel::Channel;
use crate::component::ComponentKind;
use crate::plan::RestoreVars;

/// Region used to sign requests when a destination names none.
pub const DEFAULT_REGION: &str = "us-east-1";

/// What the etcd controller does about `spec.restore` this round.
#[derive(Clone, Debug, PartialEq)]
pub enum RestorePlan {
    /// No restore, or one that completed: plan the members as usual.
    None,
    /// Render the restore init containers with these values; report this status.
    Pending(RestoreVars, RestoreStatus),
    /// The restore completed this round: report this status, render no init containers.
    Completed(RestoreStatus),
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
    channel: &Channel,
    version: &Version,
) -> Result<RestorePlan, ReconcileError> {
    let Some(restore) = etcd.spec.restore.as_ref() else {
        return Ok(RestorePlan::None);
    };
    let status = etcd.status.as_ref();
    let previous = status.and_then(|s| s.restore.clone()).unwrap_or_default();
    if previous.completed {
        return Ok(RestorePlan::None);
    }
    // An etcd that ran before the restore was asked for keeps its data: restore is for a
    // new etcd only.
    if status.is_some_and(|s| s.version.is_some()) && previous.snapshot.is_none() {
        return Ok(RestorePlan::Refused {
            reason: "RestoreNotAllowed",
            message: "spec.restore applies only when the etcd is first created; this etcd already runs with its own data, which a restore would never replace".into(),
        });
    }
    if !channel
        .component(ComponentKind::Etcd)
        .and_then(|c| c.capabilities)
        .is_some_and(|c| c.backups)
    {
        return Ok(RestorePlan::Refused {
            reason: "BackupsNotSupported",
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
    if let Some(snapshot) = previous.snapshot.clone() {
        let secret = restore.source.credentials_secret.name.clone();
        if status.is_some_and(|s| s.ready) {
            return Ok(RestorePlan::Completed(RestoreStatus {
                snapshot: Some(snapshot),
                completed: true,
            }));
        }
        return Ok(RestorePlan::Pending(vars(&snapshot, secret), previous));
    }
    let store = match connect(ctx, ns, &restore.source, None).await? {
        Ok(store) => store,
        Err(refused) => return Ok(refused),
    };
    let wanted = restore.snapshot.as_deref().filter(|s| !s.is_empty()).unwrap_or(LATEST);
    let checked = async {
        let key = if wanted == LATEST { store.latest().await? } else { wanted.to_string() };
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
            reason: "SnapshotVersionUnsupported",
            message: format!("snapshot {key}: {message}"),
        });
    }
    if let Err(e) = store.verify(&key, record.size, &record.sha256).await {
        return Ok(refused_by_store(&e, &etcd.name_any()));
    }
    let snapshot = SnapshotStatus {
        time: record.taken_at.clone(),
        revision: record.revision,
        size_bytes: i64::try_from(record.size).unwrap_or(i64::MAX),
        key: key.clone(),
        sha256: record.sha256.clone(),
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
            reason: "BackupCredentialsMissing",
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
