//! Channels (docs/design.md §3): directories of versioned manifest templates. A channel is an index
//! (`channel.yaml`) plus `<version>/<component>/*.yaml` minijinja templates. The built-in
//! `stable` channel is compiled into the binary; `--channels-dir` adds or replaces channels
//! from the filesystem.

mod error;
mod index;
mod load;
mod size;
mod version;

use std::collections::BTreeMap;

use semver::Version;

use crate::component::ComponentKind;
pub use error::ChannelError;
pub use index::{Capabilities, ChannelIndex, Compatibility, ComponentVersions, EndpointsSource, ReadinessSource};
pub use load::{builtin_channels, load_channel_dir};
pub use size::{ComponentSize, MAX_SIZE_NAME, Size, is_size_name};
pub use version::{RequestedVersion, minor_of};

/// Name of the channel used when neither a component nor its control plane names one.
pub const DEFAULT_CHANNEL: &str = "stable";

/// One template file of a channel.
#[derive(Clone, Debug)]
pub struct Template {
    /// Path inside the channel, for error messages (`1.36.3/apiserver/statefulset.yaml`).
    pub path: String,
    /// The minijinja source.
    pub source: String,
}

/// A loaded and checked channel: its index and every template, by component and version.
#[derive(Clone, Debug)]
pub struct Channel {
    pub name: String,
    pub index: ChannelIndex,
    /// Where it came from (`built-in` or a directory), for `capn channels list`.
    pub origin: String,
    templates: BTreeMap<(ComponentKind, Version), Vec<Template>>,
}

