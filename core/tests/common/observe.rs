//! Reads of the Dispatcher's tables for the checker: the whole-store dump a
//! "changes nothing" observation compares, the ownership snapshot checked
//! after every step (with each session's leg and event counts, for the
//! "nothing live is pruned" invariant), and the evidence of each new
//! assignment decision.

use super::checker::{AssignmentEvidence, Ownership, Snapshot};
use callfence_core::heartbeat::Heartbeat;
use callfence_core::store::{Store, Value};
use std::collections::BTreeMap;

/// Every table except the bookkeeping counter of webhook arrival.
pub fn dump(store: &impl Store) -> String {
    let mut out = String::new();
    for table in [
        "documents",
        "heartbeats",
        "node_health",
        "node_load",
        "sessions",
        "legs",
        "events",
        "decisions",
    ] {
        let rows = store
            .exec(&format!("SELECT * FROM {table} ORDER BY 1"), &[])
            .expect("dump");
        out.push_str(&format!("{table}:{rows:?}\n"));
    }
    out
}

/// Ownership, delivered events, document revisions and beat validity as
/// stored.
pub fn snapshot(store: &impl Store) -> Snapshot {
    snapshot_since(store, &Snapshot::default(), |_| true)
}

/// [`snapshot`] after a step that wrote only the tables `wrote` accepts:
/// what the other tables give is taken from `last`, the snapshot before it.
pub fn snapshot_since(
    store: &impl Store,
    last: &Snapshot,
    wrote: impl Fn(&str) -> bool,
) -> Snapshot {
    // A table's part is read again only if the step wrote that table.
    fn part<T: Clone>(wrote: bool, read: impl FnOnce() -> T, last: &T) -> T {
        if wrote {
            read()
        } else {
            last.clone()
        }
    }
    Snapshot {
        sessions: part(
            wrote("sessions") || wrote("legs") || wrote("events"),
            || sessions(store),
            &last.sessions,
        ),
        delivered: part(wrote("events"), || delivered(store), &last.delivered),
        revisions: part(wrote("documents"), || revisions(store), &last.revisions),
        node_load: part(wrote("node_load"), || node_load(store), &last.node_load),
        beat_valid_until: part(
            wrote("heartbeats"),
            || beat_valid_until(store),
            &last.beat_valid_until,
        ),
    }
}

fn sessions(store: &impl Store) -> BTreeMap<String, Ownership> {
    let mut out = BTreeMap::new();
    let rows = store
        .exec("SELECT s.call_session_id, s.owner, s.epoch, s.fence_node, s.fence_epoch, s.state, s.created_at, \
               (SELECT COUNT(*) FROM legs l WHERE l.call_session_id = s.call_session_id), \
               (SELECT COUNT(*) FROM events e WHERE e.call_session_id = s.call_session_id) FROM sessions s", &[])
        .expect("sessions");
    for r in rows {
        let text = |i: usize| r[i].as_text().map(str::to_owned);
        let fence = match (text(3), r[4].as_int()) {
            (Some(n), Some(e)) => Some((n, e as u64)),
            _ => None,
        };
        let state = text(5).unwrap_or_default();
        out.insert(
            text(0).unwrap_or_default(),
            Ownership {
                owner: text(1),
                epoch: r[2].as_int().map(|e| e as u64),
                fence,
                open: state == "assigned" || state == "answered",
                ended: state == "ended",
                created_at_ms: r[6].as_int().unwrap_or(0),
                legs: r[7].as_int().unwrap_or(0) as u32,
                events: r[8].as_int().unwrap_or(0) as u32,
            },
        );
    }
    out
}

fn delivered(store: &impl Store) -> BTreeMap<String, Option<String>> {
    store
        .exec(
            "SELECT event_id, call_session_id FROM events WHERE state = 'delivered'",
            &[],
        )
        .expect("events")
        .into_iter()
        .map(|r| {
            (
                r[0].as_text().unwrap_or_default().to_owned(),
                r[1].as_text().map(str::to_owned),
            )
        })
        .collect()
}

fn revisions(store: &impl Store) -> BTreeMap<String, u64> {
    store
        .exec(
            "SELECT kind, MAX(revision) FROM documents GROUP BY kind",
            &[],
        )
        .expect("docs")
        .into_iter()
        .map(|r| {
            (
                r[0].as_text().unwrap_or_default().to_owned(),
                r[1].as_int().unwrap_or(0) as u64,
            )
        })
        .collect()
}

fn node_load(store: &impl Store) -> BTreeMap<String, i64> {
    store
        .exec("SELECT node, open_calls FROM node_load", &[])
        .expect("node_load")
        .into_iter()
        .map(|r| {
            (
                r[0].as_text().unwrap_or_default().to_owned(),
                r[1].as_int().unwrap_or(0),
            )
        })
        .collect()
}

fn beat_valid_until(store: &impl Store) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for r in store
        .exec(
            "SELECT node, body, received_at, signed_at FROM heartbeats",
            &[],
        )
        .expect("beats")
    {
        let valid_for = serde_json::from_str::<Heartbeat>(r[1].as_text().unwrap_or("{}"))
            .map(|h| h.valid_for_s)
            .unwrap_or(0);
        let received = r[2].as_int().unwrap_or(0);
        let signed = r[3].as_int().unwrap_or(0);
        out.insert(
            r[0].as_text().unwrap_or_default().to_owned(),
            received.min(signed + 2_000) + i64::from(valid_for) * 1000,
        );
    }
    out
}

/// The assignment decisions stored after decision `after_id`, with their
/// evidence; `truly_eligible(node, at_ms)` is what the node itself last
/// said. Returns the evidence and the last decision id read.
pub fn new_assignments(
    store: &impl Store,
    after_id: i64,
    truly_eligible: impl Fn(&str, i64) -> bool,
) -> (Vec<AssignmentEvidence>, i64) {
    let rows = store
        .exec(
            "SELECT decision_id, body FROM decisions WHERE decision_id > ? ORDER BY decision_id",
            &[Value::Int(after_id)],
        )
        .expect("decisions");
    let mut last = after_id;
    let mut out = Vec::new();
    for r in rows {
        last = r[0].as_int().unwrap_or(0);
        let d: serde_json::Value =
            serde_json::from_str(r[1].as_text().unwrap_or("{}")).expect("decision json");
        let outcome = d["outcome"].as_str().unwrap_or_default();
        if outcome != "assigned" && outcome != "reassigned" {
            continue;
        }
        let node = d["chosen"].as_str().unwrap_or_default().to_owned();
        let at = d["at"]
            .as_str()
            .and_then(callfence_core::time::parse_ms)
            .unwrap_or(0);
        out.push(AssignmentEvidence {
            node_truly_eligible: truly_eligible(&node, at),
            node,
            rule_claim: d["rule"] == "claim",
            policy_revision: d["policy_revision"].as_u64(),
            nodes_revision: d["nodes_revision"].as_u64(),
            chosen_sha: d["chosen_sha"].as_str().map(str::to_owned),
            chosen_clean: d["chosen_clean"].as_bool(),
        });
    }
    (out, last)
}
