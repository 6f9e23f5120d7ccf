//! The alarm: parked events re-evaluated every second for the pending
//! window, lapsed leases and unknown outcomes re-driven, queued events sent
//! to new owners, sessions swept (`node_lost`, `max_duration`) and old rows
//! pruned (SPEC §7.5, §7.7, §9).

use super::routing::DecisionSubject;
use super::rows::{event_from_row, event_state as st, SessionRow, EVENT_COLUMNS, OPEN_STATES};
use super::{Engine, EngineError, Forward};
use crate::decision::DecisionOutcome;
use crate::store::{Store, Value};

/// Decisions kept, newest first.
pub const KEPT_DECISIONS: i64 = 10_000;
/// Row caps: the oldest rows beyond these are pruned whatever their age.
pub const MAX_EVENTS: i64 = 200_000;
/// See [`MAX_EVENTS`].
pub const MAX_SESSIONS: i64 = 100_000;
/// See [`MAX_EVENTS`].
pub const MAX_LEGS: i64 = 200_000;

/// What the Dispatcher must do after its alarm fired.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AlarmWork {
    /// Forwards to send now (in order), each to be reported.
    pub forwards: Vec<Forward>,
    /// When the alarm should fire next, if there is anything left to do.
    pub next_alarm_ms: Option<i64>,
}

impl<S: Store> Engine<S> {
    /// Runs the alarm's bookkeeping at `now_ms` and returns the forwards to
    /// make and the next alarm time.
    pub fn poll_alarm(&self, now_ms: i64) -> Result<AlarmWork, EngineError> {
        self.store.atomically(|| {
            let mut work = AlarmWork::default();
            // A lapsed lease is an ambiguous outcome: the session stays put.
            self.exec(
                "UPDATE sessions SET ambiguous_epoch = epoch WHERE call_session_id IN \
                 (SELECT call_session_id FROM events WHERE state = 'forwarding' AND lease_until <= ?)",
                &[Value::Int(now_ms)],
            )?;
            self.exec(
                "UPDATE events SET state = 'unknown', updated_at = ? WHERE state = 'forwarding' AND lease_until <= ?",
                &[Value::Int(now_ms), Value::Int(now_ms)],
            )?;
            self.revisit_pending(now_ms)?;
            self.redrive_due(now_ms, &mut work)?;
            self.sweep(now_ms)?;
            self.prune(now_ms)?;
            work.next_alarm_ms = self.next_alarm_at(now_ms)?;
            Ok(work)
        })
    }

    /// Parked events: reject those whose window closed, try to assign the
    /// rest's sessions.
    fn revisit_pending(&self, now_ms: i64) -> Result<(), EngineError> {
        let sql = format!(
            "SELECT {EVENT_COLUMNS} FROM events WHERE state = 'pending_assignment' ORDER BY seq"
        );
        let parked: Vec<_> = self
            .exec(&sql, &[])?
            .iter()
            .map(event_from_row)
            .collect::<Result<_, _>>()?;
        for event in parked {
            let Some(session_id) = event.call_session_id.clone() else {
                continue;
            };
            let Some(session) = self.load_session(&session_id)? else {
                self.set_event_state(&event.event_id, st::REJECTED, now_ms)?;
                continue;
            };
            if session.owner.is_some() {
                continue; // queued by the assignment below; redriven next.
            }
            if event.pending_until_ms.is_some_and(|until| until <= now_ms) {
                self.reject(&session, &event.event_id, now_ms)?;
                continue;
            }
            // On assignment, set_owner queues every parked event of the
            // session; redrive_due sends them in this same alarm.
            self.try_assign(&session, &event.event_id, false, now_ms)?;
        }
        Ok(())
    }

    /// Closes an event's parking window: `rejected`, with its decision; the
    /// unowned session goes once nothing of it is parked any more.
    fn reject(&self, session: &SessionRow, event_id: &str, now_ms: i64) -> Result<(), EngineError> {
        self.set_event_state(event_id, st::REJECTED, now_ms)?;
        let routed = self.route_session(session, now_ms)?;
        let subject = DecisionSubject {
            session: Some(&session.id),
            event: Some(event_id),
        };
        self.record_decision(
            subject,
            routed.as_ref(),
            None,
            None,
            DecisionOutcome::Rejected,
            now_ms,
        )?;
        let left = self.session_events(&session.id, &[st::PENDING])?;
        if left.is_empty() {
            self.exec(
                "DELETE FROM sessions WHERE call_session_id = ? AND owner IS NULL",
                &[session.id.as_str().into()],
            )?;
        }
        Ok(())
    }

    /// Queued events and unknown outcomes whose time has come, oldest first.
    fn redrive_due(&self, now_ms: i64, work: &mut AlarmWork) -> Result<(), EngineError> {
        let sql = format!(
            "SELECT {EVENT_COLUMNS} FROM events WHERE (state = 'queued' OR (state = 'unknown' AND redrives < ?)) \
             AND next_try_at IS NOT NULL AND next_try_at <= ? ORDER BY seq"
        );
        let max_redrives = self.config.timing.redrive_backoff_ms.len() as i64;
        let due: Vec<_> = self
            .exec(&sql, &[Value::Int(max_redrives), Value::Int(now_ms)])?
            .iter()
            .map(event_from_row)
            .collect::<Result<_, _>>()?;
        for event in due {
            let session = match event.call_session_id.as_deref() {
                Some(id) => self.load_session(id)?,
                None => None,
            };
            let Some(session) = session.filter(|s| s.owner.is_some()) else {
                continue;
            };
            if event.state == st::UNKNOWN {
                self.exec(
                    "UPDATE events SET redrives = redrives + 1 WHERE event_id = ?",
                    &[event.event_id.as_str().into()],
                )?;
            }
            let event = self.load_event(&event.event_id)?.unwrap_or(event);
            work.forwards
                .push(self.start_attempt(&event, &session, now_ms)?);
        }
        Ok(())
    }

