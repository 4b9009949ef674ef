//! The test cluster's child processes: spawned so that they never outlive the test binary,
//! with stdout and stderr in one log file each.

use std::fs::File;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// How many log lines a start-up failure shows.
const LOG_TAIL_LINES: usize = 40;

/// One running binary of the test cluster.
pub(super) struct Process {
    pub name: &'static str,
    pub child: Child,
    pub log: PathBuf,
}

impl Process {
    /// Starts `binary` with `args` in `dir`, its output going to `dir/<name>.log`.
    ///
    /// The child gets `PR_SET_PDEATHSIG(SIGKILL)`. Linux sends that signal when the *thread*
    /// that forked the child ends, not the process, so call this only from a thread that lives
    /// as long as the test binary (see `start::start`).
    pub fn spawn(name: &'static str, binary: &Path, args: &[String], dir: &Path) -> Result<Self, String> {
        let log = dir.join(format!("{name}.log"));
        let stdout = File::create(&log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
        let stderr = stdout
            .try_clone()
            .map_err(|e| format!("cannot duplicate {}: {e}", log.display()))?;
        let mut command = Command::new(binary);
        command
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        let parent = std::process::id();
        // SAFETY: the hook runs between fork and exec and only calls the async-signal-safe
        // prctl(2) and getppid(2); it does not allocate.
        unsafe {
            command.pre_exec(move || die_with_parent(parent));
        }
        let child = command
            .spawn()
            .map_err(|e| format!("cannot start {name} ({}): {e}", binary.display()))?;
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
pub fn die_with_parent(parent: u32) -> io::Result<()> {
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

/// The last [`LOG_TAIL_LINES`] lines of a log file, or why it cannot be read.
pub(super) fn log_tail(log: &Path) -> String {
    match std::fs::read(log) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
        }
        Err(e) => format!("(cannot read the log: {e})"),
    }
}
