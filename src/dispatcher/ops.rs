//! The operations the Dispatcher serves: protocol arguments in, an engine
//! call, a protocol answer out. This is the one place where engine outcomes
//! become HTTP statuses and the contract's error codes.

use crate::protocol::{self, Op};
use callfence_core::document::DocKind;
use callfence_core::engine::{
    BadRequest, ClaimReply, ClaimRequest, DocError, Engine, EngineError, FenceReply, FenceRequest,
    HeartbeatRefusal, Ingress, MediaReply, MediaVerifyRequest, PreviewRequest, ProbeAdmission,
    Report, ReportEffect,
};
use callfence_core::media::MediaKeys;
use callfence_core::store::Store;
use callfence_core::telnyx::parse_envelope;
use serde::Serialize;
use serde_json::{json, Map, Value as Json};

/// A protocol answer, before encoding.
type Answer = Result<Map<String, Json>, (u16, &'static str, Map<String, Json>)>;

/// Runs `op` and returns the encoded answer. An engine failure is an error
/// (the Durable Object then throws, and the Worker answers unavailable).
pub fn serve<S: Store>(
    engine: &Engine<S>,
    media: Option<&MediaKeys>,
    op: Op,
    args: Map<String, Json>,
    now_ms: i64,
) -> Result<String, EngineError> {
    if matches!(
        op,
        Op::Heartbeat | Op::Fence | Op::Claim | Op::MediaVerify | Op::Probe
    ) && !key_in_force(engine, &args)?
    {
        // The Worker's key cache may lag a registry change by a few
        // seconds: a key removed since is refused here.
        return Ok(protocol::encode_refused(
            401,
            "unknown_node_key",
            Map::new(),
        ));
    }
    let answer = match op {
        Op::Ping => ping(engine),
        Op::NodeKeys => node_keys(engine),
        Op::Webhook => webhook(engine, &args, now_ms),
        Op::Report => report(engine, &args, now_ms),
        Op::Heartbeat => heartbeat(engine, &args, now_ms),
        Op::Fence => fence(engine, media, &args, now_ms),
        Op::Claim => claim(engine, &args, now_ms),
        Op::MediaVerify => media_verify(engine, media, &args, now_ms),
        Op::GetDocument => get_document(engine, &args),
        Op::PutDocument => put_document(engine, &args, now_ms),
        Op::Preview => preview(engine, &args, now_ms),
        Op::Status => engine.status(now_ms).map(|s| Ok(object(s))),
        Op::Decisions => {
            let limit = args
                .get("limit")
                .and_then(Json::as_u64)
                .map(|l| l.min(u64::from(u32::MAX)) as u32);
            let session = args.get("call_session_id").and_then(Json::as_str);
            engine.decisions(limit, session).map(|d| Ok(object(d)))
        }
        Op::Probe => probe(engine, &args, now_ms),
        Op::Call => {
            let id = text(&args, "id");
            engine
                .call(id)
                .map(|c| c.map(object).ok_or((404, "unknown_call", Map::new())))
        }
    }?;
    Ok(match answer {
        Ok(result) => protocol::encode_done(result),
        Err((status, code, fields)) => protocol::encode_refused(status, code, fields),
    })
}

fn probe<S: Store>(
    engine: &Engine<S>,
    args: &Map<String, Json>,
    now_ms: i64,
) -> Result<Answer, EngineError> {
    Ok(match engine.handle_probe(text(args, "node"), now_ms)? {
        ProbeAdmission::Send { origin_url } => Ok(object(json!({ "origin_url": origin_url }))),
        ProbeAdmission::RateLimited { retry_after_s } => Err(refused_with(
            429,
            "rate_limited",
            json!({ "retry_after_s": retry_after_s }),
        )),
        ProbeAdmission::UnknownNode => Err(refused(401, "unknown_node_key")),
    })
}

fn object(value: Json) -> Map<String, Json> {
    match value {
        Json::Object(map) => map,
        other => {
            let mut map = Map::new();
            map.insert("value".into(), other);
            map
        }
    }
}

fn to_object(value: &impl Serialize) -> Map<String, Json> {
    object(serde_json::to_value(value).unwrap_or(Json::Null))
}

fn text<'a>(args: &'a Map<String, Json>, key: &str) -> &'a str {
    args.get(key).and_then(Json::as_str).unwrap_or_default()
}

