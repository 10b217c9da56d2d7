//! tidemark-broker: the Kafka-wire-compatible broker that tidemark deploys and tests. It keeps
//! Kafka's on-disk ideas (segments named by base offset, `leader-epoch-checkpoint`) and speaks the
//! Kafka protocol through the kafka-protocol crate, so real clients use it unchanged.

pub mod admin;
pub mod broker;
pub mod config;
pub mod controller;
pub mod dump;
pub mod durable;
pub mod errors;
pub mod faults;
pub mod fetch_session;
pub mod group;
pub mod log;
pub mod log_dir;
pub mod logging;
pub mod metadata;
pub mod mirror;
pub mod partition;
pub mod pause;
pub mod produce;
pub mod producer_ids;
pub mod protocol;
pub mod replica;
pub mod retention;
pub mod shutdown;
pub mod tiered;
