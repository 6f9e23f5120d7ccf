//! Ingress: a verified webhook enters the ledger, is deduplicated on
//! `data.id`, finds its session, and is either forwarded to the session's
//! owner, parked, or recorded (SPEC §7.2–7.5).
//!
//! A new event is decided before it is written, so its ledger row is
//! inserted once, in its final state (a first attempt, parked, ignored or
//! unroutable): a new call costs nine statements.

use super::lease::Undo;
use super::ownership::{Ownership, PendingReason, Placeable, Placed};
use super::queries::{NewEvent, NewSession};
use super::rows::{event_state as st, EventRow, Payload, SessionRow};
use super::{Arrival, CallShard, EngineError, Forward};
use crate::number::normalise;
use crate::store::Store;
use crate::telnyx::Envelope;
use serde::Serialize;

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
    /// The first event of a new session, with the sessions table at
    /// `SESSION_CAP` and only live sessions in it: 503 `storage_full`;
    /// nothing is stored (the carrier retries) and nothing is evicted.
    StorageFull,
    /// The parking window closed with no node: 503 `no_eligible_node`.
    Rejected,
    /// Another connection's event: recorded, 200, never routed.
    Ignored,
    /// No session could be found: recorded, 200.
    Unroutable,
    /// A new session this shard may not create yet (SPEC §16): the
    /// Worker sends the webhook to the shard named, or asks around first.
    /// Nothing is stored.
    Redirect(crate::messages::Redirect),
    /// The decision found a node full for want of room another shard may
    /// hold (SPEC §16): nothing is stored; the Dispatcher asks for the room
    /// and serves the webhook again, taking that decision as it stands
    /// ([`CallShard::as_is`]).
    NeedRoom,
}

impl<S: Store> CallShard<S> {
    /// `POST /v1/telnyx/webhook`, after the Worker verified the signature and
    /// parsed the envelope, on a shard that holds no map but its own: a
    /// webhook that arrives with nothing more than its body.
    pub fn handle_webhook(
        &self,
        envelope: &Envelope,
        body: &str,
        headers: &[(String, String)],
        now_ms: i64,
    ) -> Result<Ingress, EngineError> {
        self.handle_placed_webhook(envelope, body, headers, &Arrival::default(), now_ms)
    }

