//! Heartbeats (SPEC §6): the signed document a node agent posts every few
//! seconds to describe itself, its parsing and bounds, and the
//! `routing_hash` of a line map (SPEC §5).
//!
//! Parsing only refuses what is malformed. A beat describing an ineligible
//! node (dirty, bad SHA, app down, ...) parses fine; eligibility judges it.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::encoding::sha256_hex;
use crate::MAX_SAFE_INTEGER;

/// The `schema` value of every heartbeat.
pub const HEARTBEAT_SCHEMA: &str = "callfence_heartbeat_v1";

/// Largest heartbeat body, in bytes.
pub const MAX_BODY_BYTES: usize = 16 * 1024;
/// Largest `valid_for_s`.
pub const MAX_VALID_FOR_S: u32 = 30;
/// Most lines one beat may list.
pub const MAX_LINES: usize = 256;
/// Longest node id, in characters.
pub const MAX_NODE_CHARS: usize = 64;
/// Longest line id, in characters.
pub const MAX_LINE_ID_CHARS: usize = 64;
/// Longest applied number, in characters.
pub const MAX_NUMBER_CHARS: usize = 32;
/// Longest `sha`, in characters.
pub const MAX_SHA_CHARS: usize = 64;
/// Longest `origin_url`, in characters.
pub const MAX_ORIGIN_URL_CHARS: usize = 2048;
/// Longest `agent_version`, in characters.
pub const MAX_AGENT_VERSION_CHARS: usize = 64;
/// Longest `routing_hash`, in characters.
pub const MAX_ROUTING_HASH_CHARS: usize = 64;
/// Longest `sent_at`, in characters.
pub const MAX_SENT_AT_CHARS: usize = 64;

/// A node's own persisted mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Takes new calls.
    Active,
    /// Running and observing; takes no calls.
    Shadow,
    /// Takes no new calls.
    Drained,
}

impl Mode {
    /// The wire name: `active`, `shadow` or `drained`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Mode::Active => "active",
            Mode::Shadow => "shadow",
            Mode::Drained => "drained",
        }
    }
}

/// The node's call capacity as it reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capacity {
    /// Most calls the node's app will hold.
    pub max_calls: u32,
    /// Calls the app holds now, in any state.
    pub active_calls: u32,
}

/// One heartbeat as sent by a node agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// Always [`HEARTBEAT_SCHEMA`].
    pub schema: String,
    /// The node id; must equal `Callfence-Node`.
    pub node: String,
    /// Strictly increasing sequence number, 1 to 2^53 − 1.
    pub seq: u64,
    /// When the agent sent it (RFC 3339; informational, but a beat whose
    /// `sent_at` is not a time is refused).
    pub sent_at: String,
    /// How long the beat stays fresh, 1 to 30 seconds.
    pub valid_for_s: u32,
    /// The node's persisted mode.
    pub mode: Mode,
    /// The runtime checkout's commit (40 lowercase hex when valid; checked
    /// by eligibility, not here).
    pub sha: String,
    /// True when the runtime checkout has changes.
    pub dirty: bool,
    /// True when the voice app reports ready.
    pub app_ready: bool,
    /// Reported capacity.
    pub capacity: Capacity,
    /// True when the end-to-end origin probe succeeded.
    pub tunnel_up: bool,
    /// The origin URL the node believes it serves.
    pub origin_url: String,
    /// Each served line id mapped to the number the node applied.
    pub lines: BTreeMap<String, String>,
    /// The node's own [`routing_hash`] of `lines`.
    pub routing_hash: String,
    /// The agent's version.
    pub agent_version: String,
}

/// Why a heartbeat was refused (400 `invalid_heartbeat`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeartbeatError {
    /// Malformed or out of bounds; the string says what.
    Invalid(String),
    /// The body's `node` differs from the `Callfence-Node` header.
    NodeMismatch,
}

impl fmt::Display for HeartbeatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeartbeatError::Invalid(what) => write!(f, "invalid heartbeat: {what}"),
            HeartbeatError::NodeMismatch => f.write_str("heartbeat node != Callfence-Node"),
        }
    }
}

impl std::error::Error for HeartbeatError {}

