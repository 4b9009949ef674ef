//! A pod's projected certificates, issued by the *tenant's* signers, into the Secret its
//! super pod mounts (docs/design.md §11, `crate::syncer::pod::certificate`): the kubelet's
//! part of KEP-4317 (`pkg/kubelet/podcertificate`), done in the tenant.
//!
//! For each source without a current certificate the controller generates a key (kept in
//! memory only, as the kubelet keeps it; a restart of capn asks again with a new key),
//! creates a PodCertificateRequest for the tenant pod on its tenant Node, and waits for
//! the tenant's signer: `Issued` puts key and chain into the Secret, with the request's
//! `beginRefreshAt` as the time to ask again (the old credentials stay mounted until the
//! new ones are issued); `Denied` or `Failed` is a Warning Event on the tenant pod and no
//! retry, as on the kubelet. The tenant's requests are watched from the first pod that
//! needs them ([`LazyWatch`]); their changes wake the pods that project certificates.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, Secret, ServiceAccount};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};

use super::lazy_watch::Watched;
use super::pod_owned;
use super::projection_state::{Pending, Written};
use super::scope::{FIELD_MANAGER, Tenant, typed};
use crate::syncer::names::tenancy::TenantObject;
use crate::syncer::pod::PodCertificates;
use crate::syncer::pod::certificate::{CertificateSource, clean_chain, new_key};

/// Annotation on a certificate Secret: when each source's certificate is due for refresh
/// (a JSON object of source key → RFC 3339 time, the requests' `beginRefreshAt`).
pub const REFRESH_AT: &str = "tenancy.x-k8s.io/certificate-refresh-at";
/// A request the watch does not show this long after it was made is taken as deleted and
/// made again (the kubelet's `assumeDeletedThreshold`).
const ASSUME_DELETED: Duration = Duration::from_secs(600);
/// How soon a pass that waits (for the super scheduler, a tenant Node, a signer) comes back
/// without being woken.
const WAIT: Duration = Duration::from_secs(10);

/// What a signer made of a request.
enum Outcome {
    Issued {
        chain: String,
        refresh_at: Option<Timestamp>,
    },
    /// `Denied` or `Failed`: the condition's type and the kubelet's Event message.
    Ended {
        kind: String,
        note: String,
    },
    Waiting,
}

