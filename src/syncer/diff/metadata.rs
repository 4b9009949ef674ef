//! Drift of the labels and annotations the syncer owns on a super object.
//!
//! The syncer owns the keys it copied from the tenant (listed in the `label-keys` and
//! `annotation-keys` tenancy annotations of the live object) and the tenancy keys. Keys the
//! super cluster's own admission or controllers add are not the syncer's and never count:
//! every desired entry must be on the live object with its value, and every key the live
//! object says the syncer copied must still be desired.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::syncer::names::tenancy::{ANNOTATION_KEYS, LABEL_KEYS, listed_keys};

/// Keys the syncer copied onto the live object earlier that the tenant has removed since:
/// what a merge patch must delete (server-side apply removes them by itself, as fields the
/// syncer's manager no longer applies).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StaleKeys {
    /// Label keys to remove.
    pub labels: Vec<String>,
    /// Annotation keys to remove.
    pub annotations: Vec<String>,
}

/// The stale keys of `live` against `desired`: listed as copied on `live`, present on
/// `live`, absent from `desired`.
pub fn stale_keys(desired: &ObjectMeta, live: &ObjectMeta) -> StaleKeys {
    StaleKeys {
        labels: stale(LABEL_KEYS, live, desired.labels.as_ref(), live.labels.as_ref()),
        annotations: stale(
            ANNOTATION_KEYS,
            live,
            desired.annotations.as_ref(),
            live.annotations.as_ref(),
        ),
    }
}

fn stale(
    list: &str,
    live: &ObjectMeta,
    desired: Option<&BTreeMap<String, String>>,
    present: Option<&BTreeMap<String, String>>,
) -> Vec<String> {
    let listed = live
        .annotations
        .as_ref()
        .and_then(|a| a.get(list))
        .map_or("", String::as_str);
    listed_keys(listed)
        .filter(|key| desired.is_none_or(|d| !d.contains_key(*key)))
        .filter(|key| present.is_some_and(|p| p.contains_key(*key)))
        .map(str::to_owned)
        .collect()
}

/// The paths of the labels and annotations that drifted
/// (`metadata.labels['app']`, `metadata.annotations['tenancy.x-k8s.io/uid']`): a desired
/// entry missing or different on `live`, or a stale key.
pub fn metadata_drift(desired: &ObjectMeta, live: &ObjectMeta) -> Vec<String> {
    let stale = stale_keys(desired, live);
    let mut out = Vec::new();
    for (field, want, have, stale) in [
        ("labels", &desired.labels, &live.labels, &stale.labels),
        (
            "annotations",
            &desired.annotations,
            &live.annotations,
            &stale.annotations,
        ),
    ] {
        for (key, value) in want.iter().flatten() {
            if have.as_ref().and_then(|h| h.get(key)) != Some(value) {
                out.push(format!("metadata.{field}['{key}']"));
            }
        }
        out.extend(stale.iter().map(|key| format!("metadata.{field}['{key}']")));
    }
    out
}
