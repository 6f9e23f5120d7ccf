//! The Worker ↔ Dispatcher protocol: typed, versioned messages over the
//! Durable Object's `fetch`.
//!
//! # Wire format (version 2)
//!
//! The Worker sends `POST https://<instance>/<op>` to the object named
//! `<instance>` ([`instance`]: `global`, or `calls-k` for call shard `k`;
//! the host tells the object which shard it is), whose body is one line of
//! JSON, the [`Request`] tagged by `op` plus `"v":2`, then `\n`, then the
//! request's payload as raw bytes (the webhook body, a node request's body,
//! a document): the payload travels once, never as a JSON string inside
//! JSON. Compact JSON has no raw newline, so the first `\n` ends the head.
//!
//! The Dispatcher answers HTTP 200 with one of:
//! - `{"v":2,"ok":true, ...result}`: the operation ran (the result types
//!   below, or a view relayed verbatim);
//! - `{"v":2,"ok":false,"status":<4xx|5xx>,"error":"<code>","retry_after":S?, ...}`:
//!   a business refusal, which the Worker relays with that status and body
//!   (minus `v`, `ok`, `status` and `retry_after`, which becomes the
//!   `Retry-After` header).
//!
//! A message it cannot take (unknown op, a version it does not speak,
//! malformed JSON, a missing field) gets HTTP 400 `{"v":2,"ok":false,"error":...}`.
//!
//! # Versions and tolerance
//!
//! Each side speaks [`VERSION`] and accepts [`VERSION`] ± 1 (see
//! [`accepts`]), and ignores fields it does not know, so a Worker and a
//! Dispatcher one release apart (a rolling deploy, a rollback) keep talking:
//! - this Dispatcher also reads version 1 messages, which carried the
//!   payload as a `body` string inside the JSON and no parsed envelope;
//! - this Worker, when a Dispatcher answers HTTP 400 `bad_message` or
//!   `unsupported_version` to a version 2 message (a version 1 Dispatcher
//!   cannot read the framing), sends the same request again as version 1;
//! - replies have the same shape in both versions.
//!
//! # Unavailable
//!
//! The Worker treats anything else as the Dispatcher being unavailable
//! (503 `dispatcher_unavailable`, nothing forwarded): the stub throwing, a
//! runtime's plain-text 5xx, a status other than 200, a body that is not
//! such an object, a version it does not accept, a result of the wrong
//! shape, or no full answer within [`DEADLINE_MS`]. A Dispatcher that hangs
//! therefore still gets the caller an explicit 503 before Telnyx's own 2 s
//! webhook timeout; whatever the Dispatcher decided meanwhile is safe to
//! leave, because an assignment nobody forwarded is an attempt whose lease
//! lapses and is re-driven.
//!
//! # Operations
//!
//! | [`Request`] | payload | result |
//! |---|---|---|
//! | `Ping` | none | [`Documents`] |
//! | `NodeKeys` | none | [`NodeKeys`] |
//! | `Webhook` (`envelope`, `headers`, `received_at_ms`, `map`?, `absent`?, `legs_asked`?) | the raw webhook body | [`Next`]: a forward made and its answer, the carrier's answer, or a [`Redirect`] (SPEC §16) |
//! | `Holds` (`call_session_id`, `map`) | none | [`Held`] |
//! | `Leg` (`call_control_id`) | none | [`Held`]: whether the shard knows the leg |
//! | `LeaseAsk` (`ask`), to `global` | none | [`Leased`] |
//! | `Map`, to `global` | none | [`MapInForce`] |
//! | `MapPush` (`map`), to a call shard | none | `{}`, the map adopted if newer |
//! | `Reclaim`, to a call shard | none | `{}`, once it asked for a lease wanting no spare room |
//! | `Revoke` (`seq`), to a call shard | none | `{}`, once it gave up the lease for ask `seq` (if it held it) |
//! | `Mark` (`mark`), to `global` | none | `{}` |
//! | `Report` (`report`) | none | [`Next`] (a reassigned call's next forward) |
//! | `Heartbeat` (`node`, `kid`, `signed_at_s`) | the beat | the heartbeat answer (§6), relayed |
//! | `Fence`, `Claim`, `MediaVerify` (`node`, `kid`) | the request body | the §8 / §13 answers, relayed |
//! | `GetDocument` (`kind`, `revision`?) | none | [`DocumentRead`] |
//! | `PutDocument` (`kind`, `if_match`?, `writer_fp`) | the document | [`Written`] |
//! | `Preview` | the request body | the §13 preview, relayed |
//! | `Status`, `Decisions` (`limit`?, `call_session_id`?, `after`?), `Call` (`id`), `Calls` (`limit`?, `after`?), `Events` (`limit`?, `after`?) | none | the §13 views and the paged reads, relayed |
//! | `Probe` (`node`, `kid`) | none | [`ProbeTarget`], or 429 `rate_limited` |
//! | `Metrics` (`refused`) | none | [`Scraped`]: the object's samples, after adding the Worker isolate's pending `refused` count (SPEC §17) |
//! | `CountRefused` (`refused`) | none | `{}`: a Worker isolate's batch of webhooks refused before the Dispatcher |
//! | `Profile` | none | the Dispatcher's time per operation (`dispatcher::profile`; `make bench` only) |
//! | `WritesOnly` (`id`, `node`, `origin_url`) | an event body | `{"written":true}`; `make bench` only, under `CALLFENCE_TEST_WRITES_ONLY` |
//!
//! `Profile` and `WritesOnly` exist only in a `testing` build (the cargo
//! feature that test and bench builds turn on): the deployed Worker does not
//! know them, and its Dispatcher answers them `unknown_op`.
//!
//! Refusals carry the HTTP status and the contract's error code; the
//! mapping from engine outcomes to them is one exhaustive `match`,
//! `dispatcher::ops::Refusal`.