fn refused(status: u16, code: &'static str) -> (u16, &'static str, Map<String, Json>) {
    (status, code, Map::new())
}

fn refused_with(
    status: u16,
    code: &'static str,
    fields: Json,
) -> (u16, &'static str, Map<String, Json>) {
    (status, code, object(fields))
}

/// True when the request's node and key id are in the current registry.
fn key_in_force<S: Store>(
    engine: &Engine<S>,
    args: &Map<String, Json>,
) -> Result<bool, EngineError> {
    Ok(engine
        .registry()?
        .and_then(|(_, registry)| {
            registry
                .nodes
                .get(text(args, "node"))
                .map(|e| e.keys.contains_key(text(args, "kid")))
        })
        .unwrap_or(false))
}

/// The media keys, or 503 `misconfigured` for `node_routes`.
fn media_keys(
    media: Option<&MediaKeys>,
) -> Result<&MediaKeys, (u16, &'static str, Map<String, Json>)> {
    media.ok_or_else(|| refused_with(503, "misconfigured", json!({"capability": "node_routes"})))
}

/// The request body parsed by `parse`, or 400 `bad_request` with the detail.
fn parse_body<T>(
    args: &Map<String, Json>,
    parse: fn(&[u8]) -> Result<T, BadRequest>,
) -> Result<T, (u16, &'static str, Map<String, Json>)> {
    parse(text(args, "body").as_bytes())
        .map_err(|bad| refused_with(400, "bad_request", json!({"detail": bad.0})))
}

fn ping<S: Store>(engine: &Engine<S>) -> Result<Answer, EngineError> {
    let policy = engine.policy()?.is_some();
    let nodes = engine.registry()?.is_some();
    Ok(Ok(object(
        json!({"documents": {"policy": policy, "nodes": nodes}}),
    )))
}

fn node_keys<S: Store>(engine: &Engine<S>) -> Result<Answer, EngineError> {
    let (revision, keys) = engine.node_keys()?;
    Ok(Ok(object(json!({"revision": revision, "keys": keys}))))
}

/// A webhook's or a report's way forward: a forward to make, a 200
/// answer, or a refusal.
fn ingress_answer(ingress: Ingress, event_id: &str) -> Answer {
    match ingress {
        Ingress::Forward(f) => Ok(object(json!({"forward": f}))),
        Ingress::Delivered(d) => Ok(object(json!({"answer": d}))),
        Ingress::Ignored => Ok(object(
            json!({"answer": {"ignored": true, "event_id": event_id}}),
        )),
        Ingress::Unroutable => Ok(object(
            json!({"answer": {"unroutable": true, "event_id": event_id}}),
        )),
        Ingress::InProgress => Err(refused(503, "in_progress")),
        Ingress::Pending(reason) => Err(refused(503, reason.code())),
        Ingress::Rejected => Err(refused(503, "no_eligible_node")),
    }
}

fn webhook<S: Store>(
    engine: &Engine<S>,
    args: &Map<String, Json>,
    now_ms: i64,
) -> Result<Answer, EngineError> {
    let body = text(args, "body");
    let Ok(envelope) = parse_envelope(body.as_bytes()) else {
        return Ok(Err(refused(400, "bad_envelope")));
    };
    let headers: Vec<(String, String)> = args
        .get("headers")
        .cloned()
        .and_then(|h| serde_json::from_value(h).ok())
        .unwrap_or_default();
    let ingress = engine.handle_webhook(&envelope, body, &headers, now_ms)?;
    Ok(ingress_answer(ingress, &envelope.event_id))
}

