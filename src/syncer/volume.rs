//! Claims and their volumes (docs/design.md §11 "Claims and volumes").
//!
//! Down: every tenant PersistentVolumeClaim has a copy in the workload namespace that asks
//! for the same storage (class, access modes, size, volume mode) and for nothing that names
//! super-cluster objects: no `volumeName`, `selector` or `dataSource`, through which a
//! tenant would reach volumes and objects outside its own.
//!
//! Up: the super cluster binds the copy to a volume (provisioned, or matched). The tenant is
//! then shown what a cluster whose volumes come from a CSI provisioner shows: a
//! PersistentVolume bound in advance to the tenant claim (`spec.claimRef` with its uid),
//! which the tenant's own PersistentVolume controller binds the claim to, so that the
//! claim's `spec.volumeName` and `status` (phase, capacity, access modes) are written by the
//! controller that writes them in every cluster. The tenant volume has the super volume's
//! name, capacity, access modes, volume mode, class and reclaim policy; its source is a CSI
//! source of the driver [`CSI_DRIVER`] whose handle is that name, never the super volume's
//! own source (a host path, a server address or a storage system's handle are the
//! platform's, not the tenant's). It is marked provisioned by [`CSI_DRIVER`], so the tenant
//! controller leaves a released volume's deletion to the syncer, which removes it when the
//! super volume is gone.

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::diff::metadata_drift;
use super::names::tenancy::{MissingField, TenantObject, super_metadata};
use super::names::{ControlPlaneRef, NameLimit};
use super::resource::ResourceSyncer;

/// Label on every tenant PersistentVolume the syncer made (value `true`).
pub const VIRTUAL_VOLUME_LABEL: &str = "tenancy.x-k8s.io/virtual-volume";
/// The CSI driver a tenant volume names as its source and provisioner. No such driver runs
/// in the tenant (its pods' volumes are mounted by the super cluster's kubelets, from the
/// copy), and the tenant Nodes do not ask for controller-managed attachment, so the tenant's
/// attach/detach controller leaves these volumes alone.
pub const CSI_DRIVER: &str = "syncer.capn.x-k8s.io";
/// The annotation by which the PersistentVolume controller knows who provisioned a volume
/// (`pv.kubernetes.io/provisioned-by`): for a provisioner it has no plugin of, it leaves the
/// deletion of a released volume to that provisioner.
const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";

/// The copy of the tenant claim `claim` in the workload namespace of `control_plane`.
///
/// Errors: [`MissingField`] when the claim lacks its namespace, name or uid.
pub fn claim_copy(
    control_plane: &ControlPlaneRef,
    claim: &PersistentVolumeClaim,
) -> Result<PersistentVolumeClaim, MissingField> {
    let spec = claim.spec.clone().unwrap_or_default();
    Ok(PersistentVolumeClaim {
        metadata: super_metadata(control_plane, NameLimit::Subdomain, &claim.metadata)?,
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: spec.access_modes,
            resources: spec.resources,
            storage_class_name: spec.storage_class_name,
            volume_mode: spec.volume_mode,
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    })
}

/// Claims as a resource syncer: [`claim_copy`] down; a copy is current when its labels and
/// annotations are the syncer's and its storage requests the tenant's, so an expansion the
/// tenant asks for goes down (every other field of a claim is immutable, and those the super
/// cluster defaults, its storage class and volume mode, are left to it). Status stays the
/// tenant's: its PersistentVolume controller binds the claim to the volume the volumes pass
/// shows it.
pub struct Claims;

impl ResourceSyncer for Claims {
    type Object = PersistentVolumeClaim;

    fn dynamic_type(&self) {}

    fn api(&self, client: kube::Client, namespace: &str) -> kube::Api<PersistentVolumeClaim> {
        kube::Api::namespaced(client, namespace)
    }

    fn name_limit(&self) -> NameLimit {
        NameLimit::Subdomain
    }

    fn copy(
        &self,
        control_plane: &ControlPlaneRef,
        claim: &PersistentVolumeClaim,
    ) -> Result<Option<PersistentVolumeClaim>, MissingField> {
        claim_copy(control_plane, claim).map(Some)
    }

    fn is_current(&self, desired: &PersistentVolumeClaim, live: &PersistentVolumeClaim) -> bool {
        let requests = |c: &PersistentVolumeClaim| {
            c.spec
                .as_ref()
                .and_then(|s| s.resources.as_ref())
                .and_then(|r| r.requests.clone())
        };
        metadata_drift(&desired.metadata, &live.metadata).is_empty() && requests(desired) == requests(live)
    }
}

