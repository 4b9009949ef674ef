//! From a StatefulSet's pod template to the processes of one pod, as the kubelet would do it:
//! which binary, which arguments (with `$(VAR)` expanded), which environment, which volumes
//! at which paths, which user, which probes.

use std::collections::BTreeMap;
use std::fs;
use std::net::Ipv4Addr;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::{
    ConfigMap, Container, EnvVar, HostPathVolumeSource, KeyToPath, PodSecurityContext, PodSpec, Probe, Secret, Volume,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::runtime::reflector::{ObjectRef, Store};

use super::atomic_writer::{self, FileProjection, Payload, Written};
use super::probe::{Action, ProbeSpec};
use super::sandbox::{Launch, Mount, MountSource, host_path};

/// The directory inside every container that holds the pod's `hosts`, `resolv.conf` and
/// `hostname` (`/etc/hosts` and friends are symbolic links into it, so that the runner can
/// replace them atomically).
pub(super) const DNS_DIR: &str = "/run/capn-runner";
/// Where Debian, and so the distroless images, keep the CA bundle.
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// The image's PATH (distroless, which the Kubernetes and etcd images are built on).
const IMAGE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Device nodes a container runtime provides.
const DEVICES: [&str; 5] = ["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"];

/// Who the pod is, for the downward API and its names.
#[derive(Clone, Debug)]
pub(super) struct PodIdentity {
    pub name: String,
    pub namespace: String,
    pub ip: Ipv4Addr,
    pub host_ip: Ipv4Addr,
    pub node_name: String,
    /// The Pod object's uid (empty for a runner pod, which has no object).
    pub uid: String,
    pub service_account: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// One container, ready to start and to probe.
#[derive(Clone, Debug)]
pub(super) struct ContainerPlan {
    pub name: String,
    /// An init container: runs to completion before the next one and the containers.
    pub init: bool,
    pub launch: Launch,
    pub startup: Option<ProbeSpec>,
    pub readiness: Option<ProbeSpec>,
    pub liveness: Option<ProbeSpec>,
    /// What the environment and arguments are built from at each start.
    pub env: EnvSpec,
}

/// A container's `env` and unexpanded arguments: the kubelet builds the environment (and
/// expands `$(VAR)` in the arguments) anew every time it creates the container, so a
/// `configMapKeyRef` reads the ConfigMap as it is at that start, not at the pod's.
#[derive(Clone, Debug)]
pub(super) struct EnvSpec {
    container: Container,
    identity: PodIdentity,
    /// `PATH`, `HOSTNAME`, `HOME`: what the image and the runtime set before `env`.
    base: Vec<(String, String)>,
}

impl ContainerPlan {
    /// The namespace of the container's pod (where its Secrets and ConfigMaps are).
    pub fn namespace(&self) -> &str {
        &self.env.identity.namespace
    }

    /// The launch with the environment and arguments as the kubelet would build them now.
    ///
    /// # Errors
    /// A `configMapKeyRef` (not `optional`) whose ConfigMap or key does not exist: the kubelet
    /// reports `CreateContainerConfigError` and tries again.
    pub fn launch_now(&self, sources: &Sources<'_>) -> Result<Launch, NotYet> {
        let env = environment(&self.env.container, &self.env.identity, Some(sources))?;
        let mut launch = self.launch.clone();
        let vars: BTreeMap<String, String> = env.iter().cloned().collect();
        launch.args = unexpanded_args(&self.env.container)
            .iter()
            .map(|a| expand(a, &vars))
            .collect();
        let mut full_env = self.env.base.clone();
        for (k, v) in env {
            full_env.retain(|(n, _)| *n != k);
            full_env.push((k, v));
        }
        launch.env = full_env;
        Ok(launch)
    }
}

/// `command[1..]` then `args`, as rendered.
fn unexpanded_args(container: &Container) -> Vec<String> {
    container
        .command
        .iter()
        .flatten()
        .skip(1)
        .chain(container.args.iter().flatten())
        .cloned()
        .collect()
}

/// The binary each container runs and the version its image tag promises, checked once per
/// template: `Err` is a refusal to run the template at all.
pub(super) fn check_template(
    spec: &PodSpec,
    claim_templates: &[String],
    binaries: &Binaries,
    versions: &mut BTreeMap<PathBuf, Result<String, String>>,
) -> Result<(), String> {
    let refuse = |what: String| Err(what);
    for init in spec.init_containers.iter().flatten() {
        // The API server refuses probes on init containers; a sidecar (restartPolicy
        // Always) would need the kubelet's sidecar lifecycle, which the runner lacks.
        if init.startup_probe.is_some() || init.readiness_probe.is_some() || init.liveness_probe.is_some() {
            return refuse(format!(
                "init container {}: probes are not allowed on init containers",
                init.name
            ));
        }
        if init.restart_policy.as_deref() == Some("Always") {
            return refuse(format!(
                "init container {}: sidecar containers (restartPolicy: Always) are not supported by the runner",
                init.name
            ));
        }
    }
    if spec.host_network == Some(true) || spec.host_pid == Some(true) || spec.host_ipc == Some(true) {
        return refuse(
            "hostNetwork/hostPID/hostIPC pods would share the host's namespaces; the runner refuses them".into(),
        );
    }
    for volume in spec.volumes.iter().flatten() {
        if let Some(source) = &volume.host_path {
            check_host_path(&volume.name, source)?;
        } else if volume.secret.is_none()
            && volume.config_map.is_none()
            && volume.empty_dir.is_none()
            && volume.persistent_volume_claim.is_none()
        {
            super::projected::check(volume)?;
        }
    }
    for container in spec.init_containers.iter().flatten().chain(&spec.containers) {
        let name = &container.name;
        binary_for(container, binaries, versions)?;
        for mount in container.volume_mounts.iter().flatten() {
            let known =
                spec.volumes.iter().flatten().any(|v| v.name == mount.name) || claim_templates.contains(&mount.name);
            if !known {
                return refuse(format!(
                    "container {name} mounts volume {} that the pod does not have",
                    mount.name
                ));
            }
            if mount.sub_path_expr.is_some() {
                return refuse(format!("container {name}: subPathExpr is not supported by the runner"));
            }
        }
        for var in container.env.iter().flatten() {
            if let Some(from) = &var.value_from
                && from.field_ref.is_none()
                && from.config_map_key_ref.is_none()
                && from.secret_key_ref.is_none()
            {
                return refuse(format!(
                    "container {name}: env {} uses a valueFrom the runner does not support (only fieldRef, configMapKeyRef and secretKeyRef)",
                    var.name
                ));
            }
        }
        for probe in [
            &container.startup_probe,
            &container.readiness_probe,
            &container.liveness_probe,
        ]
        .into_iter()
        .flatten()
        {
            if probe.http_get.is_none() && probe.tcp_socket.is_none() {
                return refuse(format!(
                    "container {name}: only httpGet and tcpSocket probes are supported by the runner"
                ));
            }
        }
        identity(spec.security_context.as_ref(), container)?;
    }
    Ok(())
}

/// Where the runner takes the binaries that images stand for (adaptation 1).
#[derive(Clone, Debug)]
pub struct Binaries {
    /// The release cache of `hack/kube-assets.sh` ([`release_cache`]).
    pub cache: PathBuf,
    /// The `capn` binary that capn's own image stands for: the one cargo built for the
    /// caller (a library cannot name it; `env!("CARGO_BIN_EXE_capn")` in the root package).
    pub capn: PathBuf,
    /// `command[0]` base names that run one given binary whatever the image's tag says (the
    /// node's `agnhost`, which the e2e test images' own versions do not name): empty for the
    /// runner.
    pub fixed: BTreeMap<String, PathBuf>,
    /// The node's `busybox`, whose applets every container of the node finds in `/bin`
    /// (the images it runs are BusyBox's and Alpine's): `None` for the runner.
    pub busybox: Option<PathBuf>,
    /// Host tools that stand for those an image installs besides (the agnhost image's
    /// netcat-openbsd), bind-mounted read-only: empty for the runner.
    pub image_tools: Vec<ImageTool>,
    /// Files an image holds, copied into each of its containers' root (a container may move
    /// them, as upstream's StatefulSet specs move the agnhost image's `/localhost.crt`):
    /// empty for the runner.
    pub image_files: Vec<ImageTool>,
}

/// A host binary (or file) at `target` in the containers of images of `repository`.
#[derive(Clone, Debug)]
pub struct ImageTool {
    pub repository: String,
    pub target: PathBuf,
    pub binary: PathBuf,
}

/// Where a container finds the node's BusyBox (its applets link to it in `/bin`).
const BUSYBOX_PATH: &str = "/bin/busybox";

/// Where `hack/kube-assets.sh` keeps its builds, one directory per release:
/// `$CAPN_ASSETS_CACHE`, else `${XDG_CACHE_HOME:-$HOME/.cache}/capn/assets` (the script's own
/// rule, so that what it built is found here).
pub fn release_cache() -> PathBuf {
    if let Some(cache) = std::env::var_os("CAPN_ASSETS_CACHE").filter(|c| !c.is_empty()) {
        return PathBuf::from(cache);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|c| !c.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache"));
    base.join("capn/assets")
}

/// Where `hack/kube-assets.sh` puts the Go test fixture `hack/test-<name>` (its
/// `build_fixture`): `test-<name>-<first 16 hex digits of the SHA-256 of its go.mod, go.sum
/// and main.go, in that order>/capn-test-<name>` in the [`release_cache`]. `sources` are
/// those three files' bytes, which the caller includes at build time.
pub fn fixture_binary(name: &str, sources: [&[u8]; 3]) -> PathBuf {
    use sha2::Digest as _;
    let mut hash = sha2::Sha256::new();
    for source in sources {
        hash.update(source);
    }
    let hex: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    release_cache()
        .join(format!("test-{name}-{}", &hex[..16]))
        .join(format!("capn-test-{name}"))
}

/// The binary of `release` that a container running `base` needs, in the cache layout of
/// `hack/kube-assets.sh`: `kubernetes-v<release>/<base>` for the Kubernetes binaries,
/// `etcd-v<release>/<base>` for etcd's, `capn` for capn's own, and the command line that
/// builds it.
///
/// # Errors
/// For a binary the asset script does not build.
pub(super) fn release_binary(binaries: &Binaries, base: &str, release: &str) -> Result<(PathBuf, String), String> {
    if base == "capn" {
        return Ok((binaries.capn.clone(), "cargo build --bin capn".to_owned()));
    }
    let (dir, variable) = match base {
        "kube-apiserver" | "kube-controller-manager" => ("kubernetes", "KUBE_VERSION"),
        "etcd" | "etcdutl" => ("etcd", "ETCD_VERSION"),
        other => {
            return Err(format!(
                "{other} is not a binary hack/kube-assets.sh builds (kube-apiserver, kube-controller-manager, etcd, etcdutl) nor capn"
            ));
        }
    };
    let path = binaries.cache.join(format!("{dir}-v{release}")).join(base);
    let build = format!("{variable}=v{release} hack/kube-assets.sh");
    Ok((path, build))
}

/// The image's repository (`registry.k8s.io/pause:3.10` → `registry.k8s.io/pause`).
pub(super) fn repository(image: &str) -> &str {
    let image = image.split('@').next().unwrap_or(image);
    match image.rsplit_once(':') {
        Some((repository, tag)) if !tag.contains('/') => repository,
        _ => image,
    }
}

/// The container's `command[0]` without its directory (`/usr/local/bin/etcd` → `etcd`).
pub(super) fn command_base(container: &Container) -> Result<&str, String> {
    let name = &container.name;
    let command0 =
        container.command.as_ref().and_then(|c| c.first()).ok_or_else(|| {
            format!("container {name} has no command; the runner does not know the image's entrypoint")
        })?;
    Ok(Path::new(command0)
        .file_name()
        .and_then(|b| b.to_str())
        .unwrap_or(command0))
}

/// The local binary for `command[0]` of the release the image tag names, from the release
/// cache (runner adaptation 1), without checking it.
///
/// # Errors
/// When the image names no release or the binary is not one the asset script builds.
pub(super) fn located_binary(container: &Container, binaries: &Binaries) -> Result<(PathBuf, String, String), String> {
    let name = &container.name;
    let base = command_base(container)?;
    let image = container.image.as_deref().unwrap_or_default();
    let wanted = image_version(image)
        .ok_or_else(|| format!("container {name}: image {image:?} has no version tag naming the release to run"))?;
    let (binary, build) = release_binary(binaries, base, &wanted).map_err(|e| format!("container {name}: {e}"))?;
    Ok((binary, wanted, build))
}

/// The local binary for `command[0]`, of the release the image tag names, checked by its
/// `--version` against that release.
fn binary_for(
    container: &Container,
    binaries: &Binaries,
    versions: &mut BTreeMap<PathBuf, Result<String, String>>,
) -> Result<PathBuf, String> {
    let name = &container.name;
    let image = container.image.as_deref().unwrap_or_default();
    let base = command_base(container)?;
    if let Some(binary) = binaries.fixed.get(base) {
        return Ok(binary.clone());
    }
    let (binary, wanted, build) = located_binary(container, binaries)?;
    if !binary.is_file() {
        return Err(format!(
            "MISSING RELEASE: container {name} wants image {image} (release {wanted}), and {} does not exist; \
             build it with `{build}` (from the repository root; it builds only what the cache lacks)",
            binary.display()
        ));
    }
    let have = versions
        .entry(binary.clone())
        .or_insert_with(|| {
            let text = super::sandbox::run_host_command(&binary, version_args(base))?;
            parse_version(&text)
                .ok_or_else(|| format!("{} --version printed no version: {}", binary.display(), text.trim()))
        })
        .clone()?;
    if have != wanted {
        return Err(format!(
            "REFUSED: container {name} wants image {image} (version {wanted}), but {} is version {have}; \
             the runner only runs the exact release the image names (rebuild it: remove it and run `{build}`)",
            binary.display()
        ));
    }
    Ok(binary)
}

/// How a binary prints its version: `etcdutl version` (it has no `--version` flag), else
/// `--version`.
fn version_args(base: &str) -> &'static [&'static str] {
    if base == "etcdutl" {
        &["version"]
    } else {
        &["--version"]
    }
}

/// The release an image tag names: `registry.k8s.io/etcd:3.6.8-0` → `3.6.8`,
/// `…/kube-apiserver:v1.36.3` → `1.36.3`.
pub(super) fn image_version(image: &str) -> Option<String> {
    let image = image.split('@').next()?;
    let last = image.rsplit('/').next()?;
    let tag = last.split_once(':')?.1;
    let tag = tag.strip_prefix('v').unwrap_or(tag);
    let core = tag.split(['-', '+']).next()?;
    (core.split('.').count() == 3 && core.split('.').all(|p| p.parse::<u64>().is_ok())).then(|| core.to_owned())
}

/// The first `X.Y.Z` in a `--version` output (`etcd Version: 3.6.8`, `Kubernetes v1.36.3`).
pub(super) fn parse_version(text: &str) -> Option<String> {
    text.split(|c: char| c.is_whitespace() || c == ',')
        .map(|word| word.strip_prefix('v').unwrap_or(word))
        .find(|word| {
            let parts: Vec<&str> = word.split('.').collect();
            parts.len() == 3 && parts.iter().all(|p| p.parse::<u64>().is_ok())
        })
        .map(str::to_owned)
}

/// uid, gid, supplementary groups, no_new_privs, read-only root of a container.
struct Identity {
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
    no_new_privs: bool,
    read_only_root: bool,
}

fn identity(pod: Option<&PodSecurityContext>, container: &Container) -> Result<Identity, String> {
    let own = container.security_context.as_ref();
    let uid = own
        .and_then(|s| s.run_as_user)
        .or(pod.and_then(|p| p.run_as_user))
        .unwrap_or(0);
    // Without runAsGroup the runtime takes the user's group from the image's /etc/passwd
    // (the distroless one written by `build_rootfs`), else 0.
    let gid = own
        .and_then(|s| s.run_as_group)
        .or(pod.and_then(|p| p.run_as_group))
        .unwrap_or(if matches!(uid, 65532 | 65534) { uid } else { 0 });
    let non_root = own
        .and_then(|s| s.run_as_non_root)
        .or(pod.and_then(|p| p.run_as_non_root))
        .unwrap_or(false);
    if non_root && uid == 0 {
        return Err(format!(
            "container {}: runAsNonRoot without a non-zero runAsUser (the kubelet would refuse it too)",
            container.name
        ));
    }
    if own.and_then(|s| s.privileged) == Some(true) {
        return Err(format!(
            "container {}: privileged containers are not supported by the runner",
            container.name
        ));
    }
    let mut groups: Vec<u32> = pod
        .and_then(|p| p.fs_group)
        .into_iter()
        .chain(pod.and_then(|p| p.supplemental_groups.clone()).into_iter().flatten())
        .map(|g| g as u32)
        .collect();
    groups.dedup();
    Ok(Identity {
        uid: uid as u32,
        gid: gid as u32,
        groups,
        no_new_privs: own.and_then(|s| s.allow_privilege_escalation) == Some(false),
        read_only_root: own.and_then(|s| s.read_only_root_filesystem) == Some(true),
    })
}

/// The kubelet's `$(VAR)` expansion (k8s.io/kubernetes third_party/forked/golang/expansion):
/// `$(NAME)` becomes the value when NAME is defined and stays as written otherwise; `$$` is
/// an escaped `$`.
pub(super) fn expand(input: &str, vars: &BTreeMap<String, String>) -> String {
    let bytes = input.as_bytes();
    let mut out = String::new();
    let mut checkpoint = 0;
    let mut cursor = 0;
    while cursor < bytes.len() {
        if bytes[cursor] == b'$' && cursor + 1 < bytes.len() {
            out.push_str(&input[checkpoint..cursor]);
            let rest = &input[cursor + 1..];
            let advance = match rest.as_bytes()[0] {
                b'$' => {
                    out.push('$');
                    1
                }
                b'(' => match rest.find(')') {
                    Some(end) => {
                        let name = &rest[1..end];
                        match vars.get(name) {
                            Some(value) => out.push_str(value),
                            None => {
                                out.push_str("$(");
                                out.push_str(name);
                                out.push(')');
                            }
                        }
                        end + 1
                    }
                    None => {
                        out.push_str("$(");
                        1
                    }
                },
                _ => {
                    // `$` and the next character, copied as they are.
                    let c = rest.chars().next().unwrap_or_default();
                    out.push('$');
                    out.push(c);
                    c.len_utf8()
                }
            };
            cursor += advance;
            checkpoint = cursor + 1;
        }
        cursor += 1;
    }
    if checkpoint < input.len() {
        out.push_str(&input[checkpoint..]);
    }
    out
}

/// The variables of the container's `envFrom` (each ConfigMap's or Secret's keys, with the
/// `prefix`), which `env` then overrides, as the kubelet orders them. Without `sources`
/// (planning, before any start) there are none.
///
/// # Errors
/// A source that does not exist and is not `optional` (`CreateContainerConfigError`).
fn env_from(container: &Container, sources: Option<&Sources<'_>>) -> Result<Vec<(String, String)>, String> {
    let mut vars: Vec<(String, String)> = Vec::new();
    let Some(sources) = sources else { return Ok(vars) };
    for from in container.env_from.iter().flatten() {
        let (source, optional) = if let Some(c) = &from.config_map_ref {
            (Source::ConfigMap(c.name.clone()), c.optional)
        } else if let Some(s) = &from.secret_ref {
            (Source::Secret(s.name.clone()), s.optional)
        } else {
            continue;
        };
        match sources.data(&source) {
            Some(data) => {
                let prefix = from.prefix.as_deref().unwrap_or_default();
                for (key, value) in data {
                    let name = format!("{prefix}{key}");
                    vars.retain(|(n, _)| *n != name);
                    vars.push((name, String::from_utf8_lossy(&value).into_owned()));
                }
            }
            None if optional == Some(true) => {}
            None => {
                return Err(format!(
                    "CreateContainerConfigError: container {}: envFrom: {source} does not exist (yet)",
                    container.name
                ));
            }
        }
    }
    Ok(vars)
}

/// The container's environment, in order, as the kubelet builds it from `envFrom` then
/// `env`. Without `sources` (planning, before any start) a `configMapKeyRef` reads as empty.
fn environment(
    container: &Container,
    pod: &PodIdentity,
    sources: Option<&Sources<'_>>,
) -> Result<Vec<(String, String)>, String> {
    let mut vars: Vec<(String, String)> = env_from(container, sources)?;
    let mut map: BTreeMap<String, String> = vars.iter().cloned().collect();
    for EnvVar {
        name,
        value,
        value_from,
    } in container.env.iter().flatten()
    {
        let value = match (value, value_from) {
            (Some(v), _) if !v.is_empty() => expand(v, &map),
            (_, Some(from)) if from.secret_key_ref.is_some() => {
                // As the kubelet: a missing Secret or key keeps the container from starting
                // (CreateContainerConfigError) unless the reference is optional.
                let Some(key_ref) = from.secret_key_ref.as_ref() else {
                    continue;
                };
                let Some(sources) = sources else {
                    // Planning, before any start: read when the container starts.
                    continue;
                };
                let data = sources.data(&Source::Secret(key_ref.name.clone()));
                match data.as_ref().and_then(|d| d.get(&key_ref.key)) {
                    Some(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                    None if key_ref.optional == Some(true) => continue,
                    None => {
                        return Err(format!(
                            "CreateContainerConfigError: container {}: env {name}: Secret {} has no key {:?} (yet)",
                            container.name, key_ref.name, key_ref.key
                        ));
                    }
                }
            }
            (_, Some(from)) if from.config_map_key_ref.is_some() => match (sources, &from.config_map_key_ref) {
                (Some(sources), Some(selector)) => {
                    let data = sources.data(&Source::ConfigMap(selector.name.clone()));
                    match data.and_then(|d| d.get(&selector.key).cloned()) {
                        Some(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                        // An optional reference to a missing ConfigMap or key leaves the variable out.
                        None if selector.optional == Some(true) => continue,
                        None => {
                            return Err(format!(
                                "CreateContainerConfigError: container {}: env {name}: ConfigMap {} has no key {:?} (yet)",
                                container.name, selector.name, selector.key
                            ));
                        }
                    }
                }
                _ => String::new(),
            },
            (_, Some(from)) => {
                let path = from
                    .field_ref
                    .as_ref()
                    .map(|f| f.field_path.as_str())
                    .unwrap_or_default();
                field_value(path, pod).ok_or_else(|| {
                    format!(
                        "container {}: env {name}: fieldRef {path:?} is not supported by the runner",
                        container.name
                    )
                })?
            }
            _ => String::new(),
        };
        map.insert(name.clone(), value.clone());
        vars.retain(|(n, _)| n != name);
        vars.push((name.clone(), value));
    }
    Ok(vars)
}

/// The downward API fields a runner pod has.
pub(super) fn field_value(path: &str, pod: &PodIdentity) -> Option<String> {
    let quoted = |prefix: &str| path.strip_prefix(prefix)?.strip_suffix("']").map(str::to_owned);
    Some(match path {
        "metadata.name" => pod.name.clone(),
        "metadata.namespace" => pod.namespace.clone(),
        "spec.nodeName" => pod.node_name.clone(),
        "metadata.uid" => pod.uid.clone(),
        "spec.serviceAccountName" => pod.service_account.clone(),
        "status.podIP" | "status.podIPs" => pod.ip.to_string(),
        "status.hostIP" | "status.hostIPs" => pod.host_ip.to_string(),
        _ => {
            if let Some(key) = quoted("metadata.labels['") {
                pod.labels.get(&key).cloned().unwrap_or_default()
            } else if let Some(key) = quoted("metadata.annotations['") {
                pod.annotations.get(&key).cloned().unwrap_or_default()
            } else {
                return None;
            }
        }
    })
}

/// Why a pod cannot start yet (the kubelet keeps it in ContainerCreating and retries).
pub(super) type NotYet = String;

/// The object a Secret or ConfigMap volume projects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Source {
    Secret(String),
    ConfigMap(String),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Secret(name) => write!(f, "Secret {name}"),
            Self::ConfigMap(name) => write!(f, "ConfigMap {name}"),
        }
    }
}

/// Where Secret and ConfigMap volumes take their data from: the runner's watch caches of its
/// namespace (as the kubelet's watch-based Secret and ConfigMap managers).
pub(super) struct Sources<'a> {
    pub namespace: &'a str,
    pub secrets: &'a Store<Secret>,
    pub config_maps: &'a Store<ConfigMap>,
}

