//! Delivery reports: the origin's answer to one forward attempt, bound to
//! the epoch and attempt it was sent under (SPEC §7.6–7.7).

use super::ingress::{delivered, Delivered};
use super::ownership::{Owned, Ownership, PendingReason, Placeable, Placed};
use super::rows::{event_state as st, EventRow};
use super::{CallShard, EngineError, Forward};
use crate::messages::ForwardResult;
use crate::outcome::{classify, truncate_body, OriginAnswer, OutcomeClass};
use crate::store::Store;
use serde::{Deserialize, Serialize};

/// The least forward budget worth an immediate send to a new owner.
pub const MIN_REFORWARD_BUDGET_MS: i64 = 250;
/// At most this many forwards for one webhook: the first owner, then new
/// owners after definite non-deliveries. Beyond it the alarm delivers.
pub const MAX_HOPS: u32 = 3;

/// The re-forward rule: after `hops` forwards of one webhook (the one just
/// reported included), a reassigned event is sent to its new owner at once
/// only while a hop is left and the carrier's remaining budget is worth it;
/// otherwise the carrier is answered 503 `reassigned` and the alarm
/// delivers. The engine applies it in [`CallShard::handle_report`](super::CallShard::handle_report); the
/// delivery driver ([`crate::delivery`]) bounds its hops by [`MAX_HOPS`].
pub fn may_reforward(hops: u32, budget_left_ms: i64) -> bool {
    hops < MAX_HOPS && budget_left_ms >= MIN_REFORWARD_BUDGET_MS
}

fn first_hop() -> u32 {
    1
}

impl Report {
    /// The report of `forward`'s outcome, as forward number `hop` of its
    /// webhook, with `budget_left_ms` of the carrier's budget still to use.
    pub fn of(forward: &Forward, hop: u32, answer: ReportedAnswer, budget_left_ms: i64) -> Self {
        Self {
            event_id: forward.event_id.clone(),
            epoch: forward.epoch,
            attempt: forward.attempt,
            hop,
            answer,
            budget_left_ms,
        }
    }
}

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
    /// Forwards of this webhook so far, the reported one included (1 for
    /// the first forward and for the alarm's).
    /// (Absent from a version 1 Worker's report, which bounds its own hops:
    /// then 1.)
    #[serde(default = "first_hop")]
    pub hop: u32,
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

impl<S: Store> CallShard<S> {
    /// Applies one attempt's outcome. Only a report for the session's
    /// current epoch changes anything; only the latest attempt's non-delivery
    /// counts.
    pub fn handle_report(&self, report: &Report, now_ms: i64) -> Result<ReportEffect, EngineError> {
        self.unit(|| {
            let q = self.q();
            let Some(found) = q.reported_event(&report.event_id, report.epoch)? else {
                return Ok(ReportEffect::Unknown);
            };
            let (event, current) = (found.event, found.current);
            if event.state == st::DELIVERED {
                return Ok(ReportEffect::Delivered(delivered(&event)));
            }
            let Some(session) = found.session else {
                return Ok(ReportEffect::Unknown);
            };
            let Some(node) = event.node.clone().filter(|_| current) else {
                return Ok(ReportEffect::Unknown);
            };
            let answer = report.answer.to_origin();
            let class = classify(&answer);
            if class.is_delivered() {
                let (status, body) = match &answer {
                    OriginAnswer::Http { status, body } => {
                        (Some(i64::from(*status)), Some(truncate_body(body)))
                    }
                    _ => (None, None),
                };
                q.mark_delivered(&event.event_id, status, body, now_ms)?;
                self.mark(&node, ForwardResult::Delivered, now_ms);
                return Ok(ReportEffect::Delivered(Delivered {
                    delivered_to: node,
                    epoch: report.epoch,
                    event_id: event.event_id,
                }));
            }
            if report.attempt != event.attempts || event.state != st::FORWARDING {
                // An older attempt, or one already settled: the newer state stands.
                return Ok(ReportEffect::Unknown);
            }
            self.mark(&node, ForwardResult::Failed, now_ms);
            let session = Ownership::of(session);
            if class == OutcomeClass::NotDelivered {
                if let Ownership::Owned(owned) = session {
                    if self.can_move(&owned, &event)? {
                        return self.reassign(owned, &event, report, now_ms);
                    }
                    self.mark_unknown(&event, Some(owned), now_ms)?;
                    return Ok(ReportEffect::Unknown);
                }
            }
            let owned = match session {
                Ownership::Owned(owned) => Some(owned),
                _ => None,
            };
            self.mark_unknown(&event, owned, now_ms)?;
            Ok(ReportEffect::Unknown)
        })
    }

    /// An owned (so unfenced) session may move only when it is inbound, no
    /// outcome at its current epoch was ever ambiguous, and no other attempt
    /// under it is in flight.
    fn can_move(&self, session: &Owned, event: &EventRow) -> Result<bool, EngineError> {
        if !session.may_move() {
            return Ok(false);
        }
        let row = session.row();
        Ok(!self
            .q()
            .other_attempt_in_doubt(&row.id, row.epoch, &event.event_id)?)
    }

    /// Marks an event's outcome unknown and schedules the alarm's next
    /// re-drive (after the lease, then 1, 2, 4, 8 s); the owned session (a
    /// fenced one never moves anyway) never moves at this epoch.
    pub(crate) fn mark_unknown(
        &self,
        event: &EventRow,
        session: Option<Owned>,
        now_ms: i64,
    ) -> Result<(), EngineError> {
        let backoff = &self.config.timing.redrive_backoff_ms;
        let next = backoff
            .get(event.redrives as usize)
            .map(|delay| event.lease_until_ms.unwrap_or(now_ms).max(now_ms) + delay);
        let q = self.q();
        q.mark_event_unknown(&event.event_id, next, now_ms)?;
        if let Some(owned) = session.filter(|o| Some(o.epoch()) == event.epoch) {
            owned.doubt(&q)?;
        }
        Ok(())
    }

    /// Moves a session whose owner definitely did not take `event` to the next
    /// eligible node with a new epoch, or parks it when there is none; the
    /// event goes to the new owner at once when [`may_reforward`] allows.
    fn reassign(
        &self,
        session: Owned,
        event: &EventRow,
        report: &Report,
        now_ms: i64,
    ) -> Result<ReportEffect, EngineError> {
        match self.place(
            Placeable::Moving(session),
            Some(&event.event_id),
            true,
            true,
            now_ms,
        )? {
            Placed::Parked(reason) => Ok(ReportEffect::Parked(reason)),
            Placed::Assigned(_) if !may_reforward(report.hop, report.budget_left_ms) => {
                Ok(ReportEffect::Reassigned(None))
            }
            Placed::Assigned(owned) => {
                let payload = self.q().payload(&event.event_id)?;
                Ok(ReportEffect::Reassigned(Some(self.start_attempt(
                    event,
                    payload,
                    owned.row(),
                    now_ms,
                )?)))
            }
        }
    }
}
