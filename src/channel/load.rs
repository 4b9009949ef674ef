//! Reading channels from the binary (built-in) and from directories.

use std::path::Path;

use include_dir::{Dir, include_dir};

use super::{Channel, ChannelError};

/// The repository's `channels/` directory, compiled in.
static BUILTIN: Dir<'static> = include_dir!("$CARGO_MANIFEST_DIR/channels");

/// The channels compiled into the binary (`stable`).
///
/// # Errors
/// [`ChannelError::InvalidChannel`] if a built-in channel is malformed (a build defect,
/// caught by the unit tests).
pub fn builtin_channels() -> Result<Vec<Channel>, ChannelError> {
    BUILTIN
        .dirs()
        .map(|dir| {
            let name = dir.path().to_string_lossy().into_owned();
            let mut files = Vec::new();
            collect_builtin(dir, dir.path(), &mut files);
            Channel::from_files(&name, "built-in", files)
        })
        .collect()
}

fn collect_builtin(dir: &Dir<'static>, root: &Path, out: &mut Vec<(String, String)>) {
    for file in dir.files() {
        if let (Ok(rel), Some(text)) = (file.path().strip_prefix(root), file.contents_utf8()) {
            out.push((rel.to_string_lossy().into_owned(), text.to_string()));
        }
    }
    for sub in dir.dirs() {
        collect_builtin(sub, root, out);
    }
}

/// Loads the channels under `dir`: `dir` itself when it holds a `channel.yaml`, else each
/// subdirectory that does.
///
/// # Errors
/// [`ChannelError::InvalidChannel`] when the directory cannot be read or a channel in it is
/// malformed.
pub fn load_channel_dir(dir: &Path) -> Result<Vec<Channel>, ChannelError> {
    let unreadable = |message: String| ChannelError::InvalidChannel {
        channel: dir.display().to_string(),
        message,
    };
    if dir.join("channel.yaml").is_file() {
        return Ok(vec![read_one(dir)?]);
    }
    let mut channels = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| unreadable(format!("cannot read directory: {e}")))?;
    let mut paths: Vec<_> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
    paths.sort();
    for path in paths {
        if path.join("channel.yaml").is_file() {
            channels.push(read_one(&path)?);
        }
    }
    if channels.is_empty() {
        return Err(unreadable("no channel.yaml in it or in its subdirectories".into()));
    }
    Ok(channels)
}

fn read_one(dir: &Path) -> Result<Channel, ChannelError> {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut files = Vec::new();
    // Follow links: a channel mounted from a ConfigMap is a tree of symlinks.
    for entry in walkdir::WalkDir::new(dir).follow_links(true) {
        let entry = entry.map_err(|e| ChannelError::InvalidChannel {
            channel: name.clone(),
            message: e.to_string(),
        })?;
        if !entry.file_type().is_file() {
            continue;
        }
        let Ok(rel) = entry.path().strip_prefix(dir) else {
            continue;
        };
        // Skip ConfigMap bookkeeping (`..data`, `..2024_...`).
        if rel
            .components()
            .any(|c| c.as_os_str().to_string_lossy().starts_with(".."))
        {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).map_err(|e| ChannelError::InvalidChannel {
            channel: name.clone(),
            message: format!("{}: {e}", rel.display()),
        })?;
        files.push((rel.to_string_lossy().into_owned(), text));
    }
    Channel::from_files(&name, &dir.display().to_string(), files)
}
