//! The deterministic simulation: seeded schedules on a virtual clock drive the
//! real engine on real SQLite (rusqlite, the same migrations as the Durable
//! Object) through a carrier that duplicates, reorders, delays and retries,
//! nodes that beat, die, come back, go dirty, drain, change SHA, time out or
//! refuse, adversarial fence requests, node ops under unknown keys, stale
//! compare-and-set writes, restarts that drop everything in memory, and
//! late, reordered or lost delivery reports carrying their hop and budget.
//! The simulated Dispatcher asks the engine when its alarm is due after
//! every state change. After every step the checker verifies the
//! invariants, including the maintained open-call counts and the alarm's
//! due time against a full scan of the tables.
//!
//! Every delivery, the webhook's and the alarm's re-drives, is core's one
//! delivery driver (`callfence_core::delivery`), polled as the Dispatcher
//! polls it, with its reports delayed, reordered or lost in between. A
//! planted driver bug (a resend after an ambiguous answer) must be caught.
//!
//! The Dispatcher is core's two machines, a directory and a call shard,
//! driven through their typed messages (`machines.rs`): the directory's
//! views and the shard's forward marks wait in flight and are delivered at
//! random steps, in random order, some twice, and across restarts. A beat
//! is in force for the checker from when the shard's view holds it (its
//! acknowledgement), so a decision made on a late view is judged by what
//! had been acknowledged when it was made.
//!
//! `CALLFENCE_SIM_SCHEDULES` sets the number of schedules (`make test` runs
//! at least 2,000); `CALLFENCE_SIM_SEED` replays one schedule.

#[allow(dead_code)]
#[path = "../common/mod.rs"]
mod common;
mod machines;
mod world;

use common::checker::Violation;
use world::{Plant, World};

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
    let (mut reforwards, mut held_back, mut unknown_keys, mut alarm_checks) = (0u64, 0, 0, 0);
    let (mut messages, mut superseded) = (0u64, 0u64);
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
        reforwards += world.reforwards;
        held_back += world.held_back;
        unknown_keys += world.unknown_keys;
        alarm_checks += world.alarm_checks;
        let (delivered, dropped) = world.messages();
        messages += delivered;
        superseded += dropped;
    }
    let single = seeds.len() == 1;
    assert!(
        forwards > 0 && fences > 0 && alarm_checks > 0,
        "the simulation exercised nothing"
    );
    assert!(
        single || (reforwards > 0 && held_back > 0 && unknown_keys > 0 && superseded > 0),
        "the simulation never exercised the re-forward rule, the key check or a late view"
    );
    println!(
        "sim: {} schedules, {steps} steps, 0 violations ({forwards} forwards, {fences} fence grants, \
         {reforwards} re-forwards and {held_back} held back by the hop/budget rule, \
         {unknown_keys} unknown-key refusals, alarm due time checked after {alarm_checks} steps with work, \
         {messages} messages between the directory and the shard delivered out of order, \
         {superseded} of them late views the shard dropped)",
        seeds.len()
    );
}

#[test]
fn a_driver_that_resends_after_an_ambiguous_answer_is_caught() {
    let caught = (1..=50u64).find(|i| {
        let mut world = World::planted(
            i.wrapping_mul(0x9E37_79B9_7F4A_7C15),
            Plant::ResendAfterAmbiguous,
        );
        world.run();
        world
            .checker
            .violations
            .iter()
            .any(|v| matches!(v, Violation::AttemptResent(_)))
    });
    assert!(caught.is_some(), "the planted resend went unnoticed");
    println!("sim: the planted resend after an ambiguous answer caught in schedule {caught:?}");
}

#[test]
fn an_eligibility_change_acknowledged_before_the_shard_has_it_is_caught() {
    let caught = (1..=200u64).find(|i| {
        let mut world =
            World::planted(i.wrapping_mul(0x9E37_79B9_7F4A_7C15), Plant::AckAtDirectory);
        world.run();
        world
            .checker
            .violations
            .iter()
            .any(|v| matches!(v, Violation::IneligibleChosen(_)))
    });
    assert!(
        caught.is_some(),
        "a change acknowledged at the directory alone went unnoticed"
    );
    println!(
        "sim: a beat acknowledged before the shard's view held it caught in schedule {caught:?}"
    );
}
