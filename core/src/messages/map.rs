//! [`MapNotice`]: the shard map as a call shard needs it (SPEC §16), sent by
//! the directory and carried by the Worker with every request it places.

use crate::placement::{jump, session_hash};
use serde::{Deserialize, Serialize};

/// The format of [`MapNotice`]: a receiver refuses a notice whose `v` it
/// does not know instead of misreading it.
pub const MAP_VERSION: u16 = 1;

/// The map in force as of its revision, with every shard count that was in
/// force within the holding horizon (so that a shard can tell where else a
/// session may have been created).
///
/// Notices are ordered by `revision`, then, within one revision, by a
/// narrower `history`: the directory is the only writer of the map, its
/// revisions only grow, and as the holding horizon passes it issues the
/// same revision with the counts that fell out of it removed (a narrower
/// history stays true for as long as the revision is in force). A receiver
/// keeps the newest; an older one, late or repeated, changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapNotice {
    /// [`MAP_VERSION`].
    pub v: u16,
    /// The map's revision (0: the map before any `PUT`).
    pub revision: u64,
    /// How many call shards new sessions are placed on.
    pub call_shards: u32,
    /// Bit `n - 1` is set when a map of `n` shards was in force within the
    /// holding horizon (the current map's bit is always set).
    pub history: u32,
}

impl Default for MapNotice {
    /// The map before any `PUT`: one shard, never another.
    fn default() -> Self {
        Self {
            v: MAP_VERSION,
            revision: 0,
            call_shards: 1,
            history: 1,
        }
    }
}

impl MapNotice {
    /// A notice of `call_shards` at `revision`, with the counts in `history`
    /// (bit `n - 1` for `n` shards) and the current count added.
    pub fn new(revision: u64, call_shards: u32, history: u32) -> Self {
        let call_shards = call_shards.clamp(1, 32);
        Self {
            v: MAP_VERSION,
            revision,
            call_shards,
            history: history | 1 << (call_shards - 1),
        }
    }

    /// True when this notice is newer than `other`: a later revision, or
    /// the same revision with a strictly narrower history.
    pub fn supersedes(&self, other: &MapNotice) -> bool {
        let narrower = self.history != other.history && self.history & !other.history == 0;
        self.revision > other.revision || (self.revision == other.revision && narrower)
    }

    /// The shard a new session `id` is placed on now.
    pub fn home(&self, id: &str) -> u32 {
        jump(session_hash(id), self.call_shards)
    }

    /// Every other shard than `me` that a map of the history placed `id` on:
    /// where the session may already be held. Sorted, without repeats.
    pub fn other_homes(&self, id: &str, me: u32) -> Vec<u32> {
        let h = session_hash(id);
        let mut homes: Vec<u32> = (1..=32u32)
            .filter(|n| self.history & 1 << (n - 1) != 0)
            .map(|n| jump(h, n))
            .filter(|&k| k != me)
            .collect();
        homes.sort_unstable();
        homes.dedup();
        homes
    }

    /// The largest shard count of the history: a read that spans shards
    /// reads shards `0..widest()`.
    pub fn widest(&self) -> u32 {
        32 - self.history.leading_zeros()
    }
}

/// A call shard's answer to a webhook of a session it may not create
/// (`shard::holder`): nothing was stored, and the Worker sends the webhook
/// on. Its reader is the Worker's driver, `locate::Locate`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "redirect", rename_all = "snake_case")]
pub enum Redirect {
    /// The map the shard holds places the session on `shard`.
    Elsewhere {
        /// The session's home under `map`.
        shard: u32,
        /// The map the shard holds.
        map: MapNotice,
    },
    /// Another shard may already hold the session: ask each of `shards`.
    Lookup {
        /// The shards to ask.
        shards: Vec<u32>,
        /// The map the shard holds, carried in each question.
        map: MapNotice,
    },
    /// The event names no session and a leg (`call_control_id`) this shard
    /// does not know: ask each of `shards` whether it knows the leg, send
    /// the event to the one that does, or back here saying that none does.
    Leg {
        /// The other shards that may hold the leg's session.
        shards: Vec<u32>,
        /// The map the shard holds.
        map: MapNotice,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::home;

    #[test]
    fn the_current_count_is_always_in_the_history() {
        let m = MapNotice::new(3, 4, 0);
        assert_eq!(m.history, 0b1000);
        assert_eq!(m.widest(), 4);
        assert_eq!(MapNotice::default().widest(), 1);
        assert_eq!(MapNotice::new(4, 2, 0b1000).widest(), 4);
    }

    #[test]
    fn other_homes_are_the_history_placements_but_mine() {
        let grown = MapNotice::new(2, 4, 0b0001);
        for i in 0..200 {
            let id = format!("s{i}");
            let now = grown.home(&id);
            assert_eq!(now, home(&id, 4));
            let others = grown.other_homes(&id, now);
            if now == 0 {
                assert!(others.is_empty(), "{id}");
            } else {
                assert_eq!(others, vec![0], "{id}");
            }
        }
        assert!(MapNotice::default().other_homes("s", 0).is_empty());
    }

    #[test]
    fn a_newer_revision_supersedes() {
        let (a, b) = (MapNotice::new(1, 2, 0), MapNotice::new(2, 1, 0b10));
        assert!(b.supersedes(&a) && !a.supersedes(&b) && !a.supersedes(&a));
    }

    #[test]
    fn the_same_revision_supersedes_only_when_narrower() {
        let wide = MapNotice::new(5, 4, 0b0001);
        let narrow = MapNotice::new(5, 4, 0);
        assert!(narrow.supersedes(&wide) && !wide.supersedes(&narrow));
        // A history that is not a subset is never taken for a narrowing.
        let other = MapNotice::new(5, 4, 0b0010);
        assert!(!other.supersedes(&wide) && !wide.supersedes(&other));
        // A later revision supersedes whatever its history.
        assert!(MapNotice::new(6, 4, 0b0111).supersedes(&narrow));
    }
}
