#!/usr/bin/env bash
# Rewrites the code's references to the design and reference documents so that they name the
# files in this repository: `design §N` and `design.md §N` → `docs/design.md §N`,
# `reference.md` → `docs/reference.md`, `shared/<name>.md` → `docs/<name>.md`. Idempotent:
# run it again after merging a branch that still uses the old spellings, then run the tests
# (src/doc_references.rs fails on any reference that does not resolve, and, once this script
# has switched it on, on any spelling without `docs/`).
#
#   hack/rewrite-doc-references.sh            rewrite, then regenerate crds/ and clusterctl/
#   hack/rewrite-doc-references.sh --no-regen rewrite only
set -euo pipefail
cd "$(dirname "$0")/.."

# Sources only: docs/ links to its siblings relatively, and generated files are regenerated.
mapfile -t files < <(git ls-files src tests hack examples channels templates README.md Dockerfile \
  | grep -v -e '^hack/rewrite-doc-references.sh$' -e '^src/doc_references.rs$')
perl -pi -e '
  s{shared/(design|reference)\.md}{docs/$1.md}g;
  s{(?<![\w/.-])design\.md}{docs/design.md}g;
  s{(?<![\w/.-])design §}{docs/design.md §}g;
  s{(?<![\w/.-])reference\.md}{docs/reference.md}g;
' "${files[@]}"
perl -pi -e 's/^const REQUIRE_DOCS_PREFIX: bool = false;/const REQUIRE_DOCS_PREFIX: bool = true;/' src/doc_references.rs

if [ "${1:-}" != "--no-regen" ]; then
  # Doc comments end up in the CRD schemas and the clusterctl artifacts.
  UPDATE_CRDS=1 cargo test --locked --lib crds_directory >&2
  UPDATE_MANIFESTS=1 cargo test --locked --lib clusterctl_files >&2
fi
git diff --stat
