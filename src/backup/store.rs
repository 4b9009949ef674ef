//! The object store side of backups and restores, on `object_store`'s S3 client.
//!
//! - [`upload_snapshot`] streams a snapshot into a multipart upload, computing its SHA-256
//!   and size on the way (the snapshot is never held in memory or on disk), then verifies
//!   the stored object — its size with a HEAD, its hash by reading it back — and only then
//!   writes the sidecar ([`super::naming::SnapshotRecord`]) that makes it a backup;
//! - [`apply_retention`] deletes what [`super::retention::keys_to_delete`] says, after that;
//! - [`fetch_snapshot`] downloads a snapshot into a file, checking size and hash against its
//!   sidecar, and renames it into place only when both match (the restore's first step).
//!
//! Credentials come from the destination's Secret (keys [`super::ACCESS_KEY_ID`],
//! [`super::SECRET_ACCESS_KEY`], optional [`super::SESSION_TOKEN`]); path-style requests,
//! so any S3-compatible server works (MinIO, Ceph RGW, s3s-fs) as well as AWS.

use std::path::Path as FsPath;
use std::sync::Arc;

use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::naming::{LATEST, SIDECAR_SUFFIX, SnapshotRecord, sidecar_key, snapshot_time};

/// Multipart part size: S3's minimum for every part but the last is 5 MiB; 8 MiB parts keep
/// a 10,000-part upload good for 80 GiB, far above etcd's 8 GiB storage quota ceiling.
pub const PART_SIZE: usize = 8 * 1024 * 1024;
/// Parts in flight at once: bounds the memory of one upload to about 2 × [`PART_SIZE`].
pub const PARTS_IN_FLIGHT: usize = 2;

/// Where snapshots go and who may write there: the resolved form of `spec.backup.destination`.
#[derive(Clone)]
pub struct Destination {
    /// `http(s)://host[:port]` of the S3 API.
    pub endpoint: String,
    pub bucket: String,
    /// Region for request signing (`us-east-1` when the server has none).
    pub region: String,
    /// Prefix of the snapshots' keys, without leading or trailing `/`.
    pub prefix: String,
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl std::fmt::Debug for Destination {
    // Credentials never reach logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Destination")
            .field("endpoint", &self.endpoint)
            .field("bucket", &self.bucket)
            .field("region", &self.region)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// What can go wrong talking to the store or with what it holds.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("backup destination {endpoint} bucket {bucket}: {source}")]
    Client {
        endpoint: String,
        bucket: String,
        #[source]
        source: object_store::Error,
    },
    #[error("snapshot {key} not found in bucket {bucket} (nothing restored); under {prefix:?} there is {found}")]
    SnapshotMissing {
        bucket: String,
        prefix: String,
        key: String,
        found: String,
    },
    #[error(
        "snapshot {key} does not match its record: {what} (expected {expected}, found {found}); refusing to use it"
    )]
    Corrupt {
        key: String,
        what: &'static str,
        expected: String,
        found: String,
    },
    #[error("the snapshot stream failed after {bytes} bytes: {message}")]
    Source { bytes: u64, message: String },
    #[error("snapshot record {key} cannot be read: {message}")]
    Record { key: String, message: String },
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl StoreError {
    /// Short stable reason, used as the `BackupSucceeded` / restore condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Client { .. } => "BackupDestinationError",
            Self::SnapshotMissing { .. } => "SnapshotMissing",
            Self::Corrupt { .. } => "SnapshotCorrupt",
            Self::Source { .. } => "SnapshotStreamFailed",
            Self::Record { .. } => "SnapshotRecordInvalid",
            Self::Io { .. } => "SnapshotWriteFailed",
        }
    }
}

/// A connected store for one destination.
#[derive(Clone, Debug)]
pub struct Store {
    inner: Arc<dyn ObjectStore>,
    destination: Destination,
}

