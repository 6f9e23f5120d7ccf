//! The map-change race (SPEC §16), explored exhaustively: two call shards,
//! a map that has just grown from one shard to two, and two Workers, one
//! still on the old map and one on the new, that receive the same new
//! session at once. Every interleaving of their requests (webhooks,
//! redirects, holder lookups), of the directory pushing the new map to
//! either shard, and of a restart of either shard, runs on the real call
//! shards over real SQLite (the simulation's holder world, `sim/holders.rs`),
//! breadth first, so the first violation found has a shortest path.
//!
//! A state is the world's fingerprint plus the actions still available; a
//! state reached again is not explored again. Each state is rebuilt by
//! replaying its path on fresh databases.

use crate::holders::{Action, HolderWorld, Plant};
use callfence_core::placement::home;
use std::collections::{HashSet, VecDeque};

/// What a search covered, and the shortest violating path of `A`s if any
/// (this race's, and the lease race's).
pub struct Race<A> {
    pub states: usize,
    pub transitions: usize,
    pub depth: usize,
    pub found: Option<(Vec<A>, String)>,
}

/// The race's session: one the new map places on shard 1 (the old map
/// places every session on shard 0).
fn session() -> String {
    (0..)
        .map(|i| format!("v3:race-{i}"))
        .find(|id| home(id, 2) == 1)
        .expect("a session")
}

/// The world after `path`, and whether it broke an invariant.
fn replay(plant: Option<Plant>, path: &[Action]) -> HolderWorld {
    // Revision 0: one shard; revision 1: two. Both shards start on
    // revision 0; Worker 1 has read revision 1, Worker 0 has not.
    let mut world = HolderWorld::with(2, vec![1, 2], 2, plant);
    world.apply(&Action::Refresh(1));
    world.hold_still();
    for action in path {
        world.apply(action);
    }
    world
}

/// The actions enabled after `path`: each Worker's delivery once, the next
/// request of each placement in flight, each push of the new map once, and
/// one restart of either shard.
fn enabled(world: &HolderWorld, path: &[Action]) -> Vec<Action> {
    let s = session();
    let mut actions = Vec::new();
    for worker in 0..2 {
        let deliver = Action::Deliver {
            worker,
            session: s.clone(),
            event: format!("{s}/w{worker}"),
        };
        if !path.contains(&deliver) {
            actions.push(deliver);
        }
    }
    actions.extend((0..world.in_flight()).map(Action::Advance));
    for shard in 0..2 {
        let push = Action::Push { shard, revision: 1 };
        if !path.contains(&push) {
            actions.push(push);
        }
    }
    if !path.iter().any(|a| matches!(a, Action::Restart(_))) {
        actions.extend((0..2).map(Action::Restart));
    }
    actions
}

/// Explores every interleaving, breadth first.
pub fn explore(plant: Option<Plant>) -> Race<Action> {
    let mut race = Race {
        states: 0,
        transitions: 0,
        depth: 0,
        found: None,
    };
    let mut seen = HashSet::new();
    let mut queue = VecDeque::from([Vec::<Action>::new()]);
    while let Some(path) = queue.pop_front() {
        let world = replay(plant, &path);
        if let Some(violation) = world.violations.first() {
            race.found = Some((path, violation.clone()));
            return race;
        }
        let actions = enabled(&world, &path);
        let key = format!("{}|{:?}", world.fingerprint(), {
            let mut left: Vec<String> = actions
                .iter()
                .filter(|a| !matches!(a, Action::Advance(_)))
                .map(|a| format!("{a:?}"))
                .collect();
            left.sort();
            left
        });
        if !seen.insert(key) {
            continue;
        }
        race.states += 1;
        race.depth = race.depth.max(path.len());
        for action in actions {
            race.transitions += 1;
            let mut next = path.clone();
            next.push(action);
            queue.push_back(next);
        }
    }
    race
}
