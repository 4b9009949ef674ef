//! The audit settings of a NestedAPIServer turned into what its apiserver reads (issue 39
//! item 2): the `audit.k8s.io/v1` `Policy` file (inline, referenced or capn's default),
//! the log limits and the webhook sink, as the `audit` render-context variable.
//!
//! Pure: the controller (and `capn render`) read a referenced ConfigMap and hand its text
//! here; the field rules ([`crate::validate`]) check an inline policy, and
//! [`referenced_policy`] checks a referenced one against the same rules.
//!
//! kube-apiserver reads the policy file and the webhook configuration only when it starts
//! (k8s.io/apiserver pkg/server/options/audit.go reads both in `ApplyTo`): the policy's
//! digest is on the pod template ([`AuditVars::policy_digest`]), and the webhook Secret is
//! a mounted Secret outside the channel's `reloadedSecrets`, whose content feeds the
//! certificates digest; a change to either rolls the apiserver.

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::reference::{Expected, Reference};
use crate::api::{ApiServerAudit, AuditGroupResources, AuditLog, AuditPolicy, AuditPolicyRule};
use crate::validate::{FieldError, Kind, check_object};

/// The key of a referenced policy ConfigMap when `policyRef.key` is unset, and the key
/// of capn's own `<cluster>-audit-policy` ConfigMap.
pub const POLICY_KEY: &str = "policy.yaml";
/// The key of the webhook's kubeconfig Secret when `configSecretRef.key` is unset.
pub const WEBHOOK_CONFIG_KEY: &str = "kubeconfig";
/// The `apiVersion` of an audit policy document.
pub const POLICY_API_VERSION: &str = "audit.k8s.io/v1";

/// What the channel templates render auditing from (`audit` in the render context; none
/// when the NestedAPIServer has no `spec.audit`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AuditVars {
    /// The ConfigMap capn renders the policy into: `<cluster>-audit-policy`.
    pub policy_config_map: String,
    /// The key of the policy in it ([`POLICY_KEY`]).
    pub policy_key: &'static str,
    /// The policy document (JSON, which kube-apiserver's YAML reader reads).
    pub policy: String,
    /// SHA-256 of [`Self::policy`], hex, the first 32 characters: on the pod template, so
    /// that a changed policy rolls the apiserver, which reads it only at start.
    pub policy_digest: String,
    /// `--audit-log-maxsize` (MiB), `--audit-log-maxbackup`, `--audit-log-maxage` (days).
    pub log: AuditLogVars,
    /// The webhook sink, if any.
    pub webhook: Option<AuditWebhookVars>,
}

/// The audit log's rotation limits.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AuditLogVars {
    pub max_size: i32,
    pub max_backup: i32,
    pub max_age: i32,
}

/// The audit webhook sink.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AuditWebhookVars {
    /// The Secret holding the kubeconfig file.
    pub secret: String,
    /// Its key.
    pub key: String,
    /// `--audit-webhook-mode`.
    pub mode: String,
}

pub use super::reference::ReferenceError;

/// The field that references a policy.
pub const REFERENCE_FIELD: &str = "spec.audit.policyRef";

/// capn's default policy, used when `spec.audit` names none. What it records
/// (docs/guide/security.md "The default policy"):
/// - nothing for the apiserver's own health and version endpoints and for watches of the
///   `system:kube-proxy` user and of the controller-manager's leases (noise);
/// - `Secrets`, `ConfigMaps`, `TokenReviews`, `TokenRequests` (`serviceaccounts/token`) and
///   `SubjectAccessReviews`-like reviews at `Metadata` only: who, what, when, never the
///   body, which holds credentials;
/// - every other request at `Metadata` too: bodies are recorded for nothing;
/// - the `RequestReceived` stage is left out (every request is then one event per stage
///   it reaches, not two).
pub fn default_policy() -> AuditPolicy {
    let group = |group: &str, resources: &[&str]| AuditGroupResources {
        group: Some(group.to_owned()),
        resources: resources.iter().map(|r| (*r).to_owned()).collect(),
        resource_names: Vec::new(),
    };
    let strings = |items: &[&str]| items.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    AuditPolicy {
        omit_stages: strings(&["RequestReceived"]),
        omit_managed_fields: Some(true),
        rules: vec![
            AuditPolicyRule {
                level: "None".into(),
                non_resource_urls: strings(&["/healthz*", "/livez*", "/readyz*", "/version"]),
                ..AuditPolicyRule::default()
            },
            AuditPolicyRule {
                level: "None".into(),
                users: strings(&["system:kube-controller-manager", "system:kube-scheduler"]),
                verbs: strings(&["get", "update"]),
                namespaces: strings(&["kube-system"]),
                resources: vec![group("coordination.k8s.io", &["leases"])],
                ..AuditPolicyRule::default()
            },
            AuditPolicyRule {
                level: "Metadata".into(),
                resources: vec![
                    group("", &["secrets", "configmaps", "serviceaccounts/token"]),
                    group("authentication.k8s.io", &["tokenreviews"]),
                    group(
                        "authorization.k8s.io",
                        &[
                            "subjectaccessreviews",
                            "selfsubjectaccessreviews",
                            "localsubjectaccessreviews",
                        ],
                    ),
                ],
                ..AuditPolicyRule::default()
            },
            AuditPolicyRule {
                level: "Metadata".into(),
                ..AuditPolicyRule::default()
            },
        ],
    }
}

