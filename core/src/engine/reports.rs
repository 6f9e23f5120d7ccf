//! Delivery reports: the origin's answer to one forward attempt, bound to
//! the epoch and attempt it was sent under (SPEC §7.6–7.7).

use super::ingress::{delivered, Delivered, PendingReason};
use super::routing::DecisionSubject;
use super::rows::{event_state as st, EventRow, SessionRow};
use super::{Engine, EngineError, Forward};
use crate::decision::DecisionOutcome;
use crate::outcome::{classify, truncate_body, OriginAnswer, OutcomeClass};
use crate::store::{Store, Value};
use serde::{Deserialize, Serialize};

/// The least forward budget worth an immediate send to a new owner.
pub const MIN_REFORWARD_BUDGET_MS: i64 = 250;

/// One attempt's outcome, as the Worker (or the alarm) reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// Telnyx's `data.id`.
    pub event_id: String,
    /// The epoch the attempt was sent under.
    pub epoch: u64,
    /// The attempt number it carried.
    pub attempt: u32,
    /// What the origin answered.
    pub answer: ReportedAnswer,
    /// Milliseconds of the carrier's budget still available for an immediate
    /// forward to a new owner (0 from the alarm).
    pub budget_left_ms: i64,
}

/// [`OriginAnswer`] in its wire form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ReportedAnswer {
    /// An HTTP answer.
    Http {
        /// Status code.
        status: u16,
        /// Body (truncated to 4 KiB when recorded).
        body: String,
    },
    /// No answer within the budget.
    Timeout,
    /// The connection failed.
    NetworkError,
}

impl ReportedAnswer {
    /// The class of this answer (SPEC §7.7).
    pub fn class(&self) -> OutcomeClass {
        classify(&self.to_origin())
    }

    fn to_origin(&self) -> OriginAnswer {
        match self {
            ReportedAnswer::Http { status, body } => OriginAnswer::Http {
                status: *status,
                body: body.clone(),
            },
            ReportedAnswer::Timeout => OriginAnswer::Timeout,
            ReportedAnswer::NetworkError => OriginAnswer::NetworkError,
        }
    }
}

/// What a report did, and so what the carrier is answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReportEffect {
    /// Delivered (200 with the recorded answer).
    Delivered(Delivered),
    /// The outcome is ambiguous, or the report was superseded: 503
    /// `delivery_unknown`; the alarm and carrier retries re-drive it.
    Unknown,
    /// The session moved to a new owner. With a forward, send it now; without
    /// one, answer 503 `reassigned` and the alarm delivers.
    Reassigned(Option<Forward>),
    /// Definitely not delivered and no other node is eligible: parked.
    Parked(PendingReason),
}

impl<S: Store> Engine<S> {
    /// Applies one attempt's outcome. Only a report for the session's
    /// current epoch changes anything; only the latest attempt's non-delivery
    /// counts.
    pub fn handle_report(&self, report: &Report, now_ms: i64) -> Result<ReportEffect, EngineError> {
        self.store.atomically(|| {
            let Some(event) = self.load_event(&report.event_id)? else {
                return Ok(ReportEffect::Unknown);
            };
            if event.state == st::DELIVERED {
                return Ok(ReportEffect::Delivered(delivered(&event)));
            }
            let session = match event.call_session_id.as_deref() {
                Some(id) => self.load_session(id)?,
                None => None,
            };
            let Some(session) = session else {
                return Ok(ReportEffect::Unknown);
            };
            let current = session.epoch == Some(report.epoch) && event.epoch == Some(report.epoch);
            let Some(node) = event.node.clone().filter(|_| current) else {
                return Ok(ReportEffect::Unknown);
            };
            let answer = report.answer.to_origin();
            let class = classify(&answer);
            if class.is_delivered() {
                let (status, body) = match &answer {
                    OriginAnswer::Http { status, body } => (Some(i64::from(*status)), Some(truncate_body(body))),
                    _ => (None, None),
                };
                self.exec(
                    "UPDATE events SET state = 'delivered', result_status = ?, result_body = ?, lease_until = NULL, next_try_at = NULL, updated_at = ? WHERE event_id = ?",
                    &[status.into(), body.into(), Value::Int(now_ms), event.event_id.as_str().into()],
                )?;
                self.mark_delivery(&node, now_ms)?;
                let event = self.load_event(&event.event_id)?.unwrap_or(event);
                return Ok(ReportEffect::Delivered(delivered(&event)));
            }
            if report.attempt != event.attempts || event.state != st::FORWARDING {
                // An older attempt, or one already settled: the newer state stands.
                return Ok(ReportEffect::Unknown);
            }
            self.mark_failure(&node, now_ms)?;
            if class == OutcomeClass::NotDelivered && self.can_move(&session, &event)? {
                return self.reassign(&session, &event, report.budget_left_ms, now_ms);
            }
            self.mark_unknown(&event, now_ms)?;
            Ok(ReportEffect::Unknown)
        })
    }

