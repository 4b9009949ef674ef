//! A real S3-compatible server next to the test cluster (issue 10): `s3s-fs`, the s3s
//! project's file-system backed S3 server, built from crates.io by `hack/s3-assets.sh`
//! (cached by version). Started once per test binary by the first test that asks for it with
//! [`s3`], on a free loopback port, with its own access key; every test makes a bucket of its
//! own with [`S3::bucket`]. Never a mock: the requests are real S3 (SigV4, multipart).
//!
//! The binary comes from `S3_SERVER` when set, else from running `hack/s3-assets.sh`.

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use super::net::free_ports;
use super::process::Process;

/// Names the `s3s-fs` binary, else `hack/s3-assets.sh` builds or finds it.
pub const SERVER_VARIABLE: &str = "S3_SERVER";
/// The test server's credentials (loopback only, a throw-away server).
pub const ACCESS_KEY_ID: &str = "capn-test-access-key";
pub const SECRET_ACCESS_KEY: &str = "capn-test-secret-key-0123456789";
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The running server; get it with [`s3`].
pub struct S3 {
    endpoint: String,
    root: PathBuf,
}

static SERVER: OnceLock<Result<S3, String>> = OnceLock::new();
static RUNNING: OnceLock<(libc::pid_t, PathBuf)> = OnceLock::new();
static STOPPING: AtomicBool = AtomicBool::new(false);
static BUCKETS: AtomicU32 = AtomicU32::new(0);

/// The S3 server of this test binary, started on first use (well under a second).
///
/// # Panics
/// If the binary is missing and cannot be built, or does not start listening.
pub fn s3() -> &'static S3 {
    match SERVER.get_or_init(start) {
        Ok(server) => server,
        Err(message) => panic!("the S3 server did not start: {message}"),
    }
}

impl S3 {
    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Creates a new, empty bucket (`capn-test-<n>-<pid>`) and returns its name. s3s-fs keeps a
    /// bucket as a directory under its root, which is what its CreateBucket makes too.
    ///
    /// # Panics
    /// If the directory cannot be made.
    pub fn bucket(&self) -> String {
        let name = format!(
            "capn-test-{}-{}",
            BUCKETS.fetch_add(1, Ordering::SeqCst),
            std::process::id()
        );
        std::fs::create_dir_all(self.root.join(&name)).unwrap_or_else(|e| panic!("cannot create bucket {name}: {e}"));
        name
    }

    /// The file s3s-fs stores object `key` of `bucket` in, for tests that corrupt a stored
    /// object behind the server's back (as a disk error or a tampering would).
    pub fn object_file(&self, bucket: &str, key: &str) -> PathBuf {
        self.root.join(bucket).join(key)
    }
}

/// A second s3s-fs over the same buckets, listening on another address: the runner's host
/// address on its pod network, which pods reach (they have no route to loopback) and this
/// host too. Stopped when dropped; it must be started from the thread that drops it (the
/// test's), since its child dies with the thread that forked it.
pub struct Listener {
    process: Process,
    endpoint: String,
}

impl Listener {
    /// `http://<address>:<port>`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.process.kill();
    }
}

impl S3 {
    /// Serves the same buckets on `address` as well (see [`Listener`]).
    ///
    /// # Errors
    /// When the server does not start listening there.
    pub fn serve_on(&self, address: Ipv4Addr) -> Result<Listener, String> {
        let binary = server_binary()?;
        let [port] = free_ports()?;
        let dir = self.root.parent().unwrap_or(&self.root).to_path_buf();
        let args = vec![
            "--host".to_owned(),
            address.to_string(),
            "--port".to_owned(),
            port.to_string(),
            "--access-key".to_owned(),
            ACCESS_KEY_ID.to_owned(),
            "--secret-key".to_owned(),
            SECRET_ACCESS_KEY.to_owned(),
            self.root.display().to_string(),
        ];
        let name: &'static str = Box::leak(format!("s3s-fs-{address}-{port}").into_boxed_str());
        let mut process = Process::spawn(name, &binary, &args, &dir)?;
        let socket = SocketAddr::from((address, port));
        let deadline = Instant::now() + START_TIMEOUT;
        while TcpStream::connect_timeout(&socket, Duration::from_millis(200)).is_err() {
            process.check_running()?;
            if Instant::now() > deadline {
                let message = process.failure(&format!("did not listen on {socket} within {START_TIMEOUT:?}"));
                process.kill();
                return Err(message);
            }
            thread::sleep(Duration::from_millis(50));
        }
        Ok(Listener {
            process,
            endpoint: format!("http://{socket}"),
        })
    }
}

