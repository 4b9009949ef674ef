//! The `capn` command line: `run`, `render`, `kubeconfig`, `connect`, `crds`, `channels`,
//! `version`.

pub mod connect;
pub mod credential;
mod files;
mod render;
pub mod restore;
mod run;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand, ValueEnum};

pub use render::{InputError, Problem, RenderErrors, RenderOptions, Rendered, error_reason, render_documents};
pub use run::{LeaderElection, run};

use crate::channel::ChannelRegistry;
use crate::controllers::{EnabledControllers, Settings};

/// capn runs nested Kubernetes control planes (etcd, kube-apiserver,
/// kube-controller-manager) as workloads of a super cluster, as a Cluster API control plane
/// and infrastructure provider.
#[derive(Debug, Parser)]
#[command(
    name = "capn",
    version,
    about,
    long_about = None,
    propagate_version = true,
    after_help = "Examples:\n  capn run --leader-elect                      run the controllers (current kubeconfig or in-cluster)\n  capn render -f examples/nestedcontrolplane.yaml   what one NestedControlPlane becomes, offline\n  capn crds | kubectl apply -f -               install the CustomResourceDefinitions\n  capn priority-class | kubectl apply -f -     install the components' default PriorityClass\n  capn channels validate ./my-channels         check a custom channel before shipping it"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once at start-up: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the controllers against the cluster of the current kubeconfig (or in-cluster).
    Run(RunArgs),
    /// Print, offline, the objects that the resources in a file would produce
    /// (multi-document YAML; Secrets by name only).
    Render(RenderArgs),
    /// Print the CustomResourceDefinitions capn serves.
    Crds,
    /// Print the PriorityClass the components run with by default (cluster-scoped; the
    /// clusterctl control plane components install it too).
    PriorityClass,
    /// Inspect channels.
    Channels {
        #[command(subcommand)]
        command: ChannelsCommand,
    },
    /// Print a tenant's admin kubeconfig (`<cluster>-kubeconfig`), read from the super
    /// cluster: as it is where its server resolves (or `--direct`), pointed at a `--server`
    /// of yours, else in the exec form that reaches it through a background `capn connect`.
    Kubeconfig(connect::KubeconfigArgs),
    /// Serve a local endpoint for a tenant's apiserver through the super cluster, write a
    /// kubeconfig for it and keep that file current across apiserver rolls and CA rotations
    /// (like `vcluster connect`), until Ctrl-C (or `--idle-timeout`); `--stop` stops the
    /// exec form's background one.
    Connect(connect::ConnectArgs),
    /// Print capn's version.
    Version,
    /// The steps of an etcd member's restore that run in capn's image (init containers
    /// rendered while a NestedEtcd's `spec.restore` is pending).
    EtcdRestore {
        #[command(subcommand)]
        command: restore::RestoreCommand,
    },
}

