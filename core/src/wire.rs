//! The node routes' bodies (SPEC §6–§8) as the types both ends serialise:
//! the node agent writes the requests and reads the answers, the Dispatcher
//! reads the requests and writes the answers. Nobody spells these bodies with
//! string keys.
//!
//! | route | request | 200 | refusal (409) |
//! |---|---|---|---|
//! | `POST /v1/fence` | [`FenceRequest`] | [`FenceGrant`] | [`FenceRefused`] |
//! | `POST /v1/claims` | [`ClaimRequest`] | [`Claimed`] | [`ClaimRefused`] |
//! | `POST /v1/media/verify` | [`MediaVerifyRequest`] | [`MediaValid`] | [`MediaInvalid`] |
//! | `POST /v1/nodes/heartbeat` | [`crate::heartbeat::Heartbeat`] | [`HeartbeatAnswer`] | (400/401/409 errors) |
//!
//! A refusal body also carries the stable `error` code the Worker adds to
//! every error answer; the types here ignore fields they do not know, so an
//! answer from a Dispatcher one version ahead still reads. Requests are
//! parsed with limits ([`FenceRequest::parse`] and friends): a body that
//! fails is a 400 `bad_request` and changes nothing.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The largest fence, claim or media-verify body (4 KiB).
pub const MAX_SMALL_BODY: usize = 4096;
/// The longest id (session, leg) accepted.
pub const MAX_ID_LEN: usize = 256;
/// The longest media token accepted.
pub const MAX_MEDIA_TOKEN_LEN: usize = crate::media::MAX_TOKEN_BYTES;

/// A request body that does not parse or breaks a limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRequest(pub String);

impl std::fmt::Display for BadRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Parses a JSON body of at most [`MAX_SMALL_BODY`] bytes.
pub(crate) fn parse_small<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, BadRequest> {
    if body.len() > MAX_SMALL_BODY {
        return Err(BadRequest("body over 4 KiB".into()));
    }
    serde_json::from_slice(body).map_err(|e| BadRequest(format!("invalid body: {e}")))
}

fn check_id(name: &str, value: &str) -> Result<(), BadRequest> {
    if value.is_empty() || value.len() > MAX_ID_LEN {
        return Err(BadRequest(format!(
            "{name} must be 1 to {MAX_ID_LEN} bytes"
        )));
    }
    Ok(())
}

fn check_epoch(epoch: u64) -> Result<(), BadRequest> {
    if epoch == 0 || epoch > crate::MAX_SAFE_INTEGER {
        return Err(BadRequest("epoch out of range".into()));
    }
    Ok(())
}

// ------------------------------------------------------------------ fence ----

/// What a fence is asked for. Only answering is fenced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FencePurpose {
    /// The Telnyx `answer` of the leg.
    Answer,
}

/// `POST /v1/fence`: may this node answer this leg under this epoch?
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceRequest {
    /// The session to answer.
    pub call_session_id: String,
    /// The leg to answer.
    pub call_control_id: String,
    /// The epoch the node was given in its assertion.
    pub epoch: u64,
    /// Always [`FencePurpose::Answer`].
    pub purpose: FencePurpose,
}

impl FenceRequest {
    /// A request to answer `call_control_id` of `call_session_id` under `epoch`.
    pub fn answer(call_session_id: &str, call_control_id: &str, epoch: u64) -> Self {
        Self {
            call_session_id: call_session_id.to_owned(),
            call_control_id: call_control_id.to_owned(),
            epoch,
            purpose: FencePurpose::Answer,
        }
    }

    /// Parses and checks a fence body.
    pub fn parse(body: &[u8]) -> Result<Self, BadRequest> {
        let req: Self = parse_small(body)?;
        check_id("call_session_id", &req.call_session_id)?;
        check_id("call_control_id", &req.call_control_id)?;
        check_epoch(req.epoch)?;
        Ok(req)
    }
}

/// A fence grant (200).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceGrant {
    /// Always true.
    pub granted: bool,
    /// True for the first grant, false when the same owner asks again.
    pub first: bool,
    /// The epoch granted.
    pub epoch: u64,
    /// The deterministic answer command id ([`crate::fence::command_id`]).
    pub command_id: String,
    /// The media token for this call ([`crate::media`]).
    pub media_token: String,
    /// When the fence was first granted (RFC 3339).
    pub granted_at: String,
}

/// Why a fence is refused (409).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FenceRefusal {
    /// The epoch is not the session's current one.
    StaleEpoch,
    /// The caller does not own the session.
    NotOwner,
    /// Every leg has hung up.
    CallEnded,
    /// No such session or leg.
    UnknownCall,
}

