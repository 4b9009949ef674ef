//! The Linux side of the runner: the thread every pod process is forked from, per-pod network
//! and UTS namespaces, the runner's private bridge, and the start of one container in its own
//! mount namespace and root directory.
//!
//! Nothing here outlives the process: namespaces are held by file descriptors (no `ip netns`
//! files), the veth pairs die with the namespaces they live in, and every child gets
//! `PR_SET_PDEATHSIG(SIGKILL)` from a thread that lives as long as the runner.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read};
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;

type Job = Box<dyn FnOnce() + Send>;

/// Every runner's and the node's pod network: one /24 of it each.
pub(super) const POD_NETWORKS: &str = "198.18.0.0/15";
/// How many pods one pod network (a /24: .2 to .253) holds at once.
pub(crate) const POD_ADDRESSES: u16 = 252;
/// The last address of each pod network: the node namespace's own, on its bridge, where
/// the node's pods send Service traffic for its kube-proxy ([`Network::route_services`]).
const NODE_ADDRESS: u8 = 254;

/// A thread that forks every process of the runner. `PR_SET_PDEATHSIG` fires when the *thread*
/// that forked a child ends; tokio's threads come and go, this one lives as long as the runner.
pub(super) struct Spawner {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Spawner {
    pub fn start() -> Result<Self, String> {
        let (jobs, receiver) = mpsc::channel::<Job>();
        let thread = thread::Builder::new()
            .name("capn-runner-spawner".to_owned())
            .spawn(move || {
                for job in receiver {
                    job();
                }
            })
            .map_err(|e| format!("cannot start the runner's spawner thread: {e}"))?;
        Ok(Self {
            jobs: Some(jobs),
            thread: Some(thread),
        })
    }

    /// Queues `job` for the spawner thread; its result arrives on the returned receiver.
    pub fn submit<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Result<tokio::sync::oneshot::Receiver<T>, String> {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        self.jobs
            .as_ref()
            .ok_or("the runner is shutting down")?
            .send(Box::new(move || {
                let _ = sender.send(job());
            }))
            .map_err(|_| "the runner's spawner thread has ended".to_owned())?;
        Ok(receiver)
    }
}

impl Drop for Spawner {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A new network namespace, and a UTS namespace when a hostname is given, held by descriptors.
pub(super) struct Namespaces {
    pub net: OwnedFd,
    pub uts: Option<OwnedFd>,
}

impl Namespaces {
    /// Creates them on a short-lived thread (unshare(2) moves only the calling thread).
    pub fn create(hostname: Option<&str>) -> Result<Self, String> {
        let hostname = hostname.map(|h| h.as_bytes().to_vec());
        thread::spawn(move || -> io::Result<Self> {
            let mut flags = libc::CLONE_NEWNET;
            if hostname.is_some() {
                flags |= libc::CLONE_NEWUTS;
            }
            // SAFETY: plain system calls on this thread's own namespaces.
            unsafe {
                if libc::unshare(flags) != 0 {
                    return Err(io::Error::last_os_error());
                }
                if let Some(name) = &hostname
                    && libc::sethostname(name.as_ptr().cast(), name.len()) != 0
                {
                    return Err(io::Error::last_os_error());
                }
            }
            let net = File::open("/proc/thread-self/ns/net")?.into();
            let uts = match hostname {
                Some(_) => Some(File::open("/proc/thread-self/ns/uts")?.into()),
                None => None,
            };
            Ok(Self { net, uts })
        })
        .join()
        .map_err(|_| "the namespace thread panicked".to_owned())?
        .map_err(|e| format!("cannot create network namespaces: {e} (the runner needs root: CAP_SYS_ADMIN)"))
    }

