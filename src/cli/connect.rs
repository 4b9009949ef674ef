//! `capn kubeconfig` and `capn connect`: a tenant's admin kubeconfig that works from where
//! they run, the habit of `vcluster connect` (docs/guide/connect.md).
//!
//! capn writes each control plane's admin kubeconfig into the Secret `<cluster>-kubeconfig`
//! with the apiserver's in-cluster name (`https://<cluster>-apiserver.<ns>.svc:6443`), which
//! resolves only in the super cluster's pod network. `capn kubeconfig` prints it, pointed at
//! a `--server` of the user's when given. `capn connect` serves a local endpoint that
//! reaches the apiserver through the super cluster's `pods/portforward` (a ready pod picked
//! per connection, so it follows rolls: [`crate::reach`]), writes a kubeconfig for it that
//! still verifies the certificate for the in-cluster name (`tls-server-name`), and rewrites
//! that file whenever the Secret changes (renewed certificates, a CA rotation), so kubectl,
//! which reads the file on every call, keeps working without the user doing anything.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use clap::Args;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::{WatchStreamExt as _, watcher};
use serde_json::Value;

use super::credential;
use super::files::{write_if_changed, write_private};
use crate::api::NestedControlPlane;
use crate::controllers::shared::read::cluster_name;
use crate::pki::{SecretNames, kubeconfig_from_secret};
use crate::reach::Target;

/// `capn kubeconfig`'s arguments.
#[derive(Debug, Args)]
pub struct KubeconfigArgs {
    /// The NestedControlPlane.
    pub name: String,
    /// Its namespace in the super cluster (default: the current context's namespace).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Dial the apiserver at this URL instead (`https://ADDRESS:PORT`: a load balancer, a
    /// node port, `capn connect`'s endpoint); the certificate is still verified for the
    /// in-cluster name.
    #[arg(long, value_name = "URL", conflicts_with = "direct")]
    pub server: Option<String>,
    /// Print the Secret's kubeconfig as it is (its server the in-cluster name), also where
    /// that name does not resolve; without it, such a kubeconfig is printed in the exec form,
    /// which reaches the apiserver through a background `capn connect`.
    #[arg(long)]
    pub direct: bool,
    /// The exec form's state directory (its port, CA file, the background connect's log and
    /// pid). Default: `$XDG_STATE_HOME/capn/connect/<ns>-<name>-<hash of the super cluster's
    /// URL>`, `~/.local/state/...` without `XDG_STATE_HOME`.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    #[command(flatten)]
    pub super_cluster: SuperClusterArgs,
}

/// Which super cluster to read, when not the current kubeconfig's current context.
#[derive(Debug, Args)]
pub struct SuperClusterArgs {
    /// The super cluster's kubeconfig file (default: `KUBECONFIG`, `~/.kube/config`, or
    /// in-cluster). The exec form pins it in the plugin's arguments.
    #[arg(long, value_name = "FILE")]
    pub super_kubeconfig: Option<PathBuf>,
    /// The context of the super cluster's kubeconfig to use (default: its current context).
    #[arg(long, value_name = "NAME")]
    pub super_context: Option<String>,
}

