//! The bounded scenario: two nodes, a few calls, and every action the world
//! can take, applied to the real [`Engine`] the way the Worker and the node
//! agents would, with what each action showed handed to the checker.
//!
//! A [`State`] is the database's tables, what the harness remembers (the
//! clock, the armed alarm, forwards awaiting their outcome, budgets left,
//! what each node last said of itself, the documents' revisions as their
//! writers know them) and the checker's history.

use crate::common::checker::{Checker, Observation};
use crate::common::fixtures::{self, BeatSpec, Keys, T0};
use crate::common::observe;
use crate::db::{Db, ModelStore, TableHashes, Wide};
use crate::plants::Plant;
use callfence_core::document::DocKind;
use callfence_core::engine::{
    Caches, Caller, ClaimRequest, Engine, EngineConfig, FenceReply, FenceRequest, Forward, Ingress,
    Report, ReportEffect, ReportedAnswer, DEFAULT_SESSION_CAP,
};
use callfence_core::heartbeat::Mode;
use callfence_core::store::{Store, Value};
use callfence_core::telnyx::Envelope;
use serde_json::json;
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::rc::Rc;

/// A node-signed request's caller, with the key id the fixtures register.
fn signed(node: &str) -> Caller<'_> {
    Caller { node, kid: "k1" }
}

/// The nodes, both stable and registered.
pub const NODES: [&str; 2] = ["M1", "M2"];
const LINE: (&str, &str) = ("main", "+15102160079");
const CALLER: &str = "+12125550199";
const DIALLED: &str = "+12025550133";
/// The budget a report made at once may spend on a forward to a new owner.
const WEBHOOK_BUDGET_MS: i64 = 1_300;
/// How long after its send a beat still vouches for the node in the
/// checker's eyes (valid_for_s plus the signed-time grace).
const BEAT_TRUST_MS: i64 = 17_000;

/// The scenario's bounds. Every budget is spent by the action it names;
/// fences, claims, reports and alarms are bounded by what there is to act on.
#[derive(Debug, Clone)]
pub struct Bounds {
    /// Calls: odd-numbered ones inbound on the line, even-numbered ones
    /// dialled by a node (claimed).
    pub calls: usize,
    /// Deliveries of each `call.initiated` (the first, then duplicates).
    pub deliveries: u8,
    /// Deliveries of each `call.hangup`.
    pub hangups: u8,
    /// Heartbeats per node.
    pub beats: u8,
    /// Restarts of the Dispatcher.
    pub restarts: u8,
    /// Compare-and-set writes of a document (fresh or stale).
    pub writes: u8,
    /// Advances of the clock.
    pub advances: u8,
    /// The clock never passes T0 + horizon.
    pub horizon_ms: i64,
    /// Duplicates may also arrive through the failover URL.
    pub failover: bool,
    /// Claims by M2 of fresh outgoing sessions (a dial loop's flood).
    pub floods: u8,
    /// The sessions table's row cap (`SESSION_CAP`).
    pub session_cap: i64,
}

impl Bounds {
    /// A named preset: `hangups` and `restarts` (the two scenarios of
    /// `full`, see [`Bounds::scenarios`]), `large` (three deliveries with
    /// failover duplicates, a hangup, two beats per node, a restart, a
    /// document write and two clock advances: the first `full`; it does not
    /// finish in 10 minutes here), `short` (`make test`), `smoke` (a debug
    /// `cargo test`).
    pub fn preset(name: &str) -> Self {
        let large = Bounds {
            calls: 1,
            deliveries: 3,
            hangups: 1,
            beats: 2,
            restarts: 1,
            writes: 1,
            advances: 2,
            horizon_ms: 150_000,
            failover: true,
            floods: 0,
            session_cap: DEFAULT_SESSION_CAP,
        };
        let hangups = Bounds {
            deliveries: 2,
            beats: 1,
            restarts: 0,
            writes: 0,
            advances: 1,
            ..large
        };
        match name {
            "large" => large,
            "hangups" => hangups,
            "restarts" => Bounds {
                hangups: 0,
                restarts: 1,
                writes: 1,
                ..hangups
            },
            "short" => Bounds {
                hangups: 0,
                failover: false,
                ..hangups
            },
            // The `short` bounds with one delivery, a row cap of 2 and two
            // claims of fresh sessions: the flood meets a live, fenced call
            // at the cap.
            "cap" => Bounds {
                deliveries: 1,
                floods: 2,
                session_cap: 2,
                ..Self::preset("short")
            },
            "smoke" => Bounds {
                deliveries: 1,
                hangups: 0,
                advances: 0,
                failover: false,
                ..hangups
            },
            "full" => panic!("`full` is two scenarios (hangups, restarts): name one of them"),
            other => panic!(
                "unknown model preset {other:?} (full, hangups, restarts, large, short, cap, smoke)"
            ),
        }
    }

