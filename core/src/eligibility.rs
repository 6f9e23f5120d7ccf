//! Eligibility: every reason a node may not take a new call, in one place.
//!
//! [`check`] answers "why was M3 skipped" for one node and one call. It is
//! pure: the engine gathers the [`NodeFacts`] (registry entry, last accepted
//! beat, open calls, forward health) and passes `now_ms`.

use crate::heartbeat::{Heartbeat, Mode};
use crate::registry::{NodeEntry, Role};
use serde::{Deserialize, Serialize};

/// A heartbeat is stale `valid_for_s` after the earlier of its receipt and
/// its signed timestamp plus this grace.
pub const SIGNED_TIME_GRACE_MS: i64 = 2_000;
/// A beat whose signed timestamp is further than this from the edge's clock
/// at receipt makes the node ineligible.
pub const MAX_BEAT_SKEW_MS: i64 = 10_000;
/// A failed forward keeps the node out of new assignments this long, unless
/// a delivery succeeded since.
pub const FORWARD_FAILURE_WINDOW_MS: i64 = 30_000;

/// Why a node cannot take a new call. The serialised names are the stable
/// reason codes of the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Reason {
    /// The node is not in the registry.
    NotRegistered,
    /// The registry drains it.
    AdminDrained,
    /// No beat has been accepted yet.
    NoHeartbeat,
    /// The last beat is past its validity.
    HeartbeatStale,
    /// The beat's signed time was more than 10 s from the edge's clock.
    ClockSkew,
    /// The node's own mode is `shadow`.
    ModeShadow,
    /// The node's own mode is `drained`.
    ModeDrained,
    /// The runtime checkout has changes.
    Dirty,
    /// The SHA is not 40 lowercase hex digits.
    ShaInvalid,
    /// The registry lists `allowed_shas` and this SHA is not among them.
    ShaNotAllowed,
    /// The voice app is not ready.
    AppDown,
    /// Open or reported calls reach the effective `max_calls`.
    CapacityExhausted,
    /// The node's end-to-end origin probe failed.
    TunnelDown,
    /// The beat's `origin_url` differs from the registry's.
    OriginMismatch,
    /// The call's line is not among the lines the node serves.
    LineNotServed,
    /// The node serves the line with another called number.
    RoutingHashMismatch,
    /// A forward to the node failed within 30 s, with no delivery since.
    RecentForwardFailure,
    /// A candidate named as preferred without `canary_go`.
    CanaryNotGo,
    /// A candidate reached as a fallback without `fallback_approved`.
    CandidateNotApproved,
}

impl Reason {
    /// The stable reason code.
    pub fn code(self) -> &'static str {
        match self {
            Reason::NotRegistered => "not_registered",
            Reason::AdminDrained => "admin_drained",
            Reason::NoHeartbeat => "no_heartbeat",
            Reason::HeartbeatStale => "heartbeat_stale",
            Reason::ClockSkew => "clock_skew",
            Reason::ModeShadow => "mode_shadow",
            Reason::ModeDrained => "mode_drained",
            Reason::Dirty => "dirty",
            Reason::ShaInvalid => "sha_invalid",
            Reason::ShaNotAllowed => "sha_not_allowed",
            Reason::AppDown => "app_down",
            Reason::CapacityExhausted => "capacity_exhausted",
            Reason::TunnelDown => "tunnel_down",
            Reason::OriginMismatch => "origin_mismatch",
            Reason::LineNotServed => "line_not_served",
            Reason::RoutingHashMismatch => "routing_hash_mismatch",
            Reason::RecentForwardFailure => "recent_forward_failure",
            Reason::CanaryNotGo => "canary_not_go",
            Reason::CandidateNotApproved => "candidate_not_approved",
        }
    }
}

/// The last accepted heartbeat of a node with the times the edge saw it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Beat {
    /// The beat document.
    pub heartbeat: Heartbeat,
    /// When the Dispatcher accepted it.
    pub received_at_ms: i64,
    /// Its `Callfence-Timestamp`, in milliseconds.
    pub signed_at_ms: i64,
}

impl Beat {
    /// The instant the beat stops vouching for the node.
    pub fn valid_until_ms(&self) -> i64 {
        self.received_at_ms
            .min(self.signed_at_ms + SIGNED_TIME_GRACE_MS)
            .saturating_add(i64::from(self.heartbeat.valid_for_s) * 1000)
    }

