//! A shard's lease (SPEC §16, `messages::lease`): shards other than
//! `global` decide only under a lease from the directory, and give a node a
//! call only while their open calls there are below the lease's cap.
//! `global`'s own shard needs no lease: it decides on the directory's view
//! in the same object, and counts against each node's capacity what the
//! other shards may hold ([`CallShard::set_held_elsewhere`]).
//!
//! Asking for a lease gives up the one held, so the open calls the ask
//! reports stay exact until the answer comes; only the answer to the newest
//! ask is taken. After a restart no lease is held.

use super::{CallShard, ShardInput};
use crate::error::EngineError;
use crate::messages::{Lease, LeaseAsk, PerNode, CLOCK_MARGIN_MS, LEASE_MS, LEASE_VERSION};
use crate::store::Store;
use std::rc::Rc;

/// The lease a shard decides under.
#[derive(Debug, Clone)]
pub(crate) struct HeldLease {
    /// When the shard stops using it (its end less the clock margin).
    pub usable_until_ms: i64,
    /// Per node, the most open calls the shard may have.
    pub caps: PerNode<u32>,
}

/// What a shard knows of the calls that count against a node's capacity
/// outside its own tables.
#[derive(Debug, Clone, Default)]
pub(crate) enum Room {
    /// The only shard, or `global` with what the other shards may hold.
    #[default]
    Unleased,
    /// A leased shard: its caps (`None`: no usable lease, so no room).
    Leased(Option<PerNode<u32>>),
}

impl<S: Store> CallShard<S> {
    /// The same shard, deciding only under leases (every shard but
    /// `global`).
    pub fn leased(self) -> Self {
        *self.lease_state.borrow_mut() = Some(None);
        self
    }

    /// True when this shard may decide now: it needs no lease, or it holds
    /// one that is still usable.
    pub fn lease_usable(&self, now_ms: i64) -> bool {
        match &*self.lease_state.borrow() {
            None => true,
            Some(held) => held.as_ref().is_some_and(|l| l.usable_until_ms > now_ms),
        }
    }

    /// True when the shard should ask for a lease now: it has none usable,
    /// or half of it has run.
    pub fn lease_due(&self, now_ms: i64) -> bool {
        match &*self.lease_state.borrow() {
            None => false,
            Some(None) => true,
            Some(Some(l)) => l.usable_until_ms - now_ms < LEASE_MS / 2,
        }
    }

    /// Gives up the lease held and asks for a new one (`reclaimed`: the
    /// directory asked this shard to report; it wants no spare room).
    pub fn lease_ask(&self, reclaimed: bool) -> Result<LeaseAsk, EngineError> {
        let (seq, open) = self.unit(|| {
            let q = self.q();
            let seq = q.counters(&["lease_seq"], &[])?[0];
            Ok::<_, EngineError>((seq, q.all_open_calls()?))
        })?;
        if let Some(held) = &mut *self.lease_state.borrow_mut() {
            *held = None;
        }
        self.asked.set(Some(seq));
        Ok(LeaseAsk {
            v: LEASE_VERSION,
            shard: self.index,
            seq,
            open,
            want: std::mem::take(&mut *self.wants.borrow_mut()),
            reclaimed,
        })
    }

    /// The directory's answer: taken when it answers this shard's newest
    /// ask (since it started), after the map it carries is adopted (when
    /// newer), so that a shard under a lease holds a map replaced at most a
    /// lease ago. Returns true when taken.
    pub fn handle_lease(&self, lease: Lease) -> Result<bool, EngineError> {
        let newest = self.asked.get() == Some(lease.seq);
        if lease.v != LEASE_VERSION
            || lease.shard != self.index
            || !newest
            || self.lease_state.borrow().is_none()
        {
            return Ok(false);
        }
        if let Some(map) = &lease.map {
            self.handle_map(map)?;
        }
        let mut state = self.lease_state.borrow_mut();
        let Some(held) = &mut *state else {
            return Ok(false);
        };
        *held = Some(HeldLease {
            usable_until_ms: lease.until_ms - CLOCK_MARGIN_MS,
            caps: lease.caps,
        });
        drop(state);
        self.handle_input(ShardInput::View(Rc::clone(&lease.view)));
        Ok(true)
    }

