//! Projected and downwardAPI volumes, written once when the pod starts (runner adaptation 5):
//! a projected volume's `secret`, `configMap` and `downwardAPI` sources merged into one
//! payload, as the kubelet's projected plugin does, through the same atomic writer as Secret
//! and ConfigMap volumes. `serviceAccountToken`, `clusterTrustBundle` and `podCertificate`
//! sources, and `resourceFieldRef` items, are refused.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{DownwardAPIVolumeFile, KeyToPath, Volume};

use super::atomic_writer::{self, FileProjection, Payload};
use super::pod::{NotYet, PodIdentity, Source, SourcedVolume, Sources, apply_fs_group, field_value, safe_relative};

/// `Err` (a refusal) for a volume of a kind neither the runner nor the node materializes,
/// or a projected source they do not support.
///
/// # Errors
/// Naming the volume and what is not supported.
pub(super) fn check(volume: &Volume) -> Result<(), String> {
    let name = &volume.name;
    if let Some(projected) = &volume.projected {
        for source in projected.sources.iter().flatten() {
            if source.secret.is_none() && source.config_map.is_none() && source.downward_api.is_none() {
                return Err(format!(
                    "volume {name}: projected sources other than secret, configMap and downwardAPI \
                     (serviceAccountToken, clusterTrustBundle, podCertificate) are not supported by the runner"
                ));
            }
            check_items(name, source.downward_api.as_ref().and_then(|d| d.items.as_ref()))?;
        }
        return Ok(());
    }
    if let Some(downward) = &volume.downward_api {
        return check_items(name, downward.items.as_ref());
    }
    Err(format!(
        "volume {name} is of a kind the runner does not materialize (only secret, configMap, emptyDir, hostPath, \
         persistentVolumeClaim, projected, downwardAPI)"
    ))
}

fn check_items(name: &str, items: Option<&Vec<DownwardAPIVolumeFile>>) -> Result<(), String> {
    if items.into_iter().flatten().any(|i| i.field_ref.is_none()) {
        return Err(format!(
            "volume {name}: downward API items need a fieldRef (resourceFieldRef is not supported by the runner)"
        ));
    }
    Ok(())
}

/// The files of a projected or downwardAPI volume (`None` for another kind).
pub(super) fn payload(
    volume: &Volume,
    sources: &Sources<'_>,
    identity: &PodIdentity,
) -> Option<Result<Payload, NotYet>> {
    if let Some(projected) = &volume.projected {
        let mode = projected.default_mode.unwrap_or(0o644) as u32;
        let mut payload = Payload::new();
        for source in projected.sources.iter().flatten() {
            let part = if let Some(s) = &source.secret {
                keyed(
                    Source::Secret(s.name.clone()),
                    s.items.clone(),
                    s.optional,
                    mode,
                    sources,
                )
            } else if let Some(c) = &source.config_map {
                keyed(
                    Source::ConfigMap(c.name.clone()),
                    c.items.clone(),
                    c.optional,
                    mode,
                    sources,
                )
            } else if let Some(d) = &source.downward_api {
                downward(&volume.name, d.items.as_ref(), mode, identity)
            } else {
                Err(format!("volume {}: unsupported projected source", volume.name))
            };
            match part {
                Ok(part) => payload.extend(part),
                Err(e) => return Some(Err(e)),
            }
        }
        return Some(Ok(payload));
    }
    let downward_api = volume.downward_api.as_ref()?;
    let mode = downward_api.default_mode.unwrap_or(0o644) as u32;
    Some(downward(&volume.name, downward_api.items.as_ref(), mode, identity))
}

/// A Secret or ConfigMap source, as a Secret or ConfigMap volume of its own would hold it.
fn keyed(
    source: Source,
    items: Option<Vec<KeyToPath>>,
    optional: Option<bool>,
    mode: u32,
    sources: &Sources<'_>,
) -> Result<Payload, NotYet> {
    let volume = SourcedVolume {
        name: String::new(),
        dir: PathBuf::new(),
        source,
        items,
        default_mode: mode,
        optional: optional.unwrap_or(false),
        fs_group: None,
    };
    volume.payload(sources.data(&volume.source).as_ref())
}

/// Downward API items: each `fieldRef`'s value (labels and annotations as `key="value"`
/// lines, sorted, as the kubelet writes them).
fn downward(
    volume: &str,
    items: Option<&Vec<DownwardAPIVolumeFile>>,
    mode: u32,
    identity: &PodIdentity,
) -> Result<Payload, NotYet> {
    let mut payload = Payload::new();
    for item in items.into_iter().flatten() {
        let path = item
            .field_ref
            .as_ref()
            .map(|f| f.field_path.as_str())
            .unwrap_or_default();
        let map = |m: &BTreeMap<String, String>| {
            m.iter()
                .map(|(k, v)| format!("{k}={v:?}"))
                .collect::<Vec<_>>()
                .join("\n")
        };
        let value = match path {
            "metadata.labels" => map(&identity.labels),
            "metadata.annotations" => map(&identity.annotations),
            other => field_value(other, identity)
                .ok_or_else(|| format!("volume {volume}: fieldRef {other:?} is not supported by the runner"))?,
        };
        safe_relative(&item.path)
            .ok_or_else(|| format!("volume {volume}: item path {:?} escapes the volume", item.path))?;
        payload.insert(
            item.path.clone(),
            FileProjection {
                data: value.into_bytes(),
                mode: item.mode.map_or(mode, |m| m as u32),
            },
        );
    }
    Ok(payload)
}

/// Creates the volume directory (0777, like the kubelet's) and writes `payload` into it with
/// the atomic writer, `fsGroup` applied as for a Secret volume.
///
/// # Errors
/// Filesystem errors.
pub(super) fn write(dir: &Path, payload: &Payload, fs_group: Option<u32>) -> Result<PathBuf, NotYet> {
    let io = |what: &str, e: std::io::Error| format!("{what} {}: {e}", dir.display());
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir).map_err(|e| io("cannot create", e))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o777)).map_err(|e| io("chmod", e))?;
    atomic_writer::write(dir, payload, || match fs_group {
        Some(group) => apply_fs_group(dir, group, true),
        None => Ok(()),
    })?;
    Ok(dir.to_owned())
}
