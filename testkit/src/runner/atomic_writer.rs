//! The kubelet's atomic writer for Secret and ConfigMap volumes (k8s.io/kubernetes
//! `pkg/volume/util/atomic_writer.go`, `AtomicWriter.Write`), behaviour for behaviour:
//!
//! ```text
//! <volume>/..2026_12_01_01_17_16.Ab12Cd/tls.crt    the payload, in a timestamped directory
//! <volume>/..data -> ..2026_12_01_01_17_16.Ab12Cd  swapped by rename(2): atomic
//! <volume>/tls.crt -> ..data/tls.crt               one link per top-level entry
//! ```
//!
//! A new payload is written into a new timestamped directory, `..data_tmp` is made to point
//! at it and renamed over `..data`, and only then are the old directory and the links of
//! vanished entries removed. A reader opening `tls.crt` and then `tls.key` during an update
//! may therefore get the old certificate with the new key (as on a real node), never a new
//! certificate with an old key, and every path resolved through `..data` after the rename
//! belongs to the new payload. An unchanged payload writes nothing. The volume directory
//! itself is never replaced, so a bind mount of it keeps showing the current payload.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{self, Write as _};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _, symlink};
use std::path::{Component, Path, PathBuf};

/// The link to the current payload directory.
pub(super) const DATA_DIR: &str = "..data";
/// The link made next to it and renamed over it.
const NEW_DATA_DIR: &str = "..data_tmp";
/// The kubelet's limits on a projected path (atomic_writer.go `maxFileNameLength`,
/// `maxPathLength`).
const MAX_FILE_NAME: usize = 255;
const MAX_PATH: usize = 4096;

/// One file of a payload: its bytes and its mode (`defaultMode` or the item's `mode`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct FileProjection {
    pub data: Vec<u8>,
    pub mode: u32,
}

/// A volume's content: relative path (`items[].path`, or the key) → file.
pub(super) type Payload = BTreeMap<String, FileProjection>;

/// What [`write`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Written {
    /// The payload on disk already was this one; nothing was written (missing links were
    /// made again, as the kubelet does).
    Unchanged,
    /// A new payload directory (its name) was published through `..data`.
    Published(String),
}

/// Projects `payload` into the existing directory `target`, as the kubelet's
/// `AtomicWriter.Write` does. `set_perms` runs after the new payload is written and before it
/// is published (the kubelet applies fsGroup to the whole volume there).
///
/// # Errors
/// A path that is absolute, empty, too long, has a `..` element or starts with `..` (the
/// names the writer reserves); any filesystem error, with the path it concerns. On an error
/// the previous payload stays published.
pub(super) fn write(
    target: &Path,
    payload: &Payload,
    set_perms: impl FnOnce() -> io::Result<()>,
) -> Result<Written, String> {
    let payload = clean_payload(payload)?;
    let io = |what: &str, path: &Path, e: io::Error| format!("{what} {}: {e}", path.display());
    let data_dir = target.join(DATA_DIR);
    let old = match fs::read_link(&data_dir) {
        Ok(old) => Some(old),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(io("cannot read the link", &data_dir, e)),
    };
    let old_path = old.as_ref().map(|old| target.join(old));
    let mut to_remove = BTreeSet::new();
    let mut should_write = true;
    if let Some(old_path) = &old_path {
        to_remove = paths_to_remove(&payload, old_path).map_err(|e| io("cannot walk", old_path, e))?;
        let changed = payload_differs(&payload, old_path).map_err(|e| io("cannot compare with", old_path, e))?;
        should_write = changed || !to_remove.is_empty();
    }
    let mut published = None;
    if should_write {
        let ts_dir = new_timestamp_dir(target).map_err(|e| io("cannot create a payload directory in", target, e))?;
        let ts_name = ts_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let prepared = write_payload(&payload, &ts_dir)
            .and_then(|()| set_perms())
            .map_err(|e| io("cannot write the payload into", &ts_dir, e))
            .and_then(|()| {
                let new_data_dir = target.join(NEW_DATA_DIR);
                // A link left by an interrupted write would make symlink(2) fail for good.
                let _ = fs::remove_file(&new_data_dir);
                symlink(&ts_name, &new_data_dir)
                    .and_then(|()| fs::rename(&new_data_dir, &data_dir))
                    .map_err(|e| {
                        let _ = fs::remove_file(&new_data_dir);
                        io("cannot publish", &ts_dir, e)
                    })
            });
        if let Err(e) = prepared {
            let _ = fs::remove_dir_all(&ts_dir);
            return Err(e);
        }
        published = Some(ts_name);
    }
    create_user_visible_links(&payload, target).map_err(|e| io("cannot link the payload in", target, e))?;
    // Only top-level names have links; deeper paths went with the old payload directory.
    let mut last_error = None;
    for path in to_remove.iter().filter(|p| !p.contains('/')) {
        let link = target.join(path);
        if let Err(e) = fs::remove_file(&link) {
            last_error = Some(io("cannot remove the stale link", &link, e));
        }
    }
    if let Some(e) = last_error {
        return Err(e);
    }
    match published {
        Some(name) => {
            if let Some(old_path) = &old_path {
                match fs::remove_dir_all(old_path) {
                    // Like Go's os.RemoveAll: already gone is fine.
                    Err(e) if e.kind() != io::ErrorKind::NotFound => {
                        return Err(io("cannot remove the old payload", old_path, e));
                    }
                    _ => {}
                }
            }
            Ok(Written::Published(name))
        }
        None => Ok(Written::Unchanged),
    }
}

