//! Which release a component should run, and the version rules that guard every change
//! (docs/design.md §5; Kubernetes' version skew policy; kubeadm's upgrade rules).

use semver::Version;

use super::{ClusterSettings, PlanError};
use crate::api::ComponentSpec;
use crate::channel::{Channel, ChannelError, ChannelRegistry, DEFAULT_CHANNEL, RequestedVersion, Size};
use crate::component::ComponentKind;

/// A component's resolved channel and release.
#[derive(Clone, Debug)]
pub struct Resolved<'a> {
    pub channel: &'a Channel,
    pub version: Version,
    /// The control plane's Kubernetes release (what etcd's default and compatibility follow).
    pub kubernetes: Version,
    /// The component's size and what the channel sets for it; `None` when the channel has
    /// no sizes.
    pub size: Option<(&'a str, &'a Size)>,
}

/// Resolves the channel, release and size of a component (docs/design.md §3): the
/// component's own `channel`/`version`/`size`, else the control plane's, else the channel
/// defaults; etcd's default release follows the control plane's Kubernetes minor.
///
/// # Errors
/// [`PlanError::Channel`] for an unknown channel, version or size.
pub fn resolve<'a>(
    channels: &'a ChannelRegistry,
    cluster: &ClusterSettings,
    kind: ComponentKind,
    spec: &ComponentSpec,
) -> Result<Resolved<'a>, PlanError> {
    let channel_name = spec
        .channel
        .as_deref()
        .or(cluster.channel.as_deref())
        .filter(|c| !c.is_empty())
        .unwrap_or(DEFAULT_CHANNEL);
    let channel = channels.get(channel_name)?;
    let kubernetes = kubernetes_release(channel, cluster)?;
    let own = spec.version.as_deref().filter(|v| !v.trim().is_empty());
    let version = match (kind, own) {
        (ComponentKind::Etcd, _) => channel.resolve(kind, own, Some(&kubernetes))?,
        (_, Some(v)) => channel.resolve(kind, Some(v), None)?,
        (_, None) => channel.resolve(kind, Some(&kubernetes.to_string()), None)?,
    };
    let size = channel.resolve_size(
        spec.size
            .as_deref()
            .filter(|s| !s.trim().is_empty())
            .or(cluster.size.as_deref()),
    )?;
    Ok(Resolved {
        channel,
        version,
        kubernetes,
        size,
    })
}

/// The control plane's Kubernetes release as the component's channel sees it. A channel that
/// carries no apiserver (say, an etcd-only provider channel) takes the requested release
/// literally, missing parts as 0, so that etcd can still follow the Kubernetes minor.
fn kubernetes_release(channel: &Channel, cluster: &ClusterSettings) -> Result<Version, PlanError> {
    if !channel.versions(ComponentKind::ApiServer).is_empty() {
        return Ok(channel.resolve(ComponentKind::ApiServer, cluster.kubernetes_version.as_deref(), None)?);
    }
    let wanted = cluster
        .kubernetes_version
        .as_deref()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or(&channel.index.defaults.kubernetes);
    let r = RequestedVersion::parse(wanted).ok_or_else(|| ChannelError::InvalidVersion {
        component: ComponentKind::ApiServer,
        requested: wanted.to_string(),
    })?;
    Ok(Version::new(r.major, r.minor.unwrap_or(0), r.patch.unwrap_or(0)))
}

