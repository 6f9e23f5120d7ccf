//! Heartbeats, forward health and open-call counts; documents; decisions.

use super::{int, text, LastBeat, NodeRow, Queries};
use crate::engine::EngineError;
use crate::store::{Store, Value};
use std::collections::BTreeMap;

/// A node's forward health and maintained open-call count: two primary-key
/// reads, whatever the number of open calls.
pub(super) const NODE_FACTS: &str =
    "SELECT (SELECT last_failure_at FROM node_health WHERE node = ?1), \
    (SELECT last_delivery_at FROM node_health WHERE node = ?1), \
    (SELECT open_calls FROM node_load WHERE node = ?1)";

/// [`NODE_FACTS`] for every node at once.
pub(super) const ALL_NODE_FACTS: &str =
    "SELECT n.node, h.last_failure_at, h.last_delivery_at, l.open_calls \
    FROM (SELECT node FROM node_health UNION SELECT node FROM node_load) AS n \
    LEFT JOIN node_health AS h ON h.node = n.node \
    LEFT JOIN node_load AS l ON l.node = n.node";

impl<S: Store> Queries<'_, S> {
    pub(crate) fn last_beat(&self, node: &str) -> Result<Option<LastBeat>, EngineError> {
        Ok(self
            .run(
                "SELECT seq, body_sha256, answer FROM heartbeats WHERE node = ?",
                &[node.into()],
            )?
            .first()
            .map(|r| LastBeat {
                seq: int(r, 0).unwrap_or(0),
                body_sha256: text(r, 1).unwrap_or_default(),
                answer: text(r, 2).unwrap_or_default(),
            }))
    }

    /// A node's stored beat: (body, received at, signed at).
    pub(crate) fn beat(&self, node: &str) -> Result<Option<(String, i64, i64)>, EngineError> {
        Ok(self
            .run(
                "SELECT body, received_at, signed_at FROM heartbeats WHERE node = ?",
                &[node.into()],
            )?
            .first()
            .map(|r| {
                (
                    text(r, 0).unwrap_or_default(),
                    int(r, 1).unwrap_or(0),
                    int(r, 2).unwrap_or(0),
                )
            }))
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn store_beat(
        &self,
        node: &str,
        seq: u64,
        body: &str,
        digest: &str,
        received_at: i64,
        signed_at: i64,
        answer: &str,
    ) -> Result<(), EngineError> {
        self.run(
            "INSERT INTO heartbeats (node, seq, body, body_sha256, received_at, signed_at, answer) VALUES (?, ?, ?, ?, ?, ?, ?) \
             ON CONFLICT (node) DO UPDATE SET seq = excluded.seq, body = excluded.body, body_sha256 = excluded.body_sha256, \
             received_at = excluded.received_at, signed_at = excluded.signed_at, answer = excluded.answer",
            &[
                node.into(),
                seq.into(),
                body.into(),
                digest.into(),
                Value::Int(received_at),
                Value::Int(signed_at),
                answer.into(),
            ],
        )?;
        Ok(())
    }

    /// A node's forward health and open calls, in one read.
    pub(crate) fn node(&self, node: &str) -> Result<NodeRow, EngineError> {
        let rows = self.run(NODE_FACTS, &[node.into()])?;
        let row = rows.first().cloned().unwrap_or_default();
        Ok(NodeRow {
            last_failure_at_ms: int(&row, 0),
            last_delivery_at_ms: int(&row, 1),
            open_calls: int(&row, 2).unwrap_or(0),
        })
    }

    /// The forward health and open calls of every node that has either, in
    /// one read (the directory's view; a node with neither is absent).
    pub(crate) fn all_nodes(&self) -> Result<BTreeMap<String, NodeRow>, EngineError> {
        let rows = self.run(ALL_NODE_FACTS, &[])?;
        Ok(rows
            .iter()
            .filter_map(|row| {
                let node = text(row, 0)?;
                Some((
                    node,
                    NodeRow {
                        last_failure_at_ms: int(row, 1),
                        last_delivery_at_ms: int(row, 2),
                        open_calls: int(row, 3).unwrap_or(0),
                    },
                ))
            })
            .collect())
    }

    /// Records a forward failure (`recent_forward_failure` for 30 s).
    pub(crate) fn mark_failure(&self, node: &str, now_ms: i64) -> Result<(), EngineError> {
        self.run(
            "INSERT INTO node_health (node, last_failure_at) VALUES (?, ?) \
             ON CONFLICT (node) DO UPDATE SET last_failure_at = excluded.last_failure_at",
            &[node.into(), Value::Int(now_ms)],
        )?;
        Ok(())
    }

    /// Records a delivery, which clears `recent_forward_failure`.
    pub(crate) fn mark_delivery(&self, node: &str, now_ms: i64) -> Result<(), EngineError> {
        self.run(
            "INSERT INTO node_health (node, last_delivery_at) VALUES (?, ?) \
             ON CONFLICT (node) DO UPDATE SET last_delivery_at = excluded.last_delivery_at",
            &[node.into(), Value::Int(now_ms)],
        )?;
        Ok(())
    }

    /// Counts a heartbeat refused `stale_seq` that was not a re-send.
    pub(crate) fn mark_seq_regression(&self, node: &str, now_ms: i64) -> Result<(), EngineError> {
        self.run(
            "INSERT INTO node_seq_regressions (node, regressions, last_at) VALUES (?, 1, ?) \
             ON CONFLICT (node) DO UPDATE SET regressions = regressions + 1, last_at = excluded.last_at",
            &[node.into(), Value::Int(now_ms)],
        )?;
        Ok(())
    }

    /// A node's seq regressions: (count, time of the last), if any.
    pub(crate) fn seq_regressions(&self, node: &str) -> Result<Option<(i64, i64)>, EngineError> {
        Ok(self
            .run(
                "SELECT regressions, last_at FROM node_seq_regressions WHERE node = ?",
                &[node.into()],
            )?
            .first()
            .and_then(|r| Some((int(r, 0)?, int(r, 1)?))))
    }

    /// Nodes with stored beats, forward health or seq regressions.
    pub(crate) fn known_nodes(&self) -> Result<Vec<String>, EngineError> {
        Ok(self
            .run(
                "SELECT node FROM heartbeats UNION SELECT node FROM node_health \
                 UNION SELECT node FROM node_seq_regressions",
                &[],
            )?
            .iter()
            .filter_map(|r| text(r, 0))
            .collect())
    }

    /// Forgets the beats, forward health and seq regressions of a node no
    /// longer registered.
    pub(crate) fn forget_node(&self, node: &str) -> Result<(), EngineError> {
        for sql in [
            "DELETE FROM heartbeats WHERE node = ?",
            "DELETE FROM node_health WHERE node = ?",
            "DELETE FROM node_seq_regressions WHERE node = ?",
        ] {
            self.run(sql, &[node.into()])?;
        }
        Ok(())
    }

    // ---- documents ---------------------------------------------------------

    /// The newest revision of a document kind and its stored body.
    pub(crate) fn latest_document(&self, kind: &str) -> Result<Option<(i64, String)>, EngineError> {
        Ok(self
            .run(
                "SELECT revision, body FROM documents WHERE kind = ? ORDER BY revision DESC LIMIT 1",
                &[kind.into()],
            )?
            .first()
            .and_then(|r| Some((int(r, 0)?, text(r, 1)?))))
    }

    pub(crate) fn document(
        &self,
        kind: &str,
        revision: u64,
    ) -> Result<Option<(i64, String)>, EngineError> {
        Ok(self
            .run(
                "SELECT revision, body FROM documents WHERE kind = ? AND revision = ?",
                &[kind.into(), revision.into()],
            )?
            .first()
            .and_then(|r| Some((int(r, 0)?, text(r, 1)?))))
    }

    /// Stores revision `revision` and drops those older than the kept ones.
    pub(crate) fn insert_document(
        &self,
        kind: &str,
        revision: u64,
        body: &str,
        writer_fp: &str,
        kept: i64,
        now_ms: i64,
    ) -> Result<(), EngineError> {
        self.run(
            "INSERT INTO documents (kind, revision, body, written_at, writer_fp) VALUES (?, ?, ?, ?, ?)",
            &[
                kind.into(),
                revision.into(),
                body.into(),
                Value::Int(now_ms),
                writer_fp.into(),
            ],
        )?;
        self.run(
            "DELETE FROM documents WHERE kind = ? AND revision <= ?",
            &[kind.into(), Value::Int(revision as i64 - kept)],
        )?;
        Ok(())
    }

    // ---- decisions ---------------------------------------------------------

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