    /// A verified webhook as the Worker placed it: `headers` are the Telnyx
    /// headers to store with the first delivery, and `arrival` what the
    /// Worker knows of the map (the holder rule, `holder`).
    pub fn handle_placed_webhook(
        &self,
        envelope: &Envelope,
        body: &str,
        headers: &[(String, String)],
        arrival: &Arrival,
        now_ms: i64,
    ) -> Result<Ingress, EngineError> {
        let undone = self.unit(|| {
            let q = self.q();
            if let Some(event) = q.event(&envelope.event_id)? {
                q.set_counter("last_webhook_at", now_ms)?;
                return Ok(self.on_duplicate(event, now_ms)?);
            }
            // Where the event belongs, before anything is written: a shard
            // that sends it on (SPEC §16) stores nothing of it.
            let serves = self.serves_connection(envelope.connection_id.as_deref());
            let session_id = match envelope.session_hint() {
                _ if !serves => None,
                Some(id) => Some(id.to_owned()),
                None => match envelope.call_control_id.as_deref() {
                    Some(ccid) => match q.leg_session(ccid)? {
                        Some(id) => Some(id),
                        None => match self.leg_check(arrival)? {
                            Some(ask) => return Ok(ask),
                            None => None,
                        },
                    },
                    None => None,
                },
            };
            let known = match &session_id {
                Some(id) => q.session(id)?,
                None => None,
            };
            if let (Some(id), None) = (&session_id, &known) {
                if let Some(away) = self.holder_check(id, arrival)? {
                    return Ok(away);
                }
            }
            let seq = q.counters(&["event_seq"], &[("last_webhook_at", now_ms)])?[0];
            let seq = self.shard_scoped(seq);
            let headers_json =
                serde_json::to_string(headers).map_err(|e| EngineError::Corrupt(e.to_string()))?;
            let new = |session, state, pending_until, attempt| NewEvent {
                event_id: &envelope.event_id,
                seq,
                session,
                call_control_id: envelope.call_control_id.as_deref(),
                event_type: &envelope.event_type,
                state,
                body,
                headers: &headers_json,
                now_ms,
                pending_until,
                attempt,
            };
            if !serves {
                q.insert_event(&new(envelope.session_hint(), st::IGNORED, None, None))?;
                return Ok(Ingress::Ignored);
            }
            let Some(session_id) = session_id else {
                q.insert_event(&new(None, st::UNROUTABLE, None, None))?;
                return Ok(Ingress::Unroutable);
            };
            let (session, created) = match known {
                Some(row) => (Ownership::of(row), false),
                None => {
                    let Some(session) = self.open_session(&session_id, envelope, now_ms)? else {
                        return Ok(Ingress::StorageFull);
                    };
                    (session, true)
                }
            };
            let session = self.track_leg(session, envelope, now_ms)?;
            let session = match session {
                Ownership::Unowned(u) => {
                    self.watch_room();
                    let placed = self.place(
                        Placeable::Unowned(u),
                        Some(&envelope.event_id),
                        true,
                        !created,
                        now_ms,
                    )?;
                    if self.room_short() {
                        return Err(Undo::NeedRoom);
                    }
                    match placed {
                        Placed::Assigned(owned) => Ownership::Owned(owned),
                        Placed::Parked(reason) => {
                            let until = now_ms + self.config.timing.pending_window_ms;
                            q.insert_event(&new(
                                Some(&session_id),
                                st::PENDING,
                                Some(until),
                                None,
                            ))?;
                            return Ok(Ingress::Pending(reason));
                        }
                    }
                }
                owned => owned,
            };
            let row = session.row();
            let (Some(node), Some(epoch), Some(origin)) = (&row.owner, row.epoch, &row.origin_url)
            else {
                return Err(EngineError::Corrupt("attempt on an unowned session".into()).into());
            };
            let lease = self.lease_until(now_ms);
            q.insert_event(&new(
                Some(&session_id),
                st::FORWARDING,
                None,
                Some((node, epoch, lease)),
            ))?;
            Ok(Ingress::Forward(Forward {
                event_id: envelope.event_id.clone(),
                call_session_id: session_id.clone(),
                call_control_id: envelope.call_control_id.clone(),
                node: node.clone(),
                origin_url: origin.clone(),
                epoch,
                attempt: 1,
                body: body.to_owned(),
                headers: headers.to_vec(),
            }))
        });
        let ingress = match undone {
            Ok(ingress) => ingress,
            Err(Undo::NeedRoom) => Ingress::NeedRoom,
            Err(Undo::Failed(e)) => return Err(e),
        };
        if matches!(ingress, Ingress::StorageFull) {
            self.count_refusal(|r| r.storage_full += 1);
        }
        Ok(ingress)
    }

    fn serves_connection(&self, connection_id: Option<&str>) -> bool {
        match &self.config.connection_ids {
            None => true,
            Some(ids) => connection_id.is_some_and(|c| ids.iter().any(|id| id == c)),
        }
    }

    /// A new session, created from its first event's numbers. `None` when
    /// the sessions table holds only live sessions at `SESSION_CAP`.
    fn open_session(
        &self,
        id: &str,
        envelope: &Envelope,
        now_ms: i64,
    ) -> Result<Option<Ownership>, EngineError> {
        let caller = envelope.from.as_deref().and_then(normalise);
        let called = envelope.to.as_deref().and_then(normalise);
        let q = self.q();
        let new = NewSession {
            id,
            direction: envelope.direction.as_deref(),
            caller: caller.as_deref(),
            called: called.as_deref(),
            now_ms,
        };
        if let Some(row) = q.insert_session(&new, self.config.session_cap)? {
            return Ok(Some(Ownership::of(row)));
        }
        Ok(self.insert_at_cap(&new)?.map(Ownership::of))
    }

    /// Inserts a session known to be new while the sessions table is at
    /// `SESSION_CAP`: the oldest settled sessions are evicted to make room
    /// (never a live one); `None` when there is none to evict.
    pub(crate) fn insert_at_cap(
        &self,
        new: &NewSession<'_>,
    ) -> Result<Option<SessionRow>, EngineError> {
        let q = self.q();
        let cap = self.config.session_cap;
        if q.evict_settled(cap - 1)? == 0 {
            return Ok(None);
        }
        q.insert_session(new, cap)
    }

