//! The lease race (SPEC §16), explored exhaustively: `global` and one call
//! shard, nodes of `max_calls` 1, and the call shard deciding under leases
//! whose asks, grants and revocations (and their answers) cross between the
//! two objects in any order; new calls at either shard, the shard's own
//! lease asks (and those its decisions make), a node's drain, and a restart
//! of either object, within [`Bounds`] (`make test`: two calls, one ask,
//! one drain, one restart; `make model-check` adds the clock passing half a
//! lease's life; hangups, beats, reclaims, duplicates and losses can be
//! added with `CALLFENCE_MODEL_LEASE`, and the simulation's lease world
//! draws them all at random). Every path runs on the simulation's lease
//! world (`sim/leases.rs`: the real engine and call shard on real SQLite),
//! breadth first, so the first violation found has a shortest path. The
//! world checks after each step that no node has more open calls over both
//! shards than its `max_calls`, and that no call goes to a node whose drain
//! was acknowledged before the decision started.
//!
//! A state is the world's fingerprint (its clock, nodes, open calls,
//! messages in flight in any order, every object's storage and what each
//! object was told since it started) plus the actions already used; a
//! state reached again is not explored again.

use crate::leases::{Action, LeaseWorld, Message, Plant};
use crate::race::{breadth_first, key, Race};

/// How many times each kind of action may happen on one path.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// New calls, at either shard.
    pub calls: usize,
    /// Hangups of open calls.
    pub hangups: usize,
    /// Lease asks of the call shard (more follow from decisions).
    pub asks: usize,
    /// Node M1 drains, or comes back.
    pub toggles: usize,
    /// The clock moves on by half a lease's life.
    pub waits: usize,
    /// Restarts of either object.
    pub restarts: usize,
    /// Messages delivered and kept in flight (duplicates).
    pub duplicates: usize,
    /// Messages, or a revocation's answer, lost.
    pub losses: usize,
    /// Rounds of every node's beat.
    pub beats: usize,
    /// The directory's queued reclaims asked.
    pub reclaims: usize,
}

impl Bounds {
    /// `make test`'s bounds (`CALLFENCE_MODEL=short`, or unset), the full
    /// ones (`full`), or ten numbers in field order from
    /// `CALLFENCE_MODEL_LEASE`
    /// (`calls,hangups,asks,toggles,waits,restarts,duplicates,losses,beats,reclaims`).
    pub fn from_env() -> Bounds {
        if let Ok(list) = std::env::var("CALLFENCE_MODEL_LEASE") {
            let n: Vec<usize> = list
                .split(',')
                .map(|v| v.trim().parse().expect("CALLFENCE_MODEL_LEASE: numbers"))
                .collect();
            assert_eq!(n.len(), 10, "CALLFENCE_MODEL_LEASE: ten numbers");
            return Bounds {
                calls: n[0],
                hangups: n[1],
                asks: n[2],
                toggles: n[3],
                waits: n[4],
                restarts: n[5],
                duplicates: n[6],
                losses: n[7],
                beats: n[8],
                reclaims: n[9],
            };
        }
        let short = Bounds {
            calls: 2,
            hangups: 0,
            asks: 1,
            toggles: 1,
            waits: 0,
            restarts: 1,
            duplicates: 0,
            losses: 0,
            beats: 0,
            reclaims: 0,
        };
        match std::env::var("CALLFENCE_MODEL").as_deref() {
            Ok("full") => Bounds { waits: 1, ..short },
            _ => short,
        }
    }
}

/// Two shards (`global` and `calls-1`), nodes of one call each.
const SHARDS: u32 = 2;
const LIMIT: u32 = 1;
/// Half of a lease's 4 s: a lease granted before two waits has lapsed.
const WAIT_MS: i64 = 2_500;

/// The world after `path`, stopped at its first violation.
fn replay(plant: Option<Plant>, path: &[Action]) -> LeaseWorld {
    let mut world = LeaseWorld::with(0, plant, SHARDS, LIMIT);
    for action in path {
        world.steps += 1;
        world.apply(action);
        world.check();
        if !world.violations.is_empty() {
            break;
        }
    }
    world
}

/// How often each kind of action happened on `path`, in [`Bounds`] order.
fn used(path: &[Action]) -> [usize; 10] {
    let mut n = [0; 10];
    for action in path {
        let kind = match action {
            Action::Call(_) => 0,
            Action::Hangup(_) => 1,
            Action::Ask(_) => 2,
            Action::Toggle(_) => 3,
            Action::Wait(_) => 4,
            Action::Restart(_) => 5,
            Action::Deliver { again: true, .. } => 6,
            Action::Lose(_)
            | Action::Deliver {
                answered: false, ..
            } => 7,
            Action::Beats => 8,
            Action::Reclaim => 9,
            Action::Deliver { .. } => continue,
        };
        n[kind] += 1;
    }
    n
}

/// The actions enabled after `path` within `bounds`.
fn enabled(world: &LeaseWorld, path: &[Action], bounds: &Bounds) -> Vec<Action> {
    let n = used(path);
    let mut actions = Vec::new();
    if n[0] < bounds.calls {
        actions.extend((0..SHARDS).map(Action::Call));
    }
    if n[1] < bounds.hangups {
        actions.extend((0..world.calls.len()).map(Action::Hangup));
    }
    if n[2] < bounds.asks {
        actions.push(Action::Ask(1));
    }
    for (i, message) in world.in_flight.iter().enumerate() {
        actions.push(Action::Deliver {
            i,
            again: false,
            answered: true,
        });
        if n[6] < bounds.duplicates {
            actions.push(Action::Deliver {
                i,
                again: true,
                answered: true,
            });
        }
        if n[7] < bounds.losses {
            actions.push(Action::Lose(i));
            if matches!(message, Message::Revoke(..)) {
                actions.push(Action::Deliver {
                    i,
                    again: false,
                    answered: false,
                });
            }
        }
    }
    if n[9] < bounds.reclaims {
        actions.push(Action::Reclaim);
    }
    if n[3] < bounds.toggles {
        actions.push(Action::Toggle(0));
    }
    if n[8] < bounds.beats {
        actions.push(Action::Beats);
    }
    if n[4] < bounds.waits {
        actions.push(Action::Wait(WAIT_MS));
    }
    if n[5] < bounds.restarts {
        actions.extend((0..SHARDS).map(Action::Restart));
    }
    actions
}

/// Explores every path within `bounds`, breadth first.
pub fn explore(plant: Option<Plant>, bounds: &Bounds) -> Race<Action> {
    breadth_first(
        "lease race",
        |path| replay(plant, path),
        |world| world.violations.first().cloned(),
        |world, path| {
            let state = key((world.fingerprint(), used(path)));
            (enabled(world, path, bounds), state)
        },
    )
}
