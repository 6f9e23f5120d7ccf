//! The Worker ↔ Dispatcher protocol: versioned JSON messages over the
//! Durable Object's `fetch`.
//!
//! # Wire format
//!
//! The Worker sends `POST https://dispatcher/<op>` with the body
//! `{"v":1,"op":"<op>", ...arguments}`. The Dispatcher answers HTTP 200 with
//! one of:
//! - `{"v":1,"ok":true, ...result}`: the operation ran;
//! - `{"v":1,"ok":false,"status":<4xx|5xx>,"error":"<code>", ...}`: a business
//!   refusal (for example 409 `stale_seq`), which the Worker relays with
//!   that status and body (minus `v`, `ok` and `status`).
//!
//! A message it cannot take (unknown op, a version it does not speak,
//! malformed JSON) gets HTTP 400 `{"v":1,"ok":false,"error":...}`.
//!
//! # Versions and tolerance
//!
//! Each side speaks [`VERSION`] and accepts [`VERSION`] ± 1 (see
//! [`accepts`]), and ignores fields it does not know, so a Worker and a
//! Dispatcher one release apart (a rolling deploy, a rollback) keep talking.
//!
//! # Unavailable
//!
//! The Worker treats anything else as the Dispatcher being unavailable
//! (503 `dispatcher_unavailable`, nothing forwarded): the stub throwing, a
//! runtime's plain-text 5xx, a status other than 200, a body that is not
//! such an object, a version it does not accept, or no full answer within
//! [`DEADLINE_MS`]. A Dispatcher that hangs therefore still gets the caller
//! an explicit 503 before Telnyx's own 2 s webhook timeout; whatever the
//! Dispatcher decided meanwhile is safe to leave, because an assignment
//! nobody forwarded is an attempt whose lease lapses and is re-driven.
//!
//! # Operations
//!
//! | op | arguments | result |
//! |---|---|---|
//! | `ping` | none | `{"documents":{"policy":bool,"nodes":bool}}` |
//! | `node_keys` | none | `{"revision":N,"keys":[{"node","kid","public_key"}]}` (revision 0: no registry) |
//! | `webhook` | `body`, `headers` | `{"forward":Forward}` or `{"answer":{..}}` (200) |
//! | `report` | `report` | as `webhook` (a reassigned call's next forward) |
//! | `heartbeat` | `node`, `signed_at_s`, `body` | the heartbeat answer (§6) |
//! | `fence`, `claim`, `media_verify` | `node`, `body` | the §8 / §13 answers |
//! | `probe` | `node`, `kid` | `{"origin_url":..}` or 429 `rate_limited` (`retry_after_s`) |
//! | `get_document` | `kind`, `revision`? | `{"revision":N,"document":{..}}` |
//! | `put_document` | `kind`, `body`, `if_match`?, `writer_fp` | `{"revision":N}` |
//! | `preview` | `body` | the §13 preview |
//! | `status`, `decisions` (`limit`?, `call_session_id`?), `call` (`id`) | | the §13 views |
//!
//! Refusals carry the HTTP status and the contract's error code; the
//! mapping from engine outcomes to them lives in one place,
//! `dispatcher::ops`.

use futures_util::future::{select, Either};
use serde_json::{Map, Value};

/// The protocol version this build speaks.
pub const VERSION: u64 = 1;

/// The Durable Object instance every Worker talks to.
pub const INSTANCE: &str = "global";

/// The `DISPATCHER` binding.
pub const BINDING: &str = "DISPATCHER";

/// How long one call may wait for the Dispatcher's whole answer.
pub const DEADLINE_MS: u64 = 1_500;

/// True for the versions this build accepts: its own and its neighbours.
pub fn accepts(version: u64) -> bool {
    version >= 1 && version.abs_diff(VERSION) <= 1
}

/// One Dispatcher operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Liveness and protocol check; reports which documents exist.
    Ping,
    /// Every key of every registered node, for the Worker's signature cache.
    NodeKeys,
    /// A verified carrier webhook.
    Webhook,
    /// The outcome of a forward.
    Report,
    /// A node's heartbeat (signature verified by the Worker).
    Heartbeat,
    /// A node asks for the answer fence.
    Fence,
    /// A node claims a session it dialled.
    Claim,
    /// A node checks a media token.
    MediaVerify,
    /// Read a document.
    GetDocument,
    /// Write a document (compare-and-set).
    PutDocument,
    /// Routing preview.
    Preview,
    /// The status view.
    Status,
    /// The decision list.
    Decisions,
    /// One call's record.
    Call,
    /// Admit an L5 probe (rate limit) and name the node's origin.
    Probe,
}

impl Op {
    /// Every operation.
    pub const ALL: [Op; 15] = [
        Op::Ping,
        Op::NodeKeys,
        Op::Webhook,
        Op::Report,
        Op::Heartbeat,
        Op::Fence,
        Op::Claim,
        Op::MediaVerify,
        Op::GetDocument,
        Op::PutDocument,
        Op::Preview,
        Op::Status,
        Op::Decisions,
        Op::Call,
        Op::Probe,
    ];

