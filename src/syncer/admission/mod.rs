//! What the syncer refuses to create in the super cluster, checked on the tenant Pod before
//! anything is written: the Pod Security Standards at the tenant's level
//! (<https://kubernetes.io/docs/concepts/security/pod-security-standards/>), and the
//! fields the syncer cannot carry over ([`syncable`]).
//!
//! The standards are implemented as upstream's Pod Security Admission implements them at
//! Kubernetes 1.36 (`k8s.io/pod-security-admission/policy`, one `check_*.go` per rule, each
//! cited in [`baseline`] and [`restricted`]), including its overrides: at `restricted`, the
//! restricted rules for capabilities, volumes, seccomp and procMount replace the baseline
//! ones. Ephemeral containers are not checked: the syncer never copies them (docs/design.md
//! §11), so they never reach the super cluster.
//!
//! Every violation is returned, not only the first, each with the field path
//! (`spec.containers[0].securityContext.privileged`) and what is allowed there.

pub mod baseline;
pub mod restricted;
pub mod syncable;

use std::fmt;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

/// The Pod Security Standards level a tenant's pods must meet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Level {
    /// Prevents known privilege escalations; an ordinary pod passes.
    #[default]
    Baseline,
    /// Baseline and the hardening rules: non-root, no privilege escalation, all
    /// capabilities dropped, a seccomp profile, the volume types of a restricted pod.
    Restricted,
}

impl From<crate::api::PodSecurityLevel> for Level {
    fn from(level: crate::api::PodSecurityLevel) -> Self {
        match level {
            crate::api::PodSecurityLevel::Baseline => Level::Baseline,
            crate::api::PodSecurityLevel::Restricted => Level::Restricted,
        }
    }
}

impl Level {
    /// The level's value in the `pod-security.kubernetes.io/enforce` namespace label.
    pub const fn label_value(self) -> &'static str {
        match self {
            Level::Baseline => "baseline",
            Level::Restricted => "restricted",
        }
    }
}

/// The rule a tenant pod broke: the Pod Security Admission check it follows, or one of the
/// syncer's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rule {
    /// Baseline `hostNamespaces`: host network, PID or IPC namespace.
    HostNamespaces,
    /// Baseline `privileged`: a privileged container.
    Privileged,
    /// Baseline `capabilities_baseline`: a capability beyond the default set.
    Capabilities,
    /// Baseline `hostPathVolumes`: a hostPath volume.
    HostPathVolumes,
    /// Baseline `hostPorts`: a host port.
    HostPorts,
    /// Baseline `appArmorProfile`: an unconfined or unknown AppArmor profile.
    AppArmorProfile,
    /// Baseline `seLinuxOptions`: a custom SELinux type, user or role.
    SeLinuxOptions,
    /// Baseline `procMount`: an unmasked /proc outside a user namespace.
    ProcMount,
    /// Baseline `seccompProfile_baseline`: an unconfined seccomp profile.
    SeccompProfile,
    /// Baseline `sysctls`: a sysctl outside the safe set.
    Sysctls,
    /// Baseline `windowsHostProcess`: a Windows host process.
    WindowsHostProcess,
    /// Baseline `hostProbesAndHostLifecycle`: a probe or hook aimed at another host.
    HostProbesAndHostLifecycle,
    /// Restricted `restrictedVolumes`: a volume type outside the restricted list.
    RestrictedVolumes,
    /// Restricted `allowPrivilegeEscalation`: not set to false.
    AllowPrivilegeEscalation,
    /// Restricted `runAsNonRoot`: not required.
    RunAsNonRoot,
    /// Restricted `runAsUser`: user 0.
    RunAsUser,
    /// Restricted `capabilities_restricted`: ALL not dropped, or more than
    /// NET_BIND_SERVICE added.
    RestrictedCapabilities,
    /// Restricted `seccompProfile_restricted`: no RuntimeDefault or Localhost profile.
    RestrictedSeccompProfile,
    /// Restricted `procMount_restricted`: an unmasked /proc, in a user namespace too.
    RestrictedProcMount,
    /// `spec.nodeName` set by the tenant: the super scheduler places pods.
    NodeName,
    /// A field that refers to something the syncer does not copy.
    NotSyncable,
}