    /// True when the beat is past its validity at `now_ms`.
    pub fn is_stale(&self, now_ms: i64) -> bool {
        now_ms > self.valid_until_ms()
    }
}

/// Everything the Dispatcher knows about one node, for one decision.
#[derive(Debug, Clone, Copy)]
pub struct NodeFacts<'a> {
    /// The registry entry, if the node is registered.
    pub entry: Option<&'a NodeEntry>,
    /// The last accepted beat.
    pub beat: Option<&'a Beat>,
    /// Calls the Dispatcher has assigned to the node that are still open,
    /// not counting the call being decided.
    pub open_calls: u32,
    /// The last failed forward to the node.
    pub last_failure_at_ms: Option<i64>,
    /// The last delivered forward to the node.
    pub last_delivery_at_ms: Option<i64>,
}

impl NodeFacts<'_> {
    /// The `capacity_exhausted` rule: the larger of the calls the beat
    /// reports and the open calls the Dispatcher assigned reaches the
    /// effective `max_calls`. Without a beat no limit is known, and this is
    /// false (eligibility refuses such a node `no_heartbeat`; a claim
    /// refuses it itself). A claim counts against capacity by this same rule.
    pub fn capacity_exhausted(&self) -> bool {
        let reported = self.beat.map_or(0, |b| b.heartbeat.capacity.active_calls);
        effective_max_calls(self.entry, self.beat)
            .is_some_and(|limit| reported.max(self.open_calls) >= limit)
    }
}

/// How a node is being considered for a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Candidacy {
    /// Named as the preferred node by the policy.
    Preferred,
    /// Reached through the fallback order.
    Fallback,
    /// No particular call: the node's general health (heartbeat answers,
    /// status). Candidate rules do not apply.
    General,
}

/// The line a call's `to` matched: line id and the called number the policy
/// gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineRef<'a> {
    /// The line id.
    pub line_id: &'a str,
    /// The policy's called number for it.
    pub called_number: &'a str,
}

/// True when a decision made on `new` is the one it would make on `old`,
/// the beat it replaces: `old` still vouches for the node at `now_ms` and
/// no longer than `new` does, both or neither are skewed, and every other
/// field a rule reads is the same (for the reported calls, whether
/// they reach the limit, with `registry_max` the registry's `max_calls`).
/// A beat that only repeats its node needs no acknowledgement across
/// shards (SPEC §16).
pub fn same_for_decisions(old: &Beat, new: &Beat, registry_max: Option<u32>, now_ms: i64) -> bool {
    let (a, b) = (&old.heartbeat, &new.heartbeat);
    let full = |beat: &Beat| {
        let limit = beat
            .heartbeat
            .capacity
            .max_calls
            .min(registry_max.unwrap_or(u32::MAX));
        beat.heartbeat.capacity.active_calls >= limit
    };
    let skewed = |beat: &Beat| (beat.signed_at_ms - beat.received_at_ms).abs() > MAX_BEAT_SKEW_MS;
    old.valid_until_ms() > now_ms
        && new.valid_until_ms() >= old.valid_until_ms()
        && skewed(old) == skewed(new)
        && a.mode == b.mode
        && a.sha == b.sha
        && a.dirty == b.dirty
        && a.app_ready == b.app_ready
        && a.capacity.max_calls == b.capacity.max_calls
        && full(old) == full(new)
        && a.tunnel_up == b.tunnel_up
        && a.origin_url == b.origin_url
        && a.lines == b.lines
        && a.routing_hash == b.routing_hash
}

/// The effective call limit: the smaller of the beat's and the registry's.
pub fn effective_max_calls(entry: Option<&NodeEntry>, beat: Option<&Beat>) -> Option<u32> {
    let from_beat = beat.map(|b| b.heartbeat.capacity.max_calls);
    match (from_beat, entry.and_then(|e| e.max_calls)) {
        (Some(b), Some(r)) => Some(b.min(r)),
        (Some(b), None) => Some(b),
        (None, _) => None,
    }
}

