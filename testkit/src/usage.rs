//! What the kernel counts for a process and everything it forked: resident memory (RSS and
//! PSS) and CPU time, read from `/proc` (proc(5)). For the density benchmark (issue 40),
//! which measures the runner's etcd, kube-apiserver and kube-controller-manager processes
//! ([`crate::runner::Runner::container_pid`]).
//!
//! - **RSS** (`VmRSS` of `/proc/<pid>/status`): every page the process has in memory, its
//!   own (`RssAnon`: heap, stacks) and file-backed (`RssFile`: its binary's text, libraries,
//!   mapped files such as etcd's database) and shared memory (`RssShmem`). A page shared
//!   with another process counts in full for each: what one tenant alone on a node costs.
//! - **PSS** (`Pss` of `/proc/<pid>/smaps_rollup`): the same with each shared page divided
//!   among the processes that map it, so that the PSS of all processes sums to the memory
//!   used. Tenants of one release share their binaries' text pages: their PSS is below their
//!   RSS by that share.
//! - **CPU** (`utime` + `stime`, fields 14 and 15 of `/proc/<pid>/stat`): CPU time spent, in
//!   seconds. The difference of two readings over a window, divided by the window, is the
//!   process's CPU use in cores; unlike wall-clock times it does not grow when other work
//!   shares the machine (only slightly, through caches and the scheduler).
//!
//! A process tree is the process and its descendants (`/proc/<pid>/task/<tid>/children`),
//! summed; the Kubernetes and etcd binaries do not fork, so it is usually the one process.

/// Memory and CPU of one process tree at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Usage {
    /// How many processes were summed (the process and its descendants).
    pub processes: usize,
    /// Resident set size (`VmRSS`), bytes.
    pub rss_bytes: u64,
    /// Resident anonymous memory (`RssAnon`), bytes.
    pub rss_anon_bytes: u64,
    /// Resident file-backed memory (`RssFile`), bytes.
    pub rss_file_bytes: u64,
    /// Proportional set size (`Pss` of `smaps_rollup`), bytes; 0 where the kernel does not
    /// give it (before Linux 4.14, or without the right to read it).
    pub pss_bytes: u64,
    /// User plus system CPU time since the process started, seconds.
    pub cpu_seconds: f64,
}

impl std::ops::Add for Usage {
    type Output = Usage;
    fn add(self, other: Usage) -> Usage {
        Usage {
            processes: self.processes + other.processes,
            rss_bytes: self.rss_bytes + other.rss_bytes,
            rss_anon_bytes: self.rss_anon_bytes + other.rss_anon_bytes,
            rss_file_bytes: self.rss_file_bytes + other.rss_file_bytes,
            pss_bytes: self.pss_bytes + other.pss_bytes,
            cpu_seconds: self.cpu_seconds + other.cpu_seconds,
        }
    }
}

/// The usage of process `pid` and all its descendants, summed.
///
/// # Errors
/// The process is gone (its `/proc` entry cannot be read) or `/proc` is not in the format
/// read. A descendant that ends while it is read is left out.
pub fn tree_usage(pid: i32) -> Result<Usage, String> {
    let mut total = process_usage(pid)?;
    for child in descendants(pid) {
        if let Ok(usage) = process_usage(child) {
            total = total + usage;
        }
    }
    Ok(total)
}

/// The usage of process `pid` alone.
///
/// # Errors
/// As [`tree_usage`].
pub fn process_usage(pid: i32) -> Result<Usage, String> {
    let read = |file: &str| {
        let path = format!("/proc/{pid}/{file}");
        std::fs::read_to_string(&path).map_err(|e| format!("cannot read {path}: {e}"))
    };
    let status = read("status")?;
    let kib = |field: &str| kib_field(&status, field).ok_or_else(|| format!("no {field} in /proc/{pid}/status"));
    let stat = read("stat")?;
    let ticks = cpu_ticks(&stat).ok_or_else(|| format!("unexpected /proc/{pid}/stat: {stat}"))?;
    // PSS needs PTRACE_MODE_READ on the process (root here); 0 when it cannot be read.
    let pss = read("smaps_rollup")
        .ok()
        .and_then(|rollup| kib_field(&rollup, "Pss"))
        .unwrap_or(0);
    Ok(Usage {
        processes: 1,
        rss_bytes: kib("VmRSS")? * 1024,
        rss_anon_bytes: kib("RssAnon")? * 1024,
        rss_file_bytes: kib("RssFile")? * 1024,
        pss_bytes: pss * 1024,
        cpu_seconds: ticks as f64 / ticks_per_second(),
    })
}