impl Sources<'_> {
    /// The data of `source` (a ConfigMap's `data` and `binaryData` together), `None` when it
    /// does not exist.
    pub fn data(&self, source: &Source) -> Option<BTreeMap<String, Vec<u8>>> {
        match source {
            Source::Secret(name) => {
                let secret = self.secrets.get(&ObjectRef::new(name).within(self.namespace))?;
                Some(
                    secret
                        .data
                        .iter()
                        .flatten()
                        .map(|(k, v)| (k.clone(), v.0.clone()))
                        .collect(),
                )
            }
            Source::ConfigMap(name) => {
                let config_map = self.config_maps.get(&ObjectRef::new(name).within(self.namespace))?;
                let mut data: BTreeMap<String, Vec<u8>> = config_map
                    .data
                    .iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
                    .collect();
                data.extend(
                    config_map
                        .binary_data
                        .iter()
                        .flatten()
                        .map(|(k, v)| (k.clone(), v.0.clone())),
                );
                Some(data)
            }
        }
    }
}

/// A Secret or ConfigMap volume of a pod: what the kubelet needs to write it again when its
/// source changes.
#[derive(Clone, Debug)]
pub(super) struct SourcedVolume {
    /// The volume's name in the pod.
    pub name: String,
    /// `pod_dir/volumes/<name>`, the directory containers bind-mount.
    pub dir: PathBuf,
    pub source: Source,
    pub items: Option<Vec<KeyToPath>>,
    /// `defaultMode`, 0644 when unset (the API default).
    pub default_mode: u32,
    pub optional: bool,
    pub fs_group: Option<u32>,
}

