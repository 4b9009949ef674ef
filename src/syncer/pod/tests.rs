use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{EnvVar, Pod, PodSpec, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::json;

use super::*;
use crate::syncer::admission::Rule;
use crate::syncer::fixtures::{nginx, with};

fn target() -> Target {
    Target {
        control_plane: ControlPlaneRef::new("default", "t1"),
        apiserver: ApiServerAddress {
            host: "10.96.0.10".into(),
            port: 6443,
        },
        level: Level::Baseline,
        dns: None,
    }
}

fn translated(pod: &Pod) -> Translation {
    translate(pod, &target(), &[]).expect("the pod translates")
}

fn spec(translation: &Translation) -> &PodSpec {
    translation.pod.spec.as_ref().expect("a spec")
}

fn env(translation: &Translation, container: usize) -> Vec<(String, Option<String>)> {
    let env = spec(translation).containers[container].env.clone().unwrap_or_default();
    env.into_iter()
        .map(|EnvVar { name, value, .. }| (name, value))
        .collect()
}

fn volume<'a>(translation: &'a Translation, name: &str) -> &'a Volume {
    spec(translation)
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == name)
        .expect("the volume")
}

#[test]
fn the_super_pod_has_the_mapped_metadata_and_none_of_the_tenant_bookkeeping() {
    let meta = translated(&nginx()).pod.metadata;
    assert_eq!(meta.name.as_deref(), Some("nginx-x-web-x-t1"));
    assert_eq!(meta.namespace.as_deref(), Some("default-t1-workloads"));
    assert!(meta.uid.is_none() && meta.resource_version.is_none() && meta.generate_name.is_none());
    assert!(meta.owner_references.is_none() && meta.finalizers.is_none() && meta.managed_fields.is_none());
    assert!(meta.creation_timestamp.is_none());
    let labels = meta.labels.unwrap();
    assert_eq!(labels["app"], "nginx");
    assert_eq!(labels[tenancy::NAMESPACE], "web");
}

#[test]
fn the_super_pod_mounts_no_super_token_and_runs_as_the_default_service_account() {
    let translation = translated(&nginx());
    let spec = spec(&translation);
    assert_eq!(spec.automount_service_account_token, Some(false));
    assert_eq!(spec.service_account_name.as_deref(), Some("default"));
    assert_eq!(spec.service_account, None);
}

#[test]
fn the_kube_api_access_token_becomes_a_secret_source_in_the_same_volume() {
    let translation = translated(&nginx());
    let expected_secret =
        target()
            .control_plane
            .token_secret_name("web", "nginx", "6f1c1b7e-5d4a-4f39-9d8e-0c2b1a9f7e61");
    let token = translation.token_secret.clone().expect("a token Secret");
    assert_eq!(token.name, expected_secret);
    assert_eq!(token.service_account_name, "default");
    assert_eq!(
        token.tokens,
        vec![TokenRequest {
            key: "kube-api-access-x7k2p.0".into(),
            audience: None,
            expiration_seconds: 3607,
        }]
    );
    let projected = volume(&translation, "kube-api-access-x7k2p").projected.clone().unwrap();
    assert_eq!(projected.default_mode, Some(420));
    let sources = projected.sources.unwrap();
    assert_eq!(sources.len(), 3, "the CA and the namespace stay beside the token");
    let secret = sources[0].secret.clone().expect("a secret source");
    assert!(sources[0].service_account_token.is_none());
    assert_eq!(secret.name, expected_secret);
    let item = &secret.items.unwrap()[0];
    assert_eq!(
        (item.key.as_str(), item.path.as_str()),
        ("kube-api-access-x7k2p.0", "token")
    );
    assert_eq!(
        sources[1].config_map.as_ref().unwrap().name,
        "kube-root-ca.crt-x-web-x-t1"
    );
    let namespace = &sources[2].downward_api.as_ref().unwrap().items.as_ref().unwrap()[0];
    assert_eq!(
        namespace.field_ref.as_ref().unwrap().field_path,
        "metadata.annotations['tenancy.x-k8s.io/namespace']"
    );
}

#[test]
fn a_projected_token_is_requested_with_its_audience_and_the_default_lifetime() {
    let pod = with(
        &nginx(),
        "/spec/volumes/1",
        json!({"name": "vault", "projected": {"sources": [{"serviceAccountToken": {"audience": "vault", "path": "vault-token"}}]}}),
    );
    let pod = with(&pod, "/spec/serviceAccountName", json!("builder"));
    let token = translated(&pod).token_secret.unwrap();
    assert_eq!(token.service_account_name, "builder");
    assert_eq!(
        token.tokens[1],
        TokenRequest {
            key: "vault.0".into(),
            audience: Some("vault".into()),
            expiration_seconds: 3600,
        }
    );
}