    /// Settles sessions whose owner has been silent for the grace period
    /// (`node_lost`) or that outlived the maximum duration (`max_duration`).
    /// Bookkeeping only: fences and media checks still work for the owner.
    fn sweep(&self, now_ms: i64) -> Result<(), EngineError> {
        let timing = &self.config.timing;
        self.exec(
            &format!("UPDATE sessions SET state = 'max_duration', settled_at = ?, updated_at = ? WHERE state IN {OPEN_STATES} AND created_at <= ?"),
            &[Value::Int(now_ms), Value::Int(now_ms), Value::Int(now_ms - timing.max_duration_ms)],
        )?;
        let owners = self.exec(
            &format!("SELECT DISTINCT owner FROM sessions WHERE state IN {OPEN_STATES} AND owner IS NOT NULL"),
            &[],
        )?;
        for owner in owners
            .iter()
            .filter_map(|r| r.first().and_then(Value::as_text))
        {
            let silent_since = match self.beat(owner)? {
                Some(beat) => beat.valid_until_ms(),
                None => i64::MIN,
            };
            if now_ms - silent_since >= timing.node_lost_after_ms {
                self.exec(
                    &format!(
                        "UPDATE sessions SET state = 'node_lost', settled_at = ?, updated_at = ? WHERE owner = ? AND state IN {OPEN_STATES}"
                    ),
                    &[Value::Int(now_ms), Value::Int(now_ms), owner.into()],
                )?;
            }
        }
        Ok(())
    }

    /// Retention by age whatever the state, plus row caps.
    fn prune(&self, now_ms: i64) -> Result<(), EngineError> {
        let horizon = Value::Int(now_ms - self.config.timing.retention_ms);
        for table in ["events", "sessions", "legs"] {
            self.exec(
                &format!("DELETE FROM {table} WHERE updated_at < ?"),
                std::slice::from_ref(&horizon),
            )?;
        }
        self.exec(
            "DELETE FROM decisions WHERE decision_id <= (SELECT MAX(decision_id) FROM decisions) - ?",
            &[Value::Int(KEPT_DECISIONS)],
        )?;
        self.exec(
            "DELETE FROM events WHERE seq <= (SELECT MAX(seq) FROM events) - ?",
            &[Value::Int(MAX_EVENTS)],
        )?;
        self.exec(
            "DELETE FROM sessions WHERE call_session_id IN (SELECT call_session_id FROM sessions ORDER BY updated_at DESC LIMIT -1 OFFSET ?)",
            &[Value::Int(MAX_SESSIONS)],
        )?;
        self.exec(
            "DELETE FROM legs WHERE call_control_id IN (SELECT call_control_id FROM legs ORDER BY updated_at DESC LIMIT -1 OFFSET ?)",
            &[Value::Int(MAX_LEGS)],
        )?;
        // Beats and forward health of nodes no longer registered.
        let registered = self.registry()?.map(|(_, r)| r).unwrap_or_default();
        for table in ["heartbeats", "node_health"] {
            for row in self.exec(&format!("SELECT node FROM {table}"), &[])? {
                if let Some(node) = row.first().and_then(Value::as_text) {
                    if !registered.nodes.contains_key(node) {
                        self.exec(
                            &format!("DELETE FROM {table} WHERE node = ?"),
                            &[node.into()],
                        )?;
                    }
                }
            }
        }
        Ok(())
    }

    /// The earliest time the alarm has anything to do, if ever. The
    /// Dispatcher arms its alarm with this after every state change.
    pub fn next_alarm_at(&self, now_ms: i64) -> Result<Option<i64>, EngineError> {
        let timing = &self.config.timing;
        let one = |sql: &str| self.scalar(sql, &[]);
        let mut due: Vec<i64> = Vec::new();
        if one("SELECT 1 FROM events WHERE state = 'pending_assignment' LIMIT 1")?.is_some() {
            due.push(now_ms + timing.pending_retry_ms);
        }
        let max_redrives = timing.redrive_backoff_ms.len();
        if let Some(t) = one(&format!(
            "SELECT MIN(next_try_at) FROM events WHERE state IN ('queued', 'forwarding') OR (state = 'unknown' AND redrives < {max_redrives})"
        ))? {
            due.push(t.max(now_ms));
        }
        if one(&format!(
            "SELECT 1 FROM sessions WHERE state IN {OPEN_STATES} LIMIT 1"
        ))?
        .is_some()
            || one("SELECT 1 FROM events LIMIT 1")?.is_some()
        {
            due.push(now_ms + timing.sweep_interval_ms);
        }
        Ok(due.into_iter().min())
    }
}
