//! The event ledger's statements, and the alarm's facts.

use super::{int, text, AlarmFacts, NewEvent, Queries, Received, ALARM_FACTS};
use crate::error::EngineError;
use crate::shard::rows::{
    event_at, payload_at, session_at, EventRow, Payload, SessionRow, EVENT_COLUMNS, SESSION_COLUMNS,
};
use crate::store::{Store, Value};

/// What a report is applied to ([`Queries::reported_event`]).
pub(crate) struct ReportedEvent {
    pub event: EventRow,
    pub session: Option<SessionRow>,
    /// The report's epoch is both the session's and the event's.
    pub current: bool,
}

impl<S: Store> Queries<'_, S> {
    /// An event without its payload.
    pub(crate) fn event(&self, id: &str) -> Result<Option<EventRow>, EngineError> {
        let sql = concat!("SELECT ", event_cols!(), " FROM events WHERE event_id = ?");
        self.run(sql, &[id.into()])?
            .first()
            .map(|r| event_at(r, 0))
            .transpose()
    }

    /// A reported event, its session, and whether `epoch` is current: the
    /// session's epoch and the event's latest attempt's. The epoch guard of
    /// a report is this read's `current` column, so that a report's every
    /// effect hangs on one stated condition of the unit's first read.
    pub(crate) fn reported_event(
        &self,
        id: &str,
        epoch: u64,
    ) -> Result<Option<ReportedEvent>, EngineError> {
        let sql = concat!("SELECT ", event_cols_e!(), ", ", session_cols_s!(), ", (s.epoch IS ?2 AND e.epoch IS ?2) \
             FROM events e LEFT JOIN sessions s ON s.call_session_id = e.call_session_id WHERE e.event_id = ?1");
        let rows = self.run(sql, &[id.into(), epoch.into()])?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let event = event_at(row, 0)?;
        let session = match row.get(EVENT_COLUMNS) {
            Some(Value::Text(_)) => Some(session_at(row, EVENT_COLUMNS)?),
            _ => None,
        };
        let current = int(row, EVENT_COLUMNS + SESSION_COLUMNS) == Some(1);
        Ok(Some(ReportedEvent {
            event,
            session,
            current,
        }))
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

    /// Marks an event's outcome unknown, with its next re-drive (`None` when
    /// none is left).
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
        let sql = concat!(
            "SELECT ",
            event_cols!(),
            " FROM events WHERE state = 'pending_assignment' ORDER BY seq"
        );
        self.run(sql, &[])?.iter().map(|r| event_at(r, 0)).collect()
    }

    /// Queued events and unknown outcomes whose time has come, oldest
    /// first, with their payloads.
    pub(crate) fn due_events(
        &self,
        now_ms: i64,
        max_redrives: i64,
    ) -> Result<Vec<(EventRow, Payload)>, EngineError> {
        let sql = concat!("SELECT ", event_cols!(), ", body, headers FROM events WHERE (state = 'queued' OR (state = 'unknown' AND redrives < ?)) \
             AND next_try_at IS NOT NULL AND next_try_at <= ? ORDER BY seq");
        self.run(sql, &[Value::Int(max_redrives), Value::Int(now_ms)])?
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
    /// ([`ALARM_FACTS`]).
    pub(crate) fn alarm_facts(&self) -> Result<AlarmFacts, EngineError> {
        let rows = self.run(ALARM_FACTS, &[])?;
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
        let sql = concat!(
            "SELECT ",
            event_cols!(),
            " FROM events WHERE call_session_id = ? ORDER BY seq DESC LIMIT 500"
        );
        self.run(sql, &[session.into()])?
            .iter()
            .map(|r| event_at(r, 0))
            .collect()
    }

    /// Up to `limit` ledger events after arrival number `after`, in arrival
    /// order, with their first delivery's raw body (the export).
    pub(crate) fn events_after(
        &self,
        after: u64,
        limit: u32,
    ) -> Result<Vec<Received>, EngineError> {
        let rows = self.run(
            "SELECT seq, event_id, event_type, call_session_id, state, node, received_at, updated_at, body FROM events WHERE seq > ? ORDER BY seq LIMIT ?",
            &[after.into(), Value::Int(i64::from(limit))],
        )?;
        Ok(rows
            .iter()
            .filter_map(|r| {
                Some(Received {
                    seq: int(r, 0)?,
                    event_id: text(r, 1)?,
                    event_type: text(r, 2)?,
                    call_session_id: text(r, 3),
                    state: text(r, 4)?,
                    node: text(r, 5),
                    received_at_ms: int(r, 6)?,
                    updated_at_ms: int(r, 7)?,
                    body: text(r, 8)?,
                })
            })
            .collect())
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
}
