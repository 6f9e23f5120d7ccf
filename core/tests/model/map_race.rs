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
use crate::race::{breadth_first, key, Race};
use callfence_core::placement::home;

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
    breadth_first(
        "map race",
        |path| replay(plant, path),
        |world| world.violations.first().cloned(),
        |world, path| {
            let actions = enabled(world, path);
            let mut left: Vec<String> = actions
                .iter()
                .filter(|a| !matches!(a, Action::Advance(_)))
                .map(|a| format!("{a:?}"))
                .collect();
            left.sort();
            let key = key((world.fingerprint(), left));
            (actions, key)
        },
    )
}
