//! The directory's view: everything the call-shard side of the engine reads
//! of the directory (SPEC §16), as one typed, versioned snapshot.
//!
//! The shard side (placement, claims, the sweeper, retention, the decision
//! record) decides on a [`DirectoryView`] and never reads the directory's
//! tables (documents, heartbeats, forward health) itself. Today both sides
//! share one object and one database, and the engine takes the view inside
//! the same unit as the decision, so nothing changes in behaviour; when the
//! shards become objects of their own, this is the message the directory
//! sends them.

use super::rows::SessionRow;
use crate::eligibility::{self, Beat, Candidacy, NodeFacts, Reason};
use crate::policy::RoutingPolicy;
use crate::registry::NodeRegistry;
use std::collections::BTreeMap;
use std::rc::Rc;

/// The format of [`DirectoryView`]: a receiver refuses a view whose `v`
/// it does not know instead of misreading it.
pub const VIEW_VERSION: u16 = 1;

/// What a shard decides on, as of one moment of the directory: the
/// documents in force with their revisions, and per registered node its
/// last accepted beat, forward health and the calls it has open.
///
/// `(nodes_revision, policy_revision, as_of_ms)` orders views: a receiver
/// keeps the newest and drops an older one delivered late, so a view sent
/// twice or out of order changes nothing.
#[derive(Debug, Clone)]
pub struct DirectoryView {
    /// [`VIEW_VERSION`].
    pub v: u16,
    /// When the directory took it.
    pub as_of_ms: i64,
    /// The node registry in force and its revision (0 and `None` before any).
    pub registry: Option<(u64, Rc<NodeRegistry>)>,
    /// The routing policy in force and its revision (0 and `None` before any).
    pub policy: Option<(u64, Rc<RoutingPolicy>)>,
    /// Per registered node: beat, forward health, open calls.
    pub(crate) nodes: BTreeMap<String, NodeState>,
}

impl DirectoryView {
    /// The registry's revision, 0 before any.
    pub fn nodes_revision(&self) -> u64 {
        self.registry.as_ref().map_or(0, |(r, _)| *r)
    }

    /// The policy's revision, 0 before any.
    pub fn policy_revision(&self) -> u64 {
        self.policy.as_ref().map_or(0, |(r, _)| *r)
    }

    /// True when this view is newer than `other` (a later revision of
    /// either document, or the same revisions taken later).
    pub fn supersedes(&self, other: &DirectoryView) -> bool {
        let key = |v: &DirectoryView| (v.nodes_revision(), v.policy_revision(), v.as_of_ms);
        key(self) > key(other)
    }

    /// A registered node's state, not counting `except` (the call being
    /// decided never counts against its own node's capacity). `None` for
    /// a node the registry does not list.
    pub(crate) fn node(&self, node: &str, except: Option<&SessionRow>) -> Option<NodeState> {
        let mut state = self.nodes.get(node)?.clone();
        if except.is_some_and(|s| s.loads(node)) {
            state.open_calls = state.open_calls.saturating_sub(1);
        }
        Some(state)
    }

    /// A registered node's last accepted beat.
    pub(crate) fn beat(&self, node: &str) -> Option<Rc<Beat>> {
        self.nodes.get(node).and_then(|s| s.beat.clone())
    }

    /// The general (call-independent) reasons `node` is ineligible now.
    pub(crate) fn general_reasons(&self, node: &str, now_ms: i64) -> Vec<Reason> {
        let state = self.nodes.get(node).cloned().unwrap_or_default();
        let entry = self.registry.as_ref().and_then(|(_, r)| r.nodes.get(node));
        eligibility::check(&state.facts(entry), Candidacy::General, None, now_ms)
    }

    /// True when the registry lists `node` with the key id `kid`.
    pub(crate) fn key_in_force(&self, node: &str, kid: &str) -> bool {
        lists_key(self.registry.as_ref().map(|(_, r)| &**r), node, kid)
    }

    /// Every registered node's state (for views).
    pub(crate) fn nodes(&self) -> &BTreeMap<String, NodeState> {
        &self.nodes
    }
}

/// True when `registry` lists `node` with the key id `kid`.
pub(crate) fn lists_key(registry: Option<&NodeRegistry>, node: &str, kid: &str) -> bool {
    registry.is_some_and(|r| r.nodes.get(node).is_some_and(|e| e.keys.contains_key(kid)))
}

/// What the directory keeps of a node besides its registry entry: its last
/// accepted beat, forward health and open calls.
#[derive(Debug, Clone, Default)]
pub(crate) struct NodeState {
    pub beat: Option<Rc<Beat>>,
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
            beat: self.beat.as_deref(),
            open_calls: self.open_calls,
            last_failure_at_ms: self.last_failure_at_ms,
            last_delivery_at_ms: self.last_delivery_at_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(nodes: Option<u64>, policy: Option<u64>, as_of_ms: i64) -> DirectoryView {
        let policy_doc = || RoutingPolicy {
            default_node: "M1".into(),
            by_line: BTreeMap::new(),
            by_caller: BTreeMap::new(),
        };
        DirectoryView {
            v: VIEW_VERSION,
            as_of_ms,
            registry: nodes.map(|r| (r, Rc::new(NodeRegistry::default()))),
            policy: policy.map(|r| (r, Rc::new(policy_doc()))),
            nodes: BTreeMap::new(),
        }
    }

    #[test]
    fn a_view_supersedes_only_an_older_one() {
        let base = view(Some(3), Some(5), 1_000);
        // A later revision of either document wins, whatever the time it
        // was taken: a view delivered late never replaces a newer one.
        assert!(view(Some(4), Some(5), 900).supersedes(&base));
        assert!(view(Some(3), Some(6), 900).supersedes(&base));
        assert!(view(Some(3), Some(5), 1_001).supersedes(&base));
        assert!(!base.supersedes(&view(Some(4), Some(5), 900)));
        assert!(!view(Some(3), Some(5), 999).supersedes(&base));
        // The same view again supersedes nothing: a repeat changes nothing.
        assert!(!base.supersedes(&base.clone()));
        // Before any document the revisions read 0.
        let empty = view(None, None, 0);
        assert_eq!((empty.nodes_revision(), empty.policy_revision()), (0, 0));
        assert!(base.supersedes(&empty));
    }

    #[test]
    fn the_call_being_decided_never_counts_against_its_own_node() {
        let mut v = view(Some(1), Some(1), 0);
        v.nodes.insert(
            "M1".into(),
            NodeState {
                open_calls: 2,
                ..NodeState::default()
            },
        );
        let own = SessionRow {
            id: "s1".into(),
            state: super::super::rows::SessionState::Assigned,
            owner: Some("M1".into()),
            epoch: Some(1),
            origin_url: None,
            direction: None,
            caller: None,
            called: None,
            created_at_ms: 0,
            fence: None,
            ambiguous_epoch: None,
        };
        assert_eq!(v.node("M1", None).map(|s| s.open_calls), Some(2));
        assert_eq!(v.node("M1", Some(&own)).map(|s| s.open_calls), Some(1));
        assert!(v.node("M9", None).is_none());
    }
}
