//! The NestedControlPlane's encryption key rotation (docs/guide/certificates.md "Rotating
//! the key"; the phases are [`KeyRotationPhase`]'s). A rotation is requested with the
//! annotation [`ROTATE_KEY_ANNOTATION`], or starts at a run of
//! `spec.encryption.keyRotationSchedule` (when it is due: the backups' rule,
//! `crate::backup::due`); each pass writes `<c>-encryption` as the recorded
//! phase wants it and moves on only once every apiserver is ready with it (the same wait as
//! a CA rotation's), so no apiserver ever meets a value encrypted with a key it lacks. The
//! phase is in status before the next phase's configuration is written: an interrupted
//! rotation resumes where it stopped.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, PostParams};

use super::certificates::encryption_status;
use super::rotation::{new_request_after, observations};
use super::scope::Round;
use crate::api::EncryptionStatus;
use crate::api::{EncryptionKeyRotation, NestedControlPlaneStatus, RotationPhaseRecord};
use crate::backup::due::{Due, Trigger, due};
use crate::backup::schedule::Schedule;
use crate::controllers::ReconcileError;
use crate::controllers::shared::tenant::tenant_client;
use crate::pki::encryption::{
    EncryptionKey, KMS_PROVIDER, KeyRotationPhase, KmsProviders, configured_resources, desired_kms, desired_resources,
    encryption_configuration, key_names, keys, keys_for_phase, kms_providers, next_key_name,
};
use crate::pki::rotation::converged;
use crate::status::{ConditionUpdate, ENCRYPTION_KEY_ROTATION, Reason};

/// Annotation on a NestedControlPlane that requests a key rotation: any value (`1`, a date);
/// a value equal to the last rotation's does nothing, so a new value rotates again.
pub const ROTATE_KEY_ANNOTATION: &str = "controlplane.cluster.x-k8s.io/rotate-encryption-key";

/// How soon a pass looks again while a rotation runs (the apiservers' rolls also wake it).
const LOOK_AGAIN: Duration = Duration::from_secs(5);

/// The longest a pass waits for the next run of the key rotation schedule.
const SCHEDULE_RECHECK: Duration = Duration::from_secs(3600);

/// The objects written again at once in `RewriteSecrets`.
const REWRITES_AT_ONCE: usize = 4;

