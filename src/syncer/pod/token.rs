//! Service-account tokens of the *tenant*, delivered through a Secret.
//!
//! A tenant pod's tokens must be the tenant apiserver's: bound to the tenant pod, signed by
//! the tenant's service-account key, for the audiences the pod asks for. The super cluster
//! cannot mint them, and since Kubernetes 1.24 no legacy token Secret exists to copy
//! (VirtualCluster's way, which broke there). So, as vcluster does, the controller asks the
//! tenant apiserver (TokenRequest, bound to the tenant pod) and writes the tokens into one
//! Secret per pod, which the super pod mounts.
//!
//! Each projected `serviceAccountToken` source, the one in the `kube-api-access-*` volume
//! the tenant's ServiceAccount admission adds included, becomes a projected `secret` source
//! in the *same* volume: the other sources stay beside it, so the mount still holds
//! `token`, `ca.crt` and `namespace` where client-go's in-cluster configuration reads them
//! (a separate Secret volume could not share the mount path). The Secret key is
//! `<volume name>.<source index>`, unique in the pod since volume names are; the file keeps
//! the source's `path` and the volume's `defaultMode`.
//!
//! The controller refreshes a token as the kubelet does (`pkg/kubelet/token`: past 80% of
//! its lifetime, or older than 24 hours); the kubelet then updates the mounted file, as it
//! updates every Secret volume. It gives the Secret an owner reference to the super pod,
//! so the garbage collector deletes it with the pod; its name is no mapped name, so the
//! orphan search among synced Secrets (`diff::orphans`) never takes it for a copy.

use k8s_openapi::api::core::v1::{KeyToPath, PodSpec, SecretProjection, VolumeProjection};

use crate::syncer::names::ControlPlaneRef;
use crate::syncer::names::tenancy::TenantObject;

/// A projected token's lifetime when the source sets none (`expirationSeconds` "defaults
/// to 1 hour", the API reference of ServiceAccountTokenProjection).
pub const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;

/// The Secret that carries a pod's tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenSecret {
    /// Its name in the workload namespace ([`ControlPlaneRef::token_secret_name`]).
    pub name: String,
    /// The tenant service account the tokens are for.
    pub service_account_name: String,
    /// One token per key.
    pub tokens: Vec<TokenRequest>,
}

/// One token the controller requests from the tenant apiserver (a TokenRequest for the
/// service account, bound to the tenant pod).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenRequest {
    /// The Secret key the token goes under.
    pub key: String,
    /// The audience the projection asks for; `None`: the tenant apiserver's own
    /// (`--api-audiences`).
    pub audience: Option<String>,
    /// The lifetime asked for, in seconds.
    pub expiration_seconds: i64,
}

/// Replaces every projected service-account token source of `spec` by a source of the
/// token Secret of the tenant pod `identity`; `None` when the pod projects no token.
pub(super) fn replace(
    spec: &mut PodSpec,
    control_plane: &ControlPlaneRef,
    identity: &TenantObject,
    service_account: &str,
) -> Option<TokenSecret> {
    let name = control_plane.token_secret_name(&identity.namespace, &identity.name, &identity.uid);
    let mut tokens = Vec::new();
    for (key, source) in super::projected_sources_mut(spec) {
        let Some(projection) = source.service_account_token.take() else {
            continue;
        };
        tokens.push(TokenRequest {
            key: key.clone(),
            audience: projection.audience.filter(|a| !a.is_empty()),
            expiration_seconds: projection.expiration_seconds.unwrap_or(DEFAULT_EXPIRATION_SECONDS),
        });
        *source = VolumeProjection {
            secret: Some(SecretProjection {
                name: name.clone(),
                items: Some(vec![KeyToPath {
                    key,
                    path: projection.path,
                    mode: None,
                }]),
                optional: Some(false),
            }),
            ..VolumeProjection::default()
        };
    }
    (!tokens.is_empty()).then(|| TokenSecret {
        name,
        service_account_name: service_account.to_owned(),
        tokens,
    })
}
