//! Every SQL statement the Dispatcher runs, as one named function each (the
//! agent's `ledger.rs` does the same for the agent). Nothing else in the
//! engine spells SQL; the schema is `migrations/`.
//!
//! On the Durable Object each statement is one crossing between wasm and the
//! runtime's SQL binding, which is most of the Dispatcher's CPU: statements
//! here combine what they can (`RETURNING`, upserts, joins, several counters
//! in one write) and read the large columns (an event's body and headers)
//! only when they are forwarded. `core/benches/engine.rs` counts them per
//! operation.

use super::rows::{event_at, payload_at, session_at, EventRow, Payload, SessionRow};
use super::rows::{EVENT_COLUMNS, SESSION_COLUMNS};
use super::EngineError;
use crate::store::{Row, Store, Value};

/// SQL list of the session states that count toward the owner's capacity
/// (the Rust twin is `SessionState::is_open`; the `node_load` triggers of
/// `migrations/0002_node_load.sql` spell it too).
pub(crate) const OPEN_STATES: &str = "('assigned', 'answered')";

const SESSION: &str = "call_session_id, state, owner, epoch, origin_url, direction, caller, called, created_at, fence_node, fence_epoch, fence_at, command_id, ambiguous_epoch";
const SESSION_S: &str = "s.call_session_id, s.state, s.owner, s.epoch, s.origin_url, s.direction, s.caller, s.called, s.created_at, s.fence_node, s.fence_epoch, s.fence_at, s.command_id, s.ambiguous_epoch";
/// The guard of every move of an owned session (parameter: the epoch it
/// moves from).
const MOVABLE: &str = "epoch = ? AND owner IS NOT NULL AND fence_node IS NULL AND ambiguous_epoch IS NOT epoch AND direction IS NOT 'outgoing'";
const EVENT: &str = "event_id, call_session_id, call_control_id, event_type, state, received_at, epoch, attempts, lease_until, redrives, result_status, node, pending_until";
const EVENT_E: &str = "e.event_id, e.call_session_id, e.call_control_id, e.event_type, e.state, e.received_at, e.epoch, e.attempts, e.lease_until, e.redrives, e.result_status, e.node, e.pending_until";

/// A new ledger row, inserted in its final state for this unit.
pub(crate) struct NewEvent<'a> {
    pub event_id: &'a str,
    pub seq: u64,
    pub session: Option<&'a str>,
    pub call_control_id: Option<&'a str>,
    pub event_type: &'a str,
    pub state: &'a str,
    pub body: &'a str,
    pub headers: &'a str,
    pub now_ms: i64,
    pub pending_until: Option<i64>,
    /// (node, epoch, lease until) when inserted as a first attempt.
    pub attempt: Option<(&'a str, u64, i64)>,
}

/// A new session's first facts.
pub(crate) struct NewSession<'a> {
    pub id: &'a str,
    pub direction: Option<&'a str>,
    pub caller: Option<&'a str>,
    pub called: Option<&'a str>,
    pub now_ms: i64,
}

/// A node's forward health and open-call count, as eligibility reads them.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct NodeRow {
    pub last_failure_at_ms: Option<i64>,
    pub last_delivery_at_ms: Option<i64>,
    pub open_calls: i64,
}

/// The stored facts the alarm's due time is computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AlarmFacts {
    pub pending: bool,
    pub next_try_at: Option<i64>,
    pub busy: bool,
}

/// The last accepted heartbeat of a node, for replay and the seq check.
pub(crate) struct LastBeat {
    pub seq: i64,
    pub body_sha256: String,
    pub answer: String,
}

/// The Dispatcher's statements over one [`Store`].
pub(crate) struct Queries<'s, S: Store> {
    store: &'s S,
}

fn int(row: &Row, i: usize) -> Option<i64> {
    row.get(i).and_then(Value::as_int)
}

fn text(row: &Row, i: usize) -> Option<String> {
    row.get(i).and_then(Value::as_text).map(str::to_owned)
}

impl<'s, S: Store> Queries<'s, S> {
    pub(crate) fn new(store: &'s S) -> Self {
        Self { store }
    }

    fn run(&self, sql: &str, params: &[Value]) -> Result<Vec<Row>, EngineError> {
        Ok(self.store.exec(sql, params)?)
    }

    fn first_int(&self, sql: &str, params: &[Value]) -> Result<Option<i64>, EngineError> {
        Ok(self.run(sql, params)?.first().and_then(|r| int(r, 0)))
    }

    // ---- counters ----------------------------------------------------------