    /// The inode of the network namespace (`net:[inode]` in /proc/*/ns/net).
    pub fn net_inode(&self) -> u64 {
        std::fs::metadata(fd_path(&self.net))
            .map(|m| m.ino())
            .unwrap_or_default()
    }
}

/// The path another process opens to reach a namespace we hold.
fn fd_path(fd: &OwnedFd) -> String {
    format!("/proc/{}/fd/{}", std::process::id(), fd.as_raw_fd())
}

/// Runs `ip ARGS` (iproute2), inside the network namespace `netns` when given.
pub(super) fn ip(netns: Option<&OwnedFd>, args: &[&str]) -> Result<String, String> {
    run_in("ip", "iproute2", netns, args)
}

/// Runs `iptables ARGS` inside the network namespace `netns`.
pub(super) fn iptables(netns: &OwnedFd, args: &[&str]) -> Result<String, String> {
    run_in("iptables", "iptables", Some(netns), args)
}

/// Runs `program ARGS` (from the Debian package `package`), inside `netns` when given.
fn run_in(program: &str, package: &str, netns: Option<&OwnedFd>, args: &[&str]) -> Result<String, String> {
    let mut command = Command::new(program);
    command.args(args).stdin(Stdio::null());
    if let Some(fd) = netns {
        let fd = fd.as_raw_fd();
        // SAFETY: setns(2) only, between fork and exec.
        unsafe {
            command.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) == 0 {
                    Ok(())
                } else {
                    Err(io::Error::last_os_error())
                }
            });
        }
    }
    let output = command.output().map_err(|e| {
        format!(
            "cannot run `{program} {}`: {e} (the runner needs {package})",
            args.join(" ")
        )
    })?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// The runner's pod network: a bridge in a private "node" namespace, one veth per pod into it,
/// and one veth from the host, so that this process (and a user's kubectl) reaches pod
/// addresses. Addresses come from 198.18.0.0/15 (RFC 2544, never routed on the Internet), one
/// /24 per runner; the host interface `capn<N>` names the /24 it holds, so concurrent runners
/// cannot pick the same one.
pub(super) struct Network {
    node: Namespaces,
    host_link: String,
    prefix: [u8; 3],
    used: BTreeSet<u8>,
    last: u8,
    /// The Service CIDR routed through the node namespace ([`Network::route_services`]).
    services: Option<String>,
}

impl Network {
    pub fn create() -> Result<Self, String> {
        let node = Namespaces::create(None)?;
        ip(Some(&node.net), &["link", "set", "lo", "up"])?;
        ip(Some(&node.net), &["link", "add", "br0", "type", "bridge"])?;
        ip(Some(&node.net), &["link", "set", "br0", "up"])?;
        let taken = host_prefixes()?;
        let start = usize::from(random_u16()) % 512;
        for i in 0..512 {
            let n = (start + i) % 512;
            let prefix = [198, 18 + (n / 256) as u8, (n % 256) as u8];
            if taken.contains(&prefix) {
                continue;
            }
            let host_link = format!("capn{n}");
            let created = ip(
                None,
                &[
                    "link",
                    "add",
                    &host_link,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "uplink",
                    "netns",
                    &fd_path(&node.net),
                ],
            );
            match created {
                Ok(_) => {}
                Err(e) if e.contains("File exists") => continue,
                Err(e) => return Err(e),
            }
            let network = Self {
                node,
                host_link,
                prefix,
                used: BTreeSet::new(),
                last: 1,
                services: None,
            };
            network.configure_uplink()?;
            return Ok(network);
        }
        Err("no free /24 left in 198.18.0.0/15 for the runner's pod network".to_owned())
    }

    fn configure_uplink(&self) -> Result<(), String> {
        let link = self.host_link.as_str();
        let gateway = format!("{}/24", self.address(1));
        // No IPv6 link-local address: nothing but the IPv4 /24 is meant to use this link.
        ip(None, &["link", "set", link, "addrgenmode", "none"])?;
        ip(None, &["addr", "add", &gateway, "dev", link])?;
        ip(None, &["link", "set", link, "up"])?;
        // Forwarding on this link only (not the host's global switch): packets from these
        // pods to another pod network of this host (the node's, another runner's) are routed
        // on, and so are the answers.
        std::fs::write(format!("/proc/sys/net/ipv4/conf/{link}/forwarding"), "1")
            .map_err(|e| format!("cannot enable forwarding on {link}: {e}"))?;
        ip(Some(&self.node.net), &["link", "set", "uplink", "master", "br0"])?;
        ip(Some(&self.node.net), &["link", "set", "uplink", "up"])?;
        Ok(())
    }

