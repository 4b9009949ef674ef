//! `capn render`: what the controllers would apply for the resources in a file, computed
//! offline through the same [`crate::plan::plan`] the controllers call.
//!
//! Every problem in the input is reported in one run ([`RenderErrors`]), each under the
//! object and the field that holds it, as the API server and the controllers would name them.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::DynamicObject;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::api::{NestedAPIServer, NestedControlPlane, NestedControllerManager, NestedEtcd};
use crate::channel::{ChannelError, ChannelRegistry};
use crate::controllers::component::ComponentResource;
use crate::controllers::shared::read::{CAPI_GROUP, cluster_settings, controller_reference};
use crate::pki::{SECRET_TYPE, SecretNames};
use crate::plan::{
    ClusterSettings, ComponentRequest, Plan, PlanError, Running, Upstream, check_cluster, check_control_plane, plan,
    resolve,
};
use crate::validate::FieldError;

fn kind_of(doc: &Value) -> (&str, &str) {
    let s = |k: &str| doc.get(k).and_then(Value::as_str).unwrap_or_default();
    (s("apiVersion"), s("kind"))
}

fn name_of(doc: &Value) -> &str {
    doc.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
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

/// One thing wrong with the input of `capn render`: the object and field that hold it, a
/// short stable reason and what is wrong. Displayed as `Kind name: path: message`, each part
/// present once.
#[derive(Clone, Debug)]
pub struct Problem {
    /// The object, as `Kind name` (`NestedEtcd demo-etcd`); `None` for the input as a whole
    /// (two documents that are one object, no NestedControlPlane at all).
    pub object: Option<String>,
    /// The field, as kubectl names it (`spec.certSANs[0]`, `spec.etcd.name`); `None` when no
    /// single field is at fault.
    pub path: Option<String>,
    /// Short stable reason: the controllers' condition reason for the same input
    /// (`InvalidSAN`, `SkewNotAllowed`, ...) or one of [`InputError`]'s.
    pub reason: &'static str,
    /// What is wrong, and what is allowed where capn knows.
    pub message: String,
    /// The error the controllers meet for the same input (a [`PlanError`] or a
    /// [`FieldError`]), when planning or a field rule found the problem: its Display is the
    /// message they put on the condition.
    pub cause: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

/// The same problem: the same place, reason and message (whatever the cause).
impl PartialEq for Problem {
    fn eq(&self, other: &Self) -> bool {
        (&self.object, &self.path, self.reason, &self.message)
            == (&other.object, &other.path, other.reason, &other.message)
    }
}

impl Eq for Problem {}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for part in [&self.object, &self.path].into_iter().flatten() {
            write!(f, "{part}: ")?;
        }
        f.write_str(&self.message)
    }
}

impl Problem {
    fn input(object: Option<String>, path: Option<String>, reason: &'static str, message: String) -> Self {
        Self {
            object,
            path,
            reason,
            message,
            cause: None,
        }
    }

    /// A field rule's error, in the words the API server uses at admission.
    fn field(e: &FieldError) -> Self {
        Self {
            object: Some(format!("{} {}", e.kind, e.name)),
            path: Some(e.path.clone()),
            reason: e.reason,
            message: format!("Invalid value: {}: {}", e.value, e.message),
            cause: Some(Arc::new(e.clone())),
        }
    }
}

impl From<InputError> for Problem {
    fn from(e: InputError) -> Self {
        Self::input(None, None, e.reason, e.message)
    }
}

/// Every problem `capn render` found in its input, in the order of the input (documents
/// first, then what planning each NestedControlPlane found), each once. Displayed one
/// problem a line; [`error_reason`] gives the first one's reason.
#[derive(Debug, Default, thiserror::Error)]
pub struct RenderErrors {
    /// The problems, at least one.
    pub problems: Vec<Problem>,
}

impl fmt::Display for RenderErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

impl RenderErrors {
    /// Adds `problem` unless the same one is already there (every component inherits the
    /// control plane's settings, and would report a bad one again).
    fn push(&mut self, problem: Problem) {
        if !self.problems.contains(&problem) {
            self.problems.push(problem);
        }
    }
}

/// Where a component's plan error belongs: a version or channel the component inherits is
/// the NestedControlPlane's field, not the component's; so are the apiserver's replicas when
/// the control plane sets them.
struct Origin<'a> {
    ncp: &'a NestedControlPlane,
    /// `Kind name` of the component.
    component: String,
    spec: &'a crate::api::ComponentSpec,
    /// The control plane's `spec.replicas` went into this component (the apiserver).
    replicas_from_ncp: bool,
}

impl Origin<'_> {
    fn ncp_object(&self) -> String {
        format!("NestedControlPlane {}", self.ncp.name_any())
    }

    fn problem(&self, error: PlanError) -> Problem {
        let set = |v: Option<&String>| v.map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let (own_version, own_channel) = (set(self.spec.version.as_ref()), set(self.spec.channel.as_ref()));
        let (object, path) = match &error {
            PlanError::Field(e) => {
                let mut problem = Problem::field(e);
                if self.replicas_from_ncp && e.path == "spec.replicas" {
                    problem.object = Some(self.ncp_object());
                }
                return problem;
            }
            PlanError::Channel(
                ChannelError::UnknownVersion { requested, .. } | ChannelError::InvalidVersion { requested, .. },
            ) => {
                let own = own_version.as_deref() == Some(requested.trim());
                (
                    if own { self.component.clone() } else { self.ncp_object() },
                    Some("spec.version"),
                )
            }
            PlanError::Reference(e) => {
                return Problem {
                    object: Some(self.component.clone()),
                    path: Some(e.field.to_string()),
                    reason: e.reason,
                    message: e.detail.clone(),
                    cause: Some(Arc::new(error.clone())),
                };
            }
            PlanError::Channel(ChannelError::NoEtcdForKubernetes { .. }) => (self.ncp_object(), Some("spec.version")),
            PlanError::Channel(ChannelError::UnknownSize { requested, .. }) => {
                let own = set(self.spec.size.as_ref()).as_deref() == Some(requested.trim());
                (
                    if own { self.component.clone() } else { self.ncp_object() },
                    Some("spec.size"),
                )
            }
            PlanError::Channel(ChannelError::UnknownChannel { requested, .. }) => {
                let own = own_channel.as_deref() == Some(requested.trim());
                (
                    if own { self.component.clone() } else { self.ncp_object() },
                    Some("spec.channel"),
                )
            }
            PlanError::Skew(_) => {
                let own = own_version.is_some();
                (
                    if own { self.component.clone() } else { self.ncp_object() },
                    Some("spec.version"),
                )
            }
            PlanError::InvalidReplicas(_) if self.replicas_from_ncp => (self.ncp_object(), Some("spec.replicas")),
            PlanError::InvalidReplicas(_) => (self.component.clone(), Some("spec.replicas")),
            _ => (self.component.clone(), None),
        };
        let mut message = error.to_string();
        let mut source = std::error::Error::source(&error);
        while let Some(cause) = source {
            message = format!("{message}: {cause}");
            source = cause.source();
        }
        Problem {
            object: Some(object),
            path: path.map(str::to_string),
            reason: error.reason(),
            message,
            cause: Some(Arc::new(error)),
        }
    }
}

