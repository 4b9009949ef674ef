//! What the control plane tests share: running capn's controllers in-process for one
//! namespace, applying examples, reading secrets and certificates.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use capn::api::{NestedAPIServer, NestedControlPlane, NestedControllerManager, NestedEtcd};
use capn::channel::ChannelRegistry;
use capn::controllers::{Settings, run};
use capn_testkit::{CapnOptions, CapnProcess, wait_until};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, ResourceExt};
use x509_parser::prelude::*;

/// The first object `api` lists for which `matches` holds; `None` while there is none or the
/// list fails: the poll of a wait (`wait_until`, `runner.wait_for`) for an Event, a copy, ...
pub async fn find_listed<K>(api: &Api<K>, matches: impl Fn(&K) -> bool) -> Option<K>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.list(&ListParams::default())
        .await
        .ok()?
        .items
        .into_iter()
        .find(|object| matches(object))
}

/// The `capn` binary cargo built for this test binary. The kit (a library, where
/// `CARGO_BIN_EXE_capn` does not exist) takes it from its caller.
pub fn capn_binary() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_BIN_EXE_capn"))
}

/// The release of the local etcd, for an image tag the runner accepts.
pub fn local_etcd_release() -> String {
    let output = std::process::Command::new(capn_testkit::cluster().assets_dir().join("etcd"))
        .arg("--version")
        .output()
        .expect("etcd --version runs");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix("etcd Version: "))
        .unwrap_or_else(|| panic!("etcd --version printed no version: {text}"))
        .trim()
        .to_owned()
}

/// How long a test waits for one step of capn's controllers on the super cluster alone, where
/// readiness is written by the test or the stand-in and no pod runs (a booted control plane's
/// steps take [`crate::boot::BOOTED_STEP`]).
pub const CONTROLLER_STEP: Duration = Duration::from_secs(30);

/// capn's controllers, running in this test's runtime, watching one namespace.
pub struct Capn(tokio::task::JoinHandle<()>);

impl Capn {
    /// Starts every controller for `namespace` but the public CRD sync (its CRDs are
    /// cluster-wide; only its own test turns it on) and the syncer (it needs a tenant
    /// apiserver that runs; the booted tests turn it on).
    pub fn start(client: &Client, namespace: &str) -> Self {
        Self::start_with_channels(client, namespace, &[])
    }

    /// Like [`Capn::start`], with extra channel directories (paths relative to
    /// `tests/integration/channels`, or absolute).
    pub fn start_with_channels(client: &Client, namespace: &str, dirs: &[&str]) -> Self {
        let mut settings = Settings {
            namespace: Some(namespace.to_string()),
            ..Settings::default()
        };
        settings.enabled.public_crds = false;
        settings.enabled.syncer = false;
        Self::start_with_settings(client, settings, dirs)
    }

    /// Starts the controllers with `settings` and extra channel directories.
    pub fn start_with_settings(client: &Client, settings: Settings, dirs: &[&str]) -> Self {
        let dirs: Vec<std::path::PathBuf> = dirs
            .iter()
            .map(|d| {
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("tests/integration/channels")
                    .join(d)
            })
            .collect();
        let channels = Arc::new(ChannelRegistry::load(&dirs).expect("channels load"));
        Self(tokio::spawn(run(
            client.clone(),
            channels,
            settings,
            Default::default(),
        )))
    }

    /// Stops the controllers (as a crash or a rollout would).
    pub async fn stop(self) {
        self.0.abort();
        let _ = self.0.await;
    }
}

/// `capn run` for `namespace` as a child process (see [`CapnProcess::start`]), with the test
/// cluster's kubeconfig and `args` appended; its log (debug level, JSON) goes to a file in the
/// temporary directory, removed when the process is dropped.
///
/// # Panics
/// If capn cannot be started.
pub fn start_capn_process(namespace: &str, args: &[String]) -> CapnProcess {
    start_capn_process_as(namespace, args, capn_testkit::cluster().kubeconfig_path(), &[])
}

