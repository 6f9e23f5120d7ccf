//! What a decision reads: the directory's [`DirectoryView`] with what only
//! the shard knows laid over it (its own forward marks the directory has
//! not yet echoed, and each node's open calls).

use super::rows::SessionRow;
use super::{CallShard, EngineError};
use crate::eligibility::{self, Beat, Candidacy, NodeFacts, Reason};
use crate::messages::{DirectoryView, Health, PerNode};
use crate::store::Store;
use std::ops::Deref;
use std::rc::Rc;

/// The view one decision (or one read) is made on.
pub(crate) struct ShardView {
    directory: Rc<DirectoryView>,
    marks: PerNode<Health>,
    open_calls: PerNode<u32>,
}

impl Deref for ShardView {
    type Target = DirectoryView;

    fn deref(&self) -> &DirectoryView {
        &self.directory
    }
}

/// A registered node as a decision sees it.
#[derive(Debug, Clone, Default)]
pub(crate) struct NodeNow {
    pub beat: Option<Rc<Beat>>,
    pub open_calls: u32,
    pub health: Health,
    pub seq_regressions: Option<(i64, i64)>,
}

impl NodeNow {
    pub(crate) fn facts<'a>(
        &'a self,
        entry: Option<&'a crate::registry::NodeEntry>,
    ) -> NodeFacts<'a> {
        NodeFacts {
            entry,
            beat: self.beat.as_deref(),
            open_calls: self.open_calls,
            last_failure_at_ms: self.health.last_failure_at_ms,
            last_delivery_at_ms: self.health.last_delivery_at_ms,
        }
    }
}

impl ShardView {
    /// A registered node's state, not counting `except` (the call being
    /// decided never counts against its own node's capacity). `None` for
    /// a node the view does not list.
    pub(crate) fn node(&self, node: &str, except: Option<&SessionRow>) -> Option<NodeNow> {
        let state = self.directory.nodes.get(node)?;
        let own = u32::from(except.is_some_and(|s| s.loads(node)));
        let health = match self.marks.get(node) {
            Some(mine) => state.health.merge(mine),
            None => state.health,
        };
        Some(NodeNow {
            beat: state.beat.clone(),
            open_calls: self.open_calls.get(node).unwrap_or(0).saturating_sub(own),
            health,
            seq_regressions: state.seq_regressions,
        })
    }

    /// Every registered node, by id.
    pub(crate) fn nodes(&self) -> impl Iterator<Item = (&String, NodeNow)> + '_ {
        self.directory
            .nodes
            .keys()
            .filter_map(|n| Some((n, self.node(n, None)?)))
    }

    /// The general (call-independent) reasons `node` is ineligible now.
    pub(crate) fn general_reasons(&self, node: &str, now_ms: i64) -> Vec<Reason> {
        let state = self.node(node, None).unwrap_or_default();
        let entry = self.registry.as_ref().and_then(|(_, r)| r.nodes.get(node));
        eligibility::check(&state.facts(entry), Candidacy::General, None, now_ms)
    }
}

impl<S: Store> CallShard<S> {
    /// The view a decision starts on: the newest the directory sent, this
    /// shard's own marks, and its open calls (one read).
    pub(crate) fn decision_view(&self) -> Result<ShardView, EngineError> {
        Ok(ShardView {
            directory: self.view.borrow().clone(),
            marks: self.marks.borrow().clone(),
            open_calls: self.q().all_open_calls()?,
        })
    }

    /// Every node's open calls in this shard (the directory's capacity
    /// accounting reads it).
    pub fn open_calls(&self) -> Result<PerNode<u32>, EngineError> {
        self.q().all_open_calls()
    }

    /// One node's open calls in this shard.
    pub fn node_open_calls(&self, node: &str) -> Result<u32, EngineError> {
        self.q().open_calls(node)
    }
}
