//! The invariant checker shared by the simulation and the model check: fed
//! observations and snapshots of the Dispatcher's tables after every step,
//! it reports each broken invariant. It knows nothing of the engine's
//! internals; each invariant has a test below that hands it a broken history
//! and shows it is reported.
//!
//! What it remembers across steps beyond the last snapshot (grants and
//! deliveries it was told of, ambiguous epochs, recorded answers, the highest
//! epoch) is its history; [`Checker::hash_history`] feeds it to the model
//! check's state hash.

use callfence_core::engine::{MAX_HOPS, MIN_REFORWARD_BUDGET_MS};
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};

/// One session's ownership as stored.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ownership {
    pub owner: Option<String>,
    pub epoch: Option<u64>,
    pub fence: Option<(String, u64)>,
    pub open: bool,
    /// Every leg hung up (state `ended`).
    pub ended: bool,
    pub created_at_ms: i64,
    /// The session's stored legs and ledger events.
    pub legs: u32,
    pub events: u32,
}

impl Ownership {
    /// Live (SPEC §9): open, or fenced and not ended. Never pruned.
    pub fn live(&self) -> bool {
        self.open || (self.fence.is_some() && !self.ended)
    }
}

/// The stored state the checker looks at after a step.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub sessions: BTreeMap<String, Ownership>,
    /// Events in state `delivered`, with their session.
    pub delivered: BTreeMap<String, Option<String>>,
    /// Document revisions by kind.
    pub revisions: BTreeMap<String, u64>,
    /// Last beat validity per node (valid-until, ms).
    pub beat_valid_until: BTreeMap<String, i64>,
    /// The Dispatcher's maintained open-call count per node (`node_load`).
    pub node_load: BTreeMap<String, i64>,
}

/// A decision as the checker needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssignmentEvidence {
    pub node: String,
    pub rule_claim: bool,
    pub policy_revision: Option<u64>,
    pub nodes_revision: Option<u64>,
    pub chosen_sha: Option<String>,
    pub chosen_clean: Option<bool>,
    /// What the simulated node itself last reported: active, clean, ready.
    pub node_truly_eligible: bool,
}

/// Something the simulation saw happen in a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observation {
    /// The engine asked for a forward of this event.
    Forwarded { event_id: String },
    /// A delivery (numbered by the simulation) had this attempt of an event
    /// sent to its origin.
    Sent {
        delivery: u64,
        event_id: String,
        epoch: u64,
        attempt: u32,
    },
    /// The engine answered that this event is delivered (`node/epoch`): the
    /// carrier got its 200. The first answer is the recorded one.
    Delivered { event_id: String, answer: String },
    /// A duplicate got a delivered answer (`node/epoch`).
    DuplicateAnswered { event_id: String, answer: String },
    /// A node was granted a session's answer fence.
    FenceGranted {
        session: String,
        node: String,
        epoch: u64,
    },
    /// An outcome was reported as ambiguous for this session and epoch.
    Ambiguous { session: String, epoch: u64 },
    /// A report under a superseded epoch: the state before and after.
    StaleReport { before: String, after: String },
    /// Invalid or unsigned input: the whole store before and after.
    InvalidInput { before: String, after: String },
    /// A compare-and-set with a stale revision: the store before and after.
    StaleWrite { before: String, after: String },
    /// A new assignment decision.
    Assignment(AssignmentEvidence),
    /// After a step: when the engine says its alarm is next due, and when
    /// the stored work (read by a full scan of the tables) is next due.
    AlarmDue {
        engine: Option<i64>,
        truth: Option<i64>,
    },
    /// A definite non-delivery moved the session; `forwarded` is whether
    /// the engine handed back a forward to the new owner at once, after
    /// `hop` forwards with `budget_left_ms` of the carrier's budget left.
    Reassigned {
        hop: u32,
        budget_left_ms: i64,
        forwarded: bool,
    },
    /// A node op signed with a key id (or node) not in the registry:
    /// whether the engine refused it `unknown_node_key`.
    UnknownKey { op: &'static str, refused: bool },
    /// The alarm ran at this time with this sweep slack.
    AlarmRan {
        now_ms: i64,
        node_lost_after_ms: i64,
        max_duration_ms: i64,
        slack_ms: i64,
    },
}