/// Starts a requested rotation and moves the one in progress as far as it can, recording its
/// phase and its condition in `status`. Returns when to look again while it runs.
///
/// # Errors
/// API and PKI errors; [`ReconcileError::EncryptionKeyMissing`]. The caller retries.
pub(super) async fn step(
    round: &Round<'_>,
    status: &mut NestedControlPlaneStatus,
) -> Result<Option<Duration>, ReconcileError> {
    let secret = round.names.encryption.clone();
    forget_mended_schedule(round, status);
    let Some(encryption) = status.encryption.as_deref_mut() else {
        // No key yet (the certificates stage makes it): nothing to rotate.
        return Ok(None);
    };
    let annotation = round.ncp.annotations().get(ROTATE_KEY_ANNOTATION).map(String::as_str);
    let last_rotation = encryption
        .rotation
        .as_ref()
        .map(|r| (r.request.clone(), r.phase.clone()));
    let last = last_rotation.as_ref().map(|(r, p)| (r.as_str(), p.as_str()));
    let running = last.is_some_and(|(_, phase)| phase != KeyRotationPhase::Completed.as_str());
    let requested = new_request_after(annotation, last, KeyRotationPhase::Completed.as_str());
    if !running && requested.is_none() && write_configuration(round, &secret, encryption).await? {
        // The apiservers roll to it (the Secret's digest changed); a rotation waits a pass.
        return Ok(Some(LOOK_AGAIN));
    }
    let schedule = round
        .ncp
        .spec
        .encryption
        .as_ref()
        .and_then(|e| e.key_rotation_schedule.as_deref());
    // The schedule is looked at only between rotations: the first run after the last one
    // started (or after the control plane was made) starts the next.
    let since = encryption.rotation.as_ref().map(|r| r.start_time.0);
    let created = round
        .ncp
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(round.now.k8s.0, |t| t.0);
    let due = match (running || requested.is_some(), schedule) {
        (false, Some(schedule)) => match due(Some(schedule), None, None, since, created, round.now.k8s.0) {
            Ok(due) => Some(due),
            Err(invalid) => {
                let message = invalid.message_at("spec.encryption.keyRotationSchedule");
                let update = ConditionUpdate::new(
                    ENCRYPTION_KEY_ROTATION,
                    false,
                    Reason::InvalidKeyRotationSchedule,
                    message,
                );
                round.set(status, update);
                return Ok(None);
            }
        },
        _ => None,
    };
    let scheduled = match due {
        Some(Due::Now(Trigger::Scheduled(run))) => Some(run),
        _ => None,
    };
    if requested.is_some() || scheduled.is_some() {
        let config = read(round, &secret).await?;
        let names = key_names(&config).map_err(pki(&secret))?;
        // A scheduled rotation keeps the request last served, so the annotation's value
        // does not start another when this one completes.
        let request = requested.unwrap_or_else(|| last.map(|(r, _)| r.to_owned()).unwrap_or_default());
        encryption.rotation = Some(EncryptionKeyRotation {
            request,
            key: next_key_name(names.iter().map(String::as_str)),
            phase: KeyRotationPhase::AddKey.as_str().to_owned(),
            start_time: round.now.k8s.clone(),
            phases: Vec::new(),
            message: String::new(),
            rewritten: None,
            scheduled: scheduled.map(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time),
        });
    }
    // Between rotations, look again at the schedule's next run.
    let next_run = match due {
        Some(Due::At(run)) => Some(until(run, round.now.k8s.0)),
        _ => None,
    };
    let Some(rotation) = encryption.rotation.as_mut() else {
        return Ok(next_run);
    };
    let Some(phase) = KeyRotationPhase::parse(&rotation.phase).filter(|p| *p != KeyRotationPhase::Completed) else {
        return Ok(next_run);
    };
    let outcome = match phase {
        KeyRotationPhase::RewriteSecrets => rewrite(round, &secret).await?,
        _ => move_config(round, phase, &secret, &rotation.key).await?,
    };
    let phase = record(rotation, phase, outcome, &round.now.k8s);
    let condition = condition(phase, rotation);
    // (A KMS plugin that writes stays the key in status: capn's new key only reads.)
    if phase >= KeyRotationPhase::RewriteSecrets && encryption.provider != KMS_PROVIDER {
        encryption.key = rotation.key.clone();
    }
    if phase == KeyRotationPhase::Completed {
        encryption
            .kms
            .truncate(usize::from(encryption.provider == KMS_PROVIDER));
    }
    round.set(status, condition);
    Ok((phase != KeyRotationPhase::Completed).then_some(LOOK_AGAIN))
}

/// Moves `<c>-encryption` (`secret`) one step towards what `spec.encryption` asks, keeping
/// its keys, when `recorded` (the status: what the configuration holds) differs from it:
/// - the resources: a resource encrypted already stays ([`desired_resources`]); objects of
///   an added one stay as stored until they are next written (a key rotation's
///   `RewriteSecrets` writes them all), read by `identity` meanwhile;
/// - the KMS plugin ([`desired_kms`]): added as a reader, made the writer once every
///   apiserver runs with it, kept as a reader when dropped.
///
/// Returns whether a step is under way (written, or waiting for the apiservers); records
/// what the configuration holds in `recorded`.
async fn write_configuration(
    round: &Round<'_>,
    secret: &str,
    recorded: &mut EncryptionStatus,
) -> Result<bool, ReconcileError> {
    let spec = round.ncp.spec.encryption.as_ref();
    let spec_resources = spec.and_then(|e| e.resources.as_deref());
    let spec_kms = spec.and_then(|e| e.kms.as_deref());
    let kms_settled = match spec_kms {
        Some(kms) => recorded.provider == KMS_PROVIDER && recorded.kms.first() == Some(kms),
        None => recorded.provider != KMS_PROVIDER,
    };
    if kms_settled && desired_resources(spec_resources, &recorded.resources) == recorded.resources {
        return Ok(false);
    }
    let config = read(round, secret).await?;
    let current = kms_providers(&config).map_err(pki(secret))?;
    let configured = configured_resources(&config).map_err(pki(secret))?;
    // Only a plugin waiting to write needs to know whether every apiserver has it.
    let reading = spec_kms.is_some_and(|kms| current.readers.contains(kms));
    let converged = reading && converged(&observations(round, secret).await?).is_ok();
    let (kms, resources) = (
        desired_kms(spec_kms, &current, converged),
        desired_resources(spec_resources, &configured),
    );
    let config = if kms != current || resources != configured {
        let keys = keys(&config).map_err(pki(secret))?;
        let config = encryption_configuration(&keys, &kms, &resources);
        round.store.write_encryption_config(secret, &config).await?;
        let (writer, readers) = (
            kms.writer.as_ref().map(|p| &p.name),
            kms.readers.iter().map(|p| &p.name).collect::<Vec<_>>(),
        );
        tracing::info!(
            secret,
            ?resources,
            ?writer,
            ?readers,
            "wrote the encryption configuration's providers and resources"
        );
        config
    } else {
        config
    };
    *recorded = encryption_status(&config, recorded.rotation.take()).map_err(pki(secret))?;
    Ok(true)
}

