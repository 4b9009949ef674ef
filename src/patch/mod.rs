//! User patches and `extraArgs` on rendered objects (docs/design.md §4). Pure: no client, no clock,
//! no randomness.
//!
//! The rendering pipeline is `render → patch → validate → label`; this module is the
//! `patch` step. It takes the objects one component rendered (all in the component's
//! namespace) and applies, in this order, the component's `patches` ([`apply_patches`]) and
//! its `extraArgs` ([`apply_extra_args`]).
//!
//! # The three patch forms (docs/design.md §4)
//!
//! 1. **A partial object** with `apiVersion`, `kind` and `metadata.name` (`metadata.namespace`
//!    may be given and must then equal the target's). It is applied with *strategic merge*
//!    semantics, following the Kubernetes strategic merge patch rules
//!    (<https://kubernetes.io/docs/tasks/manage-kubernetes-objects/update-api-object-kubectl-patch/>,
//!    `sig-api-machinery/strategic-merge-patch.md`) for the well-known list merge keys:
//!
//!    | list | merged by |
//!    |---|---|
//!    | `containers`, `initContainers`, `ephemeralContainers`, `volumes`, `env`, `imagePullSecrets` | `name` |
//!    | `volumeMounts` | `mountPath` |
//!    | `ports` | `containerPort` when the elements have it (container ports), else `port` (Service ports) |
//!
//!    Maps merge recursively; `null` deletes a field; `$patch: delete` on a map deletes that
//!    map, and inside an element of a merged list deletes that element; `$patch: replace` on
//!    a map replaces it wholesale, and a list element `{$patch: replace}` replaces the list
//!    wholesale with the other elements. **Every other list is replaced as a whole** — notably
//!    `command` and `args`: a patch that sets `args` replaces the whole argument list. To
//!    change or add one flag, use `extraArgs` ([`apply_extra_args`]) instead. See
//!    [`strategic_merge`] for the details.
//! 2. **`{target: {kind, name, [apiVersion]}, jsonPatch: [...]}`** — a JSON Patch (RFC 6902,
//!    applied by the `json-patch` crate): JSON Pointer escapes `~1` (`/`) and `~0` (`~`) work
//!    in paths, `add` to `/-` appends to an existing array, and adding below a location that
//!    does not exist (for example appending to a missing array) is an error, as the RFC says.
//! 3. **`{target: {kind, name, [apiVersion]}, mergePatch: {...}}`** — a JSON Merge Patch
//!    (RFC 7386, republished as RFC 7396; applied by the `json-patch` crate): maps merge,
//!    `null` deletes, lists are replaced.
//!
//! # Rules (docs/design.md §4)
//!
//! - The target of a patch is the rendered object of the same `kind` and `metadata.name`;
//!   when an `apiVersion` is given, its API group (`apps` in `apps/v1`, the empty core group
//!   in `v1`) must match too. A patch whose target is not rendered is an error naming the
//!   objects that are ([`PatchError::TargetNotFound`]); it is never silently ignored.
//! - A patch may not change an object's `apiVersion`, `kind`, `metadata.name` or
//!   `metadata.namespace` ([`PatchError::ChangesIdentity`]), and patches cannot add objects:
//!   a tenant can therefore never create a cluster-scoped object or one in another namespace.
//! - Patching is all-or-nothing: on any error the objects are left exactly as rendered.
//! - Errors name the 0-based index of the failing patch (`patch 2: ...`) and the reason, and
//!   say what is allowed.

mod extra_args;
mod strategic;
#[cfg(test)]
mod tests;

use serde_json::Value;

pub use extra_args::apply_extra_args;
pub use strategic::strategic_merge;

