//! `capn render`: what the controllers would apply for the resources in a file, computed
//! offline through the same [`crate::plan::plan`] the controllers call.

use anyhow::Context as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::DynamicObject;
use kube::{Resource, ResourceExt};
use serde_json::Value;

use crate::api::{NestedAPIServer, NestedControlPlane, NestedControllerManager, NestedEtcd};
use crate::channel::ChannelRegistry;
use crate::controllers::component::ComponentResource;
use crate::controllers::shared::read::{CAPI_GROUP, cluster_settings, controller_reference};
use crate::pki::{SECRET_TYPE, SecretNames};
use crate::plan::{ClusterSettings, ComponentRequest, Plan, Running, Upstream, check_control_plane, plan, resolve};

fn kind_of(doc: &Value) -> (&str, &str) {
    let s = |k: &str| doc.get(k).and_then(Value::as_str).unwrap_or_default();
    (s("apiVersion"), s("kind"))
}

/// `doc` as the cluster stores it: a missing or null `spec` is `{}` (the CRDs default it).
fn with_spec(doc: &Value) -> Value {
    let mut doc = doc.clone();
    if let Some(map) = doc.as_object_mut()
        && map.get("spec").is_none_or(Value::is_null)
    {
        map.insert("spec".into(), serde_json::json!({}));
    }
    doc
}

fn find<K: ComponentResource>(docs: &[Value], name: &str) -> anyhow::Result<Option<K>> {
    for doc in docs {
        let (api_version, kind) = kind_of(doc);
        if kind == K::kind(&())
            && api_version == K::api_version(&())
            && doc.pointer("/metadata/name") == Some(&Value::from(name))
        {
            return Ok(Some(
                serde_json::from_value(with_spec(doc)).with_context(|| format!("{kind} {name}"))?,
            ));
        }
    }
    Ok(None)
}

/// The component of kind `K` for `ncp`: the one the file holds under the referenced name,
/// else the default one the NestedControlPlane controller would create.
fn component<K: ComponentResource>(docs: &[Value], ncp: &NestedControlPlane) -> anyhow::Result<(K, bool)> {
    let name = K::reference(ncp)
        .map(str::to_string)
        .unwrap_or_else(|| format!("{}-{}", ncp.name_any(), K::KIND.as_str()));
    if let Some(found) = find::<K>(docs, &name)? {
        return Ok((found, false));
    }
    if K::reference(ncp).is_some() {
        return Err(InputError {
            reason: "ComponentMissing",
            message: format!(
                "NestedControlPlane {} references {} {name}, which is not in the file",
                ncp.name_any(),
                K::kind(&())
            ),
        }
        .into());
    }
    let mut fresh = K::with_defaults(&name);
    fresh.meta_mut().namespace = ncp.namespace();
    Ok((fresh, true))
}

/// The controllers' owner reference; an offline object without a uid gets an empty one.
fn owner_of<K: Resource<DynamicType = ()>>(object: &K) -> OwnerReference {
    controller_reference(object).unwrap_or_else(|| OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: object.name_any(),
        uid: String::new(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    })
}

fn plan_component<K: ComponentResource>(
    channels: &ChannelRegistry,
    cluster: &ClusterSettings,
    component: &K,
    upstream: &Upstream,
    running: Running,
) -> anyhow::Result<Plan> {
    let name = component.name_any();
    let request = ComponentRequest {
        kind: K::KIND,
        resource_name: &name,
        spec: component.component(),
        etcd_storage: component.etcd_storage(),
        etcd_restore: None,
        owner: owner_of(component),
        running,
    };
    plan(channels, cluster, &request, upstream).with_context(|| format!("{} {name}", K::kind(&())))
}

/// Input `capn render` refuses before planning: duplicate objects, unknown fields (with
/// `--strict`), a reference to a component the file lacks, no NestedControlPlane at all.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct InputError {
    /// Short stable reason (`DuplicateObject`, `UnknownField`, `ComponentMissing`,
    /// `NoControlPlane`).
    pub reason: &'static str,
    pub message: String,
}