use callfence_core::document::DocKind;
use callfence_core::engine::{
    Arrival, ClaimRequest, FenceRequest, Forward, ForwardMark, Lease, LeaseAsk, MediaVerifyRequest,
    NodeKey, Report,
};
use callfence_core::media::MediaKeys;
use callfence_core::messages::{MapNotice, Redirect};
use callfence_core::refusal::Refusal;
use callfence_core::telnyx::Envelope;
use futures_util::future::{select, Either};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The protocol version this build speaks.
pub const VERSION: u64 = 2;

/// The Durable Object instance of the directory and call shard 0, which
/// every request but a placed one goes to.
pub const INSTANCE: &str = "global";

/// The instance name of call shard `shard` (SPEC §16): `global` for 0,
/// `calls-k` for the others. It is also the host of the request's URL,
/// which tells the object which shard it is.
pub fn instance(shard: u32) -> String {
    match shard {
        0 => INSTANCE.to_owned(),
        k => format!("calls-{k}"),
    }
}

/// The shard an object is, from the host of a request's URL (`None`: not a
/// shard's name). A Worker before v1.4 sent `dispatcher`, which is
/// `global`.
pub fn shard_of(host: &str) -> Option<u32> {
    match host {
        INSTANCE | "dispatcher" => Some(0),
        _ => host
            .strip_prefix("calls-")
            .and_then(|k| k.parse::<u32>().ok())
            .filter(|k| (1..32).contains(k) && instance(*k) == host),
    }
}

/// The `DISPATCHER` binding.
pub const BINDING: &str = "DISPATCHER";

/// How long one call may wait for the Dispatcher's whole answer.
pub const DEADLINE_MS: u64 = 1_500;

/// True for the versions this build accepts: its own and its neighbours.
pub fn accepts(version: u64) -> bool {
    version >= 1 && version.abs_diff(VERSION) <= 1
}

