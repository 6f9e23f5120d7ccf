//! Documents: the node registry, the routing policy and the shard map,
//! stored by revision with compare-and-set (SPEC §4, §16).

use super::{Directory, EngineError};
use crate::document::{expected_revision, DocKind, PreconditionError};
use crate::messages::{MapNotice, PerNode, CLOCK_MARGIN_MS, LEASE_MS};
use crate::policy::{CallerOverride, Line, RoutingPolicy};
use crate::problem::Problem;
use crate::shard_map::{self, MapRevision, RollbackFloor, ShardMap};
use crate::store::Store;
use crate::time::parse_ms;
use serde_json::Value as Json;
use std::collections::BTreeMap;

/// How many revisions of each document are kept.
pub const KEPT_REVISIONS: i64 = 50;

/// Why a document read or write was refused. Nothing changes on any of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DocError {
    /// No `If-Match` and no body `revision` (428).
    PreconditionRequired,
    /// An `If-Match` that is not a strong quoted revision (400).
    BadPrecondition,
    /// The precondition names another revision than the current one (412).
    RevisionConflict {
        /// The revision in force.
        current_revision: u64,
    },
    /// The body is not a JSON object (400).
    InvalidJson,
    /// The document breaks the rules (400), with every finding.
    InvalidDocument(Vec<Problem>),
    /// The write removes a node, or a key of a node, that owns open calls (409).
    NodeInUse {
        /// The node.
        node: String,
    },
    /// The document was never written (404 `no_policy` / `no_nodes`).
    Absent(DocKind),
    /// The requested revision is not among those kept (404).
    UnknownRevision,
    /// The store failed.
    Engine(EngineError),
}

impl From<EngineError> for DocError {
    fn from(e: EngineError) -> Self {
        DocError::Engine(e)
    }
}

impl From<crate::store::StoreError> for DocError {
    fn from(e: crate::store::StoreError) -> Self {
        DocError::Engine(e.into())
    }
}

/// How long after its replacement a map may still be the one a shard
/// creates sessions under: a call shard takes a new map with each lease, and
/// one granted just before the change runs for [`LEASE_MS`]; twice that, and
/// the two objects' clock margin, is the margin kept.
pub const REPLACED_MAP_USE_MS: i64 = 2 * (LEASE_MS + CLOCK_MARGIN_MS);

impl<S: Store> Directory<S> {
    /// The newest revision of a document and its stored body.
    pub(super) fn latest_document(
        &self,
        kind: DocKind,
    ) -> Result<Option<(u64, Json)>, EngineError> {
        self.q()
            .latest_document(kind.as_str())?
            .map(|row| parse_row(kind, row))
            .transpose()
    }

    /// The current revision of a document (0 when never written).
    pub fn revision(&self, kind: DocKind) -> Result<u64, EngineError> {
        Ok(match kind {
            DocKind::Nodes => self.registry()?.map_or(0, |(r, _)| r),
            DocKind::Policy => self.policy()?.map_or(0, |(r, _)| r),
            DocKind::Shards => self.shard_map()?.0,
        })
    }

    /// The shard map in force and its revision: one shard at revision 0
    /// before any PUT.
    pub fn shard_map(&self) -> Result<(u64, ShardMap), EngineError> {
        if let Some(cached) = self.cache.borrow().shards {
            return Ok(cached);
        }
        let loaded = match self.latest_document(DocKind::Shards)? {
            None => (0, ShardMap::default()),
            Some((revision, doc)) => ShardMap::load(&doc)
                .map(|map| (revision, map))
                .ok_or_else(|| EngineError::Corrupt("stored shard map".into()))?,
        };
        self.cache.borrow_mut().shards = Some(loaded);
        Ok(loaded)
    }

    /// The oldest release this deployment can be rolled back to, from the
    /// map's kept revisions (SPEC §16): `v1.4` while a shard other than
    /// `global` may still hold a session's records, that is while a map of
    /// more than one shard counted within `horizon_ms` (the longest call
    /// and then the retention) plus [`REPLACED_MAP_USE_MS`], the window
    /// [`Self::map_notice`] keeps shards in the history for. SPEC §16 says
    /// "until the retention has passed"; the retention of a session begins
    /// when it ends, so this is that reading on the safe side.
    pub fn rollback_floor(
        &self,
        now_ms: i64,
        horizon_ms: i64,
    ) -> Result<RollbackFloor, EngineError> {
        Ok(shard_map::rollback_floor(
            &self.map_history()?,
            now_ms,
            horizon_ms + REPLACED_MAP_USE_MS,
        ))
    }

