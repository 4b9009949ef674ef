//! The NestedControlPlane's CA rotation step (docs/design.md §9; the stages are
//! [`crate::pki::rotation`]'s). A rotation is requested with the annotation
//! [`ROTATE_ANNOTATION`]; each reconcile writes the authority's Secret for the recorded
//! phase, and advances the phase only once every component that mounts the authority is
//! ready with the digest of the Secrets as they are now. The phase is recorded in status
//! before the Secrets of the next phase are written, so a rotation interrupted anywhere
//! resumes where it stopped.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use super::scope::Round;
use crate::api::{
    CertificateAuthorityRotation, NestedAPIServer, NestedControlPlaneStatus, NestedControllerManager, NestedEtcd,
    RotationPhaseRecord,
};
use crate::controllers::ReconcileError;
use crate::controllers::component::ComponentResource;
use crate::pki::rotation::{Authority, ComponentObservation, Phase, converged, desired_content, parse_request};
use crate::pki::{
    CLUSTER_CA_COMMON_NAME, CertificateAuthority, ETCD_CA_COMMON_NAME, FRONT_PROXY_CA_COMMON_NAME, KeyAlgorithm,
    KeyPairPem, SecretNames, service_account_key_pair,
};
use crate::plan::certificates_digest;
use crate::status::{CA_ROTATION, ConditionUpdate, Reason};

/// Annotation on a NestedControlPlane that requests a rotation: `ca`, `etcd`,
/// `front-proxy` or `sa`, optionally followed by `/<id>` so that the same authority can be
/// rotated again later (a value equal to the last completed request does nothing).
pub const ROTATE_ANNOTATION: &str = "controlplane.cluster.x-k8s.io/rotate-certificate-authority";

fn secret_of(names: &SecretNames, authority: Authority) -> &str {
    match authority {
        Authority::Cluster => &names.ca,
        Authority::Etcd => &names.etcd_ca,
        Authority::FrontProxy => &names.proxy_ca,
        Authority::ServiceAccount => &names.sa,
    }
}

/// The next authority's Secret (`<secret>-next`).
pub fn next_secret(secret: &str) -> String {
    format!("{secret}-next")
}

fn generate(authority: Authority, now: time::OffsetDateTime) -> Result<KeyPairPem, crate::pki::PkiError> {
    let common_name = match authority {
        Authority::Cluster => CLUSTER_CA_COMMON_NAME,
        Authority::Etcd => ETCD_CA_COMMON_NAME,
        Authority::FrontProxy => FRONT_PROXY_CA_COMMON_NAME,
        Authority::ServiceAccount => return service_account_key_pair(KeyAlgorithm::default()),
    };
    Ok(
        CertificateAuthority::generate(common_name, now, KeyAlgorithm::default())?
            .pem()
            .clone(),
    )
}

/// Starts a requested rotation and moves the one in progress as far as it can, recording
/// its phase and its condition in `status`.
///
/// The rest of the pass needs nothing back, not even for a lost authority, which a
/// rotation brings back: the phase that finds it lost records the next one (`SignWithNew`,
/// as nothing old is left to trust together) and writes nothing, so that pass's
/// certificates stage still reports it missing; the status write that records the phase
/// wakes the next pass at once, whose rotation step writes the new authority into the
/// Secret before the certificates stage reads it ([`next_move`]).
///
/// # Errors
/// API and PKI errors; the caller retries.
pub(super) async fn step(round: &Round<'_>, status: &mut NestedControlPlaneStatus) -> Result<(), ReconcileError> {
    if let Err(refusal) = start_requested(round, status) {
        round.set(status, refusal);
        return Ok(());
    }
    let Some((mut rotation, authority, phase)) = running(status.certificate_authority_rotation.as_deref()) else {
        return Ok(());
    };
    let secret = secret_of(&round.names, authority).to_string();
    let current = round.store.read_pair(&secret).await?;
    let outcome = match phase {
        Phase::NewAuthority => new_authority(round, authority, &secret).await?,
        _ => move_phase(round, phase, &secret, current.as_ref()).await?,
    };
    let Some(phase) = record(&mut rotation, phase, outcome, current.is_none(), &round.now.k8s) else {
        round.set(status, state_lost(authority, &next_secret(&secret)));
        return Ok(());
    };
    if phase == Phase::Completed {
        round.store.delete(&next_secret(&secret)).await?;
    }
    round.set(status, condition(authority, &secret, phase, &rotation.message));
    status.certificate_authority_rotation = Some(rotation);
    Ok(())
}

