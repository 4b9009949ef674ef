//! The field rules: one table, three callers.
//!
//! Every spec field with a syntax (ports, hosts, CIDRs, DNS domains, `certSANs`, quantities,
//! versions, channel names, `extraArgs` keys, replica bounds, the cluster name) has one entry
//! in [`RULES`]. The entry is used
//! 1. by [`crate::crds::crds`], which turns it into OpenAPI constraints and CEL
//!    `x-kubernetes-validations` in the generated CRDs, so the API server refuses bad input
//!    at admission;
//! 2. by the controllers, which check the same rules before planning (a CRD installed by an
//!    older capn, or a value that comes from elsewhere — the cluster name label, a Cluster
//!    API `Cluster`'s `clusterNetwork` — is refused with a condition naming the field);
//! 3. by `capn render`, which refuses the input offline with the same reason and message.
//!
//! Messages follow the API server's shape (`<path>: Invalid value: <value>: <message>`),
//! and `<message>` is the CEL rule's `message`, so the three callers say the same thing.
//!
//! CEL libraries used, and the first Kubernetes release of the super cluster that has them
//! (<https://kubernetes.io/docs/reference/using-api/cel/>): validation rules (GA 1.29),
//! `matches` (all), the IP and CIDR libraries `isIP`/`isCIDR`/`cidr()` (1.31), the quantity
//! library `isQuantity`/`quantity()` (1.29). The super cluster therefore needs Kubernetes
//! 1.31 or newer.

use std::net::IpAddr;
use std::sync::LazyLock;

use serde_json::Value;

/// The kinds whose specs carry rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    NestedControlPlane,
    NestedEtcd,
    NestedAPIServer,
    NestedControllerManager,
}

impl Kind {
    /// The kind's name (`NestedEtcd`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NestedControlPlane => "NestedControlPlane",
            Self::NestedEtcd => "NestedEtcd",
            Self::NestedAPIServer => "NestedAPIServer",
            Self::NestedControllerManager => "NestedControllerManager",
        }
    }

    /// The kind named `kind`, if it has rules.
    pub fn from_name(kind: &str) -> Option<Self> {
        [
            Self::NestedControlPlane,
            Self::NestedEtcd,
            Self::NestedAPIServer,
            Self::NestedControllerManager,
        ]
        .into_iter()
        .find(|k| k.as_str() == kind)
    }
}

/// Largest etcd cluster capn runs: the etcd FAQ recommends 3, 5 or 7 members, and more
/// members only slow writes down (<https://etcd.io/docs/v3.6/faq/>).
pub const MAX_ETCD_MEMBERS: i64 = 7;
/// Largest apiserver or controller-manager replica count (a bound, so that a typo like
/// `replicas: 300` is refused instead of scheduled).
pub const MAX_REPLICAS: i64 = 10;
/// Longest cluster name: `<c>-controller-manager` is a StatefulSet, whose pods carry the
/// label `controller-revision-hash: <statefulset>-<hash>`; a label value holds at most 63
/// characters and the hash suffix takes up to 11, so a StatefulSet name holds at most 52
/// (kubernetes/kubernetes#64023). 52 − len("-controller-manager") = 33. The Services
/// `<c>-etcd` and `<c>-apiserver` (RFC 1035 labels of at most 63 characters) fit then too.
pub const MAX_CLUSTER_NAME: usize = 33;

const DNS_LABEL: &str = "[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?";

static DNS_SUBDOMAIN: LazyLock<String> = LazyLock::new(|| format!("^{DNS_LABEL}(\\.{DNS_LABEL})*$"));
static WILDCARD_SUBDOMAIN: LazyLock<String> = LazyLock::new(|| format!("^(\\*\\.)?{DNS_LABEL}(\\.{DNS_LABEL})*$"));
const RFC1035_LABEL: &str = "^[a-z]([-a-z0-9]*[a-z0-9])?$";
const VERSION: &str = "^(v?[0-9]+(\\.[0-9]+){0,2}(-[0-9]+)?)?$";
const CHANNEL_NAME: &str = "^([a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?)?$";
const SIZE_NAME: &str = "^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)?$";
const FLAG_NAME: &str = "^[A-Za-z0-9][-A-Za-z0-9_.]*$";
const IMAGE_REPOSITORY: &str = "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?(:[0-9]+)?(/[a-z0-9]+([._-]+[a-z0-9]+)*)*$";
const CRON: &str = "^(@(hourly|daily|weekly|monthly|yearly|annually)|\\S+( +\\S+){4})$";
const S3_ENDPOINT: &str = "^https?://([a-z0-9]([-a-z0-9.]*[a-z0-9])?|[0-9.]+|\\[[0-9a-fA-F:]+\\])(:[0-9]{1,5})?/?$";
const BUCKET: &str = "^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$";
/// Kubernetes' quantity grammar (`<signedNumber><suffix>`, `resource.Quantity`).
const QUANTITY: &str = "^[+-]?([0-9]+(\\.[0-9]*)?|\\.[0-9]+)([eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$";

/// What a field must look like. Each syntax has a reason (the condition reason), one or more
/// CEL rules with their messages, and the same checks in Rust ([`Syntax::check`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Syntax {
    /// A TCP port, 1–65535.
    Port,
    /// A DNS name (RFC 1123 subdomain) or an IP address, as clients dial it.
    Host,
    /// A service CIDR: a network address with no host bits, 20 host bits at most (what
    /// kube-apiserver's `--service-cluster-ip-range` accepts) and room for the first host
    /// address capn takes for the tenant's `kubernetes` Service.
    ServiceCidr,
    /// A DNS domain (RFC 1123 subdomain), no wildcard.
    DnsDomain,
    /// A certificate SAN: an IP address or a DNS name, whose first label may be `*`.
    San,
    /// A non-negative resource quantity (`100m`, `128Mi`, `1`).
    Quantity,
    /// A positive storage size.
    StorageSize,
    /// A version as users write it: `1.36.3`, `1.36`, `v1.36`, `3.6.8-0`, or empty.
    Version,
    /// A channel name: a directory name, never a path.
    ChannelName,
    /// A size name (`small`): a DNS label, or empty. Which sizes exist is the channel's
    /// (`channel.yaml` `sizes`), which CEL cannot read: the controllers and `capn render`
    /// refuse an unknown one (`UnknownSize`).
    SizeName,
    /// A command-line flag name without the leading `--` (a map key).
    FlagName,
    /// A replica count between 1 and the bound.
    Replicas { max: i64 },
    /// The cluster name every object name derives from.
    ClusterName,
    /// The name of another object (RFC 1123 subdomain).
    ObjectName,
    /// A registry and path prefix for images.
    ImageRepository,
    /// A backup schedule: five cron fields or an `@` alias (the full parse is croner's, in
    /// the controller; this is the shape).
    CronSchedule,
    /// A retention count between 1 and the bound.
    Retention { max: i64 },
    /// An S3 API endpoint: `http(s)://host[:port]`.
    S3Endpoint,
    /// An S3 bucket name.
    BucketName,
    /// An audit policy rule's `level` (`audit.k8s.io/v1`).
    AuditLevel,
    /// An audit stage (`omitStages` items).
    AuditStage,
    /// An audit policy: at least one rule (kube-apiserver refuses a policy without rules).
    AuditRules,
    /// An audit policy rule: `nonResourceURLs` or `resources`/`namespaces`, not both.
    AuditRule,
    /// The audit settings: at most one of `policy` and `policyRef`.
    AuditPolicySource,
    /// `--audit-webhook-mode`.
    AuditWebhookMode,
    /// A key of a ConfigMap's or Secret's data.
    DataKey,
    /// The JWT authenticators of an `AuthenticationConfiguration`: distinct issuer URLs.
    JwtAuthenticators,
    /// A JWT issuer URL: `https://`, no user, query or fragment.
    JwtIssuerUrl,
    /// A JWT issuer's audiences: at least one.
    JwtAudiences,
    /// A claim mapping that must be set: exactly one of `claim` and `expression`; a
    /// `prefix` with `claim`, none with `expression`.
    RequiredClaimMapping,
    /// A claim mapping that may be empty: at most one of `claim` and `expression`, and the
    /// same prefix rules.
    OptionalClaimMapping,
    /// The authorizers of an `AuthorizationConfiguration`: unique names, exactly one `Node`
    /// and one `RBAC`.
    Authorizers,
    /// One authorizer: a `webhook` exactly when its type is `Webhook`.
    AuthorizerWebhook,
    /// An authorizer's type: `Webhook`, `Node` or `RBAC`.
    AuthorizerType,
    /// A webhook authorizer's `timeout`: a Go duration above 0 and at most 30s.
    WebhookTimeout,
    /// A Go duration (`5m`, `1m30s`), as `authorizedTTL` and `unauthorizedTTL` are.
    GoDuration,
    /// `subjectAccessReviewVersion`: `v1` or `v1beta1`.
    SubjectAccessReviewVersion,
    /// `matchConditionSubjectAccessReviewVersion`: `v1`.
    MatchConditionVersion,
    /// A webhook authorizer's `failurePolicy`: `NoOpinion` or `Deny`.
    AuthorizerFailurePolicy,
    /// A webhook authorizer's `connectionInfo.type`: `KubeConfigFile`.
    WebhookConnectionType,
    /// `spec.authentication` and `spec.authorization`: exactly one of `configuration` (inline)
    /// and `configurationRef` (a ConfigMap).
    ConfigurationSource,
    /// The resources encrypted at rest: `secrets` among them, each once (kube-apiserver's
    /// `duplicateResourceErr`).
    EncryptedResources,
    /// One resource encrypted at rest, as kube-apiserver's `EncryptionConfiguration` names it
    /// and its validation (k8s.io/apiserver `pkg/apis/apiserver/validation`
    /// `validateResourceNames`) accepts it, without the wildcards capn does not offer.
    EncryptedResource,
    /// A KMS provider's name: kube-apiserver refuses one with `:` (it is written into every
    /// value's prefix, `k8s:enc:kms:v2:<name>:`); capn takes letters, digits, `-`, `_`, `.`.
    KmsName,
    /// A KMS v2 plugin's endpoint: `unix://` and an absolute path of a socket in a directory
    /// (kube-apiserver dials KMS v2 plugins on unix sockets only), no `.` or `..` steps, at
    /// most 107 bytes of path (`sun_path`).
    KmsEndpoint,
    /// A KMS provider's `timeout`: a Go duration above 0 and at most 30s.
    KmsTimeout,
    /// One `matchExpressions` requirement of a label selector: `In` and `NotIn` with values,
    /// `Exists` and `DoesNotExist` without (apimachinery's `ValidateLabelSelectorRequirement`).
    LabelSelectorRequirement,
}

