//! The lease world (SPEC §16): `global` (core's `Engine`: the directory and
//! call shard 0) and two call shards on their own databases that decide
//! under leases, with two nodes of small capacity.
//!
//! Calls arrive at every shard, hang up, and are decided on whatever lease
//! each shard holds. Lease asks and leases travel between the objects in
//! their wire form (JSON), delayed, reordered, repeated or lost; the
//! directory asks shards with spare room to report; nodes drain and come back; the clock runs; any
//! object restarts (its memory dropped).
//!
//! A change that waits for leases makes the directory ask each shard holding
//! one from before it to give it up (`revoke_targets`); those messages and
//! their answers travel like the rest, and an answer lets the change be
//! acknowledged sooner.
//!
//! After every step the world checks: no node has more open calls, summed
//! over the shards, than its limit; and no call is assigned to a node whose
//! drain was acknowledged before the decision started (a drain beat is
//! acknowledged when `Engine::acknowledge_at` says, as the Dispatcher
//! answers it, at the latest; sooner when the shards gave their leases up).
//!
//! Each step is an [`Action`]: the simulation draws them at random
//! ([`LeaseWorld::run`]), and the model check enumerates them
//! (`core/tests/model/lease_race.rs`), with [`LeaseWorld::fingerprint`] to
//! know a state seen before.

use crate::common::fixtures::{self, BeatSpec};
use crate::rng::Rng;
use callfence_core::document::DocKind;
use callfence_core::engine::{Caller, Engine, EngineConfig, Ingress, Lease, LeaseAsk};
use callfence_core::heartbeat::Mode;
use callfence_core::messages::MapNotice;
use callfence_core::placement::home;
use callfence_core::shard::{Arrival, CallShard, ShardInput};
use callfence_core::store::migrate;
use callfence_core::store::sqlite::SqliteStore;
use callfence_core::store::{Store, Value};
use callfence_core::telnyx::parse_envelope;
use serde_json::json;
use std::rc::Rc;

const NODES: [&str; 2] = ["M1", "M2"];
/// Each node's `max_calls` in the simulation (the registry's; beats say more).
pub const LIMIT: u32 = 2;
/// The objects of the simulation: `global` and two call shards.
const SHARDS: u32 = 3;
const STEPS: u32 = 300;
const LINE: &str = "+15102160079";
const T0: i64 = fixtures::T0;

/// A bug the world can be told to have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plant {
    /// The call shards count only their own open calls against a node's
    /// capacity (no leases, no caps).
    CapacityPerShard,
    /// A drain is acknowledged as soon as the directory has it, while
    /// shards still decide on leases granted before it.
    AckAtDirectory,
    /// A shard asked to give up its lease says it did, and keeps deciding
    /// on it.
    RevokeIgnored,
}

/// One step of the lease world.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// The clock moves on this many ms.
    Wait(i64),
    /// A new inbound call, placed on shard `.0`.
    Call(u32),
    /// The open call `.0` (oldest first) hangs up.
    Hangup(usize),
    /// Call shard `.0` asks for a lease, unless its last ask is young.
    Ask(u32),
    /// The directory's next queued reclaim: the shard it names asks again,
    /// wanting no spare room.
    Reclaim,
    /// The message `i` in flight arrives; `again`: a copy stays in flight
    /// (a duplicate); `answered` false: a revocation's answer is lost.
    Deliver {
        i: usize,
        again: bool,
        answered: bool,
    },
    /// The message `.0` in flight is lost.
    Lose(usize),
    /// Node `.0` drains, or comes back, and beats.
    Toggle(usize),
    /// Every node beats.
    Beats,
    /// Object `.0` restarts, its memory dropped (0: `global`).
    Restart(u32),
}

/// A message between `global` and a call shard, in flight in its wire form
/// (JSON), as it crosses from one object to another.
#[derive(Debug, Clone)]
pub enum Message {
    Ask(String),
    Lease(String),
    /// The directory asks shard `.0` to give up its lease for ask `.1`;
    /// the answer comes back on the same request, unless it is lost.
    Revoke(u32, u64),
}

/// A message's wire form.
fn wire(message: &impl serde::Serialize) -> String {
    serde_json::to_string(message).expect("encode")
}

