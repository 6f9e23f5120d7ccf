//! Signed inputs as the Worker hands them to the engine: Telnyx webhooks
//! (signed, verified and parsed), node heartbeats, and the registry entries
//! of the documents.

use callfence_core::encoding::b64_encode;
use callfence_core::heartbeat::{routing_hash, Capacity, Heartbeat, Mode, HEARTBEAT_SCHEMA};
use callfence_core::media::MediaKeys;
use callfence_core::telnyx::{self, Envelope, TelnyxKeys};
use ed25519_dalek::{Signer, SigningKey};
use serde_json::{json, Value as Json};
use std::collections::BTreeMap;

/// The virtual clock's start (Unix ms).
pub const T0: i64 = 1_796_000_000_000;

/// The keys of the carrier and of the media tokens.
pub struct Keys {
    pub telnyx_key: SigningKey,
    pub telnyx_keys: TelnyxKeys,
    pub media_keys: MediaKeys,
}

impl Keys {
    pub fn new() -> Self {
        let telnyx_key = SigningKey::from_bytes(&[42; 32]);
        let telnyx_keys =
            TelnyxKeys::parse(&b64_encode(telnyx_key.verifying_key().as_bytes())).expect("keys");
        let media_keys =
            MediaKeys::parse(&format!("m1:{}", b64_encode(&[7u8; 32]))).expect("media keys");
        Self {
            telnyx_key,
            telnyx_keys,
            media_keys,
        }
    }

    /// The Worker's ingress check: signs `body` as Telnyx would at `now_ms`,
    /// verifies it and parses the envelope. Returns the envelope and the
    /// Telnyx headers stored with a first delivery.
    pub fn signed_webhook(&self, body: &str, now_ms: i64) -> (Envelope, Vec<(String, String)>) {
        let ts = (now_ms / 1000).to_string();
        let sig = b64_encode(
            &self
                .telnyx_key
                .sign(format!("{ts}|{body}").as_bytes())
                .to_bytes(),
        );
        telnyx::verify(
            &self.telnyx_keys,
            Some(&sig),
            Some(&ts),
            body.as_bytes(),
            now_ms,
        )
        .expect("signed");
        let envelope = telnyx::parse_envelope(body.as_bytes()).expect("envelope");
        (envelope, vec![("telnyx-timestamp".to_string(), ts)])
    }

    /// An unsigned (zero-signature) copy of `body` is refused by the
    /// Worker's check and never reaches the engine.
    pub fn forged_is_refused(&self, body: &[u8], now_ms: i64) -> bool {
        let ts = (now_ms / 1000).to_string();
        telnyx::verify(
            &self.telnyx_keys,
            Some(&b64_encode(&[0u8; 64])),
            Some(&ts),
            body,
            now_ms,
        )
        .is_err()
    }
}

/// The signing key of node number `i`.
pub fn node_key(i: usize) -> SigningKey {
    SigningKey::from_bytes(&[i as u8 + 1; 32])
}

/// The origin URL of a node.
pub fn origin_url(node: &str) -> String {
    format!(
        "https://{}.example.com/callfence/telnyx",
        node.to_lowercase()
    )
}

/// A registry entry for node number `i`.
pub fn registry_entry(i: usize, role: &str, admin_drained: bool) -> Json {
    json!({"role": role, "origin_url": origin_url(&format!("M{}", i + 1)),
           "keys": {"k1": b64_encode(node_key(i).verifying_key().as_bytes())},
           "canary_go": true, "fallback_approved": false, "admin_drained": admin_drained, "max_calls": 3})
}

/// A call event's body as Telnyx sends it.
pub fn event_body(
    event_id: &str,
    event_type: &str,
    session: &str,
    ccid: &str,
    from: &str,
    to: &str,
    direction: &str,
) -> String {
    json!({"data": {"id": event_id, "event_type": event_type, "record_type": "event",
        "payload": {"call_session_id": session, "call_control_id": ccid, "from": from, "to": to, "direction": direction}}})
    .to_string()
}

/// What a node says of itself in a heartbeat.
pub struct BeatSpec<'a> {
    pub node: &'a str,
    pub seq: u64,
    pub mode: Mode,
    pub sha: String,
    pub dirty: bool,
    pub lines: &'a [(&'a str, &'a str)],
}

/// A heartbeat body sent at `now_ms`, valid for 15 s.
pub fn heartbeat_body(spec: &BeatSpec<'_>, now_ms: i64) -> Vec<u8> {
    let lines: BTreeMap<String, String> = spec
        .lines
        .iter()
        .map(|(l, n)| (l.to_string(), n.to_string()))
        .collect();
    let hb = Heartbeat {
        schema: HEARTBEAT_SCHEMA.into(),
        node: spec.node.into(),
        seq: spec.seq,
        sent_at: callfence_core::time::format_ms(now_ms),
        valid_for_s: 15,
        mode: spec.mode,
        sha: spec.sha.clone(),
        dirty: spec.dirty,
        app_ready: true,
        capacity: Capacity {
            max_calls: 3,
            active_calls: 0,
        },
        tunnel_up: true,
        origin_url: origin_url(spec.node),
        routing_hash: routing_hash(&lines),
        lines,
        agent_version: "sim".into(),
    };
    serde_json::to_vec(&hb).expect("json")
}
