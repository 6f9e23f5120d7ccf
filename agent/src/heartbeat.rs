//! Heartbeats (SPEC §6): observe the node, build the beat, sign it, send it,
//! and keep the edge's verdict.
//!
//! A beat describes reality: the persisted mode, the checkout's SHA and
//! cleanliness, the app's readiness, capacity and lines from its status
//! endpoint, and the tunnel probe. `seq` is allocated and persisted before
//! the beat is sent. The edge's answer (accepted, eligible, reasons, its
//! clock) is stored as a [`BeatRecord`] in `last_beat.json` for `status`
//! and `/readyz`. A refused beat is logged with the edge's reason code.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use callfence_core::heartbeat::{routing_hash, Capacity, Heartbeat, HEARTBEAT_SCHEMA};
use callfence_core::time::{format_ms, parse_ms};
use callfence_core::wire::{HeartbeatAnswer, RoutingView};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::clock::now_ms;
use crate::config::{Config, LinesSource};
use crate::edge::EdgeClient;
use crate::files::write_atomic;
use crate::keys::KeyRing;
use crate::mode::{self, NodeMode};
use crate::{git, probe, seq, AGENT_VERSION};

/// The edge route beats go to.
pub const PATH: &str = "/v1/nodes/heartbeat";

/// What the node observed about itself for one beat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observed {
    /// The persisted mode.
    pub mode: String,
    /// Why the mode fell back to `drained`, when it did.
    pub mode_note: Option<String>,
    /// Checkout SHA.
    pub sha: String,
    /// Checkout has changes.
    pub dirty: bool,
    /// Why git failed, when it did.
    pub git_error: Option<String>,
    /// App ready.
    pub app_ready: bool,
    /// Why the app status probe failed, when it did.
    pub app_error: Option<String>,
    /// The app's capacity (0/0 when unknown).
    pub max_calls: u32,
    /// The app's active calls (0 when unknown).
    pub active_calls: u32,
    /// Tunnel probe result.
    pub tunnel_up: bool,
    /// Lines applied.
    pub lines: BTreeMap<String, String>,
    /// Routing hash of `lines`.
    pub routing_hash: String,
}

/// Observes the node: mode, git, app status and tunnel, concurrently.
pub async fn observe(config: &Config, http: &reqwest::Client) -> Observed {
    let timeout = Duration::from_millis(config.timing.probe_timeout_ms);
    let reading = mode::read(&config.state_dir);
    let (checkout, app, tunnel_up) = tokio::join!(
        git::inspect(&config.runtime_checkout),
        probe::app_status(http, &config.app_status_url, timeout),
        probe::tunnel(http, &config.probe_url, &config.node, timeout),
    );
    let (app_ready, app_error, max_calls, active_calls, app_lines) = match app {
        Ok(s) => (s.ready, None, s.max_calls, s.active_calls, s.lines),
        Err(e) => (false, Some(e), 0, 0, BTreeMap::new()),
    };
    let lines = match &config.lines {
        LinesSource::App => app_lines,
        LinesSource::Config(lines) => lines.clone(),
    };
    Observed {
        mode: reading.mode.as_str().into(),
        mode_note: reading.fallback,
        sha: checkout.sha,
        dirty: checkout.dirty,
        git_error: checkout.error,
        app_ready,
        app_error,
        max_calls,
        active_calls,
        tunnel_up,
        routing_hash: routing_hash(&lines),
        lines,
    }
}