    /// The scenarios a preset runs: `full` (`make model-check`) is
    /// `hangups` (a call's hangup among everything else, no restart, no
    /// document write) and `restarts` (a restart that drops every cache and
    /// a compare-and-set write, no hangup); together
    /// they reach every kind of action in about 2.5 minutes here, where one
    /// scenario with both (and three deliveries, two beats) does not finish
    /// in 10. Every other preset is one scenario of its own name.
    pub fn scenarios(name: &str) -> Vec<(&str, Self)> {
        let named = |names: &[&'static str]| {
            names
                .iter()
                .map(|n| (*n, Self::preset(n)))
                .collect::<Vec<_>>()
        };
        match name {
            "full" => named(&["hangups", "restarts", "cap"]),
            "short" => named(&["short", "cap"]),
            other => vec![(other, Self::preset(other))],
        }
    }

    /// The scenarios named by `CALLFENCE_MODEL` (default `default`), each
    /// with the `CALLFENCE_MODEL_*` overrides applied.
    pub fn scenarios_from_env(default: &str) -> Vec<(String, Self)> {
        let preset = std::env::var("CALLFENCE_MODEL").unwrap_or_else(|_| default.into());
        Self::scenarios(&preset)
            .into_iter()
            .map(|(name, mut b)| {
                b.override_from_env();
                (name.to_string(), b)
            })
            .collect()
    }

    /// The preset named by `CALLFENCE_MODEL` (default `default`), with the
    /// `CALLFENCE_MODEL_*` overrides applied.
    pub fn from_env(default: &str) -> Self {
        let preset = std::env::var("CALLFENCE_MODEL").unwrap_or_else(|_| default.into());
        let mut b = Self::preset(&preset);
        b.override_from_env();
        b
    }

    /// Applies each `CALLFENCE_MODEL_*` variable that is set to its bound.
    fn override_from_env(&mut self) {
        let b = self;
        let var = |name: &str| -> Option<i64> {
            let v = std::env::var(format!("CALLFENCE_MODEL_{name}")).ok()?;
            Some(
                v.parse()
                    .unwrap_or_else(|_| panic!("CALLFENCE_MODEL_{name}={v} is not a number")),
            )
        };
        if let Some(v) = var("CALLS") {
            b.calls = v.clamp(1, 4) as usize;
        }
        for (name, bound) in [
            ("DELIVERIES", &mut b.deliveries),
            ("HANGUPS", &mut b.hangups),
            ("BEATS", &mut b.beats),
            ("RESTARTS", &mut b.restarts),
            ("WRITES", &mut b.writes),
            ("ADVANCES", &mut b.advances),
            ("FLOODS", &mut b.floods),
        ] {
            if let Some(v) = var(name) {
                *bound = u8::try_from(v).expect("a bound of at most 255");
            }
        }
        if let Some(v) = var("HORIZON_S") {
            b.horizon_ms = v * 1000;
        }
        if let Some(v) = var("FAILOVER") {
            b.failover = v != 0;
        }
        if let Some(v) = var("SESSION_CAP") {
            b.session_cap = v.max(1);
        }
    }
}

impl Bounds {
    /// The environment that sets exactly these bounds.
    pub fn env(&self) -> String {
        format!(
            "CALLFENCE_MODEL_CALLS={} CALLFENCE_MODEL_DELIVERIES={} CALLFENCE_MODEL_HANGUPS={} CALLFENCE_MODEL_BEATS={} CALLFENCE_MODEL_RESTARTS={} CALLFENCE_MODEL_WRITES={} CALLFENCE_MODEL_ADVANCES={} CALLFENCE_MODEL_HORIZON_S={} CALLFENCE_MODEL_FAILOVER={} CALLFENCE_MODEL_FLOODS={} CALLFENCE_MODEL_SESSION_CAP={}",
            self.calls,
            self.deliveries,
            self.hangups,
            self.beats,
            self.restarts,
            self.writes,
            self.advances,
            self.horizon_ms / 1000,
            u8::from(self.failover),
            self.floods,
            self.session_cap
        )
    }
}

impl fmt::Display for Bounds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} nodes, {} calls, {} deliveries of each call.initiated, {} of each hangup, {} beats per node, {} restarts, {} document writes, {} clock advances within {} s{}, {} flood claims, row cap {}",
            NODES.len(),
            self.calls,
            self.deliveries,
            self.hangups,
            self.beats,
            self.restarts,
            self.writes,
            self.advances,
            self.horizon_ms / 1000,
            if self.failover { ", failover duplicates" } else { "" },
            self.floods,
            self.session_cap
        )
    }
}

