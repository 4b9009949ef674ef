//! `apply`: the only writer of rendered objects (docs/design.md §5). Server-side apply with field
//! manager `capn` (forced: capn owns what it renders), in a fixed order.

pub mod applyset;
mod readiness;
pub mod surge;

pub use readiness::{Readiness, readiness};

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::OnceCell;

use kube::{Client, ResourceExt};

use crate::api::InventoryEntry;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::discovery::{Scope, pinned_kind};

/// Field manager of every server-side apply capn sends.
pub const FIELD_MANAGER: &str = "capn";

/// The parameters of every server-side apply capn sends: manager [`FIELD_MANAGER`], forced
/// (capn owns what it renders), and `fieldValidation=Ignore`.
///
/// Why Ignore: the API server's default for apply (`Warn`) parses every apply body a second
/// time (`yaml.UnmarshalStrict`, apiserver `handlers/patch.go`) only to put unknown fields into
/// `Warning` headers, which kube's client drops. What is stored is the same either way
/// (unknown fields are pruned); the second parse was about 5% of the super cluster API
/// server's CPU while capn provisioned 100 control planes.
pub fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force().validation_ignore()
}

/// The parameters of capn's few non-apply patches (merge patches of a spec reference, a
/// replica count, an adoption label, an Event series): manager [`FIELD_MANAGER`].
///
/// Why: without a manager the API server records the fields under `"manager": "unknown"`
/// (apiserver `fieldmanager`), which hides from `kubectl get --show-managed-fields` who owns
/// them.
pub fn update_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    }
}

/// The parameters of every create capn sends (a component, a Secret that must not be
/// overwritten, an Event): manager [`FIELD_MANAGER`], for the reason given at
/// [`update_params`].
pub fn create_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PostParams::default()
    }
}

/// Errors while applying. All are transient (API trouble) unless the API server rejects
/// the object itself (`Invalid`), which points at a channel or patch defect.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("{kind}/{name}: the API server rejected it: {source}")]
    Rejected {
        kind: String,
        name: String,
        source: kube::Error,
    },
    #[error("{kind}/{name}: {source}")]
    Api {
        kind: String,
        name: String,
        source: kube::Error,
    },
    #[error("object has no apiVersion/kind/metadata.name")]
    Malformed,
    #[error("{api_version} {kind} is not served by the super cluster: {source}")]
    UnknownKind {
        api_version: String,
        kind: String,
        source: kube::Error,
    },
    #[error("{kind} is cluster-scoped; capn only applies namespaced objects")]
    ClusterScoped { kind: String },
}

impl ApplyError {
    /// Short stable reason for conditions, Events and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Rejected { .. } | Self::Malformed | Self::ClusterScoped { .. } => "ApplyRejected",
            Self::Api { .. } | Self::UnknownKind { .. } => "ApplyFailed",
        }
    }

    /// Whether retrying the same input can help.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Api { .. } | Self::UnknownKind { .. })
    }
}

/// Applies rendered objects; remembers which API resource serves each kind, and what it
/// applied last (the docs/design.md §5 short cut: a planned object equal to what was last applied,
/// with no drift seen on it, costs no request).
pub struct Applier {
    client: Client,
    /// Per (apiVersion, kind): the API resource discovery found, once it did. Reconciles
    /// that need a kind not resolved yet wait for the one discovery request in flight
    /// rather than each sending their own (at start, a wave of 100 control planes sent 50).
    /// A failed discovery leaves the cell empty: the next caller tries again.
    resources: Mutex<HashMap<(String, String), Discovered>>,
    applied: Mutex<HashMap<ObjectKey, Applied>>,
    /// Per applyset ID: the inventory as the last completed round left it (applied, then
    /// pruned). The inventory capn reads from its parent's status can be a moment behind
    /// capn's own status write; this closes that gap (see [`Self::known_inventory`]).
    inventories: Mutex<HashMap<String, Vec<InventoryEntry>>>,
}

/// The API resource of one kind: empty until discovery answers, shared by every caller
/// waiting for that answer.
type Discovered = Arc<OnceCell<ApiResource>>;

/// A hash of `(namespace, apiVersion, kind, name)` of an applied object ([`object_key`]):
/// eight bytes a key instead of four strings, for the eleven objects of each of a
/// thousand control planes. Two objects that share a key would also need
/// equal hashes of what was sent ([`Applied::hash`]) for one to be skipped wrongly.
type ObjectKey = u64;