/// One Dispatcher operation and its arguments (the payload travels beside
/// it, see the module doc).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
// One request is built per message and never kept in bulk: the webhook's
// inline envelope and map cost nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub enum Request {
    /// Liveness and protocol check; reports which documents exist.
    Ping,
    /// Every key of every registered node, for the Worker's signature cache.
    NodeKeys,
    /// A verified carrier webhook; the payload is its raw body.
    Webhook {
        /// The envelope the Worker parsed (absent only from a version 1
        /// Worker, in which case the Dispatcher parses the body).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        envelope: Option<Envelope>,
        /// The Telnyx headers to store and carry.
        headers: Vec<(String, String)>,
        /// When the Worker received it, by its clock: for shedding under
        /// overload ([`callfence_core::admission`]) and the forward budget.
        /// Absent from version 1, whose Worker forwards and reports itself;
        /// present, the Dispatcher forwards the event itself and answers
        /// with the outcome.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        received_at_ms: Option<i64>,
        /// When the Worker sent this request, by its clock: a webhook that
        /// reaches its holder after a redirect was sent again, and only the
        /// time since then is time queued in front of the holder (absent:
        /// `received_at_ms` counts).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sent_at_ms: Option<i64>,
        /// The newest shard map the Worker knows (SPEC §16); absent: the
        /// map the shard holds.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        map: Option<MapNotice>,
        /// The shards that answered [`Request::Holds`] absent for this
        /// session, and the map revision they answered under.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        absent: Option<(u64, Vec<u32>)>,
        /// For an event that names no session: every other shard was asked
        /// whether it knows the event's leg ([`Request::Leg`]).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        legs_asked: bool,
    },
    /// Whether this shard knows a leg, asked for an event that names no
    /// session (SPEC §16: it reaches the leg's holder).
    Leg {
        /// The leg.
        call_control_id: String,
    },
    /// Whether this shard holds a session, asked for the shard that may
    /// create it under `map` (which the asked shard adopts first).
    Holds {
        /// The session.
        call_session_id: String,
        /// The asking shard's map.
        map: MapNotice,
    },
    /// A call shard's ask for a lease (SPEC §16), to `global`.
    LeaseAsk {
        /// The ask.
        ask: LeaseAsk,
    },
    /// The shard map in force as the call shards hold it, with its history
    /// (for a read that spans shards), from `global`.
    Map,
    /// `global` sends a call shard the map in force after a change, before
    /// the change is answered; the shard adopts it if newer.
    MapPush {
        /// The map.
        map: MapNotice,
    },
    /// `global` asks a call shard to report its open calls and give up its
    /// spare room: it asks for a new lease wanting none
    /// ([`callfence_core::directory::Directory::poll_reclaim`]).
    Reclaim,
    /// From `global`, after a change that a call shard's lease (the answer
    /// to its ask `seq`) was granted without: the shard gives it up (SPEC
    /// §16, `CallShard::handle_revoke`), so the change is acknowledged
    /// without waiting for the lease's end.
    Revoke {
        /// The ask the lease answered.
        seq: u64,
    },
    /// A call shard's forward mark, to `global`.
    Mark {
        /// The mark.
        mark: ForwardMark,
    },
    /// The outcome of a forward.
    Report {
        /// The attempt's outcome.
        report: Report,
    },
    /// A node's heartbeat (signature verified by the Worker).
    Heartbeat {
        /// `Callfence-Node`.
        node: String,
        /// `Callfence-Key-Id`.
        kid: String,
        /// `Callfence-Timestamp`.
        signed_at_s: i64,
    },
    /// A node asks for the answer fence.
    Fence {
        /// `Callfence-Node`.
        node: String,
        /// `Callfence-Key-Id`.
        kid: String,
        /// The newest shard map the Worker knows, and the shards that
        /// answered absent for the session (SPEC §16; as for `Webhook`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        map: Option<MapNotice>,
        /// See `map`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        absent: Option<(u64, Vec<u32>)>,
    },
    /// A node claims a session it dialled.
    Claim {
        /// `Callfence-Node`.
        node: String,
        /// `Callfence-Key-Id`.
        kid: String,
        /// The newest shard map the Worker knows, and the shards that
        /// answered absent for the session (SPEC §16; as for `Webhook`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        map: Option<MapNotice>,
        /// See `map`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        absent: Option<(u64, Vec<u32>)>,
    },
    /// A node checks a media token.
    MediaVerify {
        /// `Callfence-Node`.
        node: String,
        /// `Callfence-Key-Id`.
        kid: String,
        /// The newest shard map the Worker knows, and the shards that
        /// answered absent for the session (SPEC §16; as for `Webhook`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        map: Option<MapNotice>,
        /// See `map`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        absent: Option<(u64, Vec<u32>)>,
    },
    /// Read a document.
    GetDocument {
        /// Which one.
        kind: DocKind,
        /// One of the kept revisions; the current one when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        revision: Option<u64>,
    },
    /// Write a document (compare-and-set); the payload is the document.
    PutDocument {
        /// Which one.
        kind: DocKind,
        /// The `If-Match` header as sent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        if_match: Option<String>,
        /// The fingerprint of the writer's token.
        writer_fp: String,
    },
    /// Routing preview; the payload is `{"to","from"}`.
    Preview,
    /// The status view.
    Status,
    /// The decision list.
    Decisions {
        /// At most this many (clamped by the engine).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<u32>,
        /// Only this call's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        call_session_id: Option<String>,
        /// Oldest first, after this decision id (the paged read).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<u64>,
    },
    /// A page of whole calls.
    Calls {
        /// At most this many (clamped by the engine).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<u32>,
        /// After this call session id.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<String>,
    },
    /// A page of the event ledger with raw bodies.
    Events {
        /// At most this many (clamped by the engine).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<u32>,
        /// After this arrival number (`seq`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<u64>,
    },
    /// One call's record.
    Call {
        /// The call session id.
        id: String,
        /// The newest shard map the Worker knows, and the shards that
        /// answered absent for the session (SPEC §16; as for `Webhook`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        map: Option<MapNotice>,
        /// See `map`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        absent: Option<(u64, Vec<u32>)>,
    },
    /// A scrape (SPEC §17): the object's metric samples. Adds the
    /// scraping Worker isolate's pending count of refused webhooks first,
    /// so a scrape shows every refusal that isolate saw. Writes nothing.
    Metrics {
        /// Webhooks the isolate refused (§7.1) and has not reported yet.
        #[serde(default)]
        refused: u64,
    },
    /// A Worker isolate's batch of webhooks refused before the Dispatcher
    /// (at most one a second per isolate). Writes nothing.
    CountRefused {
        /// How many.
        refused: u64,
    },
    /// Where the Dispatcher's time went, per operation (for `make bench`;
    /// no public route serves it). Only in a `testing` build.
    #[cfg(feature = "testing")]
    Profile,
    /// Admit a node's L5 probe under its rate limit and name its registered
    /// origin (SPEC §14).
    Probe {
        /// `Callfence-Node`.
        node: String,
        /// `Callfence-Key-Id`.
        kid: String,
    },
    /// `make bench` only: the SQL writes of one assignment and its delivery
    /// and nothing else (`Engine::writes_only_assign`, then
    /// `Engine::writes_only_deliver` in a second commit); the payload is the event's
    /// body. Served only under the test-only switch
    /// `CALLFENCE_TEST_WRITES_ONLY`, otherwise `unknown_op`; only in a
    /// `testing` build.
    #[cfg(feature = "testing")]
    WritesOnly {
        /// The new call's session, leg and event id.
        id: String,
        /// The node it is assigned to.
        node: String,
        /// That node's origin.
        origin_url: String,
    },
}