/// True for exactly 40 lowercase hex digits.
pub fn is_valid_sha(sha: &str) -> bool {
    sha.len() == 40 && sha.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Every reason `facts` keeps the node from taking the call; empty means
/// eligible. Reasons come in the contract's table order.
pub fn check(
    facts: &NodeFacts<'_>,
    candidacy: Candidacy,
    line: Option<LineRef<'_>>,
    now_ms: i64,
) -> Vec<Reason> {
    let Some(entry) = facts.entry else {
        return vec![Reason::NotRegistered];
    };
    let mut reasons = Vec::new();
    if entry.admin_drained {
        reasons.push(Reason::AdminDrained);
    }
    match facts.beat {
        None => reasons.push(Reason::NoHeartbeat),
        Some(beat) => beat_reasons(facts, entry, beat, line, now_ms, &mut reasons),
    }
    if let Some(failed) = facts.last_failure_at_ms {
        let delivered_since = facts.last_delivery_at_ms.is_some_and(|d| d >= failed);
        if now_ms - failed < FORWARD_FAILURE_WINDOW_MS && !delivered_since {
            reasons.push(Reason::RecentForwardFailure);
        }
    }
    if entry.role == Role::Candidate {
        match candidacy {
            Candidacy::Preferred if !entry.canary_go => reasons.push(Reason::CanaryNotGo),
            Candidacy::Fallback if !entry.fallback_approved => {
                reasons.push(Reason::CandidateNotApproved)
            }
            _ => {}
        }
    }
    reasons
}

fn beat_reasons(
    facts: &NodeFacts<'_>,
    entry: &NodeEntry,
    beat: &Beat,
    line: Option<LineRef<'_>>,
    now_ms: i64,
    reasons: &mut Vec<Reason>,
) {
    let hb = &beat.heartbeat;
    if beat.is_stale(now_ms) {
        reasons.push(Reason::HeartbeatStale);
    }
    if (beat.signed_at_ms - beat.received_at_ms).abs() > MAX_BEAT_SKEW_MS {
        reasons.push(Reason::ClockSkew);
    }
    match hb.mode {
        Mode::Active => {}
        Mode::Shadow => reasons.push(Reason::ModeShadow),
        Mode::Drained => reasons.push(Reason::ModeDrained),
    }
    if hb.dirty {
        reasons.push(Reason::Dirty);
    }
    if !is_valid_sha(&hb.sha) {
        reasons.push(Reason::ShaInvalid);
    } else if let Some(allowed) = &entry.allowed_shas {
        if !allowed.iter().any(|s| s == &hb.sha) {
            reasons.push(Reason::ShaNotAllowed);
        }
    }
    if !hb.app_ready {
        reasons.push(Reason::AppDown);
    }
    if facts.capacity_exhausted() {
        reasons.push(Reason::CapacityExhausted);
    }
    if !hb.tunnel_up {
        reasons.push(Reason::TunnelDown);
    }
    if hb.origin_url != entry.origin_url {
        reasons.push(Reason::OriginMismatch);
    }
    if let Some(line) = line {
        match hb.lines.get(line.line_id) {
            None => reasons.push(Reason::LineNotServed),
            Some(applied) if applied != line.called_number => {
                reasons.push(Reason::RoutingHashMismatch)
            }
            Some(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::heartbeat::Capacity;

    const NOW: i64 = 1_796_000_000_000;
    const ORIGIN: &str = "https://m1.example.com/callfence/telnyx";
    const LINE: LineRef<'static> = LineRef {
        line_id: "sales",
        called_number: "+15102160079",
    };

    fn entry(role: Role) -> NodeEntry {
        NodeEntry::bare(role, ORIGIN)
    }

    fn beat() -> Beat {
        Beat {
            heartbeat: Heartbeat {
                schema: crate::heartbeat::HEARTBEAT_SCHEMA.into(),
                node: "M1".into(),
                seq: 1,
                sent_at: String::new(),
                valid_for_s: 15,
                mode: Mode::Active,
                sha: "a".repeat(40),
                dirty: false,
                app_ready: true,
                capacity: Capacity {
                    max_calls: 10,
                    active_calls: 0,
                },
                tunnel_up: true,
                origin_url: ORIGIN.into(),
                lines: [("sales".to_string(), "+15102160079".to_string())].into(),
                routing_hash: String::new(),
                agent_version: "test".into(),
            },
            received_at_ms: NOW,
            signed_at_ms: NOW,
        }
    }

    /// The reasons for a stable node with `entry` and `beat` changed by the
    /// closures, preferred for a call on LINE.
    fn reasons(
        edit_entry: impl FnOnce(&mut NodeEntry),
        edit_beat: impl FnOnce(&mut Beat),
    ) -> Vec<Reason> {
        let mut e = entry(Role::Stable);
        edit_entry(&mut e);
        let mut b = beat();
        edit_beat(&mut b);
        let facts = NodeFacts {
            entry: Some(&e),
            beat: Some(&b),
            open_calls: 0,
            last_failure_at_ms: None,
            last_delivery_at_ms: None,
        };
        check(&facts, Candidacy::Preferred, Some(LINE), NOW + 1_000)
    }

    fn only(reason: Reason, got: Vec<Reason>) {
        assert_eq!(got, vec![reason]);
    }

    #[test]
    fn a_healthy_node_is_eligible() {
        assert!(reasons(|_| {}, |_| {}).is_empty());
    }

    #[test]
    fn not_registered() {
        let facts = NodeFacts {
            entry: None,
            beat: None,
            open_calls: 0,
            last_failure_at_ms: None,
            last_delivery_at_ms: None,
        };
        only(
            Reason::NotRegistered,
            check(&facts, Candidacy::Preferred, None, NOW),
        );
    }

    #[test]
    fn admin_drained() {
        only(
            Reason::AdminDrained,
            reasons(|e| e.admin_drained = true, |_| {}),
        );
    }

    #[test]
    fn no_heartbeat() {
        let e = entry(Role::Stable);
        let facts = NodeFacts {
            entry: Some(&e),
            beat: None,
            open_calls: 0,
            last_failure_at_ms: None,
            last_delivery_at_ms: None,
        };
        only(
            Reason::NoHeartbeat,
            check(&facts, Candidacy::Preferred, None, NOW),
        );
    }

    #[test]
    fn heartbeat_stale_counts_from_the_earlier_of_receipt_and_signed_time_plus_grace() {
        // Received at NOW, valid 15 s: fresh at NOW+15 s, stale just after.
        let b = beat();
        assert!(!b.is_stale(NOW + 15_000));
        assert!(b.is_stale(NOW + 15_001));
        // A beat signed 5 s before receipt is stale 2 s + 15 s after signing.
        only(
            Reason::HeartbeatStale,
            reasons(
                |_| {},
                |b| {
                    b.signed_at_ms = NOW - 19_000;
                    b.received_at_ms = NOW - 9_000;
                    b.heartbeat.valid_for_s = 10;
                },
            ),
        );
    }

    #[test]
    fn a_beat_that_starts_or_ends_a_skew_changes_decisions() {
        let old = beat();
        let mut same = beat();
        same.heartbeat.seq = 2;
        assert!(same_for_decisions(&old, &same, None, NOW));
        let mut skewed = same.clone();
        skewed.signed_at_ms = NOW + MAX_BEAT_SKEW_MS + 1;
        assert!(!same_for_decisions(&old, &skewed, None, NOW));
        assert!(!same_for_decisions(&skewed, &same, None, NOW));
    }

    #[test]
    fn clock_skew() {
        only(
            Reason::ClockSkew,
            reasons(|_| {}, |b| b.signed_at_ms = NOW + 10_001),
        );
        assert!(reasons(|_| {}, |b| b.signed_at_ms = NOW + 10_000).is_empty());
    }

    #[test]
    fn mode_shadow_and_mode_drained() {
        only(
            Reason::ModeShadow,
            reasons(|_| {}, |b| b.heartbeat.mode = Mode::Shadow),
        );
        only(
            Reason::ModeDrained,
            reasons(|_| {}, |b| b.heartbeat.mode = Mode::Drained),
        );
    }

    #[test]
    fn dirty() {
        only(Reason::Dirty, reasons(|_| {}, |b| b.heartbeat.dirty = true));
    }

    #[test]
    fn sha_invalid() {
        only(
            Reason::ShaInvalid,
            reasons(|_| {}, |b| b.heartbeat.sha = "A".repeat(40)),
        );
        only(
            Reason::ShaInvalid,
            reasons(|_| {}, |b| b.heartbeat.sha = "abc".into()),
        );
    }

    #[test]
    fn sha_not_allowed() {
        only(
            Reason::ShaNotAllowed,
            reasons(|e| e.allowed_shas = Some(vec!["b".repeat(40)]), |_| {}),
        );
        assert!(reasons(|e| e.allowed_shas = Some(vec!["a".repeat(40)]), |_| {}).is_empty());
    }

    #[test]
    fn app_down() {
        only(
            Reason::AppDown,
            reasons(|_| {}, |b| b.heartbeat.app_ready = false),
        );
    }

    #[test]
    fn capacity_exhausted_uses_the_smaller_limit_and_the_larger_count() {
        only(
            Reason::CapacityExhausted,
            reasons(|_| {}, |b| b.heartbeat.capacity.active_calls = 10),
        );
        only(
            Reason::CapacityExhausted,
            reasons(
                |e| e.max_calls = Some(2),
                |b| b.heartbeat.capacity.active_calls = 2,
            ),
        );
        assert!(reasons(
            |e| e.max_calls = Some(3),
            |b| b.heartbeat.capacity.active_calls = 2
        )
        .is_empty());
        let e = entry(Role::Stable);
        let b = beat();
        let facts = NodeFacts {
            entry: Some(&e),
            beat: Some(&b),
            open_calls: 10,
            last_failure_at_ms: None,
            last_delivery_at_ms: None,
        };
        only(
            Reason::CapacityExhausted,
            check(&facts, Candidacy::Preferred, None, NOW),
        );
    }

    #[test]
    fn tunnel_down() {
        only(
            Reason::TunnelDown,
            reasons(|_| {}, |b| b.heartbeat.tunnel_up = false),
        );
    }

    #[test]
    fn origin_mismatch_is_an_exact_string_compare() {
        only(
            Reason::OriginMismatch,
            reasons(|_| {}, |b| b.heartbeat.origin_url.push('/')),
        );
    }

    #[test]
    fn line_not_served() {
        only(
            Reason::LineNotServed,
            reasons(|_| {}, |b| b.heartbeat.lines.clear()),
        );
    }

    #[test]
    fn routing_hash_mismatch() {
        only(
            Reason::RoutingHashMismatch,
            reasons(
                |_| {},
                |b| {
                    b.heartbeat
                        .lines
                        .insert("sales".into(), "+15105550123".into());
                },
            ),
        );
    }

    #[test]
    fn recent_forward_failure_clears_after_30_s_or_a_delivery() {
        let e = entry(Role::Stable);
        let b = beat();
        let facts = |failure, delivery| NodeFacts {
            entry: Some(&e),
            beat: Some(&b),
            open_calls: 0,
            last_failure_at_ms: failure,
            last_delivery_at_ms: delivery,
        };
        only(
            Reason::RecentForwardFailure,
            check(
                &facts(Some(NOW - 29_000), None),
                Candidacy::Preferred,
                None,
                NOW,
            ),
        );
        assert!(check(
            &facts(Some(NOW - 30_000), None),
            Candidacy::Preferred,
            None,
            NOW
        )
        .is_empty());
        assert!(check(
            &facts(Some(NOW - 1_000), Some(NOW - 500)),
            Candidacy::Preferred,
            None,
            NOW
        )
        .is_empty());
    }

    #[test]
    fn canary_not_go_and_candidate_not_approved() {
        let b = beat();
        let check_as = |e: &NodeEntry, candidacy| {
            let facts = NodeFacts {
                entry: Some(e),
                beat: Some(&b),
                open_calls: 0,
                last_failure_at_ms: None,
                last_delivery_at_ms: None,
            };
            check(&facts, candidacy, None, NOW)
        };
        let mut candidate = entry(Role::Candidate);
        only(
            Reason::CanaryNotGo,
            check_as(&candidate, Candidacy::Preferred),
        );
        only(
            Reason::CandidateNotApproved,
            check_as(&candidate, Candidacy::Fallback),
        );
        assert!(check_as(&candidate, Candidacy::General).is_empty());
        candidate.canary_go = true;
        candidate.fallback_approved = true;
        assert!(check_as(&candidate, Candidacy::Preferred).is_empty());
        assert!(check_as(&candidate, Candidacy::Fallback).is_empty());
    }

    #[test]
    fn every_code_is_its_serialised_name() {
        for r in [
            Reason::NotRegistered,
            Reason::RoutingHashMismatch,
            Reason::CandidateNotApproved,
        ] {
            assert_eq!(
                serde_json::to_value(r).unwrap(),
                serde_json::json!(r.code())
            );
        }
    }
}
