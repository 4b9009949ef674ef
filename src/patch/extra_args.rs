//! `extraArgs`: command-line flag overrides for a component's main container (docs/design.md §2,
//! §4).

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::PatchError;

/// Overrides and extends the command-line flags of the main (first) container of every
/// workload object in `objects` — anything with `spec.template.spec.containers`
/// (StatefulSet, Deployment, DaemonSet, Job, ...) — with `extra_args` (docs/design.md §2: "flag →
/// value, overrides the template's flag of that name"; docs/design.md §4).
///
/// For each key `foo` with value `v`, in `BTreeMap` (sorted) order:
/// - every `--foo=...` and every bare `--foo` in the main container's `command` **or**
///   `args` becomes `--foo=v`, in place (its position is kept). When the element is exactly
///   `--foo` and the next element of the same list does not start with `-`, that next
///   element is taken as the flag's separate value and removed (`--foo old` → `--foo=v`).
///   Only the exact flag name matches: key `foo` leaves `--foo-bar=...` alone. Single-dash
///   spellings (`-foo`) are not recognised.
/// - a flag found nowhere is appended to `args` (created if missing) as `--foo=v`; several
///   new flags are appended in sorted key order.
/// - an empty value gives `--foo=` (the flag set to the empty string). `extraArgs` cannot
///   remove a flag; use a patch for that.
///
/// Other containers, and objects without a pod template (Services, ConfigMaps, ...), are
/// left alone. All-or-nothing: on error `objects` is unchanged.
///
/// # Errors
/// [`PatchError::InvalidExtraArg`] when a key is empty, starts with `-` (keys are flag names
/// without dashes: `v`, not `--v`), or contains `=` or whitespace; or when a workload's main
/// container has a `command` or `args` that is not a list.
pub fn apply_extra_args(objects: &mut [Value], extra_args: &BTreeMap<String, String>) -> Result<(), PatchError> {
    for flag in extra_args.keys() {
        validate_flag(flag)?;
    }
    if extra_args.is_empty() {
        return Ok(());
    }
    let mut work = objects.to_vec();
    for object in &mut work {
        let label = super::describe(object);
        if let Some(Value::Object(container)) = object.pointer_mut("/spec/template/spec/containers/0") {
            override_flags(container, extra_args, &label)?;
        }
    }
    objects.clone_from_slice(&work);
    Ok(())
}

fn validate_flag(flag: &str) -> Result<(), PatchError> {
    let problem = if flag.is_empty() {
        Some("is empty")
    } else if flag.starts_with('-') {
        Some("starts with '-'")
    } else if flag.contains('=') {
        Some("contains '='")
    } else if flag.chars().any(char::is_whitespace) {
        Some("contains whitespace")
    } else {
        None
    };
    match problem {
        Some(problem) => Err(PatchError::InvalidExtraArg {
            flag: flag.to_string(),
            message: format!(
                "the key {problem}; keys are flag names without leading dashes, '=' or whitespace (`v: \"2\"` sets --v=2)"
            ),
        }),
        None => Ok(()),
    }
}

fn override_flags(
    container: &mut Map<String, Value>,
    extra_args: &BTreeMap<String, String>,
    label: &str,
) -> Result<(), PatchError> {
    let not_a_list = |flag: &str, field: &str| PatchError::InvalidExtraArg {
        flag: flag.to_string(),
        message: format!("{label}: the main container's {field} is not a list of arguments, so flags cannot be set"),
    };
    for (flag, value) in extra_args {
        let mut found = false;
        for field in ["command", "args"] {
            match container.get_mut(field) {
                None | Some(Value::Null) => {}
                Some(Value::Array(list)) => found |= replace_flag(list, flag, value),
                Some(_) => return Err(not_a_list(flag, field)),
            }
        }
        if !found {
            let args = container.entry("args").or_insert(Value::Null);
            if args.is_null() {
                *args = Value::Array(Vec::new());
            }
            match args {
                Value::Array(list) => list.push(Value::String(format!("--{flag}={value}"))),
                _ => return Err(not_a_list(flag, "args")),
            }
        }
    }
    Ok(())
}

/// Sets every occurrence of `--flag` in `list` to `--flag=value`; returns whether any was
/// found.
fn replace_flag(list: &mut Vec<Value>, flag: &str, value: &str) -> bool {
    let bare = format!("--{flag}");
    let prefix = format!("--{flag}=");
    let replacement = format!("--{flag}={value}");
    let mut found = false;
    let mut i = 0;
    while i < list.len() {
        if let Some(arg) = list[i].as_str() {
            if arg == bare {
                let separate_value = list
                    .get(i + 1)
                    .and_then(Value::as_str)
                    .is_some_and(|next| !next.starts_with('-'));
                if separate_value {
                    list.remove(i + 1);
                }
                list[i] = Value::String(replacement.clone());
                found = true;
            } else if arg.starts_with(&prefix) {
                list[i] = Value::String(replacement.clone());
                found = true;
            }
        }
        i += 1;
    }
    found
}
