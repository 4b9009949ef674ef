//! The preflight before each upgrade step, as pure decisions: which deprecated
//! APIs the tenant still uses that the step's target removes, and whether a certificate
//! would expire during the step. The reads (the tenant's `/metrics`, component statuses)
//! are the controller's.

use semver::Version;

/// The metric a kube-apiserver exposes for every deprecated API requested since it started
/// (KEP-1693, "Warning mechanism for use of deprecated APIs": a gauge with labels `group`,
/// `version`, `resource`, `subresource` and `removed_release`).
pub const DEPRECATED_APIS_METRIC: &str = "apiserver_requested_deprecated_apis";

/// One deprecated API the tenant requested, from [`DEPRECATED_APIS_METRIC`].
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DeprecatedApi {
    /// API group (`""` for the core group).
    pub group: String,
    pub version: String,
    pub resource: String,
    /// `""` unless a subresource was requested.
    pub subresource: String,
    /// `major.minor` that stops serving it; `""` when none is planned.
    pub removed_release: String,
}

impl DeprecatedApi {
    /// `servicecidrs.v1beta1.networking.k8s.io` (kubectl's spelling), with `/subresource`.
    pub fn name(&self) -> String {
        let mut name = self.resource.clone();
        if !self.version.is_empty() {
            name.push('.');
            name.push_str(&self.version);
        }
        if !self.group.is_empty() {
            name.push('.');
            name.push_str(&self.group);
        }
        if !self.subresource.is_empty() {
            name.push('/');
            name.push_str(&self.subresource);
        }
        name
    }

    /// The removal release as `(major, minor)`, if it is one.
    fn removed(&self) -> Option<(u64, u64)> {
        let (major, minor) = self.removed_release.split_once('.')?;
        Some((major.parse().ok()?, minor.parse().ok()?))
    }
}

/// A line of the Prometheus text format that could not be read.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("line {line} of the metrics is not in the Prometheus text format: {message}")]
pub struct MetricsError {
    pub line: usize,
    pub message: String,
}

/// One sample line: `name{label="value",...} value [timestamp]`.
#[derive(Clone, Debug, PartialEq)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

