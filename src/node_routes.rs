//! Node-signed routes after the signature check: heartbeat, fence, claims
//! and media checks go to the Dispatcher with their body as the payload
//! (SPEC §6, §8): a heartbeat to `global`, the others to the call shard
//! that holds their session ([`placing`]); the L5 probe is
//! [`crate::probe`]'s.

use crate::clock::now_ms;
use crate::config::Config;
use crate::placing;
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
    let (map, absent) = (None, None);
    let request = match route {
        Route::Heartbeat => Request::Heartbeat {
            node,
            kid,
            signed_at_s,
        },
        Route::Fence => Request::Fence {
            node,
            kid,
            map,
            absent,
        },
        Route::Claims => Request::Claim {
            node,
            kid,
            map,
            absent,
        },
        Route::MediaVerify => Request::MediaVerify {
            node,
            kid,
            map,
            absent,
        },
        Route::Probe => return crate::probe::handle(env, &node, &kid, &body).await,
        _ => return Err(ApiError::not_found()),
    };
    let config = Config::get(env);
    let media = config.node_routes.as_ref().ok().map(|n| &n.media);
    let Some(session) = request.session(&body, media, now_ms()) else {
        return relay(protocol::call(env, &request, &body).await);
    };
    let answer_by = now_ms() + protocol::DEADLINE_MS as i64;
    relay(
        placing::to_holder(
            env,
            &session,
            request,
            &body,
            answer_by,
            placing::redirect_in,
        )
        .await,
    )
}