    /// Increments each named counter by one and sets each `(name, value)`, in
    /// one statement; returns the incremented counters' new values in the
    /// order of `bump`.
    pub(crate) fn counters(
        &self,
        bump: &[&str],
        set: &[(&str, i64)],
    ) -> Result<Vec<u64>, EngineError> {
        let mut sql = String::from("INSERT INTO counters (name, value) VALUES ");
        let mut params = Vec::with_capacity(2 * (bump.len() + set.len()));
        for (i, name) in bump.iter().enumerate() {
            sql.push_str(if i == 0 { "(?, 1)" } else { ", (?, 1)" });
            params.push(Value::from(*name));
        }
        for (i, (name, value)) in set.iter().enumerate() {
            sql.push_str(if i == 0 && bump.is_empty() {
                "(?, ?)"
            } else {
                ", (?, ?)"
            });
            params.push(Value::from(*name));
            params.push(Value::Int(*value));
        }
        let sets: Vec<String> = set.iter().map(|(n, _)| format!("'{n}'")).collect();
        if sets.is_empty() {
            sql.push_str(" ON CONFLICT (name) DO UPDATE SET value = value + 1");
        } else {
            sql.push_str(&format!(
                " ON CONFLICT (name) DO UPDATE SET value = CASE WHEN name IN ({}) THEN excluded.value ELSE value + 1 END",
                sets.join(", ")
            ));
        }
        sql.push_str(" RETURNING name, value");
        let rows = self.run(&sql, &params)?;
        bump.iter()
            .map(|name| {
                let value = rows
                    .iter()
                    .find(|r| r.first().and_then(Value::as_text) == Some(name))
                    .and_then(|r| int(r, 1))
                    .ok_or_else(|| EngineError::Corrupt(format!("counter {name}")))?;
                if value as u64 > crate::MAX_SAFE_INTEGER || value < 1 {
                    return Err(EngineError::Corrupt(format!("counter {name} exhausted")));
                }
                Ok(value as u64)
            })
            .collect()
    }

    /// A named counter (0 when absent).
    pub(crate) fn counter(&self, name: &str) -> Result<i64, EngineError> {
        Ok(self
            .first_int("SELECT value FROM counters WHERE name = ?", &[name.into()])?
            .unwrap_or(0))
    }

    // ---- events ------------------------------------------------------------

    /// An event without its payload.
    pub(crate) fn event(&self, id: &str) -> Result<Option<EventRow>, EngineError> {
        let sql = format!("SELECT {EVENT} FROM events WHERE event_id = ?");
        self.run(&sql, &[id.into()])?
            .first()
            .map(|r| event_at(r, 0))
            .transpose()
    }

    /// An event and its session, in one read.
    pub(crate) fn event_with_session(
        &self,
        id: &str,
    ) -> Result<Option<(EventRow, Option<SessionRow>)>, EngineError> {
        let sql = format!(
            "SELECT {EVENT_E}, {SESSION_S} FROM events e LEFT JOIN sessions s ON s.call_session_id = e.call_session_id WHERE e.event_id = ?"
        );
        let rows = self.run(&sql, &[id.into()])?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let event = event_at(row, 0)?;
        let session = match row.get(EVENT_COLUMNS) {
            Some(Value::Text(_)) => Some(session_at(row, EVENT_COLUMNS)?),
            _ => None,
        };
        Ok(Some((event, session)))
    }

    /// The stored body and headers of an event.
    pub(crate) fn payload(&self, id: &str) -> Result<Payload, EngineError> {
        let rows = self.run(
            "SELECT body, headers FROM events WHERE event_id = ?",
            &[id.into()],
        )?;
        let row = rows
            .first()
            .ok_or_else(|| EngineError::Corrupt("event vanished".into()))?;
        payload_at(row, 0)
    }

