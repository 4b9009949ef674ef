//! The control plane's certificates: the CAs, the service-account key and the
//! encryption-at-rest key (created once, never re-minted: docs/design.md §6), the admin `<cluster>-kubeconfig`, and when the
//! earliest certificate expires and the next one is renewed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use time::OffsetDateTime;

use super::scope::Round;
use crate::api::{ApiEndpoint, CertificateRenewal, EncryptionStatus, NestedControlPlaneStatus};
use crate::controllers::ReconcileError;
use crate::controllers::shared::certificates::CaRef;
use crate::pki::encryption::{
    KMS_PROVIDER, KmsProviders, PROVIDER, configured_resources, desired_resources, key_names, kms_providers,
};
use crate::pki::{
    CLUSTER_CA_COMMON_NAME, ETCD_CA_COMMON_NAME, FRONT_PROXY_CA_COMMON_NAME, admin_leaf, admin_user, server_url,
};
use crate::plan::APISERVER_PORT;
use crate::status::{CERTIFICATES_AVAILABLE, ConditionUpdate, Reason, is_true};

/// The authorities as this pass found them: the cluster CA (it signs the admin kubeconfig)
/// and when each CA expires.
pub(super) struct Authorities {
    pub cluster: CaRef,
    pub expiry: Vec<OffsetDateTime>,
}

/// The CAs and the service-account key: created on the control plane's first passes; after
/// that a missing one is an error for a human, never a silent re-mint (docs/design.md §6).
///
/// # Errors
/// [`ReconcileError::CertificateAuthorityMissing`]; API and PKI errors.
pub(super) async fn ensure_authorities(
    round: &Round<'_>,
    status: &mut NestedControlPlaneStatus,
) -> Result<Authorities, ReconcileError> {
    let may_create = !status.initialized && !is_true(&status.conditions, CERTIFICATES_AVAILABLE);
    // The encryption key came later than the CAs: a control plane made by an older capn
    // gets one (nothing was encrypted before it); once recorded, it is never made again.
    let may_create_key = status.encryption.is_none();
    // A new control plane's key encrypts what its spec asks from the start; a change later
    // is `encryption_rotation::step`'s (written once no rotation runs).
    let spec = round.ncp.spec.encryption.as_ref();
    let resources = desired_resources(spec.and_then(|e| e.resources.as_deref()), &[]);
    // A KMS plugin of a new control plane encrypts from the start (no apiserver ran without
    // it); one given to a control plane made by an older capn reads first
    // (`encryption_rotation::step` makes it the writer once every apiserver has it).
    let kms = spec.and_then(|e| e.kms.as_deref()).cloned();
    let kms = match may_create {
        true => KmsProviders {
            writer: kms,
            readers: Vec::new(),
        },
        false => KmsProviders {
            writer: None,
            readers: kms.into_iter().collect(),
        },
    };
    let (store, names) = (&round.store, &round.names);
    // Five independent Secrets: read or created at once, not one after another.
    let (ca, etcd_ca, proxy_ca, (), config) = futures::try_join!(
        store.ensure_ca(&names.ca, CLUSTER_CA_COMMON_NAME, may_create),
        store.ensure_ca(&names.etcd_ca, ETCD_CA_COMMON_NAME, may_create),
        store.ensure_ca(&names.proxy_ca, FRONT_PROXY_CA_COMMON_NAME, may_create),
        store.ensure_service_account_key(&names.sa, may_create),
        store.ensure_encryption_key(&names.encryption, may_create_key, &kms, &resources),
    )?;
    if let Some(config) = config {
        let rotation = status.encryption.take().and_then(|e| e.rotation);
        let recorded = encryption_status(&config, rotation).map_err(|source| ReconcileError::Pki {
            secret: names.encryption.clone(),
            source,
        })?;
        status.encryption = Some(Box::new(recorded));
    }
    round.set(
        status,
        ConditionUpdate::new(
            CERTIFICATES_AVAILABLE,
            true,
            Reason::CertificatesAvailable,
            "CAs, service-account key and encryption key exist",
        ),
    );
    let mut expiry = Vec::new();
    for authority in [&ca, &etcd_ca, &proxy_ca] {
        expiry.extend(store.ca_not_after(authority).await?);
    }
    Ok(Authorities { cluster: ca, expiry })
}