/// The reason of a `capn render` error: the same reason the controllers put on the
/// condition for the same input (`InvalidEndpoint`, `SkewNotAllowed`, ...).
pub fn error_reason(error: &anyhow::Error) -> Option<&'static str> {
    error.chain().find_map(|e| {
        e.downcast_ref::<crate::plan::PlanError>()
            .map(|e| e.reason())
            .or_else(|| e.downcast_ref::<crate::validate::FieldError>().map(|e| e.reason()))
            .or_else(|| e.downcast_ref::<InputError>().map(|e| e.reason))
            .or_else(|| e.downcast_ref::<crate::upgrade::PathError>().map(|e| e.reason()))
    })
}

/// How `capn render` treats its input.
#[derive(Clone, Debug)]
pub struct RenderOptions {
    /// DNS domain of the super cluster.
    pub super_dns_domain: String,
    /// Unknown fields are errors instead of warnings (kubectl's strict field validation).
    pub strict: bool,
}

impl Default for RenderOptions {
    fn default() -> Self {
        Self {
            super_dns_domain: crate::plan::DEFAULT_DNS_DOMAIN.into(),
            strict: false,
        }
    }
}

/// What `capn render` produced: the objects, and warnings (unknown fields) for stderr.
#[derive(Clone, Debug, Default)]
pub struct Rendered {
    pub objects: Vec<Value>,
    pub warnings: Vec<String>,
}

/// `apiVersion/kind namespace/name` of a document, for duplicate detection and messages.
fn identity(doc: &Value) -> (String, String, String, String) {
    let (api_version, kind) = kind_of(doc);
    let s = |p: &str| doc.pointer(p).and_then(Value::as_str).unwrap_or_default().to_string();
    let namespace = Some(s("/metadata/namespace"))
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".into());
    (
        api_version.to_string(),
        kind.to_string(),
        namespace,
        s("/metadata/name"),
    )
}

/// Refuses two documents that are the same object (the second would silently replace the
/// first in the cluster).
fn refuse_duplicates(docs: &[Value]) -> Result<(), InputError> {
    let mut seen = std::collections::BTreeMap::new();
    for (i, doc) in docs.iter().enumerate() {
        let id = identity(doc);
        if let Some(first) = seen.insert(id.clone(), i + 1) {
            let (_, kind, namespace, name) = id;
            return Err(InputError {
                reason: "DuplicateObject",
                message: format!(
                    "{kind} {namespace}/{name} is in the file twice (documents {first} and {}); an object may appear once",
                    i + 1
                ),
            });
        }
    }
    Ok(())
}

/// ObjectMeta's fields (the CRD schemas leave `metadata` open; the API server checks it).
const OBJECT_META_FIELDS: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

/// The paths of fields in `doc` that its CRD's schema does not have, as kubectl's strict
/// field validation names them (`spec.verison`).
fn unknown_fields(doc: &Value) -> Vec<String> {
    let (api_version, kind) = kind_of(doc);
    let group = api_version.split_once('/').map(|(g, _)| g).unwrap_or_default();
    let Some(crd) = crate::crds::crds()
        .into_iter()
        .find(|c| c.spec.names.kind == kind && c.spec.group == group)
    else {
        return Vec::new();
    };
    let Some(schema) = crd
        .spec
        .versions
        .first()
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| serde_json::to_value(&s.open_api_v3_schema).ok())
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if let Some(metadata) = doc.get("metadata").and_then(Value::as_object) {
        for key in metadata.keys().filter(|k| !OBJECT_META_FIELDS.contains(&k.as_str())) {
            out.push(format!("metadata.{key}"));
        }
    }
    let mut root = doc.clone();
    if let Some(map) = root.as_object_mut() {
        for key in ["metadata", "apiVersion", "kind"] {
            map.remove(key);
        }
    }
    walk_schema(&root, &schema, "", &mut out);
    out
}

fn walk_schema(value: &Value, schema: &Value, path: &str, out: &mut Vec<String>) {
    if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
        return;
    }
    let join = |k: &str| {
        if path.is_empty() {
            k.to_string()
        } else {
            format!("{path}.{k}")
        }
    };
    match value {
        Value::Object(map) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            for (key, child) in map {
                match (properties.and_then(|p| p.get(key)), additional) {
                    (Some(s), _) => walk_schema(child, s, &join(key), out),
                    (None, Some(s)) => walk_schema(child, s, &join(key), out),
                    (None, None) if properties.is_some() => out.push(join(key)),
                    (None, None) => {}
                }
            }
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    walk_schema(item, s, &format!("{path}[{i}]"), out);
                }
            }
        }
        _ => {}
    }
}

