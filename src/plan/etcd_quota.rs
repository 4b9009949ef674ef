//! etcd's backend quota (`--quota-backend-bytes`): the size of its database at which etcd
//! raises the `NOSPACE` alarm and accepts only reads and deletes
//! (<https://etcd.io/docs/v3.6/op-guide/maintenance/#space-quota>).
//!
//! A NestedEtcd sets it with `spec.storage.quotaBackendBytes`; without it capn sizes it
//! from the members' volume ([`default_quota_backend_bytes`]), under a ceiling that the
//! component's size may set (etcd's own 2 GiB default otherwise), because a quota the volume
//! cannot hold is worse than none: etcd then fills its disk before the alarm, and a member
//! that cannot write its WAL stops, where one past its quota still serves reads and lets
//! the data be deleted.
//!
//! Pure: the controllers (status, the `NOSPACE` handling) and `capn render` compute the same
//! quota from the same spec.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::api::EtcdStorage;
pub use crate::quantity::quantity_bytes;
use crate::validate::FieldError;

/// etcd's own default quota, 2 GiB (`DefaultQuotaBytes`, go.etcd.io/etcd/server/v3
/// storage/quota.go), which capn keeps on every volume large enough for it.
pub const ETCD_DEFAULT_QUOTA_BYTES: u64 = 2 * 1024 * 1024 * 1024;

/// etcd's suggested maximum quota, 8 GiB (`MaxQuotaBytes` in storage/quota.go; etcd warns
/// at start above it). capn's default never exceeds [`ETCD_DEFAULT_QUOTA_BYTES`]; a spec
/// may set more, up to the volume.
pub const ETCD_MAX_QUOTA_BYTES: u64 = 8 * 1024 * 1024 * 1024;

/// Room on the volume for etcd's write-ahead log, in bytes: six WAL segments of 64 MB
/// (`wal.SegmentSizeBytes`), the five `--max-wals` etcd keeps plus the one it preallocates.
pub const WAL_RESERVE_BYTES: u64 = 6 * 64 * 1000 * 1000;

/// The quota capn gives a member whose volume holds `volume_bytes`, in bytes:
/// `min(ceiling, max(volume / 4, (volume − WAL reserve) / 2))`, the ceiling being
/// [`ETCD_DEFAULT_QUOTA_BYTES`] unless the component's size sets another.
///
/// Why half of what the WAL leaves: at times a member holds two copies of its database
/// on the same volume — a defragmentation writes the compacted copy beside the old file
/// before it replaces it, and a follower that receives a snapshot from its leader keeps
/// its own database until the new one is complete. Both copies stay within the quota, so
/// twice the quota plus the WAL must fit. On volumes too small for the WAL reserve to
/// matter (under 2 × [`WAL_RESERVE_BYTES`]) a quarter of the volume is kept instead, which
/// is continuous with the rule above at that size. Never above etcd's own default of 2 GiB
/// ([`ETCD_DEFAULT_QUOTA_BYTES`]), which a volume of about 4.4 GiB or more gets: a larger
/// database costs memory (etcd maps it) and slower snapshots, and is a choice to make in
/// the spec or in a size. The default 1 GiB volume gets 345 MB (329 MiB).
pub fn default_quota_backend_bytes(volume_bytes: u64, ceiling: u64) -> u64 {
    let by_copies = volume_bytes.saturating_sub(WAL_RESERVE_BYTES) / 2;
    by_copies.max(volume_bytes / 4).min(ceiling)
}

