//! Helpers shared by the end-to-end tests.

pub mod engine;
pub mod nemesis;
pub mod sshd;
