//! The one failure of a machine that is not a business answer.

use crate::store::StoreError;

/// A failure of the engine that is not a business answer: the caller must
/// answer 503 `dispatcher_unavailable` and change nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineError {
    /// The storage backend failed.
    Store(StoreError),
    /// A stored row could not be read back.
    Corrupt(String),
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineError::Store(e) => write!(f, "{e}"),
            EngineError::Corrupt(what) => write!(f, "corrupt stored state: {what}"),
        }
    }
}

impl std::error::Error for EngineError {}

impl From<StoreError> for EngineError {
    fn from(e: StoreError) -> Self {
        EngineError::Store(e)
    }
}
