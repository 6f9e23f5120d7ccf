//! Forward marks: what a call shard tells the directory after a forward
//! (SPEC §16: forward-failure marks are the directory's, and eligibility
//! reads them in every shard).
//!
//! The shard side never writes the directory's forward health itself: a
//! report that delivered or failed makes a [`ForwardMark`] and the
//! directory applies it ([`crate::engine::Engine`]'s directory side). Today
//! it is applied in the report's own unit, before any re-placement reads the
//! view, so behaviour is unchanged; between objects it is one small message.

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

/// One forward's end, for the directory. Idempotent: applying the same mark
/// again stores the same row (it sets the node's last delivery or failure
/// time to `at_ms`), so a retried send changes nothing.
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
