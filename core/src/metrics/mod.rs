//! The edge's metrics (SPEC §17): the catalogue of every family, the
//! in-memory counters an object keeps, the gauges read from its stored
//! state, and the Prometheus text exposition (format 0.0.4).
//!
//! Nothing here does I/O. A Dispatcher counts into its [`Counters`] as it
//! serves; a scrape turns the counters and the status view into [`Sample`]s
//! ([`Counters::samples`], [`gauges::from_status`]), which travel to the
//! Worker as JSON and are rendered there by [`exposition::render`], so
//! that samples from several objects (call shards, SPEC §16) can be merged
//! under one `# HELP` and `# TYPE` per family.
//!
//! # Labels
//!
//! Label values are node ids, line ids, shard numbers and the SPEC's stable
//! codes: never a phone number, a call or event id, or a token. Node and
//! line ids are bounded by the documents (at most 64 nodes, 1,000 lines);
//! the counters also cap the label sets of each family at
//! [`MAX_SERIES_PER_FAMILY`], so a long-lived object that saw many
//! registries cannot grow without bound.
//!
//! # Layout
//!
//! - [`counters`]: the counters, what may be counted and how;
//! - [`gauges`]: the gauges, from the status view;
//! - [`exposition`]: the text format;
//! - [`merge`]: one scrape's samples from every call shard, merged.

pub mod counters;
pub mod exposition;
pub mod gauges;
pub mod merge;

pub use counters::{ClaimLimit, Count, Counters, WebhookOutcome};

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Most label sets one family keeps; a new one beyond it is not counted.
pub const MAX_SERIES_PER_FAMILY: usize = 1_024;

/// A metric's type, as `# TYPE` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only grows (and restarts at 0 when its object restarts).
    Counter,
    /// A reading of stored state at scrape time.
    Gauge,
}

impl Kind {
    /// The `# TYPE` word.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        }
    }
}

/// One family: its name, type, help text and label names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Family {
    /// The metric name.
    pub name: &'static str,
    /// Counter or gauge.
    pub kind: Kind,
    /// The `# HELP` text.
    pub help: &'static str,
    /// Its label names, in the order they are written.
    pub labels: &'static [&'static str],
}

/// `callfence_webhooks_total{outcome}`.
pub const WEBHOOKS: &str = "callfence_webhooks_total";
/// `callfence_decisions_total{rule,outcome}`.
pub const DECISIONS: &str = "callfence_decisions_total";
/// `callfence_forward_failures_total{node,class}`.
pub const FORWARD_FAILURES: &str = "callfence_forward_failures_total";
/// `callfence_fence_requests_total{result}`.
pub const FENCE_REQUESTS: &str = "callfence_fence_requests_total";
/// `callfence_claims_refused_total{node,reason}`.
pub const CLAIMS_REFUSED: &str = "callfence_claims_refused_total";
/// `callfence_storage_full_total`.
pub const STORAGE_FULL: &str = "callfence_storage_full_total";
/// `callfence_heartbeats_total{node,result}`.
pub const HEARTBEATS: &str = "callfence_heartbeats_total";
/// `callfence_heartbeat_seq_regressions_total{node}`.
pub const SEQ_REGRESSIONS: &str = "callfence_heartbeat_seq_regressions_total";
/// `callfence_node_eligible{node}`.
pub const NODE_ELIGIBLE: &str = "callfence_node_eligible";
/// `callfence_node_ineligible_reason{node,reason}`.
pub const NODE_INELIGIBLE_REASON: &str = "callfence_node_ineligible_reason";
/// `callfence_node_heartbeat_age_seconds{node}`.
pub const NODE_HEARTBEAT_AGE: &str = "callfence_node_heartbeat_age_seconds";
/// `callfence_node_open_calls{node}`.
pub const NODE_OPEN_CALLS: &str = "callfence_node_open_calls";
/// `callfence_node_max_calls{node}`.
pub const NODE_MAX_CALLS: &str = "callfence_node_max_calls";
/// `callfence_line_fallback_in_use{line}`.
pub const LINE_FALLBACK: &str = "callfence_line_fallback_in_use";
/// `callfence_line_route{line,preferred,target}`.
pub const LINE_ROUTE: &str = "callfence_line_route";
/// `callfence_pending_events{shard}`.
pub const PENDING_EVENTS: &str = "callfence_pending_events";
/// `callfence_open_calls{shard}`.
pub const OPEN_CALLS: &str = "callfence_open_calls";
/// `callfence_policy_revision`.
pub const POLICY_REVISION: &str = "callfence_policy_revision";
/// `callfence_nodes_revision`.
pub const NODES_REVISION: &str = "callfence_nodes_revision";
/// `callfence_shard_map_revision`.
pub const SHARD_MAP_REVISION: &str = "callfence_shard_map_revision";