/// Every descendant of `pid` (children, their children, ...), from each thread's
/// `children` file (Linux 3.5 and later with `CONFIG_PROC_CHILDREN`, as every distribution
/// kernel has).
pub fn descendants(pid: i32) -> Vec<i32> {
    let mut found = Vec::new();
    let mut next = vec![pid];
    while let Some(parent) = next.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{parent}/task")) else {
            continue;
        };
        for task in tasks.filter_map(Result::ok) {
            let Ok(children) = std::fs::read_to_string(task.path().join("children")) else {
                continue;
            };
            for child in children.split_whitespace().filter_map(|c| c.parse::<i32>().ok()) {
                if !found.contains(&child) {
                    found.push(child);
                    next.push(child);
                }
            }
        }
    }
    found
}

/// The kernel's clock ticks per second (`utime` and `stime` are counted in them).
fn ticks_per_second() -> f64 {
    // SAFETY: sysconf reads a constant of the running kernel.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).max(1) as f64
}

/// The value in KiB of `field` in a `/proc` text of `Name:   1234 kB` lines (`status`,
/// `smaps_rollup`).
fn kib_field(text: &str, field: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()
}

/// `utime` + `stime` (fields 14 and 15) of a `/proc/<pid>/stat` text, in clock ticks. The
/// command name (field 2) is in parentheses and may hold spaces and parentheses, so fields
/// are counted after its last `)`.
fn cpu_ticks(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state).
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(field(14)? + field(15)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_and_rollup_fields_are_read_in_kib() {
        let status = "Name:\tetcd\nVmHWM:\t   81234 kB\nVmRSS:\t   80000 kB\nRssAnon:\t   60000 kB\nRssFile:\t   20000 kB\nRssShmem:\t       0 kB\n";
        assert_eq!(kib_field(status, "VmRSS"), Some(80_000));
        assert_eq!(kib_field(status, "RssAnon"), Some(60_000));
        // A field is matched whole: `Rss` is not `RssAnon`.
        assert_eq!(kib_field(status, "Rss"), None);
        assert_eq!(kib_field(status, "VmSwap"), None);
        let rollup = "55d0c0a00000-7ffd1b5fe000 ---p 00000000 00:00 0 [rollup]\nRss:              101808 kB\nPss:               77321 kB\nPss_Anon:          60112 kB\n";
        assert_eq!(kib_field(rollup, "Pss"), Some(77_321));
        assert_eq!(kib_field(rollup, "Pss_Anon"), Some(60_112));
    }

    #[test]
    fn cpu_ticks_are_utime_plus_stime_after_the_command_name() {
        // A command name with a space and a parenthesis, as comm may hold.
        let stat = "4242 (kube (api) server) S 1 4242 4242 0 -1 4194560 123 0 0 0 1500 250 0 0 20 0 12 0 987654 1000000 20000 18446744073709551615";
        assert_eq!(cpu_ticks(stat), Some(1750));
        assert_eq!(cpu_ticks("4242 (etcd) S 1"), None);
        assert_eq!(cpu_ticks("garbage"), None);
    }

    #[test]
    fn a_forked_child_is_summed_into_its_parents_tree() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep starts");
        let me = std::process::id() as i32;
        let child_pid = child.id() as i32;
        let found = descendants(me);
        let tree = tree_usage(me).expect("this tree's usage");
        let alone = process_usage(child_pid).expect("the child's usage");
        let _ = child.kill();
        let _ = child.wait();
        assert!(found.contains(&child_pid), "{child_pid} not in {found:?}");
        // This process and at least the child (other tests may have children of their own).
        assert!(tree.processes >= 2, "{tree:?}");
        assert!(alone.rss_bytes > 0, "{alone:?}");
        assert!(alone.rss_bytes >= alone.rss_anon_bytes, "{alone:?}");
    }

    #[test]
    fn cpu_time_grows_while_the_process_works() {
        let me = std::process::id() as i32;
        let before = process_usage(me).expect("usage").cpu_seconds;
        // Spin until the kernel has counted at least two ticks more (bounded by the work,
        // not by a clock).
        let mut x: u64 = 1;
        let mut after = before;
        for _ in 0..10_000 {
            for i in 0..100_000u64 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
            }
            after = process_usage(me).expect("usage").cpu_seconds;
            if after - before >= 2.0 / ticks_per_second() {
                break;
            }
        }
        std::hint::black_box(x);
        assert!(after > before, "{before} → {after}");
    }
}
