//! The edge's origin assertion (SPEC §7 "Assertion"): the
//! `Callfence-Assertion` header the Worker adds to every forwarded webhook,
//! `v1.{kid}.{payload}.{sig}`, binding the forward to one node, session,
//! epoch, attempt and body for 60 seconds.
//!
//! `payload` is unpadded base64url of the JSON [`Claims`]; `sig` is unpadded
//! base64url of the Ed25519 signature with the edge key over the ASCII
//! `v1.{kid}.{payload}`. The node agent verifies it against keys pinned in
//! its configuration.
//!
//! Two kinds exist: a webhook's [`Claims`] (session, leg, epoch, attempt)
//! and a probe's [`ProbeClaims`] (`"probe": true`, none of those; SPEC §14).
//! [`verify`] admits only the [`Kind`] it is asked for (a payload of the
//! other kind is [`AssertionError::WrongKind`]), so a
//! webhook assertion can never carry a probe and a probe assertion can never
//! carry a call.

use std::fmt;

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

use crate::encoding::{b64url_decode, b64url_encode, ct_eq, sha256_hex};

/// The header that carries an assertion.
pub const HEADER: &str = "Callfence-Assertion";

/// The only issuer: the edge.
pub const ISSUER: &str = "callfence-edge";

/// How long an assertion lives, in seconds.
pub const TTL_S: i64 = 60;

/// Longest header value [`verify`] reads.
pub const MAX_HEADER_BYTES: usize = 4096;

/// Longest key id, in bytes.
pub const MAX_KID_BYTES: usize = 64;

/// The scheme's version prefix.
const VERSION: &str = "v1";

/// What an assertion states about one forward.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// Always [`ISSUER`].
    pub iss: String,
    /// The node the event is forwarded to (its owner).
    pub node: String,
    /// The call session.
    pub call_session_id: String,
    /// The leg the event is about, when it names one.
    pub call_control_id: Option<String>,
    /// The event id (`data.id`).
    pub event_id: String,
    /// The ownership epoch the forward is sent under.
    pub epoch: u64,
    /// Which attempt of this event's delivery this is (1 for the first).
    pub attempt: u32,
    /// Lowercase hex SHA-256 of the raw body forwarded.
    pub body_sha256: String,
    /// Issued at, Unix seconds.
    pub iat: i64,
    /// Expires at, Unix seconds ([`TTL_S`] after `iat`).
    pub exp: i64,
}

/// What a probe's assertion states (SPEC §14): no call session, leg, epoch
/// or attempt; `event_id` is the probe's nonce.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeClaims {
    /// Always [`ISSUER`].
    pub iss: String,
    /// The node probed.
    pub node: String,
    /// Always true.
    pub probe: bool,
    /// The probe's nonce (`data.id` of the probe body).
    pub event_id: String,
    /// Lowercase hex SHA-256 of the probe body.
    pub body_sha256: String,
    /// Issued at, Unix seconds.
    pub iat: i64,
    /// Expires at, Unix seconds ([`TTL_S`] after `iat`).
    pub exp: i64,
}

/// Builds a probe's claims for `node`, `nonce` and the probe `body`.
pub fn probe_claims_for(node: &str, nonce: &str, body: &[u8], now_ms: i64) -> ProbeClaims {
    let iat = now_ms.div_euclid(1000);
    ProbeClaims {
        iss: ISSUER.to_string(),
        node: node.to_string(),
        probe: true,
        event_id: nonce.to_string(),
        body_sha256: sha256_hex(body),
        iat,
        exp: iat.saturating_add(TTL_S),
    }
}

/// Builds the claims for one forward: issuer [`ISSUER`], `iat` now in whole
/// seconds, `exp` [`TTL_S`] later, and the body's SHA-256.
#[allow(clippy::too_many_arguments)]
pub fn claims_for(
    node: &str,
    call_session_id: &str,
    call_control_id: Option<&str>,
    event_id: &str,
    epoch: u64,
    attempt: u32,
    body: &[u8],
    now_ms: i64,
) -> Claims {
    let iat = now_ms.div_euclid(1000);
    Claims {
        iss: ISSUER.to_string(),
        node: node.to_string(),
        call_session_id: call_session_id.to_string(),
        call_control_id: call_control_id.map(str::to_string),
        event_id: event_id.to_string(),
        epoch,
        attempt,
        body_sha256: sha256_hex(body),
        iat,
        exp: iat.saturating_add(TTL_S),
    }
}

