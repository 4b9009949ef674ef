//! The patrol's comparison of what the syncer wants in the super cluster with what is
//! there, and whose each super object is.
//!
//! [`pod_drift`] compares a translated pod with the live super pod only where drift is
//! possible and the syncer's: its labels and annotations ([`metadata`]), and the spec
//! fields a Pod update may change at all (Kubernetes' pod update validation,
//! <https://kubernetes.io/docs/concepts/workloads/pods/#pod-update-and-replacement>:
//! container and init container `image`, `activeDeadlineSeconds`, additions to
//! `tolerations`, removals from `schedulingGates`; and container `resources` through the
//! `resize` subresource). Every other spec field is immutable, so it can only differ
//! because the super cluster filled it in (defaults such as `terminationMessagePath` or
//! `schedulerName`, `nodeName` from the scheduler, tolerations and resources from its
//! admission) and never counts; nor do status, uid, resourceVersion, managedFields or
//! timestamps. The tenant's pod spec is immutable in the same fields, so a tenant change
//! always lands in one of these.

pub mod metadata;
pub mod ownership;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

pub use metadata::{StaleKeys, metadata_drift, stale_keys};
pub use ownership::{Ownership, copy_of, orphans, ownership};

/// How a drifted field is put right.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Repair {
    /// A patch or apply of the pod.
    Update,
    /// The pod's `resize` subresource.
    Resize,
}

/// One field of the live super pod that is not as the syncer wants it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Drift {
    /// The field's path (`spec.containers[0].image`), indexed as in the desired pod.
    pub field: String,
    /// How to put it right.
    pub repair: Repair,
}

impl Drift {
    fn update(field: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            repair: Repair::Update,
        }
    }
}

/// Every drifted field of `live` against `desired` (see the module documentation); empty
/// when the live pod is as wanted.
pub fn pod_drift(desired: &Pod, live: &Pod) -> Vec<Drift> {
    let mut out: Vec<Drift> = metadata_drift(&desired.metadata, &live.metadata)
        .into_iter()
        .map(Drift::update)
        .collect();
    let (Some(want), Some(have)) = (desired.spec.as_ref(), live.spec.as_ref()) else {
        return out;
    };
    containers_drift(
        "spec.initContainers",
        want.init_containers.as_deref(),
        have.init_containers.as_deref(),
        &mut out,
    );
    containers_drift(
        "spec.containers",
        Some(&want.containers),
        Some(&have.containers),
        &mut out,
    );
    if want.active_deadline_seconds.is_some() && want.active_deadline_seconds != have.active_deadline_seconds {
        out.push(Drift::update("spec.activeDeadlineSeconds"));
    }
    out.extend(scheduling_drift(want, have));
    out
}

/// Tolerations the tenant added and gates it removed since the live pod was made.
fn scheduling_drift(want: &PodSpec, have: &PodSpec) -> Vec<Drift> {
    let mut out = Vec::new();
    let live_tolerations = have.tolerations.as_deref().unwrap_or_default();
    for (i, toleration) in want.tolerations.iter().flatten().enumerate() {
        if !live_tolerations.contains(toleration) {
            out.push(Drift::update(format!("spec.tolerations[{i}]")));
        }
    }
    let wanted_gates = want.scheduling_gates.as_deref().unwrap_or_default();
    if have
        .scheduling_gates
        .iter()
        .flatten()
        .any(|gate| !wanted_gates.contains(gate))
    {
        out.push(Drift::update("spec.schedulingGates"));
    }
    out
}

/// Image and resource drift of the containers of one list, matched by name.
fn containers_drift(list: &str, want: Option<&[Container]>, have: Option<&[Container]>, out: &mut Vec<Drift>) {
    let live: BTreeMap<&str, &Container> = have.into_iter().flatten().map(|c| (c.name.as_str(), c)).collect();
    for (i, container) in want.into_iter().flatten().enumerate() {
        let Some(current) = live.get(container.name.as_str()) else {
            continue;
        };
        if container.image.is_some() && container.image != current.image {
            out.push(Drift::update(format!("{list}[{i}].image")));
        }
        if !resources_within(container, current) {
            out.push(Drift {
                field: format!("{list}[{i}].resources"),
                repair: Repair::Resize,
            });
        }
    }
}

/// Whether every request and limit the desired container sets is the live one's (entries
/// the super cluster's LimitRanger added are not the syncer's).
fn resources_within(want: &Container, have: &Container) -> bool {
    let (Some(want), have) = (want.resources.as_ref(), have.resources.as_ref()) else {
        return true;
    };
    [
        (&want.requests, have.and_then(|h| h.requests.as_ref())),
        (&want.limits, have.and_then(|h| h.limits.as_ref())),
    ]
    .into_iter()
    .all(|(want, have)| {
        want.iter()
            .flatten()
            .all(|(name, quantity)| have.and_then(|h| h.get(name)) == Some(quantity))
    })
}

#[cfg(test)]
mod tests;
