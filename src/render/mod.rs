//! Templates → objects (docs/design.md §3, §4): renders one component's templates from a channel
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
    /// A rendered object is cluster-scoped or in another namespace: a channel may only place
    /// objects in the cluster's namespace, owned by the namespaced component resource
    /// (docs/design.md §4).
    #[error("template {path}{}: {kind} {name} {message}", line.map(|l| format!(" line {l}")).unwrap_or_default())]
    OutsideNamespace {
        path: String,
        line: Option<usize>,
        kind: String,
        name: String,
        message: String,
    },
}

impl RenderError {
    /// Short stable reason, used as condition reason, Event reason and metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::OutsideNamespace { .. } => "ObjectOutsideNamespace",
            _ => "RenderFailed",
        }
    }
}

/// Kinds the Kubernetes API serves cluster-scoped (core and built-in groups). A channel
/// object of one of these kinds would escape the tenant's namespace, and a namespaced owner
/// (the component resource) cannot own it: the garbage collector would delete it at once.
/// Kinds of CRDs are not known offline; the API server refuses those at apply time.
pub const CLUSTER_SCOPED_KINDS: &[&str] = &[
    "APIService",
    "CertificateSigningRequest",
    "ClusterRole",
    "ClusterRoleBinding",
    "ClusterTrustBundle",
    "ComponentStatus",
    "CSIDriver",
    "CSINode",
    "CustomResourceDefinition",
    "DeviceClass",
    "FlowSchema",
    "IngressClass",
    "IPAddress",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionPolicyBinding",
    "MutatingWebhookConfiguration",
    "Namespace",
    "Node",
    "PersistentVolume",
    "PriorityClass",
    "PriorityLevelConfiguration",
    "ResourceSlice",
    "RuntimeClass",
    "ServiceCIDR",
    "StorageClass",
    "StorageVersionMigration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "ValidatingWebhookConfiguration",
    "VolumeAttachment",
    "VolumeAttributesClass",
];

/// Renders like [`render_templates`] and refuses any object that is cluster-scoped or names
/// another namespace than `namespace`, pointing at the template line that says so.
///
/// # Errors
/// [`RenderError`], including [`RenderError::OutsideNamespace`].
pub fn render_templates_in<C: Serialize>(
    templates: &[Template],
    context: &C,
    namespace: &str,
) -> Result<Vec<serde_json::Value>, RenderError> {
    let mut objects = Vec::new();
    for t in templates {
        for object in render_templates(std::slice::from_ref(t), context)? {
            let kind = object["kind"].as_str().unwrap_or_default().to_string();
            let name = object["metadata"]["name"].as_str().unwrap_or_default().to_string();
            let problem = if CLUSTER_SCOPED_KINDS.contains(&kind.as_str()) {
                Some((
                    "is cluster-scoped; a channel may only render objects in the cluster's namespace".to_string(),
                    line_of(&t.source, &kind, false),
                ))
            } else {
                match object.pointer("/metadata/namespace").and_then(|n| n.as_str()) {
                    Some(ns) if ns != namespace => Some((
                        format!("is in namespace {ns:?}, not the cluster's namespace {namespace:?}"),
                        line_of(&t.source, &kind, true),
                    )),
                    _ => None,
                }
            };
            if let Some((message, line)) = problem {
                return Err(RenderError::OutsideNamespace {
                    path: t.path.clone(),
                    line,
                    kind,
                    name,
                    message,
                });
            }
            objects.push(object);
        }
    }
    Ok(objects)
}

