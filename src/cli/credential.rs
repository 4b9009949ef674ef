//! The exec form of `capn kubeconfig` and its credential plugin, `capn connect --credential`
//! (docs/guide/connect.md, "The exec form").
//!
//! A file cannot carry a connection, so where the apiserver's in-cluster name does not
//! resolve, `capn kubeconfig` prints a kubeconfig whose server is a local endpoint
//! (`https://127.0.0.1:PORT`, verified for the in-cluster name) and whose user is a
//! client-go exec credential plugin, as EKS and GKE kubeconfigs are: kubectl runs
//! `capn connect NAME --credential ...` before each call. The plugin reads the admin
//! kubeconfig from the super cluster (through the super cluster's kubeconfig file and context
//! pinned in its arguments: kubectl runs it with `KUBECONFIG` set to the tenant's file), keeps
//! the CA file current, starts a background `capn connect` serving the endpoint when nothing
//! answers there, and prints the client certificate as an `ExecCredential`. No key is
//! written into the printed file: losing access to the super cluster revokes it.
//!
//! Everything of one tenant lives in its state directory ([`default_state_dir`]): the port
//! (`port`), the CA (`ca.crt`), the background connect's kubeconfig, log and pid.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use base64::Engine as _;
use serde_json::{Value, json};
use sha2::Digest as _;

/// The `apiVersion` of the exec plugin's input and output (client-go's stable version).
pub const EXEC_API_VERSION: &str = "client.authentication.k8s.io/v1";
/// The longest an `ExecCredential` is valid: kubectl asks again after it, so a credential
/// lost with the super-cluster access it came from lasts at most this long.
pub const CREDENTIAL_LIFETIME: Duration = Duration::from_secs(3600);
/// How long the plugin waits for the background connect it started to serve the endpoint.
pub const DAEMON_START: Duration = Duration::from_secs(30);
/// How long the background connect started by the plugin stays without a connection.
pub const DAEMON_IDLE: Duration = Duration::from_secs(3600);
/// How often the plugin looks at the endpoint and the starting connect.
const POLL: Duration = Duration::from_millis(100);
/// A log bigger than this is moved to `connect.log.1` when a connect is started.
const LOG_LIMIT: u64 = 1 << 20;

/// The state directory's record of the local port (`capn kubeconfig` picks it once).
pub const PORT_FILE: &str = "port";
/// The CA the exec form's `certificate-authority` names.
pub const CA_FILE: &str = "ca.crt";
/// The background connect's pid, written by it once it serves the endpoint.
pub const PID_FILE: &str = "connect.pid";
/// The background connect's standard output and error.
pub const LOG_FILE: &str = "connect.log";
/// The background connect's own kubeconfig (`--kubeconfig-out`; it holds the admin key).
pub const KUBECONFIG_FILE: &str = "kubeconfig";

/// The state directory of tenant `name` in `namespace` of the super cluster at `server`
/// (its API URL): `<base>/capn/connect/<namespace>-<name>-<8 hex digits of SHA-256(server)>`,
/// where `<base>` is `xdg_state_home` when set and absolute, else `<home>/.local/state`
/// (the XDG base directory rules).
///
/// # Errors
/// Neither `XDG_STATE_HOME` nor `HOME` gives a directory.
pub fn default_state_dir(
    xdg_state_home: Option<&Path>,
    home: Option<&Path>,
    server: &str,
    namespace: &str,
    name: &str,
) -> anyhow::Result<PathBuf> {
    let base = match (xdg_state_home.filter(|p| p.is_absolute()), home) {
        (Some(state), _) => state.to_path_buf(),
        (None, Some(home)) if !home.as_os_str().is_empty() => home.join(".local/state"),
        _ => anyhow::bail!("neither XDG_STATE_HOME nor HOME is set: pass --state-dir"),
    };
    let digest = sha2::Sha256::digest(server.as_bytes());
    let short: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    Ok(base.join("capn/connect").join(format!("{namespace}-{name}-{short}")))
}

/// [`default_state_dir`] with this process's `XDG_STATE_HOME` and `HOME`.
///
/// # Errors
/// As [`default_state_dir`].
pub fn state_dir_here(server: &str, namespace: &str, name: &str) -> anyhow::Result<PathBuf> {
    let xdg = std::env::var_os("XDG_STATE_HOME").map(PathBuf::from);
    let home = std::env::var_os("HOME").map(PathBuf::from);
    default_state_dir(xdg.as_deref(), home.as_deref(), server, namespace, name)
}

/// Creates `dir` (and its parents) if needed and makes it the owner's only (mode 0700).
///
/// # Errors
/// It cannot be created or its mode set.
pub fn prepare_state_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("setting the mode of {}", dir.display()))
}

