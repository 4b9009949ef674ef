//! The kit's child processes — the super cluster's binaries, Cluster API's manager, the S3
//! server and `capn run` ([`CapnProcess`]) — spawned so that they never outlive their owner,
//! with stdout and stderr in one log file each.

use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::net::{free_ports, http_get};

/// How many log lines a start-up failure shows.
const LOG_TAIL_LINES: usize = 40;
/// How long [`CapnProcess::stop`] waits after SIGTERM before it kills: capn's Deployment's
/// default grace would be 30 s; capn stops within a second when nothing hangs.
const CAPN_STOP_GRACE: Duration = Duration::from_secs(10);
/// How often [`CapnProcess::wait_ready`] asks `/readyz`.
const READY_POLL: Duration = Duration::from_millis(100);

/// One running child process.
pub(crate) struct Process {
    pub name: &'static str,
    pub child: Child,
    pub log: PathBuf,
}

impl Process {
    /// Starts `binary` with `args` in `dir`, its output going to `dir/<name>.log` (see
    /// [`Process::start`]).
    pub fn spawn(name: &'static str, binary: &Path, args: &[String], dir: &Path) -> Result<Self, String> {
        let mut command = Command::new(binary);
        command.args(args).current_dir(dir);
        Self::start(name, command, dir.join(format!("{name}.log")))
    }

    /// Starts `command` with stdin from `/dev/null` and stdout and stderr into the file `log`
    /// (created anew).
    ///
    /// The child gets `PR_SET_PDEATHSIG(SIGKILL)`. Linux sends that signal when the *thread*
    /// that forked the child ends, not the process, so call this only from a thread that lives
    /// as long as the child should (see `start::start`).
    pub fn start(name: &'static str, mut command: Command, log: PathBuf) -> Result<Self, String> {
        let stdout = File::create(&log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
        let stderr = stdout
            .try_clone()
            .map_err(|e| format!("cannot duplicate {}: {e}", log.display()))?;
        command.stdin(Stdio::null()).stdout(stdout).stderr(stderr);
        let parent = std::process::id();
        // SAFETY: the hook runs between fork and exec and only calls the async-signal-safe
        // prctl(2) and getppid(2); it does not allocate.
        unsafe {
            command.pre_exec(move || die_with_parent(parent));
        }
        let child = command.spawn().map_err(|e| {
            format!(
                "cannot start {name} ({}): {e}",
                Path::new(command.get_program()).display()
            )
        })?;
        Ok(Self { name, child, log })
    }

    /// `Ok` while the process runs; once it has exited, an error with the end of its log.
    pub fn check_running(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(self.failure(&format!("exited ({status})"))),
            Err(e) => Err(self.failure(&format!("cannot be waited for ({e})"))),
        }
    }

    /// A start-up failure message: `what` went wrong, then where the log is and its last lines.
    pub fn failure(&self, what: &str) -> String {
        format!(
            "{} {what}; last lines of {}:\n{}",
            self.name,
            self.log.display(),
            log_tail(&self.log)
        )
    }

    /// Kills the process and reaps it; used when start-up fails half way.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Asks Linux to SIGKILL the calling process when its parent's forking thread ends, and
/// fails when `parent` (a pid) is no longer the parent. For a `pre_exec` hook: it only calls
/// the async-signal-safe prctl(2) and getppid(2) and does not allocate.
///
/// # Errors
/// When prctl(2) fails, or `parent` died before the signal was set up (`ESRCH`).
fn die_with_parent(parent: u32) -> io::Result<()> {
    // SAFETY: plain system calls without pointers.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
            return Err(io::Error::last_os_error());
        }
        // The parent may have died between fork and prctl; no signal would come then.
        if libc::getppid() as u32 != parent {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
    }
    Ok(())
}

/// SIGTERM, then SIGKILL once `grace` has passed, and reap.
pub(crate) async fn terminate(child: &mut Child, grace: Duration) {
    // SAFETY: signals our own child.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let deadline = tokio::time::Instant::now() + grace;
    while tokio::time::Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The last [`LOG_TAIL_LINES`] lines of a log file, or why it cannot be read.
fn log_tail(log: &Path) -> String {
    match std::fs::read(log) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
        }
        Err(e) => format!("(cannot read the log: {e})"),
    }
}

/// What [`CapnProcess::start`] passes besides its standard flags.
#[derive(Clone, Debug, Default)]
pub struct CapnOptions {
    /// Flags after the standard ones (a later flag overrides an earlier one).
    pub args: Vec<String>,
    /// Environment variables besides `KUBECONFIG` (the tests' `RUST_LOG=debug`).
    pub env: Vec<(String, String)>,
    /// Remove the log file when the process is dropped (the tests': their logs go to the
    /// shared temporary directory).
    pub remove_log: bool,
    /// Serve metrics and probes on ports picked up front, so that
    /// [`CapnProcess::metrics_address`], [`CapnProcess::probe_address`] and
    /// [`CapnProcess::wait_ready`] can reach them (the benchmark). Otherwise capn binds port 0,
    /// for which nothing can race (the tests and the demo, which never ask).
    pub reachable: bool,
}