/// One CEL rule of a syntax and the message shown when it fails.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CelRule {
    /// The rule, with `self` the field's value.
    pub rule: String,
    /// What is allowed, as the API server and capn say it.
    pub message: &'static str,
}

macro_rules! cel {
    ($rule:expr, $message:expr) => {
        CelRule {
            rule: String::from($rule),
            message: $message,
        }
    };
}

const PORT_MESSAGE: &str = "must be a TCP port between 1 and 65535";
const HOST_MESSAGE: &str =
    "must be a DNS name (lower-case RFC 1123 subdomain, at most 253 characters) or an IP address without brackets";
const CIDR_MESSAGE: &str =
    "must be a network in CIDR notation with no bits set after the prefix, like 10.96.0.0/12 or fd00::/108";
const CIDR_SIZE_MESSAGE: &str = "must be an IPv4 /12 to /30 or an IPv6 /108 to /126: kube-apiserver allows at most 20 host bits, and capn takes the first address for the kubernetes Service";
const DOMAIN_MESSAGE: &str =
    "must be a DNS domain (lower-case RFC 1123 subdomain, at most 253 characters, no wildcard), like cluster.local";
const SAN_MESSAGE: &str = "must be an IP address or a DNS name (lower-case RFC 1123 subdomain; the first label may be *), at most 253 characters";
const QUANTITY_MESSAGE: &str = "must be a non-negative quantity, like 100m, 128Mi or 2";
const STORAGE_MESSAGE: &str = "must be a positive quantity, like 1Gi or 500Mi";
const VERSION_MESSAGE: &str = "must be a version: major.minor.patch (1.36.3) or major.minor (1.36), optionally with a leading v and an image suffix (-0), or empty";
const CHANNEL_MESSAGE: &str =
    "must be a channel name (lower-case letters, digits, '-' and '.', at most 63 characters), never a path";
const SIZE_MESSAGE: &str = "must be a size name (lower-case letters, digits and '-', at most 63 characters), like small; the channel's channel.yaml lists the sizes it offers";
const FLAG_MESSAGE: &str = "keys must be flag names without the leading -- (letters, digits, '-', '_' and '.'; at most 128 characters), like v or feature-gates";
const CLUSTER_NAME_MESSAGE: &str = "must be a lower-case RFC 1035 label of at most 33 characters: the Services <name>-etcd and <name>-apiserver are RFC 1035 labels (at most 63), and the StatefulSet <name>-controller-manager may have at most 52 characters because its pods' controller-revision-hash label adds 11 to it";
const OBJECT_NAME_MESSAGE: &str = "must be an object name (lower-case RFC 1123 subdomain, at most 253 characters)";
const CRON_MESSAGE: &str = "must be a cron expression of five fields (minute hour day-of-month month day-of-week, like 0 3 * * *) or one of @hourly, @daily, @weekly, @monthly, @yearly, @annually";
const S3_ENDPOINT_MESSAGE: &str = "must be the URL of an S3 API, http:// or https:// with a host and an optional port and nothing after, like https://s3.eu-west-1.amazonaws.com or http://minio.backup:9000";
const BUCKET_MESSAGE: &str = "must be an S3 bucket name: 3 to 63 lower-case letters, digits, '.' and '-', starting and ending with a letter or digit";
/// The levels of `audit.k8s.io/v1` (k8s.io/apiserver/pkg/apis/audit/v1 `Level`).
pub const AUDIT_LEVELS: &[&str] = &["None", "Metadata", "Request", "RequestResponse"];
/// The authorizer types capn renders (`AlwaysAllow` and `AlwaysDeny` would open or close
/// the whole tenant; ABAC needs a policy file capn does not mount).
pub const AUTHORIZER_TYPES: &[&str] = &["Webhook", "Node", "RBAC"];
const SAR_VERSIONS: &[&str] = &["v1", "v1beta1"];
const MATCH_CONDITION_VERSIONS: &[&str] = &["v1"];
const FAILURE_POLICIES: &[&str] = &["NoOpinion", "Deny"];
const CONNECTION_TYPES: &[&str] = &["KubeConfigFile"];
/// A Go duration (`time.ParseDuration`), unsigned.
const GO_DURATION: &str = "^([0-9]+(\\.[0-9]*)?(ns|us|ms|s|m|h))+$";
const AUTHORIZER_NAMES_MESSAGE: &str = "authorizer names must be unique";
const AUTHORIZERS_MESSAGE: &str = "must hold exactly one Node and one RBAC authorizer: capn's nodes and the control plane's own components are authorized by them";
const AUTHORIZER_WEBHOOK_MESSAGE: &str = "webhook must be set for type Webhook and only for it";
const AUTHORIZER_TYPE_MESSAGE: &str = "must be one of Webhook, Node, RBAC";
const WEBHOOK_TIMEOUT_MESSAGE: &str = "must be a duration above 0s and at most 30s, like 3s";
const GO_DURATION_MESSAGE: &str = "must be a duration like 5m or 1m30s";
const SAR_VERSION_MESSAGE: &str = "must be v1 or v1beta1";
const MATCH_CONDITION_VERSION_MESSAGE: &str = "must be v1";
const FAILURE_POLICY_MESSAGE: &str = "must be NoOpinion or Deny";
const CONNECTION_TYPE_MESSAGE: &str = "must be KubeConfigFile (with kubeConfigSecretRef): InClusterConfig would dial the super cluster with the apiserver pod's identity";
/// The stages of `audit.k8s.io/v1` (`Stage`).
pub const AUDIT_STAGES: &[&str] = &["RequestReceived", "ResponseStarted", "ResponseComplete", "Panic"];
/// kube-apiserver's `--audit-webhook-mode` values.
pub const AUDIT_WEBHOOK_MODES: &[&str] = &["batch", "blocking", "blocking-strict"];
/// A ConfigMap or Secret data key (k8s.io/apimachinery `IsConfigMapKey`).
const DATA_KEY: &str = "^[-._a-zA-Z0-9]+$";
const AUDIT_LEVEL_MESSAGE: &str = "must be one of None, Metadata, Request, RequestResponse (audit.k8s.io/v1 levels)";
const AUDIT_STAGE_MESSAGE: &str =
    "must be one of RequestReceived, ResponseStarted, ResponseComplete, Panic (audit.k8s.io/v1 stages)";
const AUDIT_RULES_MESSAGE: &str = "must have at least one rule: kube-apiserver refuses an audit policy without rules";
const AUDIT_RULE_MESSAGE: &str =
    "a rule applies either to nonResourceURLs or to resources and namespaces, not both (as kube-apiserver checks it)";
const AUDIT_POLICY_SOURCE_MESSAGE: &str =
    "policy and policyRef are exclusive: set at most one (neither: capn's default policy)";
const AUDIT_WEBHOOK_MODE_MESSAGE: &str = "must be one of batch, blocking, blocking-strict (--audit-webhook-mode)";
const DATA_KEY_MESSAGE: &str =
    "must be a data key: letters, digits, '-', '_' and '.', at most 253 characters, like policy.yaml";
/// An issuer URL as kube-apiserver accepts it (k8s.io/apiserver pkg/apis/apiserver/validation
/// `validateURL`): scheme https, a host, no user information, query or fragment.
const ISSUER_URL: &str = "^https://[^/?#@\\s]+(/[^?#\\s]*)?$";
const JWT_DUPLICATE_MESSAGE: &str =
    "issuer URLs must be distinct: kube-apiserver refuses two JWT authenticators of one issuer";
