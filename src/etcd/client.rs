//! Clients of tenant etcd clusters, one per member, cached per cluster.
//!
//! capn dials each member by its stable name, `https://<c>-etcd-<i>.<c>-etcd.<ns>.svc:2379`
//! (the member's `--advertise-client-urls`; the name is in the etcd server certificate's SANs,
//! docs/reference.md "Names clients dial"). In a super cluster the headless Service `<c>-etcd`
//! (with `publishNotReadyAddresses`) makes cluster DNS answer those names, and the tenant's
//! etcd NetworkPolicy admits capn's pods to port 2379 (`--self-namespace`/`--self-labels`).
//! Outside the pod network the names do not resolve: a [`HostsFile`] maps them to addresses
//! when given, and otherwise [`crate::reach`] dials the member's pod through the super
//! cluster's `pods/portforward`; TLS verifies the name on every path.
//!
//! Connections are made lazily (tonic connects on the first call and reconnects by itself)
//! and kept per cluster and member while its membership is in flux, so a reconcile costs no
//! new TLS handshake; a settled cluster's clients are forgotten. At most
//! [`MAX_CACHED_CLUSTERS`] clusters are kept; the least recently used goes first. A member is
//! dialed anew when the address it is dialled at changes (hosts file, port-forward listener)
//! or capn's identity is renewed.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use etcd_client::{
    AlarmAction, AlarmOptions, AlarmType, Certificate, Client, CompactionOptions, ConnectOptions, Identity,
    MemberAddOptions, TlsOptions,
};
use time::OffsetDateTime;

use super::hosts::HostsFile;
use super::identity::ClientIdentity;
use crate::pki::{CertificateAuthority, PkiError};

/// How many clusters' clients are kept.
pub const MAX_CACHED_CLUSTERS: usize = 512;
/// How long a TCP connect and TLS handshake to a member may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a member's TCP port may take to accept before a new client is built. etcd-client
/// always dials through a balanced channel, which connects lazily and holds a call to a member
/// that does not resolve or refuses until [`CALL_TIMEOUT`]; this check fails such a member at
/// once instead (a starting etcd held one of the controller's reconcile slots for
/// 5 s per call).
pub const REACH_TIMEOUT: Duration = Duration::from_secs(1);
/// How long one unary call (member list, status, member add/promote/remove) may take. Not a
/// per-connection timeout: tonic would send it as the gRPC deadline of streaming calls too
/// (a snapshot may stream for minutes).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a compaction or a defragmentation may take: both rewrite the database, which
/// takes about a second per hundred MB on ordinary disks (etcd's quota is at most 8 GiB).
pub const MAINTENANCE_TIMEOUT: Duration = Duration::from_secs(120);

/// Why talking to a tenant's etcd failed. Every variant is transient for the reconcile (it
/// retries), and its message names the member dialed.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// capn's client certificate could not be made from the etcd CA.
    #[error("issuing capn's etcd client certificate: {0}")]
    Identity(#[from] PkiError),
    /// A member's URL is not `https://host:port`.
    #[error("etcd member URL {0:?} is not https://host:port")]
    BadUrl(String),
    /// The call failed (connection refused, TLS, gRPC status).
    #[error("etcd {operation} via {url}: {source}")]
    Call {
        operation: &'static str,
        url: String,
        source: etcd_client::Error,
    },
    /// The member's name did not resolve, or its port did not accept a TCP connection within
    /// [`REACH_TIMEOUT`]: no client was built.
    #[error("etcd member {url} is not reachable: {message}")]
    Unreachable { url: String, message: String },
    /// The call did not answer within [`CALL_TIMEOUT`].
    #[error("etcd {operation} via {url}: no answer within {CALL_TIMEOUT:?}")]
    Timeout { operation: &'static str, url: String },
    /// None of the members answered.
    #[error("no etcd member answered {operation}: {tried}")]
    NoMemberAnswered { operation: &'static str, tried: String },
}

impl EtcdError {
    /// Short stable reason for conditions, Events and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Identity(_) => "EtcdClientCertificateFailed",
            Self::BadUrl(_) => "EtcdBadMemberURL",
            Self::Call { .. } | Self::Timeout { .. } | Self::Unreachable { .. } => "EtcdCallFailed",
            Self::NoMemberAnswered { .. } => "EtcdUnreachable",
        }
    }
}

/// A member as the member list reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedMember {
    pub id: u64,
    /// The member's `--name`; empty while an added member has not started yet.
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    pub learner: bool,
}