/// Takes back an `InvalidKeyRotationSchedule` condition once the schedule parses (or is
/// gone): the condition says what it said before (the last rotation), or nothing.
fn forget_mended_schedule(round: &Round<'_>, status: &mut NestedControlPlaneStatus) {
    let invalid = Reason::InvalidKeyRotationSchedule.as_str();
    let stale = status
        .conditions
        .iter()
        .any(|c| c.type_ == ENCRYPTION_KEY_ROTATION && c.reason == invalid);
    let schedule = round
        .ncp
        .spec
        .encryption
        .as_ref()
        .and_then(|e| e.key_rotation_schedule.as_deref());
    if !stale || schedule.is_some_and(|s| Schedule::parse(s).is_err()) {
        return;
    }
    let last = status.encryption.as_ref().and_then(|e| e.rotation.clone());
    match last
        .as_ref()
        .and_then(|r| KeyRotationPhase::parse(&r.phase).map(|p| (p, r)))
    {
        Some((phase, rotation)) => round.set(status, condition(phase, rotation)),
        None => status.conditions.retain(|c| c.type_ != ENCRYPTION_KEY_ROTATION),
    }
}

/// The time from `now` until `run`, at most [`SCHEDULE_RECHECK`] (a long requeue is lost
/// with the process anyway; a pass at least this often also notices a changed schedule
/// without a watch event).
fn until(run: k8s_openapi::jiff::Timestamp, now: k8s_openapi::jiff::Timestamp) -> Duration {
    let left = run.duration_since(now);
    Duration::try_from(left)
        .unwrap_or(Duration::ZERO)
        .clamp(Duration::from_secs(1), SCHEDULE_RECHECK)
}

/// What one pass did in its phase.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// The phase took effect everywhere (with the objects rewritten, in `RewriteSecrets`).
    Done(Option<i64>),
    /// The phase waits; the message says for what.
    Waiting(String),
}

/// A phase that changes the configuration: `<c>-encryption` written as the phase wants it,
/// or, once it holds that, every apiserver waited for.
async fn move_config(
    round: &Round<'_>,
    phase: KeyRotationPhase,
    secret: &str,
    key: &str,
) -> Result<Outcome, ReconcileError> {
    let config = read(round, secret).await?;
    let current = keys(&config).map_err(pki(secret))?;
    let new = match current.iter().find(|k| k.name == key) {
        Some(found) => found.clone(),
        // Made in `AddKey` (again, when its first write did not land: nothing was encrypted
        // with a key no apiserver had).
        None if phase == KeyRotationPhase::AddKey => EncryptionKey::generate(key).map_err(pki(secret))?,
        None => {
            return Ok(Outcome::Waiting(format!(
                "the new key {key} is not in {secret} any more; restore the Secret, or request a rotation anew"
            )));
        }
    };
    let desired = keys_for_phase(phase, &current, &new).unwrap_or_else(|| current.clone());
    // KMS providers that only read are old keys too: everything was written again under
    // the writer before `DropOldKeys`.
    let kms = kms_providers(&config).map_err(pki(secret))?;
    let desired_kms = match phase {
        KeyRotationPhase::DropOldKeys => KmsProviders {
            writer: kms.writer.clone(),
            readers: Vec::new(),
        },
        _ => kms.clone(),
    };
    if desired != current || desired_kms != kms {
        let resources = configured_resources(&config).map_err(pki(secret))?;
        round
            .store
            .write_encryption_config(secret, &encryption_configuration(&desired, &desired_kms, &resources))
            .await?;
        return Ok(Outcome::Waiting(format!("wrote {secret} for phase {}", phase.as_str())));
    }
    Ok(match converged(&observations(round, secret).await?) {
        Ok(()) => Outcome::Done(None),
        Err(waiting) => Outcome::Waiting(waiting),
    })
}