impl Channel {
    /// Builds a channel from its files (paths relative to the channel directory).
    ///
    /// # Errors
    /// [`ChannelError::InvalidChannel`] when `channel.yaml` is missing or malformed, lists a
    /// version that is not a plain `major.minor.patch`, or a listed version has no templates.
    pub fn from_files(
        name: &str,
        origin: &str,
        files: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ChannelError> {
        let invalid = |message: String| ChannelError::InvalidChannel {
            channel: name.to_string(),
            message,
        };
        let mut index_source = None;
        let mut by_dir: BTreeMap<(String, String), Vec<Template>> = BTreeMap::new();
        for (path, source) in files {
            let parts: Vec<&str> = path.split('/').collect();
            match parts.as_slice() {
                ["channel.yaml"] => index_source = Some(source),
                [version, component, file] if file.ends_with(".yaml") || file.ends_with(".yml") => {
                    by_dir
                        .entry((version.to_string(), component.to_string()))
                        .or_default()
                        .push(Template {
                            path: path.clone(),
                            source,
                        });
                }
                _ => {}
            }
        }
        let index_source = index_source.ok_or_else(|| invalid("channel.yaml is missing".into()))?;
        let index: ChannelIndex =
            serde_saphyr::from_str(&index_source).map_err(|e| invalid(format!("channel.yaml: {e}")))?;
        let mut templates = BTreeMap::new();
        for (component_name, listed) in &index.components {
            let kind = ComponentKind::from_name(component_name).ok_or_else(|| {
                invalid(format!(
                    "channel.yaml names unknown component {component_name:?} (known: etcd, apiserver, controller-manager)"
                ))
            })?;
            for v in &listed.versions {
                let version = Version::parse(v).map_err(|e| invalid(format!("{component_name} version {v:?}: {e}")))?;
                let mut files = by_dir
                    .remove(&(v.clone(), component_name.clone()))
                    .ok_or_else(|| invalid(format!("{v}/{component_name}/ has no templates")))?;
                files.sort_by(|a, b| a.path.cmp(&b.path));
                templates.insert((kind, version), files);
            }
        }
        if let Some(((v, c), _)) = by_dir.into_iter().next() {
            return Err(invalid(format!("{v}/{c}/ is not listed in channel.yaml")));
        }
        index.check(name)?;
        Ok(Self {
            name: name.to_string(),
            index,
            origin: origin.to_string(),
            templates,
        })
    }

    /// Releases of `kind` this channel carries, lowest first.
    pub fn versions(&self, kind: ComponentKind) -> Vec<&Version> {
        self.templates
            .keys()
            .filter(|(k, _)| *k == kind)
            .map(|(_, v)| v)
            .collect()
    }

    /// What the channel declares for `kind` beyond its versions (readiness, outputs).
    pub fn component(&self, kind: ComponentKind) -> Option<&ComponentVersions> {
        self.index.components.get(kind.as_str())
    }

    /// The templates of `kind` at `version`, sorted by path.
    pub fn templates(&self, kind: ComponentKind, version: &Version) -> Option<&[Template]> {
        self.templates.get(&(kind, version.clone())).map(Vec::as_slice)
    }

    /// Resolves the size a component runs with (docs/guide/sizes.md): `requested` (the
    /// component's `spec.size`, else its control plane's; empty counts as unset), else the
    /// channel's `defaults.size`. `None` for a channel without sizes when none is requested.
    ///
    /// # Errors
    /// [`ChannelError::UnknownSize`], naming the sizes the channel offers, when it has no
    /// size of that name.
    pub fn resolve_size(&self, requested: Option<&str>) -> Result<Option<(&str, &Size)>, ChannelError> {
        let requested = requested.map(str::trim).filter(|s| !s.is_empty());
        let Some(name) = requested.or(self.index.defaults.size.as_deref()) else {
            return Ok(None);
        };
        self.index
            .sizes
            .get_key_value(name)
            .map(|(name, size)| Some((name.as_str(), size)))
            .ok_or_else(|| ChannelError::UnknownSize {
                channel: self.name.clone(),
                requested: name.to_string(),
                available: self.index.sizes.keys().cloned().collect(),
            })
    }

    /// Resolves a requested release of `kind` (docs/design.md §3).
    ///
    /// `requested`: exact, partial or empty. When empty, the apiserver and controller-manager
    /// take the channel's default Kubernetes release; etcd takes the default for the minor
    /// of `kubernetes` (or of the default Kubernetes release when `kubernetes` is `None`).
    ///
    /// # Errors
    /// [`ChannelError::InvalidVersion`] for unparsable input, [`ChannelError::UnknownVersion`]
    /// (listing what exists) when nothing in the channel matches.
    pub fn resolve(
        &self,
        kind: ComponentKind,
        requested: Option<&str>,
        kubernetes: Option<&Version>,
    ) -> Result<Version, ChannelError> {
        let requested = requested.map(str::trim).filter(|s| !s.is_empty());
        let wanted = match requested {
            Some(r) => r.to_string(),
            None => match kind {
                ComponentKind::Etcd => {
                    let k8s = match kubernetes {
                        Some(v) => v.clone(),
                        None => self.resolve(ComponentKind::ApiServer, None, None)?,
                    };
                    self.index.etcd_for(&k8s).map(|c| c.etcd.clone()).ok_or_else(|| {
                        ChannelError::NoEtcdForKubernetes {
                            channel: self.name.clone(),
                            kubernetes: format!("{}.{}", k8s.major, k8s.minor),
                            known: self.index.compatibility.iter().map(|c| c.kubernetes.clone()).collect(),
                        }
                    })?
                }
                _ => self.index.defaults.kubernetes.clone(),
            },
        };
        let parsed = RequestedVersion::parse(&wanted).ok_or_else(|| ChannelError::InvalidVersion {
            component: kind,
            requested: wanted.clone(),
        })?;
        self.versions(kind)
            .into_iter()
            .rev()
            .find(|v| parsed.matches(v))
            .cloned()
            .ok_or_else(|| ChannelError::UnknownVersion {
                channel: self.name.clone(),
                component: kind,
                requested: wanted,
                available: self.versions(kind).iter().map(|v| v.to_string()).collect(),
            })
    }
}

/// Every channel capn knows, by name.
#[derive(Clone, Debug, Default)]
pub struct ChannelRegistry {
    channels: BTreeMap<String, Channel>,
}

impl ChannelRegistry {
    /// The built-in channels, then each directory of `dirs` in order: a directory holding a
    /// `channel.yaml` is one channel named after the directory; otherwise every
    /// subdirectory with a `channel.yaml` is one. A later channel of the same name replaces
    /// an earlier one (how an operator overrides `stable`).
    ///
    /// # Errors
    /// The first channel that fails to load or check ([`ChannelError::InvalidChannel`]).
    pub fn load(dirs: &[std::path::PathBuf]) -> Result<Self, ChannelError> {
        let mut registry = Self::default();
        for channel in builtin_channels()? {
            registry.insert(channel);
        }
        for dir in dirs {
            for channel in load_channel_dir(dir)? {
                registry.insert(channel);
            }
        }
        Ok(registry)
    }

    /// Adds or replaces a channel.
    pub fn insert(&mut self, channel: Channel) {
        self.channels.insert(channel.name.clone(), channel);
    }

    /// The channel called `name`.
    ///
    /// # Errors
    /// [`ChannelError::UnknownChannel`] naming the channels that exist.
    pub fn get(&self, name: &str) -> Result<&Channel, ChannelError> {
        self.channels.get(name).ok_or_else(|| ChannelError::UnknownChannel {
            requested: name.to_string(),
            available: self.channels.keys().cloned().collect(),
        })
    }

    /// All channels, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Channel> {
        self.channels.values()
    }
}

#[cfg(test)]
mod tests;