/// Builds the beat body from an observation.
pub fn build(config: &Config, observed: &Observed, seq: u64, now_ms: i64) -> Heartbeat {
    let mode = observed
        .mode
        .parse::<NodeMode>()
        .unwrap_or(NodeMode::Drained);
    Heartbeat {
        schema: HEARTBEAT_SCHEMA.into(),
        node: config.node.clone(),
        seq,
        sent_at: format_ms(now_ms),
        valid_for_s: config.timing.valid_for_s,
        mode: mode.to_core(),
        sha: observed.sha.clone(),
        dirty: observed.dirty,
        app_ready: observed.app_ready,
        capacity: Capacity {
            max_calls: observed.max_calls,
            active_calls: observed.active_calls,
        },
        tunnel_up: observed.tunnel_up,
        origin_url: config.origin_url.clone(),
        lines: observed.lines.clone(),
        routing_hash: observed.routing_hash.clone(),
        agent_version: AGENT_VERSION.into(),
    }
}

/// The outcome of one beat, as kept in `last_beat.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BeatRecord {
    /// When it was sent (RFC 3339).
    pub at: String,
    /// When it was sent (Unix ms).
    pub at_ms: i64,
    /// Its seq (0 when none could be allocated).
    pub seq: u64,
    /// The key id it was finally signed with.
    pub key_id: Option<String>,
    /// `accepted`, `refused` or `unreachable`.
    pub outcome: String,
    /// The edge's HTTP status, when it answered.
    pub http_status: Option<u16>,
    /// The edge's error code for a refusal, or the transport failure.
    pub refused: Option<String>,
    /// The edge's eligibility verdict (accepted beats).
    pub eligible: Option<bool>,
    /// The edge's reason codes.
    pub reasons: Vec<String>,
    /// The edge's clock.
    pub edge_time: Option<String>,
    /// Edge clock minus ours (ms), measured at the midpoint of the request.
    pub clock_skew_ms: Option<i64>,
    /// The edge's routing view (accepted beats).
    pub routing: Option<RoutingView>,
    /// The registry's `allowed_shas` for this node as the edge reported it
    /// (accepted beats): `null` when the registry lists none, absent from
    /// an edge that does not report it.
    #[serde(default)]
    pub allowed_shas: Option<Value>,
    /// `valid_for_s` of the beat.
    pub valid_for_s: u32,
    /// What the beat reported.
    pub observed: Observed,
}

impl BeatRecord {
    /// True when the beat was accepted and the node found eligible.
    pub fn accepted_and_eligible(&self) -> bool {
        self.outcome == "accepted" && self.eligible == Some(true)
    }

    /// True while the beat is still within its `valid_for_s`.
    pub fn fresh(&self, now_ms: i64) -> bool {
        now_ms <= self.at_ms + i64::from(self.valid_for_s) * 1000
    }
}

/// The last beat's record's file name inside the state directory
/// (`last_beat.json`).
pub const FILE: &str = "last_beat.json";

/// Persists the last beat's record (best effort: a failure is logged).
pub fn save(state_dir: &Path, record: &BeatRecord) {
    let Ok(bytes) = serde_json::to_vec_pretty(record) else {
        return;
    };
    if let Err(e) = write_atomic(&state_dir.join(FILE), &bytes, 0o600) {
        crate::log::warn("last_beat_not_persisted", json!({"error": e.to_string()}));
    }
}