/// What was last applied for one object: a hash of the object sent, and what the API
/// server returned that reveals a later change by someone else.
#[derive(Clone, Debug)]
struct Applied {
    hash: u64,
    generation: Option<i64>,
    resource_version: Option<String>,
    at: std::time::Instant,
}

/// What the caller knows about the live object, to judge drift without a request.
pub enum Live {
    /// The object as the watch cache holds it now (`None`: not in the cache).
    Cached(Option<serde_json::Value>),
    /// Nobody watches this kind.
    Unwatched,
}

/// Kinds whose readiness never depends on what the API server reports: when unchanged and
/// unwatched, they are re-applied only after [`UNWATCHED_REAPPLY`].
const STATIC_KINDS: &[&str] = &[
    "ConfigMap",
    "Secret",
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "PodDisruptionBudget",
    "NetworkPolicy",
];

/// How long an unchanged object of a kind nobody watches is trusted to be as applied:
/// after that it is applied again, which repairs any drift (once an hour, like the
/// certificate re-check).
pub const UNWATCHED_REAPPLY: std::time::Duration = std::time::Duration::from_secs(3600);

fn hash_of(object: &serde_json::Value) -> u64 {
    crate::hash64(&object.to_string())
}

fn object_key(namespace: &str, api_version: &str, kind: &str, name: &str) -> ObjectKey {
    crate::hash64(&(namespace, api_version, kind, name))
}

/// The key and the kind of a rendered object; `None` without an apiVersion, kind or name.
fn key_of(object: &serde_json::Value) -> Option<(ObjectKey, &str)> {
    let s = |p: &str| object.pointer(p).and_then(|v| v.as_str());
    let kind = s("/kind")?;
    let key = object_key(
        s("/metadata/namespace").unwrap_or_default(),
        s("/apiVersion")?,
        kind,
        s("/metadata/name")?,
    );
    Some((key, kind))
}

impl Applier {
    pub fn new(client: Client) -> Self {
        Self {
            client,
            resources: Mutex::default(),
            applied: Mutex::default(),
            inventories: Mutex::default(),
        }
    }

    /// What may exist of the applyset `applyset_id`: the inventory its parent's status
    /// shows (`from_status`) joined with what the last round this process completed left.
    /// The parent is read from a watch cache, which right after capn's own status write can
    /// still show the inventory before it; a round that trusted that alone would forget
    /// objects applied a moment ago and never prune them.
    ///
    /// Once the status shows what was recorded, the cache has caught up (it never goes
    /// back) and the record is dropped, so the memo holds only writes in flight, not an
    /// entry per applyset ever seen.
    pub fn known_inventory(&self, applyset_id: &str, from_status: &[InventoryEntry]) -> Vec<InventoryEntry> {
        let mut known = from_status.to_vec();
        let Ok(mut memo) = self.inventories.lock() else {
            return known;
        };
        if memo.get(applyset_id).is_some_and(|last| last.as_slice() == from_status) {
            memo.remove(applyset_id);
        } else if let Some(last) = memo.get(applyset_id) {
            for entry in last {
                if !known.contains(entry) {
                    known.push(entry.clone());
                }
            }
        }
        known
    }

    /// Records that the applyset `applyset_id` now holds exactly `entries` (every planned
    /// object applied, every stale one pruned), while its parent's status shows
    /// `from_status`. When the two are equal nothing is in flight and nothing is kept: the
    /// status the round writes next says the same, and a round that provisions nothing new
    /// (most of them) leaves no entry behind (1.7 MB of inventories at a thousand
    /// control planes, each kept until a later round happened to drop it).
    pub fn record_inventory(&self, applyset_id: &str, entries: &[InventoryEntry], from_status: &[InventoryEntry]) {
        if let Ok(mut m) = self.inventories.lock() {
            if entries == from_status {
                m.remove(applyset_id);
            } else {
                m.insert(applyset_id.to_string(), entries.to_vec());
            }
        }
    }

