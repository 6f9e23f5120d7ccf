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
//! module never spells them with string keys.
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
use serde_json::{json, Map, Value};

use callfence_core::wire::{
    ClaimRefused, ClaimRequest, Claimed, FenceGrant, FenceRefused, FenceRequest, MediaInvalid,
    MediaValid, MediaVerifyRequest,
};

use crate::clock::now_ms;
use crate::context::Agent;
use crate::edge::EdgeReply;
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
        .route("/metrics", get(|State(a)| crate::metrics::exposition(a)))
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/readyz", get(readyz))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(agent);
    crate::serve::read_body_within(routes, MAX_BODY_BYTES, read_timeout)
        .layer(middleware::from_fn_with_state(Arc::new(gate), guard))
}

fn reply(status: StatusCode, body: Value) -> Response {
    (status, Json(body)).into_response()
}

/// A refusal before any work: status and JSON body.
type Refusal = (StatusCode, Value);

fn object(body: &[u8]) -> Result<Map<String, Value>, Refusal> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        _ => Err((
            StatusCode::BAD_REQUEST,
            json!({"error": "bad_request", "problem": "body must be a JSON object"}),
        )),
    }
}

fn id_field(m: &Map<String, Value>, name: &str) -> Result<String, Refusal> {
    match m.get(name).and_then(Value::as_str) {
        Some(s) if !s.is_empty() && s.len() <= 256 => Ok(s.to_string()),
        _ => Err((
            StatusCode::BAD_REQUEST,
            json!({"error": "bad_request", "problem": format!("{name} must be a string of 1 to 256 characters")}),
        )),
    }
}

async fn answer(State(agent): State<Arc<Agent>>, body: Bytes) -> Response {
    match answer_inner(&agent, &body).await {
        Ok(r) | Err(r) => r,
    }
}

/// No new fence attempt starts later than this after the first one (the
/// pauses are [`crate::net::RETRY_PAUSES_MS`]): a fence that takes longer is
/// reported unavailable, and the voice app decides. Asking again is safe:
/// the edge gives the same owner at the same epoch the same grant again
/// (SPEC §8, `"first": false`), never a second one, so a reply lost in a
/// restart of the edge or its Dispatcher costs a retry, not the call.
const FENCE_RETRY_WINDOW: Duration = Duration::from_millis(2_500);

/// True for an edge reply worth asking again: no HTTP answer, or a 502,
/// 503 or 504 (a refusal, a grant or any other status is final).
fn transient(reply: &Result<EdgeReply, String>) -> bool {
    match reply {
        Err(_) => true,
        Ok(r) => matches!(r.status, 502..=504),
    }
}

/// `POST /v1/fence`, asked again while the reply is [`transient`], within
/// [`FENCE_RETRY_WINDOW`].
async fn ask_fence(agent: &Agent, request: &FenceRequest) -> Result<EdgeReply, String> {
    crate::net::retried(
        FENCE_RETRY_WINDOW,
        || {
            agent
                .edge
                .post_json(agent.keys.current(), "/v1/fence", request, now_ms())
        },
        transient,
    )
    .await
}