const JWT_ISSUER_MESSAGE: &str =
    "must be an https:// URL with a host and no user, query or fragment (kube-apiserver's rule for issuer URLs)";
const JWT_AUDIENCES_MESSAGE: &str = "must list at least one audience";
const CLAIM_ONE_MESSAGE: &str = "set exactly one of claim and expression";
const CLAIM_AT_MOST_ONE_MESSAGE: &str = "set at most one of claim and expression";
const CLAIM_PREFIX_MESSAGE: &str =
    "prefix is required when claim is set (\"\" for none), as kube-apiserver requires it";
const EXPRESSION_PREFIX_MESSAGE: &str = "prefix may not be set with expression: put it in the expression";
const CONFIGURATION_SOURCE_MESSAGE: &str =
    "set exactly one of configuration and configurationRef: the configuration inline, or the ConfigMap that holds it";
/// A resource named in an `EncryptionConfiguration`: a lower-case `<resource>` of the core
/// group or `<resource>.<group>`; no wildcard (`*.<group>`, `*.*`), which capn does not offer.
const ENCRYPTED_RESOURCE: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// A label selector requirement's operator and values.
const SELECTOR_REQUIREMENT_MESSAGE: &str = "operator must be In or NotIn with at least one value, or Exists or DoesNotExist without values (a label selector's requirement)";
/// A KMS provider's name.
const KMS_NAME: &str = "^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$";
const KMS_NAME_MESSAGE: &str = "must be letters, digits, '-', '_' and '.', at most 63, starting and ending with a letter or digit (kube-apiserver writes the name into every value it encrypts and refuses ':')";
/// A KMS v2 endpoint: `unix://`, then an absolute path of at least two steps, none of them
/// `.` or `..` (no step starts with a dot).
const KMS_ENDPOINT: &str = "^unix:///[A-Za-z0-9_-][-A-Za-z0-9_.]*(/[A-Za-z0-9_-][-A-Za-z0-9_.]*)+$";
const KMS_ENDPOINT_MESSAGE: &str = "must be unix:// and the absolute path of the plugin's socket in a directory, like unix:///var/run/kmsplugin/socket.sock: kube-apiserver dials KMS v2 plugins on unix sockets only, capn mounts the socket's directory, no step may start with '.', and a socket path holds at most 107 bytes";
/// Resources without a REST API, which kube-apiserver refuses to encrypt
/// (`nonRESTAPIResourceErr`).
pub const NON_REST_RESOURCES: &[&str] = &["apiserveripinfo", "serviceipallocations", "servicenodeportallocations"];
const ENCRYPTED_RESOURCE_MESSAGE: &str = "must be a resource as kube-apiserver's EncryptionConfiguration names it: lower-case <resource> of the core group or <resource>.<group>, like configmaps or deployments.apps; wildcards (*.apps, *.*) are not offered, because a key rotation writes every object of every listed resource again and needs each resource named";
const NON_REST_RESOURCE_MESSAGE: &str = "apiserveripinfo, serviceipallocations and servicenodeportallocations have no REST API and cannot be encrypted (kube-apiserver refuses them)";
const EVENTS_GROUP_MESSAGE: &str = "events.k8s.io Events are stored as the core group's events: name them events (kube-apiserver refuses the events.k8s.io group)";
const EXTENSIONS_GROUP_MESSAGE: &str =
    "the extensions group was removed and cannot be encrypted (kube-apiserver refuses it)";
const ENCRYPTED_SECRETS_MESSAGE: &str = "must include secrets: the tenant's Secrets are always encrypted, and dropping them would leave those encrypted so far unreadable";
const ENCRYPTED_DUPLICATE_MESSAGE: &str =
    "must name each resource once (kube-apiserver refuses a resource listed twice)";
/// A resource of the group `events.k8s.io` (the group is what follows the first `.`, as
/// k8s.io/apimachinery `ParseGroupResource` splits it).
const EVENTS_GROUP: &str = "^[^.]+\\.events\\.k8s\\.io$";
/// A resource of the removed group `extensions`.
const EXTENSIONS_GROUP: &str = "^[^.]+\\.extensions$";
const IMAGE_REPOSITORY_MESSAGE: &str =
    "must be a registry host with an optional port and path, like registry.k8s.io or localhost:5000/mirror";

// The CEL rules must say what the Rust checks below say; the corpus test
// (tests/integration/validation.rs) proves it on a real API server, case by case.