impl Store {
    /// Builds the S3 client (no request is sent yet).
    ///
    /// # Errors
    /// [`StoreError::Client`] when the endpoint is not a URL the client accepts.
    pub fn connect(destination: Destination) -> Result<Self, StoreError> {
        // reqwest's rustls without a bundled provider: use ring, like kube's client. A
        // provider installed before (by this or another client) is fine too.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let inner = AmazonS3Builder::new()
            .with_endpoint(&destination.endpoint)
            .with_bucket_name(&destination.bucket)
            .with_region(&destination.region)
            .with_access_key_id(&destination.access_key_id)
            .with_secret_access_key(&destination.secret_access_key)
            .with_virtual_hosted_style_request(false)
            .with_allow_http(destination.endpoint.starts_with("http://"));
        let inner = match &destination.session_token {
            Some(token) => inner.with_token(token),
            None => inner,
        }
        .build()
        .map_err(|source| StoreError::Client {
            endpoint: destination.endpoint.clone(),
            bucket: destination.bucket.clone(),
            source,
        })?;
        Ok(Self {
            inner: Arc::new(inner),
            destination,
        })
    }

    /// The destination this store writes to.
    pub fn destination(&self) -> &Destination {
        &self.destination
    }

    fn client_error(&self, source: object_store::Error) -> StoreError {
        StoreError::Client {
            endpoint: self.destination.endpoint.clone(),
            bucket: self.destination.bucket.clone(),
            source,
        }
    }

    /// Every object key under the destination's prefix.
    ///
    /// # Errors
    /// [`StoreError::Client`].
    pub async fn list_keys(&self) -> Result<Vec<String>, StoreError> {
        let prefix = (!self.destination.prefix.is_empty()).then(|| Path::from(self.destination.prefix.as_str()));
        let metas: Vec<_> = self
            .inner
            .list(prefix.as_ref())
            .try_collect()
            .await
            .map_err(|e| self.client_error(e))?;
        Ok(metas.into_iter().map(|m| m.location.to_string()).collect())
    }

    /// The newest complete snapshot (one with a sidecar) under the prefix.
    ///
    /// # Errors
    /// [`StoreError::SnapshotMissing`] when there is none, [`StoreError::Client`].
    pub async fn latest(&self) -> Result<String, StoreError> {
        let keys = self.list_keys().await?;
        let present: std::collections::BTreeSet<&str> = keys.iter().map(String::as_str).collect();
        keys.iter()
            .filter(|k| !k.ends_with(SIDECAR_SUFFIX) && snapshot_time(k).is_some())
            .filter(|k| present.contains(sidecar_key(k).as_str()))
            .max()
            .cloned()
            .ok_or_else(|| StoreError::SnapshotMissing {
                bucket: self.destination.bucket.clone(),
                prefix: self.destination.prefix.clone(),
                key: LATEST.to_string(),
                found: describe_found(&keys),
            })
    }

    /// Reads a snapshot's sidecar.
    ///
    /// # Errors
    /// [`StoreError::SnapshotMissing`] when the snapshot or its sidecar is not there (an
    /// incomplete upload is no snapshot), [`StoreError::Record`], [`StoreError::Client`].
    pub async fn record(&self, key: &str) -> Result<SnapshotRecord, StoreError> {
        let sidecar = sidecar_key(key);
        let bytes = match self.inner.get(&Path::from(sidecar.as_str())).await {
            Ok(got) => got.bytes().await.map_err(|e| self.client_error(e))?,
            Err(object_store::Error::NotFound { .. }) => {
                let keys = self.list_keys().await.unwrap_or_default();
                return Err(StoreError::SnapshotMissing {
                    bucket: self.destination.bucket.clone(),
                    prefix: self.destination.prefix.clone(),
                    key: key.to_string(),
                    found: describe_found(&keys),
                });
            }
            Err(e) => return Err(self.client_error(e)),
        };
        let record: SnapshotRecord = serde_json::from_slice(&bytes).map_err(|e| StoreError::Record {
            key: sidecar.clone(),
            message: e.to_string(),
        })?;
        if record.key != key {
            return Err(StoreError::Record {
                key: sidecar,
                message: format!("it describes {}, not {key}", record.key),
            });
        }
        Ok(record)
    }

