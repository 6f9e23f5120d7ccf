//! Carrier ingress after verification: ask the Dispatcher, forward within
//! the budget, report the outcome, answer Telnyx (SPEC §7).
//!
//! The forward and its report run under `ctx.waitUntil`, so a carrier that
//! hangs up mid-way cannot cancel them; the request awaits their result
//! through a channel. A reassigned call is forwarded to its new owner at
//! once while the budget allows.
//!
//! The request's log line gets `wait_ms`: the time spent awaiting the
//! Dispatcher (the webhook and each report) and the origin, so that
//! `ms - wait_ms` is the time spent in the Worker's own code (see
//! [`RequestLog::waited`](crate::log::RequestLog::waited)).

use crate::clock::now_ms;
use crate::config::Ingress as IngressConfig;
use crate::forward::{self, CARRIED_HEADERS};
use crate::log::RequestLog;
use crate::protocol::{self, Op, Reply, Unavailable};
use crate::reply::{relay, Answer, ApiError};
use callfence_core::engine::{Forward, Report, MAX_HOPS};
use futures_channel::oneshot;
use serde_json::{json, Map, Value};
use worker::{Context, Env, Request};

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

/// Handles a verified webhook `body` (valid JSON, so valid UTF-8).
pub async fn handle(
    env: &Env,
    ctx: &Context,
    config: &IngressConfig,
    body: Vec<u8>,
    headers: Vec<(String, String)>,
    log: &mut RequestLog,
) -> Result<Answer, ApiError> {
    let started = now_ms();
    let budget = i64::from(config.forward_timeout_ms);
    let text = String::from_utf8(body).map_err(|_| ApiError::new(400, "bad_envelope"))?;
    let mut args = Map::new();
    args.insert("body".into(), Value::String(text));
    args.insert("headers".into(), json!(headers));
    let asked = now_ms();
    let mut reply = protocol::call(env, Op::Webhook, args).await;
    log.waited(now_ms() - asked);
    // The engine applies the re-forward rule (core `may_reforward`): it
    // hands back no forward beyond MAX_HOPS, which only bounds this loop.
    for hop in 1..=MAX_HOPS {
        let forward = match &reply {
            Ok(Reply::Done(result)) => match result.get("forward") {
                Some(f) => serde_json::from_value::<Forward>(f.clone())
                    .map_err(|_| ApiError::dispatcher_unavailable())?,
                None => {
                    return Ok(Answer::ok(
                        result.get("answer").cloned().unwrap_or(Value::Null),
                    ))
                }
            },
            _ => return relay(reply),
        };
        let left = budget - (now_ms() - started);
        let (next, waited) = forward_and_report(env, ctx, config, forward, left, hop).await;
        log.waited(waited);
        reply = next;
    }
    // Still being moved after MAX_HOPS: the alarm finishes the job.
    Err(ApiError::new(503, "reassigned"))
}

/// Forwards under `waitUntil` and reports the outcome; returns the
/// Dispatcher's reply to the report, and the milliseconds spent awaiting the
/// origin and the Dispatcher.
async fn forward_and_report(
    env: &Env,
    ctx: &Context,
    config: &IngressConfig,
    forward: Forward,
    budget_ms: i64,
    hop: u32,
) -> (Result<Reply, Unavailable>, i64) {
    let (tx, rx) = oneshot::channel();
    let env = env.clone();
    let edge = config.edge.clone();
    let total = i64::from(config.forward_timeout_ms);
    ctx.wait_until(async move {
        let sent_at = now_ms();
        let (answer, origin_wait) = forward::send_timed(&forward, &edge, budget_ms, sent_at).await;
        let spent = now_ms() - sent_at;
        let report = Report {
            event_id: forward.event_id,
            epoch: forward.epoch,
            attempt: forward.attempt,
            answer,
            budget_left_ms: (budget_ms - spent).min(total),
            hop,
        };
        let mut args = Map::new();
        args.insert("report".into(), json!(report));
        let reporting = now_ms();
        let reply = protocol::call(&env, Op::Report, args).await;
        let waited = origin_wait + (now_ms() - reporting);
        let _ = tx.send((reply, waited));
    });
    rx.await
        .unwrap_or_else(|_| (Err(Unavailable("the report was lost".into())), 0))
}
