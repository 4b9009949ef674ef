//! What capn (`capn run`, a [`capn_testkit::CapnProcess`]) spent and did, so that the figures
//! are its own: peak memory and CPU time from `/proc/<pid>/status` (VmHWM, RssAnon, RssFile)
//! and `/proc/<pid>/stat` (utime + stime), reconciles from its `/metrics`.

use std::net::SocketAddr;

/// One controller's reconciles, from capn's own `/metrics` (capn counts these itself: they
/// are not requests, the audit log cannot see them).
#[derive(Clone, Debug, PartialEq)]
pub struct Reconciles {
    pub controller: String,
    /// `capn_reconcile_total`.
    pub count: u64,
    /// `capn_reconcile_duration_seconds_sum`: time spent in reconciles, in seconds, summed
    /// over the concurrent ones.
    pub seconds: f64,
}

/// What the kernel counted for a process.
#[derive(Clone, Copy, Debug)]
pub struct Usage {
    /// Peak resident set size (VmHWM), in bytes.
    pub peak_rss_bytes: u64,
    /// Resident anonymous memory now (RssAnon: heap, stacks), in bytes.
    pub rss_anon_bytes: u64,
    /// Resident file-backed memory now (RssFile: the binary's text and data pages, shared
    /// libraries), in bytes. Clean pages the kernel can drop, but VmHWM counts them.
    pub rss_file_bytes: u64,
    /// User plus system CPU time, in seconds.
    pub cpu_seconds: f64,
    /// Open sockets now (the `socket:` entries of `/proc/<pid>/fd`): for capn, its
    /// connections to the API server plus its metrics and probe listeners.
    pub sockets: usize,
}

/// The reconciles each controller of the capn serving `metrics` ran so far, by controller
/// name.
///
/// # Errors
/// `/metrics` does not answer 200, or has no reconcile counts.
pub async fn reconciles(metrics: SocketAddr) -> Result<Vec<Reconciles>, String> {
    let (status, body) = capn_testkit::http_get(metrics, "/metrics")
        .await
        .map_err(|e| format!("scraping capn's /metrics: {e}"))?;
    if status != 200 {
        return Err(format!("capn's /metrics answered {status}"));
    }
    let reconciles = parse_reconciles(&body);
    if reconciles.is_empty() {
        return Err("capn's /metrics has no capn_reconcile_total samples".to_owned());
    }
    Ok(reconciles)
}

/// Peak and current memory and CPU time so far of process `pid`, read from
/// `/proc/<pid>/status` (VmHWM, RssAnon, RssFile) and `/proc/<pid>/stat` (utime + stime).
///
/// # Errors
/// The process has exited (its `/proc` entry is gone) or the kernel's format is not the one
/// read.
pub fn usage_of(pid: u32) -> Result<Usage, String> {
    let read = |file: &str| {
        let path = format!("/proc/{pid}/{file}");
        std::fs::read_to_string(&path).map_err(|e| format!("cannot read {path}: {e}"))
    };
    let status = read("status")?;
    let bytes = |field: &str| status_bytes(&status, field).ok_or_else(|| format!("no {field} in /proc/{pid}/status"));
    let (peak_rss_bytes, rss_anon_bytes, rss_file_bytes) = (bytes("VmHWM")?, bytes("RssAnon")?, bytes("RssFile")?);
    // Fields after the command name (which may hold spaces, so split after its ')'):
    // state is field 3, utime field 14 and stime field 15, in clock ticks.
    let stat = read("stat")?;
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |field: usize| fields.get(field - 3).and_then(|v| v.parse::<u64>().ok());
    let (Some(user), Some(system)) = (ticks(14), ticks(15)) else {
        return Err(format!("unexpected /proc/{pid}/stat: {stat}"));
    };
    // SAFETY: sysconf reads a constant of the running kernel.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let fd_dir = format!("/proc/{pid}/fd");
    let sockets = std::fs::read_dir(&fd_dir)
        .map_err(|e| format!("cannot read {fd_dir}: {e}"))?
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("socket:"))
        .count();
    Ok(Usage {
        peak_rss_bytes,
        rss_anon_bytes,
        rss_file_bytes,
        cpu_seconds: (user + system) as f64 / ticks_per_second,
        sockets,
    })
}

/// The value of `field` in a `/proc/<pid>/status` text (`VmHWM:    79360 kB`), in bytes.
fn status_bytes(status: &str, field: &str) -> Option<u64> {
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// The per-controller reconcile counts and summed durations in an OpenMetrics text, by
/// controller name.
fn parse_reconciles(text: &str) -> Vec<Reconciles> {
    let mut found: std::collections::BTreeMap<&str, Reconciles> = std::collections::BTreeMap::new();
    for line in text.lines() {
        let (rest, is_count) = if let Some(rest) = line.strip_prefix("capn_reconcile_total{") {
            (rest, true)
        } else if let Some(rest) = line.strip_prefix("capn_reconcile_duration_seconds_sum{") {
            (rest, false)
        } else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let Some(controller) = labels
            .split(',')
            .find_map(|l| l.strip_prefix("controller=\"").and_then(|v| v.strip_suffix('"')))
        else {
            continue;
        };
        let value: f64 = value
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let entry = found.entry(controller).or_insert_with(|| Reconciles {
            controller: controller.to_owned(),
            count: 0,
            seconds: 0.0,
        });
        if is_count {
            entry.count = value as u64;
        } else {
            entry.seconds = value;
        }
    }
    found.into_values().collect()
}