impl Request {
    /// The operation's name on the wire (also the URL path).
    pub fn op(&self) -> &'static str {
        match self {
            Request::Ping => "ping",
            Request::NodeKeys => "node_keys",
            Request::Webhook { .. } => "webhook",
            Request::Holds { .. } => "holds",
            Request::Leg { .. } => "leg",
            Request::LeaseAsk { .. } => "lease_ask",
            Request::Reclaim => "reclaim",
            Request::Revoke { .. } => "revoke",
            Request::Map => "map",
            Request::MapPush { .. } => "map_push",
            Request::Mark { .. } => "mark",
            Request::Report { .. } => "report",
            Request::Heartbeat { .. } => "heartbeat",
            Request::Fence { .. } => "fence",
            Request::Claim { .. } => "claim",
            Request::MediaVerify { .. } => "media_verify",
            Request::GetDocument { .. } => "get_document",
            Request::PutDocument { .. } => "put_document",
            Request::Preview => "preview",
            Request::Status => "status",
            Request::Decisions { .. } => "decisions",
            Request::Call { .. } => "call",
            Request::Calls { .. } => "calls",
            Request::Events { .. } => "events",
            Request::Metrics { .. } => "metrics",
            Request::CountRefused { .. } => "count_refused",
            #[cfg(feature = "testing")]
            Request::Profile => "profile",
            Request::Probe { .. } => "probe",
            #[cfg(feature = "testing")]
            Request::WritesOnly { .. } => "writes_only",
        }
    }

    /// The node and key id of a node-signed request.
    pub fn caller(&self) -> Option<(&str, &str)> {
        match self {
            Request::Heartbeat { node, kid, .. }
            | Request::Fence { node, kid, .. }
            | Request::Claim { node, kid, .. }
            | Request::MediaVerify { node, kid, .. }
            | Request::Probe { node, kid } => Some((node, kid)),
            Request::Ping
            | Request::NodeKeys
            | Request::Webhook { .. }
            | Request::Holds { .. }
            | Request::Leg { .. }
            | Request::LeaseAsk { .. }
            | Request::Reclaim
            | Request::Revoke { .. }
            | Request::Map
            | Request::MapPush { .. }
            | Request::Mark { .. }
            | Request::Report { .. }
            | Request::GetDocument { .. }
            | Request::PutDocument { .. }
            | Request::Preview
            | Request::Status
            | Request::Decisions { .. }
            | Request::Call { .. }
            | Request::Calls { .. }
            | Request::Events { .. }
            | Request::Metrics { .. }
            | Request::CountRefused { .. } => None,
            #[cfg(feature = "testing")]
            Request::Profile | Request::WritesOnly { .. } => None,
        }
    }

    /// Sets what the Worker knows of the shard map on a request about one
    /// session (a webhook, a node's request, a call read); others have
    /// none.
    pub fn set_arrival(&mut self, arrival: Arrival) {
        match self {
            Request::Webhook {
                map,
                absent,
                legs_asked,
                ..
            } => {
                (*map, *absent, *legs_asked) = (arrival.map, arrival.absent, arrival.legs_asked);
            }
            Request::Fence { map, absent, .. }
            | Request::Claim { map, absent, .. }
            | Request::MediaVerify { map, absent, .. }
            | Request::Call { map, absent, .. } => {
                (*map, *absent) = (arrival.map, arrival.absent);
            }
            _ => {}
        }
    }

    /// Notes that a webhook is sent (again) at `now_ms`; other requests
    /// carry no such time.
    pub fn set_sent_at(&mut self, now_ms: i64) {
        if let Request::Webhook { sent_at_ms, .. } = self {
            *sent_at_ms = Some(now_ms);
        }
    }

    /// What the Worker knows of the shard map, as a request carries it.
    pub fn arrival(&self) -> Arrival {
        match self {
            Request::Webhook {
                map,
                absent,
                legs_asked,
                ..
            } => Arrival {
                map: *map,
                absent: absent.clone(),
                legs_asked: *legs_asked,
            },
            Request::Fence { map, absent, .. }
            | Request::Claim { map, absent, .. }
            | Request::MediaVerify { map, absent, .. }
            | Request::Call { map, absent, .. } => Arrival {
                map: *map,
                absent: absent.clone(),
                legs_asked: false,
            },
            _ => Arrival::default(),
        }
    }

    /// The session this request is about, when it names one: a fence's or
    /// a claim's body, a media token's claims (read only under a valid
    /// signature, with `media`), a call read's id. Where the holder rule
    /// applies (SPEC §16); a body that cannot be read is refused by its own
    /// operation.
    pub fn session(
        &self,
        payload: &[u8],
        media: Option<&MediaKeys>,
        now_ms: i64,
    ) -> Option<String> {
        match self {
            Request::Fence { .. } => FenceRequest::parse(payload).ok().map(|r| r.call_session_id),
            Request::Claim { .. } => ClaimRequest::parse(payload).ok().map(|r| r.call_session_id),
            Request::MediaVerify { .. } => {
                let token = MediaVerifyRequest::parse(payload).ok()?.media_token;
                let claims = callfence_core::media::verify(media?, &token, now_ms).ok()?;
                Some(claims.call_session_id)
            }
            Request::Call { id, .. } => Some(id.clone()),
            _ => None,
        }
    }

    /// True for the directory's operations whose answer tells a change of
    /// what decisions read (a beat, a document, a forward mark): answered
    /// only once the change is in force in every call shard.
    pub fn acknowledges(&self) -> bool {
        matches!(
            self,
            Request::Heartbeat { .. } | Request::PutDocument { .. } | Request::Mark { .. }
        )
    }

    /// True for the operations that may change stored state (after which
    /// the Dispatcher asks the engine when its alarm is next due). The
    /// bench-only `WritesOnly` writes but answers false on purpose: it
    /// measures an assignment's writes alone, without the alarm's work.
    pub fn changes_state(&self) -> bool {
        match self {
            Request::Webhook { .. }
            | Request::Report { .. }
            | Request::Heartbeat { .. }
            | Request::Fence { .. }
            | Request::Claim { .. }
            | Request::Probe { .. }
            | Request::LeaseAsk { .. }
            | Request::Mark { .. }
            | Request::PutDocument { .. } => true,
            Request::Ping
            | Request::NodeKeys
            | Request::Holds { .. }
            | Request::Leg { .. }
            | Request::Reclaim
            | Request::Revoke { .. }
            | Request::Map
            | Request::MapPush { .. }
            | Request::MediaVerify { .. }
            | Request::GetDocument { .. }
            | Request::Preview
            | Request::Status
            | Request::Decisions { .. }
            | Request::Call { .. }
            | Request::Calls { .. }
            | Request::Events { .. }
            | Request::Metrics { .. }
            | Request::CountRefused { .. } => false,
            #[cfg(feature = "testing")]
            Request::Profile | Request::WritesOnly { .. } => false,
        }
    }
}

/// Why a message was not taken (the Dispatcher's side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageError {
    /// Not a head of JSON with a numeric `v` and a known `op` and its
    /// fields.
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

/// A decoded request: the operation and its payload.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// The version it was sent in.
    pub version: u64,
    /// The operation.
    pub request: Request,
    /// The raw payload (empty for operations without one).
    pub payload: Vec<u8>,
    /// When the receiving object took the message, before any wait of its
    /// own (a call shard's lease ask, the room it asks for): a webhook's
    /// admission counts the time it queued until then
    /// (`admission::admits_webhook`). Not on the wire; `None` until set.
    pub taken_at_ms: Option<i64>,
}