    fn address(&self, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(self.prefix[0], self.prefix[1], self.prefix[2], host)
    }

    /// The host's address on the pod network (what a pod sees as its node's address).
    pub fn host_address(&self) -> Ipv4Addr {
        self.address(1)
    }

    /// The interface on the host that routes the pod network.
    pub fn host_link(&self) -> &str {
        &self.host_link
    }

    /// Gives the pod namespace an `eth0` on the bridge with a fresh address, and brings up its
    /// loopback. Addresses rotate, so a deleted pod's address is not reused at once.
    pub fn attach(&mut self, pod: &Namespaces) -> Result<Ipv4Addr, String> {
        let host = (1..=i32::from(POD_ADDRESSES))
            .map(|i| ((i32::from(self.last) - 2 + i).rem_euclid(i32::from(POD_ADDRESSES)) + 2) as u8)
            .find(|h| !self.used.contains(h))
            .ok_or_else(|| format!("the runner's pod network is full ({POD_ADDRESSES} pods)"))?;
        self.used.insert(host);
        self.last = host;
        let address = self.address(host);
        let port = format!("vp{host}");
        let result = (|| {
            ip(
                Some(&self.node.net),
                &[
                    "link",
                    "add",
                    &port,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "eth0",
                    "netns",
                    &fd_path(&pod.net),
                ],
            )?;
            ip(Some(&self.node.net), &["link", "set", &port, "master", "br0"])?;
            ip(Some(&self.node.net), &["link", "set", &port, "up"])?;
            ip(
                Some(&pod.net),
                &["addr", "add", &format!("{address}/24"), "dev", "eth0"],
            )?;
            ip(Some(&pod.net), &["link", "set", "eth0", "up"])?;
            ip(Some(&pod.net), &["link", "set", "lo", "up"])?;
            // The other pod networks of this host (198.18.0.0/15) through the host; still no
            // default route.
            let gateway = self.address(1).to_string();
            ip(Some(&pod.net), &["route", "add", POD_NETWORKS, "via", &gateway])?;
            if let Some(cidr) = &self.services {
                let node = self.address(NODE_ADDRESS).to_string();
                ip(Some(&pod.net), &["route", "add", cidr, "via", &node])?;
            }
            Ok::<_, String>(())
        })();
        if let Err(e) = result {
            self.release(address);
            return Err(e);
        }
        Ok(address)
    }

    /// Makes the node namespace the router of the Service CIDR `cidr` for the pods attached
    /// from now on, as a node is for its pods: it gets the address [`NODE_ADDRESS`] on its
    /// bridge, forwards, and reaches the other pod networks of this host through the host; each
    /// pod gets a route to `cidr` through it. Whatever programs the node namespace's packet
    /// filter (kube-proxy, [`Network::node_namespace`]) then decides where that traffic goes.
    ///
    /// # Errors
    /// When `ip` fails, or forwarding cannot be switched on in the node namespace.
    pub fn route_services(&mut self, cidr: &str) -> Result<(), String> {
        let own = format!("{}/24", self.address(NODE_ADDRESS));
        ip(Some(&self.node.net), &["addr", "add", &own, "dev", "br0"])?;
        let gateway = self.address(1).to_string();
        ip(Some(&self.node.net), &["route", "add", POD_NETWORKS, "via", &gateway])?;
        // `/proc/sys/net` shows the namespace of the thread that opens it.
        let fd = self.node.net.as_raw_fd();
        thread::spawn(move || -> io::Result<()> {
            // SAFETY: setns(2) on this short-lived thread only.
            if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            // The network sysctls are those of the namespace of the thread that writes them.
            std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")
        })
        .join()
        .map_err(|_| "the forwarding thread panicked".to_owned())?
        .map_err(|e| format!("cannot enable forwarding in the node namespace: {e}"))?;
        self.services = Some(cidr.to_owned());
        Ok(())
    }

