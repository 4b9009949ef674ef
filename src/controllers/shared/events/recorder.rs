//! capn's Event recorder: `events.k8s.io/v1` Events, a repeat patched as a series.
//!
//! It does what kube-runtime's `Recorder` does (and client-go's `tools/events`): the first
//! Event of its kind is created, and a repeat within [`SERIES_WINDOW`] (same type, reason,
//! action, reporting controller, object and related object) is patched as a series,
//! `series.count` and `series.lastObservedTime`, instead of created again. It is capn's own
//! for two reasons, both measured:
//! - kube-runtime 5's key compares the whole `ObjectReference`, `resourceVersion`
//!   included, so a repeat about an object that changed in between (as a reconciled object
//!   always has) never matched and was created anew (kube-rs/kube#1655's review saw the
//!   same);
//! - it keeps every Event it sent, whole, for six minutes in one `HashMap` (its entries
//!   inline, about 1.3 KiB each before their strings), and scans them all at every
//!   publish: 12.5 MB at the end of a thousand control planes' provisioning. This one keeps
//!   a 64-bit digest of the key, the Event's name and the series count per Event (about
//!   80 bytes), and forgets expired ones once a minute.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch};

use crate::apply::{create_params, update_params};
use serde_json::json;

/// How long after its last occurrence an Event can be repeated as a series: six minutes,
/// kube-runtime's `CACHE_TTL`, well inside the API server's one-hour `--event-ttl`.
pub const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);

/// How often expired series are forgotten (at a publish; nothing runs in between).
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// One Event to publish, as its caller says it.
#[derive(Clone, Debug)]
pub struct Occurrence<'a> {
    /// `Warning` when something failed, otherwise `Normal`.
    pub warning: bool,
    /// `reason`: UpperCamelCase, why the action was taken (`AddedLearner`).
    pub reason: &'a str,
    /// `action`: what was done (`MemberAdd`, `Reconcile`).
    pub action: &'a str,
    /// `note`: for a person. A series keeps its first Event's note.
    pub note: String,
    /// `regarding`: the object the Event is about.
    pub regarding: ObjectReference,
    /// `related`: a second object involved, if any.
    pub related: Option<ObjectReference>,
}

/// An Event capn created, as remembered for its series (in the regarding object's
/// namespace, which is part of the key).
#[derive(Debug, Clone, PartialEq)]
struct Sent {
    name: String,
    /// Occurrences so far: 1 after the create.
    count: i32,
    last: Instant,
}

impl Sent {
    /// Whether a repeat at `now` still belongs to its series.
    fn live(&self, now: Instant) -> bool {
        now.duration_since(self.last) < SERIES_WINDOW
    }
}

/// What [`Recorder::publish`] sends: a new Event, or the next count of an existing series.
#[derive(Debug, PartialEq)]
enum Write {
    Create,
    Series { name: String, count: i32 },
}

/// The Events sent within the last [`SERIES_WINDOW`], by key digest ([`key`]).
#[derive(Debug, Default)]
struct Memory {
    sent: HashMap<u64, Sent>,
    pruned: Option<Instant>,
}

impl Memory {
    /// The write for an occurrence with `key` at `now`. A series' count is taken at once,
    /// so that concurrent repeats count apart. Forgets expired series once every
    /// [`PRUNE_EVERY`].
    fn decide(&mut self, key: u64, now: Instant) -> Write {
        if self.pruned.is_none_or(|at| now.duration_since(at) >= PRUNE_EVERY) {
            self.sent.retain(|_, sent| sent.live(now));
            self.pruned = Some(now);
        }
        match self.sent.get_mut(&key) {
            Some(sent) if sent.live(now) => {
                sent.count += 1;
                sent.last = now;
                Write::Series {
                    name: sent.name.clone(),
                    count: sent.count,
                }
            }
            _ => Write::Create,
        }
    }
}

