//! `callfence-fake-telnyx`: the one stand-in for the Telnyx Call Control API,
//! on loopback, used by `make dev` (`scripts/dev.mjs`), the end-to-end
//! cluster (`tests/e2e/agents-cluster.mjs`) and the agent's integration tests
//! (`agent/tests/common`), so all three see the same behaviour.
//!
//! - `POST /v2/calls/{call_control_id}/actions/{action}`: 200
//!   `{"data":{"result":"ok"}}`.
//! - `POST /v2/calls` (a dial): 200 `{"data":{"call_control_id",
//!   "call_session_id","call_leg_id","record_type":"call","is_alive":false}}`
//!   with ids fresh for this process.
//! - With `--api-key-file`, a request without `Authorization: Bearer <key>` is
//!   401 (Telnyx's error `10009`); a body that is not JSON is 400 (`10015`);
//!   any other route is 404 (`10005`).
//! - `--caller LABEL=FILE` (repeatable) accepts the key in FILE as well and
//!   records which caller sent each request by its LABEL (a node id), so a
//!   drill can tell which node answered; the key is never recorded.
//! - `GET /__record[?call_control_id=&action=&command_id=]`: every request
//!   above, oldest first, as `{"commands":[{"seq","at","method","path",
//!   "call_control_id","action","command_id","status","authorized","caller",
//!   "body"}]}` (`action` is `dial` for `POST /v2/calls`). The last 10,000
//!   are kept.
//!
//! Its first line on stdout is `listening http://ADDR` (`--listen
//! 127.0.0.1:0` picks a free port); then each request is one JSON line (its
//! record). The API key itself is never printed or recorded.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use clap::Parser;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Records kept at most (the oldest beyond are dropped).
const MAX_RECORDS: usize = 10_000;
/// Largest request body read.
const MAX_BODY_BYTES: usize = 64 * 1024;

/// A fake Telnyx Call Control API that records every command.
#[derive(Debug, Parser)]
#[command(name = "callfence-fake-telnyx", version, about)]
struct Args {
    /// Loopback address to listen on (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// A file holding the API key every request must carry as a bearer
    /// token; without it, any request is accepted.
    #[arg(long)]
    api_key_file: Option<std::path::PathBuf>,
    /// `LABEL=FILE`: another accepted key, whose requests are recorded with
    /// `caller: LABEL` (repeatable).
    #[arg(long)]
    caller: Vec<String>,
}

/// One request as recorded.
#[derive(Debug, Clone, Serialize)]
struct Record {
    seq: u64,
    at: String,
    method: String,
    path: String,
    call_control_id: Option<String>,
    action: Option<String>,
    command_id: Option<String>,
    status: u16,
    authorized: bool,
    /// The label of the `--caller` key the request carried.
    caller: Option<String>,
    body: Value,
}

#[derive(Default)]
struct Log {
    next_seq: u64,
    records: Vec<Record>,
}

struct Fake {
    api_key: Option<String>,
    /// (label, key) of every `--caller`.
    callers: Vec<(String, String)>,
    /// Distinguishes this process's dial ids from any earlier run's.
    run: String,
    log: Mutex<Log>,
}

/// Filters of `GET /__record`.
#[derive(Debug, Deserialize)]
struct Filter {
    call_control_id: Option<String>,
    action: Option<String>,
    command_id: Option<String>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), String> {
    let args = Args::parse();
    if !args.listen.ip().is_loopback() {
        return Err("--listen must be a loopback address".into());
    }
    let api_key = match &args.api_key_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| format!("{}: {e}", path.display()))?
                .trim()
                .to_string(),
        ),
        None => None,
    };
    let mut callers = Vec::new();
    for spec in &args.caller {
        let (label, path) = spec
            .split_once('=')
            .ok_or_else(|| format!("--caller {spec}: expected LABEL=FILE"))?;
        let key = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
        callers.push((label.to_string(), key.trim().to_string()));
    }
    let mut nonce = [0u8; 6];
    getrandom::fill(&mut nonce).map_err(|e| e.to_string())?;
    let fake = Arc::new(Fake {
        api_key,
        callers,
        run: callfence_core::encoding::hex(&nonce),
        log: Mutex::new(Log::default()),
    });
    let router = Router::new()
        .route("/__record", get(record))
        .fallback(command)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(fake);
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("{}: {e}", args.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    println!("listening http://{addr}");
    axum::serve(listener, router)
        .await
        .map_err(|e| e.to_string())
}

