//! Call ownership: a session's states as types, in the spirit of rustls's
//! handshake states. Each state is a struct; a transition consumes the state
//! it starts from and returns the next, so an illegal transition (fencing an
//! unowned call, moving a fenced one) does not compile.
//!
//! ```text
//!   Unowned --assign--> Owned --fence--> Fenced
//!      ^                  |  \                \
//!      +----release-------+   reassign         end (every leg hung up)
//!                         |   (new owner,       \
//!                         |    new epoch)        v
//!                         +------- end ------> Ended
//! ```
//!
//! Every transition is one guarded write ([`Queries`]' ownership
//! statements): its `WHERE` re-checks the preconditions (owner, epoch,
//! fence, ambiguous epoch, ended) in the same synchronous unit as the read
//! that chose it, and a guard that no longer holds fails the unit (rolled
//! back) instead of writing. The alarm's `node_lost` and `max_duration`
//! settlements are the bulk form of settling, guarded on an open state.
//!
//! [`Engine::place`] is the one way a session gets an owner by policy:
//! first assignment and reassignment after a definite non-delivery are the
//! same resolution, selection and decision record.

use super::queries::Queries;
use super::routing::{route_session, DecisionSubject, Target};
use super::rows::{FenceRow, SessionRow, SessionState};
use super::{CallShard, EngineError};
use crate::decision::DecisionOutcome;
use crate::store::Store;

/// A session as its ownership state.
pub(crate) enum Ownership {
    /// No owner (new, parked, or released).
    Unowned(Unowned),
    /// An owner at an epoch, no fence yet.
    Owned(Owned),
    /// The fence was granted: ownership never changes again.
    Fenced(Fenced),
    /// Every leg hung up before any fence.
    Ended(Ended),
}

/// A session without an owner.
pub(crate) struct Unowned(SessionRow);
/// A session with an owner and no fence.
pub(crate) struct Owned(SessionRow);
/// A session whose fence was granted.
pub(crate) struct Fenced(SessionRow);
/// A session that ended without a fence.
pub(crate) struct Ended(SessionRow);

/// Why an event is parked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingReason {
    /// No routing policy or node registry yet (503 `no_policy`).
    NoPolicy,
    /// No node is eligible, or an outgoing session awaits its claim
    /// (503 `no_eligible_node`).
    NoEligibleNode,
}

fn guard_failed(what: &str, id: &str) -> EngineError {
    EngineError::Corrupt(format!("ownership guard failed: {what} of session {id}"))
}

impl Ownership {
    /// Classifies a stored session.
    pub(crate) fn of(row: SessionRow) -> Self {
        if row.fence.is_some() {
            Ownership::Fenced(Fenced(row))
        } else if row.state == SessionState::Ended {
            Ownership::Ended(Ended(row))
        } else if row.owner.is_some() && row.epoch.is_some() {
            Ownership::Owned(Owned(row))
        } else {
            Ownership::Unowned(Unowned(row))
        }
    }

    /// The stored row.
    pub(crate) fn row(&self) -> &SessionRow {
        match self {
            Ownership::Unowned(Unowned(r))
            | Ownership::Owned(Owned(r))
            | Ownership::Fenced(Fenced(r))
            | Ownership::Ended(Ended(r)) => r,
        }
    }

    /// Settles an owned or fenced session as ended once every leg has hung
    /// up; anything else, or a leg still open, is returned unchanged.
    pub(crate) fn end_if_hung_up<S: Store>(
        self,
        q: &Queries<'_, S>,
        now_ms: i64,
    ) -> Result<Ownership, EngineError> {
        let row = match &self {
            Ownership::Owned(Owned(r)) | Ownership::Fenced(Fenced(r)) => r,
            _ => return Ok(self),
        };
        Ok(match q.end_session(&row.id, now_ms)? {
            Some(ended) => Ownership::of(ended),
            None => self,
        })
    }
}

impl Unowned {
    /// Gives the session its first owner at `epoch`; with `queue`, its
    /// parked events are queued for the owner.
    pub(crate) fn assign<S: Store>(
        self,
        q: &Queries<'_, S>,
        target: &Target,
        epoch: u64,
        queue: bool,
        now_ms: i64,
    ) -> Result<Owned, EngineError> {
        let row = q
            .own_session(
                &self.0.id,
                None,
                &target.node,
                epoch,
                &target.origin,
                now_ms,
            )?
            .ok_or_else(|| guard_failed("assign", &self.0.id))?;
        if queue {
            q.queue_session_events(&row.id, now_ms)?;
        }
        Ok(Owned(row))
    }

    pub(crate) fn row(&self) -> &SessionRow {
        &self.0
    }
}

impl Owned {
    pub(crate) fn row(&self) -> &SessionRow {
        &self.0
    }

    /// The owner.
    pub(crate) fn owner(&self) -> &str {
        self.0.owner.as_deref().unwrap_or_default()
    }

    /// The current epoch.
    pub(crate) fn epoch(&self) -> u64 {
        self.0.epoch.unwrap_or(0)
    }

    /// May move at all: an inbound session with no ambiguous outcome at its
    /// current epoch (the fence is excluded by type).
    pub(crate) fn may_move(&self) -> bool {
        !self.0.is_outgoing() && self.0.ambiguous_epoch != self.0.epoch
    }

