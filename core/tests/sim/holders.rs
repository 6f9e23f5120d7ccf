//! The holder world (SPEC §16): up to four call shards, each core's real
//! `CallShard` on its own SQLite database, and Workers that place webhooks
//! with the map they have cached, while the map grows and shrinks.
//!
//! A webhook's placement is a small task run one request at a time, as a
//! Worker runs it: send to the home of the map it holds; on `Elsewhere`,
//! follow (adopting the answer's map); on `Lookup`, ask each named shard
//! `handle_holds`, then go to the holder or back with the shards that
//! answered absent. Many tasks are in flight at once, each step advancing
//! one of them, so two Workers with different maps race on a new session,
//! and map changes, pushes of the map to single shards, Workers refreshing
//! their cache and shard restarts (their memory dropped) fall between any
//! two requests.
//!
//! After every step the world checks: no session is held by two shards;
//! no shard but the holder stores an event of a session; every event whose
//! placement ended stored is still at its session's holder (none lost
//! across a map change). At the end, with the map still, every task in
//! flight must finish.

use crate::rng::Rng;
use callfence_core::engine::{EngineConfig, Ingress};
use callfence_core::messages::MapNotice;
use callfence_core::shard::{Arrival, CallShard, Holds};
use callfence_core::store::sqlite::SqliteStore;
use callfence_core::store::{migrate, Store, Value};
use callfence_core::telnyx::parse_envelope;
use std::collections::BTreeMap;
use std::rc::Rc;

const SHARDS: u32 = 4;
/// Sessions open to new events at a time.
const SESSIONS: u64 = 3;
/// Steps before the window of sessions moves on by one.
const STEPS_PER_SESSION: u64 = 20;
const WORKERS: usize = 3;
const STEPS: u32 = 260;
/// Requests one placement may take before the Worker gives up (503; the
/// carrier retries later with a new task).
pub const ROUNDS: u32 = 16;
const T0: i64 = 1_796_000_000_000;

/// A bug the world can be told to have, to show the checks catch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plant {
    /// The Worker answers a `Lookup` by claiming every shard absent without
    /// asking: the shard creates the session with no holder check.
    SkipLookup,
    /// The Worker carries shards that answered absent under one map revision
    /// over to the next, as if the proof held under any map.
    StaleProof,
}

/// What a placement is waiting to send next.
#[derive(Debug, Clone)]
enum Next {
    /// The webhook, to `shard`.
    Webhook { shard: u32 },
    /// `handle_holds` to the first of `ask`, for the webhook's shard `back`.
    Ask {
        ask: Vec<u32>,
        map: MapNotice,
        absent: Vec<u32>,
        back: u32,
    },
}

/// One webhook being placed by a Worker.
#[derive(Debug, Clone)]
struct Task {
    worker: usize,
    session: String,
    event: String,
    arrival: Arrival,
    next: Next,
    rounds: u32,
}

/// One shard's sessions, and its events as (session, event id).
type Tables = (Vec<String>, Vec<(String, String)>);

pub struct HolderWorld {
    rng: Rng,
    plant: Option<Plant>,
    now: i64,
    shards: Vec<Option<CallShard<Rc<SqliteStore>>>>,
    stores: Vec<Rc<SqliteStore>>,
    /// The map's revisions: `maps[r]` is revision `r`'s shard count.
    maps: Vec<u32>,
    workers: [MapNotice; WORKERS],
    tasks: Vec<Task>,
    /// Event ids per session, in the order they were first sent.
    events: BTreeMap<String, Vec<String>>,
    /// The events whose placement ended stored.
    stored: Vec<(String, String)>,
    pub violations: Vec<String>,
    pub steps: u64,
    pub lookups: u64,
    pub redirects: u64,
    pub map_changes: u64,
    pub gave_up: u64,
    pub created: u64,
}

impl HolderWorld {
    pub fn new(seed: u64, plant: Option<Plant>) -> Self {
        let mut stores = Vec::new();
        let mut shards = Vec::new();
        for k in 0..SHARDS {
            let store = SqliteStore::in_memory().expect("sqlite");
            migrate(&store, T0).expect("migrate");
            let store = Rc::new(store);
            shards.push(Some(
                CallShard::new(store.clone(), EngineConfig::default()).numbered(k),
            ));
            stores.push(store);
        }
        Self {
            rng: Rng(seed),
            plant,
            now: T0,
            shards,
            stores,
            maps: vec![1],
            workers: [MapNotice::default(); WORKERS],
            tasks: Vec::new(),
            events: BTreeMap::new(),
            stored: Vec::new(),
            violations: Vec::new(),
            steps: 0,
            lookups: 0,
            redirects: 0,
            map_changes: 0,
            gave_up: 0,
            created: 0,
        }
    }

