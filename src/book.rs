//! The book's generated reference chapters (`docs/reference/cli.md`,
//! `docs/reference/fields.md`), kept current as `crds/` is: a test compares each chapter with
//! what the code generates now, and `UPDATE_DOCS=1 cargo test --lib book` rewrites them.
//! A further test checks that `docs/SUMMARY.md` lists every chapter of the book.

use std::path::{Path, PathBuf};

use clap::CommandFactory;
use serde_json::Value;

use crate::cli::Cli;

fn docs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docs")
}

/// Compares `docs/<relative>` with `generated`, or writes it under `UPDATE_DOCS`.
fn check_or_update(relative: &str, generated: &str) {
    crate::generated::assert_current(
        &format!("docs/{relative}"),
        generated,
        "UPDATE_DOCS",
        "cargo test --lib book",
    );
}

/// The CLI chapter: the `--help` of `capn` and of every subcommand, as clap prints it.
fn cli_chapter() -> String {
    // Environment values would make the text depend on the shell that runs the test.
    fn hide_env_values(command: clap::Command) -> clap::Command {
        command
            .mut_args(|arg| arg.hide_env_values(true))
            .mut_subcommands(hide_env_values)
    }
    let mut command = hide_env_values(Cli::command()).term_width(100);
    command.build();
    let mut out = String::from(
        "# Command line\n\n\
         Generated from the clap definitions in `src/cli` by `src/book.rs` (`UPDATE_DOCS=1 cargo\n\
         test --lib book`): what `--help` prints for `capn` and each subcommand.\n",
    );
    fn section(command: &mut clap::Command, out: &mut String) {
        let name = command.get_bin_name().unwrap_or(command.get_name()).to_string();
        let help = command.render_long_help().to_string();
        let help: Vec<&str> = help.lines().map(str::trim_end).collect();
        out.push_str(&format!(
            "\n## `{name}`\n\n```text\n{}\n```\n",
            help.join("\n").trim_end()
        ));
        for sub in command.get_subcommands_mut() {
            if sub.get_name() != "help" {
                section(sub, out);
            }
        }
    }
    section(&mut command, &mut out);
    out
}

/// Markdown for one table cell: one line, `|` escaped, and `<`/`>` outside code spans
/// written as entities so that `<namespace>` is not taken for an HTML tag.
fn cell(text: &str) -> String {
    let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    one_line
        .split('`')
        .enumerate()
        .map(|(i, part)| {
            let part = part.replace('|', "\\|");
            if i % 2 == 0 {
                part.replace('<', "&lt;").replace('>', "&gt;")
            } else {
                part
            }
        })
        .collect::<Vec<_>>()
        .join("`")
}

/// A schema's type as the Kubernetes API reference writes it.
fn type_of(schema: &Value) -> String {
    if schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        return "int-or-string".into();
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("array") => format!("[]{}", schema.get("items").map(type_of).unwrap_or_else(|| "any".into())),
        Some("object") => match schema.get("additionalProperties") {
            Some(values) if values.is_object() => format!("map[string]{}", type_of(values)),
            _ => "object".into(),
        },
        Some(t) => match schema.get("format").and_then(Value::as_str) {
            Some(format) => format!("{t} ({format})"),
            None => t.into(),
        },
        None if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) => "any".into(),
        None => "any".into(),
    }
}

/// What the schema constrains besides the type: required, default, bounds, enum, CEL rules.
fn constraints(schema: &Value, required: bool) -> Vec<String> {
    let mut out = Vec::new();
    if required {
        out.push("Required.".into());
    }
    if let Some(default) = schema.get("default").filter(|d| *d != &serde_json::json!({})) {
        out.push(format!("Default: `{default}`."));
    }
    for (key, before, after) in [
        ("minimum", "Minimum ", ""),
        ("maximum", "Maximum ", ""),
        ("maxLength", "At most ", " characters"),
        ("maxItems", "At most ", " items"),
        ("maxProperties", "At most ", " entries"),
    ] {
        if let Some(n) = schema.get(key) {
            out.push(format!("{before}{n}{after}."));
        }
    }
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        let values: Vec<String> = values
            .iter()
            .map(|v| format!("`{}`", v.as_str().unwrap_or_default()))
            .collect();
        out.push(format!("One of {}.", values.join(", ")));
    }
    for rule in schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(message) = rule.get("message").and_then(Value::as_str) {
            out.push(format!("Validation: {message}."));
        }
    }
    out
}

/// One row per field under `schema`, depth first, each path spelled as `kubectl explain`
/// takes it (`spec.backup.destination.bucket`; `[]` marks a list's items, `*` a map's values).
fn rows(schema: &Value, path: &str, out: &mut Vec<String>) {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (name, property) in properties {
        let field = if path.is_empty() {
            name.clone()
        } else {
            format!("{path}.{name}")
        };
        let mut text = property
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        for c in constraints(property, required.contains(&name.as_str())) {
            text.push(' ');
            text.push_str(&c);
        }
        out.push(format!(
            "| `{field}` | {} | {} |",
            cell(&type_of(property)),
            cell(text.trim())
        ));
        rows(property, &field, out);
        if let Some(items) = property.get("items") {
            rows(items, &format!("{field}[]"), out);
        }
        if let Some(values) = property.get("additionalProperties").filter(|v| v.is_object()) {
            rows(values, &format!("{field}.*"), out);
        }
    }
}