impl Syntax {
    /// Short stable reason, used as condition reason, Event reason and metric label.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Port | Self::Host => "InvalidEndpoint",
            Self::ServiceCidr => "InvalidServiceCIDR",
            Self::DnsDomain => "InvalidServiceDomain",
            Self::San => "InvalidSAN",
            Self::Quantity => "InvalidResources",
            Self::StorageSize => "InvalidStorage",
            Self::Version => "InvalidVersion",
            Self::ChannelName => "InvalidChannelName",
            Self::SizeName => "InvalidSize",
            Self::FlagName => "InvalidExtraArgs",
            Self::Replicas { .. } => "InvalidReplicas",
            Self::ClusterName => "InvalidClusterName",
            Self::ObjectName => "InvalidName",
            Self::ImageRepository => "InvalidImageRepository",
            Self::CronSchedule => "InvalidBackupSchedule",
            Self::Retention { .. } => "InvalidBackupRetention",
            Self::S3Endpoint | Self::BucketName => "InvalidBackupDestination",
            Self::AuditLevel | Self::AuditStage | Self::AuditRules | Self::AuditRule => "InvalidAuditPolicy",
            Self::AuditPolicySource | Self::AuditWebhookMode | Self::DataKey => "InvalidAudit",
            Self::JwtAuthenticators
            | Self::JwtIssuerUrl
            | Self::JwtAudiences
            | Self::RequiredClaimMapping
            | Self::OptionalClaimMapping
            | Self::ConfigurationSource => "InvalidAuthentication",
            Self::Authorizers
            | Self::AuthorizerWebhook
            | Self::AuthorizerType
            | Self::WebhookTimeout
            | Self::GoDuration
            | Self::SubjectAccessReviewVersion
            | Self::MatchConditionVersion
            | Self::AuthorizerFailurePolicy
            | Self::WebhookConnectionType => "InvalidAuthorization",
            Self::EncryptedResources | Self::EncryptedResource => "InvalidEncryptionResources",
            Self::KmsName | Self::KmsEndpoint | Self::KmsTimeout => "InvalidEncryptionKMS",
            Self::LabelSelectorRequirement => "InvalidTenantNodes",
        }
    }

    /// The CEL rules of this syntax, each with its message (`self` is the value).
    pub fn cel(self) -> Vec<CelRule> {
        match self {
            Self::Port => vec![cel!("self >= 1 && self <= 65535", PORT_MESSAGE)],
            Self::Host => vec![cel!(
                format!("isIP(self) || self.matches('{}')", cel_pattern(&DNS_SUBDOMAIN)),
                HOST_MESSAGE
            )],
            Self::ServiceCidr => vec![
                cel!("isCIDR(self)", CIDR_MESSAGE),
                // isCIDR accepts host bits after the prefix (10.96.0.1/12).
                cel!("!isCIDR(self) || cidr(self) == cidr(self).masked()", CIDR_MESSAGE),
                cel!(
                    "!isCIDR(self) || (cidr(self).ip().family() == 4 ? cidr(self).prefixLength() >= 12 && cidr(self).prefixLength() <= 30 : cidr(self).prefixLength() >= 108 && cidr(self).prefixLength() <= 126)",
                    CIDR_SIZE_MESSAGE
                ),
            ],
            Self::DnsDomain => vec![cel!(
                format!("self.matches('{}')", cel_pattern(&DNS_SUBDOMAIN)),
                DOMAIN_MESSAGE
            )],
            Self::San => vec![cel!(
                format!("isIP(self) || self.matches('{}')", cel_pattern(&WILDCARD_SUBDOMAIN)),
                SAN_MESSAGE
            )],
            Self::Quantity => vec![cel!(
                "type(self) == string ? isQuantity(self) && !quantity(self).isLessThan(quantity('0')) : self >= 0",
                QUANTITY_MESSAGE
            )],
            Self::StorageSize => vec![cel!(
                "type(self) == string ? isQuantity(self) && quantity(self).isGreaterThan(quantity('0')) : self > 0",
                STORAGE_MESSAGE
            )],
            Self::Version => vec![cel!(
                format!("self.matches('{}')", cel_pattern(VERSION)),
                VERSION_MESSAGE
            )],
            Self::ChannelName => vec![cel!(
                format!("self.matches('{}')", cel_pattern(CHANNEL_NAME)),
                CHANNEL_MESSAGE
            )],
            Self::SizeName => vec![cel!(
                format!("self.matches('{}')", cel_pattern(SIZE_NAME)),
                SIZE_MESSAGE
            )],
            Self::FlagName => vec![cel!(
                format!(
                    "self.all(k, k.size() <= 128 && k.matches('{}'))",
                    cel_pattern(FLAG_NAME)
                ),
                FLAG_MESSAGE
            )],
            Self::Replicas { max } => vec![CelRule {
                rule: format!("self >= 1 && self <= {max}"),
                message: if max == MAX_ETCD_MEMBERS {
                    "must be between 1 and 7 (etcd members; the etcd FAQ recommends 3, 5 or 7)"
                } else {
                    "must be between 1 and 10"
                },
            }],
            Self::ClusterName => vec![cel!(
                format!(
                    "self.size() <= {MAX_CLUSTER_NAME} && self.matches('{}')",
                    cel_pattern(RFC1035_LABEL)
                ),
                CLUSTER_NAME_MESSAGE
            )],
            Self::ObjectName => vec![cel!(
                format!("self.matches('{}')", cel_pattern(&DNS_SUBDOMAIN)),
                OBJECT_NAME_MESSAGE
            )],
            Self::ImageRepository => vec![cel!(
                format!("self.matches('{}')", cel_pattern(IMAGE_REPOSITORY)),
                IMAGE_REPOSITORY_MESSAGE
            )],
            Self::CronSchedule => vec![cel!(format!("self.matches('{}')", cel_pattern(CRON)), CRON_MESSAGE)],
            Self::Retention { max } => vec![CelRule {
                rule: format!("self >= 1 && self <= {max}"),
                message: "must be between 1 and 1000 (complete snapshots kept)",
            }],
            Self::S3Endpoint => vec![cel!(
                format!("self.matches('{}')", cel_pattern(S3_ENDPOINT)),
                S3_ENDPOINT_MESSAGE
            )],
            Self::BucketName => vec![cel!(format!("self.matches('{}')", cel_pattern(BUCKET)), BUCKET_MESSAGE)],
            Self::AuditLevel => vec![cel!(cel_one_of(AUDIT_LEVELS), AUDIT_LEVEL_MESSAGE)],
            Self::AuditStage => vec![cel!(cel_one_of(AUDIT_STAGES), AUDIT_STAGE_MESSAGE)],
            Self::AuditRules => vec![cel!("has(self.rules) && size(self.rules) > 0", AUDIT_RULES_MESSAGE)],
            Self::AuditRule => vec![cel!(
                "!(has(self.nonResourceURLs) && size(self.nonResourceURLs) > 0 && ((has(self.resources) && size(self.resources) > 0) || (has(self.namespaces) && size(self.namespaces) > 0)))",
                AUDIT_RULE_MESSAGE
            )],
            Self::AuditPolicySource => vec![cel!(
                "!(has(self.policy) && has(self.policyRef))",
                AUDIT_POLICY_SOURCE_MESSAGE
            )],
            Self::AuditWebhookMode => vec![cel!(cel_one_of(AUDIT_WEBHOOK_MODES), AUDIT_WEBHOOK_MODE_MESSAGE)],
            Self::DataKey => vec![cel!(
                format!("self.matches('{}')", cel_pattern(DATA_KEY)),
                DATA_KEY_MESSAGE
            )],
            Self::JwtAuthenticators => vec![cel!(
                "self.all(a, self.filter(b, b.issuer.url == a.issuer.url).size() == 1)",
                JWT_DUPLICATE_MESSAGE
            )],
            Self::JwtIssuerUrl => vec![cel!(
                format!("self.matches('{}')", cel_pattern(ISSUER_URL)),
                JWT_ISSUER_MESSAGE
            )],
            Self::JwtAudiences => vec![cel!("size(self) > 0", JWT_AUDIENCES_MESSAGE)],
            Self::EncryptedResources => vec![
                cel!("self.exists(r, r == 'secrets')", ENCRYPTED_SECRETS_MESSAGE),
                cel!(
                    "self.all(r, self.filter(s, s == r).size() == 1)",
                    ENCRYPTED_DUPLICATE_MESSAGE
                ),
            ],
            Self::EncryptedResource => vec![
                cel!(
                    format!("self.matches('{}')", cel_pattern(ENCRYPTED_RESOURCE)),
                    ENCRYPTED_RESOURCE_MESSAGE
                ),
                cel!(
                    format!("!({})", cel_one_of(NON_REST_RESOURCES)),
                    NON_REST_RESOURCE_MESSAGE
                ),
                cel!(
                    format!("!self.matches('{}')", cel_pattern(EVENTS_GROUP)),
                    EVENTS_GROUP_MESSAGE
                ),
                cel!(
                    format!("!self.matches('{}')", cel_pattern(EXTENSIONS_GROUP)),
                    EXTENSIONS_GROUP_MESSAGE
                ),
            ],
            Self::RequiredClaimMapping => vec![
                cel!("has(self.claim) != has(self.expression)", CLAIM_ONE_MESSAGE),
                cel!("!has(self.claim) || has(self.prefix)", CLAIM_PREFIX_MESSAGE),
                cel!("!has(self.expression) || !has(self.prefix)", EXPRESSION_PREFIX_MESSAGE),
            ],
            Self::OptionalClaimMapping => vec![
                cel!("!(has(self.claim) && has(self.expression))", CLAIM_AT_MOST_ONE_MESSAGE),
                cel!("!has(self.claim) || has(self.prefix)", CLAIM_PREFIX_MESSAGE),
                cel!("!has(self.expression) || !has(self.prefix)", EXPRESSION_PREFIX_MESSAGE),
            ],
            Self::Authorizers => vec![
                cel!(
                    "self.all(a, self.filter(b, b.name == a.name).size() == 1)",
                    AUTHORIZER_NAMES_MESSAGE
                ),
                cel!(
                    "self.filter(a, a.type == 'Node').size() == 1 && self.filter(a, a.type == 'RBAC').size() == 1",
                    AUTHORIZERS_MESSAGE
                ),
            ],
            Self::AuthorizerWebhook => vec![cel!(
                "(self.type == 'Webhook') == has(self.webhook)",
                AUTHORIZER_WEBHOOK_MESSAGE
            )],
            Self::AuthorizerType => vec![cel!(cel_one_of(AUTHORIZER_TYPES), AUTHORIZER_TYPE_MESSAGE)],
            Self::LabelSelectorRequirement => vec![cel!(
                "self.operator in ['In', 'NotIn'] ? (has(self.values) && size(self.values) > 0) : \
                 (self.operator in ['Exists', 'DoesNotExist'] && (!has(self.values) || size(self.values) == 0))",
                SELECTOR_REQUIREMENT_MESSAGE
            )],
            Self::KmsName => vec![cel!(
                format!("self.matches('{}')", cel_pattern(KMS_NAME)),
                KMS_NAME_MESSAGE
            )],
            Self::KmsEndpoint => vec![cel!(
                format!("self.matches('{}')", cel_pattern(KMS_ENDPOINT)),
                KMS_ENDPOINT_MESSAGE
            )],
            // `&&` stops at a string that is no duration, before `duration()` would fail on it.
            Self::WebhookTimeout | Self::KmsTimeout => vec![cel!(
                format!(
                    "self.matches('{}') && duration(self) > duration('0s') && duration(self) <= duration('30s')",
                    cel_pattern(GO_DURATION)
                ),
                WEBHOOK_TIMEOUT_MESSAGE
            )],
            Self::GoDuration => vec![cel!(
                format!("self.matches('{}')", cel_pattern(GO_DURATION)),
                GO_DURATION_MESSAGE
            )],
            Self::SubjectAccessReviewVersion => vec![cel!(cel_one_of(SAR_VERSIONS), SAR_VERSION_MESSAGE)],
            Self::MatchConditionVersion => vec![cel!(
                cel_one_of(MATCH_CONDITION_VERSIONS),
                MATCH_CONDITION_VERSION_MESSAGE
            )],
            Self::AuthorizerFailurePolicy => vec![cel!(cel_one_of(FAILURE_POLICIES), FAILURE_POLICY_MESSAGE)],
            Self::WebhookConnectionType => vec![cel!(cel_one_of(CONNECTION_TYPES), CONNECTION_TYPE_MESSAGE)],
            Self::ConfigurationSource => vec![cel!(
                "has(self.configuration) != has(self.configurationRef)",
                CONFIGURATION_SOURCE_MESSAGE
            )],
        }
    }

    /// The longest string value (OpenAPI `maxLength`), which also bounds the CEL cost.
    pub fn max_length(self) -> Option<i64> {
        match self {
            Self::Host | Self::DnsDomain | Self::San | Self::ObjectName => Some(253),
            Self::ServiceCidr | Self::Quantity | Self::StorageSize => Some(64),
            Self::Version => Some(64),
            Self::ChannelName | Self::SizeName => Some(63),
            Self::ClusterName => None, // metadata.name: the API server bounds it
            Self::ImageRepository | Self::S3Endpoint => Some(255),
            Self::CronSchedule => Some(128),
            Self::BucketName => Some(63),
            Self::AuditLevel | Self::AuditStage | Self::AuditWebhookMode => Some(32),
            Self::DataKey => Some(253),
            Self::JwtIssuerUrl => Some(512),
            Self::EncryptedResource => Some(253),
            Self::KmsName => Some(63),
            Self::KmsEndpoint => Some(114),
            Self::AuthorizerType
            | Self::KmsTimeout
            | Self::WebhookTimeout
            | Self::GoDuration
            | Self::SubjectAccessReviewVersion
            | Self::MatchConditionVersion
            | Self::AuthorizerFailurePolicy
            | Self::WebhookConnectionType => Some(32),
            Self::Port
            | Self::FlagName
            | Self::Replicas { .. }
            | Self::Retention { .. }
            | Self::AuditRules
            | Self::AuditRule
            | Self::AuditPolicySource
            | Self::JwtAuthenticators
            | Self::JwtAudiences
            | Self::RequiredClaimMapping
            | Self::OptionalClaimMapping
            | Self::Authorizers
            | Self::AuthorizerWebhook
            | Self::ConfigurationSource
            | Self::EncryptedResources
            | Self::LabelSelectorRequirement => None,
        }
    }

    /// Checks one value; on failure the message of the first rule it breaks.
    ///
    /// # Errors
    /// The [`CelRule::message`] that the API server would report.
    pub fn check(self, value: &Value) -> Result<(), &'static str> {
        let rules = self.cel();
        let fail = |i: usize| Err(rules[i].message);
        let string = value.as_str();
        match self {
            Self::Port => match value.as_i64() {
                Some(p) if (1..=65535).contains(&p) => Ok(()),
                _ => fail(0),
            },
            Self::Replicas { max } | Self::Retention { max } => match value.as_i64() {
                Some(r) if (1..=max).contains(&r) => Ok(()),
                _ => fail(0),
            },
            Self::Host => match string {
                Some(s) if s.len() <= 253 && (parse_ip(s).is_some() || matches(&DNS_SUBDOMAIN, s)) => Ok(()),
                _ => fail(0),
            },
            Self::San => match string {
                Some(s) if s.len() <= 253 && (parse_ip(s).is_some() || matches(&WILDCARD_SUBDOMAIN, s)) => Ok(()),
                _ => fail(0),
            },
            Self::DnsDomain | Self::ObjectName => match string {
                Some(s) if s.len() <= 253 && matches(&DNS_SUBDOMAIN, s) => Ok(()),
                _ => fail(0),
            },
            Self::ServiceCidr => {
                let Some(net) = string.and_then(parse_cidr) else {
                    return fail(0);
                };
                let ok = match net {
                    ipnet::IpNet::V4(n) => (12..=30).contains(&n.prefix_len()),
                    ipnet::IpNet::V6(n) => (108..=126).contains(&n.prefix_len()),
                };
                if ok { Ok(()) } else { fail(2) }
            }
            Self::Quantity | Self::StorageSize => {
                let sign = match value {
                    Value::Number(n) => n.as_f64().map(|f| f.partial_cmp(&0.0)),
                    Value::String(s) if s.len() <= 64 && matches(QUANTITY, s) => Some(quantity_sign(s)),
                    _ => None,
                };
                let positive_required = self == Self::StorageSize;
                match sign.flatten() {
                    Some(std::cmp::Ordering::Greater) => Ok(()),
                    Some(std::cmp::Ordering::Equal) if !positive_required => Ok(()),
                    _ => fail(0),
                }
            }
            Self::Version => match string {
                Some(s) if s.len() <= 64 && matches(VERSION, s) => Ok(()),
                _ => fail(0),
            },
            Self::SizeName => match string {
                Some(s) if matches(SIZE_NAME, s) => Ok(()),
                _ => fail(0),
            },
            Self::ChannelName => match string {
                Some(s) if matches(CHANNEL_NAME, s) => Ok(()),
                _ => fail(0),
            },
            Self::FlagName => match value.as_object() {
                Some(map) if map.keys().all(|k| k.len() <= 128 && matches(FLAG_NAME, k)) => Ok(()),
                _ => fail(0),
            },
            Self::ClusterName => match string {
                Some(s) if s.len() <= MAX_CLUSTER_NAME && matches(RFC1035_LABEL, s) => Ok(()),
                _ => fail(0),
            },
            Self::ImageRepository => match string {
                Some(s) if s.len() <= 255 && matches(IMAGE_REPOSITORY, s) => Ok(()),
                _ => fail(0),
            },
            Self::CronSchedule => match string {
                Some(s) if s.len() <= 128 && matches(CRON, s) => Ok(()),
                _ => fail(0),
            },
            Self::S3Endpoint => match string {
                Some(s) if s.len() <= 255 && matches(S3_ENDPOINT, s) => Ok(()),
                _ => fail(0),
            },
            Self::BucketName => match string {
                Some(s) if matches(BUCKET, s) => Ok(()),
                _ => fail(0),
            },
            Self::AuditLevel => one_of(string, AUDIT_LEVELS).then_some(()).ok_or(rules[0].message),
            Self::AuditStage => one_of(string, AUDIT_STAGES).then_some(()).ok_or(rules[0].message),
            Self::AuditWebhookMode => one_of(string, AUDIT_WEBHOOK_MODES)
                .then_some(())
                .ok_or(rules[0].message),
            Self::AuditRules => match value.get("rules").and_then(Value::as_array) {
                Some(rules) if !rules.is_empty() => Ok(()),
                _ => fail(0),
            },
            Self::AuditRule => {
                let set = |field: &str| {
                    value
                        .get(field)
                        .and_then(Value::as_array)
                        .is_some_and(|l| !l.is_empty())
                };
                if set("nonResourceURLs") && (set("resources") || set("namespaces")) {
                    fail(0)
                } else {
                    Ok(())
                }
            }
            Self::AuditPolicySource => match (value.get("policy"), value.get("policyRef")) {
                (Some(a), Some(b)) if !a.is_null() && !b.is_null() => fail(0),
                _ => Ok(()),
            },
            Self::DataKey => match string {
                Some(s) if s.len() <= 253 && matches(DATA_KEY, s) => Ok(()),
                _ => fail(0),
            },
            Self::JwtAuthenticators => {
                let urls: Vec<Option<&str>> = value
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|a| a.pointer("/issuer/url").and_then(Value::as_str))
                    .collect();
                let distinct: std::collections::BTreeSet<_> = urls.iter().collect();
                if distinct.len() == urls.len() { Ok(()) } else { fail(0) }
            }
            Self::JwtIssuerUrl => match string {
                Some(s) if s.len() <= 512 && matches(ISSUER_URL, s) => Ok(()),
                _ => fail(0),
            },
            Self::JwtAudiences => match value.as_array() {
                Some(audiences) if !audiences.is_empty() => Ok(()),
                _ => fail(0),
            },
            Self::RequiredClaimMapping | Self::OptionalClaimMapping => {
                let has = |field: &str| value.get(field).is_some_and(|v| !v.is_null());
                let (claim, expression, prefix) = (has("claim"), has("expression"), has("prefix"));
                let first = match self {
                    Self::RequiredClaimMapping => claim != expression,
                    _ => !(claim && expression),
                };
                if !first {
                    fail(0)
                } else if claim && !prefix {
                    fail(1)
                } else if expression && prefix {
                    fail(2)
                } else {
                    Ok(())
                }
            }
            Self::Authorizers => {
                let items: Vec<&Value> = value.as_array().into_iter().flatten().collect();
                let field = |a: &Value, f: &str| a.get(f).and_then(Value::as_str).map(str::to_owned);
                let names: Vec<Option<String>> = items.iter().map(|a| field(a, "name")).collect();
                let distinct: std::collections::BTreeSet<_> = names.iter().collect();
                let count = |t: &str| items.iter().filter(|a| field(a, "type").as_deref() == Some(t)).count();
                if distinct.len() != names.len() {
                    fail(0)
                } else if count("Node") != 1 || count("RBAC") != 1 {
                    fail(1)
                } else {
                    Ok(())
                }
            }
            Self::AuthorizerWebhook => {
                let webhook_type = value.get("type").and_then(Value::as_str) == Some("Webhook");
                let has_webhook = value.get("webhook").is_some_and(|w| !w.is_null());
                if webhook_type == has_webhook { Ok(()) } else { fail(0) }
            }
            Self::AuthorizerType => one_of(string, AUTHORIZER_TYPES).then_some(()).ok_or(rules[0].message),
            Self::SubjectAccessReviewVersion => one_of(string, SAR_VERSIONS).then_some(()).ok_or(rules[0].message),
            Self::MatchConditionVersion => one_of(string, MATCH_CONDITION_VERSIONS)
                .then_some(())
                .ok_or(rules[0].message),
            Self::AuthorizerFailurePolicy => one_of(string, FAILURE_POLICIES).then_some(()).ok_or(rules[0].message),
            Self::WebhookConnectionType => one_of(string, CONNECTION_TYPES).then_some(()).ok_or(rules[0].message),
            Self::ConfigurationSource => {
                let has = |field: &str| value.get(field).is_some_and(|v| !v.is_null());
                if has("configuration") != has("configurationRef") {
                    Ok(())
                } else {
                    fail(0)
                }
            }
            Self::EncryptedResources => {
                let items: Vec<&Value> = value.as_array().into_iter().flatten().collect();
                let distinct: std::collections::BTreeSet<String> = items.iter().map(|v| v.to_string()).collect();
                if !items.iter().any(|r| r.as_str() == Some("secrets")) {
                    fail(0)
                } else if distinct.len() != items.len() {
                    fail(1)
                } else {
                    Ok(())
                }
            }
            Self::EncryptedResource => match string {
                Some(s) if s.len() <= 253 && matches(ENCRYPTED_RESOURCE, s) => {
                    if NON_REST_RESOURCES.contains(&s) {
                        fail(1)
                    } else if matches(EVENTS_GROUP, s) {
                        fail(2)
                    } else if matches(EXTENSIONS_GROUP, s) {
                        fail(3)
                    } else {
                        Ok(())
                    }
                }
                _ => fail(0),
            },
            Self::GoDuration => match string {
                Some(s) if s.len() <= 32 && matches(GO_DURATION, s) => Ok(()),
                _ => fail(0),
            },
            Self::KmsName => match string {
                Some(s) if s.len() <= 63 && matches(KMS_NAME, s) => Ok(()),
                _ => fail(0),
            },
            Self::KmsEndpoint => match string {
                Some(s) if s.len() <= 114 && matches(KMS_ENDPOINT, s) => Ok(()),
                _ => fail(0),
            },
            Self::LabelSelectorRequirement => {
                let values = value.get("values").and_then(Value::as_array).map_or(0, Vec::len);
                match value.get("operator").and_then(Value::as_str) {
                    Some("In" | "NotIn") if values > 0 => Ok(()),
                    Some("Exists" | "DoesNotExist") if values == 0 => Ok(()),
                    _ => fail(0),
                }
            }
            Self::WebhookTimeout | Self::KmsTimeout => match string
                .filter(|s| s.len() <= 32 && matches(GO_DURATION, s))
                .and_then(go_duration_nanos)
            {
                Some(nanos) if nanos > 0.0 && nanos <= 30e9 => Ok(()),
                _ => fail(0),
            },
        }
    }
}