fn report<S: Store>(
    engine: &Engine<S>,
    args: &Map<String, Json>,
    now_ms: i64,
) -> Result<Answer, EngineError> {
    let Some(report) = args
        .get("report")
        .cloned()
        .and_then(|r| serde_json::from_value::<Report>(r).ok())
    else {
        return Ok(Err(refused(400, "bad_message")));
    };
    Ok(match engine.handle_report(&report, now_ms)? {
        ReportEffect::Delivered(d) => Ok(object(json!({"answer": d}))),
        ReportEffect::Reassigned(Some(f)) => Ok(object(json!({"forward": f}))),
        ReportEffect::Reassigned(None) => Err(refused(503, "reassigned")),
        ReportEffect::Unknown => Err(refused(503, "delivery_unknown")),
        ReportEffect::Parked(reason) => Err(refused(503, reason.code())),
    })
}

fn heartbeat<S: Store>(
    engine: &Engine<S>,
    args: &Map<String, Json>,
    now_ms: i64,
) -> Result<Answer, EngineError> {
    let signed_at_s = args.get("signed_at_s").and_then(Json::as_i64).unwrap_or(0);
    match engine.handle_heartbeat(
        text(args, "node"),
        signed_at_s,
        text(args, "body").as_bytes(),
        now_ms,
    ) {
        Ok(answer) => Ok(Ok(object(answer))),
        Err(HeartbeatRefusal::Engine(e)) => Err(e),
        Err(HeartbeatRefusal::Invalid(detail)) => Ok(Err(refused_with(
            400,
            "invalid_heartbeat",
            json!({"detail": detail}),
        ))),
        Err(refusal) => Ok(Err(refused(
            if refusal.code() == "stale_seq" {
                409
            } else {
                401
            },
            refusal.code(),
        ))),
    }
}

fn fence<S: Store>(
    engine: &Engine<S>,
    media: Option<&MediaKeys>,
    args: &Map<String, Json>,
    now_ms: i64,
) -> Result<Answer, EngineError> {
    let (media, req) = match (media_keys(media), parse_body(args, FenceRequest::parse)) {
        (Err(refusal), _) | (_, Err(refusal)) => return Ok(Err(refusal)),
        (Ok(media), Ok(req)) => (media, req),
    };
    Ok(
        match engine.handle_fence(text(args, "node"), &req, media, now_ms)? {
            FenceReply::Granted(grant) => Ok(to_object(&grant)),
            FenceReply::Refused(r) => Err(refused_with(
                409,
                r.code(),
                json!({"granted": false, "reason": r.code()}),
            )),
        },
    )
}

fn claim<S: Store>(
    engine: &Engine<S>,
    args: &Map<String, Json>,
    now_ms: i64,
) -> Result<Answer, EngineError> {
    let req = match parse_body(args, ClaimRequest::parse) {
        Ok(req) => req,
        Err(refusal) => return Ok(Err(refusal)),
    };
    Ok(
        match engine.handle_claim(text(args, "node"), &req, now_ms)? {
            ClaimReply::Claimed {
                call_session_id,
                epoch,
            } => Ok(object(
                json!({"claimed": true, "call_session_id": call_session_id, "epoch": epoch}),
            )),
            ClaimReply::AlreadyOwned => Err(refused_with(
                409,
                "already_owned",
                json!({"claimed": false, "reason": "already_owned"}),
            )),
            ClaimReply::NotRegistered => Err(refused(401, "unknown_node_key")),
        },
    )
}

fn media_verify<S: Store>(
    engine: &Engine<S>,
    media: Option<&MediaKeys>,
    args: &Map<String, Json>,
    now_ms: i64,
) -> Result<Answer, EngineError> {
    let (media, req) = match (
        media_keys(media),
        parse_body(args, MediaVerifyRequest::parse),
    ) {
        (Err(refusal), _) | (_, Err(refusal)) => return Ok(Err(refusal)),
        (Ok(media), Ok(req)) => (media, req),
    };
    Ok(
        match engine.handle_media_verify(text(args, "node"), &req.media_token, media, now_ms)? {
            MediaReply::Valid {
                call_session_id,
                epoch,
            } => Ok(object(
                json!({"valid": true, "call_session_id": call_session_id, "epoch": epoch}),
            )),
            MediaReply::Invalid(r) => Err(refused_with(
                409,
                r.code(),
                json!({"valid": false, "reason": r.code()}),
            )),
        },
    )
}