/// `capn connect`'s arguments.
#[derive(Debug, Args)]
pub struct ConnectArgs {
    /// The NestedControlPlane.
    pub name: String,
    /// Its namespace in the super cluster (default: the current context's namespace).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Where the local endpoint listens (`ADDRESS:PORT`; port 0 picks a free one).
    #[arg(long, value_name = "ADDRESS:PORT", default_value = "127.0.0.1:0")]
    pub local_address: SocketAddr,
    /// The kubeconfig file written for the local endpoint, and kept current (mode 0600: it
    /// holds the admin key). Default: `<name>.kubeconfig` in the current directory.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig_out: Option<PathBuf>,
    /// Also write the tenant's CA (PEM) to this file, and keep it current.
    #[arg(long, value_name = "FILE")]
    pub ca_out: Option<PathBuf>,
    /// Write this process's pid to this file once the endpoint listens (removed on exit).
    #[arg(long, value_name = "FILE")]
    pub pid_file: Option<PathBuf>,
    /// Exit after this long (a Go duration: `90s`, `1h`) without a connection to the
    /// endpoint. Default: never (the plugin starts its connect with 1h).
    #[arg(long, value_name = "DURATION", value_parser = super::parse_duration)]
    pub idle_timeout: Option<std::time::Duration>,
    /// The exec credential plugin of `capn kubeconfig`'s exec form (kubectl runs it): make
    /// sure a background connect serves `--local-address`, then print an ExecCredential.
    #[arg(long, hide = true, requires = "state_dir")]
    pub credential: bool,
    /// Stop the background connect of the exec form (the one whose pid is in the state
    /// directory).
    #[arg(long, conflicts_with = "credential")]
    pub stop: bool,
    /// The exec form's state directory (as `capn kubeconfig --state-dir`).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    #[command(flatten)]
    pub super_cluster: SuperClusterArgs,
}

/// A kubeconfig's first cluster's server, as host and port (443 when the URL has none).
///
/// # Errors
/// The text is not a kubeconfig with a cluster whose `server` is an `https://` URL.
pub fn server_of(kubeconfig: &str) -> anyhow::Result<(String, u16)> {
    let doc: Value = serde_saphyr::from_str(kubeconfig).context("the kubeconfig does not parse")?;
    let server = doc["clusters"][0]["cluster"]["server"]
        .as_str()
        .context("the kubeconfig names no cluster server")?;
    let uri: http::Uri = server
        .parse()
        .with_context(|| format!("the kubeconfig's server {server:?} is not a URL"))?;
    let host = uri
        .host()
        .with_context(|| format!("the kubeconfig's server {server:?} has no host"))?;
    Ok((host.trim_matches(['[', ']']).to_owned(), uri.port_u16().unwrap_or(443)))
}

/// `kubeconfig` with every cluster's `server` set to `server` and its certificate verified
/// for `tls_server_name` (kubectl's `tls-server-name`), as YAML. The credentials and the CA
/// are kept as they are.
///
/// # Errors
/// The text is not a YAML kubeconfig with a `clusters` list.
pub fn point_at(kubeconfig: &str, server: &str, tls_server_name: &str) -> anyhow::Result<String> {
    let mut doc: Value = serde_saphyr::from_str(kubeconfig).context("the kubeconfig does not parse")?;
    let clusters = doc["clusters"]
        .as_array_mut()
        .context("the kubeconfig has no clusters")?;
    for cluster in clusters {
        let cluster = cluster
            .get_mut("cluster")
            .and_then(Value::as_object_mut)
            .context("a kubeconfig cluster without `cluster`")?;
        cluster.insert("server".into(), server.into());
        cluster.insert("tls-server-name".into(), tls_server_name.into());
    }
    Ok(serde_saphyr::to_string(&doc)?)
}

/// The admin kubeconfig of the NestedControlPlane `name` in `namespace`, and the name of the
/// Secret that holds it.
///
/// # Errors
/// No such NestedControlPlane (with a hint that the current kubeconfig must be the super
/// cluster's), its kubeconfig Secret not written yet, or one without a kubeconfig.
pub async fn admin_kubeconfig(client: &kube::Client, namespace: &str, name: &str) -> anyhow::Result<(String, String)> {
    let ncp = Api::<NestedControlPlane>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .with_context(|| format!("reading NestedControlPlane {namespace}/{name}"))?
        .with_context(|| {
            format!(
                "no NestedControlPlane {name} in namespace {namespace} of this cluster: capn reads the super cluster, \
                 so the current kubeconfig must be the super cluster's (pass -n for another namespace)"
            )
        })?;
    let secret_name = SecretNames::new(&cluster_name(&ncp)).kubeconfig;
    let secret = Api::<Secret>::namespaced(client.clone(), namespace)
        .get_opt(&secret_name)
        .await
        .with_context(|| format!("reading Secret {namespace}/{secret_name}"))?
        .with_context(|| {
            format!(
                "Secret {namespace}/{secret_name} is not written yet: the control plane is still being set up \
                 (kubectl get -n {namespace} nestedcontrolplane {name})"
            )
        })?;
    let text = kubeconfig_from_secret(&secret).with_context(|| format!("Secret {namespace}/{secret_name}"))?;
    Ok((text, secret_name))
}

