//! Errors of channel loading and version resolution.

use crate::component::ComponentKind;

/// What went wrong finding a channel, a release in it, or loading it. All variants are
/// terminal for a reconcile: they describe input (a spec or a channel) that must change.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum ChannelError {
    #[error("channel {requested:?} does not exist; available channels: {}", available.join(", "))]
    UnknownChannel { requested: String, available: Vec<String> },
    #[error("{component} version {requested:?} is not in channel {channel:?}; available: {}", available.join(", "))]
    UnknownVersion {
        channel: String,
        component: ComponentKind,
        requested: String,
        available: Vec<String>,
    },
    #[error(
        "{component} version {requested:?} is not a version; use major.minor.patch (1.36.3), major.minor (1.36), optionally with a leading v"
    )]
    InvalidVersion {
        component: ComponentKind,
        requested: String,
    },
    #[error("channel {channel:?} names no etcd for Kubernetes {kubernetes}; it knows Kubernetes {}", known.join(", "))]
    NoEtcdForKubernetes {
        channel: String,
        kubernetes: String,
        known: Vec<String>,
    },
    /// `spec.size` names a size the channel does not define. CEL cannot know a channel's
    /// sizes, so this is the controllers' and `capn render`'s refusal.
    #[error("{}", unknown_size_message(channel, requested, available))]
    UnknownSize {
        channel: String,
        requested: String,
        available: Vec<String>,
    },
    #[error("channel {channel:?} is invalid: {message}")]
    InvalidChannel { channel: String, message: String },
}

impl ChannelError {
    /// Short stable reason, used as condition reason, Event reason and metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::UnknownChannel { .. } => "UnknownChannel",
            Self::UnknownVersion { .. } => "UnknownVersion",
            Self::InvalidVersion { .. } => "InvalidVersion",
            Self::NoEtcdForKubernetes { .. } => "UnknownVersion",
            Self::InvalidChannel { .. } => "InvalidChannel",
            Self::UnknownSize { .. } => "UnknownSize",
        }
    }
}

fn unknown_size_message(channel: &str, requested: &str, available: &[String]) -> String {
    if available.is_empty() {
        format!(
            "size {requested:?} is not in channel {channel:?}, which defines no sizes; leave spec.size empty for this component's channel"
        )
    } else {
        format!(
            "size {requested:?} is not in channel {channel:?}; available: {}",
            available.join(", ")
        )
    }
}
