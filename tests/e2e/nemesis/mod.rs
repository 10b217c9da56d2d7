//! Fault kinds against real brokers, scripted schedules through the command line, and power
//! loss under the data directories.

mod cli;
mod faults;
mod power;
