//! Leases (SPEC §16): how a call shard other than `global` learns what the
//! directory knows, and how many calls it may give each node.
//!
//! A shard `k ≥ 1` decides only under a lease. It asks for one with a
//! [`LeaseAsk`], and stops using the lease it held when it asks, so the
//! open calls it reports stay exact until the answer. The directory answers
//! a [`Lease`]: its view (documents, every node's latest beat and forward
//! health: freshness travels with the lease, beats never fan out), the time
//! it lapses, and per node the most open calls the shard may have until
//! then. `global` (shard 0) is the directory's own shard and needs none.
//!
//! Both are safe late, twice or out of order: an ask carries the shard's
//! ask sequence number, the directory ignores an ask older than the newest
//! it answered, and the shard takes only the lease that answers its newest
//! ask.

use super::map::MapNotice;
use super::view::{DirectoryView, PerNode};
use serde::{Deserialize, Serialize};
use std::rc::Rc;

/// The format of [`LeaseAsk`] and [`Lease`].
pub const LEASE_VERSION: u16 = 1;

/// How long a lease lasts, by the directory's clock.
pub const LEASE_MS: i64 = 4_000;

/// How much sooner a shard stops using a lease than its stated end, for
/// the clocks of two objects that may differ.
pub const CLOCK_MARGIN_MS: i64 = 500;

/// A shard's request for a lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseAsk {
    /// [`LEASE_VERSION`].
    pub v: u16,
    /// The asking shard (≥ 1).
    pub shard: u32,
    /// The shard's ask count: each ask has a larger one.
    pub seq: u64,
    /// Its open calls per node, exact: it stopped deciding when it asked.
    pub open: PerNode<u32>,
    /// Nodes it needs room on (a decision found its cap reached).
    pub want: Vec<String>,
    /// True when the directory asked it to report (it wants no spare).
    pub reclaimed: bool,
}

/// The directory's answer to a [`LeaseAsk`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Lease {
    /// [`LEASE_VERSION`].
    pub v: u16,
    /// The shard it is for.
    pub shard: u32,
    /// The ask it answers.
    pub seq: u64,
    /// The directory's view as of the answer.
    pub view: Rc<DirectoryView>,
    /// When it lapses, by the directory's clock (the shard stops
    /// [`CLOCK_MARGIN_MS`] sooner).
    pub until_ms: i64,
    /// Per node, the most open calls the shard may have while the lease
    /// holds. A node not listed: none.
    pub caps: PerNode<u32>,
    /// The shard map in force, with its history as of the answer: a shard
    /// adopts it before it takes the lease, so it never creates a session
    /// under a map replaced more than a lease ago (`None` from a directory
    /// that sends none: the lease is taken without it).
    #[serde(default)]
    pub map: Option<MapNotice>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Between objects a lease and an ask travel as JSON: each names its
    /// format, and reading it back gives the same message.
    #[test]
    fn an_ask_and_a_lease_survive_their_wire_form() {
        let ask = LeaseAsk {
            v: LEASE_VERSION,
            shard: 3,
            seq: 9,
            open: [("M1".to_owned(), 2)].into_iter().collect(),
            want: vec!["M2".into()],
            reclaimed: false,
        };
        let text = serde_json::to_string(&ask).unwrap();
        assert!(
            text.starts_with(r#"{"v":1,"shard":3,"seq":9,"open":[["M1",2]]"#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<LeaseAsk>(&text).unwrap(), ask);
        let lease = Lease {
            v: LEASE_VERSION,
            shard: 3,
            seq: 9,
            view: Rc::new(DirectoryView::empty()),
            until_ms: 4_000,
            caps: [("M1".to_owned(), 1)].into_iter().collect(),
            map: Some(MapNotice::new(2, 4, 1)),
        };
        let text = serde_json::to_string(&lease).unwrap();
        let back: Lease = serde_json::from_str(&text).unwrap();
        assert_eq!(serde_json::to_string(&back).unwrap(), text);
        assert_eq!((back.view.v, back.caps.get("M1")), (1, Some(1)));
        assert_eq!(back.map, lease.map);
    }
}