/// A broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    SecondFence(String),
    FenceNotToCurrentOwner(String),
    MovedAfterAmbiguous(String),
    StaleReportChangedState,
    EpochNotIncreasing(String),
    MovedAfterFence(String),
    ForwardedAfterDelivery(String),
    DuplicateAnswerDiffers(String),
    InvalidInputChangedState,
    IneligibleChosen(String),
    AssignmentWithoutEvidence(String),
    RevisionDecreased(String),
    StaleWriteChangedState,
    OpenAfterOwnerLoss(String),
    OpenAfterMaxDuration(String),
    OpenCallCountDrift(String),
    AlarmDueWrong {
        engine: Option<i64>,
        truth: Option<i64>,
    },
    ReforwardRuleBroken {
        hop: u32,
        budget_left_ms: i64,
    },
    UnknownKeyAccepted(&'static str),
    /// A live session, or a leg or event of one, was deleted.
    LivePruned(String),
    /// One delivery sent an attempt of an event (its epoch and attempt
    /// number) twice: a retry the engine did not start, after an outcome
    /// that may have been delivered.
    AttemptResent(String),
}

impl Violation {
    /// The variant's name, without its argument (what a planted bug's test
    /// looks for).
    pub fn kind(&self) -> &'static str {
        match self {
            Violation::SecondFence(_) => "SecondFence",
            Violation::FenceNotToCurrentOwner(_) => "FenceNotToCurrentOwner",
            Violation::MovedAfterAmbiguous(_) => "MovedAfterAmbiguous",
            Violation::StaleReportChangedState => "StaleReportChangedState",
            Violation::EpochNotIncreasing(_) => "EpochNotIncreasing",
            Violation::MovedAfterFence(_) => "MovedAfterFence",
            Violation::ForwardedAfterDelivery(_) => "ForwardedAfterDelivery",
            Violation::DuplicateAnswerDiffers(_) => "DuplicateAnswerDiffers",
            Violation::InvalidInputChangedState => "InvalidInputChangedState",
            Violation::IneligibleChosen(_) => "IneligibleChosen",
            Violation::AssignmentWithoutEvidence(_) => "AssignmentWithoutEvidence",
            Violation::RevisionDecreased(_) => "RevisionDecreased",
            Violation::StaleWriteChangedState => "StaleWriteChangedState",
            Violation::OpenAfterOwnerLoss(_) => "OpenAfterOwnerLoss",
            Violation::OpenAfterMaxDuration(_) => "OpenAfterMaxDuration",
            Violation::OpenCallCountDrift(_) => "OpenCallCountDrift",
            Violation::AlarmDueWrong { .. } => "AlarmDueWrong",
            Violation::ReforwardRuleBroken { .. } => "ReforwardRuleBroken",
            Violation::UnknownKeyAccepted(_) => "UnknownKeyAccepted",
            Violation::LivePruned(_) => "LivePruned",
            Violation::AttemptResent(_) => "AttemptResent",
        }
    }
}

/// The checker's memory across steps.
#[derive(Default, Clone)]
pub struct Checker {
    /// Shared, so that cloning a checker (the model check does, per
    /// explored action) does not copy it.
    last: std::rc::Rc<Snapshot>,
    max_epoch: u64,
    ambiguous: BTreeSet<(String, u64)>,
    /// Fences the engine granted, as the nodes were told.
    granted: BTreeMap<String, (String, u64)>,
    /// Events the carrier was told are delivered, with the first answer.
    answered: BTreeMap<String, String>,
    /// Every attempt sent: (delivery, event, epoch, attempt).
    sent: BTreeSet<(u64, String, u64, u32)>,
    pub violations: Vec<Violation>,
}

