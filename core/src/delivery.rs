//! The delivery driver: the one loop that sends an event to its owner,
//! takes the origin's answer and says what comes next, in the spirit of
//! quinn-proto's `poll_transmit` / `handle_*`.
//!
//! The engine decides *who* gets an event ([`Forward`]) and what an outcome
//! does to the call ([`Engine::handle_report`](crate::engine::Engine::handle_report));
//! a [`Delivery`] decides everything about the sending itself: the budget of
//! each send, the hop the report carries, the carrier's budget left after
//! it, whether the call is followed to a new owner at once or left to the
//! alarm, and when to give up. Every shell that delivers drives it the same
//! way, and none of them decides a hop, a retry or a budget:
//!
//! ```text
//! let mut delivery = Delivery::webhook(first, received_at_ms, forward_timeout_ms);
//! while let Some(transmit) = delivery.poll_transmit(now) {
//!     let answer = send(transmit.forward, transmit.budget_ms).await;   // the shell's I/O
//!     let report = delivery.handle_answer(answer, now);
//!     delivery.handle_effect(engine.handle_report(&report, now)?);    // or the Dispatcher's reply
//! }
//! let effect = delivery.poll_finish();  // what the carrier is answered
//! ```
//!
//! The shells: the Dispatcher delivering a webhook in the request that
//! brought it and its alarm re-driving (`src/dispatcher/deliver.rs`), the
//! Worker when a version 1 Dispatcher asks it to forward (`src/ingress.rs`),
//! and the simulation (`tests/sim`), which delays, reorders and loses the
//! reports between [`Delivery::handle_answer`] and [`Delivery::handle_effect`].
//!
//! # Invariants
//!
//! - Each [`Forward`] (an event's epoch and attempt) is transmitted at most
//!   once: an ambiguous answer (a timeout, a 5xx) is reported, never sent
//!   again; only the engine starts another attempt.
//! - A reassigned event is sent to its new owner only while a hop is left
//!   ([`MAX_HOPS`]); the engine's [`may_reforward`](crate::engine::may_reforward)
//!   has already weighed the budget the report carried.
//! - An alarm's re-drive has the whole forward budget and reports none of it
//!   left, so its moves are the alarm's next work.

use crate::engine::{Forward, Report, ReportEffect, ReportedAnswer, MAX_HOPS};

/// What the shell must send now: `forward` to its origin, given up after
/// `budget_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit<'a> {
    /// The event, its owner, origin, epoch and attempt.
    pub forward: &'a Forward,
    /// How long the origin may take.
    pub budget_ms: i64,
}

/// Where a delivery stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// A forward to send at the next [`Delivery::poll_transmit`].
    Ready(Forward),
    /// Sent at `sent_at_ms` with `budget_ms`; awaiting the origin's answer.
    InFlight {
        forward: Forward,
        budget_ms: i64,
        sent_at_ms: i64,
    },
    /// Reported; awaiting what the report did.
    Reported,
    /// Nothing more to send: what the last report did.
    Finished(ReportEffect),
}

/// One event's delivery: see the module documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The forward budget (`FORWARD_TIMEOUT_MS`).
    forward_timeout_ms: i64,
    /// When the carrier's budget started (the webhook's receipt); `None`
    /// for an alarm's re-drive, which never follows a move at once.
    received_at_ms: Option<i64>,
    /// Forwards of this delivery so far, the one in flight included.
    hop: u32,
    state: State,
}

impl Delivery {
    /// A webhook's delivery: `first` is sent within what is left of
    /// `forward_timeout_ms` since `received_at_ms`, and a call that moves
    /// after a definite non-delivery is followed while hops and budget last.
    pub fn webhook(first: Forward, received_at_ms: i64, forward_timeout_ms: i64) -> Self {
        Self {
            forward_timeout_ms,
            received_at_ms: Some(received_at_ms),
            hop: 0,
            state: State::Ready(first),
        }
    }