/// Why patches or `extraArgs` could not be applied to a component's rendered objects.
/// Terminal: the component's `patches` or `extraArgs` must change. Every patch error names
/// the 0-based index of the patch in the component's `patches` list.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum PatchError {
    /// The patch is not one of the three forms of docs/design.md §4, or its content is malformed
    /// (an unknown `$patch` directive, an element of a merged list without its merge key,
    /// an operation that is not RFC 6902, an ambiguous target).
    #[error("patch {index}: {message}")]
    InvalidPatch {
        /// 0-based index of the patch.
        index: usize,
        /// What is wrong and what is allowed.
        message: String,
    },
    /// No rendered object matches the patch's target (docs/design.md §4: never silently ignored).
    #[error(
        "patch {index}: target {kind}/{name}{} is not among the rendered objects (rendered: {}); a patch can only change an object the component renders",
        api_version.as_deref().map(|v| format!(" (apiVersion {v})")).unwrap_or_default(),
        list_or_none(available)
    )]
    TargetNotFound {
        /// 0-based index of the patch.
        index: usize,
        /// The kind the patch asked for.
        kind: String,
        /// The name the patch asked for.
        name: String,
        /// The apiVersion the patch asked for, if any (only its group is compared).
        api_version: Option<String>,
        /// Every rendered object, as `Kind/name`, in rendering order.
        available: Vec<String>,
    },
    /// The patch changed the object's identity (docs/design.md §4: tenants must not escape their
    /// namespace; a patch may not rename, re-kind or move an object).
    #[error(
        "patch {index}: changes {field} of {target}; a patch may not change an object's apiVersion, kind, metadata.name or metadata.namespace"
    )]
    ChangesIdentity {
        /// 0-based index of the patch.
        index: usize,
        /// The patched object, as `Kind/name`.
        target: String,
        /// The first identity field that changed: `apiVersion`, `kind`, `metadata.name` or
        /// `metadata.namespace`.
        field: &'static str,
    },
    /// A well-formed RFC 6902 JSON Patch failed on the target (a missing path, a failing
    /// `test` operation, an index out of bounds).
    #[error("patch {index}: JSON patch (RFC 6902) failed on {target}: {message}")]
    JsonPatch {
        /// 0-based index of the patch.
        index: usize,
        /// The patched object, as `Kind/name`.
        target: String,
        /// The failing operation and why, from the `json-patch` crate.
        message: String,
    },
    /// An `extraArgs` key is not a flag name, or a workload's main container cannot take
    /// flags (its `command` or `args` is not a list).
    #[error("extraArgs {flag:?}: {message}")]
    InvalidExtraArg {
        /// The offending `extraArgs` key.
        flag: String,
        /// What is wrong and what is allowed.
        message: String,
    },
}

impl PatchError {
    /// Short stable reason, used as condition reason, Event reason and metric label:
    /// `InvalidPatch`, `PatchTargetNotFound`, `PatchChangesIdentity`, `PatchFailed` or
    /// `InvalidExtraArgs`.
    pub fn reason(&self) -> &'static str {
        match self {
            PatchError::InvalidPatch { .. } => "InvalidPatch",
            PatchError::TargetNotFound { .. } => "PatchTargetNotFound",
            PatchError::ChangesIdentity { .. } => "PatchChangesIdentity",
            PatchError::JsonPatch { .. } => "PatchFailed",
            PatchError::InvalidExtraArg { .. } => "InvalidExtraArgs",
        }
    }

    /// The 0-based index of the failing patch; `None` for `extraArgs` errors.
    pub fn index(&self) -> Option<usize> {
        match self {
            PatchError::InvalidPatch { index, .. }
            | PatchError::TargetNotFound { index, .. }
            | PatchError::ChangesIdentity { index, .. }
            | PatchError::JsonPatch { index, .. } => Some(*index),
            PatchError::InvalidExtraArg { .. } => None,
        }
    }
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".to_string()
    } else {
        items.join(", ")
    }
}

/// What every patch may be, for error messages.
const FORMS: &str = "a patch is one of: a partial object with apiVersion, kind and metadata.name (strategic merge), {target: {kind, name}, jsonPatch: [...]} (RFC 6902), or {target: {kind, name}, mergePatch: {...}} (RFC 7386)";

/// The identity fields a patch may not change, with their JSON Pointers.
const IDENTITY: [(&str, &str); 4] = [
    ("apiVersion", "/apiVersion"),
    ("kind", "/kind"),
    ("metadata.name", "/metadata/name"),
    ("metadata.namespace", "/metadata/namespace"),
];

