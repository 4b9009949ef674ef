//! The restricted level of the Pod Security Standards on top of baseline, rule by rule as
//! Pod Security Admission checks it (`k8s.io/pod-security-admission/policy/check_<id>.go`),
//! at Kubernetes 1.36. Windows pods (`spec.os.name: windows`) are exempt from the Linux
//! rules (privilege escalation, capabilities, seccomp) as upstream exempts them since 1.25;
//! a pod in a user namespace (`hostUsers: false`) from the root rules since 1.35.

use k8s_openapi::api::core::v1::{PodSpec, Volume};

use super::{Rule, Violation, baseline, containers, in_user_namespace, is_windows};

/// Volume types a restricted pod may use (`check_restrictedVolumes.go`).
pub const VOLUME_TYPES: [&str; 9] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "image",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// The one capability a restricted container may add.
pub const NET_BIND_SERVICE: &str = "NET_BIND_SERVICE";

pub(super) fn check(spec: &PodSpec, out: &mut Vec<Violation>) {
    volume_types(spec, out);
    baseline::proc_mount(spec, Rule::RestrictedProcMount, false, out);
    if !in_user_namespace(spec) {
        run_as_non_root(spec, out);
        run_as_user(spec, out);
    }
    if !is_windows(spec) {
        allow_privilege_escalation(spec, out);
        capabilities(spec, out);
        seccomp(spec, out);
    }
}

/// `restrictedVolumes`: only the types of [`VOLUME_TYPES`] (it replaces `hostPathVolumes`).
fn volume_types(spec: &PodSpec, out: &mut Vec<Violation>) {
    for (i, volume) in spec.volumes.iter().flatten().enumerate() {
        if !allowed_volume(volume) {
            let message = format!("must be one of {}", VOLUME_TYPES.join(", "));
            out.push(Violation::new(
                Rule::RestrictedVolumes,
                format!("spec.volumes[{i}]"),
                message,
            ));
        }
    }
}

fn allowed_volume(v: &Volume) -> bool {
    v.config_map.is_some()
        || v.csi.is_some()
        || v.downward_api.is_some()
        || v.empty_dir.is_some()
        || v.ephemeral.is_some()
        || v.image.is_some()
        || v.persistent_volume_claim.is_some()
        || v.projected.is_some()
        || v.secret.is_some()
}

/// `allowPrivilegeEscalation`: every container sets it to false.
fn allow_privilege_escalation(spec: &PodSpec, out: &mut Vec<Violation>) {
    for (path, c) in containers(spec) {
        if c.security_context.as_ref().and_then(|s| s.allow_privilege_escalation) != Some(false) {
            let field = format!("{path}.securityContext.allowPrivilegeEscalation");
            out.push(Violation::new(Rule::AllowPrivilegeEscalation, field, "must be false"));
        }
    }
}

/// `runAsNonRoot`: true on the pod or on every container, false nowhere.
fn run_as_non_root(spec: &PodSpec, out: &mut Vec<Violation>) {
    let pod = spec.security_context.as_ref().and_then(|s| s.run_as_non_root);
    if pod == Some(false) {
        let message = "must be true, or unset with every container setting it";
        out.push(Violation::new(
            Rule::RunAsNonRoot,
            "spec.securityContext.runAsNonRoot",
            message,
        ));
    }
    for (path, c) in containers(spec) {
        let field = format!("{path}.securityContext.runAsNonRoot");
        match c.security_context.as_ref().and_then(|s| s.run_as_non_root) {
            Some(true) => {}
            Some(false) => out.push(Violation::new(Rule::RunAsNonRoot, field, "must be true or unset")),
            // Set on the pod, true or false: with false, the pod's field is the one to fix
            // (upstream reports it alone).
            None if pod.is_some() => {}
            None => {
                let message = "must be true, here or in spec.securityContext.runAsNonRoot";
                out.push(Violation::new(Rule::RunAsNonRoot, field, message));
            }
        }
    }
}

/// `runAsUser`: never 0, on the pod or a container.
fn run_as_user(spec: &PodSpec, out: &mut Vec<Violation>) {
    let pod = spec.security_context.as_ref().and_then(|s| s.run_as_user);
    let pod = pod.map(|uid| ("spec.securityContext".to_owned(), uid));
    let containers = containers(spec).filter_map(|(path, c)| {
        Some((
            format!("{path}.securityContext"),
            c.security_context.as_ref()?.run_as_user?,
        ))
    });
    for (path, uid) in pod.into_iter().chain(containers) {
        if uid == 0 {
            out.push(Violation::new(
                Rule::RunAsUser,
                format!("{path}.runAsUser"),
                "must not be 0 (root)",
            ));
        }
    }
}

/// `capabilities_restricted`: `drop` contains `ALL`, `add` at most [`NET_BIND_SERVICE`]
/// (it replaces `capabilities_baseline`).
fn capabilities(spec: &PodSpec, out: &mut Vec<Violation>) {
    for (path, c) in containers(spec) {
        let capabilities = c.security_context.as_ref().and_then(|s| s.capabilities.as_ref());
        let dropped = capabilities.and_then(|c| c.drop.as_ref());
        if !dropped.into_iter().flatten().any(|d| d == "ALL") {
            let field = format!("{path}.securityContext.capabilities.drop");
            out.push(Violation::new(Rule::RestrictedCapabilities, field, "must contain ALL"));
        }
        let added = capabilities.and_then(|c| c.add.as_ref());
        for (i, capability) in added.into_iter().flatten().enumerate() {
            if capability != NET_BIND_SERVICE {
                let field = format!("{path}.securityContext.capabilities.add[{i}]");
                out.push(Violation::new(
                    Rule::RestrictedCapabilities,
                    field,
                    format!("adds {capability}; only {NET_BIND_SERVICE} is allowed"),
                ));
            }
        }
    }
}

/// `seccompProfile_restricted`: `RuntimeDefault` or `Localhost` on the pod or on every
/// container, nothing else anywhere (it replaces `seccompProfile_baseline`).
fn seccomp(spec: &PodSpec, out: &mut Vec<Violation>) {
    let allowed = |t: &str| t == "RuntimeDefault" || t == "Localhost";
    let pod = spec
        .security_context
        .as_ref()
        .and_then(|s| s.seccomp_profile.as_ref())
        .map(|p| p.type_.as_str());
    if pod.is_some_and(|t| !allowed(t)) {
        out.push(Violation::new(
            Rule::RestrictedSeccompProfile,
            "spec.securityContext.seccompProfile.type",
            "must be RuntimeDefault or Localhost",
        ));
    }
    let pod_set = pod.is_some_and(allowed);
    for (path, c) in containers(spec) {
        let field = format!("{path}.securityContext.seccompProfile.type");
        match c.security_context.as_ref().and_then(|s| s.seccomp_profile.as_ref()) {
            Some(p) if allowed(&p.type_) => {}
            Some(_) => out.push(Violation::new(
                Rule::RestrictedSeccompProfile,
                field,
                "must be RuntimeDefault or Localhost",
            )),
            None if pod_set => {}
            None => out.push(Violation::new(
                Rule::RestrictedSeccompProfile,
                field,
                "must be RuntimeDefault or Localhost, here or in spec.securityContext.seccompProfile",
            )),
        }
    }
}
