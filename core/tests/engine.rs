//! Scenario tests of the engine on real SQLite: the paths the simulation
//! does not drive (claims and outgoing sessions, the pending window closing,
//! refused deliveries after an ambiguous one, media checks, heartbeat replay,
//! the preview of a draft policy, the status view's stale marks, the
//! open-call count across a rollback to the previous release, issue 18's
//! claim flood against a live call under a small row cap, and the shard
//! map's history behind the rollback floor).

use callfence_core::directory::{DocError, REPLACED_MAP_USE_MS};
use callfence_core::document::DocKind;
use callfence_core::encoding::b64_encode;
use callfence_core::engine::{
    may_reforward, Arrival, Caller, ClaimReply, ClaimRequest, Engine, EngineConfig, FenceRefusal,
    FenceReply, FenceRequest, Forward, HeartbeatRefusal, Holds, Ingress, Lease, LeaseAsk,
    MediaRefusal, MediaReply, PendingReason, PreviewRequest, Redirect, Report, ReportEffect,
    ReportedAnswer, MAX_HOPS, MIN_REFORWARD_BUDGET_MS,
};
use callfence_core::heartbeat::{routing_hash, Capacity, Heartbeat, Mode, HEARTBEAT_SCHEMA};
use callfence_core::media::MediaKeys;
use callfence_core::messages::MapNotice;
use callfence_core::shard::ShardOutput;
use callfence_core::shard_map::{RollbackFloor, ShardMap, SHARDS_SCHEMA};
use callfence_core::store::sqlite::SqliteStore;
use callfence_core::store::{migrate, migrate_with, Store, Value, MIGRATIONS};
use callfence_core::telnyx::parse_envelope;
use callfence_core::time::format_ms;
use ed25519_dalek::SigningKey;
use serde_json::json;
use std::collections::BTreeMap;

const T0: i64 = 1_796_000_000_000;

struct World {
    engine: Engine<SqliteStore>,
    media: MediaKeys,
    now: i64,
    seq: u64,
}

impl World {
    fn new() -> Self {
        Self::with(EngineConfig::default())
    }

    fn with(config: EngineConfig) -> Self {
        let store = SqliteStore::in_memory().unwrap();
        migrate(&store, T0).unwrap();
        let engine = Engine::new(store, config);
        let nodes: serde_json::Map<_, _> = ["M1", "M2"]
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let key = SigningKey::from_bytes(&[i as u8 + 1; 32]);
                (id.to_string(), json!({"role": "stable", "origin_url": format!("https://{id}.example.com/t"),
                    "keys": {"k1": b64_encode(key.verifying_key().as_bytes())}, "fallback_approved": false, "admin_drained": false}))
            })
            .collect();
        let registry = json!({"schema": "callfence_nodes_v1", "nodes": nodes});
        engine
            .put_document(
                DocKind::Nodes,
                registry.to_string().as_bytes(),
                Some("\"0\""),
                "t",
                T0,
            )
            .unwrap();
        let policy = json!({"schema": "riff_node_routing_policy_v1", "default_node": "M1",
            "by_line": {"sales": {"called_number": "+15102160079", "preferred_node": "M1", "fallback_node": "M2"}}});
        engine
            .put_document(
                DocKind::Policy,
                policy.to_string().as_bytes(),
                Some("\"0\""),
                "t",
                T0,
            )
            .unwrap();
        let media = MediaKeys::parse(&format!("m1:{}", b64_encode(&[9u8; 32]))).unwrap();
        Self {
            engine,
            media,
            now: T0,
            seq: 0,
        }
    }

    /// Writes `doc` as the next revision of `kind` (compare-and-set on the
    /// current one).
    fn put(&self, kind: DocKind, doc: &serde_json::Value) {
        let current = self.engine.revision(kind).unwrap();
        let mut doc = doc.clone();
        if let Some(o) = doc.as_object_mut() {
            o.remove("revision");
        }
        self.engine
            .put_document(
                kind,
                doc.to_string().as_bytes(),
                Some(&format!("\"{current}\"")),
                "t",
                self.now,
            )
            .unwrap();
    }

    /// A world where M1 serves the `sales` line and M2 beats but serves no
    /// line.
    fn with_m1_and_a_lineless_m2() -> Self {
        let mut w = World::new();
        w.beat("M1", |_| {}).unwrap();
        w.beat("M2", |hb| {
            hb.lines.clear();
            hb.routing_hash = routing_hash(&hb.lines);
        })
        .unwrap();
        w
    }

    fn beat(
        &mut self,
        node: &str,
        edit: impl FnOnce(&mut Heartbeat),
    ) -> Result<serde_json::Value, HeartbeatRefusal> {
        let lines: BTreeMap<String, String> =
            [("sales".to_string(), "+15102160079".to_string())].into();
        self.seq += 1;
        let mut hb = Heartbeat {
            schema: HEARTBEAT_SCHEMA.into(),
            node: node.into(),
            seq: self.seq,
            sent_at: "2026-11-30T00:53:20.000Z".into(),
            valid_for_s: 30,
            mode: Mode::Active,
            sha: "c".repeat(40),
            dirty: false,
            app_ready: true,
            capacity: Capacity {
                max_calls: 5,
                active_calls: 0,
            },
            tunnel_up: true,
            origin_url: format!("https://{node}.example.com/t"),
            routing_hash: routing_hash(&lines),
            lines,
            agent_version: "t".into(),
        };
        edit(&mut hb);
        self.engine.handle_heartbeat(
            caller(node),
            self.now / 1000,
            &serde_json::to_vec(&hb).unwrap(),
            self.now,
        )
    }

    fn webhook(&self, id: &str, kind: &str, session: &str, direction: &str) -> Ingress {
        let body = json!({"data": {"id": id, "event_type": kind, "payload": {"call_session_id": session,
            "call_control_id": format!("leg-{session}"), "from": "+12125550199", "to": "+15102160079", "direction": direction}}})
        .to_string();
        let envelope = parse_envelope(body.as_bytes()).unwrap();
        self.engine
            .handle_webhook(&envelope, &body, &[], self.now)
            .unwrap()
    }

    fn report(&self, f: &Forward, answer: ReportedAnswer) -> ReportEffect {
        let report = Report {
            event_id: f.event_id.clone(),
            epoch: f.epoch,
            attempt: f.attempt,
            answer,
            budget_left_ms: 1_000,
            hop: 1,
        };
        self.engine.handle_report(&report, self.now).unwrap()
    }

    fn fence(&self, node: &str, session: &str, epoch: u64) -> FenceReply {
        let req = FenceRequest {
            call_session_id: session.into(),
            call_control_id: format!("leg-{session}"),
            epoch,
            purpose: callfence_core::wire::FencePurpose::Answer,
        };
        self.engine
            .handle_fence(caller(node), &req, &self.media, self.now)
            .unwrap()
    }
}

/// A node signing with its registered key id.
fn caller(node: &str) -> Caller<'_> {
    Caller { node, kid: "k1" }
}

fn forward(ingress: Ingress) -> Forward {
    match ingress {
        Ingress::Forward(f) => f,
        other => panic!("expected a forward, got {other:?}"),
    }
}

fn ok(status: u16) -> ReportedAnswer {
    ReportedAnswer::Http {
        status,
        body: "{}".into(),
    }
}

fn not_admitted() -> ReportedAnswer {
    ReportedAnswer::Http {
        status: 503,
        body: r#"{"callfence":"not_admitted"}"#.into(),
    }
}