/// `capn run` as a child process, as a user runs it: for the integration tests, the
/// benchmark (whose figures must be capn's own) and the demo. Killed (SIGKILL) when dropped
/// without [`CapnProcess::stop`], and when the thread that started it ends, even if its owner
/// aborts on a panic (`PR_SET_PDEATHSIG`, see [`Process::start`]).
pub struct CapnProcess {
    process: Process,
    /// Where metrics and probes are served, when [`CapnOptions::reachable`].
    endpoints: Option<(SocketAddr, SocketAddr)>,
    remove_log: bool,
}

impl CapnProcess {
    /// Starts `binary run --namespace <namespace> --controllers=*,-public-crds` with
    /// `KUBECONFIG=<kubeconfig>`, its metrics and probe endpoints on loopback (see
    /// [`CapnOptions::reachable`]), then
    /// `options.args`; stdout and stderr go to the file `log`. The public CRD sync stays off:
    /// it dials tenants by their in-cluster names, which this host cannot resolve.
    ///
    /// capn runs in a process group of its own, so that a signal meant for its owner's group
    /// (Ctrl-C at a terminal) reaches only the owner, which then stops capn in order.
    ///
    /// `binary` is the caller's to name: `env!("CARGO_BIN_EXE_capn")` in the root package's
    /// tests and benches.
    ///
    /// # Errors
    /// No free port, the log cannot be created, or the binary cannot be started.
    pub fn start(
        binary: &Path,
        kubeconfig: &Path,
        namespace: &str,
        log: PathBuf,
        options: CapnOptions,
    ) -> Result<Self, String> {
        let endpoints = if options.reachable {
            let [metrics, probes] = free_ports()?.map(|port| SocketAddr::from((Ipv4Addr::LOCALHOST, port)));
            Some((metrics, probes))
        } else {
            None
        };
        let any = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        let (metrics, probes) = endpoints.unwrap_or((any, any));
        let mut command = Command::new(binary);
        command
            .args(["run", "--namespace", namespace, "--controllers=*,-public-crds"])
            .arg(format!("--metrics-bind-address={metrics}"))
            .arg(format!("--health-probe-bind-address={probes}"))
            .args(&options.args)
            .env("KUBECONFIG", kubeconfig)
            .envs(options.env.iter().map(|(name, value)| (name, value)))
            .process_group(0);
        Ok(Self {
            process: Process::start("capn", command, log)?,
            endpoints,
            remove_log: options.remove_log,
        })
    }

    /// capn's process id.
    pub fn pid(&self) -> u32 {
        self.process.child.id()
    }

    /// Where capn serves `/metrics`; `None` unless started [`CapnOptions::reachable`].
    pub fn metrics_address(&self) -> Option<SocketAddr> {
        self.endpoints.map(|(metrics, _)| metrics)
    }

    /// Where capn serves `/healthz` and `/readyz`; `None` unless started
    /// [`CapnOptions::reachable`].
    pub fn probe_address(&self) -> Option<SocketAddr> {
        self.endpoints.map(|(_, probes)| probes)
    }

    /// The file capn logs to.
    pub fn log_path(&self) -> &Path {
        &self.process.log
    }

    /// Everything capn logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.process.log).unwrap_or_default()
    }

    /// `Ok` while capn runs; once it has exited, an error with the end of its log.
    ///
    /// # Errors
    /// capn has exited.
    pub fn check_running(&mut self) -> Result<(), String> {
        self.process.check_running()
    }

    /// `what` went wrong, then the end of capn's log.
    pub fn failure(&self, what: &str) -> String {
        self.process.failure(what)
    }

    /// Waits until capn answers `/readyz` with 200.
    ///
    /// # Errors
    /// capn exits, or does not answer so within `timeout` (with the end of its log).
    pub async fn wait_ready(&mut self, timeout: Duration) -> Result<(), String> {
        let probes = self
            .probe_address()
            .ok_or("capn was started without reachable probes (CapnOptions::reachable)")?;
        let deadline = Instant::now() + timeout;
        while !matches!(http_get(probes, "/readyz").await, Ok((200, _))) {
            self.check_running()?;
            if Instant::now() > deadline {
                return Err(self.failure(&format!("did not answer /readyz within {timeout:?}")));
            }
            tokio::time::sleep(READY_POLL).await;
        }
        Ok(())
    }

    /// Stops capn as its Deployment would: SIGTERM, then SIGKILL if it lingers 10 s.
    pub async fn stop(mut self) {
        terminate(&mut self.process.child, CAPN_STOP_GRACE).await;
    }
}

impl Drop for CapnProcess {
    fn drop(&mut self) {
        self.process.kill();
        if self.remove_log {
            let _ = std::fs::remove_file(&self.process.log);
        }
    }
}