/// What the status records of the `EncryptionConfiguration` `config`: the provider and key
/// that encrypt every write (the KMS writer when there is one, else capn's first key), the
/// resources, the KMS providers; `rotation` kept as it was.
///
/// # Errors
/// [`crate::pki::PkiError::InvalidEncryptionConfiguration`] when capn cannot read it.
pub(super) fn encryption_status(
    config: &str,
    rotation: Option<crate::api::EncryptionKeyRotation>,
) -> Result<EncryptionStatus, crate::pki::PkiError> {
    let kms = kms_providers(config)?;
    let (provider, key) = match &kms.writer {
        Some(writer) => (KMS_PROVIDER.to_owned(), writer.name.clone()),
        None => (
            PROVIDER.to_owned(),
            key_names(config)?.into_iter().next().unwrap_or_default(),
        ),
    };
    Ok(EncryptionStatus {
        provider,
        key,
        resources: configured_resources(config)?,
        kms: kms.all().cloned().collect(),
        rotation,
    })
}

/// The admin kubeconfig `<c>-kubeconfig` (CAPI secret layout), once the endpoint is known.
/// Returns when its certificate expires.
///
/// # Errors
/// API and PKI errors.
pub(super) async fn ensure_kubeconfig(
    round: &Round<'_>,
    ca: &CaRef,
    endpoint: Option<&ApiEndpoint>,
) -> Result<Option<OffsetDateTime>, ReconcileError> {
    let Some(e) = endpoint else {
        return Ok(None);
    };
    let port = u16::try_from(e.port).unwrap_or(APISERVER_PORT as u16);
    let server = server_url(&e.host, port);
    let (expiry, _) = round
        .store
        .ensure_kubeconfig(
            &round.names.kubeconfig,
            ca,
            &admin_leaf(),
            &admin_user(&round.cluster.name),
            &server,
            false,
        )
        .await?;
    Ok(Some(expiry))
}

/// Records in status when the earliest certificate expires (of `expiry`, those this pass
/// read, and the leaves the components issued) and which is renewed next. The leaves say
/// both in their Secrets' annotations: read from the metadata cache, no request. The same
/// goes to the `capn_certificate_*` series, with `renew_window`, the policy's
/// ([`crate::pki::RenewalPolicy::renew_window`]).
pub(super) fn record_schedule(
    round: &Round<'_>,
    expiry: Vec<OffsetDateTime>,
    renew_window: time::Duration,
    status: &mut NestedControlPlaneStatus,
) {
    let leaves = leaf_schedule(round);
    let (expires, renewal) = schedule(expiry, &leaves, round.store.next_renewal_of());
    round.ctx.metrics.set_certificates(
        &round.cluster.namespace,
        &round.cluster.name,
        crate::telemetry::CertificateFigures {
            expiry: expires.as_ref().map(|t| t.0.as_second()),
            next_renewal: renewal.as_ref().map(|r| r.time.0.as_second()),
            renew_before: renew_window.whole_seconds(),
        },
    );
    status.certificates_expiry_date = expires;
    status.next_certificate_renewal = renewal;
}

/// What a leaf Secret's annotations say about its certificate.
pub(super) struct LeafSchedule {
    pub secret: String,
    pub not_after: OffsetDateTime,
    pub renew_at: Option<OffsetDateTime>,
}

/// The expiry and renewal times the cluster's leaf Secrets carry (annotations written when
/// capn issued them), from the metadata cache.
fn leaf_schedule(round: &Round<'_>) -> Vec<LeafSchedule> {
    round
        .names
        .all()
        .into_iter()
        .filter_map(|name| {
            let cached = round.ctx.caches.secret(round.ns, name)?;
            Some(LeafSchedule {
                secret: name.to_string(),
                not_after: cached.not_after?,
                renew_at: cached.renew_after,
            })
        })
        .collect()
}

/// The earliest of `expiry` and the leaves' expiry, and the earliest renewal of the leaves'
/// and `issued` (the earliest of those this pass issued), in the shape of the status.
pub(super) fn schedule(
    expiry: Vec<OffsetDateTime>,
    leaves: &[LeafSchedule],
    issued: Option<(OffsetDateTime, String)>,
) -> (Option<Time>, Option<CertificateRenewal>) {
    let expires = expiry
        .into_iter()
        .chain(leaves.iter().map(|l| l.not_after))
        .min()
        .and_then(kube_time);
    let next_renewal = leaves
        .iter()
        .filter_map(|l| l.renew_at.map(|at| (at, l.secret.clone())))
        .chain(issued)
        .min();
    let renewal = next_renewal.and_then(|(at, secret)| kube_time(at).map(|time| CertificateRenewal { secret, time }));
    (expires, renewal)
}

fn kube_time(t: OffsetDateTime) -> Option<Time> {
    k8s_openapi::jiff::Timestamp::from_second(t.unix_timestamp())
        .ok()
        .map(Time)
}