/// `capn kubeconfig`: prints the admin kubeconfig: pointed at `--server` when given; as it
/// is with `--direct` or where its server's name resolves; else in the exec form
/// ([`super::credential`]), writing the state directory's port and CA files first.
///
/// # Errors
/// As [`admin_kubeconfig`] and [`point_at`]; the super cluster's configuration cannot be
/// read; for the exec form, no super-cluster kubeconfig file to pin, or the state directory
/// cannot be written.
pub async fn kubeconfig(args: KubeconfigArgs) -> anyhow::Result<()> {
    let (client, config, namespace) = super_cluster(args.namespace.clone(), &args.super_cluster).await?;
    let (text, _) = admin_kubeconfig(&client, &namespace, &args.name).await?;
    let (host, port) = server_of(&text)?;
    if let Some(server) = &args.server {
        print!("{}", point_at(&text, server, &host)?);
        return Ok(());
    }
    if args.direct || crate::reach::resolves(&host, port).await {
        print!("{text}");
        return Ok(());
    }
    let (super_file, super_context) = pinned_super_cluster(&args.super_cluster)?;
    let state = match &args.state_dir {
        Some(dir) => std::path::absolute(dir).with_context(|| format!("{}", dir.display()))?,
        None => credential::state_dir_here(config.cluster_url.to_string().as_str(), &namespace, &args.name)?,
    };
    credential::prepare_state_dir(&state)?;
    let local_port = credential::state_port(&state)?;
    let ca_file = state.join(credential::CA_FILE);
    write_if_changed(&ca_file, &credential::ca_pem(&text)?)?;
    let local = format!("127.0.0.1:{local_port}");
    let mut plugin = vec![
        "connect".to_owned(),
        args.name.clone(),
        "-n".to_owned(),
        namespace.clone(),
        "--credential".to_owned(),
        "--local-address".to_owned(),
        local.clone(),
        "--state-dir".to_owned(),
        state.display().to_string(),
        "--super-kubeconfig".to_owned(),
        super_file.display().to_string(),
    ];
    if let Some(context) = super_context {
        plugin.extend(["--super-context".to_owned(), context]);
    }
    let exe = std::env::current_exe().context("finding capn's own executable")?;
    print!(
        "{}",
        credential::exec_kubeconfig(&text, &format!("https://{local}"), &host, &ca_file, &exe, &plugin)?
    );
    Ok(())
}

/// The super cluster's kubeconfig file (absolute) and context to pin in the plugin's
/// arguments: the given ones, else `KUBECONFIG`'s first file (or `~/.kube/config`) and the
/// current context of the merged `KUBECONFIG`.
fn pinned_super_cluster(args: &SuperClusterArgs) -> anyhow::Result<(PathBuf, Option<String>)> {
    let file = match &args.super_kubeconfig {
        Some(file) => file.clone(),
        None => std::env::var_os("KUBECONFIG")
            .and_then(|v| std::env::split_paths(&v).find(|p| !p.as_os_str().is_empty()))
            .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".kube/config")))
            .context("no KUBECONFIG and no HOME: pass --super-kubeconfig")?,
    };
    let file = std::fs::canonicalize(&file).with_context(|| {
        format!(
            "the exec form pins the super cluster's kubeconfig file, and {} cannot be read (pass --super-kubeconfig, or --direct for the Secret's kubeconfig as it is)",
            file.display()
        )
    })?;
    let context = match &args.super_context {
        Some(context) => Some(context.clone()),
        None => kube::config::Kubeconfig::read()
            .ok()
            .and_then(|k| k.current_context)
            .or_else(|| {
                kube::config::Kubeconfig::read_from(&file)
                    .ok()
                    .and_then(|k| k.current_context)
            }),
    };
    Ok((file, context))
}

