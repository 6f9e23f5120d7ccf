//! The gauges, read at scrape time from an object's status view (SPEC §13,
//! the panel contract), so that a scrape reads exactly what the panel
//! shows and writes nothing.

use super::{
    Sample, LINE_FALLBACK, LINE_ROUTE, NODES_REVISION, NODE_ELIGIBLE, NODE_HEARTBEAT_AGE,
    NODE_INELIGIBLE_REASON, NODE_MAX_CALLS, NODE_OPEN_CALLS, OPEN_CALLS, PENDING_EVENTS,
    POLICY_REVISION, SEQ_REGRESSIONS, SHARD_MAP_REVISION,
};
use serde::Deserialize;

/// The parts of the status view the gauges read.
#[derive(Deserialize)]
struct Status {
    policy_revision: Option<u64>,
    nodes_revision: Option<u64>,
    #[serde(default)]
    lines: Vec<Line>,
    #[serde(default)]
    nodes: Vec<Node>,
    counts: Counts,
}

#[derive(Deserialize)]
struct Line {
    line_id: String,
    fallback_in_use: bool,
    prefers: String,
    next_call_target: Option<String>,
}

#[derive(Deserialize)]
struct Node {
    node: String,
    eligible: bool,
    #[serde(default)]
    reasons: Vec<String>,
    heartbeat_age_s: Option<u64>,
    capacity: Capacity,
    #[serde(default)]
    seq_regressions: u64,
}

#[derive(Deserialize)]
struct Capacity {
    max_calls: Option<u64>,
    open_calls: u64,
}

#[derive(Deserialize)]
struct Counts {
    open_calls: u64,
    pending: u64,
}

/// The gauges of the status view `status` of call shard `shard` (0:
/// `global`), and the stored seq-regression counts (a counter kept in
/// storage, migration 0004, so it survives restarts). The shard map's
/// revision is 0: no shard map exists yet (SPEC §16).
pub fn from_status(status: &serde_json::Value, shard: u32) -> Result<Vec<Sample>, String> {
    let status = Status::deserialize(status).map_err(|e| e.to_string())?;
    let bit = |b: bool| if b { 1.0 } else { 0.0 };
    let shard = shard.to_string();
    let mut samples = vec![
        Sample::new(
            POLICY_REVISION,
            &[],
            status.policy_revision.unwrap_or(0) as f64,
        ),
        Sample::new(
            NODES_REVISION,
            &[],
            status.nodes_revision.unwrap_or(0) as f64,
        ),
        Sample::new(SHARD_MAP_REVISION, &[], 0.0),
        Sample::new(
            PENDING_EVENTS,
            &[("shard", &shard)],
            status.counts.pending as f64,
        ),
        Sample::new(
            OPEN_CALLS,
            &[("shard", &shard)],
            status.counts.open_calls as f64,
        ),
    ];
    for line in &status.lines {
        let labels = [("line", line.line_id.as_str())];
        samples.push(Sample::new(
            LINE_FALLBACK,
            &labels,
            bit(line.fallback_in_use),
        ));
        let target = line.next_call_target.as_deref().unwrap_or("none");
        let route = [
            ("line", line.line_id.as_str()),
            ("preferred", line.prefers.as_str()),
            ("target", target),
        ];
        samples.push(Sample::new(LINE_ROUTE, &route, 1.0));
    }
    for node in &status.nodes {
        let id = [("node", node.node.as_str())];
        samples.push(Sample::new(NODE_ELIGIBLE, &id, bit(node.eligible)));
        for reason in &node.reasons {
            let labels = [("node", node.node.as_str()), ("reason", reason.as_str())];
            samples.push(Sample::new(NODE_INELIGIBLE_REASON, &labels, 1.0));
        }
        if let Some(age) = node.heartbeat_age_s {
            samples.push(Sample::new(NODE_HEARTBEAT_AGE, &id, age as f64));
        }
        samples.push(Sample::new(
            NODE_OPEN_CALLS,
            &id,
            node.capacity.open_calls as f64,
        ));
        if let Some(max) = node.capacity.max_calls {
            samples.push(Sample::new(NODE_MAX_CALLS, &id, max as f64));
        }
        samples.push(Sample::new(
            SEQ_REGRESSIONS,
            &id,
            node.seq_regressions as f64,
        ));
    }
    Ok(samples)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::exposition::render;
    use serde_json::json;

    #[test]
    fn the_status_view_becomes_gauges() {
        let status = json!({
            "policy_revision": 3, "nodes_revision": null,
            "lines": [{"line_id": "sales", "called_number": "+15551230000", "prefers": "M2",
                       "next_call_target": "M1", "fallback_in_use": true},
                      {"line_id": "support", "called_number": "+15551230001", "prefers": "M2",
                       "next_call_target": null, "fallback_in_use": true}],
            "nodes": [
                {"node": "M1", "eligible": true, "reasons": [], "heartbeat_age_s": 4,
                 "capacity": {"max_calls": 10, "active_calls": 1, "open_calls": 2}, "seq_regressions": 1},
                {"node": "M2", "eligible": false, "reasons": ["mode_drained", "app_down"],
                 "heartbeat_age_s": null, "capacity": {"max_calls": null, "open_calls": 0}}
            ],
            "counts": {"open_calls": 2, "pending": 5, "unroutable": 1},
        });
        let text = render(&from_status(&status, 0).unwrap());
        for line in [
            "callfence_policy_revision 3\n",
            "callfence_nodes_revision 0\n",
            "callfence_shard_map_revision 0\n",
            "callfence_pending_events{shard=\"0\"} 5\n",
            "callfence_open_calls{shard=\"0\"} 2\n",
            "callfence_line_fallback_in_use{line=\"sales\"} 1\n",
            "callfence_line_route{line=\"sales\",preferred=\"M2\",target=\"M1\"} 1\n",
            "callfence_line_route{line=\"support\",preferred=\"M2\",target=\"none\"} 1\n",
            "callfence_node_eligible{node=\"M1\"} 1\n",
            "callfence_node_eligible{node=\"M2\"} 0\n",
            "callfence_node_ineligible_reason{node=\"M2\",reason=\"app_down\"} 1\n",
            "callfence_node_ineligible_reason{node=\"M2\",reason=\"mode_drained\"} 1\n",
            "callfence_node_heartbeat_age_seconds{node=\"M1\"} 4\n",
            "callfence_node_open_calls{node=\"M1\"} 2\n",
            "callfence_node_max_calls{node=\"M1\"} 10\n",
            "callfence_heartbeat_seq_regressions_total{node=\"M1\"} 1\n",
            "callfence_heartbeat_seq_regressions_total{node=\"M2\"} 0\n",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
        assert!(!text.contains("callfence_node_heartbeat_age_seconds{node=\"M2\"}"));
        assert!(!text.contains("callfence_node_max_calls{node=\"M2\"}"));
        assert!(!text.contains("+1555"), "no number reaches a label");
    }

    #[test]
    fn a_view_of_another_shape_is_an_error() {
        assert!(from_status(&json!({"nodes": 3}), 0).is_err());
    }
}
