//! Bearer-token routes: the documents (with revisions and ETags), the
//! routing preview, the read-only views (SPEC §4, §9, §13) and their paged
//! reads (`/v1/calls`, `/v1/events`).

use crate::auth::Caller;
use crate::clock::now_ms;
use crate::placing;
use crate::protocol::{self, DocumentRead, Reply, Request as ProtocolRequest, Written};
use crate::reply::{relay, Answer, ApiError};
use crate::routes::{valid_call_id, Route};
use crate::span;
use callfence_core::document::DocKind;
use callfence_core::refusal::Refusal;
use callfence_core::spanning::Paged;
use serde_json::json;
use worker::{Env, Request};

fn query(req: &Request, name: &str) -> Option<String> {
    crate::request_url::query_param(&req.inner().url(), name)
}

/// A non-negative integer query parameter; anything else is 400.
fn number(req: &Request, name: &str) -> Result<Option<u64>, ApiError> {
    match query(req, name) {
        None => Ok(None),
        Some(text) => text
            .parse::<u64>()
            .map(Some)
            .map_err(|_| bad_parameter(name)),
    }
}

/// A list's `limit` (the engine clamps it to the route's range).
fn limit(req: &Request) -> Result<Option<u32>, ApiError> {
    Ok(number(req, "limit")?.map(|l| l.min(u64::from(u32::MAX)) as u32))
}

fn bad_parameter(name: &str) -> ApiError {
    ApiError(Refusal::BadParameter(name.to_owned()))
}

fn etag(revision: u64) -> String {
    format!("\"{revision}\"")
}

/// Serves a bearer route other than `/v1/health`.
pub async fn handle(
    env: &Env,
    req: &Request,
    route: &Route,
    caller: &Caller,
    body: Vec<u8>,
) -> Result<Answer, ApiError> {
    let request = match route {
        Route::GetPolicy | Route::GetNodes | Route::GetShards => {
            let request = ProtocolRequest::GetDocument {
                kind: kind(route),
                revision: number(req, "revision")?,
            };
            return match protocol::call::<DocumentRead>(env, &request, b"").await {
                Ok(Reply::Done(read)) => {
                    Ok(Answer::ok(read.document).header("ETag", etag(read.revision)))
                }
                Ok(Reply::Refused(refused)) => Ok(Answer::refused(refused)),
                Err(_) => Err(ApiError::dispatcher_unavailable()),
            };
        }
        Route::PutPolicy | Route::PutNodes | Route::PutShards => {
            let request = ProtocolRequest::PutDocument {
                kind: kind(route),
                if_match: req.headers().get("If-Match").ok().flatten(),
                writer_fp: caller.fingerprint.clone(),
            };
            return match protocol::call::<Written>(env, &request, &body).await {
                Ok(Reply::Done(written)) => Ok(Answer::ok(json!({"revision": written.revision}))
                    .header("ETag", etag(written.revision))),
                Ok(Reply::Refused(refused)) => Ok(Answer::refused(refused)),
                Err(_) => Err(ApiError::dispatcher_unavailable()),
            };
        }
        Route::Preview => ProtocolRequest::Preview,
        Route::Status => return span::status(env).await,
        Route::Decisions => {
            let (limit, after) = (limit(req)?, number(req, "after")?);
            let call_session_id = query(req, "call_session_id").filter(|id| id.len() <= 256);
            return span::decisions(env, limit, call_session_id, after).await;
        }
        Route::Call(id) => ProtocolRequest::Call {
            id: id.clone(),
            map: None,
            absent: None,
        },
        Route::Calls => {
            let request = ProtocolRequest::Calls {
                limit: limit(req)?,
                after: match query(req, "after") {
                    Some(id) if !valid_call_id(&id) => return Err(bad_parameter("after")),
                    after => after,
                },
            };
            return span::pages(env, request, Paged::Calls).await;
        }
        Route::Events => {
            let request = ProtocolRequest::Events {
                limit: limit(req)?,
                after: number(req, "after")?,
            };
            return span::pages(env, request, Paged::Events).await;
        }
        _ => return Err(ApiError::not_found()),
    };
    if let ProtocolRequest::Call { id, .. } = &request {
        // One call's record is read at the shard that holds it (SPEC §16).
        let (id, answer_by) = (id.clone(), now_ms() + protocol::DEADLINE_MS as i64);
        return relay(
            placing::to_holder(env, &id, request, &body, answer_by, placing::redirect_in).await,
        );
    }
    relay(protocol::call(env, &request, &body).await)
}

fn kind(route: &Route) -> DocKind {
    match route {
        Route::GetNodes | Route::PutNodes => DocKind::Nodes,
        Route::GetShards | Route::PutShards => DocKind::Shards,
        _ => DocKind::Policy,
    }
}
