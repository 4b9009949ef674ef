//! The NestedControlPlane's CA rotation step (docs/design.md §9; the stages are
//! [`crate::pki::rotation`]'s). A rotation is requested with the annotation
//! [`ROTATE_ANNOTATION`]; each reconcile writes the authority's Secret for the recorded
//! phase, and advances the phase only once every component that mounts the authority is
//! ready with the digest of the Secrets as they are now. The phase is recorded in status
//! before the Secrets of the next phase are written, so a rotation interrupted anywhere
//! resumes where it stopped.

use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use crate::api::{
    CertificateAuthorityRotation, NestedAPIServer, NestedControlPlane, NestedControlPlaneStatus,
    NestedControllerManager, NestedEtcd, RotationPhaseRecord,
};
use crate::controllers::component::ComponentResource;
use crate::controllers::round::Now;
use crate::controllers::shared::certificates::CertificateStore;
use crate::controllers::{Context, ReconcileError};
use crate::pki::rotation::{Authority, ComponentObservation, Phase, converged, desired_content, parse_request};
use crate::pki::{
    CLUSTER_CA_COMMON_NAME, CertificateAuthority, ETCD_CA_COMMON_NAME, FRONT_PROXY_CA_COMMON_NAME, KeyAlgorithm,
    SecretNames, service_account_key_pair,
};
use crate::plan::certificates_digest;
use crate::status::{CA_ROTATION, ConditionUpdate, Reason, set_condition};

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