async fn record(State(fake): State<Arc<Fake>>, Query(filter): Query<Filter>) -> Json<Value> {
    let log = fake.log.lock().unwrap_or_else(|p| p.into_inner());
    let matches = |want: &Option<String>, have: &Option<String>| {
        want.as_ref().is_none_or(|w| have.as_ref() == Some(w))
    };
    let commands: Vec<&Record> = log
        .records
        .iter()
        .filter(|r| {
            matches(&filter.call_control_id, &r.call_control_id)
                && matches(&filter.action, &r.action)
                && matches(&filter.command_id, &r.command_id)
        })
        .collect();
    Json(json!({ "commands": commands }))
}

fn telnyx_error(status: StatusCode, code: &str, title: &str) -> (StatusCode, Value) {
    (status, json!({"errors": [{"code": code, "title": title}]}))
}

/// `(call_control_id, action)` of `/v2/calls/{id}/actions/{action}`.
fn call_action(path: &str) -> Option<(String, String)> {
    let rest = path.strip_prefix("/v2/calls/")?;
    let (id, action) = rest.split_once("/actions/")?;
    let plain = |s: &str| !s.is_empty() && !s.contains('/');
    (plain(id) && plain(action) && action.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
        .then(|| (percent_decode(id), action.to_string()))
}

/// Decodes `%XX` escapes (call control ids carry `:` as `%3A`).
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn command(
    State(fake): State<Arc<Fake>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let caller = fake
        .callers
        .iter()
        .find(|(_, key)| Some(key.as_str()) == bearer)
        .map(|(label, _)| label.clone());
    let authorized = caller.is_some()
        || match &fake.api_key {
            None => fake.callers.is_empty(),
            Some(key) => bearer == Some(key.as_str()),
        };
    let parsed: Option<Value> = if body.is_empty() {
        Some(json!({}))
    } else {
        serde_json::from_slice(&body).ok()
    };
    let route = call_action(&path);
    let is_dial = path == "/v2/calls";
    let (call_control_id, action) = match &route {
        Some((id, action)) => (Some(id.clone()), Some(action.clone())),
        None if is_dial => (None, Some("dial".to_string())),
        None => (None, None),
    };
    let mut log = fake.log.lock().unwrap_or_else(|p| p.into_inner());
    log.next_seq += 1;
    let seq = log.next_seq;
    let (status, answer) = if !authorized {
        telnyx_error(StatusCode::UNAUTHORIZED, "10009", "Authentication failed")
    } else if parsed.is_none() {
        telnyx_error(StatusCode::BAD_REQUEST, "10015", "Invalid JSON")
    } else if method == Method::POST && route.is_some() {
        (StatusCode::OK, json!({"data": {"result": "ok"}}))
    } else if method == Method::POST && is_dial {
        let data = json!({
            "call_control_id": format!("v3:fake-{}-{seq}", fake.run),
            "call_session_id": format!("fake-session-{}-{seq}", fake.run),
            "call_leg_id": format!("fake-leg-{}-{seq}", fake.run),
            "record_type": "call",
            "is_alive": false,
        });
        (StatusCode::OK, json!({ "data": data }))
    } else {
        telnyx_error(StatusCode::NOT_FOUND, "10005", "Resource not found")
    };
    let body = parsed.unwrap_or(Value::Null);
    let entry = Record {
        seq,
        at: callfence_core::time::format_ms(callfence_agent::clock::now_ms()),
        method: method.to_string(),
        path,
        call_control_id,
        action,
        command_id: body
            .get("command_id")
            .and_then(Value::as_str)
            .map(str::to_string),
        status: status.as_u16(),
        authorized,
        caller,
        body,
    };
    println!("{}", serde_json::to_string(&entry).unwrap_or_default());
    log.records.push(entry);
    if log.records.len() > MAX_RECORDS {
        log.records.remove(0);
    }
    (status, Json(answer)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_actions_are_recognised_and_decoded() {
        assert_eq!(
            call_action("/v2/calls/v3%3Aabc/actions/answer"),
            Some(("v3:abc".to_string(), "answer".to_string()))
        );
        assert_eq!(
            call_action("/v2/calls/x/actions/speak_text"),
            Some(("x".to_string(), "speak_text".to_string()))
        );
        assert_eq!(call_action("/v2/calls"), None);
        assert_eq!(call_action("/v2/calls//actions/answer"), None);
        assert_eq!(call_action("/v2/calls/a/b/actions/answer"), None);
        assert_eq!(call_action("/v2/calls/a/actions/Answer"), None);
    }

    #[test]
    fn percent_decoding_keeps_what_is_not_an_escape() {
        assert_eq!(percent_decode("v3%3Aabc"), "v3:abc");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz%41"), "%zzA");
    }
}
