//! `channel.yaml`: the index of a channel.

use std::collections::BTreeMap;

use semver::Version;
use serde::{Deserialize, Serialize};

use super::size::{Size, is_size_name};
use super::{ChannelError, RequestedVersion};
use crate::component::ComponentKind;

/// The parsed `channel.yaml` of a channel.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChannelIndex {
    /// Must equal the channel's directory name.
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Releases per component (`etcd`, `apiserver`, `controller-manager`).
    pub components: BTreeMap<String, ComponentVersions>,
    pub defaults: Defaults,
    /// Which etcd each Kubernetes minor runs with.
    #[serde(default)]
    pub compatibility: Vec<Compatibility>,
    /// Named sizes (`small`, `medium`, ...): what a control plane of each size runs with
    /// (docs/guide/sizes.md). A channel with sizes names its default in `defaults.size`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sizes: BTreeMap<String, Size>,
}

/// The releases a channel carries for one component, and how a provider other than the
/// native StatefulSets reports readiness and outputs.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ComponentVersions {
    pub versions: Vec<String>,
    /// The rendered objects whose readiness is the component's. Default: the workloads
    /// (StatefulSets, Deployments) by the built-in rules (docs/design.md §5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness: Option<ReadinessSource>,
    /// etcd only: where the client URLs the apiserver dials are published. Default: one
    /// URL per native member (`https://<c>-etcd-<i>.<c>-etcd.<ns>.svc:2379`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<EndpointsSource>,
    /// Secrets (by their key in the render context's `secrets`, e.g. `apiserver`) whose
    /// content the component's processes reload by themselves. A change of any other Secret
    /// the pod templates mount rolls the component (docs/design.md §9). Default: none, so every
    /// mounted Secret rolls it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reloaded_secrets: Vec<String>,
    /// etcd only: the day-2 operations capn may perform on this provider's etcd. Default:
    /// none, because capn cannot know that another provider's templates take their member
    /// list from capn (membership) or that capn may reach its members (backups).
    #[serde(default, skip_serializing_if = "Capabilities::is_none")]
    pub capabilities: Capabilities,
}

/// What capn may do to a running etcd of a channel's provider.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Capabilities {
    /// Members are added and removed through etcd's member API (learners, one at a time),
    /// and the templates start each member from the `<c>-etcd-membership` ConfigMap.
    #[serde(default)]
    pub membership_changes: bool,
    /// capn takes snapshots through etcd's maintenance API and may restore from them.
    #[serde(default)]
    pub backups: bool,
}

impl Capabilities {
    /// Neither capability (the default).
    pub fn is_none(&self) -> bool {
        *self == Self::default()
    }
}

/// Which rendered objects decide a component's readiness: every object of `kind` must be
/// ready by its `Ready`/`Available` condition (or the built-in rule for known kinds).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReadinessSource {
    pub kind: String,
}

/// A list of URLs read from a rendered object as the API server returns it.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EndpointsSource {
    /// Kind of the rendered object (the first one of that kind is read).
    pub kind: String,
    /// RFC 6901 JSON pointer to an array of strings, e.g. `/status/clientURLs`.
    pub pointer: String,
}

/// Channel-wide defaults.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Defaults {
    /// Kubernetes release for the apiserver and controller-manager when none is requested.
    pub kubernetes: String,
    /// The size a component runs with when neither it nor its control plane names one: a
    /// key of `sizes`, required when there are sizes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,
}

/// The etcd a Kubernetes minor runs with.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Compatibility {
    /// Kubernetes `major.minor`.
    pub kubernetes: String,
    /// Default etcd release for that minor.
    pub etcd: String,
    /// etcd `major.minor`s that minor may run with.
    #[serde(default)]
    pub etcd_minors: Vec<String>,
}

impl ChannelIndex {
    /// The compatibility entry for the minor of `kubernetes`.
    pub fn etcd_for(&self, kubernetes: &Version) -> Option<&Compatibility> {
        self.compatibility.iter().find(|c| {
            RequestedVersion::parse(&c.kubernetes).is_some_and(|r| r.minor.is_some() && r.matches(kubernetes))
        })
    }

    /// Consistency checks beyond the schema.
    pub(super) fn check(&self, dir_name: &str) -> Result<(), ChannelError> {
        let invalid = |message: String| ChannelError::InvalidChannel {
            channel: dir_name.to_string(),
            message,
        };
        if self.name != dir_name {
            return Err(invalid(format!(
                "channel.yaml says name {:?} but the directory is {dir_name:?}",
                self.name
            )));
        }
        for c in &self.compatibility {
            match RequestedVersion::parse(&c.kubernetes) {
                Some(r) if r.minor.is_some() && r.patch.is_none() => {}
                _ => {
                    return Err(invalid(format!(
                        "compatibility kubernetes {:?} must be major.minor",
                        c.kubernetes
                    )));
                }
            }
        }
        self.check_sizes().map_err(invalid)
    }

    /// The sizes: names that `spec.size` can hold, a default among them, and each
    /// component's settings ([`super::ComponentSize`]).
    fn check_sizes(&self) -> Result<(), String> {
        let names = || self.sizes.keys().cloned().collect::<Vec<_>>().join(", ");
        for (name, size) in &self.sizes {
            if !is_size_name(name) {
                return Err(format!(
                    "size name {name:?} must be a DNS label (lower-case letters, digits and '-', at most 63 characters), as spec.size holds it"
                ));
            }
            for kind in [
                ComponentKind::Etcd,
                ComponentKind::ApiServer,
                ComponentKind::ControllerManager,
            ] {
                if let Some(settings) = size.component(kind) {
                    settings.check(name, kind)?;
                }
            }
        }
        match (&self.defaults.size, self.sizes.is_empty()) {
            (None, false) => Err(format!(
                "defaults.size is missing: a channel with sizes names the one a control plane gets without asking (one of: {})",
                names()
            )),
            (Some(size), true) => Err(format!(
                "defaults.size {size:?} names a size, but the channel has no sizes (channel.yaml sizes)"
            )),
            (Some(size), false) if !self.sizes.contains_key(size) => Err(format!(
                "defaults.size {size:?} is not one of the channel's sizes: {}",
                names()
            )),
            _ => Ok(()),
        }
    }
}
