//! Parsing of requested versions (docs/design.md §3): exact `1.36.3`, partial `1.36` or `1`, with
//! a tolerated leading `v` and image-style suffix (`3.6.8-0`).

use semver::Version;

/// A version as a user wrote it, reduced to the parts that were given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestedVersion {
    pub major: u64,
    pub minor: Option<u64>,
    pub patch: Option<u64>,
}

impl RequestedVersion {
    /// Parses `v1.36.3`, `1.36`, `3.6.8-0`. Returns `None` for anything else (letters,
    /// more than three parts, an empty string).
    pub fn parse(input: &str) -> Option<Self> {
        let s = input.trim();
        let s = s.strip_prefix('v').unwrap_or(s);
        // Image tags carry a build suffix (`3.6.8-0`); it names the same release.
        let s = match s.split_once('-') {
            Some((head, tail)) if !tail.is_empty() && tail.chars().all(|c| c.is_ascii_digit()) => head,
            Some(_) => return None,
            None => s,
        };
        let mut parts = s.split('.').map(|p| {
            (!p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
                .then(|| p.parse::<u64>().ok())
                .flatten()
        });
        let major = parts.next()??;
        let minor = match parts.next() {
            None => None,
            Some(p) => Some(p?),
        };
        let patch = match parts.next() {
            None => None,
            Some(p) => Some(p?),
        };
        if parts.next().is_some() || (minor.is_none() && patch.is_some()) {
            return None;
        }
        Some(Self { major, minor, patch })
    }

    /// Whether `v` is a release this request accepts.
    pub fn matches(&self, v: &Version) -> bool {
        v.major == self.major && self.minor.is_none_or(|m| v.minor == m) && self.patch.is_none_or(|p| v.patch == p)
    }
}

/// `major.minor` of a version, the unit of Kubernetes' skew rules.
pub fn minor_of(v: &Version) -> (u64, u64) {
    (v.major, v.minor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_exact_partial_prefixed_and_suffixed() {
        let r = |s| RequestedVersion::parse(s);
        assert_eq!(
            r("1.36.3"),
            Some(RequestedVersion {
                major: 1,
                minor: Some(36),
                patch: Some(3)
            })
        );
        assert_eq!(
            r("v1.36"),
            Some(RequestedVersion {
                major: 1,
                minor: Some(36),
                patch: None
            })
        );
        assert_eq!(
            r("3.6.8-0"),
            Some(RequestedVersion {
                major: 3,
                minor: Some(6),
                patch: Some(8)
            })
        );
        assert_eq!(
            r("1"),
            Some(RequestedVersion {
                major: 1,
                minor: None,
                patch: None
            })
        );
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "v",
            "latest",
            "1.x",
            "1.36.3.4",
            "1..3",
            "1.36.3-rc.1",
            "-1",
            "1.36.3-",
        ] {
            assert_eq!(RequestedVersion::parse(bad), None, "{bad:?} should not parse");
        }
    }

    #[test]
    fn partial_matches_every_patch_of_its_minor_only() {
        let req = RequestedVersion::parse("1.36").unwrap();
        assert!(req.matches(&Version::new(1, 36, 0)));
        assert!(req.matches(&Version::new(1, 36, 9)));
        assert!(!req.matches(&Version::new(1, 37, 0)));
        assert!(!req.matches(&Version::new(2, 36, 0)));
    }
}
