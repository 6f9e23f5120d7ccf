//! The local API's decisions about the answer fence (SPEC §8), with no I/O
//! ([`crate::local_api`] translates HTTP, the edge and Telnyx to and from
//! them):
//!
//! - [`answer_request`]: what `POST /local/answer` asks for, or the 400;
//! - [`transient`] and [`fence_verdict`]: what the edge's fence reply means
//!   (ask again, granted, refused, unavailable);
//! - [`answered`]: what Telnyx's answer after a granted fence means for the
//!   voice app;
//! - [`claim_verdict`]: what the edge's claim reply means for a dial;
//! - [`media_verdict`]: the fenced media check's verdict.
//!
//! Each verdict carries the status and body the voice app gets.

use axum::http::StatusCode;
use callfence_core::wire::{
    ClaimRefused, Claimed, FenceGrant, FenceRefused, MediaInvalid, MediaValid,
};
use serde_json::{json, Map, Value};

use crate::edge::EdgeReply;
use crate::telnyx_api::Reply;
use crate::telnyx_options;

/// A reply to the voice app: status and JSON body.
pub type Verdict = (StatusCode, Value);

fn bad_request(problem: impl Into<String>) -> Verdict {
    (
        StatusCode::BAD_REQUEST,
        json!({"error": "bad_request", "problem": problem.into()}),
    )
}

/// The body as a JSON object, or 400.
pub fn object(body: &[u8]) -> Result<Map<String, Value>, Verdict> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        _ => Err(bad_request("body must be a JSON object")),
    }
}

fn id_field(m: &Map<String, Value>, name: &str) -> Result<String, Verdict> {
    match m.get(name).and_then(Value::as_str) {
        Some(s) if !s.is_empty() && s.len() <= 256 => Ok(s.to_string()),
        _ => Err(bad_request(format!(
            "{name} must be a string of 1 to 256 characters"
        ))),
    }
}

/// What `POST /local/answer` asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct AnswerRequest {
    /// The leg to answer.
    pub call_control_id: String,
    /// Its session.
    pub call_session_id: String,
    /// The epoch the app was given (`Callfence-Epoch`).
    pub epoch: u64,
    /// The Telnyx answer options passed through (allow-listed).
    pub options: Map<String, Value>,
}

/// Reads an answer request: the ids, a positive epoch (number or numeric
/// string), and only allowed options; else the 400 to give.
pub fn answer_request(body: &[u8]) -> Result<AnswerRequest, Verdict> {
    let mut options = object(body)?;
    let call_control_id = id_field(&options, "call_control_id")?;
    let call_session_id = id_field(&options, "call_session_id")?;
    let epoch = options.get("epoch").and_then(|v| {
        v.as_u64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
    });
    let Some(epoch) = epoch.filter(|e| *e > 0 && *e <= callfence_core::MAX_SAFE_INTEGER) else {
        return Err(bad_request(
            "epoch must be a positive integer (Callfence-Epoch)",
        ));
    };
    for k in ["call_control_id", "call_session_id", "epoch"] {
        options.remove(k);
    }
    telnyx_options::check(&options, telnyx_options::Command::Answer)
        .map_err(|body| (StatusCode::BAD_REQUEST, body))?;
    Ok(AnswerRequest {
        call_control_id,
        call_session_id,
        epoch,
        options,
    })
}

/// True for an edge reply worth asking again: no HTTP answer, or a 502,
/// 503 or 504 (a refusal, a grant or any other status is final).
pub fn transient(reply: &Result<EdgeReply, String>) -> bool {
    match reply {
        Err(_) => true,
        Ok(r) => matches!(r.status, 502..=504),
    }
}

/// Why no fence was granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoFence {
    /// Refused (stale epoch, not the owner...): 409, Telnyx is never called.
    Refused(&'static str),
    /// No usable answer: 502, the voice app decides.
    Unavailable {
        /// The edge's status, when it answered.
        edge_status: Option<u16>,
        /// What was wrong, for the log.
        why: String,
    },
}

