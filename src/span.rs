//! Reads that span call shards (SPEC §16): `GET /v1/status`,
//! `GET /v1/decisions`, `GET /v1/calls` and `GET /v1/events` ask every
//! shard that may still hold a session (0 to
//! the widest map within the retention, which `global` names), all at
//! once, and core's [`callfence_core::spanning`] merges what came back. A
//! shard that does not answer is named in `shards_unreachable`; the read
//! still answers 200 with the rest. It reaches at most N + 1 objects: the
//! map from `global`, then each shard once.
//!
//! A paged decision read (`after`) is merged ascending by `decision_id`,
//! which is unique across shards (each shard's ids carry its number).

use crate::protocol::{self, strip_envelope, MapInForce, Reply, Request, View, DEADLINE_MS};
use crate::reply::{Answer, ApiError};
use callfence_core::engine::MapNotice;
use callfence_core::shard::{DEFAULT_LIMIT, MAX_LIMIT, MAX_PAGE};
use callfence_core::spanning::{
    merge_decisions, merge_pages, merge_status, DecisionRead, Paged, ShardRead,
};
use futures_util::future::join_all;
use serde_json::Value;
use worker::Env;

/// `GET /v1/status`, summed over the shards.
pub async fn status(env: &Env) -> Result<Answer, ApiError> {
    let reads = read_all(env, &Request::Status).await;
    merge_status(&reads)
        .map(Answer::ok)
        .ok_or_else(ApiError::dispatcher_unavailable)
}

/// `GET /v1/decisions`: every shard's newest merged newest first, or with
/// `after` every shard's next page merged ascending, at most `limit`.
pub async fn decisions(
    env: &Env,
    limit: Option<u32>,
    call_session_id: Option<String>,
    after: Option<u64>,
) -> Result<Answer, ApiError> {
    let read = match after {
        Some(_) => DecisionRead::After,
        None => DecisionRead::NewestFirst,
    };
    let request = Request::Decisions {
        limit,
        call_session_id,
        after,
    };
    let reads = read_all(env, &request).await;
    if reads.iter().all(|r| r.answer.is_none()) {
        return Err(ApiError::dispatcher_unavailable());
    }
    let limit = limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT) as usize;
    Ok(Answer::ok(merge_decisions(&reads, limit, read)))
}

/// `GET /v1/calls` and `GET /v1/events` (`request`, of the `paged` kind):
/// every shard's next page after the cursor, merged ascending, at most
/// `limit`.
pub async fn pages(env: &Env, request: Request, paged: Paged) -> Result<Answer, ApiError> {
    let limit = match &request {
        Request::Calls { limit, .. } | Request::Events { limit, .. } => *limit,
        _ => None,
    };
    let reads = read_all(env, &request).await;
    if reads.iter().all(|r| r.answer.is_none()) {
        return Err(ApiError::dispatcher_unavailable());
    }
    let limit = limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_PAGE) as usize;
    Ok(Answer::ok(merge_pages(&reads, paged, limit)))
}

/// How many shards a read that spans them asks: every one the map may have
/// placed a session on (`0..widest`). A `global` that names no map (one
/// release behind, or unreachable) is read alone, as before call shards.
pub async fn shards(env: &Env) -> u32 {
    match protocol::call::<MapInForce>(env, &Request::Map, b"").await {
        Ok(Reply::Done(MapInForce { map })) => map.widest(),
        _ => MapNotice::default().widest(),
    }
}

/// Asks `request` of every shard [`shards`] names.
async fn read_all(env: &Env, request: &Request) -> Vec<ShardRead> {
    let asks = (0..shards(env).await).map(|shard| async move {
        let deadline = DEADLINE_MS as i64;
        let answer = protocol::call_shard_within::<View>(env, shard, request, b"", deadline).await;
        ShardRead {
            shard,
            answer: match answer {
                Ok(Reply::Done(view)) => Some(Value::Object(strip_envelope(view))),
                _ => None,
            },
        }
    });
    join_all(asks).await
}