/// The policy document kube-apiserver reads: `policy` with its `apiVersion` and `kind`.
pub fn policy_document(policy: &AuditPolicy) -> String {
    let mut document = serde_json::to_value(policy).unwrap_or_default();
    if let Some(map) = document.as_object_mut() {
        map.insert("apiVersion".into(), POLICY_API_VERSION.into());
        map.insert("kind".into(), "Policy".into());
    }
    serde_json::to_string_pretty(&document).unwrap_or_default()
}

/// Reads and checks a referenced policy: the text under `key` of ConfigMap `config_map`
/// (`None`: the ConfigMap or the key is missing). `resource_name` is the NestedAPIServer's.
///
/// # Errors
/// [`ReferenceError`]: `AuditPolicyMissing` when there is no text; `InvalidAuditPolicy` when
/// it is not YAML or JSON, not an `audit.k8s.io/v1` `Policy`, a field has the wrong type, or
/// it breaks a rule of `spec.audit.policy` (named by its place in the document, e.g.
/// `rules[1].level`).
pub fn referenced_policy(
    resource_name: &str,
    config_map: &str,
    key: &str,
    text: Option<&str>,
) -> Result<AuditPolicy, ReferenceError> {
    let reference = Reference {
        resource: resource_name,
        field: REFERENCE_FIELD,
        config_map,
        key,
    };
    let (policy, document) = reference.read(
        text,
        &Expected {
            api_version: POLICY_API_VERSION,
            kind: "Policy",
            missing_reason: "AuditPolicyMissing",
            invalid_reason: "InvalidAuditPolicy",
            missing_hint: "create it with an audit.k8s.io/v1 Policy under that key, or drop policyRef for capn's default policy",
            strict: false,
        },
    )?;
    let object = serde_json::json!({
        "metadata": {"name": resource_name},
        "spec": {"audit": {"policy": document}},
    });
    if let Some(e) = check_object(Kind::NestedAPIServer, &object)
        .into_iter()
        .find(|e| e.path.starts_with("spec.audit.policy"))
    {
        return Err(reference.field_error(&e, "spec.audit.policy"));
    }
    Ok(policy)
}