/// What one member says about itself (the Maintenance Status call).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberStatus {
    pub member_id: u64,
    /// The leader's ID as this member knows it; 0 when it has none (no quorum).
    pub leader: u64,
    pub raft_term: u64,
    pub raft_index: u64,
    pub raft_applied_index: u64,
    pub learner: bool,
    /// Size of the backend database file, bytes.
    pub db_size: i64,
    /// Bytes of the database file holding data (`dbSizeInUse`); the rest is free pages a
    /// defragmentation gives back (etcd 3.4+).
    pub db_size_in_use: i64,
    /// The member's `--quota-backend-bytes` (`dbSizeQuota`; etcd 3.6+, 0 before).
    pub db_size_quota: i64,
    /// The store's revision when the status was taken (from the response header).
    pub revision: i64,
    /// Errors the member reports (alarms such as NOSPACE).
    pub errors: Vec<String>,
    /// The etcd server version.
    pub version: String,
}

/// The clients of every tenant etcd capn talks to; one per process (in [`crate::controllers::Context`]).
#[derive(Debug)]
pub struct EtcdClients {
    hosts: Option<HostsFile>,
    /// How members the hosts file does not name are dialled (`None`: by name).
    reach: Option<std::sync::Arc<crate::reach::Reach>>,
    clusters: Mutex<HashMap<ClusterKey, Cached>>,
}

/// A cluster: its namespace and cluster name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct ClusterKey {
    namespace: String,
    cluster: String,
}

#[derive(Debug)]
struct Cached {
    identity: ClientIdentity,
    /// By client URL: the address dialed (from the hosts file or a port-forward, if any)
    /// and the client.
    members: HashMap<String, (Option<SocketAddr>, ClientHandle)>,
    used: Instant,
}

/// `etcd_client::Client` without a `Debug` of its own.
#[derive(Clone)]
struct ClientHandle(Client);

impl std::fmt::Debug for ClientHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("etcd client")
    }
}

impl EtcdClients {
    /// Clients that dial members by name, or at the address `hosts_file` maps the name to
    /// (see [`HostsFile`]).
    pub fn new(hosts_file: Option<PathBuf>) -> Self {
        Self {
            hosts: hosts_file.map(HostsFile::new),
            reach: None,
            clusters: Mutex::new(HashMap::new()),
        }
    }

    /// These clients, dialling the members the hosts file does not name as `reach` says
    /// (directly, or through the super cluster's port-forward).
    #[must_use]
    pub fn with_reach(mut self, reach: std::sync::Arc<crate::reach::Reach>) -> Self {
        self.reach = Some(reach);
        self
    }

