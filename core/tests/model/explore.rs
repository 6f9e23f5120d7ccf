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
use std::collections::HashMap;
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
    let mut frames = vec![Frame {
        actions: model.actions(&root),
        state: root,
        next: 0,
        via: None,
    }];
    let mut found = None;
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
        let depth = frames.len();
        let top = &frames[depth - 1];
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
        let seen = top.state.checker.violations.len();
        if let Some(v) = child.checker.violations[seen..].iter().find(|v| wanted(v)) {
            let mut path: Vec<Action> = frames.iter().filter_map(|f| f.via).collect();
            path.push(action);
            found = Some(Found {
                violation: v.clone(),
                path,
            });
            break;
        }
        let hash = model.hash(&child);
        let explore = match visited.get(&hash) {
            Some(d) => limit.is_some() && *d > depth,
            None => {
                stats.states += 1;
                true
            }
        };
        if !explore || limit.is_some_and(|l| depth >= l) {
            if explore {
                visited.insert(hash, depth);
            }
            model.db.rollback();
            model.restore(&top.state);
            continue;
        }
        visited.insert(hash, depth);
        frames.push(Frame {
            actions: model.actions(&child),
            state: child,
            next: 0,
            via: Some(action),
        });
    }
    stats.elapsed = started.elapsed();
    stats.cpu = thread_cpu()
        .zip(cpu_start)
        .map(|(end, start)| end.saturating_sub(start));
    (stats, found, model.db.fired())
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
