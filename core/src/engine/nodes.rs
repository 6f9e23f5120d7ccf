//! Nodes as the Dispatcher sees them: who is calling (node and key id,
//! checked against the current registry), accepted heartbeats, forward
//! health, open-call counts, and the facts eligibility is decided on.

use super::marks::{ForwardMark, ForwardResult};
use super::rows::SessionRow;
use super::view::{lists_key, DirectoryView, NodeState, VIEW_VERSION};
use super::{Engine, EngineError};
use crate::eligibility::{self, Beat, Candidacy};
use crate::encoding::sha256_hex;
use crate::heartbeat;
use crate::store::Store;
use crate::wire::{HeartbeatAnswer, RoutingView};
use serde::Serialize;
use serde_json::Value as Json;
use std::collections::BTreeMap;
use std::rc::Rc;

/// The node a node-signed request comes from, and the key id it was signed
/// with (`Callfence-Node`, `Callfence-Key-Id`), already verified by the
/// Worker against its key cache. Every node operation re-checks the pair
/// against the current registry in its own unit: the cache may lag a
/// registry change, and a removed key is refused (`unknown_node_key`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller<'a> {
    /// The node id.
    pub node: &'a str,
    /// The key id.
    pub kid: &'a str,
}

/// Why a heartbeat was refused; nothing is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
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

impl From<EngineError> for HeartbeatRefusal {
    fn from(e: EngineError) -> Self {
        HeartbeatRefusal::Engine(e)
    }
}

impl From<crate::store::StoreError> for HeartbeatRefusal {
    fn from(e: crate::store::StoreError) -> Self {
        HeartbeatRefusal::Engine(e.into())
    }
}