/// The `--quota-backend-bytes` a NestedEtcd's members run with, in bytes: the spec's
/// `storage.quotaBackendBytes`, else [`default_quota_backend_bytes`] of the volume
/// (`storage.size`, default `default_size`) under `ceiling` (the size's; `None`: etcd's
/// default of 2 GiB), else, on ephemeral storage (an `emptyDir` has no size to go by), the
/// ceiling itself.
///
/// # Errors
/// A [`FieldError`] on `spec.storage.quotaBackendBytes` (or `spec.storage.size`) that is
/// not a positive quantity, or a quota larger than the volume: etcd would fill its disk
/// before it raises the alarm.
pub fn quota_backend_bytes(
    storage: Option<&EtcdStorage>,
    default_size: &str,
    ceiling: Option<u64>,
    resource_name: &str,
) -> Result<u64, FieldError> {
    let ceiling = ceiling.unwrap_or(ETCD_DEFAULT_QUOTA_BYTES);
    let field_error = |path: &str, value: &str, message: &'static str, reason: &'static str| FieldError {
        kind: "NestedEtcd",
        name: resource_name.to_string(),
        path: path.to_string(),
        value: serde_json::Value::from(value).to_string(),
        message,
        reason,
    };
    let ephemeral = storage.is_some_and(|s| s.ephemeral);
    let size_text = storage
        .and_then(|s| s.size.as_ref())
        .map_or(default_size, |q| q.0.as_str());
    let volume = if ephemeral {
        None
    } else {
        Some(quantity_bytes(size_text).filter(|b| *b > 0).ok_or_else(|| {
            field_error(
                "spec.storage.size",
                size_text,
                "must be a positive quantity, like 1Gi or 500Mi",
                "InvalidStorage",
            )
        })?)
    };
    let Some(Quantity(quota_text)) = storage.and_then(|s| s.quota_backend_bytes.as_ref()) else {
        return Ok(volume.map_or(ceiling, |v| default_quota_backend_bytes(v, ceiling)));
    };
    let quota = quantity_bytes(quota_text).filter(|b| *b > 0).ok_or_else(|| {
        field_error(
            "spec.storage.quotaBackendBytes",
            quota_text,
            "must be a positive quantity, like 1Gi or 500Mi",
            "InvalidStorage",
        )
    })?;
    if volume.is_some_and(|v| quota > v) {
        return Err(field_error(
            "spec.storage.quotaBackendBytes",
            quota_text,
            QUOTA_ABOVE_VOLUME_MESSAGE,
            "InvalidEtcdQuota",
        ));
    }
    Ok(quota)
}

