//! Every SQL statement the Dispatcher runs, as one named function each (the
//! agent's `ledger.rs` does the same for the agent). Nothing else in the
//! engine spells SQL; the schema is `migrations/`.
//!
//! On the Durable Object each statement is one crossing between wasm and the
//! runtime's SQL binding, which is most of the Dispatcher's CPU: statements
//! here combine what they can (`RETURNING`, upserts, joins, several counters
//! in one write) and read the large columns (an event's body and headers)
//! only when they are forwarded. `core/benches/engine.rs` counts them per
//! operation.

// Column lists and shared clauses as macros, so that every statement is one
// `&'static str` built at compile time (no formatting per statement).

/// SQL list of the session states that count toward the owner's capacity
/// (the Rust twin is `SessionState::is_open`; the `node_load` triggers of
/// `migrations/0002_node_load.sql` spell it too).
macro_rules! open_states {
    () => {
        "('assigned', 'answered')"
    };
}
/// The sessions the row cap may evict: ended, or settled (`node_lost`,
/// `max_duration`) without a fence; `$p` is a table prefix (`""`, `"s."`).
/// Word for word the `WHERE` of the partial index `sessions_settled`
/// (`migrations/0005_session_cap.sql`) when `$p` is empty.
macro_rules! settled {
    ($p:literal) => {
        concat!(
            "(",
            $p,
            "state = 'ended' OR (",
            $p,
            "state IN ('node_lost', 'max_duration') AND ",
            $p,
            "fence_node IS NULL))"
        )
    };
}
/// A live session (SPEC §9): open (`assigned`, `answered`), or fenced and
/// not ended; a state this release does not know counts as live. Nothing
/// live, nor its legs or events, is ever pruned. `$p` as in `settled!`.
macro_rules! live {
    ($p:literal) => {
        concat!(
            "NOT (",
            $p,
            "state = 'ended' OR (",
            $p,
            "state IN ('node_lost', 'max_duration', 'pending_assignment') AND ",
            $p,
            "fence_node IS NULL))"
        )
    };
}
/// The session columns `rows::session_at` reads, in order.
macro_rules! session_cols {
    () => {
        "call_session_id, state, owner, epoch, origin_url, direction, caller, called, created_at, fence_node, fence_epoch, fence_at, command_id, ambiguous_epoch"
    };
}
/// [`session_cols`] of the alias `s`.
macro_rules! session_cols_s {
    () => {
        "s.call_session_id, s.state, s.owner, s.epoch, s.origin_url, s.direction, s.caller, s.called, s.created_at, s.fence_node, s.fence_epoch, s.fence_at, s.command_id, s.ambiguous_epoch"
    };
}
/// The event columns `rows::event_at` reads, in order.
macro_rules! event_cols {
    () => {
        "event_id, call_session_id, call_control_id, event_type, state, received_at, epoch, attempts, lease_until, redrives, result_status, node, pending_until"
    };
}
/// [`event_cols`] of the alias `e`.
macro_rules! event_cols_e {
    () => {
        "e.event_id, e.call_session_id, e.call_control_id, e.event_type, e.state, e.received_at, e.epoch, e.attempts, e.lease_until, e.redrives, e.result_status, e.node, e.pending_until"
    };
}
/// The guard of every move of an owned session (parameter: the epoch it
/// moves from).
macro_rules! movable {
    () => {
        "epoch = ? AND owner IS NOT NULL AND fence_node IS NULL AND ambiguous_epoch IS NOT epoch AND direction IS NOT 'outgoing'"
    };
}

mod events;
mod load;
mod retention;
mod sessions;

pub(crate) use crate::sql::{int, text, Queries};

/// The alarm's facts: is anything parked, the earliest re-drive or lease
/// end, and is anything open or stored at all (the sweep). Each part is one
/// seek in an index (`events_by_due`, `events_by_age`) or a read of the
/// small `node_load` table, so the cost does not grow with the ledger. An
/// `unknown` event with no re-drive left never carries a `next_try_at`
/// ([`Queries::lapse_leases`], [`Queries::mark_event_unknown`]), so the
/// earliest one is always due.
pub(super) const ALARM_FACTS: &str = "SELECT \
    (SELECT 1 FROM events WHERE state = 'pending_assignment' LIMIT 1), \
    (SELECT MIN(next_try_at) FROM events WHERE state = 'queued'), \
    (SELECT MIN(next_try_at) FROM events WHERE state = 'forwarding'), \
    (SELECT MIN(next_try_at) FROM events WHERE state = 'unknown'), \
    (SELECT 1 FROM node_load WHERE open_calls > 0 LIMIT 1), \
    (SELECT MIN(updated_at) FROM events)";

/// A new ledger row, inserted in its final state for this unit.
pub(crate) struct NewEvent<'a> {
    pub event_id: &'a str,
    pub seq: u64,
    pub session: Option<&'a str>,
    pub call_control_id: Option<&'a str>,
    pub event_type: &'a str,
    pub state: &'a str,
    pub body: &'a str,
    pub headers: &'a str,
    pub now_ms: i64,
    pub pending_until: Option<i64>,
    /// (node, epoch, lease until) when inserted as a first attempt.
    pub attempt: Option<(&'a str, u64, i64)>,
}

/// A new session's first facts.
pub(crate) struct NewSession<'a> {
    pub id: &'a str,
    pub direction: Option<&'a str>,
    pub caller: Option<&'a str>,
    pub called: Option<&'a str>,
    pub now_ms: i64,
}

/// The stored facts the alarm's due time is computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AlarmFacts {
    pub pending: bool,
    pub next_try_at: Option<i64>,
    pub busy: bool,
}

/// A ledger event as the export reads it: its first delivery's raw body.
pub(crate) struct Received {
    pub seq: i64,
    pub event_id: String,
    pub event_type: String,
    pub call_session_id: Option<String>,
    pub state: String,
    pub node: Option<String>,
    pub received_at_ms: i64,
    pub updated_at_ms: i64,
    pub body: String,
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use crate::store::sqlite::SqliteStore;
    use crate::store::{migrate, Store, Value};

    /// The query plan's lines for `sql`.
    fn plan(store: &SqliteStore, sql: &str, params: &[Value]) -> Vec<String> {
        store
            .exec(&format!("EXPLAIN QUERY PLAN {sql}"), params)
            .unwrap()
            .iter()
            .filter_map(|r| r.get(3).and_then(Value::as_text).map(str::to_owned))
            .collect()
    }

    #[test]
    fn the_alarm_facts_and_a_node_s_facts_read_indexes_only() {
        let store = SqliteStore::in_memory().unwrap();
        migrate(&store, 0).unwrap();
        // Only the outer constant row and the per-node table are scanned.
        let indexed = |lines: &[String]| {
            lines.iter().all(|l| {
                !l.starts_with("SCAN") || l == "SCAN CONSTANT ROW" || l == "SCAN node_load"
            })
        };
        let lines = plan(&store, ALARM_FACTS, &[]);
        assert!(
            lines.iter().any(|l| l.contains("events_by_due")),
            "{lines:?}"
        );
        assert!(indexed(&lines), "{lines:?}");
        let q = Queries::new(&store);
        assert_eq!(
            q.alarm_facts().unwrap(),
            AlarmFacts {
                pending: false,
                next_try_at: None,
                busy: false
            }
        );
        let node = plan(&store, load::OPEN_CALLS, &["M1".into()]);
        assert!(indexed(&node), "{node:?}");
        assert!(node.iter().any(|l| l.contains("node_load")), "{node:?}");
    }
}