pub struct LeaseWorld {
    rng: Rng,
    plant: Option<Plant>,
    /// The objects: `global` and call shards 1 .. `shard_count`.
    shard_count: u32,
    /// Each node's `max_calls`.
    limit: u32,
    now: i64,
    global: Option<Engine<SqliteStore>>,
    shards: Vec<Option<CallShard<Rc<SqliteStore>>>>,
    stores: Vec<Rc<SqliteStore>>,
    pub in_flight: Vec<Message>,
    /// Per node: mode and beat seq.
    modes: [(Mode, u64); 2],
    /// Per node: from when its drain is acknowledged (None: active, or
    /// the drain not yet acknowledged).
    drained_since: [Option<i64>; 2],
    /// Open calls: (shard, session).
    pub calls: Vec<(u32, String)>,
    next_call: u64,
    /// Per shard: when its outstanding lease ask was sent.
    asked_at: Vec<Option<i64>>,
    /// Per object: what it was told since it last started, with the time
    /// (its memory is a function of these and its storage).
    inputs: Vec<Vec<String>>,
    pub violations: Vec<String>,
    pub steps: u64,
    pub assigned: u64,
    pub parked: u64,
    pub leases: u64,
    pub reclaims: u64,
    pub full: u64,
    /// Leases given up when asked, and answered.
    pub revoked: u64,
    /// Decisions undone for want of room held elsewhere.
    pub room_asked: u64,
}

fn signed(node: &str) -> Caller<'_> {
    Caller { node, kid: "k1" }
}

impl LeaseWorld {
    /// The simulation's world: three objects, nodes of [`LIMIT`] calls.
    pub fn new(seed: u64, plant: Option<Plant>) -> Self {
        Self::with(seed, plant, SHARDS, LIMIT)
    }

    /// A world of `shard_count` objects whose nodes take `limit` calls.
    pub fn with(seed: u64, plant: Option<Plant>, shard_count: u32, limit: u32) -> Self {
        let store = SqliteStore::in_memory().expect("sqlite");
        migrate(&store, T0).expect("migrate");
        let global = Engine::new(store, EngineConfig::default());
        let map = MapNotice::new(1, shard_count, 0);
        let mut shards = vec![None];
        let mut stores = vec![];
        for k in 1..shard_count {
            let store = SqliteStore::in_memory().expect("sqlite");
            migrate(&store, T0).expect("migrate");
            let store = Rc::new(store);
            let shard = Self::shard(&store, k, plant);
            shard.handle_map(&map).expect("map");
            shards.push(Some(shard));
            stores.push(store);
        }
        let mut world = Self {
            rng: Rng(seed),
            plant,
            shard_count,
            limit,
            now: T0,
            global: Some(global),
            shards,
            stores,
            in_flight: Vec::new(),
            modes: [(Mode::Active, 0); 2],
            drained_since: [None; 2],
            calls: Vec::new(),
            next_call: 0,
            asked_at: vec![None; shard_count as usize],
            inputs: vec![Vec::new(); shard_count as usize],
            violations: Vec::new(),
            steps: 0,
            assigned: 0,
            parked: 0,
            leases: 0,
            reclaims: 0,
            full: 0,
            revoked: 0,
            room_asked: 0,
        };
        world.write_documents();
        for i in 0..NODES.len() {
            world.beat(i);
        }
        world
    }

    fn shard(store: &Rc<SqliteStore>, k: u32, plant: Option<Plant>) -> CallShard<Rc<SqliteStore>> {
        let shard = CallShard::new(store.clone(), EngineConfig::default()).numbered(k);
        match plant {
            Some(Plant::CapacityPerShard) => shard,
            _ => shard.leased(),
        }
    }

    fn global(&self) -> &Engine<SqliteStore> {
        self.global.as_ref().expect("global")
    }

    fn call_shard(&self, k: u32) -> &CallShard<Rc<SqliteStore>> {
        self.shards[k as usize].as_ref().expect("shard")
    }