/// What a heartbeat says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BeatKind {
    /// Active, clean, ready: eligible.
    Eligible,
    /// A dirty checkout: ineligible.
    Dirty,
    /// Signed 20 s ago: stale (and skewed) as soon as it arrives.
    Stale,
}

/// Which URL a delivery came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Via {
    Primary,
    Failover,
}

/// A forward attempt's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    Delivered,
    NotAdmitted,
    Timeout,
    ServerError,
    /// No report ever comes: the lease lapses.
    Lapse,
}

/// One step of the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    Beat {
        node: u8,
        kind: BeatKind,
    },
    Webhook {
        event: u8,
        via: Via,
    },
    Report {
        event: u8,
        attempt: u32,
        outcome: Outcome,
    },
    Fence {
        node: u8,
        call: u8,
        epoch: u64,
    },
    Claim {
        node: u8,
        call: u8,
    },
    /// M2 claims the next fresh outgoing session (`flood-N`).
    Flood,
    Alarm,
    /// Moves the clock to this many ms after T0.
    Advance {
        to_ms: i64,
    },
    Restart,
    Put {
        policy: bool,
        stale: bool,
    },
}

fn event_name(event: u8) -> String {
    let kind = if event.is_multiple_of(2) {
        "initiated"
    } else {
        "hangup"
    };
    format!("c{}.{kind}", event / 2 + 1)
}

fn parse_event(text: &str) -> Option<u8> {
    let (call, kind) = text.strip_prefix('c')?.split_once('.')?;
    let call: u8 = call.parse().ok()?;
    let kind = match kind {
        "initiated" => 0,
        "hangup" => 1,
        _ => return None,
    };
    Some((call.checked_sub(1)?) * 2 + kind)
}

fn parse_node(text: &str) -> Option<u8> {
    NODES.iter().position(|n| *n == text).map(|i| i as u8)
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let node = |n: &u8| NODES[*n as usize];
        match self {
            Action::Beat { node: n, kind } => {
                let kind = match kind {
                    BeatKind::Eligible => "eligible",
                    BeatKind::Dirty => "dirty",
                    BeatKind::Stale => "stale",
                };
                write!(f, "beat {} {kind}", node(n))
            }
            Action::Webhook { event, via } => {
                let via = if *via == Via::Primary {
                    "primary"
                } else {
                    "failover"
                };
                write!(f, "webhook {} {via}", event_name(*event))
            }
            Action::Report {
                event,
                attempt,
                outcome,
            } => {
                let outcome = match outcome {
                    Outcome::Delivered => "delivered",
                    Outcome::NotAdmitted => "not_admitted",
                    Outcome::Timeout => "timeout",
                    Outcome::ServerError => "5xx",
                    Outcome::Lapse => "lapse",
                };
                write!(f, "report {}#{attempt} {outcome}", event_name(*event))
            }
            Action::Fence {
                node: n,
                call,
                epoch,
            } => write!(f, "fence {} c{} e{epoch}", node(n), call + 1),
            Action::Claim { node: n, call } => write!(f, "claim {} c{}", node(n), call + 1),
            Action::Flood => f.write_str("flood"),
            Action::Alarm => f.write_str("alarm"),
            Action::Advance { to_ms } => write!(f, "advance {to_ms}"),
            Action::Restart => f.write_str("restart"),
            Action::Put { policy, stale } => write!(
                f,
                "put {} {}",
                if *policy { "policy" } else { "nodes" },
                if *stale { "stale" } else { "fresh" }
            ),
        }
    }
}