/// Refuses a string that is longer than `max` characters (or empty when
/// `non_empty`), or that holds control characters.
fn bounded(field: &str, value: &str, max: usize, non_empty: bool) -> Result<(), HeartbeatError> {
    if non_empty && value.is_empty() {
        return Err(HeartbeatError::Invalid(format!("{field} is empty")));
    }
    if value.chars().count() > max {
        return Err(HeartbeatError::Invalid(format!(
            "{field} is longer than {max} characters"
        )));
    }
    if value.chars().any(char::is_control) {
        return Err(HeartbeatError::Invalid(format!(
            "{field} holds control characters"
        )));
    }
    Ok(())
}

/// Parses and bounds-checks a heartbeat body sent with `Callfence-Node:
/// header_node`. Unknown fields are ignored (a newer agent may add some).
pub fn parse(body: &[u8], header_node: &str) -> Result<Heartbeat, HeartbeatError> {
    if body.len() > MAX_BODY_BYTES {
        return Err(HeartbeatError::Invalid("body over 16 KiB".into()));
    }
    let beat: Heartbeat =
        serde_json::from_slice(body).map_err(|e| HeartbeatError::Invalid(e.to_string()))?;
    if beat.schema != HEARTBEAT_SCHEMA {
        return Err(HeartbeatError::Invalid(format!(
            "schema must be {HEARTBEAT_SCHEMA}"
        )));
    }
    bounded("node", &beat.node, MAX_NODE_CHARS, true)?;
    if beat.node != header_node {
        return Err(HeartbeatError::NodeMismatch);
    }
    if !(1..=MAX_SAFE_INTEGER).contains(&beat.seq) {
        return Err(HeartbeatError::Invalid("seq must be 1 to 2^53 - 1".into()));
    }
    if !(1..=MAX_VALID_FOR_S).contains(&beat.valid_for_s) {
        return Err(HeartbeatError::Invalid(
            "valid_for_s must be 1 to 30".into(),
        ));
    }
    bounded("sent_at", &beat.sent_at, MAX_SENT_AT_CHARS, false)?;
    if crate::time::parse_ms(&beat.sent_at).is_none() {
        return Err(HeartbeatError::Invalid(
            "sent_at must be an RFC 3339 time".into(),
        ));
    }
    bounded("sha", &beat.sha, MAX_SHA_CHARS, false)?;
    bounded("origin_url", &beat.origin_url, MAX_ORIGIN_URL_CHARS, false)?;
    bounded(
        "routing_hash",
        &beat.routing_hash,
        MAX_ROUTING_HASH_CHARS,
        false,
    )?;
    bounded(
        "agent_version",
        &beat.agent_version,
        MAX_AGENT_VERSION_CHARS,
        false,
    )?;
    if beat.lines.len() > MAX_LINES {
        return Err(HeartbeatError::Invalid(format!(
            "more than {MAX_LINES} lines"
        )));
    }
    for (line_id, number) in &beat.lines {
        bounded("a line id", line_id, MAX_LINE_ID_CHARS, true)?;
        bounded("a line number", number, MAX_NUMBER_CHARS, true)?;
    }
    Ok(beat)
}

