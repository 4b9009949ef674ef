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
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
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

/// `capn kubeconfig`: prints the admin kubeconfig; when its server's name does not resolve
/// here and no `--server` is given, says on stderr how to reach it.
///
/// # Errors
/// As [`admin_kubeconfig`] and [`point_at`]; the super cluster's configuration cannot be read.
pub async fn kubeconfig(args: KubeconfigArgs) -> anyhow::Result<()> {
    let (client, _, namespace) = super_cluster(args.namespace).await?;
    let (text, _) = admin_kubeconfig(&client, &namespace, &args.name).await?;
    let (host, port) = server_of(&text)?;
    if let Some(server) = &args.server {
        print!("{}", point_at(&text, server, &host)?);
        return Ok(());
    }
    if tokio::net::lookup_host((host.as_str(), port)).await.is_err() {
        eprintln!(
            "Note: {host} resolves only inside the super cluster. From here, run `capn connect {name} -n {namespace}` \
             (a local endpoint that follows apiserver rolls and CA rotations), or pass --server with an address that \
             reaches the apiserver.",
            name = args.name
        );
    }
    print!("{text}");
    Ok(())
}

/// `capn connect`: serves the local endpoint and keeps its kubeconfig current until Ctrl-C
/// (or SIGTERM).
///
/// # Errors
/// As [`admin_kubeconfig`]; the server is not an in-cluster name; the local address cannot
/// be bound; the kubeconfig file cannot be written.
pub async fn connect(args: ConnectArgs) -> anyhow::Result<()> {
    let (client, config, namespace) = super_cluster(args.namespace.clone()).await?;
    let streams = crate::client::upgrade_client(config)?;
    let (text, secret_name) = admin_kubeconfig(&client, &namespace, &args.name).await?;
    let (host, port) = server_of(&text)?;
    let target = Target::of_name(&host).with_context(|| {
        format!("the kubeconfig's server {host} is not an in-cluster name: dial it as it is (capn kubeconfig)")
    })?;
    let metrics = Arc::new(crate::telemetry::Metrics::default());
    let (address, listener) = crate::reach::listen(streams, target, port, args.local_address, metrics)
        .await
        .with_context(|| format!("listening on {}", args.local_address))?;
    let path = args
        .kubeconfig_out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("{}.kubeconfig", args.name)));
    let server = format!("https://{address}");
    write_private(&path, &point_at(&text, &server, &host)?)?;
    eprintln!(
        "Forwarding {server} to {host}:{port} through the super cluster (pods/portforward).\n\
         Wrote {path}; it is rewritten when the control plane's certificates change.\n\n  export KUBECONFIG={path}\n\n\
         Ctrl-C stops.",
        path = path.display()
    );
    let secrets = Api::<Secret>::namespaced(client, &namespace);
    let follow = follow_secret(secrets, &secret_name, &path, &server, &host, text);
    let stop = shutdown_signal();
    tokio::select! {
        result = follow => result?,
        () = stop => {}
    }
    listener.abort();
    Ok(())
}

/// Rewrites `path` whenever the kubeconfig in Secret `name` changes. Returns only on a
/// failed write (a watch error is retried by the watcher's backoff).
async fn follow_secret(
    secrets: Api<Secret>,
    name: &str,
    path: &Path,
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
            write_private(path, &point_at(&text, server, host)?)?;
            eprintln!(
                "Rewrote {}: the control plane's kubeconfig changed (renewed certificate or CA rotation).",
                path.display()
            );
            written = text;
        }
    }
    Ok(())
}

/// The super cluster's client (the current kubeconfig, or in-cluster), its configuration
/// (for the HTTP/1.1 client of port-forwards) and the namespace: `namespace`, else the
/// current context's.
async fn super_cluster(namespace: Option<String>) -> anyhow::Result<(kube::Client, kube::Config, String)> {
    let config = kube::Config::infer()
        .await
        .context("reading the super cluster's configuration (KUBECONFIG, ~/.kube/config or in-cluster)")?;
    let namespace = namespace.unwrap_or_else(|| config.default_namespace.clone());
    let client = crate::client::client(config.clone()).context("connecting to the super cluster")?;
    Ok((client, config, namespace))
}

/// Writes `text` to `path` readable by the owner only, through a temporary file renamed
/// over it, so that a kubectl reading it meanwhile never sees half a file. A file already
/// there keeps its owner where this process may set it (root rewriting a user's file).
fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::MetadataExt as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let temporary = dir.join(format!(
        ".{}.tmp",
        path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default()
    ));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temporary)
        .with_context(|| format!("writing {}", temporary.display()))?;
    file.write_all(text.as_bytes())
        .with_context(|| format!("writing {}", temporary.display()))?;
    if let Ok(before) = std::fs::metadata(path) {
        // Best effort: an unprivileged process cannot give a file away, and needs not.
        let _ = std::os::unix::fs::fchown(&file, Some(before.uid()), Some(before.gid()));
    }
    std::fs::rename(&temporary, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
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

    #[test]
    fn the_written_file_is_private_and_replaced_whole() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("demo.kubeconfig");
        write_private(&path, "one").unwrap();
        write_private(&path, "two").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "two");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temporary file left"
        );
    }
}