    fn write_documents(&mut self) {
        let nodes: serde_json::Map<String, serde_json::Value> = NODES
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let mut entry = fixtures::registry_entry(i, "stable", false);
                entry["max_calls"] = json!(self.limit);
                (id.to_string(), entry)
            })
            .collect();
        let registry = json!({"schema": "callfence_nodes_v1", "nodes": nodes});
        let policy = json!({
            "schema": "riff_node_routing_policy_v1", "default_node": "M1",
            "by_line": {"main": {"called_number": LINE, "preferred_node": "M1", "fallback_node": "M2"}}
        });
        let g = self.global();
        g.put_document(
            DocKind::Nodes,
            registry.to_string().as_bytes(),
            Some("\"0\""),
            "sim",
            T0,
        )
        .expect("registry");
        g.put_document(
            DocKind::Policy,
            policy.to_string().as_bytes(),
            Some("\"0\""),
            "sim",
            T0,
        )
        .expect("policy");
    }

    fn beat(&mut self, i: usize) {
        let (mode, seq) = self.modes[i];
        let seq = (seq + 1).max(self.now as u64);
        self.modes[i].1 = seq;
        let spec = BeatSpec {
            node: NODES[i],
            seq,
            mode,
            sha: "9b4082d1c0ffee00112233445566778899aabbcc".into(),
            dirty: false,
            lines: &[("main", LINE)],
        };
        let body = fixtures::heartbeat_body(&spec, self.now);
        let now = self.now;
        self.told(0, format!("beat {i} {mode:?} {seq}"));
        let g = self.global();
        g.handle_heartbeat(signed(NODES[i]), now / 1000, &body, now)
            .expect("beat");
        let acked = if self.plant == Some(Plant::AckAtDirectory) {
            g.acknowledge_at(now).expect("ack");
            now
        } else {
            g.acknowledge_at(now).expect("ack")
        };
        if acked > now {
            // The Dispatcher asks the shards holding leases from before
            // the change to give them up, and answers sooner if they do
            // (once per lease while its question is in flight).
            for (k, seq) in g.revoke_targets(now).expect("targets") {
                let asking = self
                    .in_flight
                    .iter()
                    .any(|m| matches!(m, Message::Revoke(j, s) if (*j, *s) == (k, seq)));
                if !asking {
                    self.in_flight.push(Message::Revoke(k, seq));
                }
            }
        }
        self.drained_since[i] = match mode {
            Mode::Active => None,
            _ => Some(self.drained_since[i].map_or(acked, |t| t.min(acked))),
        };
    }

    /// A random schedule of [`STEPS`] steps, checked after each.
    pub fn run(&mut self) {
        for _ in 0..STEPS {
            self.steps += 1;
            let wait = self.rng.below(400) as i64;
            self.apply(&Action::Wait(wait));
            if let Some(action) = self.draw() {
                self.apply(&action);
            }
            self.check();
        }
    }

    /// A random step (none when the one drawn cannot happen now).
    fn draw(&mut self) -> Option<Action> {
        let shard = self.rng.below(u64::from(self.shard_count)) as u32;
        Some(match self.rng.below(100) {
            0..=24 => Action::Call(shard),
            25..=44 if !self.calls.is_empty() => {
                Action::Hangup(self.rng.below(self.calls.len() as u64) as usize)
            }
            45..=49 if shard > 0 => Action::Ask(shard),
            50..=74 if !self.in_flight.is_empty() => {
                let i = self.rng.below(self.in_flight.len() as u64) as usize;
                let again = self.rng.chance(15);
                if self.rng.chance(10) {
                    Action::Lose(i)
                } else {
                    Action::Deliver {
                        i,
                        again,
                        answered: !self.rng.chance(10),
                    }
                }
            }
            75..=79 => Action::Reclaim,
            80..=86 => Action::Toggle(self.rng.below(2) as usize),
            87..=94 => Action::Beats,
            95..=97 if shard > 0 => Action::Restart(shard),
            98..=99 => Action::Restart(0),
            _ => return None,
        })
    }

    /// Applies one step. The caller checks the invariants after it.
    pub fn apply(&mut self, action: &Action) {
        match *action {
            Action::Wait(ms) => self.now += ms,
            Action::Call(k) => self.new_call(k),
            Action::Hangup(i) => self.hangup(i),
            Action::Ask(k) => self.ask(k, false),
            Action::Reclaim => {
                self.told(0, "reclaim".into());
                if let Some(k) = self.global().poll_reclaim() {
                    self.reclaims += 1;
                    self.ask(k, true);
                }
            }
            Action::Deliver { i, again, answered } => self.deliver(i, again, answered),
            Action::Lose(i) => {
                self.in_flight.remove(i);
            }
            Action::Toggle(i) => {
                self.modes[i].0 = if self.modes[i].0 == Mode::Active {
                    Mode::Drained
                } else {
                    Mode::Active
                };
                self.beat(i);
            }
            Action::Beats => {
                // Nodes beat every few seconds; the clock moves on.
                for i in 0..NODES.len() {
                    self.beat(i);
                }
            }
            Action::Restart(0) => {
                let store = self.global.take().expect("global").into_store();
                self.global = Some(Engine::new(store, EngineConfig::default()));
                self.inputs[0].clear();
            }
            Action::Restart(k) => {
                self.shards[k as usize] = None;
                let store = &self.stores[k as usize - 1];
                self.shards[k as usize] = Some(Self::shard(store, k, self.plant));
                self.asked_at[k as usize] = None;
                self.inputs[k as usize].clear();
            }
        }
    }

    /// Object `k` is told `what` now.
    fn told(&mut self, k: u32, what: String) {
        let now = self.now;
        self.inputs[k as usize].push(format!("{what}@{now}"));
    }

    /// The world's state, as far as its future depends on it: the clock,
    /// the nodes, the open calls, the messages in flight (in any order),
    /// every object's storage and what each was told since it started.
    pub fn fingerprint(&self) -> String {
        let mut messages: Vec<String> = self.in_flight.iter().map(|m| format!("{m:?}")).collect();
        messages.sort();
        let mut text = format!(
            "{}|{:?}|{:?}|{:?}|{:?}|{}|{messages:?}|{:?}|",
            self.now,
            self.modes,
            self.drained_since,
            self.calls,
            self.asked_at,
            self.next_call,
            self.inputs
        );
        let stores = std::iter::once(self.global().store()).chain(self.stores.iter().map(|s| &**s));
        for store in stores {
            let tables = store
                .exec(
                    "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY 1",
                    &[],
                )
                .expect("tables");
            for table in tables {
                let Some(Value::Text(name)) = table.first() else {
                    continue;
                };
                let rows = store
                    .exec(&format!("SELECT * FROM \"{name}\" ORDER BY 1"), &[])
                    .expect("rows");
                text.push_str(&format!("{name}:{rows:?}|"));
            }
        }
        text
    }

    /// Shard `k` asks for a lease, unless its last ask is under three
    /// seconds old (as the Dispatcher does: one ask at a time, asked again when
    /// its answer is late).
    fn ask(&mut self, k: u32, reclaimed: bool) {
        let since = &mut self.asked_at[k as usize];
        if !reclaimed && since.is_some_and(|t| self.now - t < 3_000) {
            return;
        }
        *since = Some(self.now);
        self.told(k, format!("ask {reclaimed}"));
        let ask = self.call_shard(k).lease_ask(reclaimed).expect("ask");
        self.in_flight.push(Message::Ask(wire(&ask)));
    }

    /// Delivers the message `i` in flight (`again`: a copy stays in
    /// flight); `answered` false loses a revocation's answer.
    fn deliver(&mut self, i: usize, again: bool, answered: bool) {
        let message = if again {
            self.in_flight[i].clone()
        } else {
            self.in_flight.remove(i)
        };
        match message {
            Message::Ask(ask) => {
                self.told(0, format!("ask {ask}"));
                let ask: LeaseAsk = serde_json::from_str(&ask).expect("ask");
                if let Some(lease) = self
                    .global()
                    .handle_lease_ask(&ask, self.now)
                    .expect("lease")
                {
                    self.in_flight.push(Message::Lease(wire(&lease)));
                }
            }
            Message::Revoke(k, seq) => {
                self.told(k, format!("revoke {seq}"));
                if self.plant != Some(Plant::RevokeIgnored) && self.call_shard(k).handle_revoke(seq)
                {
                    self.asked_at[k as usize] = None;
                }
                if !answered {
                    return;
                }
                self.told(0, format!("revoked {k} {seq}"));
                let now = self.now;
                let g = self.global();
                g.revoked(k, seq, now).expect("revoked");
                let acked = g.acknowledge_at(now).expect("ack");
                for since in &mut self.drained_since {
                    // A drain waiting for its answer is answered now.
                    if let Some(t) = since.filter(|t| *t > acked) {
                        *since = Some(t.min(acked));
                    }
                }
                self.revoked += 1;
            }
            Message::Lease(text) => {
                let lease: Lease = serde_json::from_str(&text).expect("lease");
                let k = lease.shard;
                self.told(k, format!("lease {text}"));
                let shard = self.call_shard(k);
                if self.plant == Some(Plant::CapacityPerShard) {
                    // No leases: the view alone, and no caps.
                    shard.handle_input(ShardInput::View(lease.view));
                } else if shard.handle_lease(lease).expect("lease taken") {
                    self.leases += 1;
                    self.asked_at[k as usize] = None;
                }
            }
        }
    }

    /// A new inbound call at shard `k`, with a session placed there.
    fn new_call(&mut self, k: u32) {
        let shards = self.shard_count;
        let (n, session) = (self.next_call..)
            .map(|i| (i, format!("v3:lease-{i}")))
            .find(|(_, id)| home(id, shards) == k)
            .expect("a session");
        self.next_call = n + 1;
        let body = fixtures::event_body(
            &format!("{session}/initiated"),
            "call.initiated",
            &session,
            &format!("{session}-leg"),
            "+12125550199",
            LINE,
            "incoming",
        );
        match self.webhook(k, &body) {
            Ingress::Forward(f) => {
                self.assigned += 1;
                let i = NODES.iter().position(|n| *n == f.node).expect("node");
                if self.drained_since[i].is_some_and(|t| t <= self.now) {
                    self.violations.push(format!(
                        "step {}: shard {k} assigned {session} to {} after its drain was acknowledged",
                        self.steps, f.node
                    ));
                }
                self.calls.push((k, session));
            }
            _ => self.parked += 1,
        }
    }

    /// The webhook `body` at shard `k` (`global`'s through the engine).
    fn webhook(&mut self, k: u32, body: &str) -> Ingress {
        let envelope = parse_envelope(body.as_bytes()).expect("envelope");
        let now = self.now;
        self.told(k, format!("webhook {}", envelope.event_id));
        if k == 0 {
            let served = |w: &Self| {
                w.global()
                    .handle_webhook(&envelope, body, &[], now)
                    .expect("webhook")
            };
            let ingress = served(self);
            if !matches!(ingress, Ingress::NeedRoom) {
                return ingress;
            }
            // The Dispatcher asks the shards holding room to report; their
            // answers come later.
            self.room_asked += 1;
            while let Some(j) = self.global().poll_reclaim() {
                self.ask(j, true);
            }
            return self.global().shard().as_is(|| served(self));
        }
        let shard = self.call_shard(k);
        if shard.lease_due(now) {
            // The Dispatcher asks before it decides; the answer comes later.
            self.ask(k, false);
        }
        let served = |w: &Self| {
            w.call_shard(k)
                .handle_placed_webhook(&envelope, body, &[], &Arrival::default(), now)
                .expect("webhook")
        };
        let ingress = served(self);
        if !matches!(ingress, Ingress::NeedRoom) {
            return ingress;
        }
        // Undone for want of room: the Dispatcher asks for a lease naming
        // the node at once; here its answer comes later, and the webhook is
        // served again as it stands.
        self.room_asked += 1;
        self.asked_at[k as usize] = None;
        self.ask(k, false);
        self.call_shard(k).as_is(|| served(self))
    }

    fn hangup(&mut self, i: usize) {
        let (k, session) = self.calls.remove(i);
        let body = fixtures::event_body(
            &format!("{session}/hangup"),
            "call.hangup",
            &session,
            &format!("{session}-leg"),
            "+12125550199",
            LINE,
            "incoming",
        );
        self.webhook(k, &body);
    }

    /// Checks the invariants after a step.
    pub fn check(&mut self) {
        let limit = self.limit;
        for node in NODES {
            let mut open = self.global().shard().node_open_calls(node).expect("open");
            for k in 1..self.shard_count {
                open += self.call_shard(k).node_open_calls(node).expect("open");
            }
            self.full += u64::from(open == limit);
            if open > limit {
                self.violations.push(format!(
                    "step {}: {node} has {open} open calls over the shards, its limit is {limit}",
                    self.steps
                ));
            }
        }
        self.violations.dedup();
        self.violations.truncate(5);
    }
}
