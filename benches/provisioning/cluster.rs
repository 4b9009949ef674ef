//! The benchmark's super cluster: the test cluster (`testkit`, capn's test kit) with the
//! API server's audit log on, and one impersonated user per party, so that the audit log
//! tells capn's requests from the floor's, the stand-in's and the benchmark's own.

use std::path::{Path, PathBuf};

use capn_testkit::{StartOptions, TestCluster, audit};
use kube::config::Kubeconfig;

/// Who sends a request, as the audit log names it (the impersonated user).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Party {
    /// The `capn run` process.
    Capn,
    /// The logic-free client.
    Floor,
    /// The logic-free client that also does the least capn's API asks for.
    DesignFloor,
    /// The StatefulSet status stand-in; its requests are excluded from both halves.
    StandIn,
    /// The benchmark as the user: namespaces, NestedControlPlanes, watching for readiness.
    User,
}

impl Party {
    pub fn username(self) -> &'static str {
        match self {
            Self::Capn => "bench-capn",
            Self::Floor => "bench-floor",
            Self::DesignFloor => "bench-design-floor",
            Self::StandIn => "bench-stand-in",
            Self::User => "bench-user",
        }
    }
}

/// The impersonated group: every party may do anything, as the admin it borrows the
/// credentials of. It also puts them all in the API server's exempt priority level, so
/// that API Priority and Fairness queues none of them.
const GROUP: &str = "system:masters";

/// The running cluster and where its audit log goes.
pub struct BenchCluster {
    pub cluster: TestCluster,
    pub audit_log: PathBuf,
}

/// Starts the super cluster with the audit log in `dir`.
///
/// # Errors
/// The policy cannot be written, or the cluster does not start (with the failing binary's
/// log).
pub fn start(dir: &Path) -> Result<BenchCluster, String> {
    let policy = dir.join("audit-policy.yaml");
    std::fs::write(&policy, audit::POLICY).map_err(|e| format!("cannot write {}: {e}", policy.display()))?;
    let audit_log = dir.join("audit.log");
    let options = StartOptions {
        extra_apiserver_args: vec![
            format!("--audit-policy-file={}", policy.display()),
            format!("--audit-log-path={}", audit_log.display()),
            "--audit-log-format=json".to_owned(),
            // The default, 100 MB, would rotate the log in the middle of a large run.
            "--audit-log-maxsize=1000000".to_owned(),
            // Every control plane's apiserver Service takes a ClusterIP, in both halves: the
            // test cluster's /24 runs out at about 250 (the later flag wins).
            "--service-cluster-ip-range=10.0.0.0/16".to_owned(),
        ],
    };
    let cluster = capn_testkit::start_cluster(options)?;
    Ok(BenchCluster { cluster, audit_log })
}

/// CPU seconds (user plus system) the super cluster's kube-apiserver and etcd have used
/// since they started; the difference of two readings is what a half cost them.
#[derive(Clone, Copy, Debug)]
pub struct ServerCpu {
    pub apiserver_seconds: f64,
    pub etcd_seconds: f64,
}

impl std::ops::Sub for ServerCpu {
    type Output = Self;

    fn sub(self, earlier: Self) -> Self {
        Self {
            apiserver_seconds: self.apiserver_seconds - earlier.apiserver_seconds,
            etcd_seconds: self.etcd_seconds - earlier.etcd_seconds,
        }
    }
}

impl BenchCluster {
    /// The CPU time kube-apiserver and etcd have used so far.
    ///
    /// # Errors
    /// The cluster knows no pid for one of them, or its `/proc` entry cannot be read.
    pub fn server_cpu(&self) -> Result<ServerCpu, String> {
        let seconds = |binary: &str| {
            let pid = self
                .cluster
                .pid(binary)
                .ok_or_else(|| format!("the test cluster has no {binary} process"))?;
            crate::process::usage_of(pid).map(|usage| usage.cpu_seconds)
        };
        Ok(ServerCpu {
            apiserver_seconds: seconds("kube-apiserver")?,
            etcd_seconds: seconds("etcd")?,
        })
    }

    /// A client acting as `party`.
    ///
    /// # Errors
    /// kube cannot build a client (outside a tokio runtime, for one).
    pub fn client(&self, party: Party) -> Result<kube::Client, String> {
        let mut config = self.cluster.config();
        config.auth_info.impersonate = Some(party.username().to_owned());
        config.auth_info.impersonate_groups = Some(vec![GROUP.to_owned()]);
        kube::Client::try_from(config).map_err(|e| format!("cannot build a client for {}: {e}", party.username()))
    }

    /// Writes a kubeconfig acting as `party` to `path`, for a child process.
    ///
    /// # Errors
    /// The admin kubeconfig cannot be read or the new one written.
    pub fn write_kubeconfig(&self, party: Party, path: &Path) -> Result<(), String> {
        let admin = self.cluster.kubeconfig_path();
        let mut kubeconfig =
            Kubeconfig::read_from(admin).map_err(|e| format!("cannot read {}: {e}", admin.display()))?;
        for named in &mut kubeconfig.auth_infos {
            let auth_info = named.auth_info.get_or_insert_with(Default::default);
            auth_info.impersonate = Some(party.username().to_owned());
            auth_info.impersonate_groups = Some(vec![GROUP.to_owned()]);
        }
        // JSON is YAML, and kube writes it as it reads it.
        let text = serde_json::to_string_pretty(&kubeconfig).map_err(|e| format!("cannot write a kubeconfig: {e}"))?;
        std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
    }
}
