//! The operations the Dispatcher serves: a typed [`Request`] and its
//! payload in, an engine call, a protocol answer out. Engine outcomes
//! become [`Refusal`]s here, and [`Refusal::status`] turns them into HTTP
//! statuses.

use super::counting;
#[cfg(feature = "testing")]
use super::profile::Profile;
use crate::protocol::encode_refusal;
use crate::protocol::{
    self, DocumentRead, Documents, Held, Leased, MapInForce, MapState, Message, Next, NodeKeys,
    Present, ProbeTarget, Request, Scraped, Written,
};
use callfence_core::admission;
use callfence_core::engine::{
    Arrival, BadRequest, Caller, ClaimReply, ClaimRequest, Engine, EngineError, FenceReply,
    FenceRequest, Forward, Holds, Ingress, MediaReply, MediaVerifyRequest, PendingReason,
    PreviewRequest, ProbeAdmission, ReportEffect,
};
use callfence_core::media::MediaKeys;
use callfence_core::metrics::{ClaimLimit, Count, WebhookOutcome};
use callfence_core::node_auth::NodeAuthError;
use callfence_core::refusal::{DocumentRefusal, Refusal};
use callfence_core::store::Store;
use callfence_core::telnyx::{parse_envelope, Envelope};
use callfence_core::wire::{ClaimRefusal, Claimed, MediaValid};
use serde::Serialize;
use serde_json::json;

/// An operation's outcome before encoding: its result, or a refusal.
type Outcome = Result<String, Refusal>;

/// What [`serve`] leaves to the Durable Object.
#[derive(Debug)]
pub enum Served {
    /// The encoded answer.
    Reply(String),
    /// A version 2 webhook whose event must be forwarded now: the Durable
    /// Object sends it itself ([`super::deliver`]) and answers with what the
    /// reports make of it.
    Deliver {
        /// The first forward.
        forward: Box<Forward>,
        /// When the Worker received the webhook, by its clock.
        received_at_ms: i64,
    },
    /// A decision found a node full for want of room another shard may
    /// hold, and was undone (SPEC §16): the Durable Object asks for the
    /// room and serves the request again, as it stands.
    NeedRoom,
    /// A bench-only `writes_only` whose first unit is written: the Durable
    /// Object yields (so that it commits on its own) and writes the second.
    #[cfg(feature = "testing")]
    WritesOnlyDeliver {
        /// The call.
        id: String,
    },
}

/// The way forward after a report: the carrier's answer, a new owner to
/// forward to, or a refusal.
pub fn report_way(effect: ReportEffect) -> Result<Next, Refusal> {
    match effect {
        ReportEffect::Delivered(d) => Ok(Next::Answer(json!(d))),
        ReportEffect::Reassigned(Some(f)) => Ok(Next::Forward(Box::new(f))),
        ReportEffect::Reassigned(None) => Err(Refusal::Reassigned),
        ReportEffect::Unknown => Err(Refusal::DeliveryUnknown),
        ReportEffect::Parked(reason) => Err(Refusal::Pending(reason)),
    }
}

/// A refusal or a result, encoded.
pub fn encode(way: Result<Next, Refusal>) -> String {
    match way {
        Ok(next) => protocol::encode_done(&next),
        Err(refusal) => encode_refusal(&refusal),
    }
}

fn done(result: &impl Serialize) -> Outcome {
    Ok(protocol::encode_done(result))
}

