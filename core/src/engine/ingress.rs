//! Ingress: a verified webhook enters the ledger, is deduplicated on
//! `data.id`, finds its session, and is either forwarded to the session's
//! owner, parked, or recorded (SPEC §7.2–7.5).

use super::routing::DecisionSubject;
use super::rows::{event_state as st, EventRow, SessionRow, SessionState};
use super::{Engine, EngineError, Forward};
use crate::decision::DecisionOutcome;
use crate::number::normalise;
use crate::store::{Store, Value};
use crate::telnyx::Envelope;
use serde::Serialize;

/// Why an event is parked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingReason {
    /// No routing policy or node registry yet (503 `no_policy`).
    NoPolicy,
    /// No node is eligible, or an outgoing session awaits its claim
    /// (503 `no_eligible_node`).
    NoEligibleNode,
}

impl PendingReason {
    /// The stable error code.
    pub fn code(self) -> &'static str {
        match self {
            PendingReason::NoPolicy => "no_policy",
            PendingReason::NoEligibleNode => "no_eligible_node",
        }
    }
}

/// The answer for a delivered event (200), the same for every duplicate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Delivered {
    /// The node that has it.
    pub delivered_to: String,
    /// The epoch it was delivered under.
    pub epoch: u64,
    /// Telnyx's `data.id`.
    pub event_id: String,
}

/// What the Worker must do with a verified webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ingress {
    /// Send it to its owner now, then report.
    Forward(Forward),
    /// Already delivered: 200 with the recorded answer; not forwarded again.
    Delivered(Delivered),
    /// An attempt's lease is live: 503 `in_progress`.
    InProgress,
    /// Parked: 503 with `Retry-After: 1`; the alarm retries for 10 s.
    Pending(PendingReason),
    /// The parking window closed with no node: 503 `no_eligible_node`.
    Rejected,
    /// Another connection's event: recorded, 200, never routed.
    Ignored,
    /// No session could be found: recorded, 200.
    Unroutable,
}

/// The outcome of trying to give an unowned session an owner.
pub(crate) enum Assignment {
    Assigned,
    Parked(PendingReason),
}

impl<S: Store> Engine<S> {
    /// `POST /v1/telnyx/webhook`, after the Worker verified the signature and
    /// parsed the envelope. `headers` are the Telnyx headers to store with
    /// the first delivery.
    pub fn handle_webhook(
        &self,
        envelope: &Envelope,
        body: &str,
        headers: &[(String, String)],
        now_ms: i64,
    ) -> Result<Ingress, EngineError> {
        self.store.atomically(|| {
            self.set_counter("last_webhook_at", now_ms)?;
            if let Some(event) = self.load_event(&envelope.event_id)? {
                return self.on_duplicate(event, now_ms);
            }
            if !self.serves_connection(envelope.connection_id.as_deref()) {
                self.insert_event(
                    envelope,
                    envelope.session_hint(),
                    st::IGNORED,
                    body,
                    headers,
                    now_ms,
                )?;
                return Ok(Ingress::Ignored);
            }
            let session_id = match envelope.session_hint() {
                Some(id) => Some(id.to_owned()),
                None => match envelope.call_control_id.as_deref() {
                    Some(ccid) => self.session_of_leg(ccid)?,
                    None => None,
                },
            };
            let Some(session_id) = session_id else {
                self.insert_event(envelope, None, st::UNROUTABLE, body, headers, now_ms)?;
                return Ok(Ingress::Unroutable);
            };
            self.insert_event(
                envelope,
                Some(&session_id),
                st::PENDING,
                body,
                headers,
                now_ms,
            )?;
            let session = match self.load_session(&session_id)? {
                Some(s) => s,
                None => self.create_session(&session_id, envelope, now_ms)?,
            };
            self.track_leg(&session, envelope, now_ms)?;
            let event = self
                .load_event(&envelope.event_id)?
                .ok_or_else(|| EngineError::Corrupt("event vanished".into()))?;
            if session.owner.is_some() {
                return Ok(Ingress::Forward(
                    self.start_attempt(&event, &session, now_ms)?,
                ));
            }
            self.assign_or_park(session, event, true, now_ms)
        })
    }

    fn serves_connection(&self, connection_id: Option<&str>) -> bool {
        match &self.config.connection_ids {
            None => true,
            Some(ids) => connection_id.is_some_and(|c| ids.iter().any(|id| id == c)),
        }
    }

