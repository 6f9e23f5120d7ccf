//! [`ForwardMark`]: how a forward ended, sent call shard to directory
//! (SPEC §16: forward-failure marks are the directory's, and eligibility
//! reads them in every shard).
//!
//! A shard never writes the directory's forward health: a report that
//! failed makes a mark, and so does a delivery to a node the shard knows
//! as failing (a delivery to a healthy node changes no eligibility and is
//! not sent). The shard decides on its own marks at once, before the
//! directory has them.

use serde::{Deserialize, Serialize};

/// The format of [`ForwardMark`]: a receiver refuses a `v` it does not know.
pub const MARK_VERSION: u16 = 1;

/// How a forward to a node ended, for its forward health.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ForwardResult {
    /// The origin answered: clears `recent_forward_failure`.
    Delivered,
    /// The forward failed or its outcome is unknown:
    /// `recent_forward_failure` for 30 s unless a delivery follows.
    Failed,
}

/// One forward's end, for the directory. Idempotent and commutative: a mark
/// raises the node's last delivery or failure time to `at_ms` and never
/// lowers it, so a mark sent twice, late or out of order changes nothing
/// more than once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForwardMark {
    /// [`MARK_VERSION`].
    pub v: u16,
    /// The node the forward went to.
    pub node: String,
    /// How it ended.
    pub result: ForwardResult,
    /// When the shard learnt it.
    pub at_ms: i64,
}

impl ForwardMark {
    /// A mark of `result` for `node` at `at_ms`.
    pub fn new(node: &str, result: ForwardResult, at_ms: i64) -> Self {
        Self {
            v: MARK_VERSION,
            node: node.to_owned(),
            result,
            at_ms,
        }
    }
}
