//! Which shard an object is (SPEC §16), and what a call shard's own object
//! (`calls-k`, k ≥ 1) does around each request: it serves only the call
//! path and its reads, asks `global` for a lease before a request that
//! decides or checks a node's key, and sends `global` the forward marks
//! its requests left in the shard's outbox. `global` does none of this: its
//! shard reads the directory in the same object.

use super::ops::Served;
use super::store::DoStore;
use crate::clock::now_ms;
use crate::protocol::{self, Leased, Reply, Request};
use callfence_core::document::DocKind;
use callfence_core::engine::{Engine, EngineError};
use callfence_core::shard::ShardOutput;
use callfence_core::store::{Store, Value};

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
    engine.shard().index() == 0
        || matches!(
            request,
            Request::Webhook { .. }
                | Request::Holds { .. }
                | Request::Leg { .. }
                | Request::Reclaim
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

/// Before a request that decides or checks a node's key, a call shard
/// renews its lease when due ([`renew`]); asked to report
/// ([`Request::Reclaim`]), it asks for one wanting no spare room. Returns
/// false when the request is on the call path (a webhook, a fence, a claim,
/// a media check) and the shard still holds no usable lease: it may not
/// serve it (the Worker answers 503), since the lease is what keeps its
/// map, its view and its caps in force (SPEC §16). `global` always may.
pub async fn lease(engine: &Engine<DoStore>, env: &worker::Env, request: &Request) -> bool {
    let call_path = matches!(
        request,
        Request::Webhook { .. }
            | Request::Fence { .. }
            | Request::Claim { .. }
            | Request::MediaVerify { .. }
    );
    if matches!(request, Request::Reclaim) {
        ask(engine, env, true).await;
    } else if call_path || matches!(request, Request::Status) {
        renew(engine, env).await;
    }
    !call_path || engine.shard().lease_usable(now_ms())
}

/// True when a call shard answered a webhook without a forward because a
/// decision found a node's cap reached: a new lease may give the room it
/// lacked, and the parked event is decided again (a claim is not: its
/// second run would spend the node's rate twice; the node retries).
pub fn wants_room(engine: &Engine<DoStore>, request: &Request, served: &Served) -> bool {
    let shard = engine.shard();
    shard.index() != 0
        && matches!(request, Request::Webhook { .. })
        && matches!(served, Served::Reply(_))
        && shard.wants_room()
}

/// A call shard whose lease is due asks `global` for a new one. An ask
/// that fails leaves it with none: its decisions then find no room and
/// park (the carrier retries), and its node requests find no key, until a
/// later ask succeeds. Nothing is decided on a view it does not hold.
pub async fn renew(engine: &Engine<DoStore>, env: &worker::Env) {
    if engine.shard().lease_due(now_ms()) {
        ask(engine, env, false).await;
    }
}

/// Asks `global` for a lease (`reclaimed`: wanting no spare room) and takes
/// the answer.
async fn ask(engine: &Engine<DoStore>, env: &worker::Env, reclaimed: bool) {
    let shard = engine.shard();
    if shard.index() == 0 {
        return;
    }
    let Ok(ask) = shard.lease_ask(reclaimed) else {
        return;
    };
    let request = Request::LeaseAsk { ask };
    if let Ok(Reply::Done(Leased { lease: Some(lease) })) =
        protocol::call::<Leased>(env, &request, b"").await
    {
        // A lease whose map could not be stored is not taken: the shard
        // stays without one, as when the ask fails.
        let _taken = shard.handle_lease(lease);
    }
}

/// In `global`: asks each call shard the directory named as holding room
/// that another shard wants to report, so that the room comes back (SPEC
/// §16, `Directory::poll_reclaim`). A shard that cannot be reached keeps
/// its room until it next asks.
pub async fn reclaim(engine: &Engine<DoStore>, env: &worker::Env) {
    if engine.shard().index() != 0 {
        return;
    }
    while let Some(k) = engine.poll_reclaim() {
        tell(env, k, &Request::Reclaim).await;
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
    let pushes = (1..map.widest()).map(|k| tell(env, k, &request));
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
        if !tell(env, 0, &request).await {
            shard.retry_output(ShardOutput::Mark(mark));
            return;
        }
    }
}

/// Sends `request`, which answers `{}`, to shard `shard`'s object within
/// the protocol's deadline; true when it was done.
async fn tell(env: &worker::Env, shard: u32, request: &Request) -> bool {
    let deadline = protocol::DEADLINE_MS as i64;
    let sent = protocol::call_shard_within::<serde_json::Value>(env, shard, request, b"", deadline);
    matches!(sent.await, Ok(Reply::Done(_)))
}