/// A document read as the type of its kind; a type error names its field.
fn read<K: DeserializeOwned>(doc: &Value) -> Result<K, Problem> {
    serde_path_to_error::deserialize(with_spec(doc)).map_err(|e| {
        let (_, kind) = kind_of(doc);
        let path = e.path().to_string();
        Problem {
            object: Some(format!("{kind} {}", name_of(doc))),
            path: (path != ".").then_some(path),
            reason: "InvalidType",
            message: e.into_inner().to_string(),
            cause: None,
        }
    })
}

/// The document of kind `K` named `name`: `Ok(None)` when the file has none; an error when
/// it has one that cannot be read as `K` (`None` when it is in `skip`: already reported).
fn find<K: ComponentResource>(
    docs: &[Value],
    skip: &BTreeSet<usize>,
    name: &str,
) -> Result<Option<K>, Option<Problem>> {
    let Some((index, doc)) = docs.iter().enumerate().find(|(_, doc)| {
        let (api_version, kind) = kind_of(doc);
        kind == K::kind(&()) && api_version == K::api_version(&()) && name_of(doc) == name
    }) else {
        return Ok(None);
    };
    if skip.contains(&index) {
        return Err(None);
    }
    read(doc).map(Some).map_err(Some)
}

/// The component of kind `K` for `ncp`: the one the file holds under the referenced name,
/// else the default one the NestedControlPlane controller would create.
///
/// # Errors
/// A reference to a component the file lacks, or a component that cannot be read (`None`
/// when its document is in `skip`: already reported).
fn component<K: ComponentResource>(
    docs: &[Value],
    skip: &BTreeSet<usize>,
    ncp: &NestedControlPlane,
) -> Result<(K, bool), Option<Problem>> {
    let name = K::reference(ncp)
        .map(str::to_string)
        .unwrap_or_else(|| format!("{}-{}", ncp.name_any(), K::KIND.as_str()));
    if let Some(found) = find::<K>(docs, skip, &name)? {
        return Ok((found, false));
    }
    if K::reference(ncp).is_some() {
        return Err(Some(Problem::input(
            Some(format!("NestedControlPlane {}", ncp.name_any())),
            Some(format!("spec.{}.name", K::REFERENCE_FIELD)),
            "ComponentMissing",
            format!("references {} {name}, which is not in the file", K::kind(&())),
        )));
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
    docs: &[Value],
) -> Result<Plan, PlanError> {
    let name = component.name_any();
    // What a component references is read from the file, as the controllers read it from
    // the cluster (a ConfigMap of that name in the input; the namespace is not compared).
    let text = |(config_map, key): (&str, &str)| {
        docs.iter()
            .find(|d| kind_of(d) == ("v1", "ConfigMap") && name_of(d) == config_map)
            .and_then(|d| d.get("data"))
            .and_then(|data| data.get(key))
            .and_then(Value::as_str)
    };
    let referenced = match crate::plan::audit::policy_reference(component.audit()) {
        Some(at @ (config_map, key)) => Some(crate::plan::audit::referenced_policy(&name, config_map, key, text(at))?),
        None => None,
    };
    let issuer = crate::plan::service_account_issuer(&cluster.dns_domain);
    let authentication = match crate::plan::authentication::configuration_reference(component.authentication()) {
        Some(at @ (config_map, key)) => Some(crate::plan::authentication::referenced_configuration(
            &name,
            config_map,
            key,
            text(at),
            &issuer,
        )?),
        None => None,
    };
    let authorization = match crate::plan::authorization::configuration_reference(component.authorization()) {
        Some(at @ (config_map, key)) => Some(crate::plan::authorization::referenced_configuration(
            &name,
            config_map,
            key,
            text(at),
        )?),
        None => None,
    };
    let request = ComponentRequest {
        kind: K::KIND,
        resource_name: &name,
        spec: component.component(),
        etcd_storage: component.etcd_storage(),
        etcd_restore: None,
        owner: owner_of(component),
        running,
        audit: component.audit().map(|spec| crate::plan::AuditRequest {
            spec,
            referenced: referenced.as_ref(),
        }),
        authentication: component.authentication(),
        authorization: component.authorization(),
        referenced: crate::plan::ReferencedConfigurations {
            authentication: authentication.as_ref(),
            authorization: authorization.as_ref(),
        },
    };
    plan(channels, cluster, &request, upstream)
}

/// Input `capn render` refuses before planning: duplicate objects, unknown fields (unless
/// `strict` is off), a reference to a component the file lacks, no NestedControlPlane at
/// all, a kind capn does not serve, a value of the wrong type.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct InputError {
    /// Short stable reason (`DuplicateObject`, `UnknownField`, `ComponentMissing`,
    /// `NoControlPlane`, `UnknownKind`, `InvalidType`, `UnsupportedValue`, `InvalidVersion`,
    /// `UnknownRunningVersion`).
    pub reason: &'static str,
    /// What is wrong.
    pub message: String,
}

