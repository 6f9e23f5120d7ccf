//! The deterministic simulation: seeded schedules on a virtual clock drive the
//! real engine on real SQLite (rusqlite, the same migrations as the Durable
//! Object) through a carrier that duplicates, reorders, delays and retries,
//! nodes that beat, die, come back, go dirty, drain, change SHA, time out or
//! refuse, adversarial fence requests, stale compare-and-set writes,
//! restarts that drop everything in memory, and late, reordered or lost
//! delivery reports. After every step the checker verifies the invariants.
//!
//! `CALLFENCE_SIM_SCHEDULES` sets the number of schedules (`make test` runs
//! at least 2,000); `CALLFENCE_SIM_SEED` replays one schedule.

#[allow(dead_code)]
#[path = "../common/mod.rs"]
mod common;
mod world;

use world::World;

#[test]
fn schedules_hold_every_invariant() {
    let schedules: u64 = std::env::var("CALLFENCE_SIM_SCHEDULES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let seeds: Vec<u64> = match std::env::var("CALLFENCE_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(seed) => vec![seed],
        None => (1..=schedules)
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect(),
    };
    let (mut steps, mut forwards, mut fences) = (0u64, 0u64, 0u64);
    for seed in &seeds {
        let mut world = World::new(*seed);
        world.run();
        if !world.checker.violations.is_empty() {
            panic!(
                "sim: seed {seed} broke invariants: {:?}\nreplay: CALLFENCE_SIM_SEED={seed} cargo test -p callfence-core --test sim",
                world.checker.violations
            );
        }
        steps += world.steps;
        forwards += world.forwards;
        fences += world.fences;
    }
    assert!(
        forwards > 0 && fences > 0,
        "the simulation exercised nothing"
    );
    println!(
        "sim: {} schedules, {steps} steps, 0 violations ({forwards} forwards, {fences} fence grants)",
        seeds.len()
    );
}
