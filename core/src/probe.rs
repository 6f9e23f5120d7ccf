//! The public L5 probe (SPEC §14): a node asks the edge, after a deploy, to
//! send a synthetic event through the whole public path (edge → tunnel →
//! agent → app) and to say whether the app answered it.
//!
//! Every rule of the probe lives here, as pure functions:
//! - [`parse_request`]: the node's `{"nonce"}` (16–64 of `[A-Za-z0-9_-]`).
//! - [`body`]: the event the edge forwards,
//!   `{"data":{"event_type":"callfence.probe","id":<nonce>,"payload":{"node":..}}}`.
//! - [`parse_body`]: the agent's side: is a forwarded body a probe, and for
//!   which nonce and node.
//! - [`rate_limit`]: at most one probe per node per [`INTERVAL_MS`].
//! - [`evaluate`]: the edge's answer `{"ok","status","latency_ms","sha","reason"}`,
//!   `ok` only for a 2xx whose `probe` echoes the nonce.
//!
//! The probe's assertion is [`crate::assertion::ProbeClaims`]; a webhook
//! assertion is never admitted for a probe body, nor a probe assertion for a
//! webhook.

use serde::Serialize;
use serde_json::{json, Value};

use crate::engine::ReportedAnswer;

/// The probe's `data.event_type`.
pub const EVENT_TYPE: &str = "callfence.probe";

/// The header the agent adds when it hands a verified probe to the app.
pub const APP_HEADER: &str = "Callfence-Probe";

/// At most one probe per node in this many milliseconds.
pub const INTERVAL_MS: i64 = 5_000;

/// Shortest nonce.
pub const MIN_NONCE: usize = 16;
/// Longest nonce.
pub const MAX_NONCE: usize = 64;
/// Longest SHA echoed back from the app's answer.
const MAX_SHA: usize = 64;

/// Why a probe request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProbeError {
    /// Not a JSON object with a string `nonce`.
    BadRequest,
    /// The nonce is not 16–64 of `[A-Za-z0-9_-]`.
    BadNonce,
}

/// True for 16–64 characters of `[A-Za-z0-9_-]`.
pub fn valid_nonce(nonce: &str) -> bool {
    (MIN_NONCE..=MAX_NONCE).contains(&nonce.len())
        && nonce
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Reads the node's request body `{"nonce": ...}` and returns the nonce.
pub fn parse_request(body: &[u8]) -> Result<String, ProbeError> {
    let value: Value = serde_json::from_slice(body).map_err(|_| ProbeError::BadRequest)?;
    let nonce = value
        .get("nonce")
        .and_then(Value::as_str)
        .ok_or(ProbeError::BadRequest)?;
    if !valid_nonce(nonce) {
        return Err(ProbeError::BadNonce);
    }
    Ok(nonce.to_string())
}

/// The body the edge forwards for a probe of `node` with `nonce`.
pub fn body(node: &str, nonce: &str) -> String {
    json!({"data": {"event_type": EVENT_TYPE, "id": nonce, "payload": {"node": node}}}).to_string()
}

/// A forwarded body that is a probe: its nonce and node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeBody {
    /// `data.id`.
    pub nonce: String,
    /// `data.payload.node`.
    pub node: String,
}

/// `Some` when `body` is JSON whose `data.event_type` is [`EVENT_TYPE`]
/// (whether or not the rest is well formed: such a body is only ever
/// admitted as a probe). `Ok` only for a valid nonce and a node.
pub fn parse_body(body: &[u8]) -> Option<Result<ProbeBody, ProbeError>> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let data = value.get("data")?;
    if data.get("event_type").and_then(Value::as_str) != Some(EVENT_TYPE) {
        return None;
    }
    let nonce = data.get("id").and_then(Value::as_str);
    let node = data
        .get("payload")
        .and_then(|p| p.get("node"))
        .and_then(Value::as_str);
    Some(match (nonce, node) {
        (Some(nonce), Some(node)) if valid_nonce(nonce) => Ok(ProbeBody {
            nonce: nonce.to_string(),
            node: node.to_string(),
        }),
        (Some(_), Some(_)) => Err(ProbeError::BadNonce),
        _ => Err(ProbeError::BadRequest),
    })
}

/// The per-node rate limit: given the time of the node's last admitted
/// probe, `Ok` when a new one may go now, else `Err(retry_after_s)` (at
/// least 1).
pub fn rate_limit(last_ms: Option<i64>, now_ms: i64) -> Result<(), u32> {
    match last_ms {
        Some(last) if now_ms >= last && now_ms - last < INTERVAL_MS => {
            let wait_ms = INTERVAL_MS - (now_ms - last);
            Err(u32::try_from((wait_ms + 999) / 1000).unwrap_or(5).max(1))
        }
        _ => Ok(()),
    }
}

/// The edge's answer to a probe (200 whatever the outcome).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProbeAnswer {
    /// True only for a 2xx whose `probe` equals the nonce.
    pub ok: bool,
    /// The origin's HTTP status (null for a timeout or network error).
    pub status: Option<u16>,
    /// Milliseconds from sending to the full answer.
    pub latency_ms: i64,
    /// The `sha` the app reported (null when absent or not a string).
    pub sha: Option<String>,
    /// `ok`, `timeout`, `network_error`, `http_status`, `not_json` or `nonce_mismatch`.
    pub reason: &'static str,
}

