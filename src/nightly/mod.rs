//! The pure part of `tidemark nightly`: the matrix and its cases and shards ([`matrix`]), a
//! night's records, exit code and trend ([`night`]), and its two renderings, JUnit XML
//! ([`junit`]) and the index page ([`index`]). Running the cases as child processes and reading
//! and writing the store is `cmd_nightly`'s.

pub mod index;
pub mod junit;
pub mod matrix;
pub mod night;
