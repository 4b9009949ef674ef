//! Name → address overrides for dialing tenant etcd members from outside the pod network.
//!
//! In a super cluster capn dials `https://<c>-etcd-<i>.<c>-etcd.<ns>.svc:2379` and cluster DNS
//! answers. Outside the pod network (tests, development) those names do not resolve; a file in
//! the format of `/etc/hosts` (`capn run --etcd-hosts-file FILE`) maps them to addresses while
//! TLS still verifies the certificate for the name (the name is the TLS server name, only the
//! TCP connection goes to the address). The file is read again whenever its modification time
//! or size changes, so a test runner can rewrite it while capn runs (pods get new addresses).

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

/// Parses hosts-file text: `ADDRESS NAME [NAME...]` per line, `#` starts a comment, blank and
/// malformed lines (an address that does not parse) are skipped. The first address given for a
/// name wins, as in the C library's resolver. Names are compared without a trailing dot and
/// case-insensitively (DNS names are).
pub fn parse_hosts(text: &str) -> HashMap<String, IpAddr> {
    let mut map = HashMap::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or_default();
        let mut fields = line.split_whitespace();
        let Some(address) = fields.next().and_then(|a| a.parse::<IpAddr>().ok()) else {
            continue;
        };
        for name in fields {
            map.entry(normalize(name)).or_insert(address);
        }
    }
    map
}

fn normalize(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// A hosts file read lazily and again when it changes. See the module documentation.
#[derive(Debug)]
pub struct HostsFile {
    path: PathBuf,
    read: Mutex<Option<Snapshot>>,
}

#[derive(Debug)]
struct Snapshot {
    modified: Option<SystemTime>,
    len: u64,
    names: HashMap<String, IpAddr>,
}

impl HostsFile {
    /// A hosts file at `path`; nothing is read yet (the file may appear later).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            read: Mutex::new(None),
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The address `name` maps to, reading the file again if it changed since the last look.
    /// `None` when the file does not exist (yet) or does not name `name`: the caller then dials
    /// the name itself.
    pub fn lookup(&self, name: &str) -> Option<IpAddr> {
        let meta = std::fs::metadata(&self.path).ok()?;
        let modified = meta.modified().ok();
        let mut read = self.read.lock().unwrap_or_else(|p| p.into_inner());
        let stale = read
            .as_ref()
            .is_none_or(|s| s.modified != modified || s.len != meta.len());
        if stale {
            let text = std::fs::read_to_string(&self.path).ok()?;
            *read = Some(Snapshot {
                modified,
                len: meta.len(),
                names: parse_hosts(&text),
            });
        }
        read.as_ref().and_then(|s| s.names.get(&normalize(name)).copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_text_maps_every_name_and_first_address_wins() {
        let map = parse_hosts(
            "# comment\n198.18.1.2 a.b.svc  A2.b.svc. # trailing\n\nnot-an-ip x\n198.18.1.3 a.b.svc\n::1 six\n",
        );
        assert_eq!(map.get("a.b.svc"), Some(&"198.18.1.2".parse().unwrap()));
        assert_eq!(map.get("a2.b.svc"), Some(&"198.18.1.2".parse().unwrap()));
        assert_eq!(map.get("six"), Some(&"::1".parse().unwrap()));
        assert!(!map.contains_key("x"));
        assert_eq!(map.len(), 3);
    }

    #[test]
    fn hosts_file_is_read_again_when_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hosts");
        let file = HostsFile::new(&path);
        assert_eq!(file.lookup("m0"), None, "no file yet");
        std::fs::write(&path, "198.18.1.2 m0\n").unwrap();
        assert_eq!(file.lookup("M0."), Some("198.18.1.2".parse().unwrap()));
        // A different size is noticed even within the file system's timestamp granularity.
        std::fs::write(&path, "198.18.1.20 m0\n").unwrap();
        assert_eq!(file.lookup("m0"), Some("198.18.1.20".parse().unwrap()));
    }
}