/// The last persisted beat record, if any.
pub fn load(state_dir: &Path) -> Option<BeatRecord> {
    let bytes = std::fs::read(state_dir.join(FILE)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Interprets the edge's answer into a record.
pub fn record(
    observed: Observed,
    seq: u64,
    valid_for_s: u32,
    key_id: Option<String>,
    reply: Result<&crate::edge::EdgeReply, &str>,
    sent_ms: i64,
) -> BeatRecord {
    let mut rec = BeatRecord {
        at: format_ms(sent_ms),
        at_ms: sent_ms,
        seq,
        key_id,
        outcome: "unreachable".into(),
        http_status: None,
        refused: None,
        eligible: None,
        reasons: Vec::new(),
        edge_time: None,
        clock_skew_ms: None,
        routing: None,
        allowed_shas: None,
        valid_for_s,
        observed,
    };
    match reply {
        Err(e) => rec.refused = Some(e.to_string()),
        Ok(r) => {
            rec.http_status = Some(r.status);
            match r
                .decode::<HeartbeatAnswer>()
                .filter(|a| r.status == 200 && a.accepted)
            {
                Some(answer) => {
                    if let Some(edge_ms) = parse_ms(&answer.edge_time) {
                        rec.edge_time = Some(format_ms(edge_ms));
                        rec.clock_skew_ms = Some(edge_ms - (r.sent_ms + r.received_ms) / 2);
                    }
                    rec.outcome = "accepted".into();
                    rec.eligible = Some(answer.eligible);
                    rec.reasons = answer.reasons.into_iter().take(64).collect();
                    rec.routing = Some(answer.routing);
                    rec.allowed_shas = answer.allowed_shas.map(|list| json!(list));
                }
                None => {
                    rec.outcome = "refused".into();
                    rec.refused = Some(
                        r.error_code()
                            .unwrap_or("unexpected_answer")
                            .chars()
                            .take(64)
                            .collect(),
                    );
                }
            }
        }
    }
    rec
}

/// Observes, builds, signs and sends one beat, falling back from the next
/// key to the active key within the same beat (see [`crate::keys`]), and
/// persists the record.
pub async fn beat_once(
    config: &Config,
    http: &reqwest::Client,
    keys: &KeyRing,
    edge: &EdgeClient,
) -> BeatRecord {
    let observed = observe(config, http).await;
    let now = now_ms();
    let seq = match seq::next(&config.state_dir, now) {
        Ok(s) => s,
        Err(e) => {
            crate::log::error("seq_unavailable", json!({"error": e.0}));
            let rec = record(
                observed,
                0,
                config.timing.valid_for_s,
                None,
                Err("seq_unavailable"),
                now,
            );
            save(&config.state_dir, &rec);
            return rec;
        }
    };
    let beat = build(config, &observed, seq, now);
    let body = serde_json::to_vec(&beat).unwrap_or_default();
    let order = keys.beat_order();
    let mut rec = None;
    for (i, key) in order.iter().enumerate() {
        let sent = now_ms();
        let reply = edge.post_signed(key, PATH, body.clone(), sent).await;
        let last = i + 1 == order.len();
        if let Ok(r) = &reply {
            if r.status == 401 && !last {
                crate::log::warn(
                    "beat_key_refused",
                    json!({"seq": seq, "key_id": key.kid, "code": r.error_code(), "fallback": true}),
                );
                continue;
            }
        }
        let r = record(
            observed.clone(),
            seq,
            config.timing.valid_for_s,
            Some(key.kid.clone()),
            reply.as_ref().map_err(String::as_str),
            sent,
        );
        if r.outcome == "accepted" && keys.accepted(&key.kid) {
            crate::log::info("key_rotated", json!({"key_id": key.kid}));
        }
        rec = Some(r);
        break;
    }
    let rec = rec.unwrap_or_else(|| {
        record(
            observed,
            seq,
            config.timing.valid_for_s,
            None,
            Err("no_key"),
            now,
        )
    });
    if rec.outcome != "accepted" {
        crate::log::warn(
            "beat_refused",
            json!({"seq": rec.seq, "outcome": rec.outcome, "http_status": rec.http_status, "reason": rec.refused, "key_id": rec.key_id}),
        );
    }
    save(&config.state_dir, &rec);
    rec
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edge::EdgeReply;
    use serde_json::Value;

    fn observed() -> Observed {
        let mut lines = BTreeMap::new();
        lines.insert(
            "property_management_ca".to_string(),
            "+15102160079".to_string(),
        );
        Observed {
            mode: "active".into(),
            mode_note: None,
            sha: "9b4082d0000000000000000000000000000000aa".into(),
            dirty: false,
            git_error: None,
            app_ready: true,
            app_error: None,
            max_calls: 10,
            active_calls: 3,
            tunnel_up: true,
            routing_hash: routing_hash(&lines),
            lines,
        }
    }

    #[test]
    fn the_beat_carries_every_field_and_parses_back_in_core() {
        let config = crate::config::from_toml(&crate::config::example_toml("/var/lib/cf")).unwrap();
        let beat = build(&config, &observed(), 1_796_000_000_123, 1_796_000_000_123);
        let body = serde_json::to_vec(&beat).unwrap();
        let parsed = callfence_core::heartbeat::parse(&body, "M3").unwrap();
        assert_eq!(parsed, beat);
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["schema"], "callfence_heartbeat_v1");
        assert_eq!(v["mode"], "active");
        assert_eq!(v["capacity"]["active_calls"], 3);
        assert_eq!(v["origin_url"], "https://m3.example.com/callfence/telnyx");
        assert_eq!(v["sent_at"], "2026-11-30T00:53:20.123Z");
        assert_eq!(v["valid_for_s"], 15);
    }

    #[test]
    fn an_accepted_answer_gives_verdict_and_skew() {
        let reply = EdgeReply {
            status: 200,
            body: json!({"accepted": true, "eligible": false, "reasons": ["dirty"],
                         "edge_time": "1970-01-01T00:00:01.500Z", "routing": {"hash": "x", "lines": {}}}),
            sent_ms: 1_000,
            received_ms: 1_200,
        };
        let rec = record(observed(), 7, 15, Some("k1".into()), Ok(&reply), 1_000);
        assert_eq!(rec.outcome, "accepted");
        assert_eq!(rec.eligible, Some(false));
        assert_eq!(rec.reasons, ["dirty"]);
        assert_eq!(rec.clock_skew_ms, Some(400));
        assert!(!rec.accepted_and_eligible());
        assert!(rec.fresh(16_000) && !rec.fresh(16_001));
    }

    #[test]
    fn a_200_that_is_not_a_heartbeat_answer_is_not_accepted() {
        for body in [
            json!({"accepted": false, "eligible": true, "reasons": [], "edge_time": "1970-01-01T00:00:01.500Z",
                   "routing": {"hash": "x", "lines": {}}}),
            json!({"accepted": true, "eligible": "yes"}),
            Value::Null,
        ] {
            let reply = EdgeReply {
                status: 200,
                body,
                sent_ms: 0,
                received_ms: 0,
            };
            let rec = record(observed(), 7, 15, None, Ok(&reply), 0);
            assert_eq!(
                (rec.outcome.as_str(), rec.refused.as_deref(), rec.eligible),
                ("refused", Some("unexpected_answer"), None)
            );
        }
    }

    #[test]
    fn a_refusal_keeps_the_code() {
        let reply = EdgeReply {
            status: 409,
            body: json!({"error": "stale_seq"}),
            sent_ms: 0,
            received_ms: 0,
        };
        let rec = record(observed(), 7, 15, None, Ok(&reply), 0);
        assert_eq!(
            (rec.outcome.as_str(), rec.refused.as_deref()),
            ("refused", Some("stale_seq"))
        );
        let rec = record(observed(), 7, 15, None, Err("connect_failed"), 0);
        assert_eq!(rec.outcome, "unreachable");
    }

    /// A stub edge that verifies node signatures with the core's verifier
    /// and knows only the keys in `known`: the rotation fallback and the
    /// signing format are checked end to end, short of the real Worker.
    #[tokio::test]
    async fn rotation_falls_back_within_the_beat_then_switches() {
        use axum::http::HeaderMap;
        use callfence_core::node_auth::{verify, NodeHeaders};
        use ed25519_dalek::SigningKey;
        use std::sync::{Arc, Mutex};

        type Known = Arc<Mutex<Vec<(String, ed25519_dalek::VerifyingKey)>>>;
        let old = SigningKey::from_bytes(&[1; 32]);
        let new = SigningKey::from_bytes(&[2; 32]);
        let known: Known = Arc::new(Mutex::new(vec![("old".into(), old.verifying_key())]));
        type Seen = Arc<Mutex<Vec<(String, u16, Vec<u8>)>>>;
        let seen: Seen = Arc::default();
        let (k2, s2) = (known.clone(), seen.clone());
        let handler = move |headers: HeaderMap, body: axum::body::Bytes| {
            let (known, seen) = (k2.clone(), s2.clone());
            async move {
                let h = |n: &str| {
                    headers
                        .get(n)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string)
                };
                let (node, kid, ts, sig, host) = (
                    h("callfence-node"),
                    h("callfence-key-id"),
                    h("callfence-timestamp"),
                    h("callfence-signature"),
                    h("host"),
                );
                let nh = NodeHeaders {
                    node: node.as_deref(),
                    key_id: kid.as_deref(),
                    timestamp: ts.as_deref(),
                    signature: sig.as_deref(),
                };
                let keys = known.lock().unwrap().clone();
                let result = verify(
                    &nh,
                    "POST",
                    host.as_deref().unwrap_or(""),
                    PATH,
                    &body,
                    now_ms(),
                    |n, k| {
                        (n == "M3")
                            .then(|| keys.iter().find(|(id, _)| id == k).map(|(_, v)| *v))
                            .flatten()
                    },
                );
                let (status, answer) = match result {
                    Ok(_) => (
                        200,
                        json!(HeartbeatAnswer::new(
                            &[],
                            now_ms(),
                            RoutingView::default(),
                            None
                        )),
                    ),
                    Err(e) => (401, json!({"error": e.code()})),
                };
                seen.lock()
                    .unwrap()
                    .push((kid.unwrap_or_default(), status, body.to_vec()));
                (
                    axum::http::StatusCode::from_u16(status).unwrap(),
                    axum::Json(answer),
                )
            }
        };
        let app = axum::Router::new().route(PATH, axum::routing::post(handler));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

        let dir = crate::files::test_dir("rotation-beat");
        let state = crate::files::test_dir("rotation-state");
        let text = crate::config::example_toml("/var/lib/cf")
            .replace("https://edge.example.com", &format!("http://{addr}"))
            .replace("/srv/voice-app", &dir.display().to_string());
        let mut config = crate::config::from_toml(&text).unwrap();
        config.state_dir = state.clone();
        config.timing.probe_timeout_ms = 100;
        let ring = KeyRing::from_keys(
            crate::keys::NodeKey {
                kid: "old".into(),
                signing: old,
            },
            Some(crate::keys::NodeKey {
                kid: "new".into(),
                signing: new.clone(),
            }),
            state.join("keys.json"),
        );
        let http = crate::net::client().unwrap();
        let edge = EdgeClient::new(
            http.clone(),
            config.edge_url.clone(),
            "M3".into(),
            Duration::from_secs(2),
        );

        let rec = beat_once(&config, &http, &ring, &edge).await;
        assert_eq!(
            (rec.outcome.as_str(), rec.key_id.as_deref()),
            ("accepted", Some("old"))
        );
        assert_eq!(ring.current().kid, "old");
        {
            let seen = seen.lock().unwrap();
            assert_eq!(seen.len(), 2);
            assert_eq!((seen[0].0.as_str(), seen[0].1), ("new", 401));
            assert_eq!((seen[1].0.as_str(), seen[1].1), ("old", 200));
            assert_eq!(seen[0].2, seen[1].2, "the same beat, re-signed: none lost");
        }
        assert!(rec.clock_skew_ms.unwrap().abs() < 2_000);
        assert_eq!(load(&state).unwrap().seq, rec.seq);

        known
            .lock()
            .unwrap()
            .push(("new".into(), new.verifying_key()));
        let rec2 = beat_once(&config, &http, &ring, &edge).await;
        assert_eq!(rec2.key_id.as_deref(), Some("new"));
        assert!(rec2.seq > rec.seq);
        assert_eq!(
            ring.current().kid,
            "new",
            "fence, claims and media now sign with the next key"
        );
    }
}
