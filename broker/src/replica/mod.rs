//! Replication between brokers: a small Kafka client for broker-to-broker requests and the
//! follower fetcher that keeps a replica in step with its leader, truncating by leader epoch.

pub mod client;
pub mod fetcher;
