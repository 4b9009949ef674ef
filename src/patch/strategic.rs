//! Strategic merge of a partial object into a rendered one (docs/design.md §4, form 1), following
//! the Kubernetes strategic merge patch rules for the well-known list merge keys.

use serde_json::{Map, Value};

/// The strategic merge directive key.
const PATCH: &str = "$patch";

/// A `$patch` directive.
#[derive(Clone, Copy, PartialEq)]
enum Directive {
    Merge,
    Replace,
    Delete,
}

/// Merges the partial object `patch` into `object` with Kubernetes strategic merge patch
/// semantics, restricted to the list merge keys docs/design.md §4 names (source: Kubernetes
/// "strategic merge patch" documentation and `sig-api-machinery/strategic-merge-patch.md`):
///
/// - maps merge recursively; a `null` value deletes the field;
/// - `$patch: delete` on a map deletes that map (the field holding it); `$patch: replace` on
///   a map replaces it wholesale with the rest of the patch map; `$patch: merge` is the
///   default;
/// - lists named `containers`, `initContainers`, `ephemeralContainers`, `volumes`, `env` and
///   `imagePullSecrets` merge their elements by `name`, `volumeMounts` by `mountPath`,
///   `topologySpreadConstraints` by `topologyKey` (its patchMergeKey in the Kubernetes API),
///   and `ports` by `containerPort` when the elements have it (container ports) and by
///   `port` otherwise (Service ports). A patch element whose key matches an existing element is
///   merged into it (recursively); an unmatched element is appended; an element carrying
///   `$patch: delete` deletes the matching element (nothing, if none matches); an element
///   carrying `$patch: replace` replaces the matching element wholesale. A list element that
///   is exactly `{$patch: replace}` makes the list be replaced by the other elements;
/// - every other list — `args` and `command` included — is replaced as a whole, as are the
///   merge-keyed lists when an element of the patch list is not an object. An `args` patch
///   therefore replaces the whole argument list: use `extraArgs` to change one flag.
///
/// The other strategic merge directives (`$retainKeys`, `$setElementOrder/...`,
/// `$deleteFromPrimitiveList/...`) are not supported and are rejected, rather than being
/// written into the object.
///
/// # Errors
/// A message (the caller wraps it as [`super::PatchError::InvalidPatch`]) naming the path
/// when `patch` is not an object, a `$patch` value is not `merge`, `replace` or `delete`, an
/// unsupported directive is used, a top-level `$patch: delete` would delete the object, an
/// element of a merged list lacks its merge key, or `$patch: delete` appears in a list that
/// is replaced as a whole.
pub fn strategic_merge(object: &mut Value, patch: &Value) -> Result<(), String> {
    let Value::Object(patch) = patch else {
        return Err(format!(
            "a strategic merge patch is an object, not {}",
            super::type_name(patch)
        ));
    };
    match directive(patch, "the patch")? {
        Directive::Delete => Err(
            "`$patch: delete` at the top level would delete the object; patches cannot add or remove objects"
                .to_string(),
        ),
        Directive::Replace => {
            *object = Value::Object(fresh_map(patch, "")?);
            Ok(())
        }
        Directive::Merge => {
            if !object.is_object() {
                *object = Value::Object(Map::new());
            }
            match object {
                Value::Object(map) => merge_map(map, patch, ""),
                _ => unreachable!("object was just made a map"),
            }
        }
    }
}

/// The `$patch` directive of a patch map (`merge` when absent).
fn directive(map: &Map<String, Value>, path: &str) -> Result<Directive, String> {
    match map.get(PATCH) {
        None => Ok(Directive::Merge),
        Some(Value::String(s)) if s == "merge" => Ok(Directive::Merge),
        Some(Value::String(s)) if s == "replace" => Ok(Directive::Replace),
        Some(Value::String(s)) if s == "delete" => Ok(Directive::Delete),
        Some(other) => Err(format!(
            "{path}: `$patch: {other}` is not a strategic merge directive; use delete, replace or merge"
        )),
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// Rejects the strategic merge directives this implementation does not support.
fn check_key(key: &str, path: &str) -> Result<(), String> {
    if key == "$retainKeys" || key.starts_with("$setElementOrder/") || key.starts_with("$deleteFromPrimitiveList/") {
        return Err(format!(
            "{}: the strategic merge directive {key} is not supported; only `$patch: delete|replace|merge` is (use a jsonPatch for finer list edits)",
            if path.is_empty() { "the patch" } else { path }
        ));
    }
    Ok(())
}

/// A patch map applied to nothing: directives resolved, nulls dropped.
fn fresh_map(patch: &Map<String, Value>, path: &str) -> Result<Map<String, Value>, String> {
    let mut map = Map::new();
    merge_map(&mut map, patch, path)?;
    Ok(map)
}

/// A patch value applied to nothing (used for list elements of a replaced list).
fn fresh_value(value: &Value, path: &str) -> Result<Value, String> {
    Ok(match value {
        Value::Object(map) => {
            if directive(map, path)? == Directive::Delete {
                return Err(format!(
                    "{path}: `$patch: delete` is only meaningful in a list merged by key (containers, initContainers, ephemeralContainers, volumes, env, imagePullSecrets by name; volumeMounts by mountPath; topologySpreadConstraints by topologyKey; ports by containerPort or port); this list is replaced as a whole"
                ));
            }
            Value::Object(fresh_map(map, path)?)
        }
        Value::Array(items) => Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, v)| fresh_value(v, &format!("{path}[{i}]")))
                .collect::<Result<_, _>>()?,
        ),
        scalar => scalar.clone(),
    })
}

