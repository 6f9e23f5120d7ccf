//! Nodes as the Dispatcher sees them: accepted heartbeats, forward health,
//! open-call counts, and the facts eligibility is decided on.

use super::rows::OPEN_STATES;
use super::{Engine, EngineError};
use crate::eligibility::{self, Beat, Candidacy, NodeFacts, Reason};
use crate::encoding::sha256_hex;
use crate::heartbeat::{self, routing_hash};
use crate::store::{Store, Value};
use crate::time::format_ms;
use serde::Serialize;
use serde_json::{json, Value as Json};
use std::collections::BTreeMap;

/// Why a heartbeat was refused; nothing is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeartbeatRefusal {
    /// Malformed, or `node` differs from `Callfence-Node` (400).
    Invalid(String),
    /// `seq` is not greater than the last accepted one (409).
    StaleSeq,
    /// The node is no longer in the registry (401).
    UnknownNode,
    /// The store failed.
    Engine(EngineError),
}

impl HeartbeatRefusal {
    /// The stable error code.
    pub fn code(&self) -> &'static str {
        match self {
            HeartbeatRefusal::Invalid(_) => "invalid_heartbeat",
            HeartbeatRefusal::StaleSeq => "stale_seq",
            HeartbeatRefusal::UnknownNode => "unknown_node_key",
            HeartbeatRefusal::Engine(e) => e.code(),
        }
    }
}

impl From<EngineError> for HeartbeatRefusal {
    fn from(e: EngineError) -> Self {
        HeartbeatRefusal::Engine(e)
    }
}

/// One public key of one node, for the Worker's signature cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeKey {
    /// The node id.
    pub node: String,
    /// The key id.
    pub kid: String,
    /// Base64 of the raw 32-byte Ed25519 public key.
    pub public_key: String,
}

/// Per-node state the engine keeps besides the registry.
#[derive(Debug, Clone, Default)]
pub(crate) struct NodeState {
    pub beat: Option<Beat>,
    pub open_calls: u32,
    pub last_failure_at_ms: Option<i64>,
    pub last_delivery_at_ms: Option<i64>,
}

impl NodeState {
    pub(crate) fn facts<'a>(
        &'a self,
        entry: Option<&'a crate::registry::NodeEntry>,
    ) -> NodeFacts<'a> {
        NodeFacts {
            entry,
            beat: self.beat.as_ref(),
            open_calls: self.open_calls,
            last_failure_at_ms: self.last_failure_at_ms,
            last_delivery_at_ms: self.last_delivery_at_ms,
        }
    }
}

impl<S: Store> Engine<S> {
    /// Every key of every registered node, and the registry revision.
    pub fn node_keys(&self) -> Result<(u64, Vec<NodeKey>), EngineError> {
        let Some((revision, registry)) = self.registry()? else {
            return Ok((0, Vec::new()));
        };
        let keys = registry
            .nodes
            .iter()
            .flat_map(|(node, entry)| {
                entry.keys.iter().map(move |(kid, key)| NodeKey {
                    node: node.clone(),
                    kid: kid.clone(),
                    public_key: key.clone(),
                })
            })
            .collect();
        Ok((revision, keys))
    }

    /// `POST /v1/nodes/heartbeat`, after the Worker verified the node
    /// signature. `signed_at_s` is the `Callfence-Timestamp`.
    pub fn handle_heartbeat(
        &self,
        node: &str,
        signed_at_s: i64,
        body: &[u8],
        now_ms: i64,
    ) -> Result<Json, HeartbeatRefusal> {
        let Some((_, registry)) = self.registry()? else {
            return Err(HeartbeatRefusal::UnknownNode);
        };
        let Some(entry) = registry.nodes.get(node) else {
            return Err(HeartbeatRefusal::UnknownNode);
        };
        let digest = sha256_hex(body);
        let last = self.exec(
            "SELECT seq, body_sha256, answer FROM heartbeats WHERE node = ?",
            &[node.into()],
        )?;
        let last = last.first();
        if let Some(row) = last {
            if row.get(1).and_then(Value::as_text) == Some(digest.as_str()) {
                let answer = row.get(2).and_then(Value::as_text).unwrap_or("{}");
                return serde_json::from_str(answer)
                    .map_err(|_| EngineError::Corrupt("stored heartbeat answer".into()).into());
            }
        }
        let beat =
            heartbeat::parse(body, node).map_err(|e| HeartbeatRefusal::Invalid(e.to_string()))?;
        let last_seq = last
            .and_then(|r| r.first())
            .and_then(Value::as_int)
            .unwrap_or(0);
        if beat.seq as i64 <= last_seq {
            return Err(HeartbeatRefusal::StaleSeq);
        }
        let signed_at_ms = signed_at_s.saturating_mul(1000);
        let stored = Beat {
            heartbeat: beat,
            received_at_ms: now_ms,
            signed_at_ms,
        };
        let mut state = self.node_state(node, None)?;
        state.beat = Some(stored.clone());
        let reasons =
            eligibility::check(&state.facts(Some(entry)), Candidacy::General, None, now_ms);
        let lines = self
            .policy()?
            .map(|(_, p)| p.routing_lines())
            .unwrap_or_default();
        let answer = json!({
            "accepted": true,
            "eligible": reasons.is_empty(),
            "reasons": reasons,
            "edge_time": format_ms(now_ms),
            "routing": {"hash": routing_hash(&lines), "lines": lines},
            "allowed_shas": entry.allowed_shas,
        });
        let body_text = String::from_utf8_lossy(body).into_owned();
        self.exec(
            "INSERT INTO heartbeats (node, seq, body, body_sha256, received_at, signed_at, answer) VALUES (?, ?, ?, ?, ?, ?, ?) \
             ON CONFLICT (node) DO UPDATE SET seq = excluded.seq, body = excluded.body, body_sha256 = excluded.body_sha256, \
             received_at = excluded.received_at, signed_at = excluded.signed_at, answer = excluded.answer",
            &[
                node.into(),
                stored.heartbeat.seq.into(),
                body_text.into(),
                digest.into(),
                Value::Int(now_ms),
                Value::Int(signed_at_ms),
                answer.to_string().into(),
            ],
        )?;
        Ok(answer)
    }

