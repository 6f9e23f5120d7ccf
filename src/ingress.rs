//! Carrier ingress after verification: hand the webhook to the Dispatcher,
//! which decides, forwards, applies the outcome and answers, all in one
//! round trip (SPEC §7; `dispatcher::deliver`).
//!
//! The Dispatcher call runs under `ctx.waitUntil`, so a carrier that hangs
//! up mid-way cannot cancel the forward or its report; the request awaits
//! its result through a channel.
//!
//! # The answer deadline
//!
//! Every webhook is answered within the forward budget plus
//! [`ANSWER_MARGIN_MS`] of its arrival, inside the carrier's 2 s, whatever
//! the Dispatcher, the origin or a version 1 Dispatcher's report hops do:
//! past it the carrier gets 503 `dispatcher_unavailable` with `Retry-After:
//! 1` and retries. Nothing is lost or sent twice by answering early: the
//! work goes on under `waitUntil`, a forward already made is reported under
//! its epoch and lease, and the retry meets the event deduplicated
//! (`in_progress`, or the stored delivery); a webhook the Dispatcher had not
//! taken yet is shed by its admission or taken then, once (SPEC §7.3).
//!
//! A Dispatcher one protocol version behind answers with a forward for the
//! Worker to make, as before: the Worker then forwards and reports itself.
//! Its answer to the carrier does not wait for that report when the
//! origin's answer already decides it
//! ([`OutcomeClass::early_answer`](callfence_core::outcome::OutcomeClass::early_answer)).
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
use crate::reply::{Answer, ApiError};
use callfence_core::engine::{Delivered, Forward, Report, MAX_HOPS};
use callfence_core::outcome::EarlyAnswer;
use callfence_core::refusal::Refusal;
use callfence_core::telnyx::Envelope;
use futures_channel::oneshot;
use futures_util::future::{select, Either};
use serde_json::json;
use std::time::Duration;
use worker::{Context, Delay, Env, Request};

/// How long past the forward budget the Worker waits for the Dispatcher's
/// answer to a webhook (the report and the answer's way back).
pub const ANSWER_MARGIN_MS: i64 = 300;

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

/// A verified webhook.
pub struct Webhook {
    /// Its parsed envelope.
    pub envelope: Envelope,
    /// Its raw body.
    pub body: Vec<u8>,
    /// Its Telnyx headers.
    pub headers: Vec<(String, String)>,
    /// When the Worker received it.
    pub received_at_ms: i64,
}

/// What one hop ended with.
enum Hop {
    /// The carrier's answer is known (a report may go on in the background).
    Answered(Answer),
    /// The Dispatcher's reply (to the webhook, or to a report).
    Replied(Result<Reply<Next>, Unavailable>),
}

/// Handles a verified webhook, answering by its deadline (see the module's
/// "The answer deadline").
pub async fn handle(
    env: &Env,
    ctx: &Context,
    config: &IngressConfig,
    webhook: Webhook,
    log: &mut RequestLog,
) -> Result<Answer, ApiError> {
    let answer_by =
        webhook.received_at_ms + i64::from(config.forward_timeout_ms) + ANSWER_MARGIN_MS;
    let left_ms = (answer_by - now_ms()).max(1) as u64;
    let deadline = Delay::from(Duration::from_millis(left_ms));
    match select(
        Box::pin(decide(env, ctx, config, webhook, answer_by, log)),
        deadline,
    )
    .await
    {
        Either::Left((answer, _)) => answer,
        Either::Right(_) => Err(ApiError::dispatcher_unavailable()),
    }
}

/// The Dispatcher's decision on a webhook, and for a version 1 Dispatcher
/// the forwards and reports it asks of the Worker; the Dispatcher call itself
/// is given up at `answer_by` too, the deadline [`handle`] answers by.
async fn decide(
    env: &Env,
    ctx: &Context,
    config: &IngressConfig,
    webhook: Webhook,
    answer_by: i64,
    log: &mut RequestLog,
) -> Result<Answer, ApiError> {
    let budget = i64::from(config.forward_timeout_ms);
    let received_at = webhook.received_at_ms;
    let request = ProtocolRequest::Webhook {
        envelope: Some(webhook.envelope),
        headers: webhook.headers,
        received_at_ms: Some(received_at),
    };
    let deadline = (answer_by - now_ms()).max(1);
    let asked = now_ms();
    let (env_owned, body) = (env.clone(), webhook.body);
    let (mut outcome, _) = run_detached(ctx, async move {
        let reply = protocol::call_within(&env_owned, &request, &body, deadline).await;
        (Hop::Replied(reply), 0)
    })
    .await;
    log.waited(now_ms() - asked);
    for hop in 1..=MAX_HOPS {
        let forward = match outcome {
            Hop::Answered(answer) => return Ok(answer),
            Hop::Replied(Ok(Reply::Done(Next::Forward(f)))) => *f,
            Hop::Replied(Ok(Reply::Done(Next::Answer(answer)))) => return Ok(Answer::ok(answer)),
            Hop::Replied(Ok(Reply::Refused(refused))) => return Ok(Answer::refused(refused)),
            Hop::Replied(Err(_)) => return Err(ApiError::dispatcher_unavailable()),
        };
        // A version 1 Dispatcher: forward and report here.
        let left = budget - (now_ms() - received_at);
        let (next, waited) = forward_and_report(env, ctx, config, forward, (hop, left)).await;
        log.waited(waited);
        outcome = next;
    }
    // Still being moved after the hop limit: the alarm finishes the job.
    Ok(Answer::refusal(&Refusal::Reassigned))
}

/// Runs `work` under `waitUntil` (so the carrier hanging up cannot cancel
/// it) and awaits its result.
async fn run_detached(
    ctx: &Context,
    work: impl std::future::Future<Output = (Hop, i64)> + 'static,
) -> (Hop, i64) {
    let (tx, rx) = oneshot::channel();
    ctx.wait_until(async move {
        let _ = tx.send(work.await);
    });
    rx.await.unwrap_or_else(|_| {
        (
            Hop::Replied(Err(Unavailable("the answer was lost".into()))),
            0,
        )
    })
}

/// Forwards under `waitUntil` and reports the outcome (for a version 1
/// Dispatcher). Returns as soon as the carrier's answer is known, with the
/// milliseconds spent awaiting the origin (and the Dispatcher, when the
/// report had to be awaited).
async fn forward_and_report(
    env: &Env,
    ctx: &Context,
    config: &IngressConfig,
    forward: Forward,
    (hop, budget_ms): (u32, i64),
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
        let report = Report::of(&forward, hop, answer, (budget_ms - spent).min(total));
        let request = ProtocolRequest::Report { report };
        let tx = match early {
            EarlyAnswer::Delivered => {
                let delivered = Delivered {
                    delivered_to: forward.node.clone(),
                    epoch: forward.epoch,
                    event_id: forward.event_id.clone(),
                };
                let _ = tx.send((Hop::Answered(Answer::ok(json!(delivered))), origin_wait));
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
            let _ = tx.send((Hop::Replied(reply), waited));
        }
    });
    rx.await.unwrap_or_else(|_| {
        (
            Hop::Replied(Err(Unavailable("the report was lost".into()))),
            0,
        )
    })
}