/// Lowercase hex SHA-256 of the lines written as `line_id=called_number\n`
/// each, in line-id byte order (the map's order).
pub fn routing_hash(lines: &BTreeMap<String, String>) -> String {
    let mut text = String::new();
    for (line_id, number) in lines {
        text.push_str(line_id);
        text.push('=');
        text.push_str(number);
        text.push('\n');
    }
    sha256_hex(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn example() -> Value {
        json!({"schema": "callfence_heartbeat_v1", "node": "M3", "seq": 1796000000123u64,
            "sent_at": "2026-11-29T22:00:00.000Z", "valid_for_s": 15, "mode": "active",
            "sha": "9b4082d1c0ffee00112233445566778899aabbcc", "dirty": false, "app_ready": true,
            "capacity": {"max_calls": 10, "active_calls": 3}, "tunnel_up": true,
            "origin_url": "https://m3.example.com/callfence/telnyx",
            "lines": {"property_management_ca": "+15102160079"},
            "routing_hash": "a3f1", "agent_version": "0.1.0"})
    }

    fn parse_value(v: &Value) -> Result<Heartbeat, HeartbeatError> {
        parse(v.to_string().as_bytes(), "M3")
    }

    fn with(path: &[&str], value: Value) -> Value {
        let mut v = example();
        let mut at = &mut v;
        for key in &path[..path.len() - 1] {
            at = &mut at[*key];
        }
        at[path[path.len() - 1]] = value;
        v
    }

    fn invalid(v: &Value) {
        match parse_value(v) {
            Err(HeartbeatError::Invalid(_)) => {}
            other => panic!("expected Invalid for {v}, got {other:?}"),
        }
    }

    #[test]
    fn parses_the_spec_example() {
        let beat = parse_value(&example()).unwrap();
        assert_eq!(beat.node, "M3");
        assert_eq!(beat.seq, 1_796_000_000_123);
        assert_eq!(beat.valid_for_s, 15);
        assert_eq!(beat.mode, Mode::Active);
        assert_eq!(beat.mode.as_str(), "active");
        assert!(!beat.dirty && beat.app_ready && beat.tunnel_up);
        assert_eq!(
            beat.capacity,
            Capacity {
                max_calls: 10,
                active_calls: 3
            }
        );
        assert_eq!(beat.lines["property_management_ca"], "+15102160079");
        // Serialises back to the same document.
        assert_eq!(serde_json::to_value(&beat).unwrap(), example());
    }

    #[test]
    fn ineligible_but_well_formed_beats_parse() {
        let v = with(&["sha"], json!("not-a-sha"));
        let v = {
            let mut v = v;
            v["dirty"] = json!(true);
            v["app_ready"] = json!(false);
            v["mode"] = json!("drained");
            v
        };
        let beat = parse_value(&v).unwrap();
        assert_eq!(beat.mode, Mode::Drained);
        assert_eq!(Mode::Shadow.as_str(), "shadow");
        let unknown_field = with(&["future_field"], json!({"x": 1}));
        assert!(parse_value(&unknown_field).is_ok());
    }

    #[test]
    fn node_mismatch() {
        let got = parse(example().to_string().as_bytes(), "M4");
        assert_eq!(got, Err(HeartbeatError::NodeMismatch));
        let err = got.unwrap_err();
        assert!(err.to_string().contains("Callfence-Node"));
    }

    #[test]
    fn each_bound() {
        // schema
        invalid(&with(&["schema"], json!("callfence_heartbeat_v2")));
        // seq: 1 ..= 2^53 - 1
        invalid(&with(&["seq"], json!(0)));
        invalid(&with(&["seq"], json!(1u64 << 53)));
        invalid(&with(&["seq"], json!(-1)));
        assert!(parse_value(&with(&["seq"], json!((1u64 << 53) - 1))).is_ok());
        assert!(parse_value(&with(&["seq"], json!(1))).is_ok());
        // valid_for_s: 1 ..= 30
        invalid(&with(&["valid_for_s"], json!(0)));
        invalid(&with(&["valid_for_s"], json!(31)));
        assert!(parse_value(&with(&["valid_for_s"], json!(30))).is_ok());
        assert!(parse_value(&with(&["valid_for_s"], json!(1))).is_ok());
        // mode
        invalid(&with(&["mode"], json!("paused")));
        // capacity
        invalid(&with(&["capacity", "max_calls"], json!(-1)));
        invalid(&with(&["capacity", "active_calls"], json!(1u64 << 32)));
        // strings
        let s = |n: usize| json!("x".repeat(n));
        invalid(&with(&["sha"], s(MAX_SHA_CHARS + 1)));
        assert!(parse_value(&with(&["sha"], s(MAX_SHA_CHARS))).is_ok());
        invalid(&with(&["origin_url"], s(MAX_ORIGIN_URL_CHARS + 1)));
        assert!(parse_value(&with(&["origin_url"], s(MAX_ORIGIN_URL_CHARS))).is_ok());
        invalid(&with(&["agent_version"], s(MAX_AGENT_VERSION_CHARS + 1)));
        assert!(parse_value(&with(&["agent_version"], s(MAX_AGENT_VERSION_CHARS))).is_ok());
        invalid(&with(&["routing_hash"], s(MAX_ROUTING_HASH_CHARS + 1)));
        invalid(&with(&["sent_at"], s(MAX_SENT_AT_CHARS + 1)));
        // sent_at: an RFC 3339 time (any offset), nothing else
        for not_a_time in [
            "yesterday",
            "",
            "2026-11-29",
            "2026-11-29 22:00:00",
            "1796000000",
        ] {
            match parse_value(&with(&["sent_at"], json!(not_a_time))) {
                Err(HeartbeatError::Invalid(why)) => assert!(why.contains("sent_at"), "{why}"),
                other => panic!("sent_at {not_a_time:?}: {other:?}"),
            }
        }
        invalid(&with(&["sent_at"], json!(1796000000)));
        assert!(parse_value(&with(&["sent_at"], json!("2026-11-29T23:00:00+01:00"))).is_ok());
        assert!(parse_value(&with(&["sent_at"], json!("2026-11-29T22:00:00Z"))).is_ok());
        invalid(&with(&["agent_version"], json!("0.1\n0")));
        // node: non-empty, bounded (the header must match too)
        let long_node = "n".repeat(MAX_NODE_CHARS + 1);
        let v = with(&["node"], json!(long_node));
        assert!(matches!(
            parse(v.to_string().as_bytes(), &long_node),
            Err(HeartbeatError::Invalid(_))
        ));
        let v = with(&["node"], json!(""));
        assert!(matches!(
            parse(v.to_string().as_bytes(), ""),
            Err(HeartbeatError::Invalid(_))
        ));
        // lines: <= 256 entries, ids <= 64, numbers <= 32, neither empty
        let many: BTreeMap<String, String> = (0..=MAX_LINES)
            .map(|i| (format!("l{i}"), "+15102160079".to_string()))
            .collect();
        invalid(&with(&["lines"], json!(many)));
        let enough: BTreeMap<String, String> = (0..MAX_LINES)
            .map(|i| (format!("l{i}"), "+1".to_string()))
            .collect();
        assert!(parse_value(&with(&["lines"], json!(enough))).is_ok());
        invalid(&with(
            &["lines"],
            json!({"x".repeat(MAX_LINE_ID_CHARS + 1): "+1"}),
        ));
        invalid(&with(
            &["lines"],
            json!({"l": "1".repeat(MAX_NUMBER_CHARS + 1)}),
        ));
        invalid(&with(&["lines"], json!({"": "+1"})));
        invalid(&with(&["lines"], json!({"l": ""})));
        invalid(&with(&["lines"], json!({"l": 15102160079u64})));
        // missing field, wrong type, not JSON, too big
        let mut v = example();
        v.as_object_mut().unwrap().remove("tunnel_up");
        invalid(&v);
        invalid(&with(&["dirty"], json!("false")));
        assert!(matches!(
            parse(b"nope", "M3"),
            Err(HeartbeatError::Invalid(_))
        ));
        let big = with(&["pad"], s(MAX_BODY_BYTES));
        invalid(&big);
    }

    #[test]
    fn routing_hash_of_a_known_map() {
        let mut lines = BTreeMap::new();
        // Inserted out of order: the hash sorts by line id.
        lines.insert("sales_uk".to_string(), "+442079460958".to_string());
        lines.insert(
            "property_management_ca".to_string(),
            "+15102160079".to_string(),
        );
        // Python: sha256(b"property_management_ca=+15102160079\nsales_uk=+442079460958\n")
        assert_eq!(
            routing_hash(&lines),
            "89147188ca4e1496eabf4dee37e5d340a722fd78bfc58d797c101243fc93bb20"
        );
        assert_eq!(
            routing_hash(&BTreeMap::new()),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    proptest! {
        #[test]
        fn parse_never_panics(body in proptest::collection::vec(any::<u8>(), 0..512), node in ".{0,8}") {
            let _ = parse(&body, &node);
        }

        #[test]
        fn parse_never_panics_on_near_valid_beats(
            seq in any::<i64>(), valid in any::<i64>(), mode in "[a-z]{0,8}",
            line in ".{0,70}", number in ".{0,40}",
        ) {
            let mut v = example();
            v["seq"] = json!(seq);
            v["valid_for_s"] = json!(valid);
            v["mode"] = json!(mode);
            v["lines"] = json!({line: number});
            let _ = parse_value(&v);
        }
    }
}
