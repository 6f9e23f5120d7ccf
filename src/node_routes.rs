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
use callfence_core::wire::{ClaimRequest, FenceRequest, MediaVerifyRequest};
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
    let Some(session) = session_of(env, &request, &body) else {
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

/// The session a fence, a claim or a media check is about, when its body
/// says (a media token's claims are read only under a valid signature);
/// the holder answers it (SPEC §16). Anything else goes to `global`, which
/// refuses what it cannot read.
fn session_of(env: &Env, request: &Request, body: &[u8]) -> Option<String> {
    match request {
        Request::Fence { .. } => FenceRequest::parse(body).ok().map(|r| r.call_session_id),
        Request::Claim { .. } => ClaimRequest::parse(body).ok().map(|r| r.call_session_id),
        Request::MediaVerify { .. } => {
            let config = Config::get(env);
            let media = &config.node_routes.as_ref().ok()?.media;
            let token = MediaVerifyRequest::parse(body).ok()?.media_token;
            let claims = callfence_core::media::verify(media, &token, now_ms()).ok()?;
            Some(claims.call_session_id)
        }
        _ => None,
    }
}