#[test]
fn a_pod_without_projected_tokens_needs_no_token_secret() {
    let pod = with(&nginx(), "/spec/volumes", json!([]));
    assert_eq!(translated(&pod).token_secret, None);
}

#[test]
fn references_are_rewritten_to_the_synced_copies_and_listed() {
    let pod = with(
        &nginx(),
        "/spec/volumes",
        json!([
            {"name": "config", "configMap": {"name": "site"}},
            {"name": "tls", "secret": {"secretName": "site-tls"}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "www"}},
            {"name": "vault", "csi": {"driver": "secrets-store.csi.k8s.io", "nodePublishSecretRef": {"name": "vault-creds"}}}
        ]),
    );
    let pod = with(
        &pod,
        "/spec/containers/0/env",
        json!([
            {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "site", "key": "mode"}}},
            {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}
        ]),
    );
    let pod = with(
        &pod,
        "/spec/containers/0/envFrom",
        json!([{"configMapRef": {"name": "defaults"}}, {"secretRef": {"name": "api"}}]),
    );
    let pod = with(&pod, "/spec/imagePullSecrets", json!([{"name": "registry"}]));
    let translation = translated(&pod);
    let spec = spec(&translation);
    assert_eq!(
        volume(&translation, "config").config_map.as_ref().unwrap().name,
        "site-x-web-x-t1"
    );
    assert_eq!(
        volume(&translation, "tls")
            .secret
            .as_ref()
            .unwrap()
            .secret_name
            .as_deref(),
        Some("site-tls-x-web-x-t1")
    );
    assert_eq!(
        volume(&translation, "data")
            .persistent_volume_claim
            .as_ref()
            .unwrap()
            .claim_name,
        "www-x-web-x-t1"
    );
    let csi = volume(&translation, "vault").csi.as_ref().unwrap();
    assert_eq!(
        csi.node_publish_secret_ref.as_ref().unwrap().name,
        "vault-creds-x-web-x-t1"
    );
    let env = spec.containers[0].env.as_ref().unwrap();
    let from = |i: usize| {
        env.iter()
            .find(|e| e.name == ["MODE", "PASSWORD"][i])
            .unwrap()
            .value_from
            .clone()
            .unwrap()
    };
    assert_eq!(from(0).config_map_key_ref.unwrap().name, "site-x-web-x-t1");
    assert_eq!(from(1).secret_key_ref.unwrap().name, "db-x-web-x-t1");
    let env_from = spec.containers[0].env_from.as_ref().unwrap();
    assert_eq!(env_from[0].config_map_ref.as_ref().unwrap().name, "defaults-x-web-x-t1");
    assert_eq!(env_from[1].secret_ref.as_ref().unwrap().name, "api-x-web-x-t1");
    assert_eq!(spec.image_pull_secrets.as_ref().unwrap()[0].name, "registry-x-web-x-t1");
    let listed: BTreeSet<(ReferenceKind, &str)> = translation
        .references
        .iter()
        .map(|r| (r.kind, r.name.as_str()))
        .collect();
    let expected = BTreeSet::from([
        (ReferenceKind::ConfigMap, "site"),
        (ReferenceKind::ConfigMap, "defaults"),
        (ReferenceKind::Secret, "site-tls"),
        (ReferenceKind::Secret, "vault-creds"),
        (ReferenceKind::Secret, "db"),
        (ReferenceKind::Secret, "api"),
        (ReferenceKind::Secret, "registry"),
        (ReferenceKind::PersistentVolumeClaim, "www"),
    ]);
    assert_eq!(listed, expected);
}

/// The variables the kubelet gives every pod for the `kubernetes` Service
/// (`pkg/kubelet/envvars`), here naming the tenant apiserver at 10.96.0.10:6443.
fn apiserver_env() -> Vec<(String, Option<String>)> {
    [
        ("KUBERNETES_SERVICE_HOST", "10.96.0.10"),
        ("KUBERNETES_SERVICE_PORT", "6443"),
        ("KUBERNETES_SERVICE_PORT_HTTPS", "6443"),
        ("KUBERNETES_PORT", "tcp://10.96.0.10:6443"),
        ("KUBERNETES_PORT_6443_TCP", "tcp://10.96.0.10:6443"),
        ("KUBERNETES_PORT_6443_TCP_PROTO", "tcp"),
        ("KUBERNETES_PORT_6443_TCP_PORT", "6443"),
        ("KUBERNETES_PORT_6443_TCP_ADDR", "10.96.0.10"),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_owned(), Some(value.to_owned())))
    .collect()
}

