//! Pruning by age and row caps, and the eviction that makes room for a new
//! session at `SESSION_CAP`. Every statement here spares live sessions
//! (`live!`) and the legs and events of one: a row cap is met by evicting
//! settled rows only, never by evicting a call in progress (SPEC §9).

use super::{text, NewSession, Queries};
use crate::error::EngineError;
use crate::shard::rows::{session_at, SessionRow};
use crate::store::{Store, Value};

/// `DELETE FROM sessions` of the oldest settled sessions beyond the first
/// parameter's row count (0 when within it), via `sessions_settled`.
const EVICT_SETTLED: &str = concat!(
    "DELETE FROM sessions WHERE call_session_id IN (SELECT call_session_id FROM sessions WHERE ",
    settled!(""),
    " ORDER BY updated_at LIMIT MAX(0, COALESCE((SELECT rows FROM table_rows WHERE name = 'sessions'), 0) - ?)) RETURNING call_session_id"
);

/// A row of `$table` (`events`, `legs`) whose session is live.
macro_rules! held {
    ($table:literal) => {
        concat!(
            "EXISTS (SELECT 1 FROM sessions s WHERE s.call_session_id = ",
            $table,
            ".call_session_id AND ",
            live!("s."),
            ")"
        )
    };
}

impl<S: Store> Queries<'_, S> {
    /// Retention by age, then row caps, of whatever holds no live call; a
    /// session pruned takes its legs and events with it.
    pub(crate) fn prune(
        &self,
        horizon_ms: i64,
        caps: &crate::shard::alarm::RowCaps,
    ) -> Result<(), EngineError> {
        let horizon = Value::Int(horizon_ms);
        let aged = self.run(
            concat!(
                "DELETE FROM sessions WHERE updated_at < ? AND NOT (",
                live!(""),
                ") RETURNING call_session_id"
            ),
            std::slice::from_ref(&horizon),
        )?;
        self.forget_rows_of(&aged)?;
        for sql in [
            concat!(
                "DELETE FROM events WHERE updated_at < ? AND NOT ",
                held!("events")
            ),
            concat!(
                "DELETE FROM legs WHERE updated_at < ? AND NOT ",
                held!("legs")
            ),
        ] {
            self.run(sql, std::slice::from_ref(&horizon))?;
        }
        self.run(
            "DELETE FROM decisions WHERE decision_id <= (SELECT MAX(decision_id) FROM decisions) - ?",
            &[Value::Int(caps.decisions)],
        )?;
        self.evict_settled(caps.sessions)?;
        self.run(
            concat!(
                "DELETE FROM events WHERE seq <= (SELECT MAX(seq) FROM events) - ? AND NOT ",
                held!("events")
            ),
            &[Value::Int(caps.events)],
        )?;
        self.run(
            concat!(
                "DELETE FROM legs WHERE call_control_id IN (SELECT call_control_id FROM legs ORDER BY updated_at DESC LIMIT -1 OFFSET ?) AND NOT ",
                held!("legs")
            ),
            &[Value::Int(caps.legs)],
        )?;
        Ok(())
    }

    /// Deletes the oldest settled sessions, with their legs and events,
    /// until at most `keep` sessions are left (or no settled one is);
    /// returns how many sessions it deleted.
    pub(crate) fn evict_settled(&self, keep: i64) -> Result<usize, EngineError> {
        let evicted = self.run(EVICT_SETTLED, &[Value::Int(keep)])?;
        self.forget_rows_of(&evicted)?;
        Ok(evicted.len())
    }

    /// Deletes the legs and events of the sessions just deleted (rows of
    /// their ids): none of their events is left due for a re-drive with no
    /// session to send it to.
    fn forget_rows_of(&self, sessions: &[crate::store::Row]) -> Result<(), EngineError> {
        for id in sessions.iter().filter_map(|r| text(r, 0)) {
            for sql in [
                "DELETE FROM events WHERE call_session_id = ?",
                "DELETE FROM legs WHERE call_session_id = ?",
            ] {
                self.run(sql, &[id.as_str().into()])?;
            }
        }
        Ok(())
    }

    /// Creates an unowned session if the table holds fewer than `cap` rows;
    /// `None` when it already exists or the table is at its cap.
    pub(crate) fn insert_session(
        &self,
        s: &NewSession<'_>,
        cap: i64,
    ) -> Result<Option<SessionRow>, EngineError> {
        let sql = concat!("INSERT INTO sessions (call_session_id, state, direction, caller, called, created_at, updated_at) \
             SELECT ?, 'pending_assignment', ?, ?, ?, ?, ? WHERE COALESCE((SELECT rows FROM table_rows WHERE name = 'sessions'), 0) < ? \
             ON CONFLICT (call_session_id) DO NOTHING RETURNING ", session_cols!());
        self.run(
            sql,
            &[
                s.id.into(),
                s.direction.into(),
                s.caller.into(),
                s.called.into(),
                Value::Int(s.now_ms),
                Value::Int(s.now_ms),
                Value::Int(cap),
            ],
        )?
        .first()
        .map(|r| session_at(r, 0))
        .transpose()
    }

    /// Rows stored in `sessions` (maintained by triggers: one indexed read).
    pub(crate) fn count_sessions(&self) -> Result<i64, EngineError> {
        Ok(self
            .first_int("SELECT rows FROM table_rows WHERE name = 'sessions'", &[])?
            .unwrap_or(0))
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use crate::store::migrate;
    use crate::store::sqlite::SqliteStore;

    #[test]
    fn eviction_reads_the_partial_index_of_settled_sessions() {
        let store = SqliteStore::in_memory().unwrap();
        migrate(&store, 0).unwrap();
        let plan: Vec<String> = store
            .exec(
                &format!("EXPLAIN QUERY PLAN {EVICT_SETTLED}"),
                &[Value::Int(1)],
            )
            .unwrap()
            .iter()
            .filter_map(|r| text(r, 3))
            .collect();
        assert!(
            plan.iter().any(|l| l.contains("sessions_settled")),
            "{plan:?}"
        );
    }
}
