//! References from a pod to other objects of its namespace, rewritten to the synced copies
//! (the same name mapping as every synced object, `ControlPlaneRef::super_name` with the
//! subdomain limit of ConfigMap, Secret and PersistentVolumeClaim names).
//!
//! Rewritten: `configMap`, `secret` and `persistentVolumeClaim` volumes; projected
//! `configMap` and `secret` sources (the tenant's `kube-root-ca.crt` among them: the
//! controller syncs the tenant's own, so the pod trusts its own apiserver's CA); the
//! Secrets that volume plugins read from the pod's namespace (`csi.nodePublishSecretRef`,
//! `azureFile.secretName`, and the `secretRef` of `cephfs`, `cinder`, `flexVolume`,
//! `iscsi`, `rbd`, `scaleIO`, `storageos`); `env[*].valueFrom.configMapKeyRef` and
//! `secretKeyRef`; `envFrom[*].configMapRef` and `secretRef`; `imagePullSecrets`.
//! Generic ephemeral volumes keep their claim template: the super cluster's ephemeral
//! volume controller creates the claim in the workload namespace itself.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Container, PodSpec, Volume};

use crate::syncer::names::{ControlPlaneRef, NameLimit};
pub use crate::syncer::resource::{Reference, ReferenceKind};

/// Rewrites every reference of `spec` (a pod of `namespace`) and returns the tenant objects
/// referred to.
pub(super) fn rewrite(spec: &mut PodSpec, control_plane: &ControlPlaneRef, namespace: &str) -> BTreeSet<Reference> {
    let mut found = BTreeSet::new();
    visit(spec, &mut |kind, name| {
        found.insert(Reference {
            kind,
            name: name.clone(),
        });
        *name = control_plane.super_name(NameLimit::Subdomain, namespace, name);
    });
    found
}

/// Every object of its namespace that `spec` refers to, by the names it uses: a tenant pod's
/// are tenant names, a super pod's (already rewritten) the copies' names. The same walk as
/// [`rewrite`], so the two never disagree on what counts as a reference.
pub fn referenced(spec: &PodSpec) -> BTreeSet<Reference> {
    let mut found = BTreeSet::new();
    visit(&mut spec.clone(), &mut |kind, name| {
        found.insert(Reference {
            kind,
            name: name.clone(),
        });
    });
    found
}

/// Calls `each` on every reference of `spec` with a name (an empty name is invalid in the
/// tenant already, and is left as it is).
fn visit(spec: &mut PodSpec, each: &mut dyn FnMut(ReferenceKind, &mut String)) {
    let mut mapper = Mapper(each);
    for volume in spec.volumes.iter_mut().flatten() {
        volume_references(volume, &mut mapper);
    }
    for container in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        container_references(container, &mut mapper);
    }
    for secret in spec.image_pull_secrets.iter_mut().flatten() {
        mapper.map(ReferenceKind::Secret, &mut secret.name);
    }
}

/// What [`visit`] calls for each reference.
struct Mapper<'a>(&'a mut dyn FnMut(ReferenceKind, &mut String));

impl Mapper<'_> {
    fn map(&mut self, kind: ReferenceKind, name: &mut String) {
        if !name.is_empty() {
            (self.0)(kind, name);
        }
    }
}

fn volume_references(volume: &mut Volume, mapper: &mut Mapper<'_>) {
    if let Some(config_map) = volume.config_map.as_mut() {
        mapper.map(ReferenceKind::ConfigMap, &mut config_map.name);
    }
    if let Some(name) = volume.secret.as_mut().and_then(|s| s.secret_name.as_mut()) {
        mapper.map(ReferenceKind::Secret, name);
    }
    if let Some(claim) = volume.persistent_volume_claim.as_mut() {
        mapper.map(ReferenceKind::PersistentVolumeClaim, &mut claim.claim_name);
    }
    let sources = volume.projected.as_mut().and_then(|p| p.sources.as_mut());
    for source in sources.into_iter().flatten() {
        if let Some(config_map) = source.config_map.as_mut() {
            mapper.map(ReferenceKind::ConfigMap, &mut config_map.name);
        }
        if let Some(secret) = source.secret.as_mut() {
            mapper.map(ReferenceKind::Secret, &mut secret.name);
        }
    }
    let plugin_secrets = [
        volume.csi.as_mut().and_then(|v| v.node_publish_secret_ref.as_mut()),
        volume.cephfs.as_mut().and_then(|v| v.secret_ref.as_mut()),
        volume.cinder.as_mut().and_then(|v| v.secret_ref.as_mut()),
        volume.flex_volume.as_mut().and_then(|v| v.secret_ref.as_mut()),
        volume.iscsi.as_mut().and_then(|v| v.secret_ref.as_mut()),
        volume.rbd.as_mut().and_then(|v| v.secret_ref.as_mut()),
        volume.storageos.as_mut().and_then(|v| v.secret_ref.as_mut()),
        volume.scale_io.as_mut().map(|v| &mut v.secret_ref),
    ];
    for secret in plugin_secrets.into_iter().flatten() {
        mapper.map(ReferenceKind::Secret, &mut secret.name);
    }
    if let Some(azure_file) = volume.azure_file.as_mut() {
        mapper.map(ReferenceKind::Secret, &mut azure_file.secret_name);
    }
}

fn container_references(container: &mut Container, mapper: &mut Mapper<'_>) {
    for source in container.env.iter_mut().flatten().filter_map(|e| e.value_from.as_mut()) {
        if let Some(key) = source.config_map_key_ref.as_mut() {
            mapper.map(ReferenceKind::ConfigMap, &mut key.name);
        }
        if let Some(key) = source.secret_key_ref.as_mut() {
            mapper.map(ReferenceKind::Secret, &mut key.name);
        }
    }
    for source in container.env_from.iter_mut().flatten() {
        if let Some(config_map) = source.config_map_ref.as_mut() {
            mapper.map(ReferenceKind::ConfigMap, &mut config_map.name);
        }
        if let Some(secret) = source.secret_ref.as_mut() {
            mapper.map(ReferenceKind::Secret, &mut secret.name);
        }
    }
}