async fn answer_inner(agent: &Arc<Agent>, body: &[u8]) -> Result<Response, Response> {
    let refuse = |(s, v): Refusal| reply(s, v);
    let mut options = object(body).map_err(refuse)?;
    let ccid = id_field(&options, "call_control_id").map_err(refuse)?;
    let session = id_field(&options, "call_session_id").map_err(refuse)?;
    let epoch = options.get("epoch").and_then(|v| {
        v.as_u64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
    });
    let Some(epoch) = epoch.filter(|e| *e > 0 && *e <= callfence_core::MAX_SAFE_INTEGER) else {
        return Err(reply(
            StatusCode::BAD_REQUEST,
            json!({"error": "bad_request", "problem": "epoch must be a positive integer (Callfence-Epoch)"}),
        ));
    };
    for k in ["call_control_id", "call_session_id", "epoch"] {
        options.remove(k);
    }
    telnyx_options::check(&options, telnyx_options::Command::Answer)
        .map_err(|body| reply(StatusCode::BAD_REQUEST, body))?;
    let Some(telnyx) = agent.telnyx.as_ref() else {
        return Err(reply(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"answered": false, "reason": "telnyx_api_not_configured"}),
        ));
    };
    let request = FenceRequest::answer(&session, &ccid, epoch);
    let fence = ask_fence(agent, &request).await;
    crate::metrics::global().fence(&fence);
    let log_fields = |outcome: &str| json!({"call_session_id": session, "call_control_id": ccid, "epoch": epoch, "outcome": outcome});
    let unavailable = |edge_status: Option<u16>| {
        let mut body = json!({"answered": false, "reason": "fence_unavailable"});
        if let Some(status) = edge_status {
            body["edge_status"] = json!(status);
        }
        reply(StatusCode::BAD_GATEWAY, body)
    };
    let grant = match fence {
        Err(e) => {
            crate::log::warn(
                "fence_unavailable",
                json!({"call_session_id": session, "epoch": epoch, "reason": e}),
            );
            return Err(unavailable(None));
        }
        Ok(r) if r.status == 200 => match r.decode::<FenceGrant>() {
            Some(grant) if grant.granted && grant.command_id.len() == 36 => grant,
            _ => {
                crate::log::warn(
                    "fence_unavailable",
                    json!({"call_session_id": session, "epoch": epoch, "edge_status": r.status, "code": "unexpected_answer"}),
                );
                return Err(unavailable(Some(r.status)));
            }
        },
        Ok(r) if r.status == 409 => {
            // A refusal this version cannot read is still a refusal.
            let reason = r
                .decode::<FenceRefused>()
                .map_or("fence_refused", |f| f.reason.code());
            crate::log::warn(
                "fence_refused",
                json!({"call_session_id": session, "epoch": epoch, "reason": reason}),
            );
            return Err(reply(
                StatusCode::CONFLICT,
                json!({"answered": false, "reason": reason}),
            ));
        }
        Ok(r) => {
            crate::log::warn(
                "fence_unavailable",
                json!({"call_session_id": session, "epoch": epoch, "edge_status": r.status, "code": r.error_code()}),
            );
            return Err(unavailable(Some(r.status)));
        }
    };
    options.insert("command_id".into(), Value::String(grant.command_id.clone()));
    let result = telnyx.answer(&ccid, &Value::Object(options)).await;
    let granted = json!({
        "epoch": grant.epoch,
        "first": grant.first,
        "command_id": grant.command_id,
        "media_token": grant.media_token,
        "granted_at": grant.granted_at,
    });
    let ledger = agent.ledger.clone();
    let (leg, leg_session) = (ccid.clone(), session.clone());
    let _ = tokio::task::spawn_blocking(move || {
        ledger.note_leg(&leg, Some(&leg_session), true, now_ms())
    })
    .await;
    let mut out = granted.as_object().cloned().unwrap_or_default();
    match result {
        Ok(r) if r.ok() => {
            crate::log::info("call_answered", log_fields("answered"));
            out.insert("answered".into(), Value::Bool(true));
            Ok(reply(StatusCode::OK, Value::Object(out)))
        }
        Ok(r) if r.already_answered(&agent.config.already_answered_codes) => {
            crate::log::info("call_answered", log_fields("already_answered"));
            out.insert("answered".into(), Value::Bool(true));
            out.insert("already_answered".into(), Value::Bool(true));
            Ok(reply(StatusCode::OK, Value::Object(out)))
        }
        Ok(r) => {
            crate::log::warn(
                "telnyx_answer_refused",
                json!({"call_session_id": session, "epoch": epoch, "telnyx_status": r.status, "codes": r.error_codes()}),
            );
            out.insert("answered".into(), Value::Bool(false));
            out.insert("reason".into(), Value::String("telnyx_refused".into()));
            out.insert("telnyx_status".into(), json!(r.status));
            out.insert("telnyx_errors".into(), r.body["errors"].clone());
            Ok(reply(StatusCode::BAD_GATEWAY, Value::Object(out)))
        }
        Err(e) => {
            crate::log::warn(
                "telnyx_answer_unanswered",
                json!({"call_session_id": session, "epoch": epoch, "reason": e}),
            );
            out.insert("answered".into(), Value::Bool(false));
            out.insert("reason".into(), Value::String("telnyx_no_answer".into()));
            Ok(reply(StatusCode::GATEWAY_TIMEOUT, Value::Object(out)))
        }
    }
}