/// The tenant volume that shows the super volume `volume`, bound to the tenant claim
/// `claim`.
pub fn tenant_volume(volume: &PersistentVolume, claim: &TenantObject) -> PersistentVolume {
    let name = volume.metadata.name.clone().unwrap_or_default();
    let spec = volume.spec.clone().unwrap_or_default();
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(BTreeMap::from([(VIRTUAL_VOLUME_LABEL.to_owned(), "true".to_owned())])),
            annotations: Some(BTreeMap::from([(PROVISIONED_BY.to_owned(), CSI_DRIVER.to_owned())])),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            capacity: spec.capacity,
            access_modes: spec.access_modes,
            volume_mode: spec.volume_mode,
            storage_class_name: spec.storage_class_name,
            persistent_volume_reclaim_policy: spec.persistent_volume_reclaim_policy,
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("PersistentVolumeClaim".to_owned()),
                namespace: Some(claim.namespace.clone()),
                name: Some(claim.name.clone()),
                uid: Some(claim.uid.clone()),
                ..ObjectReference::default()
            }),
            csi: Some(CSIPersistentVolumeSource {
                driver: CSI_DRIVER.to_owned(),
                volume_handle: name,
                ..CSIPersistentVolumeSource::default()
            }),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    }
}

/// Whether the live tenant volume `live` already says what `desired` says (the fields the
/// syncer sets; the tenant controller's status and annotations are its own).
pub fn same_volume(desired: &PersistentVolume, live: &PersistentVolume) -> bool {
    let (Some(want), Some(have)) = (&desired.spec, &live.spec) else {
        return false;
    };
    let claim = |spec: &PersistentVolumeSpec| {
        spec.claim_ref
            .as_ref()
            .map(|c| (c.namespace.clone(), c.name.clone(), c.uid.clone()))
    };
    want.capacity == have.capacity
        && want.access_modes == have.access_modes
        && want.volume_mode == have.volume_mode
        && want.storage_class_name == have.storage_class_name
        && want.persistent_volume_reclaim_policy == have.persistent_volume_reclaim_policy
        && claim(want) == claim(have)
        && want.csi.as_ref().map(|c| (&c.driver, &c.volume_handle))
            == have.csi.as_ref().map(|c| (&c.driver, &c.volume_handle))
}

/// One write a volumes pass makes in the tenant.
#[derive(Clone, Debug, PartialEq)]
pub enum VolumeChange {
    /// Make the tenant volume, or set it to this; `existing` says whether the syncer's
    /// cache of tenant volumes holds one of that name.
    Apply {
        volume: Box<PersistentVolume>,
        existing: bool,
    },
    /// Remove the tenant volume of this name: its super volume is gone, or no longer bound
    /// to a claim of this tenant.
    Delete(String),
}

