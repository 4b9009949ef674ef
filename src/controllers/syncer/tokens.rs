//! A pod's service-account tokens, from the *tenant* apiserver (TokenRequest, bound to the
//! tenant pod), into the Secret its super pod mounts (docs/design.md §11,
//! `crate::syncer::pod::token`). Refreshed as the kubelet refreshes projected tokens
//! (`pkg/kubelet/token/token_manager.go`, `requiresRefresh`): once 80% of the lifetime has
//! passed, and at the latest after 24 hours.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, Secret, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::reflector::ObjectRef;

use super::pod_owned;
use super::scope::{FIELD_MANAGER, Issued, Tenant, typed};
use crate::syncer::names::tenancy::TenantObject;
use crate::syncer::pod::TokenSecret;

/// Annotation on a token Secret: when its tokens are due for refresh (RFC 3339).
pub const REFRESH_AT: &str = "tenancy.x-k8s.io/token-refresh-at";
/// The kubelet refreshes a token at the latest after this long, whatever its lifetime.
const MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// Makes sure the token Secret `secret` of the tenant pod `pod` holds current tokens,
/// owned by the super pod `live` (so it goes with it). Returns how long until the next
/// refresh is due.
///
/// # Errors
/// The tenant's refusal of a TokenRequest (the service account does not exist yet: the
/// pod is retried), or the super cluster's of the Secret.
pub(super) async fn sync(
    tenant: &Tenant,
    pod: &TenantObject,
    secret: &TokenSecret,
    live: &Pod,
) -> Result<Option<Duration>, kube::Error> {
    let now = Timestamp::now();
    let owner = live.metadata.uid.clone().unwrap_or_default();
    let current = tenant
        .super_secrets
        .get(&ObjectRef::new(&secret.name).within(&tenant.namespace));
    // A Secret of an earlier super pod of this name (deleted, made again) is the garbage
    // collector's: this pod gets its own.
    let due = current
        .as_ref()
        .filter(|s| s.owner_references().iter().any(|o| o.uid == owner))
        .and_then(|s| s.annotations().get(REFRESH_AT))
        .and_then(|at| at.parse::<Timestamp>().ok())
        .or_else(|| issued_lately(tenant, &secret.name, &owner));
    if let Some(due) = due.filter(|due| *due > now) {
        return Ok(Some(pod_owned::until(now, due)));
    }
    let accounts = Api::<ServiceAccount>::namespaced(tenant.tenant_client.clone(), &pod.namespace);
    let mut data = BTreeMap::new();
    let mut refresh_at = now + SignedDuration::try_from(MAX_AGE).unwrap_or_default();
    for request in &secret.tokens {
        let body = TokenRequest {
            metadata: ObjectMeta::default(),
            spec: Some(TokenRequestSpec {
                audiences: request.audience.clone().map(|a| vec![a]),
                expiration_seconds: Some(request.expiration_seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".to_owned()),
                    kind: Some("Pod".to_owned()),
                    name: Some(pod.name.clone()),
                    uid: Some(pod.uid.clone()),
                }),
            }),
            status: None,
        };
        let issued: TokenRequest = accounts
            .create_subresource("token", &secret.service_account_name, &PostParams::default(), &body)
            .await?;
        let Some((token, expires)) = issued.status.and_then(|s| s.token.zip(s.expiration_timestamp)) else {
            continue;
        };
        // The lifetime the apiserver granted (it may cut or extend what was asked).
        let lifetime = expires.0.duration_since(now);
        refresh_at = refresh_at.min(now + lifetime.mul_f64(0.8));
        data.insert(request.key.clone(), ByteString(token.into_bytes()));
    }
    let copy = Secret {
        metadata: pod_owned::metadata(
            tenant,
            pod,
            live,
            &secret.name,
            [(REFRESH_AT.to_owned(), refresh_at.to_string())].into(),
        ),
        data: Some(data),
        type_: Some("Opaque".to_owned()),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(tenant.super_client.clone(), &tenant.namespace)
        .patch(
            &secret.name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(typed(&copy)),
        )
        .await?;
    tenant.tokens_issued.record(&secret.name, Issued { owner, refresh_at });
    Ok(Some(pod_owned::until(now, refresh_at)))
}

/// When the token Secret `name` of the super pod `owner` is due, if this worker wrote it
/// lately (`written_lately`): the pod's next passes (its status changing as it starts)
/// come before the cache shows the Secret, and would otherwise ask the tenant for tokens
/// again.
fn issued_lately(tenant: &Tenant, name: &str, owner: &str) -> Option<Timestamp> {
    let issued = tenant.tokens_issued.get(name)?;
    (issued.owner == owner).then_some(issued.refresh_at)
}