/// Makes sure the certificate Secret `certificates` of the tenant pod `tenant_pod` holds a
/// current key and chain for every source, owned by the super pod `live` (so it goes with
/// it). Returns when the pass must come back at the latest (a refresh falls due, a request
/// or the pod's placement is awaited), `None` when only a change can move it on.
///
/// # Errors
/// The tenant's discovery, its refusal of a request or of the service-account read, or the
/// super cluster's refusal of the Secret.
pub(super) async fn sync(
    tenant: &Tenant,
    tenant_pod: &Pod,
    pod: &TenantObject,
    certificates: &PodCertificates,
    live: &Pod,
) -> Result<Option<Duration>, kube::Error> {
    // The request names the tenant Node the pod is bound to: wait for the super scheduler
    // and the Node.
    let node = live.spec.as_ref().and_then(|s| s.node_name.clone());
    let node_uid = node
        .as_deref()
        .and_then(|n| tenant.tenant_nodes.get(&ObjectRef::new(n)))
        .and_then(|n| n.metadata.uid.clone());
    let (Some(node), Some(node_uid)) = (node, node_uid) else {
        return Ok(Some(WAIT));
    };
    let state = &tenant.pod_certificates;
    state.forget_gone_pods(&tenant.tenant_pods);
    let (requests, resource) = match state.watch.watched(&tenant.tenant_client).await? {
        Watched::Listed { store, resource } => (store, resource),
        Watched::NotListed => return Ok(Some(WAIT)),
        // As on a kubelet whose cluster serves no requests: the volume never mounts.
        Watched::NotServed => return Ok(None),
    };
    let owner = live.metadata.uid.clone().unwrap_or_default();
    let (mut data, mut refresh) = match state.written_lately(&certificates.name, &owner) {
        Some(written) => (written.data, written.refresh),
        None => {
            let current = tenant
                .super_secrets
                .get(&ObjectRef::new(&certificates.name).within(&tenant.namespace))
                .filter(|s| s.owner_references().iter().any(|o| o.uid == owner));
            let data = current.as_ref().and_then(|s| s.data.clone()).unwrap_or_default();
            let refresh: BTreeMap<String, Timestamp> = current
                .as_ref()
                .and_then(|s| s.annotations().get(REFRESH_AT).cloned())
                .and_then(|at| serde_json::from_str(&at).ok())
                .unwrap_or_default();
            (data, refresh)
        }
    };
    let now = Timestamp::now();
    let mut next: Option<Duration> = None;
    let mut soonest = |after: Duration| next = Some(next.map_or(after, |n: Duration| n.min(after)));
    let mut changed = false;
    for source in &certificates.sources {
        let due = refresh
            .get(&source.key)
            .copied()
            .filter(|_| data.contains_key(&source.chain_key()));
        if let Some(due) = due.filter(|due| *due > now) {
            soonest(pod_owned::until(now, due));
            continue;
        }
        let id = (certificates.name.clone(), source.key.clone());
        let pending = state.pending().get(&id).cloned().filter(|p| p.owner == owner);
        let Some(pending) = pending else {
            let request = Request {
                pod,
                node: &node,
                node_uid: &node_uid,
                service_account: &certificates.service_account_name,
                source,
            };
            let (name, key_pem) = create_request(&tenant.tenant_client, &resource, &request).await?;
            state.pending().insert(
                id,
                Pending {
                    pod: pod.clone(),
                    request: name,
                    key_pem,
                    owner: owner.clone(),
                    made: Instant::now(),
                    ended: false,
                },
            );
            soonest(WAIT);
            continue;
        };
        if pending.ended {
            continue;
        }
        match outcome(&requests, &resource, &pod.namespace, &pending.request) {
            None if pending.made.elapsed() > ASSUME_DELETED => {
                state.pending().remove(&id);
                soonest(Duration::from_secs(1));
            }
            None | Some(Outcome::Waiting) => soonest(WAIT),
            Some(Outcome::Issued { chain, refresh_at }) => {
                let chain = clean_chain(&chain);
                let bundle = format!("{}{chain}", pending.key_pem);
                data.insert(
                    source.private_key_key(),
                    ByteString(pending.key_pem.clone().into_bytes()),
                );
                data.insert(source.chain_key(), ByteString(chain.into_bytes()));
                data.insert(source.bundle_key(), ByteString(bundle.into_bytes()));
                // A signer that names no refresh time: ask again in a day, the kubelet's
                // longest wait for anything.
                let refresh_at = refresh_at.unwrap_or_else(|| now + k8s_openapi::jiff::SignedDuration::from_hours(24));
                refresh.insert(source.key.clone(), refresh_at);
                soonest(pod_owned::until(now, refresh_at));
                state.pending().remove(&id);
                changed = true;
            }
            Some(Outcome::Ended { kind, note }) => {
                if let Some(p) = state.pending().get_mut(&id) {
                    p.ended = true;
                }
                tenant.event(tenant_pod, true, &kind, note).await;
            }
        }
    }
    if changed {
        write_secret(tenant, pod, certificates, live, data.clone(), &refresh).await?;
        let written = Written { owner, data, refresh };
        state.record(&certificates.name, written);
    }
    Ok(next)
}

/// What one request asks for.
struct Request<'a> {
    pod: &'a TenantObject,
    node: &'a str,
    node_uid: &'a str,
    service_account: &'a str,
    source: &'a CertificateSource,
}