#[test]
fn the_apiserver_variables_come_first_in_every_container_unless_it_sets_them() {
    let pod = with(
        &nginx(),
        "/spec/initContainers",
        json!([{"name": "init", "image": "busybox", "env": [{"name": "KUBERNETES_SERVICE_HOST", "value": "api.example"}]}]),
    );
    let translation = translated(&pod);
    let mut expected = apiserver_env();
    expected.push(("GREETING".to_owned(), Some("hello".to_owned())));
    assert_eq!(env(&translation, 0), expected);
    let init = spec(&translation).init_containers.as_ref().unwrap()[0]
        .env
        .clone()
        .unwrap();
    let names: Vec<&str> = init.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(
        names.last(),
        Some(&SERVICE_HOST),
        "the container's own value stays, last"
    );
    assert_eq!(init.last().unwrap().value.as_deref(), Some("api.example"));
    assert_eq!(names.iter().filter(|n| **n == SERVICE_HOST).count(), 1);
    assert_eq!(
        spec(&translation).enable_service_links,
        Some(false),
        "the super kubelet adds none"
    );
}

#[test]
fn the_namespace_services_are_named_with_their_super_addresses_unless_links_are_off() {
    let web = env::ServiceLink {
        name: "web-api".into(),
        host: "10.0.0.77".into(),
        ports: vec![serde_json::from_value(json!({"name": "http", "port": 8080, "protocol": "TCP"})).unwrap()],
    };
    // A namespace's own `kubernetes` Service does not replace the apiserver's variables,
    // as in the kubelet.
    let shadow = env::ServiceLink {
        name: "kubernetes".into(),
        host: "10.0.0.99".into(),
        ports: vec![serde_json::from_value(json!({"port": 80})).unwrap()],
    };
    let translation = translate(&nginx(), &target(), &[web.clone(), shadow.clone()]).unwrap();
    let mut expected = apiserver_env();
    expected.extend(
        [
            ("WEB_API_SERVICE_HOST", "10.0.0.77"),
            ("WEB_API_SERVICE_PORT", "8080"),
            ("WEB_API_SERVICE_PORT_HTTP", "8080"),
            ("WEB_API_PORT", "tcp://10.0.0.77:8080"),
            ("WEB_API_PORT_8080_TCP", "tcp://10.0.0.77:8080"),
            ("WEB_API_PORT_8080_TCP_PROTO", "tcp"),
            ("WEB_API_PORT_8080_TCP_PORT", "8080"),
            ("WEB_API_PORT_8080_TCP_ADDR", "10.0.0.77"),
            ("GREETING", "hello"),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), Some(value.to_owned()))),
    );
    assert_eq!(env(&translation, 0), expected);

    let off = with(&nginx(), "/spec/enableServiceLinks", json!(false));
    let translation = translate(&off, &target(), &[web, shadow]).unwrap();
    let mut expected = apiserver_env();
    expected.push(("GREETING".to_owned(), Some("hello".to_owned())));
    assert_eq!(env(&translation, 0), expected);
}

#[test]
fn the_downward_api_shows_the_tenant_pod() {
    let field = |path: &str| json!({"fieldRef": {"fieldPath": path}});
    let pod = with(
        &nginx(),
        "/spec/containers/0/env",
        json!([
            {"name": "NAME", "valueFrom": field("metadata.name")},
            {"name": "NAMESPACE", "valueFrom": field("metadata.namespace")},
            {"name": "UID", "valueFrom": field("metadata.uid")},
            {"name": "SA", "valueFrom": field("spec.serviceAccountName")},
            {"name": "APP", "valueFrom": field("metadata.labels['app']")},
            {"name": "IP", "valueFrom": field("status.podIP")}
        ]),
    );
    let pod = with(
        &pod,
        "/spec/volumes/1",
        json!({"name": "info", "downwardAPI": {"items": [
            {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
            {"path": "uid", "fieldRef": {"fieldPath": "metadata.uid"}},
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}
        ]}}),
    );
    let translation = translated(&pod);
    let env = spec(&translation).containers[0].env.clone().unwrap();
    let literal = |name: &str| {
        env.iter()
            .find(|e| e.name == name)
            .map(|e| (e.value.clone(), e.value_from.is_some()))
            .unwrap()
    };
    assert_eq!(literal("NAME"), (Some("nginx".into()), false));
    assert_eq!(literal("NAMESPACE"), (Some("web".into()), false));
    assert_eq!(
        literal("UID"),
        (Some("6f1c1b7e-5d4a-4f39-9d8e-0c2b1a9f7e61".into()), false)
    );
    assert_eq!(literal("SA"), (Some("default".into()), false));
    assert_eq!(literal("APP"), (None, true), "labels are the tenant's");
    assert_eq!(literal("IP"), (None, true), "the pod's IP is the tenant pod's");
    let items = volume(&translation, "info")
        .downward_api
        .clone()
        .unwrap()
        .items
        .unwrap();
    let paths: Vec<String> = items.into_iter().map(|i| i.field_ref.unwrap().field_path).collect();
    assert_eq!(
        paths,
        vec![
            "metadata.annotations['tenancy.x-k8s.io/name']",
            "metadata.annotations['tenancy.x-k8s.io/uid']",
            "metadata.labels"
        ]
    );
    // The annotations those items read hold the tenant's values.
    let annotations = translation.pod.metadata.annotations.unwrap();
    assert_eq!(annotations[tenancy::NAME], "nginx");
}