fn kind(args: &Map<String, Json>) -> Option<DocKind> {
    match text(args, "kind") {
        "policy" => Some(DocKind::Policy),
        "nodes" => Some(DocKind::Nodes),
        _ => None,
    }
}

/// The status and body of a refused document read or write.
fn doc_refusal(error: DocError) -> Result<(u16, &'static str, Map<String, Json>), EngineError> {
    let code = error.code();
    Ok(match error {
        DocError::Engine(e) => return Err(e),
        DocError::PreconditionRequired => refused(428, code),
        DocError::BadPrecondition => refused(400, code),
        DocError::RevisionConflict { current_revision } => {
            refused_with(412, code, json!({"current_revision": current_revision}))
        }
        DocError::InvalidJson => refused_with(
            400,
            code,
            json!({"details": [{"path": "", "problem": "the body is not a JSON object"}]}),
        ),
        DocError::InvalidDocument(details) => refused_with(400, code, json!({"details": details})),
        DocError::NodeInUse { node } => refused_with(409, code, json!({"node": node})),
        DocError::Absent(_) | DocError::UnknownRevision => refused(404, code),
        _ => refused(400, code),
    })
}

fn get_document<S: Store>(
    engine: &Engine<S>,
    args: &Map<String, Json>,
) -> Result<Answer, EngineError> {
    let Some(kind) = kind(args) else {
        return Ok(Err(refused(400, "bad_message")));
    };
    let revision = args.get("revision").and_then(Json::as_u64);
    Ok(match engine.get_document(kind, revision) {
        Ok((revision, document)) => Ok(object(json!({"revision": revision, "document": document}))),
        Err(e) => Err(doc_refusal(e)?),
    })
}

fn put_document<S: Store>(
    engine: &Engine<S>,
    args: &Map<String, Json>,
    now_ms: i64,
) -> Result<Answer, EngineError> {
    let Some(kind) = kind(args) else {
        return Ok(Err(refused(400, "bad_message")));
    };
    let if_match = args.get("if_match").and_then(Json::as_str);
    let result = engine.put_document(
        kind,
        text(args, "body").as_bytes(),
        if_match,
        text(args, "writer_fp"),
        now_ms,
    );
    Ok(match result {
        Ok(revision) => Ok(object(json!({"revision": revision}))),
        Err(e) => Err(doc_refusal(e)?),
    })
}