/// The local port recorded in `dir`, else a free one (bound once on `127.0.0.1:0`), then
/// recorded: printing the kubeconfig twice gives the same file, served by one connect.
///
/// # Errors
/// The port file cannot be written, or no port can be bound.
pub fn state_port(dir: &Path) -> anyhow::Result<u16> {
    let file = dir.join(PORT_FILE);
    if let Some(port) = std::fs::read_to_string(&file)
        .ok()
        .and_then(|t| t.trim().parse::<u16>().ok())
        .filter(|p| *p != 0)
    {
        return Ok(port);
    }
    let port = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .context("finding a free local port")?
        .port();
    super::files::write_private(&file, &format!("{port}\n"))?;
    Ok(port)
}

/// The PEM of the CA in `kubeconfig`'s first cluster (`certificate-authority-data`).
///
/// # Errors
/// No such field, or it is not base64 of UTF-8 text.
pub fn ca_pem(kubeconfig: &str) -> anyhow::Result<String> {
    let doc: Value = serde_saphyr::from_str(kubeconfig).context("the kubeconfig does not parse")?;
    decoded(&doc["clusters"][0]["cluster"], "certificate-authority-data")
}

/// `field` of `object`, base64-decoded to text.
fn decoded(object: &Value, field: &str) -> anyhow::Result<String> {
    let data = object[field]
        .as_str()
        .with_context(|| format!("the kubeconfig has no {field}"))?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .with_context(|| format!("the kubeconfig's {field} is not base64"))?;
    String::from_utf8(bytes).with_context(|| format!("the kubeconfig's {field} is not text"))
}

/// The exec form of the Secret's `kubeconfig`, as YAML: every cluster's server is `server`
/// (the local endpoint), verified for `tls_server_name` against the CA file `ca_file` (a
/// file kept current rather than data, which a CA rotation would leave stale); every user
/// runs `command` with `args` as a client-go exec plugin instead of carrying a key. Names,
/// contexts and the current context are kept.
///
/// # Errors
/// The text is not a YAML kubeconfig with `clusters` and `users` lists.
pub fn exec_kubeconfig(
    kubeconfig: &str,
    server: &str,
    tls_server_name: &str,
    ca_file: &Path,
    command: &Path,
    args: &[String],
) -> anyhow::Result<String> {
    let mut doc: Value = serde_saphyr::from_str(kubeconfig).context("the kubeconfig does not parse")?;
    for cluster in doc["clusters"]
        .as_array_mut()
        .context("the kubeconfig has no clusters")?
    {
        let cluster = cluster
            .get_mut("cluster")
            .and_then(Value::as_object_mut)
            .context("a kubeconfig cluster without `cluster`")?;
        cluster.remove("certificate-authority-data");
        cluster.insert("server".into(), server.into());
        cluster.insert("tls-server-name".into(), tls_server_name.into());
        cluster.insert("certificate-authority".into(), ca_file.display().to_string().into());
    }
    for user in doc["users"].as_array_mut().context("the kubeconfig has no users")? {
        let user = user.as_object_mut().context("a kubeconfig user that is no mapping")?;
        user.insert(
            "user".into(),
            json!({"exec": {
                "apiVersion": EXEC_API_VERSION,
                "command": command.display().to_string(),
                "args": args,
                "interactiveMode": "Never",
                "provideClusterInfo": false,
                "installHint": format!(
                    "This kubeconfig runs {} (capn) to reach the tenant through the super cluster. \
                     Install capn there, or print the kubeconfig again with `capn kubeconfig` where capn is.",
                    command.display()
                ),
            }}),
        );
    }
    Ok(serde_saphyr::to_string(&doc)?)
}

/// The `ExecCredential` (JSON) of the Secret's `kubeconfig`: its first user's client
/// certificate and key (PEM), valid until the sooner of the certificate's `notAfter` and
/// [`CREDENTIAL_LIFETIME`] after `now` (RFC 3339, whole seconds).
///
/// # Errors
/// The kubeconfig has no `client-certificate-data`/`client-key-data`, or the certificate
/// does not parse.
pub fn exec_credential(kubeconfig: &str, now: k8s_openapi::jiff::Timestamp) -> anyhow::Result<String> {
    let doc: Value = serde_saphyr::from_str(kubeconfig).context("the kubeconfig does not parse")?;
    let user = &doc["users"][0]["user"];
    let certificate = decoded(user, "client-certificate-data")?;
    let key = decoded(user, "client-key-data")?;
    let not_after = crate::pki::not_after(&certificate)
        .context("the kubeconfig's client certificate")?
        .unix_timestamp();
    let limit = now.as_second().saturating_add(CREDENTIAL_LIFETIME.as_secs() as i64);
    let expiry = k8s_openapi::jiff::Timestamp::from_second(not_after.min(limit)).context("the expiry")?;
    let credential = json!({
        "apiVersion": EXEC_API_VERSION,
        "kind": "ExecCredential",
        "status": {
            "expirationTimestamp": expiry.to_string(),
            "clientCertificateData": certificate,
            "clientKeyData": key,
        },
    });
    Ok(serde_json::to_string(&credential)? + "\n")
}

