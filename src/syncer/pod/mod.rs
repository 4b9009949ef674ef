//! A tenant Pod translated into the Pod the super cluster runs (docs/design.md §11).
//!
//! [`translate`] checks the tenant pod against [`admission`](crate::syncer::admission)
//! first and translates nothing it refuses. The translated pod:
//! - has the metadata of [`tenancy::super_metadata`]: its mapped name in the workload
//!   namespace, the tenant's labels and annotations, the tenancy ones, nothing else;
//! - refers to the synced copies of the tenant's ConfigMaps, Secrets and
//!   PersistentVolumeClaims ([`references`]), which the result lists for the controller to
//!   sync first;
//! - carries the tenant's service-account tokens in a Secret the controller fills from the
//!   *tenant* apiserver ([`token`]); the super pod itself mounts no super token
//!   (`automountServiceAccountToken: false`, `serviceAccountName: default`);
//! - mounts the *tenant's* ClusterTrustBundles where it projects them, through a ConfigMap
//!   the controller fills ([`trust_bundle`]), and the certificates the *tenant's* signers
//!   issue where it projects `podCertificate` sources, through a Secret ([`certificate`]);
//! - talks to its own apiserver: `KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT`
//!   (and the `kubernetes` Service's other variables) on every container name the tenant
//!   apiserver as the super cluster reaches it, unless the container sets them itself (the
//!   kubelet's own variables yield to a container's, so a tenant's explicit value keeps
//!   winning, as in any cluster);
//! - finds its namespace's Services through the environment variables the kubelet would
//!   give it, holding their super ClusterIPs ([`crate::syncer::service`]);
//! - shows the tenant's identity through the downward API ([`downward`]);
//! - keeps to the tenant's placement wishes that cannot escape its share of the super
//!   cluster ([`placement`]);
//! - leaves to the super cluster what only it can decide: `nodeName` (its scheduler),
//!   `schedulerName`, `priority`, `priorityClassName` and `preemptionPolicy` (a tenant's
//!   `system-node-critical` must not preempt other tenants' pods; the super cluster's
//!   Priority admission fills them), `overhead` (its RuntimeClass admission);
//! - has no ephemeral containers (they cannot be created with a pod, only added through the
//!   `ephemeralcontainers` subresource, which the syncer does not drive yet) and no readiness
//!   gates (the conditions they wait for are set on the tenant pod; the way up folds them
//!   into the tenant's Ready condition, see `upward`);
//! - keeps `hostname` (set from the tenant pod's name when unset, so the pod sees its
//!   tenant name) and `subdomain`; a pod that asks for cluster DNS resolves through the
//!   tenant's ([`dns`]: `dnsPolicy: None` with the `resolv.conf` the kubelet would write).

pub mod certificate;
pub mod dns;
pub mod downward;
pub mod env;
pub mod placement;
pub mod references;
pub mod token;
pub mod trust_bundle;

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{EnvVar, Pod, PodSpec, ServicePort, Toleration};

use self::env::{ServiceLink, link_env};
use crate::syncer::admission::{self, Level, Violation};
use crate::syncer::names::tenancy::{self, MissingField, TenantObject};
use crate::syncer::names::{ControlPlaneRef, NameLimit, is_dns_label};

pub use certificate::PodCertificates;
pub use dns::ClusterDns;
pub use references::{Reference, ReferenceKind};
pub use token::{TokenRequest, TokenSecret};
pub use trust_bundle::TrustBundles;

/// The variable client-go's in-cluster configuration reads the apiserver's host from.
pub const SERVICE_HOST: &str = "KUBERNETES_SERVICE_HOST";
/// The variable client-go's in-cluster configuration reads the apiserver's port from.
pub const SERVICE_PORT: &str = "KUBERNETES_SERVICE_PORT";
/// The Service the kubelet names the apiserver by in every pod's environment
/// (`default/kubernetes`).
const MASTER_SERVICE: &str = "kubernetes";

/// What a translation needs besides the tenant pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The control plane the tenant pod belongs to.
    pub control_plane: ControlPlaneRef,
    /// The tenant apiserver as pods in the super cluster reach it.
    pub apiserver: ApiServerAddress,
    /// The Pod Security Standards level the tenant's pods must meet.
    pub level: Level,
    /// The tenant's cluster DNS, when capn serves it.
    pub dns: Option<ClusterDns>,
}

/// An address of the tenant apiserver reachable from super-cluster pods, such as its
/// Service's ClusterIP and port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiServerAddress {
    /// An IP address (IPv6 without brackets, as the kubelet writes it) or a DNS name.
    pub host: String,
    /// The TCP port.
    pub port: u16,
}