/// Runs `request` with its `payload` and returns the encoded answer. An
/// engine failure is an error (the Durable Object then throws, and the
/// Worker answers unavailable).
pub fn serve<S: Store>(
    engine: &Engine<S>,
    media: Option<&MediaKeys>,
    #[cfg(feature = "testing")] profile: &Profile,
    message: &Message,
    now_ms: i64,
) -> Result<Served, EngineError> {
    let (request, payload) = (&message.request, message.payload.as_slice());
    // A node request under a key the current registry no longer has is
    // refused before its body is read, so it learns nothing about its
    // validation (the engine re-checks the pair in its own unit).
    if let Some((node, kid)) = request.caller() {
        if !engine.key_in_force(caller(node, kid))? {
            return Ok(Served::Reply(encode_refusal(&Refusal::NodeAuth(
                NodeAuthError::UnknownNodeKey,
            ))));
        }
    }
    // Under a map that only ever had `global`, no id needs reading (a media
    // token's would cost a second HMAC check).
    let arrival = request.arrival();
    let sole = engine.shard().sole_holder(&arrival)?;
    if let Some(id) = (!sole)
        .then(|| request.session(payload, media, now_ms))
        .flatten()
    {
        if let Some(redirect) = engine.redirect_for(&id, &arrival)? {
            return Ok(Served::Reply(protocol::encode_done(&Next::Redirect(
                redirect,
            ))));
        }
    }
    let outcome = match request {
        Request::Ping => {
            let directory = engine.directory();
            let (map_revision, map) = directory.shard_map()?;
            let floor =
                directory.rollback_floor(now_ms, engine.config().timing.holding_horizon_ms())?;
            done(&Documents {
                documents: Present {
                    policy: engine.policy()?.is_some(),
                    nodes: engine.registry()?.is_some(),
                },
                shards: Some(MapState {
                    call_shards: map.call_shards,
                    map_revision,
                    rollback_floor: floor.as_str().to_owned(),
                }),
            })
        }
        Request::NodeKeys => {
            let (revision, keys) = engine.node_keys()?;
            done(&NodeKeys { revision, keys })
        }
        Request::Webhook {
            envelope,
            headers,
            received_at_ms,
            sent_at_ms,
            map,
            absent,
            legs_asked,
        } => {
            let sent = sent_at_ms.or(*received_at_ms);
            if !admission::admits_webhook(sent, message.taken_at_ms.unwrap_or(now_ms)) {
                engine
                    .metrics()
                    .count(Count::Webhook(WebhookOutcome::Overloaded));
                Err(Refusal::Overloaded)
            } else {
                let arrival = Arrival {
                    map: *map,
                    absent: absent.clone(),
                    legs_asked: *legs_asked,
                };
                let placed = Placed {
                    envelope: envelope.as_ref(),
                    headers,
                    arrival: &arrival,
                };
                match webhook(engine, placed, payload, now_ms)? {
                    None => return Ok(Served::NeedRoom),
                    // A version 1 Worker forwards and reports itself.
                    Some(Ok(Next::Forward(forward))) if received_at_ms.is_some() => {
                        return Ok(Served::Deliver {
                            forward,
                            received_at_ms: received_at_ms.unwrap_or(now_ms),
                        })
                    }
                    Some(way) => Ok(encode(way)),
                }
            }
        }
        Request::Holds {
            call_session_id,
            map,
        } => done(&Held {
            held: engine.handle_holds(call_session_id, map)? == Holds::Held,
        }),
        Request::Leg { call_control_id } => done(&Held {
            held: engine.holds_leg(call_control_id)?,
        }),
        Request::LeaseAsk { ask } => done(&Leased {
            lease: engine.handle_lease_ask(ask, now_ms)?,
        }),
        Request::Map => done(&MapInForce {
            map: engine.map_notice(now_ms)?,
        }),
        Request::MapPush { map } => {
            engine.shard().handle_map(map)?;
            done(&json!({}))
        }
        // The object asked for its lease before serving (`role::lease`).
        Request::Reclaim => done(&json!({})),
        Request::Revoke { seq } => {
            engine.shard().handle_revoke(*seq);
            done(&json!({}))
        }
        Request::Mark { mark } => {
            engine.handle_mark(mark.clone(), now_ms)?;
            done(&json!({}))
        }
        Request::Report { report } => Ok(encode(report_way(engine.handle_report(report, now_ms)?))),
        Request::Heartbeat {
            node,
            kid,
            signed_at_s,
        } => {
            let beat =
                match engine.handle_heartbeat(caller(node, kid), *signed_at_s, payload, now_ms) {
                    Ok(answer) => Ok(answer),
                    Err(refused) => Err(Refusal::of_heartbeat(refused)?),
                };
            counting::heartbeat(engine.metrics(), node, beat.as_ref().err());
            beat.and_then(|answer| done(&answer))
        }
        Request::Fence { node, kid, .. } => match media {
            None => Err(Refusal::Misconfigured("node_routes")),
            Some(media) => match parse(payload, FenceRequest::parse) {
                Err(refusal) => Err(refusal),
                Ok(req) => {
                    let reply = engine.handle_fence(caller(node, kid), &req, media, now_ms)?;
                    counting::fence(engine.metrics(), &reply);
                    match reply {
                        FenceReply::Granted(grant) => done(&grant),
                        FenceReply::UnknownNodeKey => {
                            Err(Refusal::NodeAuth(NodeAuthError::UnknownNodeKey))
                        }
                        FenceReply::Refused(r) => Err(Refusal::Fence(r)),
                    }
                }
            },
        },
        Request::Claim { node, kid, .. } => match parse(payload, ClaimRequest::parse) {
            Err(refusal) => Err(refusal),
            Ok(req) => match engine.handle_claim(caller(node, kid), &req, now_ms)? {
                ClaimReply::Claimed {
                    call_session_id,
                    epoch,
                } => done(&Claimed::new(&call_session_id, epoch)),
                ClaimReply::AlreadyOwned => Err(Refusal::Claim(ClaimRefusal::AlreadyOwned)),
                ClaimReply::CapacityExhausted => {
                    counting::claim_refused(engine.metrics(), node, ClaimLimit::Capacity);
                    Err(Refusal::Claim(ClaimRefusal::CapacityExhausted))
                }
                ClaimReply::RateLimited { retry_after_s } => {
                    counting::claim_refused(engine.metrics(), node, ClaimLimit::Rate);
                    Err(Refusal::RateLimited(retry_after_s))
                }
                ClaimReply::StorageFull => Err(Refusal::StorageFull),
                ClaimReply::NotRegistered => Err(Refusal::NodeAuth(NodeAuthError::UnknownNodeKey)),
                ClaimReply::NeedRoom => return Ok(Served::NeedRoom),
            },
        },
        Request::MediaVerify { node, kid, .. } => match media {
            None => Err(Refusal::Misconfigured("node_routes")),
            Some(media) => match parse(payload, MediaVerifyRequest::parse) {
                Err(refusal) => Err(refusal),
                Ok(req) => {
                    match engine.handle_media_verify(
                        caller(node, kid),
                        &req.media_token,
                        media,
                        now_ms,
                    )? {
                        MediaReply::UnknownNodeKey => {
                            Err(Refusal::NodeAuth(NodeAuthError::UnknownNodeKey))
                        }
                        MediaReply::Valid {
                            call_session_id,
                            epoch,
                        } => done(&MediaValid::new(&call_session_id, epoch)),
                        MediaReply::Invalid(r) => Err(Refusal::Media(r)),
                    }
                }
            },
        },
        Request::GetDocument { kind, revision } => match engine.get_document(*kind, *revision) {
            Ok((revision, document)) => done(&DocumentRead { revision, document }),
            Err(e) => Err(Refusal::Document(DocumentRefusal::from_error(e)?)),
        },
        Request::PutDocument {
            kind,
            if_match,
            writer_fp,
        } => match engine.put_document(*kind, payload, if_match.as_deref(), writer_fp, now_ms) {
            Ok(revision) => done(&Written { revision }),
            Err(e) => Err(Refusal::Document(DocumentRefusal::from_error(e)?)),
        },
        Request::Preview => match parse(payload, PreviewRequest::parse) {
            Err(refusal) => Err(refusal),
            Ok(req) => match engine.preview(&req, now_ms)? {
                Some(preview) => done(&preview),
                None => Err(Refusal::NoPolicy),
            },
        },
        Request::Status => done(&engine.status(now_ms)?),
        Request::Decisions {
            limit,
            call_session_id,
            after,
        } => done(&engine.decisions(*limit, call_session_id.as_deref(), *after)?),
        Request::Calls { limit, after } => done(&engine.calls(after.as_deref(), *limit)?),
        Request::Events { limit, after } => done(&engine.events(*after, *limit)?),
        Request::Call { id, .. } => match engine.call(id)? {
            Some(call) => done(&call),
            None => Err(Refusal::UnknownCall),
        },
        Request::Metrics { refused } => {
            counting::refused(engine.metrics(), *refused);
            done(&Scraped {
                samples: counting::samples(engine, now_ms)?,
            })
        }
        Request::CountRefused { refused } => {
            counting::refused(engine.metrics(), *refused);
            done(&json!({}))
        }
        #[cfg(feature = "testing")]
        Request::Profile => done(profile),
        Request::Probe { node, .. } => match engine.handle_probe(node, now_ms)? {
            ProbeAdmission::Send { origin_url } => done(&ProbeTarget { origin_url }),
            ProbeAdmission::RateLimited { retry_after_s } => {
                Err(Refusal::RateLimited(retry_after_s))
            }
            ProbeAdmission::UnknownNode => Err(Refusal::NodeAuth(NodeAuthError::UnknownNodeKey)),
        },
        #[cfg(feature = "testing")]
        Request::WritesOnly {
            id,
            node,
            origin_url,
        } => {
            let body = String::from_utf8_lossy(payload);
            engine.writes_only_assign(id, node, origin_url, &body, now_ms)?;
            return Ok(Served::WritesOnlyDeliver { id: id.clone() });
        }
    };
    Ok(Served::Reply(
        outcome.unwrap_or_else(|refusal| encode_refusal(&refusal)),
    ))
}