    pub(crate) fn insert_event(&self, e: &NewEvent<'_>) -> Result<(), EngineError> {
        let (node, epoch, lease) = match e.attempt {
            Some((node, epoch, lease)) => (Some(node), Some(epoch), Some(lease)),
            None => (None, None, None),
        };
        self.run(
            "INSERT INTO events (event_id, seq, call_session_id, call_control_id, event_type, state, body, headers, received_at, updated_at, pending_until, node, epoch, attempts, lease_until, next_try_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            &[
                e.event_id.into(),
                e.seq.into(),
                e.session.into(),
                e.call_control_id.into(),
                e.event_type.into(),
                e.state.into(),
                e.body.into(),
                e.headers.into(),
                Value::Int(e.now_ms),
                Value::Int(e.now_ms),
                e.pending_until.into(),
                node.into(),
                epoch.into(),
                Value::Int(i64::from(e.attempt.is_some())),
                lease.into(),
                lease.into(),
            ],
        )?;
        Ok(())
    }

    /// Starts attempt `attempt` of an event under (node, epoch) with a lease.
    pub(crate) fn start_attempt(
        &self,
        event_id: &str,
        node: &str,
        epoch: u64,
        attempt: u32,
        lease_until: i64,
        now_ms: i64,
    ) -> Result<(), EngineError> {
        self.run(
            "UPDATE events SET state = 'forwarding', node = ?, epoch = ?, attempts = ?, lease_until = ?, next_try_at = ?, pending_until = NULL, updated_at = ? WHERE event_id = ?",
            &[
                node.into(),
                epoch.into(),
                Value::Int(i64::from(attempt)),
                Value::Int(lease_until),
                Value::Int(lease_until),
                Value::Int(now_ms),
                event_id.into(),
            ],
        )?;
        Ok(())
    }

    pub(crate) fn mark_delivered(
        &self,
        event_id: &str,
        status: Option<i64>,
        body: Option<String>,
        now_ms: i64,
    ) -> Result<(), EngineError> {
        self.run(
            "UPDATE events SET state = 'delivered', result_status = ?, result_body = ?, lease_until = NULL, next_try_at = NULL, updated_at = ? WHERE event_id = ?",
            &[status.into(), body.into(), Value::Int(now_ms), event_id.into()],
        )?;
        Ok(())
    }

    /// Marks an event's outcome unknown, with its next re-drive (if any).
    pub(crate) fn mark_event_unknown(
        &self,
        event_id: &str,
        next_try_at: Option<i64>,
        now_ms: i64,
    ) -> Result<(), EngineError> {
        self.run(
            "UPDATE events SET state = 'unknown', next_try_at = ?, updated_at = ? WHERE event_id = ?",
            &[next_try_at.into(), Value::Int(now_ms), event_id.into()],
        )?;
        Ok(())
    }

    pub(crate) fn set_event_state(
        &self,
        event_id: &str,
        state: &str,
        now_ms: i64,
    ) -> Result<(), EngineError> {
        self.run(
            "UPDATE events SET state = ?, updated_at = ? WHERE event_id = ?",
            &[state.into(), Value::Int(now_ms), event_id.into()],
        )?;
        Ok(())
    }

    /// Parks one event until `until`.
    pub(crate) fn park_event(
        &self,
        event_id: &str,
        until: i64,
        now_ms: i64,
    ) -> Result<(), EngineError> {
        self.run(
            "UPDATE events SET state = 'pending_assignment', pending_until = ?, lease_until = NULL, next_try_at = NULL, updated_at = ? WHERE event_id = ?",
            &[Value::Int(until), Value::Int(now_ms), event_id.into()],
        )?;
        Ok(())
    }

    /// Parks every undelivered event of a session that lost its owner.
    pub(crate) fn park_session_events(
        &self,
        session: &str,
        until: i64,
        now_ms: i64,
    ) -> Result<(), EngineError> {
        self.run(
            "UPDATE events SET state = 'pending_assignment', pending_until = ?, lease_until = NULL, next_try_at = NULL, updated_at = ? \
             WHERE call_session_id = ? AND state IN ('forwarding', 'unknown', 'queued')",
            &[Value::Int(until), Value::Int(now_ms), session.into()],
        )?;
        Ok(())
    }

    /// Queues a session's undelivered events for its new owner, in order.
    pub(crate) fn queue_session_events(
        &self,
        session: &str,
        now_ms: i64,
    ) -> Result<(), EngineError> {
        self.run(
            "UPDATE events SET state = 'queued', next_try_at = ?, pending_until = NULL, updated_at = ? \
             WHERE call_session_id = ? AND state IN ('pending_assignment', 'forwarding', 'unknown', 'queued')",
            &[Value::Int(now_ms), Value::Int(now_ms), session.into()],
        )?;
        Ok(())
    }

    /// True when another attempt of the session at `epoch` is in flight or
    /// ended ambiguously.
    pub(crate) fn other_attempt_in_doubt(
        &self,
        session: &str,
        epoch: Option<u64>,
        except_event: &str,
    ) -> Result<bool, EngineError> {
        Ok(self
            .first_int(
                "SELECT 1 FROM events WHERE call_session_id = ? AND state IN ('unknown', 'forwarding') AND epoch = ? AND event_id != ? LIMIT 1",
                &[session.into(), epoch.into(), except_event.into()],
            )?
            .is_some())
    }

    /// True when an event of the session is still parked.
    pub(crate) fn session_has_parked(&self, session: &str) -> Result<bool, EngineError> {
        Ok(self
            .first_int(
                "SELECT 1 FROM events WHERE call_session_id = ? AND state = 'pending_assignment' LIMIT 1",
                &[session.into()],
            )?
            .is_some())
    }

    /// Every parked event, oldest first.
    pub(crate) fn parked_events(&self) -> Result<Vec<EventRow>, EngineError> {
        let sql =
            format!("SELECT {EVENT} FROM events WHERE state = 'pending_assignment' ORDER BY seq");
        self.run(&sql, &[])?
            .iter()
            .map(|r| event_at(r, 0))
            .collect()
    }

    /// Queued events and unknown outcomes whose time has come, oldest
    /// first, with their payloads.
    pub(crate) fn due_events(
        &self,
        now_ms: i64,
        max_redrives: i64,
    ) -> Result<Vec<(EventRow, Payload)>, EngineError> {
        let sql = format!(
            "SELECT {EVENT}, body, headers FROM events WHERE (state = 'queued' OR (state = 'unknown' AND redrives < ?)) \
             AND next_try_at IS NOT NULL AND next_try_at <= ? ORDER BY seq"
        );
        self.run(&sql, &[Value::Int(max_redrives), Value::Int(now_ms)])?
            .iter()
            .map(|r| Ok((event_at(r, 0)?, payload_at(r, EVENT_COLUMNS)?)))
            .collect()
    }

    pub(crate) fn count_redrive(&self, event_id: &str) -> Result<(), EngineError> {
        self.run(
            "UPDATE events SET redrives = redrives + 1 WHERE event_id = ?",
            &[event_id.into()],
        )?;
        Ok(())
    }

    /// A lapsed lease is an ambiguous outcome: the session stays put, the
    /// event is `unknown`, re-driven while re-drives are left.
    pub(crate) fn lapse_leases(&self, now_ms: i64, max_redrives: i64) -> Result<(), EngineError> {
        self.run(
            "UPDATE sessions SET ambiguous_epoch = epoch WHERE call_session_id IN \
             (SELECT call_session_id FROM events WHERE state = 'forwarding' AND lease_until <= ?)",
            &[Value::Int(now_ms)],
        )?;
        self.run(
            "UPDATE events SET state = 'unknown', updated_at = ? WHERE state = 'forwarding' AND lease_until <= ?",
            &[Value::Int(now_ms), Value::Int(now_ms)],
        )?;
        // Unknown outcomes with no re-drive left are never due again (rows of
        // an older release may still carry a time).
        self.run(
            "UPDATE events SET next_try_at = NULL WHERE state = 'unknown' AND redrives >= ? AND next_try_at IS NOT NULL",
            &[Value::Int(max_redrives)],
        )?;
        Ok(())
    }

    /// What the alarm's due time depends on, in one read of indexes only
    /// (`events_by_due`, the primary keys, `node_load`).
    pub(crate) fn alarm_facts(&self, max_redrives: i64) -> Result<AlarmFacts, EngineError> {
        let rows = self.run(
            "SELECT \
               (SELECT 1 FROM events WHERE state = 'pending_assignment' LIMIT 1), \
               (SELECT MIN(next_try_at) FROM events WHERE state = 'queued'), \
               (SELECT MIN(next_try_at) FROM events WHERE state = 'forwarding'), \
               (SELECT MIN(next_try_at) FROM events WHERE state = 'unknown' AND redrives < ?), \
               (SELECT 1 FROM node_load WHERE open_calls > 0 LIMIT 1), \
               (SELECT 1 FROM events LIMIT 1)",
            &[Value::Int(max_redrives)],
        )?;
        let row = rows.first().cloned().unwrap_or_default();
        Ok(AlarmFacts {
            pending: int(&row, 0).is_some(),
            next_try_at: [int(&row, 1), int(&row, 2), int(&row, 3)]
                .into_iter()
                .flatten()
                .min(),
            busy: int(&row, 4).is_some() || int(&row, 5).is_some(),
        })
    }

    /// Up to 500 events of a session, newest first.
    pub(crate) fn session_history(&self, session: &str) -> Result<Vec<EventRow>, EngineError> {
        let sql = format!(
            "SELECT {EVENT} FROM events WHERE call_session_id = ? ORDER BY seq DESC LIMIT 500"
        );
        self.run(&sql, &[session.into()])?
            .iter()
            .map(|r| event_at(r, 0))
            .collect()
    }

    /// Events in `state` (for the status counts).
    pub(crate) fn count_events(&self, state: &str) -> Result<i64, EngineError> {
        Ok(self
            .first_int(
                "SELECT COUNT(*) FROM events WHERE state = ?",
                &[state.into()],
            )?
            .unwrap_or(0))
    }

    // ---- sessions ----------------------------------------------------------

    pub(crate) fn session(&self, id: &str) -> Result<Option<SessionRow>, EngineError> {
        let sql = format!("SELECT {SESSION} FROM sessions WHERE call_session_id = ?");
        self.run(&sql, &[id.into()])?
            .first()
            .map(|r| session_at(r, 0))
            .transpose()
    }

    /// Creates an unowned session; `None` when it already exists.
    pub(crate) fn insert_session(
        &self,
        s: &NewSession<'_>,
    ) -> Result<Option<SessionRow>, EngineError> {
        let sql = format!(
            "INSERT INTO sessions (call_session_id, state, direction, caller, called, created_at, updated_at) VALUES (?, 'pending_assignment', ?, ?, ?, ?, ?) \
             ON CONFLICT (call_session_id) DO NOTHING RETURNING {SESSION}"
        );
        self.run(
            &sql,
            &[
                s.id.into(),
                s.direction.into(),
                s.caller.into(),
                s.called.into(),
                Value::Int(s.now_ms),
                Value::Int(s.now_ms),
            ],
        )?
        .first()
        .map(|r| session_at(r, 0))
        .transpose()
    }

    /// A session and the session its leg belongs to, in one read.
    pub(crate) fn session_with_leg(
        &self,
        id: &str,
        call_control_id: &str,
    ) -> Result<Option<(SessionRow, Option<String>)>, EngineError> {
        let sql = format!(
            "SELECT {SESSION}, (SELECT call_session_id FROM legs WHERE call_control_id = ?) FROM sessions WHERE call_session_id = ?"
        );
        let rows = self.run(&sql, &[call_control_id.into(), id.into()])?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        Ok(Some((session_at(row, 0)?, text(row, SESSION_COLUMNS))))
    }

    /// Reads back the session an ownership write changed: `None` when its
    /// guard (the `WHERE`) did not hold.
    fn write_session(
        &self,
        sql: &str,
        params: &[Value],
    ) -> Result<Option<SessionRow>, EngineError> {
        self.run(sql, params)?
            .first()
            .map(|r| session_at(r, 0))
            .transpose()
    }

    /// Unowned to owned: guarded on no owner, no fence, not ended.
    pub(crate) fn assign_session(
        &self,
        id: &str,
        node: &str,
        epoch: u64,
        origin: &str,
        now_ms: i64,
    ) -> Result<Option<SessionRow>, EngineError> {
        let sql = format!(
            "UPDATE sessions SET state = 'assigned', owner = ?, epoch = ?, origin_url = ?, updated_at = ? \
             WHERE call_session_id = ? AND owner IS NULL AND fence_node IS NULL AND state != 'ended' RETURNING {SESSION}"
        );
        self.write_session(
            &sql,
            &[
                node.into(),
                epoch.into(),
                origin.into(),
                Value::Int(now_ms),
                id.into(),
            ],
        )
    }

    /// Owned at `from_epoch` to another owner (or the same) at `epoch`:
    /// guarded on the epoch, no fence, an inbound session, and no ambiguous
    /// outcome at `from_epoch`.
    pub(crate) fn reassign_session(
        &self,
        id: &str,
        from_epoch: u64,
        node: &str,
        epoch: u64,
        origin: &str,
        now_ms: i64,
    ) -> Result<Option<SessionRow>, EngineError> {
        let sql = format!(
            "UPDATE sessions SET state = 'assigned', owner = ?, epoch = ?, origin_url = ?, updated_at = ? \
             WHERE call_session_id = ? AND {MOVABLE} RETURNING {SESSION}"
        );
        self.write_session(
            &sql,
            &[
                node.into(),
                epoch.into(),
                origin.into(),
                Value::Int(now_ms),
                id.into(),
                from_epoch.into(),
            ],
        )
    }

    /// Owned at `from_epoch` back to unowned (no node is eligible): the same
    /// guard as [`Self::reassign_session`]; the epoch stays as evidence.
    pub(crate) fn release_session(
        &self,
        id: &str,
        from_epoch: u64,
        now_ms: i64,
    ) -> Result<Option<SessionRow>, EngineError> {
        let sql = format!(
            "UPDATE sessions SET state = 'pending_assignment', owner = NULL, origin_url = NULL, updated_at = ? \
             WHERE call_session_id = ? AND {MOVABLE} RETURNING {SESSION}"
        );
        self.write_session(&sql, &[Value::Int(now_ms), id.into(), from_epoch.into()])
    }

    /// Grants the fence: guarded on no fence yet, the owner and epoch, and a
    /// session that has not ended.
    pub(crate) fn fence_session(
        &self,
        id: &str,
        node: &str,
        epoch: u64,
        command_id: &str,
        now_ms: i64,
    ) -> Result<Option<SessionRow>, EngineError> {
        let sql = format!(
            "UPDATE sessions SET fence_node = ?, fence_epoch = ?, fence_at = ?, command_id = ?, \
             state = CASE WHEN state = 'assigned' THEN 'answered' ELSE state END, updated_at = ? \
             WHERE call_session_id = ? AND fence_node IS NULL AND owner = ? AND epoch = ? AND state != 'ended' RETURNING {SESSION}"
        );
        self.write_session(
            &sql,
            &[
                node.into(),
                epoch.into(),
                Value::Int(now_ms),
                command_id.into(),
                Value::Int(now_ms),
                id.into(),
                node.into(),
                epoch.into(),
            ],
        )
    }

    /// Settles an owned session as `ended` once every leg has hung up:
    /// guarded on an owner, not already ended, and no open leg.
    pub(crate) fn end_session(
        &self,
        id: &str,
        now_ms: i64,
    ) -> Result<Option<SessionRow>, EngineError> {
        let sql = format!(
            "UPDATE sessions SET state = 'ended', settled_at = ?2, updated_at = ?2 \
             WHERE call_session_id = ?1 AND owner IS NOT NULL AND state != 'ended' \
             AND NOT EXISTS (SELECT 1 FROM legs WHERE call_session_id = ?1 AND state != 'hungup') RETURNING {SESSION}"
        );
        self.write_session(&sql, &[id.into(), Value::Int(now_ms)])
    }

    /// Records that an outcome at `epoch` was ambiguous: the session never
    /// moves at that epoch. Guarded on `epoch` being the current one.
    pub(crate) fn mark_session_ambiguous(&self, id: &str, epoch: u64) -> Result<(), EngineError> {
        self.run(
            "UPDATE sessions SET ambiguous_epoch = ? WHERE call_session_id = ? AND epoch = ?",
            &[epoch.into(), id.into(), epoch.into()],
        )?;
        Ok(())
    }

    /// Settles every open session created at or before `created_by` as
    /// `max_duration`.
    pub(crate) fn settle_expired(&self, created_by: i64, now_ms: i64) -> Result<(), EngineError> {
        self.run(
            &format!("UPDATE sessions SET state = 'max_duration', settled_at = ?, updated_at = ? WHERE state IN {OPEN_STATES} AND created_at <= ?"),
            &[Value::Int(now_ms), Value::Int(now_ms), Value::Int(created_by)],
        )?;
        Ok(())
    }

    /// Settles every open session of a silent owner as `node_lost`.
    pub(crate) fn settle_lost(&self, owner: &str, now_ms: i64) -> Result<(), EngineError> {
        self.run(
            &format!("UPDATE sessions SET state = 'node_lost', settled_at = ?, updated_at = ? WHERE owner = ? AND state IN {OPEN_STATES}"),
            &[Value::Int(now_ms), Value::Int(now_ms), owner.into()],
        )?;
        Ok(())
    }

    /// A session a node dialled: created outgoing, or marked outgoing.
    pub(crate) fn note_outgoing(&self, id: &str, now_ms: i64) -> Result<SessionRow, EngineError> {
        let sql = format!(
            "INSERT INTO sessions (call_session_id, state, direction, created_at, updated_at) VALUES (?, 'pending_assignment', 'outgoing', ?, ?) \
             ON CONFLICT (call_session_id) DO UPDATE SET direction = 'outgoing' RETURNING {SESSION}"
        );
        self.write_session(&sql, &[id.into(), Value::Int(now_ms), Value::Int(now_ms)])?
            .ok_or_else(|| EngineError::Corrupt("session vanished".into()))
    }

    /// Owners of open sessions.
    pub(crate) fn open_owners(&self) -> Result<Vec<String>, EngineError> {
        Ok(self
            .run("SELECT node FROM node_load WHERE open_calls > 0", &[])?
            .iter()
            .filter_map(|r| text(r, 0))
            .collect())
    }

    /// Deletes an unowned session once nothing of it is parked.
    pub(crate) fn forget_unowned(&self, session: &str) -> Result<(), EngineError> {
        self.run(
            "DELETE FROM sessions WHERE call_session_id = ? AND owner IS NULL",
            &[session.into()],
        )?;
        Ok(())
    }

    /// Open sessions (for the status counts).
    pub(crate) fn count_open_sessions(&self) -> Result<i64, EngineError> {
        Ok(self
            .first_int("SELECT COALESCE(SUM(open_calls), 0) FROM node_load", &[])?
            .unwrap_or(0))
    }

    // ---- legs --------------------------------------------------------------

    /// The session a leg belongs to, if the leg was seen before.
    pub(crate) fn leg_session(&self, call_control_id: &str) -> Result<Option<String>, EngineError> {
        Ok(self
            .run(
                "SELECT call_session_id FROM legs WHERE call_control_id = ?",
                &[call_control_id.into()],
            )?
            .first()
            .and_then(|r| text(r, 0)))
    }

    /// Records a leg, and its new lifecycle state (`answered`, `hungup`) if
    /// the event changes it; a hung-up leg stays hung up.
    pub(crate) fn track_leg(
        &self,
        call_control_id: &str,
        session: &str,
        state: Option<&str>,
        now_ms: i64,
    ) -> Result<(), EngineError> {
        self.run(
            "INSERT INTO legs (call_control_id, call_session_id, state, updated_at) VALUES (?, ?, ?, ?) \
             ON CONFLICT (call_control_id) DO UPDATE SET state = excluded.state, updated_at = excluded.updated_at \
             WHERE legs.state != 'hungup' AND excluded.state != 'open'",
            &[
                call_control_id.into(),
                session.into(),
                state.unwrap_or("open").into(),
                Value::Int(now_ms),
            ],
        )?;
        Ok(())
    }

    /// The legs of a session (for the call view).
    pub(crate) fn legs_of(&self, session: &str) -> Result<Vec<(String, String)>, EngineError> {
        Ok(self
            .run(
                "SELECT call_control_id, state FROM legs WHERE call_session_id = ? ORDER BY updated_at",
                &[session.into()],
            )?
            .iter()
            .map(|r| (text(r, 0).unwrap_or_default(), text(r, 1).unwrap_or_default()))
            .collect())
    }

    // ---- nodes -------------------------------------------------------------

    pub(crate) fn last_beat(&self, node: &str) -> Result<Option<LastBeat>, EngineError> {
        Ok(self
            .run(
                "SELECT seq, body_sha256, answer FROM heartbeats WHERE node = ?",
                &[node.into()],
            )?
            .first()
            .map(|r| LastBeat {
                seq: int(r, 0).unwrap_or(0),
                body_sha256: text(r, 1).unwrap_or_default(),
                answer: text(r, 2).unwrap_or_default(),
            }))
    }

    /// A node's stored beat: (body, received at, signed at).
    pub(crate) fn beat(&self, node: &str) -> Result<Option<(String, i64, i64)>, EngineError> {
        Ok(self
            .run(
                "SELECT body, received_at, signed_at FROM heartbeats WHERE node = ?",
                &[node.into()],
            )?
            .first()
            .map(|r| {
                (
                    text(r, 0).unwrap_or_default(),
                    int(r, 1).unwrap_or(0),
                    int(r, 2).unwrap_or(0),
                )
            }))
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn store_beat(
        &self,
        node: &str,
        seq: u64,
        body: &str,
        digest: &str,
        received_at: i64,
        signed_at: i64,
        answer: &str,
    ) -> Result<(), EngineError> {
        self.run(
            "INSERT INTO heartbeats (node, seq, body, body_sha256, received_at, signed_at, answer) VALUES (?, ?, ?, ?, ?, ?, ?) \
             ON CONFLICT (node) DO UPDATE SET seq = excluded.seq, body = excluded.body, body_sha256 = excluded.body_sha256, \
             received_at = excluded.received_at, signed_at = excluded.signed_at, answer = excluded.answer",
            &[
                node.into(),
                seq.into(),
                body.into(),
                digest.into(),
                Value::Int(received_at),
                Value::Int(signed_at),
                answer.into(),
            ],
        )?;
        Ok(())
    }

    /// A node's forward health and open calls, in one read.
    pub(crate) fn node(&self, node: &str) -> Result<NodeRow, EngineError> {
        let rows = self.run(
            "SELECT (SELECT last_failure_at FROM node_health WHERE node = ?1), \
                    (SELECT last_delivery_at FROM node_health WHERE node = ?1), \
                    (SELECT open_calls FROM node_load WHERE node = ?1)",
            &[node.into()],
        )?;
        let row = rows.first().cloned().unwrap_or_default();
        Ok(NodeRow {
            last_failure_at_ms: int(&row, 0),
            last_delivery_at_ms: int(&row, 1),
            open_calls: int(&row, 2).unwrap_or(0),
        })
    }

    /// Records a forward failure (`recent_forward_failure` for 30 s).
    pub(crate) fn mark_failure(&self, node: &str, now_ms: i64) -> Result<(), EngineError> {
        self.run(
            "INSERT INTO node_health (node, last_failure_at) VALUES (?, ?) \
             ON CONFLICT (node) DO UPDATE SET last_failure_at = excluded.last_failure_at",
            &[node.into(), Value::Int(now_ms)],
        )?;
        Ok(())
    }

    /// Records a delivery, which clears `recent_forward_failure`.
    pub(crate) fn mark_delivery(&self, node: &str, now_ms: i64) -> Result<(), EngineError> {
        self.run(
            "INSERT INTO node_health (node, last_delivery_at) VALUES (?, ?) \
             ON CONFLICT (node) DO UPDATE SET last_delivery_at = excluded.last_delivery_at",
            &[node.into(), Value::Int(now_ms)],
        )?;
        Ok(())
    }

    /// Nodes with stored beats or forward health.
    pub(crate) fn known_nodes(&self) -> Result<Vec<String>, EngineError> {
        Ok(self
            .run(
                "SELECT node FROM heartbeats UNION SELECT node FROM node_health",
                &[],
            )?
            .iter()
            .filter_map(|r| text(r, 0))
            .collect())
    }

    /// Forgets the beats and forward health of a node no longer registered.
    pub(crate) fn forget_node(&self, node: &str) -> Result<(), EngineError> {
        for sql in [
            "DELETE FROM heartbeats WHERE node = ?",
            "DELETE FROM node_health WHERE node = ?",
        ] {
            self.run(sql, &[node.into()])?;
        }
        Ok(())
    }

    // ---- documents ---------------------------------------------------------

    /// The newest revision of a document kind and its stored body.
    pub(crate) fn latest_document(&self, kind: &str) -> Result<Option<(i64, String)>, EngineError> {
        Ok(self
            .run(
                "SELECT revision, body FROM documents WHERE kind = ? ORDER BY revision DESC LIMIT 1",
                &[kind.into()],
            )?
            .first()
            .and_then(|r| Some((int(r, 0)?, text(r, 1)?))))
    }

    pub(crate) fn document(
        &self,
        kind: &str,
        revision: u64,
    ) -> Result<Option<(i64, String)>, EngineError> {
        Ok(self
            .run(
                "SELECT revision, body FROM documents WHERE kind = ? AND revision = ?",
                &[kind.into(), revision.into()],
            )?
            .first()
            .and_then(|r| Some((int(r, 0)?, text(r, 1)?))))
    }

    /// Stores revision `revision` and drops those older than the kept ones.
    pub(crate) fn insert_document(
        &self,
        kind: &str,
        revision: u64,
        body: &str,
        writer_fp: &str,
        kept: i64,
        now_ms: i64,
    ) -> Result<(), EngineError> {
        self.run(
            "INSERT INTO documents (kind, revision, body, written_at, writer_fp) VALUES (?, ?, ?, ?, ?)",
            &[
                kind.into(),
                revision.into(),
                body.into(),
                Value::Int(now_ms),
                writer_fp.into(),
            ],
        )?;
        self.run(
            "DELETE FROM documents WHERE kind = ? AND revision <= ?",
            &[kind.into(), Value::Int(revision as i64 - kept)],
        )?;
        Ok(())
    }

    // ---- decisions ---------------------------------------------------------

    pub(crate) fn insert_decision(
        &self,
        id: u64,
        now_ms: i64,
        session: Option<&str>,
        event: Option<&str>,
        body: &str,
    ) -> Result<(), EngineError> {
        self.run(
            "INSERT INTO decisions (decision_id, at, call_session_id, event_id, body) VALUES (?, ?, ?, ?, ?)",
            &[
                id.into(),
                Value::Int(now_ms),
                session.into(),
                event.into(),
                body.into(),
            ],
        )?;
        Ok(())
    }

    /// Decision bodies, newest first.
    pub(crate) fn decisions(
        &self,
        limit: u32,
        session: Option<&str>,
    ) -> Result<Vec<String>, EngineError> {
        let limit = Value::Int(i64::from(limit));
        let rows = match session {
            Some(id) => self.run(
                "SELECT body FROM decisions WHERE call_session_id = ? ORDER BY decision_id DESC LIMIT ?",
                &[id.into(), limit],
            )?,
            None => self.run(
                "SELECT body FROM decisions ORDER BY decision_id DESC LIMIT ?",
                &[limit],
            )?,
        };
        Ok(rows.iter().filter_map(|r| text(r, 0)).collect())
    }

    // ---- retention ---------------------------------------------------------

    /// Retention by age whatever the state, plus row caps.
    pub(crate) fn prune(
        &self,
        horizon_ms: i64,
        caps: &super::alarm::RowCaps,
    ) -> Result<(), EngineError> {
        let horizon = Value::Int(horizon_ms);
        for sql in [
            "DELETE FROM events WHERE updated_at < ?",
            "DELETE FROM sessions WHERE updated_at < ?",
            "DELETE FROM legs WHERE updated_at < ?",
        ] {
            self.run(sql, std::slice::from_ref(&horizon))?;
        }
        self.run(
            "DELETE FROM decisions WHERE decision_id <= (SELECT MAX(decision_id) FROM decisions) - ?",
            &[Value::Int(caps.decisions)],
        )?;
        self.run(
            "DELETE FROM events WHERE seq <= (SELECT MAX(seq) FROM events) - ?",
            &[Value::Int(caps.events)],
        )?;
        self.run(
            "DELETE FROM sessions WHERE call_session_id IN (SELECT call_session_id FROM sessions ORDER BY updated_at DESC LIMIT -1 OFFSET ?)",
            &[Value::Int(caps.sessions)],
        )?;
        self.run(
            "DELETE FROM legs WHERE call_control_id IN (SELECT call_control_id FROM legs ORDER BY updated_at DESC LIMIT -1 OFFSET ?)",
            &[Value::Int(caps.legs)],
        )?;
        Ok(())
    }
}