/// The super pod and what the controller must do around it.
#[derive(Clone, Debug, PartialEq)]
pub struct Translation {
    /// The pod to create in the workload namespace.
    pub pod: Pod,
    /// The tenant objects (in the pod's namespace) the super pod refers to by their mapped
    /// names: sync them before the pod, or it waits for them.
    pub references: BTreeSet<Reference>,
    /// The token Secret the pod mounts, when the tenant pod projects service-account
    /// tokens.
    pub token_secret: Option<TokenSecret>,
    /// The trust bundle ConfigMap the pod mounts, when the tenant pod projects
    /// ClusterTrustBundles.
    pub trust_bundles: Option<TrustBundles>,
    /// The certificate Secret the pod mounts, when the tenant pod projects pod
    /// certificates.
    pub certificates: Option<PodCertificates>,
    /// Tolerations the tenant pod asked for and the super pod does not carry
    /// ([`placement::TOLERATION_KEYS`]), for an Event on the tenant pod.
    pub dropped_tolerations: Vec<Toleration>,
}

/// Why a tenant pod was not translated.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum TranslateError {
    /// The pod breaks admission rules; every violation is listed.
    #[error("refused: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Refused(Vec<Violation>),
    /// The pod lacks its namespace, name or uid.
    #[error(transparent)]
    MissingField(#[from] MissingField),
}

impl TranslateError {
    /// Short stable reason, used as condition reason, Event reason and metric label: the
    /// first violation's, or `TenantObjectIncomplete`.
    pub fn reason(&self) -> &'static str {
        match self {
            TranslateError::Refused(violations) => violations.first().map_or("Refused", |v| v.rule.reason()),
            TranslateError::MissingField(_) => "TenantObjectIncomplete",
        }
    }
}

/// The super-cluster Pod for the tenant pod `tenant` (see the module documentation), whose
/// Service environment variables name `services` (the links of its namespace's Services,
/// [`crate::syncer::service::service_links`]).
///
/// Errors: [`TranslateError::Refused`] with every admission violation at `target.level`;
/// [`TranslateError::MissingField`] for a pod without namespace, name or uid. Both are
/// terminal: the tenant pod must change.
pub fn translate(tenant: &Pod, target: &Target, services: &[ServiceLink]) -> Result<Translation, TranslateError> {
    let violations = admission::check(tenant, target.level);
    if !violations.is_empty() {
        return Err(TranslateError::Refused(violations));
    }
    let identity = TenantObject::of(&tenant.metadata)?;
    let metadata = tenancy::super_metadata(&target.control_plane, NameLimit::Subdomain, &tenant.metadata)?;
    let mut spec = tenant.spec.clone().unwrap_or_default();
    let service_account = service_account_name(&spec);
    downward::rewrite(&mut spec, &identity, &service_account);
    let references = references::rewrite(&mut spec, &target.control_plane, &identity.namespace);
    let token_secret = token::replace(&mut spec, &target.control_plane, &identity, &service_account);
    let trust_bundles = trust_bundle::replace(&mut spec, &target.control_plane, &identity);
    let certificates = certificate::replace(&mut spec, &target.control_plane, &identity, &service_account);
    let dropped_tolerations = placement::rewrite(&mut spec, &identity.namespace);
    leave_to_the_super_cluster(&mut spec);
    set_hostname(&mut spec, &identity.name);
    dns::rewrite(&mut spec, target.dns.as_ref(), &identity.namespace);
    set_service_env(&mut spec, &target.apiserver, services);
    Ok(Translation {
        pod: Pod {
            metadata,
            spec: Some(spec),
            status: None,
        },
        references,
        token_secret,
        trust_bundles,
        certificates,
        dropped_tolerations,
    })
}

/// Gives every container of `desired` the `env` of the same container in `live`, and
/// `desired` the live `enableServiceLinks`, `dnsPolicy` and `dnsConfig`: they are immutable
/// (Kubernetes' pod update validation), and the live pod's named the Services there were
/// when it was made, as a kubelet's pod keeps those of its start (a super pod made by an
/// earlier capn, with service links on or without tenant DNS, stays so).
pub fn keep_live_immutables(desired: &mut Pod, live: &Pod) {
    let (Some(spec), Some(live)) = (desired.spec.as_mut(), live.spec.as_ref()) else {
        return;
    };
    spec.enable_service_links = live.enable_service_links;
    spec.dns_policy.clone_from(&live.dns_policy);
    spec.dns_config.clone_from(&live.dns_config);
    // Container names are unique across a pod's containers and init containers.
    let live: Vec<_> = live
        .containers
        .iter()
        .chain(live.init_containers.iter().flatten())
        .collect();
    let containers = spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten());
    for container in containers {
        if let Some(same) = live.iter().find(|c| c.name == container.name) {
            container.env.clone_from(&same.env);
        }
    }
}