/// The payload with validated, cleaned paths (`a//b/./c` → `a/b/c`), as `validatePayload`.
fn clean_payload(payload: &Payload) -> Result<Payload, String> {
    let mut clean = Payload::new();
    for (path, file) in payload {
        clean.insert(validate_path(path)?, file.clone());
    }
    Ok(clean)
}

/// atomic_writer.go `validatePath`: relative, not empty, no `..` element, not starting with
/// `..` (reserved for the writer's own names), names ≤ 255 and paths ≤ 4096 bytes.
fn validate_path(path: &str) -> Result<String, String> {
    let bad = |why: &str| Err(format!("invalid path {path:?}: {why}"));
    if path.is_empty() {
        return bad("must not be empty");
    }
    if path.starts_with('/') {
        return bad("must be a relative path");
    }
    if path.len() > MAX_PATH {
        return bad("must be at most 4096 characters");
    }
    let mut parts = Vec::new();
    for element in path.split('/') {
        if element == ".." {
            return bad("must not contain '..'");
        }
        if element.len() > MAX_FILE_NAME {
            return bad("file names must be at most 255 characters");
        }
    }
    for component in Path::new(path).components() {
        match component {
            Component::Normal(part) => parts.push(part.to_string_lossy().into_owned()),
            Component::CurDir => {}
            _ => return bad("must be a relative path without '..'"),
        }
    }
    if parts.is_empty() {
        return bad("must name a file");
    }
    if parts[0].starts_with("..") {
        return bad("must not start with '..'");
    }
    Ok(parts.join("/"))
}

/// Every path under the old payload directory that the new payload does not have (neither
/// as a file nor as a directory on the way to one).
fn paths_to_remove(payload: &Payload, old: &Path) -> io::Result<BTreeSet<String>> {
    let mut present = BTreeSet::new();
    match walk(old, "", &mut present) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(BTreeSet::new()),
        other => other?,
    }
    let mut wanted = BTreeSet::new();
    for path in payload.keys() {
        let mut prefix = path.as_str();
        wanted.insert(prefix.to_owned());
        while let Some((parent, _)) = prefix.rsplit_once('/') {
            wanted.insert(parent.to_owned());
            prefix = parent;
        }
    }
    Ok(present.difference(&wanted).cloned().collect())
}

fn walk(dir: &Path, prefix: &str, out: &mut BTreeSet<String>) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let relative = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        if entry.file_type()?.is_dir() {
            walk(&entry.path(), &relative, out)?;
        }
        out.insert(relative);
    }
    Ok(())
}