/// Whether something accepts TCP connections at `address` now (within a second).
pub async fn accepts(address: SocketAddr) -> bool {
    matches!(
        tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(address)).await,
        Ok(Ok(_))
    )
}

/// Makes sure a connect serves `address`: when nothing accepts there, starts
/// `capn connect` with `daemon_args` in the background (its own process group, standard
/// input closed, output to `<state>/connect.log`) and waits up to [`DAEMON_START`] until the
/// address accepts. A connect that exits first (another plugin's connect took the port
/// meanwhile) is fine when the address accepts after all.
///
/// # Errors
/// The connect cannot be started, exits without the address accepting, or does not serve
/// it in time; the message ends with the log's last lines.
pub async fn ensure_daemon(address: SocketAddr, state: &Path, daemon_args: &[String]) -> anyhow::Result<()> {
    if accepts(address).await {
        return Ok(());
    }
    let log_path = state.join(LOG_FILE);
    if std::fs::metadata(&log_path).is_ok_and(|m| m.len() > LOG_LIMIT) {
        let _ = std::fs::rename(&log_path, state.join(format!("{LOG_FILE}.1")));
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    let exe = std::env::current_exe().context("finding capn's own executable")?;
    let mut command = std::process::Command::new(&exe);
    {
        use std::os::unix::process::CommandExt as _;
        command
            .args(daemon_args)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Its own process group: a Ctrl-C meant for kubectl does not reach it.
            .process_group(0);
    }
    let mut child = command
        .spawn()
        .with_context(|| format!("starting {} connect", exe.display()))?;
    let deadline = tokio::time::Instant::now() + DAEMON_START;
    loop {
        if accepts(address).await {
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            if accepts(address).await {
                return Ok(());
            }
            anyhow::bail!(
                "capn connect exited ({status}) without serving {address}; {}:\n{}",
                log_path.display(),
                tail(&log_path)
            );
        }
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!(
                "capn connect (pid {}) did not serve {address} within {}s; {}:\n{}",
                child.id(),
                DAEMON_START.as_secs(),
                log_path.display(),
                tail(&log_path)
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The last 20 lines of the file at `path` (empty when it cannot be read).
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Returns when `connections` has had none open and none accepted for `timeout`, looking
/// every second (or a quarter of `timeout` when shorter).
pub async fn idle(connections: &crate::reach::Connections, timeout: Duration) {
    let tick = (timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut seen = connections.accepted();
    let mut since = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(tick).await;
        let accepted = connections.accepted();
        if connections.open() > 0 || accepted != seen {
            seen = accepted;
            since = tokio::time::Instant::now();
        } else if since.elapsed() >= timeout {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kubeconfig as capn writes it, with a real certificate valid until `not_after`.
    fn secret_kubeconfig(not_after: (i32, u8, u8)) -> (String, String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["kubernetes-admin".into()]).unwrap();
        params.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
        let cert = params.self_signed(&key).unwrap();
        let b64 = |t: &str| base64::engine::general_purpose::STANDARD.encode(t);
        let text = format!(
            "apiVersion: v1
kind: Config
clusters:
- name: demo
  cluster:
    server: https://demo-apiserver.tenant-a.svc:6443
    certificate-authority-data: {ca}
users:
- name: demo-admin
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: demo-admin@demo
  context: {{cluster: demo, user: demo-admin}}
current-context: demo-admin@demo
",
            ca = b64("CA PEM"),
            cert = b64(&cert.pem()),
            key = b64(&key.serialize_pem()),
        );
        (text, cert.pem(), key.serialize_pem())
    }

    #[test]
    fn the_exec_form_dials_the_local_endpoint_with_the_ca_file_and_no_key() {
        let (text, _, _) = secret_kubeconfig((2030, 1, 1));
        let args: Vec<String> = ["connect", "demo", "-n", "tenant-a", "--credential"]
            .map(String::from)
            .to_vec();
        let exec = exec_kubeconfig(
            &text,
            "https://127.0.0.1:40123",
            "demo-apiserver.tenant-a.svc",
            Path::new("/state/ca.crt"),
            Path::new("/usr/local/bin/capn"),
            &args,
        )
        .unwrap();
        assert!(!exec.contains("client-key-data") && !exec.contains("certificate-authority-data"));
        let parsed = kube::config::Kubeconfig::from_yaml(&exec).unwrap();
        let cluster = parsed.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:40123"));
        assert_eq!(cluster.tls_server_name.as_deref(), Some("demo-apiserver.tenant-a.svc"));
        assert_eq!(cluster.certificate_authority.as_deref(), Some("/state/ca.crt"));
        let user = parsed.auth_infos[0].auth_info.as_ref().unwrap();
        let plugin = user.exec.as_ref().unwrap();
        assert_eq!(plugin.api_version.as_deref(), Some(EXEC_API_VERSION));
        assert_eq!(plugin.command.as_deref(), Some("/usr/local/bin/capn"));
        assert_eq!(plugin.args.as_deref(), Some(&args[..]));
        assert_eq!(
            plugin.interactive_mode.as_ref().map(|m| format!("{m:?}")).as_deref(),
            Some("Never")
        );
        assert!(user.client_key_data.is_none() && user.client_certificate_data.is_none());
        assert_eq!(parsed.current_context.as_deref(), Some("demo-admin@demo"));
        assert_eq!(ca_pem(&text).unwrap(), "CA PEM");
    }

    #[test]
    fn the_credential_carries_the_pem_and_expires_within_the_hour_or_with_the_certificate() {
        let (text, cert, key) = secret_kubeconfig((2030, 1, 1));
        let now: k8s_openapi::jiff::Timestamp = "2026-12-07T13:00:00Z".parse().unwrap();
        let credential: Value = serde_json::from_str(&exec_credential(&text, now).unwrap()).unwrap();
        assert_eq!(credential["apiVersion"], EXEC_API_VERSION);
        assert_eq!(credential["kind"], "ExecCredential");
        assert_eq!(credential["status"]["clientCertificateData"], cert.as_str());
        assert_eq!(credential["status"]["clientKeyData"], key.as_str());
        assert_eq!(credential["status"]["expirationTimestamp"], "2026-12-07T14:00:00Z");
        // A certificate that ends sooner ends the credential.
        let (soon, _, _) = secret_kubeconfig((2026, 12, 7));
        let late: k8s_openapi::jiff::Timestamp = "2026-12-06T23:30:00Z".parse().unwrap();
        let credential: Value = serde_json::from_str(&exec_credential(&soon, late).unwrap()).unwrap();
        assert_eq!(credential["status"]["expirationTimestamp"], "2026-12-07T00:00:00Z");
        let err = exec_credential("users: []", now).unwrap_err().to_string();
        assert!(err.contains("client-certificate-data"), "{err}");
    }

    #[test]
    fn the_state_dir_is_one_per_super_cluster_namespace_and_name() {
        let home = Path::new("/home/ada");
        let one = default_state_dir(None, Some(home), "https://super:6443/", "tenant-a", "demo").unwrap();
        assert!(
            one.starts_with("/home/ada/.local/state/capn/connect"),
            "{}",
            one.display()
        );
        let leaf = one.file_name().unwrap().to_str().unwrap();
        assert!(
            leaf.starts_with("tenant-a-demo-") && leaf.len() == "tenant-a-demo-".len() + 8,
            "{leaf}"
        );
        let other = default_state_dir(None, Some(home), "https://other:6443/", "tenant-a", "demo").unwrap();
        assert_ne!(one, other, "another super cluster, another directory");
        let xdg = default_state_dir(
            Some(Path::new("/xdg")),
            Some(home),
            "https://super:6443/",
            "tenant-a",
            "demo",
        );
        assert_eq!(xdg.unwrap(), Path::new("/xdg/capn/connect").join(leaf));
        // A relative XDG_STATE_HOME is ignored, as the spec says.
        let relative = default_state_dir(
            Some(Path::new("rel")),
            Some(home),
            "https://super:6443/",
            "tenant-a",
            "demo",
        );
        assert_eq!(relative.unwrap(), one);
        assert!(default_state_dir(None, None, "s", "n", "d").is_err());
    }

    #[test]
    fn the_port_is_picked_once_and_reused() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        prepare_state_dir(&state).unwrap();
        assert_eq!(std::fs::metadata(&state).unwrap().permissions().mode() & 0o777, 0o700);
        let port = state_port(&state).unwrap();
        assert_ne!(port, 0);
        assert_eq!(state_port(&state).unwrap(), port);
    }

    #[tokio::test]
    async fn a_listener_is_idle_only_without_connections() {
        let connections = crate::reach::Connections::default();
        let timeout = Duration::from_millis(40);
        tokio::time::timeout(Duration::from_secs(5), idle(&connections, timeout))
            .await
            .expect("idle with no connection");
    }
}
