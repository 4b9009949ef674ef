//! `plan`: the pure heart of a reconcile (docs/design.md §4). For one component it resolves the
//! channel and release, renders the templates, applies `extraArgs` and the user's
//! patches, checks the result, and labels and owns every object. The controllers, `capn
//! render` and the unit tests all call [`plan`]: one code path, three callers.
//!
//! Pure: no client, no clock, no randomness. Nothing is applied unless the whole set planned.

pub mod audit;
pub mod authentication;
pub mod authorization;
mod channel_check;
mod context;
mod digest;
pub mod etcd_quota;
mod labels;
pub mod policy;
pub mod reference;
mod rules;
pub mod size;

pub use channel_check::validate_channel;
pub use context::*;
pub use digest::{
    CERTIFICATES_DIGEST_ANNOTATION, DIGEST_PLACEHOLDER, certificates_digest, mounted_secrets, stamp_certificates_digest,
};
pub use labels::{MANAGED_BY, selector_labels, standard_labels};
pub use policy::{CapnPods, NetworkPolicySettings};
pub use rules::{Resolved, Running, SkewError, check, check_members, resolve};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use semver::Version;

use crate::api::{ComponentSpec, EtcdStorage, InventoryEntry};
use crate::apply::applyset::{PART_OF_LABEL, applyset_id, contains_group_kinds, group_kind};
use crate::channel::{ChannelError, ChannelRegistry};
use crate::component::ComponentKind;
use crate::patch::{PatchError, apply_extra_args, apply_patches};
use crate::pki::SecretNames;
use crate::render::{RenderError, render_templates_in};
use crate::validate as field_rules;

/// Secure port of the nested apiserver.
pub const APISERVER_PORT: i32 = 6443;
/// Default tenant service CIDR (kubeadm's default).
pub const DEFAULT_SERVICE_CIDR: &str = "10.96.0.0/12";
/// Default tenant and super cluster DNS domain.
pub const DEFAULT_DNS_DOMAIN: &str = "cluster.local";
/// Default image registry.
pub const DEFAULT_IMAGE_REPOSITORY: &str = "registry.k8s.io";
/// Default size of each etcd member's volume.
pub const DEFAULT_ETCD_STORAGE: &str = "1Gi";

/// The cluster-wide settings a component is planned with, gathered from the
/// NestedControlPlane (and the CAPI Cluster when one owns it).
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterSettings {
    /// Cluster name: the owning CAPI Cluster's name, or the NestedControlPlane's.
    pub name: String,
    pub namespace: String,
    /// NestedControlPlane `spec.version` (exact, partial or none).
    pub kubernetes_version: Option<String>,
    /// NestedControlPlane `spec.channel`.
    pub channel: Option<String>,
    /// NestedControlPlane `spec.size` (a component's own `size` wins).
    pub size: Option<String>,
    pub image_repository: String,
    pub service_cidr: String,
    pub dns_domain: String,
    /// DNS domain of the super cluster (the names tenant pods get there).
    pub super_dns_domain: String,
    /// Who the NetworkPolicies admit besides the control plane itself.
    pub network_policy: NetworkPolicySettings,
    /// The KMS v2 plugins' socket endpoints (`unix:///var/run/kmsplugin/socket.sock`) the
    /// apiservers must reach: `spec.encryption.kms`'s and those the configuration in
    /// `<c>-encryption` still holds (`status.encryption.kms`).
    pub kms_endpoints: Vec<String>,
}

/// One component resource to plan.
#[derive(Clone, Debug)]
pub struct ComponentRequest<'a> {
    pub kind: ComponentKind,
    /// Name of the component resource (NestedEtcd, ...).
    pub resource_name: &'a str,
    pub spec: &'a ComponentSpec,
    /// etcd only.
    pub etcd_storage: Option<&'a EtcdStorage>,
    /// etcd only: a restore that is pending (checked by the controller first).
    pub etcd_restore: Option<&'a context::RestoreVars>,
    /// Controller reference to the component resource, put on every object.
    pub owner: OwnerReference,
    /// Releases running now, which the version rules compare against.
    pub running: Running,
    /// apiserver only: `spec.audit` and the policy it references, read by the caller.
    pub audit: Option<AuditRequest<'a>>,
    /// apiserver only: `spec.authentication`.
    pub authentication: Option<&'a crate::api::ApiServerAuthentication>,
    /// apiserver only: `spec.authorization`.
    pub authorization: Option<&'a crate::api::ApiServerAuthorization>,
    /// apiserver only: the configurations the `configurationRef`s of `authentication` and
    /// `authorization` name, read and checked by the caller.
    pub referenced: ReferencedConfigurations<'a>,
}