#[test]
fn an_outgoing_session_waits_for_its_claim_then_goes_to_the_claimer() {
    let mut w = World::new();
    w.beat("M1", |_| {}).unwrap();
    w.beat("M2", |_| {}).unwrap();
    assert_eq!(
        w.webhook("e1", "call.initiated", "out-1", "outgoing"),
        Ingress::Pending(PendingReason::NoEligibleNode)
    );
    let claim = ClaimRequest {
        call_control_id: "leg-out-1".into(),
        call_session_id: "out-1".into(),
    };
    let ClaimReply::Claimed { epoch, .. } =
        w.engine.handle_claim(caller("M2"), &claim, w.now).unwrap()
    else {
        panic!("not claimed")
    };
    assert_eq!(
        w.engine.handle_claim(caller("M2"), &claim, w.now).unwrap(),
        ClaimReply::Claimed {
            call_session_id: "out-1".into(),
            epoch
        }
    );
    assert_eq!(
        w.engine.handle_claim(caller("M1"), &claim, w.now).unwrap(),
        ClaimReply::AlreadyOwned
    );
    w.now += 10;
    let work = w.engine.poll_alarm(w.now).unwrap();
    assert_eq!(
        work.forwards.len(),
        1,
        "the parked event is delivered by the alarm"
    );
    assert_eq!(
        (work.forwards[0].node.as_str(), work.forwards[0].epoch),
        ("M2", epoch)
    );
    let later = forward(w.webhook("e2", "call.answered", "out-1", "outgoing"));
    assert_eq!(later.node, "M2");
}

#[test]
fn a_claim_cannot_take_an_inbound_session_and_strangers_are_refused() {
    let mut w = World::new();
    w.beat("M1", |_| {}).unwrap();
    forward(w.webhook("e1", "call.initiated", "in-1", "incoming"));
    let claim = ClaimRequest {
        call_control_id: "leg-in-1".into(),
        call_session_id: "in-1".into(),
    };
    assert_eq!(
        w.engine.handle_claim(caller("M2"), &claim, w.now).unwrap(),
        ClaimReply::AlreadyOwned
    );
    assert_eq!(
        w.engine.handle_claim(caller("M9"), &claim, w.now).unwrap(),
        ClaimReply::NotRegistered
    );
}

#[test]
fn not_admitted_moves_the_call_but_never_after_an_ambiguous_outcome() {
    let mut w = World::new();
    w.beat("M1", |_| {}).unwrap();
    w.beat("M2", |_| {}).unwrap();
    // Definite refusal first: the call moves to M2 with a higher epoch.
    let first = forward(w.webhook("a1", "call.initiated", "s-a", "incoming"));
    assert_eq!(first.node, "M1");
    let ReportEffect::Reassigned(Some(next)) = w.report(&first, not_admitted()) else {
        panic!("not reassigned")
    };
    assert_eq!(next.node, "M2");
    assert!(next.epoch > first.epoch);
    assert!(matches!(
        w.fence("M1", "s-a", first.epoch),
        FenceReply::Refused(FenceRefusal::NotOwner | FenceRefusal::StaleEpoch)
    ));
    assert!(matches!(
        w.fence("M2", "s-a", next.epoch),
        FenceReply::Granted(_)
    ));

    // Ambiguous first (timeout), then a refusal on the re-drive: stays put.
    w.now += 31_000; // past M1's recent_forward_failure window
    w.beat("M1", |_| {}).unwrap();
    w.beat("M2", |_| {}).unwrap();
    let first = forward(w.webhook("b1", "call.initiated", "s-b", "incoming"));
    assert_eq!(
        w.report(&first, ReportedAnswer::Timeout),
        ReportEffect::Unknown
    );
    let again = forward(w.webhook("b1", "call.initiated", "s-b", "incoming"));
    assert_eq!(
        (again.node.as_str(), again.epoch),
        (first.node.as_str(), first.epoch)
    );
    assert_eq!(
        w.report(&again, not_admitted()),
        ReportEffect::Unknown,
        "an ambiguous epoch never moves"
    );
    let call = w.engine.call("s-b").unwrap().unwrap();
    assert_eq!(
        (call["owner"].as_str(), call["epoch"].as_u64()),
        (Some(first.node.as_str()), Some(first.epoch))
    );
}

#[test]
fn a_stale_report_changes_nothing_and_a_delivered_event_is_answered_from_the_ledger() {
    let mut w = World::new();
    w.beat("M1", |_| {}).unwrap();
    let f = forward(w.webhook("c1", "call.initiated", "s-c", "incoming"));
    let stale = Report {
        event_id: f.event_id.clone(),
        epoch: f.epoch + 7,
        attempt: f.attempt,
        answer: ok(200),
        budget_left_ms: 0,
        hop: 1,
    };
    assert_eq!(
        w.engine.handle_report(&stale, w.now).unwrap(),
        ReportEffect::Unknown
    );
    assert_eq!(
        w.webhook("c1", "call.initiated", "s-c", "incoming"),
        Ingress::InProgress
    );
    let ReportEffect::Delivered(d) = w.report(&f, ok(200)) else {
        panic!("not delivered")
    };
    assert_eq!(
        w.webhook("c1", "call.initiated", "s-c", "incoming"),
        Ingress::Delivered(d)
    );
}

#[test]
fn the_pending_window_closes_with_a_rejected_decision() {
    let mut w = World::new();
    assert_eq!(
        w.webhook("p1", "call.initiated", "s-p", "incoming"),
        Ingress::Pending(PendingReason::NoEligibleNode)
    );
    w.now += 5_000;
    assert!(w.engine.poll_alarm(w.now).unwrap().forwards.is_empty());
    w.now += 5_001;
    w.engine.poll_alarm(w.now).unwrap();
    assert_eq!(
        w.webhook("p1", "call.initiated", "s-p", "incoming"),
        Ingress::Rejected
    );
    let decisions = w.engine.decisions(None, Some("s-p"), None).unwrap();
    let outcomes: Vec<_> = decisions["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["outcome"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        outcomes,
        vec!["rejected", "pending"],
        "newest first; re-checks record nothing"
    );
}

#[test]
fn media_tokens_hold_for_the_fenced_owner_until_hangup() {
    let mut w = World::new();
    w.beat("M1", |_| {}).unwrap();
    let f = forward(w.webhook("m1", "call.initiated", "s-m", "incoming"));
    let FenceReply::Granted(grant) = w.fence("M1", "s-m", f.epoch) else {
        panic!("no grant")
    };
    let FenceReply::Granted(again) = w.fence("M1", "s-m", f.epoch) else {
        panic!("no regrant")
    };
    assert!(grant.first && !again.first);
    assert_eq!(
        (grant.command_id, grant.media_token.clone()),
        (again.command_id, again.media_token)
    );
    let verify = |node: &str| {
        w.engine
            .handle_media_verify(caller(node), &grant.media_token, &w.media, w.now)
            .unwrap()
    };
    assert!(matches!(verify("M1"), MediaReply::Valid { .. }));
    assert_eq!(verify("M2"), MediaReply::Invalid(MediaRefusal::NotOwner));
    forward(w.webhook("m2", "call.hangup", "s-m", "incoming"));
    let verify = |node: &str| {
        w.engine
            .handle_media_verify(caller(node), &grant.media_token, &w.media, w.now)
            .unwrap()
    };
    assert_eq!(verify("M1"), MediaReply::Invalid(MediaRefusal::CallEnded));
    assert_eq!(
        w.fence("M2", "s-m", f.epoch),
        FenceReply::Refused(FenceRefusal::NotOwner)
    );
}

#[test]
fn heartbeats_refuse_old_seq_and_replay_identical_bytes() {
    let mut w = World::new();
    let first = w.beat("M1", |_| {}).unwrap();
    assert_eq!(first["eligible"], true);
    // The same bytes again (seq 1, nothing changed): the stored answer.
    w.now += 5_000;
    assert_eq!(w.beat("M1", |h| h.seq = 1).unwrap(), first);
    // seq 1 with other bytes: stale.
    assert_eq!(
        w.beat("M1", |h| {
            h.seq = 1;
            h.dirty = true
        }),
        Err(HeartbeatRefusal::StaleSeq)
    );
    let dirty = w.beat("M1", |h| h.dirty = true).unwrap();
    assert_eq!(
        (dirty["accepted"].as_bool(), dirty["eligible"].as_bool()),
        (Some(true), Some(false))
    );
    assert_eq!(dirty["reasons"], json!(["dirty"]));
    assert!(matches!(
        w.beat("M1", |h| h.valid_for_s = 99),
        Err(HeartbeatRefusal::Invalid(_))
    ));
}

