//! Eligibility: every reason a node may not take a new call, in one place.
//!
//! [`check`] answers "why was M3 skipped" for one node and one call. It is
//! pure: the engine gathers the [`NodeFacts`] (registry entry, last accepted
//! beat, open calls, forward health) and passes `now_ms`.

use crate::heartbeat::{Heartbeat, Mode};
use crate::registry::{NodeEntry, Role};
use serde::Serialize;

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
#[derive(Debug, Clone)]
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
        Some(beat) => beat_reasons(entry, beat, facts.open_calls, line, now_ms, &mut reasons),
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
    entry: &NodeEntry,
    beat: &Beat,
    open_calls: u32,
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
    if let Some(limit) = effective_max_calls(Some(entry), Some(beat)) {
        if hb.capacity.active_calls.max(open_calls) >= limit {
            reasons.push(Reason::CapacityExhausted);
        }
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