    /// The map as the call shards need it: in force now, with every shard
    /// count in force since `now_ms - horizon_ms`. `horizon_ms` is how long
    /// a session's records may be kept after it was created (the longest
    /// call and then the retention), so the history names every shard that
    /// may still hold a session. A replaced map counts for
    /// [`REPLACED_MAP_USE_MS`] longer: a shard may still create sessions
    /// under it until its lease granted before the change lapses. When the
    /// kept revisions no longer say, the history is every count up to 32
    /// (the safe side: every shard is asked).
    pub fn map_notice(&self, now_ms: i64, horizon_ms: i64) -> Result<MapNotice, EngineError> {
        let (revision, map) = self.shard_map()?;
        let since = now_ms.saturating_sub(horizon_ms + REPLACED_MAP_USE_MS);
        let history = shard_map::in_force_since(&self.map_history()?, since).unwrap_or(u32::MAX);
        Ok(MapNotice::new(revision, map.call_shards as u32, history))
    }

    /// The map's kept revisions, oldest first.
    fn map_history(&self) -> Result<Vec<MapRevision>, EngineError> {
        self.q()
            .document_history(DocKind::Shards.as_str())?
            .into_iter()
            .map(|(revision, body, written_at_ms)| {
                let doc = parse_row(DocKind::Shards, (revision, body))?.1;
                let map = ShardMap::load(&doc)
                    .ok_or_else(|| EngineError::Corrupt("stored shard map".into()))?;
                Ok(MapRevision {
                    revision: revision as u64,
                    call_shards: map.call_shards,
                    written_at_ms,
                })
            })
            .collect()
    }

    /// `GET /v1/policy`, `/v1/nodes` and `/v1/shards`: the document with
    /// `revision` filled in; `revision` picks one of the kept revisions.
    /// The shard map is never absent: before any PUT it is one shard at
    /// revision 0.
    pub fn get_document(
        &self,
        kind: DocKind,
        revision: Option<u64>,
    ) -> Result<(u64, Json), DocError> {
        let shards = kind == DocKind::Shards;
        let initial_map = || Some((0, ShardMap::default().to_json()));
        let found = match revision {
            Some(0) if shards => initial_map(),
            None => match self.latest_document(kind)? {
                None if shards => initial_map(),
                found => found,
            },
            Some(rev) => match self.q().document(kind.as_str(), rev)? {
                Some(row) => Some(parse_row(kind, row)?),
                None if !shards && self.revision(kind)? == 0 => None,
                None => return Err(DocError::UnknownRevision),
            },
        };
        let (rev, mut doc) = found.ok_or(DocError::Absent(kind))?;
        if let Json::Object(map) = &mut doc {
            map.insert("revision".into(), rev.into());
        }
        Ok((rev, doc))
    }

    /// `PUT /v1/policy`, `/v1/nodes` and `/v1/shards`: validates, checks the revision
    /// precondition and stores revision N+1. Returns the new revision.
    /// `open_calls` is the shards' open calls per node: a registry that
    /// removes a node, or a key of it, while it has any is `node_in_use`.
    pub fn put_document(
        &self,
        kind: DocKind,
        body: &[u8],
        if_match: Option<&str>,
        writer_fp: &str,
        open_calls: &PerNode<u32>,
        now_ms: i64,
    ) -> Result<u64, DocError> {
        let doc: Json = serde_json::from_slice(body).map_err(|_| DocError::InvalidJson)?;
        if !doc.is_object() {
            return Err(DocError::InvalidJson);
        }
        let expected = expected_revision(if_match, &doc).map_err(|e| match e {
            PreconditionError::Missing => DocError::PreconditionRequired,
            PreconditionError::Malformed => DocError::BadPrecondition,
        })?;
        self.unit(|| {
            let current = self.revision(kind)?;
            if expected != current {
                return Err(DocError::RevisionConflict {
                    current_revision: current,
                });
            }
            let canonical = match kind {
                DocKind::Nodes => self.validate_registry(&doc, open_calls)?,
                DocKind::Policy => self.validate_policy(&doc, now_ms)?,
                DocKind::Shards => shard_map::validate(&doc)
                    .map_err(DocError::InvalidDocument)?
                    .to_json(),
            };
            let next = current + 1;
            if next > crate::MAX_SAFE_INTEGER {
                return Err(DocError::Engine(EngineError::Corrupt(
                    "revisions exhausted".into(),
                )));
            }
            self.q().insert_document(
                kind.as_str(),
                next,
                &canonical.to_string(),
                writer_fp,
                KEPT_REVISIONS,
                now_ms,
            )?;
            self.invalidate(kind, now_ms);
            Ok(next)
        })
    }

