//! The simulated world: carrier, nodes, operators and the Worker's glue
//! around the real engine.

use crate::common::checker::{Checker, Observation, Snapshot};
use crate::common::fixtures::{self, BeatSpec, Keys, T0};
use crate::common::observe;
use crate::machines::Machines;
use crate::rng::Rng;
use callfence_core::delivery::Delivery as Driver;
use callfence_core::document::DocKind;
use callfence_core::eligibility::is_valid_sha;
use callfence_core::engine::{
    Caller, ClaimReply, ClaimRequest, EngineConfig, FenceReply, FenceRequest, Forward,
    HeartbeatRefusal, Ingress, MediaReply, Report, ReportEffect, ReportedAnswer, Timing,
};
use callfence_core::heartbeat::{Mode, HEARTBEAT_SCHEMA};
use callfence_core::outcome::OutcomeClass;
use callfence_core::store::sqlite::SqliteStore;
use callfence_core::store::{migrate, Store, Value};
use serde_json::json;
use std::collections::BTreeSet;

const LINES: [(&str, &str); 2] = [
    ("property_management_ca", "+15102160079"),
    ("front_desk", "+15105550123"),
];
const NODES: [&str; 3] = ["M1", "M2", "M3"];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Behavior {
    Ok,
    Timeout,
    NotAdmitted,
    ServerError,
}

struct SimNode {
    id: &'static str,
    alive: bool,
    dirty: bool,
    mode: Mode,
    sha: String,
    behavior: Behavior,
    seq: u64,
    /// Sessions this node admitted (the agent answers them, never not_admitted).
    admitted: BTreeSet<String>,
    /// Every beat sent: (sent at, eligible by its own account).
    /// Beats in force: (acknowledged at, sent at, truly eligible).
    beats: Vec<(i64, i64, bool)>,
}

struct CallEvent {
    event_id: String,
    event_type: &'static str,
    body: String,
}

struct Delivery {
    at: i64,
    event: usize,
    tries_left: u32,
}

struct LateReport {
    at: i64,
    report: Report,
    session: String,
    /// The delivery it belongs to, which applies what the report did.
    driven: Driven,
}

/// A bug planted in the simulated Dispatcher, which the checker must catch.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Plant {
    /// A delivery driver that sends an attempt again after an ambiguous
    /// answer (a timeout, a 5xx), a retry the engine never started.
    ResendAfterAmbiguous,
    /// A Dispatcher that acknowledges a beat when the directory has it,
    /// before the shard's view does: an eligibility change applied only
    /// to the directory.
    AckAtDirectory,
}

/// Core's delivery driver as the simulated Dispatcher polls it, on the
/// delivery's own clock (the world's clock does not move while an origin
/// answers), and with the planted driver bug when armed.
struct Driven {
    /// Which delivery this is, for the checker.
    id: u64,
    driver: Driver,
    /// The time of the delivery's last send or answer.
    at: i64,
    /// [`Plant::ResendAfterAmbiguous`]: the forward to send again.
    resend: Option<Forward>,
}

impl Driven {
    fn new(id: u64, driver: Driver, at: i64) -> Self {
        Self {
            id,
            driver,
            at,
            resend: None,
        }
    }

    /// The next forward to send, if any.
    fn poll_transmit(&mut self) -> Option<Forward> {
        if let Some(again) = self.resend.take() {
            return Some(again);
        }
        let at = self.at;
        self.driver.poll_transmit(at).map(|t| t.forward.clone())
    }

    /// The origin's answer to `sent`, `spent_ms` after it was sent.
    fn handle_answer(
        &mut self,
        sent: &Forward,
        answer: ReportedAnswer,
        spent_ms: i64,
        plant: Option<Plant>,
    ) -> Option<Report> {
        if plant == Some(Plant::ResendAfterAmbiguous) && answer.class() == OutcomeClass::Unknown {
            self.resend = Some(sent.clone());
        }
        self.at += spent_ms;
        self.driver.handle_answer(answer, self.at)
    }
}

/// A node signing with its registered key id.
fn signed(node: &str) -> Caller<'_> {
    Caller { node, kid: "k1" }
}