/// The reason of a `capn render` error: the same reason the controllers put on the
/// condition for the same input (`InvalidEndpoint`, `SkewNotAllowed`, ...); for
/// [`RenderErrors`], the first problem's.
pub fn error_reason(error: &anyhow::Error) -> Option<&'static str> {
    error.chain().find_map(|e| {
        e.downcast_ref::<RenderErrors>()
            .and_then(|e| e.problems.first())
            .map(|p| p.reason)
            .or_else(|| e.downcast_ref::<crate::plan::PlanError>().map(|e| e.reason()))
            .or_else(|| e.downcast_ref::<crate::validate::FieldError>().map(|e| e.reason()))
            .or_else(|| e.downcast_ref::<InputError>().map(|e| e.reason))
            .or_else(|| e.downcast_ref::<crate::upgrade::PathError>().map(|e| e.reason()))
    })
}

/// The error `capn render` exits with: each problem on a line of its own as
/// `<Reason>: <Kind name>: <path>: <message>` (the binary prefixes the first line with
/// `error: `, and this every further one).
pub(crate) fn cli_error(error: anyhow::Error) -> anyhow::Error {
    if let Some(errors) = error.downcast_ref::<RenderErrors>() {
        let lines: Vec<String> = errors.problems.iter().map(|p| format!("{}: {p}", p.reason)).collect();
        return anyhow::anyhow!("{}", lines.join("\nerror: "));
    }
    match error_reason(&error) {
        Some(reason) => anyhow::anyhow!("{reason}: {error:#}"),
        None => error,
    }
}

/// How `capn render` treats its input.
#[derive(Clone, Debug)]
pub struct RenderOptions {
    /// DNS domain of the super cluster.
    pub super_dns_domain: String,
    /// Unknown fields are errors (the default, like kubectl's strict field validation);
    /// `false` makes them warnings.
    pub strict: bool,
}

impl Default for RenderOptions {
    fn default() -> Self {
        Self {
            super_dns_domain: crate::plan::DEFAULT_DNS_DOMAIN.into(),
            strict: true,
        }
    }
}

/// What `capn render` produced: the objects, and warnings (unknown fields without `strict`)
/// for stderr.
#[derive(Clone, Debug, Default)]
pub struct Rendered {
    /// Every object, in the order the controllers apply them.
    pub objects: Vec<Value>,
    /// One line each, without the `Warning: ` the binary prints before it.
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

/// Two documents that are the same object (the second would silently replace the first in
/// the cluster), each pair once.
fn duplicates(docs: &[Value]) -> Vec<InputError> {
    let mut seen = BTreeMap::new();
    let mut out = Vec::new();
    for (i, doc) in docs.iter().enumerate() {
        let id = identity(doc);
        if let Some(first) = seen.get(&id) {
            let (_, kind, namespace, name) = id;
            out.push(InputError {
                reason: "DuplicateObject",
                message: format!(
                    "{kind} {namespace}/{name} is in the file twice (documents {first} and {}); an object may appear once",
                    i + 1
                ),
            });
        } else {
            seen.insert(id, i + 1);
        }
    }
    out
}

/// Refuses two documents that are the same object: the first pair.
fn refuse_duplicates(docs: &[Value]) -> Result<(), InputError> {
    duplicates(docs).into_iter().next().map_or(Ok(()), Err)
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

/// The number of single-character edits (insert, delete, substitute) between `a` and `b`,
/// ignoring case (Levenshtein, from `strsim`, which clap's suggestions use too).
fn edit_distance(a: &str, b: &str) -> usize {
    strsim::levenshtein(&a.to_lowercase(), &b.to_lowercase())
}

/// The candidate closest to `word` other than `word` itself, if `word` is a likely
/// misspelling of it: a difference of case only, or at most 2 edits and fewer than half of
/// the word.
fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (edit_distance(word, c), c))
        .filter(|&(d, c)| c != word && d <= 2 && d * 2 < c.chars().count().max(word.chars().count()))
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}