/// [`start_capn_process`] with `kubeconfig` instead of the test cluster's admin one (another
/// identity, such as a ServiceAccount's token) and the environment variables `env` besides.
///
/// # Panics
/// If capn cannot be started.
pub fn start_capn_process_as(
    namespace: &str,
    args: &[String],
    kubeconfig: &std::path::Path,
    env: &[(String, String)],
) -> CapnProcess {
    let log = std::env::temp_dir().join(format!("capn-test-{namespace}.log"));
    let mut all = vec!["--log-format".to_owned(), "json".to_owned()];
    all.extend_from_slice(args);
    let mut all_env = vec![("RUST_LOG".to_owned(), "debug".to_owned())];
    all_env.extend_from_slice(env);
    let options = CapnOptions {
        args: all,
        env: all_env,
        remove_log: true,
        reachable: false,
    };
    CapnProcess::start(capn_binary(), kubeconfig, namespace, log, options)
        .unwrap_or_else(|e| panic!("capn did not start: {e}"))
}

/// One behaviour test's world, the preamble every test shared: an admin client, a namespace
/// of its own, and capn's controllers running for that namespace.
pub struct Fixture {
    /// An admin client of the test cluster, built on this test's runtime.
    pub client: Client,
    /// The test's own namespace.
    pub ns: String,
    capn: Option<Capn>,
}

impl Fixture {
    /// A new namespace with capn running (every controller but the public CRD sync).
    pub async fn new() -> Self {
        Self::with_channels(&[]).await
    }

    /// Like [`Fixture::new`], with extra channel directories (see [`Capn::start_with_channels`]).
    pub async fn with_channels(dirs: &[&str]) -> Self {
        let mut fixture = Self::without_capn().await;
        fixture.capn = Some(Capn::start_with_channels(&fixture.client, &fixture.ns, dirs));
        fixture
    }

    /// A new namespace; capn is not running (start it with [`Fixture::start_capn`]).
    pub async fn without_capn() -> Self {
        let client = capn_testkit::cluster().client();
        let ns = capn_testkit::test_namespace(&client).await;
        Self { client, ns, capn: None }
    }

    /// Starts capn for the namespace (again, after [`Fixture::stop_capn`]).
    pub fn start_capn(&mut self) {
        self.capn = Some(Capn::start(&self.client, &self.ns));
    }

    /// Stops capn, as a crash or a rollout would; the namespace stays.
    pub async fn stop_capn(&mut self) {
        if let Some(capn) = self.capn.take() {
            capn.stop().await;
        }
    }

    /// Server-side applies one document in the namespace (see [`apply_doc`]).
    pub async fn apply(&self, doc: serde_json::Value) {
        apply_doc(&self.client, &self.ns, doc).await;
    }

    /// Applies every document of an example file (see [`apply_example`]).
    pub async fn apply_example(&self, path: &str) {
        apply_example(&self.client, &self.ns, path).await;
    }

    /// Brings the control plane `c` to ready, in order (see [`bring_up`]).
    pub async fn bring_up(&self, c: &str) {
        bring_up(&self.client, &self.ns, c).await;
    }

    /// Ends the test: stops capn.
    pub async fn stop(mut self) {
        self.stop_capn().await;
    }
}

/// The `Synced` condition of NestedAPIServer `name` while it is False with `reason` (a
/// refusal), for a test's wait; `None` otherwise or when it cannot be read.
pub async fn apiserver_refusal(
    apiservers: &Api<NestedAPIServer>,
    name: &str,
    reason: &str,
) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    apiservers
        .get(name)
        .await
        .ok()?
        .status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Synced" && c.status == "False" && c.reason == reason)
}

/// Requests a CA rotation of NestedControlPlane `name` (the annotation's `value`, e.g. `ca`).
pub async fn request_rotation(client: &Client, ns: &str, name: &str, value: &str) {
    Api::<NestedControlPlane>::namespaced(client.clone(), ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                capn::controllers::control_plane::rotation::ROTATE_ANNOTATION: value
            }}})),
        )
        .await
        .unwrap_or_else(|e| panic!("annotating {name} for a rotation: {e}"));
}

/// Creates every document of an example file in `namespace` (like `kubectl apply -f`).
pub async fn apply_example(client: &Client, namespace: &str, path: &str) {
    let text = std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).unwrap();
    for doc in docs.into_iter().filter(|d| !d.is_null()) {
        apply_doc(client, namespace, doc).await;
    }
}

/// Server-side applies one document in `namespace` with a user's field manager.
pub async fn apply_doc(client: &Client, namespace: &str, doc: serde_json::Value) {
    apply(client, Some(namespace), doc).await;
}

/// Server-side applies the cluster-scoped object `doc` as `kubectl` would.
pub async fn apply_cluster_doc(client: &Client, doc: serde_json::Value) {
    apply(client, None, doc).await;
}