fn merge_map(object: &mut Map<String, Value>, patch: &Map<String, Value>, path: &str) -> Result<(), String> {
    for (key, value) in patch {
        if key == PATCH {
            continue;
        }
        check_key(key, path)?;
        let child = join(path, key);
        match value {
            Value::Null => {
                object.remove(key);
            }
            Value::Object(map) => match directive(map, &child)? {
                Directive::Delete => {
                    object.remove(key);
                }
                Directive::Replace => {
                    object.insert(key.clone(), Value::Object(fresh_map(map, &child)?));
                }
                Directive::Merge => match object.get_mut(key) {
                    Some(Value::Object(existing)) => merge_map(existing, map, &child)?,
                    _ => {
                        object.insert(key.clone(), Value::Object(fresh_map(map, &child)?));
                    }
                },
            },
            Value::Array(items) => {
                let merged = merge_list(key, object.get(key), items, &child)?;
                object.insert(key.clone(), Value::Array(merged));
            }
            scalar => {
                object.insert(key.clone(), scalar.clone());
            }
        }
    }
    Ok(())
}

/// Whether a list element is the `{$patch: replace}` marker.
fn is_replace_marker(element: &Value) -> bool {
    matches!(element, Value::Object(m) if m.len() == 1 && m.get(PATCH).and_then(Value::as_str) == Some("replace"))
}

/// The merge key of the list held by `field`, per docs/design.md §4; `None` for lists that are
/// replaced as a whole.
fn merge_key(field: &str, original: &[Value], patch: &[&Value]) -> Option<&'static str> {
    match field {
        "containers" | "initContainers" | "ephemeralContainers" | "volumes" | "env" | "imagePullSecrets" => {
            Some("name")
        }
        "volumeMounts" => Some("mountPath"),
        "topologySpreadConstraints" => Some("topologyKey"),
        "ports" => {
            let container_ports = original
                .iter()
                .chain(patch.iter().copied())
                .any(|e| e.get("containerPort").is_some());
            Some(if container_ports { "containerPort" } else { "port" })
        }
        _ => None,
    }
}

fn merge_list(field: &str, original: Option<&Value>, patch: &[Value], path: &str) -> Result<Vec<Value>, String> {
    let original: &[Value] = match original {
        Some(Value::Array(items)) => items,
        _ => &[],
    };
    let replace = patch.iter().any(is_replace_marker);
    let elements: Vec<&Value> = patch.iter().filter(|e| !is_replace_marker(e)).collect();
    let key = merge_key(field, original, &elements);
    let Some(key) = key.filter(|_| !replace && elements.iter().all(|e| e.is_object())) else {
        // Replaced as a whole.
        return elements
            .iter()
            .enumerate()
            .map(|(i, e)| fresh_value(e, &format!("{path}[{i}]")))
            .collect();
    };
    let mut result = original.to_vec();
    for (i, element) in elements.iter().enumerate() {
        let Value::Object(map) = element else {
            unreachable!("every element was checked to be an object");
        };
        let key_value = match map.get(key) {
            Some(v) if !v.is_null() => v,
            _ => {
                return Err(format!(
                    "{path}[{i}]: element has no {key}; elements of {field} are merged by {key}{}",
                    if field == "ports" {
                        " (containerPort for container ports, port for Service ports)"
                    } else {
                        ""
                    }
                ));
            }
        };
        let element_path = format!("{path}[{key}={key_value}]");
        let position = result.iter().position(|o| o.get(key) == Some(key_value));
        match directive(map, &element_path)? {
            Directive::Delete => result.retain(|o| o.get(key) != Some(key_value)),
            Directive::Replace => {
                let fresh = Value::Object(fresh_map(map, &element_path)?);
                match position {
                    Some(p) => result[p] = fresh,
                    None => result.push(fresh),
                }
            }
            Directive::Merge => match position.map(|p| &mut result[p]) {
                Some(Value::Object(existing)) => merge_map(existing, map, &element_path)?,
                _ => result.push(Value::Object(fresh_map(map, &element_path)?)),
            },
        }
    }
    Ok(result)
}