/// A refused fence (409), beside the `error` code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceRefused {
    /// Always false.
    pub granted: bool,
    /// Why.
    pub reason: FenceRefusal,
}

impl From<FenceRefusal> for FenceRefused {
    fn from(reason: FenceRefusal) -> Self {
        Self {
            granted: false,
            reason,
        }
    }
}

// ----------------------------------------------------------------- claims ----

/// `POST /v1/claims`: the node dialled this leg and claims its session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRequest {
    /// The leg the node dialled.
    pub call_control_id: String,
    /// Its session.
    pub call_session_id: String,
}

impl ClaimRequest {
    /// Parses and checks a claim body.
    pub fn parse(body: &[u8]) -> Result<Self, BadRequest> {
        let req: Self = parse_small(body)?;
        check_id("call_session_id", &req.call_session_id)?;
        check_id("call_control_id", &req.call_control_id)?;
        Ok(req)
    }
}

/// A granted claim (200): the node owns the session at `epoch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claimed {
    /// Always true.
    pub claimed: bool,
    /// The session.
    pub call_session_id: String,
    /// The epoch the node now owns it at.
    pub epoch: u64,
}

impl Claimed {
    /// The answer for `call_session_id` owned at `epoch`.
    pub fn new(call_session_id: &str, epoch: u64) -> Self {
        Self {
            claimed: true,
            call_session_id: call_session_id.to_owned(),
            epoch,
        }
    }
}

/// Why a claim is refused (409). A claim over the node's rate is a 429
/// `rate_limited` instead, and one at `SESSION_CAP` a 503 `storage_full`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClaimRefusal {
    /// Another node owns the session, or it is an inbound session the policy
    /// decides.
    AlreadyOwned,
    /// The claim would take the node over its capacity (v1.4).
    CapacityExhausted,
}

/// A refused claim (409), beside the `error` code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRefused {
    /// Always false.
    pub claimed: bool,
    /// Why.
    pub reason: ClaimRefusal,
}

impl From<ClaimRefusal> for ClaimRefused {
    fn from(reason: ClaimRefusal) -> Self {
        Self {
            claimed: false,
            reason,
        }
    }
}

// ------------------------------------------------------------------ media ----

/// `POST /v1/media/verify`: is this media token still good for this node?
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MediaVerifyRequest {
    /// The token from the fence grant.
    pub media_token: String,
}

impl MediaVerifyRequest {
    /// Parses and checks a media-verify body.
    pub fn parse(body: &[u8]) -> Result<Self, BadRequest> {
        let req: Self = parse_small(body)?;
        req.check()?;
        Ok(req)
    }

    /// Checks the token's length: 1 to [`MAX_MEDIA_TOKEN_LEN`] bytes.
    pub fn check(&self) -> Result<(), BadRequest> {
        if self.media_token.is_empty() || self.media_token.len() > MAX_MEDIA_TOKEN_LEN {
            return Err(BadRequest(format!(
                "media_token must be 1 to {MAX_MEDIA_TOKEN_LEN} bytes"
            )));
        }
        Ok(())
    }
}

/// A valid media token (200).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MediaValid {
    /// Always true.
    pub valid: bool,
    /// The session.
    pub call_session_id: String,
    /// The fenced epoch.
    pub epoch: u64,
}

impl MediaValid {
    /// The answer for a token good for `call_session_id` at `epoch`.
    pub fn new(call_session_id: &str, epoch: u64) -> Self {
        Self {
            valid: true,
            call_session_id: call_session_id.to_owned(),
            epoch,
        }
    }
}

/// Why a media token is refused (409).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MediaRefusal {
    /// Bad format, MAC or key, or an unknown call.
    BadToken,
    /// Past its `exp`.
    Expired,
    /// Minted for another node, or the caller no longer owns the call.
    NotOwner,
    /// Minted for an epoch that is not the call's current one.
    StaleEpoch,
    /// No fence was granted at that epoch.
    NotFenced,
    /// Every leg has hung up.
    CallEnded,
}

/// A refused media token (409), beside the `error` code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MediaInvalid {
    /// Always false.
    pub valid: bool,
    /// Why.
    pub reason: MediaRefusal,
}

impl From<MediaRefusal> for MediaInvalid {
    fn from(reason: MediaRefusal) -> Self {
        Self {
            valid: false,
            reason,
        }
    }
}

// -------------------------------------------------------------- heartbeat ----

/// The routing view a heartbeat answer carries: the policy's lines and their
/// [`crate::heartbeat::routing_hash`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RoutingView {
    /// The routing hash of `lines`.
    pub hash: String,
    /// Line id → called number, as the policy in force has them.
    pub lines: BTreeMap<String, String>,
}