impl SourcedVolume {
    fn new(volume: &Volume, dir: &Path, fs_group: Option<u32>) -> Option<Self> {
        let (source, items, default_mode, optional) = if let Some(s) = &volume.secret {
            (
                Source::Secret(s.secret_name.clone().unwrap_or_default()),
                s.items.clone(),
                s.default_mode,
                s.optional,
            )
        } else {
            let c = volume.config_map.as_ref()?;
            (
                Source::ConfigMap(c.name.clone()),
                c.items.clone(),
                c.default_mode,
                c.optional,
            )
        };
        Some(Self {
            name: volume.name.clone(),
            dir: dir.to_owned(),
            source,
            items,
            default_mode: default_mode.unwrap_or(0o644) as u32,
            optional: optional.unwrap_or(false),
            fs_group,
        })
    }

    /// The files of this volume from its source's `data` (`None`: the source does not
    /// exist), as the kubelet's `MakePayload`: every key, or the `items` with their own
    /// modes; a missing source or key is an error unless the volume is `optional`.
    ///
    /// # Errors
    /// Why the volume cannot be written (yet): a missing source or key, or an item path that
    /// leaves the volume.
    pub fn payload(&self, data: Option<&BTreeMap<String, Vec<u8>>>) -> Result<Payload, NotYet> {
        let what = &self.source;
        let empty = BTreeMap::new();
        let data = match data {
            Some(data) => data,
            None if self.optional => &empty,
            None => return Err(format!("{what} does not exist")),
        };
        let mut payload = Payload::new();
        let Some(items) = &self.items else {
            for (key, bytes) in data {
                payload.insert(
                    key.clone(),
                    FileProjection {
                        data: bytes.clone(),
                        mode: self.default_mode,
                    },
                );
            }
            return Ok(payload);
        };
        for item in items {
            let Some(bytes) = data.get(&item.key) else {
                if self.optional {
                    continue;
                }
                return Err(format!("{what} has no key {}", item.key));
            };
            safe_relative(&item.path).ok_or_else(|| format!("{what}: item path {:?} escapes the volume", item.path))?;
            payload.insert(
                item.path.clone(),
                FileProjection {
                    data: bytes.clone(),
                    mode: item.mode.map_or(self.default_mode, |m| m as u32),
                },
            );
        }
        Ok(payload)
    }

