//! The Dispatcher forwarding an event itself: one send to the owner's
//! origin, its report applied at once, and, for a webhook, the hops to new
//! owners after definite non-deliveries while the carrier's budget lasts.
//!
//! A version 2 Worker hands the Dispatcher the whole webhook, and the
//! Dispatcher decides, forwards, applies the outcome and answers in that one
//! request: one Worker ↔ Dispatcher round trip per webhook, no report
//! message. While it awaits the origin the Durable Object serves other
//! requests (an outgoing fetch does not close its input gate), and the
//! decision and the report are each one atomic unit, as when the Worker
//! reported. The alarm's re-drives use the same send.

use super::counting;
use super::ops::{encode, report_way};
use crate::clock::now_ms;
use crate::config::EdgeKey;
use crate::forward;
use crate::protocol::Next;
use crate::refusal::Refusal;
use callfence_core::engine::{Engine, EngineError, Forward, Report, ReportEffect, MAX_HOPS};
use callfence_core::store::Store;

/// Sends `forward` within `budget_ms` and applies its report as forward
/// number `hop` of its webhook. With `reforward`, the budget left may move
/// the call to a new owner at once (a webhook; core's `may_reforward`
/// decides); without, a move is left to the alarm. Returns the effect and
/// the milliseconds spent awaiting the origin.
pub async fn send_and_report<S: Store>(
    engine: &Engine<S>,
    edge: &EdgeKey,
    forward: &Forward,
    (hop, budget_ms): (u32, i64),
    reforward: bool,
) -> Result<(ReportEffect, i64), EngineError> {
    let sent_at = now_ms();
    let (answer, waited) = forward::send_timed(forward, edge, budget_ms, sent_at).await;
    let now = now_ms();
    let budget_left_ms = if reforward {
        (budget_ms - (now - sent_at)).max(0)
    } else {
        0
    };
    let class = answer.class();
    let report = Report::of(forward, hop, answer, budget_left_ms);
    let effect = engine.handle_report(&report, now)?;
    counting::report(engine.metrics(), &forward.node, class, &effect, reforward);
    Ok((effect, waited))
}

/// Delivers a webhook's event: forwards, reports, and follows the call to
/// its new owners, within `forward_timeout_ms` of `received_at_ms` (when the
/// Worker received it). Returns the encoded answer for the Worker and the
/// milliseconds spent awaiting origins.
pub async fn deliver<S: Store>(
    engine: &Engine<S>,
    edge: &EdgeKey,
    forward_timeout_ms: i64,
    first: Forward,
    received_at_ms: i64,
) -> Result<(String, i64), EngineError> {
    let mut forward = first;
    let mut waited = 0;
    for hop in 1..=MAX_HOPS {
        let elapsed = (now_ms() - received_at_ms).clamp(0, forward_timeout_ms);
        let budget = (forward_timeout_ms - elapsed).max(1);
        let (effect, origin_ms) =
            send_and_report(engine, edge, &forward, (hop, budget), true).await?;
        waited += origin_ms;
        match report_way(effect) {
            Ok(Next::Forward(next)) => forward = *next,
            way => return Ok((encode(way), waited)),
        }
    }
    Ok((Refusal::Reassigned.encode(), waited))
}