    /// The name on the wire (also the URL path).
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Ping => "ping",
            Op::NodeKeys => "node_keys",
            Op::Webhook => "webhook",
            Op::Report => "report",
            Op::Heartbeat => "heartbeat",
            Op::Fence => "fence",
            Op::Claim => "claim",
            Op::MediaVerify => "media_verify",
            Op::GetDocument => "get_document",
            Op::PutDocument => "put_document",
            Op::Preview => "preview",
            Op::Status => "status",
            Op::Decisions => "decisions",
            Op::Call => "call",
            Op::Probe => "probe",
        }
    }

    /// The operation named `name`, if this build knows it.
    pub fn parse(name: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|op| op.as_str() == name)
    }
}

/// Why a message was not taken (the Dispatcher's side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageError {
    /// Not a JSON object with a numeric `v` and a string `op`.
    Malformed,
    /// A version this build does not accept.
    UnsupportedVersion,
    /// An operation this build does not know, or a URL naming another op.
    UnknownOp,
}

impl MessageError {
    /// Stable code: `bad_message`, `unsupported_version` or `unknown_op`.
    pub fn code(self) -> &'static str {
        match self {
            MessageError::Malformed => "bad_message",
            MessageError::UnsupportedVersion => "unsupported_version",
            MessageError::UnknownOp => "unknown_op",
        }
    }
}

/// The Dispatcher did not give a well-formed answer of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable(pub String);

/// A well-formed answer from the Dispatcher.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// The operation ran; its result fields.
    Done(Map<String, Value>),
    /// A business refusal: the status and the body to relay.
    Refused {
        /// 4xx or 5xx.
        status: u16,
        /// `{"error": code, ...}`.
        body: Map<String, Value>,
    },
}

/// The request body for `op` with `args`.
pub fn encode_request(op: Op, args: Map<String, Value>) -> String {
    let mut message = args;
    message.insert("v".into(), Value::from(VERSION));
    message.insert("op".into(), Value::from(op.as_str()));
    Value::Object(message).to_string()
}

/// Reads a request on the Dispatcher's side: the op (which must agree with
/// the URL's last path segment) and the arguments (everything but `v` and
/// `op`, unknown fields included).
pub fn decode_request(url_op: &str, body: &[u8]) -> Result<(Op, Map<String, Value>), MessageError> {
    let Ok(Value::Object(mut message)) = serde_json::from_slice::<Value>(body) else {
        return Err(MessageError::Malformed);
    };
    let version = message
        .remove("v")
        .and_then(|v| v.as_u64())
        .ok_or(MessageError::Malformed)?;
    let name = match message.remove("op") {
        Some(Value::String(name)) => name,
        _ => return Err(MessageError::Malformed),
    };
    if !accepts(version) {
        return Err(MessageError::UnsupportedVersion);
    }
    let op = Op::parse(&name)
        .filter(|_| name == url_op)
        .ok_or(MessageError::UnknownOp)?;
    Ok((op, message))
}

/// The Dispatcher's answer body for an operation's result.
pub fn encode_done(result: Map<String, Value>) -> String {
    envelope(true, result)
}

/// The Dispatcher's answer body for a business refusal.
pub fn encode_refused(status: u16, code: &str, mut fields: Map<String, Value>) -> String {
    fields.insert("status".into(), Value::from(status));
    fields.insert("error".into(), Value::from(code));
    envelope(false, fields)
}

/// The Dispatcher's answer body (sent with HTTP 400) for a message it cannot take.
pub fn encode_rejected(error: MessageError) -> String {
    let mut fields = Map::new();
    fields.insert("error".into(), Value::from(error.code()));
    envelope(false, fields)
}

fn envelope(ok: bool, mut fields: Map<String, Value>) -> String {
    fields.insert("v".into(), Value::from(VERSION));
    fields.insert("ok".into(), Value::from(ok));
    Value::Object(fields).to_string()
}

/// Reads the Dispatcher's answer on the Worker's side.
pub fn decode_reply(http_status: u16, body: &[u8]) -> Result<Reply, Unavailable> {
    let unavailable = |why: &str| Unavailable(why.to_owned());
    if http_status != 200 {
        return Err(Unavailable(format!("HTTP {http_status}")));
    }
    let Ok(Value::Object(mut reply)) = serde_json::from_slice::<Value>(body) else {
        return Err(unavailable("not a JSON object"));
    };
    match reply.remove("v").and_then(|v| v.as_u64()) {
        Some(version) if accepts(version) => {}
        _ => return Err(unavailable("no version it accepts")),
    }
    match reply.remove("ok") {
        Some(Value::Bool(true)) => Ok(Reply::Done(reply)),
        Some(Value::Bool(false)) => {
            let status = reply
                .remove("status")
                .and_then(|s| s.as_u64())
                .filter(|s| (400..=599).contains(s))
                .ok_or_else(|| unavailable("refusal without a status"))?;
            if !matches!(reply.get("error"), Some(Value::String(_))) {
                return Err(unavailable("refusal without an error code"));
            }
            Ok(Reply::Refused {
                status: status as u16,
                body: reply,
            })
        }
        _ => Err(unavailable("no ok flag")),
    }
}

