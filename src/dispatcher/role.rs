//! Which shard an object is (SPEC §16), and what each does around a
//! request: a call shard's own object (`calls-k`, k ≥ 1) serves only the
//! call path and its reads, and sends `global` the forward marks its
//! requests left in the shard's outbox (its lease is [`super::lessee`]'s);
//! `global` answers lease asks with the room other shards report, revokes
//! leases a change was made without, and pushes a changed map.

use super::ops::Served;
use super::store::DoStore;
use crate::clock::now_ms;
use crate::protocol::{self, Leased, Reply, Request};
use callfence_core::document::DocKind;
use callfence_core::engine::{Engine, EngineError};
use callfence_core::shard::ShardOutput;
use callfence_core::store::{Store, Value};

/// How long `global` waits for a call shard to give up its lease: a
/// shard that answers later keeps the change waiting for its lease's end,
/// and the beat or document that made it must still be answered within
/// the Worker's deadline.
const REVOKE_DEADLINE_MS: i64 = 400;

/// How long `global` waits for a call shard to report the room it holds,
/// while a decision elsewhere waits for it.
const ROOM_DEADLINE_MS: i64 = 400;

/// The protocol's deadline, for the messages that have no tighter one.
const DEADLINE_MS: i64 = protocol::DEADLINE_MS as i64;

/// The counter that keeps a call shard's number in its own storage.
const SHARD_COUNTER: &str = "object_shard";

/// The shard this object is: the one its first request's URL named, kept
/// in storage so that an alarm (`named` is `None`) knows it. `global` keeps
/// nothing (an object with no number stored is `global`, as every object
/// before v1.4 was). A request naming another shard than the one stored is
/// refused: one object is one shard for its whole life.
pub fn settle_shard(store: &DoStore, named: Option<u32>) -> Result<u32, EngineError> {
    let read = store.exec(
        "SELECT value FROM counters WHERE name = ?",
        &[Value::from(SHARD_COUNTER)],
    )?;
    let stored = read
        .first()
        .and_then(|row| row.first())
        .and_then(Value::as_int)
        .map(|k| k as u32);
    match (stored, named) {
        (Some(k), Some(n)) if k != n => Err(EngineError::Corrupt(format!(
            "object of shard {k} asked as shard {n}"
        ))),
        (None, Some(k)) if k > 0 => {
            store.exec(
                "INSERT INTO counters (name, value) VALUES (?, ?)",
                &[Value::from(SHARD_COUNTER), Value::Int(i64::from(k))],
            )?;
            Ok(k)
        }
        (stored, named) => Ok(stored.or(named).unwrap_or(0)),
    }
}

/// True when this object serves `request`: `global` serves every one; a
/// call shard serves the call path, its questions and its reads.
pub fn serves(engine: &Engine<DoStore>, request: &Request) -> bool {
    #[cfg(feature = "testing")]
    if matches!(request, Request::Profile) {
        // Every object keeps its own profile (`make bench`).
        return true;
    }
    engine.shard().index() == 0
        || matches!(
            request,
            Request::Webhook { .. }
                | Request::Holds { .. }
                | Request::Leg { .. }
                | Request::Reclaim
                | Request::Revoke { .. }
                | Request::MapPush { .. }
                | Request::Fence { .. }
                | Request::Claim { .. }
                | Request::MediaVerify { .. }
                | Request::Status
                | Request::Metrics { .. }
                | Request::Decisions { .. }
                | Request::Call { .. }
                | Request::Calls { .. }
                | Request::Events { .. }
        )
}

/// In `global`, a lease ask that named nodes with no room left made the
/// directory queue the shards holding room there: they are asked to
/// report at once, and the ask is answered again with what they gave back
/// (`first` otherwise), so that a shard is refused room only when no shard
/// holds it.
pub async fn lease_with_room(
    engine: &Engine<DoStore>,
    env: &worker::Env,
    request: &Request,
    first: Served,
) -> Result<Served, EngineError> {
    let Request::LeaseAsk { ask } = request else {
        return Ok(first);
    };
    if ask.want.is_empty() || !engine.reclaim_pending() {
        return Ok(first);
    }
    reclaim(engine, env).await;
    let lease = engine.handle_lease_ask_again(ask, now_ms())?;
    Ok(Served::Reply(protocol::encode_done(&Leased { lease })))
}