    fn insert_event(
        &self,
        envelope: &Envelope,
        session: Option<&str>,
        state: &str,
        body: &str,
        headers: &[(String, String)],
        now_ms: i64,
    ) -> Result<(), EngineError> {
        let seq = self.next_counter("event_seq")?;
        let headers =
            serde_json::to_string(headers).map_err(|e| EngineError::Corrupt(e.to_string()))?;
        let pending_until =
            (state == st::PENDING).then_some(now_ms + self.config.timing.pending_window_ms);
        self.exec(
            "INSERT INTO events (event_id, seq, call_session_id, call_control_id, event_type, state, body, headers, received_at, updated_at, pending_until) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            &[
                envelope.event_id.as_str().into(),
                seq.into(),
                session.into(),
                envelope.call_control_id.as_deref().into(),
                envelope.event_type.as_str().into(),
                state.into(),
                body.into(),
                headers.into(),
                Value::Int(now_ms),
                Value::Int(now_ms),
                pending_until.into(),
            ],
        )?;
        Ok(())
    }

    fn create_session(
        &self,
        id: &str,
        envelope: &Envelope,
        now_ms: i64,
    ) -> Result<SessionRow, EngineError> {
        let caller = envelope.from.as_deref().and_then(normalise);
        let called = envelope.to.as_deref().and_then(normalise);
        self.exec(
            "INSERT INTO sessions (call_session_id, state, direction, caller, called, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            &[
                id.into(),
                SessionState::PendingAssignment.as_str().into(),
                envelope.direction.as_deref().into(),
                caller.into(),
                called.into(),
                Value::Int(now_ms),
                Value::Int(now_ms),
            ],
        )?;
        self.load_session(id)?
            .ok_or_else(|| EngineError::Corrupt("session vanished".into()))
    }

    /// Records the leg and its lifecycle: `call.answered` marks it answered,
    /// `call.hangup` hung up; a session whose every leg hung up has ended.
    fn track_leg(
        &self,
        session: &SessionRow,
        envelope: &Envelope,
        now_ms: i64,
    ) -> Result<(), EngineError> {
        let Some(ccid) = envelope.call_control_id.as_deref() else {
            return Ok(());
        };
        let leg_state = match envelope.event_type.as_str() {
            "call.hangup" => Some("hungup"),
            "call.answered" => Some("answered"),
            _ => None,
        };
        self.exec(
            "INSERT INTO legs (call_control_id, call_session_id, state, updated_at) VALUES (?, ?, 'open', ?) \
             ON CONFLICT (call_control_id) DO NOTHING",
            &[ccid.into(), session.id.as_str().into(), Value::Int(now_ms)],
        )?;
        if let Some(state) = leg_state {
            self.exec(
                "UPDATE legs SET state = ?, updated_at = ? WHERE call_control_id = ? AND state != 'hungup'",
                &[state.into(), Value::Int(now_ms), ccid.into()],
            )?;
        }
        if leg_state == Some("hungup") && session.owner.is_some() {
            let open = self.scalar(
                "SELECT COUNT(*) FROM legs WHERE call_session_id = ? AND state != 'hungup'",
                &[session.id.as_str().into()],
            )?;
            if open == Some(0) {
                self.exec(
                    "UPDATE sessions SET state = 'ended', settled_at = ?, updated_at = ? WHERE call_session_id = ?",
                    &[Value::Int(now_ms), Value::Int(now_ms), session.id.as_str().into()],
                )?;
            }
        }
        Ok(())
    }

    fn on_duplicate(&self, event: EventRow, now_ms: i64) -> Result<Ingress, EngineError> {
        match event.state.as_str() {
            st::DELIVERED => Ok(Ingress::Delivered(delivered(&event))),
            st::IGNORED => Ok(Ingress::Ignored),
            st::UNROUTABLE => Ok(Ingress::Unroutable),
            st::REJECTED => Ok(Ingress::Rejected),
            st::FORWARDING if event.lease_until_ms.is_some_and(|l| l > now_ms) => {
                Ok(Ingress::InProgress)
            }
            st::FORWARDING | st::UNKNOWN | st::QUEUED | st::PENDING => {
                if event.state == st::FORWARDING {
                    // The lease lapsed with no report: the outcome is
                    // unknown and the call stays put at this epoch, exactly
                    // as when the alarm finds the lapse first (SPEC §7.3).
                    self.mark_unknown(&event, now_ms)?;
                }
                let session = match event.call_session_id.as_deref() {
                    Some(id) => self.load_session(id)?,
                    None => None,
                };
                let Some(session) = session else {
                    return Ok(Ingress::Unroutable);
                };
                if session.owner.is_some() {
                    Ok(Ingress::Forward(
                        self.start_attempt(&event, &session, now_ms)?,
                    ))
                } else {
                    self.assign_or_park(session, event, false, now_ms)
                }
            }
            // A state written by a newer release: answer safely, change nothing.
            _ => Ok(Ingress::InProgress),
        }
    }

    /// Gives an unowned session an owner and forwards `event`, or parks the
    /// event. `first_park` records a `pending` decision (only the first time
    /// an event is parked; re-checks record nothing).
    fn assign_or_park(
        &self,
        session: SessionRow,
        event: EventRow,
        first_park: bool,
        now_ms: i64,
    ) -> Result<Ingress, EngineError> {
        match self.try_assign(&session, &event.event_id, first_park, now_ms)? {
            Assignment::Assigned => {
                let session = self
                    .load_session(&session.id)?
                    .ok_or_else(|| EngineError::Corrupt("session vanished".into()))?;
                Ok(Ingress::Forward(
                    self.start_attempt(&event, &session, now_ms)?,
                ))
            }
            Assignment::Parked(reason) => {
                if event.state != st::PENDING {
                    self.park_event(&event.event_id, now_ms)?;
                }
                Ok(Ingress::Pending(reason))
            }
        }
    }

    /// Tries to give an unowned inbound session an owner by policy. On
    /// success the session's parked events are queued for the owner.
    pub(crate) fn try_assign(
        &self,
        session: &SessionRow,
        event_id: &str,
        record_pending: bool,
        now_ms: i64,
    ) -> Result<Assignment, EngineError> {
        let subject = || DecisionSubject {
            session: Some(&session.id),
            event: Some(event_id),
        };
        // An outgoing session is never resolved by policy: it waits for its claim.
        let routed = match session.is_outgoing() {
            true => None,
            false => self.route_session(session, now_ms)?,
        };
        let Some((node, origin)) = routed.as_ref().and_then(|r| r.target()) else {
            if record_pending {
                self.record_decision(
                    subject(),
                    routed.as_ref(),
                    None,
                    None,
                    DecisionOutcome::Pending,
                    now_ms,
                )?;
            }
            let reason = match routed.is_none() && !session.is_outgoing() {
                true => PendingReason::NoPolicy,
                false => PendingReason::NoEligibleNode,
            };
            return Ok(Assignment::Parked(reason));
        };
        let epoch = self.next_epoch()?;
        self.set_owner(&session.id, &node, epoch, &origin, now_ms)?;
        self.record_decision(
            subject(),
            routed.as_ref(),
            None,
            Some(epoch),
            DecisionOutcome::Assigned,
            now_ms,
        )?;
        Ok(Assignment::Assigned)
    }

    /// Makes `node` the owner at `epoch` and queues the session's undelivered
    /// events for it, in order.
    pub(crate) fn set_owner(
        &self,
        session: &str,
        node: &str,
        epoch: u64,
        origin: &str,
        now_ms: i64,
    ) -> Result<(), EngineError> {
        self.exec(
            "UPDATE sessions SET state = 'assigned', owner = ?, epoch = ?, origin_url = ?, updated_at = ? WHERE call_session_id = ?",
            &[node.into(), epoch.into(), origin.into(), Value::Int(now_ms), session.into()],
        )?;
        self.exec(
            "UPDATE events SET state = 'queued', next_try_at = ?, pending_until = NULL, updated_at = ? \
             WHERE call_session_id = ? AND state IN ('pending_assignment', 'forwarding', 'unknown', 'queued')",
            &[Value::Int(now_ms), Value::Int(now_ms), session.into()],
        )?;
        Ok(())
    }

    /// Parks an event for the pending window.
    pub(crate) fn park_event(&self, event_id: &str, now_ms: i64) -> Result<(), EngineError> {
        self.exec(
            "UPDATE events SET state = 'pending_assignment', pending_until = ?, lease_until = NULL, next_try_at = NULL, updated_at = ? WHERE event_id = ?",
            &[
                Value::Int(now_ms + self.config.timing.pending_window_ms),
                Value::Int(now_ms),
                event_id.into(),
            ],
        )?;
        Ok(())
    }

    /// Starts a forward attempt of `event` to the session's owner at the
    /// session's epoch, with a lease of the forward budget plus grace.
    pub(crate) fn start_attempt(
        &self,
        event: &EventRow,
        session: &SessionRow,
        now_ms: i64,
    ) -> Result<Forward, EngineError> {
        let (Some(node), Some(epoch), Some(origin)) =
            (&session.owner, session.epoch, &session.origin_url)
        else {
            return Err(EngineError::Corrupt("attempt on an unowned session".into()));
        };
        let attempt = event.attempts + 1;
        let lease_until =
            now_ms + self.config.forward_timeout_ms + self.config.timing.lease_grace_ms;
        self.exec(
            "UPDATE events SET state = 'forwarding', node = ?, epoch = ?, attempts = ?, lease_until = ?, next_try_at = ?, pending_until = NULL, updated_at = ? WHERE event_id = ?",
            &[
                node.as_str().into(),
                epoch.into(),
                Value::Int(i64::from(attempt)),
                Value::Int(lease_until),
                Value::Int(lease_until),
                Value::Int(now_ms),
                event.event_id.as_str().into(),
            ],
        )?;
        Ok(Forward {
            event_id: event.event_id.clone(),
            call_session_id: session.id.clone(),
            call_control_id: event.call_control_id.clone(),
            node: node.clone(),
            origin_url: origin.clone(),
            epoch,
            attempt,
            body: event.body.clone(),
            headers: event.headers.clone(),
        })
    }
}

/// The recorded 200 answer of a delivered event.
pub(crate) fn delivered(event: &EventRow) -> Delivered {
    Delivered {
        delivered_to: event.node.clone().unwrap_or_default(),
        epoch: event.epoch.unwrap_or(0),
        event_id: event.event_id.clone(),
    }
}
