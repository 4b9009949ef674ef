use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::*;
use crate::syncer::fixtures::{nginx, restricted_nginx, with};

fn fields(violations: &[Violation]) -> Vec<(Rule, &str)> {
    violations.iter().map(|v| (v.rule, v.field.as_str())).collect()
}

/// Each case breaks one rule: the base pod passes, the changed one is refused at exactly
/// that field.
fn assert_refused(base: &Pod, level: Level, cases: &[(&str, Value, Rule, &str)]) {
    assert_eq!(check(base, level), vec![], "the base pod passes");
    for (pointer, value, rule, field) in cases {
        let violations = check(&with(base, pointer, value.clone()), level);
        assert_eq!(fields(&violations), vec![(*rule, *field)], "{pointer} = {value}");
        assert!(!violations[0].message.is_empty());
    }
}

/// Each case sets an allowed value: the pod still passes.
fn assert_allowed(base: &Pod, level: Level, cases: &[(&str, Value)]) {
    for (pointer, value) in cases {
        assert_eq!(
            check(&with(base, pointer, value.clone()), level),
            vec![],
            "{pointer} = {value}"
        );
    }
}

const CONTAINER_SC: &str = "/spec/containers/0/securityContext";

#[test]
fn an_ordinary_nginx_pod_passes_baseline() {
    assert_eq!(check(&nginx(), Level::Baseline), vec![]);
}

#[test]
fn baseline_refuses_host_namespaces_privilege_and_host_access() {
    assert_refused(
        &nginx(),
        Level::Baseline,
        &[
            (
                "/spec/hostNetwork",
                json!(true),
                Rule::HostNamespaces,
                "spec.hostNetwork",
            ),
            ("/spec/hostPID", json!(true), Rule::HostNamespaces, "spec.hostPID"),
            ("/spec/hostIPC", json!(true), Rule::HostNamespaces, "spec.hostIPC"),
            (
                &format!("{CONTAINER_SC}/privileged"),
                json!(true),
                Rule::Privileged,
                "spec.containers[0].securityContext.privileged",
            ),
            (
                "/spec/initContainers",
                json!([{"name": "init", "image": "busybox", "securityContext": {"privileged": true}}]),
                Rule::Privileged,
                "spec.initContainers[0].securityContext.privileged",
            ),
            (
                "/spec/volumes",
                json!([{"name": "root", "hostPath": {"path": "/"}}]),
                Rule::HostPathVolumes,
                "spec.volumes[0].hostPath",
            ),
            (
                "/spec/containers/0/ports/0/hostPort",
                json!(8080),
                Rule::HostPorts,
                "spec.containers[0].ports[0].hostPort",
            ),
            (
                &format!("{CONTAINER_SC}/windowsOptions/hostProcess"),
                json!(true),
                Rule::WindowsHostProcess,
                "spec.containers[0].securityContext.windowsOptions.hostProcess",
            ),
        ],
    );
    assert_allowed(
        &nginx(),
        Level::Baseline,
        &[
            ("/spec/hostNetwork", json!(false)),
            (&format!("{CONTAINER_SC}/privileged"), json!(false)),
            ("/spec/containers/0/ports/0/hostPort", json!(0)),
            (
                "/spec/volumes",
                json!([{"name": "data", "nfs": {"server": "nfs.example", "path": "/"}}]),
            ),
        ],
    );
}

#[test]
fn baseline_allows_only_the_default_capabilities() {
    assert_refused(
        &nginx(),
        Level::Baseline,
        &[
            (
                &format!("{CONTAINER_SC}/capabilities/add"),
                json!(["CHOWN", "SYS_ADMIN"]),
                Rule::Capabilities,
                "spec.containers[0].securityContext.capabilities.add[1]",
            ),
            (
                &format!("{CONTAINER_SC}/capabilities/add"),
                json!(["NET_RAW"]),
                Rule::Capabilities,
                "spec.containers[0].securityContext.capabilities.add[0]",
            ),
        ],
    );
    assert_allowed(
        &nginx(),
        Level::Baseline,
        &[(
            &format!("{CONTAINER_SC}/capabilities/add"),
            json!(["NET_BIND_SERVICE", "CHOWN"]),
        )],
    );
}