/// The length of a Go duration that matched [`GO_DURATION`], in nanoseconds (what CEL's
/// `duration()` reads: Go's `time.ParseDuration`).
fn go_duration_nanos(value: &str) -> Option<f64> {
    static PART: LazyLock<regex::Regex> =
        LazyLock::new(|| regex::Regex::new("([0-9]+(?:\\.[0-9]*)?)(ns|us|ms|s|m|h)").expect("regex"));
    PART.captures_iter(value)
        .map(|c| {
            let number: f64 = c[1].parse().ok()?;
            let unit = match &c[2] {
                "ns" => 1.0,
                "us" => 1e3,
                "ms" => 1e6,
                "s" => 1e9,
                "m" => 60e9,
                _ => 3600e9,
            };
            Some(number * unit)
        })
        .sum()
}

/// CEL: `self` is one of `values`.
fn cel_one_of(values: &[&str]) -> String {
    let quoted: Vec<String> = values.iter().map(|v| format!("'{v}'")).collect();
    format!("self in [{}]", quoted.join(", "))
}

/// `value` is a string and one of `values`.
fn one_of(value: Option<&str>, values: &[&str]) -> bool {
    value.is_some_and(|v| values.contains(&v))
}

/// A regular expression as a CEL string literal (single-quoted; backslashes doubled). CEL's
/// `matches` uses RE2 syntax, which the `regex` crate shares for these patterns, so the
/// same pattern text is checked in both places.
fn cel_pattern(pattern: &str) -> String {
    pattern.replace('\\', "\\\\")
}

