//! The alarm: parked events re-evaluated every second for the pending
//! window, lapsed leases and unknown outcomes re-driven, queued events sent
//! to new owners, sessions swept (`node_lost`, `max_duration`) and old rows
//! pruned (SPEC §7.5, §7.7, §9). Pruning never removes a live session (open,
//! or fenced and not ended) nor its legs and events.

use super::ownership::{Ownership, Placeable};
use super::routing::{route_session, DecisionSubject};
use super::rows::{event_state as st, SessionRow};
use super::{CallShard, EngineError, Forward};
use crate::decision::DecisionOutcome;
use crate::metrics::{Count, WebhookOutcome};
use crate::store::Store;

/// Decisions kept, newest first.
pub const KEPT_DECISIONS: i64 = 10_000;
/// The legs' and the events' row caps are this many times `SESSION_CAP`.
pub const ROWS_PER_SESSION: i64 = 2;

/// The row caps [`super::queries::Queries::prune`] applies: beyond them the
/// oldest rows that hold no live call are pruned whatever their age.
pub(crate) struct RowCaps {
    pub decisions: i64,
    pub events: i64,
    pub sessions: i64,
    pub legs: i64,
}

impl RowCaps {
    /// The caps for a sessions cap of `sessions`.
    fn for_sessions(sessions: i64) -> Self {
        Self {
            decisions: KEPT_DECISIONS,
            events: sessions.saturating_mul(ROWS_PER_SESSION),
            sessions,
            legs: sessions.saturating_mul(ROWS_PER_SESSION),
        }
    }
}

/// What the Dispatcher must do after its alarm fired.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AlarmWork {
    /// Forwards to send now (in order), each to be reported.
    pub forwards: Vec<Forward>,
    /// When the alarm should fire next, if there is anything left to do.
    pub next_alarm_ms: Option<i64>,
}

impl<S: Store> CallShard<S> {
    fn max_redrives(&self) -> i64 {
        self.config.timing.redrive_backoff_ms.len() as i64
    }

    /// Runs the alarm's bookkeeping at `now_ms` and returns the forwards to
    /// make and the next alarm time.
    pub fn poll_alarm(&self, now_ms: i64) -> Result<AlarmWork, EngineError> {
        let mut work = self.unit(|| {
            let mut work = AlarmWork::default();
            self.q().lapse_leases(now_ms, self.max_redrives())?;
            self.revisit_pending(now_ms)?;
            self.redrive_due(now_ms, &mut work)?;
            // Prune before the sweep: what this alarm settles is pruned by a
            // later one, so nothing live when an alarm starts is gone after.
            self.prune(now_ms)?;
            self.sweep(now_ms)?;
            Ok::<_, EngineError>(work)
        })?;
        work.next_alarm_ms = self.next_alarm_at(now_ms)?;
        Ok(work)
    }

    /// Parked events: reject those whose window closed, try to assign the
    /// rest's sessions.
    fn revisit_pending(&self, now_ms: i64) -> Result<(), EngineError> {
        let q = self.q();
        for event in q.parked_events()? {
            let Some(session_id) = event.call_session_id.clone() else {
                continue;
            };
            let Some(session) = q.session(&session_id)? else {
                q.set_event_state(&event.event_id, st::REJECTED, now_ms)?;
                self.metrics.stage(Count::Webhook(WebhookOutcome::Rejected));
                continue;
            };
            let Ownership::Unowned(unowned) = Ownership::of(session) else {
                continue; // queued by an assignment below; redriven next.
            };
            if event.pending_until_ms.is_some_and(|until| until <= now_ms) {
                self.reject(unowned.row(), &event.event_id, now_ms)?;
                continue;
            }
            // On assignment every parked event of the session is queued;
            // redrive_due sends them in this same alarm.
            self.place(
                Placeable::Unowned(unowned),
                Some(&event.event_id),
                false,
                true,
                now_ms,
            )?;
        }
        Ok(())
    }

