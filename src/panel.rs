//! Bearer-token routes: the documents (with revisions and ETags), the
//! routing preview and the read-only views (SPEC §4, §9, §13).

use crate::auth::Caller;
use crate::protocol::{self, Op, Reply};
use crate::reply::{relay, Answer, ApiError};
use crate::routes::Route;
use serde_json::{Map, Value};
use worker::{Env, Request};

fn query(req: &Request, name: &str) -> Option<String> {
    req.url()
        .ok()?
        .query_pairs()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

/// A non-negative integer query parameter; anything else is 400.
fn number(req: &Request, name: &str) -> Result<Option<u64>, ApiError> {
    match query(req, name) {
        None => Ok(None),
        Some(text) => text
            .parse::<u64>()
            .map(Some)
            .map_err(|_| ApiError::new(400, "bad_request").with("parameter", name)),
    }
}

fn etag(revision: &Value) -> String {
    format!("\"{}\"", revision.as_u64().unwrap_or(0))
}

/// Serves a bearer route other than `/v1/health`.
pub async fn handle(
    env: &Env,
    req: &Request,
    route: &Route,
    caller: &Caller,
    body: Vec<u8>,
) -> Result<Answer, ApiError> {
    let mut args = Map::new();
    let text = || String::from_utf8(body.clone()).map_err(|_| ApiError::new(400, "bad_request"));
    let op = match route {
        Route::GetPolicy | Route::GetNodes => {
            args.insert("kind".into(), kind(route).into());
            if let Some(revision) = number(req, "revision")? {
                args.insert("revision".into(), revision.into());
            }
            Op::GetDocument
        }
        Route::PutPolicy | Route::PutNodes => {
            args.insert("kind".into(), kind(route).into());
            args.insert("body".into(), text()?.into());
            args.insert("writer_fp".into(), caller.fingerprint.clone().into());
            if let Some(if_match) = req.headers().get("If-Match").ok().flatten() {
                args.insert("if_match".into(), if_match.into());
            }
            Op::PutDocument
        }
        Route::Preview => {
            args.insert("body".into(), text()?.into());
            Op::Preview
        }
        Route::Status => Op::Status,
        Route::Decisions => {
            if let Some(limit) = number(req, "limit")? {
                args.insert("limit".into(), limit.into());
            }
            if let Some(id) = query(req, "call_session_id").filter(|id| id.len() <= 256) {
                args.insert("call_session_id".into(), id.into());
            }
            Op::Decisions
        }
        Route::Call(id) => {
            args.insert("id".into(), id.clone().into());
            Op::Call
        }
        _ => return Err(ApiError::not_found()),
    };
    let reply = protocol::call(env, op, args).await;
    match (op, reply) {
        (Op::GetDocument, Ok(Reply::Done(mut result))) => {
            let tag = etag(result.get("revision").unwrap_or(&Value::Null));
            Ok(Answer::ok(result.remove("document").unwrap_or(Value::Null)).header("ETag", tag))
        }
        (Op::PutDocument, Ok(Reply::Done(result))) => {
            let tag = etag(result.get("revision").unwrap_or(&Value::Null));
            Ok(Answer::ok(Value::Object(result)).header("ETag", tag))
        }
        (_, reply) => relay(reply),
    }
}

fn kind(route: &Route) -> &'static str {
    match route {
        Route::GetNodes | Route::PutNodes => "nodes",
        _ => "policy",
    }
}
