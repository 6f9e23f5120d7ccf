//! Carrier ingress after verification: ask the Dispatcher, forward within
//! the budget, report the outcome, answer Telnyx (SPEC §7).
//!
//! The forward and its report run under `ctx.waitUntil`, so a carrier that
//! hangs up mid-way cannot cancel them; the request awaits their result
//! through a channel. The carrier's answer does not wait for the report
//! when the origin's answer already decides it
//! ([`OutcomeClass::early_answer`](callfence_core::outcome::OutcomeClass::early_answer)):
//! a delivery is answered 200 and an ambiguous outcome 503
//! `delivery_unknown` at once, while the report follows in the background.
//! Only a definite non-delivery waits for the Dispatcher, which may hand
//! over a new owner to forward to at once while the budget allows.
//!
//! The request's log line gets `wait_ms`: the time spent awaiting the
//! Dispatcher and the origin, so that `ms - wait_ms` is the time spent in
//! the Worker's own code (see
//! [`RequestLog::waited`](crate::log::RequestLog::waited)).

use crate::clock::now_ms;
use crate::config::Ingress as IngressConfig;
use crate::forward::{self, CARRIED_HEADERS};
use crate::log::RequestLog;
use crate::protocol::{self, Next, Reply, Request as ProtocolRequest, Unavailable};
use crate::refusal::Refusal;
use crate::reply::{Answer, ApiError};
use callfence_core::engine::{Forward, Report};
use callfence_core::outcome::EarlyAnswer;
use callfence_core::telnyx::Envelope;
use futures_channel::oneshot;
use serde_json::json;
use std::rc::Rc;
use worker::{Context, Env, Request};

/// At most this many forwards for one webhook (first owner, then new owners
/// after definite non-deliveries).
const MAX_HOPS: usize = 3;

/// The Telnyx headers stored with the event and carried to the origin.
pub fn carried_headers(req: &Request) -> Vec<(String, String)> {
    CARRIED_HEADERS
        .iter()
        .filter_map(|name| {
            req.headers()
                .get(name)
                .ok()
                .flatten()
                .map(|value| ((*name).to_owned(), value))
        })
        .collect()
}

/// What one hop ended with.
enum Hop {
    /// The carrier's answer is known (the report goes on in the background).
    Answered(Answer),
    /// The Dispatcher's reply to the report.
    Reported(Result<Reply<Next>, Unavailable>),
}

/// Handles a verified webhook: its parsed `envelope` and raw `body`.
pub async fn handle(
    env: &Env,
    ctx: &Context,
    config: &IngressConfig,
    envelope: Envelope,
    body: Vec<u8>,
    headers: Vec<(String, String)>,
    log: &mut RequestLog,
) -> Result<Answer, ApiError> {
    let started = now_ms();
    let budget = i64::from(config.forward_timeout_ms);
    let body: Rc<[u8]> = body.into();
    let request = ProtocolRequest::Webhook {
        envelope: Some(envelope),
        headers,
        sent_at_ms: Some(now_ms()),
    };
    let asked = now_ms();
    let mut reply = protocol::call::<Next>(env, &request, &body).await;
    log.waited(now_ms() - asked);
    for _ in 0..MAX_HOPS {
        let mut forward = match reply {
            Ok(Reply::Done(Next::Forward(f))) => *f,
            Ok(Reply::Done(Next::Answer(answer))) => return Ok(Answer::ok(answer)),
            Ok(Reply::Refused(refused)) => return Ok(Answer::refused(refused)),
            Err(_) => return Err(ApiError::dispatcher_unavailable()),
        };
        if forward.body.is_empty() {
            // The Dispatcher elides the body when it is the one we sent.
            forward.body = String::from_utf8_lossy(&body).into_owned();
        }
        let left = budget - (now_ms() - started);
        let (hop, waited) = forward_and_report(env, ctx, config, forward, left).await;
        log.waited(waited);
        match hop {
            Hop::Answered(answer) => return Ok(answer),
            Hop::Reported(next) => reply = next,
        }
    }
    // Still being moved after MAX_HOPS: the alarm finishes the job.
    Ok(Answer::refusal(&Refusal::Reassigned))
}

/// Forwards under `waitUntil` and reports the outcome. Returns as soon as
/// the carrier's answer is known, with the milliseconds spent awaiting the
/// origin (and the Dispatcher, when the report had to be awaited).
async fn forward_and_report(
    env: &Env,
    ctx: &Context,
    config: &IngressConfig,
    forward: Forward,
    budget_ms: i64,
) -> (Hop, i64) {
    let (tx, rx) = oneshot::channel();
    let env = env.clone();
    let edge = config.edge.clone();
    let total = i64::from(config.forward_timeout_ms);
    ctx.wait_until(async move {
        let sent_at = now_ms();
        let (answer, origin_wait) = forward::send_timed(&forward, &edge, budget_ms, sent_at).await;
        let spent = now_ms() - sent_at;
        let early = answer.class().early_answer();
        let report = Report {
            event_id: forward.event_id.clone(),
            epoch: forward.epoch,
            attempt: forward.attempt,
            answer,
            budget_left_ms: (budget_ms - spent).min(total),
        };
        let request = ProtocolRequest::Report { report };
        let tx = match early {
            EarlyAnswer::Delivered => {
                let body = json!({"delivered_to": forward.node, "epoch": forward.epoch, "event_id": forward.event_id});
                let _ = tx.send((Hop::Answered(Answer::ok(body)), origin_wait));
                None
            }
            EarlyAnswer::Unknown => {
                let answer = Answer::refusal(&Refusal::DeliveryUnknown);
                let _ = tx.send((Hop::Answered(answer), origin_wait));
                None
            }
            EarlyAnswer::AwaitReport => Some(tx),
        };
        let reporting = now_ms();
        let reply = protocol::call::<Next>(&env, &request, b"").await;
        if let Some(tx) = tx {
            let waited = origin_wait + (now_ms() - reporting);
            let _ = tx.send((Hop::Reported(reply), waited));
        }
    });
    rx.await.unwrap_or_else(|_| {
        (
            Hop::Reported(Err(Unavailable("the report was lost".into()))),
            0,
        )
    })
}