/// Every projected source of every volume of `spec`, mutable, with the key
/// `<volume name>.<source index>` by which the syncer's Secrets and ConfigMaps hold what
/// stands in for it (unique in the pod, since volume names are).
fn projected_sources_mut(
    spec: &mut PodSpec,
) -> impl Iterator<Item = (String, &mut k8s_openapi::api::core::v1::VolumeProjection)> {
    spec.volumes.iter_mut().flatten().flat_map(|volume| {
        let name = volume.name.clone();
        let sources = volume.projected.as_mut().and_then(|p| p.sources.as_mut());
        sources
            .into_iter()
            .flatten()
            .enumerate()
            .map(move |(index, source)| (format!("{name}.{index}"), source))
    })
}

/// Every projected source of every volume of `spec`.
pub fn projected_sources(spec: &PodSpec) -> impl Iterator<Item = &k8s_openapi::api::core::v1::VolumeProjection> {
    spec.volumes
        .iter()
        .flatten()
        .filter_map(|v| v.projected.as_ref()?.sources.as_ref())
        .flatten()
}

/// The tenant pod's service account: `serviceAccountName`, else the deprecated
/// `serviceAccount`, else `default` (the tenant apiserver's ServiceAccount admission fills
/// the first).
fn service_account_name(spec: &PodSpec) -> String {
    [&spec.service_account_name, &spec.service_account]
        .into_iter()
        .flatten()
        .find(|name| !name.is_empty())
        .cloned()
        .unwrap_or_else(|| "default".to_owned())
}

/// Clears what the super cluster decides (see the module documentation).
fn leave_to_the_super_cluster(spec: &mut PodSpec) {
    spec.node_name = None;
    spec.service_account_name = Some("default".to_owned());
    spec.service_account = None;
    spec.automount_service_account_token = Some(false);
    spec.scheduler_name = None;
    spec.priority = None;
    spec.priority_class_name = None;
    spec.preemption_policy = None;
    spec.overhead = None;
    spec.ephemeral_containers = None;
    spec.readiness_gates = None;
}

/// `hostname` from the tenant pod's name when the tenant left it unset, as the kubelet
/// derives it (`truncatePodHostnameIfNeeded` in `pkg/kubelet/kubelet_pods.go`: the first 63
/// characters, trailing `-` and `.` trimmed). A name that is still no DNS-1123 label (it
/// has dots) is left out, as `spec.hostname` would refuse it; that pod sees its super name.
fn set_hostname(spec: &mut PodSpec, tenant_name: &str) {
    if spec.hostname.as_deref().is_some_and(|h| !h.is_empty()) {
        return;
    }
    let cut = tenant_name
        .get(..63)
        .unwrap_or(tenant_name)
        .trim_end_matches(['-', '.']);
    spec.hostname = is_dns_label(cut).then(|| cut.to_owned());
}

/// The Service environment variables ([`link_env`]) first in every container's and init
/// container's `env` (first, so that a later `$(KUBERNETES_SERVICE_HOST)` of the tenant
/// expands to them), each unless the container sets it itself: the tenant apiserver's as
/// the `kubernetes` Service's always (the kubelet adds the master Service's even when
/// service links are off, and lets it win over a namespace's Service of that name), and
/// those of `services` unless the pod turns `enableServiceLinks` off. The super pod's own
/// links are off: the super kubelet would name the workload namespace's copies.
fn set_service_env(spec: &mut PodSpec, apiserver: &ApiServerAddress, services: &[ServiceLink]) {
    let mut links = vec![ServiceLink {
        name: MASTER_SERVICE.to_owned(),
        host: apiserver.host.clone(),
        ports: vec![ServicePort {
            name: Some("https".to_owned()),
            port: i32::from(apiserver.port),
            protocol: Some("TCP".to_owned()),
            ..ServicePort::default()
        }],
    }];
    if spec.enable_service_links != Some(false) {
        links.extend(services.iter().filter(|l| l.name != MASTER_SERVICE).cloned());
    }
    spec.enable_service_links = Some(false);
    let vars = link_env(&links);
    let containers = spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten());
    for container in containers {
        let env = container.env.get_or_insert_with(Vec::new);
        let missing: Vec<EnvVar> = vars
            .iter()
            .filter(|var| !env.iter().any(|e| e.name == var.name))
            .cloned()
            .collect();
        env.splice(0..0, missing);
    }
}

#[cfg(test)]
mod tests;
