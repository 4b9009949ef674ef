//! The upgrade path planner: from the Kubernetes release a control plane runs to
//! the one its spec asks for, through every intermediate minor the channel carries.
//!
//! Pure: channel contents, running releases and the request in; ordered steps or a refusal
//! out. The rules come from Kubernetes' version skew policy
//! (<https://kubernetes.io/releases/version-skew-policy/>: the apiserver moves one minor at
//! a time, the controller-manager follows) and kubeadm's upgrade rules (one minor per
//! `kubeadm upgrade apply`, no minor downgrade); etcd follows kubeadm's
//! `SupportedEtcdVersion` table, which is the channel's `compatibility` (docs/design.md §3).

use semver::Version;

use crate::channel::{Channel, ChannelError, RequestedVersion, minor_of};
use crate::component::ComponentKind;

/// One step of an upgrade path: the Kubernetes release the apiserver and the
/// controller-manager move to, and the etcd release that runs with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// Kubernetes release of this step (the highest patch of its minor the channel carries,
    /// or the requested release on the last step).
    pub kubernetes: Version,
    /// etcd release during and after this step.
    pub etcd: Version,
    /// Whether etcd moves in this step (its release differs from the one before).
    pub etcd_changes: bool,
}

/// An ordered upgrade path. Empty `steps`: the control plane already runs the target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpgradePath {
    /// The Kubernetes release the path starts from (what runs).
    pub from: Version,
    /// The etcd release running at the start.
    pub from_etcd: Option<Version>,
    /// The Kubernetes release the spec asks for, resolved in the channel.
    pub target: Version,
    pub steps: Vec<Step>,
}

impl UpgradePath {
    /// `1.35.4 → 1.36.3 → 1.37.2 (etcd 3.6.8 → 3.7.0)`: the path in one line, for status
    /// messages, Events and `capn render --upgrade-path`.
    pub fn summary(&self) -> String {
        let mut text = self.from.to_string();
        for s in &self.steps {
            text.push_str(&format!(" → {}", s.kubernetes));
        }
        let etcds: Vec<String> = self
            .from_etcd
            .iter()
            .chain(self.steps.iter().filter(|s| s.etcd_changes).map(|s| &s.etcd))
            .map(Version::to_string)
            .collect();
        if etcds.len() > 1 {
            text.push_str(&format!(" (etcd {})", etcds.join(" → ")));
        }
        text
    }
}

/// What the running control plane is made of, as its components report it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunningReleases {
    /// The lowest Kubernetes release among the apiserver and the controller-manager (a step
    /// is done only when both run it, so the path starts from the one behind).
    pub kubernetes: Option<Version>,
    /// The etcd release running.
    pub etcd: Option<Version>,
}

/// Why no path can be planned. Terminal: nothing moves until the spec (or the channel)
/// changes.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum PathError {
    #[error(
        "cannot upgrade from {from} to {to}: channel {channel:?} carries no Kubernetes {missing}, and upgrades pass through every minor (carried: {})",
        available.join(", ")
    )]
    MissingMinor {
        from: String,
        to: String,
        missing: String,
        channel: String,
        available: Vec<String>,
    },
    #[error(
        "cannot go from Kubernetes {from} to {to}: a downgrade to an older minor is not supported (kubeadm and the version skew policy allow none); ask for {from_minor} or newer"
    )]
    Downgrade {
        from: String,
        to: String,
        from_minor: String,
    },
    #[error(
        "cannot upgrade from Kubernetes {from} to {to}: the major version changes; capn upgrades within one major only"
    )]
    MajorChange { from: String, to: String },
    #[error(
        "step to Kubernetes {kubernetes} would take etcd from {from} down to {to}; etcd minors never go back: pin the NestedEtcd's version to {from_minor} or newer"
    )]
    EtcdDowngrade {
        kubernetes: String,
        from: String,
        to: String,
        from_minor: String,
    },
    #[error(
        "etcd {etcd} (pinned on the NestedEtcd) is not allowed with Kubernetes {kubernetes} in channel {channel:?}; allowed etcd minors: {}",
        allowed.join(", ")
    )]
    IncompatibleEtcd {
        etcd: String,
        kubernetes: String,
        channel: String,
        allowed: Vec<String>,
    },
    #[error(transparent)]
    Channel(#[from] ChannelError),
}

impl PathError {
    /// Short stable reason, used as condition reason, Event reason and metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::MissingMinor { .. } | Self::Downgrade { .. } | Self::MajorChange { .. } => "UpgradeNotAllowed",
            Self::EtcdDowngrade { .. } | Self::IncompatibleEtcd { .. } => "IncompatibleEtcd",
            Self::Channel(e) => e.reason(),
        }
    }
}

