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
//! Worker to make, as before: the Worker then forwards and reports itself,
//! polling core's delivery driver (`callfence_core::delivery`) as the
//! Dispatcher does. Its answer to the carrier does not wait for that report when the
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
use crate::placing;
use crate::protocol::{self, Next, Reply, Request as ProtocolRequest, Unavailable};
use crate::reply::{Answer, ApiError};
use callfence_core::delivery::Delivery;
use callfence_core::engine::{Delivered, Forward, ReportEffect};
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
/// the forwards and reports it asks of the Worker (core's delivery driver,
/// [`Delivery`], decides each send's budget and whether to follow a move);
/// the Dispatcher call itself is given up at `answer_by` too, the deadline
/// [`handle`] answers by.
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
    let asked = now_ms();
    let env_owned = env.clone();
    let outcome = run_detached(ctx, async move {
        Hop::Replied(place(&env_owned, webhook, answer_by).await)
    })
    .await;
    log.waited(now_ms() - asked);
    let first = match outcome {
        Hop::Replied(Ok(Reply::Done(Next::Forward(f)))) => *f,
        other => return answer_of(other),
    };
    // A version 1 Dispatcher: core's delivery driver runs here, its reports
    // sent as messages; a forward in the reply to one is the call's move.
    let mut delivery = Delivery::webhook(first, received_at, budget);
    loop {
        let sent_at = now_ms();
        let Some(transmit) = delivery.poll_transmit(sent_at) else {
            // Still being moved after the hop limit: the alarm finishes the job.
            return Ok(Answer::refusal(&Refusal::Reassigned));
        };
        let (forward, budget_ms) = (transmit.forward.clone(), transmit.budget_ms);
        let sent = forward_and_report(env, ctx, config, forward, budget_ms, delivery).await;
        log.waited(sent.waited_ms);
        delivery = match (sent.hop, sent.delivery) {
            (Hop::Replied(Ok(Reply::Done(Next::Forward(next)))), Some(mut delivery)) => {
                delivery.handle_effect(ReportEffect::Reassigned(Some(*next)));
                delivery
            }
            (hop, _) => return answer_of(hop),
        };
    }
}

/// Sends a webhook to its session's holder (SPEC §16, [`placing`]); a
/// webhook that names no session goes to its leg's holder.
async fn place(env: &Env, webhook: Webhook, answer_by: i64) -> Result<Reply<Next>, Unavailable> {
    let session = webhook.envelope.session_hint().map(str::to_owned);
    let leg = webhook.envelope.call_control_id.clone();
    let request = ProtocolRequest::Webhook {
        envelope: Some(webhook.envelope),
        headers: webhook.headers,
        received_at_ms: Some(webhook.received_at_ms),
        sent_at_ms: None,
        map: None,
        absent: None,
        legs_asked: false,
    };
    let Some(session) = session else {
        return placing::to_leg_holder(env, leg, request, &webhook.body, answer_by).await;
    };
    let redirect_of = |next: &Next| match next {
        Next::Redirect(redirect) => Some(redirect.clone()),
        Next::Forward(_) | Next::Answer(_) => None,
    };
    placing::to_holder(
        env,
        &session,
        request,
        &webhook.body,
        answer_by,
        redirect_of,
    )
    .await
}

/// The carrier's answer from a hop that did not hand back a forward.
fn answer_of(hop: Hop) -> Result<Answer, ApiError> {
    match hop {
        Hop::Answered(answer) => Ok(answer),
        Hop::Replied(Ok(Reply::Done(Next::Answer(answer)))) => Ok(Answer::ok(answer)),
        Hop::Replied(Ok(Reply::Refused(refused))) => Ok(Answer::refused(refused)),
        // A forward with no delivery to follow it: not a version 1 reply; a
        // redirect is followed before it gets here.
        Hop::Replied(Ok(Reply::Done(Next::Forward(_) | Next::Redirect(_))))
        | Hop::Replied(Err(_)) => Err(ApiError::dispatcher_unavailable()),
    }
}

/// Runs `work` under `waitUntil` (so the carrier hanging up cannot cancel
/// it) and awaits its result.
async fn run_detached(
    ctx: &Context,
    work: impl std::future::Future<Output = Hop> + 'static,
) -> Hop {
    let (tx, rx) = oneshot::channel();
    ctx.wait_until(async move {
        let _ = tx.send(work.await);
    });
    rx.await
        .unwrap_or_else(|_| Hop::Replied(Err(Unavailable("the answer was lost".into()))))
}

/// What a forward made by the Worker ended with.
struct Sent {
    /// The carrier's answer, or the Dispatcher's reply to the report.
    hop: Hop,
    /// Milliseconds spent awaiting the origin (and the Dispatcher, when the
    /// report had to be awaited).
    waited_ms: i64,
    /// The delivery, back when its report's reply was awaited (it may name
    /// the call's next owner).
    delivery: Option<Delivery>,
}

/// Sends `forward` (the transmit `delivery` polled) under `waitUntil` and
/// reports the outcome (for a version 1 Dispatcher). Returns as soon as the
/// carrier's answer is known.
async fn forward_and_report(
    env: &Env,
    ctx: &Context,
    config: &IngressConfig,
    forward: Forward,
    budget_ms: i64,
    mut delivery: Delivery,
) -> Sent {
    let (tx, rx) = oneshot::channel();
    let env = env.clone();
    let edge = config.edge.clone();
    ctx.wait_until(async move {
        let sent_at = now_ms();
        let (answer, origin_wait) = forward::send_timed(&forward, &edge, budget_ms, sent_at).await;
        let early = answer.class().early_answer();
        let Some(report) = delivery.handle_answer(answer, now_ms()) else {
            return;
        };
        let request = ProtocolRequest::Report { report };
        let answered = |answer| Sent {
            hop: Hop::Answered(answer),
            waited_ms: origin_wait,
            delivery: None,
        };
        let tx = match early {
            EarlyAnswer::Delivered => {
                let delivered = Delivered {
                    delivered_to: forward.node.clone(),
                    epoch: forward.epoch,
                    event_id: forward.event_id.clone(),
                };
                let _ = tx.send(answered(Answer::ok(json!(delivered))));
                None
            }
            EarlyAnswer::Unknown => {
                let _ = tx.send(answered(Answer::refusal(&Refusal::DeliveryUnknown)));
                None
            }
            EarlyAnswer::AwaitReport => Some(tx),
        };
        let reporting = now_ms();
        let reply = protocol::call::<Next>(&env, &request, b"").await;
        if let Some(tx) = tx {
            let _ = tx.send(Sent {
                hop: Hop::Replied(reply),
                waited_ms: origin_wait + (now_ms() - reporting),
                delivery: Some(delivery),
            });
        }
    });
    rx.await.unwrap_or_else(|_| Sent {
        hop: Hop::Replied(Err(Unavailable("the report was lost".into()))),
        waited_ms: 0,
        delivery: None,
    })
}