fn matches(pattern: &str, value: &str) -> bool {
    static CACHE: LazyLock<std::sync::Mutex<std::collections::HashMap<String, regex::Regex>>> =
        LazyLock::new(Default::default);
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    let re = cache
        .entry(pattern.to_string())
        .or_insert_with(|| regex::Regex::new(pattern).unwrap_or_else(|_| regex::Regex::new("$^").expect("regex")));
    re.is_match(value)
}

/// The sign of a quantity that matched [`QUANTITY`].
fn quantity_sign(s: &str) -> Option<std::cmp::Ordering> {
    let negative = s.starts_with('-');
    let digits_nonzero = s
        .trim_start_matches(['+', '-'])
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .any(|c| c.is_ascii_digit() && c != '0');
    Some(match (digits_nonzero, negative) {
        (false, _) => std::cmp::Ordering::Equal,
        (true, true) => std::cmp::Ordering::Less,
        (true, false) => std::cmp::Ordering::Greater,
    })
}

/// An IP address as Kubernetes' CEL `isIP` accepts it: IPv4 without leading zeros, IPv6
/// without a zone, and no IPv4-mapped IPv6 address.
pub fn parse_ip(s: &str) -> Option<IpAddr> {
    let ip: IpAddr = s.parse().ok()?;
    match ip {
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => None,
        IpAddr::V4(_) if s.split('.').any(|o| o.len() > 1 && o.starts_with('0')) => None,
        ip => Some(ip),
    }
}

/// A CIDR as Kubernetes' CEL `isCIDR` accepts it: a valid prefix, no bits set after it, and
/// the address rules of [`parse_ip`].
pub fn parse_cidr(s: &str) -> Option<ipnet::IpNet> {
    let (addr, len) = s.split_once('/')?;
    parse_ip(addr)?;
    if len.is_empty() || !len.chars().all(|c| c.is_ascii_digit()) || (len.len() > 1 && len.starts_with('0')) {
        return None;
    }
    let net: ipnet::IpNet = s.parse().ok()?;
    (net.trunc() == net).then_some(net)
}

/// Where a rule applies.
#[derive(Clone, Copy, Debug)]
pub struct Rule {
    /// The kinds that have the field.
    pub kinds: &'static [Kind],
    /// Path of the field: dot-separated property names; a `[]` suffix means every item of a
    /// list, `{}` every value of a map. `metadata.name` is the object's name.
    pub path: &'static str,
    pub syntax: Syntax,
}

impl Rule {
    /// Short stable reason of a value this rule refuses: its syntax's
    /// ([`Syntax::reason`]), except schedules, which are named after what they schedule, and
    /// the shared syntaxes of `spec.authentication` and `spec.authorization`, named after
    /// the setting they are part of.
    pub fn reason(&self) -> &'static str {
        match (self.syntax, self.path) {
            (Syntax::ConfigurationSource | Syntax::DataKey, path) if path.starts_with("spec.authorization") => {
                "InvalidAuthorization"
            }
            (Syntax::DataKey, path) if path.starts_with("spec.authentication") => "InvalidAuthentication",
            (Syntax::CronSchedule, "spec.encryption.keyRotationSchedule") => "InvalidKeyRotationSchedule",
            (Syntax::CronSchedule, "spec.defragmentation.schedule") => "InvalidDefragmentationSchedule",
            (Syntax::CronSchedule, "spec.hibernation.schedules[].start" | "spec.hibernation.schedules[].end") => {
                "InvalidHibernationSchedule"
            }
            (syntax, _) => syntax.reason(),
        }
    }
}

const NCP: &[Kind] = &[Kind::NestedControlPlane];
const COMPONENTS: &[Kind] = &[Kind::NestedEtcd, Kind::NestedAPIServer, Kind::NestedControllerManager];
const APISERVER: &[Kind] = &[Kind::NestedAPIServer];
const ALL: &[Kind] = &[
    Kind::NestedControlPlane,
    Kind::NestedEtcd,
    Kind::NestedAPIServer,
    Kind::NestedControllerManager,
];