/// Every family the edge serves, in the order they are written.
pub const FAMILIES: &[Family] = &[
    Family {
        name: WEBHOOKS,
        kind: Kind::Counter,
        help: "Carrier webhooks by the class of their answer, plus events the alarm later delivered or rejected; refused: refused by the Worker before the Dispatcher (signature, envelope, size).",
        labels: &["outcome"],
    },
    Family {
        name: DECISIONS,
        kind: Kind::Counter,
        help: "Routing decisions recorded, by the rule that resolved the preferred node and what the decision did.",
        labels: &["rule", "outcome"],
    },
    Family {
        name: FORWARD_FAILURES,
        kind: Kind::Counter,
        help: "Forwards to a node that were not delivered: not_admitted (definitely not delivered) or unknown (timeout, reset, 408, 429, 5xx).",
        labels: &["node", "class"],
    },
    Family {
        name: FENCE_REQUESTS,
        kind: Kind::Counter,
        help: "Answer fence requests by result: granted, regranted, or the refusal's reason.",
        labels: &["result"],
    },
    Family {
        name: CLAIMS_REFUSED,
        kind: Kind::Counter,
        help: "Claims refused under a limit: capacity (capacity_exhausted) or rate (rate_limited).",
        labels: &["node", "reason"],
    },
    Family {
        name: STORAGE_FULL,
        kind: Kind::Counter,
        help: "New sessions (a webhook's first event or a claim) refused 503 storage_full: the sessions table is at SESSION_CAP with only live sessions.",
        labels: &[],
    },
    Family {
        name: HEARTBEATS,
        kind: Kind::Counter,
        help: "Heartbeats from registered nodes: accepted, or the refusal's code.",
        labels: &["node", "result"],
    },
    Family {
        name: SEQ_REGRESSIONS,
        kind: Kind::Counter,
        help: "Heartbeats refused stale_seq (their seq went backwards: the node's key may be in use in two places), as stored.",
        labels: &["node"],
    },
    Family {
        name: NODE_ELIGIBLE,
        kind: Kind::Gauge,
        help: "1 when the node may take a new call now, else 0.",
        labels: &["node"],
    },
    Family {
        name: NODE_INELIGIBLE_REASON,
        kind: Kind::Gauge,
        help: "1 for each reason the node may not take a new call now.",
        labels: &["node", "reason"],
    },
    Family {
        name: NODE_HEARTBEAT_AGE,
        kind: Kind::Gauge,
        help: "Seconds since the node's last accepted heartbeat (absent before the first).",
        labels: &["node"],
    },
    Family {
        name: NODE_OPEN_CALLS,
        kind: Kind::Gauge,
        help: "Open calls (assigned or answered, not settled) the edge counts against the node.",
        labels: &["node"],
    },
    Family {
        name: NODE_MAX_CALLS,
        kind: Kind::Gauge,
        help: "The node's effective max_calls (absent when neither its beat nor the registry sets one).",
        labels: &["node"],
    },
    Family {
        name: LINE_FALLBACK,
        kind: Kind::Gauge,
        help: "1 when the line's next call would not go to its preferred node.",
        labels: &["line"],
    },
    Family {
        name: LINE_ROUTE,
        kind: Kind::Gauge,
        help: "Always 1: the line's preferred node and the node its next call would go to (none: no eligible node).",
        labels: &["line", "preferred", "target"],
    },
    Family {
        name: PENDING_EVENTS,
        kind: Kind::Gauge,
        help: "Events parked waiting for an eligible node, per call shard.",
        labels: &["shard"],
    },
    Family {
        name: OPEN_CALLS,
        kind: Kind::Gauge,
        help: "Open calls, per call shard.",
        labels: &["shard"],
    },
    Family {
        name: POLICY_REVISION,
        kind: Kind::Gauge,
        help: "The routing policy's current revision (0: none yet).",
        labels: &[],
    },
    Family {
        name: NODES_REVISION,
        kind: Kind::Gauge,
        help: "The node registry's current revision (0: none yet).",
        labels: &[],
    },
    Family {
        name: SHARD_MAP_REVISION,
        kind: Kind::Gauge,
        help: "The shard map's current revision (0: the implicit one-shard map; no shard map exists yet).",
        labels: &[],
    },
];

/// The family named `name`, if the edge serves it.
pub fn family(name: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.name == name)
}

/// One sample: a family, its label values by label name, and the value.
/// The wire form between a Dispatcher and the Worker. Every value the edge
/// serves is a whole, non-negative number (counts, revisions, 0/1, whole
/// seconds), so it is one here, and the Worker carries no float formatting.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// The family's name.
    pub name: String,
    /// Label name → value.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The value.
    pub value: u64,
}

impl Sample {
    /// A sample of `name` with `labels`.
    pub fn new(name: &str, labels: &[(&str, &str)], value: u64) -> Self {
        Self {
            name: name.to_owned(),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            value,
        }
    }
}

/// True for a label value the edge may write: 1 to 64 characters of
/// `[A-Za-z0-9_-]` (node ids, line ids, shard numbers, stable codes). A
/// value outside it is never written (the sample is dropped), so nothing
/// that reached a label by mistake can carry a `+` number, a URL or a
/// token's punctuation.
pub fn is_label_value(value: &str) -> bool {
    (1..=64).contains(&value.len())
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn family_names_are_unique_and_well_formed() {
        let mut names: Vec<&str> = FAMILIES.iter().map(|f| f.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), FAMILIES.len());
        for f in FAMILIES {
            assert!(f.name.starts_with("callfence_"), "{}", f.name);
            assert_eq!(f.kind == Kind::Counter, f.name.ends_with("_total"));
            assert!(!f.help.contains(['\n', '\\']), "{}", f.name);
        }
    }

    #[test]
    fn label_values_are_ids_and_codes_only() {
        for ok in ["M1", "property_management_ca", "0", "mode_drained"] {
            assert!(is_label_value(ok), "{ok}");
        }
        for bad in [
            "",
            "+15102160079",
            "v3:abc",
            "a b",
            "https://x",
            &"a".repeat(65),
        ] {
            assert!(!is_label_value(bad), "{bad}");
        }
    }
}