/// Plans the path from `running` to `requested` (a NestedControlPlane `spec.version`:
/// exact, `major.minor` or empty for the channel default) in `channel`.
///
/// - Each intermediate minor gets one step at the highest patch the channel carries; the
///   last step is the requested release. A patch change within the running minor (up or
///   down, as kubeadm allows) is one step.
/// - etcd in each step is `pinned_etcd` (the NestedEtcd's own `version`) when set, which
///   must be allowed with every step's minor; otherwise the channel's default for the
///   step's minor, which must never be an older etcd minor than the one before.
///
/// # Errors
/// [`PathError::MissingMinor`] naming the first minor the channel lacks;
/// [`PathError::Downgrade`] for an older minor; [`PathError::MajorChange`];
/// [`PathError::EtcdDowngrade`], [`PathError::IncompatibleEtcd`]; [`PathError::Channel`]
/// for an unknown or invalid requested release.
pub fn plan_path(
    channel: &Channel,
    running: &RunningReleases,
    requested: Option<&str>,
    pinned_etcd: Option<&str>,
) -> Result<UpgradePath, PathError> {
    let target = channel.resolve(ComponentKind::ApiServer, requested, None)?;
    let Some(from) = running.kubernetes.clone() else {
        // Nothing runs yet: the components come up on the target directly.
        return Ok(UpgradePath {
            from_etcd: running.etcd.clone(),
            from: target.clone(),
            target,
            steps: Vec::new(),
        });
    };
    let (cur, want) = (minor_of(&from), minor_of(&target));
    if want.0 != cur.0 {
        return Err(if want < cur {
            PathError::Downgrade {
                from_minor: format!("{}.{}", cur.0, cur.1),
                from: from.to_string(),
                to: target.to_string(),
            }
        } else {
            PathError::MajorChange {
                from: from.to_string(),
                to: target.to_string(),
            }
        });
    }
    if want.1 < cur.1 {
        return Err(PathError::Downgrade {
            from_minor: format!("{}.{}", cur.0, cur.1),
            from: from.to_string(),
            to: target.to_string(),
        });
    }
    let mut releases = Vec::new();
    for minor in cur.1 + 1..want.1 {
        let request = RequestedVersion {
            major: cur.0,
            minor: Some(minor),
            patch: None,
        };
        let highest = channel
            .versions(ComponentKind::ApiServer)
            .into_iter()
            .rev()
            .find(|v| request.matches(v))
            .cloned()
            .ok_or_else(|| PathError::MissingMinor {
                from: from.to_string(),
                to: target.to_string(),
                missing: format!("{}.{minor}", cur.0),
                channel: channel.name.clone(),
                available: channel
                    .versions(ComponentKind::ApiServer)
                    .iter()
                    .map(|v| v.to_string())
                    .collect(),
            })?;
        releases.push(highest);
    }
    if target != from {
        releases.push(target.clone());
    }
    let pinned = pinned_etcd
        .filter(|v| !v.trim().is_empty())
        .map(|v| channel.resolve(ComponentKind::Etcd, Some(v), None))
        .transpose()?;
    let mut etcd_before = running.etcd.clone();
    let mut steps = Vec::with_capacity(releases.len());
    for kubernetes in releases {
        let etcd = match &pinned {
            Some(p) => {
                if let Some(compat) = channel.index.etcd_for(&kubernetes)
                    && !compat.etcd_minors.is_empty()
                    && !compat.etcd_minors.contains(&format!("{}.{}", p.major, p.minor))
                {
                    return Err(PathError::IncompatibleEtcd {
                        etcd: p.to_string(),
                        kubernetes: kubernetes.to_string(),
                        channel: channel.name.clone(),
                        allowed: compat.etcd_minors.clone(),
                    });
                }
                p.clone()
            }
            None => channel.resolve(ComponentKind::Etcd, None, Some(&kubernetes))?,
        };
        if let Some(before) = &etcd_before
            && minor_of(&etcd) < minor_of(before)
        {
            return Err(PathError::EtcdDowngrade {
                kubernetes: kubernetes.to_string(),
                from: before.to_string(),
                to: etcd.to_string(),
                from_minor: format!("{}.{}", before.major, before.minor),
            });
        }
        let etcd_changes = etcd_before.as_ref() != Some(&etcd);
        etcd_before = Some(etcd.clone());
        steps.push(Step {
            kubernetes,
            etcd,
            etcd_changes,
        });
    }
    Ok(UpgradePath {
        from,
        from_etcd: running.etcd.clone(),
        target,
        steps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A channel with these apiserver releases (the controller-manager carries the same),
    /// etcd 3.6.8 and 3.7.0, and kubeadm's table for 1.35–1.38.
    fn channel(kubernetes: &[&str]) -> Channel {
        let quoted = |vs: &[&str]| vs.iter().map(|v| format!("\"{v}\"")).collect::<Vec<_>>().join(", ");
        let index = format!(
            "name: t\ncomponents:\n  etcd:\n    versions: [\"3.6.8\", \"3.7.0\"]\n  apiserver:\n    versions: [{k}]\n  controller-manager:\n    versions: [{k}]\ndefaults:\n  kubernetes: \"{d}\"\ncompatibility:\n  - kubernetes: \"1.35\"\n    etcd: \"3.6.8\"\n    etcdMinors: [\"3.5\", \"3.6\", \"3.7\"]\n  - kubernetes: \"1.36\"\n    etcd: \"3.6.8\"\n    etcdMinors: [\"3.6\", \"3.7\"]\n  - kubernetes: \"1.37\"\n    etcd: \"3.7.0\"\n    etcdMinors: [\"3.6\", \"3.7\"]\n  - kubernetes: \"1.38\"\n    etcd: \"3.7.0\"\n    etcdMinors: [\"3.7\"]\n",
            k = quoted(kubernetes),
            d = kubernetes[kubernetes.len() - 1],
        );
        let mut files = vec![("channel.yaml".to_string(), index)];
        for v in ["3.6.8", "3.7.0"] {
            files.push((format!("{v}/etcd/a.yaml"), "kind: ConfigMap".into()));
        }
        for v in kubernetes {
            for c in ["apiserver", "controller-manager"] {
                files.push((format!("{v}/{c}/a.yaml"), "kind: ConfigMap".into()));
            }
        }
        Channel::from_files("t", "test", files).unwrap()
    }

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap()
    }

    fn running(kubernetes: &str, etcd: &str) -> RunningReleases {
        RunningReleases {
            kubernetes: Some(v(kubernetes)),
            etcd: Some(v(etcd)),
        }
    }

    /// The steps as `kubernetes/etcd[*]` (`*`: etcd moves in that step).
    fn steps(path: &UpgradePath) -> Vec<String> {
        path.steps
            .iter()
            .map(|s| format!("{}/{}{}", s.kubernetes, s.etcd, if s.etcd_changes { "*" } else { "" }))
            .collect()
    }

    #[test]
    fn two_minors_pass_through_the_highest_patch_of_the_one_between() {
        let c = channel(&["1.35.4", "1.36.1", "1.36.3", "1.37.0", "1.37.2"]);
        let path = plan_path(&c, &running("1.35.4", "3.6.8"), Some("1.37"), None).unwrap();
        assert_eq!(steps(&path), ["1.36.3/3.6.8", "1.37.2/3.7.0*"]);
        assert_eq!(path.target, v("1.37.2"));
        assert_eq!(path.summary(), "1.35.4 → 1.36.3 → 1.37.2 (etcd 3.6.8 → 3.7.0)");
    }

    #[test]
    fn the_last_step_is_the_requested_patch_not_the_highest() {
        let c = channel(&["1.35.4", "1.36.3", "1.37.0", "1.37.2"]);
        let path = plan_path(&c, &running("1.35.4", "3.6.8"), Some("1.37.0"), None).unwrap();
        assert_eq!(steps(&path), ["1.36.3/3.6.8", "1.37.0/3.7.0*"]);
    }

    #[test]
    fn three_minors_make_three_steps_and_etcd_moves_once() {
        let c = channel(&["1.35.4", "1.36.3", "1.37.2", "1.38.0"]);
        let path = plan_path(&c, &running("1.35.4", "3.6.8"), Some("1.38"), None).unwrap();
        assert_eq!(steps(&path), ["1.36.3/3.6.8", "1.37.2/3.7.0*", "1.38.0/3.7.0"]);
    }

    #[test]
    fn one_minor_and_a_patch_are_one_step_and_the_same_release_none() {
        let c = channel(&["1.36.1", "1.36.3", "1.37.2"]);
        let one = plan_path(&c, &running("1.36.3", "3.6.8"), Some("1.37"), None).unwrap();
        assert_eq!(steps(&one), ["1.37.2/3.7.0*"]);
        let patch = plan_path(&c, &running("1.36.1", "3.6.8"), Some("1.36"), None).unwrap();
        assert_eq!(steps(&patch), ["1.36.3/3.6.8"]);
        let same = plan_path(&c, &running("1.36.3", "3.6.8"), Some("1.36.3"), None).unwrap();
        assert!(same.steps.is_empty());
        assert_eq!(same.summary(), "1.36.3");
    }

    #[test]
    fn nothing_running_means_no_steps() {
        let c = channel(&["1.35.4", "1.37.2"]);
        let path = plan_path(&c, &RunningReleases::default(), Some("1.37"), None).unwrap();
        assert!(path.steps.is_empty());
        assert_eq!(path.target, v("1.37.2"));
    }

    #[test]
    fn a_minor_the_channel_lacks_is_named_in_the_refusal() {
        let c = channel(&["1.35.4", "1.37.2", "1.38.0"]);
        let err = plan_path(&c, &running("1.35.4", "3.6.8"), Some("1.38"), None).unwrap_err();
        assert_eq!(err.reason(), "UpgradeNotAllowed");
        assert!(
            matches!(&err, PathError::MissingMinor { missing, .. } if missing == "1.36"),
            "{err:?}"
        );
        let message = err.to_string();
        assert!(message.contains("no Kubernetes 1.36"), "{message}");
        assert!(message.contains("1.35.4, 1.37.2, 1.38.0"), "{message}");
    }

    #[test]
    fn downgrades_of_a_minor_or_more_are_refused_and_patch_downgrades_are_one_step() {
        let c = channel(&["1.35.4", "1.36.3", "1.37.2"]);
        for (from, to) in [("1.37.2", "1.36"), ("1.37.2", "1.35.4")] {
            let err = plan_path(&c, &running(from, "3.7.0"), Some(to), None).unwrap_err();
            assert!(matches!(err, PathError::Downgrade { .. }), "{from} → {to}: {err:?}");
            assert!(err.to_string().contains("ask for 1.37 or newer"), "{err}");
        }
        // kubeadm allows a patch downgrade within a minor, and so did capn before paths.
        let c = channel(&["1.36.1", "1.36.3"]);
        let down = plan_path(&c, &running("1.36.3", "3.6.8"), Some("1.36.1"), None).unwrap();
        assert_eq!(steps(&down), ["1.36.1/3.6.8"]);
    }

    #[test]
    fn a_major_change_is_refused() {
        let c = channel(&["1.36.3"]);
        let err = plan_path(&c, &running("0.36.3", "3.6.8"), Some("1.36"), None).unwrap_err();
        assert!(matches!(err, PathError::MajorChange { .. }), "{err:?}");
    }

    #[test]
    fn an_unknown_target_is_the_channel_error() {
        let c = channel(&["1.35.4", "1.36.3"]);
        let err = plan_path(&c, &running("1.35.4", "3.6.8"), Some("1.99"), None).unwrap_err();
        assert_eq!(err.reason(), "UnknownVersion");
        assert!(err.to_string().contains("available: 1.35.4, 1.36.3"), "{err}");
    }

    #[test]
    fn a_pinned_etcd_stays_and_must_fit_every_step() {
        let c = channel(&["1.35.4", "1.36.3", "1.37.2", "1.38.0"]);
        let path = plan_path(&c, &running("1.35.4", "3.7.0"), Some("1.37"), Some("3.7")).unwrap();
        assert_eq!(steps(&path), ["1.36.3/3.7.0", "1.37.2/3.7.0"]);
        let err = plan_path(&c, &running("1.36.3", "3.6.8"), Some("1.38"), Some("3.6.8")).unwrap_err();
        assert!(
            matches!(&err, PathError::IncompatibleEtcd { kubernetes, .. } if kubernetes == "1.38.0"),
            "{err:?}"
        );
    }

    #[test]
    fn a_default_etcd_older_than_the_running_one_is_refused() {
        // etcd 3.7 runs with 1.35 (allowed); 1.36's default 3.6.8 would be an etcd downgrade.
        let c = channel(&["1.35.4", "1.36.3", "1.37.2"]);
        let err = plan_path(&c, &running("1.35.4", "3.7.0"), Some("1.37"), None).unwrap_err();
        assert_eq!(err.reason(), "IncompatibleEtcd");
        assert!(err.to_string().contains("pin the NestedEtcd's version to 3.7"), "{err}");
    }

    #[test]
    fn the_stable_channel_plans_1_35_to_1_37_through_1_36() {
        let channels = crate::channel::ChannelRegistry::load(&[]).unwrap();
        let stable = channels.get("stable").unwrap();
        let path = plan_path(stable, &running("1.35.4", "3.6.8"), Some("1.37"), None).unwrap();
        assert_eq!(steps(&path), ["1.36.3/3.6.8", "1.37.2/3.7.0*"]);
    }
}
