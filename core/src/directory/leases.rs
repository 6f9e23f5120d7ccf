//! The directory's side of leases (SPEC §16, `messages::lease`): it answers
//! each call shard's ask with its view and per-node caps, counts capacity
//! across shards from what it granted, and says when a change may be
//! acknowledged.
//!
//! Capacity: for each node, `global`'s own open calls plus, for every
//! other shard, the larger of the open calls it last reported and the cap
//! it was last given (what it may hold now) never exceed the node's
//! effective `max_calls` when a cap is granted. A shard gives a node a
//! call only below its cap, so the edge never assigns a node more open
//! calls than its limit, however many shards there are. A shard's row
//! changes only when it asks again, having given up its lease and counted
//! its open calls exactly.
//!
//! Eligibility: a lease lasts [`LEASE_MS`]. A change to what the shards
//! decide on (a document, a beat that changes a node's eligibility, a
//! forward health mark) is acknowledged no sooner than
//! [`Directory::acknowledge_at`]: when every lease granted before it has
//! lapsed, or its shard has answered that it gave it up
//! ([`Directory::revoke_targets`], [`Directory::revoked`]): changes are
//! pushed, to the shards holding a lease only. Every decision that starts
//! after the acknowledgement, in any shard, is made on a view that holds
//! the change.

use super::queries::LeaseRow;
use super::{Directory, EngineError};
use crate::eligibility::effective_max_calls;
use crate::messages::{Lease, LeaseAsk, MapNotice, PerNode, LEASE_MS, LEASE_VERSION};
use crate::store::Store;

impl<S: Store> Directory<S> {
    /// Every shard's lease row (cached).
    fn lease_rows(&self) -> Result<Vec<LeaseRow>, EngineError> {
        if let Some(rows) = &self.cache.borrow().leases {
            return Ok(rows.clone());
        }
        let rows = self.q().lease_rows()?;
        self.cache.borrow_mut().leases = Some(rows.clone());
        Ok(rows)
    }

    /// Per node, the open calls shards other than `global` may hold now:
    /// what `global`'s own decisions count beyond its tables.
    pub fn held_by_shards(&self) -> Result<PerNode<u32>, EngineError> {
        self.held_except(None)
    }

    /// What shards other than `global` and `except` may hold, per node.
    fn held_except(&self, except: Option<u32>) -> Result<PerNode<u32>, EngineError> {
        let mut held = PerNode::default();
        for row in self
            .lease_rows()?
            .iter()
            .filter(|r| Some(r.shard) != except)
        {
            let mut nodes: Vec<&str> = row
                .open
                .iter()
                .chain(row.caps.iter())
                .map(|(n, _)| n)
                .collect();
            nodes.sort_unstable();
            nodes.dedup();
            for node in nodes {
                let mine = row
                    .open
                    .get(node)
                    .unwrap_or(0)
                    .max(row.caps.get(node).unwrap_or(0));
                held.set(node, held.get(node).unwrap_or(0) + mine);
            }
        }
        Ok(held)
    }

    /// When the answer to a request made at `now_ms` may be given:
    /// `decisive` when the request changed what decisions read. A change is
    /// acknowledged once every lease granted before it has lapsed or been
    /// revoked ([`Directory::revoked`]), and any later answer (a beat that
    /// repeats the change, say) no sooner than that: the answer tells the
    /// state, so it waits until every shard decides on it. After a restart,
    /// when the last change was is unknown, and every lease still running
    /// counts.
    pub fn acknowledge_at(&self, now_ms: i64, decisive: bool) -> Result<i64, EngineError> {
        let change = {
            let mut cache = self.cache.borrow_mut();
            let change = match cache.last_change_ms {
                Some(at) if !decisive => at,
                _ => now_ms,
            };
            cache.last_change_ms = Some(change);
            change
        };
        Ok(self
            .lease_rows()?
            .iter()
            .filter(|row| granted_by(row, change))
            .map(|row| row.until_ms)
            .fold(now_ms, i64::max))
    }

    /// The leases that keep the last change from being acknowledged at
    /// `now_ms`, as (shard, ask seq): granted before it and still running.
    /// Each shard asked to give its lease up ([`Directory::revoked`]) lets
    /// the change be acknowledged sooner than the lease's end.
    pub fn revoke_targets(&self, now_ms: i64) -> Result<Vec<(u32, u64)>, EngineError> {
        let Some(change) = self.cache.borrow().last_change_ms else {
            return Ok(Vec::new());
        };
        Ok(self
            .lease_rows()?
            .iter()
            .filter(|row| granted_by(row, change) && row.until_ms > now_ms)
            .map(|row| (row.shard, row.seq))
            .collect())
    }

    /// Shard `shard` answered, at `now_ms`, that it gave up the lease that
    /// answered its ask `seq` and will take no answer to an ask it made
    /// before: that lease no longer holds anything back. A later lease of
    /// the shard is left as it is. Its caps still count toward capacity
    /// until the shard asks again (its open calls may have grown under them).
    pub fn revoked(&self, shard: u32, seq: u64, now_ms: i64) -> Result<(), EngineError> {
        let Some(mut row) = self
            .lease_rows()?
            .into_iter()
            .find(|r| r.shard == shard && r.seq == seq && r.until_ms > now_ms)
        else {
            return Ok(());
        };
        row.until_ms = now_ms;
        self.unit(|| self.q().store_lease(&row))?;
        if let Some(rows) = &mut self.cache.borrow_mut().leases {
            for r in rows.iter_mut().filter(|r| r.shard == shard && r.seq == seq) {
                r.until_ms = now_ms;
            }
        }
        Ok(())
    }

