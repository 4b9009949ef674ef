//! Every reference to a document in the repository points at something that exists: a
//! `docs/...` path, a section `docs/design.md §N`, a heading `docs/reference.md "<heading>"`
//! or of any other page of the book (`docs/guide/upgrades.md "<heading>"`), a heading of the
//! front page (`README "<heading>"`, `README.md "<heading>"`), and relative Markdown links.
//! Whoever clones the repository can follow every citation.

use std::path::{Path, PathBuf};

use regex::Regex;

/// Where references are looked for (generated files included: they carry doc comments).
const SCANNED: &[&str] = &[
    "src",
    "tests",
    "benches",
    ".ci",
    "hack",
    "examples",
    "channels",
    "templates",
    "clusterctl",
    "crds",
    "deploy",
    "docs",
    "README.md",
    "Dockerfile",
    "Cargo.toml",
];

/// Whether a reference must spell out `docs/` (`design §4` alone no longer passes). Set by
/// `hack/rewrite-doc-references.sh`, which rewrites the old spellings.
const REQUIRE_DOCS_PREFIX: bool = true;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn files() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in SCANNED {
        let path = root().join(entry);
        for file in walkdir::WalkDir::new(&path).into_iter().filter_map(Result::ok) {
            // This checker and the rewrite script spell the old references on purpose.
            let own = ["src/doc_references.rs", "hack/rewrite-doc-references.sh"]
                .iter()
                .any(|o| file.path().ends_with(o));
            if file.file_type().is_file() && !own {
                out.push(file.into_path());
            }
        }
    }
    out
}

/// The headings of a Markdown file, without the leading `#`s.
fn headings(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| l.trim_start_matches('#').trim().to_string())
        .collect()
}

/// A quoted heading as cited, on one line: it may wrap onto the next comment line (`//`,
/// `///`, `#`).
fn cited_heading(quoted: &str) -> String {
    quoted
        .split_whitespace()
        .filter(|w| !w.starts_with("//") && *w != "#")
        .collect::<Vec<_>>()
        .join(" ")
}

