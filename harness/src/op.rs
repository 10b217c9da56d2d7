//! Operations as plain data: what a generator asks for, what a client answers, and the history
//! line that records either. History lines are the checkers' own [`Op`] type, so what the harness
//! writes is exactly what `tidemark check` reads; field names are fixed by `docs/history-format.md`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use tidemark_checkers::{Op, OpType, Process};

/// How an operation ended, as a client or nemesis reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Took effect.
    Ok,
    /// Certainly did not take effect.
    Fail,
    /// Unknown.
    Info,
}

impl From<Outcome> for OpType {
    fn from(o: Outcome) -> Self {
        match o {
            Outcome::Ok => OpType::Ok,
            Outcome::Fail => OpType::Fail,
            Outcome::Info => OpType::Info,
        }
    }
}

/// An operation to perform: its name and argument. Generators produce these; clients and the
/// nemesis consume them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Invocation {
    /// The operation, e.g. `send`.
    pub f: String,
    /// Its argument.
    pub value: Value,
}

/// The answer to an [`Invocation`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    /// `ok`, `fail` or `info`, by the contract of `docs/history-format.md`.
    pub outcome: Outcome,
    /// The result; by convention the invocation's value plus what was learned.
    pub value: Value,
    /// The node the operation went to, when there was one.
    pub node: Option<String>,
    /// Why it failed or is unknown.
    pub error: Option<String>,
}

impl Completion {
    /// A completion with `outcome`, `value`, no node and no error.
    pub fn new(outcome: Outcome, value: Value) -> Self {
        Completion {
            outcome,
            value,
            node: None,
            error: None,
        }
    }
}
