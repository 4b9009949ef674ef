//! Which snapshots go after a verified upload (pure).
//!
//! Rules, in the order they protect data:
//! 1. retention runs only after a snapshot was uploaded *and verified*; the caller passes
//!    that snapshot's key, and it is never deleted;
//! 2. only complete snapshots (with a sidecar) count toward the retention count; the newest
//!    `retention` of them are kept;
//! 3. an incomplete snapshot (no sidecar: an upload that failed) older than the verified one
//!    is deleted, since it can never be restored; a newer one is left alone (another
//!    capn instance may be writing it);
//! 4. objects that are not snapshot keys under the prefix are never touched.
//!
//! So a failed upload deletes nothing: there is no verified key to call this with.

use super::naming::{SIDECAR_SUFFIX, sidecar_key, snapshot_time};

/// The keys to delete (snapshots and their sidecars), oldest first.
///
/// `keys` are every object key under the destination's prefix (as listed); `verified` the
/// snapshot just uploaded and verified; `retention` the number of complete snapshots to
/// keep (at least 1: the verified one).
pub fn keys_to_delete(keys: &[String], verified: &str, retention: usize) -> Vec<String> {
    let retention = retention.max(1);
    let Some(verified_time) = snapshot_time(verified) else {
        return Vec::new();
    };
    let present: std::collections::BTreeSet<&str> = keys.iter().map(String::as_str).collect();
    let mut snapshots: Vec<(&str, bool)> = keys
        .iter()
        .filter(|k| !k.ends_with(SIDECAR_SUFFIX) && snapshot_time(k).is_some())
        .map(|k| (k.as_str(), present.contains(sidecar_key(k).as_str()) || k == verified))
        .collect();
    // Newest first (keys sort by time).
    snapshots.sort_by(|a, b| b.0.cmp(a.0));
    let mut delete = Vec::new();
    let mut complete_kept = 0usize;
    for (key, complete) in snapshots {
        if key == verified {
            complete_kept += 1;
            continue;
        }
        let older = snapshot_time(key).is_some_and(|t| t < verified_time);
        if complete {
            if complete_kept < retention {
                complete_kept += 1;
            } else if older {
                delete.push(key.to_string());
            }
        } else if older {
            delete.push(key.to_string());
        }
    }
    delete.sort();
    let mut out = Vec::new();
    for key in delete {
        let sidecar = sidecar_key(&key);
        // The snapshot before its sidecar: were the deletion cut in between, a sidecar
        // without a snapshot is ignored, while a snapshot without a sidecar would be
        // mistaken for a failed upload (harmless too, but the order keeps the record honest).
        if present.contains(sidecar.as_str()) {
            out.push(key);
            out.push(sidecar);
        } else {
            out.push(key);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(day: u32) -> String {
        format!("p/etcd-snapshot-202612{day:02}T030000Z.db")
    }

    fn complete(days: &[u32]) -> Vec<String> {
        days.iter().flat_map(|d| [key(*d), sidecar_key(&key(*d))]).collect()
    }

    #[test]
    fn keeps_the_newest_complete_snapshots_and_deletes_older_ones_with_their_sidecars() {
        let keys = complete(&[1, 2, 3, 4, 5]);
        let delete = keys_to_delete(&keys, &key(5), 3);
        assert_eq!(delete, vec![key(1), sidecar_key(&key(1)), key(2), sidecar_key(&key(2))]);
    }

    #[test]
    fn a_failed_upload_counts_for_nothing_and_is_cleaned_when_older() {
        // Day 3's upload failed (no sidecar). With retention 2 after day 5 is verified,
        // days 5 and 4 are kept; 3 (incomplete), 2 and 1 go.
        let mut keys = complete(&[1, 2, 4]);
        keys.push(key(3));
        keys.push(key(5)); // verified, its sidecar not listed yet
        let delete = keys_to_delete(&keys, &key(5), 2);
        assert_eq!(
            delete,
            vec![key(1), sidecar_key(&key(1)), key(2), sidecar_key(&key(2)), key(3)]
        );
    }

    #[test]
    fn incomplete_snapshots_newer_than_the_verified_one_are_left_alone() {
        let mut keys = complete(&[1, 2]);
        keys.push(key(9));
        assert_eq!(keys_to_delete(&keys, &key(2), 1), vec![key(1), sidecar_key(&key(1))]);
    }

    #[test]
    fn retention_zero_still_keeps_the_verified_snapshot_and_others_are_untouched() {
        let mut keys = complete(&[1, 2]);
        keys.push("p/README".into());
        keys.push("p/other/etcd-backup.tar".into());
        let delete = keys_to_delete(&keys, &key(2), 0);
        assert_eq!(delete, vec![key(1), sidecar_key(&key(1))]);
    }

    #[test]
    fn no_verified_snapshot_means_nothing_is_deleted() {
        let keys = complete(&[1, 2, 3]);
        assert!(keys_to_delete(&keys, "p/not-a-snapshot", 1).is_empty());
    }
}