/// The fields chapter: every field of every CRD, from the generated schemas.
fn fields_chapter() -> String {
    let mut out = String::from(
        "# Fields\n\n\
         Generated from the CRDs (`crate::crds::crds()`, the `openAPIV3Schema` of each) by\n\
         `src/book.rs` (`UPDATE_DOCS=1 cargo test --lib book`): every field of every kind, with its\n\
         type, its description (the doc comment in `src/api`, as `kubectl explain` shows it) and\n\
         what admission checks. `[]` marks the items of a list, `*` the values of a map. The\n\
         syntax rules are explained in [Field rules](../guide/field-rules.md).\n",
    );
    for crd in crate::crds::crds() {
        let names = &crd.spec.names;
        let short = names.short_names.clone().unwrap_or_default().join(", ");
        for version in &crd.spec.versions {
            let schema = version
                .schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .map(|s| serde_json::to_value(s).unwrap())
                .unwrap_or_default();
            out.push_str(&format!(
                "\n## {}\n\n`{}/{}`, plural `{}`, short name `{}`, {}. {}\n\n",
                names.kind,
                crd.spec.group,
                version.name,
                names.plural,
                short,
                crd.spec.scope.to_lowercase(),
                cell(schema.get("description").and_then(Value::as_str).unwrap_or_default()),
            ));
            out.push_str("| field | type | description |\n|---|---|---|\n");
            let mut table = Vec::new();
            for part in ["spec", "status"] {
                if let Some(property) = schema.pointer(&format!("/properties/{part}")) {
                    let mut root = serde_json::json!({"properties": {part: property}});
                    if let Some(required) = schema.get("required") {
                        root["required"] = required.clone();
                    }
                    rows(&root, "", &mut table);
                }
            }
            for row in table {
                out.push_str(&row);
                out.push('\n');
            }
        }
    }
    out
}

/// The table of conditions and reasons, from the declarations of [`crate::status::Reason`].
fn conditions_chapter() -> String {
    use crate::status::Reason;
    let mut out = String::from(
        "# Conditions and reasons\n\n\
         Generated from `Reason` in `src/status.rs` by `src/book.rs` (`UPDATE_DOCS=1 cargo test --lib book`).\n\
         A condition whose status is not True and whose reason is a failure makes a Warning Event; \
         every other change worth telling makes a Normal one. A reason not listed here is an \
         error's own (for example `InvalidVersion`, `ApplyFailed`): always a failure, its \
         message says what is wrong; see [troubleshooting](../operations/troubleshooting.md).\n\n\
         | reason | failure | conditions | meaning |\n|---|---|---|---|\n",
    );
    for reason in Reason::ALL {
        let conditions = if reason.conditions().is_empty() {
            "(Events only)".to_string()
        } else {
            reason
                .conditions()
                .iter()
                .map(|c| format!("`{c}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        out.push_str(&format!(
            "| `{reason}` | {} | {conditions} | {} |\n",
            if reason.is_failure() { "yes" } else { "no" },
            reason.meaning()
        ));
    }
    out
}

#[test]
fn book_cli_reference_matches_the_clap_definitions() {
    check_or_update("reference/cli.md", &cli_chapter());
}

#[test]
fn book_fields_reference_matches_the_crds() {
    check_or_update("reference/fields.md", &fields_chapter());
}

#[test]
fn book_conditions_reference_matches_the_reasons() {
    check_or_update("reference/conditions.md", &conditions_chapter());
}

#[test]
fn book_summary_lists_every_chapter() {
    let summary = std::fs::read_to_string(docs().join("SUMMARY.md")).unwrap();
    let listed: std::collections::BTreeSet<String> = regex::Regex::new(r"\]\(([^)]+\.md)\)")
        .unwrap()
        .captures_iter(&summary)
        .map(|c| c[1].to_string())
        .collect();
    let mut missing = Vec::new();
    for entry in walkdir::WalkDir::new(docs()).into_iter().filter_map(Result::ok) {
        let relative = entry
            .path()
            .strip_prefix(docs())
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if relative.ends_with(".md") && relative != "SUMMARY.md" && !listed.contains(&relative) {
            missing.push(relative);
        }
    }
    assert!(missing.is_empty(), "docs/SUMMARY.md does not list {missing:?}");
    for chapter in &listed {
        assert!(
            docs().join(chapter).is_file(),
            "docs/SUMMARY.md lists {chapter}, which does not exist"
        );
    }
}

#[test]
fn book_cells_keep_code_and_escape_markup() {
    assert_eq!(cell("a <b> `<c>`\n| d"), "a &lt;b&gt; `<c>` \\| d");
    assert_eq!(
        type_of(&serde_json::json!({"type": "array", "items": {"type": "string"}})),
        "[]string"
    );
    assert_eq!(
        type_of(&serde_json::json!({"type": "object", "additionalProperties": {"type": "string"}})),
        "map[string]string"
    );
    assert_eq!(
        type_of(&serde_json::json!({"type": "integer", "format": "int32"})),
        "integer (int32)"
    );
}