/// Every broken reference in `text` (a file at `path`), as `<file>: <what>`.
fn broken_in(path: &Path, text: &str) -> Vec<String> {
    let design = headings(&root().join("docs/design.md"));
    let reference = headings(&root().join("docs/reference.md"));
    let rel = path.strip_prefix(root()).unwrap_or(path).display().to_string();
    let in_docs = rel.starts_with("docs/");
    let mut out = Vec::new();
    let paths = Regex::new(r"(?:^|[^A-Za-z0-9_./-])docs/([A-Za-z0-9_./-]*[A-Za-z0-9_])").expect("regex");
    for c in paths.captures_iter(text) {
        if !root().join("docs").join(&c[1]).exists() {
            out.push(format!("{rel}: docs/{} does not exist", &c[1]));
        }
    }
    let sections = Regex::new(r"(docs/)?design(?:\.md)? §(\d+)").expect("regex");
    for c in sections.captures_iter(text) {
        let n = &c[2];
        if !design.iter().any(|h| h.starts_with(&format!("{n}. "))) {
            out.push(format!("{rel}: docs/design.md has no section §{n}"));
        }
        if REQUIRE_DOCS_PREFIX && c.get(1).is_none() && !in_docs {
            out.push(format!("{rel}: write `docs/design.md §{n}`, not `design §{n}`"));
        }
    }
    let quoted = Regex::new(r#"(docs/)?reference\.md "([^"]+)""#).expect("regex");
    for c in quoted.captures_iter(text) {
        let heading = cited_heading(&c[2]);
        if !reference.iter().any(|h| h.starts_with(&heading)) {
            out.push(format!("{rel}: docs/reference.md has no heading {heading:?}"));
        }
    }
    // A heading of another page of the book (docs/reference.md is checked above).
    let chapter = Regex::new(r#"docs/([A-Za-z0-9_./-]+\.md) \\?"([^"\\]+)\\?""#).expect("regex");
    for c in chapter.captures_iter(text) {
        if &c[1] == "reference.md" {
            continue;
        }
        let heading = cited_heading(&c[2]);
        let page = root().join("docs").join(&c[1]);
        if page.exists() && !headings(&page).iter().any(|h| h.starts_with(&heading)) {
            out.push(format!("{rel}: docs/{} has no heading {heading:?}", &c[1]));
        }
    }
    // A heading of the front page.
    let readme = Regex::new(r#"README(?:\.md)?:? \\?"([^"\\]+)\\?""#).expect("regex");
    let front = headings(&root().join("README.md"));
    for c in readme.captures_iter(text) {
        let heading = cited_heading(&c[1]);
        if !front.iter().any(|h| h.starts_with(&heading)) {
            out.push(format!("{rel}: README.md has no heading {heading:?}"));
        }
    }
    if REQUIRE_DOCS_PREFIX && !in_docs {
        let bare = Regex::new(r"(?:^|[^A-Za-z0-9_./-])((?:shared/)?(?:design|reference)\.md)").expect("regex");
        for c in bare.captures_iter(text) {
            out.push(format!("{rel}: write `docs/{}`", c[1].trim_start_matches("shared/")));
        }
    }
    // Relative Markdown links.
    if rel.ends_with(".md") {
        let links = Regex::new(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)").expect("regex");
        for c in links.captures_iter(text) {
            let target = path.parent().unwrap_or(Path::new(".")).join(&c[1]);
            if !target.exists() {
                out.push(format!("{rel}: link to {} which does not exist", &c[1]));
            }
        }
    }
    out
}

#[test]
fn every_document_reference_resolves() {
    let mut broken = Vec::new();
    for file in files() {
        // Binary files (none today) are skipped.
        if let Ok(text) = std::fs::read_to_string(&file) {
            broken.extend(broken_in(&file, &text));
        }
    }
    assert!(broken.is_empty(), "broken document references:\n{}", broken.join("\n"));
}

#[test]
fn the_checker_finds_each_kind_of_broken_reference() {
    let here = root().join("src/example.rs");
    let text = "see docs/nope.md, design §42 and reference.md \"No such heading\"; docs/design.md §4 is fine";
    let broken = broken_in(&here, text);
    let missing: Vec<&String> = broken.iter().filter(|b| !b.contains(": write `")).collect();
    assert_eq!(missing.len(), 3, "{broken:?}");
    assert!(missing[0].contains("docs/nope.md does not exist"));
    assert!(missing[1].contains("no section §42"));
    assert!(missing[2].contains("no heading \"No such heading\""));
    // Once the references are rewritten, the old spellings are refused too.
    let spelling = broken.len() - missing.len();
    assert_eq!(spelling, if REQUIRE_DOCS_PREFIX { 2 } else { 0 }, "{broken:?}");
    assert!(
        broken_in(
            &here,
            "https://kubernetes.io/docs/concepts/ and docs/reference.md \"Identities\" and docs/reference.md \"Cluster\n/// API secrets\""
        )
        .is_empty()
    );
}

#[test]
fn front_page_heading_citations_are_checked() {
    let here = root().join("src/example.rs");
    let broken = broken_in(
        &here,
        "README \"No such section\" and README.md \"Neither\" and (README: \\\"Escaped\\\")",
    );
    assert_eq!(broken.len(), 3, "{broken:?}");
    assert!(
        broken.iter().all(|b| b.contains("README.md has no heading")),
        "{broken:?}"
    );
    // A heading the front page has, cited by a prefix, wrapped onto the next comment line.
    assert!(broken_in(&here, "README \"Two\n/// commands\" and README.md \"Compatibility\"").is_empty());
}

#[test]
fn book_chapter_heading_citations_are_checked() {
    let here = root().join("channels/example.yaml");
    let broken = broken_in(
        &here,
        "# docs/guide/upgrades.md \"No such heading\" and docs/guide/etcd-membership.md \"Lost\n# members\"",
    );
    assert_eq!(broken.len(), 1, "{broken:?}");
    assert!(broken[0].contains("docs/guide/upgrades.md has no heading \"No such heading\""));
    // A chapter that does not exist is reported once, as a missing path.
    let broken = broken_in(&here, "docs/guide/nope.md \"Anything\"");
    assert_eq!(broken.len(), 1, "{broken:?}");
    assert!(broken[0].contains("docs/guide/nope.md does not exist"));
}