impl std::str::FromStr for Action {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || format!("not a model action: {text:?}");
        let words: Vec<&str> = text.split_whitespace().collect();
        let word = |i: usize| words.get(i).copied().unwrap_or("");
        let call =
            |w: &str| -> Option<u8> { w.strip_prefix('c')?.parse::<u8>().ok()?.checked_sub(1) };
        let action = match word(0) {
            "beat" => Action::Beat {
                node: parse_node(word(1)).ok_or_else(bad)?,
                kind: match word(2) {
                    "eligible" => BeatKind::Eligible,
                    "dirty" => BeatKind::Dirty,
                    "stale" => BeatKind::Stale,
                    _ => return Err(bad()),
                },
            },
            "webhook" => Action::Webhook {
                event: parse_event(word(1)).ok_or_else(bad)?,
                via: match word(2) {
                    "primary" => Via::Primary,
                    "failover" => Via::Failover,
                    _ => return Err(bad()),
                },
            },
            "report" => {
                let (event, attempt) = word(1).split_once('#').ok_or_else(bad)?;
                Action::Report {
                    event: parse_event(event).ok_or_else(bad)?,
                    attempt: attempt.parse().map_err(|_| bad())?,
                    outcome: match word(2) {
                        "delivered" => Outcome::Delivered,
                        "not_admitted" => Outcome::NotAdmitted,
                        "timeout" => Outcome::Timeout,
                        "5xx" => Outcome::ServerError,
                        "lapse" => Outcome::Lapse,
                        _ => return Err(bad()),
                    },
                }
            }
            "fence" => Action::Fence {
                node: parse_node(word(1)).ok_or_else(bad)?,
                call: call(word(2)).ok_or_else(bad)?,
                epoch: word(3)
                    .strip_prefix('e')
                    .and_then(|e| e.parse().ok())
                    .ok_or_else(bad)?,
            },
            "claim" => Action::Claim {
                node: parse_node(word(1)).ok_or_else(bad)?,
                call: call(word(2)).ok_or_else(bad)?,
            },
            "flood" => Action::Flood,
            "alarm" => Action::Alarm,
            "advance" => Action::Advance {
                to_ms: word(1).parse().map_err(|_| bad())?,
            },
            "restart" => Action::Restart,
            "put" => Action::Put {
                policy: match word(1) {
                    "policy" => true,
                    "nodes" => false,
                    _ => return Err(bad()),
                },
                stale: match word(2) {
                    "stale" => true,
                    "fresh" => false,
                    _ => return Err(bad()),
                },
            },
            _ => return Err(bad()),
        };
        Ok(action)
    }
}

/// Parses a `;`-separated action list.
pub fn parse_actions(text: &str) -> Result<Vec<Action>, String> {
    text.split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::parse)
        .collect()
}

/// Formats an action list as [`parse_actions`] reads it.
pub fn format_actions(actions: &[Action]) -> String {
    actions
        .iter()
        .map(Action::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// A forward the engine asked for whose outcome has not been reported.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InFlight {
    pub event: u8,
    pub attempt: u32,
    pub node: u8,
    pub epoch: u64,
    pub sent_at: i64,
    /// What a report made at the send's instant may spend on re-forwarding.
    pub budget_ms: i64,
}

/// What the harness remembers besides the tables.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Harness {
    /// The clock, in ms after T0.
    pub now: i64,
    /// When the Dispatcher's alarm is armed (ms after T0).
    pub armed: Option<i64>,
    /// Restarted and not yet used: the engine's caches are empty.
    pub cold: bool,
    pub restarts: u8,
    pub advances: u8,
    pub writes: u8,
    /// Flood claims made.
    pub floods: u8,
    /// Deliveries made of each event.
    pub deliveries: Vec<u8>,
    /// Per node: beats sent, and the last one's time and kind.
    pub beats: Vec<(u8, Option<(i64, BeatKind)>)>,
    /// Forwards awaiting their outcome, sorted.
    pub inflight: Vec<InFlight>,
    /// Per call, a bit per node that took one of its events: an agent
    /// answers `not_admitted` only for a session it never admitted (SPEC
    /// §11). An ambiguous outcome admits nothing, so a node may still refuse
    /// after it: the engine cannot tell either way.
    pub admitted: Vec<u8>,
    /// Per document (nodes, policy): the revision its writers last saw
    /// acknowledged, and which of its two variants that is.
    pub docs: [(u64, u8); 2],
}

/// One explored state.
#[derive(Clone)]
pub struct State {
    pub harness: Harness,
    pub checker: Checker,
    pub tables: TableHashes,
    /// The engine's in-memory caches in this state.
    pub caches: Caches,
}

/// A verified webhook's envelope and the Telnyx headers stored with it.
type Signed = (Envelope, Vec<(String, String)>);

/// The engine, its database and the scenario's fixed inputs.
pub struct Model {
    pub bounds: Bounds,
    pub db: Rc<Db>,
    engine: Engine<ModelStore>,
    config: EngineConfig,
    keys: Keys,
    bodies: Vec<String>,
    signed: HashMap<(u8, i64, Via), Signed>,
}

fn session(call: u8) -> String {
    format!("sess-{}", call + 1)
}

fn leg(call: u8) -> String {
    format!("v3:leg-{}", call + 1)
}

fn outgoing(call: u8) -> bool {
    call % 2 == 1
}

fn registry(variant: u8) -> Vec<u8> {
    let nodes: serde_json::Map<String, serde_json::Value> = NODES
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let drained = variant == 1 && i == 1;
            (
                id.to_string(),
                fixtures::registry_entry(i, "stable", drained),
            )
        })
        .collect();
    json!({"schema": "callfence_nodes_v1", "nodes": nodes})
        .to_string()
        .into_bytes()
}