    /// The last accepted beat of a node.
    pub(crate) fn beat(&self, node: &str) -> Result<Option<Beat>, EngineError> {
        let rows = self.exec(
            "SELECT body, received_at, signed_at FROM heartbeats WHERE node = ?",
            &[node.into()],
        )?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let body = row.first().and_then(Value::as_text).unwrap_or_default();
        let heartbeat = heartbeat::parse(body.as_bytes(), node)
            .map_err(|_| EngineError::Corrupt("stored heartbeat".into()))?;
        Ok(Some(Beat {
            heartbeat,
            received_at_ms: row.get(1).and_then(Value::as_int).unwrap_or(0),
            signed_at_ms: row.get(2).and_then(Value::as_int).unwrap_or(0),
        }))
    }

    /// Open calls assigned to `node`, not counting `except` (the call being
    /// decided). The count reads the `(owner, state)` index only.
    pub(crate) fn open_calls(&self, node: &str, except: Option<&str>) -> Result<u32, EngineError> {
        let one = |sql: &str, params: &[Value]| {
            Ok::<_, EngineError>(self.scalar(sql, params)?.unwrap_or(0))
        };
        let all = one(
            &format!("SELECT COUNT(*) FROM sessions WHERE owner = ? AND state IN {OPEN_STATES}"),
            &[node.into()],
        )?;
        let own = match except {
            Some(id) => one(
                &format!("SELECT COUNT(*) FROM sessions WHERE call_session_id = ? AND owner = ? AND state IN {OPEN_STATES}"),
                &[id.into(), node.into()],
            )?,
            None => 0,
        };
        Ok((all - own).max(0) as u32)
    }

    /// Everything eligibility needs about a node, except the registry entry.
    pub(crate) fn node_state(
        &self,
        node: &str,
        except: Option<&str>,
    ) -> Result<NodeState, EngineError> {
        let health = self.exec(
            "SELECT last_failure_at, last_delivery_at FROM node_health WHERE node = ?",
            &[node.into()],
        )?;
        let health = health.first();
        Ok(NodeState {
            beat: self.beat(node)?,
            open_calls: self.open_calls(node, except)?,
            last_failure_at_ms: health.and_then(|r| r.first()).and_then(Value::as_int),
            last_delivery_at_ms: health.and_then(|r| r.get(1)).and_then(Value::as_int),
        })
    }

    /// The state of every registered node (for views).
    pub(crate) fn all_node_states(&self) -> Result<BTreeMap<String, NodeState>, EngineError> {
        let Some((_, registry)) = self.registry()? else {
            return Ok(BTreeMap::new());
        };
        registry
            .nodes
            .keys()
            .map(|n| Ok((n.clone(), self.node_state(n, None)?)))
            .collect()
    }

    /// Records a forward failure (`recent_forward_failure` for 30 s).
    pub(crate) fn mark_failure(&self, node: &str, now_ms: i64) -> Result<(), EngineError> {
        self.exec(
            "INSERT INTO node_health (node, last_failure_at) VALUES (?, ?) \
             ON CONFLICT (node) DO UPDATE SET last_failure_at = excluded.last_failure_at",
            &[node.into(), Value::Int(now_ms)],
        )?;
        Ok(())
    }

    /// Records a delivery, which clears `recent_forward_failure`.
    pub(crate) fn mark_delivery(&self, node: &str, now_ms: i64) -> Result<(), EngineError> {
        self.exec(
            "INSERT INTO node_health (node, last_delivery_at) VALUES (?, ?) \
             ON CONFLICT (node) DO UPDATE SET last_delivery_at = excluded.last_delivery_at",
            &[node.into(), Value::Int(now_ms)],
        )?;
        Ok(())
    }

    /// The general (call-independent) reasons a node is ineligible now.
    pub(crate) fn general_reasons(
        &self,
        node: &str,
        state: &NodeState,
        now_ms: i64,
    ) -> Result<Vec<Reason>, EngineError> {
        let registry = self.registry()?;
        let entry = registry.as_ref().and_then(|(_, r)| r.nodes.get(node));
        Ok(eligibility::check(
            &state.facts(entry),
            Candidacy::General,
            None,
            now_ms,
        ))
    }
}