#[derive(Debug, Args)]
pub struct ChannelArgs {
    /// Directory of extra channels (repeatable); a channel of the same name as a built-in
    /// one replaces it.
    #[arg(long = "channels-dir", value_name = "DIR")]
    pub channels_dirs: Vec<PathBuf>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub channels: ChannelArgs,
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "CAPN_NAMESPACE")]
    pub namespace: Option<String>,
    /// Controllers to run, like kube-controller-manager's flag: `*` enables all, `-name`
    /// disables one. Names: control-plane, etcd, apiserver, controller-manager, cluster,
    /// public-crds, syncer.
    #[arg(long, value_delimiter = ',', default_value = "*")]
    pub controllers: Vec<String>,
    /// DNS domain of the super cluster, used in certificate SANs.
    #[arg(long, default_value = crate::plan::DEFAULT_DNS_DOMAIN)]
    pub super_cluster_dns_domain: String,
    /// Reconcile only resources labelled `cluster.x-k8s.io/watch-filter=VALUE`.
    #[arg(long, value_name = "VALUE")]
    pub watch_filter: Option<String>,
    /// Address of the Prometheus metrics endpoint (`/metrics`).
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub metrics_bind_address: std::net::SocketAddr,
    /// Address of the health probes (`/healthz`, `/readyz`).
    #[arg(long, default_value = "0.0.0.0:8081")]
    pub health_probe_bind_address: std::net::SocketAddr,
    /// Run the controllers only while holding a Lease, so that several replicas can run.
    #[arg(long)]
    pub leader_elect: bool,
    /// Namespace of the leader election Lease (default: the pod's namespace, else `default`).
    #[arg(long, env = "POD_NAMESPACE")]
    pub leader_election_namespace: Option<String>,
    /// Name of the leader election Lease.
    #[arg(long, default_value = "capn-leader-election")]
    pub leader_election_id: String,
    /// Seconds a Lease stays valid without renewal.
    #[arg(long, default_value_t = 15)]
    pub leader_election_lease_duration: u64,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Lifetime of the leaf certificates capn issues, as a Go duration (`5m`, `8760h`), for
    /// control planes that do not set `certificateValidityPeriod`. Default one year; short
    /// values are for tests and demos of certificate renewal.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub certificate_validity: Option<std::time::Duration>,
    /// How long one step of a stepped upgrade may take before it is marked failed (a Go
    /// duration); the preflight also waits while a certificate expires or is renewed within
    /// this time.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "30m")]
    pub upgrade_step_timeout: std::time::Duration,
    /// Namespace capn's own pods run in (the clusterctl Deployment passes the downward API's
    /// `POD_NAMESPACE`). The tenants' NetworkPolicies admit capn's pods from it (pods labelled
    /// `--self-labels`) to etcd and the apiserver; empty when capn runs outside the super
    /// cluster, and then no pod is admitted for it.
    #[arg(long, env = "POD_NAMESPACE", value_name = "NS")]
    pub self_namespace: Option<String>,
    /// Labels of capn's own pods, `key=value[,key=value]`, for the same NetworkPolicy peer.
    #[arg(long, value_delimiter = ',', default_value = crate::plan::policy::DEFAULT_CAPN_POD_LABELS, value_name = "LABELS")]
    pub self_labels: Vec<String>,
    /// capn's own image: the etcd restore init containers run `capn etcd-restore` from it.
    #[arg(long, env = "CAPN_IMAGE", default_value = crate::controllers::DEFAULT_CAPN_IMAGE, value_name = "IMAGE")]
    pub capn_image: String,
    /// A file in `/etc/hosts` format mapping the tenants' in-cluster names (etcd members
    /// `<c>-etcd-<i>.<c>-etcd.<ns>.svc`, apiservers `<c>-apiserver.<ns>.svc`) to addresses
    /// that override `--tenant-connection` for those names: etcd membership and backups,
    /// the upgrade preflight, the public CRD sync and the syncer dial through it. Read
    /// again when it changes; TLS still verifies the name. Needed by nothing since
    /// `--tenant-connection` (the tests use it to stand in for cluster DNS).
    #[arg(long, value_name = "FILE")]
    pub etcd_hosts_file: Option<std::path::PathBuf>,
    /// How capn connects to tenant apiservers and etcd members: `auto` dials their
    /// in-cluster names where those resolve (in a super cluster) and goes through the super
    /// cluster's `pods/portforward` where they do not (a laptop, CI, another cluster);
    /// `direct` and `port-forward` force one path. TLS is verified for the in-cluster
    /// name on both.
    #[arg(long, env = "CAPN_TENANT_CONNECTION", value_enum, default_value = "auto")]
    pub tenant_connection: crate::reach::TenantConnection,
    /// How often the syncer's patrol removes what outlived its tenant object (super pods of
    /// deleted tenant pods, unused copies) and the workloads of deleted control planes, as
    /// a Go duration.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "60s")]
    pub syncer_patrol_interval: std::time::Duration,
    /// Where the syncer serves the tenant Nodes' kubelet API (`kubectl logs`, `exec`,
    /// `attach`, `port-forward` in a tenant):
    /// `ADDRESS:PORT`, port 0 for a free one.
    #[arg(long, value_name = "ADDRESS:PORT", default_value = "0.0.0.0:10250")]
    pub kubelet_bind_address: std::net::SocketAddr,
    /// The address tenant apiservers dial for the kubelet API, announced as each tenant
    /// Node's InternalDNS (their InternalIP is the super node's): capn's pod IP in a super
    /// cluster (the clusterctl Deployment passes the downward API's `POD_IP`). Unset, no
    /// kubelet API is served.
    #[arg(long, env = "POD_IP", value_name = "ADDRESS")]
    pub kubelet_advertise_address: Option<std::net::IpAddr>,
    /// Whether capn serves each tenant's cluster DNS (docs/design.md §11 "DNS"), at
    /// `--kubelet-advertise-address` (without it, none is served and tenant pods resolve
    /// through the super cluster's DNS).
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub tenant_dns: bool,
    /// The address the tenants' DNS servers listen on.
    #[arg(long, value_name = "ADDRESS", default_value = "0.0.0.0")]
    pub dns_bind_address: std::net::IpAddr,
    /// The ports the tenants' DNS servers listen on, one per tenant, `FIRST-LAST` (each
    /// tenant's pods reach theirs through a Service of their own, port 53).
    #[arg(long, value_name = "FIRST-LAST", default_value = "20000-21999", value_parser = parse_port_range)]
    pub dns_ports: std::ops::RangeInclusive<u16>,
    /// Where the tenants' DNS forwards names outside their zones, `ADDRESS[:PORT]`,
    /// comma-separated; by default the nameservers of capn's own `/etc/resolv.conf` (in a
    /// super cluster, its cluster DNS).
    #[arg(long, value_delimiter = ',', value_name = "ADDRESS[:PORT]", value_parser = parse_upstream)]
    pub dns_upstream: Vec<std::net::SocketAddr>,
}

