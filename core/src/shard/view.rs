//! What a decision reads: the directory's [`DirectoryView`] with what only
//! the shard knows laid over it (its own forward marks the directory has
//! not yet echoed, and each node's open calls).

use super::lease::Room;
use super::rows::SessionRow;
use super::{CallShard, EngineError};
use crate::eligibility::{self, Beat, Candidacy, NodeFacts, Reason};
use crate::messages::{DirectoryView, Health, PerNode};
use crate::store::Store;
use std::cell::RefCell;
use std::ops::Deref;
use std::rc::Rc;

/// How a view reads one node's open calls.
type LoadOpenCalls<'a> = Box<dyn Fn(&str) -> Result<u32, EngineError> + 'a>;

/// A registered node in a status read: its id, state and the general
/// reasons it is ineligible.
pub(crate) type NodeRead<'v> = (&'v String, NodeNow, Vec<Reason>);

/// The view one decision (or one read) is made on. A node's open calls are
/// read when the decision first visits the node (one primary-key read), so
/// a decision costs the same whatever the number of registered nodes.
pub(crate) struct ShardView<'a> {
    directory: Rc<DirectoryView>,
    marks: PerNode<Health>,
    open_calls: RefCell<PerNode<u32>>,
    load: LoadOpenCalls<'a>,
    /// What counts against capacity beyond this shard's open calls.
    room: Room,
    elsewhere: PerNode<u32>,
    /// Where a decision records a node whose cap it found reached.
    want: Box<dyn Fn(&str) + 'a>,
}

impl Deref for ShardView<'_> {
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

impl ShardView<'_> {
    /// A node's open calls in this shard, read once per view.
    fn open_calls(&self, node: &str) -> Result<u32, EngineError> {
        if let Some(n) = self.open_calls.borrow().get(node) {
            return Ok(n);
        }
        let n = (self.load)(node)?;
        self.open_calls.borrow_mut().set(node, n);
        Ok(n)
    }

    /// A registered node's state, not counting `except` (the call being
    /// decided never counts against its own node's capacity). `None` for
    /// a node the view does not list.
    pub(crate) fn node(
        &self,
        node: &str,
        except: Option<&SessionRow>,
    ) -> Result<Option<NodeNow>, EngineError> {
        self.node_counting(node, except, true)
    }

    /// [`ShardView::node`]; `counting_room` adds what the lease or the
    /// other shards hold to the open calls (a decision's count), else the
    /// open calls are this shard's alone (a status read's).
    fn node_counting(
        &self,
        node: &str,
        except: Option<&SessionRow>,
        counting_room: bool,
    ) -> Result<Option<NodeNow>, EngineError> {
        let Some(state) = self.directory.nodes.get(node) else {
            return Ok(None);
        };
        let own = u32::from(except.is_some_and(|s| s.loads(node)));
        let health = match self.marks.get(node) {
            Some(mine) => state.health.merge(mine),
            None => state.health,
        };
        let here = self.open_calls(node)?.saturating_sub(own);
        Ok(Some(NodeNow {
            beat: state.beat.clone(),
            open_calls: match counting_room {
                true => self.counted(node, here, state.beat.as_deref()),
                false => here,
            },
            health,
            seq_regressions: state.seq_regressions,
        }))
    }

    /// The open calls that count against `node`'s capacity for a decision
    /// here, given `here` in this shard: for `global`, those and what the
    /// other shards may hold; for a leased shard, its own, raised to the
    /// node's limit once they reach the lease's cap (so the capacity rule
    /// refuses the node exactly when the cap is reached).
    fn counted(&self, node: &str, here: u32, beat: Option<&Beat>) -> u32 {
        match &self.room {
            Room::Unleased => {
                let elsewhere = self.elsewhere.get(node).unwrap_or(0);
                let entry = self.registry.as_ref().and_then(|(_, r)| r.nodes.get(node));
                let limit = eligibility::effective_max_calls(entry, beat);
                if elsewhere > 0 && limit.is_some_and(|l| here < l && here + elsewhere >= l) {
                    // Full only for what other shards may hold: ask for it back.
                    (self.want)(node);
                }
                here + elsewhere
            }
            Room::Leased(caps) => {
                let cap = caps.as_ref().and_then(|c| c.get(node)).unwrap_or(0);
                let entry = self.registry.as_ref().and_then(|(_, r)| r.nodes.get(node));
                match eligibility::effective_max_calls(entry, beat) {
                    Some(limit) if here >= cap => {
                        if cap < limit {
                            // Full only for the cap: room may be elsewhere.
                            (self.want)(node);
                        }
                        here.max(limit)
                    }
                    Some(limit) => here + limit.saturating_sub(cap),
                    None => here,
                }
            }
        }
    }

    /// Every registered node, by id, with the general (call-independent)
    /// reasons it is ineligible now (for status: one read of every node's
    /// open calls).
    pub(crate) fn nodes(
        &self,
        all_open_calls: PerNode<u32>,
        now_ms: i64,
    ) -> Result<Vec<NodeRead<'_>>, EngineError> {
        *self.open_calls.borrow_mut() = all_open_calls;
        let mut out = Vec::with_capacity(self.directory.nodes.len());
        for name in self.directory.nodes.keys() {
            let state = self.node_counting(name, None, false)?.unwrap_or_default();
            let entry = self.registry.as_ref().and_then(|(_, r)| r.nodes.get(name));
            let reasons = eligibility::check(&state.facts(entry), Candidacy::General, None, now_ms);
            out.push((name, state, reasons));
        }
        Ok(out)
    }
}

impl<S: Store> CallShard<S> {
    /// The view a decision starting at `now_ms` is made on: the newest the
    /// directory sent, this shard's own marks, and the room the lease (or,
    /// in `global`, the other shards) leaves; open calls are read as nodes
    /// are visited.
    pub(crate) fn decision_view(&self, now_ms: i64) -> ShardView<'_> {
        ShardView {
            directory: self.view.borrow().clone(),
            marks: self.marks.borrow().clone(),
            open_calls: RefCell::new(PerNode::default()),
            load: Box::new(move |node| self.q().open_calls(node)),
            room: self.room(now_ms),
            elsewhere: self.elsewhere.borrow().clone(),
            want: Box::new(move |node| self.want(node)),
        }
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
