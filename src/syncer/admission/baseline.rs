//! The baseline level of the Pod Security Standards, rule by rule as Pod Security
//! Admission checks it (`k8s.io/pod-security-admission/policy/check_<id>.go`, the id in
//! each function's documentation), at Kubernetes 1.36.

use k8s_openapi::api::core::v1::{LifecycleHandler, PodSpec, Probe};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{Level, Rule, Violation, containers, in_user_namespace};

/// Capabilities a baseline container may add: the container runtimes' default set
/// (`check_capabilities_baseline.go`).
pub const CAPABILITIES: [&str; 13] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// The safe sysctls, namespaced per pod and isolated from other pods (`check_sysctls.go`,
/// the set of 1.32, unchanged up to 1.36; 1.37 adds `net.ipv4.tcp_slow_start_after_idle`
/// and `net.ipv4.tcp_notsent_lowat`, which kubelets before 1.37 refuse).
pub const SYSCTLS: [&str; 12] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
];

/// SELinux types a pod may ask for (`check_seLinuxOptions.go`, 1.31+).
pub const SELINUX_TYPES: [&str; 5] = [
    "",
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

/// Prefix of the deprecated per-container AppArmor annotations.
pub const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";

/// Profile types allowed for seccomp and AppArmor.
const PROFILE_TYPES: [&str; 2] = ["RuntimeDefault", "Localhost"];

/// Every baseline violation of the pod; the rules that `restricted` replaces are skipped
/// at that level (Pod Security Admission's `OverrideCheckIDs`).
pub(super) fn check(meta: &ObjectMeta, spec: &PodSpec, level: Level, out: &mut Vec<Violation>) {
    host_namespaces(spec, out);
    privileged(spec, out);
    host_ports(spec, out);
    app_armor(meta, spec, out);
    se_linux(spec, out);
    sysctls(spec, out);
    windows_host_process(spec, out);
    probe_hosts(spec, out);
    if level == Level::Baseline {
        capabilities(spec, out);
        host_path_volumes(spec, out);
        seccomp(spec, out);
        proc_mount(spec, Rule::ProcMount, in_user_namespace(spec), out);
    }
}

/// `hostNamespaces`: `spec.hostNetwork`, `hostPID`, `hostIPC` false or unset.
fn host_namespaces(spec: &PodSpec, out: &mut Vec<Violation>) {
    for (field, value) in [
        ("spec.hostNetwork", spec.host_network),
        ("spec.hostPID", spec.host_pid),
        ("spec.hostIPC", spec.host_ipc),
    ] {
        if value == Some(true) {
            out.push(Violation::new(
                Rule::HostNamespaces,
                field,
                "must be false or unset: a tenant pod shares no namespace with the node",
            ));
        }
    }
}

/// `privileged`: `securityContext.privileged` false or unset.
fn privileged(spec: &PodSpec, out: &mut Vec<Violation>) {
    for (path, c) in containers(spec) {
        if c.security_context.as_ref().and_then(|s| s.privileged) == Some(true) {
            out.push(Violation::new(
                Rule::Privileged,
                format!("{path}.securityContext.privileged"),
                "must be false or unset",
            ));
        }
    }
}

/// `capabilities_baseline`: `securityContext.capabilities.add` only from [`CAPABILITIES`].
fn capabilities(spec: &PodSpec, out: &mut Vec<Violation>) {
    for (path, c) in containers(spec) {
        let added = c
            .security_context
            .as_ref()
            .and_then(|s| s.capabilities.as_ref())
            .and_then(|c| c.add.as_ref());
        for (i, capability) in added.into_iter().flatten().enumerate() {
            if !CAPABILITIES.contains(&capability.as_str()) {
                let message = format!("adds {capability}; allowed are {}", CAPABILITIES.join(", "));
                out.push(Violation::new(
                    Rule::Capabilities,
                    format!("{path}.securityContext.capabilities.add[{i}]"),
                    message,
                ));
            }
        }
    }
}

/// `hostPathVolumes`: no `spec.volumes[*].hostPath`.
fn host_path_volumes(spec: &PodSpec, out: &mut Vec<Violation>) {
    for (i, volume) in spec.volumes.iter().flatten().enumerate() {
        if volume.host_path.is_some() {
            out.push(Violation::new(
                Rule::HostPathVolumes,
                format!("spec.volumes[{i}].hostPath"),
                "must be unset: a tenant pod mounts nothing of the node",
            ));
        }
    }
}

/// `hostPorts`: `ports[*].hostPort` 0 or unset.
fn host_ports(spec: &PodSpec, out: &mut Vec<Violation>) {
    for (path, c) in containers(spec) {
        for (i, port) in c.ports.iter().flatten().enumerate() {
            if port.host_port.is_some_and(|p| p != 0) {
                out.push(Violation::new(
                    Rule::HostPorts,
                    format!("{path}.ports[{i}].hostPort"),
                    "must be 0 or unset",
                ));
            }
        }
    }
}

/// `appArmorProfile`: profile types `RuntimeDefault` or `Localhost`; the deprecated
/// annotations `runtime/default`, `localhost/*` or empty.
fn app_armor(meta: &ObjectMeta, spec: &PodSpec, out: &mut Vec<Violation>) {
    let pod = spec
        .security_context
        .as_ref()
        .and_then(|s| s.app_armor_profile.as_ref());
    let pod = pod.map(|p| ("spec.securityContext".to_owned(), p));
    let containers = containers(spec).filter_map(|(path, c)| {
        Some((
            format!("{path}.securityContext"),
            c.security_context.as_ref()?.app_armor_profile.as_ref()?,
        ))
    });
    for (path, profile) in pod.into_iter().chain(containers) {
        if !PROFILE_TYPES.contains(&profile.type_.as_str()) {
            let field = format!("{path}.appArmorProfile.type");
            out.push(Violation::new(
                Rule::AppArmorProfile,
                field,
                "must be RuntimeDefault or Localhost",
            ));
        }
    }
    for (key, value) in meta.annotations.iter().flatten() {
        let allowed = value.is_empty() || value == "runtime/default" || value.starts_with("localhost/");
        if key.starts_with(APPARMOR_ANNOTATION_PREFIX) && !allowed {
            let field = format!("metadata.annotations['{key}']");
            out.push(Violation::new(
                Rule::AppArmorProfile,
                field,
                "must be runtime/default, localhost/<profile> or empty",
            ));
        }
    }
}

/// `seLinuxOptions`: `type` one of [`SELINUX_TYPES`], `user` and `role` empty, for the pod
/// and each container.
fn se_linux(spec: &PodSpec, out: &mut Vec<Violation>) {
    let pod = spec.security_context.as_ref().and_then(|s| s.se_linux_options.as_ref());
    let pod = pod.map(|o| ("spec.securityContext".to_owned(), o));
    let containers = containers(spec).filter_map(|(path, c)| {
        Some((
            format!("{path}.securityContext"),
            c.security_context.as_ref()?.se_linux_options.as_ref()?,
        ))
    });
    for (path, options) in pod.into_iter().chain(containers) {
        if !SELINUX_TYPES.contains(&options.type_.as_deref().unwrap_or("")) {
            let message = format!("must be one of {}, or unset", SELINUX_TYPES[1..].join(", "));
            out.push(Violation::new(
                Rule::SeLinuxOptions,
                format!("{path}.seLinuxOptions.type"),
                message,
            ));
        }
        for (field, value) in [("user", &options.user), ("role", &options.role)] {
            if value.as_deref().is_some_and(|v| !v.is_empty()) {
                out.push(Violation::new(
                    Rule::SeLinuxOptions,
                    format!("{path}.seLinuxOptions.{field}"),
                    "must be empty",
                ));
            }
        }
    }
}

/// `seccompProfile_baseline`: a seccomp profile type, where set, `RuntimeDefault` or
/// `Localhost` (never `Unconfined`).
fn seccomp(spec: &PodSpec, out: &mut Vec<Violation>) {
    let pod = spec.security_context.as_ref().and_then(|s| s.seccomp_profile.as_ref());
    let pod = pod.map(|p| ("spec.securityContext".to_owned(), p));
    let containers = containers(spec).filter_map(|(path, c)| {
        Some((
            format!("{path}.securityContext"),
            c.security_context.as_ref()?.seccomp_profile.as_ref()?,
        ))
    });
    for (path, profile) in pod.into_iter().chain(containers) {
        if !PROFILE_TYPES.contains(&profile.type_.as_str()) {
            out.push(Violation::new(
                Rule::SeccompProfile,
                format!("{path}.seccompProfile.type"),
                "must be RuntimeDefault or Localhost",
            ));
        }
    }
}

/// `procMount` (baseline) and `procMount_restricted`: `securityContext.procMount`
/// `Default` or unset; any value in a user namespace when `relaxed` (baseline, 1.35+).
pub(super) fn proc_mount(spec: &PodSpec, rule: Rule, relaxed: bool, out: &mut Vec<Violation>) {
    if relaxed {
        return;
    }
    for (path, c) in containers(spec) {
        let value = c.security_context.as_ref().and_then(|s| s.proc_mount.as_deref());
        if value.is_some_and(|v| v != "Default") {
            let message = "must be Default or unset (any value only with spec.hostUsers: false at baseline)";
            out.push(Violation::new(
                rule,
                format!("{path}.securityContext.procMount"),
                message,
            ));
        }
    }
}

/// `sysctls`: `spec.securityContext.sysctls[*].name` only from [`SYSCTLS`].
fn sysctls(spec: &PodSpec, out: &mut Vec<Violation>) {
    let sysctls = spec.security_context.as_ref().and_then(|s| s.sysctls.as_ref());
    for (i, sysctl) in sysctls.into_iter().flatten().enumerate() {
        if !SYSCTLS.contains(&sysctl.name.as_str()) {
            let message = format!(
                "{} is not a safe sysctl; allowed are {}",
                sysctl.name,
                SYSCTLS.join(", ")
            );
            out.push(Violation::new(
                Rule::Sysctls,
                format!("spec.securityContext.sysctls[{i}].name"),
                message,
            ));
        }
    }
}

/// `windowsHostProcess`: `securityContext.windowsOptions.hostProcess` false or unset.
fn windows_host_process(spec: &PodSpec, out: &mut Vec<Violation>) {
    let pod = spec.security_context.as_ref().and_then(|s| s.windows_options.as_ref());
    let pod = pod.map(|o| ("spec.securityContext".to_owned(), o));
    let containers = containers(spec).filter_map(|(path, c)| {
        Some((
            format!("{path}.securityContext"),
            c.security_context.as_ref()?.windows_options.as_ref()?,
        ))
    });
    for (path, options) in pod.into_iter().chain(containers) {
        if options.host_process == Some(true) {
            out.push(Violation::new(
                Rule::WindowsHostProcess,
                format!("{path}.windowsOptions.hostProcess"),
                "must be false or unset",
            ));
        }
    }
}

/// `hostProbesAndHostLifecycle` (1.34+): no `host` in a probe's or lifecycle handler's
/// `httpGet` or `tcpSocket` (it would reach any address from the kubelet).
fn probe_hosts(spec: &PodSpec, out: &mut Vec<Violation>) {
    for (path, c) in containers(spec) {
        let probes = [
            ("livenessProbe", &c.liveness_probe),
            ("readinessProbe", &c.readiness_probe),
            ("startupProbe", &c.startup_probe),
        ];
        let mut hosts: Vec<(String, Option<&str>)> = Vec::new();
        for (name, probe) in probes {
            hosts.extend(
                probe
                    .as_ref()
                    .map_or_else(Vec::new, |p| probe_host(&format!("{path}.{name}"), p)),
            );
        }
        let lifecycle = c.lifecycle.as_ref();
        for (name, handler) in [
            ("postStart", lifecycle.and_then(|l| l.post_start.as_ref())),
            ("preStop", lifecycle.and_then(|l| l.pre_stop.as_ref())),
        ] {
            hosts.extend(handler.map_or_else(Vec::new, |h| handler_host(&format!("{path}.lifecycle.{name}"), h)));
        }
        for (field, host) in hosts {
            if host.is_some_and(|h| !h.is_empty()) {
                out.push(Violation::new(
                    Rule::HostProbesAndHostLifecycle,
                    field,
                    "must be empty: probes and hooks reach the pod's own address",
                ));
            }
        }
    }
}

fn probe_host<'a>(path: &str, probe: &'a Probe) -> Vec<(String, Option<&'a str>)> {
    vec![
        (
            format!("{path}.httpGet.host"),
            probe.http_get.as_ref().and_then(|h| h.host.as_deref()),
        ),
        (
            format!("{path}.tcpSocket.host"),
            probe.tcp_socket.as_ref().and_then(|t| t.host.as_deref()),
        ),
    ]
}

fn handler_host<'a>(path: &str, handler: &'a LifecycleHandler) -> Vec<(String, Option<&'a str>)> {
    vec![
        (
            format!("{path}.httpGet.host"),
            handler.http_get.as_ref().and_then(|h| h.host.as_deref()),
        ),
        (
            format!("{path}.tcpSocket.host"),
            handler.tcp_socket.as_ref().and_then(|t| t.host.as_deref()),
        ),
    ]
}
