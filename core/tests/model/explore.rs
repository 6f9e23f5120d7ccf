//! The search: depth-first over every enabled action of every state, with
//! each state's 128-bit hash remembered so that a state reached again is not
//! explored twice, and iterative deepening for the shortest action sequence
//! that breaks an invariant.
//!
//! States are returned to by savepoint rollbacks (see [`crate::db`]); [`replay`] runs an
//! action list on a fresh database instead, which is how a counterexample is
//! confirmed and how `CALLFENCE_MODEL_REPLAY` reproduces one.

use crate::common::checker::Violation;
use crate::plants::Plant;
use crate::scenario::{Action, Bounds, Model, State};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What a search covered.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    /// Distinct states explored.
    pub states: u64,
    /// Actions applied.
    pub transitions: u64,
    /// The longest action sequence followed.
    pub depth: usize,
    pub elapsed: Duration,
    /// CPU time of the searching thread (None where Linux's
    /// `/proc/thread-self/schedstat` is unavailable).
    pub cpu: Option<Duration>,
}

/// The calling thread's CPU time so far.
fn thread_cpu() -> Option<Duration> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = text.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

/// A broken invariant and the actions that reach it.
#[derive(Debug, Clone)]
pub struct Found {
    pub violation: Violation,
    pub path: Vec<Action>,
}

struct Frame {
    state: State,
    actions: Vec<Action>,
    next: usize,
    via: Option<Action>,
}

/// Explores every state reachable within `limit` actions (all of them when
/// `None`), stopping at the first new violation `wanted` accepts.
///
/// The database always holds the top frame's state: an action is applied
/// inside a savepoint, which stays open while its state is explored and is
/// rolled back when the search returns from it.
pub fn search(
    bounds: &Bounds,
    plant: Option<&'static Plant>,
    limit: Option<usize>,
    wanted: &dyn Fn(&Violation) -> bool,
) -> (Stats, Option<Found>, u64) {
    let started = Instant::now();
    let cpu_start = thread_cpu();
    let (mut model, root) = Model::new(bounds.clone(), plant);
    let mut visited: HashMap<u128, usize> = HashMap::new();
    visited.insert(model.hash(&root), 0);
    let mut stats = Stats {
        states: 1,
        ..Stats::default()
    };
    // A state is explored again only when iterative deepening reaches it
    // by a shorter path than before.
    let mut seen = |hash: u128, depth: usize| match visited.get(&hash) {
        Some(d) if limit.is_none() || *d <= depth => (false, false),
        known => {
            let new = known.is_none();
            visited.insert(hash, depth);
            (true, new)
        }
    };
    let found = dfs(
        &mut model,
        root,
        &[],
        limit,
        wanted,
        &mut seen,
        &mut stats,
        started,
    );
    stats.elapsed = started.elapsed();
    stats.cpu = thread_cpu()
        .zip(cpu_start)
        .map(|(end, start)| end.saturating_sub(start));
    (stats, found, model.db.fired())
}