async fn dial(State(agent): State<Arc<Agent>>, body: Bytes) -> Response {
    let mut options = match object(&body) {
        Ok(o) => o,
        Err((s, v)) => return reply(s, v),
    };
    if let Err(refused) = telnyx_options::check(&options, telnyx_options::Command::Dial) {
        return reply(StatusCode::BAD_REQUEST, refused);
    }
    let (Some(telnyx), Some(connection)) = (
        agent.telnyx.as_ref(),
        agent.config.telnyx_connection_id.as_ref(),
    ) else {
        return reply(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"dialed": false, "reason": "telnyx_api_not_configured"}),
        );
    };
    options.insert("connection_id".into(), Value::String(connection.clone()));
    let r = match telnyx.dial(&Value::Object(options)).await {
        Err(e) => {
            crate::log::warn("telnyx_dial_unanswered", json!({"reason": e}));
            return reply(
                StatusCode::BAD_GATEWAY,
                json!({"dialed": false, "reason": "telnyx_no_answer"}),
            );
        }
        Ok(r) if !r.ok() => {
            return reply(
                StatusCode::BAD_GATEWAY,
                json!({"dialed": false, "reason": "telnyx_refused", "telnyx_status": r.status, "telnyx_errors": r.body["errors"]}),
            );
        }
        Ok(r) => r,
    };
    let data = &r.body["data"];
    let (Some(ccid), Some(session)) = (
        data["call_control_id"].as_str(),
        data["call_session_id"].as_str(),
    ) else {
        return reply(
            StatusCode::BAD_GATEWAY,
            json!({"dialed": true, "claimed": false, "reason": "telnyx_answer_without_ids", "telnyx": data}),
        );
    };
    let ledger = agent.ledger.clone();
    let (leg, leg_session) = (ccid.to_string(), session.to_string());
    let _ = tokio::task::spawn_blocking(move || {
        ledger.note_leg(&leg, Some(&leg_session), true, now_ms())
    })
    .await;
    let claim = ClaimRequest {
        call_control_id: ccid.to_string(),
        call_session_id: session.to_string(),
    };
    let mut last = None;
    for attempt in 0..3u64 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(200 * attempt)).await;
        }
        match agent
            .edge
            .post_json(agent.keys.current(), "/v1/claims", &claim, now_ms())
            .await
        {
            // A repeated claim by the owner answers the same, so an answer
            // this version cannot read is retried like a lost one.
            Ok(c) if c.status == 200 => match c.decode::<Claimed>() {
                Some(claimed) if claimed.claimed => {
                    crate::log::info(
                        "call_claimed",
                        json!({"call_session_id": session, "call_control_id": ccid, "epoch": claimed.epoch}),
                    );
                    return reply(
                        StatusCode::OK,
                        json!({"dialed": true, "claimed": true, "call_control_id": ccid, "call_session_id": session,
                               "epoch": claimed.epoch, "telnyx": data}),
                    );
                }
                _ => last = Some("unexpected_answer".to_string()),
            },
            Ok(c) if c.status == 409 => {
                let reason = c
                    .decode::<ClaimRefused>()
                    .map_or("claim_refused", |r| r.reason.code());
                crate::log::warn(
                    "claim_refused",
                    json!({"call_session_id": session, "reason": reason}),
                );
                return reply(
                    StatusCode::CONFLICT,
                    json!({"dialed": true, "claimed": false, "reason": reason, "call_control_id": ccid,
                           "call_session_id": session, "telnyx": data}),
                );
            }
            Ok(c) => last = Some(format!("edge_status_{}", c.status)),
            Err(e) => last = Some(e),
        }
    }
    crate::log::warn(
        "claim_unavailable",
        json!({"call_session_id": session, "reason": last}),
    );
    reply(
        StatusCode::BAD_GATEWAY,
        json!({"dialed": true, "claimed": false, "reason": "claim_unavailable", "call_control_id": ccid,
               "call_session_id": session, "telnyx": data}),
    )
}

async fn media_verify(State(agent): State<Arc<Agent>>, body: Bytes) -> Response {
    let request = match serde_json::from_slice::<MediaVerifyRequest>(&body) {
        Ok(r) if r.check().is_ok() => r,
        _ => {
            return reply(
                StatusCode::BAD_REQUEST,
                json!({"error": "bad_request", "problem": "media_token must be a string of 1 to 2048 bytes"}),
            )
        }
    };
    let unavailable = |edge_status: Option<u16>| {
        let mut body = json!({"valid": false, "reason": "edge_unavailable"});
        if let Some(status) = edge_status {
            body["edge_status"] = json!(status);
        }
        reply(StatusCode::BAD_GATEWAY, body)
    };
    let r = match agent
        .edge
        .post_json(agent.keys.current(), "/v1/media/verify", &request, now_ms())
        .await
    {
        Ok(r) => r,
        Err(_) => return unavailable(None),
    };
    let verdict = match r.status {
        200 => r
            .decode::<MediaValid>()
            .map(|v| (StatusCode::OK, json!(v), None)),
        409 => r
            .decode::<MediaInvalid>()
            .map(|v| (StatusCode::CONFLICT, json!(v), Some(v.reason.code()))),
        _ => None,
    };
    match verdict {
        Some((status, body, reason)) => {
            crate::log::info(
                "media_checked",
                json!({"valid": status == StatusCode::OK, "reason": reason}),
            );
            reply(status, body)
        }
        None => unavailable(Some(r.status)),
    }
}

async fn status(State(agent): State<Arc<Agent>>) -> Response {
    let reading = mode::read(&agent.config.state_dir);
    reply(
        StatusCode::OK,
        json!({"node": agent.config.node, "mode": reading.mode.as_str(), "mode_note": reading.fallback,
               "signing_key_id": agent.keys.current().kid, "last_beat": agent.last_beat()}),
    )
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
    reply(
        if ready {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        },
        body,
    )
}