    /// Writes `payload` with the kubelet's atomic writer, fsGroup applied to the whole
    /// volume before the new payload is published (the secret and configMap plugins'
    /// `setPerms`; these volumes are read-only: `r--r-----` added).
    ///
    /// # Errors
    /// Filesystem errors; the previous payload then stays.
    pub fn write(&self, payload: &Payload) -> Result<Written, String> {
        atomic_writer::write(&self.dir, payload, || match self.fs_group {
            Some(group) => apply_fs_group(&self.dir, group, true),
            None => Ok(()),
        })
    }

    /// Brings the volume up to date with its source, writing nothing when the files already
    /// hold its data.
    ///
    /// # Errors
    /// As [`Self::payload`] and [`Self::write`]; the volume then keeps its last content.
    pub fn refresh(&self, sources: &Sources<'_>) -> Result<Written, NotYet> {
        let payload = self.payload(sources.data(&self.source).as_ref())?;
        self.write(&payload)
    }
}

/// Writes the pod's volumes under `pod_dir/volumes/<name>` (claims: the directories given),
/// with the ownership and modes the kubelet gives them (fsGroup included). Returns every
/// volume's directory by name, and the Secret and ConfigMap volumes to keep up to date.
pub(super) fn materialize_volumes(
    sources: &Sources<'_>,
    identity: &PodIdentity,
    spec: &PodSpec,
    claims: &BTreeMap<String, PathBuf>,
    claims_dir: &Path,
    pod_dir: &Path,
) -> Result<(BTreeMap<String, PathBuf>, Vec<SourcedVolume>), NotYet> {
    let fs_group = spec
        .security_context
        .as_ref()
        .and_then(|s| s.fs_group)
        .map(|g| g as u32);
    let mut out = BTreeMap::new();
    let mut sourced = Vec::new();
    for (name, dir) in claims {
        prepare_claim(dir, fs_group)?;
        out.insert(name.clone(), dir.clone());
    }
    for volume in spec.volumes.iter().flatten() {
        let dir = pod_dir.join("volumes").join(&volume.name);
        let path = match super::projected::payload(volume, sources, identity) {
            Some(payload) => super::projected::write(&dir, &payload?, fs_group)?,
            None => materialize(sources, volume, &dir, claims_dir, fs_group, &mut sourced)?,
        };
        out.insert(volume.name.clone(), path);
    }
    Ok((out, sourced))
}