/// Depth-first from `start` (the database holds it, reached by `prefix`),
/// with `seen(hash, depth)` saying whether a state is to be explored and
/// whether it is new. Returns with the database holding `start` again,
/// unless a violation was found.
#[allow(clippy::too_many_arguments)]
fn dfs(
    model: &mut Model,
    start: State,
    prefix: &[Action],
    limit: Option<usize>,
    wanted: &dyn Fn(&Violation) -> bool,
    seen: &mut dyn FnMut(u128, usize) -> (bool, bool),
    stats: &mut Stats,
    started: Instant,
) -> Option<Found> {
    let base = prefix.len();
    let mut frames = vec![Frame {
        actions: model.actions(&start),
        state: start,
        next: 0,
        via: None,
    }];
    let progress = std::env::var_os("CALLFENCE_MODEL_PROGRESS").is_some();
    while let Some(top) = frames.last_mut() {
        if top.next == top.actions.len() {
            frames.pop();
            if let Some(parent) = frames.last() {
                model.db.rollback();
                model.restore(&parent.state);
            }
            continue;
        }
        let action = top.actions[top.next];
        top.next += 1;
        let depth = base + frames.len();
        let top = &frames[frames.len() - 1];
        model.db.savepoint();
        let child = model.apply(&top.state, action);
        stats.transitions += 1;
        stats.depth = stats.depth.max(depth);
        if progress && stats.transitions.is_multiple_of(100_000) {
            eprintln!(
                "model check: {} states, {} transitions, depth {} (now {}), {:.0} s",
                stats.states,
                stats.transitions,
                stats.depth,
                depth,
                started.elapsed().as_secs_f64()
            );
        }
        let before = top.state.checker.violations.len();
        if let Some(v) = child.checker.violations[before..]
            .iter()
            .find(|v| wanted(v))
        {
            let mut path = prefix.to_vec();
            path.extend(frames.iter().filter_map(|f| f.via));
            path.push(action);
            return Some(Found {
                violation: v.clone(),
                path,
            });
        }
        let (explore, new) = seen(model.hash(&child), depth);
        if new {
            stats.states += 1;
        }
        if !explore || limit.is_some_and(|l| depth >= l) {
            model.db.rollback();
            model.restore(&top.state);
            continue;
        }
        frames.push(Frame {
            actions: model.actions(&child),
            state: child,
            next: 0,
            via: Some(action),
        });
    }
    None
}

/// The states a worker starts from: distinct states at `depth` actions,
/// each with the actions that reach it.
type Roots = Vec<Vec<Action>>;

/// A visited set shared by the search threads, split into shards so that
/// they seldom wait for each other.
struct Shared(Vec<Mutex<HashSet<u128>>>);

impl Shared {
    const SHARDS: usize = 64;

    fn new() -> Self {
        Shared((0..Self::SHARDS).map(|_| Mutex::default()).collect())
    }

    /// True when `hash` was not there before.
    fn insert(&self, hash: u128) -> bool {
        self.0[hash as usize % Self::SHARDS]
            .lock()
            .expect("visited set")
            .insert(hash)
    }
}

/// Applies `path` from the initial state, each action in its own savepoint.
fn walk(model: &mut Model, root: &State, path: &[Action]) -> State {
    let mut state = root.clone();
    for action in path {
        model.db.savepoint();
        state = model.apply(&state, *action);
    }
    state
}

/// Undoes [`walk`].
fn unwalk(model: &mut Model, root: &State, path: &[Action]) {
    for _ in path {
        model.db.rollback();
    }
    model.restore(root);
}

