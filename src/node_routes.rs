//! Node-signed routes after the signature check: heartbeat, fence, claims
//! and media checks go to the Dispatcher with their body as the payload
//! (SPEC §6, §8); the L5 probe is [`crate::probe`]'s.

use crate::protocol::{self, Request};
use crate::reply::{relay, Answer, ApiError};
use crate::routes::Route;
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
    let (node, kid) = (node.to_owned(), kid.to_owned());
    let request = match route {
        Route::Heartbeat => Request::Heartbeat {
            node,
            kid,
            signed_at_s,
        },
        Route::Fence => Request::Fence { node, kid },
        Route::Claims => Request::Claim { node, kid },
        Route::MediaVerify => Request::MediaVerify { node, kid },
        Route::Probe => return crate::probe::handle(env, &node, &kid, &body).await,
        _ => return Err(ApiError::not_found()),
    };
    relay(protocol::call(env, &request, &body).await)
}