fn start() -> Result<S3, String> {
    let binary = server_binary()?;
    let (sender, receiver) = mpsc::channel();
    thread::Builder::new()
        .name("capn-test-s3".to_owned())
        .spawn(move || {
            let result = start_on_this_thread(&binary);
            match result {
                Ok((server, process)) => {
                    let _ = sender.send(Ok(server));
                    supervise(process);
                }
                Err(e) => {
                    let _ = sender.send(Err(e));
                }
            }
        })
        .map_err(|e| format!("cannot start the S3 thread: {e}"))?;
    receiver
        .recv()
        .map_err(|_| "the S3 start-up thread panicked (see its message above)".to_owned())?
}

fn start_on_this_thread(binary: &Path) -> Result<(S3, Process), String> {
    let dir = tempfile::Builder::new()
        .prefix("capn-test-s3-")
        .tempdir()
        .map_err(|e| format!("cannot create the S3 directory: {e}"))?
        .keep();
    let root = dir.join("data");
    std::fs::create_dir_all(&root).map_err(|e| format!("cannot create {}: {e}", root.display()))?;
    let [port] = free_ports()?;
    let args = vec![
        "--host".to_owned(),
        "127.0.0.1".to_owned(),
        "--port".to_owned(),
        port.to_string(),
        "--access-key".to_owned(),
        ACCESS_KEY_ID.to_owned(),
        "--secret-key".to_owned(),
        SECRET_ACCESS_KEY.to_owned(),
        root.display().to_string(),
    ];
    let mut process = Process::spawn("s3s-fs", binary, &args, &dir)?;
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let deadline = Instant::now() + START_TIMEOUT;
    while TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_err() {
        process.check_running()?;
        if Instant::now() > deadline {
            let message = process.failure(&format!("did not listen on {address} within {START_TIMEOUT:?}"));
            process.kill();
            return Err(message);
        }
        thread::sleep(Duration::from_millis(50));
    }
    if RUNNING.set((process.child.id() as libc::pid_t, dir.clone())).is_ok() {
        // SAFETY: registers a plain function; it runs once at `exit`.
        unsafe {
            libc::atexit(stop_at_exit);
        }
    }
    eprintln!(
        "capn test S3 server: s3s-fs on http://{address}, log {}",
        process.log.display()
    );
    Ok((
        S3 {
            endpoint: format!("http://{address}"),
            root,
        },
        process,
    ))
}

/// `S3_SERVER`, else what `hack/s3-assets.sh` prints.
fn server_binary() -> Result<PathBuf, String> {
    let path = super::asset_path(SERVER_VARIABLE, "hack/s3-assets.sh")?;
    if !path.is_file() {
        return Err(format!(
            "{SERVER_VARIABLE} or hack/s3-assets.sh names {}, which is no file",
            path.display()
        ));
    }
    Ok(path)
}

extern "C" fn stop_at_exit() {
    STOPPING.store(true, Ordering::SeqCst);
    let Some((pid, dir)) = RUNNING.get() else {
        return;
    };
    // SAFETY: signals and reaps our own child by pid.
    unsafe {
        libc::kill(*pid, libc::SIGKILL);
        libc::waitpid(*pid, std::ptr::null_mut(), 0);
    }
    if std::env::var_os("CAPN_KEEP_TEST_CLUSTER").is_none_or(|keep| keep.is_empty() || keep == "0") {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Keeps the server's parent thread alive (`PR_SET_PDEATHSIG` is tied to it) and reports if
/// the server dies.
fn supervise(mut process: Process) {
    loop {
        thread::sleep(Duration::from_millis(500));
        if STOPPING.load(Ordering::SeqCst) {
            continue;
        }
        if let Err(report) = process.check_running() {
            eprintln!("capn test S3 server: {report}\n(backup tests after this will fail)");
            return;
        }
    }
}