/// Creates a PodCertificateRequest (the kubelet's `createPodCertificateRequest`: owned by the
/// tenant pod, for its service account and Node) with a new key's proof of possession.
/// Returns the request's name and the key's PEM.
async fn create_request(
    client: &Client,
    resource: &ApiResource,
    request: &Request<'_>,
) -> Result<(String, String), kube::Error> {
    let Request {
        pod,
        node,
        node_uid,
        service_account,
        source,
    } = request;
    let account = Api::<ServiceAccount>::namespaced(client.clone(), &pod.namespace)
        .get(service_account)
        .await?;
    // The key type was checked by admission; a failure here is the crypto library's.
    let (key_pem, proof) = new_key(&source.key_type).map_err(|e| kube::Error::Service(e.into()))?;
    let mut spec = serde_json::json!({
        "signerName": source.signer_name,
        "podName": pod.name,
        "podUID": pod.uid,
        "serviceAccountName": service_account,
        "serviceAccountUID": account.metadata.uid,
        "nodeName": node,
        "nodeUID": node_uid,
        "stubPKCS10Request": base64::Engine::encode(&base64::engine::general_purpose::STANDARD, proof),
    });
    if let Some(seconds) = source.max_expiration_seconds {
        spec["maxExpirationSeconds"] = seconds.into();
    }
    if !source.user_annotations.is_empty() {
        spec["unverifiedUserAnnotations"] = serde_json::json!(source.user_annotations);
    }
    let object: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": resource.api_version,
        "kind": resource.kind,
        "metadata": {
            "generateName": "req-",
            "namespace": pod.namespace,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid}],
        },
        "spec": spec,
    }))
    .map_err(kube::Error::SerdeError)?;
    let made = Api::<DynamicObject>::namespaced_with(client.clone(), &pod.namespace, resource)
        .create(&PostParams::default(), &object)
        .await?;
    Ok((made.name_any(), key_pem))
}

/// The signer's answer to the request `name` in `namespace`; `None` when the watch does
/// not show it.
fn outcome(requests: &Store<DynamicObject>, resource: &ApiResource, namespace: &str, name: &str) -> Option<Outcome> {
    let request = requests.get(&ObjectRef::new_with(name, resource.clone()).within(namespace))?;
    let status = &request.data["status"];
    for condition in status["conditions"].as_array().into_iter().flatten() {
        let kind = condition["type"].as_str().unwrap_or_default();
        let text = |field: &str| condition[field].as_str().unwrap_or_default().to_owned();
        match kind {
            "Issued" => {
                return Some(Outcome::Issued {
                    chain: status["certificateChain"].as_str().unwrap_or_default().to_owned(),
                    refresh_at: status["beginRefreshAt"].as_str().and_then(|t| t.parse().ok()),
                });
            }
            "Denied" | "Failed" => {
                let verb = if kind == "Denied" { "was denied" } else { "failed" };
                let note = format!(
                    "PodCertificateRequest {namespace}/{name} {verb}, reason={:?}, message={:?}",
                    text("reason"),
                    text("message")
                );
                return Some(Outcome::Ended {
                    kind: kind.to_owned(),
                    note,
                });
            }
            _ => {}
        }
    }
    Some(Outcome::Waiting)
}

/// Writes the certificate Secret with `data` and the refresh times.
async fn write_secret(
    tenant: &Tenant,
    pod: &TenantObject,
    certificates: &PodCertificates,
    live: &Pod,
    data: BTreeMap<String, ByteString>,
    refresh: &BTreeMap<String, Timestamp>,
) -> Result<(), kube::Error> {
    let annotations = [(
        REFRESH_AT.to_owned(),
        serde_json::to_string(refresh).unwrap_or_default(),
    )];
    let secret = Secret {
        metadata: pod_owned::metadata(tenant, pod, live, &certificates.name, annotations.into()),
        data: Some(data),
        type_: Some("Opaque".to_owned()),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(tenant.super_client.clone(), &tenant.namespace)
        .patch(
            &certificates.name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(typed(&secret)),
        )
        .await?;
    Ok(())
}
