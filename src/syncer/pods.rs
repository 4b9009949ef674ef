//! The pod syncer's rules as a [`ResourceSyncer`]: the copy is [`translate`]'s pod, the
//! patrol's comparison is [`pod_drift`], status comes up as [`tenant_status`] says, and the
//! references are the ConfigMaps, Secrets and claims the pod names. The controller that
//! drives them is `controllers::syncer::pods`, not the copies engine: a pod's copy waits
//! for its references, brings objects made per pod (its token, trust bundle and certificate
//! holders, from [`translate`]'s [`Translation`]), is bound in the tenant, and ends as the
//! kubelet ends a pod (docs/developer/resource-syncers.md).

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::jiff::Timestamp;

use super::diff::pod_drift;
use super::pod::env::ServiceLink;
use super::pod::references::{Reference, referenced};
use super::pod::{Target, TranslateError, Translation, translate};
use crate::syncer::names::tenancy::MissingField;
use crate::syncer::names::{ControlPlaneRef, NameLimit};
use crate::syncer::resource::ResourceSyncer;
use crate::syncer::upward::tenant_status;

/// The rules for one pass over the pods of one tenant namespace.
pub struct Pods<'a> {
    /// Where the pods go and what they reach.
    pub target: &'a Target,
    /// The Service links of the namespace (`crate::syncer::service::service_links`).
    pub links: &'a [ServiceLink],
    /// The time a condition that changes state going up is stamped with.
    pub now: Timestamp,
}

impl Pods<'_> {
    /// The whole translation of `pod`: its copy and what is made per pod around it.
    ///
    /// Errors: as [`translate`].
    pub fn translate(&self, pod: &Pod) -> Result<Translation, TranslateError> {
        translate(pod, self.target, self.links)
    }
}

impl ResourceSyncer for Pods<'_> {
    type Object = Pod;

    fn dynamic_type(&self) {}

    fn api(&self, client: kube::Client, namespace: &str) -> kube::Api<Pod> {
        kube::Api::namespaced(client, namespace)
    }

    fn name_limit(&self) -> NameLimit {
        NameLimit::Subdomain
    }

    /// `None` for a pod the syncer's admission refuses (the controller tells the tenant
    /// why, from [`Pods::translate`]'s error).
    fn copy(&self, control_plane: &ControlPlaneRef, pod: &Pod) -> Result<Option<Pod>, MissingField> {
        debug_assert_eq!(control_plane, &self.target.control_plane);
        match self.translate(pod) {
            Ok(translation) => Ok(Some(translation.pod)),
            Err(TranslateError::MissingField(missing)) => Err(missing),
            Err(TranslateError::Refused(_)) => Ok(None),
        }
    }

    fn is_current(&self, desired: &Pod, live: &Pod) -> bool {
        pod_drift(desired, live).is_empty()
    }

    /// The tenant pod with its super pod's status merged in, when that changes it (the
    /// controller writes it as a merge patch of `status`, and binds the pod first).
    fn status_up(&self, pod: &Pod, copy: &Pod) -> Option<Pod> {
        let up = tenant_status(pod, copy, self.now).status;
        let merged = merge(pod.status.as_ref(), &up)?;
        Some(Pod {
            status: Some(merged),
            ..pod.clone()
        })
    }

    fn references(&self, pod: &Pod) -> BTreeSet<Reference> {
        pod.spec.as_ref().map(referenced).unwrap_or_default()
    }
}

/// `desired` merged into `current` as a JSON merge patch would, or `None` when that changes
/// nothing. Comparing the merged result, not the two statuses, keeps a field the patch does
/// not name from causing a write at every pass.
fn merge(current: Option<&PodStatus>, desired: &PodStatus) -> Option<PodStatus> {
    let current = serde_json::to_value(current.cloned().unwrap_or_default()).ok()?;
    let mut merged = current.clone();
    json_patch::merge(&mut merged, &serde_json::to_value(desired).ok()?);
    (merged != current)
        .then(|| serde_json::from_value(merged).ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::syncer::fixtures::{nginx, with};
    use crate::syncer::pod::ApiServerAddress;

    fn target() -> Target {
        Target {
            control_plane: ControlPlaneRef::new("tenants", "demo"),
            apiserver: ApiServerAddress {
                host: "10.0.0.1".to_owned(),
                port: 443,
            },
            level: crate::syncer::admission::Level::Baseline,
            dns: None,
        }
    }

    fn status(value: serde_json::Value) -> PodStatus {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_status_is_written_only_when_merging_it_would_change_the_tenant_pod() {
        let current = status(serde_json::json!({
            "phase": "Running", "podIP": "10.0.0.5", "nominatedNodeName": "n1",
            "conditions": [{"type": "Ready", "status": "True"}]}));
        // The same, without a field the merge leaves alone: no write.
        let same = status(serde_json::json!({
            "phase": "Running", "podIP": "10.0.0.5",
            "conditions": [{"type": "Ready", "status": "True"}]}));
        assert_eq!(merge(Some(&current), &same), None);
        // A changed condition list is a write (lists are replaced whole).
        let not_ready = status(serde_json::json!({
            "phase": "Running", "podIP": "10.0.0.5",
            "conditions": [{"type": "Ready", "status": "False"}]}));
        let merged = merge(Some(&current), &not_ready).unwrap();
        assert_eq!(
            merged.nominated_node_name.as_deref(),
            Some("n1"),
            "what the patch does not name stays"
        );
        assert!(merge(None, &same).is_some());
    }

    #[test]
    fn the_trait_is_the_translation_and_a_refused_pod_has_no_copy() {
        let target = target();
        let pods = Pods {
            target: &target,
            links: &[],
            now: Timestamp::UNIX_EPOCH,
        };
        let pod = nginx();
        let copy = pods.copy(&target.control_plane, &pod).unwrap().unwrap();
        assert_eq!(copy, pods.translate(&pod).unwrap().pod);
        assert!(pods.is_current(&copy, &copy.clone()));
        let privileged = with(
            &pod,
            "/spec/containers/0/securityContext",
            serde_json::json!({"privileged": true}),
        );
        assert_eq!(pods.copy(&target.control_plane, &privileged).unwrap(), None);
        let mut anonymous = pod.clone();
        anonymous.metadata.uid = None;
        assert!(pods.copy(&target.control_plane, &anonymous).is_err());
    }

    #[test]
    fn a_pod_references_what_its_spec_names_and_its_status_comes_from_the_super_pod() {
        let target = target();
        let pods = Pods {
            target: &target,
            links: &[],
            now: Timestamp::UNIX_EPOCH,
        };
        let pod = with(
            &nginx(),
            "/spec/volumes",
            serde_json::json!([{"name": "c", "configMap": {"name": "settings"}}]),
        );
        let names: Vec<_> = pods.references(&pod).into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["settings"]);
        let mut running = pods.copy(&target.control_plane, &pod).unwrap().unwrap();
        running.status = Some(status(serde_json::json!({"phase": "Running", "podIP": "10.1.0.7"})));
        let up = pods.status_up(&pod, &running).unwrap();
        assert_eq!(up.status.as_ref().and_then(|s| s.pod_ip.as_deref()), Some("10.1.0.7"));
        assert_eq!(pods.status_up(&up, &running), None, "written once, then current");
    }
}