/// Judges the origin's answer to a probe with `nonce`.
pub fn evaluate(nonce: &str, answer: &ReportedAnswer, latency_ms: i64) -> ProbeAnswer {
    let mut out = ProbeAnswer {
        ok: false,
        status: None,
        latency_ms: latency_ms.max(0),
        sha: None,
        reason: "ok",
    };
    let (status, body) = match answer {
        ReportedAnswer::Timeout => {
            out.reason = "timeout";
            return out;
        }
        ReportedAnswer::NetworkError => {
            out.reason = "network_error";
            return out;
        }
        ReportedAnswer::Http { status, body } => (*status, body),
    };
    out.status = Some(status);
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    out.sha = parsed
        .as_ref()
        .and_then(|v| v.get("sha"))
        .and_then(Value::as_str)
        .filter(|s| s.len() <= MAX_SHA)
        .map(str::to_string);
    out.reason = if !(200..300).contains(&status) {
        "http_status"
    } else if parsed.is_none() {
        "not_json"
    } else if parsed
        .as_ref()
        .and_then(|v| v.get("probe"))
        .and_then(Value::as_str)
        != Some(nonce)
    {
        "nonce_mismatch"
    } else {
        out.ok = true;
        "ok"
    };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONCE: &str = "abcdefghij_KLMN-0123";

    #[test]
    fn nonces_are_16_to_64_of_the_safe_alphabet() {
        assert!(valid_nonce(&"a".repeat(16)));
        assert!(valid_nonce(&"Z_-9".repeat(16)));
        assert!(!valid_nonce(&"a".repeat(15)));
        assert!(!valid_nonce(&"a".repeat(65)));
        assert!(!valid_nonce("abcdefghijklmno/"));
        assert!(!valid_nonce("abcdefghijklmnoé"));
        assert_eq!(
            parse_request(format!(r#"{{"nonce":"{NONCE}"}}"#).as_bytes()),
            Ok(NONCE.into())
        );
        assert_eq!(
            parse_request(br#"{"nonce":"short"}"#),
            Err(ProbeError::BadNonce)
        );
        assert_eq!(
            parse_request(br#"{"nonce":7}"#),
            Err(ProbeError::BadRequest)
        );
        assert_eq!(parse_request(b"nope"), Err(ProbeError::BadRequest));
    }

    #[test]
    fn the_body_round_trips_and_other_events_are_not_probes() {
        let b = body("M3", NONCE);
        let v: Value = serde_json::from_str(&b).unwrap();
        assert_eq!(
            v,
            json!({"data":{"event_type":"callfence.probe","id":NONCE,"payload":{"node":"M3"}}})
        );
        assert_eq!(
            parse_body(b.as_bytes()),
            Some(Ok(ProbeBody {
                nonce: NONCE.into(),
                node: "M3".into()
            }))
        );
        assert_eq!(
            parse_body(br#"{"data":{"event_type":"call.initiated","id":"x"}}"#),
            None
        );
        assert_eq!(parse_body(b"not json"), None);
        assert_eq!(
            parse_body(br#"{"data":{"event_type":"callfence.probe","id":"short","payload":{"node":"M3"}}}"#),
            Some(Err(ProbeError::BadNonce))
        );
        assert_eq!(
            parse_body(br#"{"data":{"event_type":"callfence.probe"}}"#),
            Some(Err(ProbeError::BadRequest))
        );
    }

    #[test]
    fn one_probe_per_node_per_five_seconds() {
        assert_eq!(rate_limit(None, 1_000), Ok(()));
        assert_eq!(rate_limit(Some(1_000), 1_000), Err(5));
        assert_eq!(rate_limit(Some(1_000), 5_000), Err(1));
        assert_eq!(rate_limit(Some(1_000), 5_999), Err(1));
        assert_eq!(rate_limit(Some(1_000), 6_000), Ok(()));
        // A clock that went backwards does not lock the node out.
        assert_eq!(rate_limit(Some(9_000), 1_000), Ok(()));
    }

    #[test]
    fn ok_only_for_a_2xx_echoing_the_nonce() {
        let http = |status, body: &str| ReportedAnswer::Http {
            status,
            body: body.into(),
        };
        let good = format!(r#"{{"probe":"{NONCE}","sha":"abc"}}"#);
        let a = evaluate(NONCE, &http(200, &good), 12);
        assert_eq!(
            a,
            ProbeAnswer {
                ok: true,
                status: Some(200),
                latency_ms: 12,
                sha: Some("abc".into()),
                reason: "ok"
            }
        );
        assert_eq!(evaluate(NONCE, &http(503, &good), 1).reason, "http_status");
        assert!(!evaluate(NONCE, &http(503, &good), 1).ok);
        let other = r#"{"probe":"someoneelsesnonce000","sha":"abc"}"#;
        assert_eq!(
            evaluate(NONCE, &http(200, other), 1).reason,
            "nonce_mismatch"
        );
        assert_eq!(evaluate(NONCE, &http(200, "ok"), 1).reason, "not_json");
        let t = evaluate(NONCE, &ReportedAnswer::Timeout, 1500);
        assert_eq!((t.ok, t.status, t.reason), (false, None, "timeout"));
        let n = evaluate(NONCE, &ReportedAnswer::NetworkError, 3);
        assert_eq!((n.ok, n.reason), (false, "network_error"));
        let long_sha = format!(r#"{{"probe":"{NONCE}","sha":"{}"}}"#, "a".repeat(65));
        assert_eq!(evaluate(NONCE, &http(200, &long_sha), 1).sha, None);
    }
}