    /// The directory's notice of revision `r`: every count so far is in the
    /// history (the simulated horizon never passes).
    fn notice(&self, r: usize) -> MapNotice {
        let history = self.maps[..=r]
            .iter()
            .fold(0u32, |mask, n| mask | 1 << (n - 1));
        MapNotice::new(r as u64, self.maps[r], history)
    }

    fn current(&self) -> MapNotice {
        self.notice(self.maps.len() - 1)
    }

    fn shard(&self, k: u32) -> &CallShard<Rc<SqliteStore>> {
        self.shards[k as usize].as_ref().expect("shard")
    }

    pub fn run(&mut self) {
        for _ in 0..STEPS {
            self.step();
            self.check();
        }
        // The map holds still: every placement in flight must end, stored,
        // within the requests a still map needs.
        let gave_up = self.gave_up;
        for task in &mut self.tasks {
            task.rounds = 0;
        }
        while !self.tasks.is_empty() {
            self.advance(0);
            self.check();
        }
        if self.gave_up > gave_up {
            self.violations.push(format!(
                "{} placements did not end under a still map",
                self.gave_up - gave_up
            ));
        }
    }

    fn step(&mut self) {
        self.steps += 1;
        self.now += 1 + self.rng.below(50) as i64;
        match self.rng.below(100) {
            0..=29 => self.new_task(),
            30..=79 if !self.tasks.is_empty() => {
                let i = self.rng.below(self.tasks.len() as u64) as usize;
                self.advance(i);
            }
            80..=85 => self.change_map(),
            86..=90 => {
                let k = self.rng.below(u64::from(SHARDS)) as u32;
                let r = self.rng.below(self.maps.len() as u64) as usize;
                let notice = self.notice(r);
                self.shard(k).handle_map(&notice).expect("map");
            }
            91..=96 => {
                let w = self.rng.below(WORKERS as u64) as usize;
                self.workers[w] = self.current();
            }
            _ => {
                let k = self.rng.below(u64::from(SHARDS)) as usize;
                self.shards[k] = None;
                self.shards[k] = Some(
                    CallShard::new(self.stores[k].clone(), EngineConfig::default())
                        .numbered(k as u32),
                );
            }
        }
    }

    /// A Worker receives a webhook: a new event of a session, or a
    /// duplicate of one already sent.
    fn new_task(&mut self) {
        let worker = self.rng.below(WORKERS as u64) as usize;
        // A window of sessions that moves on: new sessions keep arriving
        // while the map changes, some of them at two Workers at once.
        let first = self.steps / STEPS_PER_SESSION;
        let session = format!("v3:sim-{}", first + self.rng.below(SESSIONS));
        let sent = self.events.entry(session.clone()).or_default();
        let event = if !sent.is_empty() && self.rng.chance(30) {
            sent[self.rng.below(sent.len() as u64) as usize].clone()
        } else {
            let id = format!("{session}/e{}", sent.len());
            sent.push(id.clone());
            id
        };
        let map = self.workers[worker];
        self.tasks.push(Task {
            worker,
            next: Next::Webhook {
                shard: map.home(&session),
            },
            session,
            event,
            arrival: Arrival {
                map: Some(map),
                absent: None,
            },
            rounds: 0,
        });
    }

    fn change_map(&mut self) {
        let n = 1 + self.rng.below(u64::from(SHARDS)) as u32;
        self.maps.push(n);
        self.map_changes += 1;
    }

    /// Sends task `i`'s next request and takes its answer.
    fn advance(&mut self, i: usize) {
        let mut task = self.tasks.remove(i);
        task.rounds += 1;
        if task.rounds > ROUNDS {
            self.gave_up += 1;
            return;
        }
        match task.next.clone() {
            Next::Webhook { shard } => self.send_webhook(task, shard),
            Next::Ask {
                mut ask,
                map,
                mut absent,
                back,
            } => {
                let k = ask.remove(0);
                self.lookups += 1;
                match self
                    .shard(k)
                    .handle_holds(&task.session, &map)
                    .expect("holds")
                {
                    Holds::Held if self.plant == Some(Plant::StaleProof) => {
                        task.next = Next::Webhook { shard: k };
                    }
                    Holds::Held => {
                        task.arrival.absent = None;
                        task.next = Next::Webhook { shard: k };
                    }
                    Holds::Absent if ask.is_empty() => {
                        absent.push(k);
                        task.arrival.absent = Some((map.revision, absent));
                        task.next = Next::Webhook { shard: back };
                    }
                    Holds::Absent => {
                        absent.push(k);
                        task.next = Next::Ask {
                            ask,
                            map,
                            absent,
                            back,
                        };
                    }
                }
                self.tasks.push(task);
            }
        }
    }

