//! Sizes (`channel.yaml` `sizes`): named presets of what a control plane of that size runs
//! with — each component's container resources, the apiserver's concurrency limits, the Go
//! runtime's memory limit and collector target, etcd's backend quota — so that a platform
//! sizes its tenants in its channel, not in capn's code (docs/guide/sizes.md).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::{Deserialize, Serialize};

use crate::component::ComponentKind;
use crate::quantity::quantity_bytes;

/// One size: what each component runs with. A component the size leaves out renders with
/// none of these settings (its template's own choices, or the process defaults).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Size {
    /// For humans: who the size is for, and where its numbers come from.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<ComponentSize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apiserver: Option<ComponentSize>,
    #[serde(default, rename = "controller-manager", skip_serializing_if = "Option::is_none")]
    pub controller_manager: Option<ComponentSize>,
}

impl Size {
    /// What the size sets for `kind`.
    pub fn component(&self, kind: ComponentKind) -> Option<&ComponentSize> {
        match kind {
            ComponentKind::Etcd => self.etcd.as_ref(),
            ComponentKind::ApiServer => self.apiserver.as_ref(),
            ComponentKind::ControllerManager => self.controller_manager.as_ref(),
        }
    }
}

/// What one size sets for one component. Every field is optional: an absent one leaves the
/// process's own default.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ComponentSize {
    /// The main container's resources (requests and limits), unless the component's
    /// `spec.resources` sets its own (which replace these wholesale).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// The Go runtime's soft memory limit, a quantity of bytes (`180Mi`), rendered as the
    /// `GOMEMLIMIT` environment variable (<https://pkg.go.dev/runtime#hdr-Environment_Variables>):
    /// the collector works harder as the heap nears it. At most `resources.limits.memory`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub go_mem_limit: Option<Quantity>,
    /// The Go collector's target, percent of live heap allocated before the next collection
    /// (`GOGC`; Go's default is 100). Lower keeps less garbage at more CPU.
    #[serde(default, rename = "goGC", skip_serializing_if = "Option::is_none")]
    pub go_gc: Option<u32>,
    /// apiserver only: `--max-requests-inflight` (kube-apiserver's default 400). With API
    /// Priority and Fairness (on by default) this and the next are summed into the server's
    /// total concurrency limit, which the priority levels share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_requests_inflight: Option<u32>,
    /// apiserver only: `--max-mutating-requests-inflight` (kube-apiserver's default 200).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_mutating_requests_inflight: Option<u32>,
    /// etcd only: the ceiling of etcd's backend quota (`--quota-backend-bytes`) in place of
    /// etcd's own 2 GiB default: the quota is this, or less when the volume has room for
    /// less (src/plan/etcd_quota.rs). A NestedEtcd's `spec.storage.quotaBackendBytes` wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_backend_bytes: Option<Quantity>,
    /// Command-line flags of the component's main container, flag name → value, applied
    /// like the component's `spec.extraArgs` (a flag the template renders is replaced in
    /// place, another is appended) and before them: the component's own `extraArgs` win flag
    /// by flag. For the knobs that have no field of their own: the apiserver's watch cache
    /// sizes, the controllers the controller-manager runs, etcd's snapshot count
    /// (docs/guide/sizes.md says what each buys). A flag must exist in every release of the
    /// channel that the size is used with: the process refuses an unknown flag at start.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra_args: BTreeMap<String, String>,
}

/// The longest size name: a DNS label.
pub const MAX_SIZE_NAME: usize = 63;

/// Whether `name` is a size name: a DNS label (lower-case letters, digits and `-`, starting
/// and ending with a letter or digit, at most 63 characters), as the CRDs' rule for
/// `spec.size` says.
pub fn is_size_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_SIZE_NAME
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first() != Some(&b'-')
        && bytes.last() != Some(&b'-')
}