/// What the CRD schema check found in one document.
#[derive(Default)]
struct SchemaFindings {
    /// Fields the schema does not have, with a near field name if there is one.
    unknown: Vec<(String, Option<String>)>,
    /// Values the schema refuses (the wrong type, a value outside an enum): path, reason
    /// and message in the API server's words.
    types: Vec<(String, &'static str, String)>,
}

/// Checks `doc` against the `openAPIV3Schema` of its CRD: the fields it does not have (as
/// kubectl's strict field validation names them, `spec.verison`), and values of the wrong
/// type (as the API server names them, `spec.replicas`).
fn check_schema(doc: &Value, schema: &Value) -> SchemaFindings {
    let mut out = SchemaFindings::default();
    if let Some(metadata) = doc.get("metadata").and_then(Value::as_object) {
        for key in metadata.keys().filter(|k| !OBJECT_META_FIELDS.contains(&k.as_str())) {
            let near = closest(key, OBJECT_META_FIELDS.iter().copied()).map(|n| format!("metadata.{n}"));
            out.unknown.push((format!("metadata.{key}"), near));
        }
    }
    let mut root = doc.clone();
    if let Some(map) = root.as_object_mut() {
        for key in ["metadata", "apiVersion", "kind"] {
            map.remove(key);
        }
    }
    walk_schema(&root, schema, "", &mut out);
    out
}

/// Why `schema` refuses `value`, if it does: its type (an `int32` out of range too), or a
/// value outside its `enum`.
fn refused_by(value: &Value, schema: &Value) -> Option<(&'static str, String)> {
    let integer = value.is_i64() || value.is_u64();
    let int_or_string = schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    let wanted = schema.get("type").and_then(Value::as_str);
    let fits = match wanted {
        _ if int_or_string => value.is_string() || integer,
        Some("object") => value.is_object(),
        Some("array") => value.is_array(),
        Some("string") => value.is_string(),
        Some("boolean") => value.is_boolean(),
        Some("integer") => integer,
        Some("number") => value.is_number(),
        _ => true,
    };
    if !fits {
        let wanted = if int_or_string {
            "integer or string"
        } else {
            wanted.unwrap_or_default()
        };
        return Some((
            "InvalidType",
            format!("Invalid value: {value}: must be of type {wanted}"),
        ));
    }
    if integer
        && schema.get("format").and_then(Value::as_str) == Some("int32")
        && value.as_i64().is_none_or(|n| i32::try_from(n).is_err())
    {
        return Some((
            "InvalidType",
            format!("Invalid value: {value}: must be a 32-bit integer"),
        ));
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        let allowed: Vec<String> = allowed.iter().map(Value::to_string).collect();
        return Some((
            "UnsupportedValue",
            format!("Unsupported value: {value}: supported values: {}", allowed.join(", ")),
        ));
    }
    None
}

fn walk_schema(value: &Value, schema: &Value, path: &str, out: &mut SchemaFindings) {
    // The API server drops a null it does not accept; serde reads it as absent.
    if value.is_null() {
        return;
    }
    if !path.is_empty()
        && let Some((reason, message)) = refused_by(value, schema)
    {
        out.types.push((path.to_string(), reason, message));
        return;
    }
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
                    (None, None) if properties.is_some() => {
                        let near = properties
                            .and_then(|p| closest(key, p.keys().map(String::as_str)))
                            .map(&join);
                        out.unknown.push((join(key), near));
                    }
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

/// A CRD capn serves, as `capn render` checks documents against it.
struct Crd {
    group: String,
    kind: String,
    /// The served versions.
    versions: Vec<String>,
    /// The `openAPIV3Schema`, as JSON.
    schema: Option<Value>,
}

fn served_crds() -> Vec<Crd> {
    crate::crds::crds()
        .into_iter()
        .map(|c| Crd {
            versions: c
                .spec
                .versions
                .iter()
                .filter(|v| v.served)
                .map(|v| v.name.clone())
                .collect(),
            schema: c
                .spec
                .versions
                .first()
                .and_then(|v| v.schema.as_ref())
                .and_then(|s| serde_json::to_value(&s.open_api_v3_schema).ok()),
            group: c.spec.group,
            kind: c.spec.names.kind,
        })
        .collect()
}

/// A document whose kind is none capn knows although it looks meant to be one: no kind at
/// all, an unknown kind in capn's API group, a near miss of a known kind, or a known kind at
/// an API version capn does not serve.
fn unknown_kind(index: usize, doc: &Value, crds: &[Crd]) -> Option<Problem> {
    let (api_version, kind) = kind_of(doc);
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let name = name_of(doc);
    if !doc.is_object() || kind.is_empty() {
        return Some(Problem::input(
            None,
            None,
            "UnknownKind",
            format!(
                "document {} has no kind; capn render reads NestedControlPlane, its components and a Cluster API Cluster",
                index + 1
            ),
        ));
    }
    let object = Some(format!("{kind} {name}"));
    if let Some(crd) = crds.iter().find(|c| c.kind == kind) {
        if crd.group == group && crd.versions.iter().any(|v| v == version) {
            return None;
        }
        if crd.group == group || group.is_empty() {
            return Some(Problem::input(
                object,
                Some("apiVersion".into()),
                "UnknownKind",
                format!(
                    "{kind} is served as {}/{}, not {api_version:?}",
                    crd.group,
                    crd.versions.join(", ")
                ),
            ));
        }
    }
    if kind == "Cluster" && group == CAPI_GROUP {
        return None;
    }
    // Cluster API's Cluster is a near miss only in its own group.
    let cluster = (group == CAPI_GROUP).then_some("Cluster");
    let suggestion = closest(kind, crds.iter().map(|c| c.kind.as_str()).chain(cluster));
    // infrastructure.cluster.x-k8s.io is every infrastructure provider's group.
    let capn_group = crds
        .iter()
        .any(|c| c.group == group && c.group != "infrastructure.cluster.x-k8s.io");
    if suggestion.is_none() && !capn_group {
        return None;
    }
    let hint = match suggestion {
        Some(near) => format!("; did you mean {near}?"),
        None => {
            let kinds: Vec<&str> = crds
                .iter()
                .filter(|c| c.group == group)
                .map(|c| c.kind.as_str())
                .collect();
            format!("; {group} has {}", kinds.join(", "))
        }
    };
    Some(Problem::input(
        object,
        Some("kind".into()),
        "UnknownKind",
        format!("{kind:?} is not a kind of {api_version}{hint}"),
    ))
}

/// Checks one document before planning: its kind, its fields against its CRD's schema
/// (unknown fields, types), that it reads as its type, and the field rules. Returns whether
/// it can be planned from (it read as its type).
fn check_document(
    index: usize,
    doc: &Value,
    crds: &[Crd],
    strict: bool,
    errors: &mut RenderErrors,
    warnings: &mut Vec<String>,
) -> bool {
    if let Some(problem) = unknown_kind(index, doc, crds) {
        errors.push(problem);
        return false;
    }
    let (api_version, kind) = kind_of(doc);
    let group = api_version.split_once('/').map(|(g, _)| g).unwrap_or_default();
    let Some(schema) = crds
        .iter()
        .find(|c| c.kind == kind && c.group == group)
        .and_then(|c| c.schema.as_ref())
    else {
        return true;
    };
    let object = format!("{kind} {}", name_of(doc));
    let findings = check_schema(doc, schema);
    for (path, near) in findings.unknown {
        let hint = near.map(|n| format!("; did you mean {n}?")).unwrap_or_default();
        if strict {
            errors.push(Problem::input(
                Some(object.clone()),
                Some(path),
                "UnknownField",
                format!("unknown field{hint} (--strict=false makes unknown fields warnings)"),
            ));
        } else {
            let (_, kind, namespace, name) = identity(doc);
            warnings.push(format!("unknown field \"{path}\" in {kind} {namespace}/{name}{hint}"));
        }
    }
    let field_rules = |errors: &mut RenderErrors, wrong_type: &[String]| {
        if let Some(rules) = crate::validate::Kind::from_name(kind) {
            // A value of the wrong type breaks its rule too: it is reported once, as a type error.
            for e in crate::validate::check_object(rules, &with_spec(doc)) {
                if !wrong_type
                    .iter()
                    .any(|p| e.path == *p || e.path.starts_with(&format!("{p}.")))
                {
                    errors.push(Problem::field(&e));
                }
            }
        }
    };
    if !findings.types.is_empty() {
        let mut wrong_type = Vec::new();
        for (path, reason, message) in findings.types {
            errors.push(Problem::input(
                Some(object.clone()),
                Some(path.clone()),
                reason,
                message,
            ));
            wrong_type.push(path);
        }
        field_rules(errors, &wrong_type);
        return false;
    }
    let read_as = |doc: &Value| -> Result<(), Problem> {
        match kind {
            "NestedControlPlane" => read::<NestedControlPlane>(doc).map(drop),
            "NestedEtcd" => read::<NestedEtcd>(doc).map(drop),
            "NestedAPIServer" => read::<NestedAPIServer>(doc).map(drop),
            "NestedControllerManager" => read::<NestedControllerManager>(doc).map(drop),
            _ => Ok(()),
        }
    };
    if let Err(problem) = read_as(doc) {
        let wrong_type: Vec<String> = problem.path.iter().cloned().collect();
        errors.push(problem);
        field_rules(errors, &wrong_type);
        return false;
    }
    field_rules(errors, &[]);
    true
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
/// fields the CRD does not have are errors (warnings without `strict`); the same object
/// twice is an error.
///
/// A CAPI `Cluster` in `docs` whose `spec.controlPlaneRef` names a NestedControlPlane is
/// treated as its owner (as Cluster API will make it): its name is the cluster name and its
/// `spec.clusterNetwork` applies.
///
/// # Errors
/// [`RenderErrors`] with every problem found, each under its object and field: a kind capn
/// does not serve (with the nearest known kind), a value of the wrong type, a duplicate, an
/// unknown field with `strict`, a reference to a component not in `docs`, no
/// NestedControlPlane, or any plan error (a field rule, unknown version or channel, a skew
/// rule, a failing patch, ...); a version or channel a component inherits is reported
/// against the NestedControlPlane's field. [`error_reason`] gives the first one's reason.
pub fn render_documents(
    channels: &ChannelRegistry,
    docs: Vec<Value>,
    options: &RenderOptions,
) -> anyhow::Result<Rendered> {
    let docs: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
    let mut errors = RenderErrors::default();
    for e in duplicates(&docs) {
        errors.push(e.into());
    }
    let crds = served_crds();
    let mut warnings = Vec::new();
    // Documents that cannot be read as their kind: reported, and not planned from.
    let mut unreadable = BTreeSet::new();
    for (i, doc) in docs.iter().enumerate() {
        if !check_document(i, doc, &crds, options.strict, &mut errors, &mut warnings) {
            unreadable.insert(i);
        }
    }
    let mut out = Vec::new();
    let mut control_planes = 0;
    for (i, doc) in docs.iter().enumerate() {
        if kind_of(doc) != (NestedControlPlane::api_version(&()).as_ref(), "NestedControlPlane") {
            continue;
        }
        control_planes += 1;
        if unreadable.contains(&i) {
            continue;
        }
        match read::<NestedControlPlane>(doc) {
            Ok(ncp) => render_control_plane(channels, &docs, &unreadable, ncp, options, &mut out, &mut errors),
            Err(problem) => errors.push(problem),
        }
    }
    let misspelt_kind = errors.problems.iter().any(|p| p.reason == "UnknownKind");
    if control_planes == 0 && !misspelt_kind {
        errors.push(
            InputError {
                reason: "NoControlPlane",
                message: "no NestedControlPlane (controlplane.cluster.x-k8s.io/v1beta1) in the input".into(),
            }
            .into(),
        );
    }
    if !errors.problems.is_empty() {
        return Err(errors.into());
    }
    Ok(Rendered { objects: out, warnings })
}

/// Renders one NestedControlPlane into `out`, or adds what is wrong with it to `errors`:
/// every component is planned even when another fails, so that each reports its problems.
fn render_control_plane(
    channels: &ChannelRegistry,
    docs: &[Value],
    skip: &BTreeSet<usize>,
    mut ncp: NestedControlPlane,
    options: &RenderOptions,
    out: &mut Vec<Value>,
    errors: &mut RenderErrors,
) {
    if ncp.namespace().is_none() {
        ncp.meta_mut().namespace = Some("default".into());
    }
    let capi_cluster = docs.iter().find(|d| {
        let (api_version, kind) = kind_of(d);
        kind == "Cluster"
            && api_version.starts_with(&format!("{CAPI_GROUP}/"))
            && d.pointer("/spec/controlPlaneRef/name") == Some(&Value::from(ncp.name_any()))
    });
    let capi_cluster: Option<DynamicObject> = match capi_cluster.map(read).transpose() {
        Ok(c) => c,
        Err(problem) => {
            errors.push(problem);
            return;
        }
    };
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
    // The control plane's own fields were checked with its document; these are the settings
    // it passes on, some of which come from a label or the Cluster (reported, as the
    // controllers report them, under the cluster's name).
    if let Err(e) = check_cluster(&cluster) {
        errors.push(match &e {
            PlanError::Field(f) => Problem::field(f),
            _ => Problem::input(
                Some(format!("NestedControlPlane {}", ncp.name_any())),
                None,
                e.reason(),
                e.to_string(),
            ),
        });
    }

    let etcd = component::<NestedEtcd>(docs, skip, &ncp);
    let apiserver = component::<NestedAPIServer>(docs, skip, &ncp);
    let controller_manager = component::<NestedControllerManager>(docs, skip, &ncp);
    for problem in [
        etcd.as_ref().err(),
        apiserver.as_ref().err(),
        controller_manager.as_ref().err(),
    ] {
        // A reference that breaks its field rule is not looked for again.
        let said = |p: &Problem| errors.problems.iter().any(|e| e.object == p.object && e.path == p.path);
        if let Some(problem) = problem.cloned().flatten().filter(|p| !said(p)) {
            errors.push(problem);
        }
    }
    let (Ok((etcd, etcd_new)), Ok((mut apiserver, apiserver_new)), Ok((controller_manager, cm_new))) =
        (etcd, apiserver, controller_manager)
    else {
        return;
    };
    // The scale subresource: the control plane's replicas are the apiserver's, as the
    // NestedControlPlane controller writes them into the NestedAPIServer.
    if let Some(replicas) = ncp.spec.replicas {
        apiserver.spec.component.replicas = Some(replicas);
    }
    let ncp_owner = owner_of(&ncp);
    let mut objects = Vec::new();
    for (new, value) in [
        (etcd_new, serde_json::to_value(&etcd)),
        (apiserver_new, serde_json::to_value(&apiserver)),
        (cm_new, serde_json::to_value(&controller_manager)),
    ] {
        if let (true, Ok(mut value)) = (new, value) {
            value["metadata"]["ownerReferences"] = serde_json::to_value(vec![&ncp_owner]).unwrap_or_default();
            objects.push(value);
        }
    }
    for name in SecretNames::new(&cluster.name).all() {
        objects.push(serde_json::json!({
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
    let origin = |kind: &str, name: String, spec, replicas_from_ncp| Origin {
        ncp: &ncp,
        component: format!("{kind} {name}"),
        spec,
        replicas_from_ncp,
    };
    let etcd_origin = origin("NestedEtcd", etcd.name_any(), etcd.component(), false);
    let apiserver_origin = origin(
        "NestedAPIServer",
        apiserver.name_any(),
        apiserver.component(),
        ncp.spec.replicas.is_some(),
    );
    let cm_origin = origin(
        "NestedControllerManager",
        controller_manager.name_any(),
        controller_manager.component(),
        false,
    );
    let mut failed = false;
    let mut keep = |plan: Result<Plan, PlanError>, origin: &Origin<'_>| match plan {
        Ok(plan) => Some(plan),
        Err(e) => {
            failed = true;
            errors.push(origin.problem(e));
            None
        }
    };
    let etcd_plan = keep(
        plan_component(channels, &cluster, &etcd, &Upstream::default(), etcd_running, docs),
        &etcd_origin,
    );
    // Without an etcd plan the apiserver is still planned, against the endpoints etcd
    // would publish, so that its own problems are reported too.
    let etcd_endpoints = etcd_plan.as_ref().map_or_else(
        || {
            let replicas = etcd.component().replicas.unwrap_or(1).max(1);
            crate::plan::etcd_members(&cluster.name, &cluster.namespace, replicas)
                .into_iter()
                .map(|m| m.client_url)
                .collect()
        },
        |p| p.etcd_endpoints.clone(),
    );
    let upstream = Upstream {
        etcd_endpoints,
        ..Upstream::default()
    };
    let apiserver_plan = keep(
        plan_component(channels, &cluster, &apiserver, &upstream, apiserver_running, docs),
        &apiserver_origin,
    );
    let cm_plan = keep(
        plan_component(
            channels,
            &cluster,
            &controller_manager,
            &Upstream::default(),
            cm_running,
            docs,
        ),
        &cm_origin,
    );
    if failed {
        return;
    }
    out.extend(objects);
    for plan in [etcd_plan, apiserver_plan, cm_plan].into_iter().flatten() {
        out.extend(plan.objects);
    }
}

/// A component [`component`] could not give, as an error of its own.
fn unreadable(problem: Option<Problem>) -> anyhow::Error {
    match problem {
        Some(problem) => RenderErrors {
            problems: vec![problem],
        }
        .into(),
        None => anyhow::anyhow!("a component of the file cannot be read"),
    }
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
    let one = |problem: Problem| RenderErrors {
        problems: vec![problem],
    };
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
        let mut ncp: NestedControlPlane = read(doc).map_err(one)?;
        if ncp.namespace().is_none() {
            ncp.meta_mut().namespace = Some("default".into());
        }
        let cluster = cluster_settings(&ncp, None, &options.super_dns_domain);
        check_control_plane(&serde_json::to_value(&ncp)?, &cluster)?;
        let none = BTreeSet::new();
        let (etcd, _) = component::<NestedEtcd>(&docs, &none, &ncp).map_err(unreadable)?;
        let (apiserver, _) = component::<NestedAPIServer>(&docs, &none, &ncp).map_err(unreadable)?;
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

    fn problems(err: &anyhow::Error) -> &[Problem] {
        &err.downcast_ref::<RenderErrors>()
            .unwrap_or_else(|| panic!("not RenderErrors: {err:#}"))
            .problems
    }

    fn component(kind: &str, name: &str, spec: Value) -> Value {
        json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": kind,
               "metadata": {"name": name, "namespace": "t"}, "spec": spec})
    }

    #[test]
    fn unknown_fields_are_errors_by_default_and_warnings_with_strict_false() {
        let doc = ncp(Some(
            json!({"verison": "1.36", "clusterNetwork": {"services": {"cidr": "x"}}}),
        ));
        let err = render(vec![doc.clone()]).unwrap_err();
        assert_eq!(error_reason(&err), Some("UnknownField"));
        assert_eq!(
            problems(&err).iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "NestedControlPlane demo: spec.clusterNetwork.services.cidr: unknown field (--strict=false makes unknown fields warnings)",
                "NestedControlPlane demo: spec.verison: unknown field; did you mean spec.version? (--strict=false makes unknown fields warnings)",
            ]
        );
        let lenient = RenderOptions {
            strict: false,
            ..RenderOptions::default()
        };
        let channels = ChannelRegistry::load(&[]).unwrap();
        let rendered = render_documents(&channels, vec![doc], &lenient).unwrap();
        assert_eq!(
            rendered.warnings,
            [
                "unknown field \"spec.clusterNetwork.services.cidr\" in NestedControlPlane t/demo",
                "unknown field \"spec.verison\" in NestedControlPlane t/demo; did you mean spec.version?",
            ]
        );
        let mut meta = ncp(None);
        meta["metadata"]["lables"] = json!({});
        assert_eq!(
            render_documents(&channels, vec![meta], &lenient).unwrap().warnings,
            ["unknown field \"metadata.lables\" in NestedControlPlane t/demo; did you mean metadata.labels?"]
        );
    }

    #[test]
    fn every_problem_is_reported_in_one_run() {
        let err = render(vec![ncp(Some(json!({
            "certSANs": ["bad san!"],
            "clusterNetwork": {"services": {"cidrBlocks": ["10.0.0.0/8"]}},
        })))])
        .unwrap_err();
        let found: Vec<_> = problems(&err)
            .iter()
            .map(|p| (p.reason, p.object.as_deref(), p.path.as_deref()))
            .collect();
        assert_eq!(
            found,
            [
                ("InvalidSAN", Some("NestedControlPlane demo"), Some("spec.certSANs[0]")),
                (
                    "InvalidServiceCIDR",
                    Some("NestedControlPlane demo"),
                    Some("spec.clusterNetwork.services.cidrBlocks[0]")
                ),
            ],
            "{err}"
        );
        assert_eq!(error_reason(&err), Some("InvalidSAN"));
        // The binary prints one line per problem, each with its reason.
        let printed = format!("error: {:#}", cli_error(err));
        assert_eq!(printed.lines().count(), 2, "{printed}");
        assert!(
            printed
                .lines()
                .nth(1)
                .is_some_and(|l| l.starts_with("error: InvalidServiceCIDR: NestedControlPlane demo: ")),
            "{printed}"
        );
    }

    #[test]
    fn a_type_error_names_its_object_and_field() {
        let etcd = component("NestedEtcd", "demo-etcd", json!({"replicas": "three"}));
        let err = render(vec![ncp(None), etcd]).unwrap_err();
        assert_eq!(
            problems(&err).iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["NestedEtcd demo-etcd: spec.replicas: Invalid value: \"three\": must be of type integer"]
        );
        assert_eq!(error_reason(&err), Some("InvalidType"));
        // What the schema cannot tell, serde does, with the field's path.
        let problem = read::<NestedControlPlane>(&ncp(Some(json!({"workloads": {"podSecurity": 1}}))))
            .map(drop)
            .unwrap_err();
        assert_eq!(problem.path.as_deref(), Some("spec.workloads.podSecurity"), "{problem}");
    }

    #[test]
    fn a_misspelt_kind_is_named_with_the_nearest_known_kind() {
        let mut doc = ncp(None);
        doc["kind"] = json!("NestedControlPlan");
        let err = render(vec![doc]).unwrap_err();
        assert_eq!(
            problems(&err).iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "NestedControlPlan demo: kind: \"NestedControlPlan\" is not a kind of controlplane.cluster.x-k8s.io/v1beta1; did you mean NestedControlPlane?"
            ],
            "the misspelt kind, and no NoControlPlane besides"
        );
        assert_eq!(error_reason(&err), Some("UnknownKind"));
        // Other kinds pass through untouched; a file of only those has no control plane.
        let config_map = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}});
        let err = render(vec![config_map]).unwrap_err();
        assert_eq!(error_reason(&err), Some("NoControlPlane"));
        assert_eq!(
            closest("NestedEcd", ["NestedEtcd", "NestedCluster"]),
            Some("NestedEtcd")
        );
        assert_eq!(closest("Secret", ["NestedEtcd", "Cluster"]), None);
        assert_eq!(closest("NestedApiServer", ["NestedAPIServer"]), Some("NestedAPIServer"));
        assert_eq!(closest("NestedEtcd", ["NestedEtcd"]), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn a_version_error_is_reported_against_the_object_that_set_it() {
        let err = render(vec![ncp(Some(json!({"version": "1.99"})))]).unwrap_err();
        assert_eq!(
            problems(&err).iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "NestedControlPlane demo: spec.version: apiserver version \"1.99\" is not in channel \"stable\"; available: 1.35.4, 1.36.3, 1.37.2"
            ],
            "once, on the NestedControlPlane, although every component inherits it"
        );
        assert_eq!(error_reason(&err), Some("UnknownVersion"));
        let etcd = component("NestedEtcd", "demo-etcd", json!({"version": "3.99.1"}));
        let err = render(vec![ncp(None), etcd]).unwrap_err();
        let found: Vec<_> = problems(&err)
            .iter()
            .map(|p| (p.object.as_deref(), p.path.as_deref()))
            .collect();
        assert_eq!(found, [(Some("NestedEtcd demo-etcd"), Some("spec.version"))], "{err}");
    }

