//! Auditing of the tenant's kube-apiserver (issue 39 item 2): the audit policy and the sinks
//! events go to, in Kubernetes' own words (`audit.k8s.io/v1` `Policy`, kube-apiserver's
//! `--audit-log-*` and `--audit-webhook-*` flags:
//! <https://kubernetes.io/docs/tasks/debug/debug-cluster/audit/>).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Auditing of a NestedAPIServer's kube-apiserver. Present means on: capn renders the policy
/// into the ConfigMap `<cluster>-audit-policy`, mounts it, and the apiserver writes every
/// event its policy keeps to a log file on a volume (`--audit-log-path`) and, when
/// `webhook` is set, sends it to a webhook. The policy and the webhook configuration are
/// read only when the apiserver starts: a change rolls the apiserver
/// (docs/guide/security.md "Audit").
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ApiServerAudit {
    /// The audit policy, inline: an `audit.k8s.io/v1` `Policy` without `apiVersion` and
    /// `kind`. When neither `policy` nor `policyRef` is set, capn's default policy
    /// (docs/guide/security.md "The default policy"). At most one of the two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<AuditPolicy>,
    /// The audit policy from a ConfigMap in the NestedAPIServer's namespace: a whole
    /// `audit.k8s.io/v1` `Policy` document (YAML or JSON) under `key`. capn copies it into
    /// the ConfigMap it owns, so the referenced one may change (a change rolls the
    /// apiserver) but should not be deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_ref: Option<ConfigMapKeyReference>,
    /// Limits of the audit log file (`--audit-log-maxsize`, `--audit-log-maxbackup`,
    /// `--audit-log-maxage`). The log is always written, to `/var/log/kubernetes/audit/audit.log`
    /// on an `emptyDir` volume named `audit-log`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<AuditLog>,
    /// Also send the events to a webhook (`--audit-webhook-config-file`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<AuditWebhook>,
}

/// An `audit.k8s.io/v1` `Policy`: which events are recorded and at which level. The first
/// rule that matches a request decides its level; a request no rule matches is not recorded.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AuditPolicy {
    /// The rules, in order; at least one.
    #[serde(default)]
    pub rules: Vec<AuditPolicyRule>,
    /// Stages recorded for no request: `RequestReceived`, `ResponseStarted`,
    /// `ResponseComplete`, `Panic`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub omit_stages: Vec<String>,
    /// Leave `managedFields` out of the request and response bodies recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub omit_managed_fields: Option<bool>,
}

/// One rule of an audit policy (`audit.k8s.io/v1` `PolicyRule`). A rule matches a request
/// when every list it sets matches (an empty list matches everything).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AuditPolicyRule {
    /// `None` (not recorded), `Metadata` (who, what, when: no bodies), `Request` (and the
    /// request body), `RequestResponse` (and the response body).
    pub level: String,
    /// The users the rule applies to (`system:kube-proxy`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<String>,
    /// The groups the rule applies to (`system:authenticated`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_groups: Vec<String>,
    /// The verbs (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub verbs: Vec<String>,
    /// The resources, by group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<AuditGroupResources>,
    /// The namespaces; `""` matches requests outside any namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// URL paths that are not resources (`/healthz*`, `/version`); `*` only at the end. A
    /// rule has either these or `resources` and `namespaces`.
    #[serde(default, rename = "nonResourceURLs", skip_serializing_if = "Vec::is_empty")]
    pub non_resource_urls: Vec<String>,
    /// Stages this rule does not record (as the policy's `omitStages`, added to them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub omit_stages: Vec<String>,
    /// Overrides the policy's `omitManagedFields` for this rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub omit_managed_fields: Option<bool>,
}

/// Resources of one API group in an audit policy rule (`audit.k8s.io/v1` `GroupResources`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AuditGroupResources {
    /// The API group; `""` (or unset) is the core group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// The resources (`secrets`, `pods/log`, `pods/*`, `*/scale`); empty means all of the group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<String>,
    /// Object names; empty means all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resource_names: Vec<String>,
}

/// A key of a ConfigMap in the referring object's namespace.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapKeyReference {
    /// The ConfigMap's name.
    pub name: String,
    /// The key; its default is the referring field's (`policy.yaml` for an audit policy,
    /// `config.yaml` for an authentication or authorization configuration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl ConfigMapKeyReference {
    /// The ConfigMap's name and the key, `default` when the reference names none.
    pub fn name_and_key<'a>(&'a self, default: &'a str) -> (&'a str, &'a str) {
        (self.name.as_str(), self.key.as_deref().unwrap_or(default))
    }
}

/// A key of a Secret in the referring object's namespace.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyReference {
    /// The Secret's name.
    pub name: String,
    /// The key (default `kubeconfig`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// Rotation limits of the audit log file (kube-apiserver's defaults are no limits; capn's
/// are below, so that a busy tenant cannot fill the node's disk).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AuditLog {
    /// Size in mebibytes at which the file is rotated (`--audit-log-maxsize`). Default 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_size: Option<i32>,
    /// Rotated files kept (`--audit-log-maxbackup`). Default 5; at least 1, because
    /// kube-apiserver reads 0 as no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_backup: Option<i32>,
    /// Days a rotated file is kept (`--audit-log-maxage`). Default 7; 0 keeps files of any
    /// age (`maxBackup` still bounds them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_age: Option<i32>,
}

impl AuditLog {
    /// Default of [`Self::max_size`], in MiB.
    pub const DEFAULT_MAX_SIZE: i32 = 100;
    /// Default of [`Self::max_backup`].
    pub const DEFAULT_MAX_BACKUP: i32 = 5;
    /// Default of [`Self::max_age`], in days.
    pub const DEFAULT_MAX_AGE: i32 = 7;
}

/// The audit webhook sink: kube-apiserver sends events to the server a kubeconfig-format
/// file names (`--audit-webhook-config-file`), with that file's credentials.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AuditWebhook {
    /// The Secret (in the NestedAPIServer's namespace) and key holding the kubeconfig file;
    /// its `clusters[].cluster.server` is the webhook's URL. Read at start: a change rolls
    /// the apiserver.
    pub config_secret_ref: SecretKeyReference,
    /// `batch` (default: events are buffered and sent asynchronously), `blocking` (each
    /// request waits for its event to be sent) or `blocking-strict` (and fails when it
    /// cannot be) — `--audit-webhook-mode`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
}
