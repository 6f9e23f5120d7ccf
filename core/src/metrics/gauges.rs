//! The gauges, read at scrape time from an object's status view (SPEC §13,
//! the panel contract), so that a scrape reads exactly what the panel
//! shows and writes nothing.

use super::{
    Sample, LINE_FALLBACK, LINE_ROUTE, NODES_REVISION, NODE_ELIGIBLE, NODE_HEARTBEAT_AGE,
    NODE_INELIGIBLE_REASON, NODE_MAX_CALLS, NODE_OPEN_CALLS, OPEN_CALLS, PENDING_EVENTS,
    POLICY_REVISION, SEQ_REGRESSIONS, SHARD_MAP_REVISION,
};
use serde_json::Value;

/// The status view's field `key` of `value` as a whole number (absent or
/// null: `None`).
fn number(value: &Value, key: &str) -> Option<u64> {
    value.get(key).and_then(Value::as_u64)
}

/// The status view's text field `key` of `value`.
fn text<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(Value::as_str)
}

/// The status view's list `key` of `value` (absent: empty).
fn list<'a>(value: &'a Value, key: &str) -> &'a [Value] {
    value
        .get(key)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// The gauges of the status view `status` of call shard `shard` (0:
/// `global`), the shard map's revision `map_revision` (0 before any PUT,
/// SPEC §16), and the stored seq-regression counts (a counter kept in
/// storage, migration 0004, so it survives restarts). A view without its
/// counts, or a node or line without its id, is an error. (Read field by
/// field rather than through a typed copy of the view: the Worker's wasm
/// then carries no deserialiser for it.)
pub fn from_status(status: &Value, shard: u32, map_revision: u64) -> Result<Vec<Sample>, String> {
    let counts = status.get("counts").ok_or("a status view without counts")?;
    let shard = shard.to_string();
    let shard = [("shard", shard.as_str())];
    let mut samples = vec![
        Sample::new(
            POLICY_REVISION,
            &[],
            number(status, "policy_revision").unwrap_or(0),
        ),
        Sample::new(
            NODES_REVISION,
            &[],
            number(status, "nodes_revision").unwrap_or(0),
        ),
        Sample::new(SHARD_MAP_REVISION, &[], map_revision),
        Sample::new(
            PENDING_EVENTS,
            &shard,
            number(counts, "pending").unwrap_or(0),
        ),
        Sample::new(
            OPEN_CALLS,
            &shard,
            number(counts, "open_calls").unwrap_or(0),
        ),
    ];
    for line in list(status, "lines") {
        let id = text(line, "line_id").ok_or("a line without its id")?;
        let fallback = line.get("fallback_in_use").and_then(Value::as_bool);
        samples.push(Sample::new(
            LINE_FALLBACK,
            &[("line", id)],
            u64::from(fallback == Some(true)),
        ));
        let preferred = text(line, "prefers").ok_or("a line without its preferred node")?;
        let target = text(line, "next_call_target").unwrap_or("none");
        let route = [("line", id), ("preferred", preferred), ("target", target)];
        samples.push(Sample::new(LINE_ROUTE, &route, 1));
    }
    for node in list(status, "nodes") {
        let id = text(node, "node").ok_or("a node without its id")?;
        let eligible = node.get("eligible").and_then(Value::as_bool) == Some(true);
        samples.push(Sample::new(
            NODE_ELIGIBLE,
            &[("node", id)],
            u64::from(eligible),
        ));
        for reason in list(node, "reasons").iter().filter_map(Value::as_str) {
            let labels = [("node", id), ("reason", reason)];
            samples.push(Sample::new(NODE_INELIGIBLE_REASON, &labels, 1));
        }
        if let Some(age) = number(node, "heartbeat_age_s") {
            samples.push(Sample::new(NODE_HEARTBEAT_AGE, &[("node", id)], age));
        }
        let capacity = node.get("capacity").unwrap_or(&Value::Null);
        let open = number(capacity, "open_calls").unwrap_or(0);
        samples.push(Sample::new(NODE_OPEN_CALLS, &[("node", id)], open));
        if let Some(max) = number(capacity, "max_calls") {
            samples.push(Sample::new(NODE_MAX_CALLS, &[("node", id)], max));
        }
        let regressions = number(node, "seq_regressions").unwrap_or(0);
        samples.push(Sample::new(SEQ_REGRESSIONS, &[("node", id)], regressions));
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
        let text = render(&from_status(&status, 0, 2).unwrap());
        for line in [
            "callfence_policy_revision 3\n",
            "callfence_nodes_revision 0\n",
            "callfence_shard_map_revision 2\n",
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
        assert!(from_status(&json!({"nodes": []}), 0, 0).is_err());
        let nameless = json!({"counts": {}, "nodes": [{"eligible": true}]});
        assert!(from_status(&nameless, 0, 0).is_err());
    }
}
