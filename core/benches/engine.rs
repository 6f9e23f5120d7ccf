//! Native cost of the engine's hot paths, as medians over many runs.
//!
//! `cargo bench -p callfence-core --bench engine` (or `make bench`) prints:
//! - SQL statements and µs per operation (a counting [`Store`] wrapper): a
//!   new-call webhook, its delivery report, a duplicate, a fence, a
//!   heartbeat. On the Durable Object every statement is one crossing
//!   between wasm and the runtime's SQL binding, which dominates its CPU;
//! - verify + parse + decide for one new webhook (Ed25519 verify, envelope
//!   parse, ledger insert, resolution, eligibility, assignment, decision);
//! - one routing decision (the preview path: resolution and eligibility
//!   without writes) for 10/100/1000 lines and 2/16/64 nodes with 10,000
//!   open calls in the store, and for 0, 10,000 and 19,000 open calls.
//!
//! Storage is rusqlite in memory with the Dispatcher's migrations.

use callfence_core::document::DocKind;
use callfence_core::encoding::b64_encode;
use callfence_core::engine::{
    Caller, Engine, EngineConfig, FenceReply, FenceRequest, Ingress, PreviewRequest, Report,
    ReportEffect, ReportedAnswer,
};
use callfence_core::heartbeat::{routing_hash, Capacity, Heartbeat, Mode, HEARTBEAT_SCHEMA};
use callfence_core::media::MediaKeys;
use callfence_core::store::sqlite::SqliteStore;
use callfence_core::store::{migrate, Store, StoreError, Value};
use callfence_core::telnyx::{self, TelnyxKeys};
use ed25519_dalek::{Signer, SigningKey};
use serde_json::json;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::time::Instant;

const NOW: i64 = 1_796_000_000_000;
const SERVED: usize = 100;

/// A [`Store`] that counts the statements it runs.
struct Counting {
    inner: SqliteStore,
    statements: Cell<u64>,
}

impl Store for Counting {
    fn exec(&self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>, StoreError> {
        self.statements.set(self.statements.get() + 1);
        self.inner.exec(sql, params)
    }

    fn atomically<T, E: From<StoreError>>(
        &self,
        work: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        self.inner.atomically(work)
    }
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(|a, b| a.total_cmp(b));
    samples[samples.len() / 2]
}

/// An engine with `nodes` stable nodes (each beating, eligible, serving every
/// line), `lines` lines, and `open_calls` open sessions spread over the nodes.
fn engine(nodes: usize, lines: usize, open_calls: usize) -> Engine<Counting> {
    let store = Counting {
        inner: SqliteStore::in_memory().unwrap(),
        statements: Cell::new(0),
    };
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
        engine
            .handle_heartbeat(signed(id), NOW / 1000, &beat(id, 1, &served), NOW)
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

/// A node signing with its registered key id.
fn signed(node: &str) -> Caller<'_> {
    Caller { node, kid: "k1" }
}

/// A heartbeat body of `id` serving `lines`.
fn beat(id: &str, seq: u64, lines: &BTreeMap<String, String>) -> Vec<u8> {
    let hb = Heartbeat {
        schema: HEARTBEAT_SCHEMA.into(),
        node: id.into(),
        seq,
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
        routing_hash: routing_hash(lines),
        lines: lines.clone(),
        agent_version: "bench".into(),
    };
    serde_json::to_vec(&hb).unwrap()
}

/// A signed-looking new-call webhook body for call `i`.
fn call_body(i: usize) -> String {
    json!({"data": {"id": format!("evt-{i}"), "event_type": "call.initiated",
        "payload": {"call_session_id": format!("s-{i}"), "call_control_id": format!("c-{i}"),
                    "from": "+12125550199", "to": "+15100000003", "direction": "incoming"}}})
    .to_string()
}

/// Statements and time of one operation, as medians over the runs.
#[derive(Default)]
struct OpCost {
    statements: Vec<f64>,
    micros: Vec<f64>,
}

impl OpCost {
    fn time<T>(&mut self, eng: &Engine<Counting>, op: impl FnOnce() -> T) -> T {
        let before = eng.store().statements.get();
        let start = Instant::now();
        let out = op();
        self.micros.push(start.elapsed().as_secs_f64() * 1e6);
        self.statements
            .push((eng.store().statements.get() - before) as f64);
        out
    }