    /// Applies `object` unless it equals what was last applied and `live` shows no change
    /// since: a watched object whose `metadata.generation` (or, without one, its
    /// resourceVersion) is still what the last apply returned, or an unwatched object of a
    /// kind whose readiness needs no status, applied less than [`UNWATCHED_REAPPLY`] ago.
    /// Returns the object as the API server holds it (from the cache when nothing was sent).
    ///
    /// # Errors
    /// As [`Self::apply`].
    pub async fn apply_if_changed(
        &self,
        object: &serde_json::Value,
        live: Live,
    ) -> Result<serde_json::Value, ApplyError> {
        let (key, kind) = key_of(object).ok_or(ApplyError::Malformed)?;
        let hash = hash_of(object);
        let last = self.applied.lock().ok().and_then(|m| m.get(&key).cloned());
        if let Some(last) = last.filter(|l| l.hash == hash) {
            match live {
                Live::Cached(Some(live)) => {
                    let generation = live.pointer("/metadata/generation").and_then(|g| g.as_i64());
                    let unchanged = match generation {
                        Some(g) => Some(g) == last.generation,
                        None => {
                            live.pointer("/metadata/resourceVersion").and_then(|v| v.as_str())
                                == last.resource_version.as_deref()
                        }
                    };
                    if unchanged {
                        return Ok(live);
                    }
                }
                Live::Unwatched if STATIC_KINDS.contains(&kind) && last.at.elapsed() < UNWATCHED_REAPPLY => {
                    return Ok(object.clone());
                }
                _ => {}
            }
        }
        let applied = self.apply(object).await?;
        let record = Applied {
            hash,
            generation: applied.pointer("/metadata/generation").and_then(|g| g.as_i64()),
            resource_version: applied
                .pointer("/metadata/resourceVersion")
                .and_then(|v| v.as_str())
                .map(str::to_string),
            at: std::time::Instant::now(),
        };
        if let Ok(mut m) = self.applied.lock() {
            m.insert(key, record);
        }
        Ok(applied)
    }

    /// Forgets what was applied for `entries` in `namespace` (pruned objects).
    pub fn forget(&self, namespace: &str, entries: &[InventoryEntry]) {
        if let Ok(mut m) = self.applied.lock() {
            for e in entries {
                m.remove(&object_key(namespace, &e.api_version, &e.kind, &e.name));
            }
        }
    }

    /// The client this applier writes with.
    pub fn client(&self) -> &Client {
        &self.client
    }

    async fn resource(&self, api_version: &str, kind: &str) -> Result<ApiResource, ApplyError> {
        let cell = self
            .resources
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry((api_version.to_string(), kind.to_string()))
            .or_default()
            .clone();
        cell.get_or_try_init(|| self.discover(api_version, kind)).await.cloned()
    }

    /// Asks the API server which resource serves `kind` of `api_version` (one GET of the
    /// group version's resource list).
    async fn discover(&self, api_version: &str, kind: &str) -> Result<ApiResource, ApplyError> {
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version),
        };
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (ar, caps) = pinned_kind(&self.client, &gvk)
            .await
            .map_err(|source| ApplyError::UnknownKind {
                api_version: api_version.into(),
                kind: kind.into(),
                source,
            })?;
        if caps.scope != Scope::Namespaced {
            return Err(ApplyError::ClusterScoped { kind: kind.into() });
        }
        Ok(ar)
    }

    /// Server-side applies `object` (force, manager `capn`) and returns what the API server
    /// stored, status included.
    ///
    /// # Errors
    /// [`ApplyError`]: `Rejected` for 4xx validation failures, `Api` for the rest.
    pub async fn apply(&self, object: &serde_json::Value) -> Result<serde_json::Value, ApplyError> {
        let s = |p: &str| object.pointer(p).and_then(|v| v.as_str());
        let (Some(api_version), Some(kind), Some(name)) = (s("/apiVersion"), s("/kind"), s("/metadata/name")) else {
            return Err(ApplyError::Malformed);
        };
        let namespace = s("/metadata/namespace").unwrap_or("default");
        let ar = self.resource(api_version, kind).await?;
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), namespace, &ar);
        let params = apply_params();
        let applied = api
            .patch(name, &params, &Patch::Apply(object))
            .await
            .map_err(|source| {
                let rejected = matches!(&source, kube::Error::Api(s) if s.code == 422 || s.code == 400);
                let (kind, name) = (kind.to_string(), name.to_string());
                if rejected {
                    ApplyError::Rejected { kind, name, source }
                } else {
                    ApplyError::Api { kind, name, source }
                }
            })?;
        serde_json::to_value(applied).map_err(|_| ApplyError::Malformed)
    }
}