    /// An alarm's re-drive of `forward`: one send with the whole budget; a
    /// move it causes is left to the alarm.
    pub fn redrive(forward: Forward, forward_timeout_ms: i64) -> Self {
        Self {
            forward_timeout_ms,
            received_at_ms: None,
            hop: 0,
            state: State::Ready(forward),
        }
    }

    /// What to send now, if anything: each forward exactly once.
    pub fn poll_transmit(&mut self, now_ms: i64) -> Option<Transmit<'_>> {
        let forward = match std::mem::replace(&mut self.state, State::Reported) {
            State::Ready(forward) => forward,
            other => {
                self.state = other;
                return None;
            }
        };
        let total = self.forward_timeout_ms;
        let budget_ms = match self.received_at_ms {
            Some(received) => (total - (now_ms - received).clamp(0, total)).max(1),
            None => total,
        };
        self.hop += 1;
        self.state = State::InFlight {
            forward,
            budget_ms,
            sent_at_ms: now_ms,
        };
        match &self.state {
            State::InFlight {
                forward, budget_ms, ..
            } => Some(Transmit {
                forward,
                budget_ms: *budget_ms,
            }),
            _ => None,
        }
    }

    /// The origin's answer to the forward in flight: the report to apply
    /// (the engine's [`handle_report`](crate::engine::Engine::handle_report),
    /// or the Dispatcher's `report` message). `None` when nothing is in
    /// flight (an answer already taken changes nothing).
    pub fn handle_answer(&mut self, answer: ReportedAnswer, now_ms: i64) -> Option<Report> {
        let (forward, budget_ms, sent_at_ms) =
            match std::mem::replace(&mut self.state, State::Reported) {
                State::InFlight {
                    forward,
                    budget_ms,
                    sent_at_ms,
                } => (forward, budget_ms, sent_at_ms),
                other => {
                    self.state = other;
                    return None;
                }
            };
        let budget_left_ms = match self.received_at_ms {
            Some(_) => (budget_ms - (now_ms - sent_at_ms)).max(0),
            None => 0,
        };
        Some(Report::of(&forward, self.hop, answer, budget_left_ms))
    }

    /// What the report did. A move with a forward is sent at the next
    /// [`Delivery::poll_transmit`] while a hop is left; past the last hop it
    /// is the alarm's (`Reassigned(None)`). Anything else finishes the
    /// delivery. Ignored unless a report is awaited.
    pub fn handle_effect(&mut self, effect: ReportEffect) {
        if self.state != State::Reported {
            return;
        }
        self.state = match effect {
            ReportEffect::Reassigned(Some(next)) if self.hop < MAX_HOPS => State::Ready(next),
            ReportEffect::Reassigned(Some(_)) => State::Finished(ReportEffect::Reassigned(None)),
            effect => State::Finished(effect),
        };
    }

    /// What the delivery ended with, once it has: the effect the carrier's
    /// answer is made of.
    pub fn poll_finish(&self) -> Option<&ReportEffect> {
        match &self.state {
            State::Finished(effect) => Some(effect),
            _ => None,
        }
    }

    /// Whether this is a webhook's delivery (which follows moves and ends
    /// the carrier's request), not an alarm's re-drive.
    pub fn is_webhook(&self) -> bool {
        self.received_at_ms.is_some()
    }

    /// Forwards transmitted so far.
    pub fn hops(&self) -> u32 {
        self.hop
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Delivered, PendingReason};

    fn forward(node: &str, epoch: u64) -> Forward {
        Forward {
            event_id: "e1".into(),
            call_session_id: "s1".into(),
            call_control_id: None,
            node: node.into(),
            origin_url: format!("https://{node}.example/t"),
            epoch,
            attempt: 1,
            body: "{}".into(),
            headers: vec![],
        }
    }

    fn not_admitted() -> ReportedAnswer {
        ReportedAnswer::Http {
            status: 503,
            body: r#"{"callfence":"not_admitted"}"#.into(),
        }
    }

    #[test]
    fn a_webhook_follows_its_call_while_hops_last_then_leaves_it_to_the_alarm() {
        let mut d = Delivery::webhook(forward("M1", 1), 1_000, 1_500);
        let t = d.poll_transmit(1_100).unwrap();
        assert_eq!((t.forward.node.as_str(), t.budget_ms), ("M1", 1_400));
        assert!(d.poll_transmit(1_100).is_none(), "sent once");
        let report = d.handle_answer(not_admitted(), 1_300).unwrap();
        assert_eq!((report.hop, report.budget_left_ms), (1, 1_200));
        d.handle_effect(ReportEffect::Reassigned(Some(forward("M2", 2))));
        let t = d.poll_transmit(1_300).unwrap();
        assert_eq!((t.forward.node.as_str(), t.budget_ms), ("M2", 1_200));
        d.handle_answer(not_admitted(), 1_400).unwrap();
        d.handle_effect(ReportEffect::Reassigned(Some(forward("M3", 3))));
        assert!(d.poll_transmit(1_400).is_some());
        let report = d.handle_answer(not_admitted(), 1_450).unwrap();
        assert_eq!(report.hop, MAX_HOPS);
        d.handle_effect(ReportEffect::Reassigned(Some(forward("M1", 4))));
        assert!(d.poll_transmit(1_450).is_none(), "no hop left");
        assert_eq!(d.poll_finish(), Some(&ReportEffect::Reassigned(None)));
        assert_eq!(d.hops(), MAX_HOPS);
    }

    #[test]
    fn an_ambiguous_answer_is_reported_and_never_sent_again() {
        let mut d = Delivery::webhook(forward("M1", 1), 0, 1_500);
        d.poll_transmit(0).unwrap();
        let report = d.handle_answer(ReportedAnswer::Timeout, 1_500).unwrap();
        assert_eq!(report.budget_left_ms, 0);
        assert!(d.poll_transmit(1_500).is_none());
        d.handle_effect(ReportEffect::Unknown);
        assert!(d.poll_transmit(1_500).is_none());
        assert_eq!(d.poll_finish(), Some(&ReportEffect::Unknown));
        // A second answer or effect changes nothing.
        assert!(d.handle_answer(ReportedAnswer::Timeout, 1_600).is_none());
        d.handle_effect(ReportEffect::Reassigned(Some(forward("M2", 2))));
        assert_eq!(d.poll_finish(), Some(&ReportEffect::Unknown));
    }

    #[test]
    fn the_budget_is_what_is_left_of_the_carriers_and_never_below_one_ms() {
        let mut late = Delivery::webhook(forward("M1", 1), 0, 1_500);
        assert_eq!(late.poll_transmit(9_000).unwrap().budget_ms, 1);
        let mut early = Delivery::webhook(forward("M1", 1), 5_000, 1_500);
        assert_eq!(early.poll_transmit(4_000).unwrap().budget_ms, 1_500);
    }

    #[test]
    fn a_redrive_has_the_whole_budget_and_leaves_a_move_to_the_alarm() {
        let mut d = Delivery::redrive(forward("M1", 1), 1_500);
        assert_eq!(d.poll_transmit(99_000).unwrap().budget_ms, 1_500);
        let report = d.handle_answer(not_admitted(), 99_010).unwrap();
        assert_eq!((report.hop, report.budget_left_ms), (1, 0));
        d.handle_effect(ReportEffect::Parked(PendingReason::NoEligibleNode));
        assert!(d.poll_transmit(99_010).is_none());
        assert_eq!(
            d.poll_finish(),
            Some(&ReportEffect::Parked(PendingReason::NoEligibleNode))
        );
    }

    #[test]
    fn a_delivered_report_finishes() {
        let mut d = Delivery::webhook(forward("M1", 1), 0, 1_500);
        d.poll_transmit(0).unwrap();
        assert!(d.poll_finish().is_none());
        d.handle_answer(
            ReportedAnswer::Http {
                status: 200,
                body: "{}".into(),
            },
            10,
        )
        .unwrap();
        let delivered = Delivered {
            delivered_to: "M1".into(),
            epoch: 1,
            event_id: "e1".into(),
        };
        d.handle_effect(ReportEffect::Delivered(delivered.clone()));
        assert_eq!(d.poll_finish(), Some(&ReportEffect::Delivered(delivered)));
    }
}
