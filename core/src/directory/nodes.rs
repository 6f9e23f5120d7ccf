//! Nodes as the directory sees them: which keys are in force, accepted
//! heartbeats, and the view every call shard decides on.

use super::{Directory, EngineError};
use crate::eligibility::{self, Beat, Candidacy, NodeFacts};
use crate::encoding::sha256_hex;
use crate::heartbeat;
use crate::messages::{lists_key, DirectoryView, NodeState, VIEW_VERSION};
use crate::node_auth::Caller;
use crate::store::Store;
use crate::wire::{HeartbeatAnswer, RoutingView};
use serde::Serialize;
use serde_json::Value as Json;
use std::collections::BTreeMap;
use std::rc::Rc;

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

impl<S: Store> Directory<S> {
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
    /// signature. `signed_at_s` is the `Callfence-Timestamp`; `open_calls`
    /// is the calls the shards have open on the node (its answer's
    /// `capacity_exhausted` counts them). One unit: the
    /// replay and seq checks and the write cannot be split. A beat refused
    /// `stale_seq` stores nothing of itself, but counts a seq regression
    /// against the node (shown in status): beats that go backwards mean
    /// another signer holds its key, or its seq file was restored.
    pub fn handle_heartbeat(
        &self,
        caller: Caller<'_>,
        signed_at_s: i64,
        body: &[u8],
        open_calls: u32,
        now_ms: i64,
    ) -> Result<Json, HeartbeatRefusal> {
        let node = caller.node;
        let before = self.beat(node)?;
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
            let health = self.node_health(node)?;
            let facts = NodeFacts {
                entry: Some(entry),
                beat: Some(&stored),
                open_calls,
                last_failure_at_ms: health.last_failure_at_ms,
                last_delivery_at_ms: health.last_delivery_at_ms,
            };
            let reasons = eligibility::check(&facts, Candidacy::General, None, now_ms);
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
            self.cache.borrow_mut().regressions = None;
            self.changed(now_ms);
        }
        let (answer, stored) = result?;
        if let Some(beat) = stored {
            let limit = self
                .registry()?
                .and_then(|(_, r)| r.nodes.get(node).and_then(|e| e.max_calls));
            let decisive = !before
                .as_deref()
                .is_some_and(|old| eligibility::same_for_decisions(old, &beat, limit, now_ms));
            // Committed: the parsed beat replaces the cached one.
            self.cache
                .borrow_mut()
                .beats
                .insert(node.to_owned(), Some(beat));
            self.touched(now_ms, decisive);
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

    /// A node's forward health (the cached map, read once).
    pub(super) fn node_health(&self, node: &str) -> Result<crate::messages::Health, EngineError> {
        self.load_health()?;
        Ok(self
            .cache
            .borrow()
            .health
            .as_ref()
            .and_then(|h| h.get(node))
            .unwrap_or_default())
    }

    /// The directory's view (SPEC §16): the documents in force and every
    /// registered node's beat, forward health and seq regressions. It is
    /// rebuilt from the caches only after a change, so in steady state
    /// taking it is one reference count, whatever the number of nodes.
    pub fn view(&self) -> Result<Rc<DirectoryView>, EngineError> {
        self.view_as_of(None)
    }

    /// [`Directory::view`], as of `now_ms` at the latest when it is taken
    /// afresh: it then holds everything stored until now. A directory that
    /// has just started (or dropped its caches) has changed nothing yet;
    /// as of 0 its views would order before every view a shard kept from
    /// before, and a shard would keep deciding on that older one under a
    /// lease granted after a change (SPEC §16).
    pub fn view_at(&self, now_ms: i64) -> Result<Rc<DirectoryView>, EngineError> {
        self.view_as_of(Some(now_ms))
    }

    fn view_as_of(&self, now_ms: Option<i64>) -> Result<Rc<DirectoryView>, EngineError> {
        if let Some(view) = &self.cache.borrow().view {
            return Ok(view.clone());
        }
        let started = self.cache.borrow().incarnation;
        let incarnation = match started {
            Some(incarnation) => incarnation,
            None => {
                let counted = self.unit(|| self.q().counters(&["directory_starts"], &[]))?[0];
                self.cache.borrow_mut().incarnation = Some(counted);
                counted
            }
        };
        let registry = self.registry()?;
        let mut nodes = BTreeMap::new();
        if let Some((_, r)) = &registry {
            let regressions = self.seq_regressions()?;
            for node in r.nodes.keys() {
                let state = NodeState {
                    beat: self.beat(node)?,
                    health: self.node_health(node)?,
                    seq_regressions: regressions.get(node),
                };
                nodes.insert(node.clone(), state);
            }
        }
        let (generation, as_of_ms) = {
            let mut cache = self.cache.borrow_mut();
            if let Some(now_ms) = now_ms {
                cache.changed_at_ms = cache.changed_at_ms.max(now_ms);
            }
            (cache.generation, cache.changed_at_ms)
        };
        let view = Rc::new(DirectoryView {
            v: VIEW_VERSION,
            as_of_ms,
            generation,
            incarnation,
            registry,
            policy: self.policy()?,
            nodes,
        });
        self.cache.borrow_mut().view = Some(view.clone());
        Ok(view)
    }

    /// Every node's seq regressions (cached, read once).
    fn seq_regressions(&self) -> Result<crate::messages::PerNode<(i64, i64)>, EngineError> {
        if let Some(regressions) = &self.cache.borrow().regressions {
            return Ok(regressions.clone());
        }
        let regressions = self.q().all_seq_regressions()?;
        self.cache.borrow_mut().regressions = Some(regressions.clone());
        Ok(regressions)
    }

    /// Forgets the beats, forward health and seq regressions of nodes no
    /// longer registered (the directory's retention, run with the alarm's).
    pub fn forget_unregistered(&self, now_ms: i64) -> Result<(), EngineError> {
        let q = self.q();
        let registered = self.registry()?.map(|(_, r)| r).unwrap_or_default();
        let gone: Vec<String> = q
            .known_nodes()?
            .into_iter()
            .filter(|node| !registered.nodes.contains_key(node))
            .collect();
        if gone.is_empty() {
            return Ok(());
        }
        self.unit(|| gone.iter().try_for_each(|node| q.forget_node(node)))?;
        {
            let mut cache = self.cache.borrow_mut();
            cache.regressions = None;
            for node in &gone {
                cache.beats.remove(node);
                if let Some(health) = &mut cache.health {
                    health.retain(|n, _| n != node);
                }
            }
        }
        self.changed(now_ms);
        Ok(())
    }
}