fn preview<S: Store>(
    engine: &Engine<S>,
    args: &Map<String, Json>,
    now_ms: i64,
) -> Result<Answer, EngineError> {
    let req = match parse_body(args, PreviewRequest::parse) {
        Ok(req) => req,
        Err(refusal) => return Ok(Err(refusal)),
    };
    Ok(engine
        .preview(&req, now_ms)?
        .map(object)
        .ok_or(refused(404, "no_policy")))
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use crate::protocol::{decode_reply, Reply};
    use callfence_core::engine::EngineConfig;
    use callfence_core::store::{migrate, sqlite::SqliteStore};

    fn engine() -> Engine<SqliteStore> {
        let store = SqliteStore::in_memory().unwrap();
        migrate(&store, 0).unwrap();
        Engine::new(store, EngineConfig::default())
    }

    fn run(engine: &Engine<SqliteStore>, op: Op, args: Json) -> Reply {
        let body = serve(engine, None, op, object(args), 1_796_000_000_000).unwrap();
        decode_reply(200, body.as_bytes()).unwrap()
    }

    #[test]
    fn ping_reports_which_documents_exist() {
        let e = engine();
        let Reply::Done(map) = run(&e, Op::Ping, json!({})) else {
            panic!("refused")
        };
        assert_eq!(
            Json::Object(map),
            json!({"documents": {"policy": false, "nodes": false}})
        );
    }

    #[test]
    fn document_refusals_carry_their_status_and_code() {
        let e = engine();
        let cases = [
            (json!({"kind": "nodes"}), 404, "no_nodes"),
            (json!({"kind": "policy"}), 404, "no_policy"),
        ];
        for (args, status, code) in cases {
            match run(&e, Op::GetDocument, args) {
                Reply::Refused { status: s, body } => {
                    assert_eq!((s, body["error"].as_str()), (status, Some(code)));
                }
                Reply::Done(_) => panic!("a missing document was served"),
            }
        }
        let put = |if_match: Option<&str>, body: &str| {
            run(
                &e,
                Op::PutDocument,
                json!({"kind": "nodes", "body": body, "if_match": if_match, "writer_fp": "t"}),
            )
        };
        let status_of = |reply: Reply| match reply {
            Reply::Refused { status, body } => (
                status,
                body["error"].as_str().unwrap_or_default().to_owned(),
            ),
            Reply::Done(_) => (200, String::new()),
        };
        assert_eq!(
            status_of(put(None, "{}")),
            (428, "precondition_required".into())
        );
        assert_eq!(
            status_of(put(Some("W/\"0\""), "{}")),
            (400, "bad_precondition".into())
        );
        assert_eq!(
            status_of(put(Some("\"3\""), "{}")),
            (412, "revision_conflict".into())
        );
        assert_eq!(
            status_of(put(Some("\"0\""), "[]")),
            (400, "invalid_document".into())
        );
        assert_eq!(
            status_of(put(Some("\"0\""), "{\"schema\":\"x\"}")),
            (400, "invalid_document".into())
        );
    }

    /// An engine whose registry has node M1 with key id k1.
    fn engine_with_m1() -> Engine<SqliteStore> {
        let e = engine();
        let key = callfence_core::encoding::b64_encode(
            ed25519_dalek::SigningKey::from_bytes(&[1; 32])
                .verifying_key()
                .as_bytes(),
        );
        let registry = json!({"schema": "callfence_nodes_v1", "nodes": {"M1": {
            "role": "stable", "origin_url": "https://m1.example.com/t", "keys": {"k1": key},
            "fallback_approved": false, "admin_drained": false}}});
        let reply = run(
            &e,
            Op::PutDocument,
            json!({"kind": "nodes", "body": registry.to_string(), "if_match": "\"0\"", "writer_fp": "t"}),
        );
        assert!(matches!(reply, Reply::Done(_)), "{reply:?}");
        e
    }

    fn refusal(reply: Reply) -> (u16, String) {
        match reply {
            Reply::Refused { status, body } => (
                status,
                body["error"].as_str().unwrap_or_default().to_owned(),
            ),
            Reply::Done(map) => panic!("not refused: {map:?}"),
        }
    }

    #[test]
    fn fence_without_media_keys_is_misconfigured_and_bad_bodies_are_400() {
        let e = engine_with_m1();
        let fence = run(
            &e,
            Op::Fence,
            json!({"node": "M1", "kid": "k1", "body": "{}"}),
        );
        assert_eq!(refusal(fence), (503, "misconfigured".into()));
        let claim = run(
            &e,
            Op::Claim,
            json!({"node": "M1", "kid": "k1", "body": "nope"}),
        );
        assert_eq!(refusal(claim), (400, "bad_request".into()));
    }

    #[test]
    fn a_key_no_longer_in_the_registry_is_refused_for_every_node_op() {
        let e = engine_with_m1();
        for op in [Op::Heartbeat, Op::Fence, Op::Claim, Op::MediaVerify] {
            for (node, kid) in [("M1", "gone"), ("M9", "k1")] {
                let reply = run(&e, op, json!({"node": node, "kid": kid, "body": "{}"}));
                assert_eq!(
                    refusal(reply),
                    (401, "unknown_node_key".into()),
                    "{op:?} {node}/{kid}"
                );
            }
        }
    }
}