#[test]
fn the_hostname_is_the_tenant_pods_name_unless_the_tenant_set_one() {
    let hostname = |pod: &Pod| spec(&translated(pod)).hostname.clone();
    assert_eq!(hostname(&nginx()), Some("nginx".into()));
    let set = with(
        &with(&nginx(), "/spec/hostname", json!("web-0")),
        "/spec/subdomain",
        json!("web"),
    );
    assert_eq!(hostname(&set), Some("web-0".into()));
    assert_eq!(spec(&translated(&set)).subdomain.as_deref(), Some("web"));
    let long = with(
        &nginx(),
        "/metadata/name",
        json!(format!("{}-{}", "a".repeat(62), "b".repeat(7))),
    );
    assert_eq!(
        hostname(&long),
        Some("a".repeat(62)),
        "cut to 63, the trailing '-' trimmed"
    );
    let dotted = with(&nginx(), "/metadata/name", json!("nginx.v1"));
    assert_eq!(hostname(&dotted), None);
}

#[test]
fn what_the_super_cluster_decides_is_cleared_and_dns_is_kept() {
    let pod = with(&nginx(), "/spec/priorityClassName", json!("system-node-critical"));
    let pod = with(&pod, "/spec/priority", json!(2_000_001_000));
    let pod = with(&pod, "/spec/overhead", json!({"cpu": "250m"}));
    let pod = with(
        &pod,
        "/spec/readinessGates",
        json!([{"conditionType": "example.com/ready"}]),
    );
    let translation = translated(&pod);
    let spec = spec(&translation);
    assert_eq!(
        (&spec.priority, &spec.priority_class_name, &spec.preemption_policy),
        (&None, &None, &None)
    );
    assert_eq!(
        (&spec.scheduler_name, &spec.overhead, &spec.readiness_gates),
        (&None, &None, &None)
    );
    assert_eq!(spec.node_name, None);
    assert_eq!(spec.dns_policy.as_deref(), Some("ClusterFirst"));
}