fn materialize(
    sources: &Sources<'_>,
    volume: &Volume,
    dir: &Path,
    claims_dir: &Path,
    fs_group: Option<u32>,
    sourced: &mut Vec<SourcedVolume>,
) -> Result<PathBuf, NotYet> {
    if let Some(source) = &volume.persistent_volume_claim {
        let claim = claims_dir.join(&source.claim_name);
        prepare_claim(&claim, fs_group)?;
        return Ok(claim);
    }
    if let Some(source) = &volume.host_path {
        return host_path_volume(&volume.name, source);
    }
    let io = |what: &str, e: std::io::Error| format!("{what} {}: {e}", dir.display());
    let target = SourcedVolume::new(volume, dir, fs_group);
    // The payload first: a volume whose source is missing is not created at all.
    let payload = match &target {
        Some(target) => Some(target.payload(sources.data(&target.source).as_ref())?),
        None if volume.empty_dir.is_some() => None,
        None => return Err(format!("volume {} has no supported source", volume.name)),
    };
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir).map_err(|e| io("cannot create", e))?;
    // emptyDir and the atomic-writer volumes (secret, configMap) start as 0777 directories.
    fs::set_permissions(dir, fs::Permissions::from_mode(0o777)).map_err(|e| io("chmod", e))?;
    match (target, payload) {
        (Some(target), Some(payload)) => {
            target.write(&payload)?;
            sourced.push(target);
        }
        _ => {
            if let Some(group) = fs_group {
                apply_fs_group(dir, group, false).map_err(|e| io("fsGroup on", e))?;
            }
        }
    }
    Ok(dir.to_owned())
}

/// `Err` (a refusal) for a hostPath volume the runner does not mount: a relative path, or a
/// type other than `Directory`, `DirectoryOrCreate` and unset (`File`, `Socket`, ...: no
/// channel renders them yet).
///
/// # Errors
/// Naming the volume and what is not supported.
fn check_host_path(name: &str, source: &HostPathVolumeSource) -> Result<(), String> {
    if !Path::new(&source.path).is_absolute() {
        return Err(format!(
            "volume {name}: hostPath {:?} is not an absolute path",
            source.path
        ));
    }
    match source.type_.as_deref().unwrap_or_default() {
        "" | "Directory" | "DirectoryOrCreate" => Ok(()),
        other => Err(format!(
            "volume {name}: hostPath type {other} is not supported by the runner (only Directory, \
             DirectoryOrCreate and unset)"
        )),
    }
}

/// A hostPath volume's directory on the host, checked or made as the kubelet's hostPath
/// plugin does before the pod starts (`pkg/volume/hostpath`, `checkType`): `Directory` must
/// exist and be a directory; `DirectoryOrCreate` is made (0755, owned by root) when missing
/// and must then be a directory; an unset type is not checked, and a missing path is made
/// as a directory, as containerd's CRI plugin makes a bind mount's missing source. Nothing
/// of fsGroup is applied (the kubelet manages no hostPath ownership), and the runner never
/// removes what it made.
///
/// # Errors
/// The kubelet's `MountVolume.SetUp failed … hostPath type check failed: <path> is not a
/// directory`: the pod waits and the check is made again (a directory made later lets it
/// start), as the kubelet retries the mount.
fn host_path_volume(name: &str, source: &HostPathVolumeSource) -> Result<PathBuf, NotYet> {
    let path = PathBuf::from(&source.path);
    let kind = source.type_.as_deref().unwrap_or_default();
    let failed = |why: String| format!("MountVolume.SetUp failed for volume {name:?} : {why}");
    if kind != "Directory" && !path.exists() {
        fs::create_dir_all(&path).map_err(|e| failed(format!("cannot create {}: {e}", path.display())))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755))
            .map_err(|e| failed(format!("chmod {}: {e}", path.display())))?;
    }
    if kind.is_empty() || path.is_dir() {
        return Ok(path);
    }
    Err(failed(format!(
        "hostPath type check failed: {} is not a directory",
        path.display()
    )))
}

/// A claim's directory: created once like a fresh filesystem's root (root:root 0755), then
/// given to fsGroup at every pod start (fsGroupChangePolicy Always).
fn prepare_claim(dir: &Path, fs_group: Option<u32>) -> Result<(), NotYet> {
    if !dir.exists() {
        fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("chmod {}: {e}", dir.display()))?;
    }
    if let Some(group) = fs_group {
        apply_fs_group(dir, group, false).map_err(|e| format!("fsGroup on {}: {e}", dir.display()))?;
    }
    Ok(())
}

/// The kubelet's SetVolumeOwnership: group `fs_group` on everything (symbolic links
/// included, through lchown), `rw-rw----` (read-only volumes `r--r-----`) added to files,
/// plus setgid and `--x--x---` on directories; a link's mode is left alone (chmod would
/// change its target).
pub(super) fn apply_fs_group(path: &Path, group: u32, read_only: bool) -> std::io::Result<()> {
    let meta = fs::symlink_metadata(path)?;
    std::os::unix::fs::lchown(path, None, Some(group))?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    let mut mask = if read_only { 0o440 } else { 0o660 };
    if meta.is_dir() {
        mask |= 0o2000 | 0o110;
    }
    fs::set_permissions(
        path,
        fs::Permissions::from_mode(meta.permissions().mode() & 0o7777 | mask),
    )?;
    if meta.is_dir() {
        for entry in fs::read_dir(path)? {
            apply_fs_group(&entry?.path(), group, read_only)?;
        }
    }
    Ok(())
}

/// `path` if it is relative and stays inside its base.
pub(super) fn safe_relative(path: &str) -> Option<&Path> {
    let p = Path::new(path);
    p.components().all(|c| matches!(c, Component::Normal(_))).then_some(p)
}

/// Everything about one pod the containers need, besides its template.
pub(super) struct PodContext<'a> {
    pub identity: &'a PodIdentity,
    pub volumes: &'a BTreeMap<String, PathBuf>,
    /// The pod's DNS directory (mounted at [`DNS_DIR`]).
    pub dns_dir: &'a Path,
    pub pod_dir: &'a Path,
    /// Where the binaries come from (runner adaptation 1).
    pub binaries: &'a Binaries,
    pub libraries: &'a BTreeMap<PathBuf, Vec<PathBuf>>,
}

