//! What this worker wrote a moment ago, before its watch cache shows it.
//!
//! A watch cache lags the writes it reflects: a pass that runs between a write and its watch
//! event (the tenant pod changing as it starts, another pod of the namespace) would find
//! nothing and write again, so request counts would depend on timing. A writer records what
//! it wrote here; a pass that misses the object in its cache uses the record instead, for at
//! most [`CACHE_LAG`] (after that the object counts as gone and is written again). This is
//! the "expectations" of upstream's ReplicaSet controller (`pkg/controller/controller_utils.go`),
//! keyed by object name.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// How long a write vouches for an object its watch cache does not show yet.
pub(super) const CACHE_LAG: Duration = Duration::from_secs(30);

/// Objects written lately, by name, each with what the writer needs to know of it (`V`).
pub(super) struct WrittenLately<V> {
    entries: Mutex<HashMap<String, (V, Instant)>>,
}

impl<V> Default for WrittenLately<V> {
    fn default() -> Self {
        Self {
            entries: Mutex::default(),
        }
    }
}

impl<V: Clone> WrittenLately<V> {
    /// Records that `name` was written just now as `value` (replacing an earlier record).
    pub fn record(&self, name: &str, value: V) {
        self.entries().insert(name.to_owned(), (value, Instant::now()));
    }

    /// What was recorded for `name` less than [`CACHE_LAG`] ago.
    pub fn get(&self, name: &str) -> Option<V> {
        let mut entries = self.entries();
        entries.retain(|_, (_, at)| at.elapsed() < CACHE_LAG);
        entries.get(name).map(|(value, _)| value.clone())
    }

    /// Drops the record of `name` (the cache shows it now, or the write is undone).
    pub fn forget(&self, name: &str) {
        self.entries().remove(name);
    }

    fn entries(&self) -> MutexGuard<'_, HashMap<String, (V, Instant)>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_found_replaced_and_forgotten_by_name() {
        let written = WrittenLately::default();
        assert_eq!(written.get("a"), None);
        written.record("a", 1);
        written.record("b", 2);
        assert_eq!(written.get("a"), Some(1));
        written.record("a", 3);
        assert_eq!(written.get("a"), Some(3));
        written.forget("a");
        assert_eq!((written.get("a"), written.get("b")), (None, Some(2)));
    }

    #[test]
    fn a_record_older_than_the_cache_lag_is_gone() {
        let written = WrittenLately::default();
        written.record("a", 1);
        // Aged by hand: the clock is not waited on.
        if let Some((_, at)) = written.entries().get_mut("a") {
            *at = Instant::now().checked_sub(CACHE_LAG).expect("an instant that long ago");
        }
        assert_eq!(written.get("a"), None);
    }
}
