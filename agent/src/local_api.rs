//! The local API, on loopback only, for the voice app and local probes.
//! Every request passes [`crate::local_auth::guard`] first (no `Origin`,
//! the listener's own `Host`, JSON POSTs, and the bearer token on every
//! path but `/healthz` and `/readyz`). Deploys, rollbacks and shedding
//! are never offered here: they go through [`crate::control`].
//!
//! - `POST /local/answer {"call_control_id","call_session_id","epoch", ...options}`:
//!   asks the edge for the answer fence (`POST /v1/fence`, node-signed, asked
//!   again for up to 2.5 s while the edge is unreachable or answers 502-504); a
//!   refused fence answers 409 `{"answered":false,"reason":..}` and Telnyx
//!   is never called. A granted fence is followed by Telnyx `answer` with the
//!   fence's `command_id` and the other options (the allow-list of
//!   [`crate::telnyx_options::SHARED`]; anything else is 400
//!   `option_not_allowed` before the fence is asked) passed through, resent while
//!   Telnyx is silent (see [`crate::telnyx_api`]); Telnyx's "already
//!   answered" after a granted fence counts as success. 200
//!   `{"answered":true,"first","epoch","command_id","media_token","granted_at"}`.
//! - `POST /local/dial {...dial options}`: Telnyx `POST /v2/calls` with the
//!   options of [`crate::telnyx_options::SHARED`] and
//!   [`crate::telnyx_options::DIAL_ONLY`], and the configured
//!   `[telnyx] connection_id`, then the claim (`POST /v1/claims`) so the new
//!   session's events come back here.
//! - `POST /local/media/verify {"media_token"}`: the edge's fenced media check;
//!   its verdict ([`callfence_core::wire::MediaValid`] or
//!   [`callfence_core::wire::MediaInvalid`]) with the edge's 200 or 409.
//!
//! The edge's bodies are core's wire types ([`callfence_core::wire`]); this
//! module never spells them with string keys. What each reply means (the
//! fence, Telnyx's answer, a claim, the media check) is decided in
//! [`crate::fence`]; the handlers here only do the I/O and translate.
//! - `GET /local/status`: the running agent's last beat and mode.
//! - `GET /metrics`: the agent's metrics ([`crate::metrics`]), with the token.
//! - `GET /healthz`: 200 while the process serves.
//! - `GET /readyz`: 200 only when the mode is `active`, the last beat is
//!   fresh, accepted and eligible, and the app answers its status probe.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use callfence_core::wire::{ClaimRequest, FenceRequest, MediaVerifyRequest};

use crate::clock::now_ms;
use crate::context::Agent;
use crate::edge::EdgeReply;
use crate::fence::{self, ClaimVerdict, NoFence, Verdict};
use crate::local_auth::{guard, Gate};
use crate::mode::{self, NodeMode};
use crate::telnyx_options;

/// Largest request body.
pub const MAX_BODY_BYTES: usize = 16 * 1024;

/// The local listener's routes, behind `gate` (checked before the body is
/// read, which must arrive within `timing.request_read_timeout_ms`).
pub fn router(agent: Arc<Agent>, gate: Gate) -> Router {
    let read_timeout = Duration::from_millis(agent.config.timing.request_read_timeout_ms);
    let routes = Router::new()
        .route("/local/answer", post(answer))
        .route("/local/dial", post(dial))
        .route("/local/media/verify", post(media_verify))
        .route("/local/status", get(status))
        .route("/metrics", get(|State(a)| crate::scrape::exposition(a)))
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/readyz", get(readyz))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(agent);
    crate::serve::read_body_within(routes, MAX_BODY_BYTES, read_timeout)
        .layer(middleware::from_fn_with_state(Arc::new(gate), guard))
}

fn reply((status, body): Verdict) -> Response {
    (status, Json(body)).into_response()
}