/// Reads the edge's final fence reply: the grant, or why there is none. A
/// refusal this version cannot read is still a refusal; a grant it cannot
/// read is not a grant.
pub fn fence_verdict(reply: &Result<EdgeReply, String>) -> Result<FenceGrant, NoFence> {
    match reply {
        Err(e) => Err(NoFence::Unavailable {
            edge_status: None,
            why: e.clone(),
        }),
        Ok(r) if r.status == 200 => match r.decode::<FenceGrant>() {
            Some(grant) if grant.granted && grant.command_id.len() == 36 => Ok(grant),
            _ => Err(NoFence::Unavailable {
                edge_status: Some(r.status),
                why: "unexpected_answer".into(),
            }),
        },
        Ok(r) if r.status == 409 => Err(NoFence::Refused(
            r.decode::<FenceRefused>()
                .map_or("fence_refused", |f| f.reason.code()),
        )),
        Ok(r) => Err(NoFence::Unavailable {
            edge_status: Some(r.status),
            why: r.error_code().unwrap_or("?").to_string(),
        }),
    }
}

impl NoFence {
    /// The reply to the voice app.
    pub fn reply(&self) -> Verdict {
        match self {
            NoFence::Refused(reason) => (
                StatusCode::CONFLICT,
                json!({"answered": false, "reason": reason}),
            ),
            NoFence::Unavailable { edge_status, .. } => {
                let mut body = json!({"answered": false, "reason": "fence_unavailable"});
                if let Some(status) = edge_status {
                    body["edge_status"] = json!(status);
                }
                (StatusCode::BAD_GATEWAY, body)
            }
        }
    }
}

/// What Telnyx's answer after a granted fence means: the reply to the
/// voice app and the outcome for the log. Telnyx's "already answered"
/// (`already_answered_codes`) counts as answered.
pub fn answered(
    grant: &FenceGrant,
    telnyx: &Result<Reply, String>,
    already_answered_codes: &[String],
) -> (Verdict, &'static str) {
    let mut out = Map::new();
    out.insert("epoch".into(), json!(grant.epoch));
    out.insert("first".into(), json!(grant.first));
    out.insert("command_id".into(), json!(grant.command_id));
    out.insert("media_token".into(), json!(grant.media_token));
    out.insert("granted_at".into(), json!(grant.granted_at));
    let (status, outcome) = match telnyx {
        Ok(r) if r.ok() => (StatusCode::OK, "answered"),
        Ok(r) if r.already_answered(already_answered_codes) => {
            out.insert("already_answered".into(), Value::Bool(true));
            (StatusCode::OK, "already_answered")
        }
        Ok(r) => {
            out.insert("reason".into(), json!("telnyx_refused"));
            out.insert("telnyx_status".into(), json!(r.status));
            out.insert("telnyx_errors".into(), r.body["errors"].clone());
            (StatusCode::BAD_GATEWAY, "telnyx_refused")
        }
        Err(_) => {
            out.insert("reason".into(), json!("telnyx_no_answer"));
            (StatusCode::GATEWAY_TIMEOUT, "telnyx_no_answer")
        }
    };
    out.insert("answered".into(), Value::Bool(status == StatusCode::OK));
    ((status, Value::Object(out)), outcome)
}

/// What the edge's reply to a dial's claim means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimVerdict {
    /// Claimed at this epoch.
    Claimed(u64),
    /// Refused: final.
    Refused(&'static str),
    /// Lost or unreadable: ask again (a repeated claim by the owner answers
    /// the same).
    Again(String),
}

/// Reads one claim reply.
pub fn claim_verdict(reply: &Result<EdgeReply, String>) -> ClaimVerdict {
    match reply {
        Ok(c) if c.status == 200 => match c.decode::<Claimed>() {
            Some(claimed) if claimed.claimed => ClaimVerdict::Claimed(claimed.epoch),
            _ => ClaimVerdict::Again("unexpected_answer".into()),
        },
        Ok(c) if c.status == 409 => ClaimVerdict::Refused(
            c.decode::<ClaimRefused>()
                .map_or("claim_refused", |r| r.reason.code()),
        ),
        Ok(c) => ClaimVerdict::Again(format!("edge_status_{}", c.status)),
        Err(e) => ClaimVerdict::Again(e.clone()),
    }
}