    /// The directory asks this shard to give up the lease that answered
    /// its ask `seq` (a change was made that the lease's view lacks): when
    /// the shard's newest ask is no newer, it drops the lease it holds and
    /// will take no answer to that ask, so the change is acknowledged
    /// without waiting for the lease's end; its next request that decides
    /// asks again. A newer ask is kept: the lease revoked is not held, and
    /// an answer to it would not be taken. Either way, once this returned
    /// the directory may count that lease as given up
    /// ([`crate::directory::Directory::revoked`]). Returns true when it
    /// dropped what it held.
    pub fn handle_revoke(&self, seq: u64) -> bool {
        if self.asked.get().is_none_or(|asked| asked > seq) {
            return false;
        }
        self.asked.set(None);
        if let Some(held) = &mut *self.lease_state.borrow_mut() {
            *held = None;
        }
        true
    }

    /// For `global`'s own shard: per node, the open calls the other shards
    /// may hold ([`crate::directory::Directory::held_by_shards`]).
    pub fn set_held_elsewhere(&self, held: PerNode<u32>) {
        *self.elsewhere.borrow_mut() = held;
    }

    /// What a decision starting now counts against each node's capacity
    /// beyond this shard's open calls.
    pub(crate) fn room(&self, now_ms: i64) -> Room {
        match &*self.lease_state.borrow() {
            None => Room::Unleased,
            Some(held) => Room::Leased(
                held.as_ref()
                    .filter(|l| l.usable_until_ms > now_ms)
                    .map(|l| l.caps.clone()),
            ),
        }
    }

    /// The nodes decisions found full for want of room held by other
    /// shards (in `global`: the directory asks those shards to report).
    pub fn take_wants(&self) -> Vec<String> {
        std::mem::take(&mut *self.wants.borrow_mut())
    }

    /// A decision found `node`'s cap reached: the next ask asks for room.
    pub(crate) fn want(&self, node: &str) {
        self.short.set(true);
        let mut wants = self.wants.borrow_mut();
        if !wants.iter().any(|n| n == node) {
            wants.push(node.to_owned());
        }
    }

    /// True when a decision found a node's cap reached since the last ask
    /// (the next ask asks for room there).
    pub fn wants_room(&self) -> bool {
        !self.wants.borrow().is_empty()
    }

    /// Runs `serve` with every decision taken as it stands: a node found
    /// full for want of room held elsewhere is full. The Dispatcher serves
    /// a request this way once it asked for the room a first try lacked
    /// (`Undo::NeedRoom`), so that a request is undone at most once.
    pub fn as_is<T>(&self, serve: impl FnOnce() -> T) -> T {
        self.as_is.set(true);
        let out = serve();
        self.as_is.set(false);
        out
    }

    /// Starts a decision that is undone when it finds a node full for want
    /// of room another shard may hold ([`CallShard::room_short`]).
    pub(crate) fn watch_room(&self) {
        self.short.set(false);
    }

    /// True when the decision since [`CallShard::watch_room`] found a node
    /// full only for room another shard may hold (a leased shard's cap
    /// reached, or in `global` the room other shards may hold), and it is
    /// not taken as it stands: its unit is undone and the room asked for.
    pub(crate) fn room_short(&self) -> bool {
        self.short.get() && !self.as_is.get()
    }
}

/// How a unit that makes a decision ends early: failed, or undone on
/// purpose because it found a node full for want of room another shard
/// may hold (SPEC §16: capacity counts every shard's calls, so the room is
/// asked for before a decision says a node is full).
#[derive(Debug)]
pub(crate) enum Undo {
    /// The storage failed, or a row could not be read.
    Failed(EngineError),
    /// Nothing was stored; the request is served again once the room was
    /// asked for.
    NeedRoom,
}

impl From<EngineError> for Undo {
    fn from(e: EngineError) -> Self {
        Undo::Failed(e)
    }
}

impl From<crate::store::StoreError> for Undo {
    fn from(e: crate::store::StoreError) -> Self {
        Undo::Failed(e.into())
    }
}