    /// Records the leg and its lifecycle: `call.answered` marks it answered,
    /// `call.hangup` hung up; an owned session whose every leg hung up has
    /// ended.
    fn track_leg(
        &self,
        session: Ownership,
        envelope: &Envelope,
        now_ms: i64,
    ) -> Result<Ownership, EngineError> {
        let Some(ccid) = envelope.call_control_id.as_deref() else {
            return Ok(session);
        };
        let leg_state = match envelope.event_type.as_str() {
            "call.hangup" => Some("hungup"),
            "call.answered" => Some("answered"),
            _ => None,
        };
        let q = self.q();
        q.track_leg(ccid, &session.row().id, leg_state, now_ms)?;
        if leg_state == Some("hungup") {
            return session.end_if_hung_up(&q, now_ms);
        }
        Ok(session)
    }

    /// The lease of an attempt started now: the forward budget plus grace.
    fn lease_until(&self, now_ms: i64) -> i64 {
        now_ms + self.config.forward_timeout_ms + self.config.timing.lease_grace_ms
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
                let session = match event.call_session_id.as_deref() {
                    Some(id) => self.q().session(id)?,
                    None => None,
                };
                let Some(mut session) = session else {
                    return Ok(Ingress::Unroutable);
                };
                if event.state == st::FORWARDING {
                    // The lease lapsed with no report: the outcome is
                    // unknown and the call stays put at this epoch, exactly
                    // as when the alarm finds the lapse first (SPEC §7.3).
                    let owned = match Ownership::of(session.clone()) {
                        Ownership::Owned(owned) => Some(owned),
                        _ => None,
                    };
                    if let Some(owned) = owned {
                        self.mark_unknown(&event, Some(owned), now_ms)?;
                        session = self.q().session(&session.id)?.unwrap_or(session);
                    } else {
                        self.mark_unknown(&event, None, now_ms)?;
                    }
                }
                let session = match Ownership::of(session) {
                    Ownership::Unowned(u) => {
                        match self.place(
                            Placeable::Unowned(u),
                            Some(&event.event_id),
                            false,
                            true,
                            now_ms,
                        )? {
                            Placed::Assigned(owned) => owned.row().clone(),
                            Placed::Parked(reason) => {
                                if event.state != st::PENDING {
                                    self.park_event(&event.event_id, now_ms)?;
                                }
                                return Ok(Ingress::Pending(reason));
                            }
                        }
                    }
                    owned => owned.row().clone(),
                };
                let payload = self.q().payload(&event.event_id)?;
                Ok(Ingress::Forward(
                    self.start_attempt(&event, payload, &session, now_ms)?,
                ))
            }
            // A state written by a newer release: answer safely, change nothing.
            _ => Ok(Ingress::InProgress),
        }
    }

    /// Parks an event for the pending window.
    pub(crate) fn park_event(&self, event_id: &str, now_ms: i64) -> Result<(), EngineError> {
        self.q().park_event(
            event_id,
            now_ms + self.config.timing.pending_window_ms,
            now_ms,
        )
    }

    /// Starts a forward attempt of a stored `event` to the session's owner at
    /// the session's epoch, with a lease of the forward budget plus grace.
    pub(crate) fn start_attempt(
        &self,
        event: &EventRow,
        payload: Payload,
        session: &SessionRow,
        now_ms: i64,
    ) -> Result<Forward, EngineError> {
        let (Some(node), Some(epoch), Some(origin)) =
            (&session.owner, session.epoch, &session.origin_url)
        else {
            return Err(EngineError::Corrupt("attempt on an unowned session".into()));
        };
        let attempt = event.attempts + 1;
        self.q().start_attempt(
            &event.event_id,
            node,
            epoch,
            attempt,
            self.lease_until(now_ms),
            now_ms,
        )?;
        Ok(Forward {
            event_id: event.event_id.clone(),
            call_session_id: session.id.clone(),
            call_control_id: event.call_control_id.clone(),
            node: node.clone(),
            origin_url: origin.clone(),
            epoch,
            attempt,
            body: payload.body,
            headers: payload.headers,
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