/// Applies `patches` in order to `objects`, the objects one component rendered (all in the
/// component's namespace), following docs/design.md §4 (see the [module docs](self) for the three
/// forms and their sources: Kubernetes strategic merge patch, RFC 6902, RFC 7386).
///
/// All-or-nothing: the patches are applied to a copy, and `objects` is replaced only when
/// every patch succeeded; on error `objects` is left unchanged. Patches see the result of
/// the patches before them.
///
/// # Errors
/// The first failing patch, by its 0-based index:
/// - [`PatchError::InvalidPatch`] — not an object, not one of the three forms (both
///   `jsonPatch` and `mergePatch`, a target without `kind` or `name`, a partial object
///   without `apiVersion`, `kind` or `metadata.name`, unknown keys beside `target`), a
///   malformed operation or directive, or a target that matches more than one object;
/// - [`PatchError::TargetNotFound`] — no rendered object has that kind and name (and API
///   group, when given); the error lists the rendered objects;
/// - [`PatchError::ChangesIdentity`] — the patch changed `apiVersion`, `kind`,
///   `metadata.name` or `metadata.namespace`;
/// - [`PatchError::JsonPatch`] — an RFC 6902 operation failed on the target.
pub fn apply_patches(objects: &mut Vec<Value>, patches: &[Value]) -> Result<(), PatchError> {
    if patches.is_empty() {
        return Ok(());
    }
    let mut work = objects.clone();
    for (index, patch) in patches.iter().enumerate() {
        apply_one(&mut work, index, patch)?;
    }
    *objects = work;
    Ok(())
}

/// Which object a patch is for.
struct Target<'a> {
    kind: &'a str,
    name: &'a str,
    api_version: Option<&'a str>,
    namespace: Option<&'a str>,
}

/// How a patch changes its target.
enum Form<'a> {
    Strategic(&'a Value),
    Json(json_patch::Patch),
    Merge(&'a Value),
}

fn apply_one(objects: &mut [Value], index: usize, patch: &Value) -> Result<(), PatchError> {
    let invalid = |message: String| PatchError::InvalidPatch { index, message };
    let (target, form) = parse(patch).map_err(invalid)?;
    let position = find_target(objects, index, &target)?;
    let object = &mut objects[position];
    let before = object.clone();
    let label = describe(&before);
    match form {
        Form::Strategic(p) => strategic_merge(object, p).map_err(invalid)?,
        Form::Json(ops) => json_patch::patch(object, &ops).map_err(|e| PatchError::JsonPatch {
            index,
            target: label.clone(),
            message: e.to_string(),
        })?,
        Form::Merge(p) => json_patch::merge(object, p),
    }
    if let Some((field, _)) = IDENTITY
        .iter()
        .find(|(_, pointer)| before.pointer(pointer) != object.pointer(pointer))
    {
        return Err(PatchError::ChangesIdentity {
            index,
            target: label,
            field,
        });
    }
    Ok(())
}

/// Recognises the form of a patch (docs/design.md §4). Errors are messages for `InvalidPatch`.
fn parse(patch: &Value) -> Result<(Target<'_>, Form<'_>), String> {
    let Value::Object(map) = patch else {
        return Err(format!("is {}, not an object; {FORMS}", type_name(patch)));
    };
    let has_json = map.contains_key("jsonPatch");
    let has_merge = map.contains_key("mergePatch");
    if let Some(target) = map.get("target") {
        if has_json && has_merge {
            return Err(format!(
                "has both jsonPatch and mergePatch; give one per patch; {FORMS}"
            ));
        }
        if let Some(key) = map
            .keys()
            .find(|k| !matches!(k.as_str(), "target" | "jsonPatch" | "mergePatch"))
        {
            return Err(format!(
                "unknown key {key:?} beside target; a targeted patch has exactly target and one of jsonPatch or mergePatch"
            ));
        }
        let target = parse_target(target)?;
        if let Some(ops) = map.get("jsonPatch") {
            let Value::Array(list) = ops else {
                return Err(format!(
                    "jsonPatch is {}, not a list of RFC 6902 operations",
                    type_name(ops)
                ));
            };
            let mut parsed = Vec::with_capacity(list.len());
            for (i, op) in list.iter().enumerate() {
                parsed.push(serde_json::from_value(op.clone()).map_err(|e| {
                    format!("jsonPatch operation {i} is not an RFC 6902 operation (op add, remove, replace, move, copy or test with path, and value or from): {e}")
                })?);
            }
            return Ok((target, Form::Json(json_patch::Patch(parsed))));
        }
        if let Some(merge) = map.get("mergePatch") {
            if !merge.is_object() {
                return Err(format!(
                    "mergePatch is {}, not an object; an RFC 7386 merge patch of an object is an object",
                    type_name(merge)
                ));
            }
            return Ok((target, Form::Merge(merge)));
        }
        return Err(format!("has a target but neither jsonPatch nor mergePatch; {FORMS}"));
    }
    if has_json || has_merge {
        let key = if has_json { "jsonPatch" } else { "mergePatch" };
        return Err(format!(
            "has {key} but no target; write {{target: {{kind, name}}, {key}: ...}}"
        ));
    }
    let field = |pointer: &str, what: &str| -> Result<&str, String> {
        match patch.pointer(pointer) {
            Some(Value::String(s)) if !s.is_empty() => Ok(s),
            _ => Err(format!(
                "a partial object (strategic merge) needs a non-empty {what}; {FORMS}"
            )),
        }
    };
    let api_version = field("/apiVersion", "apiVersion")?;
    let kind = field("/kind", "kind")?;
    let name = field("/metadata/name", "metadata.name")?;
    // A namespace given here must equal the target's: checked as an identity change after
    // the merge, so it reads "changes metadata.namespace".
    Ok((
        Target {
            kind,
            name,
            api_version: Some(api_version),
            namespace: None,
        },
        Form::Strategic(patch),
    ))
}

fn parse_target(target: &Value) -> Result<Target<'_>, String> {
    const SHAPE: &str = "target is {kind, name} with optional apiVersion and namespace";
    let Value::Object(map) = target else {
        return Err(format!("target is {}, not an object; {SHAPE}", type_name(target)));
    };
    if let Some(key) = map
        .keys()
        .find(|k| !matches!(k.as_str(), "kind" | "name" | "apiVersion" | "namespace"))
    {
        return Err(format!("target has unknown key {key:?}; {SHAPE}"));
    }
    let required = |key: &str| -> Result<&str, String> {
        match map.get(key) {
            Some(Value::String(s)) if !s.is_empty() => Ok(s),
            _ => Err(format!("target needs a non-empty {key}; {SHAPE}")),
        }
    };
    let optional = |key: &str| -> Result<Option<&str>, String> {
        match map.get(key) {
            None => Ok(None),
            Some(Value::String(s)) if !s.is_empty() => Ok(Some(s)),
            Some(_) => Err(format!("target.{key} must be a non-empty string; {SHAPE}")),
        }
    };
    Ok(Target {
        kind: required("kind")?,
        name: required("name")?,
        api_version: optional("apiVersion")?,
        namespace: optional("namespace")?,
    })
}