impl Rule {
    /// Short stable reason, used as condition reason, Event reason and metric label.
    pub fn reason(self) -> &'static str {
        match self {
            Rule::HostNamespaces => "HostNamespacesForbidden",
            Rule::Privileged => "PrivilegedForbidden",
            Rule::Capabilities => "CapabilitiesForbidden",
            Rule::HostPathVolumes => "HostPathVolumesForbidden",
            Rule::HostPorts => "HostPortsForbidden",
            Rule::AppArmorProfile => "AppArmorProfileForbidden",
            Rule::SeLinuxOptions => "SELinuxOptionsForbidden",
            Rule::ProcMount => "ProcMountForbidden",
            Rule::SeccompProfile => "SeccompProfileForbidden",
            Rule::Sysctls => "SysctlsForbidden",
            Rule::WindowsHostProcess => "WindowsHostProcessForbidden",
            Rule::HostProbesAndHostLifecycle => "ProbeHostForbidden",
            Rule::RestrictedVolumes => "VolumeTypeForbidden",
            Rule::AllowPrivilegeEscalation => "PrivilegeEscalationForbidden",
            Rule::RunAsNonRoot => "RunAsNonRootRequired",
            Rule::RunAsUser => "RunAsRootForbidden",
            Rule::RestrictedCapabilities => "CapabilitiesNotDropped",
            Rule::RestrictedSeccompProfile => "SeccompProfileRequired",
            Rule::RestrictedProcMount => "ProcMountForbidden",
            Rule::NodeName => "NodeNameForbidden",
            Rule::NotSyncable => "FieldNotSyncable",
        }
    }

    /// Where the rule comes from, for messages.
    pub fn source(self) -> &'static str {
        match self {
            Rule::RestrictedVolumes
            | Rule::AllowPrivilegeEscalation
            | Rule::RunAsNonRoot
            | Rule::RunAsUser
            | Rule::RestrictedCapabilities
            | Rule::RestrictedSeccompProfile
            | Rule::RestrictedProcMount => "Pod Security Standards, restricted",
            Rule::NodeName | Rule::NotSyncable => "capn syncer",
            _ => "Pod Security Standards, baseline",
        }
    }
}

/// One refused field of a tenant pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The rule broken.
    pub rule: Rule,
    /// The field's path in the tenant pod, `spec.containers[0].securityContext.privileged`.
    pub field: String,
    /// What is wrong and what is allowed.
    pub message: String,
}

impl Violation {
    pub(crate) fn new(rule: Rule, field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            rule,
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} ({})", self.field, self.message, self.rule.source())
    }
}

/// Every violation of `pod` at `level`, in a stable order (rule, then field); empty when
/// the pod may be synced.
pub fn check(pod: &Pod, level: Level) -> Vec<Violation> {
    let Some(spec) = pod.spec.as_ref() else {
        return vec![Violation::new(
            Rule::NotSyncable,
            "spec",
            "a pod without a spec cannot be synced",
        )];
    };
    let mut out = Vec::new();
    baseline::check(&pod.metadata, spec, level, &mut out);
    if level == Level::Restricted {
        restricted::check(spec, &mut out);
    }
    syncable::check(spec, &mut out);
    out.sort_by(|a, b| (a.rule, &a.field).cmp(&(b.rule, &b.field)));
    out
}

/// The init containers and containers of `spec` with their paths
/// (`spec.initContainers[0]`, `spec.containers[1]`), in that order.
pub(crate) fn containers(spec: &PodSpec) -> impl Iterator<Item = (String, &Container)> {
    let init = spec.init_containers.iter().flatten().enumerate();
    let init = init.map(|(i, c)| (format!("spec.initContainers[{i}]"), c));
    let main = spec.containers.iter().enumerate();
    init.chain(main.map(|(i, c)| (format!("spec.containers[{i}]"), c)))
}

/// Whether the pod runs in a user namespace (`hostUsers: false`), which relaxes some rules
/// (KEP-127; Pod Security Admission's `relaxPolicyForUserNamespacePod`).
pub(crate) fn in_user_namespace(spec: &PodSpec) -> bool {
    spec.host_users == Some(false)
}

/// Whether the pod declares itself a Windows pod (`spec.os.name: windows`), which the
/// restricted Linux rules exempt (Pod Security Admission, 1.25+).
pub(crate) fn is_windows(spec: &PodSpec) -> bool {
    spec.os.as_ref().is_some_and(|os| os.name == "windows")
}

#[cfg(test)]
mod tests;