    /// Answers a shard's ask at `now_ms`: its view, and per registered node
    /// a cap that keeps the node's limit across shards. `global_open` is
    /// `global`'s own open calls per node; `map` the map in force, which
    /// the lease carries (a shard's spare room on a node is
    /// `max(1, limit / 2N)` for its `N` shards). `None` for
    /// an ask older than the newest answered (late or repeated). A shard
    /// that wants room on a node that has none left is asked, through
    /// [`Directory::poll_reclaim`], which shards hold spare room there.
    /// `again`: the same ask answered once more, before its first answer
    /// was sent, once those shards reported (the answer replaces the row).
    pub fn handle_lease_ask(
        &self,
        ask: &LeaseAsk,
        global_open: &PerNode<u32>,
        map: MapNotice,
        again: bool,
        now_ms: i64,
    ) -> Result<Option<Lease>, EngineError> {
        if ask.v != LEASE_VERSION || ask.shard == 0 {
            return Err(EngineError::Corrupt(format!(
                "lease ask v{} from shard {}",
                ask.v, ask.shard
            )));
        }
        let rows = self.lease_rows()?;
        if rows.iter().any(|row| {
            row.shard == ask.shard && (row.seq > ask.seq || (row.seq == ask.seq && !again))
        }) {
            return Ok(None);
        }
        let elsewhere = self.held_except(Some(ask.shard))?;
        let view = self.view_at(now_ms)?;
        let mut caps = PerNode::default();
        let mut reclaim = Vec::new();
        if let Some((_, registry)) = &view.registry {
            for (node, entry) in &registry.nodes {
                let beat = view.beat(node);
                let Some(limit) = effective_max_calls(Some(entry), beat.as_deref()) else {
                    caps.set(node, 0);
                    continue;
                };
                let used = global_open.get(node).unwrap_or(0) + elsewhere.get(node).unwrap_or(0);
                let free = limit.saturating_sub(used);
                let open = ask.open.get(node).unwrap_or(0);
                let spare = if ask.reclaimed {
                    0
                } else {
                    (limit / (2 * map.call_shards.max(1))).max(1)
                };
                let cap = free.min(open + spare);
                if cap <= open && ask.want.iter().any(|w| w == node) {
                    reclaim.push(node.clone());
                }
                caps.set(node, cap);
            }
        }
        let row = LeaseRow {
            shard: ask.shard,
            seq: ask.seq,
            until_ms: now_ms + LEASE_MS,
            open: ask.open.clone(),
            caps: caps.clone(),
        };
        self.unit(|| self.q().store_lease(&row))?;
        {
            let mut cache = self.cache.borrow_mut();
            if let Some(rows) = &mut cache.leases {
                rows.retain(|r| r.shard != row.shard);
                rows.push(row.clone());
            }
        }
        self.reclaim_spare(&reclaim, Some(ask.shard))?;
        Ok(Some(Lease {
            v: LEASE_VERSION,
            shard: ask.shard,
            seq: ask.seq,
            view,
            until_ms: row.until_ms,
            caps,
            map: Some(map),
        }))
    }

    /// Queues, for [`Directory::poll_reclaim`], every shard but `except`
    /// that may hold room on one of `nodes`: a cap or open calls there (a
    /// call it reported open may have ended since, which the directory
    /// learns only when the shard reports).
    pub fn reclaim_spare(&self, nodes: &[String], except: Option<u32>) -> Result<(), EngineError> {
        let rows = self.lease_rows()?;
        let spare = rows.iter().filter(|r| {
            Some(r.shard) != except
                && nodes
                    .iter()
                    .any(|n| r.caps.get(n).unwrap_or(0) > 0 || r.open.get(n).unwrap_or(0) > 0)
        });
        let shards: Vec<u32> = spare.map(|r| r.shard).collect();
        let queue = &mut self.cache.borrow_mut().reclaim;
        for shard in shards {
            if !queue.contains(&shard) {
                queue.push(shard);
            }
        }
        Ok(())
    }

    /// True when a shard is to be asked to report ([`Directory::poll_reclaim`]).
    pub fn reclaim_pending(&self) -> bool {
        !self.cache.borrow().reclaim.is_empty()
    }

    /// The next shard to ask to report (it holds spare room on a node
    /// another shard wants), if any. The shard answers with a
    /// [`LeaseAsk`] marked `reclaimed`.
    pub fn poll_reclaim(&self) -> Option<u32> {
        let mut cache = self.cache.borrow_mut();
        (!cache.reclaim.is_empty()).then(|| cache.reclaim.remove(0))
    }
}

/// True when `row`'s lease was granted no later than `change`: it may carry
/// a view without it. (A lease lasts [`LEASE_MS`] from its grant, by the
/// directory's clock; a revoked one has ended already.)
fn granted_by(row: &LeaseRow, change: i64) -> bool {
    row.until_ms - LEASE_MS <= change
}