#[derive(Serialize)]
struct HeadOut<'a> {
    v: u64,
    #[serde(flatten)]
    request: &'a Request,
}

#[derive(Deserialize)]
struct HeadIn {
    v: Option<u64>,
    op: Option<String>,
    /// Version 1 only: the payload inside the JSON.
    #[serde(default)]
    body: Option<String>,
}

/// The version 2 body for `request` and its `payload`.
pub fn encode_request(request: &Request, payload: &[u8]) -> Vec<u8> {
    let mut out = serde_json::to_vec(&HeadOut {
        v: VERSION,
        request,
    })
    .unwrap_or_default();
    out.push(b'\n');
    out.extend_from_slice(payload);
    out
}

/// The version 1 body for the same request (the payload as a `body`
/// string), for a Dispatcher one release behind. `None` when the payload is
/// not UTF-8, which version 1 could not carry.
pub fn encode_request_v1(request: &Request, payload: &[u8]) -> Option<Vec<u8>> {
    let Ok(Value::Object(mut message)) = serde_json::to_value(request) else {
        return None;
    };
    for newer in ["envelope", "map", "absent"] {
        message.remove(newer);
    }
    message.insert("v".into(), Value::from(1u64));
    if !payload.is_empty() {
        let text = std::str::from_utf8(payload).ok()?;
        message.insert("body".into(), Value::from(text));
    }
    serde_json::to_vec(&Value::Object(message)).ok()
}

/// Reads a request on the Dispatcher's side. The op must agree with the
/// URL's last path segment.
pub fn decode_request(url_op: &str, bytes: &[u8]) -> Result<Message, MessageError> {
    let (head, framed) = match bytes.iter().position(|&b| b == b'\n') {
        Some(at) => (&bytes[..at], Some(&bytes[at + 1..])),
        None => (bytes, None),
    };
    let meta: HeadIn = serde_json::from_slice(head).map_err(|_| MessageError::Malformed)?;
    let (Some(version), Some(op)) = (meta.v, meta.op) else {
        return Err(MessageError::Malformed);
    };
    if !accepts(version) {
        return Err(MessageError::UnsupportedVersion);
    }
    let request: Request = serde_json::from_slice(head).map_err(|e| {
        if e.to_string().starts_with("unknown variant") {
            MessageError::UnknownOp
        } else {
            MessageError::Malformed
        }
    })?;
    if request.op() != op || op != url_op {
        return Err(MessageError::UnknownOp);
    }
    let payload = match (version, framed) {
        (1, None) => meta.body.map(String::into_bytes).unwrap_or_default(),
        (1, Some(_)) => return Err(MessageError::Malformed),
        (_, Some(payload)) => payload.to_vec(),
        (_, None) => return Err(MessageError::Malformed),
    };
    Ok(Message {
        version,
        request,
        payload,
        taken_at_ms: None,
    })
}

/// `Ping`'s result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Documents {
    /// Which documents exist.
    pub documents: Present,
    /// The shard map in force and the rollback floor (`None` from a
    /// Dispatcher older than v1.4).
    #[serde(default)]
    pub shards: Option<MapState>,
}

/// The shard map as `GET /v1/health` shows it (SPEC §13, §16).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapState {
    /// The map's `call_shards`.
    pub call_shards: u64,
    /// Its revision (0 before any PUT).
    pub map_revision: u64,
    /// The oldest release the deployment can be rolled back to.
    pub rollback_floor: String,
}

/// Which documents were ever written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Present {
    /// The routing policy.
    pub policy: bool,
    /// The node registry.
    pub nodes: bool,
}

/// `NodeKeys`'s result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeKeys {
    /// The registry revision (0: no registry).
    pub revision: u64,
    /// Every key of every node.
    pub keys: Vec<NodeKey>,
}

/// `Probe`'s result: where to send the probe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeTarget {
    /// The node's registered origin URL.
    pub origin_url: String,
}

/// `GetDocument`'s result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DocumentRead {
    /// The revision served.
    pub revision: u64,
    /// The document, `revision` filled in.
    pub document: Value,
}

/// `Metrics`' result: one object's samples (SPEC §17).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scraped {
    /// Its counters and gauges.
    pub samples: Vec<callfence_core::metrics::Sample>,
}

/// `PutDocument`'s result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Written {
    /// The new revision.
    pub revision: u64,
}

/// A webhook's or a report's way forward.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Send this to its owner now, then report.
    Forward(Box<Forward>),
    /// Answer the carrier 200 with this body.
    Answer(Value),
    /// Not this shard's session to create yet (SPEC §16): send the webhook
    /// on, as [`callfence_core::locate::Locate`] says.
    Redirect(Redirect),
}

/// [`Next`] on the wire: exactly one of the three fields.
#[derive(Default, Serialize, Deserialize)]
struct NextWire {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    forward: Option<Box<Forward>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    answer: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    redirect: Option<Redirect>,
}

impl Serialize for Next {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Next::Forward(f) => NextWire {
                forward: Some(f.clone()),
                ..NextWire::default()
            },
            Next::Answer(a) => NextWire {
                answer: Some(a.clone()),
                ..NextWire::default()
            },
            Next::Redirect(r) => NextWire {
                redirect: Some(r.clone()),
                ..NextWire::default()
            },
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Next {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match NextWire::deserialize(d)? {
            NextWire {
                forward: Some(f),
                answer: None,
                redirect: None,
            } => Ok(Next::Forward(f)),
            NextWire {
                forward: None,
                answer: Some(a),
                redirect: None,
            } => Ok(Next::Answer(a)),
            NextWire {
                forward: None,
                answer: None,
                redirect: Some(r),
            } => Ok(Next::Redirect(r)),
            _ => Err(serde::de::Error::custom(
                "exactly one of forward, answer and redirect",
            )),
        }
    }
}

