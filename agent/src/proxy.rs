//! The origin proxy: `POST /callfence/telnyx`, the only door through which a
//! webhook reaches the voice app, and `GET /callfence/health` for the tunnel
//! probe.
//!
//! For each webhook, in order:
//! 1. Every inbound `Callfence-*` header is dropped; only `content-type` and
//!    `telnyx-*` headers are passed on.
//! 2. The `Callfence-Assertion` is verified against the pinned edge keys
//!    (kid, signature, not expired with `timing.assertion_skew_s` of skew,
//!    `node` is this node, `body_sha256` matches the raw body).
//! 3. The Telnyx signature is verified on the raw body.
//!
//!    A failure of 2 or 3 answers 401 `{"callfence":"not_admitted"}`.
//! 4. A completed event gets its recorded answer; a duplicate of an event
//!    being delivered waits for that delivery (503 `in_progress` if it
//!    outlasts `timing.duplicate_wait_ms`).
//! 5. A new event of a session this node never admitted is refused with 503
//!    `{"callfence":"not_admitted"}` unless the mode is `active`.
//! 6. The event is written `received`, then delivered to the app with the
//!    raw body, the Telnyx headers, `Callfence-Epoch` and
//!    `Callfence-Call-Session`; an answer the edge classifies as delivered
//!    (`callfence_core::outcome`: a 2xx, or a 4xx other than 408/429 that is
//!    not `{"callfence":"not_admitted"}`) is recorded `completed` and
//!    returned to the edge. Anything else (3xx, 5xx, 408, 429, timeout)
//!    leaves the event `received` and answers 502/504, which the edge treats
//!    as an unknown outcome and re-drives.
//!
//! The app is called in a task of its own, so an edge that gives up early
//! does not cut a delivery in half; the result is recorded for the retry.
//!
//! # The L5 probe (SPEC §14)
//!
//! A body whose `data.event_type` is `callfence.probe` is only ever
//! admitted as a probe: it needs a probe assertion
//! (`ProbeClaims`) naming this node, whose `event_id` is the
//! body's nonce, and no Telnyx signature. A verified probe is handed to the
//! app at once with `Callfence-Probe: <nonce>` (whatever the mode: it is the
//! one forward a drained or shadow node admits) and the app's answer is
//! returned as it is. It never touches the ledger. Any other body needs a
//! webhook assertion (`Claims`), never granted to a probe.
//!
//! Every decision above is a plain function of [`crate::forward`]; this
//! module only translates HTTP, the ledger and the app to and from them.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use callfence_core::probe;
use serde_json::json;
use tokio::sync::watch;

use crate::clock::now_ms;
use crate::context::Agent;
use crate::forward::{self, Admission, Delivery, OnEntry};
use crate::ledger::Pending;
use crate::mode;
use crate::net::{describe, read_limited};

/// Largest webhook accepted (the edge's own limit).
pub const MAX_WEBHOOK_BYTES: usize = 64 * 1024;
/// Largest app answer recorded and returned.
pub const MAX_ANSWER_BYTES: usize = 16 * 1024;
/// Deliveries after which upkeep stops re-delivering a `received` event.
pub const MAX_UPKEEP_ATTEMPTS: u32 = 5;

fn callfence(status: StatusCode, code: &str) -> Response {
    (status, Json(json!({"callfence": code}))).into_response()
}

impl IntoResponse for Delivery {
    fn into_response(self) -> Response {
        match self {
            Delivery::Answered(a) => {
                let status = StatusCode::from_u16(a.status).unwrap_or(StatusCode::OK);
                let mut resp = (status, a.body).into_response();
                if let Some(ct) = a.content_type.and_then(|c| HeaderValue::from_str(&c).ok()) {
                    resp.headers_mut().insert("content-type", ct);
                }
                resp
            }
            Delivery::NotAdmitted => callfence(StatusCode::SERVICE_UNAVAILABLE, "not_admitted"),
            Delivery::AppFailed { app_status, reason } => {
                let status = if reason == "timeout" {
                    StatusCode::GATEWAY_TIMEOUT
                } else {
                    StatusCode::BAD_GATEWAY
                };
                (status, Json(json!({"callfence": "app_error", "app_status": app_status, "reason": reason}))).into_response()
            }
            Delivery::LedgerFailed => {
                callfence(StatusCode::SERVICE_UNAVAILABLE, "ledger_unavailable")
            }
            Delivery::InProgress => callfence(StatusCode::SERVICE_UNAVAILABLE, "in_progress"),
        }
    }
}