/// The API group of an apiVersion: `apps` for `apps/v1`, the empty core group for `v1`.
fn group(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(g, _)| g)
}

fn find_target(objects: &[Value], index: usize, target: &Target<'_>) -> Result<usize, PatchError> {
    let matches: Vec<usize> = objects
        .iter()
        .enumerate()
        .filter(|(_, o)| {
            str_at(o, "/kind") == Some(target.kind)
                && str_at(o, "/metadata/name") == Some(target.name)
                && target
                    .api_version
                    .is_none_or(|want| str_at(o, "/apiVersion").is_some_and(|have| group(have) == group(want)))
        })
        .map(|(i, _)| i)
        .collect();
    match matches.as_slice() {
        [] => Err(PatchError::TargetNotFound {
            index,
            kind: target.kind.to_string(),
            name: target.name.to_string(),
            api_version: target.api_version.map(str::to_string),
            available: objects.iter().map(describe).collect(),
        }),
        [one] => {
            let have = str_at(&objects[*one], "/metadata/namespace");
            if let Some(want) = target.namespace
                && have != Some(want)
            {
                return Err(PatchError::InvalidPatch {
                    index,
                    message: format!(
                        "target.namespace {want:?} is not the namespace of {} ({}); patches apply only to the objects in the component's namespace, so omit target.namespace",
                        describe(&objects[*one]),
                        have.map_or_else(|| "none".to_string(), |h| format!("{h:?}"))
                    ),
                });
            }
            Ok(*one)
        }
        many => Err(PatchError::InvalidPatch {
            index,
            message: format!(
                "target {}/{} matches {} rendered objects ({}); give target.apiVersion to choose one",
                target.kind,
                target.name,
                many.len(),
                many.iter()
                    .map(|&i| format!(
                        "{} {}",
                        str_at(&objects[i], "/apiVersion").unwrap_or("?"),
                        describe(&objects[i])
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }),
    }
}

fn str_at<'a>(object: &'a Value, pointer: &str) -> Option<&'a str> {
    object.pointer(pointer).and_then(Value::as_str)
}

/// `Kind/name` of a rendered object.
fn describe(object: &Value) -> String {
    format!(
        "{}/{}",
        str_at(object, "/kind").unwrap_or("?"),
        str_at(object, "/metadata/name").unwrap_or("?")
    )
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}