impl RunArgs {
    /// capn's own pods as the NetworkPolicies admit them (`--self-namespace`,
    /// `--self-labels`); `None` without a namespace.
    ///
    /// # Errors
    /// A label that is not `key=value`, or no labels at all (that would admit every pod
    /// of the namespace).
    pub fn capn_pods(&self) -> anyhow::Result<Option<crate::plan::CapnPods>> {
        let Some(namespace) = self.self_namespace.as_deref().map(str::trim).filter(|n| !n.is_empty()) else {
            return Ok(None);
        };
        let mut labels = std::collections::BTreeMap::new();
        for item in self.self_labels.iter().map(|l| l.trim()).filter(|l| !l.is_empty()) {
            match item.split_once('=') {
                Some((k, v)) if !k.trim().is_empty() => {
                    labels.insert(k.trim().to_string(), v.trim().to_string());
                }
                _ => anyhow::bail!("--self-labels: {item:?} is not key=value"),
            }
        }
        if labels.is_empty() {
            anyhow::bail!(
                "--self-labels is empty; name the labels of capn's pods (default app.kubernetes.io/name=capn) so that the NetworkPolicies admit only them"
            );
        }
        Ok(Some(crate::plan::CapnPods {
            namespace: namespace.to_string(),
            labels,
        }))
    }
}

/// Parses a port range `FIRST-LAST` (`FIRST` ≤ `LAST`, both above 0).
fn parse_port_range(text: &str) -> Result<std::ops::RangeInclusive<u16>, String> {
    let (first, last) = text.split_once('-').ok_or("must be FIRST-LAST, such as 20000-21999")?;
    let port = |p: &str| {
        p.trim()
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or(format!("{p:?} is not a port (1-65535)"))
    };
    let (first, last) = (port(first)?, port(last)?);
    if first > last {
        return Err(format!("{first} is above {last}"));
    }
    Ok(first..=last)
}

/// Parses `ADDRESS[:PORT]` (`[ADDRESS]:PORT` for IPv6), port 53 when none is given.
fn parse_upstream(text: &str) -> Result<std::net::SocketAddr, String> {
    text.parse::<std::net::SocketAddr>()
        .or_else(|_| {
            text.parse::<std::net::IpAddr>()
                .map(|ip| std::net::SocketAddr::new(ip, 53))
        })
        .map_err(|_| format!("{text:?} is not ADDRESS[:PORT]"))
}

/// Parses a positive Go duration (`90s`, `5m`, `8760h`) with kube's `Duration`.
pub(crate) fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let parsed: kube::core::Duration = text.parse().map_err(|e| format!("{e}"))?;
    let duration = std::time::Duration::from(parsed);
    if parsed.is_negative() || duration.is_zero() {
        return Err("must be positive".into());
    }
    Ok(duration)
}