    fn send_webhook(&mut self, mut task: Task, shard: u32) {
        let body = format!(
            r#"{{"data":{{"id":"{}","event_type":"call.initiated","record_type":"event","payload":{{"call_session_id":"{}","call_control_id":"{}-leg","from":"+15105550100","to":"+15102160079","direction":"incoming"}}}}}}"#,
            task.event, task.session, task.session
        );
        let envelope = parse_envelope(body.as_bytes()).expect("envelope");
        let held_before = self.holders(&task.session).len();
        let ingress = self
            .shard(shard)
            .handle_placed_webhook(&envelope, &body, &[], &task.arrival, self.now)
            .expect("webhook");
        let adopt = |task: &mut Task, workers: &mut [MapNotice; WORKERS], map: MapNotice| {
            if map.supersedes(&workers[task.worker]) {
                workers[task.worker] = map;
            }
            task.arrival.map = Some(workers[task.worker]);
        };
        match ingress {
            Ingress::Elsewhere { shard: to, map } => {
                self.redirects += 1;
                adopt(&mut task, &mut self.workers, map);
                task.arrival.absent = None;
                task.next = Next::Webhook { shard: to };
                self.tasks.push(task);
            }
            Ingress::Lookup { shards, map } => {
                adopt(&mut task, &mut self.workers, map);
                let proven = match (&task.arrival.absent, self.plant) {
                    (Some((_, absent)), Some(Plant::StaleProof)) => absent.clone(),
                    _ => Vec::new(),
                };
                if self.plant == Some(Plant::SkipLookup) {
                    task.arrival.absent = Some((map.revision, shards));
                    task.next = Next::Webhook { shard };
                } else if shards.iter().all(|k| proven.contains(k)) {
                    task.arrival.absent = Some((map.revision, proven));
                    task.next = Next::Webhook { shard };
                } else {
                    task.next = Next::Ask {
                        ask: shards,
                        map,
                        absent: Vec::new(),
                        back: shard,
                    };
                }
                self.tasks.push(task);
            }
            _ => {
                if held_before == 0 {
                    self.created += 1;
                }
                self.stored.push((task.session, task.event));
            }
        }
    }

    /// The shards whose tables hold session `id`.
    fn holders(&self, id: &str) -> Vec<u32> {
        (0..SHARDS)
            .filter(|&k| {
                !self.stores[k as usize]
                    .exec(
                        "SELECT 1 FROM sessions WHERE call_session_id = ?",
                        &[Value::from(id)],
                    )
                    .expect("read")
                    .is_empty()
            })
            .collect()
    }

    /// Per shard: the sessions it holds, and its events' (session, id).
    fn tables(&self) -> Vec<Tables> {
        let text = |v: &Value| v.as_text().unwrap_or_default().to_owned();
        self.stores
            .iter()
            .map(|store| {
                let sessions = store
                    .exec("SELECT call_session_id FROM sessions", &[])
                    .expect("read")
                    .iter()
                    .map(|r| text(&r[0]))
                    .collect();
                let events = store
                    .exec("SELECT call_session_id, event_id FROM events", &[])
                    .expect("read")
                    .iter()
                    .map(|r| (text(&r[0]), text(&r[1])))
                    .collect();
                (sessions, events)
            })
            .collect()
    }

    fn check(&mut self) {
        let tables = self.tables();
        let mut holder: BTreeMap<&str, u32> = BTreeMap::new();
        for (k, (sessions, _)) in tables.iter().enumerate() {
            for s in sessions {
                if let Some(other) = holder.insert(s, k as u32) {
                    self.violations.push(format!(
                        "step {}: {s} is held by shards {other} and {k}",
                        self.steps
                    ));
                }
            }
        }
        for (k, (_, events)) in tables.iter().enumerate() {
            for (s, e) in events {
                if holder.get(s.as_str()) != Some(&(k as u32)) {
                    self.violations.push(format!(
                        "step {}: shard {k} stores {e} of {s}, held by {:?}",
                        self.steps,
                        holder.get(s.as_str())
                    ));
                }
            }
        }
        for (session, event) in &self.stored {
            let at = holder.get(session.as_str()).map(|&k| &tables[k as usize].1);
            if !at.is_some_and(|events| events.iter().any(|(s, e)| s == session && e == event)) {
                self.violations.push(format!(
                    "step {}: {event} was stored and is not at {session}'s holder",
                    self.steps
                ));
            }
        }
        self.violations.dedup();
        self.violations.truncate(5);
    }
}