/// The configurations a NestedAPIServer's `configurationRef`s name, as the caller (the
/// controller, `capn render`) read them and checked them with
/// [`authentication::referenced_configuration`] and
/// [`authorization::referenced_configuration`]; `None` where no `configurationRef` is set.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReferencedConfigurations<'a> {
    pub authentication: Option<&'a crate::api::AuthenticationConfiguration>,
    pub authorization: Option<&'a crate::api::AuthorizationConfiguration>,
}

/// The audit settings of a NestedAPIServer to plan ([`audit`]).
#[derive(Clone, Copy, Debug)]
pub struct AuditRequest<'a> {
    /// `spec.audit`.
    pub spec: &'a crate::api::ApiServerAudit,
    /// The policy `spec.audit.policyRef` names, read and checked with
    /// [`audit::referenced_policy`]; `None` without `policyRef`.
    pub referenced: Option<&'a crate::api::AuditPolicy>,
}

/// Outputs of earlier components that a later one is rendered against.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Upstream {
    /// etcd client URLs, as NestedEtcd published them (apiserver only).
    pub etcd_endpoints: Vec<String>,
    /// etcd only: the membership of a running etcd, as capn read it from etcd and the step it
    /// takes; `None` renders a new cluster of `spec.replicas` members.
    pub etcd_membership: Option<EtcdMembership>,
}

/// What an etcd with members renders: how many pods, and what a member starting with an
/// empty data directory reads (the `<c>-etcd-membership` ConfigMap).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EtcdMembership {
    /// `spec.replicas` of the StatefulSet: follows the member list one step at a time, not
    /// `spec.replicas` of the NestedEtcd.
    pub statefulset_replicas: i32,
    /// Every member etcd lists, by name and peer URL, including a learner not started yet
    /// (`--initial-cluster`).
    pub members: Vec<EtcdMember>,
    /// `new` or `existing` (`--initial-cluster-state`).
    pub initial_cluster_state: InitialClusterState,
}

/// etcd's `--initial-cluster-state`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InitialClusterState {
    #[default]
    /// Bootstrap: a member with an empty data directory forms the cluster with the listed
    /// members, or refuses to start when the others report it bootstrapped already.
    New,
    /// Join: a member with an empty data directory joins the running cluster as the member
    /// whose peer URL it advertises.
    Existing,
}

impl InitialClusterState {
    /// The flag's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::New => "new",
            Self::Existing => "existing",
        }
    }
}

/// The complete desired state of one component.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub kind: ComponentKind,
    /// Channel the objects were rendered from.
    pub channel: String,
    /// Resolved release.
    pub version: Version,
    pub replicas: i32,
    /// Every object to apply, labelled and owned, in template order.
    pub objects: Vec<serde_json::Value>,
    /// etcd only: the client URL of every member, in member order.
    pub etcd_endpoints: Vec<String>,
    /// The Secrets the pod templates mount whose content the processes read only at
    /// start (every mounted Secret but the channel's `reloadedSecrets`), sorted: their
    /// digest is the pod templates' [`CERTIFICATES_DIGEST_ANNOTATION`] (docs/design.md §9).
    pub startup_secrets: Vec<String>,
}

impl Plan {
    /// The KEP-3659 `contains-group-kinds` of [`Plan::objects`]: their group-kinds, sorted and
    /// comma-separated.
    pub fn contains_group_kinds(&self) -> String {
        let group_kinds: Vec<String> = self
            .objects
            .iter()
            .map(|o| {
                let field = |p: &str| o.pointer(p).and_then(|v| v.as_str()).unwrap_or_default();
                group_kind(field("/apiVersion"), field("/kind"))
            })
            .collect();
        contains_group_kinds(group_kinds.iter().map(String::as_str))
    }

    /// The inventory entries of [`Plan::objects`], sorted.
    pub fn inventory(&self) -> Vec<InventoryEntry> {
        let mut entries: Vec<InventoryEntry> = self.objects.iter().map(inventory_entry).collect();
        entries.sort();
        entries
    }
}

