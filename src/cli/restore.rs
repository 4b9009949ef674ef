//! `capn etcd-restore fetch|commit`: the two steps of a member's restore that run in capn's
//! own image, as init containers around etcd's `etcdutl snapshot restore`
//! (docs/design.md §9, docs/guide/backups.md "What a restore does").
//!
//! The member's volume (mounted at `/var/lib/etcd` by the `stable` channel) holds the data
//! directory (`data/`) and, while a restore is pending, a work directory (`restore/`) on
//! the same file system, so the last step is one `rename`:
//!
//! 1. `fetch` — unless the data directory already holds a member, downloads the snapshot
//!    into `restore/snapshot.db`, verified against its record (size, SHA-256), and clears
//!    `restore/staging` so that step 2 starts clean;
//! 2. `etcdutl snapshot restore restore/snapshot.db --data-dir restore/staging ...` (etcd's
//!    image) writes the member's data with its name, peer URL and the initial cluster;
//! 3. `commit` — moves `restore/staging/member` to `data/member` only if `data/member` does
//!    not exist, syncs, and removes the work directory.
//!
//! A pod restart at any point repeats the steps from the start: before step 3's rename the
//! data directory has no member, so nothing was started; after it the member is complete,
//! and `fetch` and `commit` leave it alone (the snapshot is fetched again so that step 2,
//! which cannot be skipped without a shell, has a file to read). A corrupt or missing
//! snapshot fails step 1, so etcd never starts half restored.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::{Args, Subcommand};

use crate::backup::store::{Destination, Store};
use crate::backup::{ACCESS_KEY_ID, SECRET_ACCESS_KEY, SESSION_TOKEN};

/// The restore steps that run in capn's image.
#[derive(Debug, Subcommand)]
pub enum RestoreCommand {
    /// Download a snapshot into the member's volume, verified (size and SHA-256 against its
    /// record). Credentials from the environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    /// optionally AWS_SESSION_TOKEN. Does nothing to a data directory that holds a member.
    Fetch(FetchArgs),
    /// Move the restored member from the work directory into the data directory if that
    /// holds no member yet, then remove the work directory.
    Commit(CommitArgs),
}

#[derive(Debug, Args)]
pub struct FetchArgs {
    /// URL of the S3 API.
    #[arg(long)]
    pub endpoint: String,
    #[arg(long)]
    pub bucket: String,
    #[arg(long, default_value = "us-east-1")]
    pub region: String,
    /// Key prefix the snapshot was written under (for `latest`).
    #[arg(long, default_value = "")]
    pub prefix: String,
    /// Object key of the snapshot, or `latest`.
    #[arg(long)]
    pub snapshot: String,
    /// etcd's data directory (its `--data-dir`).
    #[arg(long)]
    pub data_dir: PathBuf,
    /// Work directory on the same file system as the data directory.
    #[arg(long)]
    pub work_dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct CommitArgs {
    /// etcd's data directory (its `--data-dir`).
    #[arg(long)]
    pub data_dir: PathBuf,
    /// The work directory `fetch` used.
    #[arg(long)]
    pub work_dir: PathBuf,
}

/// The snapshot's path in the work directory.
pub fn snapshot_file(work_dir: &Path) -> PathBuf {
    work_dir.join("snapshot.db")
}

/// Where `etcdutl snapshot restore --data-dir` writes, in the work directory.
pub fn staging_dir(work_dir: &Path) -> PathBuf {
    work_dir.join("staging")
}

/// Runs one step.
///
/// # Errors
/// A missing credential, a missing or corrupt snapshot, a file system error; the message
/// says which, and the init container fails with it (nothing starts).
pub async fn run(command: RestoreCommand) -> anyhow::Result<()> {
    match command {
        RestoreCommand::Fetch(args) => fetch(args).await,
        RestoreCommand::Commit(args) => commit(&args.data_dir, &args.work_dir),
    }
}

async fn fetch(args: FetchArgs) -> anyhow::Result<()> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let access_key_id = env(ACCESS_KEY_ID)
        .with_context(|| format!("{ACCESS_KEY_ID} is not set: the credentials Secret must have this key"))?;
    let secret_access_key = env(SECRET_ACCESS_KEY)
        .with_context(|| format!("{SECRET_ACCESS_KEY} is not set: the credentials Secret must have this key"))?;
    if args.data_dir.join("member").exists() {
        println!(
            "{} holds a member already: nothing to restore; fetching the snapshot again only for the etcdutl step",
            args.data_dir.display()
        );
    }
    std::fs::create_dir_all(&args.work_dir).with_context(|| args.work_dir.display().to_string())?;
    let staging = staging_dir(&args.work_dir);
    if staging.exists() {
        std::fs::remove_dir_all(&staging).with_context(|| staging.display().to_string())?;
    }
    let store = Store::connect(Destination {
        endpoint: args.endpoint,
        bucket: args.bucket,
        region: args.region,
        prefix: crate::backup::naming::normalize_prefix(&args.prefix),
        access_key_id,
        secret_access_key,
        session_token: env(SESSION_TOKEN),
    })?;
    let target = snapshot_file(&args.work_dir);
    let record = store
        .fetch_snapshot(&args.snapshot, &target)
        .await
        .map_err(|e| anyhow::anyhow!("{}: {e}", e.reason()))?;
    println!(
        "fetched {} ({} bytes, sha256 {}, etcd revision {}, etcd {}) to {}",
        record.key,
        record.size,
        record.sha256,
        record.revision,
        record.etcd_version,
        target.display()
    );
    Ok(())
}