/// The fenced media check's verdict from the edge's reply: 200 valid, 409
/// invalid with the reason code; `None` when the edge gave neither (502).
pub fn media_verdict(reply: &EdgeReply) -> Option<(Verdict, Option<&'static str>)> {
    match reply.status {
        200 => reply
            .decode::<MediaValid>()
            .map(|v| ((StatusCode::OK, json!(v)), None)),
        409 => reply
            .decode::<MediaInvalid>()
            .map(|v| ((StatusCode::CONFLICT, json!(v)), Some(v.reason.code()))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edge(status: u16, body: Value) -> Result<EdgeReply, String> {
        Ok(EdgeReply {
            status,
            body,
            sent_ms: 0,
            received_ms: 0,
        })
    }

    fn grant() -> Value {
        json!({"granted": true, "first": true, "epoch": 3,
               "command_id": "5b3e2a2e-8f0c-5d1e-9a3b-0c1d2e3f4a5b",
               "media_token": "v1.m1.x.y", "granted_at": "2026-12-02T12:00:00.000Z"})
    }

    #[test]
    fn an_answer_request_needs_ids_a_positive_epoch_and_allowed_options() {
        let ok = answer_request(
            br#"{"call_control_id":"c","call_session_id":"s","epoch":"7","client_state":"x"}"#,
        )
        .unwrap();
        assert_eq!(ok.epoch, 7);
        assert_eq!(ok.options.keys().collect::<Vec<_>>(), ["client_state"]);
        for bad in [
            &br#"[]"#[..],
            br#"{"call_session_id":"s","epoch":1}"#,
            br#"{"call_control_id":"c","call_session_id":"s","epoch":0}"#,
            br#"{"call_control_id":"c","call_session_id":"s","epoch":1,"webhook_url":"http://x"}"#,
        ] {
            let (status, _) = answer_request(bad).unwrap_err();
            assert_eq!(
                status,
                StatusCode::BAD_REQUEST,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn only_no_answer_and_502_to_504_are_asked_again() {
        assert!(transient(&Err("connect".into())));
        for s in [502, 503, 504] {
            assert!(transient(&edge(s, Value::Null)), "{s}");
        }
        for s in [200, 409, 400, 500] {
            assert!(!transient(&edge(s, Value::Null)), "{s}");
        }
    }

    #[test]
    fn the_fence_is_granted_refused_or_unavailable() {
        assert!(fence_verdict(&edge(200, grant())).is_ok());
        let mut short = grant();
        short["command_id"] = json!("short");
        let v = fence_verdict(&edge(200, short)).unwrap_err();
        assert_eq!(v.reply().0, StatusCode::BAD_GATEWAY);
        let refused =
            fence_verdict(&edge(409, json!({"granted": false, "reason": "what?"}))).unwrap_err();
        assert_eq!(refused, NoFence::Refused("fence_refused"));
        assert_eq!(refused.reply().0, StatusCode::CONFLICT);
        let down =
            fence_verdict(&edge(503, json!({"error": "dispatcher_unavailable"}))).unwrap_err();
        assert_eq!(down.reply().1["edge_status"], 503);
    }

    #[test]
    fn telnyx_already_answered_after_a_grant_counts_as_answered() {
        let g: FenceGrant = serde_json::from_value(grant()).unwrap();
        let codes = vec!["90018".to_string()];
        let reply = |status, body| Ok(Reply { status, body });
        let ((s, body), outcome) = answered(&g, &reply(200, json!({})), &codes);
        assert_eq!(
            (s, outcome, body["answered"].clone()),
            (StatusCode::OK, "answered", json!(true))
        );
        let already = reply(422, json!({"errors": [{"code": "90018"}]}));
        let ((s, body), _) = answered(&g, &already, &codes);
        assert_eq!(
            (s, body["already_answered"].clone()),
            (StatusCode::OK, json!(true))
        );
        let ((s, body), _) = answered(&g, &reply(422, json!({"errors": []})), &codes);
        assert_eq!(
            (s, body["answered"].clone()),
            (StatusCode::BAD_GATEWAY, json!(false))
        );
        let ((s, _), _) = answered(&g, &Err("timeout".into()), &codes);
        assert_eq!(s, StatusCode::GATEWAY_TIMEOUT);
    }

    #[test]
    fn a_claim_is_claimed_refused_or_asked_again() {
        assert_eq!(
            claim_verdict(&edge(
                200,
                json!({"claimed": true, "call_session_id": "s", "epoch": 4})
            )),
            ClaimVerdict::Claimed(4)
        );
        assert_eq!(
            claim_verdict(&edge(409, json!({}))),
            ClaimVerdict::Refused("claim_refused")
        );
        assert!(matches!(
            claim_verdict(&edge(503, json!({}))),
            ClaimVerdict::Again(_)
        ));
        assert!(matches!(
            claim_verdict(&Err("x".into())),
            ClaimVerdict::Again(_)
        ));
    }
}
