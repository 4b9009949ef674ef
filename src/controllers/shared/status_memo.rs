//! The status capn last wrote per object, so that a reconcile that reads its object from a
//! cache a moment behind capn's own status write does not write the same status again
//! (every request beyond the work is waste).
//!
//! A reconcile compares the status it computed with the status its (cached) object shows,
//! and writes when they differ. Right after a write the cache can still show the status the
//! write replaced; a reconcile woken then by something else (a StatefulSet, a sibling)
//! would compute the same status again, see a difference and write it again. The memo
//! remembers, per object, what the last write was computed *from* and what it wrote: when
//! the computed status equals the written one and the object still shows either the status
//! the write replaced or the write's own resourceVersion, the write is known to be on the
//! server and is skipped. Anything else (another writer, a new generation, a restart of
//! capn with an empty memo) writes as before.

use std::collections::HashMap;
use std::sync::Mutex;

use serde::Serialize;

/// What the memo keeps per object: hashes of the statuses, never the statuses themselves.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Written {
    uid: String,
    /// Hash of the status the object showed when capn computed the write.
    based_on: u64,
    /// Hash of the status written.
    written: u64,
    /// The object's resourceVersion the write returned.
    resource_version: String,
}

/// The last status write per object, process-wide, keyed by a hash of kind, namespace and
/// name (not the strings, to keep memory small). Two objects whose keys collide are told apart
/// by their uids. At most [`STATUS_MEMO_ENTRIES`] are kept (about 130 bytes each); a full
/// memo starts again empty, which only costs one repeated write per object.
#[derive(Default)]
pub struct StatusMemo(Mutex<HashMap<u64, Written>>);

/// How many objects [`StatusMemo`] remembers.
pub const STATUS_MEMO_ENTRIES: usize = 16_384;

/// The identity and current state of an object whose status capn writes.
#[derive(Debug)]
pub struct Observed<'a, S> {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    /// The status the object shows now.
    pub status: &'a S,
}

impl<'a, S> Observed<'a, S> {
    /// `object` of `kind` as read for this reconcile, showing `status`.
    pub fn of(kind: &'static str, object: &impl kube::ResourceExt, status: &'a S) -> Self {
        Self {
            kind,
            namespace: object.namespace().unwrap_or_default(),
            name: object.name_any(),
            uid: object.uid().unwrap_or_default(),
            resource_version: object.resource_version().unwrap_or_default(),
            status,
        }
    }

    /// The memo's key for this object.
    fn key(&self) -> u64 {
        crate::hash64(&(self.kind, &self.namespace, &self.name))
    }
}

/// Hash of `status` without its conditions' `lastTransitionTime`s: a reconcile over a cache
/// that does not show capn's last write yet sees no conditions, so it sets them again with
/// its own clock reading. The times the write carried are the true transitions; a status
/// that differs from it only in those times is the same status.
fn hash_of<S: Serialize>(status: &S) -> u64 {
    fn strip_transition_times(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(map) => {
                map.remove("lastTransitionTime");
                map.values_mut().for_each(strip_transition_times);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip_transition_times),
            _ => {}
        }
    }
    let mut value = serde_json::to_value(status).unwrap_or_default();
    strip_transition_times(&mut value);
    // serde_json writes maps sorted (no preserve_order feature), so equal statuses give
    // equal text.
    crate::hash64(&value.to_string())
}

impl StatusMemo {
    /// Whether writing `next` for `object` would only repeat capn's last write, which the
    /// object (read from a lagging cache) does not show yet.
    pub fn already_written<S: Serialize>(&self, object: &Observed<'_, S>, next: &S) -> bool {
        let Ok(map) = self.0.lock() else { return false };
        let Some(last) = map.get(&object.key()) else {
            return false;
        };
        last.uid == object.uid
            && last.written == hash_of(next)
            && (last.resource_version == object.resource_version || last.based_on == hash_of(object.status))
    }

    /// Records that `written` was written over `object`'s status, the server answering with
    /// `resource_version`.
    pub fn record<S: Serialize>(&self, object: &Observed<'_, S>, written: &S, resource_version: String) {
        let Ok(mut map) = self.0.lock() else { return };
        if map.len() >= STATUS_MEMO_ENTRIES {
            map.clear();
        }
        map.insert(
            object.key(),
            Written {
                uid: object.uid.clone(),
                based_on: hash_of(object.status),
                written: hash_of(written),
                resource_version,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observed<'a>(rv: &str, status: &'a Vec<&'a str>) -> Observed<'a, Vec<&'a str>> {
        Observed {
            kind: "NestedEtcd",
            namespace: "ns".into(),
            name: "c-etcd".into(),
            uid: "u1".into(),
            resource_version: rv.into(),
            status,
        }
    }

    #[test]
    fn a_repeat_over_a_lagging_cache_is_skipped() {
        let memo = StatusMemo::default();
        let before = vec!["Provisioning"];
        let next = vec!["Ready"];
        assert!(
            !memo.already_written(&observed("1", &before), &next),
            "nothing written yet"
        );
        memo.record(&observed("1", &before), &next, "2".into());
        // The cache still shows the old status (rv 1): the same write again is skipped.
        assert!(memo.already_written(&observed("1", &before), &next));
        // The cache caught up (rv 2 shows what was written): equal anyway, also skipped.
        assert!(memo.already_written(&observed("2", &next), &next));
    }

    #[test]
    fn a_repeat_that_only_moves_transition_times_is_skipped() {
        let memo = StatusMemo::default();
        let condition = |time: &str| serde_json::json!({"conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": time}]});
        let (before, written) = (serde_json::json!({}), condition("2026-12-02T22:58:59Z"));
        memo.record(&observed_json("1", &before), &written, "2".into());
        // Computed again a second later over the same lagging cache: the same conditions,
        // with new transition times.
        assert!(memo.already_written(&observed_json("1", &before), &condition("2026-12-02T22:59:00Z")));
        // A condition that changes is still written.
        let changed = serde_json::json!({"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-02T22:59:00Z"}]});
        assert!(!memo.already_written(&observed_json("1", &before), &changed));
    }

    fn observed_json<'a>(rv: &str, status: &'a serde_json::Value) -> Observed<'a, serde_json::Value> {
        Observed {
            kind: "NestedControlPlane",
            namespace: "ns".into(),
            name: "c".into(),
            uid: "u1".into(),
            resource_version: rv.into(),
            status,
        }
    }

    #[test]
    fn anything_else_is_written() {
        let memo = StatusMemo::default();
        let before = vec!["Provisioning"];
        let next = vec!["Ready"];
        memo.record(&observed("1", &before), &next, "2".into());
        // A different status to write.
        assert!(!memo.already_written(&observed("1", &before), &vec!["Failed"]));
        // Someone else changed the status after capn's write (rv 3, content unknown to capn).
        let other = vec!["Edited"];
        assert!(!memo.already_written(&observed("3", &other), &next));
        // A new object with the same name (another uid).
        let mut again = observed("1", &before);
        again.uid = "u2".into();
        assert!(!memo.already_written(&again, &next));
    }
}