/// `RewriteSecrets`: every object of every resource `<c>-encryption` (`secret`) encrypts
/// written again, unchanged, through the tenant's apiserver, which stores it under the key it
/// now encrypts with (the apiserver writes an unchanged object again when it read it with
/// another key than its first: the re-encryption the Kubernetes documentation gives,
/// <https://kubernetes.io/docs/tasks/administer-cluster/encrypt-data/#ensure-all-secrets-are-encrypted>).
/// An object changed or deleted meanwhile was written under the new key already. Secrets
/// are known; every other resource is found by discovery of its group (one not served has
/// no objects to rewrite).
async fn rewrite(round: &Round<'_>, secret: &str) -> Result<Outcome, ReconcileError> {
    let resources = configured_resources(&read(round, secret).await?).map_err(pki(secret))?;
    let client = tenant_client(round.ctx, round.ncp, round.ns).await?;
    let mut count = 0;
    for resource in &resources {
        let Some(api_resource) = api_resource(&client, resource).await? else {
            tracing::info!(resource, "not served by the tenant: nothing of it to rewrite");
            continue;
        };
        count += rewrite_all(&client, &api_resource).await?;
    }
    Ok(Outcome::Done(Some(count)))
}

/// The served version of `resource` (`configmaps`, `deployments.apps`), `None` when its group
/// does not serve it or it cannot be listed and updated (`tokenreviews`, which kube-apiserver
/// accepts in an `EncryptionConfiguration`, is never stored: nothing to rewrite).
async fn api_resource(client: &kube::Client, resource: &str) -> Result<Option<ApiResource>, ReconcileError> {
    if resource == "secrets" {
        return Ok(Some(ApiResource::erase::<Secret>(&())));
    }
    let (plural, group) = resource.split_once('.').unwrap_or((resource, ""));
    let found = match kube::discovery::group(client, group).await {
        Ok(group) => group
            .resources_by_stability()
            .into_iter()
            .find(|(ar, caps)| {
                use kube::discovery::verbs::{LIST, UPDATE};
                ar.plural == plural && caps.supports_operation(LIST) && caps.supports_operation(UPDATE)
            })
            .map(|(ar, _)| ar),
        // A group the tenant does not serve (a CRD not installed there).
        Err(kube::Error::Discovery(_)) => None,
        Err(kube::Error::Api(e)) if e.code == 404 => None,
        Err(other) => return Err(other.into()),
    };
    Ok(found)
}

/// Every object of `resource` written again, [`REWRITES_AT_ONCE`] at a time; how many.
async fn rewrite_all(client: &kube::Client, resource: &ApiResource) -> Result<i64, ReconcileError> {
    let objects = Api::<DynamicObject>::all_with(client.clone(), resource)
        .list(&ListParams::default())
        .await?
        .items;
    let count = objects.len() as i64;
    futures::stream::iter(objects)
        .map(|object| {
            let api = match object.namespace() {
                Some(ns) => Api::<DynamicObject>::namespaced_with(client.clone(), &ns, resource),
                None => Api::<DynamicObject>::all_with(client.clone(), resource),
            };
            async move {
                match api.replace(&object.name_any(), &PostParams::default(), &object).await {
                    Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
                    other => other.map(drop),
                }
            }
        })
        .buffer_unordered(REWRITES_AT_ONCE)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(count)
}