/// The inventory entry of one object.
pub fn inventory_entry(object: &serde_json::Value) -> InventoryEntry {
    let s = |p: &str| {
        object
            .pointer(p)
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string()
    };
    InventoryEntry {
        api_version: s("/apiVersion"),
        kind: s("/kind"),
        name: s("/metadata/name"),
    }
}

/// Why a component could not be planned. Every variant is terminal: the spec, the
/// channel or a patch must change; nothing is applied meanwhile.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum PlanError {
    #[error(transparent)]
    Channel(#[from] ChannelError),
    #[error(transparent)]
    Render(#[from] RenderError),
    #[error(transparent)]
    Patch(#[from] PatchError),
    #[error(transparent)]
    Skew(#[from] SkewError),
    #[error("replicas must be at least 1, got {0}")]
    InvalidReplicas(i32),
    /// `certificateValidityPeriod` or `rolloutBefore` of the control plane is unusable.
    #[error("{0}")]
    InvalidCertificateValidity(String),
    #[error("the apiserver needs the etcd endpoints, and NestedEtcd has published none yet")]
    NoEtcdEndpoints,
    /// A field breaks its rule (crate::validate): the same reason and message the API
    /// server gives at admission.
    #[error(transparent)]
    Field(#[from] crate::validate::FieldError),
    /// `spec.audit.policyRef` or a `configurationRef` names a ConfigMap or key that is
    /// missing, or a document that is invalid.
    #[error(transparent)]
    Reference(#[from] reference::ReferenceError),
    #[error("rendered {kind}/{name} {message}")]
    InvalidObject {
        kind: String,
        name: String,
        message: String,
    },
}

impl PlanError {
    /// Short stable reason, used as condition reason, Event reason and metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Channel(e) => e.reason(),
            Self::Render(e) => e.reason(),
            Self::Patch(e) => e.reason(),
            Self::Skew(e) => e.reason(),
            Self::InvalidReplicas(_) => "InvalidReplicas",
            Self::InvalidCertificateValidity(_) => "InvalidCertificateValidityPeriod",
            Self::NoEtcdEndpoints => "WaitingForEtcd",
            Self::Field(e) => e.reason(),
            Self::Reference(e) => e.reason,
            Self::InvalidObject { .. } => "InvalidObject",
        }
    }
}

/// The ApplySet id of a component resource (its objects' `applyset.kubernetes.io/part-of`).
pub fn component_applyset_id(kind: ComponentKind, resource_name: &str, namespace: &str) -> String {
    applyset_id(
        resource_name,
        namespace,
        kind.resource_kind(),
        crate::api::CONTROL_PLANE_GROUP,
    )
}

/// The plan of the first round of a component that does not exist yet: `request` planned as
/// the component will plan it, against the upstream outputs of a new etcd (the apiserver
/// needs etcd endpoints; which ones changes neither the kinds nor the Services it renders).
/// The control plane creates its components with what this tells in advance, so that their
/// first round sends fewer requests: each is created already labelled as the
/// parent of its ApplySet ([`Plan::contains_group_kinds`]), and the control plane's endpoint
/// is known when the apiserver's Service will be rendered.
///
/// `None` when `request` cannot be planned; the component then labels itself, as it does
/// whenever its planned kinds differ from what its parent says, and the endpoint waits for
/// the apiserver's Service.
pub fn first_plan(
    channels: &ChannelRegistry,
    cluster: &ClusterSettings,
    request: &ComponentRequest<'_>,
) -> Option<Plan> {
    let upstream = Upstream {
        etcd_endpoints: etcd_members(&cluster.name, &cluster.namespace, 1)
            .into_iter()
            .map(|m| m.client_url)
            .collect(),
        etcd_membership: None,
    };
    plan(channels, cluster, request, &upstream).ok()
}

/// The etcd members of `cluster` with `replicas` members (docs/reference.md: per-member names
/// under the headless Service `<c>-etcd`).
pub fn etcd_members(cluster: &str, namespace: &str, replicas: i32) -> Vec<EtcdMember> {
    let service = ComponentKind::Etcd.object_name(cluster);
    (0..replicas.max(0))
        .map(|i| {
            let name = format!("{service}-{i}");
            let host = format!("{name}.{service}.{namespace}.svc");
            EtcdMember {
                peer_url: format!("https://{host}:2380"),
                client_url: format!("https://{host}:2379"),
                name,
                host,
            }
        })
        .collect()
}

/// Checks the field rules ([`crate::validate`]) of what a component is planned from: the
/// cluster settings it inherits (cluster name, service CIDR, DNS domain, image repository,
/// the control plane's version and channel; they may come from a Cluster API `Cluster` or a
/// label, which admission never saw) and the component's own spec.
///
/// # Errors
/// [`PlanError::Field`] for the first field that breaks its rule.
pub fn check_input(
    cluster: &ClusterSettings,
    kind: ComponentKind,
    resource_name: &str,
    spec: &ComponentSpec,
    etcd_storage: Option<&EtcdStorage>,
) -> Result<(), PlanError> {
    check_cluster(cluster)?;
    let mut object = serde_json::json!({
        "metadata": {"name": resource_name},
        "spec": serde_json::to_value(spec).unwrap_or_default(),
    });
    if let Some(storage) = etcd_storage {
        object["spec"]["storage"] = serde_json::to_value(storage).unwrap_or_default();
    }
    let rules_of = match kind {
        ComponentKind::Etcd => field_rules::Kind::NestedEtcd,
        ComponentKind::ApiServer => field_rules::Kind::NestedAPIServer,
        ComponentKind::ControllerManager => field_rules::Kind::NestedControllerManager,
    };
    if let Some(e) = field_rules::check_object(rules_of, &object).into_iter().next() {
        return Err(e.into());
    }
    // A rule across two fields (the quota against the volume), which the table of single
    // fields cannot say. It concerns the explicit fields only, so the size's ceiling does
    // not matter here.
    if kind == ComponentKind::Etcd {
        etcd_quota::quota_backend_bytes(etcd_storage, DEFAULT_ETCD_STORAGE, None, resource_name)?;
    }
    Ok(())
}

/// The field rules of the settings a component inherits from its control plane, reported
/// under the NestedControlPlane's field that holds each (or would: the cluster name and
/// network may come from the owning Cluster API `Cluster`).
///
/// # Errors
/// [`PlanError::Field`] for the first setting that breaks its rule.
pub fn check_cluster(cluster: &ClusterSettings) -> Result<(), PlanError> {
    use field_rules::{Kind, Syntax, check_value};
    let ncp = Kind::NestedControlPlane;
    let name = &cluster.name;
    check_value(ncp, name, "metadata.name", Syntax::ClusterName, name)?;
    for (i, block) in cluster.service_cidr.split(',').enumerate() {
        check_value(
            ncp,
            name,
            &format!("spec.clusterNetwork.services.cidrBlocks[{i}]"),
            Syntax::ServiceCidr,
            block.trim(),
        )?;
    }
    check_value(
        ncp,
        name,
        "spec.clusterNetwork.serviceDomain",
        Syntax::DnsDomain,
        &cluster.dns_domain,
    )?;
    check_value(
        ncp,
        name,
        "spec.imageRepository",
        Syntax::ImageRepository,
        &cluster.image_repository,
    )?;
    if let Some(version) = &cluster.kubernetes_version {
        check_value(ncp, name, "spec.version", Syntax::Version, version)?;
    }
    if let Some(channel) = &cluster.channel {
        check_value(ncp, name, "spec.channel", Syntax::ChannelName, channel)?;
    }
    if let Some(size) = &cluster.size {
        check_value(ncp, name, "spec.size", Syntax::SizeName, size)?;
    }
    Ok(())
}

/// Checks the field rules of a NestedControlPlane (`object`, as JSON) and of the cluster
/// settings derived from it; the NestedControlPlane controller and `capn render` both call
/// it before anything else.
///
/// # Errors
/// [`PlanError::Field`] for the first field that breaks its rule.
pub fn check_control_plane(object: &serde_json::Value, cluster: &ClusterSettings) -> Result<(), PlanError> {
    if let Some(e) = field_rules::check_object(field_rules::Kind::NestedControlPlane, object)
        .into_iter()
        .next()
    {
        return Err(e.into());
    }
    check_cluster(cluster)
}

/// Plans one component: resolve → render → extraArgs → patches → check → label and own.
///
/// # Errors
/// [`PlanError`]: unknown channel or version, a template that fails, a patch that fails,
/// an object outside the namespace, or (apiserver) no etcd endpoints yet.
pub fn plan(
    channels: &ChannelRegistry,
    cluster: &ClusterSettings,
    request: &ComponentRequest<'_>,
    upstream: &Upstream,
) -> Result<Plan, PlanError> {
    let kind = request.kind;
    let spec = request.spec;
    check_input(cluster, kind, request.resource_name, spec, request.etcd_storage)?;
    let resolved = rules::resolve(channels, cluster, kind, spec)?;
    rules::check(kind, &resolved, &request.running)?;
    rules::check_members(kind, spec.replicas.unwrap_or(1), &request.running, &resolved)?;
    let (channel, version, size) = (resolved.channel, resolved.version, resolved.size);
    let mut replicas = spec.replicas.unwrap_or(1);
    if replicas < 1 {
        return Err(PlanError::InvalidReplicas(replicas));
    }
    let mut initial_state = InitialClusterState::New;
    let members = match (kind, &upstream.etcd_membership) {
        (ComponentKind::Etcd, Some(membership)) => {
            replicas = membership.statefulset_replicas.max(1);
            initial_state = membership.initial_cluster_state;
            membership.members.clone()
        }
        (ComponentKind::Etcd, None) => etcd_members(&cluster.name, &cluster.namespace, replicas),
        _ => Vec::new(),
    };
    let etcd_endpoints: Vec<String> = match kind {
        ComponentKind::Etcd => etcd_members(&cluster.name, &cluster.namespace, replicas)
            .into_iter()
            .map(|m| m.client_url)
            .collect(),
        _ => Vec::new(),
    };
    let endpoints_for_templates = match kind {
        ComponentKind::Etcd => etcd_endpoints.clone(),
        ComponentKind::ApiServer if upstream.etcd_endpoints.is_empty() => {
            return Err(PlanError::NoEtcdEndpoints);
        }
        _ => upstream.etcd_endpoints.clone(),
    };
    let mut context = build_context(cluster, request, &version, replicas, members, endpoints_for_templates);
    context.etcd.initial_cluster_state = initial_state.as_str().to_string();
    context.audit = planned_audit(cluster, request)?;
    context.authentication = planned_authentication(cluster, request)?;
    context.authorization = planned_authorization(cluster, request)?;
    size::apply(&mut context, kind, spec, size);
    if kind == ComponentKind::Etcd {
        context.etcd.storage.quota_backend_bytes = Some(etcd_quota::quota_backend_bytes(
            request.etcd_storage,
            DEFAULT_ETCD_STORAGE,
            size::quota_ceiling(size),
            request.resource_name,
        )?);
    }
    // Every object is a member of the component's ApplySet (KEP-3659): pruning and kubectl
    // both find the set by this label.
    context.labels.insert(
        PART_OF_LABEL.to_string(),
        component_applyset_id(request.kind, request.resource_name, &cluster.namespace),
    );
    let templates = channel.templates(kind, &version).unwrap_or_default();
    let mut objects = render_templates_in(templates, &context, &cluster.namespace)?;
    // The size's flags first, the component's own `extraArgs` over them flag by flag.
    let mut extra_args = size::extra_args(kind, size);
    extra_args.extend(spec.extra_args.iter().map(|(k, v)| (k.clone(), v.clone())));
    apply_extra_args(&mut objects, &extra_args)?;
    apply_patches(&mut objects, &spec.patches)?;
    let reloaded = reloaded_secret_names(&channel.name, channel.component(kind), &context)?;
    let startup_secrets: Vec<String> = mounted_secrets(&objects)
        .into_iter()
        .filter(|name| !reloaded.contains(name))
        .collect();
    stamp_certificates_digest(&mut objects, DIGEST_PLACEHOLDER);
    for object in &mut objects {
        labels::finalize_object(object, &cluster.namespace, &context.labels, &request.owner).map_err(|message| {
            let entry = inventory_entry(object);
            PlanError::InvalidObject {
                kind: entry.kind,
                name: entry.name,
                message,
            }
        })?;
    }
    Ok(Plan {
        kind,
        channel: channel.name.clone(),
        version,
        replicas,
        objects,
        etcd_endpoints: if kind == ComponentKind::Etcd {
            etcd_endpoints
        } else {
            Vec::new()
        },
        startup_secrets,
    })
}

/// The `--quota-backend-bytes` a NestedEtcd renders with, in bytes, as [`plan`] computes it:
/// its `spec.storage.quotaBackendBytes`, else sized from the volume under the ceiling of its
/// size (docs/guide/sizes.md). The etcd space controller compares the members' database
/// with it, so the two must agree.
///
/// # Errors
/// [`PlanError`] for an unknown channel, release or size, or a quota field that breaks its
/// rule.
pub fn etcd_quota_bytes(
    channels: &ChannelRegistry,
    cluster: &ClusterSettings,
    resource_name: &str,
    spec: &ComponentSpec,
    storage: Option<&EtcdStorage>,
) -> Result<u64, PlanError> {
    let resolved = rules::resolve(channels, cluster, ComponentKind::Etcd, spec)?;
    Ok(etcd_quota::quota_backend_bytes(
        storage,
        DEFAULT_ETCD_STORAGE,
        size::quota_ceiling(resolved.size),
        resource_name,
    )?)
}

/// The render-context `audit` of an apiserver: none without `spec.audit`.
///
/// # Errors
/// [`PlanError::Reference`] when `policyRef` is set and the caller found no policy.
fn planned_audit(
    cluster: &ClusterSettings,
    request: &ComponentRequest<'_>,
) -> Result<Option<audit::AuditVars>, PlanError> {
    let Some(AuditRequest { spec, referenced }) = request.audit.filter(|_| request.kind == ComponentKind::ApiServer)
    else {
        return Ok(None);
    };
    audit::check_fields(request.resource_name, spec)?;
    if let (Some((config_map, key)), None) = (audit::policy_reference(Some(spec)), referenced) {
        audit::referenced_policy(request.resource_name, config_map, key, None)?;
    }
    Ok(audit::audit_vars(&cluster.name, Some(spec), referenced))
}

/// The render-context `authentication` of an apiserver: none without `spec.authentication`.
///
/// # Errors
/// [`PlanError::Field`] when it breaks a rule of [`authentication::check_fields`];
/// [`PlanError::Reference`] when `configurationRef` is set and the caller found no
/// configuration.
fn planned_authentication(
    cluster: &ClusterSettings,
    request: &ComponentRequest<'_>,
) -> Result<Option<authentication::AuthenticationVars>, PlanError> {
    let Some(spec) = request
        .authentication
        .filter(|_| request.kind == ComponentKind::ApiServer)
    else {
        return Ok(None);
    };
    let issuer = service_account_issuer(&cluster.dns_domain);
    authentication::check_fields(request.resource_name, spec, &issuer)?;
    let configuration = match (&spec.configuration, request.referenced.authentication) {
        (Some(configuration), _) | (None, Some(configuration)) => configuration,
        (None, None) => {
            let (config_map, key) = authentication::configuration_reference(Some(spec)).unwrap_or_default();
            return match authentication::referenced_configuration(request.resource_name, config_map, key, None, &issuer)
            {
                Err(e) => Err(e.into()),
                Ok(_) => Ok(None),
            };
        }
    };
    Ok(authentication::authentication_vars(&cluster.name, Some(configuration)))
}

/// The render-context `authorization` of an apiserver: none without `spec.authorization`.
///
/// # Errors
/// [`PlanError::Field`] when it breaks a rule of [`authorization::check_fields`];
/// [`PlanError::Reference`] when `configurationRef` is set and the caller found no
/// configuration.
fn planned_authorization(
    cluster: &ClusterSettings,
    request: &ComponentRequest<'_>,
) -> Result<Option<authorization::AuthorizationVars>, PlanError> {
    let Some(spec) = request
        .authorization
        .filter(|_| request.kind == ComponentKind::ApiServer)
    else {
        return Ok(None);
    };
    authorization::check_fields(request.resource_name, spec)?;
    let configuration = match (&spec.configuration, request.referenced.authorization) {
        (Some(configuration), _) | (None, Some(configuration)) => configuration,
        (None, None) => {
            let (config_map, key) = authorization::configuration_reference(Some(spec)).unwrap_or_default();
            return match authorization::referenced_configuration(request.resource_name, config_map, key, None) {
                Err(e) => Err(e.into()),
                Ok(_) => Ok(None),
            };
        }
    };
    Ok(authorization::authorization_vars(&cluster.name, Some(configuration)))
}

/// The tenant apiserver's `--service-account-issuer` (the `stable` channel's): the issuer
/// of its own service-account tokens.
pub fn service_account_issuer(dns_domain: &str) -> String {
    format!("https://kubernetes.default.svc.{dns_domain}")
}

/// The names of the Secrets a channel declares its component's processes reload by
/// themselves (`reloadedSecrets`, by their `secrets.<key>` in the render context).
fn reloaded_secret_names(
    channel: &str,
    versions: Option<&crate::channel::ComponentVersions>,
    context: &RenderContext,
) -> Result<Vec<String>, PlanError> {
    versions
        .map(|v| v.reloaded_secrets.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|key| {
            context.secrets.get(key.as_str()).cloned().ok_or_else(|| {
                PlanError::Channel(ChannelError::InvalidChannel {
                    channel: channel.to_string(),
                    message: format!(
                        "reloadedSecrets names {key:?}, which is not a Secret of the render context (one of: {})",
                        context.secrets.keys().copied().collect::<Vec<_>>().join(", ")
                    ),
                })
            })
        })
        .collect()
}

fn build_context(
    cluster: &ClusterSettings,
    request: &ComponentRequest<'_>,
    version: &Version,
    replicas: i32,
    members: Vec<EtcdMember>,
    etcd_endpoints: Vec<String>,
) -> RenderContext {
    let c = &cluster.name;
    let ns = &cluster.namespace;
    let secrets = SecretNames::new(c);
    let storage = request.etcd_storage.cloned().unwrap_or_default();
    let apiserver_service = ComponentKind::ApiServer.object_name(c);
    RenderContext {
        cluster: ClusterVars {
            name: c.clone(),
            namespace: ns.clone(),
        },
        component: ComponentVars {
            name: request.kind.as_str(),
            resource: request.resource_name.to_string(),
            replicas,
            version: version.to_string(),
            resources: request
                .spec
                .resources
                .as_ref()
                .and_then(|r| serde_json::to_value(r).ok()),
            priority_class_name: policy::priority_class_name(request.spec),
        },
        image_repository: cluster.image_repository.trim_end_matches('/').to_string(),
        names: NameVars {
            etcd: ComponentKind::Etcd.object_name(c),
            apiserver: apiserver_service.clone(),
            controller_manager: ComponentKind::ControllerManager.object_name(c),
        },
        selector: selector_labels(request.kind, c),
        labels: standard_labels(request.kind, c),
        network: NetworkVars {
            service_cidr: cluster.service_cidr.clone(),
            dns_domain: cluster.dns_domain.clone(),
            super_dns_domain: cluster.super_dns_domain.clone(),
        },
        secrets: [
            ("ca", secrets.ca),
            ("etcd_ca", secrets.etcd_ca),
            ("proxy_ca", secrets.proxy_ca),
            ("sa", secrets.sa),
            ("apiserver", secrets.apiserver),
            ("apiserver_etcd_client", secrets.apiserver_etcd_client),
            ("etcd_server", secrets.etcd_server),
            ("apiserver_kubelet_client", secrets.apiserver_kubelet_client),
            ("front_proxy_client", secrets.front_proxy_client),
            ("controller_manager_kubeconfig", secrets.controller_manager_kubeconfig),
            ("kubeconfig", secrets.kubeconfig),
            ("encryption", secrets.encryption),
        ]
        .into_iter()
        .collect(),
        etcd: EtcdVars {
            initial_cluster: members
                .iter()
                .map(|m| format!("{}={}", m.name, m.peer_url))
                .collect::<Vec<_>>()
                .join(","),
            initial_cluster_state: InitialClusterState::New.as_str().to_string(),
            members,
            endpoints: etcd_endpoints,
            storage: StorageVars {
                ephemeral: storage.ephemeral,
                size: storage
                    .size
                    .map(|q| q.0)
                    .unwrap_or_else(|| DEFAULT_ETCD_STORAGE.to_string()),
                storage_class_name: storage.storage_class_name,
                quota_backend_bytes: None,
            },
            restore: request.etcd_restore.cloned(),
        },
        apiserver: ApiServerVars {
            url: format!("https://{apiserver_service}.{ns}.svc:{APISERVER_PORT}"),
            service: apiserver_service,
            port: APISERVER_PORT,
        },
        selectors: SelectorVars {
            etcd: selector_labels(ComponentKind::Etcd, c),
            apiserver: selector_labels(ComponentKind::ApiServer, c),
            controller_manager: selector_labels(ComponentKind::ControllerManager, c),
        },
        disruption: policy::disruption(request.kind, replicas),
        spread: policy::spread(request.spec.topology_spread.as_ref()),
        network_policy: policy::network_policy_vars(&cluster.network_policy),
        audit: None,
        authentication: None,
        authorization: None,
        size: size::SizeVars::default(),
        encryption: context::EncryptionVars::new(&cluster.kms_endpoints),
    }
}

#[cfg(test)]
mod tests;