    fn validate_registry(&self, doc: &Json, open_calls: &PerNode<u32>) -> Result<Json, DocError> {
        let registry = crate::registry::validate(doc, self.allow_plaintext)
            .map_err(DocError::InvalidDocument)?;
        if let Some((policy_rev, policy)) = self.policy()? {
            let missing: Vec<Problem> = policy
                .named_nodes()
                .into_iter()
                .filter(|n| !registry.nodes.contains_key(*n))
                .map(|n| Problem {
                    path: format!("/nodes/{}", crate::problem::pointer_segment(n)),
                    problem: format!("node {n} is named by policy revision {policy_rev}; change the policy first"),
                })
                .collect();
            if !missing.is_empty() {
                return Err(DocError::InvalidDocument(missing));
            }
        }
        if let Some((_, current)) = self.registry()? {
            for (node, entry) in &current.nodes {
                let removed = match registry.nodes.get(node) {
                    None => true,
                    Some(next) => entry.keys.keys().any(|kid| !next.keys.contains_key(kid)),
                };
                if removed && open_calls.get(node).is_some_and(|n| n > 0) {
                    return Err(DocError::NodeInUse { node: node.clone() });
                }
            }
        }
        Ok(registry.to_json())
    }

    fn validate_policy(&self, doc: &Json, now_ms: i64) -> Result<Json, DocError> {
        let Some((_, registry)) = self.registry()? else {
            return Err(DocError::InvalidDocument(vec![Problem {
                path: String::new(),
                problem: "no node registry yet: PUT /v1/nodes first".into(),
            }]));
        };
        let previous = self.policy()?;
        let policy = crate::policy::validate(
            doc,
            &registry,
            previous.as_ref().map(|(_, p)| p.as_ref()),
            now_ms,
        )
        .map_err(DocError::InvalidDocument)?;
        Ok(policy.to_json())
    }
}

fn parse_row(kind: DocKind, (revision, body): (i64, String)) -> Result<(u64, Json), EngineError> {
    let doc = serde_json::from_str(&body)
        .map_err(|_| EngineError::Corrupt(format!("stored {} document", kind.as_str())))?;
    Ok((revision as u64, doc))
}

/// Rebuilds a stored policy (already validated when written, with the
/// server's `created_at` stamps) without re-validating it.
pub(super) fn load_policy(doc: &Json) -> Result<RoutingPolicy, EngineError> {
    let corrupt = |what: &str| EngineError::Corrupt(format!("stored policy: {what}"));
    let text = |v: &Json, key: &str| v.get(key).and_then(Json::as_str).map(str::to_owned);
    let default_node = text(doc, "default_node").ok_or_else(|| corrupt("default_node"))?;
    let mut by_line = BTreeMap::new();
    if let Some(lines) = doc.get("by_line").and_then(Json::as_object) {
        for (id, line) in lines {
            by_line.insert(
                id.clone(),
                Line {
                    called_number: text(line, "called_number")
                        .ok_or_else(|| corrupt("called_number"))?,
                    preferred_node: text(line, "preferred_node")
                        .ok_or_else(|| corrupt("preferred_node"))?,
                    fallback_node: text(line, "fallback_node"),
                },
            );
        }
    }
    let mut by_caller = BTreeMap::new();
    if let Some(overrides) = doc.get("by_caller").and_then(Json::as_object) {
        for (caller, o) in overrides {
            let time = |key: &str| {
                o.get(key)
                    .and_then(Json::as_str)
                    .and_then(parse_ms)
                    .ok_or_else(|| corrupt(key))
            };
            by_caller.insert(
                caller.clone(),
                CallerOverride {
                    preferred_node: text(o, "preferred_node")
                        .ok_or_else(|| corrupt("preferred_node"))?,
                    expires_at_ms: time("expires_at")?,
                    created_at_ms: time("created_at")?,
                    note: text(o, "note"),
                },
            );
        }
    }
    Ok(RoutingPolicy {
        default_node,
        by_line,
        by_caller,
    })
}