/// `capn connect`: serves the local endpoint and keeps its kubeconfig (and CA file) current
/// until Ctrl-C, SIGTERM or `--idle-timeout`; with `--credential`, the exec plugin
/// ([`credential`]); with `--stop`, stops the exec form's background connect.
///
/// # Errors
/// As [`admin_kubeconfig`]; the server is not an in-cluster name; the local address cannot
/// be bound; the kubeconfig, CA or pid file cannot be written.
pub async fn connect(args: ConnectArgs) -> anyhow::Result<()> {
    let (client, config, namespace) = super_cluster(args.namespace.clone(), &args.super_cluster).await?;
    if args.stop {
        return stop(&args, &config, &namespace);
    }
    let (text, secret_name) = admin_kubeconfig(&client, &namespace, &args.name).await?;
    if args.credential {
        return credential(&args, &namespace, &text).await;
    }
    let streams = crate::client::upgrade_client(config)?;
    let (host, port) = server_of(&text)?;
    let target = Target::of_name(&host).with_context(|| {
        format!("the kubeconfig's server {host} is not an in-cluster name: dial it as it is (capn kubeconfig)")
    })?;
    let metrics = Arc::new(crate::telemetry::Metrics::default());
    let connections = Arc::new(crate::reach::Connections::default());
    let (address, listener) =
        crate::reach::listen(streams, target, port, args.local_address, metrics, connections.clone())
            .await
            .with_context(|| format!("listening on {}", args.local_address))?;
    let _pid = match &args.pid_file {
        Some(path) => Some(PidFile::write(path)?),
        None => None,
    };
    let path = args
        .kubeconfig_out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("{}.kubeconfig", args.name)));
    let server = format!("https://{address}");
    write_private(&path, &point_at(&text, &server, &host)?)?;
    if let Some(ca) = &args.ca_out {
        write_if_changed(ca, &credential::ca_pem(&text)?)?;
    }
    eprintln!(
        "Forwarding {server} to {host}:{port} through the super cluster (pods/portforward).\n\
         Wrote {path}; it is rewritten when the control plane's certificates change.\n\n  export KUBECONFIG={path}\n\n\
         Ctrl-C stops.",
        path = path.display()
    );
    let secrets = Api::<Secret>::namespaced(client, &namespace);
    let files = Files {
        kubeconfig: &path,
        ca: args.ca_out.as_deref(),
    };
    let follow = follow_secret(secrets, &secret_name, files, &server, &host, text);
    let stop = shutdown_signal();
    let idle = async {
        match args.idle_timeout {
            Some(timeout) => credential::idle(&connections, timeout).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        result = follow => result?,
        () = stop => {}
        () = idle => eprintln!(
            "No connection to {server} for {}: exiting (--idle-timeout).",
            kube::core::Duration::from(args.idle_timeout.unwrap_or_default())
        ),
    }
    listener.abort();
    Ok(())
}