/// Signs `claims` (a [`Claims`] or a [`ProbeClaims`]) with the edge key
/// `key` named `kid`, giving the header value `v1.{kid}.{payload}.{sig}`.
pub fn mint(kid: &str, key: &SigningKey, claims: &impl Serialize) -> String {
    // Serialising a struct of strings and integers cannot fail; an empty
    // payload would only make a token that never verifies (fail closed).
    let json = serde_json::to_vec(claims).unwrap_or_default();
    let signed = format!("{VERSION}.{kid}.{}", b64url_encode(&json));
    let sig = key.sign(signed.as_bytes());
    format!("{signed}.{}", b64url_encode(&sig.to_bytes()))
}

/// Why an assertion was refused (the agent answers 401 `not_admitted`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AssertionError {
    /// Not `v1.{kid}.{payload}.{sig}`, too long, or a signed payload that
    /// is not the claims JSON of issuer [`ISSUER`].
    Malformed,
    /// The kid is not among the pinned edge keys.
    UnknownKid,
    /// The signature is not base64url of 64 bytes or does not verify.
    BadSignature,
    /// Past `exp`, or issued in the future, beyond the allowed skew.
    Expired,
    /// Issued for another node.
    WrongNode,
    /// The body's SHA-256 differs from `body_sha256`.
    BodyMismatch,
    /// A probe assertion offered for a webhook, or a webhook assertion for
    /// a probe.
    WrongKind,
}

impl AssertionError {
    /// Stable code: `malformed_assertion`, `unknown_kid`, `bad_signature`,
    /// `expired`, `wrong_node`, `body_mismatch` or `wrong_kind`.
    pub fn code(&self) -> &'static str {
        match self {
            AssertionError::Malformed => "malformed_assertion",
            AssertionError::UnknownKid => "unknown_kid",
            AssertionError::BadSignature => "bad_signature",
            AssertionError::Expired => "expired",
            AssertionError::WrongNode => "wrong_node",
            AssertionError::BodyMismatch => "body_mismatch",
            AssertionError::WrongKind => "wrong_kind",
        }
    }
}

impl fmt::Display for AssertionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AssertionError::Malformed => "assertion is malformed",
            AssertionError::UnknownKid => "assertion key id is not pinned",
            AssertionError::BadSignature => "assertion signature does not verify",
            AssertionError::Expired => "assertion is expired or not yet valid",
            AssertionError::WrongNode => "assertion names another node",
            AssertionError::BodyMismatch => "assertion does not match the body",
            AssertionError::WrongKind => "assertion is for another kind of forward",
        })
    }
}

impl std::error::Error for AssertionError {}

/// The claims every assertion carries, whatever its kind.
#[derive(Deserialize)]
struct Common {
    iss: String,
    node: String,
    body_sha256: String,
    iat: i64,
    exp: i64,
}

/// A kind of assertion: [`Claims`] (a webhook) or [`ProbeClaims`] (a probe).
pub trait Kind: serde::de::DeserializeOwned {
    /// True when the payload is of this kind (checked after the common
    /// checks, before the payload is read as this type).
    fn is_kind(payload: &serde_json::Value) -> bool;
}

impl Kind for Claims {
    /// A webhook assertion never carries the probe flag.
    fn is_kind(payload: &serde_json::Value) -> bool {
        payload.get("probe").is_none()
    }
}

impl Kind for ProbeClaims {
    /// A probe assertion is `"probe": true` and names no session, leg,
    /// epoch or attempt.
    fn is_kind(payload: &serde_json::Value) -> bool {
        let call_fields = ["call_session_id", "call_control_id", "epoch", "attempt"];
        payload.get("probe") == Some(&serde_json::Value::Bool(true))
            && call_fields.iter().all(|f| payload.get(f).is_none())
    }
}