/// Plans every container of the pod and lays out their root directories.
pub(super) fn plan_containers(spec: &PodSpec, ctx: &PodContext<'_>) -> Result<Vec<ContainerPlan>, String> {
    let mut plans = Vec::new();
    for container in &spec.containers {
        plans.push(plan_container(spec, container, ctx)?);
    }
    Ok(plans)
}

/// Plans the init containers, in order.
pub(super) fn plan_init_containers(spec: &PodSpec, ctx: &PodContext<'_>) -> Result<Vec<ContainerPlan>, String> {
    let mut plans = Vec::new();
    for container in spec.init_containers.iter().flatten() {
        let mut plan = plan_container(spec, container, ctx)?;
        plan.init = true;
        plans.push(plan);
    }
    Ok(plans)
}

fn plan_container(spec: &PodSpec, container: &Container, ctx: &PodContext<'_>) -> Result<ContainerPlan, String> {
    let name = &container.name;
    let command = container.command.clone().unwrap_or_default();
    let command0 = command.first().cloned().unwrap_or_default();
    let base = command_base(container)?.to_owned();
    let binary = match ctx.binaries.fixed.get(&base) {
        Some(binary) => binary.clone(),
        None => located_binary(container, ctx.binaries)?.0,
    };
    // A bare name is found on the image's PATH; the Kubernetes images keep it here.
    let program = if command0.contains('/') {
        PathBuf::from(&command0)
    } else {
        PathBuf::from("/usr/local/bin").join(&base)
    };
    let env = environment(container, ctx.identity, None)?;
    let vars: BTreeMap<String, String> = env.iter().cloned().collect();
    let args: Vec<String> = unexpanded_args(container).iter().map(|a| expand(a, &vars)).collect();
    let base = vec![
        ("PATH".to_owned(), IMAGE_PATH.to_owned()),
        ("HOSTNAME".to_owned(), ctx.identity.name.clone()),
        ("HOME".to_owned(), "/".to_owned()),
    ];
    let mut full_env = base.clone();
    for (k, v) in env {
        full_env.retain(|(n, _)| *n != k);
        full_env.push((k, v));
    }
    let id = identity(spec.security_context.as_ref(), container)?;

    // The mounts, in the order they are made.
    let mut mounts = vec![
        Mount {
            target: "/proc".into(),
            source: MountSource::Proc,
        },
        Mount {
            target: "/sys".into(),
            source: MountSource::Sysfs,
        },
    ];
    for device in DEVICES {
        mounts.push(Mount {
            target: device.into(),
            source: MountSource::Bind {
                source: device.into(),
                read_only: false,
            },
        });
    }
    bind_binary(&mut mounts, ctx.libraries.get(&binary), program.clone(), binary);
    // Distroless images carry Debian's CA bundle (TLS clients such as capn's object storage
    // client load it even for an http endpoint); the host's stands in for it, read-only
    // like the rest of the image.
    mounts.push(Mount {
        target: CA_BUNDLE.into(),
        source: MountSource::Bind {
            source: CA_BUNDLE.into(),
            read_only: true,
        },
    });
    mounts.push(Mount {
        target: DNS_DIR.into(),
        source: MountSource::Bind {
            source: ctx.dns_dir.to_owned(),
            read_only: true,
        },
    });
    let mut volume_mounts: Vec<_> = container.volume_mounts.iter().flatten().collect();
    // Shallower paths first, so that a mount inside another one is made after it.
    volume_mounts.sort_by_key(|m| Path::new(&m.mount_path).components().count());
    for vm in volume_mounts {
        let base = ctx
            .volumes
            .get(&vm.name)
            .ok_or_else(|| format!("container {name}: volume {} was not materialized", vm.name))?;
        let source = match vm.sub_path.as_deref().filter(|s| !s.is_empty()) {
            Some(sub) => {
                let relative = safe_relative(sub)
                    .ok_or_else(|| format!("container {name}: subPath {sub:?} escapes its volume"))?;
                let path = base.join(relative);
                if !path.exists() {
                    fs::create_dir_all(&path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
                }
                path
            }
            None => base.clone(),
        };
        mounts.push(Mount {
            target: PathBuf::from(&vm.mount_path),
            source: MountSource::Bind {
                source,
                read_only: vm.read_only == Some(true),
            },
        });
    }
    // The node's images' own tools: BusyBox in every container, and those of the image.
    let image = repository(container.image.as_deref().unwrap_or_default());
    let tools = ctx
        .binaries
        .busybox
        .iter()
        .map(|b| (PathBuf::from(BUSYBOX_PATH), b))
        .chain(
            ctx.binaries
                .image_tools
                .iter()
                .filter(|t| t.repository == image)
                .map(|t| (t.target.clone(), &t.binary)),
        );
    for (target, binary) in tools {
        bind_binary(&mut mounts, ctx.libraries.get(binary), target, binary.clone());
    }
    let container_dir = ctx.pod_dir.join("containers").join(name);
    let rootfs = container_dir.join("rootfs");
    build_rootfs(&rootfs, &mounts)?;
    if let Some(busybox) = &ctx.binaries.busybox {
        link_applets(&rootfs, busybox, &ctx.binaries.fixed)?;
    }
    for file in ctx.binaries.image_files.iter().filter(|f| f.repository == image) {
        let to = host_path(&rootfs, &file.target);
        fs::copy(&file.binary, &to)
            .map_err(|e| format!("cannot copy {} to {}: {e}", file.binary.display(), to.display()))?;
    }
    let pod_ip = ctx.identity.ip.to_string();
    let probe = |p: &Option<Probe>| -> Result<Option<ProbeSpec>, String> {
        p.as_ref().map(|p| probe_spec(p, container, &pod_ip)).transpose()
    };
    Ok(ContainerPlan {
        name: name.clone(),
        init: false,
        env: EnvSpec {
            container: container.clone(),
            identity: ctx.identity.clone(),
            base,
        },
        startup: probe(&container.startup_probe)?,
        readiness: probe(&container.readiness_probe)?,
        liveness: probe(&container.liveness_probe)?,
        launch: Launch {
            program,
            argv0: command0,
            args,
            env: full_env,
            rootfs,
            mounts,
            read_only_root: id.read_only_root,
            workdir: container
                .working_dir
                .clone()
                .filter(|w| !w.is_empty())
                .unwrap_or_else(|| "/".to_owned()),
            uid: id.uid,
            gid: id.gid,
            groups: id.groups,
            no_new_privs: id.no_new_privs,
            log: container_dir.join("log"),
        },
    })
}

/// The container's "image": a skeleton of a distroless root, and an empty file or directory
/// for every mount to land on.
fn build_rootfs(rootfs: &Path, mounts: &[Mount]) -> Result<(), String> {
    let io = |what: &Path, e: std::io::Error| format!("cannot prepare {}: {e}", what.display());
    let _ = fs::remove_dir_all(rootfs);
    for dir in ["etc", "dev", "proc", "sys", "usr/local/bin", "var", "home/nonroot"] {
        let path = rootfs.join(dir);
        fs::create_dir_all(&path).map_err(|e| io(&path, e))?;
    }
    let tmp = rootfs.join("tmp");
    fs::create_dir_all(&tmp).map_err(|e| io(&tmp, e))?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o1777)).map_err(|e| io(&tmp, e))?;
    let files = [
        (
            "etc/passwd",
            "root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
        ),
        ("etc/group", "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n"),
        ("etc/nsswitch.conf", "passwd: files\ngroup: files\nhosts: files dns\n"),
    ];
    for (path, text) in files {
        let path = rootfs.join(path);
        fs::write(&path, text).map_err(|e| io(&path, e))?;
    }
    for name in ["hosts", "resolv.conf", "hostname"] {
        let link = rootfs.join("etc").join(name);
        symlink(format!("{DNS_DIR}/{name}"), &link).map_err(|e| io(&link, e))?;
    }
    // Mount points: inside an earlier bind-mounted directory, the point is made in that
    // directory (as a container runtime would, through the mount).
    let mut made: Vec<(&Path, &Path)> = Vec::new();
    for mount in mounts {
        let target = &mount.target;
        let on_host = made
            .iter()
            .filter(|(t, _)| target.starts_with(t) && target != t)
            .max_by_key(|(t, _)| t.components().count())
            .map(|(t, source)| source.join(target.strip_prefix(t).unwrap_or(target)))
            .unwrap_or_else(|| host_path(rootfs, target));
        let is_dir = match &mount.source {
            MountSource::Bind { source, .. } => source.is_dir(),
            MountSource::Proc | MountSource::Sysfs => true,
        };
        if is_dir {
            fs::create_dir_all(&on_host).map_err(|e| io(&on_host, e))?;
        } else {
            if let Some(parent) = on_host.parent() {
                fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
            }
            if !on_host.exists() {
                fs::write(&on_host, b"").map_err(|e| io(&on_host, e))?;
            }
        }
        if let MountSource::Bind { source, .. } = &mount.source
            && source.is_dir()
        {
            made.push((target, source));
        }
    }
    Ok(())
}

