//! capn as its own process (`capn run`, the binary cargo built next to this benchmark), so
//! that its peak memory and CPU time are its own: read from `/proc/<pid>/status` (VmHWM,
//! RssAnon, RssFile) and `/proc/<pid>/stat` (utime + stime).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long `capn run` may take to answer `/readyz`.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How many lines of capn's log an error shows.
const LOG_TAIL_LINES: usize = 30;

/// A running `capn run`; killed when dropped.
pub struct CapnProcess {
    child: tokio::process::Child,
    pid: u32,
    metrics: SocketAddr,
    pub log: PathBuf,
}

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

impl CapnProcess {
    /// Starts `capn run` for `namespace` with `kubeconfig` and `etcd_hosts` (its
    /// `--etcd-hosts-file`), logging to `dir/capn.log`, and
    /// waits until it answers `/readyz`. The public CRD sync stays off, as in the demo: the
    /// stand-in's control planes have no apiserver to sync to.
    ///
    /// # Errors
    /// capn does not start or exits, with the end of its log.
    pub async fn start(kubeconfig: &Path, etcd_hosts: &Path, namespace: &str, dir: &Path) -> Result<Self, String> {
        let log = dir.join("capn.log");
        let stdout = std::fs::File::create(&log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
        let stderr = stdout
            .try_clone()
            .map_err(|e| format!("cannot duplicate {}: {e}", log.display()))?;
        let [metrics, probes] = capn_testkit::free_ports()?.map(|port| SocketAddr::from((Ipv4Addr::LOCALHOST, port)));
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_capn"));
        let parent = std::process::id();
        // SAFETY: the hook runs between fork and exec and only calls async-signal-safe
        // system calls (`die_with_parent`). With it capn ends with the benchmark even when
        // the benchmark aborts on a panic (the release profile's `panic = "abort"`), which
        // runs no `kill_on_drop`.
        unsafe {
            command.pre_exec(move || capn_testkit::process::die_with_parent(parent));
        }
        let child = command
            .args(["run", "--namespace", namespace, "--controllers=*,-public-crds"])
            .arg(format!("--metrics-bind-address={metrics}"))
            .arg(format!("--health-probe-bind-address={probes}"))
            .arg("--etcd-hosts-file")
            .arg(etcd_hosts)
            .env("KUBECONFIG", kubeconfig)
            .stdin(std::process::Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", env!("CARGO_BIN_EXE_capn")))?;
        let pid = child.id().ok_or("capn exited at once")?;
        let mut capn = Self {
            child,
            pid,
            metrics,
            log,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        while !answers_ready(probes).await {
            capn.check_running()?;
            if Instant::now() > deadline {
                return Err(capn.failure(&format!("did not answer /readyz within {START_TIMEOUT:?}")));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(capn)
    }

    /// `Ok` while capn runs; once it has exited, an error with the end of its log.
    pub fn check_running(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(self.failure(&format!("exited ({status})"))),
            Err(e) => Err(self.failure(&format!("cannot be waited for ({e})"))),
        }
    }

    /// `what` went wrong, then the end of capn's log.
    pub fn failure(&self, what: &str) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
        format!("capn {what}; last lines of {}:\n{tail}", self.log.display())
    }

    /// Peak memory and CPU time so far.
    ///
    /// # Errors
    /// As [`usage_of`].
    pub fn usage(&self) -> Result<Usage, String> {
        usage_of(self.pid)
    }

    /// The reconciles each controller ran so far, by controller name.
    ///
    /// # Errors
    /// `/metrics` does not answer 200.
    pub async fn reconciles(&self) -> Result<Vec<Reconciles>, String> {
        let address = self.metrics;
        let (status, body) = capn_testkit::http_get(address, "/metrics")
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

    /// Stops capn as its Deployment would (SIGTERM), killing it if it lingers.
    pub async fn stop(mut self) {
        // SAFETY: signals our own child by pid.
        unsafe {
            libc::kill(self.pid as libc::pid_t, libc::SIGTERM);
        }
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
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

/// Whether `GET /readyz` on `address` answers 200.
async fn answers_ready(address: SocketAddr) -> bool {
    capn_testkit::http_get(address, "/readyz")
        .await
        .is_ok_and(|(status, _)| status == 200)
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