    /// The clients of cluster `cluster` in `namespace`, authenticating with capn's identity
    /// from etcd CA `ca` (re-issued at `now` when due or when the CA changed). Dials nothing.
    ///
    /// # Errors
    /// [`EtcdError::Identity`] when the identity cannot be issued.
    pub fn cluster(
        &self,
        namespace: &str,
        cluster: &str,
        ca: &CertificateAuthority,
        now: OffsetDateTime,
    ) -> Result<EtcdCluster<'_>, EtcdError> {
        let key = ClusterKey {
            namespace: namespace.to_string(),
            cluster: cluster.to_string(),
        };
        let mut clusters = self.lock();
        let fresh = clusters.get(&key).is_some_and(|c| !c.identity.stale(ca, now));
        if !fresh {
            // A new identity: the connections made with the old one go too.
            let identity = ClientIdentity::issue(ca, now)?;
            if clusters.len() >= MAX_CACHED_CLUSTERS && !clusters.contains_key(&key) {
                let oldest = clusters.iter().min_by_key(|(_, c)| c.used).map(|(k, _)| k.clone());
                if let Some(oldest) = oldest {
                    clusters.remove(&oldest);
                }
            }
            clusters.insert(
                key.clone(),
                Cached {
                    identity,
                    members: HashMap::new(),
                    used: Instant::now(),
                },
            );
        }
        let cached = clusters.get_mut(&key).ok_or_else(|| EtcdError::BadUrl(String::new()))?;
        cached.used = Instant::now();
        Ok(EtcdCluster {
            clients: self,
            key,
            identity: cached.identity.clone(),
        })
    }

    /// Forgets a cluster's clients, closing their connections once no running call holds
    /// them (a backup's snapshot keeps its own); the next [`Self::cluster`] dials anew.
    pub fn forget(&self, namespace: &str, cluster: &str) {
        self.lock().remove(&ClusterKey {
            namespace: namespace.to_string(),
            cluster: cluster.to_string(),
        });
    }

    /// How many clusters have cached clients.
    pub fn cached_clusters(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ClusterKey, Cached>> {
        self.clusters.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The members of one tenant etcd, as capn reaches them; from [`EtcdClients::cluster`].
pub struct EtcdCluster<'a> {
    clients: &'a EtcdClients,
    key: ClusterKey,
    identity: ClientIdentity,
}

/// Splits `https://host:port` into host and port.
fn host_port(url: &str) -> Option<(&str, u16)> {
    let rest = url.strip_prefix("https://")?.trim_end_matches('/');
    let (host, port) = rest.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Some((host, port.parse().ok()?))
}

impl EtcdCluster<'_> {
    /// A client of the member serving `client_url` (`https://<name>:2379`), dialed lazily and
    /// kept for later reconciles. Calls through it are answered by that member (or forwarded
    /// by it to the leader, for writes and member changes).
    ///
    /// # Errors
    /// [`EtcdError::BadUrl`]; [`EtcdError::Unreachable`] when a new client's member does not
    /// accept a connection (see [`REACH_TIMEOUT`]; not probed through a port-forward, whose
    /// failures show in the first call) or the forward cannot be set up;
    /// [`EtcdError::Call`] when the client cannot be built.
    pub async fn client(&self, client_url: &str) -> Result<Client, EtcdError> {
        let (host, port) = host_port(client_url).ok_or_else(|| EtcdError::BadUrl(client_url.to_string()))?;
        let unreachable = |message: String| EtcdError::Unreachable {
            url: client_url.to_string(),
            message,
        };
        // `forwarded`: the address is a local port-forward listener, which always accepts.
        let (address, forwarded) = match self.clients.hosts.as_ref().and_then(|h| h.lookup(host)) {
            Some(ip) => (Some(SocketAddr::new(ip, port)), false),
            None => match &self.clients.reach {
                Some(reach) => {
                    let address = reach.dial(host, port).await.map_err(|e| unreachable(e.to_string()))?;
                    (address, address.is_some())
                }
                None => (None, false),
            },
        };
        {
            let clusters = self.clients.lock();
            if let Some((dialed, client)) = clusters.get(&self.key).and_then(|c| c.members.get(client_url))
                && *dialed == address
            {
                return Ok(client.0.clone());
            }
        }
        let target = match address {
            Some(address) => format!("https://{address}"),
            None => client_url.to_string(),
        };
        // A TCP probe fails fast on a member that is not there; through a forward it would
        // only open (and drop) one port-forward stream, and the listener accepts anyway.
        if !forwarded {
            let reached = match address {
                Some(address) => tokio::time::timeout(REACH_TIMEOUT, tokio::net::TcpStream::connect(address)).await,
                None => tokio::time::timeout(REACH_TIMEOUT, tokio::net::TcpStream::connect((host, port))).await,
            };
            match reached {
                Ok(Ok(_probe)) => {}
                Ok(Err(e)) => return Err(unreachable(e.to_string())),
                Err(_) => return Err(unreachable(format!("no TCP connection within {REACH_TIMEOUT:?}"))),
            }
        }
        let tls = TlsOptions::new()
            .ca_certificate(Certificate::from_pem(self.identity.trust_pem.as_bytes()))
            .identity(Identity::from_pem(
                self.identity.pair.cert_pem.as_bytes(),
                self.identity.pair.key_pem.as_bytes(),
            ))
            .domain_name(host);
        let options = ConnectOptions::new()
            .with_tls(tls)
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5));
        let client = Client::connect([target], Some(options))
            .await
            .map_err(|source| EtcdError::Call {
                operation: "connect",
                url: client_url.to_string(),
                source,
            })?;
        let mut clusters = self.clients.lock();
        if let Some(cached) = clusters.get_mut(&self.key)
            && cached.identity.pair == self.identity.pair
        {
            cached
                .members
                .insert(client_url.to_string(), (address, ClientHandle(client.clone())));
        }
        Ok(client)
    }

    /// Forgets the client of one member (after a call failed in a way a new connection may
    /// fix, or the member was removed).
    pub fn forget_member(&self, client_url: &str) {
        if let Some(cached) = self.clients.lock().get_mut(&self.key) {
            cached.members.remove(client_url);
        }
    }

    async fn call<T, F, Fut>(&self, operation: &'static str, url: &str, f: F) -> Result<T, EtcdError>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.call_within(CALL_TIMEOUT, operation, url, f).await
    }

    async fn call_within<T, F, Fut>(
        &self,
        timeout: Duration,
        operation: &'static str,
        url: &str,
        f: F,
    ) -> Result<T, EtcdError>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let client = self.client(url).await?;
        match tokio::time::timeout(timeout, f(client)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(source)) => Err(EtcdError::Call {
                operation,
                url: url.to_string(),
                source,
            }),
            Err(_) => Err(EtcdError::Timeout {
                operation,
                url: url.to_string(),
            }),
        }
    }

    /// The member list, from the first of `client_urls` that answers (linearizable: the
    /// member asks the leader, so a member without quorum does not answer).
    ///
    /// # Errors
    /// [`EtcdError::NoMemberAnswered`] listing each member's failure.
    pub async fn member_list(&self, client_urls: &[String]) -> Result<Vec<ListedMember>, EtcdError> {
        let mut tried = Vec::new();
        for url in client_urls {
            let listed = self
                .call("MemberList", url, |mut c| async move { c.member_list().await })
                .await;
            match listed {
                Ok(response) => {
                    return Ok(response
                        .members()
                        .iter()
                        .map(|m| ListedMember {
                            id: m.id(),
                            name: m.name().to_string(),
                            peer_urls: m.peer_urls().to_vec(),
                            client_urls: m.client_urls().to_vec(),
                            learner: m.is_learner(),
                        })
                        .collect());
                }
                Err(e) => tried.push(e.to_string()),
            }
        }
        Err(EtcdError::NoMemberAnswered {
            operation: "MemberList",
            tried: tried.join("; "),
        })
    }

    /// What the member at `client_url` says about itself.
    ///
    /// # Errors
    /// [`EtcdError::Call`] or [`EtcdError::Timeout`].
    pub async fn status(&self, client_url: &str) -> Result<MemberStatus, EtcdError> {
        let response = self
            .call("Status", client_url, |mut c| async move { c.status().await })
            .await?;
        let header = response.header();
        Ok(MemberStatus {
            member_id: header.map(|h| h.member_id()).unwrap_or_default(),
            revision: header.map(|h| h.revision()).unwrap_or_default(),
            leader: response.leader(),
            raft_term: response.raft_term(),
            raft_index: response.raft_index(),
            raft_applied_index: response.raft_applied_index(),
            learner: response.is_learner(),
            db_size: response.db_size(),
            db_size_in_use: response.raft_used_db_size(),
            db_size_quota: response.db_size_quota(),
            errors: response.errors().to_vec(),
            version: response.version().to_string(),
        })
    }

    /// The members that raised the `NOSPACE` alarm (their IDs), as the member at `via` knows
    /// the cluster's alarms (alarms are replicated: every member lists all of them).
    ///
    /// # Errors
    /// [`EtcdError::Call`] or [`EtcdError::Timeout`].
    pub async fn nospace_alarms(&self, via: &str) -> Result<Vec<u64>, EtcdError> {
        let response = self
            .call("AlarmList", via, |mut c| async move {
                c.alarm(AlarmAction::Get, AlarmType::None, None).await
            })
            .await?;
        Ok(response
            .alarms()
            .iter()
            .filter(|a| a.alarm() == AlarmType::Nospace)
            .map(|a| a.member_id())
            .collect())
    }

    /// Compacts the keyspace's history up to `revision` (every older version of a key is
    /// dropped), waiting until the member at `via` applied it to its database (`physical`).
    ///
    /// # Errors
    /// [`EtcdError::Call`] (a revision already compacted is an error etcd returns) or
    /// [`EtcdError::Timeout`] after [`MAINTENANCE_TIMEOUT`].
    pub async fn compact(&self, via: &str, revision: i64) -> Result<(), EtcdError> {
        self.call_within(MAINTENANCE_TIMEOUT, "Compact", via, |mut c| async move {
            c.compact(revision, Some(CompactionOptions::new().with_physical()))
                .await
                .map(drop)
        })
        .await
    }

    /// Defragments the database of the member at `client_url` (it rewrites the file
    /// without its free pages, blocking its reads and writes meanwhile: one member at a
    /// time, <https://etcd.io/docs/v3.6/op-guide/maintenance/#defragmentation>).
    ///
    /// # Errors
    /// [`EtcdError::Call`] or [`EtcdError::Timeout`] after [`MAINTENANCE_TIMEOUT`].
    pub async fn defragment(&self, client_url: &str) -> Result<(), EtcdError> {
        self.call_within(MAINTENANCE_TIMEOUT, "Defragment", client_url, |mut c| async move {
            c.defragment().await.map(drop)
        })
        .await
    }

    /// Disarms the `NOSPACE` alarm member `member_id` raised, asking through `via`.
    ///
    /// # Errors
    /// [`EtcdError::Call`] or [`EtcdError::Timeout`].
    pub async fn disarm_nospace(&self, via: &str, member_id: u64) -> Result<(), EtcdError> {
        self.call("AlarmDisarm", via, |mut c| async move {
            let mut options = AlarmOptions::new();
            options.with_member(member_id);
            c.alarm(AlarmAction::Deactivate, AlarmType::Nospace, Some(options))
                .await
                .map(drop)
        })
        .await
    }

    /// Adds a member with peer URL `peer_url` as a learner (etcd 3.4+: a non-voting member that
    /// receives the log until promoted), asking through the member at `via`. Returns its ID.
    ///
    /// # Errors
    /// [`EtcdError::Call`] (for example when the cluster has no leader, or already has a
    /// learner: etcd allows one at a time by default).
    pub async fn add_learner(&self, via: &str, peer_url: &str) -> Result<u64, EtcdError> {
        let urls = vec![peer_url.to_string()];
        let response = self
            .call("MemberAdd", via, |mut c| async move {
                c.member_add(urls, Some(MemberAddOptions::new().with_is_learner()))
                    .await
            })
            .await?;
        Ok(response.member().map(|m| m.id()).unwrap_or_default())
    }

    /// Promotes learner `id` to a voting member through the member at `via`. etcd refuses
    /// until the learner's log has caught up with the leader's ("can only promote a learner
    /// member which is in sync with leader"); the caller retries.
    ///
    /// # Errors
    /// [`EtcdError::Call`].
    pub async fn promote(&self, via: &str, id: u64) -> Result<(), EtcdError> {
        self.call("MemberPromote", via, |mut c| async move { c.member_promote(id).await })
            .await
            .map(drop)
    }

    /// Removes member `id` through the member at `via`.
    ///
    /// # Errors
    /// [`EtcdError::Call`].
    pub async fn remove(&self, via: &str, id: u64) -> Result<(), EtcdError> {
        self.call("MemberRemove", via, |mut c| async move { c.member_remove(id).await })
            .await
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_urls_split_into_host_and_port() {
        assert_eq!(
            host_port("https://demo-etcd-0.demo-etcd.ns.svc:2379"),
            Some(("demo-etcd-0.demo-etcd.ns.svc", 2379))
        );
        assert_eq!(host_port("https://[fd00::1]:2379/"), Some(("fd00::1", 2379)));
        assert_eq!(host_port("http://a:1"), None);
        assert_eq!(host_port("https://a"), None);
    }

    #[test]
    fn cluster_clients_are_cached_and_bounded() {
        let now = OffsetDateTime::now_utc();
        let ca = CertificateAuthority::generate("etcd-ca", now, crate::pki::KeyAlgorithm::EcdsaP256).unwrap();
        let clients = EtcdClients::new(None);
        let first = clients.cluster("ns", "a", &ca, now).unwrap().identity.pair;
        let again = clients.cluster("ns", "a", &ca, now).unwrap().identity.pair;
        assert_eq!(first, again, "the identity is kept while it is fresh");
        let later = clients
            .cluster("ns", "a", &ca, now + time::Duration::minutes(45))
            .unwrap()
            .identity
            .pair;
        assert_ne!(first, later, "and renewed when due");
        for i in 0..MAX_CACHED_CLUSTERS + 10 {
            clients.cluster("ns", &format!("c{i}"), &ca, now).unwrap();
        }
        assert_eq!(clients.cached_clusters(), MAX_CACHED_CLUSTERS);
    }

    /// A member that refuses or whose name does not resolve fails as unreachable, not after
    /// waiting out the call timeout in etcd-client's lazy channel.
    #[tokio::test]
    async fn a_member_that_does_not_accept_fails_as_unreachable() {
        let now = OffsetDateTime::now_utc();
        let ca = CertificateAuthority::generate("etcd-ca", now, crate::pki::KeyAlgorithm::EcdsaP256).unwrap();
        let clients = EtcdClients::new(None);
        let cluster = clients.cluster("ns", "a", &ca, now).unwrap();
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let refused = format!("https://127.0.0.1:{closed}");
        let unknown = "https://a-etcd-0.a-etcd.ns.svc.invalid:2379".to_string();
        for url in [&refused, &unknown] {
            match cluster.member_list(std::slice::from_ref(url)).await {
                Err(EtcdError::NoMemberAnswered { tried, .. }) => {
                    assert!(tried.contains("is not reachable"), "{url}: {tried}");
                }
                other => panic!("{url}: expected no member to answer, got {other:?}"),
            }
        }
    }
}