async fn apply(client: &Client, namespace: Option<&str>, doc: serde_json::Value) {
    let api_version = doc["apiVersion"].as_str().unwrap().to_string();
    let kind = doc["kind"].as_str().unwrap().to_string();
    let name = doc["metadata"]["name"].as_str().unwrap().to_string();
    let (group, version) = api_version.split_once('/').unwrap_or(("", &api_version));
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &kind));
    let api: Api<DynamicObject> = match namespace {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    api.patch(&name, &PatchParams::apply("kubectl"), &Patch::Apply(&doc))
        .await
        .unwrap_or_else(|e| panic!("applying {kind} {name}: {e}"));
}

pub async fn statefulset(client: &Client, ns: &str, name: &str) -> Option<StatefulSet> {
    Api::<StatefulSet>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()
}

pub async fn secret(client: &Client, ns: &str, name: &str) -> Option<Secret> {
    Api::<Secret>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()
}

pub fn secret_value(secret: &Secret, key: &str) -> String {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .unwrap_or_else(|| panic!("no {key} in {}", secret.name_any()));
    String::from_utf8(bytes.0.clone()).unwrap()
}

/// Waits for a StatefulSet to exist, then stands in for the kubelet and the StatefulSet
/// controller: every pod running and ready.
pub async fn make_ready(client: &Client, ns: &str, name: &str) {
    wait_until(&format!("StatefulSet {name} exists"), CONTROLLER_STEP, || async {
        statefulset(client, ns, name).await.map(|_| ())
    })
    .await;
    capn_testkit::mark_statefulset_ready(client, ns, name).await.unwrap();
}

/// A namespaced kind a typed `Api` can read: what the generic helpers here need.
pub trait NamespacedKind:
    kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
    + Clone
    + serde::de::DeserializeOwned
    + std::fmt::Debug
{
}

impl<K> NamespacedKind for K where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
{
}

/// Merge-patches the `K` called `name` in `ns` with `patch` (`kubectl patch --type merge`).
///
/// # Panics
/// When the API server refuses the patch.
pub async fn merge_patch<K: NamespacedKind>(client: &Client, ns: &str, name: &str, patch: serde_json::Value) {
    Api::<K>::namespaced(client.clone(), ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("merge patch of {name}: {e}"));
}

pub async fn control_plane(client: &Client, ns: &str, name: &str) -> NestedControlPlane {
    Api::<NestedControlPlane>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap()
}

pub async fn etcd_ready(client: &Client, ns: &str, name: &str) -> bool {
    Api::<NestedEtcd>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()
        .and_then(|e| e.status)
        .is_some_and(|s| s.ready)
}

/// Brings a whole control plane `c` (the standalone example's names) to ready, in order.
pub async fn bring_up(client: &Client, ns: &str, c: &str) {
    make_ready(client, ns, &format!("{c}-etcd")).await;
    make_ready(client, ns, &format!("{c}-apiserver")).await;
    make_ready(client, ns, &format!("{c}-controller-manager")).await;
    wait_until("the NestedControlPlane is ready", CONTROLLER_STEP, || async {
        control_plane(client, ns, c)
            .await
            .status
            .filter(|s| s.ready)
            .map(|_| ())
    })
    .await;
}

/// SHA-256 fingerprints of the `tls.crt` (or kubeconfig `value`) of every Secret in `ns`.
pub async fn secret_fingerprints(client: &Client, ns: &str) -> BTreeMap<String, String> {
    let secrets = Api::<Secret>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap();
    secrets
        .items
        .into_iter()
        .filter_map(|s| {
            let data = s.data.as_ref()?;
            let bytes = data.get("tls.crt").or_else(|| data.get("value"))?;
            Some((s.name_any(), sha256_hex(&bytes.0)))
        })
        .collect()
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// The first certificate of a PEM string, as DER.
pub fn pem_to_der(pem: &str) -> Vec<u8> {
    let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).expect("PEM");
    p.contents
}