/// A probe of `container`, aimed at the pod address unless it names a host.
fn probe_spec(probe: &Probe, container: &Container, pod_ip: &str) -> Result<ProbeSpec, String> {
    let port = |port: &IntOrString| -> Result<u16, String> {
        match port {
            IntOrString::Int(n) => u16::try_from(*n).map_err(|_| format!("bad probe port {n}")),
            IntOrString::String(name) => container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name))
                .and_then(|p| u16::try_from(p.container_port).ok())
                .ok_or_else(|| format!("container {}: probe port {name:?} is not a named port", container.name)),
        }
    };
    let action = if let Some(get) = &probe.http_get {
        Action::Http {
            https: get.scheme.as_deref().is_some_and(|s| s.eq_ignore_ascii_case("HTTPS")),
            host: get
                .host
                .clone()
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| pod_ip.to_owned()),
            port: port(&get.port)?,
            path: get.path.clone().unwrap_or_else(|| "/".to_owned()),
            headers: get
                .http_headers
                .iter()
                .flatten()
                .map(|h| (h.name.clone(), h.value.clone()))
                .collect(),
        }
    } else if let Some(tcp) = &probe.tcp_socket {
        Action::Tcp {
            host: tcp
                .host
                .clone()
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| pod_ip.to_owned()),
            port: port(&tcp.port)?,
        }
    } else {
        return Err(format!("container {}: unsupported probe handler", container.name));
    };
    let secs = |v: Option<i32>, default: i32| std::time::Duration::from_secs(v.unwrap_or(default).max(0) as u64);
    Ok(ProbeSpec {
        action,
        initial_delay: secs(probe.initial_delay_seconds, 0),
        period: secs(probe.period_seconds, 10).max(std::time::Duration::from_secs(1)),
        timeout: secs(probe.timeout_seconds, 1).max(std::time::Duration::from_secs(1)),
        success_threshold: probe.success_threshold.unwrap_or(1).max(1) as u32,
        failure_threshold: probe.failure_threshold.unwrap_or(3).max(1) as u32,
    })
}

/// Read-only binds of `binary` at `target` and of its shared `libraries` (each once: a
/// library another binary of the container needs is bound already).
fn bind_binary(mounts: &mut Vec<Mount>, libraries: Option<&Vec<PathBuf>>, target: PathBuf, binary: PathBuf) {
    let read_only = |source: PathBuf| MountSource::Bind {
        source,
        read_only: true,
    };
    for library in libraries.into_iter().flatten() {
        if !mounts.iter().any(|m| &m.target == library) {
            mounts.push(Mount {
                target: library.clone(),
                source: read_only(library.clone()),
            });
        }
    }
    mounts.push(Mount {
        target,
        source: read_only(binary),
    });
}

/// `/bin/<applet>` → `busybox` in `rootfs` for each applet of `busybox` (the entries of
/// `fixed` it runs), as a BusyBox image has them, except where a mount point already is.
fn link_applets(rootfs: &Path, busybox: &Path, fixed: &BTreeMap<String, PathBuf>) -> Result<(), String> {
    let bin = rootfs.join("bin");
    for (applet, _) in fixed.iter().filter(|(_, binary)| binary.as_path() == busybox) {
        let link = bin.join(applet);
        if applet == "busybox" || link.symlink_metadata().is_ok() {
            continue;
        }
        symlink("busybox", &link).map_err(|e| format!("cannot link {}: {e}", link.display()))?;
    }
    Ok(())
}