/// Records `outcome` of `phase` in `rotation`; returns the phase it is in now.
fn record(
    rotation: &mut EncryptionKeyRotation,
    phase: KeyRotationPhase,
    outcome: Outcome,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> KeyRotationPhase {
    match outcome {
        Outcome::Waiting(message) => {
            rotation.message = message;
            phase
        }
        Outcome::Done(rewritten) => {
            rotation.phases.push(RotationPhaseRecord {
                phase: phase.as_str().to_owned(),
                completion_time: now.clone(),
            });
            if rewritten.is_some() {
                rotation.rewritten = rewritten;
            }
            let next = phase.next();
            rotation.phase = next.as_str().to_owned();
            rotation.message = String::new();
            next
        }
    }
}

/// The `EncryptionKeyRotation` condition of a rotation in `phase`.
fn condition(phase: KeyRotationPhase, rotation: &EncryptionKeyRotation) -> ConditionUpdate {
    let key = &rotation.key;
    let reason = match phase {
        KeyRotationPhase::AddKey => Reason::AddKey,
        KeyRotationPhase::EncryptWithNewKey => Reason::EncryptWithNewKey,
        KeyRotationPhase::RewriteSecrets => Reason::RewriteSecrets,
        KeyRotationPhase::DropOldKeys => Reason::DropOldKeys,
        KeyRotationPhase::Completed => {
            let rewritten = rotation.rewritten.unwrap_or_default();
            return ConditionUpdate::new(
                ENCRYPTION_KEY_ROTATION,
                false,
                Reason::Completed,
                format!(
                    "the encryption key was rotated to {key}; {rewritten} objects of the encrypted resources were written again under it and the old keys dropped"
                ),
            );
        }
    };
    let waiting = if rotation.message.is_empty() {
        "starting"
    } else {
        &rotation.message
    };
    ConditionUpdate::new(
        ENCRYPTION_KEY_ROTATION,
        true,
        reason,
        format!(
            "rotating the encryption key to {key}, phase {}: {waiting}",
            phase.as_str()
        ),
    )
}

/// The configuration in `<c>-encryption`; its absence is the missing key.
async fn read(round: &Round<'_>, secret: &str) -> Result<String, ReconcileError> {
    round
        .store
        .read_encryption_config(secret)
        .await?
        .ok_or_else(|| ReconcileError::EncryptionKeyMissing(secret.to_owned()))
}

fn pki(secret: &str) -> impl Fn(crate::pki::PkiError) -> ReconcileError + '_ {
    move |source| ReconcileError::Pki {
        secret: secret.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rotation(phase: KeyRotationPhase) -> EncryptionKeyRotation {
        EncryptionKeyRotation {
            request: "1".into(),
            key: "key2".into(),
            phase: phase.as_str().into(),
            start_time: crate::controllers::round::Now::take().k8s,
            phases: Vec::new(),
            message: String::new(),
            rewritten: None,
            scheduled: None,
        }
    }

    #[test]
    fn a_finished_phase_is_recorded_and_the_next_one_begins() {
        let now = crate::controllers::round::Now::take().k8s;
        let mut r = rotation(KeyRotationPhase::RewriteSecrets);
        let next = record(&mut r, KeyRotationPhase::RewriteSecrets, Outcome::Done(Some(7)), &now);
        assert_eq!(next, KeyRotationPhase::DropOldKeys);
        assert_eq!(
            (r.phase.as_str(), r.rewritten, r.phases.len()),
            ("DropOldKeys", Some(7), 1)
        );
        let same = record(&mut r, next, Outcome::Waiting("apiserver demo is rolling".into()), &now);
        assert_eq!(same, KeyRotationPhase::DropOldKeys);
        assert_eq!(r.message, "apiserver demo is rolling");
        let update = condition(same, &r);
        assert!(update.status && update.message.contains("phase DropOldKeys: apiserver demo is rolling"));
        r.phase = KeyRotationPhase::Completed.as_str().into();
        let done = condition(KeyRotationPhase::Completed, &r);
        assert!(!done.status && done.message.contains("7 objects"), "{}", done.message);
    }
}
