//! [`DirectoryView`]: everything a call shard reads of the directory
//! (SPEC §16), as one typed, versioned snapshot sent directory to shard.

use super::mark::{ForwardMark, ForwardResult};
use crate::eligibility::Beat;
use crate::policy::RoutingPolicy;
use crate::registry::NodeRegistry;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::rc::Rc;

/// The format of [`DirectoryView`]: a receiver refuses a view whose `v`
/// it does not know instead of misreading it.
pub const VIEW_VERSION: u16 = 1;

/// What a shard decides on, as of one moment of the directory: the
/// documents in force with their revisions, and per registered node its
/// last accepted beat and forward health.
///
/// Views are ordered by `(nodes_revision, policy_revision, incarnation,
/// as_of_ms, generation)`: a receiver keeps the newest and drops an older
/// one delivered late, so a view sent twice or out of order changes
/// nothing. `incarnation` counts the directory's starts (stored), so a
/// view of a restarted directory supersedes every view from before the
/// restart, even one taken in the same millisecond; `generation` counts
/// the directory's changes since it started, and `as_of_ms` is the time
/// of the last of them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DirectoryView {
    /// [`VIEW_VERSION`].
    pub v: u16,
    /// When the directory last changed what the view holds.
    pub as_of_ms: i64,
    /// The directory's change count when it took the view.
    pub generation: u64,
    /// The directory's starts, counted in its storage (0 in a view from a
    /// build that did not count them).
    #[serde(default)]
    pub incarnation: u64,
    /// The node registry in force and its revision (`None` before any).
    pub registry: Option<(u64, Rc<NodeRegistry>)>,
    /// The routing policy in force and its revision (`None` before any).
    pub policy: Option<(u64, Rc<RoutingPolicy>)>,
    /// Per registered node: beat and forward health.
    pub nodes: BTreeMap<String, NodeState>,
}

impl DirectoryView {
    /// The view of a directory that has no document yet.
    pub fn empty() -> Self {
        Self {
            v: VIEW_VERSION,
            as_of_ms: 0,
            generation: 0,
            incarnation: 0,
            registry: None,
            policy: None,
            nodes: BTreeMap::new(),
        }
    }

    /// The registry's revision, 0 before any.
    pub fn nodes_revision(&self) -> u64 {
        self.registry.as_ref().map_or(0, |(r, _)| *r)
    }

    /// The policy's revision, 0 before any.
    pub fn policy_revision(&self) -> u64 {
        self.policy.as_ref().map_or(0, |(r, _)| *r)
    }

    /// True when this view is newer than `other`: a later revision of
    /// either document, or the same revisions from a later start of the
    /// directory, or from the same start after more changes.
    pub fn supersedes(&self, other: &DirectoryView) -> bool {
        let key = |v: &DirectoryView| {
            (
                v.nodes_revision(),
                v.policy_revision(),
                v.incarnation,
                v.as_of_ms,
                v.generation,
            )
        };
        key(self) > key(other)
    }

    /// A registered node's last accepted beat.
    pub fn beat(&self, node: &str) -> Option<Rc<Beat>> {
        self.nodes.get(node).and_then(|s| s.beat.clone())
    }

    /// True when the registry lists `node` with the key id `kid`.
    pub fn key_in_force(&self, node: &str, kid: &str) -> bool {
        lists_key(self.registry.as_ref().map(|(_, r)| &**r), node, kid)
    }
}

/// True when `registry` lists `node` with the key id `kid`.
pub fn lists_key(registry: Option<&NodeRegistry>, node: &str, kid: &str) -> bool {
    registry.is_some_and(|r| r.nodes.get(node).is_some_and(|e| e.keys.contains_key(kid)))
}

/// A small table by node id: a deployment has a few nodes, so a list
/// searched in order, which costs less code in the wasm than a map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PerNode<T>(Vec<(String, T)>);

impl<T> Default for PerNode<T> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<T: Copy> PerNode<T> {
    /// The value for `node`.
    pub fn get(&self, node: &str) -> Option<T> {
        self.0.iter().find(|(n, _)| n == node).map(|(_, v)| *v)
    }

    /// Sets the value for `node`.
    pub fn set(&mut self, node: &str, value: T) {
        match self.0.iter_mut().find(|(n, _)| n == node) {
            Some((_, v)) => *v = value,
            None => self.0.push((node.to_owned(), value)),
        }
    }

    /// Keeps the entries `keep` says yes to.
    pub fn retain(&mut self, mut keep: impl FnMut(&str, T) -> bool) {
        self.0.retain(|(n, v)| keep(n, *v));
    }

    /// Every entry, in the order set.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &T)> {
        self.0.iter().map(|(n, v)| (n.as_str(), v))
    }

    /// True when the table has no entry.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<T> FromIterator<(String, T)> for PerNode<T> {
    fn from_iter<I: IntoIterator<Item = (String, T)>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

