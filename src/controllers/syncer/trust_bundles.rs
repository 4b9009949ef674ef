//! A pod's projected ClusterTrustBundles, from the *tenant's* bundles into the ConfigMap its
//! super pod mounts (docs/design.md §11, `crate::syncer::pod::trust_bundle`).
//!
//! The tenant's bundles are watched from the first pod that needs them ([`LazyWatch`]: v1
//! from Kubernetes 1.37, v1beta1 or v1alpha1 where an older release enables them; a tenant
//! that serves none has no bundles). A change of any bundle wakes the pods that project
//! bundles; their passes write a ConfigMap only when its content changes.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};
use tokio::sync::mpsc::UnboundedSender;

use super::lazy_watch::{LazyWatch, Watched};
use super::pod_owned;
use super::scope::{FIELD_MANAGER, Tenant, typed};
use crate::syncer::names::tenancy::TenantObject;
use crate::syncer::pod::trust_bundle::{Bundle, TrustBundles, resolve};

/// ClusterTrustBundles: their group, versions (the newest first, the kubelet's order) and
/// resource.
const GROUP: &str = "certificates.k8s.io";
const VERSIONS: &[&str] = &["v1", "v1beta1", "v1alpha1"];
const RESOURCE: &str = "clustertrustbundles";
/// How long a ConfigMap this worker just wrote vouches for itself before the cache shows it
/// (the token Secrets' rule, `tokens::CACHE_LAG`).
const CACHE_LAG: Duration = Duration::from_secs(30);

/// One tenant's ClusterTrustBundles, watched from the first pod that needs them, and the
/// ConfigMaps written lately.
pub(super) struct TrustBundleCache {
    watch: LazyWatch,
    /// name → (owner uid, digest of the data, when).
    written: std::sync::Mutex<HashMap<String, (String, u64, Instant)>>,
}

impl TrustBundleCache {
    /// A cache that watches nothing yet and reports changes to `changes`.
    pub fn new(changes: UnboundedSender<()>) -> Self {
        Self {
            watch: LazyWatch::new(GROUP, VERSIONS, RESOURCE, changes),
            written: Default::default(),
        }
    }

    /// The tenant's bundles (none when it serves none); `None` while the watch has not
    /// listed them yet.
    ///
    /// # Errors
    /// The tenant's discovery failed.
    async fn bundles(&self, client: &Client) -> Result<Option<Vec<Bundle>>, kube::Error> {
        Ok(match self.watch.watched(client).await? {
            Watched::NotServed => Some(Vec::new()),
            Watched::NotListed => None,
            Watched::Listed { store, .. } => Some(store.state().iter().map(|o| bundle(o)).collect()),
        })
    }

    /// Whether this worker wrote `name` with `digest` for `owner` less than [`CACHE_LAG`]
    /// ago.
    fn written_lately(&self, name: &str, owner: &str, digest: u64) -> bool {
        let mut written = self.written.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        written.retain(|_, (_, _, at)| at.elapsed() < CACHE_LAG);
        written.get(name).is_some_and(|(o, d, _)| o == owner && *d == digest)
    }

    fn record(&self, name: &str, owner: &str, digest: u64) {
        let mut written = self.written.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        written.insert(name.to_owned(), (owner.to_owned(), digest, Instant::now()));
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

/// Makes sure the trust bundle ConfigMap `bundles` of the tenant pod `pod` holds what the
/// tenant's ClusterTrustBundles resolve to, owned by the super pod `live` (so it goes with
/// it); a source that resolves to nothing is reported in a Warning Event `FailedMount` on
/// the tenant pod when the ConfigMap is written. Returns whether the pass must come back
/// (the bundles were not listed yet).
///
/// # Errors
/// The tenant's discovery, or the super cluster's refusal of the ConfigMap.
pub(super) async fn sync(
    tenant: &Tenant,
    tenant_pod: &Pod,
    pod: &TenantObject,
    bundles: &TrustBundles,
    live: &Pod,
) -> Result<bool, kube::Error> {
    let Some(all) = tenant.trust_bundles.bundles(&tenant.tenant_client).await? else {
        return Ok(true);
    };
    let resolved = resolve(&bundles.sources, &all);
    let owner = live.metadata.uid.clone().unwrap_or_default();
    let digest = digest(&resolved.data);
    let current = tenant
        .super_config_maps
        .get(&ObjectRef::new(&bundles.name).within(&tenant.namespace));
    let current = current
        .filter(|c| c.owner_references().iter().any(|o| o.uid == owner))
        .is_some_and(|c| c.data.clone().unwrap_or_default() == resolved.data);
    if current || tenant.trust_bundles.written_lately(&bundles.name, &owner, digest) {
        return Ok(false);
    }
    let config_map = ConfigMap {
        metadata: pod_owned::metadata(tenant, pod, live, &bundles.name, BTreeMap::new()),
        data: Some(resolved.data),
        ..ConfigMap::default()
    };
    Api::<ConfigMap>::namespaced(tenant.super_client.clone(), &tenant.namespace)
        .patch(
            &bundles.name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(typed(&config_map)),
        )
        .await?;
    tenant.trust_bundles.record(&bundles.name, &owner, digest);
    for (key, why) in &resolved.missing {
        let (volume, index) = key.rsplit_once('.').unwrap_or((key, "0"));
        let note = format!(
            "MountVolume.SetUp failed for volume {volume:?}: clusterTrustBundle source {index}: {why}; the pod waits for it"
        );
        tenant.event(tenant_pod, true, "FailedMount", note).await;
    }
    Ok(false)
}

fn digest(data: &BTreeMap<String, String>) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    data.hash(&mut hasher);
    hasher.finish()
}