/// A verified webhook as the Worker placed it.
struct Placed<'a> {
    /// The Worker's envelope (a version 1 Worker sent none: the body is
    /// parsed here).
    envelope: Option<&'a Envelope>,
    /// The Telnyx headers.
    headers: &'a [(String, String)],
    /// What the Worker knows of the shard map.
    arrival: &'a Arrival,
}

/// A verified webhook's way forward; `None` when its decision was undone
/// for want of room ([`Served::NeedRoom`]).
fn webhook<S: Store>(
    engine: &Engine<S>,
    placed: Placed<'_>,
    payload: &[u8],
    now_ms: i64,
) -> Result<Option<Result<Next, Refusal>>, EngineError> {
    let parsed;
    let envelope = match placed.envelope {
        Some(envelope) => envelope,
        None => match parse_envelope(payload) {
            Ok(envelope) => {
                parsed = envelope;
                &parsed
            }
            Err(_) => return Ok(Some(Err(Refusal::BadEnvelope))),
        },
    };
    let Ok(body) = std::str::from_utf8(payload) else {
        return Ok(Some(Err(Refusal::BadEnvelope)));
    };
    let event_id = &envelope.event_id;
    let ingress =
        engine.handle_placed_webhook(envelope, body, placed.headers, placed.arrival, now_ms)?;
    counting::ingress(engine.metrics(), &ingress);
    Ok(Some(match ingress {
        Ingress::Forward(f) => Ok(Next::Forward(Box::new(f))),
        Ingress::Delivered(d) => Ok(Next::Answer(json!(d))),
        Ingress::Ignored => Ok(Next::Answer(json!({"ignored": true, "event_id": event_id}))),
        Ingress::Unroutable => Ok(Next::Answer(
            json!({"unroutable": true, "event_id": event_id}),
        )),
        Ingress::InProgress => Err(Refusal::InProgress),
        Ingress::Pending(reason) => Err(Refusal::Pending(reason)),
        Ingress::Rejected => Err(Refusal::Pending(PendingReason::NoEligibleNode)),
        Ingress::StorageFull => Err(Refusal::StorageFull),
        // Not this shard's to create (SPEC §16): the Worker goes on.
        Ingress::Redirect(redirect) => Ok(Next::Redirect(redirect)),
        Ingress::NeedRoom => return Ok(None),
    }))
}