/// `capn connect --credential`: the exec plugin. Keeps the state directory's CA file
/// current, makes sure a background connect serves `--local-address` (starting one with
/// the same super cluster, `--idle-timeout` or [`credential::DAEMON_IDLE`]), then prints
/// the `ExecCredential` on standard output, and nothing else there.
async fn credential(args: &ConnectArgs, namespace: &str, text: &str) -> anyhow::Result<()> {
    let state = args.state_dir.as_deref().context("--credential needs --state-dir")?;
    if args.local_address.port() == 0 {
        anyhow::bail!("--credential needs the --local-address the kubeconfig dials, with its port");
    }
    credential::prepare_state_dir(state)?;
    write_if_changed(&state.join(credential::CA_FILE), &credential::ca_pem(text)?)?;
    let idle = args.idle_timeout.unwrap_or(credential::DAEMON_IDLE);
    let path = |file: &str| state.join(file).display().to_string();
    let mut daemon = vec![
        "connect".to_owned(),
        args.name.clone(),
        "-n".to_owned(),
        namespace.to_owned(),
        "--local-address".to_owned(),
        args.local_address.to_string(),
        "--kubeconfig-out".to_owned(),
        path(credential::KUBECONFIG_FILE),
        "--ca-out".to_owned(),
        path(credential::CA_FILE),
        "--pid-file".to_owned(),
        path(credential::PID_FILE),
        "--idle-timeout".to_owned(),
        kube::core::Duration::from(idle).to_string(),
    ];
    if let Some(file) = &args.super_cluster.super_kubeconfig {
        daemon.extend(["--super-kubeconfig".to_owned(), file.display().to_string()]);
    }
    if let Some(context) = &args.super_cluster.super_context {
        daemon.extend(["--super-context".to_owned(), context.clone()]);
    }
    credential::ensure_daemon(args.local_address, state, &daemon).await?;
    print!(
        "{}",
        credential::exec_credential(text, k8s_openapi::jiff::Timestamp::now())?
    );
    Ok(())
}

/// `capn connect --stop`: sends SIGTERM to the background connect whose pid the state
/// directory holds.
fn stop(args: &ConnectArgs, config: &kube::Config, namespace: &str) -> anyhow::Result<()> {
    let state = match &args.state_dir {
        Some(dir) => dir.clone(),
        None => credential::state_dir_here(config.cluster_url.to_string().as_str(), namespace, &args.name)?,
    };
    let pid_file = state.join(credential::PID_FILE);
    let Ok(pid) = std::fs::read_to_string(&pid_file) else {
        eprintln!(
            "No background capn connect for {namespace}/{} ({} is absent).",
            args.name,
            pid_file.display()
        );
        return Ok(());
    };
    let pid: u32 = pid
        .trim()
        .parse()
        .with_context(|| format!("{} holds no pid", pid_file.display()))?;
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .context("running kill")?;
    if !status.success() {
        let _ = std::fs::remove_file(&pid_file);
        anyhow::bail!("no process {pid} (from {}): removed the stale file", pid_file.display());
    }
    eprintln!(
        "Stopped the background capn connect for {namespace}/{} (pid {pid}).",
        args.name
    );
    Ok(())
}

/// A pid file of this process, removed when dropped if it still names this process.
struct PidFile(PathBuf);

