//! The mirror admin APIs on the Kafka wire. Their keys and typed bodies are shared with the
//! harness and live in `tidemark-mirrorwire`; the broker's modules name them through here.

pub use tidemark_mirrorwire::*;