/// The 1-based template line that declares `kind:` (or, with `namespace`, the first
/// `namespace:` line after it): the rendered object's line in the template, as far as the
/// template's text tells.
fn line_of(source: &str, kind: &str, namespace: bool) -> Option<usize> {
    let lines: Vec<&str> = source.lines().collect();
    let value = |l: &str, key: &str| {
        l.trim()
            .strip_prefix(key)
            .map(|v| v.trim().trim_matches(['"', '\'']).to_string())
    };
    let kind_line = lines.iter().position(|l| value(l, "kind:").as_deref() == Some(kind))?;
    if namespace {
        let after = lines[kind_line..]
            .iter()
            .position(|l| value(l, "namespace:").is_some())
            .map(|i| i + kind_line);
        let before = lines[..kind_line]
            .iter()
            .rposition(|l| value(l, "namespace:").is_some());
        if let Some(i) = after.or(before) {
            return Some(i + 1);
        }
    }
    Some(kind_line + 1)
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
    // Debug info gives errors the span of the failing expression, which names the
    // undefined variable.
    env.set_debug(true);
    // Strict mode lets an undefined value through a filter; `tojson` would turn a misspelt
    // variable into `null`. Every template value goes through `tojson`, so refuse it there.
    env.add_filter(
        "tojson",
        |value: &Value, indent: Option<Value>, kwargs: minijinja::value::Kwargs| {
            if value.is_undefined() {
                return Err(minijinja::Error::from(minijinja::ErrorKind::UndefinedError));
            }
            minijinja::filters::tojson(value, indent, kwargs)
        },
    );
    // minijinja would JSON-escape every `{{ }}` in a .yaml file; templates say `tojson`
    // where they mean it, so string building (`"--flag=" ~ value`) stays plain.
    env.set_auto_escape_callback(|_| AutoEscape::None);
    let ctx = Value::from(Serde(context));
    let mut objects = Vec::new();
    for t in templates {
        let template_error = |e: minijinja::Error| {
            let expression = e
                .range()
                .and_then(|r| {
                    // A filter's error points at the filter's name: name its input instead,
                    // the expression between `{{` and the `|`.
                    let before = t.source.get(..r.start)?.trim_end();
                    match before.strip_suffix('|') {
                        Some(head) => head.rsplit_once("{{").map(|(_, x)| x),
                        None => t.source.get(r),
                    }
                })
                .map(|x| x.trim().to_string())
                .filter(|x| !x.is_empty());
            let mut message = match e.detail() {
                Some(d) => format!("{}: {d}", e.kind()),
                None => e.kind().to_string(),
            };
            if let Some(x) = expression {
                message = match e.kind() {
                    // The context as JSON only names what is missing: built on failure alone.
                    minijinja::ErrorKind::UndefinedError => {
                        undefined_in(&x, &serde_json::to_value(context).unwrap_or_default())
                    }
                    _ => format!("{message} in `{x}`"),
                };
            }
            RenderError::Template {
                path: t.path.clone(),
                line: e.line(),
                message,
            }
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

/// Names what is undefined in the expression `x`: for a dotted path (`names.etcdd`), the
/// first part the context lacks; otherwise the whole expression.
fn undefined_in(x: &str, context: &serde_json::Value) -> String {
    let is_ident = |p: &str| {
        p.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    // The leading path of the expression (`selectr | tojson` → `selectr`).
    let path: String = x
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '.')
        .collect();
    let parts: Vec<&str> = path.split('.').map(str::trim).collect();
    if parts.iter().all(|p| is_ident(p)) {
        let mut node = context;
        for (i, part) in parts.iter().enumerate() {
            match node.get(part) {
                Some(next) => node = next,
                None if i == 0 => return format!("undefined variable `{part}`"),
                None => return format!("undefined attribute `{part}` of `{}`", parts[..i].join(".")),
            }
        }
    }
    format!("undefined value in `{x}`")
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
    fn undefined_variable_is_named() {
        let ts = [t(
            "f.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\ndata:\n  a: b\n  c: {{ nmes.etcd }}\n",
        )];
        let err = render_templates(&ts, &json!({"names": {"etcd": "e"}})).unwrap_err();
        assert_eq!(
            err.to_string(),
            "template f.yaml line 7: undefined variable `nmes`",
            "names the variable and its line"
        );
        let ts = [t("g.yaml", "kind: ConfigMap\nmetadata:\n  name: {{ names.etcdd }}\n")];
        let err = render_templates(&ts, &json!({"names": {"etcd": "e"}})).unwrap_err();
        assert!(
            err.to_string().contains("undefined attribute `etcdd` of `names`"),
            "{err}"
        );
    }

    #[test]
    fn cluster_scoped_and_foreign_objects_are_refused_with_their_template_line() {
        let ts = [t(
            "crb.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ok\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: escape\n",
        )];
        let err = render_templates_in(&ts, &json!({}), "ns").unwrap_err();
        assert_eq!(err.reason(), "ObjectOutsideNamespace");
        assert!(
            err.to_string()
                .starts_with("template crb.yaml line 7: ClusterRoleBinding escape is cluster-scoped"),
            "{err}"
        );
        let ts = [t(
            "other.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n  namespace: {{ ns }}\n",
        )];
        let err = render_templates_in(&ts, &json!({"ns": "kube-system"}), "ns").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("template other.yaml line 5: ConfigMap x is in namespace \"kube-system\""),
            "{err}"
        );
        assert!(render_templates_in(&ts, &json!({"ns": "ns"}), "ns").is_ok());
    }

    #[test]
    fn an_undefined_value_through_tojson_is_an_error_not_null() {
        let ts = [t(
            "h.yaml",
            "kind: ConfigMap\nmetadata:\n  name: x\ndata: {{ dta | tojson }}\n",
        )];
        let err = render_templates(&ts, &json!({"data": {}})).unwrap_err();
        assert_eq!(err.to_string(), "template h.yaml line 4: undefined variable `dta`");
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