    fn print(self, name: &str) {
        let runs = self.micros.len();
        println!(
            "op {name:<28} {:>4} statements, median {:>6.1} µs over {runs}",
            median(self.statements),
            median(self.micros)
        );
    }
}

/// Statements per operation and their native cost, through the counting store.
fn op_costs() {
    let eng = engine(2, 10, 1_000);
    let media = MediaKeys::parse(&format!("m1:{}", b64_encode(&[9u8; 32]))).unwrap();
    let served: BTreeMap<String, String> = (0..10)
        .map(|i| (format!("line_{i}"), format!("+1510{:07}", i)))
        .collect();
    let mut new_call = OpCost::default();
    let mut report = OpCost::default();
    let mut duplicate = OpCost::default();
    let mut fence = OpCost::default();
    let mut heartbeat = OpCost::default();
    for i in 0..500 {
        let now = NOW + 1 + i as i64;
        let body = call_body(i);
        let envelope = telnyx::parse_envelope(body.as_bytes()).unwrap();
        let Ingress::Forward(f) = new_call.time(&eng, || {
            eng.handle_webhook(&envelope, &body, &[], now).unwrap()
        }) else {
            panic!("a new call was not forwarded")
        };
        let delivered = Report {
            event_id: f.event_id.clone(),
            epoch: f.epoch,
            attempt: f.attempt,
            answer: ReportedAnswer::Http {
                status: 200,
                body: "{}".into(),
            },
            budget_left_ms: 1_000,
            hop: 1,
        };
        let effect = report.time(&eng, || eng.handle_report(&delivered, now).unwrap());
        assert!(matches!(effect, ReportEffect::Delivered(_)), "{effect:?}");
        let again = duplicate.time(&eng, || {
            eng.handle_webhook(&envelope, &body, &[], now).unwrap()
        });
        assert!(matches!(again, Ingress::Delivered(_)), "{again:?}");
        let req = FenceRequest {
            call_session_id: f.call_session_id.clone(),
            call_control_id: f.call_control_id.clone().unwrap(),
            epoch: f.epoch,
            purpose: callfence_core::wire::FencePurpose::Answer,
        };
        let reply = fence.time(&eng, || {
            eng.handle_fence(signed(&f.node), &req, &media, now)
                .unwrap()
        });
        assert!(matches!(reply, FenceReply::Granted(_)), "{reply:?}");
        let hb = beat(&f.node, 2 + i as u64, &served);
        heartbeat.time(&eng, || {
            eng.handle_heartbeat(signed(&f.node), now / 1000, &hb, now)
                .unwrap()
        });
    }
    println!("statements per operation (2 nodes, 10 lines, 1000 open calls):");
    new_call.print("new-call webhook");
    report.print("its delivery report");
    duplicate.print("duplicate webhook");
    fence.print("fence");
    heartbeat.print("heartbeat");
}

fn webhook_cost() {
    let eng = engine(2, 10, 0);
    let key = SigningKey::from_bytes(&[42; 32]);
    let keys = TelnyxKeys::parse(&b64_encode(key.verifying_key().as_bytes())).unwrap();
    let mut samples = Vec::new();
    for i in 0..2_000 {
        let body = call_body(i);
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
    op_costs();
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
    // Flat in the open calls: the per-node count is maintained, not counted.
    let none = decision_cost(10, 2, 0);
    // 19,000 over 2 nodes stays below the largest max_calls (10,000 each).
    for open in [0, 10_000, 19_000] {
        let m = if open == 0 {
            none
        } else {
            decision_cost(10, 2, open)
        };
        println!("decision:   10 lines,  2 nodes, {open:>5} open calls: median {m:>7.1} µs ({:.2}x of none open)", m / none);
    }
}
