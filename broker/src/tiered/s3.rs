//! The remote store in an S3-compatible object store (`remote.log.storage.s3.*`), through the
//! `object_store` crate: the same contract as the local-directory store ([`RemoteStorage`] and
//! [`RemoteLogMetadataStore`]) and the same layout, object keys instead of paths:
//! `<topic>-<partition>-<topic id>/<uuid>.log` (and `.leader-epoch-checkpoint`, `.snapshot`),
//! `__remote_log_metadata/<topic>-<partition>-<topic id>/<uuid>.json`.
//!
//! S3 gives what the contract needs without the directory store's care: a PUT is durable and
//! visible to every reader once it returns, and an object is replaced whole or not at all.
//! Credentials come from the broker's environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! optional `AWS_SESSION_TOKEN`, the names `object_store` and AWS's tools read); they are
//! required, so that a missing key is an error at start rather than a probe of a cloud metadata
//! endpoint.
//!
//! The traits block; `object_store` is async. The store owns a one-thread runtime and waits on
//! its tasks, which works from any thread (a `spawn_blocking` one, `dump-log`'s plain main).

use std::collections::HashMap;
use std::fmt;
use std::io::Read;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as ObjectPath;
use object_store::{
    BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, RetryConfig, WriteMultipart,
};

use super::metadata::{
    topic_id_of, MetadataError, RemoteLogMetadataStore, RemoteSegmentMetadata, METADATA_DIR,
};
use super::storage::{
    IndexKind, RemoteSegmentId, RemoteStorage, RemoteStorageError, SegmentData, TopicIdPartition,
};
use crate::config::S3Config;

/// The size of the parts a segment larger than one goes up in (S3's smallest part is 5 MiB).
const UPLOAD_PART_BYTES: usize = 8 << 20;

/// A bucket of an S3-compatible store holding segments and their metadata.
pub struct S3Storage {
    bucket: String,
    store: Arc<AmazonS3>,
    /// Metadata objects as last read, by key, with the entity tag they had when listed: a
    /// listing then reads only the objects that are new or changed (a leader's task lists its
    /// partitions every `remote.log.manager.task.interval.ms`).
    listed: Mutex<HashMap<ObjectPath, (String, RemoteSegmentMetadata)>>,
    /// Runs the store's requests; shut down in the background on drop, so that dropping the
    /// store inside async code does not block it.
    runtime: Option<tokio::runtime::Runtime>,
}

impl fmt::Debug for S3Storage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "S3Storage(s3://{})", self.bucket)
    }
}

impl Drop for S3Storage {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// The keys an S3 client is signed with. Never in server.properties: a broker reads them from
/// its environment ([`S3Credentials::from_env`]).
#[derive(Clone)]
pub struct S3Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl fmt::Debug for S3Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "S3Credentials({})", self.access_key_id)
    }
}