fn policy(variant: u8) -> Vec<u8> {
    let (preferred, fallback) = if variant == 0 {
        ("M1", "M2")
    } else {
        ("M2", "M1")
    };
    json!({"schema": "riff_node_routing_policy_v1", "default_node": "M1",
           "by_line": {LINE.0: {"called_number": LINE.1, "preferred_node": preferred, "fallback_node": fallback}}})
    .to_string()
    .into_bytes()
}

impl Model {
    /// The engine on a fresh database with both documents written, and the
    /// initial state. `plant` arms one planted bug.
    pub fn new(bounds: Bounds, plant: Option<&'static Plant>) -> (Self, State) {
        // Under a small row cap, eviction picks the oldest settled session:
        // the sessions' ages then decide, and are part of the state.
        let db = Db::new(plant, T0, bounds.session_cap < DEFAULT_SESSION_CAP);
        let config = EngineConfig {
            session_cap: bounds.session_cap,
            ..EngineConfig::default()
        };
        assert!(
            bounds.horizon_ms < config.timing.retention_ms,
            "the state hash leaves out times that only pruning reads"
        );
        let engine = Engine::new(ModelStore(db.clone()), config.clone());
        engine
            .put_document(DocKind::Nodes, &registry(0), Some("\"0\""), "model", T0)
            .expect("registry");
        engine
            .put_document(DocKind::Policy, &policy(0), Some("\"0\""), "model", T0)
            .expect("policy");
        let mut bodies = Vec::new();
        for call in 0..bounds.calls as u8 {
            let (from, to, direction) = if outgoing(call) {
                (LINE.1, DIALLED, "outgoing")
            } else {
                (CALLER, LINE.1, "incoming")
            };
            for (i, kind) in ["call.initiated", "call.hangup"].iter().enumerate() {
                bodies.push(fixtures::event_body(
                    &format!("evt-{}-{i}", call + 1),
                    kind,
                    &session(call),
                    &leg(call),
                    from,
                    to,
                    direction,
                ));
            }
        }
        db.clear_decisions();
        db.take_dirty();
        db.take_decisions();
        let mut checker = Checker::default();
        checker.step(&[], observe::snapshot(db.sqlite()));
        let state = State {
            harness: Harness {
                now: 0,
                armed: engine.next_alarm_at(T0).expect("alarm"),
                cold: false,
                restarts: bounds.restarts,
                advances: bounds.advances,
                writes: bounds.writes,
                floods: 0,
                deliveries: vec![0; bodies.len()],
                beats: vec![(0, None); NODES.len()],
                inflight: Vec::new(),
                admitted: vec![0; bounds.calls],
                docs: [(1, 0), (1, 0)],
            },
            checker,
            tables: db.hash_tables(None, u64::MAX),
            caches: engine.caches(),
        };
        let model = Self {
            bounds,
            db,
            engine,
            config,
            keys: Keys::new(),
            bodies,
            signed: HashMap::new(),
        };
        (model, state)
    }

    /// The state's 128-bit hash: its tables (decision-relevant columns), the
    /// harness and the checker's history. The engine's caches are left out:
    /// the real engine's caches agree with its tables (a restart, which
    /// empties them, is in the harness), so only a planted bug that breaks
    /// that agreement could make two states equal here behave differently.
    pub fn hash(&self, state: &State) -> u128 {
        let mut h = Wide::new();
        state.tables.hash(&mut h);
        state.harness.hash(&mut h);
        state.checker.hash_history(&mut h);
        h.finish128()
    }

    /// Gives the engine `target`'s caches; the search has already returned
    /// the database to `target` ([`Db::rollback`]).
    pub fn restore(&mut self, target: &State) {
        self.engine.set_caches(target.caches.clone());
    }

    fn scalar(&self, sql: &str, params: &[Value]) -> Option<i64> {
        self.db
            .sqlite()
            .exec(sql, params)
            .expect("query")
            .first()
            .and_then(|r| r.first())
            .and_then(Value::as_int)
    }

    fn ints(&self, sql: &str) -> Vec<i64> {
        self.db
            .sqlite()
            .exec(sql, &[])
            .expect("query")
            .into_iter()
            .filter_map(|r| r.first().and_then(Value::as_int))
            .collect()
    }