/// The caller of a node request. The engine re-checks the pair against its
/// current registry (the Worker's key cache may lag a registry change by a
/// few seconds: a key removed since is refused); it is checked here first,
/// so an unknown key learns nothing about the body's validation.
fn caller<'a>(node: &'a str, kid: &'a str) -> Caller<'a> {
    Caller { node, kid }
}

/// A node or preview body parsed by `parse`, or 400 `bad_request`.
fn parse<T>(payload: &[u8], parse: fn(&[u8]) -> Result<T, BadRequest>) -> Result<T, Refusal> {
    parse(payload).map_err(|bad| Refusal::BadRequest(bad.0))
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use crate::protocol::{decode_reply, Leased, Reply, View};
    use callfence_core::document::DocKind;
    use callfence_core::engine::{
        EngineConfig, ForwardMark, ForwardResult, LeaseAsk, MapNotice, Redirect,
    };
    use callfence_core::store::{migrate, sqlite::SqliteStore};

    fn engine() -> Engine<SqliteStore> {
        let store = SqliteStore::in_memory().unwrap();
        migrate(&store, 0).unwrap();
        Engine::new(store, EngineConfig::default())
    }

    fn message(request: Request, payload: &[u8]) -> Message {
        Message {
            version: protocol::VERSION,
            request,
            payload: payload.to_vec(),
            taken_at_ms: None,
        }
    }

    fn answer_of(served: Served) -> String {
        match served {
            Served::Reply(body) => body,
            Served::Deliver { .. } | Served::WritesOnlyDeliver { .. } => {
                panic!("a forward, not a reply")
            }
            Served::NeedRoom => panic!("undone for want of room, not a reply"),
        }
    }

    fn run(engine: &Engine<SqliteStore>, request: Request, payload: &str) -> Reply<View> {
        let body = answer_of(
            serve(
                engine,
                None,
                &Profile::default(),
                &message(request, payload.as_bytes()),
                1_796_000_000_000,
            )
            .unwrap(),
        );
        decode_reply(200, body.as_bytes()).unwrap()
    }

    fn refusal(reply: Reply<View>) -> (u16, String) {
        match reply {
            Reply::Refused(r) => (
                r.status,
                r.body["error"].as_str().unwrap_or_default().to_owned(),
            ),
            Reply::Done(map) => panic!("not refused: {map:?}"),
        }
    }

    #[test]
    fn ping_reports_which_documents_exist() {
        let e = engine();
        let body = answer_of(
            serve(
                &e,
                None,
                &Profile::default(),
                &message(Request::Ping, b""),
                0,
            )
            .unwrap(),
        );
        assert_eq!(
            decode_reply::<Documents>(200, body.as_bytes()).unwrap(),
            Reply::Done(Documents {
                documents: Present {
                    policy: false,
                    nodes: false
                },
                shards: Some(MapState {
                    call_shards: 1,
                    map_revision: 0,
                    rollback_floor: "v1.3".into(),
                }),
            })
        );
    }

    fn put(if_match: Option<&str>) -> Request {
        Request::PutDocument {
            kind: DocKind::Nodes,
            if_match: if_match.map(str::to_owned),
            writer_fp: "t".into(),
        }
    }

    #[test]
    fn document_refusals_carry_their_status_and_code() {
        let e = engine();
        for (kind, code) in [(DocKind::Nodes, "no_nodes"), (DocKind::Policy, "no_policy")] {
            let reply = run(
                &e,
                Request::GetDocument {
                    kind,
                    revision: None,
                },
                "",
            );
            assert_eq!(refusal(reply), (404, code.to_owned()));
        }
        let cases = [
            (None, "{}", 428, "precondition_required"),
            (Some("W/\"0\""), "{}", 400, "bad_precondition"),
            (Some("\"3\""), "{}", 412, "revision_conflict"),
            (Some("\"0\""), "[]", 400, "invalid_document"),
            (Some("\"0\""), "{\"schema\":\"x\"}", 400, "invalid_document"),
        ];
        for (if_match, body, status, code) in cases {
            assert_eq!(
                refusal(run(&e, put(if_match), body)),
                (status, code.to_owned()),
                "{body}"
            );
        }
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
        let reply = run(&e, put(Some("\"0\"")), &registry.to_string());
        assert!(matches!(reply, Reply::Done(_)), "{reply:?}");
        e
    }

    #[test]
    fn fence_without_media_keys_is_misconfigured_and_bad_bodies_are_400() {
        let e = engine_with_m1();
        let fence = Request::Fence {
            node: "M1".into(),
            kid: "k1".into(),
            map: None,
            absent: None,
        };
        assert_eq!(refusal(run(&e, fence, "{}")), (503, "misconfigured".into()));
        let claim = Request::Claim {
            node: "M1".into(),
            kid: "k1".into(),
            map: None,
            absent: None,
        };
        assert_eq!(refusal(run(&e, claim, "nope")), (400, "bad_request".into()));
    }

    #[test]
    fn a_key_no_longer_in_the_registry_is_refused_for_every_node_op() {
        let e = engine_with_m1();
        for (node, kid) in [("M1", "gone"), ("M9", "k1")] {
            let (node, kid) = (node.to_owned(), kid.to_owned());
            let ops = [
                Request::Heartbeat {
                    node: node.clone(),
                    kid: kid.clone(),
                    signed_at_s: 0,
                },
                Request::Fence {
                    node: node.clone(),
                    kid: kid.clone(),
                    map: None,
                    absent: None,
                },
                Request::Claim {
                    node: node.clone(),
                    kid: kid.clone(),
                    map: None,
                    absent: None,
                },
                Request::MediaVerify {
                    node: node.clone(),
                    kid: kid.clone(),
                    map: None,
                    absent: None,
                },
            ];
            for op in ops {
                let name = op.op();
                assert_eq!(
                    refusal(run(&e, op, "{}")),
                    (401, "unknown_node_key".into()),
                    "{name} {node}/{kid}"
                );
            }
        }
    }

    #[test]
    fn parked_webhooks_ask_for_a_retry_and_a_v1_webhook_is_parsed_here() {
        let e = engine();
        let body = r#"{"data":{"id":"e1","event_type":"call.initiated","payload":{"call_session_id":"s1","to":"+15551230000","from":"+15551239999"}}}"#;
        let request = Request::Webhook {
            envelope: None,
            headers: Vec::new(),
            received_at_ms: None,
            sent_at_ms: None,
            map: None,
            absent: None,
            legs_asked: false,
        };
        let reply = answer_of(
            serve(
                &e,
                None,
                &Profile::default(),
                &message(request.clone(), body.as_bytes()),
                1_796_000_000_000,
            )
            .unwrap(),
        );
        match decode_reply::<View>(200, reply.as_bytes()).unwrap() {
            Reply::Refused(r) => {
                assert_eq!((r.status, r.retry_after_s), (503, Some(1)));
                assert_eq!(r.body["error"], "no_policy");
            }
            Reply::Done(d) => panic!("{d:?}"),
        }
        let reply =
            answer_of(serve(&e, None, &Profile::default(), &message(request, b"{}"), 0).unwrap());
        assert_eq!(
            refusal(decode_reply(200, reply.as_bytes()).unwrap()),
            (400, "bad_envelope".into())
        );
    }

    /// A call shard that waited for its own lease (or for room) before it
    /// served a webhook did not keep it queued: admission counts the wait
    /// until the object took the message, not until it served it.
    #[test]
    fn admission_counts_the_queue_until_the_object_took_the_webhook() {
        let e = engine();
        let body = r#"{"data":{"id":"e1","event_type":"call.initiated","payload":{"call_session_id":"s1","to":"+15551230000","from":"+15551239999"}}}"#;
        let sent = 1_796_000_000_000;
        let served_at = sent + 900;
        let error = |taken_at_ms: Option<i64>| {
            let request = Request::Webhook {
                envelope: None,
                headers: Vec::new(),
                received_at_ms: Some(sent),
                sent_at_ms: None,
                map: None,
                absent: None,
                legs_asked: false,
            };
            let message = Message {
                taken_at_ms,
                ..message(request, body.as_bytes())
            };
            let reply =
                answer_of(serve(&e, None, &Profile::default(), &message, served_at).unwrap());
            refusal(decode_reply::<View>(200, reply.as_bytes()).unwrap()).1
        };
        // Taken 50 ms after it was sent, served after a lease ask: taken.
        assert_eq!(error(Some(sent + 50)), "no_policy");
        // Taken 900 ms after it was sent: it queued, and is shed.
        assert_eq!(error(None), "overloaded");
        assert_eq!(error(Some(served_at)), "overloaded");
    }

    /// The answer to a webhook with `body` that carries `map`.
    fn placed(e: &Engine<SqliteStore>, map: MapNotice, body: &str) -> String {
        let request = Request::Webhook {
            envelope: None,
            headers: Vec::new(),
            received_at_ms: None,
            sent_at_ms: None,
            map: Some(map),
            absent: None,
            legs_asked: false,
        };
        let message = message(request, body.as_bytes());
        answer_of(serve(e, None, &Profile::default(), &message, 1_796_000_000_000).unwrap())
    }

    /// A webhook for a new session whose home under the map it carries is
    /// another shard: redirected there, nothing stored; `Holds` answers
    /// whether the session is held here.
    #[test]
    fn a_session_placed_elsewhere_is_redirected_and_holds_tells_the_truth() {
        let e = engine();
        let map = MapNotice::new(1, 4, 0);
        let id = (0..100)
            .map(|i| format!("s{i}"))
            .find(|id| map.home(id) != 0)
            .unwrap();
        let body = format!(
            r#"{{"data":{{"id":"e1","event_type":"call.initiated","payload":{{"call_session_id":"{id}","to":"+15551230000","from":"+15551239999"}}}}}}"#
        );
        let reply = placed(&e, map, &body);
        assert_eq!(
            decode_reply::<Next>(200, reply.as_bytes()).unwrap(),
            Reply::Done(Next::Redirect(Redirect::Elsewhere {
                shard: map.home(&id),
                map
            }))
        );
        assert_eq!(e.call(&id).unwrap(), None, "nothing was stored");
        let holds = |id: &str| {
            let request = Request::Holds {
                call_session_id: id.to_owned(),
                map,
            };
            let body =
                answer_of(serve(&e, None, &Profile::default(), &message(request, b""), 0).unwrap());
            decode_reply::<Held>(200, body.as_bytes()).unwrap()
        };
        assert_eq!(holds(&id), Reply::Done(Held { held: false }));
        // A pushed map is adopted when newer, and an older one is not.
        let pushed = |map: MapNotice| {
            let request = Request::MapPush { map };
            serve(&e, None, &Profile::default(), &message(request, b""), 0).unwrap();
            e.shard().map().unwrap()
        };
        let newer = MapNotice::new(2, 2, 0b1000);
        assert_eq!(pushed(newer), newer);
        assert_eq!(pushed(map), newer);
        // A session placed here is created (parked without a policy) and
        // then held.
        let here = (0..100)
            .map(|i| format!("h{i}"))
            .find(|id| map.home(id) == 0)
            .unwrap();
        let body = body.replace(&id, &here);
        let reply = placed(&e, map, &body);
        assert!(matches!(
            decode_reply::<Next>(200, reply.as_bytes()).unwrap(),
            Reply::Refused(_)
        ));
        assert_eq!(holds(&here), Reply::Done(Held { held: true }));
    }

    /// A call shard's lease ask is answered once per sequence number with
    /// the directory's view and a cap per registered node (none without a
    /// beat); a repeated ask gets no second lease.
    #[test]
    fn a_lease_ask_is_answered_once_with_the_view_and_caps() {
        let e = engine_with_m1();
        let ask = LeaseAsk {
            v: callfence_core::messages::LEASE_VERSION,
            shard: 1,
            seq: 4,
            open: Default::default(),
            want: Vec::new(),
            reclaimed: false,
        };
        let asked = |ask: &LeaseAsk| {
            let request = Request::LeaseAsk { ask: ask.clone() };
            let body = answer_of(
                serve(&e, None, &Profile::default(), &message(request, b""), 1_000).unwrap(),
            );
            match decode_reply::<Leased>(200, body.as_bytes()).unwrap() {
                Reply::Done(leased) => leased.lease,
                Reply::Refused(r) => panic!("{r:?}"),
            }
        };
        let lease = asked(&ask).expect("a lease");
        assert_eq!(
            (lease.shard, lease.seq, lease.caps.get("M1")),
            (1, 4, Some(0))
        );
        assert_eq!(lease.view.nodes_revision(), 1);
        assert!(lease.until_ms > 1_000);
        assert!(asked(&ask).is_none(), "the same ask again");
        let failing = || {
            let status = e.status(1_000).unwrap().to_string();
            status.contains("recent_forward_failure")
        };
        assert!(!failing());
        let mark = Request::Mark {
            mark: ForwardMark::new("M1", ForwardResult::Failed, 900),
        };
        let body =
            answer_of(serve(&e, None, &Profile::default(), &message(mark, b""), 1_000).unwrap());
        assert!(matches!(
            decode_reply::<View>(200, body.as_bytes()),
            Ok(Reply::Done(_))
        ));
        assert!(failing(), "the mark is in force");
    }
}