/// The origin listener's routes; each request's body must arrive within
/// `timing.request_read_timeout_ms` ([`crate::serve::read_body_within`]).
pub fn router(agent: Arc<Agent>) -> Router {
    let read_timeout = Duration::from_millis(agent.config.timing.request_read_timeout_ms);
    let routes = Router::new()
        .route("/callfence/telnyx", post(webhook))
        .route("/callfence/health", get(health))
        .layer(DefaultBodyLimit::max(MAX_WEBHOOK_BYTES))
        .with_state(agent);
    crate::serve::read_body_within(routes, MAX_WEBHOOK_BYTES, read_timeout)
}

async fn health(State(agent): State<Arc<Agent>>) -> Response {
    Json(json!({"status": "ok", "node": agent.config.node})).into_response()
}

fn refuse(reason: &str, event_id: Option<&str>) -> Response {
    crate::metrics::global().forward_refused(reason);
    crate::log::warn(
        "webhook_refused",
        json!({"reason": reason, "event_id": event_id}),
    );
    callfence(StatusCode::UNAUTHORIZED, "not_admitted")
}

async fn webhook(State(agent): State<Arc<Agent>>, headers: HeaderMap, body: Bytes) -> Response {
    match forward::admit(&agent.config, &headers, &body, now_ms()) {
        Admission::Probe { nonce } => probe_to_app(&agent, &nonce, body).await,
        Admission::Webhook(pending) => {
            let delivery = deliver(agent, pending, true).await;
            crate::metrics::global().forwarded(&delivery);
            delivery.into_response()
        }
        Admission::Refused { reason, event_id } => refuse(reason, event_id.as_deref()),
    }
}

/// Hands a verified probe to the app and returns its answer as it is (the
/// edge judges it); never recorded in the ledger.
async fn probe_to_app(agent: &Arc<Agent>, nonce: &str, body: Bytes) -> Response {
    let cfg = &agent.config;
    let sent = agent
        .http
        .post(cfg.app_webhook_url.clone())
        .timeout(Duration::from_millis(cfg.timing.app_timeout_ms))
        .header("content-type", "application/json")
        .header(probe::APP_HEADER, nonce)
        .body(body)
        .send()
        .await;
    let answer = match sent {
        Err(e) => Err(describe(&e)),
        Ok(resp) => {
            let status = resp.status().as_u16();
            read_limited(resp, MAX_ANSWER_BYTES)
                .await
                .map(|body| (status, body))
        }
    };
    match answer {
        Ok((status, body)) => {
            crate::log::info("probe_delivered", json!({"app_status": status}));
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
            (status, [("content-type", "application/json")], body).into_response()
        }
        Err(reason) => {
            crate::log::warn("probe_app_failed", json!({"reason": reason}));
            (
                StatusCode::BAD_GATEWAY,
                Json(json!({"callfence": "app_error", "reason": reason})),
            )
                .into_response()
        }
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    tokio::task::spawn_blocking(f).await.ok()
}

/// Delivers an event (a fresh webhook when `fresh`, else a `received` entry
/// being resumed), or waits for the delivery already in flight.
pub async fn deliver(agent: Arc<Agent>, event: Pending, fresh: bool) -> Delivery {
    let id = event.event_id.clone();
    let (rx, owner) = {
        let mut map = agent.inflight.lock().unwrap_or_else(|p| p.into_inner());
        match map.get(&id) {
            Some(rx) => (rx.clone(), None),
            None => {
                let (tx, rx) = watch::channel(None);
                map.insert(id.clone(), rx.clone());
                (rx, Some(tx))
            }
        }
    };
    let wait_ms = match owner {
        Some(tx) => {
            let a = agent.clone();
            tokio::spawn(async move {
                // Removes the in-flight entry even if the delivery panics, so
                // later duplicates never wait on a dead delivery.
                let _guard = InflightGuard {
                    agent: a.clone(),
                    id,
                };
                let result = first_delivery(&a, event, fresh).await;
                let _ = tx.send(Some(result));
            });
            agent.config.timing.app_timeout_ms + 2_000
        }
        None => agent.config.timing.duplicate_wait_ms,
    };
    wait(rx, Duration::from_millis(wait_ms)).await
}

struct InflightGuard {
    agent: Arc<Agent>,
    id: String,
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.agent
            .inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
    }
}

async fn wait(mut rx: watch::Receiver<Option<Delivery>>, budget: Duration) -> Delivery {
    match tokio::time::timeout(budget, rx.wait_for(Option::is_some)).await {
        Ok(Ok(v)) => v.clone().unwrap_or(Delivery::InProgress),
        _ => Delivery::InProgress,
    }
}

