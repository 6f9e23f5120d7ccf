//! Pruning by age and row caps.

use super::Queries;
use crate::engine::EngineError;
use crate::store::{Store, Value};

impl<S: Store> Queries<'_, S> {
    /// Retention by age whatever the state, plus row caps.
    pub(crate) fn prune(
        &self,
        horizon_ms: i64,
        caps: &crate::engine::alarm::RowCaps,
    ) -> Result<(), EngineError> {
        let horizon = Value::Int(horizon_ms);
        for sql in [
            "DELETE FROM events WHERE updated_at < ?",
            "DELETE FROM sessions WHERE updated_at < ?",
            "DELETE FROM legs WHERE updated_at < ?",
        ] {
            self.run(sql, std::slice::from_ref(&horizon))?;
        }
        self.run(
            "DELETE FROM decisions WHERE decision_id <= (SELECT MAX(decision_id) FROM decisions) - ?",
            &[Value::Int(caps.decisions)],
        )?;
        self.run(
            "DELETE FROM events WHERE seq <= (SELECT MAX(seq) FROM events) - ?",
            &[Value::Int(caps.events)],
        )?;
        self.run(
            "DELETE FROM sessions WHERE call_session_id IN (SELECT call_session_id FROM sessions ORDER BY updated_at DESC LIMIT -1 OFFSET ?)",
            &[Value::Int(caps.sessions)],
        )?;
        self.run(
            "DELETE FROM legs WHERE call_control_id IN (SELECT call_control_id FROM legs ORDER BY updated_at DESC LIMIT -1 OFFSET ?)",
            &[Value::Int(caps.legs)],
        )?;
        Ok(())
    }
}
