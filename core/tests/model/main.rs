//! The bounded exhaustive model check: every interleaving of the actions of
//! a small scenario (webhook deliveries and their duplicates, forward
//! outcomes, late and reordered reports, fences by each node at each epoch,
//! heartbeats, claims, hangups, alarms, clock advances to the next due time
//! or window edge, restarts, compare-and-set writes) is applied to the real
//! engine on real SQLite, and the shared checker (`tests/common/checker.rs`)
//! verifies the invariants of `core/src/lib.rs` in every reached state.
//!
//! - `CALLFENCE_MODEL=full|hangups|restarts|cap|large|short|smoke` picks the
//!   bounds (`smoke` when unset; `make model-check` runs `full`, which is
//!   the `hangups`, `restarts` and `cap` scenarios; `make test` runs `short`,
//!   which is the `short` and `cap` scenarios: `cap` adds two claims of
//!   fresh sessions against a row cap of 2), and each
//!   `CALLFENCE_MODEL_*` variable overrides one bound (see
//!   [`scenario::Bounds`]).
//! - A violation prints the shortest action sequence that reaches it and the
//!   command that replays it: `CALLFENCE_MODEL_REPLAY='<actions>'` runs that
//!   list on a fresh database (`CALLFENCE_MODEL_PLANT=<name>` with a planted
//!   bug) and fails on the first violation.
//! - Each planted bug of [`plants::PLANTS`] has a test that finds its
//!   violation with a counterexample of minimal length.
//! - [`map_race`] explores the race of SPEC §16 exhaustively: two shards, a
//!   map that has just grown, two Workers with different cached maps
//!   placing the same new session. A shard creating without the holder
//!   check is planted and found with a shortest counterexample (the
//!   simulation plants an absence proof reused across map revisions, which
//!   needs a third revision).

#[allow(dead_code)]
#[path = "../common/mod.rs"]
mod common;
mod db;
mod explore;
#[allow(dead_code)]
#[path = "../sim/holders.rs"]
mod holders;
mod lease_race;
#[allow(dead_code)]
#[path = "../sim/leases.rs"]
mod leases;
mod map_race;
mod plants;
mod race;
#[allow(dead_code)]
#[path = "../sim/rng.rs"]
mod rng;
mod scenario;

use explore::{search_parallel, shortest, Found};
use plants::{Plant, PLANTS};
use scenario::{format_actions, parse_actions, Bounds};

fn print_counterexample(bounds: &Bounds, plant: Option<&Plant>, found: &Found) {
    println!(
        "model check: violation {:?} after {} actions (shortest):",
        found.violation,
        found.path.len()
    );
    for (i, action) in found.path.iter().enumerate() {
        println!("  {:>2}. {action}", i + 1);
    }
    println!(
        "replay: {}{} CALLFENCE_MODEL_REPLAY='{}' cargo test --release -p callfence-core --test model replay -- --nocapture",
        bounds.env(),
        plant.map(|p| format!(" CALLFENCE_MODEL_PLANT={}", p.name)).unwrap_or_default(),
        format_actions(&found.path)
    );
}

#[test]
fn every_reachable_state_holds_every_invariant() {
    let threads = explore::threads();
    let (mut states, mut transitions, mut depth) = (0, 0, 0);
    let (mut wall, mut cpu) = (0.0, 0.0);
    for (name, bounds) in Bounds::scenarios_from_env("smoke") {
        println!("model check bounds ({name}): {bounds}; {threads} threads");
        let (stats, found) = search_parallel(&bounds, threads);
        if let Some(found) = found {
            let (shortest, _) = shortest(&bounds, None, found.path.len(), &|_| true);
            print_counterexample(&bounds, None, shortest.as_ref().unwrap_or(&found));
            panic!(
                "model check ({name}): {} states explored, 1 violation",
                stats.states
            );
        }
        assert!(
            stats.states > 1 && stats.transitions > stats.states,
            "nothing was explored"
        );
        let w = stats.elapsed.as_secs_f64();
        let c = stats.cpu.map_or(w, |c| c.as_secs_f64());
        println!(
            "model check ({name}): {} states, {} transitions, depth {}, 0 violations, {w:.1} s ({c:.1} s of CPU)",
            stats.states, stats.transitions, stats.depth
        );
        states += stats.states;
        transitions += stats.transitions;
        depth = depth.max(stats.depth);
        wall += w;
        cpu += c;
    }
    println!(
        "model check: {states} states, {transitions} transitions, depth {depth}, 0 violations"
    );
    println!(
        "model check took {wall:.1} s ({:.0} states/s), {cpu:.1} s of CPU over {threads} threads ({:.0} states/s of CPU)",
        states as f64 / wall.max(1e-9),
        states as f64 / cpu.max(1e-9)
    );
}