/// Why a quota above the volume is refused, and what is allowed.
pub const QUOTA_ABOVE_VOLUME_MESSAGE: &str = "must not exceed spec.storage.size: etcd would fill its volume before reaching its quota and stop instead of raising its NOSPACE alarm; raise spec.storage.size with it (capn's default, without the field, is min(2Gi, (size - 384MB) / 2))";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_quota_leaves_room_for_two_copies_and_the_wal_and_stops_at_etcds_default() {
        let gib = 1u64 << 30;
        // The default 1 GiB volume: two copies of 345 MB plus 384 MB of WAL fill it.
        let one = default_quota_backend_bytes(gib, ETCD_DEFAULT_QUOTA_BYTES);
        assert_eq!(one, (gib - WAL_RESERVE_BYTES) / 2);
        assert!(2 * one + WAL_RESERVE_BYTES <= gib);
        // Small volumes: a quarter, continuous where the two rules meet.
        assert_eq!(
            default_quota_backend_bytes(100 << 20, ETCD_DEFAULT_QUOTA_BYTES),
            25 << 20
        );
        let meet = 2 * WAL_RESERVE_BYTES;
        assert_eq!(default_quota_backend_bytes(meet, ETCD_DEFAULT_QUOTA_BYTES), meet / 4);
        // Large volumes keep etcd's 2 GiB default, never its 8 GiB maximum.
        assert_eq!(
            default_quota_backend_bytes(5 * gib, ETCD_DEFAULT_QUOTA_BYTES),
            ETCD_DEFAULT_QUOTA_BYTES
        );
        assert_eq!(
            default_quota_backend_bytes(100 * gib, ETCD_DEFAULT_QUOTA_BYTES),
            ETCD_DEFAULT_QUOTA_BYTES
        );
        assert!(default_quota_backend_bytes(u64::MAX, ETCD_DEFAULT_QUOTA_BYTES) <= ETCD_MAX_QUOTA_BYTES);
        assert_eq!(default_quota_backend_bytes(0, ETCD_DEFAULT_QUOTA_BYTES), 0);
    }

    fn storage(size: Option<&str>, quota: Option<&str>, ephemeral: bool) -> EtcdStorage {
        EtcdStorage {
            size: size.map(|s| Quantity(s.into())),
            quota_backend_bytes: quota.map(|s| Quantity(s.into())),
            ephemeral,
            ..Default::default()
        }
    }

    #[test]
    fn the_spec_quota_wins_and_the_default_follows_the_volume() {
        assert_eq!(
            quota_backend_bytes(None, "1Gi", None, "demo"),
            Ok(default_quota_backend_bytes(1 << 30, ETCD_DEFAULT_QUOTA_BYTES))
        );
        let s = storage(Some("10Gi"), None, false);
        assert_eq!(
            quota_backend_bytes(Some(&s), "1Gi", None, "demo"),
            Ok(ETCD_DEFAULT_QUOTA_BYTES)
        );
        let s = storage(None, Some("8Mi"), false);
        assert_eq!(quota_backend_bytes(Some(&s), "1Gi", None, "demo"), Ok(8 << 20));
        // An emptyDir has no size: etcd's own default.
        let s = storage(Some("1Gi"), None, true);
        assert_eq!(
            quota_backend_bytes(Some(&s), "1Gi", None, "demo"),
            Ok(ETCD_DEFAULT_QUOTA_BYTES)
        );
        let s = storage(None, Some("3Gi"), true);
        assert_eq!(quota_backend_bytes(Some(&s), "1Gi", None, "demo"), Ok(3 << 30));
    }

    #[test]
    fn a_sizes_ceiling_replaces_etcds_default_below_the_spec_and_within_the_volume() {
        let (gib, mib) = (1u64 << 30, 1u64 << 20);
        let small = Some(256 * mib);
        // The default 1 GiB volume leaves room for 345 MB: a lower ceiling wins, a higher
        // one does not.
        assert_eq!(quota_backend_bytes(None, "1Gi", small, "demo"), Ok(256 * mib));
        assert_eq!(
            quota_backend_bytes(None, "1Gi", Some(8 * gib), "demo"),
            Ok(default_quota_backend_bytes(gib, ETCD_DEFAULT_QUOTA_BYTES))
        );
        // A large volume reaches a ceiling above etcd's default.
        let s = storage(Some("40Gi"), None, false);
        assert_eq!(quota_backend_bytes(Some(&s), "1Gi", Some(8 * gib), "demo"), Ok(8 * gib));
        // Ephemeral storage: the ceiling itself.
        let s = storage(None, None, true);
        assert_eq!(quota_backend_bytes(Some(&s), "1Gi", small, "demo"), Ok(256 * mib));
        // The spec's quota wins over any size, and is still checked against the volume.
        let s = storage(None, Some("8Mi"), false);
        assert_eq!(quota_backend_bytes(Some(&s), "1Gi", small, "demo"), Ok(8 * mib));
        let s = storage(Some("1Gi"), Some("2Gi"), false);
        assert!(quota_backend_bytes(Some(&s), "1Gi", Some(8 * gib), "demo").is_err());
    }

    #[test]
    fn a_quota_above_the_volume_or_not_positive_is_refused_with_its_field() {
        let s = storage(Some("1Gi"), Some("2Gi"), false);
        let e = quota_backend_bytes(Some(&s), "1Gi", None, "demo").unwrap_err();
        assert_eq!(e.path, "spec.storage.quotaBackendBytes");
        assert_eq!(e.reason(), "InvalidEtcdQuota");
        assert!(e.to_string().contains("must not exceed spec.storage.size"), "{e}");
        for bad in ["0", "-1Mi", "lots"] {
            let s = storage(None, Some(bad), false);
            let e = quota_backend_bytes(Some(&s), "1Gi", None, "demo").unwrap_err();
            assert_eq!(
                (e.path.as_str(), e.reason()),
                ("spec.storage.quotaBackendBytes", "InvalidStorage")
            );
        }
    }
}