async fn answer(State(agent): State<Arc<Agent>>, body: Bytes) -> Response {
    let req = match fence::answer_request(&body) {
        Ok(r) => r,
        Err(refused) => return reply(refused),
    };
    let Some(telnyx) = agent.telnyx.as_ref() else {
        return reply((
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"answered": false, "reason": "telnyx_api_not_configured"}),
        ));
    };
    let (ccid, session, epoch) = (&req.call_control_id, &req.call_session_id, req.epoch);
    let fenced = ask_fence(&agent, &FenceRequest::answer(session, ccid, epoch)).await;
    let verdict = fence::fence_verdict(&fenced);
    crate::metrics::global().fence(&verdict);
    let grant = match verdict {
        Ok(grant) => grant,
        Err(no) => {
            match &no {
                NoFence::Refused(reason) => crate::log::warn(
                    "fence_refused",
                    json!({"call_session_id": session, "epoch": epoch, "reason": reason}),
                ),
                NoFence::Unavailable { edge_status, why } => crate::log::warn(
                    "fence_unavailable",
                    json!({"call_session_id": session, "epoch": epoch, "edge_status": edge_status, "reason": why}),
                ),
            }
            return reply(no.reply());
        }
    };
    let mut options = req.options.clone();
    options.insert("command_id".into(), Value::String(grant.command_id.clone()));
    let result = telnyx.answer(ccid, &Value::Object(options)).await;
    note_open_leg(&agent, ccid, session).await;
    let (verdict, outcome) = fence::answered(&grant, &result, &agent.config.already_answered_codes);
    let fields = json!({"call_session_id": session, "call_control_id": ccid, "epoch": epoch, "outcome": outcome});
    match &result {
        Ok(_) if verdict.0 == StatusCode::OK => crate::log::info("call_answered", fields),
        Ok(r) => crate::log::warn(
            "telnyx_answer_refused",
            json!({"call_session_id": session, "epoch": epoch, "telnyx_status": r.status, "codes": r.error_codes()}),
        ),
        Err(e) => crate::log::warn(
            "telnyx_answer_unanswered",
            json!({"call_session_id": session, "epoch": epoch, "reason": e}),
        ),
    }
    reply(verdict)
}

/// Records `ccid` as an open leg of `session` (for `drain --shed`).
async fn note_open_leg(agent: &Agent, ccid: &str, session: &str) {
    let ledger = agent.ledger.clone();
    let (leg, leg_session) = (ccid.to_string(), session.to_string());
    let _ = tokio::task::spawn_blocking(move || {
        ledger.note_leg(&leg, Some(&leg_session), true, now_ms())
    })
    .await;
}

/// No new fence attempt starts later than this after the first one (the
/// pauses are [`crate::net::RETRY_PAUSES_MS`]): a fence that takes longer is
/// reported unavailable, and the voice app decides. Asking again is safe:
/// the edge gives the same owner at the same epoch the same grant again
/// (SPEC §8, `"first": false`), never a second one, so a reply lost in a
/// restart of the edge or its Dispatcher costs a retry, not the call.
const FENCE_RETRY_WINDOW: Duration = Duration::from_millis(2_500);

/// `POST /v1/fence`, asked again while the reply is
/// [`fence::transient`], within [`FENCE_RETRY_WINDOW`].
async fn ask_fence(agent: &Agent, request: &FenceRequest) -> Result<EdgeReply, String> {
    crate::net::retried(
        FENCE_RETRY_WINDOW,
        || {
            agent
                .edge
                .post_json(agent.keys.current(), "/v1/fence", request, now_ms())
        },
        fence::transient,
    )
    .await
}