/// `CALLFENCE_MODEL_REPLAY`: replays an action list and fails on its first
/// violation. Unset, it replays a known path (a call delivered, a duplicate
/// answered from the ledger, its fence granted once) and checks its effects.
#[test]
fn replay() {
    let bounds = Bounds::from_env("short");
    let plant = std::env::var("CALLFENCE_MODEL_PLANT").ok().map(|name| {
        PLANTS
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("no planted bug named {name}"))
    });
    let given = std::env::var("CALLFENCE_MODEL_REPLAY").ok();
    let text = given.clone().unwrap_or_else(|| {
        "beat M1 eligible; webhook c1.initiated primary; fence M1 c1 e1; report c1.initiated#1 delivered; webhook c1.initiated primary; fence M1 c1 e1; fence M2 c1 e1".into()
    });
    let actions = parse_actions(&text).expect("actions");
    let steps = explore::replay(&bounds, plant, &actions, false).expect("replay");
    for (i, (action, violations)) in steps.iter().enumerate() {
        println!("  {:>2}. {action}", i + 1);
        assert!(
            violations.is_empty(),
            "replay: {violations:?} after action {} ({action})",
            i + 1
        );
    }
    if given.is_none() {
        assert_eq!(steps.len(), actions.len());
    }
}

/// The bounds a planted bug is searched in: the `short` ones (one call, two
/// nodes, one beat each, one clock advance) and what `more` adds.
fn plant_bounds(more: impl FnOnce(&mut Bounds)) -> Bounds {
    let mut b = Bounds::preset("short");
    more(&mut b);
    b
}

/// Finds `name`'s violation with a counterexample of `length` actions (the
/// shortest there is), checks the plant's matcher fired, and replays the
/// counterexample on a fresh database.
fn planted(name: &str, length: usize, more: impl FnOnce(&mut Bounds)) {
    let plant = PLANTS.iter().find(|p| p.name == name).expect("plant");
    let bounds = plant_bounds(more);
    let wanted = |v: &common::checker::Violation| v.kind() == plant.finds;
    // Iterative deepening up to `length`: nothing shorter breaks it.
    let (found, fired) = shortest(&bounds, Some(plant), length, &wanted);
    assert!(
        fired > 0,
        "the matcher of {name} never fired: the engine's statement changed; update plants::PLANTS"
    );
    let found = found.unwrap_or_else(|| panic!("{name}: no {} found", plant.finds));
    print_counterexample(&bounds, Some(plant), &found);
    assert_eq!(found.path.len(), length, "{name}: counterexample length");
    let steps = explore::replay(&bounds, Some(plant), &found.path, false).expect("replay");
    let last = &steps.last().expect("a step").1;
    assert!(last.iter().any(wanted), "{name}: replay gave {last:?}");
    // Without the plant the same actions (as far as the real engine takes
    // the same path) break nothing.
    for (action, violations) in explore::replay(&bounds, None, &found.path, true).expect("replay") {
        assert!(
            violations.is_empty(),
            "{name}: the real engine broke at {action}: {violations:?}"
        );
    }
}

#[test]
#[cfg_attr(debug_assertions, ignore = "release only: `make test` runs it")]
fn planted_fence_grant_not_recorded_gives_a_second_fence() {
    planted("fence_grant_not_recorded", 6, |_| {});
}

#[test]
#[cfg_attr(debug_assertions, ignore = "release only: `make test` runs it")]
fn planted_ambiguous_mark_forgotten_moves_the_call() {
    planted("ambiguous_mark_forgotten", 6, |_| {});
}

#[test]
#[cfg_attr(debug_assertions, ignore = "release only: `make test` runs it")]
fn planted_delivery_not_recorded_forwards_again() {
    planted("delivery_not_recorded", 5, |_| {});
}

#[test]
#[cfg_attr(debug_assertions, ignore = "release only: `make test` runs it")]
fn planted_heartbeat_updates_lost_choose_an_ineligible_node() {
    planted("heartbeat_updates_lost", 4, |b| {
        b.beats = 2;
        b.restarts = 1;
    });
}

