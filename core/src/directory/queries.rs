//! The directory's SQL: heartbeats, forward health, seq regressions and
//! documents, one named function each, visible only inside the directory.
//! The probe's times are named counters (`probe_at:<node>`).

use crate::error::EngineError;
use crate::messages::{Health, PerNode};
use crate::sql::{int, text, Queries};
use crate::store::{Store, Value};

/// A node's last accepted beat as the replay and seq checks read it.
pub(in crate::directory) struct LastBeat {
    pub seq: i64,
    pub body_sha256: String,
    pub answer: String,
}

impl<S: Store> Queries<'_, S> {
    pub(in crate::directory) fn last_beat(
        &self,
        node: &str,
    ) -> Result<Option<LastBeat>, EngineError> {
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
    pub(in crate::directory) fn beat(
        &self,
        node: &str,
    ) -> Result<Option<(String, i64, i64)>, EngineError> {
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
    pub(in crate::directory) fn store_beat(
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

    /// Every node's forward health, in one read.
    pub(in crate::directory) fn all_health(&self) -> Result<PerNode<Health>, EngineError> {
        Ok(self
            .run(
                "SELECT node, last_failure_at, last_delivery_at FROM node_health",
                &[],
            )?
            .iter()
            .filter_map(|r| {
                Some((
                    text(r, 0)?,
                    Health {
                        last_failure_at_ms: int(r, 1),
                        last_delivery_at_ms: int(r, 2),
                    },
                ))
            })
            .collect())
    }

    /// Stores a node's forward health.
    pub(in crate::directory) fn store_health(
        &self,
        node: &str,
        health: Health,
    ) -> Result<(), EngineError> {
        self.run(
            "INSERT INTO node_health (node, last_failure_at, last_delivery_at) VALUES (?, ?, ?) \
             ON CONFLICT (node) DO UPDATE SET last_failure_at = excluded.last_failure_at, \
             last_delivery_at = excluded.last_delivery_at",
            &[
                node.into(),
                health.last_failure_at_ms.into(),
                health.last_delivery_at_ms.into(),
            ],
        )?;
        Ok(())
    }

    /// Counts a heartbeat refused `stale_seq` that was not a re-send.
    pub(in crate::directory) fn mark_seq_regression(
        &self,
        node: &str,
        now_ms: i64,
    ) -> Result<(), EngineError> {
        self.run(
            "INSERT INTO node_seq_regressions (node, regressions, last_at) VALUES (?, 1, ?) \
             ON CONFLICT (node) DO UPDATE SET regressions = regressions + 1, last_at = excluded.last_at",
            &[node.into(), Value::Int(now_ms)],
        )?;
        Ok(())
    }

    /// Every node's seq regressions: (count, time of the last).
    pub(in crate::directory) fn all_seq_regressions(
        &self,
    ) -> Result<PerNode<(i64, i64)>, EngineError> {
        Ok(self
            .run(
                "SELECT node, regressions, last_at FROM node_seq_regressions",
                &[],
            )?
            .iter()
            .filter_map(|r| Some((text(r, 0)?, (int(r, 1)?, int(r, 2)?))))
            .collect())
    }

    /// Nodes with stored beats, forward health or seq regressions.
    pub(in crate::directory) fn known_nodes(&self) -> Result<Vec<String>, EngineError> {
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
    pub(in crate::directory) fn forget_node(&self, node: &str) -> Result<(), EngineError> {
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
    pub(in crate::directory) fn latest_document(
        &self,
        kind: &str,
    ) -> Result<Option<(i64, String)>, EngineError> {
        Ok(self
            .run(
                "SELECT revision, body FROM documents WHERE kind = ? ORDER BY revision DESC LIMIT 1",
                &[kind.into()],
            )?
            .first()
            .and_then(|r| Some((int(r, 0)?, text(r, 1)?))))
    }

    pub(in crate::directory) fn document(
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

    /// Every kept revision of a document, oldest first: revision, body,
    /// write time.
    pub(in crate::directory) fn document_history(
        &self,
        kind: &str,
    ) -> Result<Vec<(i64, String, i64)>, EngineError> {
        self.run(
            "SELECT revision, body, written_at FROM documents WHERE kind = ? ORDER BY revision",
            &[kind.into()],
        )?
        .iter()
        .map(|r| {
            let row = || Some((int(r, 0)?, text(r, 1)?, int(r, 2)?));
            row().ok_or_else(|| EngineError::Corrupt("stored document row".into()))
        })
        .collect()
    }

    /// Stores revision `revision` and drops those older than the kept ones.
    pub(in crate::directory) fn insert_document(
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
}

/// One shard's row of `shard_leases`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::directory) struct LeaseRow {
    pub shard: u32,
    pub seq: u64,
    pub until_ms: i64,
    pub open: PerNode<u32>,
    pub caps: PerNode<u32>,
}

/// A per-node table as a JSON object.
fn per_node_json(table: &PerNode<u32>) -> String {
    let object: serde_json::Map<String, serde_json::Value> = table
        .iter()
        .map(|(node, n)| (node.to_owned(), (*n).into()))
        .collect();
    serde_json::Value::Object(object).to_string()
}

/// A per-node table from its JSON object.
fn per_node_parse(text: &str) -> Result<PerNode<u32>, EngineError> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| EngineError::Corrupt(e.to_string()))?;
    let object = value
        .as_object()
        .ok_or_else(|| EngineError::Corrupt("shard_leases table".into()))?;
    Ok(object
        .iter()
        .map(|(node, n)| (node.clone(), n.as_u64().unwrap_or(0) as u32))
        .collect())
}

impl<S: Store> Queries<'_, S> {
    /// Every shard's lease row.
    pub(in crate::directory) fn lease_rows(&self) -> Result<Vec<LeaseRow>, EngineError> {
        self.run(
            "SELECT shard, seq, until_ms, open, caps FROM shard_leases ORDER BY shard",
            &[],
        )?
        .iter()
        .map(|r| {
            Ok(LeaseRow {
                shard: int(r, 0).unwrap_or(0) as u32,
                seq: int(r, 1).unwrap_or(0) as u64,
                until_ms: int(r, 2).unwrap_or(0),
                open: per_node_parse(&text(r, 3).unwrap_or_default())?,
                caps: per_node_parse(&text(r, 4).unwrap_or_default())?,
            })
        })
        .collect()
    }

    /// Stores a shard's lease row, replacing the one it had.
    pub(in crate::directory) fn store_lease(&self, row: &LeaseRow) -> Result<(), EngineError> {
        self.run(
            "INSERT INTO shard_leases (shard, seq, until_ms, open, caps) VALUES (?, ?, ?, ?, ?) \
             ON CONFLICT (shard) DO UPDATE SET seq = excluded.seq, until_ms = excluded.until_ms, \
             open = excluded.open, caps = excluded.caps",
            &[
                Value::Int(i64::from(row.shard)),
                Value::Int(row.seq as i64),
                Value::Int(row.until_ms),
                per_node_json(&row.open).into(),
                per_node_json(&row.caps).into(),
            ],
        )?;
        Ok(())
    }
}