/// Step 3; see the module documentation.
///
/// # Errors
/// File system errors, or a work directory without a restored member while the data
/// directory has none either.
pub fn commit(data_dir: &Path, work_dir: &Path) -> anyhow::Result<()> {
    let member = data_dir.join("member");
    if member.exists() {
        println!(
            "{} holds a member already; removing the work directory",
            data_dir.display()
        );
    } else {
        let staged = staging_dir(work_dir).join("member");
        anyhow::ensure!(
            staged.is_dir(),
            "{} does not exist: etcdutl snapshot restore did not write a member, and {} has none either",
            staged.display(),
            data_dir.display()
        );
        std::fs::create_dir_all(data_dir).with_context(|| data_dir.display().to_string())?;
        // etcd refuses a data directory others can read (0700, etcd's fileutil).
        set_mode(data_dir, 0o700)?;
        // One rename: the member appears whole or not at all.
        std::fs::rename(&staged, &member)
            .with_context(|| format!("moving {} to {}", staged.display(), member.display()))?;
        sync_dir(data_dir)?;
        println!("restored member moved into {}", data_dir.display());
    }
    if work_dir.exists() {
        std::fs::remove_dir_all(work_dir).with_context(|| work_dir.display().to_string())?;
    }
    Ok(())
}

fn set_mode(path: &Path, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).with_context(|| path.display().to_string())
}

fn sync_dir(path: &Path) -> anyhow::Result<()> {
    std::fs::File::open(path)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn staged(work: &Path, marker: &str) {
        let member = staging_dir(work).join("member").join("snap");
        std::fs::create_dir_all(&member).unwrap();
        std::fs::write(member.join("db"), marker).unwrap();
    }

    #[test]
    fn commit_moves_the_staged_member_into_an_empty_data_directory() {
        let dir = tempfile::tempdir().unwrap();
        let (data, work) = (dir.path().join("data"), dir.path().join("restore"));
        staged(&work, "restored");
        commit(&data, &work).unwrap();
        assert_eq!(
            std::fs::read_to_string(data.join("member/snap/db")).unwrap(),
            "restored"
        );
        assert!(!work.exists());
    }

    #[test]
    fn commit_never_replaces_a_member_that_is_there() {
        let dir = tempfile::tempdir().unwrap();
        let (data, work) = (dir.path().join("data"), dir.path().join("restore"));
        std::fs::create_dir_all(data.join("member/snap")).unwrap();
        std::fs::write(data.join("member/snap/db"), "live").unwrap();
        staged(&work, "restored");
        commit(&data, &work).unwrap();
        assert_eq!(std::fs::read_to_string(data.join("member/snap/db")).unwrap(), "live");
        assert!(!work.exists());
    }

    #[test]
    fn commit_without_a_staged_member_fails_and_leaves_the_data_directory_empty() {
        let dir = tempfile::tempdir().unwrap();
        let (data, work) = (dir.path().join("data"), dir.path().join("restore"));
        let err = commit(&data, &work).unwrap_err();
        assert!(err.to_string().contains("did not write a member"), "{err}");
        assert!(!data.join("member").exists());
    }
}