/// Parses one sample line of the Prometheus text exposition format
/// (<https://prometheus.io/docs/instrumenting/exposition_formats/#text-based-format>):
/// label values are double-quoted with `\\`, `\"` and `\n` escapes; the value is a Go float
/// (`+Inf`, `NaN` included); a timestamp may follow.
fn parse_sample(text: &str) -> Result<Sample, String> {
    let name_end = text
        .find(|c: char| c == '{' || c.is_whitespace())
        .ok_or("a sample needs a value after its name")?;
    let name = &text[..name_end];
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
        return Err(format!("{name:?} is not a metric name"));
    }
    let mut rest = &text[name_end..];
    let mut labels = Vec::new();
    if let Some(inner) = rest.strip_prefix('{') {
        let mut chars = inner.char_indices().peekable();
        let mut end = None;
        loop {
            while chars.next_if(|(_, c)| c.is_whitespace() || *c == ',').is_some() {}
            match chars.peek() {
                Some((i, '}')) => {
                    end = Some(*i);
                    break;
                }
                None => break,
                _ => {}
            }
            let mut label = String::new();
            while let Some((_, c)) = chars.next_if(|(_, c)| c.is_ascii_alphanumeric() || *c == '_') {
                label.push(c);
            }
            if label.is_empty()
                || chars.next().map(|(_, c)| c) != Some('=')
                || chars.next().map(|(_, c)| c) != Some('"')
            {
                return Err("a label must be written name=\"value\"".into());
            }
            let mut value = String::new();
            loop {
                match chars.next() {
                    Some((_, '"')) => break,
                    Some((_, '\\')) => match chars.next() {
                        Some((_, 'n')) => value.push('\n'),
                        Some((_, c @ ('\\' | '"'))) => value.push(c),
                        _ => return Err(format!("bad escape in the value of label {label}")),
                    },
                    Some((_, c)) => value.push(c),
                    None => return Err(format!("the value of label {label} is not closed")),
                }
            }
            labels.push((label, value));
        }
        let end = end.ok_or("the labels are not closed with }")?;
        rest = &inner[end + 1..];
    }
    let value = rest.split_whitespace().next().ok_or("a sample needs a value")?;
    let value = match value {
        "+Inf" | "Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse::<f64>().map_err(|_| format!("{v:?} is not a number"))?,
    };
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// The deprecated APIs requested according to a kube-apiserver's `/metrics` text: every
/// [`DEPRECATED_APIS_METRIC`] sample with a value above zero, sorted, without duplicates.
///
/// # Errors
/// [`MetricsError`] for a sample line of that metric that is not in the text format (other
/// metrics' lines are skipped unread, so an exotic line elsewhere does not stop a preflight).
pub fn deprecated_apis(metrics: &str) -> Result<Vec<DeprecatedApi>, MetricsError> {
    let mut found = Vec::new();
    for (i, line) in metrics.lines().enumerate() {
        let line = line.trim();
        let Some(after) = line.strip_prefix(DEPRECATED_APIS_METRIC) else {
            continue;
        };
        // Another metric that merely starts with the same name.
        if !after.starts_with(['{', ' ', '\t']) {
            continue;
        }
        let sample = parse_sample(line).map_err(|message| MetricsError { line: i + 1, message })?;
        if sample.value <= 0.0 || sample.value.is_nan() {
            continue;
        }
        let label = |name: &str| {
            sample
                .labels
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        found.push(DeprecatedApi {
            group: label("group"),
            version: label("version"),
            resource: label("resource"),
            subresource: label("subresource"),
            removed_release: label("removed_release"),
        });
    }
    found.sort();
    found.dedup();
    Ok(found)
}

/// The APIs among `used` that `target` no longer serves: a planned `removed_release` at or
/// before the target's minor ("removed in or before the step's target"). An API
/// removed before the target but still requested means the tenant runs a release that
/// still serves it, which the step leaves behind just the same.
pub fn removed_by(used: &[DeprecatedApi], target: &Version) -> Vec<DeprecatedApi> {
    used.iter()
        .filter(|api| api.removed().is_some_and(|r| r <= (target.major, target.minor)))
        .cloned()
        .collect()
}

/// How long a step may take, at most, for the certificate check: a certificate that
/// expires within this margin could expire while components restart.
pub const STEP_CERTIFICATE_MARGIN: time::Duration = time::Duration::hours(1);

/// Whether a certificate would expire during the step: the earliest expiry
/// (`status.certificatesExpiryDate`) within `margin` of `now`, or a renewal due
/// (`status.nextCertificateRenewal`) before the step would end. A renewal due rolls the
/// components itself, so the step waits for it rather than rolling twice at once.
///
/// Returns the reason to wait, or `None` when the step may start.
pub fn certificate_blocker(
    now: time::OffsetDateTime,
    expiry: Option<time::OffsetDateTime>,
    next_renewal: Option<(time::OffsetDateTime, &str)>,
    margin: time::Duration,
) -> Option<String> {
    if let Some(expiry) = expiry
        && expiry <= now + margin
    {
        return Some(format!(
            "a certificate expires at {} within {} minutes, before the step would end; it is renewed first",
            rfc3339(expiry),
            margin.whole_minutes()
        ));
    }
    if let Some((at, secret)) = next_renewal
        && at <= now + margin
    {
        return Some(format!(
            "Secret {secret} is due for renewal at {}, within the step's {} minutes; the renewal rolls first",
            rfc3339(at),
            margin.whole_minutes()
        ));
    }
    None
}

fn rfc3339(t: time::OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| t.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines as kube-apiserver v1.36.3 prints them (`/metrics` after a request to
    /// `networking.k8s.io/v1beta1` servicecidrs and a watch of flowschemas v1beta3), with
    /// the metric's own HELP and TYPE lines and a neighbour.
    const SAMPLE: &str = r#"# HELP apiserver_requested_deprecated_apis [STABLE] Gauge of deprecated APIs that have been requested, broken out by API group, version, resource, subresource, and removed_release.
# TYPE apiserver_requested_deprecated_apis gauge
apiserver_requested_deprecated_apis{group="networking.k8s.io",removed_release="1.37",resource="servicecidrs",subresource="",version="v1beta1"} 1
apiserver_requested_deprecated_apis{group="flowcontrol.apiserver.k8s.io",removed_release="1.32",resource="flowschemas",subresource="status",version="v1beta3"} 1
apiserver_requested_deprecated_apis{group="storage.k8s.io",removed_release="1.37",resource="volumeattributesclasses",subresource="",version="v1beta1"} 0
apiserver_requested_deprecated_apis{group="example.com",removed_release="",resource="widgets",subresource="",version="v1alpha1"} 1
apiserver_requested_deprecated_apis_total_x{group="x"} 3
# HELP apiserver_request_total [STABLE] Counter of apiserver requests
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="cluster",subresource="",verb="LIST",version="v1"} 7
"#;

    fn api(group: &str, version: &str, resource: &str, subresource: &str, removed: &str) -> DeprecatedApi {
        DeprecatedApi {
            group: group.into(),
            version: version.into(),
            resource: resource.into(),
            subresource: subresource.into(),
            removed_release: removed.into(),
        }
    }

    #[test]
    fn the_metric_lists_each_requested_deprecated_api_once() {
        let used = deprecated_apis(SAMPLE).unwrap();
        assert_eq!(
            used,
            vec![
                api("example.com", "v1alpha1", "widgets", "", ""),
                api(
                    "flowcontrol.apiserver.k8s.io",
                    "v1beta3",
                    "flowschemas",
                    "status",
                    "1.32"
                ),
                api("networking.k8s.io", "v1beta1", "servicecidrs", "", "1.37"),
            ],
            "a zero sample is not a use, and a metric that only starts with the name is another"
        );
        assert_eq!(
            used[1].name(),
            "flowschemas.v1beta3.flowcontrol.apiserver.k8s.io/status"
        );
    }

    #[test]
    fn a_finding_is_removed_in_or_before_the_step_target() {
        let used = deprecated_apis(SAMPLE).unwrap();
        let names = |target: &str| -> Vec<String> {
            removed_by(&used, &Version::parse(target).unwrap())
                .iter()
                .map(DeprecatedApi::name)
                .collect()
        };
        assert_eq!(
            names("1.36.3"),
            ["flowschemas.v1beta3.flowcontrol.apiserver.k8s.io/status"]
        );
        assert_eq!(
            names("1.37.2"),
            [
                "flowschemas.v1beta3.flowcontrol.apiserver.k8s.io/status",
                "servicecidrs.v1beta1.networking.k8s.io"
            ]
        );
        assert!(names("1.31.0").is_empty(), "nothing is removed before 1.32");
    }

    #[test]
    fn no_deprecated_use_means_no_finding() {
        let quiet =
            "# HELP apiserver_requested_deprecated_apis x\n# TYPE apiserver_requested_deprecated_apis gauge\nup 1\n";
        assert!(deprecated_apis(quiet).unwrap().is_empty());
        assert!(deprecated_apis("").unwrap().is_empty());
    }

    #[test]
    fn escapes_spaces_and_timestamps_are_read() {
        let text = "apiserver_requested_deprecated_apis{ group=\"a\\\"b\\\\c\", version=\"v1\",resource=\"r\\nx\",removed_release=\"1.40\",} 1 1700000000000\n";
        let used = deprecated_apis(text).unwrap();
        assert_eq!(used, vec![api("a\"b\\c", "v1", "r\nx", "", "1.40")]);
        let bare = deprecated_apis("apiserver_requested_deprecated_apis 1\n").unwrap();
        assert_eq!(bare, vec![api("", "", "", "", "")]);
    }

    #[test]
    fn a_broken_sample_of_the_metric_names_its_line() {
        for broken in [
            "apiserver_requested_deprecated_apis{group=\"a\" 1",
            "apiserver_requested_deprecated_apis{group=a} 1",
            "apiserver_requested_deprecated_apis{group=\"a} 1",
            "apiserver_requested_deprecated_apis{group=\"a\"}",
            "apiserver_requested_deprecated_apis{group=\"a\"} one",
            "apiserver_requested_deprecated_apis{group=\"\\q\"} 1",
        ] {
            let err = deprecated_apis(&format!("# ok\n{broken}\n")).unwrap_err();
            assert_eq!(err.line, 2, "{broken}: {err}");
        }
    }

    #[test]
    fn a_certificate_expiring_or_renewed_during_the_step_blocks_it() {
        let now = time::OffsetDateTime::parse("2026-12-01T04:00:00Z", &time::format_description::well_known::Rfc3339)
            .unwrap();
        let hour = time::Duration::hours(1);
        assert_eq!(certificate_blocker(now, Some(now + hour * 24), None, hour), None);
        let soon = certificate_blocker(now, Some(now + time::Duration::minutes(30)), None, hour).unwrap();
        assert!(soon.contains("2026-12-01T04:30:00Z"), "{soon}");
        let renewal =
            certificate_blocker(now, Some(now + hour * 24), Some((now + hour / 2, "c-apiserver")), hour).unwrap();
        assert!(renewal.contains("c-apiserver"), "{renewal}");
        assert_eq!(
            certificate_blocker(now, None, Some((now + hour * 2, "c-apiserver")), hour),
            None
        );
    }
}