/// The tenant volumes' changes, from the super volumes bound to claims in the workload
/// namespace `workloads` (`super_volumes` may hold others: they are skipped), the claim
/// copies there, and the tenant volumes the syncer made.
///
/// A super volume whose claim copy is gone (released, kept by its reclaim policy) keeps its
/// tenant volume as it is, released in the tenant too, and makes none; the tenant volume
/// goes with the super volume.
pub fn volume_changes(
    control_plane: &ControlPlaneRef,
    workloads: &str,
    super_volumes: &[impl Borrow<PersistentVolume>],
    super_claims: &[impl Borrow<PersistentVolumeClaim>],
    tenant_volumes: &[impl Borrow<PersistentVolume>],
) -> Vec<VolumeChange> {
    let claims: HashMap<(&str, &str), &PersistentVolumeClaim> = super_claims
        .iter()
        .map(Borrow::borrow)
        .filter_map(|c| Some(((c.metadata.name.as_deref()?, c.metadata.uid.as_deref()?), c)))
        .collect();
    let live: HashMap<&str, &PersistentVolume> = tenant_volumes
        .iter()
        .map(Borrow::borrow)
        .filter_map(|v| Some((v.metadata.name.as_deref()?, v)))
        .collect();
    let mut shown = HashSet::new();
    let mut changes = Vec::new();
    for volume in super_volumes.iter().map(Borrow::borrow) {
        let Some(claim_ref) = volume.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
            continue;
        };
        let (Some(name), Some(claim_name), Some(uid)) = (
            volume.metadata.name.as_deref(),
            claim_ref.name.as_deref(),
            claim_ref.uid.as_deref(),
        ) else {
            continue;
        };
        if claim_ref.namespace.as_deref() != Some(workloads) {
            continue;
        }
        shown.insert(name);
        let tenant_claim = claims
            .get(&(claim_name, uid))
            .and_then(|c| TenantObject::of_super(control_plane, &c.metadata));
        let Some(tenant_claim) = tenant_claim else {
            continue;
        };
        let desired = tenant_volume(volume, &tenant_claim);
        match live.get(name) {
            Some(existing) if same_volume(&desired, existing) => {}
            existing => changes.push(VolumeChange::Apply {
                volume: Box::new(desired),
                existing: existing.is_some(),
            }),
        }
    }
    for name in live.keys().filter(|name| !shown.contains(*name)) {
        changes.push(VolumeChange::Delete((*name).to_owned()));
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn control_plane() -> ControlPlaneRef {
        ControlPlaneRef::new("teams", "demo")
    }

    /// The claims syncer: a copy the super cluster bound and defaulted is current; a storage
    /// expansion the tenant asks for is not (it goes down); status is the tenant's (the
    /// trait's defaults: nothing goes up, through the status subresource if it did).
    #[test]
    fn a_bound_copy_is_current_an_expansion_is_not_and_status_stays_the_tenants() {
        let claim = tenant_claim();
        let desired = Claims.copy(&control_plane(), &claim).unwrap().unwrap();
        let mut live = desired.clone();
        let spec = live.spec.as_mut().unwrap();
        spec.volume_name = Some("pvc-s1".into());
        spec.storage_class_name = Some("fast".into());
        live.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert("pv.kubernetes.io/bind-completed".into(), "yes".into());
        assert!(Claims.is_current(&desired, &live));
        let mut expanded = claim.clone();
        expanded.spec.as_mut().unwrap().resources =
            Some(serde_json::from_value(serde_json::json!({"requests": {"storage": "2Gi"}})).unwrap());
        let wanted = Claims.copy(&control_plane(), &expanded).unwrap().unwrap();
        assert!(!Claims.is_current(&wanted, &live), "the expansion goes down");
        assert_eq!(Claims.status_up(&claim, &live), None);
        assert!(Claims.has_status_subresource());
    }

    fn tenant_claim() -> PersistentVolumeClaim {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "data", "namespace": "shop", "uid": "t-claim", "resourceVersion": "7",
                "finalizers": ["kubernetes.io/pvc-protection"], "labels": {"app": "db"}},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                "storageClassName": "fast", "volumeMode": "Filesystem", "volumeName": "pv-of-someone-else",
                "selector": {"matchLabels": {"disk": "ssd"}},
                "dataSource": {"kind": "PersistentVolumeClaim", "name": "other"}},
            "status": {"phase": "Pending"}
        }))
        .unwrap()
    }

    /// The copy as the super cluster stores it: with its own uid, bound to `volume`.
    fn bound_copy(volume: &str) -> PersistentVolumeClaim {
        let mut copy = claim_copy(&control_plane(), &tenant_claim()).unwrap();
        copy.metadata.uid = Some("s-claim".into());
        copy.spec.as_mut().unwrap().volume_name = Some(volume.into());
        copy
    }

    fn super_volume(name: &str, claim: &str, claim_uid: &str) -> PersistentVolume {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "uid": "s-volume", "annotations": {"pv.kubernetes.io/provisioned-by": "ebs.csi.aws.com"}},
            "spec": {"capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem",
                "storageClassName": "fast", "persistentVolumeReclaimPolicy": "Delete",
                "claimRef": {"kind": "PersistentVolumeClaim", "namespace": "teams-demo-workloads", "name": claim, "uid": claim_uid},
                "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-0abc", "nodePublishSecretRef": {"name": "k", "namespace": "kube-system"}},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}},
            "status": {"phase": "Bound"}
        }))
        .unwrap()
    }

    #[test]
    fn a_claims_copy_asks_for_the_same_storage_and_names_nothing_of_the_super_cluster() {
        let copy = claim_copy(&control_plane(), &tenant_claim()).unwrap();
        let spec = copy.spec.unwrap();
        assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_owned()]));
        assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
        assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
        assert_eq!(
            spec.resources.unwrap().requests.unwrap()["storage"].0,
            "1Gi",
            "the size asked for"
        );
        assert_eq!(spec.volume_name, None, "a tenant must not claim a super volume by name");
        assert_eq!(spec.selector, None);
        assert_eq!(spec.data_source, None);
        assert_eq!(spec.data_source_ref, None);
        assert_eq!(copy.metadata.namespace.as_deref(), Some("teams-demo-workloads"));
        assert_eq!(copy.metadata.finalizers, None);
        assert_eq!(copy.status, None);
        let owner = TenantObject::of_super(&control_plane(), &copy.metadata).unwrap();
        assert_eq!((owner.namespace.as_str(), owner.uid.as_str()), ("shop", "t-claim"));
        // A claim the tenant apiserver did not store cannot be copied.
        let mut unstored = tenant_claim();
        unstored.metadata.uid = None;
        assert!(claim_copy(&control_plane(), &unstored).is_err());
    }

    #[test]
    fn a_bound_super_volume_shows_in_the_tenant_bound_in_advance_to_the_tenant_claim() {
        let copy = bound_copy("pvc-s1");
        let name = copy.metadata.name.clone().unwrap();
        let volume = super_volume("pvc-s1", &name, "s-claim");
        let changes = volume_changes(
            &control_plane(),
            "teams-demo-workloads",
            &[volume],
            &[copy],
            &Vec::<PersistentVolume>::new(),
        );
        let [
            VolumeChange::Apply {
                volume: shown,
                existing: false,
            },
        ] = changes.as_slice()
        else {
            panic!("expected one new tenant volume, got {changes:?}");
        };
        assert_eq!(shown.metadata.name.as_deref(), Some("pvc-s1"));
        assert_eq!(shown.metadata.labels.as_ref().unwrap()[VIRTUAL_VOLUME_LABEL], "true");
        assert_eq!(shown.metadata.annotations.as_ref().unwrap()[PROVISIONED_BY], CSI_DRIVER);
        let spec = shown.spec.as_ref().unwrap();
        let claim = spec.claim_ref.as_ref().unwrap();
        assert_eq!(
            (claim.namespace.as_deref(), claim.name.as_deref(), claim.uid.as_deref()),
            (Some("shop"), Some("data"), Some("t-claim")),
            "bound to the tenant claim, not to its copy"
        );
        assert_eq!(
            spec.capacity.as_ref().unwrap()["storage"].0,
            "2Gi",
            "what was provisioned"
        );
        assert_eq!(spec.persistent_volume_reclaim_policy.as_deref(), Some("Delete"));
        assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
        let csi = spec.csi.as_ref().unwrap();
        assert_eq!(
            (csi.driver.as_str(), csi.volume_handle.as_str()),
            (CSI_DRIVER, "pvc-s1")
        );
        assert_eq!(csi.node_publish_secret_ref, None, "no super-cluster Secret is named");
        assert_eq!(spec.node_affinity, None);
        // Once shown, a pass changes nothing; a changed super volume (expanded) is shown again.
        let volume = super_volume("pvc-s1", &name, "s-claim");
        let mut live = shown.clone();
        live.status = Some(Default::default());
        let again = volume_changes(
            &control_plane(),
            "teams-demo-workloads",
            std::slice::from_ref(&volume),
            &[bound_copy("pvc-s1")],
            &[live.clone()],
        );
        assert_eq!(again, vec![]);
        let mut expanded = volume;
        expanded.spec.as_mut().unwrap().capacity.as_mut().unwrap().insert(
            "storage".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("4Gi".into()),
        );
        let changes = volume_changes(
            &control_plane(),
            "teams-demo-workloads",
            &[expanded],
            &[bound_copy("pvc-s1")],
            &[live],
        );
        assert!(matches!(
            changes.as_slice(),
            [VolumeChange::Apply { existing: true, .. }]
        ));
    }

    #[test]
    fn a_tenant_volume_stays_while_its_super_volume_does_and_goes_with_it() {
        let copy = bound_copy("pvc-s1");
        let name = copy.metadata.name.clone().unwrap();
        let shown = tenant_volume(
            &super_volume("pvc-s1", &name, "s-claim"),
            &TenantObject::of_super(&control_plane(), &copy.metadata).unwrap(),
        );
        // The claim copy is gone, the super volume kept (released): the tenant volume stays.
        let released = super_volume("pvc-s1", &name, "s-claim");
        let none: &[PersistentVolumeClaim] = &[];
        let changes = volume_changes(
            &control_plane(),
            "teams-demo-workloads",
            &[released],
            none,
            std::slice::from_ref(&shown),
        );
        assert_eq!(changes, vec![]);
        // The super volume gone: the tenant volume goes.
        let gone: &[PersistentVolume] = &[];
        let changes = volume_changes(
            &control_plane(),
            "teams-demo-workloads",
            gone,
            none,
            std::slice::from_ref(&shown),
        );
        assert_eq!(changes, vec![VolumeChange::Delete("pvc-s1".into())]);
        // Bound to another workload namespace's claim (another tenant's): not shown here.
        let elsewhere = {
            let mut v = super_volume("pvc-s1", &name, "s-claim");
            v.spec.as_mut().unwrap().claim_ref.as_mut().unwrap().namespace = Some("other-workloads".into());
            v
        };
        let changes = volume_changes(
            &control_plane(),
            "teams-demo-workloads",
            &[elsewhere],
            &[bound_copy("pvc-s1")],
            &[shown],
        );
        assert_eq!(changes, vec![VolumeChange::Delete("pvc-s1".into())]);
        // A super volume bound to a claim of the same name but another uid (the copy of a
        // tenant claim made again) is not shown as the new claim's.
        let stale = super_volume("pvc-s1", &name, "s-older-claim");
        let changes = volume_changes(
            &control_plane(),
            "teams-demo-workloads",
            &[stale],
            &[bound_copy("pvc-s1")],
            &Vec::<PersistentVolume>::new(),
        );
        assert_eq!(changes, vec![]);
    }
}