/// The table: every field with a syntax, on every kind that has it.
pub const RULES: &[Rule] = &[
    Rule {
        kinds: NCP,
        path: "metadata.name",
        syntax: Syntax::ClusterName,
    },
    Rule {
        kinds: ALL,
        path: "spec.version",
        syntax: Syntax::Version,
    },
    Rule {
        kinds: ALL,
        path: "spec.channel",
        syntax: Syntax::ChannelName,
    },
    Rule {
        kinds: ALL,
        path: "spec.size",
        syntax: Syntax::SizeName,
    },
    Rule {
        kinds: NCP,
        path: "spec.replicas",
        syntax: Syntax::Replicas { max: MAX_REPLICAS },
    },
    Rule {
        kinds: &[Kind::NestedAPIServer, Kind::NestedControllerManager],
        path: "spec.replicas",
        syntax: Syntax::Replicas { max: MAX_REPLICAS },
    },
    Rule {
        kinds: &[Kind::NestedEtcd],
        path: "spec.replicas",
        syntax: Syntax::Replicas { max: MAX_ETCD_MEMBERS },
    },
    Rule {
        kinds: NCP,
        path: "spec.imageRepository",
        syntax: Syntax::ImageRepository,
    },
    Rule {
        kinds: NCP,
        path: "spec.certSANs[]",
        syntax: Syntax::San,
    },
    Rule {
        kinds: NCP,
        path: "spec.clusterNetwork.services.cidrBlocks[]",
        syntax: Syntax::ServiceCidr,
    },
    Rule {
        kinds: NCP,
        path: "spec.clusterNetwork.serviceDomain",
        syntax: Syntax::DnsDomain,
    },
    Rule {
        kinds: NCP,
        path: "spec.controlPlaneEndpoint.host",
        syntax: Syntax::Host,
    },
    Rule {
        kinds: NCP,
        path: "spec.controlPlaneEndpoint.port",
        syntax: Syntax::Port,
    },
    Rule {
        kinds: NCP,
        path: "spec.etcd.name",
        syntax: Syntax::ObjectName,
    },
    Rule {
        kinds: NCP,
        path: "spec.apiserver.name",
        syntax: Syntax::ObjectName,
    },
    Rule {
        kinds: NCP,
        path: "spec.controllerManager.name",
        syntax: Syntax::ObjectName,
    },
    Rule {
        kinds: COMPONENTS,
        path: "spec.resources.requests{}",
        syntax: Syntax::Quantity,
    },
    Rule {
        kinds: COMPONENTS,
        path: "spec.resources.limits{}",
        syntax: Syntax::Quantity,
    },
    Rule {
        kinds: COMPONENTS,
        path: "spec.extraArgs",
        syntax: Syntax::FlagName,
    },
    Rule {
        kinds: &[Kind::NestedEtcd],
        path: "spec.storage.size",
        syntax: Syntax::StorageSize,
    },
    Rule {
        kinds: &[Kind::NestedEtcd],
        path: "spec.storage.quotaBackendBytes",
        syntax: Syntax::StorageSize,
    },
    Rule {
        kinds: &[Kind::NestedEtcd],
        path: "spec.storage.storageClassName",
        syntax: Syntax::ObjectName,
    },
    Rule {
        kinds: &[Kind::NestedEtcd],
        path: "spec.backup.schedule",
        syntax: Syntax::CronSchedule,
    },
    Rule {
        kinds: NCP,
        path: "spec.encryption.keyRotationSchedule",
        syntax: Syntax::CronSchedule,
    },
    Rule {
        kinds: NCP,
        path: "spec.encryption.resources",
        syntax: Syntax::EncryptedResources,
    },
    Rule {
        kinds: NCP,
        path: "spec.encryption.resources[]",
        syntax: Syntax::EncryptedResource,
    },
    Rule {
        kinds: NCP,
        path: "spec.encryption.kms.name",
        syntax: Syntax::KmsName,
    },
    Rule {
        kinds: NCP,
        path: "spec.encryption.kms.endpoint",
        syntax: Syntax::KmsEndpoint,
    },
    Rule {
        kinds: NCP,
        path: "spec.encryption.kms.timeout",
        syntax: Syntax::KmsTimeout,
    },
    Rule {
        kinds: NCP,
        path: "spec.workloads.nodes.selector.matchExpressions[]",
        syntax: Syntax::LabelSelectorRequirement,
    },
    Rule {
        kinds: NCP,
        path: "spec.hibernation.schedules[].start",
        syntax: Syntax::CronSchedule,
    },
    Rule {
        kinds: NCP,
        path: "spec.hibernation.schedules[].end",
        syntax: Syntax::CronSchedule,
    },
    Rule {
        kinds: &[Kind::NestedEtcd],
        path: "spec.defragmentation.schedule",
        syntax: Syntax::CronSchedule,
    },
    Rule {
        kinds: &[Kind::NestedEtcd],
        path: "spec.backup.retention",
        syntax: Syntax::Retention {
            max: crate::api::MAX_RETENTION,
        },
    },
    Rule {
        kinds: &[Kind::NestedEtcd],
        path: "spec.backup.destination.endpoint",
        syntax: Syntax::S3Endpoint,
    },
    Rule {
        kinds: &[Kind::NestedEtcd],
        path: "spec.backup.destination.bucket",
        syntax: Syntax::BucketName,
    },
    Rule {
        kinds: &[Kind::NestedEtcd],
        path: "spec.backup.destination.credentialsSecret.name",
        syntax: Syntax::ObjectName,
    },
    Rule {
        kinds: &[Kind::NestedEtcd],
        path: "spec.restore.source.endpoint",
        syntax: Syntax::S3Endpoint,
    },
    Rule {
        kinds: &[Kind::NestedEtcd],
        path: "spec.restore.source.bucket",
        syntax: Syntax::BucketName,
    },
    Rule {
        kinds: &[Kind::NestedEtcd],
        path: "spec.restore.source.credentialsSecret.name",
        syntax: Syntax::ObjectName,
    },
    // NestedAPIServer `spec.audit` (issue 39 item 2); a referenced policy is checked
    // against the `spec.audit.policy` rules too (crate::plan::audit).
    Rule {
        kinds: APISERVER,
        path: "spec.audit",
        syntax: Syntax::AuditPolicySource,
    },
    Rule {
        kinds: APISERVER,
        path: "spec.audit.policy",
        syntax: Syntax::AuditRules,
    },
    Rule {
        kinds: APISERVER,
        path: "spec.audit.policy.omitStages[]",
        syntax: Syntax::AuditStage,
    },
    Rule {
        kinds: APISERVER,
        path: "spec.audit.policy.rules[]",
        syntax: Syntax::AuditRule,
    },
    Rule {
        kinds: APISERVER,
        path: "spec.audit.policy.rules[].level",
        syntax: Syntax::AuditLevel,
    },
    Rule {
        kinds: APISERVER,
        path: "spec.audit.policy.rules[].omitStages[]",
        syntax: Syntax::AuditStage,
    },
    Rule {
        kinds: APISERVER,
        path: "spec.audit.policyRef.name",
        syntax: Syntax::ObjectName,
    },
    Rule {
        kinds: APISERVER,
        path: "spec.audit.policyRef.key",
        syntax: Syntax::DataKey,
    },
    Rule {
        kinds: APISERVER,
        path: "spec.audit.webhook.configSecretRef.name",
        syntax: Syntax::ObjectName,
    },
    Rule {
        kinds: APISERVER,
        path: "spec.audit.webhook.configSecretRef.key",
        syntax: Syntax::DataKey,
    },
    Rule {
        kinds: APISERVER,
        path: "spec.audit.webhook.mode",
        syntax: Syntax::AuditWebhookMode,
    },
    // NestedAPIServer `spec.authentication` (issue 39 item 1): what kube-apiserver checks of
    // an AuthenticationConfiguration that can be checked without its release (the CEL
    // expressions are compiled by kube-apiserver only).
    Rule {
        kinds: APISERVER,
        path: "spec.authentication",
        syntax: Syntax::ConfigurationSource,
    },
    Rule {
        kinds: APISERVER,
        path: "spec.authentication.configurationRef.name",
        syntax: Syntax::ObjectName,
    },
    Rule {
        kinds: APISERVER,
        path: "spec.authentication.configurationRef.key",
        syntax: Syntax::DataKey,
    },
    Rule {
        kinds: APISERVER,
        path: "spec.authentication.configuration.jwt",
        syntax: Syntax::JwtAuthenticators,
    },
    Rule {
        kinds: APISERVER,
        path: "spec.authentication.configuration.jwt[].issuer.url",
        syntax: Syntax::JwtIssuerUrl,
    },
    Rule {
        kinds: APISERVER,
        path: "spec.authentication.configuration.jwt[].issuer.audiences",
        syntax: Syntax::JwtAudiences,
    },
    Rule {
        kinds: APISERVER,
        path: "spec.authentication.configuration.jwt[].claimMappings.username",
        syntax: Syntax::RequiredClaimMapping,
    },
    Rule {
        kinds: APISERVER,
        path: "spec.authentication.configuration.jwt[].claimMappings.groups",
        syntax: Syntax::OptionalClaimMapping,
    },
    // NestedAPIServer `spec.authorization` (issue 39 item 1): what kube-apiserver checks of
    // an AuthorizationConfiguration at start (pkg/apis/apiserver/validation), and capn's
    // own limits (Node and RBAC kept, no InClusterConfig).
    Rule {
        kinds: APISERVER,
        path: "spec.authorization",
        syntax: Syntax::ConfigurationSource,
    },
    Rule {
        kinds: APISERVER,
        path: "spec.authorization.configurationRef.name",
        syntax: Syntax::ObjectName,
    },
    Rule {
        kinds: APISERVER,
        path: "spec.authorization.configurationRef.key",
        syntax: Syntax::DataKey,
    },
    Rule {
        kinds: APISERVER,
        path: "spec.authorization.configuration.authorizers",
        syntax: Syntax::Authorizers,
    },
    Rule {
        kinds: APISERVER,
        path: "spec.authorization.configuration.authorizers[]",
        syntax: Syntax::AuthorizerWebhook,
    },
    Rule {
        kinds: APISERVER,
        path: "spec.authorization.configuration.authorizers[].type",
        syntax: Syntax::AuthorizerType,
    },
    Rule {
        kinds: APISERVER,
        path: "spec.authorization.configuration.authorizers[].name",
        syntax: Syntax::ObjectName,
    },
    Rule {
        kinds: APISERVER,
        path: "spec.authorization.configuration.authorizers[].webhook.timeout",
        syntax: Syntax::WebhookTimeout,
    },
    Rule {
        kinds: APISERVER,
        path: "spec.authorization.configuration.authorizers[].webhook.authorizedTTL",
        syntax: Syntax::GoDuration,
    },
    Rule {
        kinds: APISERVER,
        path: "spec.authorization.configuration.authorizers[].webhook.unauthorizedTTL",
        syntax: Syntax::GoDuration,
    },
    Rule {
        kinds: APISERVER,
        path: "spec.authorization.configuration.authorizers[].webhook.subjectAccessReviewVersion",
        syntax: Syntax::SubjectAccessReviewVersion,
    },
    Rule {
        kinds: APISERVER,
        path: "spec.authorization.configuration.authorizers[].webhook.matchConditionSubjectAccessReviewVersion",
        syntax: Syntax::MatchConditionVersion,
    },
    Rule {
        kinds: APISERVER,
        path: "spec.authorization.configuration.authorizers[].webhook.failurePolicy",
        syntax: Syntax::AuthorizerFailurePolicy,
    },
    Rule {
        kinds: APISERVER,
        path: "spec.authorization.configuration.authorizers[].webhook.connectionInfo.type",
        syntax: Syntax::WebhookConnectionType,
    },
    Rule {
        kinds: APISERVER,
        path: "spec.authorization.configuration.authorizers[].webhook.connectionInfo.kubeConfigSecretRef.name",
        syntax: Syntax::ObjectName,
    },
    Rule {
        kinds: APISERVER,
        path: "spec.authorization.configuration.authorizers[].webhook.connectionInfo.kubeConfigSecretRef.key",
        syntax: Syntax::DataKey,
    },
];