impl S3Credentials {
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` (both required) and `AWS_SESSION_TOKEN`.
    pub fn from_env() -> Result<Self, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let required = |name: &str| {
            var(name).ok_or_else(|| {
                format!(
                    "remote.log.storage.s3.bucket is set, but {name} is not in the environment \
                     (the S3 store's credentials come from AWS_ACCESS_KEY_ID and \
                     AWS_SECRET_ACCESS_KEY)"
                )
            })
        };
        Ok(S3Credentials {
            access_key_id: required("AWS_ACCESS_KEY_ID")?,
            secret_access_key: required("AWS_SECRET_ACCESS_KEY")?,
            session_token: var("AWS_SESSION_TOKEN"),
        })
    }
}

impl S3Storage {
    /// A client of `config.bucket` signing with `credentials`. Nothing is sent yet: a store
    /// unreachable now fails its operations as `Unavailable` until it is back, as the directory
    /// store does.
    pub fn new(config: &S3Config, credentials: S3Credentials) -> Result<Self, String> {
        // A request fails within seconds while the store is down (uploads and remote reads
        // are retried by their callers), instead of object_store's default three minutes.
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(50),
                max_backoff: Duration::from_millis(500),
                base: 2.0,
            },
            max_retries: 2,
            retry_timeout: Duration::from_secs(5),
        };
        let mut builder = AmazonS3Builder::new()
            .with_access_key_id(credentials.access_key_id)
            .with_secret_access_key(credentials.secret_access_key)
            .with_bucket_name(&config.bucket)
            .with_region(&config.region)
            .with_virtual_hosted_style_request(!config.path_style_access)
            .with_retry(retry)
            .with_client_options(
                ClientOptions::new()
                    .with_connect_timeout(Duration::from_secs(2))
                    .with_timeout(Duration::from_secs(60))
                    .with_allow_http(
                        config
                            .endpoint
                            .as_deref()
                            .is_some_and(|e| e.starts_with("http://")),
                    ),
            );
        if let Some(token) = credentials.session_token {
            builder = builder.with_token(token);
        }
        if let Some(endpoint) = &config.endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        let store = builder
            .build()
            .map_err(|e| format!("remote.log.storage.s3.bucket={}: {e}", config.bucket))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("remote-s3")
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the S3 client's runtime: {e}"))?;
        Ok(S3Storage {
            bucket: config.bucket.clone(),
            store: Arc::new(store),
            listed: Mutex::new(HashMap::new()),
            runtime: Some(runtime),
        })
    }

    /// Runs `op` on the store's runtime and waits for it.
    fn run<T: Send + 'static>(
        &self,
        op: impl FnOnce(Arc<AmazonS3>) -> futures::future::BoxFuture<'static, object_store::Result<T>>,
    ) -> object_store::Result<T> {
        let runtime = self.runtime.as_ref().expect("the runtime lives until drop");
        let task = runtime.spawn(op(self.store.clone()));
        futures::executor::block_on(task).unwrap_or_else(|e| {
            Err(object_store::Error::Generic {
                store: "S3",
                source: Box::new(e),
            })
        })
    }

    fn segment_key(segment: &RemoteSegmentId, extension: &str) -> ObjectPath {
        ObjectPath::from(format!(
            "{}/{}.{extension}",
            segment.partition.dir_name(),
            segment.id
        ))
    }

    fn metadata_prefix(partition: &TopicIdPartition) -> ObjectPath {
        ObjectPath::from(format!("{METADATA_DIR}/{}", partition.dir_name()))
    }

    fn metadata_key(segment: &RemoteSegmentId) -> ObjectPath {
        ObjectPath::from(format!(
            "{METADATA_DIR}/{}/{}.json",
            segment.partition.dir_name(),
            segment.id
        ))
    }

    fn put(&self, key: ObjectPath, bytes: Bytes) -> object_store::Result<()> {
        self.run(move |s| Box::pin(async move { s.put(&key, bytes.into()).await.map(|_| ()) }))
    }

    fn get(&self, key: ObjectPath) -> object_store::Result<Bytes> {
        self.run(move |s| Box::pin(async move { s.get(&key).await?.bytes().await }))
    }

    /// Whether the bucket answers a listing: a missing object of a bucket that does not is a
    /// store that failed, not an object that is gone.
    fn reachable(&self) -> bool {
        self.run(|s| Box::pin(async move { s.list_with_delimiter(None).await.map(|_| ()) }))
            .is_ok()
    }

    /// `e` as the storage contract's error.
    fn error(&self, what: impl fmt::Display, e: object_store::Error) -> RemoteStorageError {
        match e {
            object_store::Error::NotFound { .. } if self.reachable() => {
                RemoteStorageError::NotFound {
                    what: what.to_string(),
                }
            }
            e => RemoteStorageError::Unavailable {
                what: format!("{what} in s3://{}", self.bucket),
                source: std::io::Error::other(e),
            },
        }
    }

    fn metadata_error(&self, key: &ObjectPath, e: object_store::Error) -> MetadataError {
        MetadataError::Io {
            path: format!("s3://{}/{key}", self.bucket).into(),
            source: std::io::Error::other(e),
        }
    }

    fn parse_metadata(
        &self,
        key: &ObjectPath,
        bytes: &[u8],
    ) -> Result<RemoteSegmentMetadata, MetadataError> {
        serde_json::from_slice(bytes).map_err(|e| MetadataError::Corrupt {
            path: format!("s3://{}/{key}", self.bucket).into(),
            reason: e.to_string(),
        })
    }
}

impl RemoteStorage for S3Storage {
    fn copy_segment(
        &self,
        segment: &RemoteSegmentId,
        data: SegmentData<'_>,
    ) -> Result<(), RemoteStorageError> {
        for (extension, bytes) in [
            (
                IndexKind::LeaderEpoch.extension(),
                Bytes::copy_from_slice(data.leader_epoch_index),
            ),
            (
                IndexKind::ProducerSnapshot.extension(),
                Bytes::copy_from_slice(data.producer_snapshot),
            ),
        ] {
            self.put(Self::segment_key(segment, extension), bytes)
                .map_err(|e| self.error(format_args!("{extension} of {segment}"), e))?;
        }
        let local = |e: std::io::Error| RemoteStorageError::Unavailable {
            what: data.log_file.display().to_string(),
            source: e,
        };
        let mut file = std::fs::File::open(data.log_file).map_err(local)?;
        let len = file.metadata().map_err(local)?.len();
        let key = Self::segment_key(segment, "log");
        // The log last, so a copy whose log is there has its indexes. A segment larger than a
        // part goes up in parts, never whole in memory (segment.bytes defaults to 1 GiB).
        let sent = if len <= UPLOAD_PART_BYTES as u64 {
            let mut bytes = Vec::with_capacity(len as usize);
            file.read_to_end(&mut bytes).map_err(local)?;
            self.put(key, Bytes::from(bytes))
        } else {
            self.run(move |s| {
                Box::pin(async move {
                    let upload = s.put_multipart(&key).await?;
                    let mut parts = WriteMultipart::new_with_chunk_size(upload, UPLOAD_PART_BYTES);
                    let mut buf = vec![0; UPLOAD_PART_BYTES];
                    loop {
                        // Reading the local file here blocks the store's own thread only.
                        let n = match file.read(&mut buf) {
                            Ok(0) => break,
                            Ok(n) => n,
                            Err(e) => {
                                parts.abort().await?;
                                return Err(object_store::Error::Generic {
                                    store: "local segment file",
                                    source: Box::new(e),
                                });
                            }
                        };
                        parts.wait_for_capacity(2).await?;
                        parts.write(&buf[..n]);
                    }
                    parts.finish().await.map(|_| ())
                })
            })
        };
        sent.map_err(|e| self.error(format_args!("log of {segment}"), e))
    }

    fn fetch_segment(
        &self,
        segment: &RemoteSegmentId,
        start: u64,
        end: Option<u64>,
    ) -> Result<Vec<u8>, RemoteStorageError> {
        let key = Self::segment_key(segment, "log");
        let read = self.run(move |s| {
            Box::pin(async move {
                // The size first: S3 refuses a range starting past the end, which the contract
                // answers with the bytes there are.
                let len = s.head(&key).await?.size;
                let end = end.unwrap_or(len).min(len);
                let start = start.min(end);
                if start == end {
                    return Ok(Bytes::new());
                }
                s.get_range(&key, start..end).await
            })
        });
        read.map(|b| b.to_vec()).map_err(|e| self.error(segment, e))
    }

    fn fetch_index(
        &self,
        segment: &RemoteSegmentId,
        kind: IndexKind,
    ) -> Result<Vec<u8>, RemoteStorageError> {
        self.get(Self::segment_key(segment, kind.extension()))
            .map(|b| b.to_vec())
            .map_err(|e| self.error(format_args!("{} of {segment}", kind.extension()), e))
    }

    fn delete_segment(&self, segment: &RemoteSegmentId) -> Result<(), RemoteStorageError> {
        for extension in [
            "log",
            IndexKind::LeaderEpoch.extension(),
            IndexKind::ProducerSnapshot.extension(),
        ] {
            let key = Self::segment_key(segment, extension);
            match self.run(move |s| Box::pin(async move { s.delete(&key).await })) {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => {
                    return Err(RemoteStorageError::Unavailable {
                        what: format!("{extension} of {segment} in s3://{}", self.bucket),
                        source: std::io::Error::other(e),
                    })
                }
            }
        }
        Ok(())
    }
}

impl RemoteLogMetadataStore for S3Storage {
    fn put(&self, metadata: &RemoteSegmentMetadata) -> Result<(), MetadataError> {
        let key = Self::metadata_key(&metadata.segment);
        match self.get(key.clone()) {
            Ok(bytes) => {
                let current = self.parse_metadata(&key, &bytes)?;
                if !current.state.may_become(metadata.state) {
                    return Err(MetadataError::InvalidTransition {
                        segment: metadata.segment.clone(),
                        from: current.state,
                        to: metadata.state,
                    });
                }
            }
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(self.metadata_error(&key, e)),
        }
        let bytes = serde_json::to_vec(metadata).map_err(|e| MetadataError::Corrupt {
            path: format!("s3://{}/{key}", self.bucket).into(),
            reason: e.to_string(),
        })?;
        S3Storage::put(self, key.clone(), Bytes::from(bytes))
            .map_err(|e| self.metadata_error(&key, e))
    }

    fn list(
        &self,
        partition: &TopicIdPartition,
    ) -> Result<Vec<RemoteSegmentMetadata>, MetadataError> {
        let prefix = Self::metadata_prefix(partition);
        let listed = {
            let prefix = prefix.clone();
            self.run(move |s| {
                Box::pin(async move { s.list(Some(&prefix)).try_collect::<Vec<_>>().await })
            })
        }
        .map_err(|e| self.metadata_error(&prefix, e))?;
        let mut out = Vec::new();
        for object in listed {
            if object.location.extension() != Some("json") {
                continue;
            }
            let cached = object.e_tag.as_ref().and_then(|tag| {
                let listed = self.listed.lock().expect("never poisoned");
                listed
                    .get(&object.location)
                    .filter(|(t, _)| t == tag)
                    .map(|(_, m)| m.clone())
            });
            let metadata = match cached {
                Some(m) => m,
                None => {
                    let bytes = self
                        .get(object.location.clone())
                        .map_err(|e| self.metadata_error(&object.location, e))?;
                    let m = self.parse_metadata(&object.location, &bytes)?;
                    if let Some(tag) = object.e_tag {
                        self.listed
                            .lock()
                            .expect("never poisoned")
                            .insert(object.location, (tag, m.clone()));
                    }
                    m
                }
            };
            out.push(metadata);
        }
        out.sort_by_key(|m| (m.start_offset, m.event_timestamp_ms));
        Ok(out)
    }

    fn topic_ids(&self, topic: &str, partition: i32) -> Result<Vec<uuid::Uuid>, MetadataError> {
        let root = ObjectPath::from(METADATA_DIR);
        let listed = {
            let root = root.clone();
            self.run(move |s| Box::pin(async move { s.list_with_delimiter(Some(&root)).await }))
        }
        .map_err(|e| self.metadata_error(&root, e))?;
        let mut ids: Vec<uuid::Uuid> = listed
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename())
            .filter_map(|name| topic_id_of(name, topic, partition))
            .collect();
        ids.sort();
        Ok(ids)
    }
}
