//! Fault kinds against real brokers, and scripted schedules through the command line.

mod cli;
mod faults;
