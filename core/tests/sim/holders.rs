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
use callfence_core::locate::{Locate, Transmit};
use callfence_core::messages::{MapNotice, Redirect};
use callfence_core::shard::CallShard;
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

/// One webhook being placed by a Worker: core's driver, as the Worker
/// runs it.
#[derive(Debug, Clone)]
struct Task {
    worker: usize,
    event: String,
    locate: Locate,
}

/// One shard's sessions, and its events as (session, event id).
type Tables = (Vec<String>, Vec<(String, String)>);

/// One step of the holder world.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Worker `worker` receives event `event` of `session` from the carrier.
    Deliver {
        worker: usize,
        session: String,
        event: String,
    },
    /// The placement in flight at `index` sends its next request.
    Advance(usize),
    /// The map gets a new revision of this many shards.
    ChangeMap(u32),
    /// The directory sends revision `revision` of the map to `shard`.
    Push { shard: u32, revision: usize },
    /// A Worker reads the map in force.
    Refresh(usize),
    /// A shard's object restarts: its memory is dropped.
    Restart(u32),
}

pub struct HolderWorld {
    rng: Rng,
    shard_count: u32,
    plant: Option<Plant>,
    now: i64,
    shards: Vec<Option<CallShard<Rc<SqliteStore>>>>,
    stores: Vec<Rc<SqliteStore>>,
    /// The map's revisions: `maps[r]` is revision `r`'s shard count.
    maps: Vec<u32>,
    workers: Vec<MapNotice>,
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
    /// `gave_up` when the map stopped changing (see `hold_still`).
    still_from: Option<u64>,
}

impl HolderWorld {
    /// The simulation's world: [`SHARDS`] shards and [`WORKERS`] Workers,
    /// on a map of one shard that the schedule then changes.
    pub fn new(seed: u64, plant: Option<Plant>) -> Self {
        let mut world = Self::with(SHARDS, vec![1], WORKERS, plant);
        world.rng = Rng(seed);
        world
    }

    /// A world of `shard_count` shards (every one on the first map), the
    /// map's revisions `maps` (revision `r` has `maps[r]` shards), and
    /// `workers` Workers that have cached the first.
    pub fn with(shard_count: u32, maps: Vec<u32>, workers: usize, plant: Option<Plant>) -> Self {
        let mut stores = Vec::new();
        let mut shards = Vec::new();
        for k in 0..shard_count {
            let store = SqliteStore::in_memory().expect("sqlite");
            migrate(&store, T0).expect("migrate");
            let store = Rc::new(store);
            shards.push(Some(
                CallShard::new(store.clone(), EngineConfig::default()).numbered(k),
            ));
            stores.push(store);
        }
        Self {
            rng: Rng(0),
            shard_count,
            plant,
            now: T0,
            shards,
            stores,
            maps,
            workers: vec![MapNotice::default(); workers],
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
            still_from: None,
        }
    }

    /// Everything the future of this world depends on, as text: each
    /// shard's sessions, events and adopted map, the placements in flight,
    /// the Workers' maps and the map's revisions. Two worlds with the same
    /// fingerprint behave alike (the model check explores one of them).
    pub fn fingerprint(&self) -> String {
        let mut text = format!("{:?}|{:?}|{:?}|", self.maps, self.workers, self.tasks);
        for store in &self.stores {
            for sql in [
                "SELECT call_session_id FROM sessions ORDER BY 1",
                "SELECT event_id, call_session_id FROM events ORDER BY 1",
                "SELECT name, value FROM counters WHERE name LIKE 'map_%' ORDER BY 1",
            ] {
                text.push_str(&format!("{:?}|", store.exec(sql, &[]).expect("read")));
            }
        }
        text
    }

    /// How many placements are in flight.
    pub fn in_flight(&self) -> usize {
        self.tasks.len()
    }

    /// Applies one action and checks every invariant after it.
    pub fn apply(&mut self, action: &Action) {
        self.steps += 1;
        match action {
            Action::Deliver {
                worker,
                session,
                event,
            } => self.deliver(*worker, session, event),
            Action::Advance(i) => self.advance(*i),
            Action::ChangeMap(n) => {
                self.maps.push(*n);
                self.map_changes += 1;
            }
            Action::Push { shard, revision } => {
                let notice = self.notice(*revision);
                self.shard(*shard).handle_map(&notice).expect("map");
            }
            Action::Refresh(w) => self.workers[*w] = self.current(),
            Action::Restart(k) => {
                let k = *k as usize;
                self.shards[k] = None;
                self.shards[k] = Some(
                    CallShard::new(self.stores[k].clone(), EngineConfig::default())
                        .numbered(k as u32),
                );
            }
        }
        self.check();
    }

