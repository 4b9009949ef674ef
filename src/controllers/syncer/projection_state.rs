//! What the passes that fill a pod's projected sources keep per tenant (docs/design.md
//! §11): the lazily watched ClusterTrustBundles and PodCertificateRequests of the tenant, the
//! requests in flight and what was written lately. [`super::scope::Tenant`] holds them;
//! `trust_bundles` and `pod_certificates` act on them.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::DynamicObject;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use tokio::sync::mpsc::UnboundedSender;

use super::lazy_watch::{LazyWatch, Watched};
use super::written_lately::WrittenLately;
use crate::syncer::names::tenancy::TenantObject;
use crate::syncer::pod::trust_bundle::Bundle;

/// The group of ClusterTrustBundles and PodCertificateRequests, its versions (the newest
/// first, the kubelet's order), and the two resources.
const GROUP: &str = "certificates.k8s.io";
const VERSIONS: &[&str] = &["v1", "v1beta1", "v1alpha1"];
const BUNDLES: &str = "clustertrustbundles";
const REQUESTS: &str = "podcertificaterequests";

/// One tenant's ClusterTrustBundles, watched from the first pod that needs them, and the
/// ConfigMaps written lately.
pub(super) struct TrustBundleCache {
    watch: LazyWatch,
    /// name → (owner uid, digest of the data).
    written: WrittenLately<(String, u64)>,
}

impl TrustBundleCache {
    /// A cache that watches nothing yet and reports changes to `changes`.
    pub fn new(changes: UnboundedSender<()>) -> Self {
        Self {
            watch: LazyWatch::new(GROUP, VERSIONS, BUNDLES, changes),
            written: Default::default(),
        }
    }

    /// The tenant's bundles (none when it serves none); `None` while the watch has not
    /// listed them yet.
    ///
    /// # Errors
    /// The tenant's discovery failed.
    pub async fn bundles(&self, client: &Client) -> Result<Option<Vec<Bundle>>, kube::Error> {
        Ok(match self.watch.watched(client).await? {
            Watched::NotServed => Some(Vec::new()),
            Watched::NotListed => None,
            Watched::Listed { store, .. } => Some(store.state().iter().map(|o| bundle(o)).collect()),
        })
    }

    /// Whether this worker wrote `name` with `digest` for `owner` lately
    /// (`written_lately`).
    pub fn written_lately(&self, name: &str, owner: &str, digest: u64) -> bool {
        self.written.get(name).is_some_and(|(o, d)| o == owner && d == digest)
    }

    pub fn record(&self, name: &str, owner: &str, digest: u64) {
        self.written.record(name, (owner.to_owned(), digest));
    }
}

/// The fields resolution reads of a ClusterTrustBundle of any version.
fn bundle(object: &DynamicObject) -> Bundle {
    let spec = &object.data["spec"];
    let text = |field: &str| spec[field].as_str().unwrap_or_default().to_owned();
    Bundle {
        name: object.name_any(),
        signer_name: text("signerName"),
        labels: object.labels().clone(),
        trust_bundle: text("trustBundle"),
    }
}

/// One tenant's PodCertificateRequests, watched from the first pod that needs them, and
/// the requests in flight.
pub(super) struct PodCertificateState {
    pub watch: LazyWatch,
    /// By (Secret name, source key).
    pending: std::sync::Mutex<HashMap<(String, String), Pending>>,
    /// The Secrets written lately, by name: what the next passes start from until the cache
    /// shows them (else they would find no certificate and ask again).
    written: WrittenLately<Written>,
}

/// A Secret this worker wrote: for the super pod `owner`, its data and refresh times.
#[derive(Clone)]
pub(super) struct Written {
    pub owner: String,
    pub data: BTreeMap<String, ByteString>,
    pub refresh: BTreeMap<String, Timestamp>,
}

/// A request in flight: the tenant pod, the request's name, the key it is for (PEM, in
/// memory only), the super pod it is for, when it was made, and whether the signer ended it
/// without a certificate.
#[derive(Clone)]
pub(super) struct Pending {
    /// The tenant pod's namespace, name and uid: an entry goes once that pod is gone.
    pub pod: TenantObject,
    pub request: String,
    pub key_pem: String,
    pub owner: String,
    pub made: Instant,
    pub ended: bool,
}

impl PodCertificateState {
    /// A state that watches nothing yet and reports changes of requests to `changes`.
    pub fn new(changes: UnboundedSender<()>) -> Self {
        Self {
            watch: LazyWatch::new(GROUP, VERSIONS, REQUESTS, changes),
            pending: Default::default(),
            written: Default::default(),
        }
    }

    /// The Secret `name` as this worker wrote it for `owner` lately (`written_lately`).
    pub fn written_lately(&self, name: &str, owner: &str) -> Option<Written> {
        self.written.get(name).filter(|w| w.owner == owner)
    }

    pub fn record(&self, name: &str, written: Written) {
        self.written.record(name, written);
    }

    /// Drops the requests of tenant pods that are gone (or made again under a new uid).
    pub fn forget_gone_pods(&self, pods: &Store<Pod>) {
        self.pending().retain(|_, p| {
            pods.get(&ObjectRef::new(&p.pod.name).within(&p.pod.namespace))
                .is_some_and(|live| live.metadata.uid.as_deref() == Some(p.pod.uid.as_str()))
        });
    }

    pub fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Pending>> {
        self.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
