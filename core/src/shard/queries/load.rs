//! Decisions, and each node's maintained open-call count (`node_load`,
//! kept by triggers from the sessions' states).

use super::{int, text, Queries};
use crate::error::EngineError;
use crate::messages::PerNode;
use crate::store::{Store, Value};

/// A node's open calls: one primary-key read.
pub(super) const OPEN_CALLS: &str = "SELECT open_calls FROM node_load WHERE node = ?";

impl<S: Store> Queries<'_, S> {
    /// A node's open calls: one primary-key read.
    pub(crate) fn open_calls(&self, node: &str) -> Result<u32, EngineError> {
        Ok(self
            .first_int(OPEN_CALLS, &[node.into()])?
            .map_or(0, |n| n.max(0) as u32))
    }

    /// Every node's open calls, in one read (nodes with none are absent).
    pub(crate) fn all_open_calls(&self) -> Result<PerNode<u32>, EngineError> {
        Ok(self
            .run(
                "SELECT node, open_calls FROM node_load WHERE open_calls > 0",
                &[],
            )?
            .iter()
            .filter_map(|r| Some((text(r, 0)?, int(r, 1)?.max(0) as u32)))
            .collect())
    }

    pub(crate) fn insert_decision(
        &self,
        id: u64,
        now_ms: i64,
        session: Option<&str>,
        event: Option<&str>,
        body: &str,
    ) -> Result<(), EngineError> {
        self.run(
            "INSERT INTO decisions (decision_id, at, call_session_id, event_id, body) VALUES (?, ?, ?, ?, ?)",
            &[
                id.into(),
                Value::Int(now_ms),
                session.into(),
                event.into(),
                body.into(),
            ],
        )?;
        Ok(())
    }

    /// Decision ids and bodies: newest first, or, `after` a decision id,
    /// oldest first from there (the paged read).
    pub(crate) fn decisions(
        &self,
        limit: u32,
        session: Option<&str>,
        after: Option<u64>,
    ) -> Result<Vec<(i64, String)>, EngineError> {
        let limit = Value::Int(i64::from(limit));
        let rows = match (after, session) {
            (Some(after), session) => self.run(
                "SELECT decision_id, body FROM decisions WHERE decision_id > ?1 AND (?2 IS NULL OR call_session_id = ?2) ORDER BY decision_id LIMIT ?3",
                &[after.into(), session.into(), limit],
            )?,
            (None, Some(id)) => self.run(
                "SELECT decision_id, body FROM decisions WHERE call_session_id = ? ORDER BY decision_id DESC LIMIT ?",
                &[id.into(), limit],
            )?,
            (None, None) => self.run(
                "SELECT decision_id, body FROM decisions ORDER BY decision_id DESC LIMIT ?",
                &[limit],
            )?,
        };
        Ok(rows
            .iter()
            .filter_map(|r| Some((int(r, 0)?, text(r, 1)?)))
            .collect())
    }
}