#[test]
fn baseline_refuses_unconfined_profiles_and_custom_selinux() {
    assert_refused(
        &nginx(),
        Level::Baseline,
        &[
            (
                "/spec/securityContext/appArmorProfile",
                json!({"type": "Unconfined"}),
                Rule::AppArmorProfile,
                "spec.securityContext.appArmorProfile.type",
            ),
            (
                &format!("{CONTAINER_SC}/appArmorProfile"),
                json!({"type": "Unconfined"}),
                Rule::AppArmorProfile,
                "spec.containers[0].securityContext.appArmorProfile.type",
            ),
            (
                "/metadata/annotations/container.apparmor.security.beta.kubernetes.io~1nginx",
                json!("unconfined"),
                Rule::AppArmorProfile,
                "metadata.annotations['container.apparmor.security.beta.kubernetes.io/nginx']",
            ),
            (
                "/spec/securityContext/seLinuxOptions",
                json!({"type": "spc_t"}),
                Rule::SeLinuxOptions,
                "spec.securityContext.seLinuxOptions.type",
            ),
            (
                &format!("{CONTAINER_SC}/seLinuxOptions"),
                json!({"user": "system_u"}),
                Rule::SeLinuxOptions,
                "spec.containers[0].securityContext.seLinuxOptions.user",
            ),
            (
                "/spec/securityContext/seccompProfile",
                json!({"type": "Unconfined"}),
                Rule::SeccompProfile,
                "spec.securityContext.seccompProfile.type",
            ),
            (
                &format!("{CONTAINER_SC}/procMount"),
                json!("Unmasked"),
                Rule::ProcMount,
                "spec.containers[0].securityContext.procMount",
            ),
        ],
    );
    assert_allowed(
        &nginx(),
        Level::Baseline,
        &[
            (
                "/spec/securityContext/appArmorProfile",
                json!({"type": "Localhost", "localhostProfile": "k8s-nginx"}),
            ),
            (
                "/metadata/annotations/container.apparmor.security.beta.kubernetes.io~1nginx",
                json!("localhost/k8s-nginx"),
            ),
            (
                "/spec/securityContext/seLinuxOptions",
                json!({"type": "container_t", "level": "s0:c123,c456"}),
            ),
            (
                "/spec/securityContext/seccompProfile",
                json!({"type": "RuntimeDefault"}),
            ),
            (&format!("{CONTAINER_SC}/procMount"), json!("Default")),
        ],
    );
    // In a user namespace the baseline allows an unmasked /proc (1.35+).
    let user_namespace = with(&nginx(), "/spec/hostUsers", json!(false));
    assert_allowed(
        &user_namespace,
        Level::Baseline,
        &[(&format!("{CONTAINER_SC}/procMount"), json!("Unmasked"))],
    );
}

#[test]
fn baseline_allows_only_safe_sysctls_and_no_probe_hosts() {
    assert_refused(
        &nginx(),
        Level::Baseline,
        &[
            (
                "/spec/securityContext/sysctls",
                json!([{"name": "net.ipv4.tcp_keepalive_time", "value": "60"}, {"name": "kernel.msgmax", "value": "65536"}]),
                Rule::Sysctls,
                "spec.securityContext.sysctls[1].name",
            ),
            (
                "/spec/containers/0/livenessProbe",
                json!({"httpGet": {"host": "10.0.0.1", "port": 80}}),
                Rule::HostProbesAndHostLifecycle,
                "spec.containers[0].livenessProbe.httpGet.host",
            ),
            (
                "/spec/containers/0/lifecycle",
                json!({"preStop": {"tcpSocket": {"host": "169.254.169.254", "port": 80}}}),
                Rule::HostProbesAndHostLifecycle,
                "spec.containers[0].lifecycle.preStop.tcpSocket.host",
            ),
        ],
    );
    assert_allowed(
        &nginx(),
        Level::Baseline,
        &[
            (
                "/spec/securityContext/sysctls",
                json!([{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}]),
            ),
            (
                "/spec/containers/0/livenessProbe",
                json!({"httpGet": {"path": "/", "port": 80}}),
            ),
        ],
    );
}

#[test]
fn what_cannot_be_synced_is_refused() {
    assert_refused(
        &nginx(),
        Level::Baseline,
        &[
            ("/spec/nodeName", json!("node-1"), Rule::NodeName, "spec.nodeName"),
            (
                "/spec/resourceClaims",
                json!([{"name": "gpu", "resourceClaimName": "gpu-claim"}]),
                Rule::NotSyncable,
                "spec.resourceClaims",
            ),
            (
                "/spec/volumes/0/projected/sources/1",
                json!({"podCertificate": {"signerName": "example.com/signer", "keyType": "RSA3072", "credentialBundlePath": "bundle.pem"}}),
                Rule::NotSyncable,
                "spec.volumes[0].projected.sources[1].podCertificate.keyType",
            ),
            (
                "/spec/affinity/podAffinity/requiredDuringSchedulingIgnoredDuringExecution",
                json!([{"topologyKey": "kubernetes.io/hostname", "namespaceSelector": {"matchLabels": {"team": "a"}}}]),
                Rule::NotSyncable,
                "spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].namespaceSelector",
            ),
        ],
    );
    assert_allowed(
        &nginx(),
        Level::Baseline,
        &[
            ("/spec/nodeName", json!("")),
            (
                "/spec/volumes/0/projected/sources/1",
                json!({"podCertificate": {"signerName": "example.com/signer", "keyType": "ED25519", "credentialBundlePath": "bundle.pem"}}),
            ),
            (
                "/spec/volumes/0/projected/sources/1",
                json!({"clusterTrustBundle": {"signerName": "example.com/signer", "labelSelector": {}, "path": "ca.pem"}}),
            ),
            (
                "/spec/affinity/podAntiAffinity/requiredDuringSchedulingIgnoredDuringExecution",
                json!([{"topologyKey": "kubernetes.io/hostname", "namespaceSelector": {}, "namespaces": ["db"]}]),
            ),
        ],
    );
}

