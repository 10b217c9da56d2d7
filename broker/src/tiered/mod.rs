//! Tiered storage (KIP-405) and the follower fetch from the last tiered offset (KIP-1023).
//!
//! A leader copies closed segments below its last stable offset to a remote store and may then
//! delete them locally; the remote copy keeps the data readable and lets an empty follower start
//! near the log end instead of replicating everything. This module holds the two boundaries
//! Kafka names, the `RemoteStorageManager` ([`storage::RemoteStorage`]: the bytes) and the
//! `RemoteLogMetadataManager` ([`metadata::RemoteLogMetadataStore`]: which segments exist, over
//! which offsets and epochs, in which state), and the pure rules the partition and the fetcher
//! ask them through.

pub mod follower;
pub mod manager;
pub mod metadata;
#[cfg(feature = "s3")]
pub mod s3;
pub mod storage;
pub mod upload;
