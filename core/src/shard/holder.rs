//! The holder rule (SPEC §16): a session is held by the shard that stored
//! its first event, and by no other, across every change of the map.
//!
//! A shard creates a session only when both hold, checked inside the unit
//! that creates it:
//! 1. the map it holds places the session on it (after adopting the
//!    request's map when newer); otherwise it answers
//!    [`Redirect::Elsewhere`] with that map, and stores nothing;
//! 2. every other shard that a map of the history placed the session on
//!    (where it may already be held) has answered "absent" to a
//!    [`CallShard::handle_holds`] that carried this same map revision;
//!    otherwise it answers [`Redirect::Lookup`] with the shards to ask.
//!
//! Answering "absent" adopts the asker's map, under which the asked shard
//! is not the session's home, so it will not create the session either
//! until it adopts a newer map; and a newer map changes the asker's
//! revision, which voids the proof. `docs/sharding.md` has the argument
//! and the message diagram; the simulation's holder world and the model
//! check explore the races.

use super::{CallShard, Ingress};
use crate::error::EngineError;
use crate::messages::{MapNotice, Redirect, MAP_VERSION};
use crate::store::Store;

/// What the Worker knows when it places a webhook: its newest map, and the
/// shards that answered "absent" under a map revision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Arrival {
    /// The newest map the Worker has seen (its cache, or an answer's).
    pub map: Option<MapNotice>,
    /// The shards that answered "absent" for this session, and the map
    /// revision their answers were given under.
    pub absent: Option<(u64, Vec<u32>)>,
    /// For an event that names no session: every other shard was asked
    /// whether it knows the event's leg, and none does (or this is the one
    /// that does).
    pub legs_asked: bool,
}

/// The answer to [`CallShard::handle_holds`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holds {
    /// The session is held here: send its events here.
    Held,
    /// Not held here, and (having adopted the asker's map) this shard will
    /// not create it under that map.
    Absent,
}

const MAP_COUNTERS: [&str; 3] = ["map_revision", "map_shards", "map_history"];

