//! The directory machine (SPEC §16): the documents, the node keys, the
//! heartbeats and every node's eligibility facts, the forward-failure
//! marks, and the L5 probe's admission. It is sans-IO, like the call shard:
//! it owns a [`Store`] handle and caches rebuilt from SQL after a restart,
//! and time arrives as `now_ms`.
//!
//! Its inputs are the operator's document writes ([`Directory::put_document`]),
//! the nodes' beats ([`Directory::handle_heartbeat`]) and probes
//! ([`Directory::handle_probe`]), and the shards' messages
//! ([`DirectoryInput::Mark`]); its one output to the shards is the
//! [`DirectoryView`] ([`DirectoryOutput::View`], drained with
//! [`Directory::poll_output`] after every input). It pushes a view only
//! after a change (a document, an accepted beat, a mark that changes a
//! node's health) and rebuilds it only then, so in steady state nothing is
//! sent and taking the view costs one reference count.
//!
//! It never reads a call shard's tables. The two facts of the shards it
//! needs (a node's open calls, for a beat's answer and for refusing to
//! remove a node with live calls) arrive as arguments.
//!
//! # Layout
//! - `documents`: the registry and the policy, stored by revision with
//!   compare-and-set, and their history;
//! - `nodes`: key checks, heartbeats, marks, and taking the view;
//! - `leases`: the leases call shards decide under, capacity counted
//!   across shards, and when a change may be acknowledged;
//! - `probes`: the L5 probe's per-node rate limit;
//! - `queries`: the directory's SQL (documents, beats, forward health, the
//!   probe's times), visible only inside this module.

mod documents;
mod leases;
mod nodes;
mod probes;
mod queries;

pub use documents::{DocError, KEPT_REVISIONS, REPLACED_MAP_USE_MS};
pub use nodes::{HeartbeatRefusal, NodeKey};
pub use probes::ProbeAdmission;

use crate::document::DocKind;
use crate::eligibility::Beat;
use crate::error::EngineError;
use crate::messages::{DirectoryView, ForwardMark, Health, PerNode};
use crate::policy::RoutingPolicy;
use crate::registry::NodeRegistry;
use crate::shard_map::ShardMap;
use crate::sql::Queries;
use crate::store::{Store, StoreError};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// A document with its revision.
pub type Cached<T> = Option<(u64, Rc<T>)>;

/// What the directory keeps in memory, all of it rebuilt from SQL on
/// demand; a failed unit drops all of it.
#[derive(Default, Clone)]
struct Cache {
    nodes: Option<Cached<NodeRegistry>>,
    policy: Option<Cached<RoutingPolicy>>,
    /// The shard map in force and its revision.
    shards: Option<(u64, ShardMap)>,
    beats: HashMap<String, Option<Rc<Beat>>>,
    health: Option<PerNode<Health>>,
    /// Beats refused `stale_seq` per node: (count, last time).
    regressions: Option<PerNode<(i64, i64)>>,
    view: Option<Rc<DirectoryView>>,
    /// Changes since this directory started (the views' `generation`).
    generation: u64,
    /// This start's number, counted in storage at the first view (the
    /// views' `incarnation`).
    incarnation: Option<u64>,
    /// The time of the last change (the views' `as_of_ms`).
    changed_at_ms: i64,
    /// True once the current view went out through `poll_output`.
    view_sent: bool,
    /// Every call shard's lease row (`leases`).
    leases: Option<Vec<queries::LeaseRow>>,
    /// Shards to ask to report, for [`Directory::poll_reclaim`].
    reclaim: Vec<u32>,
    /// True after a change that may alter a decision, until taken
    /// ([`Directory::take_decisive`]).
    decisive: bool,
    /// When the last such change was made (`leases`: the leases granted
    /// before it must lapse or be revoked before it is acknowledged).
    last_change_ms: Option<i64>,
}

/// A message the directory takes from a call shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirectoryInput {
    /// How a forward ended ([`Directory::handle_mark`]).
    Mark(ForwardMark),
}

/// A message the directory sends the call shards.
#[derive(Debug, Clone)]
pub enum DirectoryOutput {
    /// The view after a change: every shard decides on it from now on.
    View(Rc<DirectoryView>),
}

/// A copy of a directory's in-memory caches ([`Directory::caches`]).
#[cfg(feature = "testing")]
#[doc(hidden)]
#[derive(Default, Clone)]
pub struct Caches(Cache);

/// The directory: see the module documentation.
pub struct Directory<S: Store> {
    store: S,
    allow_plaintext: bool,
    cache: RefCell<Cache>,
}

impl<S: Store> Directory<S> {
    /// A directory over `store`, whose schema must already be migrated.
    /// `allow_plaintext` is `ORIGIN_ALLOW_PLAINTEXT`.
    pub fn new(store: S, allow_plaintext: bool) -> Self {
        Self {
            store,
            allow_plaintext,
            cache: RefCell::new(Cache::default()),
        }
    }