    /// Moves the session to `target` at the new `epoch` and queues its
    /// undelivered events for it.
    pub(crate) fn reassign<S: Store>(
        self,
        q: &Queries<'_, S>,
        target: &Target,
        epoch: u64,
        now_ms: i64,
    ) -> Result<Owned, EngineError> {
        let row = q
            .own_session(
                &self.0.id,
                Some(self.epoch()),
                &target.node,
                epoch,
                &target.origin,
                now_ms,
            )?
            .ok_or_else(|| guard_failed("reassign", &self.0.id))?;
        q.queue_session_events(&row.id, now_ms)?;
        Ok(Owned(row))
    }

    /// Takes the owner away (no node is eligible) and parks the session's
    /// undelivered events until `park_until`.
    pub(crate) fn release<S: Store>(
        self,
        q: &Queries<'_, S>,
        park_until: i64,
        now_ms: i64,
    ) -> Result<Unowned, EngineError> {
        let row = q
            .release_session(&self.0.id, self.epoch(), now_ms)?
            .ok_or_else(|| guard_failed("release", &self.0.id))?;
        q.park_session_events(&row.id, park_until, now_ms)?;
        Ok(Unowned(row))
    }

    /// Grants the fence to the owner at its epoch.
    pub(crate) fn fence<S: Store>(
        self,
        q: &Queries<'_, S>,
        command_id: &str,
        now_ms: i64,
    ) -> Result<Fenced, EngineError> {
        let row = q
            .fence_session(&self.0.id, self.owner(), self.epoch(), command_id, now_ms)?
            .ok_or_else(|| guard_failed("fence", &self.0.id))?;
        Ok(Fenced(row))
    }

    /// Records that an outcome at the current epoch was ambiguous: the
    /// session never moves at this epoch.
    pub(crate) fn doubt<S: Store>(mut self, q: &Queries<'_, S>) -> Result<Owned, EngineError> {
        q.mark_session_ambiguous(&self.0.id, self.epoch())?;
        self.0.ambiguous_epoch = self.0.epoch;
        Ok(self)
    }
}

impl Fenced {
    /// The granted fence.
    pub(crate) fn fence(&self) -> &FenceRow {
        self.0.fence.as_ref().expect("a fenced session has a fence")
    }

    pub(crate) fn row(&self) -> &SessionRow {
        &self.0
    }
}

/// A session [`Engine::place`] may give an owner.
pub(crate) enum Placeable {
    /// First assignment (or again after a release).
    Unowned(Unowned),
    /// Reassignment after a definite non-delivery.
    Moving(Owned),
}

/// What [`Engine::place`] did (a transient answer, never stored).
#[allow(clippy::large_enum_variant)]
pub(crate) enum Placed {
    /// The session has an owner at a new epoch.
    Assigned(Owned),
    /// No node could take it: its events are parked.
    Parked(PendingReason),
}

impl Placeable {
    fn row(&self) -> &SessionRow {
        match self {
            Placeable::Unowned(u) => u.row(),
            Placeable::Moving(o) => o.row(),
        }
    }
}

impl<S: Store> CallShard<S> {
    /// Resolves the policy for a session and gives it an owner with a new
    /// epoch and an `assigned` (or `reassigned`) decision, or leaves it
    /// unowned with a `pending` decision. An outgoing session is never
    /// resolved by policy: it waits for its claim. `record_pending` records
    /// the pending decision for a first park (re-checks record nothing; a
    /// release always records one); `queue` queues the session's parked
    /// events (false only for a session created in this unit, which has
    /// none).
    pub(crate) fn place(
        &self,
        from: Placeable,
        event_id: Option<&str>,
        record_pending: bool,
        queue: bool,
        now_ms: i64,
    ) -> Result<Placed, EngineError> {
        let q = self.q();
        let row = from.row();
        let id = row.id.clone();
        let subject = DecisionSubject {
            session: Some(&id),
            event: event_id,
        };
        let view = self.decision_view(now_ms);
        let routed = match row.is_outgoing() {
            true => None,
            false => route_session(&view, row, now_ms)?,
        };
        if let Some(target) = routed.as_ref().and_then(|r| r.target()) {
            let ids = q.counters(&["epoch", "decision"], &[])?;
            let (epoch, decision) = (ids[0], ids[1]);
            let (owned, outcome) = match from {
                Placeable::Unowned(u) => (
                    u.assign(&q, &target, epoch, queue, now_ms)?,
                    DecisionOutcome::Assigned,
                ),
                Placeable::Moving(o) => (
                    o.reassign(&q, &target, epoch, now_ms)?,
                    DecisionOutcome::Reassigned,
                ),
            };
            self.record_decision(
                &view,
                Some(decision),
                subject,
                routed.as_ref(),
                None,
                Some(epoch),
                outcome,
                now_ms,
            )?;
            return Ok(Placed::Assigned(owned));
        }
        let reason = match routed.is_none() && !row.is_outgoing() {
            true => PendingReason::NoPolicy,
            false => PendingReason::NoEligibleNode,
        };
        let record = match from {
            Placeable::Unowned(_) => record_pending,
            Placeable::Moving(o) => {
                o.release(&q, now_ms + self.config.timing.pending_window_ms, now_ms)?;
                true
            }
        };
        if record {
            self.record_unassigned(
                &view,
                subject,
                routed.as_ref(),
                DecisionOutcome::Pending,
                now_ms,
            )?;
        }
        Ok(Placed::Parked(reason))
    }
}
