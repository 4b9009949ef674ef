//! Templates → objects (design §3, §4): renders one component's templates from a channel
//! with minijinja under a strict undefined policy and parses the multi-document YAML into
//! JSON objects. Pure: no client, no clock, no randomness.

use minijinja::value::Serde;
use minijinja::{AutoEscape, Environment, UndefinedBehavior, Value};
use serde::Serialize;

use crate::channel::Template;

/// Why a component's templates did not produce objects. Terminal: the channel or the input
/// must change.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum RenderError {
    /// Template syntax or evaluation error (an undefined variable, a failing filter).
    #[error("template {path}{}: {message}", line.map(|l| format!(" line {l}")).unwrap_or_default())]
    Template {
        path: String,
        line: Option<usize>,
        message: String,
    },
    /// The rendered text is not valid YAML.
    #[error("template {path} rendered invalid YAML: {message}")]
    Yaml { path: String, message: String },
    /// A rendered document is not a Kubernetes object (needs `apiVersion`, `kind`,
    /// `metadata.name`).
    #[error("template {path} document {document}: {message}")]
    NotAnObject {
        path: String,
        document: usize,
        message: String,
    },
}

impl RenderError {
    /// Short stable reason, used as condition reason, Event reason and metric label.
    pub fn reason(&self) -> &'static str {
        "RenderFailed"
    }
}

/// Renders `templates` (sorted by path) against `context` and returns every non-empty
/// document as a JSON object, in template order then document order.
///
/// Undefined variables are errors (strict mode), never empty strings: a typo in a
/// template must not silently drop a flag.
///
/// # Errors
/// [`RenderError`] naming the template file, and the line where minijinja knows it.
pub fn render_templates<C: Serialize>(
    templates: &[Template],
    context: &C,
) -> Result<Vec<serde_json::Value>, RenderError> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    // minijinja would JSON-escape every `{{ }}` in a .yaml file; templates say `tojson`
    // where they mean it, so string building (`"--flag=" ~ value`) stays plain.
    env.set_auto_escape_callback(|_| AutoEscape::None);
    let ctx = Value::from(Serde(context));
    let mut objects = Vec::new();
    for t in templates {
        let template_error = |e: minijinja::Error| RenderError::Template {
            path: t.path.clone(),
            line: e.line(),
            message: match e.detail() {
                Some(d) => format!("{}: {d}", e.kind()),
                None => e.kind().to_string(),
            },
        };
        let tmpl = env
            .template_from_named_str(&t.path, &t.source)
            .map_err(template_error)?;
        let text = tmpl.render(&ctx).map_err(template_error)?;
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).map_err(|e| RenderError::Yaml {
            path: t.path.clone(),
            message: e.to_string(),
        })?;
        for (i, doc) in docs.into_iter().enumerate() {
            if doc.is_null() {
                continue;
            }
            check_object(&doc).map_err(|message| RenderError::NotAnObject {
                path: t.path.clone(),
                document: i + 1,
                message,
            })?;
            objects.push(doc);
        }
    }
    Ok(objects)
}

fn check_object(doc: &serde_json::Value) -> Result<(), String> {
    let field = |p: &str| doc.pointer(p).and_then(|v| v.as_str()).filter(|s| !s.is_empty());
    if !doc.is_object() {
        return Err("is not a mapping".into());
    }
    for (pointer, name) in [
        ("/apiVersion", "apiVersion"),
        ("/kind", "kind"),
        ("/metadata/name", "metadata.name"),
    ] {
        if field(pointer).is_none() {
            return Err(format!("has no {name}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn t(path: &str, source: &str) -> Template {
        Template {
            path: path.into(),
            source: source.into(),
        }
    }

    #[test]
    fn renders_multi_document_yaml_with_tojson_values() {
        let ts = [t(
            "a.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ name | tojson }}\ndata: {{ data | tojson }}\n---\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: s\n",
        )];
        let out = render_templates(&ts, &json!({"name": "x: y", "data": {"k": "v"}})).unwrap();
        assert_eq!(out.len(), 2, "the empty document is skipped");
        assert_eq!(out[0]["metadata"]["name"], "x: y");
        assert_eq!(out[0]["data"]["k"], "v");
        assert_eq!(out[1]["kind"], "Service");
    }

    #[test]
    fn undefined_variable_is_an_error_with_file_and_line() {
        let ts = [t(
            "dir/b.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ nope }}\n",
        )];
        let err = render_templates(&ts, &json!({})).unwrap_err();
        match &err {
            RenderError::Template { path, line, .. } => {
                assert_eq!(path, "dir/b.yaml");
                assert_eq!(*line, Some(4));
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn undefined_attribute_is_an_error_too() {
        let ts = [t(
            "c.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ a.missing }}\n",
        )];
        assert!(render_templates(&ts, &json!({"a": {}})).is_err());
    }

    #[test]
    fn document_without_name_is_rejected() {
        let ts = [t("d.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n")];
        let err = render_templates(&ts, &json!({})).unwrap_err();
        assert!(err.to_string().contains("metadata.name"), "{err}");
    }

    #[test]
    fn invalid_yaml_names_the_template() {
        let ts = [t("e.yaml", "a: [\n")];
        let err = render_templates(&ts, &json!({})).unwrap_err();
        assert!(
            matches!(err, RenderError::Yaml { ref path, .. } if path == "e.yaml"),
            "{err}"
        );
    }
}