/// Whether some file of the payload is missing from, or has other bytes than, the old
/// payload directory (`shouldWritePayload`: the bytes decide, not the modes).
fn payload_differs(payload: &Payload, old: &Path) -> io::Result<bool> {
    for (path, file) in payload {
        let on_disk = old.join(path);
        match fs::symlink_metadata(&on_disk) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(true),
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        if fs::read(&on_disk)? != file.data {
            return Ok(true);
        }
    }
    Ok(false)
}

/// `..<UTC yyyy_mm_dd_hh_mm_ss>.<random>`, mode 0755 whatever the umask (`newTimestampDir`).
fn new_timestamp_dir(target: &Path) -> io::Result<PathBuf> {
    let now = time::OffsetDateTime::now_utc();
    let prefix = format!(
        "..{:04}_{:02}_{:02}_{:02}_{:02}_{:02}.",
        now.year(),
        u8::from(now.month()),
        now.day(),
        now.hour(),
        now.minute(),
        now.second()
    );
    let dir = tempfile::Builder::new().prefix(&prefix).tempdir_in(target)?.keep();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))?;
    Ok(dir)
}

/// Every file with its exact mode (chmod after creating, whatever the umask).
fn write_payload(payload: &Payload, dir: &Path) -> io::Result<()> {
    for (path, file) in payload {
        let full = dir.join(path);
        if let Some(parent) = full.parent() {
            fs::create_dir_all(parent)?;
        }
        let mut out = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(file.mode)
            .open(&full)?;
        out.write_all(&file.data)?;
        drop(out);
        fs::set_permissions(&full, fs::Permissions::from_mode(file.mode))?;
    }
    Ok(())
}