/// One public key of one node, for the Worker's signature cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct NodeKey {
    /// The node id.
    pub node: String,
    /// The key id.
    pub kid: String,
    /// Base64 of the raw 32-byte Ed25519 public key.
    pub public_key: String,
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

    /// True when `caller`'s node and key id are in the current registry.
    pub fn key_in_force(&self, caller: Caller<'_>) -> Result<bool, EngineError> {
        let registry = self.registry()?;
        Ok(lists_key(
            registry.as_ref().map(|(_, r)| &**r),
            caller.node,
            caller.kid,
        ))
    }

    /// `POST /v1/nodes/heartbeat`, after the Worker verified the node
    /// signature. `signed_at_s` is the `Callfence-Timestamp`. One unit: the
    /// replay and seq checks and the write cannot be split. A beat refused
    /// `stale_seq` stores nothing of itself, but counts a seq regression
    /// against the node (shown in status): beats that go backwards mean
    /// another signer holds its key, or its seq file was restored.
    pub fn handle_heartbeat(
        &self,
        caller: Caller<'_>,
        signed_at_s: i64,
        body: &[u8],
        now_ms: i64,
    ) -> Result<Json, HeartbeatRefusal> {
        let node = caller.node;
        let result = self.unit(|| {
            if !self.key_in_force(caller)? {
                return Err(HeartbeatRefusal::UnknownNode);
            }
            let Some((_, registry)) = self.registry()? else {
                return Err(HeartbeatRefusal::UnknownNode);
            };
            let entry = registry
                .nodes
                .get(node)
                .ok_or(HeartbeatRefusal::UnknownNode)?;
            let digest = sha256_hex(body);
            let last = self.q().last_beat(node)?;
            if let Some(last) = &last {
                if last.body_sha256 == digest {
                    let answer = serde_json::from_str(&last.answer)
                        .map_err(|_| EngineError::Corrupt("stored heartbeat answer".into()))?;
                    return Ok((answer, None));
                }
            }
            let beat = heartbeat::parse(body, node)
                .map_err(|e| HeartbeatRefusal::Invalid(e.to_string()))?;
            if beat.seq as i64 <= last.map_or(0, |l| l.seq) {
                return Err(HeartbeatRefusal::StaleSeq);
            }
            let signed_at_ms = signed_at_s.saturating_mul(1000);
            let stored = Rc::new(Beat {
                heartbeat: beat,
                received_at_ms: now_ms,
                signed_at_ms,
            });
            let mut state = self.node_state(node, None)?;
            state.beat = Some(stored.clone());
            let reasons =
                eligibility::check(&state.facts(Some(entry)), Candidacy::General, None, now_ms);
            let lines = self
                .policy()?
                .map(|(_, p)| p.routing_lines())
                .unwrap_or_default();
            let answer = serde_json::to_value(HeartbeatAnswer::new(
                &reasons,
                now_ms,
                RoutingView::of(lines),
                entry.allowed_shas.clone(),
            ))
            .map_err(|_| EngineError::Corrupt("heartbeat answer".into()))?;
            self.q().store_beat(
                node,
                stored.heartbeat.seq,
                &String::from_utf8_lossy(body),
                &digest,
                now_ms,
                signed_at_ms,
                &answer.to_string(),
            )?;
            Ok((answer, Some(stored)))
        });
        if let Err(HeartbeatRefusal::StaleSeq) = &result {
            self.unit(|| self.q().mark_seq_regression(node, now_ms))?;
        }
        let (answer, stored) = result?;
        if let Some(beat) = stored {
            // Committed: the parsed beat replaces the cached one.
            self.cache
                .borrow_mut()
                .beats
                .insert(node.to_owned(), Some(beat));
        }
        Ok(answer)
    }

    /// The last accepted beat of a node (cached, parsed once per beat).
    pub(crate) fn beat(&self, node: &str) -> Result<Option<Rc<Beat>>, EngineError> {
        if let Some(cached) = self.cache.borrow().beats.get(node) {
            return Ok(cached.clone());
        }
        let beat = match self.q().beat(node)? {
            None => None,
            Some((body, received_at_ms, signed_at_ms)) => {
                let heartbeat = heartbeat::parse(body.as_bytes(), node)
                    .map_err(|_| EngineError::Corrupt("stored heartbeat".into()))?;
                Some(Rc::new(Beat {
                    heartbeat,
                    received_at_ms,
                    signed_at_ms,
                }))
            }
        };
        self.cache
            .borrow_mut()
            .beats
            .insert(node.to_owned(), beat.clone());
        Ok(beat)
    }

    /// Everything eligibility needs about a node, except the registry
    /// entry: its beat, forward health and open calls (a maintained count,
    /// one indexed read), not counting `except`, the call being decided.
    pub(crate) fn node_state(
        &self,
        node: &str,
        except: Option<&SessionRow>,
    ) -> Result<NodeState, EngineError> {
        let row = self.q().node(node)?;
        let own = i64::from(except.is_some_and(|s| s.loads(node)));
        Ok(NodeState {
            beat: self.beat(node)?,
            open_calls: (row.open_calls - own).max(0) as u32,
            last_failure_at_ms: row.last_failure_at_ms,
            last_delivery_at_ms: row.last_delivery_at_ms,
        })
    }

    /// The directory's view as of `now_ms` (SPEC §16): the documents in
    /// force and every registered node's beat, forward health and open
    /// calls, in one read besides the cached documents and beats. The shard
    /// side decides on this and reads no directory table.
    pub(crate) fn directory_view(&self, now_ms: i64) -> Result<DirectoryView, EngineError> {
        let registry = self.registry()?;
        let mut nodes = BTreeMap::new();
        if let Some((_, r)) = &registry {
            let mut rows = self.q().all_nodes()?;
            for node in r.nodes.keys() {
                let row = rows.remove(node).unwrap_or_default();
                let state = NodeState {
                    beat: self.beat(node)?,
                    open_calls: row.open_calls.max(0) as u32,
                    last_failure_at_ms: row.last_failure_at_ms,
                    last_delivery_at_ms: row.last_delivery_at_ms,
                };
                nodes.insert(node.clone(), state);
            }
        }
        Ok(DirectoryView {
            v: VIEW_VERSION,
            as_of_ms: now_ms,
            registry,
            policy: self.policy()?,
            nodes,
        })
    }

    /// Forgets the beats and forward health of nodes no longer registered
    /// (the directory's part of the alarm's retention).
    pub(crate) fn forget_unregistered(&self) -> Result<(), EngineError> {
        let q = self.q();
        let registered = self.registry()?.map(|(_, r)| r).unwrap_or_default();
        for node in q.known_nodes()? {
            if !registered.nodes.contains_key(&node) {
                q.forget_node(&node)?;
                self.cache.borrow_mut().beats.remove(&node);
            }
        }
        Ok(())
    }

    /// Applies a call shard's [`ForwardMark`] to the node's forward health.
    pub(crate) fn apply_forward_mark(&self, mark: &ForwardMark) -> Result<(), EngineError> {
        match mark.result {
            ForwardResult::Delivered => self.q().mark_delivery(&mark.node, mark.at_ms),
            ForwardResult::Failed => self.q().mark_failure(&mark.node, mark.at_ms),
        }
    }
}