/// In `global`: asks each call shard the directory named as holding room
/// that another shard wants to report, all at once, so that the room comes
/// back (SPEC §16, `Directory::poll_reclaim`); returns once each reported
/// or missed the deadline. A shard that cannot be reached keeps its room
/// until it next asks.
pub async fn reclaim(engine: &Engine<DoStore>, env: &worker::Env) {
    if engine.shard().index() != 0 {
        return;
    }
    let shards: Vec<u32> = std::iter::from_fn(|| engine.poll_reclaim()).collect();
    let asks = shards
        .into_iter()
        .map(|k| tell(env, k, &Request::Reclaim, ROOM_DEADLINE_MS));
    futures_util::future::join_all(asks).await;
}

/// In `global`, when a change waits for leases granted before it: asks
/// each call shard holding one to give it up ([`Request::Revoke`]), all at
/// once, and counts each that answered as given up, so that the change is
/// acknowledged in a round trip instead of a lease's length. Only changes
/// are pushed, and only to the shards holding a lease: a beat that changes
/// nothing a decision reads waits for nothing (SPEC §16). A shard that does
/// not answer keeps its lease until it lapses.
pub async fn revoke(engine: &Engine<DoStore>, env: &worker::Env) {
    let Ok(targets) = engine.revoke_targets(now_ms()) else {
        return;
    };
    let asks = targets.into_iter().map(|(k, seq)| async move {
        let gave_up = tell(env, k, &Request::Revoke { seq }, REVOKE_DEADLINE_MS).await;
        (k, seq, gave_up)
    });
    for (k, seq, gave_up) in futures_util::future::join_all(asks).await {
        // A lease whose end could not be stored still holds the change
        // back until it lapses: the safe side.
        if gave_up {
            let _stored = engine.revoked(k, seq, now_ms());
        }
    }
}

/// In `global`, after a change of the shard map: sends the map in force to
/// every other shard a map of its history may have used, before the change
/// is answered, so that every shard holds it (the holder rule's safety
/// argument, `docs/sharding.md`). A shard that cannot be reached adopts
/// the map from the next request that carries it.
pub async fn push_map(engine: &Engine<DoStore>, env: &worker::Env, request: &Request) {
    let changed = matches!(
        request,
        Request::PutDocument {
            kind: DocKind::Shards,
            ..
        }
    );
    if !changed || engine.shard().index() != 0 {
        return;
    }
    let Ok(map) = engine.map_notice(now_ms()) else {
        return;
    };
    let request = Request::MapPush { map };
    let pushes = (1..map.widest()).map(|k| tell(env, k, &request, DEADLINE_MS));
    futures_util::future::join_all(pushes).await;
}

/// Sends `global` the forward marks a call shard's requests left in its
/// outbox, oldest first; one that cannot be sent goes back, first, for the
/// next request to send.
pub async fn send_marks(engine: &Engine<DoStore>, env: &worker::Env) {
    let shard = engine.shard();
    if shard.index() == 0 {
        return;
    }
    while let Some(ShardOutput::Mark(mark)) = shard.poll_output() {
        let request = Request::Mark { mark: mark.clone() };
        if !tell(env, 0, &request, DEADLINE_MS).await {
            shard.retry_output(ShardOutput::Mark(mark));
            return;
        }
    }
}

/// Sends `request`, which answers `{}`, to shard `shard`'s object within
/// `deadline` ms; true when it was done.
pub(super) async fn tell(env: &worker::Env, shard: u32, request: &Request, deadline: i64) -> bool {
    let sent = protocol::call_shard_within::<serde_json::Value>(env, shard, request, b"", deadline);
    matches!(sent.await, Ok(Reply::Done(_)))
}