/// Records in `status` the rotation requested by the annotation, if there is a new one.
/// `Err` with the condition that refuses it: an unknown authority, or one the user
/// supplied.
fn start_requested(round: &Round<'_>, status: &mut NestedControlPlaneStatus) -> Result<(), ConditionUpdate> {
    let annotation = round.ncp.annotations().get(ROTATE_ANNOTATION).map(String::as_str);
    let Some(request) = new_request(annotation, status.certificate_authority_rotation.as_deref()) else {
        return Ok(());
    };
    let authority = parse_request(&request)
        .map_err(|message| ConditionUpdate::new(CA_ROTATION, false, Reason::InvalidRotationRequest, message))?;
    let secret = secret_of(&round.names, authority);
    if round.store.owned_by_control_plane(secret) == Some(false) {
        let message = format!(
            "{secret} was supplied by the user, not created by capn: capn never rotates a user-supplied {authority} (docs/design.md §6); replace it yourself"
        );
        return Err(ConditionUpdate::new(
            CA_ROTATION,
            false,
            Reason::UserSuppliedAuthority,
            message,
        ));
    }
    status.certificate_authority_rotation = Some(Box::new(CertificateAuthorityRotation {
        request,
        authority: authority.as_str().to_string(),
        phase: Phase::NewAuthority.as_str().to_string(),
        start_time: round.now.k8s.clone(),
        phases: Vec::new(),
        message: String::new(),
    }));
    Ok(())
}

/// The request to start, from the annotation's value: none while a rotation runs, and none
/// when it is empty or the one the last rotation carried out.
pub(super) fn new_request(annotation: Option<&str>, last: Option<&CertificateAuthorityRotation>) -> Option<String> {
    new_request_after(
        annotation,
        last.map(|r| (r.request.as_str(), r.phase.as_str())),
        Phase::Completed.as_str(),
    )
}

/// [`new_request`] for any rotation: `last` is the last one's request and phase, and
/// `completed` the name of its last phase.
pub(super) fn new_request_after(
    annotation: Option<&str>,
    last: Option<(&str, &str)>,
    completed: &str,
) -> Option<String> {
    if last.is_some_and(|(_, phase)| phase != completed) {
        return None;
    }
    let request = annotation?.trim();
    (!request.is_empty() && last.is_none_or(|(last, _)| last != request)).then(|| request.to_string())
}

/// The rotation in progress, with its authority and phase; `None` when none runs.
pub(super) fn running(
    rotation: Option<&CertificateAuthorityRotation>,
) -> Option<(Box<CertificateAuthorityRotation>, Authority, Phase)> {
    let rotation = rotation?;
    let authority = Authority::parse(&rotation.authority)?;
    let phase = Phase::parse(&rotation.phase).filter(|p| *p != Phase::Completed)?;
    Some((Box::new(rotation.clone()), authority, phase))
}

/// What one pass did in its phase.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    /// The phase took effect everywhere: the next one follows.
    Done,
    /// The phase waits (the message says for what).
    Waiting(String),
    /// The new authority's Secret is gone: the rotation cannot go on.
    StateLost,
}

/// `NewAuthority`: the new authority is generated into `<secret>-next` (kept if it is
/// there already: an interrupted pass resumes with it).
async fn new_authority(round: &Round<'_>, authority: Authority, secret: &str) -> Result<Outcome, ReconcileError> {
    let next_name = next_secret(secret);
    let fresh = generate(authority, round.now.time).map_err(|source| ReconcileError::Pki {
        secret: next_name.clone(),
        source,
    })?;
    round.store.create_pair(&next_name, &fresh).await?;
    Ok(Outcome::Done)
}

/// A phase after `NewAuthority`: the authority's Secret written as the phase wants it, or,
/// once it holds that, every component that mounts it waited for.
async fn move_phase(
    round: &Round<'_>,
    phase: Phase,
    secret: &str,
    current: Option<&KeyPairPem>,
) -> Result<Outcome, ReconcileError> {
    let next = round.store.read_pair(&next_secret(secret)).await?;
    Ok(match next_move(phase, current, next.as_ref()) {
        Move::StateLost => Outcome::StateLost,
        Move::Write(desired) => {
            round.store.write_pair(secret, &desired).await?;
            Outcome::Waiting(format!("wrote {secret} for phase {}", phase.as_str()))
        }
        Move::Advance => Outcome::Done,
        Move::AwaitComponents => match converged(&observations(round, secret).await?) {
            Ok(()) => Outcome::Done,
            Err(waiting) => Outcome::Waiting(waiting),
        },
    })
}

/// What a phase after `NewAuthority` does next.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Move {
    /// The new authority's Secret is gone.
    StateLost,
    /// The authority's Secret must hold this.
    Write(KeyPairPem),
    /// The phase keeps nothing old (the old authority was lost): nothing to write.
    Advance,
    /// The Secret holds what the phase wants: the components must follow.
    AwaitComponents,
}