/// The release a sibling component runs (its `status.version`) or, when it has not run
/// yet, the one it is about to run: the skew rules are checked among the components in
/// the file as the controllers check them among the running ones.
fn release_of<K: ComponentResource>(
    channels: &ChannelRegistry,
    cluster: &ClusterSettings,
    component: &K,
) -> Option<semver::Version> {
    running_release(component).or_else(|| {
        resolve(channels, cluster, K::KIND, component.component())
            .ok()
            .map(|r| r.version)
    })
}

fn running_release<K: ComponentResource>(component: &K) -> Option<semver::Version> {
    component
        .component_status()
        .and_then(|s| s.version.as_deref())
        .and_then(|v| semver::Version::parse(v).ok())
}

/// What the controllers' `running_versions` reads from the cluster, read from the file.
fn running<K: ComponentResource>(component: &K) -> Running {
    Running {
        current: running_release(component),
        etcd_members: component
            .component_status()
            .filter(|s| s.version.is_some())
            .and_then(|s| s.replicas),
        ..Running::default()
    }
}

/// Renders every NestedControlPlane in `docs`: the component resources the controller
/// would create, the certificate Secrets (name, type and labels only: their contents are
/// generated in the cluster), and every object of every component. The apiserver is
/// rendered against the etcd endpoints the etcd plan publishes, as if etcd were ready.
///
/// The input is read as the cluster reads it: a resource without `spec` is defaulted to
/// `spec: {}`; the NestedControlPlane's `spec.replicas` is the apiserver's; every field rule
/// (crate::validate) and the version skew rules among the components in the file apply;
/// fields the CRD does not have are warnings (errors with `strict`); the same object twice
/// is an error.
///
/// A CAPI `Cluster` in `docs` whose `spec.controlPlaneRef` names a NestedControlPlane is
/// treated as its owner (as Cluster API will make it): its name is the cluster name and its
/// `spec.clusterNetwork` applies.
///
/// # Errors
/// A document that is not the kind it says, a duplicate, an unknown field with `strict`, a
/// reference to a component not in `docs`, or any plan error (a field rule, unknown version
/// or channel, a skew rule, a failing patch, ...). [`error_reason`] gives its reason.
pub fn render_documents(
    channels: &ChannelRegistry,
    docs: Vec<Value>,
    options: &RenderOptions,
) -> anyhow::Result<Rendered> {
    let docs: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
    refuse_duplicates(&docs)?;
    let mut warnings = Vec::new();
    for doc in &docs {
        let (_, kind, namespace, name) = identity(doc);
        for field in unknown_fields(doc) {
            warnings.push(format!("unknown field \"{field}\" in {kind} {namespace}/{name}"));
        }
    }
    if options.strict && !warnings.is_empty() {
        return Err(InputError {
            reason: "UnknownField",
            message: warnings.join("; "),
        }
        .into());
    }
    let mut out = Vec::new();
    for doc in &docs {
        if kind_of(doc) != (NestedControlPlane::api_version(&()).as_ref(), "NestedControlPlane") {
            continue;
        }
        let mut ncp: NestedControlPlane = serde_json::from_value(with_spec(doc)).context("NestedControlPlane")?;
        if ncp.namespace().is_none() {
            ncp.meta_mut().namespace = Some("default".into());
        }
        let capi_cluster = docs.iter().find(|d| {
            let (api_version, kind) = kind_of(d);
            kind == "Cluster"
                && api_version.starts_with(&format!("{CAPI_GROUP}/"))
                && d.pointer("/spec/controlPlaneRef/name") == Some(&Value::from(ncp.name_any()))
        });
        let capi_cluster: Option<DynamicObject> =
            capi_cluster.map(|c| serde_json::from_value(c.clone())).transpose()?;
        if let Some(c) = &capi_cluster
            && ncp.owner_references().is_empty()
        {
            ncp.meta_mut().owner_references = Some(vec![OwnerReference {
                api_version: c.types.as_ref().map(|t| t.api_version.clone()).unwrap_or_default(),
                kind: "Cluster".into(),
                name: c.name_any(),
                uid: c.uid().unwrap_or_default(),
                ..Default::default()
            }]);
        }
        let cluster = cluster_settings(&ncp, capi_cluster.as_ref(), &options.super_dns_domain);
        check_control_plane(&serde_json::to_value(&ncp)?, &cluster)?;

        let (etcd, etcd_new) = component::<NestedEtcd>(&docs, &ncp)?;
        let (mut apiserver, apiserver_new) = component::<NestedAPIServer>(&docs, &ncp)?;
        let (controller_manager, cm_new) = component::<NestedControllerManager>(&docs, &ncp)?;
        // The scale subresource: the control plane's replicas are the apiserver's, as the
        // NestedControlPlane controller writes them into the NestedAPIServer.
        if let Some(replicas) = ncp.spec.replicas {
            apiserver.spec.component.replicas = Some(replicas);
        }
        let ncp_owner = owner_of(&ncp);
        for (new, value) in [
            (etcd_new, serde_json::to_value(&etcd)?),
            (apiserver_new, serde_json::to_value(&apiserver)?),
            (cm_new, serde_json::to_value(&controller_manager)?),
        ] {
            if new {
                let mut value = value;
                value["metadata"]["ownerReferences"] = serde_json::to_value(vec![&ncp_owner])?;
                out.push(value);
            }
        }
        for name in SecretNames::new(&cluster.name).all() {
            out.push(serde_json::json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {
                    "name": name,
                    "namespace": cluster.namespace,
                    "labels": {crate::api::CLUSTER_NAME_LABEL: cluster.name},
                },
                "type": SECRET_TYPE,
            }));
        }
        let apiserver_release = release_of(channels, &cluster, &apiserver);
        let cm_release = release_of(channels, &cluster, &controller_manager);
        let etcd_running = Running {
            apiserver: running_release(&apiserver),
            ..running(&etcd)
        };
        let apiserver_running = Running {
            controller_manager: cm_release,
            ..running(&apiserver)
        };
        let cm_running = Running {
            apiserver: apiserver_release,
            ..running(&controller_manager)
        };
        let etcd_plan = plan_component(channels, &cluster, &etcd, &Upstream::default(), etcd_running)?;
        let upstream = Upstream {
            etcd_endpoints: etcd_plan.etcd_endpoints.clone(),
            ..Upstream::default()
        };
        let apiserver_plan = plan_component(channels, &cluster, &apiserver, &upstream, apiserver_running)?;
        let cm_plan = plan_component(
            channels,
            &cluster,
            &controller_manager,
            &Upstream::default(),
            cm_running,
        )?;
        for p in [etcd_plan, apiserver_plan, cm_plan] {
            out.extend(p.objects);
        }
    }
    if out.is_empty() {
        return Err(InputError {
            reason: "NoControlPlane",
            message: "no NestedControlPlane (controlplane.cluster.x-k8s.io/v1beta1) in the input".into(),
        }
        .into());
    }
    Ok(Rendered { objects: out, warnings })
}