/// Publishes Events as reporting controller `controller` (instance `instance`, the pod's
/// name, or the controller's when unset), folding repeats into series.
pub struct Recorder {
    client: Client,
    controller: String,
    instance: String,
    memory: Mutex<Memory>,
}

impl Recorder {
    /// A recorder writing through `client`.
    pub fn new(client: Client, controller: &str, instance: Option<String>) -> Self {
        Self {
            client,
            instance: instance.unwrap_or_else(|| controller.to_string()),
            controller: controller.to_string(),
            memory: Mutex::default(),
        }
    }

    /// Creates the Event, or patches its series when it repeats one sent within
    /// [`SERIES_WINDOW`]. A series whose Event is gone (deleted, or expired on the server)
    /// starts over with a create. The Event goes to the regarding object's namespace
    /// (`default` for a cluster-scoped one).
    ///
    /// # Errors
    /// The API server's refusal of the create or patch.
    pub async fn publish(&self, occurrence: &Occurrence<'_>) -> Result<(), kube::Error> {
        let key = key(&self.controller, occurrence);
        let now = Instant::now();
        let namespace = occurrence.regarding.namespace.as_deref().unwrap_or("default");
        let events: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        let write = self.memory().map_or(Write::Create, |mut m| m.decide(key, now));
        if let Write::Series { name, count } = write {
            let series = EventSeries {
                count,
                last_observed_time: MicroTime(Timestamp::now()),
            };
            match events
                .patch(&name, &update_params(), &Patch::Merge(json!({ "series": series })))
                .await
            {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let event = self.event(occurrence, namespace);
        let name = event.metadata.name.clone().unwrap_or_default();
        events.create(&create_params(), &event).await?;
        if let Some(mut memory) = self.memory() {
            memory.sent.insert(
                key,
                Sent {
                    name,
                    count: 1,
                    last: now,
                },
            );
        }
        Ok(())
    }

    /// The memory, unless a panic poisoned it (then Events are created, never folded).
    fn memory(&self) -> Option<std::sync::MutexGuard<'_, Memory>> {
        self.memory.lock().ok()
    }

    /// The new Event: named `<regarding name>.<nanoseconds, hex>`, as client-go and
    /// kube-runtime name them.
    fn event(&self, o: &Occurrence<'_>, namespace: &str) -> Event {
        let now = Timestamp::now();
        let name = o.regarding.name.as_deref().unwrap_or(&self.controller);
        Event {
            metadata: ObjectMeta {
                namespace: Some(namespace.to_string()),
                name: Some(format!("{name}.{:x}", now.as_nanosecond())),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some(if o.warning { "Warning" } else { "Normal" }.into()),
            reason: Some(o.reason.to_string()),
            action: Some(o.action.to_string()),
            note: Some(o.note.clone()),
            regarding: Some(o.regarding.clone()),
            related: o.related.clone(),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..Event::default()
        }
    }
}

/// The series key's digest: type, reason, action and controller, and the regarding and
/// related objects by apiVersion, kind, namespace, name and uid, as client-go's correlator
/// keys them (`tools/record/events_cache.go`, `getEventKey`), never by `resourceVersion`.
/// The note is not in it (as in kube-runtime and client-go's `tools/events`): a series
/// keeps its first note. 64 bits: two keys of a thousand control planes' Events meet with
/// a chance of about 10⁻¹².
fn key(controller: &str, o: &Occurrence<'_>) -> u64 {
    let mut h = DefaultHasher::new();
    (o.warning, o.reason, o.action, controller).hash(&mut h);
    hash_object(Some(&o.regarding), &mut h);
    hash_object(o.related.as_ref(), &mut h);
    h.finish()
}

/// An object's part of a [`key`]: its apiVersion, kind, namespace, name and uid.
fn hash_object(r: Option<&ObjectReference>, h: &mut DefaultHasher) {
    r.map(|r| (&r.api_version, &r.kind, &r.namespace, &r.name, &r.uid))
        .hash(h);
}

#[cfg(test)]
mod tests;