async fn first_delivery(agent: &Arc<Agent>, event: Pending, fresh: bool) -> Delivery {
    let ledger = agent.ledger.clone();
    let id = event.event_id.clone();
    let entry = match blocking(move || ledger.lookup(&id)).await {
        Some(Ok(e)) => e,
        other => {
            crate::log::error(
                "ledger_failed",
                json!({"event_id": event.event_id, "error": other.and_then(|r| r.err()).map(|e| e.0)}),
            );
            return Delivery::LedgerFailed;
        }
    };
    match forward::on_entry(entry, fresh) {
        OnEntry::Replay(answer) => {
            crate::log::info(
                "webhook_duplicate",
                json!({"event_id": event.event_id, "recorded_status": answer.status}),
            );
            Delivery::Answered(answer)
        }
        OnEntry::Resume(stored) => to_app(agent, stored).await,
        OnEntry::Gone => Delivery::LedgerFailed,
        OnEntry::New => {
            let reading = mode::read(&agent.config.state_dir);
            let admitted = if reading.mode == mode::NodeMode::Active {
                None
            } else {
                let ledger = agent.ledger.clone();
                let session = event.call_session_id.clone();
                blocking(move || ledger.is_admitted(&session).ok())
                    .await
                    .flatten()
            };
            if !forward::admits_new_session(reading.mode, admitted) {
                crate::log::warn(
                    "webhook_not_admitted",
                    json!({"event_id": event.event_id, "call_session_id": event.call_session_id, "mode": reading.mode.as_str(), "mode_note": reading.fallback}),
                );
                return Delivery::NotAdmitted;
            }
            let ledger = agent.ledger.clone();
            let stored = event.clone();
            let now = now_ms();
            let written = blocking(move || {
                ledger.insert_received(&stored, now)?;
                if let Some(ccid) = &stored.call_control_id {
                    let open = forward::leg_stays_open(&stored);
                    ledger.note_leg(ccid, Some(&stored.call_session_id), open, now)?;
                }
                Ok::<_, crate::AgentError>(())
            })
            .await;
            if !matches!(written, Some(Ok(()))) {
                crate::log::error("ledger_failed", json!({"event_id": event.event_id}));
                return Delivery::LedgerFailed;
            }
            to_app(agent, event).await
        }
    }
}

async fn to_app(agent: &Arc<Agent>, event: Pending) -> Delivery {
    let cfg = &agent.config;
    let ledger = agent.ledger.clone();
    let id = event.event_id.clone();
    let _ = blocking(move || ledger.count_attempt(&id, now_ms())).await;
    let mut req = agent
        .http
        .post(cfg.app_webhook_url.clone())
        .timeout(Duration::from_millis(cfg.timing.app_timeout_ms))
        .header("Callfence-Epoch", event.epoch.to_string())
        .header("Callfence-Call-Session", &event.call_session_id);
    for (name, value) in &event.headers {
        req = req.header(name.as_str(), value.as_str());
    }
    let started = now_ms();
    let result = match req.body(event.body.clone()).send().await {
        Err(e) => Err((None, describe(&e))),
        Ok(resp) => {
            let status = resp.status().as_u16();
            let ctype = resp
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            forward::app_verdict(status, ctype, read_limited(resp, MAX_ANSWER_BYTES).await)
        }
    };
    let fields = |outcome: &str, status: Option<u16>| {
        json!({"event_id": event.event_id, "call_session_id": event.call_session_id, "epoch": event.epoch,
               "event_type": event.event_type, "attempt": event.attempts + 1, "outcome": outcome,
               "app_status": status, "ms": now_ms() - started})
    };
    match result {
        Ok(answer) => {
            let ledger = agent.ledger.clone();
            let id = event.event_id.clone();
            let recorded = answer.clone();
            match blocking(move || ledger.complete(&id, &recorded, now_ms())).await {
                Some(Ok(_)) => {}
                _ => crate::log::error("ledger_failed", json!({"event_id": event.event_id})),
            }
            crate::log::info(
                "webhook_delivered",
                fields("completed", Some(answer.status)),
            );
            Delivery::Answered(answer)
        }
        Err((status, reason)) => {
            crate::log::warn("webhook_app_failed", fields(&reason, status));
            Delivery::AppFailed {
                app_status: status,
                reason,
            }
        }
    }
}

/// Re-delivers `received` entries (after a restart, and from upkeep for
/// entries whose delivery failed), skipping those tried
/// [`MAX_UPKEEP_ATTEMPTS`] times unless `all`.
pub async fn resume(agent: &Arc<Agent>, all: bool) -> usize {
    let ledger = agent.ledger.clone();
    let pending = match blocking(move || ledger.pending()).await {
        Some(Ok(p)) => p,
        _ => return 0,
    };
    let mut n = 0;
    for event in pending {
        if !all && event.attempts >= MAX_UPKEEP_ATTEMPTS {
            continue;
        }
        n += 1;
        let a = agent.clone();
        tokio::spawn(async move {
            deliver(a, event, false).await;
        });
    }
    n
}