/// Upper bounds on list and map sizes (OpenAPI `maxItems`/`maxProperties`), which keep the
/// CEL cost of the rules on their items bounded.
pub const SIZE_BOUNDS: &[(&str, &str, i64)] = &[
    ("spec.certSANs", "maxItems", 64),
    ("spec.clusterNetwork.services.cidrBlocks", "maxItems", 2),
    ("spec.extraArgs", "maxProperties", 64),
    ("spec.resources.requests", "maxProperties", 16),
    ("spec.resources.limits", "maxProperties", 16),
    ("spec.audit.policy.rules", "maxItems", 256),
    ("spec.audit.policy.omitStages", "maxItems", 4),
    ("spec.audit.policy.rules[].omitStages", "maxItems", 4),
    ("spec.authentication.configuration.jwt", "maxItems", 64),
    ("spec.authorization.configuration.authorizers", "maxItems", 16),
    (
        "spec.authorization.configuration.authorizers[].webhook.matchConditions",
        "maxItems",
        64,
    ),
    ("spec.hibernation.schedules", "maxItems", 8),
    ("spec.encryption.resources", "maxItems", 64),
    (
        "spec.authentication.configuration.jwt[].issuer.audiences",
        "maxItems",
        16,
    ),
];

/// A field that breaks its rule.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind} {name}: {path}: Invalid value: {value}: {message}")]
pub struct FieldError {
    /// The kind of the object.
    pub kind: &'static str,
    /// The object's name.
    pub name: String,
    /// Where: `spec.certSANs[2]`, `spec.resources.requests[cpu]`.
    pub path: String,
    /// The value, as JSON.
    pub value: String,
    /// What is allowed (the CEL rule's message).
    pub message: &'static str,
    /// Short stable reason ([`Syntax::reason`]).
    pub reason: &'static str,
}

impl FieldError {
    /// Short stable reason, used as condition reason, Event reason and metric label.
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

/// Checks every rule of `kind` against `object` (the whole object as JSON: `metadata` and
/// `spec`); returns every field that breaks one, in table order.
pub fn check_object(kind: Kind, object: &Value) -> Vec<FieldError> {
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let mut errors = Vec::new();
    for rule in RULES.iter().filter(|r| r.kinds.contains(&kind)) {
        let mut found = Vec::new();
        collect(object, rule.path, String::new(), &mut found);
        for (path, value) in found {
            if value.is_null() {
                continue;
            }
            if let Err(message) = rule.syntax.check(value) {
                errors.push(FieldError {
                    kind: kind.as_str(),
                    name: name.clone(),
                    path,
                    value: value.to_string(),
                    message,
                    reason: rule.reason(),
                });
            }
        }
    }
    errors
}

/// Checks one value that does not come from the object's own field (the cluster name from
/// a label or a Cluster API `Cluster`, the service CIDR from the `Cluster`'s
/// `clusterNetwork`) against `syntax`, reporting it under `path`.
///
/// # Errors
/// The [`FieldError`].
pub fn check_value(kind: Kind, name: &str, path: &str, syntax: Syntax, value: &str) -> Result<(), FieldError> {
    let json = Value::from(value);
    syntax.check(&json).map_err(|message| FieldError {
        kind: kind.as_str(),
        name: name.to_string(),
        path: path.to_string(),
        value: json.to_string(),
        message,
        reason: syntax.reason(),
    })
}

/// Every value at `path` below `value`, with its concrete path.
fn collect<'a>(value: &'a Value, path: &str, prefix: String, out: &mut Vec<(String, &'a Value)>) {
    let (head, rest) = match path.split_once('.') {
        Some((h, r)) => (h, Some(r)),
        None => (path, None),
    };
    let join = |p: &str| {
        if prefix.is_empty() {
            p.to_string()
        } else {
            format!("{prefix}.{p}")
        }
    };
    let (field, each) = if let Some(f) = head.strip_suffix("[]") {
        (f, Some('['))
    } else if let Some(f) = head.strip_suffix("{}") {
        (f, Some('{'))
    } else {
        (head, None)
    };
    let Some(child) = value.get(field) else {
        return;
    };
    let here = join(field);
    let mut targets: Vec<(String, &Value)> = Vec::new();
    match (each, child) {
        (None, v) => targets.push((here, v)),
        (Some('['), Value::Array(items)) => {
            for (i, v) in items.iter().enumerate() {
                targets.push((format!("{here}[{i}]"), v));
            }
        }
        (Some('{'), Value::Object(map)) => {
            for (k, v) in map {
                targets.push((format!("{here}[{k}]"), v));
            }
        }
        _ => {}
    }
    for (p, v) in targets {
        match rest {
            Some(r) => collect(v, r, p, out),
            None => out.push((p, v)),
        }
    }
}

/// Adds the table's rules for `kind` to a CRD's `openAPIV3Schema` (as JSON): `maxLength`,
/// list and map bounds, and `x-kubernetes-validations` with each rule's message. Rules on
/// `metadata.name` go on the root schema (CEL may read `self.metadata.name` there), their
/// message prefixed with the field.
pub fn extend_schema(kind: Kind, schema: &mut Value) {
    for rule in RULES.iter().filter(|r| r.kinds.contains(&kind)) {
        if let Some(field) = rule.path.strip_prefix("metadata.") {
            let list = validations(schema);
            for cel in rule.syntax.cel() {
                // The API server accepts no `fieldPath` into `metadata` (its schema has no
                // properties), so the message names the field.
                list.push(serde_json::json!({
                    "rule": cel.rule.replace("self", &format!("self.metadata.{field}")),
                    "message": format!("metadata.{field}: {}", cel.message),
                    "reason": "FieldValueInvalid",
                }));
            }
            continue;
        }
        let Some(target) = schema_at(schema, rule.path) else {
            continue;
        };
        // Replica bounds replace the schema's own `minimum` (the message says both ends).
        if let Some(o) = target.as_object_mut() {
            o.remove("minimum");
        }
        if let Some(max) = rule.syntax.max_length() {
            target["maxLength"] = max.into();
        }
        let list = validations(target);
        for cel in rule.syntax.cel() {
            list.push(serde_json::json!({"rule": cel.rule, "message": cel.message}));
        }
    }
    for (path, keyword, bound) in SIZE_BOUNDS {
        if let Some(target) = schema_at(schema, path) {
            target[*keyword] = (*bound).into();
        }
    }
    // extraArgs values: bounded, so a rule over the map stays within the CEL cost budget.
    if let Some(values) = schema_at(schema, "spec.extraArgs").and_then(|s| s.get_mut("additionalProperties")) {
        values["maxLength"] = 4096.into();
    }
}

fn validations(schema: &mut Value) -> &mut Vec<Value> {
    if !schema.get("x-kubernetes-validations").is_some_and(Value::is_array) {
        schema["x-kubernetes-validations"] = Value::Array(Vec::new());
    }
    match schema.get_mut("x-kubernetes-validations") {
        Some(Value::Array(list)) => list,
        _ => unreachable!("set above"),
    }
}

/// The schema node of `path` (see [`Rule::path`]).
pub(crate) fn schema_at<'a>(schema: &'a mut Value, path: &str) -> Option<&'a mut Value> {
    let mut node = schema;
    for segment in path.split('.') {
        let (field, each) = if let Some(f) = segment.strip_suffix("[]") {
            (f, Some("items"))
        } else if let Some(f) = segment.strip_suffix("{}") {
            (f, Some("additionalProperties"))
        } else {
            (segment, None)
        };
        node = node.get_mut("properties")?.get_mut(field)?;
        if let Some(key) = each {
            node = node.get_mut(key)?;
        }
    }
    Some(node)
}

#[cfg(test)]
mod tests;
