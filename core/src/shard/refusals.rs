//! What the Dispatcher refused under a limit: claims over a node's capacity
//! or rate (SPEC §7.4) and new sessions at `SESSION_CAP` (§9). A refusal
//! stores nothing, so these are counted in memory, since the engine started
//! (a restart starts them at zero, as a Prometheus counter may); the status
//! view shows them.

use super::CallShard;
use crate::store::Store;
use serde::Serialize;

/// Counts of refusals since the engine started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Refused {
    /// New sessions (a webhook's first event, a claim) refused
    /// `storage_full`.
    pub storage_full: u64,
    /// Claims refused `capacity_exhausted`.
    pub claims_capacity_exhausted: u64,
    /// Claims refused `rate_limited`.
    pub claims_rate_limited: u64,
}

impl<S: Store> CallShard<S> {
    /// The refusals counted since this engine started.
    pub fn refused(&self) -> Refused {
        self.refused.get()
    }

    /// Counts one refusal (after its unit committed, refusing).
    pub(crate) fn count_refusal(&self, count: impl FnOnce(&mut Refused)) {
        let mut refused = self.refused.get();
        count(&mut refused);
        self.refused.set(refused);
    }
}
