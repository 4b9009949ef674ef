//! `channel.yaml`: the index of a channel.

use std::collections::BTreeMap;

use semver::Version;
use serde::{Deserialize, Serialize};

use super::{ChannelError, RequestedVersion};

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
}

/// The releases a channel carries for one component.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ComponentVersions {
    pub versions: Vec<String>,
}

/// Channel-wide defaults.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Defaults {
    /// Kubernetes release for the apiserver and controller-manager when none is requested.
    pub kubernetes: String,
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
        Ok(())
    }
}