impl RoutingView {
    /// The view of `lines`, with their hash.
    pub fn of(lines: BTreeMap<String, String>) -> Self {
        Self {
            hash: crate::heartbeat::routing_hash(&lines),
            lines,
        }
    }
}

/// An accepted heartbeat's answer (200).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatAnswer {
    /// Always true.
    pub accepted: bool,
    /// True when the node has no call-independent reason against it.
    pub eligible: bool,
    /// The call-independent eligibility reason codes
    /// ([`crate::eligibility::Reason::code`]), in reporting order. Kept as
    /// codes, not the enum, so an agent one version behind still reads an
    /// answer that names a reason it does not know.
    pub reasons: Vec<String>,
    /// The edge's clock at receipt (RFC 3339 with milliseconds).
    pub edge_time: String,
    /// The lines the policy in force routes.
    pub routing: RoutingView,
    /// The registry's `allowed_shas` for this node: `null` when it lists
    /// none (any clean SHA may be deployed), absent from an edge that does
    /// not report it (a deploy then refuses: it cannot check promotion).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub allowed_shas: Option<Option<Vec<String>>>,
}

/// A field that is present (even as `null`) reads as `Some`; an absent one
/// keeps its default, `None`.
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

impl HeartbeatAnswer {
    /// The answer for an accepted beat.
    pub fn new(
        reasons: &[crate::eligibility::Reason],
        now_ms: i64,
        routing: RoutingView,
        allowed_shas: Option<Vec<String>>,
    ) -> Self {
        Self {
            accepted: true,
            eligible: reasons.is_empty(),
            reasons: reasons.iter().map(|r| r.code().to_owned()).collect(),
            edge_time: crate::time::format_ms(now_ms),
            routing,
            allowed_shas: Some(allowed_shas),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eligibility::Reason;
    use serde_json::{json, Value};

    fn to_json(value: &impl Serialize) -> Value {
        serde_json::to_value(value).unwrap()
    }

    #[test]
    fn fence_bodies_are_checked() {
        let ok = br#"{"call_session_id":"s","call_control_id":"c","epoch":3,"purpose":"answer"}"#;
        assert_eq!(
            FenceRequest::parse(ok).unwrap(),
            FenceRequest::answer("s", "c", 3)
        );
        for bad in [
            &br#"{"call_session_id":"s","call_control_id":"c","epoch":3,"purpose":"hangup"}"#[..],
            br#"{"call_session_id":"","call_control_id":"c","epoch":3,"purpose":"answer"}"#,
            br#"{"call_session_id":"s","call_control_id":"c","epoch":0,"purpose":"answer"}"#,
            br#"{"call_session_id":"s","call_control_id":"c","epoch":9007199254740992,"purpose":"answer"}"#,
            br#"{"call_session_id":"s","call_control_id":"c","epoch":-1,"purpose":"answer"}"#,
            br#"{"call_session_id":"s","call_control_id":"c","epoch":3}"#,
            br#"{"call_session_id":"s"}"#,
            b"not json",
        ] {
            let got = FenceRequest::parse(bad);
            assert!(got.is_err(), "{}", String::from_utf8_lossy(bad));
        }
        let long = format!(
            r#"{{"call_session_id":"{}","call_control_id":"c","epoch":3,"purpose":"answer"}}"#,
            "s".repeat(MAX_ID_LEN + 1)
        );
        assert!(FenceRequest::parse(long.as_bytes()).is_err());
        assert!(FenceRequest::parse(&vec![b' '; MAX_SMALL_BODY + 1]).is_err());
    }

    #[test]
    fn claim_and_media_bodies_are_checked() {
        assert!(ClaimRequest::parse(br#"{"call_control_id":"c","call_session_id":"s"}"#).is_ok());
        assert!(ClaimRequest::parse(br#"{"call_control_id":"c"}"#).is_err());
        assert!(ClaimRequest::parse(br#"{"call_control_id":"","call_session_id":"s"}"#).is_err());
        assert!(MediaVerifyRequest::parse(br#"{"media_token":""}"#).is_err());
        assert!(MediaVerifyRequest::parse(br#"{"media_token":"v1.a.b.c"}"#).is_ok());
        let long = MediaVerifyRequest {
            media_token: "t".repeat(MAX_MEDIA_TOKEN_LEN + 1),
        };
        assert!(long.check().is_err());
    }

    #[test]
    fn the_request_a_node_writes_is_the_one_the_dispatcher_reads() {
        let req = FenceRequest::answer("sess", "v3:leg", 7);
        let body = serde_json::to_vec(&req).unwrap();
        assert_eq!(FenceRequest::parse(&body).unwrap(), req);
        assert_eq!(
            to_json(&req),
            json!({"call_session_id": "sess", "call_control_id": "v3:leg", "epoch": 7, "purpose": "answer"})
        );
        let claim = ClaimRequest {
            call_control_id: "v3:leg".into(),
            call_session_id: "sess".into(),
        };
        assert_eq!(
            ClaimRequest::parse(&serde_json::to_vec(&claim).unwrap()).unwrap(),
            claim
        );
    }

    #[test]
    fn answers_have_the_contract_shape() {
        let grant = FenceGrant {
            granted: true,
            first: true,
            epoch: 7,
            command_id: "c4e07f5c-f5f3-5972-b761-62c67d5200bc".into(),
            media_token: "v1.m1.p.m".into(),
            granted_at: "2026-11-30T00:53:20.123Z".into(),
        };
        assert_eq!(
            to_json(&grant),
            json!({"granted": true, "first": true, "epoch": 7,
                   "command_id": "c4e07f5c-f5f3-5972-b761-62c67d5200bc",
                   "media_token": "v1.m1.p.m", "granted_at": "2026-11-30T00:53:20.123Z"})
        );
        assert_eq!(
            to_json(&FenceRefused::from(FenceRefusal::StaleEpoch)),
            json!({"granted": false, "reason": "stale_epoch"})
        );
        assert_eq!(
            to_json(&Claimed::new("s", 4)),
            json!({"claimed": true, "call_session_id": "s", "epoch": 4})
        );
        assert_eq!(
            to_json(&ClaimRefused::from(ClaimRefusal::AlreadyOwned)),
            json!({"claimed": false, "reason": "already_owned"})
        );
        assert_eq!(
            to_json(&MediaValid::new("s", 4)),
            json!({"valid": true, "call_session_id": "s", "epoch": 4})
        );
        assert_eq!(
            to_json(&MediaInvalid::from(MediaRefusal::NotFenced)),
            json!({"valid": false, "reason": "not_fenced"})
        );
    }

    #[test]
    fn refusals_read_with_the_error_code_beside_them() {
        // What the Worker sends: its `error` field plus the refusal.
        let body = br#"{"error":"stale_epoch","granted":false,"reason":"stale_epoch"}"#;
        let refused: FenceRefused = serde_json::from_slice(body).unwrap();
        assert_eq!(refused, FenceRefused::from(FenceRefusal::StaleEpoch));
        let body = br#"{"error":"not_owner","valid":false,"reason":"not_owner","later":1}"#;
        let invalid: MediaInvalid = serde_json::from_slice(body).unwrap();
        assert_eq!(invalid.reason, MediaRefusal::NotOwner);
    }

    #[test]
    fn heartbeat_answers_round_trip_and_name_reasons_by_code() {
        let lines = BTreeMap::from([("sales".to_string(), "+15102160079".to_string())]);
        let answer = HeartbeatAnswer::new(
            &[Reason::Dirty, Reason::TunnelDown],
            1_796_000_000_123,
            RoutingView::of(lines.clone()),
            Some(vec!["a".repeat(40)]),
        );
        let value = to_json(&answer);
        assert_eq!(
            value,
            json!({"accepted": true, "eligible": false, "reasons": ["dirty", "tunnel_down"],
                   "edge_time": "2026-11-30T00:53:20.123Z",
                   "routing": {"hash": crate::heartbeat::routing_hash(&lines), "lines": {"sales": "+15102160079"}},
                   "allowed_shas": ["a".repeat(40)]})
        );
        let back: HeartbeatAnswer = serde_json::from_value(value).unwrap();
        assert_eq!(back, answer);
        let plain = HeartbeatAnswer::new(&[], 0, RoutingView::default(), None);
        assert!(plain.eligible);
        assert_eq!(to_json(&plain)["allowed_shas"], Value::Null);
        // A reason this version does not know still reads, and an edge that
        // does not report allowed_shas reads as None.
        let newer = json!({"accepted": true, "eligible": false, "reasons": ["from_the_future"],
                           "edge_time": "2026-11-30T00:53:20.123Z", "routing": {"hash": "", "lines": {}}});
        let read: HeartbeatAnswer = serde_json::from_value(newer).unwrap();
        assert_eq!(read.reasons, ["from_the_future"]);
        assert_eq!(read.allowed_shas, None);
        let listed: HeartbeatAnswer = serde_json::from_value(to_json(&answer)).unwrap();
        assert_eq!(listed.allowed_shas, Some(Some(vec!["a".repeat(40)])));
        let none: HeartbeatAnswer = serde_json::from_value(to_json(&plain)).unwrap();
        assert_eq!(none.allowed_shas, Some(None));
    }
}