    #[test]
    fn an_unknown_size_is_reported_against_the_object_that_set_it_with_the_sizes_there_are() {
        let err = render(vec![ncp(Some(json!({"size": "huge"})))]).unwrap_err();
        assert_eq!(
            problems(&err).iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "NestedControlPlane demo: spec.size: size \"huge\" is not in channel \"stable\"; available: large, medium, small"
            ],
            "once, on the NestedControlPlane, although every component inherits it"
        );
        assert_eq!(error_reason(&err), Some("UnknownSize"));
        let etcd = component("NestedEtcd", "demo-etcd", json!({"size": "tiny"}));
        let err = render(vec![ncp(Some(json!({"size": "small"}))), etcd]).unwrap_err();
        let found: Vec<_> = problems(&err)
            .iter()
            .map(|p| (p.object.as_deref(), p.path.as_deref(), p.reason))
            .collect();
        assert_eq!(
            found,
            [(Some("NestedEtcd demo-etcd"), Some("spec.size"), "UnknownSize")],
            "{err}"
        );
    }

    #[test]
    fn a_size_renders_its_settings_and_explicit_fields_win() {
        let apiserver = component(
            "NestedAPIServer",
            "demo-apiserver",
            json!({"extraArgs": {"max-requests-inflight": "300"}}),
        );
        let rendered = render(vec![ncp(Some(json!({"size": "small"}))), apiserver]).unwrap();
        let sts = find(&rendered.objects, "StatefulSet", "demo-apiserver");
        let container = &sts["spec"]["template"]["spec"]["containers"][0];
        let args: Vec<&str> = container["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|a| a.as_str())
            .collect();
        assert!(args.contains(&"--max-requests-inflight=300"), "extraArgs win: {args:?}");
        assert!(args.contains(&"--max-mutating-requests-inflight=50"), "{args:?}");
        assert_eq!(container["resources"]["requests"]["memory"], "256Mi");
        let etcd = find(&rendered.objects, "StatefulSet", "demo-etcd");
        let etcd_args = etcd["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
        assert!(etcd_args.contains("--quota-backend-bytes=268435456"), "{etcd_args}");
    }

    #[test]
    fn no_message_repeats_its_prefix() {
        let apiserver = component("NestedAPIServer", "demo-apiserver", json!({"replicas": 0}));
        let err = render(vec![ncp(None), apiserver]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "NestedAPIServer demo-apiserver: spec.replicas: Invalid value: 0: must be between 1 and 10"
        );
        assert_eq!(
            format!("{:#}", cli_error(err)),
            "InvalidReplicas: NestedAPIServer demo-apiserver: spec.replicas: Invalid value: 0: must be between 1 and 10"
        );
        // The control plane's replicas are the apiserver's: reported once, where they are set.
        let err = render(vec![ncp(Some(json!({"replicas": 0})))]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "NestedControlPlane demo: spec.replicas: Invalid value: 0: must be between 1 and 10"
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
    fn audit_settings_are_refused_with_their_path_and_a_referenced_policy_is_read_from_the_file() {
        let apiserver = |audit: Value| component("NestedAPIServer", "demo-apiserver", json!({"audit": audit}));
        let bad_level = render(vec![
            ncp(None),
            apiserver(json!({"policy": {"rules": [{"level": "Everything"}]}})),
        ])
        .unwrap_err();
        assert_eq!(error_reason(&bad_level), Some("InvalidAuditPolicy"));
        assert!(
            bad_level.to_string().contains(
                "NestedAPIServer demo-apiserver: spec.audit.policy.rules[0].level: Invalid value: \"Everything\": must be one of None, Metadata, Request, RequestResponse"
            ),
            "{bad_level}"
        );
        let by_ref = json!({"policyRef": {"name": "audit-policy", "key": "p.yaml"}});
        let missing = render(vec![ncp(None), apiserver(by_ref.clone())]).unwrap_err();
        assert_eq!(error_reason(&missing), Some("AuditPolicyMissing"));
        assert!(
            missing.to_string().contains(
                "NestedAPIServer demo-apiserver: spec.audit.policyRef: ConfigMap audit-policy key p.yaml: not found"
            ),
            "{missing}"
        );
        let config_map = |text: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "audit-policy"}, "data": {"p.yaml": text}});
        let invalid = render(vec![
            ncp(None),
            apiserver(by_ref.clone()),
            config_map("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Sometimes\n"),
        ])
        .unwrap_err();
        assert_eq!(error_reason(&invalid), Some("InvalidAuditPolicy"));
        assert!(
            invalid.to_string().contains(
                "spec.audit.policyRef: ConfigMap audit-policy key p.yaml: rules[0].level: Invalid value: \"Sometimes\""
            ),
            "{invalid}"
        );
        let rendered = render(vec![
            ncp(None),
            apiserver(by_ref),
            config_map("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Request\n"),
        ])
        .unwrap();
        let policy = find(&rendered.objects, "ConfigMap", "demo-audit-policy");
        assert!(
            policy["data"]["policy.yaml"]
                .as_str()
                .unwrap()
                .contains("\"level\": \"Request\""),
            "{policy}"
        );
    }

    #[test]
    fn a_configuration_ref_renders_what_the_same_configuration_inline_renders() {
        let apiserver = |spec: Value| component("NestedAPIServer", "demo-apiserver", spec);
        let authentication = json!({"jwt": [{"issuer": {"url": "https://sso.example.com", "audiences": ["t"]},
            "claimMappings": {"username": {"claim": "sub", "prefix": "sso:"}}}]});
        let authorization =
            json!({"authorizers": [{"type": "Node", "name": "node"}, {"type": "RBAC", "name": "rbac"}]});
        let document = |configuration: &Value, kind: &str| {
            let mut document = configuration.clone();
            document["apiVersion"] = "apiserver.config.k8s.io/v1".into();
            document["kind"] = kind.into();
            document.to_string()
        };
        let config_map = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "access"}, "data": {
            "config.yaml": document(&authentication, "AuthenticationConfiguration"),
            "authz.yaml": document(&authorization, "AuthorizationConfiguration"),
        }});
        let by_ref = json!({
            "authentication": {"configurationRef": {"name": "access"}},
            "authorization": {"configurationRef": {"name": "access", "key": "authz.yaml"}},
        });
        let inline = render(vec![
            ncp(None),
            apiserver(json!({
                "authentication": {"configuration": authentication},
                "authorization": {"configuration": authorization},
            })),
        ])
        .unwrap();
        let referenced = render(vec![ncp(None), apiserver(by_ref.clone()), config_map.clone()]).unwrap();
        for name in ["demo-authentication", "demo-authorization"] {
            assert_eq!(
                find(&referenced.objects, "ConfigMap", name)["data"],
                find(&inline.objects, "ConfigMap", name)["data"],
                "{name}"
            );
        }
        assert_eq!(
            find(&referenced.objects, "StatefulSet", "demo-apiserver")["spec"]["template"],
            find(&inline.objects, "StatefulSet", "demo-apiserver")["spec"]["template"],
            "the pod is the same whichever the source"
        );

        let missing = render(vec![ncp(None), apiserver(by_ref.clone())]).unwrap_err();
        assert_eq!(error_reason(&missing), Some("AuthenticationConfigurationMissing"));
        assert!(
            missing.to_string().contains(
                "NestedAPIServer demo-apiserver: spec.authentication.configurationRef: ConfigMap access key config.yaml: not found"
            ),
            "{missing}"
        );
        let mut wrong = config_map;
        wrong["data"]["authz.yaml"] = document(
            &json!({"authorizers": [{"type": "Node", "name": "node"}]}),
            "AuthorizationConfiguration",
        )
        .into();
        let invalid = render(vec![ncp(None), apiserver(by_ref), wrong]).unwrap_err();
        assert_eq!(error_reason(&invalid), Some("InvalidAuthorization"));
        assert!(
            invalid.to_string().contains(
                "spec.authorization.configurationRef: ConfigMap access key authz.yaml: authorizers: Invalid value: "
            ),
            "{invalid}"
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
