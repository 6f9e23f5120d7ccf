//! Node-signed routes after the signature check: heartbeat, fence, claims
//! and media checks go to the Dispatcher as they are (SPEC §6, §8); the L5
//! probe is [`crate::probe`]'s.

use crate::protocol::{self, Op};
use crate::reply::{relay, Answer, ApiError};
use crate::routes::Route;
use serde_json::{Map, Value};
use worker::Env;

/// Relays a verified node request. `kid` is its `Callfence-Key-Id` (the
/// Dispatcher re-checks it against the current registry) and `signed_at_s`
/// its `Callfence-Timestamp` (already checked for skew).
pub async fn handle(
    env: &Env,
    route: &Route,
    node: &str,
    kid: &str,
    signed_at_s: i64,
    body: Vec<u8>,
) -> Result<Answer, ApiError> {
    let op = match route {
        Route::Heartbeat => Op::Heartbeat,
        Route::Fence => Op::Fence,
        Route::Claims => Op::Claim,
        Route::MediaVerify => Op::MediaVerify,
        Route::Probe => return crate::probe::handle(env, node, kid, &body).await,
        _ => return Err(ApiError::not_found()),
    };
    let text = String::from_utf8(body).map_err(|_| ApiError::new(400, "bad_request"))?;
    let mut args = Map::new();
    args.insert("node".into(), Value::from(node));
    args.insert("kid".into(), Value::from(kid));
    args.insert("signed_at_s".into(), Value::from(signed_at_s));
    args.insert("body".into(), Value::String(text));
    relay(protocol::call(env, op, args).await)
}