    /// A session may move only before any fence, for an inbound session, when
    /// no outcome at the current epoch was ever ambiguous, and when no other
    /// attempt under it is in flight.
    fn can_move(&self, session: &SessionRow, event: &EventRow) -> Result<bool, EngineError> {
        if session.fence.is_some()
            || session.is_outgoing()
            || session.ambiguous_epoch == session.epoch
        {
            return Ok(false);
        }
        let ambiguous = self
            .session_events(&session.id, &[st::UNKNOWN, st::FORWARDING])?
            .into_iter()
            .any(|e| e.event_id != event.event_id && e.epoch == session.epoch);
        Ok(!ambiguous)
    }

    /// Marks an event's outcome unknown and schedules the alarm's next
    /// re-drive (after the lease, then 1, 2, 4, 8 s).
    pub(crate) fn mark_unknown(&self, event: &EventRow, now_ms: i64) -> Result<(), EngineError> {
        let backoff = &self.config.timing.redrive_backoff_ms;
        let next = backoff
            .get(event.redrives as usize)
            .map(|delay| event.lease_until_ms.unwrap_or(now_ms).max(now_ms) + delay);
        self.exec(
            "UPDATE events SET state = 'unknown', next_try_at = ?, updated_at = ? WHERE event_id = ?",
            &[next.into(), Value::Int(now_ms), event.event_id.as_str().into()],
        )?;
        self.exec(
            "UPDATE sessions SET ambiguous_epoch = ? WHERE call_session_id = ?",
            &[event.epoch.into(), event.call_session_id.as_deref().into()],
        )?;
        Ok(())
    }

    /// Moves a session whose owner definitely did not take `event` to the next
    /// eligible node with a new epoch, or parks it when there is none.
    fn reassign(
        &self,
        session: &SessionRow,
        event: &EventRow,
        budget_left_ms: i64,
        now_ms: i64,
    ) -> Result<ReportEffect, EngineError> {
        let subject = DecisionSubject {
            session: Some(&session.id),
            event: Some(&event.event_id),
        };
        let routed = self.route_session(session, now_ms)?;
        let chosen = routed.as_ref().and_then(|r| r.target());
        let Some((node, origin)) = chosen else {
            self.exec(
                "UPDATE sessions SET state = 'pending_assignment', owner = NULL, origin_url = NULL, updated_at = ? WHERE call_session_id = ?",
                &[Value::Int(now_ms), session.id.as_str().into()],
            )?;
            for e in self.session_events(&session.id, &[st::FORWARDING, st::UNKNOWN, st::QUEUED])? {
                self.park_event(&e.event_id, now_ms)?;
            }
            self.record_decision(
                subject,
                routed.as_ref(),
                None,
                None,
                DecisionOutcome::Pending,
                now_ms,
            )?;
            let reason = if routed.is_some() {
                PendingReason::NoEligibleNode
            } else {
                PendingReason::NoPolicy
            };
            return Ok(ReportEffect::Parked(reason));
        };
        let epoch = self.next_epoch()?;
        self.set_owner(&session.id, &node, epoch, &origin, now_ms)?;
        self.record_decision(
            subject,
            routed.as_ref(),
            None,
            Some(epoch),
            DecisionOutcome::Reassigned,
            now_ms,
        )?;
        if budget_left_ms < MIN_REFORWARD_BUDGET_MS {
            return Ok(ReportEffect::Reassigned(None));
        }
        let session = self
            .load_session(&session.id)?
            .ok_or_else(|| EngineError::Corrupt("session vanished".into()))?;
        let event = self
            .load_event(&event.event_id)?
            .ok_or_else(|| EngineError::Corrupt("event vanished".into()))?;
        Ok(ReportEffect::Reassigned(Some(
            self.start_attempt(&event, &session, now_ms)?,
        )))
    }
}