impl Checker {
    /// Checks one step: what was observed, then the state after it.
    pub fn step(&mut self, observations: &[Observation], after: Snapshot) {
        for obs in observations {
            self.observe(obs, &after);
        }
        self.compare(&after);
        self.last = std::rc::Rc::new(after);
    }

    /// The snapshot of the last step.
    pub fn last(&self) -> &Snapshot {
        &self.last
    }

    /// Feeds everything the checker remembers besides the last snapshot
    /// (which the model check hashes from the tables themselves).
    pub fn hash_history(&self, state: &mut impl Hasher) {
        self.max_epoch.hash(state);
        self.ambiguous.hash(state);
        self.granted.hash(state);
        self.answered.hash(state);
        self.sent.hash(state);
    }

    fn observe(&mut self, obs: &Observation, after: &Snapshot) {
        match obs {
            Observation::Forwarded { event_id } => {
                if self.last.delivered.contains_key(event_id)
                    || self.answered.contains_key(event_id)
                {
                    self.violations
                        .push(Violation::ForwardedAfterDelivery(event_id.clone()));
                }
            }
            Observation::Sent {
                delivery,
                event_id,
                epoch,
                attempt,
            } => {
                if !self
                    .sent
                    .insert((*delivery, event_id.clone(), *epoch, *attempt))
                {
                    self.violations
                        .push(Violation::AttemptResent(event_id.clone()));
                }
            }
            Observation::Delivered { event_id, answer } => {
                self.answered
                    .entry(event_id.clone())
                    .or_insert_with(|| answer.clone());
            }
            Observation::DuplicateAnswered { event_id, answer } => {
                if self.answered.get(event_id) != Some(answer) {
                    self.violations
                        .push(Violation::DuplicateAnswerDiffers(event_id.clone()));
                }
            }
            Observation::FenceGranted {
                session,
                node,
                epoch,
            } => {
                let grant = (node.clone(), *epoch);
                match self.granted.get(session) {
                    Some(first) if *first != grant => {
                        self.violations
                            .push(Violation::SecondFence(session.clone()));
                    }
                    Some(_) => {}
                    None => {
                        // A grant changes no ownership, so the state after
                        // the step names the owner it was granted under.
                        let owner = after.sessions.get(session);
                        let owner_then = owner.and_then(|o| o.owner.clone().zip(o.epoch));
                        if owner_then != Some(grant.clone()) {
                            self.violations
                                .push(Violation::FenceNotToCurrentOwner(session.clone()));
                        }
                        self.granted.insert(session.clone(), grant);
                    }
                }
            }
            Observation::Ambiguous { session, epoch } => {
                self.ambiguous.insert((session.clone(), *epoch));
            }
            Observation::StaleReport { before, after } => {
                if before != after {
                    self.violations.push(Violation::StaleReportChangedState);
                }
            }
            Observation::InvalidInput { before, after } => {
                if before != after {
                    self.violations.push(Violation::InvalidInputChangedState);
                }
            }
            Observation::StaleWrite { before, after } => {
                if before != after {
                    self.violations.push(Violation::StaleWriteChangedState);
                }
            }
            Observation::Assignment(e) => {
                if !e.rule_claim && !e.node_truly_eligible {
                    self.violations
                        .push(Violation::IneligibleChosen(e.node.clone()));
                }
                let sha_ok = e
                    .chosen_sha
                    .as_deref()
                    .is_some_and(|s| s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit()));
                let cited = e.policy_revision.is_some() && e.nodes_revision.is_some();
                if !e.rule_claim && (!cited || !sha_ok || e.chosen_clean != Some(true)) {
                    self.violations
                        .push(Violation::AssignmentWithoutEvidence(e.node.clone()));
                }
            }
            Observation::AlarmDue { engine, truth } => {
                if engine != truth {
                    self.violations.push(Violation::AlarmDueWrong {
                        engine: *engine,
                        truth: *truth,
                    });
                }
            }
            Observation::Reassigned {
                hop,
                budget_left_ms,
                forwarded,
            } => {
                let allowed = *hop < MAX_HOPS && *budget_left_ms >= MIN_REFORWARD_BUDGET_MS;
                if *forwarded != allowed {
                    self.violations.push(Violation::ReforwardRuleBroken {
                        hop: *hop,
                        budget_left_ms: *budget_left_ms,
                    });
                }
            }
            Observation::UnknownKey { op, refused } => {
                if !refused {
                    self.violations.push(Violation::UnknownKeyAccepted(op));
                }
            }
            Observation::AlarmRan {
                now_ms,
                node_lost_after_ms,
                max_duration_ms,
                slack_ms,
            } => {
                for (id, s) in &after.sessions {
                    if !s.open {
                        continue;
                    }
                    if now_ms - s.created_at_ms > max_duration_ms + slack_ms {
                        self.violations
                            .push(Violation::OpenAfterMaxDuration(id.clone()));
                    }
                    let valid_until = s
                        .owner
                        .as_ref()
                        .and_then(|o| after.beat_valid_until.get(o))
                        .copied()
                        .unwrap_or(i64::MIN / 2);
                    if now_ms - valid_until > node_lost_after_ms + slack_ms {
                        self.violations
                            .push(Violation::OpenAfterOwnerLoss(id.clone()));
                    }
                }
            }
        }
    }

    fn compare(&mut self, after: &Snapshot) {
        // Nothing live, nor its legs or events, is ever pruned.
        for (id, before) in &self.last.sessions {
            let now = after.sessions.get(id);
            if before.live() {
                let kept =
                    now.is_some_and(|now| now.legs >= before.legs && now.events >= before.events);
                if !kept {
                    self.violations.push(Violation::LivePruned(id.clone()));
                }
            } else if now.is_none() {
                // Pruned when settled: a later event of that id is a new
                // session, whose history starts afresh.
                self.granted.remove(id);
                self.ambiguous.retain(|(s, _)| s != id);
            }
        }
        // A delivered event pruned with its settled session: a late
        // duplicate of it is a new event (SPEC §9's retention).
        for (event, session) in &self.last.delivered {
            let settled = session
                .as_ref()
                .is_none_or(|s| !after.sessions.get(s).is_some_and(Ownership::live));
            if settled && !after.delivered.contains_key(event) {
                self.answered.remove(event);
            }
        }
        // The maintained per-node count equals the count of open sessions.
        let mut counted: BTreeMap<&str, i64> = BTreeMap::new();
        for s in after.sessions.values().filter(|s| s.open) {
            if let Some(owner) = &s.owner {
                *counted.entry(owner).or_default() += 1;
            }
        }
        let nodes: BTreeSet<&str> = counted
            .keys()
            .copied()
            .chain(after.node_load.keys().map(String::as_str))
            .collect();
        for node in nodes {
            let kept = after.node_load.get(node).copied().unwrap_or(0);
            if kept != counted.get(node).copied().unwrap_or(0) {
                self.violations
                    .push(Violation::OpenCallCountDrift(node.to_owned()));
            }
        }
        for (kind, rev) in &after.revisions {
            if self.last.revisions.get(kind).is_some_and(|old| rev < old) {
                self.violations
                    .push(Violation::RevisionDecreased(kind.clone()));
            }
        }
        let mut new_epochs = Vec::new();
        for (id, now) in &after.sessions {
            let before = self.last.sessions.get(id);
            let before_epoch = before.and_then(|b| b.epoch);
            let granted = self.granted.get(id);
            if granted.is_some_and(|(node, epoch)| {
                now.owner.as_deref() != Some(node.as_str()) || now.epoch != Some(*epoch)
            }) {
                self.violations.push(Violation::MovedAfterFence(id.clone()));
            }
            // A new owner always comes with a new epoch.
            if now.owner.is_some()
                && before.is_some_and(|b| b.owner != now.owner && b.epoch == now.epoch)
            {
                self.violations
                    .push(Violation::EpochNotIncreasing(id.clone()));
            }
            if now.epoch != before_epoch {
                if let Some(epoch) = now.epoch {
                    new_epochs.push((id.clone(), epoch));
                }
                if let Some(b) = before {
                    if b.fence.is_some() {
                        self.violations.push(Violation::MovedAfterFence(id.clone()));
                    }
                    if let Some(e) = b.epoch {
                        if self.ambiguous.contains(&(id.clone(), e)) {
                            self.violations
                                .push(Violation::MovedAfterAmbiguous(id.clone()));
                        }
                    }
                }
            } else if before.is_some_and(|b| b.fence.is_some() && b.owner != now.owner) {
                self.violations.push(Violation::MovedAfterFence(id.clone()));
            }
            let before_fence = before.and_then(|b| b.fence.clone());
            match (&before_fence, &now.fence) {
                (Some(old), Some(new)) if old != new => {
                    self.violations.push(Violation::SecondFence(id.clone()));
                }
                (Some(_), None) => self.violations.push(Violation::SecondFence(id.clone())),
                // Ownership cannot change once fenced (checked above), so the
                // fence must match the owner and epoch stored with it.
                (None, Some((node, epoch)))
                    if now.owner.as_deref() != Some(node.as_str()) || now.epoch != Some(*epoch) =>
                {
                    self.violations
                        .push(Violation::FenceNotToCurrentOwner(id.clone()));
                }
                _ => {}
            }
        }
        new_epochs.sort_by_key(|(_, e)| *e);
        for (id, epoch) in new_epochs {
            if epoch <= self.max_epoch {
                self.violations.push(Violation::EpochNotIncreasing(id));
            } else {
                self.max_epoch = epoch;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(owner: &str, epoch: u64, fence: bool) -> Ownership {
        Ownership {
            owner: Some(owner.into()),
            epoch: Some(epoch),
            fence: fence.then(|| (owner.to_string(), epoch)),
            open: true,
            ended: false,
            created_at_ms: 0,
            legs: 1,
            events: 1,
        }
    }

    /// A snapshot of these sessions whose maintained counts are right.
    fn snap(sessions: &[(&str, Ownership)]) -> Snapshot {
        let mut node_load = BTreeMap::new();
        for (_, s) in sessions.iter().filter(|(_, s)| s.open) {
            if let Some(owner) = &s.owner {
                *node_load.entry(owner.clone()).or_default() += 1;
            }
        }
        Snapshot {
            sessions: sessions
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            node_load,
            ..Snapshot::default()
        }
    }

    fn run(steps: Vec<(Vec<Observation>, Snapshot)>) -> Vec<Violation> {
        let mut c = Checker::default();
        for (obs, s) in steps {
            c.step(&obs, s);
        }
        c.violations
    }

    #[test]
    fn a_second_fence_is_reported() {
        let v = run(vec![
            (vec![], snap(&[("s", owned("M1", 1, false))])),
            (vec![], snap(&[("s", owned("M1", 1, true))])),
            (
                vec![],
                snap(&[(
                    "s",
                    Ownership {
                        fence: Some(("M2".into(), 1)),
                        ..owned("M1", 1, false)
                    },
                )]),
            ),
        ]);
        assert!(v.contains(&Violation::SecondFence("s".into())), "{v:?}");
    }

    #[test]
    fn a_fence_to_a_non_owner_is_reported() {
        let v = run(vec![
            (vec![], snap(&[("s", owned("M1", 1, false))])),
            (
                vec![],
                snap(&[(
                    "s",
                    Ownership {
                        fence: Some(("M2".into(), 1)),
                        ..owned("M1", 1, false)
                    },
                )]),
            ),
        ]);
        assert!(
            v.contains(&Violation::FenceNotToCurrentOwner("s".into())),
            "{v:?}"
        );
    }

    #[test]
    fn a_move_after_an_ambiguous_outcome_is_reported() {
        let v = run(vec![
            (vec![], snap(&[("s", owned("M1", 1, false))])),
            (
                vec![Observation::Ambiguous {
                    session: "s".into(),
                    epoch: 1,
                }],
                snap(&[("s", owned("M2", 2, false))]),
            ),
        ]);
        assert!(
            v.contains(&Violation::MovedAfterAmbiguous("s".into())),
            "{v:?}"
        );
    }

    #[test]
    fn a_stale_report_that_changes_state_is_reported() {
        let v = run(vec![(
            vec![Observation::StaleReport {
                before: "a".into(),
                after: "b".into(),
            }],
            Snapshot::default(),
        )]);
        assert_eq!(v, vec![Violation::StaleReportChangedState]);
    }

    #[test]
    fn a_non_increasing_epoch_is_reported() {
        let v = run(vec![
            (vec![], snap(&[("a", owned("M1", 5, false))])),
            (
                vec![],
                snap(&[("a", owned("M1", 5, false)), ("b", owned("M2", 5, false))]),
            ),
        ]);
        assert!(
            v.contains(&Violation::EpochNotIncreasing("b".into())),
            "{v:?}"
        );
    }

    #[test]
    fn a_move_after_a_fence_is_reported() {
        let v = run(vec![
            (vec![], snap(&[("s", owned("M1", 1, false))])),
            (vec![], snap(&[("s", owned("M1", 1, true))])),
            (
                vec![],
                snap(&[(
                    "s",
                    Ownership {
                        owner: Some("M2".into()),
                        ..owned("M1", 1, true)
                    },
                )]),
            ),
        ]);
        assert!(v.contains(&Violation::MovedAfterFence("s".into())), "{v:?}");
    }

    #[test]
    fn a_forward_after_delivery_is_reported() {
        let mut delivered = Snapshot::default();
        delivered.delivered.insert("e".into(), None);
        let v = run(vec![
            (vec![], delivered.clone()),
            (
                vec![Observation::Forwarded {
                    event_id: "e".into(),
                }],
                delivered,
            ),
        ]);
        assert_eq!(v, vec![Violation::ForwardedAfterDelivery("e".into())]);
    }

    #[test]
    fn an_attempt_sent_twice_by_one_delivery_is_reported_and_a_new_attempt_is_not() {
        let sent = |attempt| Observation::Sent {
            delivery: 1,
            event_id: "e".into(),
            epoch: 1,
            attempt,
        };
        let v = run(vec![(vec![sent(1), sent(2)], Snapshot::default())]);
        assert!(v.is_empty(), "{v:?}");
        let v = run(vec![
            (vec![sent(1)], Snapshot::default()),
            (vec![sent(1)], Snapshot::default()),
        ]);
        assert_eq!(v, vec![Violation::AttemptResent("e".into())]);
    }

    #[test]
    fn a_duplicate_with_another_answer_is_reported() {
        let answer = |a: &str| Observation::Delivered {
            event_id: "e".into(),
            answer: a.into(),
        };
        let duplicate = |a: &str| Observation::DuplicateAnswered {
            event_id: "e".into(),
            answer: a.into(),
        };
        let v = run(vec![
            (vec![answer("M1/1"), duplicate("M1/1")], Snapshot::default()),
            (vec![answer("M2/2")], Snapshot::default()),
            (vec![duplicate("M2/2")], Snapshot::default()),
        ]);
        assert_eq!(v, vec![Violation::DuplicateAnswerDiffers("e".into())]);
    }

    #[test]
    fn a_forward_after_a_delivered_answer_is_reported() {
        let v = run(vec![
            (
                vec![Observation::Delivered {
                    event_id: "e".into(),
                    answer: "M1/1".into(),
                }],
                Snapshot::default(),
            ),
            (
                vec![Observation::Forwarded {
                    event_id: "e".into(),
                }],
                Snapshot::default(),
            ),
        ]);
        assert_eq!(v, vec![Violation::ForwardedAfterDelivery("e".into())]);
    }

    fn grant(node: &str, epoch: u64) -> Observation {
        Observation::FenceGranted {
            session: "s".into(),
            node: node.into(),
            epoch,
        }
    }

    #[test]
    fn grants_the_store_forgot_are_still_checked() {
        // The stored fence never appears: the grants the nodes were told of
        // are what counts.
        let s1 = snap(&[("s", owned("M1", 1, false))]);
        let s2 = snap(&[("s", owned("M2", 2, false))]);
        let v = run(vec![
            (vec![], s1.clone()),
            (vec![grant("M1", 1), grant("M1", 1)], s1),
            (vec![], s2.clone()),
            (vec![grant("M2", 2)], s2),
        ]);
        assert!(v.contains(&Violation::MovedAfterFence("s".into())), "{v:?}");
        assert!(v.contains(&Violation::SecondFence("s".into())), "{v:?}");
        let v = run(vec![(
            vec![grant("M2", 1)],
            snap(&[("s", owned("M1", 1, false))]),
        )]);
        assert!(
            v.contains(&Violation::FenceNotToCurrentOwner("s".into())),
            "{v:?}"
        );
    }

    #[test]
    fn a_new_owner_under_the_old_epoch_is_reported() {
        let v = run(vec![
            (vec![], snap(&[("s", owned("M1", 1, false))])),
            (vec![], snap(&[("s", owned("M2", 1, false))])),
        ]);
        assert_eq!(v, vec![Violation::EpochNotIncreasing("s".into())]);
    }

    #[test]
    fn invalid_input_that_changes_state_is_reported() {
        let v = run(vec![(
            vec![Observation::InvalidInput {
                before: "x".into(),
                after: "y".into(),
            }],
            Snapshot::default(),
        )]);
        assert_eq!(v, vec![Violation::InvalidInputChangedState]);
    }

    fn evidence(eligible: bool, clean: Option<bool>) -> AssignmentEvidence {
        AssignmentEvidence {
            node: "M3".into(),
            rule_claim: false,
            policy_revision: Some(1),
            nodes_revision: Some(1),
            chosen_sha: Some("a".repeat(40)),
            chosen_clean: clean,
            node_truly_eligible: eligible,
        }
    }

    #[test]
    fn an_ineligible_choice_is_reported() {
        let v = run(vec![(
            vec![Observation::Assignment(evidence(false, Some(true)))],
            Snapshot::default(),
        )]);
        assert_eq!(v, vec![Violation::IneligibleChosen("M3".into())]);
    }

    #[test]
    fn an_assignment_without_evidence_is_reported() {
        let v = run(vec![(
            vec![Observation::Assignment(evidence(true, Some(false)))],
            Snapshot::default(),
        )]);
        assert_eq!(v, vec![Violation::AssignmentWithoutEvidence("M3".into())]);
        let mut no_rev = evidence(true, Some(true));
        no_rev.policy_revision = None;
        let v = run(vec![(
            vec![Observation::Assignment(no_rev)],
            Snapshot::default(),
        )]);
        assert_eq!(v, vec![Violation::AssignmentWithoutEvidence("M3".into())]);
    }

    #[test]
    fn a_decreasing_revision_and_a_stale_write_are_reported() {
        let mut a = Snapshot::default();
        a.revisions.insert("policy".into(), 3);
        let mut b = Snapshot::default();
        b.revisions.insert("policy".into(), 2);
        let v = run(vec![
            (vec![], a),
            (
                vec![Observation::StaleWrite {
                    before: "1".into(),
                    after: "2".into(),
                }],
                b,
            ),
        ]);
        assert!(
            v.contains(&Violation::RevisionDecreased("policy".into())),
            "{v:?}"
        );
        assert!(v.contains(&Violation::StaleWriteChangedState), "{v:?}");
    }

    #[test]
    fn an_open_call_count_that_drifted_from_the_sessions_is_reported() {
        let mut s = snap(&[("a", owned("M1", 1, false)), ("b", owned("M1", 2, false))]);
        s.node_load.insert("M1".into(), 2);
        assert_eq!(run(vec![(vec![], s.clone())]), vec![]);
        s.node_load.insert("M1".into(), 1);
        s.node_load.insert("M2".into(), 1);
        let v = run(vec![(vec![], s)]);
        assert_eq!(
            v,
            vec![
                Violation::OpenCallCountDrift("M1".into()),
                Violation::OpenCallCountDrift("M2".into())
            ]
        );
    }

    #[test]
    fn a_late_or_missing_alarm_is_reported() {
        let due = |engine, truth| {
            run(vec![(
                vec![Observation::AlarmDue { engine, truth }],
                Snapshot::default(),
            )])
        };
        assert!(due(Some(5), Some(5)).is_empty());
        for (engine, truth) in [(Some(9), Some(5)), (None, Some(5)), (Some(5), None)] {
            assert_eq!(
                due(engine, truth),
                vec![Violation::AlarmDueWrong { engine, truth }]
            );
        }
    }

    #[test]
    fn a_reforward_beyond_the_hop_limit_or_budget_and_a_missed_one_are_reported() {
        let moved = |hop, budget_left_ms, forwarded| {
            run(vec![(
                vec![Observation::Reassigned {
                    hop,
                    budget_left_ms,
                    forwarded,
                }],
                Snapshot::default(),
            )])
        };
        assert!(moved(1, 1_000, true).is_empty());
        assert!(moved(MAX_HOPS, 1_000, false).is_empty());
        for (hop, budget, forwarded) in [
            (MAX_HOPS, 1_000, true),
            (1, MIN_REFORWARD_BUDGET_MS - 1, true),
            (1, 1_000, false),
        ] {
            assert_eq!(
                moved(hop, budget, forwarded),
                vec![Violation::ReforwardRuleBroken {
                    hop,
                    budget_left_ms: budget
                }]
            );
        }
    }

    #[test]
    fn a_node_op_accepted_under_an_unknown_key_is_reported() {
        let v = run(vec![(
            vec![
                Observation::UnknownKey {
                    op: "fence",
                    refused: true,
                },
                Observation::UnknownKey {
                    op: "claim",
                    refused: false,
                },
            ],
            Snapshot::default(),
        )]);
        assert_eq!(v, vec![Violation::UnknownKeyAccepted("claim")]);
    }

    #[test]
    fn a_pruned_live_session_or_a_pruned_row_of_one_is_reported() {
        let settled = |s: Ownership| Ownership { open: false, ..s };
        // A settled, unfenced session may go; an ended fenced one too.
        let ended = Ownership {
            ended: true,
            ..settled(owned("M1", 2, true))
        };
        let v = run(vec![
            (
                vec![],
                snap(&[("a", settled(owned("M1", 1, false))), ("b", ended)]),
            ),
            (vec![], snap(&[])),
        ]);
        assert_eq!(v, vec![]);
        // An open one, or a fenced one settled node_lost, may not.
        for live in [owned("M1", 1, false), settled(owned("M1", 1, true))] {
            let v = run(vec![(vec![], snap(&[("s", live)])), (vec![], snap(&[]))]);
            assert_eq!(v, vec![Violation::LivePruned("s".into())]);
        }
        // Nor its legs or ledger events.
        let v = run(vec![
            (vec![], snap(&[("s", owned("M1", 1, true))])),
            (
                vec![],
                snap(&[(
                    "s",
                    Ownership {
                        events: 0,
                        ..owned("M1", 1, true)
                    },
                )]),
            ),
        ]);
        assert_eq!(v, vec![Violation::LivePruned("s".into())]);
    }

    #[test]
    fn open_calls_after_owner_loss_or_max_duration_are_reported() {
        let mut s = snap(&[("s", owned("M1", 1, false))]);
        s.beat_valid_until.insert("M1".into(), 0);
        let alarm = Observation::AlarmRan {
            now_ms: 200_000,
            node_lost_after_ms: 120_000,
            max_duration_ms: 100_000,
            slack_ms: 1_000,
        };
        let v = run(vec![(vec![alarm], s)]);
        assert!(
            v.contains(&Violation::OpenAfterOwnerLoss("s".into())),
            "{v:?}"
        );
        assert!(
            v.contains(&Violation::OpenAfterMaxDuration("s".into())),
            "{v:?}"
        );
    }
}
