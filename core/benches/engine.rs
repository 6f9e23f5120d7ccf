//! Native cost of the engine's hot paths, as medians over many runs.
//!
//! `cargo bench -p callfence-core --bench engine` (or `make bench`) prints:
//! - verify + parse + decide for one new webhook (Ed25519 verify, envelope
//!   parse, ledger insert, resolution, eligibility, assignment, decision);
//! - one routing decision (the preview path: resolution and eligibility
//!   without writes) for 10/100/1000 lines and 2/16/64 nodes with 10,000
//!   open calls in the store.
//!
//! Storage is rusqlite in memory with the Dispatcher's migrations.

use callfence_core::document::DocKind;
use callfence_core::encoding::b64_encode;
use callfence_core::engine::{Engine, EngineConfig, Ingress, PreviewRequest};
use callfence_core::heartbeat::{routing_hash, Capacity, Heartbeat, Mode, HEARTBEAT_SCHEMA};
use callfence_core::store::sqlite::SqliteStore;
use callfence_core::store::{migrate, Store, Value};
use callfence_core::telnyx::{self, TelnyxKeys};
use ed25519_dalek::{Signer, SigningKey};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Instant;

const NOW: i64 = 1_796_000_000_000;
const SERVED: usize = 100;

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(|a, b| a.total_cmp(b));
    samples[samples.len() / 2]
}

/// An engine with `nodes` stable nodes (each beating, eligible, serving every
/// line), `lines` lines, and `open_calls` open sessions spread over the nodes.
fn engine(nodes: usize, lines: usize, open_calls: usize) -> Engine<SqliteStore> {
    let store = SqliteStore::in_memory().unwrap();
    migrate(&store, NOW).unwrap();
    let engine = Engine::new(store, EngineConfig::default());
    let ids: Vec<String> = (0..nodes).map(|i| format!("N{i:02}")).collect();
    let registry: serde_json::Map<String, serde_json::Value> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let key = SigningKey::from_bytes(&[i as u8 + 1; 32]);
            (
                id.clone(),
                json!({"role": "stable", "origin_url": format!("https://{id}.example.com/t"),
                       "keys": {"k1": b64_encode(key.verifying_key().as_bytes())},
                       "fallback_approved": false, "admin_drained": false, "max_calls": 10_000}),
            )
        })
        .collect();
    let doc = json!({"schema": "callfence_nodes_v1", "nodes": registry});
    engine
        .put_document(
            DocKind::Nodes,
            doc.to_string().as_bytes(),
            Some("\"0\""),
            "bench",
            NOW,
        )
        .unwrap();
    let line_map: BTreeMap<String, String> = (0..lines)
        .map(|i| (format!("line_{i}"), format!("+1510{:07}", i)))
        .collect();
    // A beat carries at most 256 lines (16 KiB): nodes serve the first 100.
    let served: BTreeMap<String, String> = (0..lines.min(SERVED))
        .map(|i| (format!("line_{i}"), format!("+1510{:07}", i)))
        .collect();
    let by_line: serde_json::Map<String, serde_json::Value> = line_map
        .iter()
        .enumerate()
        .map(|(i, (id, number))| {
            (
                id.clone(),
                json!({"called_number": number, "preferred_node": ids[i % nodes]}),
            )
        })
        .collect();
    let policy = json!({"schema": "riff_node_routing_policy_v1", "default_node": ids[0], "by_line": by_line});
    engine
        .put_document(
            DocKind::Policy,
            policy.to_string().as_bytes(),
            Some("\"0\""),
            "bench",
            NOW,
        )
        .unwrap();
    for id in &ids {
        let hb = Heartbeat {
            schema: HEARTBEAT_SCHEMA.into(),
            node: id.clone(),
            seq: 1,
            sent_at: callfence_core::time::format_ms(NOW),
            valid_for_s: 30,
            mode: Mode::Active,
            sha: "a".repeat(40),
            dirty: false,
            app_ready: true,
            capacity: Capacity {
                max_calls: 100_000,
                active_calls: 0,
            },
            tunnel_up: true,
            origin_url: format!("https://{id}.example.com/t"),
            routing_hash: routing_hash(&served),
            lines: served.clone(),
            agent_version: "bench".into(),
        };
        engine
            .handle_heartbeat(id, NOW / 1000, &serde_json::to_vec(&hb).unwrap(), NOW)
            .unwrap();
    }
    for i in 0..open_calls {
        engine
            .store()
            .exec(
                "INSERT INTO sessions (call_session_id, state, owner, epoch, created_at, updated_at) VALUES (?, 'assigned', ?, ?, ?, ?)",
                &[format!("open-{i}").into(), ids[i % nodes].as_str().into(), Value::Int(i as i64 + 1), Value::Int(NOW), Value::Int(NOW)],
            )
            .unwrap();
    }
    engine
}

fn webhook_cost() {
    let eng = engine(2, 10, 0);
    let key = SigningKey::from_bytes(&[42; 32]);
    let keys = TelnyxKeys::parse(&b64_encode(key.verifying_key().as_bytes())).unwrap();
    let mut samples = Vec::new();
    for i in 0..2_000 {
        let body = json!({"data": {"id": format!("evt-{i}"), "event_type": "call.initiated",
            "payload": {"call_session_id": format!("s-{i}"), "call_control_id": format!("c-{i}"),
                        "from": "+12125550199", "to": "+15100000003", "direction": "incoming"}}})
        .to_string();
        let ts = (NOW / 1000).to_string();
        let sig = b64_encode(&key.sign(format!("{ts}|{body}").as_bytes()).to_bytes());
        let start = Instant::now();
        telnyx::verify(&keys, Some(&sig), Some(&ts), body.as_bytes(), NOW).unwrap();
        let envelope = telnyx::parse_envelope(body.as_bytes()).unwrap();
        let out = eng.handle_webhook(&envelope, &body, &[], NOW + 1).unwrap();
        samples.push(start.elapsed().as_secs_f64() * 1e6);
        assert!(matches!(out, Ingress::Forward(_)));
    }
    println!(
        "webhook verify+parse+decide (2 nodes, 10 lines, new call each): median {:.1} µs over 2000",
        median(samples)
    );
}

fn decision_cost(lines: usize, nodes: usize, open_calls: usize) -> f64 {
    let eng = engine(nodes, lines, open_calls);
    let mut samples = Vec::new();
    for i in 0..500 {
        let req = PreviewRequest {
            to: Some(format!("+1510{:07}", i % lines.min(SERVED))),
            from: Some("+12125550199".into()),
            policy: None,
        };
        let start = Instant::now();
        let out = eng.preview(&req, NOW + 1).unwrap().unwrap();
        samples.push(start.elapsed().as_secs_f64() * 1e6);
        assert!(out["chosen"].is_string(), "{out}");
    }
    median(samples)
}

fn main() {
    println!(
        "callfence-core native bench ({} build, {} CPUs)",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    webhook_cost();
    let base = decision_cost(10, 2, 10_000);
    for lines in [10, 100, 1000] {
        for nodes in [2, 16, 64] {
            let m = if (lines, nodes) == (10, 2) {
                base
            } else {
                decision_cost(lines, nodes, 10_000)
            };
            println!("decision: {lines:>4} lines, {nodes:>2} nodes, 10000 open calls: median {m:>7.1} µs ({:.2}x of 10 lines/2 nodes)", m / base);
        }
    }
}