/// The shared libraries (and ELF interpreter) a dynamically linked binary needs, from
/// `ldd`; empty for a static binary.
pub(super) fn libraries(binary: &Path) -> Result<Vec<PathBuf>, String> {
    let output = std::process::Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(|e| format!("cannot run ldd on {}: {e}", binary.display()))?;
    let text = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        // "not a dynamic executable": a static binary needs nothing.
        return Ok(Vec::new());
    }
    let mut libs = Vec::new();
    for line in text.lines() {
        let path = match line.split_once("=>") {
            Some((_, right)) => right.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(path) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(path));
        }
    }
    Ok(libs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expansion_follows_the_kubelet() {
        let vars: BTreeMap<String, String> = [("POD_NAME", "demo-etcd-0"), ("EMPTY", "")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let cases = [
            ("--name=$(POD_NAME)", "--name=demo-etcd-0"),
            (
                "https://$(POD_NAME).demo-etcd:2380",
                "https://demo-etcd-0.demo-etcd:2380",
            ),
            ("$(UNSET)", "$(UNSET)"),
            ("$$(POD_NAME)", "$(POD_NAME)"),
            ("a$(EMPTY)b", "ab"),
            ("$(POD_NAME", "$(POD_NAME"),
            ("cost $5", "cost $5"),
            ("end$", "end$"),
            ("plain", "plain"),
        ];
        for (input, want) in cases {
            assert_eq!(expand(input, &vars), want, "{input}");
        }
    }

    fn volume(items: Option<Vec<(&str, &str, Option<i32>)>>, optional: bool) -> SourcedVolume {
        SourcedVolume {
            name: "pki".into(),
            dir: PathBuf::from("/nonexistent"),
            source: Source::Secret("demo-apiserver".into()),
            items: items.map(|items| {
                items
                    .into_iter()
                    .map(|(key, path, mode)| KeyToPath {
                        key: key.into(),
                        path: path.into(),
                        mode,
                    })
                    .collect()
            }),
            default_mode: 0o440,
            optional,
            fs_group: None,
        }
    }

    #[test]
    fn payloads_follow_the_kubelets_make_payload() {
        let data: BTreeMap<String, Vec<u8>> = [("tls.crt", "cert"), ("tls.key", "key")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.as_bytes().to_vec()))
            .collect();
        let summary = |p: Payload| -> Vec<(String, String, u32)> {
            p.into_iter()
                .map(|(path, f)| (path, String::from_utf8(f.data).unwrap(), f.mode))
                .collect()
        };
        // Every key, with defaultMode.
        assert_eq!(
            summary(volume(None, false).payload(Some(&data)).unwrap()),
            [
                ("tls.crt".to_owned(), "cert".to_owned(), 0o440),
                ("tls.key".to_owned(), "key".to_owned(), 0o440)
            ]
        );
        // Items: only those, at their paths, with their own modes.
        let items = Some(vec![
            ("tls.key", "private/key.pem", Some(0o400)),
            ("tls.crt", "tls.crt", None),
        ]);
        assert_eq!(
            summary(volume(items.clone(), false).payload(Some(&data)).unwrap()),
            [
                ("private/key.pem".to_owned(), "key".to_owned(), 0o400),
                ("tls.crt".to_owned(), "cert".to_owned(), 0o440)
            ]
        );
        // A missing source or key: an error (the volume keeps its content), unless optional.
        let missing = volume(None, false).payload(None).unwrap_err();
        assert_eq!(missing, "Secret demo-apiserver does not exist");
        assert!(volume(None, true).payload(None).unwrap().is_empty());
        let mut short = data.clone();
        short.remove("tls.key");
        let no_key = volume(items.clone(), false).payload(Some(&short)).unwrap_err();
        assert_eq!(no_key, "Secret demo-apiserver has no key tls.key");
        assert_eq!(volume(items, true).payload(Some(&short)).unwrap().len(), 1);
        let escaping = volume(Some(vec![("tls.crt", "../tls.crt", None)]), false)
            .payload(Some(&data))
            .unwrap_err();
        assert!(escaping.contains("escapes the volume"), "{escaping}");
    }

    fn host_path(path: &Path, kind: Option<&str>) -> HostPathVolumeSource {
        HostPathVolumeSource {
            path: path.display().to_string(),
            type_: kind.map(str::to_owned),
        }
    }

    #[test]
    fn host_path_volumes_are_checked_and_made_as_the_kubelet_does() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("kms");
        // Directory: a missing path keeps the pod waiting with the kubelet's message, and
        // nothing is made; once the directory exists the same volume is mounted.
        let directory = host_path(&missing, Some("Directory"));
        assert_eq!(
            host_path_volume("kms-vault", &directory).unwrap_err(),
            format!(
                "MountVolume.SetUp failed for volume \"kms-vault\" : hostPath type check failed: {} is not a directory",
                missing.display()
            )
        );
        assert!(!missing.exists(), "Directory makes nothing");
        fs::create_dir(&missing).unwrap();
        assert_eq!(host_path_volume("kms-vault", &directory).unwrap(), missing);
        // A file where a directory is asked for: refused, for both directory types.
        let file = dir.path().join("file");
        fs::write(&file, b"").unwrap();
        for kind in ["Directory", "DirectoryOrCreate"] {
            let refused = host_path_volume("v", &host_path(&file, Some(kind))).unwrap_err();
            assert!(refused.ends_with("is not a directory"), "{kind}: {refused}");
        }
        // DirectoryOrCreate and an unset type make a missing directory, 0755.
        for (kind, name) in [
            (Some("DirectoryOrCreate"), "made"),
            (None, "unset"),
            (Some(""), "empty"),
        ] {
            let path = dir.path().join(name).join("nested");
            assert_eq!(host_path_volume("v", &host_path(&path, kind)).unwrap(), path);
            let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
            assert_eq!(mode, 0o755, "{kind:?}");
        }
        // An unset type checks nothing: a file is bind-mounted as it is.
        assert_eq!(host_path_volume("v", &host_path(&file, None)).unwrap(), file);
        // Other types and relative paths are refused before the pod is run at all.
        assert!(check_host_path("v", &host_path(&missing, Some("Directory"))).is_ok());
        assert!(check_host_path("v", &host_path(&missing, None)).is_ok());
        let socket = check_host_path("v", &host_path(&missing, Some("Socket"))).unwrap_err();
        assert!(socket.contains("hostPath type Socket is not supported"), "{socket}");
        let relative = check_host_path("v", &host_path(Path::new("var/run"), None)).unwrap_err();
        assert!(relative.contains("not an absolute path"), "{relative}");
    }

    #[test]
    fn each_release_has_its_own_directory_in_the_cache() {
        let binaries = Binaries {
            cache: PathBuf::from("/cache"),
            capn: PathBuf::from("/target/debug/capn"),
            fixed: BTreeMap::new(),
            busybox: None,
            image_tools: Vec::new(),
            image_files: Vec::new(),
        };
        let found = |base: &str, release: &str| release_binary(&binaries, base, release);
        assert_eq!(
            found("kube-apiserver", "1.37.2"),
            Ok((
                PathBuf::from("/cache/kubernetes-v1.37.2/kube-apiserver"),
                "KUBE_VERSION=v1.37.2 hack/kube-assets.sh".to_owned()
            ))
        );
        assert_eq!(
            found("kube-controller-manager", "1.35.4").map(|f| f.0),
            Ok(PathBuf::from("/cache/kubernetes-v1.35.4/kube-controller-manager"))
        );
        assert_eq!(
            found("etcd", "3.7.0"),
            Ok((
                PathBuf::from("/cache/etcd-v3.7.0/etcd"),
                "ETCD_VERSION=v3.7.0 hack/kube-assets.sh".to_owned()
            ))
        );
        assert_eq!(
            found("etcdutl", "3.6.8").map(|f| f.0),
            Ok(PathBuf::from("/cache/etcd-v3.6.8/etcdutl"))
        );
        assert_eq!(
            found("capn", "0.1.0"),
            Ok((PathBuf::from("/target/debug/capn"), "cargo build --bin capn".to_owned()))
        );
        let refused = found("kubelet", "1.36.3").unwrap_err();
        assert!(
            refused.contains("kubelet is not a binary hack/kube-assets.sh builds"),
            "{refused}"
        );
        let container: Container = serde_json::from_value(serde_json::json!({
            "name": "etcd",
            "image": "registry.k8s.io/etcd:3.7.0-0",
            "command": ["/usr/local/bin/etcd", "--name=a"],
        }))
        .unwrap();
        assert_eq!(
            located_binary(&container, &binaries).map(|f| (f.0, f.1)),
            Ok((PathBuf::from("/cache/etcd-v3.7.0/etcd"), "3.7.0".to_owned()))
        );
        let untagged: Container = serde_json::from_value(serde_json::json!({
            "name": "etcd", "image": "registry.k8s.io/etcd", "command": ["etcd"],
        }))
        .unwrap();
        assert!(located_binary(&untagged, &binaries).is_err_and(|e| e.contains("no version tag")));
    }

    #[test]
    fn versions_of_images_and_binaries() {
        assert_eq!(image_version("registry.k8s.io/etcd:3.6.8-0").as_deref(), Some("3.6.8"));
        assert_eq!(
            image_version("registry.k8s.io/kube-apiserver:v1.36.3").as_deref(),
            Some("1.36.3")
        );
        assert_eq!(image_version("localhost:5000/kube-apiserver"), None);
        assert_eq!(image_version("registry.k8s.io/etcd:latest"), None);
        assert_eq!(
            parse_version("etcd Version: 3.6.8\nGit SHA: x").as_deref(),
            Some("3.6.8")
        );
        assert_eq!(parse_version("Kubernetes v1.36.3").as_deref(), Some("1.36.3"));
    }
}