pub struct World {
    rng: Rng,
    now: i64,
    machines: Option<Machines>,
    /// Beats sent and not yet in the shard's view: (node, seq, sent, truly).
    unacked: Vec<(usize, u64, i64, bool)>,
    config: EngineConfig,
    nodes: Vec<SimNode>,
    keys: Keys,
    events: Vec<CallEvent>,
    deliveries: Vec<Delivery>,
    reports: Vec<LateReport>,
    plant: Option<Plant>,
    /// Deliveries driven so far (each one's number, for the checker).
    driven: u64,
    next_alarm: Option<i64>,
    next_beat: i64,
    obs: Vec<Observation>,
    last_decision: i64,
    calls: u64,
    pub checker: Checker,
    pub steps: u64,
    pub forwards: u64,
    pub fences: u64,
    /// Reassignments forwarded at once, and held back by the hop or budget rule.
    pub reforwards: u64,
    pub held_back: u64,
    /// Node ops refused for an unknown key id or node.
    pub unknown_keys: u64,
    /// Steps after which the alarm's due time was checked with work pending.
    pub alarm_checks: u64,
}

impl World {
    pub fn new(seed: u64) -> Self {
        let store = SqliteStore::in_memory().expect("sqlite");
        migrate(&store, T0).expect("migrate");
        let mut rng = Rng(seed);
        // A third of the schedules run against a small row cap and a short
        // retention, so that claim floods fill the table and pruning (by
        // cap and by age) runs among live calls.
        let small = rng.chance(33);
        let config = EngineConfig {
            forward_timeout_ms: 1_500,
            connection_ids: None,
            allow_plaintext: false,
            timing: Timing {
                node_lost_after_ms: 20_000,
                max_duration_ms: 90_000,
                retention_ms: if small { 40_000 } else { 600_000 },
                sweep_interval_ms: 5_000,
                ..Timing::default()
            },
            session_cap: if small {
                3 + rng.below(6) as i64
            } else {
                1_000
            },
        };
        let nodes = NODES
            .iter()
            .map(|id| SimNode {
                id,
                alive: !rng.chance(5),
                dirty: rng.chance(10),
                mode: Mode::Active,
                sha: format!("{:040x}", rng.below(3) + 0xabc),
                behavior: Behavior::Ok,
                seq: 0,
                admitted: BTreeSet::new(),
                beats: Vec::new(),
            })
            .collect();
        let mut world = Self {
            rng,
            now: T0,
            machines: Some(Machines::new(store, config.clone(), T0)),
            unacked: Vec::new(),
            config,
            nodes,
            keys: Keys::new(),
            events: Vec::new(),
            deliveries: Vec::new(),
            reports: Vec::new(),
            plant: None,
            driven: 0,
            next_alarm: None,
            next_beat: T0,
            obs: Vec::new(),
            last_decision: 0,
            calls: 0,
            checker: Checker::default(),
            steps: 0,
            forwards: 0,
            fences: 0,
            reforwards: 0,
            held_back: 0,
            unknown_keys: 0,
            alarm_checks: 0,
        };
        world.write_documents();
        world.machines().deliver_all(T0);
        world
    }

    fn engine(&self) -> &Machines {
        self.machines.as_ref().expect("machines")
    }

    /// Messages delivered between the machines, and late views dropped.
    pub fn messages(&self) -> (u64, u64) {
        (self.engine().delivered, self.engine().superseded)
    }

    fn machines(&mut self) -> &mut Machines {
        self.machines.as_mut().expect("machines")
    }

    /// Delivers one message between the machines, picked at random (so
    /// reordered), sometimes leaving a copy in flight (so repeated).
    fn deliver_message(&mut self) {
        let n = self.engine().in_flight.len();
        if n == 0 {
            return;
        }
        let index = self.rng.below(n as u64) as usize;
        let again = self.rng.chance(15);
        let now = self.now;
        self.machines().deliver(index, again, now);
        self.acknowledge_beats();
    }

    /// Beats the shard's view now holds are in force from now: the checker
    /// judges a decision by the beats acknowledged before it.
    fn acknowledge_beats(&mut self) {
        let view = self.engine().shard.directory_view();
        let now = self.now;
        let nodes = &mut self.nodes;
        self.unacked.retain(|&(i, seq, sent, truly)| {
            let held = view.beat(nodes[i].id).map_or(0, |b| b.heartbeat.seq);
            if held < seq {
                return true;
            }
            nodes[i].beats.push((now, sent, truly));
            false
        });
    }

