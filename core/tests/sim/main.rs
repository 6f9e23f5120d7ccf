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
//! The holder world (`holders.rs`) runs call shards as separate machines on
//! separate databases while the map grows and shrinks, with Workers whose
//! cached maps differ racing on the same new sessions (SPEC §16).
//!
//! `CALLFENCE_SIM_SCHEDULES` sets the number of schedules (`make test` runs
//! at least 2,000); `CALLFENCE_SIM_SEED` replays one schedule.

#[allow(dead_code)]
#[path = "../common/mod.rs"]
mod common;
// Shared with the model check, which uses what the simulation does not.
#[allow(dead_code)]
mod holders;
#[allow(dead_code)]
mod leases;
mod machines;
mod rng;
mod world;

use common::checker::Violation;
use holders::HolderWorld;
use world::{Plant, World};

#[test]
fn schedules_hold_every_invariant() {
    let seeds = schedules();
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

fn schedules() -> Vec<u64> {
    let schedules: u64 = std::env::var("CALLFENCE_SIM_SCHEDULES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    match std::env::var("CALLFENCE_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(seed) => vec![seed],
        None => (1..=schedules)
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect(),
    }
}

/// Runs `world` for every schedule: it returns a world's violations and
/// its counts, which are summed. A violation fails the test with its seed.
fn every_schedule<const N: usize>(
    name: &str,
    world: impl Fn(u64) -> (Vec<String>, [u64; N]),
) -> (usize, [u64; N]) {
    let seeds = schedules();
    let mut sums = [0; N];
    for seed in &seeds {
        let (violations, counts) = world(*seed);
        assert!(
            violations.is_empty(),
            "{name}: seed {seed}: {violations:?}\nreplay: CALLFENCE_SIM_SEED={seed} cargo test -p callfence-core --test sim {name}"
        );
        for (sum, count) in sums.iter_mut().zip(counts) {
            *sum += count;
        }
    }
    (seeds.len(), sums)
}

#[test]
fn every_session_has_one_holder_across_map_changes() {
    let (n, [steps, created, lookups, redirects, changes, gave_up]) =
        every_schedule("holders", |seed| {
            let mut w = HolderWorld::new(seed, None);
            w.run();
            let counts = [
                w.steps,
                w.created,
                w.lookups,
                w.redirects,
                w.map_changes,
                w.gave_up,
            ];
            (w.violations, counts)
        });
    assert!(
        n == 1 || (created > 0 && lookups > 0 && redirects > 0 && changes > 0),
        "the holder world never raced a map change"
    );
    println!(
        "sim holders: {n} schedules, {steps} steps, 0 violations ({created} sessions created, \
         {changes} map changes, {redirects} redirects, {lookups} holder lookups, \
         {gave_up} placements given up after {} requests and retried by the carrier)",
        callfence_core::locate::MAX_REQUESTS
    );
}

/// The first of 200 schedules whose holder world with `plant` sees a
/// session held twice.
fn second_holder_caught(plant: holders::Plant) -> Option<u64> {
    (1..=200u64).find(|i| {
        let mut world = HolderWorld::new(i.wrapping_mul(0x9E37_79B9_7F4A_7C15), Some(plant));
        world.run();
        world
            .violations
            .iter()
            .any(|v| v.contains("is held by shards"))
    })
}

#[test]
fn a_shard_that_creates_a_session_without_the_holder_check_is_caught() {
    let caught = second_holder_caught(holders::Plant::SkipLookup);
    assert!(caught.is_some(), "a second holder went unnoticed");
    println!("sim holders: a creation without the holder check caught in schedule {caught:?}");
}

#[test]
fn an_absence_proof_not_bound_to_its_map_revision_is_caught() {
    let caught = second_holder_caught(holders::Plant::StaleProof);
    assert!(caught.is_some(), "a stale absence proof went unnoticed");
    println!(
        "sim holders: an absence proof carried across map revisions caught in schedule {caught:?}"
    );
}

#[test]
fn leases_keep_capacity_and_acknowledged_drains_across_shards() {
    let (n, [steps, assigned, parked, leases, reclaims, full, revoked, room_asked]) =
        every_schedule("leases", |seed| {
            let mut w = leases::LeaseWorld::new(seed, None);
            w.run();
            let counts = [
                w.steps,
                w.assigned,
                w.parked,
                w.leases,
                w.reclaims,
                w.full,
                w.revoked,
                w.room_asked,
            ];
            (w.violations, counts)
        });
    assert!(
        n == 1
            || (assigned > 0
                && leases > 0
                && reclaims > 0
                && full > 0
                && revoked > 0
                && room_asked > 0),
        "the lease world never assigned under a lease, reclaimed room, filled a node, revoked a lease \
         or undid a decision for want of room"
    );
    println!(
        "sim leases: {n} schedules, {steps} steps, 0 violations ({assigned} calls assigned, {parked} parked, \
         {leases} leases taken, {reclaims} reclaims, {room_asked} decisions undone for room, {revoked} leases revoked, \
         a node at its limit of {} after {full} steps)",
        leases::LIMIT
    );
}

/// The first of 3,000 schedules whose lease world with `plant` breaks an
/// invariant whose message contains `what`.
fn lease_plant_caught(plant: leases::Plant, what: &str) -> Option<u64> {
    (1..=3000u64).find(|i| {
        let mut world = leases::LeaseWorld::new(i.wrapping_mul(0x9E37_79B9_7F4A_7C15), Some(plant));
        world.run();
        world.violations.iter().any(|v| v.contains(what))
    })
}

#[test]
fn capacity_counted_per_shard_is_caught() {
    let caught = lease_plant_caught(
        leases::Plant::CapacityPerShard,
        "open calls over the shards",
    );
    assert!(
        caught.is_some(),
        "capacity counted per shard went unnoticed"
    );
    println!("sim leases: capacity counted per shard caught in schedule {caught:?}");
}

#[test]
fn a_drain_acknowledged_at_the_directory_alone_is_caught() {
    let caught = lease_plant_caught(
        leases::Plant::AckAtDirectory,
        "after its drain was acknowledged",
    );
    assert!(
        caught.is_some(),
        "a drain in force at the directory alone went unnoticed"
    );
    println!("sim leases: a drain acknowledged before the shards' leases lapsed caught in schedule {caught:?}");
}

#[test]
fn a_lease_kept_after_its_revocation_is_caught() {
    let caught = lease_plant_caught(
        leases::Plant::RevokeIgnored,
        "after its drain was acknowledged",
    );
    assert!(
        caught.is_some(),
        "a shard deciding on a lease it said it gave up went unnoticed"
    );
    println!("sim leases: a lease kept after its revocation caught in schedule {caught:?}");
}