/// The full search (no limit, no plant) on `threads` threads sharing one
/// visited set. The states within a few actions of the start are explored
/// breadth-first by the calling thread; each distinct state at the first
/// depth with enough of them is a subtree root, and each thread, on its
/// own database and engine, takes the next root, replays its actions and
/// searches depth-first from it. A state is explored by the thread that
/// first inserts it, so states and transitions are counted once; `depth`
/// is the longest path followed, which depends on the threads' timing.
pub fn search_parallel(bounds: &Bounds, threads: usize) -> (Stats, Option<Found>) {
    let started = Instant::now();
    let visited = Shared::new();
    let (mut model, root) = Model::new(bounds.clone(), None);
    let mut stats = Stats {
        states: 1,
        ..Stats::default()
    };
    visited.insert(model.hash(&root));
    let cpu_start = thread_cpu();
    // Breadth-first until a level has enough subtree roots.
    let mut level: Roots = vec![Vec::new()];
    while !level.is_empty() && level.len() < 32 * threads {
        let mut next = Roots::new();
        for path in &level {
            let state = walk(&mut model, &root, path);
            for action in model.actions(&state) {
                model.db.savepoint();
                let child = model.apply(&state, action);
                stats.transitions += 1;
                stats.depth = stats.depth.max(path.len() + 1);
                let mut to = path.clone();
                to.push(action);
                if let Some(v) = child.checker.violations[state.checker.violations.len()..].first()
                {
                    return (
                        stats,
                        Some(Found {
                            violation: v.clone(),
                            path: to,
                        }),
                    );
                }
                if visited.insert(model.hash(&child)) {
                    stats.states += 1;
                    next.push(to);
                }
                model.db.rollback();
                model.restore(&state);
            }
            unwalk(&mut model, &root, path);
        }
        level = next;
    }
    let mut cpu = thread_cpu()
        .zip(cpu_start)
        .map(|(end, start)| end.saturating_sub(start));
    drop(model);
    let taken = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let results: Vec<(Stats, Option<Found>)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let cpu_start = thread_cpu();
                    let (mut model, root) = Model::new(bounds.clone(), None);
                    let mut stats = Stats::default();
                    let mut found = None;
                    let mut seen = |hash: u128, _depth: usize| {
                        let new = visited.insert(hash);
                        (new, new)
                    };
                    while !stop.load(Ordering::Relaxed) {
                        let Some(path) = level.get(taken.fetch_add(1, Ordering::Relaxed)) else {
                            break;
                        };
                        let start = walk(&mut model, &root, path);
                        found = dfs(
                            &mut model,
                            start,
                            path,
                            None,
                            &|_| true,
                            &mut seen,
                            &mut stats,
                            started,
                        );
                        if found.is_some() {
                            stop.store(true, Ordering::Relaxed);
                            break;
                        }
                        unwalk(&mut model, &root, path);
                    }
                    stats.cpu = thread_cpu()
                        .zip(cpu_start)
                        .map(|(end, start)| end.saturating_sub(start));
                    (stats, found)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("search thread"))
            .collect()
    });
    let mut found = None;
    for (s, f) in results {
        stats.states += s.states;
        stats.transitions += s.transitions;
        stats.depth = stats.depth.max(s.depth);
        cpu = cpu.zip(s.cpu).map(|(a, b)| a + b);
        found = found.or(f);
    }
    stats.elapsed = started.elapsed();
    stats.cpu = cpu;
    (stats, found)
}

/// The number of search threads: `CALLFENCE_MODEL_THREADS`, else the
/// available cores, at most 2.
pub fn threads() -> usize {
    match std::env::var("CALLFENCE_MODEL_THREADS") {
        Ok(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .unwrap_or_else(|| panic!("CALLFENCE_MODEL_THREADS={v} is not a positive number")),
        Err(_) => std::thread::available_parallelism().map_or(1, |n| n.get().min(2)),
    }
}

/// The shortest action sequence (at most `max` long) that makes the
/// checker report a violation `wanted` accepts, by iterative deepening.
/// Also returns how often the least used matcher of the plant fired in
/// the deepest iteration.
pub fn shortest(
    bounds: &Bounds,
    plant: Option<&'static Plant>,
    max: usize,
    wanted: &dyn Fn(&Violation) -> bool,
) -> (Option<Found>, u64) {
    let mut fired = 0;
    for limit in 1..=max {
        let (_, found, f) = search(bounds, plant, Some(limit), wanted);
        fired = fired.max(f);
        if found.is_some() {
            return (found, fired);
        }
    }
    (None, fired)
}

/// Runs `actions` on a fresh database from the initial state and returns
/// every state's violations, in order, with the action that caused them. An
/// action that is not enabled is an error, or with `lenient` ends the replay
/// (the real engine may take another path than a planted bug's).
pub fn replay(
    bounds: &Bounds,
    plant: Option<&'static Plant>,
    actions: &[Action],
    lenient: bool,
) -> Result<Vec<(Action, Vec<Violation>)>, String> {
    let (mut model, mut state) = Model::new(bounds.clone(), plant);
    let mut out = Vec::new();
    for action in actions {
        if !model.actions(&state).contains(action) {
            if lenient {
                break;
            }
            return Err(format!("`{action}` is not enabled here"));
        }
        let seen = state.checker.violations.len();
        state = model.apply(&state, *action);
        out.push((*action, state.checker.violations[seen..].to_vec()));
    }
    Ok(out)
}