    /// The storage backend.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// A copy of the in-memory caches (the model check gives each explored
    /// history its own). Only with the `testing` feature.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn caches(&self) -> Caches {
        Caches(self.cache.borrow().clone())
    }

    /// Replaces the in-memory caches (see [`Directory::caches`]).
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn set_caches(&self, caches: Caches) {
        *self.cache.borrow_mut() = caches.0;
    }

    fn q(&self) -> Queries<'_, S> {
        Queries::new(&self.store)
    }

    /// Runs one state-changing unit atomically; when it fails (and the
    /// store rolled it back) every cache is dropped.
    fn unit<T, E: From<StoreError>>(&self, work: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
        let result = self.store.atomically(work);
        if result.is_err() {
            let generation = self.cache.borrow().generation;
            *self.cache.borrow_mut() = Cache {
                generation: generation + 1,
                ..Cache::default()
            };
        }
        result
    }

    /// Marks what the view holds as changed at `now_ms`: the next
    /// [`Directory::view`] is taken afresh. The change may alter a decision.
    fn changed(&self, now_ms: i64) {
        self.touched(now_ms, true);
    }

    /// [`Directory::changed`], saying whether the change may alter a
    /// decision (a beat that repeats what its node said does not).
    fn touched(&self, now_ms: i64, decisive: bool) {
        let mut cache = self.cache.borrow_mut();
        cache.decisive |= decisive;
        cache.view = None;
        cache.view_sent = false;
        cache.generation += 1;
        cache.changed_at_ms = cache.changed_at_ms.max(now_ms);
    }

    /// True when a change that may alter a decision was made since the
    /// last call: its acknowledgement waits for
    /// [`Directory::acknowledge_at`] (SPEC §16).
    pub fn take_decisive(&self) -> bool {
        std::mem::take(&mut self.cache.borrow_mut().decisive)
    }

    /// The current node registry, if one was ever written.
    pub fn registry(&self) -> Result<Cached<NodeRegistry>, EngineError> {
        if let Some(cached) = &self.cache.borrow().nodes {
            return Ok(cached.clone());
        }
        let loaded = self
            .latest_document(DocKind::Nodes)?
            .map(|(revision, doc)| {
                crate::registry::validate(&doc, true)
                    .map(|r| (revision, Rc::new(r)))
                    .map_err(|_| EngineError::Corrupt("stored node registry".into()))
            })
            .transpose()?;
        self.cache.borrow_mut().nodes = Some(loaded.clone());
        Ok(loaded)
    }

    /// The current routing policy, if one was ever written.
    pub fn policy(&self) -> Result<Cached<RoutingPolicy>, EngineError> {
        if let Some(cached) = &self.cache.borrow().policy {
            return Ok(cached.clone());
        }
        let loaded = match self.latest_document(DocKind::Policy)? {
            None => None,
            Some((revision, doc)) => Some((revision, Rc::new(documents::load_policy(&doc)?))),
        };
        self.cache.borrow_mut().policy = Some(loaded.clone());
        Ok(loaded)
    }

    /// Forgets a cached document after a write. The shard map is not in
    /// the shards' view: its write changes no view.
    fn invalidate(&self, kind: DocKind, now_ms: i64) {
        {
            let mut cache = self.cache.borrow_mut();
            match kind {
                DocKind::Nodes => cache.nodes = None,
                DocKind::Policy => cache.policy = None,
                DocKind::Shards => {
                    cache.shards = None;
                    return;
                }
            }
        }
        self.changed(now_ms);
    }

    /// A message from a call shard.
    pub fn handle_input(&self, input: DirectoryInput) -> Result<(), EngineError> {
        match input {
            DirectoryInput::Mark(mark) => self.handle_mark(&mark),
        }
    }

    /// The next message for the shards: the view, once after each change
    /// (and once after the directory starts), else nothing. A view built
    /// here is stamped no earlier than `now_ms`, so the first view of a
    /// restarted directory supersedes any sent before the restart.
    pub fn poll_output(&self, now_ms: i64) -> Result<Option<DirectoryOutput>, EngineError> {
        if self.cache.borrow().view_sent {
            return Ok(None);
        }
        let view = self.view_at(now_ms)?;
        self.cache.borrow_mut().view_sent = true;
        Ok(Some(DirectoryOutput::View(view)))
    }

    /// Applies a call shard's [`ForwardMark`] to the node's forward health.
    /// A mark that changes nothing (a repeat, or older than what is stored)
    /// writes nothing and leaves the view as it is.
    pub fn handle_mark(&self, mark: &ForwardMark) -> Result<(), EngineError> {
        if mark.v != crate::messages::MARK_VERSION {
            return Err(EngineError::Corrupt(format!("forward mark v{}", mark.v)));
        }
        let before = self.node_health(&mark.node)?;
        let after = before.with(mark);
        if after == before {
            return Ok(());
        }
        self.unit(|| self.q().store_health(&mark.node, after))?;
        if let Some(health) = &mut self.cache.borrow_mut().health {
            health.set(&mark.node, after);
        }
        self.changed(mark.at_ms);
        Ok(())
    }

    /// Loads every node's forward health into the cache, once.
    fn load_health(&self) -> Result<(), EngineError> {
        if self.cache.borrow().health.is_none() {
            let health = self.q().all_health()?;
            self.cache.borrow_mut().health = Some(health);
        }
        Ok(())
    }
}