/// A change of release that capn refuses. Terminal: running workloads stay as they are
/// until the spec changes.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum SkewError {
    #[error("{component} cannot go from {from} to {to}: upgrades go one minor at a time (next allowed: {next})")]
    SkippedMinor {
        component: ComponentKind,
        from: Version,
        to: Version,
        next: String,
    },
    #[error(
        "{component} cannot be downgraded from {from} to {to}: a minor downgrade is not supported; patch downgrades within {from_minor} are"
    )]
    MinorDowngrade {
        component: ComponentKind,
        from: Version,
        to: Version,
        from_minor: String,
    },
    #[error(
        "controller-manager {controller_manager} would be newer than the apiserver {apiserver}; the controller-manager may not be newer than the apiserver"
    )]
    ControllerManagerNewer {
        controller_manager: Version,
        apiserver: Version,
    },
    #[error(
        "apiserver {apiserver} would be more than one minor ahead of the controller-manager {controller_manager}; upgrade the controller-manager first or one minor at a time"
    )]
    ApiServerTooFarAhead {
        apiserver: Version,
        controller_manager: Version,
    },
    #[error(
        "etcd has {from} members and cannot change to {to}: channel {channel} does not declare membership changes for its etcd provider (channel.yaml components.etcd.capabilities.membershipChanges); keep replicas at {from}"
    )]
    EtcdMembershipChange { from: i32, to: i32, channel: String },
    #[error("etcd {etcd} is not compatible with Kubernetes {kubernetes} in channel {channel}; allowed etcd minors: {}", allowed.join(", "))]
    IncompatibleEtcd {
        etcd: Version,
        kubernetes: String,
        channel: String,
        allowed: Vec<String>,
    },
}

impl SkewError {
    /// Short stable reason, used as condition reason, Event reason and metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::SkippedMinor { .. } | Self::MinorDowngrade { .. } => "UpgradeNotAllowed",
            Self::ControllerManagerNewer { .. } | Self::ApiServerTooFarAhead { .. } => "SkewNotAllowed",
            Self::IncompatibleEtcd { .. } => "IncompatibleEtcd",
            Self::EtcdMembershipChange { .. } => "EtcdMembershipChangeNotSupported",
        }
    }
}

/// What is running now, as the components report it in their status.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Running {
    /// The component's own running release (`status.version`).
    pub current: Option<Version>,
    /// The apiserver's running release (checked for the controller-manager, and for etcd,
    /// which must not start an upgrade the apiserver would refuse).
    pub apiserver: Option<Version>,
    /// etcd only: the member count applied before (`status.replicas`), if any.
    pub etcd_members: Option<i32>,
    /// The controller-manager's running release (checked for the apiserver).
    pub controller_manager: Option<Version>,
}

fn minor(v: &Version) -> (u64, u64) {
    (v.major, v.minor)
}

/// Refuses a member count change of an etcd that was applied before when the channel's
/// provider does not declare `capabilities.membershipChanges`: only a
/// provider whose templates start members from capn's membership ConfigMap can have members
/// added and removed through etcd's member API.
///
/// # Errors
/// [`SkewError::EtcdMembershipChange`].
pub fn check_members(
    kind: ComponentKind,
    desired_replicas: i32,
    running: &Running,
    resolved: &Resolved<'_>,
) -> Result<(), SkewError> {
    let supported = resolved
        .channel
        .component(kind)
        .is_some_and(|c| c.capabilities.membership_changes);
    match running.etcd_members {
        Some(from) if kind == ComponentKind::Etcd && from != desired_replicas && !supported => {
            Err(SkewError::EtcdMembershipChange {
                from,
                to: desired_replicas,
                channel: resolved.channel.name.clone(),
            })
        }
        _ => Ok(()),
    }
}