    /// Every action enabled in `state`, which the database holds.
    pub fn actions(&self, state: &State) -> Vec<Action> {
        let h = &state.harness;
        let b = &self.bounds;
        let mut out = Vec::new();
        for f in &h.inflight {
            let took = h.admitted[usize::from(f.event / 2)] & (1 << f.node) != 0;
            for outcome in [
                Outcome::Delivered,
                Outcome::NotAdmitted,
                Outcome::Timeout,
                Outcome::ServerError,
                Outcome::Lapse,
            ] {
                if took && outcome == Outcome::NotAdmitted {
                    continue;
                }
                out.push(Action::Report {
                    event: f.event,
                    attempt: f.attempt,
                    outcome,
                });
            }
        }
        for (event, made) in h.deliveries.iter().enumerate() {
            let limit = if event.is_multiple_of(2) {
                b.deliveries
            } else {
                b.hangups
            };
            if *made < limit {
                out.push(Action::Webhook {
                    event: event as u8,
                    via: Via::Primary,
                });
                if b.failover && *made > 0 {
                    out.push(Action::Webhook {
                        event: event as u8,
                        via: Via::Failover,
                    });
                }
            }
        }
        for (node, (sent, last)) in h.beats.iter().enumerate() {
            if *sent >= b.beats {
                continue;
            }
            for kind in [BeatKind::Eligible, BeatKind::Dirty, BeatKind::Stale] {
                if *last != Some((h.now, kind)) {
                    out.push(Action::Beat {
                        node: node as u8,
                        kind,
                    });
                }
            }
        }
        let epochs = self
            .scalar("SELECT value FROM counters WHERE name = 'epoch'", &[])
            .unwrap_or(0) as u64;
        for call in 0..b.calls as u8 {
            if !state.checker_knows(&session(call)) {
                continue;
            }
            for node in 0..NODES.len() as u8 {
                for epoch in 1..=epochs {
                    out.push(Action::Fence { node, call, epoch });
                }
            }
        }
        for call in (0..b.calls as u8).filter(|c| outgoing(*c)) {
            for node in 0..NODES.len() as u8 {
                out.push(Action::Claim { node, call });
            }
        }
        if h.floods < b.floods {
            out.push(Action::Flood);
        }
        if h.armed.is_some_and(|a| a <= h.now) {
            out.push(Action::Alarm);
        }
        if h.advances > 0 {
            for to_ms in self.due_times(state) {
                out.push(Action::Advance { to_ms });
            }
        }
        if h.restarts > 0 && !h.cold {
            out.push(Action::Restart);
        }
        if h.writes > 0 {
            for policy in [false, true] {
                for stale in [false, true] {
                    out.push(Action::Put { policy, stale });
                }
            }
        }
        out
    }

    /// The times the clock may advance to: the armed alarm (the next due
    /// time the engine reported), lease ends (2 s), parking windows, the
    /// end of each forward-failure window (30 s), the instant each beat goes
    /// stale and the end of its owner-loss grace (120 s).
    fn due_times(&self, state: &State) -> Vec<i64> {
        let t = &self.config.timing;
        let mut due: Vec<i64> = state.harness.armed.into_iter().map(|a| a + T0).collect();
        due.extend(self.ints("SELECT lease_until FROM events WHERE state = 'forwarding'"));
        due.extend(
            self.ints("SELECT pending_until FROM events WHERE state = 'pending_assignment'"),
        );
        due.extend(
            self.ints("SELECT last_failure_at FROM node_health WHERE last_failure_at IS NOT NULL")
                .into_iter()
                .map(|f| f + callfence_core::eligibility::FORWARD_FAILURE_WINDOW_MS),
        );
        for valid_until in state.checker_beats() {
            due.push(valid_until + 1);
            due.push(valid_until + t.node_lost_after_ms);
        }
        let now = state.harness.now + T0;
        let horizon = T0 + self.bounds.horizon_ms;
        let mut due: Vec<i64> = due
            .into_iter()
            .filter(|d| *d > now && *d <= horizon)
            .map(|d| d - T0)
            .collect();
        due.sort_unstable();
        due.dedup();
        due
    }

    fn truly_eligible(h: &Harness, node: &str, at_ms: i64) -> bool {
        let Some(n) = NODES.iter().position(|x| *x == node) else {
            return false;
        };
        let drained = h.docs[0].1 == 1 && n == 1;
        let at = at_ms - T0;
        !drained
            && h.beats[n].1.is_some_and(|(sent, kind)| {
                kind == BeatKind::Eligible && at - sent <= BEAT_TRUST_MS && at >= sent
            })
    }

    fn webhook(&mut self, event: u8, via: Via, now: i64) -> Signed {
        let key = (event, now / 1000, via);
        if let Some(signed) = self.signed.get(&key) {
            return signed.clone();
        }
        let (envelope, mut headers) = self.keys.signed_webhook(&self.bodies[event as usize], now);
        if via == Via::Failover {
            headers.push(("x-telnyx-delivery".into(), "failover".into()));
        }
        self.signed.insert(key, (envelope.clone(), headers.clone()));
        (envelope, headers)
    }

    fn event_index(&self, event_id: &str) -> u8 {
        let (call, i) = event_id
            .strip_prefix("evt-")
            .and_then(|s| s.split_once('-'))
            .expect("model event id");
        (call.parse::<u8>().expect("call") - 1) * 2 + i.parse::<u8>().expect("kind")
    }