    fn write_documents(&mut self) {
        let nodes: serde_json::Map<String, serde_json::Value> = NODES
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let role = if *id == "M3" { "candidate" } else { "stable" };
                (id.to_string(), fixtures::registry_entry(i, role, false))
            })
            .collect();
        let registry = json!({"schema": "callfence_nodes_v1", "nodes": nodes});
        let now = self.now;
        self.machines()
            .put_document(
                DocKind::Nodes,
                registry.to_string().as_bytes(),
                Some("\"0\""),
                now,
            )
            .expect("registry");
        let policy = json!({
            "schema": "riff_node_routing_policy_v1", "default_node": "M1",
            "by_line": {
                LINES[0].0: {"called_number": LINES[0].1, "preferred_node": "M3", "fallback_node": "M2"},
                LINES[1].0: {"called_number": LINES[1].1, "preferred_node": "M2"}
            },
            "by_caller": {"+14155550100": {"preferred_node": "M3", "expires_at": callfence_core::time::format_ms(self.now + 3_600_000)}}
        });
        let now = self.now;
        self.machines()
            .put_document(
                DocKind::Policy,
                policy.to_string().as_bytes(),
                Some("\"0\""),
                now,
            )
            .expect("policy");
    }

    /// A world whose Dispatcher carries `plant`.
    pub fn planted(seed: u64, plant: Plant) -> Self {
        let mut world = Self::new(seed);
        world.plant = Some(plant);
        world
    }

    pub fn run(&mut self) {
        let steps = 80 + self.rng.below(120);
        for _ in 0..steps {
            self.step();
        }
    }

    fn step(&mut self) {
        self.steps += 1;
        match self.rng.below(100) {
            0..=14 => self.new_call(),
            15..=44 => self.deliver_next(),
            45..=59 => self.advance(),
            60..=69 => self.node_change(),
            70..=74 => self.rogue_fence(),
            75..=77 => self.stale_write(),
            78..=79 => self.restart(),
            80..=82 => self.invalid_input(),
            83..=87 => self.claim_flood(),
            88..=93 => self.late_report(),
            _ => self.deliver_message(),
        }
        let due = self
            .engine()
            .shard
            .next_alarm_at(self.now)
            .expect("alarm due");
        let truth = self.alarm_truth();
        self.alarm_checks += u64::from(truth.is_some());
        self.obs.push(Observation::AlarmDue { engine: due, truth });
        let after = self.snapshot();
        self.collect_decisions();
        let obs = std::mem::take(&mut self.obs);
        self.checker.step(&obs, after);
    }

    // ---- the carrier -------------------------------------------------------

    fn new_call(&mut self) {
        self.calls += 1;
        let session = format!("sess-{}", self.calls);
        let ccid = format!("v3:leg-{}", self.calls);
        let to = match self.rng.below(4) {
            0 => LINES[0].1.to_string(),
            1 => "(510) 555-0123".to_string(),
            2 => "sip:+15102160079@sip.telnyx.com".to_string(),
            _ => "+12025550133".to_string(),
        };
        let from = if self.rng.chance(20) {
            "+14155550100"
        } else {
            "+12125550199"
        };
        for (i, event_type) in ["call.initiated", "call.answered", "call.hangup"]
            .into_iter()
            .enumerate()
        {
            let event_id = format!("evt-{}-{i}", self.calls);
            let body = fixtures::event_body(
                &event_id, event_type, &session, &ccid, from, &to, "incoming",
            );
            self.events.push(CallEvent {
                event_id,
                event_type,
                body,
            });
            let idx = self.events.len() - 1;
            let at = self.now + (i as i64) * (500 + self.rng.below(4000) as i64);
            self.deliveries.push(Delivery {
                at,
                event: idx,
                tries_left: 3,
            });
            if self.rng.chance(25) {
                // A duplicate, possibly via the failover URL, possibly before the original.
                let skew = self.rng.below(3000) as i64 - 1000;
                self.deliveries.push(Delivery {
                    at: at + skew,
                    event: idx,
                    tries_left: 1,
                });
            }
        }
    }

    fn deliver_next(&mut self) {
        if self.deliveries.is_empty() {
            return;
        }
        // Reorder: pick any of the three earliest deliveries.
        self.deliveries.sort_by_key(|d| d.at);
        let pick = self.rng.below(self.deliveries.len().min(3) as u64) as usize;
        let delivery = self.deliveries.remove(pick);
        self.now = self.now.max(delivery.at);
        let ok = self.webhook(delivery.event);
        if !ok && delivery.tries_left > 1 {
            self.deliveries.push(Delivery {
                at: self.now + 2_000,
                event: delivery.event,
                tries_left: delivery.tries_left - 1,
            });
        }
    }

    /// The Worker's ingress path. Returns true when the carrier got a 200.
    fn webhook(&mut self, idx: usize) -> bool {
        let body = self.events[idx].body.clone();
        let event_id = self.events[idx].event_id.clone();
        let (envelope, headers) = self.keys.signed_webhook(&body, self.now);
        let now = self.now;
        let ingress = self
            .machines()
            .on_shard(now, |s| s.handle_webhook(&envelope, &body, &headers, now))
            .expect("engine");
        self.after_store_change();
        match ingress {
            Ingress::Forward(f) => {
                let driven =
                    self.driven(Driver::webhook(f, self.now, self.config.forward_timeout_ms));
                self.send(driven)
            }
            Ingress::Delivered(d) => {
                let answer = format!("{}/{}", d.delivered_to, d.epoch);
                self.obs
                    .push(Observation::DuplicateAnswered { event_id, answer });
                true
            }
            Ingress::Ignored | Ingress::Unroutable => true,
            Ingress::InProgress
            | Ingress::Pending(_)
            | Ingress::Rejected
            | Ingress::StorageFull => false,
            // One shard that holds no map: every session's home is here.
            Ingress::Redirect(_) => {
                unreachable!("a one-shard world placed a session elsewhere")
            }
            Ingress::NeedRoom => unreachable!("a one-shard world found room held elsewhere"),
        }
    }

    /// A new delivery driven by `driver`, from now.
    fn driven(&mut self, driver: Driver) -> Driven {
        self.driven += 1;
        Driven::new(self.driven, driver, self.now)
    }

    /// Sends what the delivery driver polls to the simulated node and
    /// reports (or delays, or loses) the outcome. Returns true when the
    /// carrier would get a 200.
    fn send(&mut self, mut driven: Driven) -> bool {
        let Some(f) = driven.poll_transmit() else {
            return false;
        };
        let answer = self.transmit(&f, driven.id);
        let not_admitted = answer.class() == OutcomeClass::NotDelivered;
        let ambiguous = answer.class() == OutcomeClass::Unknown;
        // The origin's answer takes 50 to 800 ms of the carrier's budget.
        let spent = 50 + self.rng.below(750) as i64;
        let report = driven.handle_answer(&f, answer, spent, self.plant);
        if let Some(again) = driven.poll_transmit() {
            // Only a planted driver has anything to send before the report.
            self.transmit(&again, driven.id);
        }
        let report = report.expect("a send in flight");
        match self.rng.below(10) {
            0 if !not_admitted => {
                // Lost: the lease lapses, which the engine must treat as ambiguous.
                self.obs.push(Observation::Ambiguous {
                    session: f.call_session_id,
                    epoch: f.epoch,
                });
                false
            }
            1 | 2 => {
                if ambiguous {
                    self.obs.push(Observation::Ambiguous {
                        session: f.call_session_id.clone(),
                        epoch: f.epoch,
                    });
                }
                let at = self.now + self.rng.below(5_000) as i64;
                self.reports.push(LateReport {
                    at,
                    report,
                    session: f.call_session_id,
                    driven,
                });
                false
            }
            _ => {
                if ambiguous {
                    self.obs.push(Observation::Ambiguous {
                        session: f.call_session_id.clone(),
                        epoch: f.epoch,
                    });
                }
                self.report(report, &f.call_session_id, driven)
            }
        }
    }

    /// One forward to the simulated node: what it does and answers.
    fn transmit(&mut self, f: &Forward, delivery: u64) -> ReportedAnswer {
        self.forwards += 1;
        self.obs.push(Observation::Forwarded {
            event_id: f.event_id.clone(),
        });
        self.obs.push(Observation::Sent {
            delivery,
            event_id: f.event_id.clone(),
            epoch: f.epoch,
            attempt: f.attempt,
        });
        let idx = self
            .nodes
            .iter()
            .position(|n| n.id == f.node)
            .expect("known node");
        let node = &self.nodes[idx];
        let behavior = if !node.alive {
            None
        } else if node.admitted.contains(&f.call_session_id)
            && node.behavior == Behavior::NotAdmitted
        {
            Some(Behavior::Ok)
        } else if node.mode != Mode::Active && !node.admitted.contains(&f.call_session_id) {
            Some(Behavior::NotAdmitted)
        } else {
            Some(node.behavior)
        };
        let acted = match behavior {
            Some(Behavior::Ok) => true,
            Some(Behavior::Timeout | Behavior::ServerError) => self.rng.chance(50),
            _ => false,
        };
        if acted {
            self.nodes[idx].admitted.insert(f.call_session_id.clone());
            let event = self.events.iter().find(|e| e.event_id == f.event_id);
            if event.is_some_and(|e| e.event_type == "call.initiated") {
                self.fence(
                    idx,
                    &f.call_session_id,
                    f.call_control_id.as_deref().unwrap_or(""),
                    f.epoch,
                );
                if self.rng.chance(20) {
                    self.fence(
                        idx,
                        &f.call_session_id,
                        f.call_control_id.as_deref().unwrap_or(""),
                        f.epoch,
                    );
                }
            }
        }
        match behavior {
            None => ReportedAnswer::NetworkError,
            Some(Behavior::Ok) => ReportedAnswer::Http {
                status: 200,
                body: "{}".into(),
            },
            Some(Behavior::Timeout) => ReportedAnswer::Timeout,
            Some(Behavior::ServerError) => ReportedAnswer::Http {
                status: 500,
                body: "oops".into(),
            },
            Some(Behavior::NotAdmitted) => ReportedAnswer::Http {
                status: 503,
                body: r#"{"callfence":"not_admitted"}"#.into(),
            },
        }
    }

    fn report(&mut self, report: Report, session: &str, mut driven: Driven) -> bool {
        let current = self.session_epoch(session);
        let stale = current != Some(report.epoch);
        let before = stale.then(|| self.dump());
        let now = self.now;
        let effect = self
            .machines()
            .on_shard(now, |s| s.handle_report(&report, now))
            .expect("report");
        if let Some(before) = before {
            let after = self.dump();
            self.obs.push(Observation::StaleReport { before, after });
        }
        self.after_store_change();
        match &effect {
            ReportEffect::Delivered(d) => {
                self.obs.push(Observation::Delivered {
                    answer: format!("{}/{}", d.delivered_to, d.epoch),
                    event_id: d.event_id.clone(),
                });
                return true;
            }
            ReportEffect::Reassigned(next) => {
                self.obs.push(Observation::Reassigned {
                    hop: report.hop,
                    budget_left_ms: report.budget_left_ms,
                    forwarded: next.is_some(),
                });
                match next {
                    Some(_) => self.reforwards += 1,
                    None => self.held_back += 1,
                }
            }
            ReportEffect::Unknown | ReportEffect::Parked(_) => {}
        }
        // A move with a forward is the driver's next send; anything else
        // finished it.
        driven.driver.handle_effect(effect);
        self.send(driven)
    }

    fn late_report(&mut self) {
        if self.reports.is_empty() {
            return;
        }
        let i = self.rng.below(self.reports.len() as u64) as usize;
        let late = self.reports.remove(i);
        self.now = self.now.max(late.at);
        self.report(late.report, &late.session, late.driven);
    }

    // ---- nodes -------------------------------------------------------------

    fn fence(&mut self, node: usize, session: &str, ccid: &str, epoch: u64) {
        let req = FenceRequest {
            call_session_id: session.into(),
            call_control_id: ccid.into(),
            epoch,
            purpose: callfence_core::wire::FencePurpose::Answer,
        };
        let id = self.nodes[node].id;
        let (keys, now) = (&self.keys.media_keys, self.now);
        let reply = self
            .machines
            .as_mut()
            .expect("machines")
            .on_shard(now, |s| s.handle_fence(signed(id), &req, keys, now))
            .expect("fence");
        if let FenceReply::Granted(g) = reply {
            if g.first {
                self.fences += 1;
            }
            self.obs.push(Observation::FenceGranted {
                session: session.into(),
                node: id.into(),
                epoch: g.epoch,
            });
        }
    }

    fn rogue_fence(&mut self) {
        if self.calls == 0 {
            return;
        }
        let node = self.rng.below(NODES.len() as u64) as usize;
        let call = 1 + self.rng.below(self.calls);
        let epoch = 1 + self.rng.below(self.calls * 2 + 2);
        self.fence(
            node,
            &format!("sess-{call}"),
            &format!("v3:leg-{call}"),
            epoch,
        );
    }

    /// A node's dial loop: a burst of claims of fresh outgoing sessions at
    /// one instant (the token bucket, the node's capacity and the row cap
    /// refuse what they must). A claimed call may be answered (fenced) and
    /// may hang up later through the carrier; the rest stay open until the
    /// sweep settles them.
    fn claim_flood(&mut self) {
        let i = self.rng.below(NODES.len() as u64) as usize;
        let id = self.nodes[i].id;
        for _ in 0..1 + self.rng.below(15) {
            self.calls += 1;
            let session = format!("out-{}", self.calls);
            let ccid = format!("v3:out-leg-{}", self.calls);
            let claim = ClaimRequest {
                call_control_id: ccid.clone(),
                call_session_id: session.clone(),
            };
            let now = self.now;
            let reply = self
                .machines()
                .on_shard(now, |s| s.handle_claim(signed(id), &claim, now))
                .expect("claim");
            self.after_store_change();
            let ClaimReply::Claimed { epoch, .. } = reply else {
                continue;
            };
            if self.rng.chance(60) {
                self.fence(i, &session, &ccid, epoch);
            }
            if self.rng.chance(50) {
                let event_id = format!("evt-{}-hangup", self.calls);
                let body = fixtures::event_body(
                    &event_id,
                    "call.hangup",
                    &session,
                    &ccid,
                    "+15102160079",
                    "+12025550133",
                    "outgoing",
                );
                self.events.push(CallEvent {
                    event_id,
                    event_type: "call.hangup",
                    body,
                });
                self.deliveries.push(Delivery {
                    at: self.now + 500 + self.rng.below(8_000) as i64,
                    event: self.events.len() - 1,
                    tries_left: 3,
                });
            }
        }
    }

    fn node_change(&mut self) {
        let i = self.rng.below(NODES.len() as u64) as usize;
        let choice = self.rng.below(9);
        let node = &mut self.nodes[i];
        match choice {
            0 => node.alive = !node.alive,
            1 => node.dirty = !node.dirty,
            2 => node.mode = Mode::Drained,
            3 => node.mode = Mode::Shadow,
            4 => node.mode = Mode::Active,
            5 => node.sha = format!("{:040x}", self.rng.below(5) + 0xabc),
            6 => node.behavior = Behavior::Timeout,
            7 => node.behavior = Behavior::NotAdmitted,
            _ => node.behavior = Behavior::ServerError,
        }
        if self.rng.chance(50) {
            self.nodes[i].behavior = Behavior::Ok;
        }
    }

    fn beat(&mut self, i: usize) {
        let node = &self.nodes[i];
        if !node.alive {
            return;
        }
        let seq = (node.seq + 1).max(self.now as u64);
        let spec = BeatSpec {
            node: node.id,
            seq,
            mode: node.mode,
            sha: node.sha.clone(),
            dirty: node.dirty,
            lines: &LINES,
        };
        let truly = spec.mode == Mode::Active && !spec.dirty && is_valid_sha(&spec.sha);
        let body = fixtures::heartbeat_body(&spec, self.now);
        let id = node.id;
        let now = self.now;
        self.machines()
            .handle_heartbeat(signed(id), now / 1000, &body, now)
            .expect("beat accepted");
        self.nodes[i].seq = seq;
        if self.plant == Some(Plant::AckAtDirectory) {
            self.nodes[i].beats.push((now, now, truly));
        } else {
            self.unacked.push((i, seq, now, truly));
        }
    }

    // ---- time, alarm, operators, restarts ------------------------------------

    fn advance(&mut self) {
        let target = self.now + 10 + self.rng.below(6_000) as i64;
        while self.now < target {
            let next = [Some(self.next_beat), self.next_alarm, Some(target)]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(target);
            self.now = next.max(self.now);
            if self.now >= self.next_beat {
                for i in 0..self.nodes.len() {
                    self.beat(i);
                }
                self.next_beat = self.now + 5_000;
            }
            if self.next_alarm.is_some_and(|a| a <= self.now) {
                self.alarm();
            }
            if self.now >= target {
                break;
            }
        }
    }

    fn alarm(&mut self) {
        // A step may run several alarms: the checker sees the state before
        // each, so that "nothing live when an alarm starts is pruned by it"
        // is checked alarm by alarm.
        let obs = std::mem::take(&mut self.obs);
        let before = self.snapshot();
        self.checker.step(&obs, before);
        let now = self.now;
        let work = self.machines().poll_alarm(now);
        let t = &self.config.timing;
        self.obs.push(Observation::AlarmRan {
            now_ms: self.now,
            node_lost_after_ms: t.node_lost_after_ms,
            max_duration_ms: t.max_duration_ms,
            slack_ms: 0,
        });
        self.next_alarm = work.next_alarm_ms;
        for f in work.forwards {
            let driven = self.driven(Driver::redrive(f, self.config.forward_timeout_ms));
            self.send(driven);
        }
        self.after_store_change();
    }

    /// The Dispatcher's contract: after every state change it asks the
    /// engine when the alarm is next due, and arms it unless armed earlier.
    fn after_store_change(&mut self) {
        let due = self
            .engine()
            .shard
            .next_alarm_at(self.now)
            .expect("alarm due");
        self.next_alarm = match (self.next_alarm, due) {
            (Some(armed), Some(due)) => Some(armed.min(due)),
            (armed, due) => armed.or(due),
        };
    }

    /// When the stored work is next due, by a full scan of the tables (the
    /// engine answers from indexes and a cache).
    fn alarm_truth(&self) -> Option<i64> {
        let t = &self.config.timing;
        let store = self.engine().store();
        let events = store
            .exec("SELECT state, next_try_at, redrives FROM events", &[])
            .expect("events");
        let max_redrives = t.redrive_backoff_ms.len() as i64;
        let mut due: Vec<i64> = Vec::new();
        let state = |r: &Vec<Value>| r[0].as_text().unwrap_or_default().to_owned();
        if events.iter().any(|r| state(r) == "pending_assignment") {
            due.push(self.now + t.pending_retry_ms);
        }
        due.extend(events.iter().filter_map(|r| {
            let s = state(r);
            let retried = s == "queued"
                || s == "forwarding"
                || (s == "unknown" && r[2].as_int().unwrap_or(0) < max_redrives);
            retried
                .then(|| r[1].as_int())
                .flatten()
                .map(|at| at.max(self.now))
        }));
        let open = store
            .exec("SELECT state FROM sessions", &[])
            .expect("sessions")
            .iter()
            .any(|r| matches!(r[0].as_text(), Some("assigned" | "answered")));
        if open || !events.is_empty() {
            due.push(self.now + t.sweep_interval_ms);
        }
        due.into_iter().min()
    }

    fn restart(&mut self) {
        let machines = self.machines.take().expect("machines");
        self.machines = Some(machines.restart(self.config.clone(), self.now));
        self.next_alarm = Some(self.now);
    }

    fn stale_write(&mut self) {
        let kind = if self.rng.chance(50) {
            DocKind::Policy
        } else {
            DocKind::Nodes
        };
        let (rev, doc) = self.engine().get_document(kind).expect("document");
        let before = self.dump();
        let stale = format!("\"{}\"", rev.saturating_sub(1 + self.rng.below(2)));
        let now = self.now;
        let result =
            self.machines()
                .put_document(kind, doc.to_string().as_bytes(), Some(&stale), now);
        assert!(result.is_err(), "a stale write was accepted");
        let after = self.dump();
        self.obs.push(Observation::StaleWrite { before, after });
        if self.rng.chance(30) {
            // A valid rewrite: the revision must grow.
            let ok = format!("\"{rev}\"");
            self.machines()
                .put_document(kind, doc.to_string().as_bytes(), Some(&ok), now)
                .expect("rewrite");
        }
    }

    fn invalid_input(&mut self) {
        let before = self.dump();
        let node = NODES[self.rng.below(3) as usize];
        let now = self.now;
        let _ = self.machines().handle_heartbeat(
            signed(node),
            now / 1000,
            b"{\"schema\":\"nope\"}",
            now,
        );
        let _ =
            self.machines()
                .put_document(DocKind::Policy, b"{\"schema\":1}", Some("\"1\""), now);
        let _ = self
            .machines()
            .put_document(DocKind::Nodes, b"[]", None, now);
        self.unknown_key_ops();
        // An unsigned webhook never reaches the engine: the Worker's check refuses it.
        let body = br#"{"data":{"id":"forged","event_type":"call.initiated","payload":{"call_session_id":"x"}}}"#;
        assert!(self.keys.forged_is_refused(body, self.now));
        let after = self.dump();
        self.obs.push(Observation::InvalidInput { before, after });
    }

    /// Node ops under a key id (or node) the registry does not have, aimed
    /// where the right key would change state: a fence of a live call at its
    /// epoch, a claim, a fresh beat, a media check.
    fn unknown_key_ops(&mut self) {
        let node = NODES[self.rng.below(3) as usize];
        let caller = if self.rng.chance(50) {
            Caller { node, kid: "k9" }
        } else {
            Caller {
                node: "M9",
                kid: "k1",
            }
        };
        let call = 1 + self.rng.below(self.calls.max(1));
        let session = format!("sess-{call}");
        let epoch = self.session_epoch(&session).unwrap_or(1);
        let fence = FenceRequest {
            call_session_id: session.clone(),
            call_control_id: format!("v3:leg-{call}"),
            epoch,
            purpose: callfence_core::wire::FencePurpose::Answer,
        };
        let claim = ClaimRequest {
            call_control_id: format!("v3:out-{}", self.steps),
            call_session_id: format!("out-{}", self.steps),
        };
        let beat =
            json!({"schema": HEARTBEAT_SCHEMA, "node": caller.node, "seq": self.now}).to_string();
        let (keys, now) = (&self.keys.media_keys, self.now);
        let e = self.machines.as_mut().expect("machines");
        let refused = [
            (
                "fence",
                e.on_shard(now, |s| s.handle_fence(caller, &fence, keys, now))
                    .expect("fence")
                    == FenceReply::UnknownNodeKey,
            ),
            (
                "claim",
                e.on_shard(now, |s| s.handle_claim(caller, &claim, now))
                    .expect("claim")
                    == ClaimReply::NotRegistered,
            ),
            (
                "heartbeat",
                matches!(
                    e.handle_heartbeat(caller, now / 1000, beat.as_bytes(), now),
                    Err(HeartbeatRefusal::UnknownNode)
                ),
            ),
            (
                "media_verify",
                e.on_shard(now, |s| s.handle_media_verify(caller, "t", keys, now))
                    .expect("media")
                    == MediaReply::UnknownNodeKey,
            ),
        ];
        for (op, refused) in refused {
            self.unknown_keys += u64::from(refused);
            self.obs.push(Observation::UnknownKey { op, refused });
        }
    }

    // ---- observation ---------------------------------------------------------

    fn session_epoch(&self, session: &str) -> Option<u64> {
        let rows = self
            .engine()
            .store()
            .exec(
                "SELECT epoch FROM sessions WHERE call_session_id = ?",
                &[session.into()],
            )
            .expect("query");
        rows.first().and_then(|r| r[0].as_int()).map(|e| e as u64)
    }

    fn dump(&self) -> String {
        observe::dump(self.engine().store())
    }

    fn snapshot(&self) -> Snapshot {
        observe::snapshot(self.engine().store())
    }

    fn collect_decisions(&mut self) {
        let nodes = &self.nodes;
        let now = self.now;
        let (evidence, last) =
            observe::new_assignments(self.engine().store(), self.last_decision, |node, at| {
                // The beat in force when the decision was made.
                let at = if at == 0 { now } else { at };
                nodes
                    .iter()
                    .find(|n| n.id == node)
                    .and_then(|n| n.beats.iter().rev().find(|(acked, _, _)| *acked <= at))
                    .is_some_and(|(_, sent, eligible)| *eligible && at - sent <= 17_000)
            });
        self.last_decision = last;
        self.obs
            .extend(evidence.into_iter().map(Observation::Assignment));
    }
}