    /// Closes an event's parking window: `rejected`, with its decision; the
    /// unowned session goes once nothing of it is parked any more.
    fn reject(&self, session: &SessionRow, event_id: &str, now_ms: i64) -> Result<(), EngineError> {
        let q = self.q();
        q.set_event_state(event_id, st::REJECTED, now_ms)?;
        self.metrics.stage(Count::Webhook(WebhookOutcome::Rejected));
        let view = self.decision_view(now_ms);
        let routed = route_session(&view, session, now_ms)?;
        let subject = DecisionSubject {
            session: Some(&session.id),
            event: Some(event_id),
        };
        self.record_unassigned(
            &view,
            subject,
            routed.as_ref(),
            DecisionOutcome::Rejected,
            now_ms,
        )?;
        if !q.session_has_parked(&session.id)? {
            q.forget_unowned(&session.id)?;
        }
        Ok(())
    }

    /// Queued events and unknown outcomes whose time has come, oldest first.
    fn redrive_due(&self, now_ms: i64, work: &mut AlarmWork) -> Result<(), EngineError> {
        let q = self.q();
        for (mut event, payload) in q.due_events(now_ms, self.max_redrives())? {
            let session = match event.call_session_id.as_deref() {
                Some(id) => q.session(id)?,
                None => None,
            };
            let Some(session) = session.filter(|s| s.owner.is_some()) else {
                continue;
            };
            if event.state == st::UNKNOWN {
                q.count_redrive(&event.event_id)?;
                event.redrives += 1;
            }
            work.forwards
                .push(self.start_attempt(&event, payload, &session, now_ms)?);
        }
        Ok(())
    }

    /// Settles sessions whose owner has been silent for the grace period
    /// (`node_lost`) or that outlived the maximum duration (`max_duration`).
    /// Bookkeeping only: fences and media checks still work for the owner.
    fn sweep(&self, now_ms: i64) -> Result<(), EngineError> {
        let timing = &self.config.timing;
        let q = self.q();
        q.settle_expired(now_ms - timing.max_duration_ms, now_ms)?;
        let owners = q.open_owners()?;
        if owners.is_empty() {
            return Ok(());
        }
        let view = self.decision_view(now_ms);
        for owner in owners {
            let silent_since = match view.beat(&owner) {
                Some(beat) => beat.valid_until_ms(),
                None => i64::MIN,
            };
            if now_ms.saturating_sub(silent_since) >= timing.node_lost_after_ms {
                q.settle_lost(&owner, now_ms)?;
            }
        }
        Ok(())
    }

    /// Retention by age and row caps, of rows that hold no live call.
    fn prune(&self, now_ms: i64) -> Result<(), EngineError> {
        let caps = RowCaps::for_sessions(self.config.session_cap);
        self.q()
            .prune(now_ms - self.config.timing.retention_ms, &caps)
    }

    /// The earliest time the alarm has anything to do, if ever. The
    /// Dispatcher asks after every state change and arms its alarm with the
    /// answer unless it is armed earlier already. One read of indexes
    /// (`events_by_due`, `node_load`) after a change; none when nothing
    /// changed since the last ask.
    pub fn next_alarm_at(&self, now_ms: i64) -> Result<Option<i64>, EngineError> {
        let cached = self.cache.borrow().alarm;
        let facts = match cached {
            Some(facts) => facts,
            None => {
                let facts = self.q().alarm_facts()?;
                self.cache.borrow_mut().alarm = Some(facts);
                facts
            }
        };
        let timing = &self.config.timing;
        let due = [
            facts.pending.then_some(now_ms + timing.pending_retry_ms),
            facts.next_try_at.map(|t| t.max(now_ms)),
            facts.busy.then_some(now_ms + timing.sweep_interval_ms),
        ];
        Ok(due.into_iter().flatten().min())
    }
}