/// Checks the field rules of `spec.audit` ([`crate::validate`]: the inline policy's levels,
/// stages and rules, the names and keys referenced, the webhook mode) of NestedAPIServer
/// `resource_name`.
///
/// # Errors
/// The first [`FieldError`], under its path (`spec.audit.policy.rules[0].level`).
pub fn check_fields(resource_name: &str, audit: &ApiServerAudit) -> Result<(), FieldError> {
    let object = serde_json::json!({
        "metadata": {"name": resource_name},
        "spec": {"audit": audit},
    });
    match check_object(Kind::NestedAPIServer, &object).into_iter().next() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The render-context `audit` of a NestedAPIServer: `None` without `spec.audit`. `policy`
/// is the referenced policy when `policyRef` is set (already read and checked by
/// [`referenced_policy`]); otherwise the inline one or [`default_policy`].
pub fn audit_vars(
    cluster_name: &str,
    audit: Option<&ApiServerAudit>,
    referenced: Option<&AuditPolicy>,
) -> Option<AuditVars> {
    let audit = audit?;
    let default;
    let policy = match (referenced, &audit.policy) {
        (Some(policy), _) | (None, Some(policy)) => policy,
        (None, None) => {
            default = default_policy();
            &default
        }
    };
    let document = policy_document(policy);
    let log = audit.log.clone().unwrap_or_default();
    Some(AuditVars {
        policy_config_map: format!("{cluster_name}-audit-policy"),
        policy_key: POLICY_KEY,
        policy_digest: Sha256::digest(document.as_bytes())
            .iter()
            .take(16)
            .map(|b| format!("{b:02x}"))
            .collect(),
        policy: document,
        log: AuditLogVars {
            max_size: log.max_size.unwrap_or(AuditLog::DEFAULT_MAX_SIZE),
            max_backup: log.max_backup.unwrap_or(AuditLog::DEFAULT_MAX_BACKUP),
            max_age: log.max_age.unwrap_or(AuditLog::DEFAULT_MAX_AGE),
        },
        webhook: audit.webhook.as_ref().map(|w| AuditWebhookVars {
            secret: w.config_secret_ref.name.clone(),
            key: w
                .config_secret_ref
                .key
                .clone()
                .unwrap_or_else(|| WEBHOOK_CONFIG_KEY.to_owned()),
            mode: w.mode.clone().unwrap_or_else(|| "batch".to_owned()),
        }),
    })
}

/// The ConfigMap and key `policyRef` names, if set.
pub fn policy_reference(audit: Option<&ApiServerAudit>) -> Option<(&str, &str)> {
    Some(audit?.policy_ref.as_ref()?.name_and_key(POLICY_KEY))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{AuditWebhook, ConfigMapKeyReference, SecretKeyReference};

    #[test]
    fn the_default_policy_passes_the_rules_and_records_no_bodies() {
        let policy = default_policy();
        let object = serde_json::json!({
            "metadata": {"name": "a"},
            "spec": {"audit": {"policy": policy}},
        });
        assert_eq!(check_object(Kind::NestedAPIServer, &object), []);
        for rule in &policy.rules {
            assert!(
                ["None", "Metadata"].contains(&rule.level.as_str()),
                "no request or response body is recorded: {rule:?}"
            );
        }
        let secrets = policy
            .rules
            .iter()
            .find(|r| r.resources.iter().any(|g| g.resources.contains(&"secrets".to_owned())))
            .unwrap();
        assert_eq!(secrets.level, "Metadata");
    }

    #[test]
    fn the_document_is_an_audit_policy_that_reads_back() {
        let text = policy_document(&default_policy());
        let back = referenced_policy("a", "cm", "policy.yaml", Some(&text)).unwrap();
        assert_eq!(back, default_policy());
        assert!(text.contains("\"apiVersion\": \"audit.k8s.io/v1\""));
        assert!(text.contains("\"nonResourceURLs\""));
    }

    #[test]
    fn a_referenced_policy_is_checked_with_the_inline_rules() {
        let missing = referenced_policy("a", "cm", "policy.yaml", None).unwrap_err();
        assert_eq!(missing.reason, "AuditPolicyMissing");
        assert_eq!(
            missing.to_string(),
            "NestedAPIServer a: spec.audit.policyRef: ConfigMap cm key policy.yaml: not found: create it with an audit.k8s.io/v1 Policy under that key, or drop policyRef for capn's default policy"
        );
        let cases = [
            ("rules: [", "not a YAML or JSON document"),
            (
                "apiVersion: v1\nkind: ConfigMap\n",
                "must be apiVersion audit.k8s.io/v1 kind Policy",
            ),
            (
                "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: []\n",
                "(the document): Invalid value",
            ),
            (
                "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n- level: Everything\n",
                "rules[1].level: Invalid value: \"Everything\": must be one of None, Metadata, Request, RequestResponse",
            ),
            (
                "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [Sometimes]\nrules:\n- level: None\n",
                "omitStages[0]: Invalid value",
            ),
            (
                "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: None\n  nonResourceURLs: [/x]\n  namespaces: [a]\n",
                "rules[0]: Invalid value",
            ),
            (
                "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: 3\n  users: x\n",
                "rules[0]",
            ),
        ];
        for (text, expected) in cases {
            let e = referenced_policy("a", "cm", "k", Some(text)).unwrap_err();
            assert_eq!(e.reason, "InvalidAuditPolicy", "{text}");
            let message = e.to_string();
            assert!(message.contains(expected), "{text}: {message}");
            assert!(
                message.starts_with("NestedAPIServer a: spec.audit.policyRef: ConfigMap cm key k: "),
                "{message}"
            );
        }
    }

    #[test]
    fn vars_follow_the_spec_with_defaults() {
        assert_eq!(audit_vars("c", None, None), None);
        let plain = audit_vars("c", Some(&ApiServerAudit::default()), None).unwrap();
        assert_eq!(plain.policy_config_map, "c-audit-policy");
        assert_eq!(plain.policy, policy_document(&default_policy()));
        assert_eq!(
            (plain.log.max_size, plain.log.max_backup, plain.log.max_age),
            (100, 5, 7)
        );
        assert_eq!(plain.webhook, None);
        assert_eq!(plain.policy_digest.len(), 32);

        let inline = AuditPolicy {
            rules: vec![AuditPolicyRule {
                level: "RequestResponse".into(),
                ..AuditPolicyRule::default()
            }],
            ..AuditPolicy::default()
        };
        let audit = ApiServerAudit {
            policy: Some(inline.clone()),
            log: Some(AuditLog {
                max_size: Some(1),
                max_backup: Some(1),
                max_age: None,
            }),
            webhook: Some(AuditWebhook {
                config_secret_ref: SecretKeyReference {
                    name: "hook".into(),
                    key: None,
                },
                mode: Some("blocking".into()),
            }),
            ..ApiServerAudit::default()
        };
        let vars = audit_vars("c", Some(&audit), None).unwrap();
        assert_eq!(vars.policy, policy_document(&inline));
        assert_ne!(
            vars.policy_digest, plain.policy_digest,
            "a changed policy changes the digest"
        );
        assert_eq!((vars.log.max_size, vars.log.max_backup, vars.log.max_age), (1, 1, 7));
        assert_eq!(
            vars.webhook,
            Some(AuditWebhookVars {
                secret: "hook".into(),
                key: "kubeconfig".into(),
                mode: "blocking".into()
            })
        );
        let referenced = default_policy();
        let by_ref = ApiServerAudit {
            policy_ref: Some(ConfigMapKeyReference {
                name: "mine".into(),
                key: None,
            }),
            ..ApiServerAudit::default()
        };
        assert_eq!(policy_reference(Some(&by_ref)), Some(("mine", "policy.yaml")));
        assert_eq!(
            audit_vars("c", Some(&by_ref), Some(&referenced)).unwrap().policy,
            policy_document(&referenced)
        );
    }

    mod planned {
        //! The apiserver planned with `spec.audit`, in every release of the stable channel.

        use super::*;
        use crate::api::{AuditWebhook, ComponentSpec, SecretKeyReference};
        use crate::channel::ChannelRegistry;
        use crate::component::ComponentKind;
        use crate::plan::{
            AuditRequest, ClusterSettings, ComponentRequest, Plan, PlanError, Running, Upstream, etcd_members, plan,
        };

        fn plan_with(
            version: &str,
            audit: Option<&ApiServerAudit>,
            referenced: Option<&AuditPolicy>,
        ) -> Result<Plan, PlanError> {
            let registry = ChannelRegistry::load(&[]).expect("built-in channels load");
            let cluster = ClusterSettings {
                name: "demo".into(),
                namespace: "tenant-a".into(),
                kubernetes_version: Some(version.into()),
                channel: None,
                size: None,
                image_repository: crate::plan::DEFAULT_IMAGE_REPOSITORY.into(),
                service_cidr: "10.96.0.0/12".into(),
                dns_domain: "cluster.local".into(),
                super_dns_domain: "cluster.local".into(),
                network_policy: Default::default(),
                kms_endpoints: Vec::new(),
            };
            let spec = ComponentSpec::default();
            let request = ComponentRequest {
                kind: ComponentKind::ApiServer,
                resource_name: "demo-apiserver",
                spec: &spec,
                etcd_storage: None,
                etcd_restore: None,
                owner: Default::default(),
                running: Running::default(),
                audit: audit.map(|spec| AuditRequest { spec, referenced }),
                authentication: None,
                authorization: None,
                referenced: Default::default(),
            };
            let upstream = Upstream {
                etcd_endpoints: etcd_members("demo", "tenant-a", 1)
                    .into_iter()
                    .map(|m| m.client_url)
                    .collect(),
                ..Upstream::default()
            };
            plan(&registry, &cluster, &request, &upstream)
        }

        fn statefulset(plan: &Plan) -> &serde_json::Value {
            plan.objects
                .iter()
                .find(|o| o["kind"] == "StatefulSet")
                .expect("a StatefulSet")
        }

        fn args(plan: &Plan) -> Vec<String> {
            statefulset(plan)["spec"]["template"]["spec"]["containers"][0]["args"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().to_owned())
                .collect()
        }

        fn with_webhook() -> ApiServerAudit {
            ApiServerAudit {
                webhook: Some(AuditWebhook {
                    config_secret_ref: SecretKeyReference {
                        name: "audit-sink".into(),
                        key: Some("config".into()),
                    },
                    mode: None,
                }),
                ..ApiServerAudit::default()
            }
        }

        #[test]
        fn every_release_reads_the_policy_writes_the_log_and_sends_to_the_webhook() {
            for version in ["1.35.4", "1.36.3", "1.37.2"] {
                let audit = with_webhook();
                let plan = plan_with(version, Some(&audit), None).unwrap();
                let args = args(&plan);
                for flag in [
                    "--audit-policy-file=/etc/kubernetes/audit/policy/policy.yaml",
                    "--audit-log-path=/var/log/kubernetes/audit/audit.log",
                    "--audit-log-maxsize=100",
                    "--audit-log-maxbackup=5",
                    "--audit-log-maxage=7",
                    "--audit-webhook-config-file=/etc/kubernetes/audit/webhook/webhook-config.yaml",
                    "--audit-webhook-mode=batch",
                ] {
                    assert!(args.iter().any(|a| a == flag), "{version}: {flag} in {args:?}");
                }
                let config_map = plan
                    .objects
                    .iter()
                    .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == "demo-audit-policy")
                    .expect("the policy ConfigMap");
                assert_eq!(config_map["data"]["policy.yaml"], policy_document(&default_policy()));
                let pod = &statefulset(&plan)["spec"]["template"];
                let vars = audit_vars("demo", Some(&audit), None).unwrap();
                assert_eq!(
                    pod["metadata"]["annotations"]["controlplane.cluster.x-k8s.io/audit-policy-digest"],
                    vars.policy_digest.as_str()
                );
                let volumes = pod["spec"]["volumes"].as_array().unwrap();
                let volume = |name: &str| {
                    volumes
                        .iter()
                        .find(|v| v["name"] == name)
                        .unwrap_or_else(|| panic!("{version}: volume {name}"))
                };
                assert_eq!(volume("audit-policy")["configMap"]["name"], "demo-audit-policy");
                assert_eq!(volume("audit-log")["emptyDir"]["sizeLimit"], "700Mi");
                assert_eq!(volume("audit-webhook")["secret"]["secretName"], "audit-sink");
                assert_eq!(volume("audit-webhook")["secret"]["items"][0]["key"], "config");
                assert!(
                    plan.startup_secrets.contains(&"audit-sink".to_owned()),
                    "the webhook configuration is read at start: its Secret feeds the certificates digest"
                );
            }
        }

        #[test]
        fn without_audit_nothing_of_it_is_rendered() {
            let plan = plan_with("1.36.3", None, None).unwrap();
            assert!(!args(&plan).iter().any(|a| a.starts_with("--audit")));
            assert!(!plan.objects.iter().any(|o| o["kind"] == "ConfigMap"));
            let text = serde_json::to_string(statefulset(&plan)).unwrap();
            assert!(!text.contains("audit"), "{text}");
        }

        #[test]
        fn a_changed_policy_changes_the_pod_template_and_a_missing_reference_is_refused() {
            let digest = |plan: &Plan| {
                statefulset(plan)["spec"]["template"]["metadata"]["annotations"]
                    ["controlplane.cluster.x-k8s.io/audit-policy-digest"]
                    .clone()
            };
            let default = plan_with("1.36.3", Some(&ApiServerAudit::default()), None).unwrap();
            let inline = ApiServerAudit {
                policy: Some(AuditPolicy {
                    rules: vec![AuditPolicyRule {
                        level: "Request".into(),
                        ..AuditPolicyRule::default()
                    }],
                    ..AuditPolicy::default()
                }),
                ..ApiServerAudit::default()
            };
            let changed = plan_with("1.36.3", Some(&inline), None).unwrap();
            assert_ne!(digest(&default), digest(&changed));

            let by_ref: ApiServerAudit =
                serde_json::from_value(serde_json::json!({"policyRef": {"name": "mine"}})).unwrap();
            match plan_with("1.36.3", Some(&by_ref), None) {
                Err(PlanError::Reference(e)) => assert_eq!(e.reason, "AuditPolicyMissing"),
                other => panic!("{other:?}"),
            }
            let bad: ApiServerAudit =
                serde_json::from_value(serde_json::json!({"policy": {"rules": [{"level": "Everything"}]}})).unwrap();
            match plan_with("1.36.3", Some(&bad), None) {
                Err(PlanError::Field(e)) => {
                    assert_eq!(
                        (e.path.as_str(), e.reason),
                        ("spec.audit.policy.rules[0].level", "InvalidAuditPolicy")
                    );
                }
                other => panic!("{other:?}"),
            }
        }
    }
}