/// The upgrade path of every NestedControlPlane in `docs`, as the control plane controller
/// would plan it (docs/design.md §10), without touching anything: one YAML mapping per
/// control plane with `from`, `target`, a one-line `path` and the `steps` (Kubernetes and
/// etcd release of each, and whether etcd moves).
///
/// `from` is the Kubernetes release running now; without it, the release the file's
/// NestedControlPlane or NestedAPIServer status reports. `from_etcd` is the running etcd;
/// without it, the file's NestedEtcd status, else the channel's default for `from`'s minor.
///
/// # Errors
/// No NestedControlPlane in `docs`; no running release known (`from` missing); a release
/// that is not a version; a path the channel cannot serve or a downgrade
/// ([`crate::upgrade::PathError`], whose reason [`error_reason`] gives).
pub fn render_upgrade_paths(
    channels: &ChannelRegistry,
    docs: Vec<Value>,
    from: Option<&str>,
    from_etcd: Option<&str>,
    options: &RenderOptions,
) -> anyhow::Result<Vec<Value>> {
    let docs: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
    refuse_duplicates(&docs)?;
    let parse = |text: &str, what: &str| -> anyhow::Result<semver::Version> {
        let r = crate::channel::RequestedVersion::parse(text)
            .filter(|r| r.minor.is_some() && r.patch.is_some())
            .ok_or_else(|| InputError {
                reason: "InvalidVersion",
                message: format!("{what} {text:?} is not a release; write major.minor.patch (1.35.4)"),
            })?;
        Ok(semver::Version::new(
            r.major,
            r.minor.unwrap_or(0),
            r.patch.unwrap_or(0),
        ))
    };
    let mut out = Vec::new();
    for doc in &docs {
        if kind_of(doc) != (NestedControlPlane::api_version(&()).as_ref(), "NestedControlPlane") {
            continue;
        }
        let mut ncp: NestedControlPlane = serde_json::from_value(with_spec(doc)).context("NestedControlPlane")?;
        if ncp.namespace().is_none() {
            ncp.meta_mut().namespace = Some("default".into());
        }
        let cluster = cluster_settings(&ncp, None, &options.super_dns_domain);
        check_control_plane(&serde_json::to_value(&ncp)?, &cluster)?;
        let (etcd, _) = component::<NestedEtcd>(&docs, &ncp)?;
        let (apiserver, _) = component::<NestedAPIServer>(&docs, &ncp)?;
        let channel_name = cluster
            .channel
            .as_deref()
            .filter(|c| !c.is_empty())
            .unwrap_or(crate::channel::DEFAULT_CHANNEL);
        let channel = channels.get(channel_name)?;
        let reported = ncp
            .status
            .as_ref()
            .and_then(|s| s.version.clone())
            .or_else(|| apiserver.component_status().and_then(|s| s.version.clone()));
        let kubernetes = match from.map(str::to_string).or(reported) {
            Some(text) => parse(&text, "--from")?,
            None => {
                return Err(InputError {
                    reason: "UnknownRunningVersion",
                    message: format!(
                        "NestedControlPlane {} reports no running release; say where the path starts with --from (for example --from 1.35.4)",
                        ncp.name_any()
                    ),
                }
                .into());
            }
        };
        let etcd_running = match from_etcd
            .map(str::to_string)
            .or_else(|| running_release(&etcd).map(|v| v.to_string()))
        {
            Some(text) => Some(parse(&text, "--from-etcd")?),
            // A running release the channel no longer pairs with an etcd: the path is
            // refused or planned without knowing it.
            None => channel
                .resolve(crate::component::ComponentKind::Etcd, None, Some(&kubernetes))
                .ok(),
        };
        let running = crate::upgrade::RunningReleases {
            kubernetes: Some(kubernetes),
            etcd: etcd_running,
        };
        let path = crate::upgrade::plan_path(
            channel,
            &running,
            cluster.kubernetes_version.as_deref(),
            etcd.component().version.as_deref(),
        )
        .map_err(|e| anyhow::Error::new(e).context(format!("NestedControlPlane {}", ncp.name_any())))?;
        out.push(serde_json::json!({
            "nestedControlPlane": format!("{}/{}", cluster.namespace, ncp.name_any()),
            "channel": channel.name,
            "from": path.from.to_string(),
            "fromEtcd": path.from_etcd.as_ref().map(ToString::to_string),
            "target": path.target.to_string(),
            "path": path.summary(),
            "steps": path.steps.iter().map(|s| serde_json::json!({
                "kubernetes": s.kubernetes.to_string(),
                "etcd": s.etcd.to_string(),
                "etcdChanges": s.etcd_changes,
            })).collect::<Vec<_>>(),
        }));
    }
    if out.is_empty() {
        return Err(InputError {
            reason: "NoControlPlane",
            message: "the file holds no NestedControlPlane".into(),
        }
        .into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn ncp(spec: Option<Value>) -> Value {
        let mut doc = json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedControlPlane",
                             "metadata": {"name": "demo", "namespace": "t"}});
        if let Some(spec) = spec {
            doc["spec"] = spec;
        }
        doc
    }

    fn render(docs: Vec<Value>) -> anyhow::Result<Rendered> {
        render_documents(&ChannelRegistry::load(&[]).unwrap(), docs, &RenderOptions::default())
    }

    fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
        objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"))
    }

    #[test]
    fn a_control_plane_without_spec_renders_with_defaults() {
        let rendered = render(vec![ncp(None)]).unwrap();
        assert!(rendered.warnings.is_empty());
        let sts = find(&rendered.objects, "StatefulSet", "demo-apiserver");
        assert_eq!(sts["spec"]["replicas"], 1);
    }

    #[test]
    fn the_control_plane_replicas_are_the_apiservers() {
        let apiserver = json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedAPIServer",
                               "metadata": {"name": "demo-apiserver", "namespace": "t"}, "spec": {"replicas": 1}});
        let rendered = render(vec![ncp(Some(json!({"replicas": 3}))), apiserver]).unwrap();
        assert_eq!(
            find(&rendered.objects, "StatefulSet", "demo-apiserver")["spec"]["replicas"],
            3
        );
    }

    #[test]
    fn skew_is_checked_among_the_components_in_the_file() {
        let cm = json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedControllerManager",
                        "metadata": {"name": "demo-controller-manager", "namespace": "t"}, "spec": {"version": "1.37"}});
        let err = render(vec![ncp(Some(json!({"version": "1.35"}))), cm]).unwrap_err();
        assert_eq!(error_reason(&err), Some("SkewNotAllowed"), "{err:#}");
    }

    #[test]
    fn unknown_fields_are_warnings_or_with_strict_errors() {
        let doc = ncp(Some(
            json!({"verison": "1.36", "clusterNetwork": {"services": {"cidr": "x"}}}),
        ));
        let rendered = render(vec![doc.clone()]).unwrap();
        assert_eq!(
            rendered.warnings,
            [
                "unknown field \"spec.clusterNetwork.services.cidr\" in NestedControlPlane t/demo",
                "unknown field \"spec.verison\" in NestedControlPlane t/demo",
            ]
        );
        let strict = RenderOptions {
            strict: true,
            ..RenderOptions::default()
        };
        let err = render_documents(&ChannelRegistry::load(&[]).unwrap(), vec![doc], &strict).unwrap_err();
        assert_eq!(error_reason(&err), Some("UnknownField"));
        assert!(err.to_string().contains("spec.verison"), "{err}");
        let mut meta = ncp(None);
        meta["metadata"]["lables"] = json!({});
        assert_eq!(
            render(vec![meta]).unwrap().warnings,
            ["unknown field \"metadata.lables\" in NestedControlPlane t/demo"]
        );
    }

    #[test]
    fn the_same_object_twice_is_refused() {
        let err = render(vec![ncp(None), ncp(Some(json!({"version": "1.36"})))]).unwrap_err();
        assert_eq!(error_reason(&err), Some("DuplicateObject"));
        assert!(
            err.to_string()
                .contains("NestedControlPlane t/demo is in the file twice (documents 1 and 2)"),
            "{err}"
        );
    }

    #[test]
    fn a_bad_field_is_refused_with_its_path_and_reason() {
        let err = render(vec![ncp(Some(
            json!({"controlPlaneEndpoint": {"host": "api.example.com", "port": 70000}}),
        ))])
        .unwrap_err();
        assert_eq!(error_reason(&err), Some("InvalidEndpoint"));
        assert!(
            err.to_string()
                .contains("spec.controlPlaneEndpoint.port: Invalid value: 70000: must be a TCP port"),
            "{err}"
        );
    }

    #[test]
    fn a_channel_object_outside_the_namespace_is_refused_with_its_template_line() {
        let files = vec![
            (
                "channel.yaml".to_string(),
                "name: escape\ncomponents:\n  etcd:\n    versions: [\"3.6.8\"]\n  apiserver:\n    versions: [\"1.36.3\"]\n  controller-manager:\n    versions: [\"1.36.3\"]\ndefaults:\n  kubernetes: \"1.36.3\"\ncompatibility:\n  - kubernetes: \"1.36\"\n    etcd: \"3.6.8\"\n".to_string(),
            ),
            (
                "3.6.8/etcd/rbac.yaml".to_string(),
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: {{ names.etcd }}\n".to_string(),
            ),
            ("1.36.3/apiserver/a.yaml".to_string(), "kind: ConfigMap\napiVersion: v1\nmetadata:\n  name: a\n".to_string()),
            ("1.36.3/controller-manager/a.yaml".to_string(), "kind: ConfigMap\napiVersion: v1\nmetadata:\n  name: c\n".to_string()),
        ];
        let mut channels = ChannelRegistry::load(&[]).unwrap();
        channels.insert(crate::channel::Channel::from_files("escape", "test", files).unwrap());
        let err = render_documents(
            &channels,
            vec![ncp(Some(json!({"channel": "escape"})))],
            &RenderOptions::default(),
        )
        .unwrap_err();
        assert_eq!(error_reason(&err), Some("ObjectOutsideNamespace"));
        assert!(
            format!("{err:#}")
                .contains("template 3.6.8/etcd/rbac.yaml line 2: ClusterRoleBinding demo-etcd is cluster-scoped"),
            "{err:#}"
        );
    }
}
