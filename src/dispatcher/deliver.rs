//! The Dispatcher forwarding an event itself: the shell of core's delivery
//! driver ([`Delivery`]), which says what to send where with which budget
//! and what comes next; here each send is made and each answer reported to
//! the engine at once.
//!
//! A version 2 Worker hands the Dispatcher the whole webhook, and the
//! Dispatcher decides, forwards, applies the outcome and answers in that one
//! request: one Worker ↔ Dispatcher round trip per webhook, no report
//! message. While it awaits the origin the Durable Object serves other
//! requests (an outgoing fetch does not close its input gate), and the
//! decision and the report are each one atomic unit, as when the Worker
//! reported. The alarm's re-drives are the same driver
//! ([`Delivery::redrive`]).

use super::counting;
use super::ops::{encode, report_way};
use crate::clock::now_ms;
use crate::config::EdgeKey;
use crate::forward;
use callfence_core::delivery::Delivery;
use callfence_core::engine::{Engine, EngineError, Forward};
use callfence_core::refusal::Refusal;
use callfence_core::store::Store;

/// Drives `delivery` until it has nothing more to send: each transmit sent
/// to its origin, each answer reported to the engine. Returns the
/// milliseconds spent awaiting origins.
pub async fn drive<S: Store>(
    engine: &Engine<S>,
    edge: &EdgeKey,
    delivery: &mut Delivery,
) -> Result<i64, EngineError> {
    let mut waited = 0;
    loop {
        let sent_at = now_ms();
        let Some(transmit) = delivery.poll_transmit(sent_at) else {
            return Ok(waited);
        };
        let node = transmit.forward.node.clone();
        let (answer, origin_ms) =
            forward::send_timed(transmit.forward, edge, transmit.budget_ms, sent_at).await;
        waited += origin_ms;
        let now = now_ms();
        let class = answer.class();
        if let Some(report) = delivery.handle_answer(answer, now) {
            delivery.handle_effect(engine.handle_report(&report, now)?);
            let finished = delivery.poll_finish();
            counting::report(
                engine.metrics(),
                &node,
                class,
                finished,
                delivery.is_webhook(),
            );
        }
    }
}

/// Delivers a webhook's event from `first` on, within `forward_timeout_ms`
/// of `received_at_ms` (when the Worker received it). Returns the encoded
/// answer for the Worker and the milliseconds spent awaiting origins.
pub async fn deliver<S: Store>(
    engine: &Engine<S>,
    edge: &EdgeKey,
    forward_timeout_ms: i64,
    first: Forward,
    received_at_ms: i64,
) -> Result<(String, i64), EngineError> {
    let mut delivery = Delivery::webhook(first, received_at_ms, forward_timeout_ms);
    let waited = drive(engine, edge, &mut delivery).await?;
    let way = match delivery.poll_finish() {
        Some(effect) => report_way(effect.clone()),
        None => Err(Refusal::DeliveryUnknown),
    };
    Ok((encode(way), waited))
}