impl<S: Store> CallShard<S> {
    /// This shard's number (0 is `global`).
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The newest map this shard has adopted (the map before any `PUT`
    /// until it adopts one).
    pub fn map(&self) -> Result<MapNotice, EngineError> {
        if let Some(map) = self.cache.borrow().map {
            return Ok(map);
        }
        let q = self.q();
        let [revision, shards, history] = MAP_COUNTERS.map(|name| q.counter(name));
        let map = match (revision?, shards?, history?) {
            (0, _, _) => MapNotice::default(),
            (revision, shards, history) => {
                MapNotice::new(revision as u64, shards as u32, history as u32)
            }
        };
        self.cache.borrow_mut().map = Some(map);
        Ok(map)
    }

    /// Adopts `offered` when it is newer than the map held (and of a known
    /// format), inside the caller's unit; returns the map now held.
    fn adopt(&self, offered: Option<&MapNotice>) -> Result<MapNotice, EngineError> {
        let held = self.map()?;
        let Some(offered) = offered.filter(|m| m.v == MAP_VERSION && m.supersedes(&held)) else {
            return Ok(held);
        };
        let values = [
            offered.revision as i64,
            i64::from(offered.call_shards),
            i64::from(offered.history),
        ];
        let set: Vec<(&str, i64)> = MAP_COUNTERS.iter().copied().zip(values).collect();
        self.q().counters(&[], &set)?;
        self.cache.borrow_mut().map = Some(*offered);
        Ok(*offered)
    }

    /// A map from the directory: adopted when newer. Returns the map held.
    pub fn handle_map(&self, notice: &MapNotice) -> Result<MapNotice, EngineError> {
        self.unit(|| self.adopt(Some(notice)))
    }

    /// Whether the session `id` is held here, asked by the shard that may
    /// create it under `map` (which this shard adopts first, in the same
    /// unit).
    pub fn handle_holds(&self, id: &str, map: &MapNotice) -> Result<Holds, EngineError> {
        self.unit(|| {
            self.adopt(Some(map))?;
            Ok(if self.q().session(id)?.is_some() {
                Holds::Held
            } else {
                Holds::Absent
            })
        })
    }

    /// True when this shard holds or may create every session whatever its
    /// id: no newer map is offered, and every map of the history placed
    /// all sessions here (`global` under a map that never had more than one
    /// shard). A request about one session then needs no id read for the
    /// holder rule.
    pub fn sole_holder(&self, arrival: &Arrival) -> Result<bool, EngineError> {
        let held = self.map()?;
        let offered_newer = arrival.map.is_some_and(|m| m.supersedes(&held));
        Ok(!offered_newer && self.index == 0 && held.widest() == 1)
    }

    /// The holder rule for a node's request about session `id` (a fence, a
    /// claim, a media check): where the Worker must go first when this
    /// shard does not hold the session and may not create it; `None` when
    /// it holds it, or is its home with every other possible holder proven
    /// absent (a fence or a media check is then refused here as unknown,
    /// and a claim may create the session).
    pub fn redirect_for(
        &self,
        id: &str,
        arrival: &Arrival,
    ) -> Result<Option<Redirect>, EngineError> {
        // The common case needs no unit: no newer map offered, and the map
        // held makes this shard the session's only possible holder.
        let held = self.map()?;
        let offered_newer = arrival.map.is_some_and(|m| m.supersedes(&held));
        let only_home = held.home(id) == self.index && held.other_homes(id, self.index).is_empty();
        if !offered_newer && only_home {
            return Ok(None);
        }
        self.unit(|| {
            let Some(Ingress::Redirect(redirect)) = self.holder_check(id, arrival)? else {
                return Ok(None);
            };
            Ok(self.q().session(id)?.is_none().then_some(redirect))
        })
    }

    /// For an event that names no session and a leg this shard does not
    /// know (SPEC §16: it reaches the leg's holder): where the Worker asks
    /// first, when a map of the history had other shards and the Worker
    /// has not asked them yet; `None` when the event is this shard's to
    /// record as unroutable. Runs inside the webhook's unit.
    pub(super) fn leg_check(&self, arrival: &Arrival) -> Result<Option<Ingress>, EngineError> {
        let map = self.adopt(arrival.map.as_ref())?;
        if arrival.legs_asked || map.widest() <= 1 {
            return Ok(None);
        }
        let shards = (0..map.widest()).filter(|&k| k != self.index).collect();
        Ok(Some(Ingress::Redirect(Redirect::Leg { shards, map })))
    }

    /// True when this shard knows the leg `call_control_id` (its session's
    /// holder does): the answer to a Worker placing an event that names no
    /// session.
    pub fn holds_leg(&self, call_control_id: &str) -> Result<bool, EngineError> {
        Ok(self.q().leg_session(call_control_id)?.is_some())
    }

    /// The holder rule for a session not held here: `None` when this shard
    /// may create it now, else where the Worker must go first. Runs inside
    /// the webhook's unit.
    pub(super) fn holder_check(
        &self,
        id: &str,
        arrival: &Arrival,
    ) -> Result<Option<Ingress>, EngineError> {
        let map = self.adopt(arrival.map.as_ref())?;
        let home = map.home(id);
        if home != self.index {
            return Ok(Some(Ingress::Redirect(Redirect::Elsewhere {
                shard: home,
                map,
            })));
        }
        let proven: &[u32] = match &arrival.absent {
            Some((revision, shards)) if *revision == map.revision => shards,
            _ => &[],
        };
        let unasked: Vec<u32> = map
            .other_homes(id, self.index)
            .into_iter()
            .filter(|k| !proven.contains(k))
            .collect();
        Ok(
            (!unasked.is_empty()).then_some(Ingress::Redirect(Redirect::Lookup {
                shards: unasked,
                map,
            })),
        )
    }
}