    /// Counts the placements that gave up from now on as violations: under
    /// a still map, every placement must end within
    /// [`MAX_REQUESTS`](callfence_core::locate::MAX_REQUESTS) requests.
    pub fn hold_still(&mut self) {
        // The carrier retries each placement in flight afresh.
        for task in &mut self.tasks {
            let map = self.workers[task.worker];
            task.locate = Locate::new(task.locate.session(), map);
        }
        self.still_from = Some(self.gave_up);
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
            self.now += 1 + self.rng.below(50) as i64;
            let action = self.pick();
            self.apply(&action);
        }
        self.hold_still();
        while self.in_flight() > 0 {
            self.apply(&Action::Advance(0));
        }
    }

    /// A random action.
    fn pick(&mut self) -> Action {
        let shard = self.rng.below(u64::from(self.shard_count)) as u32;
        let worker = self.rng.below(self.workers.len() as u64) as usize;
        match self.rng.below(100) {
            0..=29 => {
                // A window of sessions that moves on: new sessions keep
                // arriving while the map changes, some of them at two
                // Workers at once; 30% of events are repeats.
                let first = self.steps / STEPS_PER_SESSION;
                let session = format!("v3:sim-{}", first + self.rng.below(SESSIONS));
                let sent = self.events.get(&session).map_or(0, Vec::len) as u64;
                let n = if sent > 0 && self.rng.chance(30) {
                    self.rng.below(sent)
                } else {
                    sent
                };
                Action::Deliver {
                    worker,
                    event: format!("{session}/e{n}"),
                    session,
                }
            }
            30..=79 if !self.tasks.is_empty() => {
                Action::Advance(self.rng.below(self.tasks.len() as u64) as usize)
            }
            80..=85 => Action::ChangeMap(1 + self.rng.below(u64::from(self.shard_count)) as u32),
            86..=90 => Action::Push {
                shard,
                revision: self.rng.below(self.maps.len() as u64) as usize,
            },
            91..=96 => Action::Refresh(worker),
            _ => Action::Restart(shard),
        }
    }

    /// A Worker receives a webhook.
    fn deliver(&mut self, worker: usize, session: &str, event: &str) {
        let sent = self.events.entry(session.to_owned()).or_default();
        if !sent.iter().any(|e| e == event) {
            sent.push(event.to_owned());
        }
        let map = self.workers[worker];
        self.tasks.push(Task {
            worker,
            event: event.to_owned(),
            locate: Locate::new(session, map),
        });
    }

    /// Sends task `i`'s next request and takes its answer.
    fn advance(&mut self, i: usize) {
        let mut task = self.tasks.remove(i);
        match task.locate.poll_transmit() {
            None => self.gave_up += 1,
            Some(Transmit::Webhook { shard, arrival }) => {
                let session = task.locate.session().to_owned();
                let body = format!(
                    r#"{{"data":{{"id":"{}","event_type":"call.initiated","record_type":"event","payload":{{"call_session_id":"{session}","call_control_id":"{session}-leg","from":"+15105550100","to":"+15102160079","direction":"incoming"}}}}}}"#,
                    task.event
                );
                let envelope = parse_envelope(body.as_bytes()).expect("envelope");
                let held_before = self.holders(&session).len();
                let proof = task.locate.absent().cloned();
                let ingress = self
                    .shard(shard)
                    .handle_placed_webhook(&envelope, &body, &[], &arrival, self.now)
                    .expect("webhook");
                let Ingress::Redirect(redirect) = ingress else {
                    if held_before == 0 {
                        self.created += 1;
                    }
                    self.stored.push((session, task.event));
                    return;
                };
                if let Redirect::Elsewhere { .. } = redirect {
                    self.redirects += 1;
                }
                let forged = match (&redirect, self.plant, proof) {
                    (Redirect::Lookup { shards, map }, Some(Plant::SkipLookup), _) => {
                        Some((map.revision, shards.clone()))
                    }
                    (
                        Redirect::Lookup { shards, map },
                        Some(Plant::StaleProof),
                        Some((_, proven)),
                    ) if shards.iter().all(|k| proven.contains(k)) => Some((map.revision, proven)),
                    _ => None,
                };
                task.locate.handle_redirect(redirect);
                if let Some((revision, shards)) = forged {
                    task.locate.forge_absent(revision, shards);
                }
                self.adopt(&mut task);
                self.tasks.push(task);
            }
            Some(Transmit::Holds { shard, map }) => {
                self.lookups += 1;
                let holds = self
                    .shard(shard)
                    .handle_holds(task.locate.session(), &map)
                    .expect("holds");
                task.locate.handle_holds(holds);
                self.tasks.push(task);
            }
        }
    }

    /// The task's Worker keeps the newer of its map and the task's.
    fn adopt(&mut self, task: &mut Task) {
        let cached = &mut self.workers[task.worker];
        if task.locate.map().supersedes(cached) {
            *cached = task.locate.map();
        }
        task.locate.learn(*cached);
    }

    /// The shards whose tables hold session `id`.
    fn holders(&self, id: &str) -> Vec<u32> {
        (0..self.shard_count)
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
        if let Some(from) = self.still_from.filter(|&from| self.gave_up > from) {
            self.violations.push(format!(
                "{} placements did not end under a still map",
                self.gave_up - from
            ));
        }
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