#[derive(Debug, Args)]
pub struct RenderArgs {
    /// File with NestedControlPlane (and optionally component, NestedCluster and Cluster)
    /// resources; `-` reads standard input.
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    pub file: PathBuf,
    #[command(flatten)]
    pub channels: ChannelArgs,
    /// DNS domain of the super cluster.
    #[arg(long, default_value = crate::plan::DEFAULT_DNS_DOMAIN)]
    pub super_cluster_dns_domain: String,
    /// Fields the CRDs do not have are errors (kubectl's strict field validation);
    /// `--strict=false` makes them warnings. Every other problem is an error either way.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub strict: bool,
    /// Print the upgrade path each NestedControlPlane would take instead of its objects
    /// (from the running release to `spec.version`, one step per minor).
    #[arg(long)]
    pub upgrade_path: bool,
    /// With --upgrade-path: the Kubernetes release running now (default: the release the
    /// file's status reports).
    #[arg(long, value_name = "RELEASE", requires = "upgrade_path")]
    pub from: Option<String>,
    /// With --upgrade-path: the etcd release running now (default: the file's NestedEtcd
    /// status, else the channel's default for --from).
    #[arg(long, value_name = "RELEASE", requires = "upgrade_path")]
    pub from_etcd: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum ChannelsCommand {
    /// List channels, their components and versions, and their sizes.
    List(ChannelArgs),
    /// Render every template of the channels in DIR against a sample context and report
    /// every error with its file and line; exits non-zero when any fails.
    Validate {
        /// A channel directory (with channel.yaml) or a directory of channels.
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Parses `--controllers` (`*`, `name`, `-name`).
///
/// # Errors
/// An unknown controller name, listing the known ones.
pub fn parse_controllers(list: &[String]) -> anyhow::Result<EnabledControllers> {
    let mut enabled = EnabledControllers {
        control_plane: false,
        etcd: false,
        apiserver: false,
        controller_manager: false,
        cluster: false,
        public_crds: false,
        syncer: false,
    };
    for item in list.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        if item == "*" {
            enabled = EnabledControllers::default();
            continue;
        }
        let (on, name) = match item.strip_prefix('-') {
            Some(n) => (false, n),
            None => (true, item),
        };
        let slot = match name {
            "control-plane" => &mut enabled.control_plane,
            "etcd" => &mut enabled.etcd,
            "apiserver" => &mut enabled.apiserver,
            "controller-manager" => &mut enabled.controller_manager,
            "cluster" => &mut enabled.cluster,
            "public-crds" => &mut enabled.public_crds,
            "syncer" => &mut enabled.syncer,
            other => anyhow::bail!(
                "unknown controller {other:?}; known: control-plane, etcd, apiserver, controller-manager, cluster, public-crds, syncer"
            ),
        };
        *slot = on;
    }
    Ok(enabled)
}

/// The tenants' DNS as `capn run`'s arguments ask for it: none without
/// `--kubelet-advertise-address` or with `--tenant-dns=false`; upstream servers from
/// `--dns-upstream`, else from `/etc/resolv.conf`.
fn dns_endpoint(args: &RunArgs) -> Option<crate::dns::DnsEndpoint> {
    let advertise = args.kubelet_advertise_address.filter(|_| args.tenant_dns)?;
    let upstream = if args.dns_upstream.is_empty() {
        let text = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
        crate::dns::Upstream::from_resolv_conf(&text)
    } else {
        crate::dns::Upstream {
            servers: args.dns_upstream.clone(),
        }
    };
    if upstream.servers.is_empty() {
        tracing::warn!(
            "no upstream DNS server (--dns-upstream, /etc/resolv.conf): tenant pods resolve only their cluster's names"
        );
    }
    Some(crate::dns::DnsEndpoint {
        bind: args.dns_bind_address,
        advertise,
        ports: args.dns_ports.clone(),
        upstream,
    })
}

/// Entry point of the binary.
///
/// # Errors
/// Whatever the subcommand fails with, for printing.
pub async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => {
            crate::telemetry::init(matches!(args.log_format, LogFormat::Json));
            let channels = Arc::new(ChannelRegistry::load(&args.channels.channels_dirs)?);
            let capn_pods = args.capn_pods()?;
            // The kubelet API's streams and the port-forwards to tenants need HTTP/1.1
            // upgrades: clients of their own, from the same configuration as capn's.
            let super_config = kube::Config::infer()
                .await
                .context("reading the super cluster's configuration")?;
            let streams = args.kubelet_advertise_address.map(|_| super_config.clone());
            let dns = dns_endpoint(&args);
            let settings = Settings {
                super_dns_domain: args.super_cluster_dns_domain,
                namespace: args.namespace,
                watch_filter: crate::manifests::empty_watch_filter_is_none(args.watch_filter),
                enabled: parse_controllers(&args.controllers)?,
                tenant_config_hook: None,
                certificate_validity: args.certificate_validity,
                upgrade_step_timeout: args.upgrade_step_timeout,
                capn_pods,
                capn_image: args.capn_image,
                etcd_hosts_file: args.etcd_hosts_file,
                tenant_connection: args.tenant_connection,
                super_config: Some(super_config.clone()),
                syncer_patrol: args.syncer_patrol_interval,
                dns,
                kubelet: args
                    .kubelet_advertise_address
                    .map(|advertise| crate::kubelet::KubeletEndpoint {
                        bind: args.kubelet_bind_address,
                        advertise,
                        streams,
                    }),
            };
            let client = crate::client::client(super_config.clone()).context("connecting to the super cluster")?;
            tracing::info!(namespace = ?settings.namespace, controllers = ?settings.enabled, "starting capn");
            let election = args.leader_elect.then(|| LeaderElection {
                lease: args.leader_election_id.clone(),
                namespace: args
                    .leader_election_namespace
                    .clone()
                    .unwrap_or_else(|| "default".into()),
                identity: std::env::var("POD_NAME").unwrap_or_else(|_| format!("capn-{}", std::process::id())),
                duration_seconds: args.leader_election_lease_duration.max(2),
            });
            run(
                client,
                channels,
                settings,
                args.metrics_bind_address,
                args.health_probe_bind_address,
                election,
            )
            .await
        }
        Command::Render(args) => {
            let channels = ChannelRegistry::load(&args.channels.channels_dirs)?;
            let text = if args.file.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin())?
            } else {
                std::fs::read_to_string(&args.file).with_context(|| format!("reading {}", args.file.display()))?
            };
            let docs: Vec<serde_json::Value> =
                serde_saphyr::from_multiple(&text).with_context(|| format!("parsing {}", args.file.display()))?;
            let options = RenderOptions {
                super_dns_domain: args.super_cluster_dns_domain.clone(),
                strict: args.strict,
            };
            if args.upgrade_path {
                let paths = render::render_upgrade_paths(
                    &channels,
                    docs,
                    args.from.as_deref(),
                    args.from_etcd.as_deref(),
                    &options,
                )
                .map_err(render::cli_error)?;
                print!("{}", to_yaml_stream(&paths)?);
                return Ok(());
            }
            let rendered = render_documents(&channels, docs, &options).map_err(render::cli_error)?;
            for warning in &rendered.warnings {
                eprintln!("Warning: {warning}");
            }
            print!("{}", to_yaml_stream(&rendered.objects)?);
            Ok(())
        }
        Command::Kubeconfig(args) => connect::kubeconfig(args).await,
        Command::Connect(args) => {
            // The exec plugin's standard output is its ExecCredential, and nothing else.
            if !args.credential {
                crate::telemetry::init(false);
            }
            connect::connect(args).await
        }
        Command::Crds => {
            print!("{}", crate::crds::crds_yaml()?);
            Ok(())
        }
        Command::PriorityClass => {
            print!("{}", to_yaml_stream(&[crate::plan::policy::priority_class()])?);
            Ok(())
        }
        Command::Channels {
            command: ChannelsCommand::List(args),
        } => {
            let channels = ChannelRegistry::load(&args.channels_dirs)?;
            for channel in channels.iter() {
                println!("{} ({})", channel.name, channel.origin);
                for kind in crate::component::ComponentKind::ALL {
                    let versions: Vec<String> = channel.versions(kind).iter().map(|v| v.to_string()).collect();
                    println!("  {:<20} {}", kind.as_str(), versions.join(", "));
                }
                if !channel.index.sizes.is_empty() {
                    let default = channel.index.defaults.size.as_deref();
                    let sizes: Vec<String> = channel
                        .index
                        .sizes
                        .keys()
                        .map(|s| {
                            if Some(s.as_str()) == default {
                                format!("{s} (default)")
                            } else {
                                s.clone()
                            }
                        })
                        .collect();
                    println!("  {:<20} {}", "sizes", sizes.join(", "));
                }
            }
            Ok(())
        }
        Command::Channels {
            command: ChannelsCommand::Validate { dir },
        } => {
            let channels = crate::channel::load_channel_dir(&dir)?;
            let mut failures = 0;
            for channel in &channels {
                let errors = crate::plan::validate_channel(channel);
                if errors.is_empty() {
                    println!("{}: ok", channel.name);
                }
                for e in &errors {
                    println!("{}: {e}", channel.name);
                }
                failures += errors.len();
            }
            if failures > 0 {
                anyhow::bail!("{failures} template error(s)");
            }
            Ok(())
        }
        Command::Version => {
            println!("capn {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Command::EtcdRestore { command } => restore::run(command).await,
    }
}

