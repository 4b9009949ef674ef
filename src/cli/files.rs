//! The files `capn connect` and `capn kubeconfig` write: private to their owner, replaced
//! whole.

use std::path::Path;

use anyhow::Context as _;

/// Writes `text` to `path` readable by the owner only, through a temporary file renamed
/// over it, so that a kubectl reading it meanwhile never sees half a file, and a concurrent writer
/// in another process never sees an error: the last rename wins. A file already
/// there keeps its owner where this process may set it (root rewriting a user's file).
///
/// # Errors
/// The temporary file cannot be written or renamed over `path`.
pub fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::MetadataExt as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    // One temporary file per process: the exec plugin and its background connect may
    // rewrite the same CA file at once.
    let temporary = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default(),
        std::process::id()
    ));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temporary)
        .with_context(|| format!("writing {}", temporary.display()))?;
    file.write_all(text.as_bytes())
        .with_context(|| format!("writing {}", temporary.display()))?;
    if let Ok(before) = std::fs::metadata(path) {
        // Best effort: an unprivileged process cannot give a file away, and needs not.
        let _ = std::os::unix::fs::fchown(&file, Some(before.uid()), Some(before.gid()));
    }
    std::fs::rename(&temporary, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Writes `text` to `path` ([`write_private`]) unless it holds `text` already.
///
/// # Errors
/// As [`write_private`].
pub fn write_if_changed(path: &Path, text: &str) -> anyhow::Result<()> {
    if std::fs::read_to_string(path).is_ok_and(|t| t == text) {
        return Ok(());
    }
    write_private(path, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_written_file_is_private_and_replaced_whole() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("demo.kubeconfig");
        write_private(&path, "one").unwrap();
        write_private(&path, "two").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "two");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temporary file left"
        );
    }
}