/// [`Request::LeaseAsk`]'s result: the lease, or none when the ask was
/// older than one already answered.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Leased {
    /// The lease granted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<Lease>,
}

/// [`Request::Map`]'s result (the notice has a `v` of its own, so it
/// travels under a key, not beside the answer's `v`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapInForce {
    /// The map in force, with its history.
    pub map: MapNotice,
}

/// [`Request::Holds`]'s result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    /// True when the asked shard holds the session.
    pub held: bool,
}

/// A view relayed to the caller as the Dispatcher wrote it.
pub type View = Map<String, Value>;

/// The Dispatcher did not give a well-formed answer of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable(pub String);

/// A business refusal, as the Worker relays it.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    /// 4xx or 5xx.
    pub status: u16,
    /// `Retry-After` in seconds, when the Dispatcher asks for one.
    pub retry_after_s: Option<u32>,
    /// `{"error": code, ...}`.
    pub body: Map<String, Value>,
}

/// A well-formed answer from the Dispatcher.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply<T> {
    /// The operation ran.
    Done(T),
    /// A business refusal.
    Refused(Refused),
}

/// The Dispatcher's answer body for an operation's result (any value that
/// serialises to a JSON object).
pub fn encode_done(result: &impl Serialize) -> String {
    let body = serde_json::to_string(result).unwrap_or_default();
    let fields = body
        .strip_prefix('{')
        .and_then(|rest| rest.strip_suffix('}'))
        .unwrap_or_default();
    if fields.is_empty() {
        format!("{{\"v\":{VERSION},\"ok\":true}}")
    } else {
        format!("{{\"v\":{VERSION},\"ok\":true,{fields}}}")
    }
}