    /// Streams `snapshot` to `key` and verifies it; see the module documentation. The
    /// returned record carries `revision`, `etcd_version` and `taken_at` as given.
    ///
    /// On any failure the multipart upload is aborted (or the unverified object is left
    /// without a sidecar, which makes it an incomplete upload), and nothing is deleted.
    ///
    /// # Errors
    /// [`StoreError::Source`] when the stream fails, [`StoreError::Client`],
    /// [`StoreError::Corrupt`] when the stored object differs from what was sent.
    pub async fn upload_snapshot<S, E>(
        &self,
        key: &str,
        snapshot: S,
        revision: i64,
        etcd_version: &str,
        taken_at: &str,
        encryption_keys: Vec<String>,
    ) -> Result<SnapshotRecord, StoreError>
    where
        S: Stream<Item = Result<Bytes, E>>,
        E: std::fmt::Display,
    {
        let path = Path::from(key);
        let upload = self
            .inner
            .put_multipart(&path)
            .await
            .map_err(|e| self.client_error(e))?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_SIZE);
        let mut hasher = Sha256::new();
        let mut size: u64 = 0;
        let mut snapshot = std::pin::pin!(snapshot);
        while let Some(chunk) = snapshot.next().await {
            let chunk = match chunk {
                Ok(chunk) => chunk,
                Err(e) => {
                    let _ = writer.abort().await;
                    return Err(StoreError::Source {
                        bytes: size,
                        message: e.to_string(),
                    });
                }
            };
            if let Err(e) = writer.wait_for_capacity(PARTS_IN_FLIGHT).await {
                let _ = writer.abort().await;
                return Err(self.client_error(e));
            }
            hasher.update(&chunk);
            size += chunk.len() as u64;
            writer.put(chunk);
        }
        writer.finish().await.map_err(|e| self.client_error(e))?;
        let sha256 = hex(&hasher.finalize());
        self.verify(key, size, &sha256).await?;
        let record = SnapshotRecord {
            key: key.to_string(),
            size,
            sha256,
            revision,
            etcd_version: etcd_version.to_string(),
            taken_at: taken_at.to_string(),
            encryption_keys,
        };
        let json = serde_json::to_vec(&record).map_err(|e| StoreError::Record {
            key: sidecar_key(key),
            message: e.to_string(),
        })?;
        self.inner
            .put(&Path::from(sidecar_key(key)), PutPayload::from(json))
            .await
            .map_err(|e| self.client_error(e))?;
        Ok(record)
    }

    /// Checks the stored object: its size with a HEAD, its SHA-256 by reading it back.
    ///
    /// # Errors
    /// [`StoreError::Corrupt`], [`StoreError::Client`].
    pub async fn verify(&self, key: &str, size: u64, sha256: &str) -> Result<(), StoreError> {
        let path = Path::from(key);
        let head = self.inner.head(&path).await.map_err(|e| self.client_error(e))?;
        if head.size != size {
            return Err(StoreError::Corrupt {
                key: key.to_string(),
                what: "size",
                expected: size.to_string(),
                found: head.size.to_string(),
            });
        }
        let mut stream = self
            .inner
            .get(&path)
            .await
            .map_err(|e| self.client_error(e))?
            .into_stream();
        let mut hasher = Sha256::new();
        while let Some(chunk) = stream.next().await {
            hasher.update(&chunk.map_err(|e| self.client_error(e))?);
        }
        let found = hex(&hasher.finalize());
        if found != sha256 {
            return Err(StoreError::Corrupt {
                key: key.to_string(),
                what: "sha256",
                expected: sha256.to_string(),
                found,
            });
        }
        Ok(())
    }

    /// Deletes `keys` (from [`super::retention::keys_to_delete`]), in order. A key already
    /// gone counts as deleted.
    ///
    /// # Errors
    /// [`StoreError::Client`] at the first key that cannot be deleted.
    pub async fn delete_keys(&self, keys: &[String]) -> Result<(), StoreError> {
        for key in keys {
            match self.inner.delete(&Path::from(key.as_str())).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(self.client_error(e)),
            }
        }
        Ok(())
    }

    /// Downloads snapshot `key` (or [`LATEST`]) into `target`, verified against its sidecar:
    /// the bytes go to `<target>.partial`, are hashed on the way, synced, and renamed to
    /// `target` only when size and SHA-256 match. A `target` that exists already and
    /// matches the record is kept (a restarted init container does no work twice).
    ///
    /// # Errors
    /// [`StoreError::SnapshotMissing`], [`StoreError::Corrupt`] (nothing is left at
    /// `target`), [`StoreError::Io`], [`StoreError::Client`].
    pub async fn fetch_snapshot(&self, key: &str, target: &FsPath) -> Result<SnapshotRecord, StoreError> {
        let key = if key == LATEST {
            self.latest().await?
        } else {
            key.to_string()
        };
        let record = self.record(&key).await?;
        if let Ok(existing) = file_digest(target).await
            && existing == (record.size, record.sha256.clone())
        {
            return Ok(record);
        }
        let partial = target.with_extension("partial");
        let io = |source: std::io::Error, path: &FsPath| StoreError::Io {
            path: path.display().to_string(),
            source,
        };
        let stream = match self.inner.get(&Path::from(key.as_str())).await {
            Ok(got) => got.into_stream(),
            Err(object_store::Error::NotFound { .. }) => {
                return Err(StoreError::SnapshotMissing {
                    bucket: self.destination.bucket.clone(),
                    prefix: self.destination.prefix.clone(),
                    key: key.clone(),
                    found: "its record but not the snapshot".into(),
                });
            }
            Err(e) => return Err(self.client_error(e)),
        };
        let mut file = tokio::fs::File::create(&partial).await.map_err(|e| io(e, &partial))?;
        let mut hasher = Sha256::new();
        let mut size: u64 = 0;
        let mut stream = std::pin::pin!(stream);
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| self.client_error(e))?;
            hasher.update(&chunk);
            size += chunk.len() as u64;
            file.write_all(&chunk).await.map_err(|e| io(e, &partial))?;
        }
        file.sync_all().await.map_err(|e| io(e, &partial))?;
        drop(file);
        let sha256 = hex(&hasher.finalize());
        let mismatch = if size != record.size {
            Some(("size", record.size.to_string(), size.to_string()))
        } else if sha256 != record.sha256 {
            Some(("sha256", record.sha256.clone(), sha256))
        } else {
            None
        };
        if let Some((what, expected, found)) = mismatch {
            let _ = tokio::fs::remove_file(&partial).await;
            return Err(StoreError::Corrupt {
                key,
                what,
                expected,
                found,
            });
        }
        tokio::fs::rename(&partial, target).await.map_err(|e| io(e, target))?;
        Ok(record)
    }
}

/// Size and SHA-256 of a file.
async fn file_digest(path: &FsPath) -> std::io::Result<(u64, String)> {
    use tokio::io::AsyncReadExt;
    let mut file = tokio::fs::File::open(path).await?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok((size, hex(&hasher.finalize())))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// "no snapshot" or the newest few keys, for an error message.
fn describe_found(keys: &[String]) -> String {
    let mut snapshots: Vec<&String> = keys
        .iter()
        .filter(|k| !k.ends_with(SIDECAR_SUFFIX) && snapshot_time(k).is_some())
        .collect();
    snapshots.sort();
    match snapshots.len() {
        0 => "no snapshot".to_string(),
        n => format!(
            "{n} snapshot(s), newest {}",
            snapshots
                .iter()
                .rev()
                .take(3)
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}