fn generate(authority: Authority, now: time::OffsetDateTime) -> Result<crate::pki::KeyPairPem, crate::pki::PkiError> {
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

/// Starts a requested rotation and moves the one in progress as far as it can. Returns
/// whether a rotation is in progress (the rest of the reconcile must then not treat a
/// missing authority as lost: the rotation brings it back).
///
/// # Errors
/// API and PKI errors; the caller retries.
pub async fn step(
    ctx: &Context,
    ncp: &NestedControlPlane,
    store: &CertificateStore<'_>,
    names: &SecretNames,
    status: &mut NestedControlPlaneStatus,
    now: &Now,
) -> Result<bool, ReconcileError> {
    let generation = ncp.metadata.generation;
    let set = |status: &mut NestedControlPlaneStatus, update| {
        set_condition(&mut status.conditions, update, generation, &now.k8s)
    };
    let in_progress = status
        .certificate_authority_rotation
        .as_ref()
        .is_some_and(|r| r.phase != Phase::Completed.as_str());
    let requested = ncp.annotations().get(ROTATE_ANNOTATION).map(|v| v.trim().to_string());
    if !in_progress
        && let Some(request) = requested.filter(|r| {
            !r.is_empty()
                && status
                    .certificate_authority_rotation
                    .as_ref()
                    .is_none_or(|last| &last.request != r)
        })
    {
        let authority = match parse_request(&request) {
            Ok(authority) => authority,
            Err(message) => {
                set(
                    status,
                    ConditionUpdate::new(CA_ROTATION, false, Reason::InvalidRotationRequest, message),
                );
                return Ok(false);
            }
        };
        let secret = secret_of(names, authority);
        if store.owned_by_control_plane(secret) == Some(false) {
            let message = format!(
                "{secret} was supplied by the user, not created by capn: capn never rotates a user-supplied {authority} (docs/design.md §6); replace it yourself"
            );
            set(
                status,
                ConditionUpdate::new(CA_ROTATION, false, Reason::UserSuppliedAuthority, message),
            );
            return Ok(false);
        }
        status.certificate_authority_rotation = Some(Box::new(CertificateAuthorityRotation {
            request,
            authority: authority.as_str().to_string(),
            phase: Phase::NewAuthority.as_str().to_string(),
            start_time: now.k8s.clone(),
            phases: Vec::new(),
            message: String::new(),
        }));
    }
    let Some(mut rotation) = status.certificate_authority_rotation.clone() else {
        return Ok(false);
    };
    let (Some(authority), Some(mut phase)) = (Authority::parse(&rotation.authority), Phase::parse(&rotation.phase))
    else {
        return Ok(false);
    };
    if phase == Phase::Completed {
        return Ok(false);
    }
    let secret = secret_of(names, authority).to_string();
    let next_name = next_secret(&secret);
    let current = store.read_pair(&secret).await?;
    let message = match phase {
        Phase::NewAuthority => {
            let fresh = generate(authority, now.time).map_err(|source| ReconcileError::Pki {
                secret: next_name.clone(),
                source,
            })?;
            store.create_pair(&next_name, &fresh).await?;
            Ok(())
        }
        _ => {
            let Some(next) = store.read_pair(&next_name).await? else {
                let message = format!(
                    "{next_name}, the new {authority} of the rotation, is gone; restore it, or remove the rotation by requesting it anew"
                );
                set(
                    status,
                    ConditionUpdate::new(CA_ROTATION, true, Reason::RotationStateLost, message),
                );
                return Ok(true);
            };
            match desired_content(phase, current.as_ref(), &next) {
                Some(desired) if current.as_ref() != Some(&desired) => {
                    store.write_pair(&secret, &desired).await?;
                    Err(format!("wrote {secret} for phase {}", phase.as_str()))
                }
                // A phase that keeps nothing old (the old one was lost): nothing to write.
                None => Ok(()),
                Some(_) => converged(&observations(ctx, ncp, store, &secret).await?),
            }
        }
    };
    match message {
        Ok(()) => {
            rotation.phases.push(RotationPhaseRecord {
                phase: phase.as_str().to_string(),
                completion_time: now.k8s.clone(),
            });
            phase = phase.next(current.is_none());
            if phase == Phase::Completed {
                store.delete(&next_name).await?;
            }
            rotation.phase = phase.as_str().to_string();
            rotation.message = String::new();
        }
        Err(waiting) => rotation.message = waiting,
    }
    let running = phase != Phase::Completed;
    let update = if running {
        ConditionUpdate::new(
            CA_ROTATION,
            true,
            phase_reason(phase),
            format!(
                "rotating the {authority} authority ({secret}), phase {}: {}",
                phase.as_str(),
                if rotation.message.is_empty() {
                    "starting"
                } else {
                    &rotation.message
                }
            ),
        )
    } else {
        ConditionUpdate::new(
            CA_ROTATION,
            false,
            Reason::Completed,
            format!("the {authority} authority ({secret}) was rotated; only the new one is trusted"),
        )
    };
    set(status, update);
    status.certificate_authority_rotation = Some(rotation);
    Ok(running)
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
async fn observations(
    ctx: &Context,
    ncp: &NestedControlPlane,
    store: &CertificateStore<'_>,
    secret: &str,
) -> Result<Vec<ComponentObservation>, ReconcileError> {
    let ns = ncp.namespace().unwrap_or_default();
    let statuses = [
        observed::<NestedEtcd>(ctx, ncp, &ns),
        observed::<NestedAPIServer>(ctx, ncp, &ns),
        observed::<NestedControllerManager>(ctx, ncp, &ns),
    ];
    let mut out = Vec::new();
    for (name, ready, applied) in statuses.into_iter().flatten() {
        let Some(applied) = applied.filter(|a| a.secrets.iter().any(|s| s == secret)) else {
            continue;
        };
        let mut digests = Vec::new();
        for s in &applied.secrets {
            digests.push((s.as_str(), store.data_digest(s).await?.unwrap_or_default()));
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
    ctx: &Context,
    ncp: &NestedControlPlane,
    ns: &str,
) -> Option<(String, bool, Option<crate::api::AppliedCertificates>)> {
    let name = K::reference(ncp)?;
    let component = K::cache(&ctx.caches).get(&ObjectRef::new(name).within(ns))?;
    let status = component.component_status()?;
    let ready = status.ready && status.observed_generation == component.meta().generation;
    Some((
        format!("{} {name}", K::KIND.resource_kind()),
        ready,
        status.certificates.clone(),
    ))
}
