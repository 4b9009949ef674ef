//! The three components of a nested control plane and the names derived from them.

use std::fmt;

/// One of the components a nested control plane is made of (docs/design.md §1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ComponentKind {
    Etcd,
    ApiServer,
    ControllerManager,
}

impl ComponentKind {
    /// All components, in the order they come up (etcd → apiserver → controller-manager).
    pub const ALL: [ComponentKind; 3] = [Self::Etcd, Self::ApiServer, Self::ControllerManager];

    /// The component's name in channels, labels and object names: `etcd`, `apiserver`,
    /// `controller-manager`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Etcd => "etcd",
            Self::ApiServer => "apiserver",
            Self::ControllerManager => "controller-manager",
        }
    }

    /// Parses the channel name of a component.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// The custom resource kind that describes this component.
    pub fn resource_kind(self) -> &'static str {
        match self {
            Self::Etcd => "NestedEtcd",
            Self::ApiServer => "NestedAPIServer",
            Self::ControllerManager => "NestedControllerManager",
        }
    }

    /// Name of the component's workload objects for cluster `cluster` (`<c>-etcd`,
    /// `<c>-apiserver`, `<c>-controller-manager`; docs/reference.md).
    pub fn object_name(self, cluster: &str) -> String {
        format!("{cluster}-{}", self.as_str())
    }
}

impl fmt::Display for ComponentKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