/// `<name> -> ..data/<name>` for every top-level name that has no link yet.
fn create_user_visible_links(payload: &Payload, target: &Path) -> io::Result<()> {
    let top: BTreeSet<&str> = payload.keys().map(|p| p.split('/').next().unwrap_or(p)).collect();
    for name in top {
        let link = target.join(name);
        match fs::read_link(&link) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => symlink(Path::new(DATA_DIR).join(name), &link)?,
            // A link, or something else the kubelet would leave alone too.
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt as _;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    use super::*;

    fn file(data: &str, mode: u32) -> FileProjection {
        FileProjection {
            data: data.as_bytes().to_vec(),
            mode,
        }
    }

    fn payload(files: &[(&str, &str, u32)]) -> Payload {
        files
            .iter()
            .map(|(path, data, mode)| (path.to_string(), file(data, *mode)))
            .collect()
    }

    /// The names directly in `dir`, sorted.
    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    fn link(path: &Path) -> String {
        fs::read_link(path).unwrap().to_string_lossy().into_owned()
    }

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().mode() & 0o7777
    }

    fn published(written: Written) -> String {
        match written {
            Written::Published(name) => name,
            Written::Unchanged => panic!("expected a new payload to be published"),
        }
    }

    #[test]
    fn the_layout_is_the_kubelets_and_updates_swap_it_whole() {
        let temp = tempfile::tempdir().unwrap();
        let volume = temp.path();
        let first = payload(&[
            ("tls.crt", "cert 1", 0o440),
            ("tls.key", "key 1", 0o400),
            ("nested/dir/file", "deep 1", 0o644),
        ]);
        let ts1 = published(write(volume, &first, || Ok(())).unwrap());

        assert!(
            ts1.starts_with("..") && ts1.len() > "..2026_12_01_01_17_16.".len(),
            "{ts1}"
        );
        let stamp = &ts1[2..21];
        assert!(
            stamp
                .bytes()
                .enumerate()
                .all(|(i, b)| if [4, 7, 10, 13, 16].contains(&i) {
                    b == b'_'
                } else {
                    b.is_ascii_digit()
                }),
            "a UTC timestamp yyyy_mm_dd_hh_mm_ss: {ts1}"
        );
        assert_eq!(
            entries(volume),
            [ts1.as_str(), "..data", "nested", "tls.crt", "tls.key"]
        );
        assert_eq!(link(&volume.join("..data")), ts1);
        assert_eq!(link(&volume.join("tls.crt")), "..data/tls.crt");
        assert_eq!(link(&volume.join("tls.key")), "..data/tls.key");
        assert_eq!(
            link(&volume.join("nested")),
            "..data/nested",
            "one link per top-level entry"
        );
        assert_eq!(fs::read_to_string(volume.join("tls.crt")).unwrap(), "cert 1");
        assert_eq!(fs::read_to_string(volume.join("nested/dir/file")).unwrap(), "deep 1");
        assert_eq!(mode(&volume.join(&ts1)), 0o755);
        assert_eq!(mode(&volume.join("tls.crt")), 0o440);
        assert_eq!(mode(&volume.join("tls.key")), 0o400);
        assert_eq!(mode(&volume.join("nested/dir/file")), 0o644);
        assert!(
            fs::symlink_metadata(volume.join(&ts1).join("tls.crt"))
                .unwrap()
                .is_file()
        );

        // The same bytes: nothing is written, not even with other modes (the bytes decide).
        let volume_inode = fs::metadata(volume).unwrap().ino();
        let mut same = first.clone();
        same.get_mut("tls.key").unwrap().mode = 0o444;
        assert_eq!(
            write(volume, &same, || panic!("no permissions to set")).unwrap(),
            Written::Unchanged
        );
        assert_eq!(link(&volume.join("..data")), ts1);
        // A user-visible link that went missing is made again, still without a write.
        fs::remove_file(volume.join("tls.key")).unwrap();
        assert_eq!(write(volume, &first, || Ok(())).unwrap(), Written::Unchanged);
        assert_eq!(link(&volume.join("tls.key")), "..data/tls.key");

        // A renewal: new bytes for one key, one key gone, one added.
        let mut perms_set_before_publishing = false;
        let second = payload(&[
            ("tls.crt", "cert 2", 0o440),
            ("tls.key", "key 1", 0o400),
            ("ca.crt", "ca 2", 0o440),
        ]);
        let ts2 = published(
            write(volume, &second, || {
                perms_set_before_publishing = link(&volume.join("..data")) == ts1;
                Ok(())
            })
            .unwrap(),
        );
        assert!(perms_set_before_publishing, "set_perms runs before the swap");
        assert_ne!(ts2, ts1);
        assert_eq!(
            entries(volume),
            [ts2.as_str(), "..data", "ca.crt", "tls.crt", "tls.key"],
            "the old payload directory and the link of the removed entry are gone; no ..data_tmp"
        );
        assert_eq!(
            fs::metadata(volume).unwrap().ino(),
            volume_inode,
            "the volume directory is the same"
        );
        assert_eq!(fs::read_to_string(volume.join("tls.crt")).unwrap(), "cert 2");
        assert_eq!(fs::read_to_string(volume.join("ca.crt")).unwrap(), "ca 2");
        assert_eq!(entries(&volume.join(&ts2)), ["ca.crt", "tls.crt", "tls.key"]);

        // An empty payload (an optional source that is gone) leaves only the machinery.
        let ts3 = published(write(volume, &Payload::new(), || Ok(())).unwrap());
        assert_eq!(entries(volume), [ts3.as_str(), "..data"]);
        assert!(entries(&volume.join(&ts3)).is_empty());
    }

    #[test]
    fn reserved_and_escaping_paths_are_refused_and_nothing_is_published() {
        let temp = tempfile::tempdir().unwrap();
        let volume = temp.path();
        let ts = published(write(volume, &payload(&[("a", "1", 0o644)]), || Ok(())).unwrap());
        for bad in ["", "/abs", "../up", "a/../b", "..data", "..hidden/x", &"n".repeat(256)] {
            let error = write(volume, &payload(&[("a", "2", 0o644), (bad, "x", 0o644)]), || Ok(())).unwrap_err();
            assert!(error.contains("invalid path"), "{bad:?}: {error}");
        }
        let error = write(volume, &payload(&[("a", "2", 0o644)]), || {
            Err(io::Error::other("no fsGroup"))
        })
        .unwrap_err();
        assert!(error.contains("no fsGroup"), "{error}");
        assert_eq!(
            link(&volume.join("..data")),
            ts,
            "a failed write leaves the old payload published"
        );
        assert_eq!(
            entries(volume),
            [ts.as_str(), "..data", "a"],
            "and nothing of the new one"
        );
        assert_eq!(fs::read_to_string(volume.join("a")).unwrap(), "1");
        // Cleaned paths are the same file: `./b//c` is `b/c`.
        write(volume, &payload(&[("./b//c", "3", 0o644)]), || Ok(())).unwrap();
        assert_eq!(fs::read_to_string(volume.join("b/c")).unwrap(), "3");
        assert_eq!(entries(volume)[1..], ["..data", "b"]);
        // A payload directory removed behind the writer's back: the next write publishes the
        // payload again.
        fs::remove_dir_all(volume.join(link(&volume.join("..data")))).unwrap();
        assert!(fs::read_to_string(volume.join("b/c")).is_err());
        published(write(volume, &payload(&[("b/c", "3", 0o644)]), || Ok(())).unwrap());
        assert_eq!(fs::read_to_string(volume.join("b/c")).unwrap(), "3");
    }

    /// A process reading `tls.crt` and then `tls.key` while the payload is swapped under it
    /// may pair an old certificate with a newer key (as with the kubelet), never a newer
    /// certificate with an older key; one reading both through one `..data` handle always
    /// gets a matching pair (or, if that payload was removed meanwhile, an error to retry).
    #[test]
    fn readers_never_see_a_newer_certificate_with_an_older_key() {
        let temp = tempfile::tempdir().unwrap();
        let volume = temp.path().to_owned();
        let generation = |n: u32| {
            payload(&[
                ("tls.crt", &format!("cert {n}"), 0o440),
                ("tls.key", &format!("key {n}"), 0o400),
            ])
        };
        write(&volume, &generation(0), || Ok(())).unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let reads = Arc::new(AtomicU32::new(0));
        let parse = |text: io::Result<String>| -> Option<u32> { text.ok()?.split_once(' ')?.1.parse().ok() };
        let reader = {
            let (volume, done, reads) = (volume.clone(), done.clone(), reads.clone());
            std::thread::spawn(move || {
                let (mut mixed, mut through_handle) = (0u32, 0u32);
                while !done.load(Ordering::SeqCst) {
                    let cert = parse(fs::read_to_string(volume.join("tls.crt")));
                    let key = parse(fs::read_to_string(volume.join("tls.key")));
                    if let (Some(cert), Some(key)) = (cert, key) {
                        reads.fetch_add(1, Ordering::SeqCst);
                        assert!(cert <= key, "certificate {cert} was read with the older key {key}");
                        mixed += u32::from(cert != key);
                    }
                    // One handle on the payload directory: both files from the same payload.
                    if let Ok(dir) = fs::File::open(volume.join("..data")) {
                        use std::os::fd::AsRawFd as _;
                        let at = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
                        let cert = parse(fs::read_to_string(at.join("tls.crt")));
                        let key = parse(fs::read_to_string(at.join("tls.key")));
                        if let (Some(cert), Some(key)) = (cert, key) {
                            through_handle += 1;
                            assert_eq!(cert, key, "one payload directory holds one pair");
                        }
                    }
                }
                (mixed, through_handle)
            })
        };
        // At least 300 swaps, and on until the reader has read 300 pairs (on a busy machine
        // the reader may start late).
        let mut updates = 0;
        while (updates < 300 || reads.load(Ordering::SeqCst) < 300) && !reader.is_finished() {
            updates += 1;
            published(write(&volume, &generation(updates), || Ok(())).unwrap());
        }
        done.store(true, Ordering::SeqCst);
        let (mixed, through_handle) = reader
            .join()
            .expect("the reader saw no newer certificate with an older key");
        let reads = reads.load(Ordering::SeqCst);
        assert!(through_handle > 0, "some pairs were read through one handle");
        eprintln!(
            "atomic writer: {updates} swaps; {reads} crt→key reads ({mixed} old crt + newer key); {through_handle} pairs read through one ..data handle"
        );
        assert_eq!(
            fs::read_to_string(volume.join("tls.crt")).unwrap(),
            format!("cert {updates}")
        );
        assert_eq!(entries(&volume).len(), 4, "one payload directory, ..data and two links");
    }
}