/// DNS and IP SANs of a certificate, as strings.
pub fn sans(der: &[u8]) -> (Vec<String>, Vec<String>) {
    let (_, cert) = X509Certificate::from_der(der).unwrap();
    let mut dns = Vec::new();
    let mut ips = Vec::new();
    if let Ok(Some(ext)) = cert.subject_alternative_name() {
        for name in &ext.value.general_names {
            match name {
                GeneralName::DNSName(d) => dns.push(d.to_string()),
                GeneralName::IPAddress(b) if b.len() == 4 => {
                    ips.push(std::net::Ipv4Addr::new(b[0], b[1], b[2], b[3]).to_string())
                }
                GeneralName::IPAddress(b) if b.len() == 16 => {
                    let a: [u8; 16] = (*b).try_into().unwrap();
                    ips.push(std::net::Ipv6Addr::from(a).to_string())
                }
                _ => {}
            }
        }
    }
    (dns, ips)
}

/// Extended key usages (server, client) of a certificate.
pub fn usages(der: &[u8]) -> (bool, bool) {
    let (_, cert) = X509Certificate::from_der(der).unwrap();
    let eku = cert.extended_key_usage().unwrap().expect("extended key usage").value;
    (eku.server_auth, eku.client_auth)
}

/// Whether `leaf` is signed by `ca`.
pub fn signed_by(leaf: &[u8], ca: &[u8]) -> bool {
    let (_, leaf) = X509Certificate::from_der(leaf).unwrap();
    let (_, ca) = X509Certificate::from_der(ca).unwrap();
    leaf.verify_signature(Some(ca.public_key())).is_ok()
}

/// Every component resource of the namespace, by kind, as (name, owner names).
pub async fn components(client: &Client, ns: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for e in Api::<NestedEtcd>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        out.push(("NestedEtcd".to_string(), e.name_any()));
    }
    for a in Api::<NestedAPIServer>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        out.push(("NestedAPIServer".to_string(), a.name_any()));
    }
    for m in Api::<NestedControllerManager>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        out.push(("NestedControllerManager".to_string(), m.name_any()));
    }
    out
}

/// The `--name=value` flags of a StatefulSet's first container.
pub fn flags(sts: &StatefulSet) -> BTreeMap<String, String> {
    let c = &sts.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0];
    c.args
        .iter()
        .flatten()
        .filter_map(|a| {
            a.strip_prefix("--")?
                .split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect()
}

/// `(name, resourceVersion)` of every StatefulSet in `ns`: equal snapshots mean nothing wrote.
pub async fn statefulset_versions(client: &Client, ns: &str) -> Vec<(String, Option<String>)> {
    Api::<StatefulSet>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|s| (s.name_any(), s.resource_version()))
        .collect()
}

/// The directory of Go-built test tools: the environment variable `variable`, else what
/// the build script `script` (under `hack/`, run in the repository) prints; checked to hold
/// every one of `binaries` (as the Cluster API tests treat `CAPI_ASSETS`).
///
/// # Panics
/// Loudly, with how to build them, when neither gives the binaries.
pub fn go_assets(variable: &str, script: &str, binaries: &[&str]) -> std::path::PathBuf {
    let repository = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let hint = format!("build or locate them with `export {variable}=$(hack/{script})` (needs Go)");
    let dir = match std::env::var_os(variable).filter(|v| !v.is_empty()) {
        Some(dir) => std::path::PathBuf::from(dir),
        None => {
            let output = std::process::Command::new(repository.join("hack").join(script))
                .current_dir(repository)
                .output()
                .unwrap_or_else(|e| panic!("{variable} is not set and hack/{script} cannot run: {e}; {hint}"));
            assert!(
                output.status.success(),
                "{variable} is not set and hack/{script} failed ({}):\n{}\n{hint}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
            std::path::PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
        }
    };
    for binary in binaries {
        assert!(
            dir.join(binary).is_file(),
            "{variable}={}: no {binary}; {hint}",
            dir.display()
        );
    }
    dir
}

/// The directory of the kubectl built with the super cluster's release (hack/kube-assets.sh):
/// the directory `$KUBEBUILDER_ASSETS/kube-apiserver` links into.
pub fn kubectl_dir() -> std::path::PathBuf {
    let apiserver = capn_testkit::cluster().assets_dir().join("kube-apiserver");
    let release = std::fs::canonicalize(&apiserver)
        .unwrap_or_else(|e| panic!("{}: {e}", apiserver.display()))
        .parent()
        .expect("the release directory")
        .to_path_buf();
    assert!(
        release.join("kubectl").is_file(),
        "{}/kubectl is missing: run hack/kube-assets.sh (it builds kubectl with the node's binaries)",
        release.display()
    );
    release
}