/// What the directory keeps of a node besides its registry entry.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct NodeState {
    /// The last accepted beat, parsed.
    pub beat: Option<Rc<Beat>>,
    /// The node's forward health.
    pub health: Health,
    /// Beats refused `stale_seq`: how many, and the last one's time.
    pub seq_regressions: Option<(i64, i64)>,
}

/// A node's forward health: when a forward to it last failed and last
/// delivered. Both only grow, so marks applied in any order, or twice,
/// leave the same health.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// The last failed (or unknown) forward.
    pub last_failure_at_ms: Option<i64>,
    /// The last delivered forward.
    pub last_delivery_at_ms: Option<i64>,
}

impl Health {
    /// This health with `mark` applied: the mark's time raises its result's
    /// time, never lowers it.
    pub fn with(self, mark: &ForwardMark) -> Health {
        let raise = |t: Option<i64>| Some(t.map_or(mark.at_ms, |t| t.max(mark.at_ms)));
        match mark.result {
            ForwardResult::Delivered => Health {
                last_delivery_at_ms: raise(self.last_delivery_at_ms),
                ..self
            },
            ForwardResult::Failed => Health {
                last_failure_at_ms: raise(self.last_failure_at_ms),
                ..self
            },
        }
    }

    /// The later of each time of two healths.
    pub fn merge(self, other: Health) -> Health {
        Health {
            last_failure_at_ms: self.last_failure_at_ms.max(other.last_failure_at_ms),
            last_delivery_at_ms: self.last_delivery_at_ms.max(other.last_delivery_at_ms),
        }
    }

    /// True while a failure is not followed by a delivery (the
    /// `recent_forward_failure` rule reads the times themselves).
    pub fn failing(&self) -> bool {
        self.last_failure_at_ms
            .is_some_and(|f| self.last_delivery_at_ms.is_none_or(|d| d < f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(
        nodes: Option<u64>,
        policy: Option<u64>,
        as_of_ms: i64,
        generation: u64,
    ) -> DirectoryView {
        let policy_doc = || RoutingPolicy {
            default_node: "M1".into(),
            by_line: BTreeMap::new(),
            by_caller: BTreeMap::new(),
        };
        DirectoryView {
            registry: nodes.map(|r| (r, Rc::new(NodeRegistry::default()))),
            policy: policy.map(|r| (r, Rc::new(policy_doc()))),
            as_of_ms,
            generation,
            ..DirectoryView::empty()
        }
    }

    #[test]
    fn a_view_supersedes_only_an_older_one() {
        let base = view(Some(3), Some(5), 1_000, 7);
        // A later revision of either document wins, whatever the time it
        // was taken: a view delivered late never replaces a newer one.
        assert!(view(Some(4), Some(5), 900, 1).supersedes(&base));
        assert!(view(Some(3), Some(6), 900, 1).supersedes(&base));
        assert!(view(Some(3), Some(5), 1_000, 8).supersedes(&base));
        assert!(view(Some(3), Some(5), 1_001, 0).supersedes(&base));
        assert!(!base.supersedes(&view(Some(4), Some(5), 900, 1)));
        assert!(!view(Some(3), Some(5), 1_000, 6).supersedes(&base));
        // A restarted directory's view supersedes the views from before,
        // taken in the same millisecond with fewer changes or not.
        let restarted = DirectoryView {
            incarnation: 1,
            ..view(Some(3), Some(5), 1_000, 0)
        };
        assert!(restarted.supersedes(&base));
        assert!(!base.supersedes(&restarted));
        // The same view again supersedes nothing: a repeat changes nothing.
        assert!(!base.supersedes(&base.clone()));
        let empty = DirectoryView::empty();
        assert_eq!((empty.nodes_revision(), empty.policy_revision()), (0, 0));
        assert!(base.supersedes(&empty));
    }

    #[test]
    fn marks_commute_and_repeat_harmlessly() {
        let fail = ForwardMark::new("M1", ForwardResult::Failed, 10);
        let ok = ForwardMark::new("M1", ForwardResult::Delivered, 20);
        let late_fail = ForwardMark::new("M1", ForwardResult::Failed, 5);
        let h = Health::default();
        let a = h.with(&fail).with(&ok).with(&late_fail);
        let b = h.with(&late_fail).with(&ok).with(&fail).with(&ok);
        assert_eq!(a, b);
        assert_eq!(a.last_failure_at_ms, Some(10));
        assert!(!a.failing());
        assert!(!h.with(&ok).with(&fail).failing());
        assert!(h.with(&fail).failing());
        assert_eq!(h.with(&fail).merge(h.with(&ok)), h.with(&fail).with(&ok));
    }
}