#[test]
fn only_the_allow_listed_tolerations_are_kept() {
    let pod = with(&nginx(), "/spec/tolerations/2", json!({"operator": "Exists"}));
    let pod = with(
        &pod,
        "/spec/tolerations/3",
        json!({"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}),
    );
    let translation = translated(&pod);
    let kept: Vec<Option<String>> = spec(&translation)
        .tolerations
        .clone()
        .unwrap()
        .into_iter()
        .map(|t| t.key)
        .collect();
    assert_eq!(
        kept,
        vec![
            Some("node.kubernetes.io/not-ready".into()),
            Some("node.kubernetes.io/unreachable".into())
        ]
    );
    let dropped: Vec<Option<String>> = translation.dropped_tolerations.into_iter().map(|t| t.key).collect();
    assert_eq!(dropped, vec![None, Some("dedicated".into())]);
}

#[test]
fn pod_affinity_and_spreading_are_confined_to_the_tenant_namespaces_they_meant() {
    let term = |extra: serde_json::Value| {
        let mut t = json!({"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "db"}}});
        t.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        t
    };
    let pod = with(
        &nginx(),
        "/spec/affinity",
        json!({
            "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term(json!({})), term(json!({"namespaces": ["db"]}))]},
            "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "podAffinityTerm": term(json!({"namespaceSelector": {}}))}]}
        }),
    );
    let pod = with(
        &pod,
        "/spec/topologySpreadConstraints",
        json!([{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": {"app": "nginx"}}}]),
    );
    let translation = translated(&pod);
    let spec = spec(&translation);
    let affinity = spec.affinity.clone().unwrap();
    let required = affinity
        .pod_affinity
        .unwrap()
        .required_during_scheduling_ignored_during_execution
        .unwrap();
    let namespaces_of = |selector: &Option<LabelSelector>| -> Option<Vec<String>> {
        let expressions = selector.as_ref()?.match_expressions.as_ref()?;
        let requirement = expressions.iter().find(|e| e.key == tenancy::NAMESPACE)?;
        assert_eq!(requirement.operator, "In");
        requirement.values.clone()
    };
    assert_eq!(namespaces_of(&required[0].label_selector), Some(vec!["web".to_owned()]));
    assert_eq!(namespaces_of(&required[1].label_selector), Some(vec!["db".to_owned()]));
    assert_eq!(required[1].namespaces, None, "no super namespace is named");
    let preferred = affinity
        .pod_anti_affinity
        .unwrap()
        .preferred_during_scheduling_ignored_during_execution
        .unwrap();
    assert_eq!(
        namespaces_of(&preferred[0].pod_affinity_term.label_selector),
        None,
        "{{}}: all of the tenant's"
    );
    assert_eq!(preferred[0].pod_affinity_term.namespace_selector, None);
    let spread = &spec.topology_spread_constraints.as_ref().unwrap()[0];
    assert_eq!(namespaces_of(&spread.label_selector), Some(vec!["web".to_owned()]));
}

#[test]
fn a_refused_pod_is_not_translated() {
    let pod = with(
        &with(&nginx(), "/spec/nodeName", json!("node-1")),
        "/spec/hostNetwork",
        json!(true),
    );
    let err = translate(&pod, &target(), &[]).unwrap_err();
    let TranslateError::Refused(violations) = &err else {
        panic!("{err}")
    };
    let rules: Vec<Rule> = violations.iter().map(|v| v.rule).collect();
    assert_eq!(rules, vec![Rule::HostNamespaces, Rule::NodeName]);
    assert_eq!(err.reason(), "HostNamespacesForbidden");
    assert!(err.to_string().contains("spec.nodeName: must be empty"), "{err}");
}

#[test]
fn a_pod_without_uid_is_not_translated() {
    let pod = with(&nginx(), "/metadata/uid", json!(null));
    let err = translate(&pod, &target(), &[]).unwrap_err();
    assert_eq!(
        err,
        TranslateError::MissingField(MissingField { field: "metadata.uid" })
    );
    assert_eq!(err.reason(), "TenantObjectIncomplete");
}

#[test]
fn a_live_pod_keeps_its_environment() {
    let web = env::ServiceLink {
        name: "web".into(),
        host: "10.0.0.77".into(),
        ports: vec![serde_json::from_value(json!({"port": 80})).unwrap()],
    };
    let live = translate(&nginx(), &target(), &[]).unwrap().pod;
    // A Service made after the pod: the new translation names it, the live pod does not.
    let mut desired = translate(&nginx(), &target(), &[web]).unwrap().pod;
    assert_ne!(
        desired.spec.as_ref().unwrap().containers[0].env,
        live.spec.as_ref().unwrap().containers[0].env
    );
    keep_live_immutables(&mut desired, &live);
    assert_eq!(
        desired.spec.as_ref().unwrap().containers[0].env,
        live.spec.as_ref().unwrap().containers[0].env
    );
    // A super pod an earlier capn made, with the super kubelet's service links on (the
    // field is immutable too).
    let mut earlier = live.clone();
    earlier.spec.as_mut().unwrap().enable_service_links = Some(true);
    keep_live_immutables(&mut desired, &earlier);
    assert_eq!(desired.spec.as_ref().unwrap().enable_service_links, Some(true));
    // Made before capn served the tenant's DNS: the pod keeps the DNS it started with.
    let with_dns = Target {
        dns: Some(ClusterDns {
            nameserver: "10.0.0.10".into(),
            domain: "cluster.local".into(),
        }),
        ..target()
    };
    let mut desired = translate(&nginx(), &with_dns, &[]).unwrap().pod;
    assert_eq!(desired.spec.as_ref().unwrap().dns_policy.as_deref(), Some("None"));
    keep_live_immutables(&mut desired, &live);
    let (kept, live) = (desired.spec.unwrap(), live.spec.unwrap());
    assert_eq!((kept.dns_policy, kept.dns_config), (live.dns_policy, live.dns_config));
}
