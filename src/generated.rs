//! The check behind every generated file kept in the repository (`crds/`, `clusterctl/`,
//! the book's reference chapters): the file must be what the code generates now, and a
//! variable in the environment rewrites it instead.

use std::path::Path;

/// Compares the file at `relative` (from the repository root) with `generated`; when the
/// environment variable `update` is set, writes it first. `rerun` is the command that
/// regenerates it, named in the failure.
///
/// # Panics
/// When the file is missing or differs (the test's failure).
pub(crate) fn assert_current(relative: &str, generated: &str, update: &str, rerun: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    if std::env::var_os(update).is_some() {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&path, generated).unwrap();
    }
    let on_disk =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}; run {update}=1 {rerun}", path.display()));
    assert!(
        on_disk == generated,
        "{} is stale; run {update}=1 {rerun}",
        path.display()
    );
}
