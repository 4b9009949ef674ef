//! No import circle in `src/`: the modules depend on each other in one direction only, so
//! each can be read (and tested) with what it imports and nothing above it
//! (docs/developer/modules.md).
//!
//! The check reads the `crate::`, `super::` and `use` paths of every file, resolves each to
//! the deepest module file it names, and for every pair of modules that are not each
//! other's ancestor draws an edge between the two *siblings* under their common parent
//! that contain them (`controllers::component::etcd::backup` → `controllers::shared::events`
//! is an edge `component` → `shared` inside `controllers`). A parent and its children may
//! use each other (a `mod.rs` calling its stages, a stage reading its parent's types); two
//! siblings may not, in both directions, directly or through others.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use regex::Regex;

/// A module's path below the crate root (`["controllers", "shared", "cache"]`).
type ModulePath = Vec<String>;

/// Every module file of `src/`, by module path (`lib.rs` and `main.rs` are the root).
fn modules(src: &Path) -> BTreeMap<ModulePath, String> {
    let mut out = BTreeMap::new();
    for entry in walkdir::WalkDir::new(src).into_iter().filter_map(Result::ok) {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let relative = path.strip_prefix(src).unwrap().with_extension("");
        let mut parts: ModulePath = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
        if parts.last().is_some_and(|p| p == "mod") {
            parts.pop();
        }
        if parts == ["lib"] || parts == ["main"] {
            parts.clear();
        }
        let text = std::fs::read_to_string(path).unwrap();
        out.entry(parts).or_insert_with(String::new).push_str(&text);
    }
    out
}

/// The module paths `text` (the file of module `at`) refers to, before resolution.
fn references(at: &[String], text: &str) -> Vec<ModulePath> {
    static PATTERNS: std::sync::LazyLock<[Regex; 4]> = std::sync::LazyLock::new(|| {
        [
            // crate::a::b::Item
            Regex::new(r"\b(crate)((?:::[A-Za-z_][A-Za-z0-9_]*)+)").unwrap(),
            // crate::a::{b, c::D}
            Regex::new(r"\b(crate)((?:::[a-z_][a-z0-9_]*)*)::\{([^}]*)\}").unwrap(),
            // super::super::a::Item
            Regex::new(r"\b((?:super::)+)([A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*)").unwrap(),
            // super::a::{b, c}
            Regex::new(r"\b((?:super::)+)((?:[a-z_][a-z0-9_]*::)*)\{([^}]*)\}").unwrap(),
        ]
    });
    let code: String = text
        .lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let split = |s: &str| -> ModulePath { s.split("::").filter(|p| !p.is_empty()).map(str::to_string).collect() };
    let base_of = |prefix: &str| -> ModulePath {
        if prefix == "crate" {
            Vec::new()
        } else {
            let up = prefix.matches("super::").count();
            at[..at.len().saturating_sub(up)].to_vec()
        }
    };
    let mut out = Vec::new();
    for (i, pattern) in PATTERNS.iter().enumerate() {
        for captures in pattern.captures_iter(&code) {
            let mut base = base_of(&captures[1]);
            base.extend(split(&captures[2]));
            if i % 2 == 0 {
                out.push(base);
            } else {
                for item in captures[3].split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    let mut path = base.clone();
                    path.extend(split(item.split(" as ").next().unwrap_or(item)));
                    out.push(path);
                }
            }
        }
    }
    out
}

/// The edges between siblings: parent module → set of (from child, to child).
fn sibling_edges(modules: &BTreeMap<ModulePath, String>) -> BTreeMap<ModulePath, BTreeSet<(String, String)>> {
    let mut out: BTreeMap<ModulePath, BTreeSet<(String, String)>> = BTreeMap::new();
    for (from, text) in modules {
        for reference in references(from, text) {
            // The deepest module the path names.
            let Some(to) = (1..=reference.len())
                .rev()
                .map(|n| &reference[..n])
                .find(|p| modules.contains_key(*p))
            else {
                continue;
            };
            let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
            if common == from.len() || common == to.len() {
                continue; // one is the other's ancestor
            }
            out.entry(from[..common].to_vec())
                .or_default()
                .insert((from[common].clone(), to[common].clone()));
        }
    }
    out
}

/// The circles among siblings, as `parent: a → b → … → a` (empty when there are none).
fn circles(edges: &BTreeMap<ModulePath, BTreeSet<(String, String)>>) -> Vec<String> {
    let mut found = Vec::new();
    for (parent, pairs) in edges {
        let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (a, b) in pairs {
            next.entry(a.as_str()).or_default().push(b.as_str());
        }
        // A circle through `start`: depth-first search for a path back to it.
        let mut reported: BTreeSet<BTreeSet<String>> = BTreeSet::new();
        for (start, _) in pairs {
            let mut stack = vec![(start.as_str(), vec![start.clone()])];
            let mut seen = BTreeSet::new();
            while let Some((node, path)) = stack.pop() {
                for &to in next.get(node).into_iter().flatten() {
                    if to == start {
                        let members: BTreeSet<String> = path.iter().cloned().collect();
                        if reported.insert(members) {
                            let scope = if parent.is_empty() {
                                "crate".into()
                            } else {
                                parent.join("::")
                            };
                            found.push(format!("{scope}: {} → {start}", path.join(" → ")));
                        }
                    } else if seen.insert(to.to_string()) {
                        let mut longer = path.clone();
                        longer.push(to.to_string());
                        stack.push((to, longer));
                    }
                }
            }
        }
    }
    found
}

#[test]
fn no_module_imports_a_sibling_that_imports_it_back() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = circles(&sibling_edges(&modules(&src)));
    assert!(
        found.is_empty(),
        "import circles in src/ (docs/developer/modules.md says which way each layer points):\n{}",
        found.join("\n")
    );
}

#[test]
fn a_circle_between_siblings_is_found_and_a_parent_child_pair_is_not() {
    let module = |path: &str, text: &str| {
        (
            path.split("::")
                .filter(|p| !p.is_empty())
                .map(str::to_string)
                .collect::<ModulePath>(),
            text.to_string(),
        )
    };
    let tree: BTreeMap<ModulePath, String> = [
        module("", "pub mod a; pub mod b;"),
        module("a", "use crate::b::Thing; pub mod child;"),
        module("a::child", "use super::Parent; use crate::b::{x::Y};"),
        module("b", "pub mod x; use crate::a::child::helper;"),
        module("b::x", "use super::super::a::Parent;"),
    ]
    .into_iter()
    .collect();
    let found = circles(&sibling_edges(&tree));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("crate: "), "{found:?}");

    let acyclic: BTreeMap<ModulePath, String> = [
        module("", "pub mod a; pub mod b;"),
        module("a", "pub mod child; use child::run;"),
        module("a::child", "use super::Parent; use crate::b::Thing;"),
        module("b", "// use crate::a::Parent; a comment is not an import"),
    ]
    .into_iter()
    .collect();
    assert!(circles(&sibling_edges(&acyclic)).is_empty());
}
