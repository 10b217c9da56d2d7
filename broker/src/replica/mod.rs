//! Replication between brokers: a small Kafka client for broker-to-broker requests and the
//! follower fetchers that keep replicas in step with their leaders, truncating by leader epoch,
//! one per leader broker within a fetch session.

pub mod client;
pub mod fetcher;
pub mod session;