    fn track(&self, h: &mut Harness, obs: &mut Vec<Observation>, f: Forward, budget_ms: i64) {
        obs.push(Observation::Forwarded {
            event_id: f.event_id.clone(),
        });
        h.inflight.push(InFlight {
            event: self.event_index(&f.event_id),
            attempt: f.attempt,
            node: parse_node(&f.node).expect("known node"),
            epoch: f.epoch,
            sent_at: h.now,
            budget_ms,
        });
        h.inflight.sort();
    }

    /// Applies `action` to `state`, which the database holds; afterwards the
    /// database holds the returned state.
    pub fn apply(&mut self, state: &State, action: Action) -> State {
        self.db.take_dirty();
        self.db.take_decisions();
        let mut h = state.harness.clone();
        let mut checker = state.checker.clone();
        let mut obs = Vec::new();
        let now = T0 + h.now;
        let mut engine_used = true;
        let mut alarm_set = None;
        match action {
            Action::Beat { node, kind } => {
                let n = node as usize;
                let (sent, _) = h.beats[n];
                let spec = BeatSpec {
                    node: NODES[n],
                    seq: u64::from(sent) + 1,
                    mode: Mode::Active,
                    sha: "abc".repeat(13) + "a",
                    dirty: kind == BeatKind::Dirty,
                    lines: &[LINE],
                };
                let signed_s = now / 1000 - if kind == BeatKind::Stale { 20 } else { 0 };
                let body = fixtures::heartbeat_body(&spec, now);
                // A refusal changes nothing; the checker sees the state.
                let _ = self
                    .engine
                    .handle_heartbeat(signed(NODES[n]), signed_s, &body, now);
                h.beats[n] = (sent + 1, Some((h.now, kind)));
            }
            Action::Webhook { event, via } => {
                let (envelope, headers) = self.webhook(event, via, now);
                h.deliveries[event as usize] += 1;
                let ingress = self
                    .engine
                    .handle_webhook(&envelope, &self.bodies[event as usize], &headers, now)
                    .expect("webhook");
                match ingress {
                    Ingress::Forward(f) => self.track(&mut h, &mut obs, f, WEBHOOK_BUDGET_MS),
                    Ingress::Delivered(d) => obs.push(Observation::DuplicateAnswered {
                        event_id: d.event_id,
                        answer: format!("{}/{}", d.delivered_to, d.epoch),
                    }),
                    _ => {}
                }
            }
            Action::Report {
                event,
                attempt,
                outcome,
            } => {
                let i = h
                    .inflight
                    .iter()
                    .position(|f| f.event == event && f.attempt == attempt)
                    .expect("a forward in flight");
                let f = h.inflight.remove(i);
                let sess = session(event / 2);
                if outcome == Outcome::Delivered {
                    h.admitted[usize::from(event / 2)] |= 1 << f.node;
                }
                if matches!(
                    outcome,
                    Outcome::Timeout | Outcome::ServerError | Outcome::Lapse
                ) {
                    obs.push(Observation::Ambiguous {
                        session: sess.clone(),
                        epoch: f.epoch,
                    });
                }
                let answer = match outcome {
                    Outcome::Lapse => None,
                    Outcome::Delivered => Some(ReportedAnswer::Http {
                        status: 200,
                        body: "{}".into(),
                    }),
                    Outcome::NotAdmitted => Some(ReportedAnswer::Http {
                        status: 503,
                        body: r#"{"callfence":"not_admitted"}"#.into(),
                    }),
                    Outcome::Timeout => Some(ReportedAnswer::Timeout),
                    Outcome::ServerError => Some(ReportedAnswer::Http {
                        status: 500,
                        body: "oops".into(),
                    }),
                };
                match answer {
                    None => engine_used = false,
                    Some(answer) => {
                        let report = Report {
                            event_id: format!("evt-{}-{}", event / 2 + 1, event % 2),
                            epoch: f.epoch,
                            attempt: f.attempt,
                            hop: 1,
                            answer,
                            budget_left_ms: if f.sent_at == h.now { f.budget_ms } else { 0 },
                        };
                        let owner = state.checker_owner(&sess);
                        let stale = owner.as_ref().is_some_and(|(o, e)| {
                            *e != Some(f.epoch)
                                || o.as_deref().is_some_and(|o| o != NODES[f.node as usize])
                        });
                        let before = stale.then(|| observe::dump(self.db.sqlite()));
                        let effect = self.engine.handle_report(&report, now).expect("report");
                        if let Some(before) = before {
                            let after = observe::dump(self.db.sqlite());
                            obs.push(Observation::StaleReport { before, after });
                        }
                        match effect {
                            ReportEffect::Delivered(d) => obs.push(Observation::Delivered {
                                answer: format!("{}/{}", d.delivered_to, d.epoch),
                                event_id: d.event_id,
                            }),
                            ReportEffect::Reassigned(Some(f)) => self.track(&mut h, &mut obs, f, 0),
                            _ => {}
                        }
                    }
                }
            }
            Action::Fence { node, call, epoch } => {
                let req = FenceRequest {
                    call_session_id: session(call),
                    call_control_id: leg(call),
                    epoch,
                    purpose: callfence_core::wire::FencePurpose::Answer,
                };
                let reply = self
                    .engine
                    .handle_fence(
                        signed(NODES[node as usize]),
                        &req,
                        &self.keys.media_keys,
                        now,
                    )
                    .expect("fence");
                if let FenceReply::Granted(g) = reply {
                    obs.push(Observation::FenceGranted {
                        session: session(call),
                        node: NODES[node as usize].into(),
                        epoch: g.epoch,
                    });
                }
            }
            Action::Claim { node, call } => {
                let req = ClaimRequest {
                    call_control_id: leg(call),
                    call_session_id: session(call),
                };
                self.engine
                    .handle_claim(signed(NODES[node as usize]), &req, now)
                    .expect("claim");
            }
            Action::Flood => {
                h.floods += 1;
                let req = ClaimRequest {
                    call_control_id: format!("v3:flood-{}", h.floods),
                    call_session_id: format!("flood-{}", h.floods),
                };
                self.engine
                    .handle_claim(signed(NODES[1]), &req, now)
                    .expect("claim");
            }
            Action::Alarm => {
                let work = self.engine.poll_alarm(now).expect("alarm");
                let t = &self.config.timing;
                obs.push(Observation::AlarmRan {
                    now_ms: now,
                    node_lost_after_ms: t.node_lost_after_ms,
                    max_duration_ms: t.max_duration_ms,
                    slack_ms: 0,
                });
                alarm_set = Some(work.next_alarm_ms);
                for f in work.forwards {
                    self.track(&mut h, &mut obs, f, 0);
                }
            }
            Action::Advance { to_ms } => {
                h.now = to_ms;
                h.advances -= 1;
                engine_used = false;
            }
            Action::Restart => {
                self.engine = Engine::new(ModelStore(self.db.clone()), self.config.clone());
                h.restarts -= 1;
                h.cold = true;
                engine_used = false;
            }
            Action::Put {
                policy: is_policy,
                stale,
            } => {
                let d = usize::from(is_policy);
                let (acked, variant) = h.docs[d];
                let next = 1 - variant;
                let (kind, body) = if is_policy {
                    (DocKind::Policy, policy(next))
                } else {
                    (DocKind::Nodes, registry(next))
                };
                let claimed = if stale {
                    acked.saturating_sub(1)
                } else {
                    acked
                };
                let before = stale.then(|| observe::dump(self.db.sqlite()));
                let result = self.engine.put_document(
                    kind,
                    &body,
                    Some(&format!("\"{claimed}\"")),
                    "model",
                    now,
                );
                if let Some(before) = before {
                    let after = observe::dump(self.db.sqlite());
                    obs.push(Observation::StaleWrite { before, after });
                } else if let Ok(revision) = result {
                    h.docs[d] = (revision, next);
                }
                h.writes -= 1;
            }
        }
        if engine_used {
            h.cold = false;
            h.armed = match alarm_set {
                Some(next) => next,
                None => self.engine.next_alarm_at(now).expect("next alarm"),
            }
            .map(|a| a - T0);
        }
        let dirty = self.db.take_dirty();
        if self.db.take_decisions() {
            let (evidence, _) = observe::new_assignments(self.db.sqlite(), 0, |node, at| {
                Self::truly_eligible(&h, node, at)
            });
            obs.extend(evidence.into_iter().map(Observation::Assignment));
            self.db.clear_decisions();
        }
        let after = observe::snapshot_since(self.db.sqlite(), state.checker.last(), |t| {
            self.db.wrote(dirty, t)
        });
        checker.step(&obs, after);
        State {
            harness: h,
            checker,
            tables: self.db.hash_tables(Some(&state.tables), dirty),
            caches: self.engine.caches(),
        }
    }
}

impl State {
    fn checker_knows(&self, session: &str) -> bool {
        self.checker.last().sessions.contains_key(session)
    }

    /// The session's stored (owner, epoch), if it exists.
    fn checker_owner(&self, session: &str) -> Option<(Option<String>, Option<u64>)> {
        self.checker
            .last()
            .sessions
            .get(session)
            .map(|s| (s.owner.clone(), s.epoch))
    }

    fn checker_beats(&self) -> Vec<i64> {
        self.checker
            .last()
            .beat_valid_until
            .values()
            .copied()
            .collect()
    }
}