    /// A listener on `address` in the node namespace (made on a short-lived thread that
    /// enters it; the socket stays there).
    ///
    /// # Errors
    /// When the thread cannot enter the namespace or the address cannot be bound.
    pub fn listen_in_node(&self, address: std::net::SocketAddr) -> Result<std::net::TcpListener, String> {
        let fd = self.node.net.as_raw_fd();
        thread::spawn(move || -> io::Result<std::net::TcpListener> {
            // SAFETY: setns(2) on this short-lived thread only.
            if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            std::net::TcpListener::bind(address)
        })
        .join()
        .map_err(|_| "the listening thread panicked".to_owned())?
        .map_err(|e| format!("cannot listen on {address} in the node namespace: {e}"))
    }

    /// The node namespace's address on the pod network (once [`Network::route_services`]
    /// gave it one).
    pub fn node_address(&self) -> Ipv4Addr {
        self.address(NODE_ADDRESS)
    }

    /// The node namespace, for a process that works there (`/proc/<pid>/fd/<n>`, valid while
    /// the network lives).
    pub fn node_namespace(&self) -> &OwnedFd {
        &self.node.net
    }

    /// Removes the pod's veth pair (at once: a namespace is torn down asynchronously by the
    /// kernel) and frees its address.
    pub fn release(&mut self, address: Ipv4Addr) {
        let host = address.octets()[3];
        let _ = ip(Some(&self.node.net), &["link", "del", &format!("vp{host}")]);
        self.used.remove(&host);
    }

    /// The links in the node namespace (`lo`, `br0`, `uplink` and one `vp<N>` per pod).
    pub fn node_links(&self) -> Result<Vec<String>, String> {
        let out = ip(Some(&self.node.net), &["-o", "link", "show"])?;
        Ok(out
            .lines()
            .filter_map(|line| line.split(": ").nth(1))
            .map(|name| name.split('@').next().unwrap_or(name).to_owned())
            .collect())
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        // Deleting one end deletes the pair; without this the kernel does it when the node
        // namespace goes, a moment after its descriptor closes.
        let _ = ip(None, &["link", "del", &self.host_link]);
    }
}

/// The /24s in 198.18.0.0/15 that already have an address on this host.
fn host_prefixes() -> Result<BTreeSet<[u8; 3]>, String> {
    let out = ip(None, &["-o", "-4", "addr", "show"])?;
    Ok(out
        .split_whitespace()
        .filter_map(|word| word.split('/').next()?.parse::<Ipv4Addr>().ok())
        .map(|a| {
            let o = a.octets();
            [o[0], o[1], o[2]]
        })
        .collect())
}

pub(super) fn random_u16() -> u16 {
    let mut bytes = [0u8; 2];
    let _ = File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    u16::from_ne_bytes(bytes)
}

/// What one bind or pseudo-filesystem mount of a container is.
#[derive(Clone, Debug)]
pub(super) enum MountSource {
    /// A file or directory of the host (or of the runner's directory).
    Bind {
        source: PathBuf,
        read_only: bool,
    },
    Proc,
    Sysfs,
}

/// One mount of a container, at `target` (an absolute path inside the container).
#[derive(Clone, Debug)]
pub(super) struct Mount {
    pub target: PathBuf,
    pub source: MountSource,
}

/// Everything needed to start one container process.
#[derive(Clone, Debug)]
pub(super) struct Launch {
    /// Path of the executable inside the container.
    pub program: PathBuf,
    /// `command[0]` as rendered.
    pub argv0: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// The container's root directory on the host (its "image").
    pub rootfs: PathBuf,
    /// In order: a mount may lie inside an earlier one.
    pub mounts: Vec<Mount>,
    pub read_only_root: bool,
    pub workdir: String,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub no_new_privs: bool,
    pub log: PathBuf,
}