/// Verifies an assertion header of kind `K` for `node` and the raw `body`
/// it came with, against the pinned edge keys, allowing `skew_s` seconds of
/// clock skew (negative counts as 0). Returns the claims when every check
/// holds; an assertion of the other kind is [`AssertionError::WrongKind`].
///
/// Order: shape, kid, signature, claims JSON and issuer, time, node, body, kind.
pub fn verify<K: Kind>(
    header: &str,
    pinned: &[(String, VerifyingKey)],
    node: &str,
    body: &[u8],
    now_ms: i64,
    skew_s: i64,
) -> Result<K, AssertionError> {
    if header.len() > MAX_HEADER_BYTES {
        return Err(AssertionError::Malformed);
    }
    let Some([version, kid, payload, sig]) = crate::encoding::split_token(header) else {
        return Err(AssertionError::Malformed);
    };
    if version != VERSION || kid.is_empty() || kid.len() > MAX_KID_BYTES || payload.is_empty() {
        return Err(AssertionError::Malformed);
    }
    let key = pinned
        .iter()
        .find(|(k, _)| k == kid)
        .map(|(_, key)| key)
        .ok_or(AssertionError::UnknownKid)?;
    let sig = b64url_decode(sig).ok_or(AssertionError::BadSignature)?;
    let sig: [u8; 64] = sig
        .as_slice()
        .try_into()
        .map_err(|_| AssertionError::BadSignature)?;
    // `v1.{kid}.{payload}`: everything before the last dot.
    let signed = &header[..VERSION.len() + kid.len() + payload.len() + 2];
    key.verify_strict(signed.as_bytes(), &Signature::from_bytes(&sig))
        .map_err(|_| AssertionError::BadSignature)?;

    let json = b64url_decode(payload).ok_or(AssertionError::Malformed)?;
    let value: serde_json::Value =
        serde_json::from_slice(&json).map_err(|_| AssertionError::Malformed)?;
    let claims: Common =
        serde_json::from_value(value.clone()).map_err(|_| AssertionError::Malformed)?;
    if claims.iss != ISSUER || !value.is_object() {
        return Err(AssertionError::Malformed);
    }
    let now_s = now_ms.div_euclid(1000);
    let skew = skew_s.max(0);
    if claims.exp.saturating_add(skew) < now_s || claims.iat.saturating_sub(skew) > now_s {
        return Err(AssertionError::Expired);
    }
    if claims.node != node {
        return Err(AssertionError::WrongNode);
    }
    if !ct_eq(claims.body_sha256.as_bytes(), sha256_hex(body).as_bytes()) {
        return Err(AssertionError::BodyMismatch);
    }
    if !K::is_kind(&value) {
        return Err(AssertionError::WrongKind);
    }
    serde_json::from_value(value).map_err(|_| AssertionError::Malformed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NOW_MS: i64 = 1_796_000_000_500;

    /// The webhook kind, which most of these tests check.
    #[allow(non_upper_case_globals)]
    const verify: VerifyFn<Claims> = super::verify::<Claims>;
    type VerifyFn<K> =
        fn(&str, &[(String, VerifyingKey)], &str, &[u8], i64, i64) -> Result<K, AssertionError>;
    const BODY: &[u8] = br#"{"data":{"id":"ev-1"}}"#;

    fn edge_key() -> SigningKey {
        SigningKey::from_bytes(&[9; 32])
    }

    fn pinned() -> Vec<(String, VerifyingKey)> {
        vec![
            (
                "old".to_string(),
                SigningKey::from_bytes(&[8; 32]).verifying_key(),
            ),
            ("e1".to_string(), edge_key().verifying_key()),
        ]
    }

    fn claims() -> Claims {
        claims_for("M3", "s-1", Some("v3:abc"), "ev-1", 7, 1, BODY, NOW_MS)
    }

    fn token() -> String {
        mint("e1", &edge_key(), &claims())
    }

    #[test]
    fn claims_for_fills_issuer_times_and_digest() {
        let c = claims();
        assert_eq!(c.iss, "callfence-edge");
        assert_eq!(c.iat, 1_796_000_000);
        assert_eq!(c.exp, 1_796_000_060);
        assert_eq!(c.body_sha256, sha256_hex(BODY));
        assert_eq!(c.call_control_id.as_deref(), Some("v3:abc"));
    }

    #[test]
    fn mint_verify_round_trip() {
        let t = token();
        assert!(t.starts_with("v1.e1."));
        assert_eq!(t.split('.').count(), 4);
        assert!(!t.contains('='), "unpadded base64url");
        assert_eq!(verify(&t, &pinned(), "M3", BODY, NOW_MS, 10), Ok(claims()));
        // A claims payload without call_control_id round-trips as null.
        let mut c = claims();
        c.call_control_id = None;
        let t = mint("e1", &edge_key(), &c);
        assert_eq!(verify(&t, &pinned(), "M3", BODY, NOW_MS, 10), Ok(c));
    }

    #[test]
    fn payload_is_the_documented_json() {
        let t = token();
        let payload = t.split('.').nth(2).unwrap();
        let json: serde_json::Value =
            serde_json::from_slice(&b64url_decode(payload).unwrap()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"iss":"callfence-edge","node":"M3","call_session_id":"s-1",
                "call_control_id":"v3:abc","event_id":"ev-1","epoch":7,"attempt":1,
                "body_sha256": sha256_hex(BODY),"iat":1_796_000_000i64,"exp":1_796_000_060i64})
        );
    }

    #[test]
    fn malformed() {
        let t = token();
        let m = Err(AssertionError::Malformed);
        assert_eq!(verify("", &pinned(), "M3", BODY, NOW_MS, 10), m);
        assert_eq!(verify("v1.e1.x", &pinned(), "M3", BODY, NOW_MS, 10), m);
        assert_eq!(
            verify(&format!("{t}.x"), &pinned(), "M3", BODY, NOW_MS, 10),
            m
        );
        assert_eq!(
            verify(
                &t.replacen("v1.", "v2.", 1),
                &pinned(),
                "M3",
                BODY,
                NOW_MS,
                10
            ),
            m
        );
        let long = format!("{t}{}", "A".repeat(MAX_HEADER_BYTES));
        assert_eq!(verify(&long, &pinned(), "M3", BODY, NOW_MS, 10), m);
        // A correctly signed payload that is not the claims JSON.
        let signed = format!("v1.e1.{}", b64url_encode(b"[1,2]"));
        let sig = b64url_encode(&edge_key().sign(signed.as_bytes()).to_bytes());
        assert_eq!(
            verify(
                &format!("{signed}.{sig}"),
                &pinned(),
                "M3",
                BODY,
                NOW_MS,
                10
            ),
            m
        );
        // A correctly signed token with another issuer.
        let mut c = claims();
        c.iss = "someone-else".into();
        let t = mint("e1", &edge_key(), &c);
        assert_eq!(verify(&t, &pinned(), "M3", BODY, NOW_MS, 10), m);
        assert_eq!(AssertionError::Malformed.code(), "malformed_assertion");
    }

    #[test]
    fn unknown_kid() {
        let t = mint("e2", &edge_key(), &claims());
        let got = verify(&t, &pinned(), "M3", BODY, NOW_MS, 10);
        assert_eq!(got, Err(AssertionError::UnknownKid));
        assert_eq!(got.unwrap_err().code(), "unknown_kid");
    }

    #[test]
    fn bad_signature() {
        let bad = Err(AssertionError::BadSignature);
        // Signed by another key under a pinned kid.
        let t = mint("e1", &SigningKey::from_bytes(&[1; 32]), &claims());
        assert_eq!(verify(&t, &pinned(), "M3", BODY, NOW_MS, 10), bad);
        // Signed by the key pinned as "old" but presented as "e1".
        let t = mint("old", &SigningKey::from_bytes(&[8; 32]), &claims());
        assert_eq!(
            verify(&t, &pinned(), "M3", BODY, NOW_MS, 10).map(|c| c.node),
            Ok("M3".into())
        );
        let relabelled = t.replacen("v1.old.", "v1.e1.", 1);
        assert_eq!(verify(&relabelled, &pinned(), "M3", BODY, NOW_MS, 10), bad);
        // Payload swapped under the original signature.
        let t = token();
        let parts: Vec<&str> = t.split('.').collect();
        let mut c = claims();
        c.epoch = 8;
        let other = mint("e1", &edge_key(), &c);
        let other_payload = other.split('.').nth(2).unwrap();
        let swapped = format!("v1.e1.{other_payload}.{}", parts[3]);
        assert_eq!(verify(&swapped, &pinned(), "M3", BODY, NOW_MS, 10), bad);
        // Signature not base64url, or not 64 bytes.
        let bad_b64 = format!("v1.e1.{}.{}=", parts[2], parts[3]);
        assert_eq!(verify(&bad_b64, &pinned(), "M3", BODY, NOW_MS, 10), bad);
        let short = format!("v1.e1.{}.{}", parts[2], b64url_encode(&[0; 63]));
        assert_eq!(verify(&short, &pinned(), "M3", BODY, NOW_MS, 10), bad);
        assert_eq!(AssertionError::BadSignature.code(), "bad_signature");
    }

    #[test]
    fn expired_and_not_yet_valid() {
        let t = token();
        let exp_ms = 1_796_000_060_000;
        let expired = Err(AssertionError::Expired);
        // Still valid at exp + skew, expired one second later.
        assert!(verify(&t, &pinned(), "M3", BODY, exp_ms + 10_999, 10).is_ok());
        assert_eq!(
            verify(&t, &pinned(), "M3", BODY, exp_ms + 11_000, 10),
            expired
        );
        assert_eq!(
            verify(&t, &pinned(), "M3", BODY, exp_ms + 1_000, 0),
            expired
        );
        // Issued more than the skew ahead of the verifier's clock.
        let iat_ms = 1_796_000_000_000;
        assert!(verify(&t, &pinned(), "M3", BODY, iat_ms - 10_000, 10).is_ok());
        assert_eq!(
            verify(&t, &pinned(), "M3", BODY, iat_ms - 11_000, 10),
            expired
        );
        // A negative skew counts as none.
        assert!(verify(&t, &pinned(), "M3", BODY, iat_ms, -50).is_ok());
        assert_eq!(AssertionError::Expired.code(), "expired");
    }

    #[test]
    fn wrong_node_and_body_mismatch() {
        let t = token();
        let got = verify(&t, &pinned(), "M4", BODY, NOW_MS, 10);
        assert_eq!(got, Err(AssertionError::WrongNode));
        assert_eq!(got.unwrap_err().code(), "wrong_node");
        let got = verify(&t, &pinned(), "M3", b"{}", NOW_MS, 10);
        assert_eq!(got, Err(AssertionError::BodyMismatch));
        assert_eq!(got.unwrap_err().code(), "body_mismatch");
    }

    #[test]
    fn probe_and_webhook_assertions_never_stand_in_for_each_other() {
        let probe_body = br#"{"data":{"event_type":"callfence.probe","id":"n0nce-n0nce-n0nce"}}"#;
        let pc = probe_claims_for("M3", "n0nce-n0nce-n0nce", probe_body, NOW_MS);
        let pt = mint("e1", &edge_key(), &pc);
        assert_eq!(
            super::verify::<ProbeClaims>(&pt, &pinned(), "M3", probe_body, NOW_MS, 10),
            Ok(pc.clone())
        );
        let json: serde_json::Value =
            serde_json::from_slice(&b64url_decode(pt.split('.').nth(2).unwrap()).unwrap()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"iss":"callfence-edge","node":"M3","probe":true,
                "event_id":"n0nce-n0nce-n0nce","body_sha256":sha256_hex(probe_body),
                "iat":1_796_000_000i64,"exp":1_796_000_060i64})
        );
        // A probe assertion is never a webhook's.
        assert_eq!(
            verify(&pt, &pinned(), "M3", probe_body, NOW_MS, 10),
            Err(AssertionError::WrongKind)
        );
        // A webhook assertion is never a probe's, even over the same body.
        let wc = claims_for(
            "M3",
            "s-1",
            None,
            "n0nce-n0nce-n0nce",
            7,
            1,
            probe_body,
            NOW_MS,
        );
        let wt = mint("e1", &edge_key(), &wc);
        let got = super::verify::<ProbeClaims>(&wt, &pinned(), "M3", probe_body, NOW_MS, 10);
        assert_eq!(got, Err(AssertionError::WrongKind));
        assert_eq!(got.unwrap_err().code(), "wrong_kind");
        // A webhook assertion with a stray probe flag is refused both ways.
        let mut forged = serde_json::to_value(&wc).unwrap();
        forged["probe"] = serde_json::Value::Bool(true);
        let ft = mint("e1", &edge_key(), &forged);
        assert_eq!(
            super::verify::<ProbeClaims>(&ft, &pinned(), "M3", probe_body, NOW_MS, 10),
            Err(AssertionError::WrongKind)
        );
        assert_eq!(
            verify(&ft, &pinned(), "M3", probe_body, NOW_MS, 10),
            Err(AssertionError::WrongKind)
        );
        // The common checks still apply to probes.
        assert_eq!(
            super::verify::<ProbeClaims>(&pt, &pinned(), "M4", probe_body, NOW_MS, 10),
            Err(AssertionError::WrongNode)
        );
        assert_eq!(
            super::verify::<ProbeClaims>(&pt, &pinned(), "M3", b"{}", NOW_MS, 10),
            Err(AssertionError::BodyMismatch)
        );
    }

    proptest! {
        #[test]
        fn verify_never_panics(header in ".{0,300}", now_ms in any::<i64>(), skew in any::<i64>()) {
            let _ = verify(&header, &pinned(), "M3", BODY, now_ms, skew);
        }

        #[test]
        fn verify_never_panics_on_token_like_text(
            header in "v1\\.(e1|old|x)\\.[A-Za-z0-9_-]{0,200}\\.[A-Za-z0-9_-]{0,100}",
            now_ms in any::<i64>(),
        ) {
            let _ = verify(&header, &pinned(), "M3", BODY, now_ms, 10);
        }

        #[test]
        fn minted_claims_survive_any_strings(
            node in ".{0,40}", session in ".{0,40}", event in ".{0,40}",
            epoch in 0u64..(1 << 53), attempt in any::<u32>(),
        ) {
            let c = claims_for(&node, &session, None, &event, epoch, attempt, BODY, NOW_MS);
            let t = mint("e1", &edge_key(), &c);
            prop_assert_eq!(verify(&t, &pinned(), &node, BODY, NOW_MS, 10), Ok(c));
        }
    }
}
