//! The engine end to end: runs on real namespaces and SSH hosts.

mod client;
mod clients;
mod clusters;
mod docker;
mod e2e;
mod hosts;
mod kill;
mod mirror;
mod nemesis;
mod netns;
mod signal;
mod ssh;
mod teardown;
mod tiered;