/// The Dispatcher's answer body for a business refusal: its status, code,
/// `Retry-After` and further fields (a JSON object or null).
pub fn encode_refused(
    status: u16,
    code: &str,
    retry_after_s: Option<u32>,
    fields: Value,
) -> String {
    let mut body = match fields {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    body.insert("v".into(), Value::from(VERSION));
    body.insert("ok".into(), Value::from(false));
    body.insert("status".into(), Value::from(status));
    body.insert("error".into(), Value::from(code));
    if let Some(seconds) = retry_after_s {
        body.insert("retry_after".into(), Value::from(seconds));
    }
    Value::Object(body).to_string()
}

/// A refusal on the wire, as core decided its status, code, `Retry-After`
/// and fields.
pub fn encode_refusal(refusal: &Refusal) -> String {
    encode_refused(
        refusal.status(),
        refusal.code(),
        refusal.retry_after_s(),
        refusal.fields(),
    )
}

/// The Dispatcher's answer body (sent with HTTP 400) for a message it cannot take.
pub fn encode_rejected(error: MessageError) -> String {
    format!(
        "{{\"v\":{VERSION},\"ok\":false,\"error\":\"{}\"}}",
        error.code()
    )
}

#[derive(Deserialize)]
struct ReplyHead {
    v: u64,
    ok: bool,
}

/// Reads the Dispatcher's answer on the Worker's side.
pub fn decode_reply<T: DeserializeOwned>(
    http_status: u16,
    body: &[u8],
) -> Result<Reply<T>, Unavailable> {
    let unavailable = |why: &str| Unavailable(why.to_owned());
    if http_status != 200 {
        return Err(Unavailable(format!("HTTP {http_status}")));
    }
    let head: ReplyHead =
        serde_json::from_slice(body).map_err(|_| unavailable("no versioned reply"))?;
    if !accepts(head.v) {
        return Err(unavailable("no version it accepts"));
    }
    if head.ok {
        return serde_json::from_slice(body)
            .map(Reply::Done)
            .map_err(|e| Unavailable(format!("result of the wrong shape: {e}")));
    }
    let Ok(Value::Object(mut fields)) = serde_json::from_slice::<Value>(body) else {
        return Err(unavailable("not a JSON object"));
    };
    fields.remove("v");
    fields.remove("ok");
    let status = fields
        .remove("status")
        .and_then(|s| s.as_u64())
        .filter(|s| (400..=599).contains(s))
        .ok_or_else(|| unavailable("refusal without a status"))?;
    let retry_after_s = fields
        .remove("retry_after")
        .and_then(|s| s.as_u64())
        .map(|s| s.min(3_600) as u32);
    if !matches!(fields.get("error"), Some(Value::String(_))) {
        return Err(unavailable("refusal without an error code"));
    }
    Ok(Reply::Refused(Refused {
        status: status as u16,
        retry_after_s,
        body: fields,
    }))
}

/// Removes the envelope's `v` and `ok` from a relayed view.
pub fn strip_envelope(mut view: View) -> View {
    view.remove("v");
    view.remove("ok");
    view
}

/// True when an HTTP 400 answer is a Dispatcher one version behind that
/// could not read this version's framing.
fn needs_v1(http_status: u16, body: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Rejected {
        v: u64,
        error: String,
    }
    http_status == 400
        && serde_json::from_slice::<Rejected>(body).is_ok_and(|r| {
            r.v < VERSION && matches!(r.error.as_str(), "bad_message" | "unsupported_version")
        })
}

/// Sends one request to the Dispatcher and reads its answer within
/// [`DEADLINE_MS`]. Every failure on the way (no binding, the stub throwing,
/// a malformed answer, the deadline) is [`Unavailable`].
pub async fn call<T: DeserializeOwned>(
    env: &worker::Env,
    request: &Request,
    payload: &[u8],
) -> Result<Reply<T>, Unavailable> {
    call_within(env, request, payload, DEADLINE_MS as i64).await
}

/// [`call`] with its own deadline (a webhook's answer includes the
/// Dispatcher's forward, so it may take the forward budget and a margin).
pub async fn call_within<T: DeserializeOwned>(
    env: &worker::Env,
    request: &Request,
    payload: &[u8],
    deadline_ms: i64,
) -> Result<Reply<T>, Unavailable> {
    call_shard_within(env, 0, request, payload, deadline_ms).await
}

/// [`call_within`] to call shard `shard`'s object.
pub async fn call_shard_within<T: DeserializeOwned>(
    env: &worker::Env,
    shard: u32,
    request: &Request,
    payload: &[u8],
    deadline_ms: i64,
) -> Result<Reply<T>, Unavailable> {
    let failed = |e: worker::Error| Unavailable(e.to_string());
    let name = instance(shard);
    let stub = env
        .durable_object(BINDING)
        .and_then(|namespace| namespace.get_by_name(&name))
        .map_err(failed)?;
    let url = format!("https://{name}/{}", request.op());
    let send = |body: Vec<u8>| {
        let body = worker::js_sys::Uint8Array::from(body.as_slice());
        crate::subrequest::post(
            &url,
            None,
            &body.into(),
            crate::subrequest::Redirects::Follow,
        )
        .map_err(failed)
    };
    let answer = async {
        let response = stub
            .fetch_with_request(send(encode_request(request, payload))?)
            .await
            .map_err(failed)?;
        let mut status = response.status_code();
        let mut body = crate::subrequest::body_bytes(response)
            .await
            .map_err(failed)?;
        if needs_v1(status, &body) {
            let v1 = encode_request_v1(request, payload)
                .ok_or_else(|| Unavailable("a version 1 Dispatcher cannot take it".into()))?;
            let response = stub.fetch_with_request(send(v1)?).await.map_err(failed)?;
            status = response.status_code();
            body = crate::subrequest::body_bytes(response)
                .await
                .map_err(failed)?;
        }
        decode_reply(status, &body)
    };
    let deadline_ms = deadline_ms.max(1) as u64;
    let deadline = worker::Delay::from(std::time::Duration::from_millis(deadline_ms));
    let raced = select(Box::pin(answer), Box::pin(deadline)).await;
    match raced {
        Either::Left((reply, _)) => reply,
        Either::Right(_) => Err(Unavailable(format!("no answer within {deadline_ms} ms"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_refusal_crosses_the_wire_with_its_status_code_fields_and_retry() {
        for refusal in Refusal::every() {
            let reply = decode_reply::<View>(200, encode_refusal(&refusal).as_bytes()).unwrap();
            let Reply::Refused(r) = reply else {
                panic!("{refusal:?}")
            };
            assert_eq!(r.status, refusal.status());
            assert_eq!(Value::Object(r.body), refusal.body(), "{refusal:?}");
            assert_eq!(r.retry_after_s, refusal.retry_after_s(), "{refusal:?}");
        }
    }

    fn fence() -> Request {
        Request::Fence {
            node: "M1".into(),
            kid: "k1".into(),
            map: None,
            absent: None,
        }
    }

    #[test]
    fn shards_are_named_global_and_calls_k_and_nothing_else_is_a_shard() {
        assert_eq!(
            (instance(0), instance(7)),
            ("global".into(), "calls-7".into())
        );
        for k in [0, 1, 31] {
            assert_eq!(shard_of(&instance(k)), Some(k));
        }
        assert_eq!(shard_of("dispatcher"), Some(0));
        for not in ["calls-0", "calls-32", "calls-07", "calls-+1", "calls-", "x"] {
            assert_eq!(shard_of(not), None, "{not}");
        }
    }

    #[test]
    fn a_redirect_and_a_placed_webhook_round_trip() {
        let map = MapNotice::new(3, 4, 0b1);
        let next = Next::Redirect(Redirect::Lookup {
            shards: vec![0, 2],
            map,
        });
        let wire = encode_done(&next);
        assert_eq!(
            decode_reply::<Next>(200, wire.as_bytes()),
            Ok(Reply::Done(next))
        );
        // Two ways forward at once are refused.
        let webhook = Request::Webhook {
            envelope: None,
            headers: Vec::new(),
            received_at_ms: Some(5),
            sent_at_ms: None,
            map: Some(map),
            absent: Some((3, vec![0, 2])),
            legs_asked: true,
        };
        let message = decode_request("webhook", &encode_request(&webhook, b"{}")).unwrap();
        assert_eq!(message.request, webhook);
        // A notice's own `v` travels under `map`, apart from the answer's.
        let answer = encode_done(&MapInForce { map });
        assert_eq!(
            decode_reply(200, answer.as_bytes()),
            Ok(Reply::Done(MapInForce { map }))
        );
        // A version 1 Dispatcher is sent neither.
        let v1 = String::from_utf8(encode_request_v1(&webhook, b"{}").unwrap()).unwrap();
        assert!(
            !v1.contains("\"map\"") && !v1.contains("\"absent\""),
            "{v1}"
        );
        let one = wire.replace("\"v\":2,\"ok\":true,", "\"v\":2,\"ok\":true,\"answer\":{},");
        assert_ne!(one, wire);
        assert!(decode_reply::<Next>(200, one.as_bytes()).is_err(), "{one}");
    }

    #[test]
    fn neighbouring_versions_are_accepted() {
        assert!(accepts(1) && accepts(2) && accepts(3));
        assert!(!accepts(0) && !accepts(4));
    }

    #[test]
    fn a_request_and_its_payload_round_trip_and_the_payload_is_not_json_escaped() {
        let payload = b"{\"data\":{\"id\":\"e1\"}}\nsecond line";
        let body = encode_request(&fence(), payload);
        // The payload follows the head byte for byte.
        assert!(body.ends_with(payload));
        let message = decode_request("fence", &body).unwrap();
        assert_eq!(message.request, fence());
        assert_eq!(message.payload, payload);
    }

    #[test]
    fn a_version_1_message_is_read_and_a_version_1_body_is_written() {
        let v1 = br#"{"v":1,"op":"fence","node":"M1","kid":"k1","signed_at_s":5,"body":"{}"}"#;
        let message = decode_request("fence", v1).unwrap();
        assert_eq!(
            (message.request, message.payload),
            (fence(), b"{}".to_vec())
        );
        let written = encode_request_v1(&fence(), b"{}").unwrap();
        let again = decode_request("fence", &written).unwrap();
        assert_eq!((again.request, again.payload), (fence(), b"{}".to_vec()));
        // A newer neighbour's request with extra fields is taken.
        let newer = b"{\"v\":3,\"op\":\"ping\",\"future\":true}\n";
        assert_eq!(
            decode_request("ping", newer).unwrap().request,
            Request::Ping
        );
    }

    #[test]
    fn requests_that_cannot_be_taken() {
        let cases: [(&str, &[u8], MessageError); 8] = [
            ("ping", b"not json\n", MessageError::Malformed),
            ("ping", b"{\"op\":\"ping\"}\n", MessageError::Malformed),
            (
                "ping",
                b"{\"v\":\"2\",\"op\":\"ping\"}\n",
                MessageError::Malformed,
            ),
            (
                "ping",
                b"{\"v\":4,\"op\":\"ping\"}\n",
                MessageError::UnsupportedVersion,
            ),
            (
                "fly",
                b"{\"v\":2,\"op\":\"fly\"}\n",
                MessageError::UnknownOp,
            ),
            (
                "node_keys",
                b"{\"v\":2,\"op\":\"ping\"}\n",
                MessageError::UnknownOp,
            ),
            // A missing field is an error, never an empty string.
            (
                "fence",
                b"{\"v\":2,\"op\":\"fence\",\"node\":\"M1\"}\n{}",
                MessageError::Malformed,
            ),
            // Version 2 without its framing.
            (
                "ping",
                b"{\"v\":2,\"op\":\"ping\"}",
                MessageError::Malformed,
            ),
        ];
        for (url_op, body, error) in cases {
            assert_eq!(
                decode_request(url_op, body).unwrap_err(),
                error,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn replies_round_trip() {
        let documents = Documents {
            documents: Present {
                policy: false,
                nodes: true,
            },
            shards: Some(MapState {
                call_shards: 1,
                map_revision: 3,
                rollback_floor: "v1.3".into(),
            }),
        };
        let done = encode_done(&documents);
        assert_eq!(
            decode_reply::<Documents>(200, done.as_bytes()).unwrap(),
            Reply::Done(documents)
        );
        // A v1.3 Dispatcher's ping has no map.
        let older = encode_done(&json!({"documents": {"policy": true, "nodes": true}}));
        assert!(matches!(
            decode_reply::<Documents>(200, older.as_bytes()).unwrap(),
            Reply::Done(Documents { shards: None, .. })
        ));
        let refused = encode_refused(503, "no_eligible_node", Some(1), json!({"hint": 5}));
        assert_eq!(
            decode_reply::<Documents>(200, refused.as_bytes()).unwrap(),
            Reply::Refused(Refused {
                status: 503,
                retry_after_s: Some(1),
                body: json!({"error": "no_eligible_node", "hint": 5})
                    .as_object()
                    .unwrap()
                    .clone(),
            })
        );
        let next = Next::Answer(json!({"ignored": true}));
        let body = encode_done(&next);
        assert_eq!(
            decode_reply::<Next>(200, body.as_bytes()).unwrap(),
            Reply::Done(next)
        );
        assert_eq!(
            encode_done(&json!({})),
            format!("{{\"v\":{VERSION},\"ok\":true}}")
        );
    }

    #[test]
    fn anything_not_well_formed_is_unavailable() {
        let cases: [(u16, &[u8]); 9] = [
            (500, br#"{"v":2,"ok":true,"revision":1}"#),
            (200, b"Internal Server Error"),
            (200, b"[]"),
            (200, br#"{"ok":true,"revision":1}"#),
            (200, br#"{"v":7,"ok":true,"revision":1}"#),
            (200, br#"{"v":2}"#),
            (200, br#"{"v":2,"ok":false,"error":"x"}"#),
            (200, br#"{"v":2,"ok":false,"status":200,"error":"x"}"#),
            // A result of the wrong shape: a missing field.
            (200, br#"{"v":2,"ok":true}"#),
        ];
        for (status, body) in cases {
            assert!(
                decode_reply::<Written>(status, body).is_err(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        let rejected = encode_rejected(MessageError::UnknownOp);
        assert!(decode_reply::<Written>(400, rejected.as_bytes()).is_err());
    }

    #[test]
    fn only_an_older_dispatchers_framing_refusal_asks_for_version_1() {
        assert!(needs_v1(
            400,
            br#"{"v":1,"ok":false,"error":"bad_message"}"#
        ));
        assert!(needs_v1(
            400,
            br#"{"v":1,"ok":false,"error":"unsupported_version"}"#
        ));
        assert!(!needs_v1(
            400,
            br#"{"v":2,"ok":false,"error":"bad_message"}"#
        ));
        assert!(!needs_v1(
            400,
            br#"{"v":1,"ok":false,"error":"unknown_op"}"#
        ));
        assert!(!needs_v1(
            200,
            br#"{"v":1,"ok":false,"error":"bad_message"}"#
        ));
    }

    #[test]
    fn state_changing_operations() {
        assert!(fence().changes_state());
        assert!(!Request::Status.changes_state());
        assert_eq!(
            serde_json::to_value(Request::GetDocument {
                kind: DocKind::Nodes,
                revision: None
            })
            .unwrap(),
            json!({"op": "get_document", "kind": "nodes"})
        );
    }
}