/// Checks a component's desired release against what runs:
/// - from the running release: at most one minor up, never a minor down;
/// - controller-manager: never a newer minor than the running apiserver;
/// - apiserver: at most one minor ahead of the running controller-manager;
/// - etcd: a minor the channel lists as compatible with the Kubernetes minor.
///
/// # Errors
/// The first rule broken, as [`SkewError`].
pub fn check(kind: ComponentKind, resolved: &Resolved<'_>, running: &Running) -> Result<(), SkewError> {
    let desired = &resolved.version;
    if let Some(current) = &running.current {
        let (cur, want) = (minor(current), minor(desired));
        if want.0 == cur.0 && want.1 > cur.1 + 1 || want.0 > cur.0 {
            return Err(SkewError::SkippedMinor {
                component: kind,
                from: current.clone(),
                to: desired.clone(),
                next: format!("{}.{}", cur.0, cur.1 + 1),
            });
        }
        if want < cur {
            return Err(SkewError::MinorDowngrade {
                component: kind,
                from: current.clone(),
                to: desired.clone(),
                from_minor: format!("{}.{}", cur.0, cur.1),
            });
        }
    }
    match kind {
        ComponentKind::ControllerManager => {
            if let Some(api) = &running.apiserver
                && minor(desired) > minor(api)
            {
                return Err(SkewError::ControllerManagerNewer {
                    controller_manager: desired.clone(),
                    apiserver: api.clone(),
                });
            }
        }
        ComponentKind::ApiServer => {
            if let Some(cm) = &running.controller_manager
                && (minor(desired).0 > minor(cm).0 || minor(desired).1 > minor(cm).1 + 1)
            {
                return Err(SkewError::ApiServerTooFarAhead {
                    apiserver: desired.clone(),
                    controller_manager: cm.clone(),
                });
            }
        }
        ComponentKind::Etcd => {
            // etcd moves first in an upgrade: it must not start one the apiserver will refuse.
            if let Some(api) = &running.apiserver {
                let (cur, want) = (minor(api), minor(&resolved.kubernetes));
                if want.0 > cur.0 || want.1 > cur.1 + 1 || want < cur {
                    let next = format!("{}.{}", cur.0, cur.1 + 1);
                    return Err(if want < cur {
                        SkewError::MinorDowngrade {
                            component: ComponentKind::ApiServer,
                            from: api.clone(),
                            to: resolved.kubernetes.clone(),
                            from_minor: format!("{}.{}", cur.0, cur.1),
                        }
                    } else {
                        SkewError::SkippedMinor {
                            component: ComponentKind::ApiServer,
                            from: api.clone(),
                            to: resolved.kubernetes.clone(),
                            next,
                        }
                    });
                }
            }
            if let Some(compat) = resolved.channel.index.etcd_for(&resolved.kubernetes)
                && !compat.etcd_minors.is_empty()
                && !compat
                    .etcd_minors
                    .iter()
                    .any(|m| *m == format!("{}.{}", desired.major, desired.minor))
            {
                return Err(SkewError::IncompatibleEtcd {
                    etcd: desired.clone(),
                    kubernetes: compat.kubernetes.clone(),
                    channel: resolved.channel.name.clone(),
                    allowed: compat.etcd_minors.clone(),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{DEFAULT_DNS_DOMAIN, DEFAULT_IMAGE_REPOSITORY, DEFAULT_SERVICE_CIDR};

    fn cluster(version: &str) -> ClusterSettings {
        ClusterSettings {
            name: "c".into(),
            namespace: "ns".into(),
            kubernetes_version: Some(version.into()),
            channel: None,
            size: None,
            image_repository: DEFAULT_IMAGE_REPOSITORY.into(),
            service_cidr: DEFAULT_SERVICE_CIDR.into(),
            dns_domain: DEFAULT_DNS_DOMAIN.into(),
            super_dns_domain: DEFAULT_DNS_DOMAIN.into(),
            network_policy: Default::default(),
            kms_endpoints: Vec::new(),
        }
    }

    fn v(s: &str) -> Option<Version> {
        Some(Version::parse(s).unwrap())
    }

    fn outcome(
        kind: ComponentKind,
        ncp_version: &str,
        own: Option<&str>,
        running: Running,
    ) -> Result<String, &'static str> {
        let channels = ChannelRegistry::load(&[]).unwrap();
        let spec = ComponentSpec {
            version: own.map(str::to_string),
            ..Default::default()
        };
        let resolved = resolve(&channels, &cluster(ncp_version), kind, &spec).map_err(|e| e.reason())?;
        check(kind, &resolved, &running).map_err(|e| e.reason())?;
        Ok(resolved.version.to_string())
    }

    #[test]
    fn stable_versions_follow_the_control_plane_and_kubeadm_etcd_table() {
        let none = Running::default;
        assert_eq!(
            outcome(ComponentKind::ApiServer, "1.35", None, none()),
            Ok("1.35.4".into())
        );
        assert_eq!(
            outcome(ComponentKind::ControllerManager, "1.37", None, none()),
            Ok("1.37.2".into())
        );
        assert_eq!(outcome(ComponentKind::Etcd, "1.36", None, none()), Ok("3.6.8".into()));
        assert_eq!(outcome(ComponentKind::Etcd, "1.37", None, none()), Ok("3.7.0".into()));
        assert_eq!(
            outcome(ComponentKind::Etcd, "v1.35.4", None, none()),
            Ok("3.6.8".into())
        );
    }

    #[test]
    fn refusal_table() {
        let running =
            |current: Option<Version>, apiserver: Option<Version>, controller_manager: Option<Version>| Running {
                current,
                apiserver,
                controller_manager,
                etcd_members: None,
            };
        let cases = [
            (
                "one minor up",
                ComponentKind::ApiServer,
                "1.37",
                None,
                running(v("1.36.3"), None, v("1.36.3")),
                Ok("1.37.2"),
            ),
            (
                "patch only",
                ComponentKind::ApiServer,
                "1.36",
                None,
                running(v("1.36.1"), None, None),
                Ok("1.36.3"),
            ),
            (
                "patch downgrade",
                ComponentKind::ApiServer,
                "1.36",
                None,
                running(v("1.36.9"), None, None),
                Ok("1.36.3"),
            ),
            (
                "skip a minor",
                ComponentKind::ApiServer,
                "1.37",
                None,
                running(v("1.35.4"), None, None),
                Err("UpgradeNotAllowed"),
            ),
            (
                "minor downgrade",
                ComponentKind::ApiServer,
                "1.35",
                None,
                running(v("1.36.3"), None, None),
                Err("UpgradeNotAllowed"),
            ),
            (
                "etcd minor downgrade",
                ComponentKind::Etcd,
                "1.36",
                None,
                running(v("3.7.0"), None, None),
                Err("UpgradeNotAllowed"),
            ),
            (
                "cm newer than apiserver",
                ComponentKind::ControllerManager,
                "1.37",
                None,
                running(v("1.36.3"), v("1.36.3"), None),
                Err("SkewNotAllowed"),
            ),
            (
                "cm equal to apiserver",
                ComponentKind::ControllerManager,
                "1.37",
                None,
                running(v("1.36.3"), v("1.37.2"), None),
                Ok("1.37.2"),
            ),
            (
                "apiserver two minors ahead of cm",
                ComponentKind::ApiServer,
                "1.37",
                None,
                running(v("1.36.3"), None, v("1.35.4")),
                Err("SkewNotAllowed"),
            ),
            (
                "apiserver one minor ahead of cm",
                ComponentKind::ApiServer,
                "1.37",
                None,
                running(v("1.36.3"), None, v("1.36.3")),
                Ok("1.37.2"),
            ),
            (
                "etcd incompatible with 1.36",
                ComponentKind::Etcd,
                "1.36",
                Some("3.5"),
                Running::default(),
                Err("UnknownVersion"),
            ),
            (
                "etcd 3.7 allowed with 1.36",
                ComponentKind::Etcd,
                "1.36",
                Some("3.7"),
                Running::default(),
                Ok("3.7.0"),
            ),
        ];
        for (name, kind, ncp, own, running, want) in cases {
            let got = outcome(kind, ncp, own, running);
            assert_eq!(got, want.map(str::to_string), "{name}");
        }
    }

    #[test]
    fn an_applied_etcd_keeps_its_member_count_unless_the_channel_supports_changes() {
        let running = Running {
            etcd_members: Some(3),
            ..Running::default()
        };
        // A provider that does not declare `capabilities.membershipChanges`.
        let files = vec![
            (
                "channel.yaml".to_string(),
                "name: t\ncomponents:\n  etcd:\n    versions: [\"3.6.8\"]\ndefaults:\n  kubernetes: \"1.36.3\"\ncompatibility:\n  - kubernetes: \"1.36\"\n    etcd: \"3.6.8\"\n".to_string(),
            ),
            ("3.6.8/etcd/a.yaml".to_string(), "kind: ConfigMap".to_string()),
        ];
        let mut channels = ChannelRegistry::load(&[]).unwrap();
        channels.insert(Channel::from_files("t", "test", files).unwrap());
        let mut c = cluster("1.36");
        c.channel = Some("t".into());
        let spec = ComponentSpec::default();
        let other = resolve(&channels, &c, ComponentKind::Etcd, &spec).unwrap();
        assert_eq!(check_members(ComponentKind::Etcd, 3, &running, &other), Ok(()));
        let err = check_members(ComponentKind::Etcd, 5, &running, &other).unwrap_err();
        assert_eq!(err.reason(), "EtcdMembershipChangeNotSupported");
        assert!(err.to_string().contains("keep replicas at 3"), "{err}");
        assert!(err.to_string().contains("channel t "), "{err}");
        assert_eq!(
            check_members(ComponentKind::Etcd, 5, &Running::default(), &other),
            Ok(()),
            "a new etcd may have any size"
        );
        // A provider that declares membership changes: capn changes the members.
        let files = vec![
            (
                "channel.yaml".to_string(),
                "name: u\ncomponents:\n  etcd:\n    versions: [\"3.6.8\"]\n    capabilities: {membershipChanges: true}\ndefaults:\n  kubernetes: \"1.36.3\"\ncompatibility:\n  - kubernetes: \"1.36\"\n    etcd: \"3.6.8\"\n".to_string(),
            ),
            ("3.6.8/etcd/a.yaml".to_string(), "kind: ConfigMap".to_string()),
        ];
        channels.insert(Channel::from_files("u", "test", files).unwrap());
        c.channel = Some("u".into());
        let declared = resolve(&channels, &c, ComponentKind::Etcd, &spec).unwrap();
        assert_eq!(check_members(ComponentKind::Etcd, 5, &running, &declared), Ok(()));
        assert_eq!(check_members(ComponentKind::Etcd, 1, &running, &declared), Ok(()));
    }

    #[test]
    fn etcd_outside_the_minors_a_kubernetes_minor_allows_is_refused() {
        let files = vec![
            (
                "channel.yaml".to_string(),
                "name: t\ncomponents:\n  etcd:\n    versions: [\"3.5.21\", \"3.6.8\"]\n  apiserver:\n    versions: [\"1.36.3\"]\ndefaults:\n  kubernetes: \"1.36.3\"\ncompatibility:\n  - kubernetes: \"1.36\"\n    etcd: \"3.6.8\"\n    etcdMinors: [\"3.6\"]\n".to_string(),
            ),
            ("3.5.21/etcd/a.yaml".to_string(), "kind: ConfigMap".to_string()),
            ("3.6.8/etcd/a.yaml".to_string(), "kind: ConfigMap".to_string()),
            ("1.36.3/apiserver/a.yaml".to_string(), "kind: ConfigMap".to_string()),
        ];
        let mut channels = ChannelRegistry::default();
        channels.insert(Channel::from_files("t", "test", files).unwrap());
        let mut c = cluster("1.36");
        c.channel = Some("t".into());
        let spec = ComponentSpec {
            version: Some("3.5".into()),
            ..Default::default()
        };
        let resolved = resolve(&channels, &c, ComponentKind::Etcd, &spec).unwrap();
        let err = check(ComponentKind::Etcd, &resolved, &Running::default()).unwrap_err();
        assert_eq!(err.reason(), "IncompatibleEtcd");
        assert!(err.to_string().contains("3.6"), "{err}");
    }
}