impl PidFile {
    fn write(path: &Path) -> anyhow::Result<Self> {
        write_private(path, &format!("{}\n", std::process::id()))?;
        Ok(Self(path.to_path_buf()))
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        let ours = std::fs::read_to_string(&self.0).is_ok_and(|t| t.trim() == std::process::id().to_string());
        if ours {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

/// The files [`follow_secret`] keeps current.
struct Files<'a> {
    /// The kubeconfig for the local endpoint.
    kubeconfig: &'a Path,
    /// The CA file, when asked for.
    ca: Option<&'a Path>,
}

/// Rewrites the files whenever the kubeconfig in Secret `name` changes. Returns only on a
/// failed write (a watch error is retried by the watcher's backoff).
async fn follow_secret(
    secrets: Api<Secret>,
    name: &str,
    files: Files<'_>,
    server: &str,
    host: &str,
    mut written: String,
) -> anyhow::Result<()> {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = std::pin::pin!(watcher(secrets, config).default_backoff());
    while let Some(event) = events.next().await {
        let secret = match event {
            Ok(watcher::Event::Apply(secret) | watcher::Event::InitApply(secret)) => secret,
            Ok(_) => continue,
            Err(error) => {
                tracing::warn!(%error, "watching the kubeconfig Secret");
                continue;
            }
        };
        let Ok(text) = kubeconfig_from_secret(&secret) else {
            continue;
        };
        if text != written {
            if let Some(ca) = files.ca {
                write_if_changed(ca, &credential::ca_pem(&text)?)?;
            }
            write_private(files.kubeconfig, &point_at(&text, server, host)?)?;
            eprintln!(
                "Rewrote {}: the control plane's kubeconfig changed (renewed certificate or CA rotation).",
                files.kubeconfig.display()
            );
            written = text;
        }
    }
    Ok(())
}

/// The super cluster's client (`pinned`'s kubeconfig file and context, else the current
/// kubeconfig, or in-cluster), its configuration (for the HTTP/1.1 client of port-forwards)
/// and the namespace: `namespace`, else the context's.
async fn super_cluster(
    namespace: Option<String>,
    pinned: &SuperClusterArgs,
) -> anyhow::Result<(kube::Client, kube::Config, String)> {
    let options = kube::config::KubeConfigOptions {
        context: pinned.super_context.clone(),
        ..Default::default()
    };
    let config = match (&pinned.super_kubeconfig, &pinned.super_context) {
        (Some(file), _) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(file)
                .with_context(|| format!("reading the super cluster's kubeconfig {}", file.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .with_context(|| format!("the super cluster's kubeconfig {}", file.display()))?
        }
        (None, Some(_)) => kube::Config::from_kubeconfig(&options)
            .await
            .context("reading the super cluster's configuration (KUBECONFIG or ~/.kube/config)")?,
        (None, None) => kube::Config::infer()
            .await
            .context("reading the super cluster's configuration (KUBECONFIG, ~/.kube/config or in-cluster)")?,
    };
    let namespace = namespace.unwrap_or_else(|| config.default_namespace.clone());
    let client = crate::client::client(config.clone()).context("connecting to the super cluster")?;
    Ok((client, config, namespace))
}

/// Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBECONFIG: &str = "apiVersion: v1
kind: Config
clusters:
- name: demo
  cluster:
    server: https://demo-apiserver.tenant-a.svc:6443
    certificate-authority-data: Q0E=
users:
- name: demo-admin
  user:
    client-certificate-data: Q0VSVA==
    client-key-data: S0VZ
contexts:
- name: demo-admin@demo
  context: {cluster: demo, user: demo-admin}
current-context: demo-admin@demo
";

    #[test]
    fn the_server_is_read_as_host_and_port() {
        assert_eq!(
            server_of(KUBECONFIG).unwrap(),
            ("demo-apiserver.tenant-a.svc".to_owned(), 6443)
        );
        let v6 = KUBECONFIG.replace("demo-apiserver.tenant-a.svc:6443", "[fd00::1]");
        assert_eq!(server_of(&v6).unwrap(), ("fd00::1".to_owned(), 443));
        let err = server_of("clusters: []").unwrap_err().to_string();
        assert!(err.contains("no cluster server"), "{err}");
    }

    #[test]
    fn pointing_at_another_server_keeps_the_credentials_and_verifies_the_in_cluster_name() {
        let text = point_at(KUBECONFIG, "https://127.0.0.1:40123", "demo-apiserver.tenant-a.svc").unwrap();
        let doc: Value = serde_saphyr::from_str(&text).unwrap();
        let cluster = &doc["clusters"][0]["cluster"];
        assert_eq!(cluster["server"], "https://127.0.0.1:40123");
        assert_eq!(cluster["tls-server-name"], "demo-apiserver.tenant-a.svc");
        assert_eq!(cluster["certificate-authority-data"], "Q0E=");
        assert_eq!(doc["users"][0]["user"]["client-key-data"], "S0VZ");
        assert_eq!(doc["current-context"], "demo-admin@demo");
        // kube reads it as the kubeconfig it is.
        let parsed = kube::config::Kubeconfig::from_yaml(&text).unwrap();
        assert_eq!(
            parsed.clusters[0].cluster.as_ref().unwrap().tls_server_name.as_deref(),
            Some("demo-apiserver.tenant-a.svc")
        );
        assert!(point_at("kind: Config", "https://x", "y").is_err());
    }
}
