//! Cluster mirroring (KIP-1279): a destination cluster's partition leaders copy a source
//! cluster's partitions byte for byte at identical offsets, and an operator can fail over (the
//! destination turns writable) and fail back (the old source mirrors from the new one) while the
//! two logs keep converging. The Last Mirrored Leader Epoch (LMLE) is what makes failback safe:
//! each leader epoch belongs to one cluster only.

pub mod client;
pub mod context;
pub mod group_filter;
pub mod groups;
pub mod rules;
pub mod runner;
pub mod service;
pub mod store;
pub mod tasks;
pub mod wire;