/// Objects as one multi-document YAML stream (`---` before each).
///
/// # Errors
/// Serialization failures.
pub fn to_yaml_stream(objects: &[serde_json::Value]) -> anyhow::Result<String> {
    let mut out = String::new();
    for o in objects {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(o)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controllers_flag_follows_kube_controller_manager_syntax() {
        let all = parse_controllers(&["*".into()]).unwrap();
        assert_eq!(all, EnabledControllers::default());
        let no_etcd = parse_controllers(&["*".into(), "-etcd".into()]).unwrap();
        assert!(!no_etcd.etcd && no_etcd.apiserver && no_etcd.control_plane);
        let only = parse_controllers(&["control-plane".into()]).unwrap();
        assert!(only.control_plane && !only.etcd && !only.cluster);
        let err = parse_controllers(&["*".into(), "-etcdd".into()]).unwrap_err();
        assert!(err.to_string().contains("known: control-plane"), "{err}");
    }

    fn run_args(extra: &[&str]) -> RunArgs {
        let cli = Cli::try_parse_from(["capn", "run"].iter().chain(extra)).unwrap();
        match cli.command {
            Command::Run(args) => args,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn tenant_dns_is_served_at_the_advertised_address_unless_turned_off() {
        let args = run_args(&[
            "--kubelet-advertise-address=10.0.0.5",
            "--dns-ports=30000-30009",
            "--dns-upstream=10.96.0.10,[fd00::a]:5353",
        ]);
        let dns = dns_endpoint(&args).unwrap();
        assert_eq!(dns.advertise, "10.0.0.5".parse::<std::net::IpAddr>().unwrap());
        assert_eq!(dns.ports, 30000..=30009);
        assert_eq!(
            dns.upstream.servers,
            ["10.96.0.10:53".parse().unwrap(), "[fd00::a]:5353".parse().unwrap()]
        );
        assert!(
            dns_endpoint(&run_args(&[
                "--kubelet-advertise-address=10.0.0.5",
                "--tenant-dns=false"
            ]))
            .is_none()
        );
        // Without an address pods can reach, there is nothing to serve.
        if std::env::var_os("POD_IP").is_none() {
            assert!(dns_endpoint(&run_args(&[])).is_none());
        }
        for (bad, says) in [("20000", "FIRST-LAST"), ("20-10", "above"), ("0-10", "not a port")] {
            let err = Cli::try_parse_from(["capn", "run", "--dns-ports", bad])
                .unwrap_err()
                .to_string();
            assert!(err.contains(says), "{bad}: {err}");
        }
        let err = Cli::try_parse_from(["capn", "run", "--dns-upstream", "dns.example"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("ADDRESS[:PORT]"), "{err}");
    }

    #[test]
    fn capns_own_pods_come_from_its_namespace_and_labels() {
        let args = run_args(&["--self-namespace", "capn-system"]);
        let pods = args.capn_pods().unwrap().unwrap();
        assert_eq!(pods.namespace, "capn-system");
        assert_eq!(
            pods.labels,
            [("app.kubernetes.io/name".to_string(), "capn".to_string())].into()
        );
        let args = run_args(&["--self-namespace", "ops", "--self-labels", "app=capn, tier=platform"]);
        let pods = args.capn_pods().unwrap().unwrap();
        assert_eq!(pods.labels.len(), 2);
        assert_eq!(pods.labels["tier"], "platform");
        assert_eq!(run_args(&["--self-namespace", ""]).capn_pods().unwrap(), None);
        let err = run_args(&["--self-namespace", "ops", "--self-labels", "capn"])
            .capn_pods()
            .unwrap_err();
        assert!(err.to_string().contains("not key=value"), "{err}");
        let err = run_args(&["--self-namespace", "ops", "--self-labels", ""])
            .capn_pods()
            .unwrap_err();
        assert!(err.to_string().contains("--self-labels is empty"), "{err}");
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