#[test]
fn every_violation_is_returned() {
    let pod = with(
        &with(&nginx(), "/spec/hostNetwork", json!(true)),
        "/spec/nodeName",
        json!("node-1"),
    );
    let pod = with(&pod, &format!("{CONTAINER_SC}/privileged"), json!(true));
    let rules: Vec<Rule> = check(&pod, Level::Baseline).iter().map(|v| v.rule).collect();
    assert_eq!(rules, vec![Rule::HostNamespaces, Rule::Privileged, Rule::NodeName]);
}

#[test]
fn an_ordinary_pod_fails_restricted_on_every_hardening_rule() {
    let rules: Vec<Rule> = check(&nginx(), Level::Restricted).iter().map(|v| v.rule).collect();
    assert_eq!(
        rules,
        vec![
            Rule::AllowPrivilegeEscalation,
            Rule::RunAsNonRoot,
            Rule::RestrictedCapabilities,
            Rule::RestrictedSeccompProfile
        ]
    );
}

#[test]
fn restricted_refuses_each_hardening_rule() {
    assert_refused(
        &restricted_nginx(),
        Level::Restricted,
        &[
            (
                "/spec/volumes",
                json!([{"name": "data", "nfs": {"server": "nfs.example", "path": "/"}}]),
                Rule::RestrictedVolumes,
                "spec.volumes[0]",
            ),
            (
                &format!("{CONTAINER_SC}/allowPrivilegeEscalation"),
                json!(true),
                Rule::AllowPrivilegeEscalation,
                "spec.containers[0].securityContext.allowPrivilegeEscalation",
            ),
            (
                "/spec/securityContext/runAsNonRoot",
                json!(false),
                Rule::RunAsNonRoot,
                "spec.securityContext.runAsNonRoot",
            ),
            (
                "/spec/securityContext/runAsUser",
                json!(0),
                Rule::RunAsUser,
                "spec.securityContext.runAsUser",
            ),
            (
                &format!("{CONTAINER_SC}/capabilities"),
                json!({"add": ["NET_BIND_SERVICE"]}),
                Rule::RestrictedCapabilities,
                "spec.containers[0].securityContext.capabilities.drop",
            ),
            (
                &format!("{CONTAINER_SC}/capabilities/add"),
                json!(["CHOWN"]),
                Rule::RestrictedCapabilities,
                "spec.containers[0].securityContext.capabilities.add[0]",
            ),
            (
                "/spec/securityContext/seccompProfile",
                json!(null),
                Rule::RestrictedSeccompProfile,
                "spec.containers[0].securityContext.seccompProfile.type",
            ),
            (
                &format!("{CONTAINER_SC}/procMount"),
                json!("Unmasked"),
                Rule::RestrictedProcMount,
                "spec.containers[0].securityContext.procMount",
            ),
        ],
    );
    // The container may opt in where the pod does not.
    let per_container = with(&restricted_nginx(), "/spec/securityContext", json!({"runAsUser": 101}));
    let per_container = with(&per_container, &format!("{CONTAINER_SC}/runAsNonRoot"), json!(true));
    let per_container = with(
        &per_container,
        &format!("{CONTAINER_SC}/seccompProfile"),
        json!({"type": "Localhost", "localhostProfile": "p.json"}),
    );
    assert_eq!(check(&per_container, Level::Restricted), vec![]);
}

#[test]
fn restricted_relaxes_root_rules_in_a_user_namespace_and_linux_rules_for_windows() {
    let user_namespace = with(&restricted_nginx(), "/spec/hostUsers", json!(false));
    assert_allowed(
        &user_namespace,
        Level::Restricted,
        &[
            ("/spec/securityContext/runAsUser", json!(0)),
            ("/spec/securityContext/runAsNonRoot", json!(false)),
        ],
    );
    let windows = with(&restricted_nginx(), "/spec/os", json!({"name": "windows"}));
    let windows = with(&windows, CONTAINER_SC, json!(null));
    let windows = with(&windows, "/spec/securityContext/seccompProfile", json!(null));
    assert_eq!(check(&windows, Level::Restricted), vec![]);
}

#[test]
fn a_violation_reads_as_field_message_and_source() {
    let pod = with(&nginx(), "/spec/hostPID", json!(true));
    let text = check(&pod, Level::Baseline)[0].to_string();
    assert!(text.starts_with("spec.hostPID: must be false or unset"), "{text}");
    assert!(text.ends_with("(Pod Security Standards, baseline)"), "{text}");
    let texts: Vec<String> = check(&nginx(), Level::Restricted)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(
        texts
            .iter()
            .all(|t| t.ends_with("(Pod Security Standards, restricted)")),
        "{texts:?}"
    );
}
