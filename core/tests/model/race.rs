//! The breadth-first search both races use (the map race and the lease
//! race): each path's world is rebuilt by replaying the path from scratch,
//! a state whose key was seen is not explored again, and the first
//! violation found has a shortest path.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashSet, VecDeque};
use std::hash::{Hash, Hasher};

/// What a search covered, and the shortest violating path of `A`s if any.
pub struct Race<A> {
    pub states: usize,
    pub transitions: usize,
    pub depth: usize,
    pub found: Option<(Vec<A>, String)>,
}

/// A state's key: the hash of what tells it apart.
pub fn key(state: impl Hash) -> u64 {
    let mut hasher = DefaultHasher::new();
    state.hash(&mut hasher);
    hasher.finish()
}

/// Explores every path breadth first: `replay(path)` rebuilds the world
/// after `path`, `violation(world)` is its first broken invariant, and
/// `next(world, path)` gives the actions enabled there and the state's
/// [`key`]. `CALLFENCE_MODEL_PROGRESS` prints the search's progress,
/// labelled `name`.
pub fn breadth_first<A: Clone, W>(
    name: &str,
    replay: impl Fn(&[A]) -> W,
    violation: impl Fn(&W) -> Option<String>,
    next: impl Fn(&W, &[A]) -> (Vec<A>, u64),
) -> Race<A> {
    let mut race = Race {
        states: 0,
        transitions: 0,
        depth: 0,
        found: None,
    };
    let progress = std::env::var_os("CALLFENCE_MODEL_PROGRESS").is_some();
    let mut seen = HashSet::new();
    let mut queue = VecDeque::from([Vec::<A>::new()]);
    while let Some(path) = queue.pop_front() {
        let world = replay(&path);
        if let Some(violation) = violation(&world) {
            race.found = Some((path, violation));
            return race;
        }
        let (actions, key) = next(&world, &path);
        if !seen.insert(key) {
            continue;
        }
        race.states += 1;
        race.depth = race.depth.max(path.len());
        if progress && race.states % 1_000 == 0 {
            eprintln!(
                "{name}: {} states, depth {}, queue {}",
                race.states,
                race.depth,
                queue.len()
            );
        }
        for action in actions {
            race.transitions += 1;
            let mut next = path.clone();
            next.push(action);
            queue.push_back(next);
        }
    }
    race
}