#[test]
fn a_stale_seq_that_is_not_a_resend_counts_a_regression_in_status() {
    let mut w = World::new();
    let status = |w: &World| {
        let status = w.engine.status(w.now).unwrap();
        let m1 = status["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["node"] == "M1")
            .cloned()
            .unwrap();
        (
            m1["seq_regressions"].clone(),
            m1["seq_regressed_at"].clone(),
            m1["last_seen_at"].clone(),
        )
    };
    w.beat("M1", |h| h.seq = 10).unwrap();
    let seen = status(&w).2;
    assert_eq!(status(&w), (json!(0), json!(null), seen.clone()));
    // The byte-identical re-send is no regression.
    w.beat("M1", |h| h.seq = 10).unwrap();
    assert_eq!(status(&w), (json!(0), json!(null), seen.clone()));
    // A second signer whose seqs run behind: refused, counted, not stored.
    w.now += 1_000;
    let at = w.now;
    for seq in [5, 10] {
        assert_eq!(
            w.beat("M1", |h| {
                h.seq = seq;
                h.agent_version = "other".into()
            }),
            Err(HeartbeatRefusal::StaleSeq)
        );
    }
    // Counted at the node; the refused beats left the stored one alone.
    assert_eq!(status(&w), (json!(2), json!(format_ms(at)), seen));
    w.beat("M1", |h| h.seq = 11).unwrap();
    assert_eq!(status(&w).0, json!(2));
}

#[test]
fn a_draft_preview_resolves_under_the_draft_and_stores_nothing() {
    let w = World::with_m1_and_a_lineless_m2();
    let preview = |policy| {
        let req = PreviewRequest {
            to: Some("+15102160079".into()),
            from: None,
            policy,
        };
        w.engine.preview(&req, w.now).unwrap().unwrap()
    };
    let in_force = preview(None);
    assert_eq!(
        (
            &in_force["prefers"],
            &in_force["chosen"],
            &in_force["draft"]
        ),
        (&json!("M1"), &json!("M1"), &json!(false))
    );
    // The draft prefers M2 for sales, a line M2 does not serve.
    let draft = json!({"schema": "riff_node_routing_policy_v1", "default_node": "M1",
        "by_line": {"sales": {"called_number": "+15102160079", "preferred_node": "M2", "fallback_node": "M1"}}});
    let under = preview(Some(draft));
    assert_eq!(under["prefers"], "M2");
    assert_eq!(under["chosen"], "M1");
    assert_eq!(under["reasons"]["M2"], json!(["line_not_served"]));
    assert_eq!(
        (&under["draft"], &under["policy_revision"]),
        (&json!(true), &json!(1))
    );
    // A draft that would not validate answers what a PUT would refuse.
    let bad = json!({"schema": "riff_node_routing_policy_v1", "default_node": "M9", "by_line": {}});
    let refused = preview(Some(bad));
    assert_eq!(refused["draft_problems"][0]["path"], "/default_node");
    assert!(refused.get("chosen").is_none());
    // Nothing was stored.
    assert_eq!(w.engine.revision(DocKind::Policy).unwrap(), 1);
    assert_eq!(w.engine.status(w.now).unwrap()["lines"][0]["prefers"], "M1");
}

#[test]
fn status_says_when_each_node_was_last_seen_and_whether_it_is_stale() {
    let mut w = World::new();
    w.beat("M1", |_| {}).unwrap();
    let node = |status: &serde_json::Value, id: &str| {
        status["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["node"] == id)
            .unwrap()
            .clone()
    };
    let fresh = node(&w.engine.status(w.now).unwrap(), "M1");
    assert_eq!(fresh["stale"], false);
    assert_eq!(fresh["last_seen_at"], callfence_core::time::format_ms(T0));
    let never = node(&w.engine.status(w.now).unwrap(), "M2");
    assert_eq!(
        (&never["stale"], &never["last_seen_at"]),
        (&json!(false), &json!(null))
    );
    w.now += 40_000; // past valid_for_s (30 s)
    let stale = node(&w.engine.status(w.now).unwrap(), "M1");
    assert_eq!(stale["stale"], true);
    assert!(stale["reasons"]
        .as_array()
        .unwrap()
        .contains(&json!("heartbeat_stale")));
    assert_eq!(stale["last_seen_at"], fresh["last_seen_at"]);
    assert_eq!(
        stale["mode"], "active",
        "the last report is kept, marked stale"
    );
}

/// `node_load` next to the count it replaces, per node.
fn load_and_count(store: &SqliteStore) -> (Vec<Vec<Value>>, Vec<Vec<Value>>) {
    let kept = store
        .exec(
            "SELECT node, open_calls FROM node_load WHERE open_calls != 0 ORDER BY node",
            &[],
        )
        .unwrap();
    let counted = store
        .exec(
            "SELECT owner, COUNT(*) FROM sessions WHERE owner IS NOT NULL AND state IN ('assigned', 'answered') GROUP BY owner ORDER BY owner",
            &[],
        )
        .unwrap();
    (kept, counted)
}

#[test]
fn the_open_call_count_survives_a_rollback_to_the_previous_release_and_back() {
    // The previous release's schema (0001 only), with open calls already.
    let store = SqliteStore::in_memory().unwrap();
    migrate_with(&store, &MIGRATIONS[..1], T0).unwrap();
    let old_release_writes = [
        "INSERT INTO sessions (call_session_id, state, owner, epoch, created_at, updated_at) VALUES ('a', 'assigned', 'M1', 1, 0, 0)",
        "INSERT INTO sessions (call_session_id, state, owner, epoch, created_at, updated_at) VALUES ('b', 'answered', 'M2', 2, 0, 0)",
        "INSERT INTO sessions (call_session_id, state, created_at, updated_at) VALUES ('c', 'pending_assignment', 0, 0)",
    ];
    for sql in old_release_writes {
        store.exec(sql, &[]).unwrap();
    }
    // Roll forward: the migration backfills the count.
    assert_eq!(
        migrate_with(&store, &MIGRATIONS[..2], T0).unwrap(),
        vec!["0002_node_load"]
    );
    let (kept, counted) = load_and_count(&store);
    assert_eq!(kept, counted);
    assert_eq!(kept.len(), 2);
    // Roll back: the previous release writes sessions as it always did,
    // knowing nothing of node_load; the triggers keep the count right.
    for sql in [
        "UPDATE sessions SET state = 'assigned', owner = 'M1', epoch = 3 WHERE call_session_id = 'c'",
        "UPDATE sessions SET state = 'answered' WHERE call_session_id = 'a'",
        "UPDATE sessions SET owner = 'M2', epoch = 4, state = 'assigned' WHERE call_session_id = 'c'",
        "UPDATE sessions SET state = 'node_lost', settled_at = 1 WHERE owner = 'M2' AND state IN ('assigned', 'answered')",
        "UPDATE sessions SET state = 'assigned', owner = 'M1', epoch = 5 WHERE call_session_id = 'c'",
        "UPDATE sessions SET state = 'pending_assignment', owner = NULL WHERE call_session_id = 'c'",
        "DELETE FROM sessions WHERE call_session_id = 'a'",
        "INSERT INTO sessions (call_session_id, state, owner, epoch, created_at, updated_at) VALUES ('d', 'assigned', 'M3', 6, 0, 0)",
    ] {
        store.exec(sql, &[]).unwrap();
        let (kept, counted) = load_and_count(&store);
        assert_eq!(kept, counted, "after {sql}");
    }
    // And the new release decides on it after the roll-forward (whose
    // 0004 backfills the sessions' row count).
    migrate(&store, T0).unwrap();
    let engine = Engine::new(store, EngineConfig::default());
    let status = engine.status(T0).unwrap();
    assert_eq!(status["counts"]["open_calls"], 1);
    assert_eq!(status["counts"]["sessions"], 3);
}

#[test]
fn a_reassigned_event_is_forwarded_again_only_within_the_hop_limit_and_budget() {
    for (hop, budget_left_ms, forwarded) in [
        (1, 1_000, true),
        (MAX_HOPS - 1, MIN_REFORWARD_BUDGET_MS, true),
        (MAX_HOPS, 1_000, false),
        (1, MIN_REFORWARD_BUDGET_MS - 1, false),
    ] {
        let mut w = World::new();
        w.beat("M1", |_| {}).unwrap();
        w.beat("M2", |_| {}).unwrap();
        let first = forward(w.webhook("h1", "call.initiated", "s-h", "incoming"));
        let report = Report {
            event_id: first.event_id.clone(),
            epoch: first.epoch,
            attempt: first.attempt,
            answer: not_admitted(),
            budget_left_ms,
            hop,
        };
        let ReportEffect::Reassigned(next) = w.engine.handle_report(&report, w.now).unwrap() else {
            panic!("not reassigned")
        };
        assert_eq!(next.is_some(), forwarded, "hop {hop}, {budget_left_ms} ms");
        assert_eq!(may_reforward(hop, budget_left_ms), forwarded);
        if next.is_none() {
            // The alarm delivers to the new owner.
            let work = w.engine.poll_alarm(w.now).unwrap();
            assert_eq!(work.forwards.len(), 1);
            assert_eq!(work.forwards[0].node, "M2");
        }
    }
}

#[test]
fn a_key_removed_from_the_registry_is_refused_for_every_node_op() {
    let mut w = World::new();
    w.beat("M1", |_| {}).unwrap();
    let f = forward(w.webhook("k1", "call.initiated", "s-k", "incoming"));
    let gone = Caller {
        node: "M1",
        kid: "k0",
    };
    let req = FenceRequest {
        call_session_id: "s-k".into(),
        call_control_id: "leg-s-k".into(),
        epoch: f.epoch,
        purpose: callfence_core::wire::FencePurpose::Answer,
    };
    assert_eq!(
        w.engine.handle_fence(gone, &req, &w.media, w.now).unwrap(),
        FenceReply::UnknownNodeKey
    );
    let claim = ClaimRequest {
        call_control_id: "out-leg".into(),
        call_session_id: "out".into(),
    };
    assert_eq!(
        w.engine.handle_claim(gone, &claim, w.now).unwrap(),
        ClaimReply::NotRegistered
    );
    assert_eq!(
        w.engine
            .handle_media_verify(gone, "x", &w.media, w.now)
            .unwrap(),
        MediaReply::UnknownNodeKey
    );
    assert_eq!(
        w.engine.handle_heartbeat(gone, w.now / 1000, b"{}", w.now),
        Err(HeartbeatRefusal::UnknownNode)
    );
    // The registered key still fences.
    assert!(matches!(
        w.fence("M1", "s-k", f.epoch),
        FenceReply::Granted(_)
    ));
}

#[test]
fn probes_are_rate_limited_per_node_and_store_no_call_event_or_decision() {
    use callfence_core::engine::ProbeAdmission;
    use callfence_core::store::Store;
    let mut w = World::new();
    let count = |w: &World, table: &str| {
        w.engine
            .store()
            .exec(&format!("SELECT COUNT(*) FROM {table}"), &[])
            .unwrap()[0][0]
            .as_int()
            .unwrap()
    };
    let send = ProbeAdmission::Send {
        origin_url: "https://M1.example.com/t".into(),
    };
    assert_eq!(w.engine.handle_probe("M1", w.now).unwrap(), send);
    w.now += 1_200;
    assert_eq!(
        w.engine.handle_probe("M1", w.now).unwrap(),
        ProbeAdmission::RateLimited { retry_after_s: 4 }
    );
    // Another node has its own budget; an unknown node gets nothing.
    assert!(matches!(
        w.engine.handle_probe("M2", w.now).unwrap(),
        ProbeAdmission::Send { .. }
    ));
    assert_eq!(
        w.engine.handle_probe("M9", w.now).unwrap(),
        ProbeAdmission::UnknownNode
    );
    w.now += 3_800;
    assert_eq!(w.engine.handle_probe("M1", w.now).unwrap(), send);
    for table in ["sessions", "events", "decisions", "legs"] {
        assert_eq!(count(&w, table), 0, "{table}");
    }
}

#[test]
fn the_heartbeat_answer_names_the_registry_allowed_shas() {
    let mut w = World::new();
    let answer = w.beat("M1", |_| {}).unwrap();
    assert_eq!(answer["allowed_shas"], serde_json::Value::Null);
    let mut registry = w.engine.get_document(DocKind::Nodes, None).unwrap().1;
    registry["nodes"]["M1"]["allowed_shas"] = json!(["c".repeat(40)]);
    w.put(DocKind::Nodes, &registry);
    let answer = w.beat("M1", |_| {}).unwrap();
    assert_eq!(answer["allowed_shas"], json!(["c".repeat(40)]));
}

#[test]
fn a_node_removed_from_the_registry_loses_its_beat_and_health_at_the_next_alarm() {
    let mut w = World::new();
    w.beat("M1", |_| {}).unwrap();
    w.beat("M2", |_| {}).unwrap();
    let rows = |w: &World, node: &str| {
        let count = |table: &str| {
            let sql = format!("SELECT COUNT(*) FROM {table} WHERE node = ?");
            w.engine.store().exec(&sql, &[node.into()]).unwrap()[0][0].clone()
        };
        (count("heartbeats"), count("node_health"))
    };
    assert_eq!(rows(&w, "M2").0, Value::Int(1));
    // A policy that no longer names M2, then a registry without it.
    let policy = json!({"schema": "riff_node_routing_policy_v1", "default_node": "M1",
        "by_line": {"sales": {"called_number": "+15102160079", "preferred_node": "M1"}}});
    w.put(DocKind::Policy, &policy);
    let (_, mut registry) = w.engine.get_document(DocKind::Nodes, None).unwrap();
    registry["nodes"].as_object_mut().unwrap().remove("M2");
    w.put(DocKind::Nodes, &registry);
    w.now += 1_000;
    w.engine.poll_alarm(w.now).unwrap();
    assert_eq!(rows(&w, "M2"), (Value::Int(0), Value::Int(0)));
    assert_eq!(
        rows(&w, "M1").0,
        Value::Int(1),
        "a registered node keeps its beat"
    );
}

/// A claim of a fresh outgoing session by `node`.
fn claim(w: &World, node: &str, session: &str) -> ClaimReply {
    let req = ClaimRequest {
        call_control_id: format!("leg-{session}"),
        call_session_id: session.into(),
    };
    w.engine.handle_claim(caller(node), &req, w.now).unwrap()
}

/// A live, answered, fenced call on M1 (the owner then drains, so that a
/// re-resolution would pick M2): its forward, grant and the grant's media
/// token.
fn live_call_on_m1(w: &mut World, session: &str) -> (Forward, callfence_core::engine::FenceGrant) {
    w.beat("M1", |_| {}).unwrap();
    let init = forward(w.webhook(
        &format!("{session}-i"),
        "call.initiated",
        session,
        "incoming",
    ));
    assert_eq!(init.node, "M1");
    assert!(matches!(
        w.report(&init, ok(200)),
        ReportEffect::Delivered(_)
    ));
    let FenceReply::Granted(grant) = w.fence("M1", session, init.epoch) else {
        panic!("no grant")
    };
    let answered = forward(w.webhook(
        &format!("{session}-a"),
        "call.answered",
        session,
        "incoming",
    ));
    assert!(matches!(
        w.report(&answered, ok(200)),
        ReportEffect::Delivered(_)
    ));
    w.beat("M1", |hb| hb.mode = Mode::Drained).unwrap();
    (init, grant)
}

/// Issue 18, finding 4, as observed: a flood of claims from M2 against a
/// small row cap evicted M1's live, answered, fenced call; its next event was
/// re-resolved to another node at a new epoch, which was granted a second
/// fence, and M1 was refused. Now the flood is refused (capacity, rate,
/// storage) and the call is untouched.
#[test]
fn a_claim_flood_from_one_node_cannot_evict_another_node_s_live_call() {
    let mut w = World::with(EngineConfig {
        session_cap: 4,
        ..EngineConfig::default()
    });
    let (init, grant) = live_call_on_m1(&mut w, "live-1");
    w.beat("M2", |hb| hb.capacity.max_calls = 3).unwrap();
    let replies: Vec<ClaimReply> = (0..100)
        .map(|i| claim(&w, "M2", &format!("flood-{i}")))
        .collect();
    assert!(replies[..3]
        .iter()
        .all(|r| matches!(r, ClaimReply::Claimed { .. })));
    assert!(replies[3..10]
        .iter()
        .all(|r| *r == ClaimReply::CapacityExhausted));
    assert!(replies[10..]
        .iter()
        .all(|r| *r == ClaimReply::RateLimited { retry_after_s: 1 }));
    // An idempotent re-claim is not a new session: the same 200.
    w.now += 1_000;
    assert_eq!(
        claim(&w, "M2", "flood-0"),
        replies[0],
        "a re-claim answers the same"
    );
    // The table is full of live calls: a new session is refused, stored
    // nowhere, and nothing is evicted; the alarm prunes nothing live.
    assert_eq!(claim(&w, "M1", "flood-m1"), ClaimReply::StorageFull);
    assert_eq!(
        w.webhook("new-i", "call.initiated", "new-1", "incoming"),
        Ingress::StorageFull
    );
    assert!(w.engine.call("new-1").unwrap().is_none());
    assert!(w.engine.call("flood-m1").unwrap().is_none());
    w.engine.poll_alarm(w.now).unwrap();
    let status = w.engine.status(w.now).unwrap();
    assert_eq!(status["counts"]["sessions"], 4);
    assert_eq!(status["counts"]["storage_full"], 2);
    assert_eq!(status["counts"]["claims_capacity_exhausted"], 7);
    assert_eq!(status["counts"]["claims_rate_limited"], 90);
    // M1's call is intact: its legs and events, its next event to M1 at the
    // same epoch, no second fence, the regrant and the media check.
    let call = w.engine.call("live-1").unwrap().expect("the live call");
    assert_eq!(
        (call["owner"].as_str(), call["epoch"].as_u64()),
        (Some("M1"), Some(init.epoch))
    );
    assert_eq!(call["events"].as_array().unwrap().len(), 2);
    assert_eq!(call["legs"].as_array().unwrap().len(), 1);
    let next = forward(w.webhook("live-1-p", "call.playback.started", "live-1", "incoming"));
    assert_eq!((next.node.as_str(), next.epoch), ("M1", init.epoch));
    assert_eq!(
        w.fence("M2", "live-1", init.epoch),
        FenceReply::Refused(FenceRefusal::NotOwner)
    );
    let FenceReply::Granted(again) = w.fence("M1", "live-1", init.epoch) else {
        panic!("M1's regrant refused")
    };
    assert!(!again.first && again.command_id == grant.command_id);
    assert_eq!(
        w.engine
            .handle_media_verify(caller("M1"), &grant.media_token, &w.media, w.now)
            .unwrap(),
        MediaReply::Valid {
            call_session_id: "live-1".into(),
            epoch: init.epoch
        }
    );
}

/// At the cap, a new session evicts the oldest settled one (an ended call
/// and its legs and events) and never a live one.
#[test]
fn at_the_cap_a_new_session_evicts_the_oldest_ended_call_only() {
    let mut w = World::with(EngineConfig {
        session_cap: 2,
        ..EngineConfig::default()
    });
    w.beat("M1", |_| {}).unwrap();
    forward(w.webhook("old-i", "call.initiated", "old", "incoming"));
    forward(w.webhook("old-h", "call.hangup", "old", "incoming"));
    w.now += 1_000;
    let (live, _) = live_call_on_m1(&mut w, "live");
    w.beat("M1", |_| {}).unwrap();
    w.now += 1_000;
    let fresh = forward(w.webhook("fresh-i", "call.initiated", "fresh", "incoming"));
    assert!(fresh.epoch > live.epoch);
    assert!(
        w.engine.call("old").unwrap().is_none(),
        "the ended call made room"
    );
    let call = w.engine.call("live").unwrap().expect("the live call");
    assert_eq!(call["epoch"].as_u64(), Some(live.epoch));
    // Both left are live: the next new one is refused.
    assert_eq!(
        w.webhook("more-i", "call.initiated", "more", "incoming"),
        Ingress::StorageFull
    );
    assert_eq!(w.engine.status(w.now).unwrap()["counts"]["sessions"], 2);
}

/// Retention by age and the row caps of legs and events spare a live call:
/// a fenced call settled `max_duration` and `node_lost` whose hangup never
/// came keeps its session, legs and events; an ended one goes.
#[test]
fn retention_by_age_spares_a_fenced_call_that_has_not_ended() {
    let mut w = World::new();
    let (live, _) = live_call_on_m1(&mut w, "kept");
    w.beat("M1", |_| {}).unwrap();
    forward(w.webhook("gone-i", "call.initiated", "gone", "incoming"));
    forward(w.webhook("gone-h", "call.hangup", "gone", "incoming"));
    // The first alarm settles it (a change); the second finds it untouched
    // for longer than the retention.
    for _ in 0..2 {
        w.now += 25 * 3_600_000;
        w.engine.poll_alarm(w.now).unwrap();
    }
    assert!(w.engine.call("gone").unwrap().is_none());
    let call = w.engine.call("kept").unwrap().expect("the fenced call");
    assert_eq!(call["state"], "max_duration");
    assert_eq!(call["epoch"].as_u64(), Some(live.epoch));
    assert_eq!(call["events"].as_array().unwrap().len(), 2);
    assert_eq!(call["legs"].as_array().unwrap().len(), 1);
    let next = forward(w.webhook("kept-h", "call.hangup", "kept", "incoming"));
    assert_eq!((next.node.as_str(), next.epoch), ("M1", live.epoch));
}

#[test]
fn status_says_where_an_override_callers_next_call_goes_on_each_line() {
    let mut w = World::with_m1_and_a_lineless_m2();
    let caller = "+14155550100";
    let policy = json!({"schema": "riff_node_routing_policy_v1", "default_node": "M1",
        "by_line": {"sales": {"called_number": "+15102160079", "preferred_node": "M1"}},
        "by_caller": {caller: {"preferred_node": "M2", "expires_at": format_ms(w.now + 3_600_000)}}});
    w.put(DocKind::Policy, &policy);
    let shown = |w: &World| w.engine.status(w.now).unwrap()["overrides"][0].clone();
    let o = shown(&w);
    assert_eq!(
        (&o["caller"], &o["prefers"]),
        (&json!(caller), &json!("M2"))
    );
    // M2 serves no line: to sales the caller's call falls back to the
    // default node; to any other number it reaches M2.
    assert_eq!(
        o["next_calls"],
        json!([
            {"line_id": "sales", "next_call_target": "M1", "fallback_in_use": true,
             "reasons": {"M2": ["line_not_served"]}},
            {"line_id": null, "next_call_target": "M2", "fallback_in_use": false, "reasons": {}},
        ])
    );
    // Once expired, the override routes nothing and says so.
    w.now += 3_600_000;
    let o = shown(&w);
    assert_eq!(
        (&o["expired"], &o["next_calls"]),
        (&json!(true), &json!(null))
    );
}

#[test]
fn metrics_count_committed_decisions_and_the_alarm_s_rejections() {
    use callfence_core::metrics::{DECISIONS, WEBHOOKS};
    let mut w = World::new();
    let count = |w: &World, name: &str, label: &str, value: &str| -> u64 {
        let samples = w.engine.metrics().samples();
        let matching = samples.iter().filter(|s| s.name == name);
        matching
            .filter(|s| s.labels.get(label).map(String::as_str) == Some(value))
            .map(|s| s.value)
            .sum()
    };
    assert_eq!(
        w.webhook("p1", "call.initiated", "s-p", "incoming"),
        Ingress::Pending(PendingReason::NoEligibleNode)
    );
    assert_eq!(count(&w, DECISIONS, "outcome", "pending"), 1);
    assert_eq!(count(&w, WEBHOOKS, "outcome", "rejected"), 0);
    w.now += 10_001;
    w.engine.poll_alarm(w.now).unwrap();
    assert_eq!(count(&w, DECISIONS, "outcome", "rejected"), 1);
    assert_eq!(count(&w, WEBHOOKS, "outcome", "rejected"), 1);
    // A re-check that records nothing counts nothing.
    w.engine.poll_alarm(w.now + 1_000).unwrap();
    assert_eq!(count(&w, DECISIONS, "outcome", "rejected"), 1);
}

#[test]
fn a_failure_reaches_the_directory_and_a_healthy_delivery_sends_nothing() {
    let mut w = World::new();
    w.beat("M1", |_| {}).unwrap();
    w.beat("M2", |_| {}).unwrap();
    let health = |w: &World, node: &str| w.engine.directory().view().unwrap().nodes[node].health;
    // A delivery to a healthy node changes no eligibility: no mark, and the
    // directory's stored health of M1 stays empty.
    let first = forward(w.webhook("h1", "call.initiated", "s-h1", "incoming"));
    assert_eq!(first.node, "M1");
    w.report(&first, ok(200));
    assert_eq!(health(&w, "M1"), Default::default());
    // A definite refusal is a failure: the directory has it at once (the
    // engine delivers the shard's mark before it answers), and the next
    // decision avoids M1.
    let second = forward(w.webhook("h2", "call.initiated", "s-h2", "incoming"));
    assert_eq!(second.node, "M1");
    w.report(&second, not_admitted());
    assert!(health(&w, "M1").failing());
    let third = forward(w.webhook("h3", "call.initiated", "s-h3", "incoming"));
    assert_eq!(third.node, "M2");
    // A later delivery to M1 clears the failure, which the shard sends.
    w.now += 31_000;
    w.beat("M1", |_| {}).unwrap();
    w.beat("M2", |_| {}).unwrap();
    let fourth = forward(w.webhook("h4", "call.initiated", "s-h4", "incoming"));
    assert_eq!(fourth.node, "M1");
    w.report(&fourth, ok(200));
    assert!(!health(&w, "M1").failing());
}

#[test]
fn a_mark_the_directory_could_not_store_is_delivered_at_the_next_request() {
    let mut w = World::new();
    w.beat("M1", |_| {}).unwrap();
    w.beat("M2", |_| {}).unwrap();
    let failing = |w: &World| {
        w.engine.directory().view().unwrap().nodes["M1"]
            .health
            .failing()
    };
    let first = forward(w.webhook("m1", "call.initiated", "s-m1", "incoming"));
    assert_eq!(first.node, "M1");
    // The directory's store refuses the write of forward health once.
    let store = w.engine.store();
    store
        .exec(
            "CREATE TEMP TRIGGER refuse_health BEFORE INSERT ON node_health \
             BEGIN SELECT RAISE(ABORT, 'disk full'); END",
            &[],
        )
        .unwrap();
    let report = Report {
        event_id: first.event_id.clone(),
        epoch: first.epoch,
        attempt: first.attempt,
        answer: not_admitted(),
        budget_left_ms: 0,
        hop: 1,
    };
    assert!(w.engine.handle_report(&report, w.now).is_err());
    assert!(
        !failing(&w),
        "the directory stored a mark its store refused"
    );
    store.exec("DROP TRIGGER refuse_health", &[]).unwrap();
    // The next request delivers the kept mark before it decides.
    let second = forward(w.webhook("m2", "call.initiated", "s-m2", "incoming"));
    assert!(failing(&w), "the mark was lost with the failed write");
    assert_eq!(second.node, "M2");
}

#[test]
fn a_shard_keeps_the_newest_view_and_a_restarted_directory_s_first_view_wins() {
    use callfence_core::directory::{Directory, DirectoryOutput};
    use callfence_core::shard::{CallShard, ShardInput};
    use std::rc::Rc;
    let store = SqliteStore::in_memory().unwrap();
    migrate(&store, 1_000).unwrap();
    let store = Rc::new(store);
    let view = |d: &Directory<Rc<SqliteStore>>, now: i64| match d.poll_output(now).unwrap() {
        Some(DirectoryOutput::View(v)) => v,
        None => panic!("no view after a change"),
    };
    let directory = Directory::new(store.clone(), true);
    let shard = CallShard::new(store.clone(), EngineConfig::default());
    let registry = json!({"schema": "callfence_nodes_v1", "nodes": {"M1": {
        "origin_url": "http://m1.example/t", "role": "stable",
        "fallback_approved": false, "admin_drained": false,
        "keys": {"k1": b64_encode(SigningKey::from_bytes(&[1; 32]).verifying_key().as_bytes())}}}});
    let open = Default::default();
    directory
        .put_document(
            DocKind::Nodes,
            registry.to_string().as_bytes(),
            Some("\"0\""),
            "t",
            &open,
            1_000,
        )
        .unwrap();
    let first = view(&directory, 1_000);
    assert!(
        directory.poll_output(1_001).unwrap().is_none(),
        "nothing changed"
    );
    directory
        .put_document(
            DocKind::Nodes,
            registry.to_string().as_bytes(),
            Some("\"1\""),
            "t",
            &open,
            2_000,
        )
        .unwrap();
    let second = view(&directory, 2_000);
    // Delivered out of order: the late first view changes nothing.
    shard.handle_input(ShardInput::View(second.clone()));
    shard.handle_input(ShardInput::View(first));
    assert!(Rc::ptr_eq(&shard.directory_view(), &second));
    // A restarted directory counts its changes from zero, but its first
    // view is stamped with the time it is sent, so it still wins.
    let restarted = Directory::new(store.clone(), true);
    let third = view(&restarted, 3_000);
    assert_eq!(third.nodes_revision(), second.nodes_revision());
    shard.handle_input(ShardInput::View(third.clone()));
    assert!(Rc::ptr_eq(&shard.directory_view(), &third));
    // The same view again, or one of an unknown format, changes nothing.
    shard.handle_input(ShardInput::View(third.clone()));
    let mut unknown = (*third).clone();
    unknown.v = 99;
    unknown.as_of_ms = 9_000;
    shard.handle_input(ShardInput::View(Rc::new(unknown)));
    assert!(Rc::ptr_eq(&shard.directory_view(), &third));
}

#[test]
fn the_shard_map_starts_at_one_shard_and_the_rollback_floor_follows_its_history() {
    const HOUR: i64 = 3_600_000;
    let engine = World::new().engine;
    // A session placed under a replaced map may be created until
    // REPLACED_MAP_USE_MS after the change, live as long as the longest
    // call, and be kept for the retention after it ends.
    let horizon = engine.config().timing.holding_horizon_ms();
    let window = horizon + REPLACED_MAP_USE_MS;
    assert_eq!(
        engine.directory().shard_map().unwrap(),
        (0, ShardMap::default())
    );
    let (rev, doc) = engine.get_document(DocKind::Shards, None).unwrap();
    assert_eq!(
        (rev, doc),
        (
            0,
            json!({"schema": SHARDS_SCHEMA, "call_shards": 1, "revision": 0})
        )
    );
    let floor =
        |e: &Engine<SqliteStore>, at: i64| e.directory().rollback_floor(at, horizon).unwrap();
    assert_eq!(floor(&engine, T0), RollbackFloor::V1_3);

    let put = |e: &Engine<SqliteStore>, n: u64, if_match: &str, at: i64| {
        let doc = json!({"schema": SHARDS_SCHEMA, "call_shards": n});
        e.put_document(
            DocKind::Shards,
            doc.to_string().as_bytes(),
            Some(if_match),
            "t",
            at,
        )
    };
    // A bad count is refused, and nothing is stored.
    assert!(
        matches!(put(&engine, 33, "\"0\"", T0), Err(DocError::InvalidDocument(p)) if p[0].path == "/call_shards")
    );
    assert_eq!(put(&engine, 1, "\"0\"", T0), Ok(1));
    assert_eq!(floor(&engine, T0 + HOUR), RollbackFloor::V1_3);

    // Grown to 4; read back by a new object (its caches empty), the map in
    // force is told as it is.
    assert_eq!(put(&engine, 4, "\"1\"", T0 + HOUR), Ok(2));
    let engine = Engine::new(engine.into_store(), EngineConfig::default());
    assert_eq!(
        engine.directory().shard_map().unwrap(),
        (2, ShardMap { call_shards: 4 })
    );
    assert_eq!(floor(&engine, T0 + 2 * HOUR), RollbackFloor::V1_4);
    // Shrunk back to one: the floor stays until no shard but global may
    // hold a record, past the retention of the longest call.
    let shrunk_at = T0 + 3 * HOUR;
    assert_eq!(put(&engine, 1, "\"2\"", shrunk_at), Ok(3));
    let retention = engine.config().timing.retention_ms;
    assert_eq!(
        floor(&engine, shrunk_at + retention + 1),
        RollbackFloor::V1_4
    );
    assert_eq!(floor(&engine, shrunk_at + window - 1), RollbackFloor::V1_4);
    assert_eq!(floor(&engine, shrunk_at + window + 1), RollbackFloor::V1_3);
}

/// `global` with M1 beating, call shard 1 on a database of its own, and a
/// map of two shards.
fn with_call_shard_1() -> (World, Engine<SqliteStore>, MapNotice) {
    let mut w = World::new();
    w.beat("M1", |_| {}).unwrap();
    let store = SqliteStore::in_memory().unwrap();
    migrate(&store, T0).unwrap();
    let calls1 = Engine::call_shard(store, EngineConfig::default(), 1);
    (w, calls1, MapNotice::new(1, 2, 0))
}

/// A directory that has just restarted has changed nothing since: the
/// lease it grants must still carry a view the shard takes over the one it
/// kept from before the restart, or the shard decides on eligibility the
/// directory acknowledged away. (The lease simulation found it: a drain
/// acknowledged, `global` restarted, a new call sent to the drained node.)
#[test]
fn a_lease_from_a_restarted_directory_carries_a_view_the_shard_takes() {
    let (mut w, calls1, map) = with_call_shard_1();
    let grant = |engine: &Engine<SqliteStore>, now: i64| {
        let ask = calls1.shard().lease_ask(false).unwrap();
        let lease = engine.handle_lease_ask(&ask, now).unwrap().unwrap();
        let lease: Lease = serde_json::from_str(&serde_json::to_string(&lease).unwrap()).unwrap();
        assert!(calls1.shard().handle_lease(lease).unwrap());
    };
    let call = |i: u32, now: i64| {
        let session = (0..)
            .map(|n| format!("v3:restarted-{i}-{n}"))
            .find(|s| map.home(s) == 1)
            .unwrap();
        let body = json!({"data": {"id": format!("e{i}"), "event_type": "call.initiated", "payload": {"call_session_id": session,
            "call_control_id": format!("leg-{session}"), "from": "+12125550199", "to": "+15102160079", "direction": "incoming"}}})
        .to_string();
        let envelope = parse_envelope(body.as_bytes()).unwrap();
        let arrival = Arrival {
            map: Some(map),
            absent: Some((1, vec![0])),
            legs_asked: false,
        };
        calls1
            .handle_placed_webhook(&envelope, &body, &[], &arrival, now)
            .unwrap()
    };
    grant(&w.engine, w.now);
    assert_eq!(forward(call(1, w.now)).node, "M1");

    // M1 drains, and the directory restarts before anything else changes.
    w.now += 1_000;
    w.beat("M1", |hb| hb.mode = Mode::Drained).unwrap();
    w.now += 1_000;
    let store = std::mem::replace(
        &mut w.engine,
        Engine::new(SqliteStore::in_memory().unwrap(), EngineConfig::default()),
    )
    .into_store();
    w.engine = Engine::new(store, EngineConfig::default());
    w.now += 1_000;
    grant(&w.engine, w.now);
    let next = call(2, w.now);
    assert!(
        !matches!(&next, Ingress::Forward(f) if f.node == "M1"),
        "a new call went to the drained M1: {next:?}"
    );
}

/// A call shard's own object (`calls-k`, SPEC §16) knows nothing until its
/// lease, which crosses from `global` as JSON: before it a new call parks
/// and a node's key is unknown; under it the call is forwarded and
/// fenced; a failed forward's mark reaches `global` from its outbox.
#[test]
fn a_call_shard_s_own_object_decides_only_under_a_lease_from_global() {
    let (w, calls1, map) = with_call_shard_1();
    let session = (0..100)
        .map(|i| format!("v3:k1-{i}"))
        .find(|s| map.home(s) == 1)
        .unwrap();
    let arrival = Arrival {
        map: Some(map),
        absent: Some((1, vec![0])),
        legs_asked: false,
    };
    let body = |id: &str| {
        json!({"data": {"id": id, "event_type": "call.initiated", "payload": {"call_session_id": session,
            "call_control_id": format!("leg-{session}"), "from": "+12125550199", "to": "+15102160079", "direction": "incoming"}}})
        .to_string()
    };
    let webhook = |id: &str, now: i64| {
        let body = body(id);
        let envelope = parse_envelope(body.as_bytes()).unwrap();
        calls1
            .handle_placed_webhook(&envelope, &body, &[], &arrival, now)
            .unwrap()
    };
    assert!(matches!(webhook("e1", w.now), Ingress::Pending(_)));
    assert!(!calls1.key_in_force(caller("M1")).unwrap());
    assert!(calls1.shard().lease_due(w.now));

    let ask = calls1.shard().lease_ask(false).unwrap();
    let ask: LeaseAsk = serde_json::from_str(&serde_json::to_string(&ask).unwrap()).unwrap();
    let lease = w.engine.handle_lease_ask(&ask, w.now).unwrap().unwrap();
    let lease: Lease = serde_json::from_str(&serde_json::to_string(&lease).unwrap()).unwrap();
    assert!(calls1.shard().handle_lease(lease).unwrap());
    assert!(calls1.key_in_force(caller("M1")).unwrap());

    let f = forward(webhook("e2", w.now));
    assert_eq!((f.node.as_str(), f.epoch), ("M1", 1));
    let req = FenceRequest {
        call_session_id: session.clone(),
        call_control_id: format!("leg-{session}"),
        epoch: 1,
        purpose: callfence_core::wire::FencePurpose::Answer,
    };
    let fenced = calls1
        .handle_fence(caller("M1"), &req, &w.media, w.now)
        .unwrap();
    assert!(matches!(fenced, FenceReply::Granted(_)), "{fenced:?}");
    assert_eq!(
        w.engine.call(&session).unwrap(),
        None,
        "global holds nothing of it"
    );
    // Its decisions carry its number (SPEC §16: ids unique across shards),
    // newest first, and a paged read finds them by id.
    let read = calls1.decisions(None, None, None).unwrap();
    let mine: Vec<u64> = read["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["decision_id"].as_u64().unwrap())
        .collect();
    assert!(
        !mine.is_empty() && mine.iter().all(|&id| id >> 40 == 1),
        "{mine:?}"
    );
    let oldest = mine[mine.len() - 1];
    let paged = calls1.decisions(None, None, Some(oldest - 1)).unwrap();
    assert_eq!(paged["decisions"][0]["decision_id"], oldest);

    // The forward times out: the mark waits in the shard's outbox until
    // the object sends it, and global's status then shows the failure.
    let report = Report {
        event_id: f.event_id.clone(),
        epoch: f.epoch,
        attempt: f.attempt,
        answer: ReportedAnswer::Timeout,
        budget_left_ms: 0,
        hop: 1,
    };
    calls1.handle_report(&report, w.now).unwrap();
    let failing = |w: &World| {
        let status = w.engine.status(w.now).unwrap().to_string();
        status.contains("recent_forward_failure")
    };
    assert!(!failing(&w));
    let Some(ShardOutput::Mark(mark)) = calls1.shard().poll_output() else {
        panic!("no mark in the outbox");
    };
    w.engine.handle_mark(mark, w.now).unwrap();
    assert!(failing(&w));
}

/// A lease carries the map in force with its history (SPEC §16). Within
/// the holding horizon of a map change, a call shard asks the replaced
/// map's home before it creates a session; once the horizon has passed the
/// history narrows to the map in force, every shard adopts it with its next
/// lease (and `global` when it grants one), and a new session needs no
/// question. A wider notice of the same revision, from a Worker's old
/// cache, never widens it again.
#[test]
fn a_lease_carries_the_map_whose_history_narrows_past_the_horizon() {
    let config = EngineConfig::default();
    let horizon = config.timing.holding_horizon_ms();
    let store = SqliteStore::in_memory().unwrap();
    migrate(&store, T0).unwrap();
    let global = Engine::new(store, config.clone());
    let doc = json!({"schema": SHARDS_SCHEMA, "call_shards": 2}).to_string();
    global
        .put_document(DocKind::Shards, doc.as_bytes(), Some("\"0\""), "t", T0)
        .unwrap();
    let store = SqliteStore::in_memory().unwrap();
    migrate(&store, T0).unwrap();
    let calls1 = Engine::call_shard(store, config, 1);
    let wide = MapNotice::new(1, 2, 0b01);
    let narrow = MapNotice::new(1, 2, 0);
    let lease_at = |now: i64| {
        let ask = calls1.shard().lease_ask(false).unwrap();
        let lease = global.handle_lease_ask(&ask, now).unwrap().unwrap();
        let map = lease.map;
        assert!(calls1.shard().handle_lease(lease).unwrap());
        map
    };
    let session = (0..100)
        .map(|i| format!("v3:narrow-{i}"))
        .find(|s| wide.home(s) == 1)
        .unwrap();
    let body = json!({"data": {"id": "e1", "event_type": "call.initiated", "payload": {
        "call_session_id": session, "call_control_id": "leg-1", "from": "+12125550199",
        "to": "+15102160079", "direction": "incoming"}}})
    .to_string();
    let envelope = parse_envelope(body.as_bytes()).unwrap();
    let arrival = Arrival {
        map: Some(wide),
        ..Arrival::default()
    };
    let webhook = |now: i64| {
        calls1
            .handle_placed_webhook(&envelope, &body, &[], &arrival, now)
            .unwrap()
    };

    let early = T0 + horizon;
    assert_eq!(lease_at(early), Some(wide));
    assert_eq!(calls1.shard().map().unwrap(), wide);
    assert!(
        matches!(webhook(early), Ingress::Redirect(Redirect::Lookup { ref shards, .. }) if shards == &[0]),
        "within the horizon the replaced map's home is asked"
    );

    let late = T0 + horizon + REPLACED_MAP_USE_MS + 1;
    assert_eq!(lease_at(late), Some(narrow));
    assert_eq!(calls1.shard().map().unwrap(), narrow);
    assert_eq!(
        global.shard().map().unwrap(),
        narrow,
        "global adopted it too"
    );
    assert_eq!(calls1.shard().handle_map(&wide).unwrap(), narrow);
    assert!(
        !matches!(webhook(late), Ingress::Redirect(_)),
        "past the horizon the session is created with no question"
    );
    assert!(global.shard().handle_holds(&session, &wide).unwrap() == Holds::Absent);
    assert_eq!(global.shard().map().unwrap(), narrow);
}

/// An event that names no session reaches its leg's holder (SPEC §16):
/// a shard that does not know the leg, under a map whose history had
/// other shards, stores nothing and names the shards to ask; the one that
/// knows the leg serves it as its session's event; when none does, the
/// shard asked first records it as unroutable. Under a one-shard map
/// nothing is asked.
#[test]
fn an_event_with_no_session_reaches_the_holder_of_its_leg() {
    let config = EngineConfig::default();
    let store = SqliteStore::in_memory().unwrap();
    migrate(&store, T0).unwrap();
    let global = Engine::new(store, config.clone());
    let store = SqliteStore::in_memory().unwrap();
    migrate(&store, T0).unwrap();
    let calls1 = Engine::call_shard(store, config, 1);
    let event = |id: &str, payload: serde_json::Value| {
        let body = json!({"data": {"id": id, "event_type": "call.hangup", "payload": payload}})
            .to_string();
        (parse_envelope(body.as_bytes()).unwrap(), body)
    };
    let send = |engine: &Engine<SqliteStore>, (envelope, body): &(_, String), legs_asked| {
        let arrival = Arrival {
            legs_asked,
            ..Arrival::default()
        };
        engine
            .handle_placed_webhook(envelope, body, &[], &arrival, T0)
            .unwrap()
    };
    let legless = event("e-legless", json!({"call_control_id": "leg-k1"}));
    assert!(
        matches!(send(&global, &legless, false), Ingress::Unroutable),
        "one shard: recorded where it is"
    );

    let doc = json!({"schema": SHARDS_SCHEMA, "call_shards": 2}).to_string();
    global
        .put_document(DocKind::Shards, doc.as_bytes(), Some("\"0\""), "t", T0)
        .unwrap();
    let map = global.shard().map().unwrap();
    let session = (0..100)
        .map(|i| format!("v3:leg-{i}"))
        .find(|s| map.home(s) == 1)
        .unwrap();
    let first = event(
        "e-first",
        json!({"call_session_id": session, "call_control_id": "leg-k1"}),
    );
    let arrival = Arrival {
        map: Some(map),
        absent: Some((map.revision, vec![0])),
        legs_asked: false,
    };
    let created = calls1
        .handle_placed_webhook(&first.0, &first.1, &[], &arrival, T0)
        .unwrap();
    assert!(!matches!(created, Ingress::Redirect(_)), "{created:?}");
    assert!(calls1.holds_leg("leg-k1").unwrap());
    assert!(!global.holds_leg("leg-k1").unwrap());

    let hangup = event("e-hangup", json!({"call_control_id": "leg-k1"}));
    assert!(
        matches!(send(&global, &hangup, false), Ingress::Redirect(Redirect::Leg { ref shards, .. }) if shards == &[1]),
        "global asks the other shard first and stores nothing"
    );
    let stored: Vec<String> = global.events(None, Some(10)).unwrap()["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(stored, ["e-legless"], "the hangup is not stored in global");
    let served = send(&calls1, &hangup, true);
    assert!(
        !matches!(served, Ingress::Unroutable | Ingress::Redirect(_)),
        "the leg's holder serves it as its session's event: {served:?}"
    );
    let unknown = event("e-unknown", json!({"call_control_id": "leg-nobody"}));
    assert!(matches!(send(&global, &unknown, true), Ingress::Unroutable));
}
