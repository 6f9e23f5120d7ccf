//! A bench-only operation: the SQL writes of one new-call assignment and
//! its delivery report, and nothing else.
//!
//! `make bench` compares the assignments per second the Dispatcher sustains
//! with the rate of the same Dispatcher doing only these writes: the same
//! statements (the same named [`Queries`](super::queries) functions), in the
//! same two atomic units (two storage commits), but no read, no decision, no
//! forward and no alarm. The ratio says how far the real path is from what
//! its storage alone allows. It exists only with the `testing` feature (test
//! and bench builds), and the Dispatcher serves it only under the test-only
//! switch `CALLFENCE_TEST_WRITES_ONLY` as well; the rows it writes are real sessions, events and decisions
//! of node `node`.

use super::queries::{NewEvent, NewSession};
use super::rows::event_state as st;
use super::{CallShard, EngineError};
use crate::store::Store;

/// The decision body written for each assignment: a real decision's shape
/// and size, with fixed evidence (no decision is made).
const DECISION_BODY: &str = r#"{"decision_id":0,"at":"2026-12-02T00:00:00.000Z","call_session_id":"bench","event_id":"bench","policy_revision":1,"nodes_revision":1,"rule":"default_node","line_id":null,"prefers":"M1","chosen":"M1","chosen_sha":"9b4082d1c0ffee00112233445566778899aabbcc","chosen_clean":true,"epoch":1,"reasons":[],"outcome":"assigned"}"#;

impl<S: Store> CallShard<S> {
    /// The first unit: what a new inbound call `id` assigned to `node` (at
    /// `origin_url`) writes: the ledger's counters, the session, its leg,
    /// the epoch and decision counters, the ownership, the decision and the
    /// event, with `body` as the event's body. The caller then awaits (on
    /// the Durable Object, so that the unit commits on its own, as the
    /// decision does before its forward) and calls
    /// [`CallShard::writes_only_deliver`].
    pub fn writes_only_assign(
        &self,
        id: &str,
        node: &str,
        origin_url: &str,
        body: &str,
        now_ms: i64,
    ) -> Result<(), EngineError> {
        let q = self.q();
        self.unit(|| {
            let seq = q.counters(&["event_seq"], &[("last_webhook_at", now_ms)])?[0];
            q.insert_session(
                &NewSession {
                    id,
                    direction: Some("incoming"),
                    caller: Some("+14155550100"),
                    called: Some("+14155550199"),
                    now_ms,
                },
                self.config.session_cap,
            )?;
            q.track_leg(id, id, None, now_ms)?;
            let ids = q.counters(&["epoch", "decision"], &[])?;
            let (epoch, decision) = (ids[0], ids[1]);
            q.own_session(id, None, node, epoch, origin_url, now_ms)?;
            q.insert_decision(decision, now_ms, Some(id), Some(id), DECISION_BODY)?;
            let lease = now_ms + self.config.forward_timeout_ms;
            q.insert_event(&NewEvent {
                event_id: id,
                seq,
                session: Some(id),
                call_control_id: Some(id),
                event_type: "call.initiated",
                state: st::FORWARDING,
                body,
                headers: "[]",
                now_ms,
                pending_until: None,
                attempt: Some((node, epoch, lease)),
            })
        })
    }

    /// The second unit: what the delivery report of call `id` writes (the
    /// event delivered, the node's forward health).
    pub fn writes_only_deliver(&self, id: &str, now_ms: i64) -> Result<(), EngineError> {
        let q = self.q();
        self.unit(|| q.mark_delivered(id, Some(200), Some(r#"{"ok":true}"#.to_owned()), now_ms))
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use crate::config::EngineConfig;
    use crate::store::sqlite::SqliteStore;
    use crate::store::{migrate, StoreError, Value};
    use std::cell::RefCell;

    /// Records every statement.
    struct Recording {
        inner: SqliteStore,
        sql: RefCell<Vec<String>>,
    }

    impl Store for Recording {
        fn exec(&self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>, StoreError> {
            self.sql.borrow_mut().push(sql.to_owned());
            self.inner.exec(sql, params)
        }

        fn atomically<T, E: From<StoreError>>(
            &self,
            work: impl FnOnce() -> Result<T, E>,
        ) -> Result<T, E> {
            self.inner.atomically(work)
        }
    }

    #[test]
    fn it_writes_a_delivered_assigned_call_in_eight_writes() {
        let store = Recording {
            inner: SqliteStore::in_memory().unwrap(),
            sql: RefCell::new(Vec::new()),
        };
        migrate(&store, 0).unwrap();
        let engine = CallShard::new(store, EngineConfig::default());
        engine.store().sql.borrow_mut().clear();
        engine
            .writes_only_assign("s1", "M1", "https://m1.example/t", "{}", 1_000)
            .unwrap();
        engine.writes_only_deliver("s1", 1_001).unwrap();
        let sql = engine.store().sql.borrow().clone();
        assert_eq!(sql.len(), 8, "{sql:#?}");
        assert!(sql.iter().all(|s| !s.starts_with("SELECT")), "{sql:#?}");
        let call = engine.call("s1").unwrap().expect("the session exists");
        let text = serde_json::to_string(&call).unwrap();
        assert!(text.contains("\"M1\""), "{text}");
        assert!(text.contains("delivered"), "{text}");
        // A second call with the same id is refused (its event exists): the
        // unit rolls back instead of writing a twin.
        assert!(engine
            .writes_only_assign("s1", "M1", "https://m1.example/t", "{}", 2_000)
            .is_err());
    }
}