/// What `phase` does, given what the authority's Secret holds (`current`, `None` when it
/// is lost) and the new authority (`next`, `None` when its Secret is gone).
pub(super) fn next_move(phase: Phase, current: Option<&KeyPairPem>, next: Option<&KeyPairPem>) -> Move {
    let Some(next) = next else {
        return Move::StateLost;
    };
    match desired_content(phase, current, next) {
        Some(desired) if current != Some(&desired) => Move::Write(desired),
        None => Move::Advance,
        Some(_) => Move::AwaitComponents,
    }
}

/// Records `outcome` of `phase` in `rotation`; returns the phase it is in now (the next one
/// when `phase` is done; `old_lost` skips `TrustBoth`), `None` when its state is lost.
pub(super) fn record(
    rotation: &mut CertificateAuthorityRotation,
    phase: Phase,
    outcome: Outcome,
    old_lost: bool,
    now: &Time,
) -> Option<Phase> {
    match outcome {
        Outcome::StateLost => None,
        Outcome::Waiting(message) => {
            rotation.message = message;
            Some(phase)
        }
        Outcome::Done => {
            rotation.phases.push(RotationPhaseRecord {
                phase: phase.as_str().to_string(),
                completion_time: now.clone(),
            });
            let next = phase.next(old_lost);
            rotation.phase = next.as_str().to_string();
            rotation.message = String::new();
            Some(next)
        }
    }
}

/// The condition of a rotation whose new authority's Secret (`next_name`) is gone.
fn state_lost(authority: Authority, next_name: &str) -> ConditionUpdate {
    let message = format!(
        "{next_name}, the new {authority} of the rotation, is gone; restore it, or remove the rotation by requesting it anew"
    );
    ConditionUpdate::new(CA_ROTATION, true, Reason::RotationStateLost, message)
}

/// The CertificateAuthorityRotation condition of a rotation in `phase` (`message`: what it
/// waits for).
pub(super) fn condition(authority: Authority, secret: &str, phase: Phase, message: &str) -> ConditionUpdate {
    if phase == Phase::Completed {
        return ConditionUpdate::new(
            CA_ROTATION,
            false,
            Reason::Completed,
            format!("the {authority} authority ({secret}) was rotated; only the new one is trusted"),
        );
    }
    ConditionUpdate::new(
        CA_ROTATION,
        true,
        phase_reason(phase),
        format!(
            "rotating the {authority} authority ({secret}), phase {}: {}",
            phase.as_str(),
            if message.is_empty() { "starting" } else { message }
        ),
    )
}

/// The CertificateAuthorityRotation reason of a running rotation: its phase.
fn phase_reason(phase: Phase) -> Reason {
    match phase {
        Phase::NewAuthority => Reason::NewAuthority,
        Phase::TrustBoth => Reason::TrustBoth,
        Phase::SignWithNew => Reason::SignWithNew,
        Phase::DropOld => Reason::DropOld,
        Phase::Completed => Reason::Completed,
    }
}

/// Each component that mounts `secret`: ready, and on the digest of its Secrets as they
/// are now?
pub(super) async fn observations(round: &Round<'_>, secret: &str) -> Result<Vec<ComponentObservation>, ReconcileError> {
    let statuses = [
        observed::<NestedEtcd>(round),
        observed::<NestedAPIServer>(round),
        observed::<NestedControllerManager>(round),
    ];
    let mut out = Vec::new();
    for (name, ready, applied) in statuses.into_iter().flatten() {
        let Some(applied) = applied.filter(|a| a.secrets.iter().any(|s| s == secret)) else {
            continue;
        };
        let mut digests = Vec::new();
        for s in &applied.secrets {
            digests.push((s.as_str(), round.store.data_digest(s).await?.unwrap_or_default()));
        }
        let now = certificates_digest(digests.iter().map(|(n, d)| (*n, d.as_str())));
        out.push(ComponentObservation {
            name,
            ready,
            current_digest: now == applied.digest,
        });
    }
    Ok(out)
}

/// A component's name, whether it is ready on its current generation, and the
/// certificates it was applied with.
fn observed<K: ComponentResource>(
    round: &Round<'_>,
) -> Option<(String, bool, Option<crate::api::AppliedCertificates>)> {
    let name = K::reference(round.ncp)?;
    let component = K::cache(&round.ctx.caches).get(&ObjectRef::new(name).within(round.ns))?;
    let status = component.component_status()?;
    let ready = status.ready && status.observed_generation == component.meta().generation;
    Some((
        format!("{} {name}", K::KIND.resource_kind()),
        ready,
        status.certificates.clone(),
    ))
}