/// A mount(2) call prepared before fork (no allocation after it).
struct PreparedMount {
    source: Option<CString>,
    target: CString,
    fstype: Option<CString>,
    flags: libc::c_ulong,
    /// A second call that makes a bind mount read-only.
    remount: Option<libc::c_ulong>,
}

fn cstring(path: &Path) -> Result<CString, String> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| format!("{} contains a NUL byte", path.display()))
}

/// `container` joined under `rootfs`.
pub(super) fn host_path(rootfs: &Path, container: &Path) -> PathBuf {
    rootfs.join(container.strip_prefix("/").unwrap_or(container))
}

/// Starts the container: joins the pod's network and UTS namespaces, enters a private mount
/// namespace, mounts its volumes into `rootfs`, chroots there, drops to its user and execs.
/// Call only on the spawner thread.
pub(super) fn spawn_container(launch: &Launch, net: RawFd, uts: Option<RawFd>) -> Result<Child, String> {
    let rootfs = cstring(&launch.rootfs)?;
    let mut mounts = Vec::new();
    for mount in &launch.mounts {
        let target = cstring(&host_path(&launch.rootfs, &mount.target))?;
        let nosuid = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
        mounts.push(match &mount.source {
            MountSource::Bind { source, read_only } => PreparedMount {
                source: Some(cstring(source)?),
                target,
                fstype: None,
                flags: libc::MS_BIND | libc::MS_REC,
                remount: read_only.then_some(libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY),
            },
            MountSource::Proc => PreparedMount {
                source: Some(CString::from(c"proc")),
                target,
                fstype: Some(CString::from(c"proc")),
                flags: nosuid,
                remount: None,
            },
            MountSource::Sysfs => PreparedMount {
                source: Some(CString::from(c"sysfs")),
                target,
                fstype: Some(CString::from(c"sysfs")),
                flags: nosuid | libc::MS_RDONLY,
                remount: None,
            },
        });
    }
    let entry = Entry {
        net,
        uts,
        rootfs,
        mounts,
        read_only_root: launch.read_only_root,
        workdir: CString::new(launch.workdir.as_bytes()).map_err(|e| e.to_string())?,
        uid: launch.uid,
        gid: launch.gid,
        groups: launch.groups.clone(),
        no_new_privs: launch.no_new_privs,
        parent: std::process::id(),
    };

    let log = File::options()
        .create(true)
        .append(true)
        .open(&launch.log)
        .map_err(|e| format!("cannot open {}: {e}", launch.log.display()))?;
    let log_err = log
        .try_clone()
        .map_err(|e| format!("cannot duplicate {}: {e}", launch.log.display()))?;
    let mut command = Command::new(&launch.program);
    command
        .arg0(&launch.argv0)
        .args(&launch.args)
        .env_clear()
        .envs(launch.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        // Its own process group: a Ctrl-C in the terminal is not meant for the pods.
        .process_group(0);
    // SAFETY: the hook runs between fork and exec. It only makes system calls on data
    // prepared above, and on failure writes a static message to the log (stderr) before
    // returning the errno; it does not allocate.
    unsafe {
        command.pre_exec(move || enter(&entry));
    }
    command.spawn().map_err(|e| {
        format!(
            "cannot start {}: {e} (its log says which step failed: {})",
            launch.argv0,
            launch.log.display()
        )
    })
}

/// Writes `what` to stderr (the container log) and returns the current errno.
fn fail(what: &'static [u8], path: Option<&CString>) -> io::Error {
    let error = io::Error::last_os_error();
    // SAFETY: write(2) of valid buffers.
    unsafe {
        libc::write(2, what.as_ptr().cast(), what.len());
        if let Some(path) = path {
            let bytes = path.as_bytes();
            libc::write(2, bytes.as_ptr().cast(), bytes.len());
        }
        libc::write(2, b"\n".as_ptr().cast(), 1);
    }
    error
}

/// Everything [`enter`] needs, prepared before the fork: after it nothing may allocate.
struct Entry {
    net: RawFd,
    uts: Option<RawFd>,
    rootfs: CString,
    mounts: Vec<PreparedMount>,
    read_only_root: bool,
    workdir: CString,
    uid: u32,
    gid: u32,
    groups: Vec<libc::gid_t>,
    no_new_privs: bool,
    /// The runner's pid, to tell whether it died before the parent-death signal was set.
    parent: u32,
}

fn enter(entry: &Entry) -> io::Result<()> {
    let Entry {
        net,
        uts,
        ref rootfs,
        ref mounts,
        read_only_root,
        ref workdir,
        uid,
        gid,
        ref groups,
        no_new_privs,
        parent,
    } = *entry;
    use std::ptr::null;
    // SAFETY: system calls on prepared, NUL-terminated buffers.
    unsafe {
        if libc::setns(net, libc::CLONE_NEWNET) != 0 {
            return Err(fail(b"capn runner: setns(net) failed", None));
        }
        if let Some(uts) = uts
            && libc::setns(uts, libc::CLONE_NEWUTS) != 0
        {
            return Err(fail(b"capn runner: setns(uts) failed", None));
        }
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            return Err(fail(b"capn runner: unshare(mount) failed", None));
        }
        // Nothing mounted below propagates back to the host.
        if libc::mount(null(), c"/".as_ptr(), null(), libc::MS_REC | libc::MS_PRIVATE, null()) != 0 {
            return Err(fail(b"capn runner: making / private failed", None));
        }
        if libc::mount(
            rootfs.as_ptr(),
            rootfs.as_ptr(),
            null(),
            libc::MS_BIND | libc::MS_REC,
            null(),
        ) != 0
        {
            return Err(fail(b"capn runner: binding the root failed: ", Some(rootfs)));
        }
        for m in mounts {
            let source = m.source.as_ref().map_or(null(), |s| s.as_ptr());
            let fstype = m.fstype.as_ref().map_or(null(), |s| s.as_ptr());
            if libc::mount(source, m.target.as_ptr(), fstype, m.flags, null()) != 0 {
                return Err(fail(b"capn runner: mount failed: ", Some(&m.target)));
            }
            if let Some(flags) = m.remount
                && libc::mount(null(), m.target.as_ptr(), null(), flags, null()) != 0
            {
                return Err(fail(b"capn runner: read-only remount failed: ", Some(&m.target)));
            }
        }
        if read_only_root
            && libc::mount(
                null(),
                rootfs.as_ptr(),
                null(),
                libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY,
                null(),
            ) != 0
        {
            return Err(fail(b"capn runner: read-only root failed", None));
        }
        if libc::chroot(rootfs.as_ptr()) != 0 {
            return Err(fail(b"capn runner: chroot failed", None));
        }
        if libc::chdir(workdir.as_ptr()) != 0 {
            return Err(fail(b"capn runner: chdir failed: ", Some(workdir)));
        }
        if libc::setgroups(groups.len(), groups.as_ptr()) != 0 {
            return Err(fail(b"capn runner: setgroups failed", None));
        }
        if libc::setgid(gid) != 0 {
            return Err(fail(b"capn runner: setgid failed", None));
        }
        if libc::setuid(uid) != 0 {
            return Err(fail(b"capn runner: setuid failed", None));
        }
        if no_new_privs && libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(fail(b"capn runner: no_new_privs failed", None));
        }
        // After setuid: a change of credentials clears the parent-death signal.
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
            return Err(fail(b"capn runner: PR_SET_PDEATHSIG failed", None));
        }
        if libc::getppid() as u32 != parent {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
    }
    Ok(())
}

/// Spawns a plain host command (no namespaces) that dies with the runner; used for
/// `--version` checks.
pub(super) fn run_host_command(program: &Path, args: &[&str]) -> Result<String, String> {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    if output.status.success() {
        Ok(text)
    } else {
        Err(format!(
            "{} {} failed ({}): {}",
            program.display(),
            args.join(" "),
            output.status,
            text.trim()
        ))
    }
}