/// Sends one operation to the Dispatcher and reads its answer. Every failure
/// on the way (no binding, the stub throwing, a malformed answer) is
/// [`Unavailable`].
pub async fn call(
    env: &worker::Env,
    op: Op,
    args: Map<String, Value>,
) -> Result<Reply, Unavailable> {
    let failed = |e: worker::Error| Unavailable(e.to_string());
    let stub = env
        .durable_object(BINDING)
        .and_then(|namespace| namespace.get_by_name(INSTANCE))
        .map_err(failed)?;
    let headers = worker::Headers::new();
    headers
        .set("Content-Type", "application/json")
        .map_err(failed)?;
    let mut init = worker::RequestInit::new();
    init.with_method(worker::Method::Post)
        .with_headers(headers)
        .with_body(Some(encode_request(op, args).into()));
    let request =
        worker::Request::new_with_init(&format!("https://dispatcher/{}", op.as_str()), &init)
            .map_err(failed)?;
    let answer = async move {
        let mut response = stub.fetch_with_request(request).await.map_err(failed)?;
        let body = response.bytes().await.map_err(failed)?;
        decode_reply(response.status_code(), &body)
    };
    let deadline = worker::Delay::from(std::time::Duration::from_millis(DEADLINE_MS));
    match select(Box::pin(answer), Box::pin(deadline)).await {
        Either::Left((reply, _)) => reply,
        Either::Right(_) => Err(Unavailable(format!("no answer within {DEADLINE_MS} ms"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            _ => unreachable!(),
        }
    }

    #[test]
    fn neighbouring_versions_are_accepted() {
        assert!(accepts(1) && accepts(2));
        assert!(!accepts(0) && !accepts(3));
    }

    #[test]
    fn a_request_round_trips_with_unknown_fields_kept() {
        let body = encode_request(Op::NodeKeys, object(json!({"hint": 1})));
        let (op, args) = decode_request("node_keys", body.as_bytes()).unwrap();
        assert_eq!(op, Op::NodeKeys);
        assert_eq!(Value::Object(args), json!({"hint": 1}));
        // A newer neighbour's request with extra fields is taken.
        let (op, _) = decode_request("ping", br#"{"v":2,"op":"ping","future":true}"#).unwrap();
        assert_eq!(op, Op::Ping);
    }

    #[test]
    fn requests_that_cannot_be_taken() {
        let cases: [(&str, &[u8], MessageError); 6] = [
            ("ping", b"not json", MessageError::Malformed),
            ("ping", br#"{"op":"ping"}"#, MessageError::Malformed),
            ("ping", br#"{"v":"1","op":"ping"}"#, MessageError::Malformed),
            (
                "ping",
                br#"{"v":3,"op":"ping"}"#,
                MessageError::UnsupportedVersion,
            ),
            ("fly", br#"{"v":1,"op":"fly"}"#, MessageError::UnknownOp),
            (
                "node_keys",
                br#"{"v":1,"op":"ping"}"#,
                MessageError::UnknownOp,
            ),
        ];
        for (url_op, body, error) in cases {
            assert_eq!(decode_request(url_op, body).unwrap_err(), error);
        }
    }

    #[test]
    fn replies_round_trip() {
        let done = encode_done(object(json!({"documents": {"policy": false}})));
        assert_eq!(
            decode_reply(200, done.as_bytes()).unwrap(),
            Reply::Done(object(json!({"documents": {"policy": false}})))
        );
        let refused = encode_refused(409, "stale_seq", object(json!({"last_seq": 5})));
        assert_eq!(
            decode_reply(200, refused.as_bytes()).unwrap(),
            Reply::Refused {
                status: 409,
                body: object(json!({"error": "stale_seq", "last_seq": 5}))
            }
        );
    }

    #[test]
    fn anything_not_well_formed_is_unavailable() {
        let cases: [(u16, &[u8]); 8] = [
            (500, br#"{"v":1,"ok":true}"#),
            (200, b"Internal Server Error"),
            (200, b"[]"),
            (200, br#"{"ok":true}"#),
            (200, br#"{"v":7,"ok":true}"#),
            (200, br#"{"v":1}"#),
            (200, br#"{"v":1,"ok":false,"error":"x"}"#),
            (200, br#"{"v":1,"ok":false,"status":200,"error":"x"}"#),
        ];
        for (status, body) in cases {
            assert!(
                decode_reply(status, body).is_err(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        let rejected = encode_rejected(MessageError::UnknownOp);
        assert!(decode_reply(400, rejected.as_bytes()).is_err());
    }
}