impl ComponentSize {
    /// Checks one component's settings of size `size` (`kind`'s), beyond the schema: the
    /// flags of another component are refused, quantities must parse, `goMemLimit` must fit
    /// under the memory limit.
    ///
    /// # Errors
    /// What is wrong, naming the field as `sizes.<size>.<component>.<field>`.
    pub(super) fn check(&self, size: &str, kind: ComponentKind) -> Result<(), String> {
        let at = |field: &str| format!("sizes.{size}.{kind}.{field}");
        let only = |field: &str, set: bool, owner: ComponentKind| {
            if set && kind != owner {
                Err(format!(
                    "{} is a setting of {owner} only (it is a flag of that process)",
                    at(field)
                ))
            } else {
                Ok(())
            }
        };
        only(
            "maxRequestsInflight",
            self.max_requests_inflight.is_some(),
            ComponentKind::ApiServer,
        )?;
        only(
            "maxMutatingRequestsInflight",
            self.max_mutating_requests_inflight.is_some(),
            ComponentKind::ApiServer,
        )?;
        only(
            "quotaBackendBytes",
            self.quota_backend_bytes.is_some(),
            ComponentKind::Etcd,
        )?;
        let positive = |field: &str, value: Option<u32>| match value {
            Some(0) => Err(format!("{} must be at least 1", at(field))),
            _ => Ok(()),
        };
        positive("maxRequestsInflight", self.max_requests_inflight)?;
        positive("maxMutatingRequestsInflight", self.max_mutating_requests_inflight)?;
        positive("goGC", self.go_gc)?;
        let bytes = |field: &str, q: &Quantity| {
            quantity_bytes(&q.0)
                .filter(|b| *b > 0)
                .ok_or_else(|| format!("{} {:?} must be a positive quantity, like 180Mi", at(field), q.0))
        };
        if let Some(q) = &self.quota_backend_bytes {
            bytes("quotaBackendBytes", q)?;
        }
        for flag in self.extra_args.keys() {
            if flag.is_empty() || flag.starts_with('-') || flag.contains('=') || flag.chars().any(char::is_whitespace) {
                return Err(format!(
                    "{} key {flag:?} is not a flag name: keys are flag names without leading dashes, '=' or whitespace (`watch-cache-sizes: \"...\"` sets --watch-cache-sizes=...)",
                    at("extraArgs")
                ));
            }
        }
        let resources = self.resources.as_ref();
        for (list, map) in [
            ("requests", resources.and_then(|r| r.requests.as_ref())),
            ("limits", resources.and_then(|r| r.limits.as_ref())),
        ] {
            for (name, q) in map.into_iter().flatten() {
                if quantity_bytes(&q.0).is_none() {
                    return Err(format!(
                        "{} {:?} must be a non-negative quantity, like 100m or 128Mi",
                        at(&format!("resources.{list}.{name}")),
                        q.0
                    ));
                }
            }
        }
        if let Some(q) = &self.go_mem_limit {
            let limit = bytes("goMemLimit", q)?;
            let memory = resources
                .and_then(|r| r.limits.as_ref())
                .and_then(|l| l.get("memory"))
                .and_then(|m| quantity_bytes(&m.0));
            if let Some(memory) = memory.filter(|m| limit > *m) {
                return Err(format!(
                    "{} {:?} exceeds resources.limits.memory ({memory} bytes): the kernel would kill the process before Go's collector works to stay under it; set it below the limit (about 90% of it)",
                    at("goMemLimit"),
                    q.0
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size(yaml: &str) -> ComponentSize {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn size_names_are_dns_labels() {
        for good in ["small", "m", "x-large", "2xl"] {
            assert!(is_size_name(good), "{good}");
        }
        for bad in ["", "Small", "-small", "small-", "a_b", "a.b", &"a".repeat(64)] {
            assert!(!is_size_name(bad), "{bad}");
        }
    }

    #[test]
    fn a_component_size_is_checked_with_the_field_it_names() {
        let ok = size(
            "resources: {requests: {cpu: 50m, memory: 64Mi}, limits: {memory: 512Mi}}\ngoMemLimit: 460Mi\ngoGC: 50\nmaxRequestsInflight: 100\nmaxMutatingRequestsInflight: 50\n",
        );
        assert_eq!(ok.check("small", ComponentKind::ApiServer), Ok(()));
        let e = ok.check("small", ComponentKind::Etcd).unwrap_err();
        assert!(
            e.contains("sizes.small.etcd.maxRequestsInflight is a setting of apiserver only"),
            "{e}"
        );
        let e = size("quotaBackendBytes: 1Gi")
            .check("small", ComponentKind::ApiServer)
            .unwrap_err();
        assert!(e.contains("sizes.small.apiserver.quotaBackendBytes"), "{e}");
        let e = size("goMemLimit: 600Mi\nresources: {limits: {memory: 512Mi}}")
            .check("small", ComponentKind::ControllerManager)
            .unwrap_err();
        assert!(
            e.contains("sizes.small.controller-manager.goMemLimit \"600Mi\" exceeds resources.limits.memory"),
            "{e}"
        );
        let e = size("resources: {requests: {cpu: lots}}")
            .check("small", ComponentKind::Etcd)
            .unwrap_err();
        assert!(e.contains("sizes.small.etcd.resources.requests.cpu \"lots\""), "{e}");
        let e = size("extraArgs: {\"--v\": \"2\"}")
            .check("small", ComponentKind::ApiServer)
            .unwrap_err();
        assert!(
            e.contains("sizes.small.apiserver.extraArgs key \"--v\" is not a flag name"),
            "{e}"
        );
        for bad in ["", "a=b", "a b"] {
            let yaml = format!("extraArgs: {{{bad:?}: x}}");
            assert!(size(&yaml).check("s", ComponentKind::Etcd).is_err(), "{yaml}");
        }
        assert_eq!(
            size("extraArgs: {snapshot-count: \"5000\"}").check("s", ComponentKind::Etcd),
            Ok(())
        );
        for bad in ["goGC: 0", "quotaBackendBytes: 0", "goMemLimit: -1Mi"] {
            assert!(size(bad).check("s", ComponentKind::Etcd).is_err(), "{bad}");
        }
    }
}