async fn dial(State(agent): State<Arc<Agent>>, body: Bytes) -> Response {
    let mut options = match fence::object(&body) {
        Ok(o) => o,
        Err(refused) => return reply(refused),
    };
    if let Err(refused) = telnyx_options::check(&options, telnyx_options::Command::Dial) {
        return reply((StatusCode::BAD_REQUEST, refused));
    }
    let (Some(telnyx), Some(connection)) = (
        agent.telnyx.as_ref(),
        agent.config.telnyx_connection_id.as_ref(),
    ) else {
        return reply((
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"dialed": false, "reason": "telnyx_api_not_configured"}),
        ));
    };
    options.insert("connection_id".into(), Value::String(connection.clone()));
    let r = match telnyx.dial(&Value::Object(options)).await {
        Err(e) => {
            crate::log::warn("telnyx_dial_unanswered", json!({"reason": e}));
            return reply((
                StatusCode::BAD_GATEWAY,
                json!({"dialed": false, "reason": "telnyx_no_answer"}),
            ));
        }
        Ok(r) if !r.ok() => {
            return reply((
                StatusCode::BAD_GATEWAY,
                json!({"dialed": false, "reason": "telnyx_refused", "telnyx_status": r.status, "telnyx_errors": r.body["errors"]}),
            ));
        }
        Ok(r) => r,
    };
    let data = &r.body["data"];
    let (Some(ccid), Some(session)) = (
        data["call_control_id"].as_str(),
        data["call_session_id"].as_str(),
    ) else {
        return reply((
            StatusCode::BAD_GATEWAY,
            json!({"dialed": true, "claimed": false, "reason": "telnyx_answer_without_ids", "telnyx": data}),
        ));
    };
    note_open_leg(&agent, ccid, session).await;
    let claim = ClaimRequest {
        call_control_id: ccid.to_string(),
        call_session_id: session.to_string(),
    };
    let mut last = None;
    for attempt in 0..3u64 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(200 * attempt)).await;
        }
        let answer = agent
            .edge
            .post_json(agent.keys.current(), "/v1/claims", &claim, now_ms())
            .await;
        match fence::claim_verdict(&answer) {
            ClaimVerdict::Claimed(epoch) => {
                crate::log::info(
                    "call_claimed",
                    json!({"call_session_id": session, "call_control_id": ccid, "epoch": epoch}),
                );
                return reply((
                    StatusCode::OK,
                    json!({"dialed": true, "claimed": true, "call_control_id": ccid, "call_session_id": session,
                           "epoch": epoch, "telnyx": data}),
                ));
            }
            ClaimVerdict::Refused(reason) => {
                crate::log::warn(
                    "claim_refused",
                    json!({"call_session_id": session, "reason": reason}),
                );
                return reply((
                    StatusCode::CONFLICT,
                    json!({"dialed": true, "claimed": false, "reason": reason, "call_control_id": ccid,
                           "call_session_id": session, "telnyx": data}),
                ));
            }
            ClaimVerdict::Again(why) => last = Some(why),
        }
    }
    crate::log::warn(
        "claim_unavailable",
        json!({"call_session_id": session, "reason": last}),
    );
    reply((
        StatusCode::BAD_GATEWAY,
        json!({"dialed": true, "claimed": false, "reason": "claim_unavailable", "call_control_id": ccid,
               "call_session_id": session, "telnyx": data}),
    ))
}

async fn media_verify(State(agent): State<Arc<Agent>>, body: Bytes) -> Response {
    let request = match serde_json::from_slice::<MediaVerifyRequest>(&body) {
        Ok(r) if r.check().is_ok() => r,
        _ => {
            return reply((
                StatusCode::BAD_REQUEST,
                json!({"error": "bad_request", "problem": "media_token must be a string of 1 to 2048 bytes"}),
            ))
        }
    };
    let asked = agent
        .edge
        .post_json(agent.keys.current(), "/v1/media/verify", &request, now_ms())
        .await;
    let edge_status = asked.as_ref().ok().map(|r| r.status);
    match asked.as_ref().ok().and_then(fence::media_verdict) {
        Some((verdict, reason)) => {
            crate::log::info(
                "media_checked",
                json!({"valid": verdict.0 == StatusCode::OK, "reason": reason}),
            );
            reply(verdict)
        }
        None => {
            let mut body = json!({"valid": false, "reason": "edge_unavailable"});
            if let Some(status) = edge_status {
                body["edge_status"] = json!(status);
            }
            reply((StatusCode::BAD_GATEWAY, body))
        }
    }
}

async fn status(State(agent): State<Arc<Agent>>) -> Response {
    let reading = mode::read(&agent.config.state_dir);
    reply((
        StatusCode::OK,
        json!({"node": agent.config.node, "mode": reading.mode.as_str(), "mode_note": reading.fallback,
               "signing_key_id": agent.keys.current().kid, "last_beat": agent.last_beat()}),
    ))
}

async fn readyz(State(agent): State<Arc<Agent>>) -> Response {
    let reading = mode::read(&agent.config.state_dir);
    let beat = agent.last_beat();
    let now = now_ms();
    let beat_ok = beat
        .as_ref()
        .is_some_and(|b| b.accepted_and_eligible() && b.fresh(now));
    let timeout = Duration::from_millis(agent.config.timing.probe_timeout_ms);
    let app = crate::probe::app_status(&agent.http, &agent.config.app_status_url, timeout).await;
    let app_reachable = app.is_ok();
    let ready = reading.mode == NodeMode::Active && beat_ok && app_reachable;
    let body = json!({
        "ready": ready,
        "mode": reading.mode.as_str(),
        "mode_note": reading.fallback,
        "beat_accepted_and_eligible": beat_ok,
        "reasons": beat.as_ref().map(|b| b.reasons.clone()).unwrap_or_default(),
        "app_reachable": app_reachable,
    });
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    reply((status, body))
}