impl Applier {
    /// Deletes the objects of `stale` (applied before, no longer planned) that still carry
    /// this set's part-of label; anything else (a user's object of the same name, an object
    /// another tool took over) is left alone. Objects already gone are skipped.
    ///
    /// # Errors
    /// API errors other than NotFound.
    pub async fn prune(&self, namespace: &str, stale: &[InventoryEntry], applyset_id: &str) -> Result<(), ApplyError> {
        self.forget(namespace, stale);
        for entry in stale {
            let ar = match self.resource(&entry.api_version, &entry.kind).await {
                Ok(ar) => ar,
                // The kind is no longer served: nothing of it can remain.
                Err(ApplyError::UnknownKind { .. }) => continue,
                Err(e) => return Err(e),
            };
            let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), namespace, &ar);
            let api_error = |source| ApplyError::Api {
                kind: entry.kind.clone(),
                name: entry.name.clone(),
                source,
            };
            let Some(object) = api.get_opt(&entry.name).await.map_err(api_error)? else {
                continue;
            };
            if object.labels().get(applyset::PART_OF_LABEL).map(String::as_str) != Some(applyset_id) {
                continue;
            }
            tracing::info!(kind = %entry.kind, name = %entry.name, namespace, "pruning object no longer rendered");
            match api.delete(&entry.name, &Default::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(api_error(e)),
            }
        }
        Ok(())
    }
}

/// Order of application: Services before workloads (pods need their names to resolve
/// and the apiserver certificate needs the Service's ClusterIP), everything else between.
pub fn apply_rank(object: &serde_json::Value) -> u8 {
    match object.get("kind").and_then(|k| k.as_str()) {
        Some("Service") => 0,
        Some("StatefulSet" | "Deployment" | "DaemonSet" | "Job") => 2,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(kind: &str, name: &str) -> InventoryEntry {
        InventoryEntry {
            api_version: "v1".into(),
            kind: kind.into(),
            name: name.into(),
        }
    }

    #[test]
    fn every_apply_is_forced_as_capn_without_field_validation_warnings() {
        let params = apply_params();
        assert_eq!(params.field_manager.as_deref(), Some("capn"));
        assert!(params.force);
        assert!(matches!(
            params.field_validation,
            Some(kube::api::ValidationDirective::Ignore)
        ));
    }

    #[tokio::test]
    async fn an_inventory_the_cache_does_not_show_yet_is_still_known() {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let applier = Applier::new(Client::try_from(config).unwrap());
        let (service, extra) = (entry("Service", "c-etcd"), entry("ConfigMap", "c-etcd-extra"));
        let only_service = [service.clone()];
        assert_eq!(applier.known_inventory("set", &only_service), only_service);
        // A round applied the ConfigMap, but the parent read next still shows the status
        // from before that round's write.
        let both = [service, extra];
        applier.record_inventory("set", &both, &only_service);
        assert_eq!(applier.known_inventory("set", &only_service), both);
        assert_eq!(applier.known_inventory("other-set", &[]), vec![]);
        // The cache caught up: the record is dropped, the status alone is known.
        assert_eq!(applier.known_inventory("set", &both), both);
        assert!(applier.inventories.lock().unwrap().is_empty());
        // Once the ConfigMap is pruned the set no longer holds it.
        applier.record_inventory("set", &only_service, &both);
        assert_eq!(applier.known_inventory("set", &only_service), only_service);
        // A round that applies what the status already shows keeps nothing.
        applier.record_inventory("set", &both, &both);
        assert!(applier.inventories.lock().unwrap().is_empty());
        applier.record_inventory("set", &both, &only_service);
        applier.record_inventory("set", &only_service, &only_service);
        assert!(applier.inventories.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn forgetting_a_pruned_entry_drops_what_its_object_was_applied_as() {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let applier = Applier::new(Client::try_from(config).unwrap());
        let object = serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "c-etcd-extra", "namespace": "t"},
        });
        let (key, kind) = key_of(&object).unwrap();
        assert_eq!(kind, "ConfigMap");
        let applied = Applied {
            hash: hash_of(&object),
            generation: None,
            resource_version: Some("1".into()),
            at: std::time::Instant::now(),
        };
        applier.applied.lock().unwrap().insert(key, applied);
        // Another name, kind or namespace is another object.
        applier.forget("t", &[entry("ConfigMap", "c-etcd"), entry("Secret", "c-etcd-extra")]);
        applier.forget("u", &[entry("ConfigMap", "c-etcd-extra")]);
        assert_eq!(applier.applied.lock().unwrap().len(), 1);
        applier.forget("t", &[entry("ConfigMap", "c-etcd-extra")]);
        assert!(applier.applied.lock().unwrap().is_empty());
    }
}