#[test]
#[cfg_attr(debug_assertions, ignore = "release only: `make test` runs it")]
fn planted_revision_not_bumped_accepts_a_stale_write() {
    planted("revision_not_bumped", 2, |b| b.writes = 2);
}

#[test]
#[cfg_attr(debug_assertions, ignore = "release only: `make test` runs it")]
fn planted_epoch_counter_not_advanced_repeats_an_epoch() {
    planted("epoch_counter_not_advanced", 4, |_| {});
}

/// Issue 18: a row cap whose eviction ignores liveness lets a flood of
/// claims evict a live call.
#[test]
#[cfg_attr(debug_assertions, ignore = "release only: `make test` runs it")]
fn planted_eviction_ignoring_liveness_prunes_a_live_call() {
    planted("eviction_ignores_liveness", 4, |b| {
        b.floods = 2;
        b.session_cap = 2;
    });
}

/// The report's epoch guard is defence in depth: the engine moves a session
/// only when no attempt at its epoch is outstanding or in doubt (a lapsed
/// lease marks the epoch ambiguous), so with that guard alone dropped no
/// report is ever superseded and nothing can be found. Armed with the
/// forgotten ambiguous mark, a session moves while an older attempt is out,
/// and that attempt's late report is applied.
#[test]
#[cfg_attr(debug_assertions, ignore = "release only: `make test` runs it")]
fn planted_report_epoch_unchecked_applies_a_superseded_report() {
    planted("report_epoch_unchecked", 7, |_| {});
}

fn print_race<A: std::fmt::Debug>(name: &str, race: &race::Race<A>) {
    println!(
        "model check ({name}): {} states, {} transitions, depth {}",
        race.states, race.transitions, race.depth
    );
    if let Some((path, violation)) = &race.found {
        println!("  violation after {} actions: {violation}", path.len());
        for (i, action) in path.iter().enumerate() {
            println!("  {:>2}. {action:?}", i + 1);
        }
    }
}

#[test]
#[cfg_attr(debug_assertions, ignore = "release only: `make test` runs it")]
fn the_map_change_race_never_creates_a_session_twice() {
    let race = map_race::explore(None);
    print_race("map race", &race);
    assert!(race.found.is_none(), "the map race broke an invariant");
    assert!(race.states > 100, "the race explored nothing");
}

#[test]
#[cfg_attr(debug_assertions, ignore = "release only: `make test` runs it")]
fn planted_creation_without_the_holder_check_is_found_in_the_map_race() {
    let race = map_race::explore(Some(holders::Plant::SkipLookup));
    print_race("map race, planted skip_lookup", &race);
    let (path, violation) = race.found.expect("the planted creation went unnoticed");
    assert!(violation.contains("is held by shards"), "{violation}");
    assert!(path.len() <= 8, "not a short counterexample: {path:?}");
}

#[test]
#[cfg_attr(debug_assertions, ignore = "release only: `make test` runs it")]
fn the_lease_race_keeps_capacity_and_acknowledged_drains() {
    let race = lease_race::explore(None, &lease_race::Bounds::from_env());
    print_race("lease race", &race);
    assert!(race.found.is_none(), "the lease race broke an invariant");
    assert!(race.states > 100, "the race explored nothing");
}

#[test]
#[cfg_attr(debug_assertions, ignore = "release only: `make test` runs it")]
fn planted_capacity_counted_per_shard_is_found_in_the_lease_race() {
    let race = lease_race::explore(
        Some(leases::Plant::CapacityPerShard),
        &lease_race::Bounds::from_env(),
    );
    print_race("lease race, planted capacity per shard", &race);
    let (path, violation) = race
        .found
        .expect("capacity counted per shard went unnoticed");
    assert!(
        violation.contains("open calls over the shards"),
        "{violation}"
    );
    assert!(path.len() <= 5, "not a short counterexample: {path:?}");
}

#[test]
#[cfg_attr(debug_assertions, ignore = "release only: `make test` runs it")]
fn planted_eligibility_change_applied_only_to_the_directory_is_found_in_the_lease_race() {
    let race = lease_race::explore(
        Some(leases::Plant::AckAtDirectory),
        &lease_race::Bounds::from_env(),
    );
    print_race("lease race, planted ack at the directory", &race);
    let (path, violation) = race
        .found
        .expect("the drain applied at the directory alone went unnoticed");
    assert!(
        violation.contains("after its drain was acknowledged"),
        "{violation}"
    );
    assert!(path.len() <= 5, "not a short counterexample: {path:?}");
}
