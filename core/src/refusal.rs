//! Every refusal the edge answers, and the one table of them: each one's
//! stable code (the body's `error`), HTTP status, `Retry-After` and body
//! fields. The Worker turns a [`Refusal`] into a response in one place and
//! the Dispatcher encodes one on its wire; nothing else spells a code.
//! `docs/openapi.yaml` is checked against [`Refusal::every`] by
//! `core/tests/refusal_docs.rs`.

use crate::document::DocKind;
use crate::engine::{DocError, EngineError, HeartbeatRefusal, PendingReason};
use crate::heartbeat::HeartbeatError;
use crate::node_auth::NodeAuthError;
use crate::probe::ProbeError;
use crate::problem::Problem;
use crate::telnyx::{EnvelopeError, SignatureError};
use crate::wire::{
    BadRequest, ClaimRefusal, ClaimRefused, FenceRefusal, FenceRefused, MediaInvalid, MediaRefusal,
};
use serde_json::{json, Value as Json};

/// `Retry-After` of `storage_full`: room comes back as calls end and
/// settle, not within the second.
pub const STORAGE_FULL_RETRY_S: u32 = 5;

/// A refusal: nothing was stored or changed, and the caller gets
/// `{"error": code, ...fields}` with [`Refusal::status`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Refusal {
    /// No such route (404 `not_found`).
    NotFound,
    /// The route has no such method (405 `method_not_allowed`; the Worker
    /// adds `Allow` with these methods).
    MethodNotAllowed(Vec<&'static str>),
    /// The body is over the route's limit (413 `payload_too_large`, with
    /// `limit_bytes`).
    PayloadTooLarge(usize),
    /// The route's capability is not configured (503 `misconfigured`, with
    /// `capability`).
    Misconfigured(&'static str),
    /// No valid bearer (401 `unauthorized`; the Worker adds
    /// `WWW-Authenticate: Bearer`).
    Unauthorized,
    /// A policy token on an operator-only route (403 `forbidden`).
    Forbidden,
    /// The body could not be read (400 `bad_body`).
    BadBody,
    /// A query parameter that does not parse (400 `bad_request`, with
    /// `parameter`).
    BadParameter(String),
    /// A node or preview body that does not parse (400 `bad_request`, with
    /// `detail`).
    BadRequest(String),
    /// The Dispatcher gave no well-formed answer of its own (503
    /// `dispatcher_unavailable`, `Retry-After: 1`).
    DispatcherUnavailable,
    /// The Worker could not build its own answer (500 `internal`).
    Internal,
    /// A webhook's Telnyx signature refused (401).
    Signature(SignatureError),
    /// A webhook body that is not a Telnyx event (400 `bad_envelope`).
    BadEnvelope,
    /// A node signature refused (401).
    NodeAuth(NodeAuthError),
    /// A probe request refused (400 `bad_request` or `bad_nonce`).
    Probe(ProbeError),
    /// A malformed heartbeat (400 `invalid_heartbeat`, with `detail`).
    InvalidHeartbeat(String),
    /// A heartbeat's `seq` is not greater than the last accepted (409
    /// `stale_seq`).
    StaleSeq,
    /// A fence refused (409 `{"granted":false,"reason"}`).
    Fence(FenceRefusal),
    /// A media token refused (409 `{"valid":false,"reason"}`).
    Media(MediaRefusal),
    /// A claim refused (409 `{"claimed":false,"reason"}`).
    Claim(ClaimRefusal),
    /// A new session at `SESSION_CAP` with only live sessions stored (503
    /// `storage_full`, `Retry-After: 5`).
    StorageFull,
    /// An attempt's lease is live (503 `in_progress`).
    InProgress,
    /// The Dispatcher is shedding load (503 `overloaded`, `Retry-After: 1`).
    Overloaded,
    /// A node probed again within the probe interval, or claimed over its
    /// token bucket (429 `rate_limited`, with the seconds to wait as
    /// `Retry-After` and `retry_after_s`).
    RateLimited(u32),
    /// Parked (503 `no_policy` / `no_eligible_node`, `Retry-After: 1`).
    Pending(PendingReason),
    /// The session moved and the alarm delivers (503 `reassigned`).
    Reassigned,
    /// The outcome is unknown (503 `delivery_unknown`).
    DeliveryUnknown,
    /// A document read or write refused.
    Document(DocumentRefusal),
    /// No such call (404 `unknown_call`).
    UnknownCall,
    /// A preview with no policy (404 `no_policy`).
    NoPolicy,
}

/// A document refusal (every [`DocError`] but the engine's own failure).
#[derive(Debug, Clone, PartialEq)]
pub enum DocumentRefusal {
    /// 428 `precondition_required`.
    PreconditionRequired,
    /// 400 `bad_precondition`.
    BadPrecondition,
    /// 412 `revision_conflict`, with `current_revision`.
    RevisionConflict(u64),
    /// 400 `invalid_document`: the body is not a JSON object.
    InvalidJson,
    /// 400 `invalid_document` with every problem.
    InvalidDocument(Vec<Problem>),
    /// 409 `node_in_use`, with `node`.
    NodeInUse(String),
    /// 404 `no_policy` / `no_nodes`.
    Absent(DocKind),
    /// 404 `unknown_revision`.
    UnknownRevision,
}

impl Refusal {
    /// The stable code, the body's `error`.
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::NotFound => "not_found",
            Refusal::MethodNotAllowed(_) => "method_not_allowed",
            Refusal::PayloadTooLarge(_) => "payload_too_large",
            Refusal::Misconfigured(_) => "misconfigured",
            Refusal::Unauthorized => "unauthorized",
            Refusal::Forbidden => "forbidden",
            Refusal::BadBody => "bad_body",
            Refusal::BadParameter(_)
            | Refusal::BadRequest(_)
            | Refusal::Probe(ProbeError::BadRequest) => "bad_request",
            Refusal::Probe(ProbeError::BadNonce) => "bad_nonce",
            Refusal::DispatcherUnavailable => "dispatcher_unavailable",
            Refusal::Internal => "internal",
            Refusal::Signature(SignatureError::MissingSignature) => "missing_signature",
            Refusal::Signature(SignatureError::BadSignature) => "bad_signature",
            Refusal::Signature(SignatureError::StaleTimestamp)
            | Refusal::NodeAuth(NodeAuthError::StaleTimestamp) => "stale_timestamp",
            Refusal::BadEnvelope => "bad_envelope",
            Refusal::NodeAuth(NodeAuthError::BadNodeSignature) => "bad_node_signature",
            Refusal::NodeAuth(NodeAuthError::UnknownNodeKey) => "unknown_node_key",
            Refusal::InvalidHeartbeat(_) => "invalid_heartbeat",
            Refusal::StaleSeq => "stale_seq",
            Refusal::Fence(FenceRefusal::StaleEpoch) | Refusal::Media(MediaRefusal::StaleEpoch) => {
                "stale_epoch"
            }
            Refusal::Fence(FenceRefusal::NotOwner) | Refusal::Media(MediaRefusal::NotOwner) => {
                "not_owner"
            }
            Refusal::Fence(FenceRefusal::CallEnded) | Refusal::Media(MediaRefusal::CallEnded) => {
                "call_ended"
            }
            Refusal::Fence(FenceRefusal::UnknownCall) | Refusal::UnknownCall => "unknown_call",
            Refusal::Media(MediaRefusal::BadToken) => "bad_token",
            Refusal::Media(MediaRefusal::Expired) => "expired",
            Refusal::Media(MediaRefusal::NotFenced) => "not_fenced",
            Refusal::Claim(ClaimRefusal::AlreadyOwned) => "already_owned",
            Refusal::Claim(ClaimRefusal::CapacityExhausted) => "capacity_exhausted",
            Refusal::StorageFull => "storage_full",
            Refusal::InProgress => "in_progress",
            Refusal::Overloaded => "overloaded",
            Refusal::RateLimited(_) => "rate_limited",
            Refusal::Pending(PendingReason::NoPolicy)
            | Refusal::NoPolicy
            | Refusal::Document(DocumentRefusal::Absent(DocKind::Policy)) => "no_policy",
            Refusal::Pending(PendingReason::NoEligibleNode) => "no_eligible_node",
            Refusal::Reassigned => "reassigned",
            Refusal::DeliveryUnknown => "delivery_unknown",
            Refusal::Document(d) => match d {
                DocumentRefusal::PreconditionRequired => "precondition_required",
                DocumentRefusal::BadPrecondition => "bad_precondition",
                DocumentRefusal::RevisionConflict(_) => "revision_conflict",
                DocumentRefusal::InvalidJson | DocumentRefusal::InvalidDocument(_) => {
                    "invalid_document"
                }
                DocumentRefusal::NodeInUse(_) => "node_in_use",
                DocumentRefusal::Absent(DocKind::Nodes) => "no_nodes",
                DocumentRefusal::Absent(DocKind::Policy) => "no_policy",
                // The shard map is never absent (one shard at revision 0).
                DocumentRefusal::UnknownRevision | DocumentRefusal::Absent(DocKind::Shards) => {
                    "unknown_revision"
                }
            },
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> u16 {
        match self {
            Refusal::BadBody
            | Refusal::BadParameter(_)
            | Refusal::BadRequest(_)
            | Refusal::BadEnvelope
            | Refusal::Probe(_)
            | Refusal::InvalidHeartbeat(_) => 400,
            Refusal::Unauthorized | Refusal::Signature(_) | Refusal::NodeAuth(_) => 401,
            Refusal::Forbidden => 403,
            Refusal::NotFound | Refusal::UnknownCall | Refusal::NoPolicy => 404,
            Refusal::MethodNotAllowed(_) => 405,
            Refusal::StaleSeq | Refusal::Fence(_) | Refusal::Media(_) | Refusal::Claim(_) => 409,
            Refusal::PayloadTooLarge(_) => 413,
            Refusal::RateLimited(_) => 429,
            Refusal::Internal => 500,
            Refusal::Misconfigured(_)
            | Refusal::DispatcherUnavailable
            | Refusal::StorageFull
            | Refusal::InProgress
            | Refusal::Overloaded
            | Refusal::Pending(_)
            | Refusal::Reassigned
            | Refusal::DeliveryUnknown => 503,
            Refusal::Document(d) => match d {
                DocumentRefusal::BadPrecondition
                | DocumentRefusal::InvalidJson
                | DocumentRefusal::InvalidDocument(_) => 400,
                DocumentRefusal::Absent(_) | DocumentRefusal::UnknownRevision => 404,
                DocumentRefusal::NodeInUse(_) => 409,
                DocumentRefusal::RevisionConflict(_) => 412,
                DocumentRefusal::PreconditionRequired => 428,
            },
        }
    }

    /// `Retry-After` in seconds: the carrier or panel should come back soon.
    pub fn retry_after_s(&self) -> Option<u32> {
        match self {
            Refusal::Pending(_)
            | Refusal::NoPolicy
            | Refusal::Overloaded
            | Refusal::DispatcherUnavailable => Some(1),
            Refusal::RateLimited(seconds) => Some(*seconds),
            Refusal::StorageFull => Some(STORAGE_FULL_RETRY_S),
            _ => None,
        }
    }

    /// The body's fields besides `error`.
    pub fn fields(&self) -> Json {
        match self {
            Refusal::PayloadTooLarge(limit) => json!({"limit_bytes": limit}),
            Refusal::Misconfigured(capability) => json!({"capability": capability}),
            Refusal::BadParameter(name) => json!({"parameter": name}),
            Refusal::InvalidHeartbeat(detail) | Refusal::BadRequest(detail) => {
                json!({"detail": detail})
            }
            Refusal::Fence(r) => json!(FenceRefused::from(*r)),
            Refusal::Media(r) => json!(MediaInvalid::from(*r)),
            Refusal::Claim(r) => json!(ClaimRefused::from(*r)),
            Refusal::RateLimited(seconds) => json!({"retry_after_s": seconds}),
            Refusal::Document(DocumentRefusal::RevisionConflict(current)) => {
                json!({"current_revision": current})
            }
            Refusal::Document(DocumentRefusal::InvalidJson) => {
                json!({"details": [{"path": "", "problem": "the body is not a JSON object"}]})
            }
            Refusal::Document(DocumentRefusal::InvalidDocument(details)) => {
                json!({"details": details})
            }
            Refusal::Document(DocumentRefusal::NodeInUse(node)) => json!({"node": node}),
            _ => Json::Null,
        }
    }

    /// The body the caller gets: `{"error": code, ...fields}`.
    pub fn body(&self) -> Json {
        let mut body = match self.fields() {
            Json::Object(map) => map,
            _ => serde_json::Map::new(),
        };
        body.insert("error".into(), Json::from(self.code()));
        Json::Object(body)
    }

    /// One refusal of every kind (every code at every status it is
    /// answered with), for the checks that tie the codes to the docs.
    pub fn every() -> Vec<Refusal> {
        let mut all = vec![
            Refusal::NotFound,
            Refusal::MethodNotAllowed(vec!["GET"]),
            Refusal::PayloadTooLarge(4096),
            Refusal::Misconfigured("admin"),
            Refusal::Unauthorized,
            Refusal::Forbidden,
            Refusal::BadBody,
            Refusal::BadParameter("limit".into()),
            Refusal::BadRequest("x".into()),
            Refusal::DispatcherUnavailable,
            Refusal::Internal,
            Refusal::BadEnvelope,
            Refusal::InvalidHeartbeat("x".into()),
            Refusal::StaleSeq,
            Refusal::StorageFull,
            Refusal::InProgress,
            Refusal::Overloaded,
            Refusal::RateLimited(1),
            Refusal::Reassigned,
            Refusal::DeliveryUnknown,
            Refusal::UnknownCall,
            Refusal::NoPolicy,
        ];
        all.extend(
            [
                SignatureError::MissingSignature,
                SignatureError::BadSignature,
                SignatureError::StaleTimestamp,
            ]
            .map(Refusal::Signature),
        );
        all.extend(
            [
                NodeAuthError::BadNodeSignature,
                NodeAuthError::UnknownNodeKey,
                NodeAuthError::StaleTimestamp,
            ]
            .map(Refusal::NodeAuth),
        );
        all.extend([ProbeError::BadRequest, ProbeError::BadNonce].map(Refusal::Probe));
        all.extend(
            [
                FenceRefusal::StaleEpoch,
                FenceRefusal::NotOwner,
                FenceRefusal::CallEnded,
                FenceRefusal::UnknownCall,
            ]
            .map(Refusal::Fence),
        );
        all.extend(
            [
                MediaRefusal::BadToken,
                MediaRefusal::Expired,
                MediaRefusal::NotOwner,
                MediaRefusal::StaleEpoch,
                MediaRefusal::NotFenced,
                MediaRefusal::CallEnded,
            ]
            .map(Refusal::Media),
        );
        all.extend(
            [ClaimRefusal::AlreadyOwned, ClaimRefusal::CapacityExhausted].map(Refusal::Claim),
        );
        all.extend([PendingReason::NoPolicy, PendingReason::NoEligibleNode].map(Refusal::Pending));
        all.extend(
            [
                DocumentRefusal::PreconditionRequired,
                DocumentRefusal::BadPrecondition,
                DocumentRefusal::RevisionConflict(1),
                DocumentRefusal::InvalidJson,
                DocumentRefusal::InvalidDocument(Vec::new()),
                DocumentRefusal::NodeInUse("M1".into()),
                DocumentRefusal::Absent(DocKind::Policy),
                DocumentRefusal::Absent(DocKind::Nodes),
                DocumentRefusal::UnknownRevision,
            ]
            .map(Refusal::Document),
        );
        all
    }
}

impl From<SignatureError> for Refusal {
    fn from(e: SignatureError) -> Self {
        Refusal::Signature(e)
    }
}

impl From<EnvelopeError> for Refusal {
    fn from(_: EnvelopeError) -> Self {
        Refusal::BadEnvelope
    }
}

impl From<NodeAuthError> for Refusal {
    fn from(e: NodeAuthError) -> Self {
        Refusal::NodeAuth(e)
    }
}

impl From<ProbeError> for Refusal {
    fn from(e: ProbeError) -> Self {
        Refusal::Probe(e)
    }
}

impl From<HeartbeatError> for Refusal {
    fn from(e: HeartbeatError) -> Self {
        Refusal::InvalidHeartbeat(e.to_string())
    }
}

impl From<BadRequest> for Refusal {
    fn from(e: BadRequest) -> Self {
        Refusal::BadRequest(e.0)
    }
}

impl Refusal {
    /// The refusal for a refused heartbeat, or the engine's own failure.
    pub fn of_heartbeat(refused: HeartbeatRefusal) -> Result<Self, EngineError> {
        Ok(match refused {
            HeartbeatRefusal::Engine(e) => return Err(e),
            HeartbeatRefusal::Invalid(detail) => Refusal::InvalidHeartbeat(detail),
            HeartbeatRefusal::StaleSeq => Refusal::StaleSeq,
            HeartbeatRefusal::UnknownNode => Refusal::NodeAuth(NodeAuthError::UnknownNodeKey),
        })
    }
}

impl DocumentRefusal {
    /// The refusal for a document error, or the engine's own failure.
    pub fn from_error(error: DocError) -> Result<Self, EngineError> {
        Ok(match error {
            DocError::Engine(e) => return Err(e),
            DocError::PreconditionRequired => DocumentRefusal::PreconditionRequired,
            DocError::BadPrecondition => DocumentRefusal::BadPrecondition,
            DocError::RevisionConflict { current_revision } => {
                DocumentRefusal::RevisionConflict(current_revision)
            }
            DocError::InvalidJson => DocumentRefusal::InvalidJson,
            DocError::InvalidDocument(details) => DocumentRefusal::InvalidDocument(details),
            DocError::NodeInUse { node } => DocumentRefusal::NodeInUse(node),
            DocError::Absent(kind) => DocumentRefusal::Absent(kind),
            DocError::UnknownRevision => DocumentRefusal::UnknownRevision,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Names the variant of `r`. Its `match` has no catch-all, so a new
    /// variant does not compile until it is named here: name it, and add
    /// one of it to [`Refusal::every`], or the test below fails.
    fn variant(r: &Refusal) -> &'static str {
        match r {
            Refusal::NotFound => "NotFound",
            Refusal::MethodNotAllowed(_) => "MethodNotAllowed",
            Refusal::PayloadTooLarge(_) => "PayloadTooLarge",
            Refusal::Misconfigured(_) => "Misconfigured",
            Refusal::Unauthorized => "Unauthorized",
            Refusal::Forbidden => "Forbidden",
            Refusal::BadBody => "BadBody",
            Refusal::BadParameter(_) => "BadParameter",
            Refusal::BadRequest(_) => "BadRequest",
            Refusal::DispatcherUnavailable => "DispatcherUnavailable",
            Refusal::Internal => "Internal",
            Refusal::Signature(_) => "Signature",
            Refusal::BadEnvelope => "BadEnvelope",
            Refusal::NodeAuth(_) => "NodeAuth",
            Refusal::Probe(_) => "Probe",
            Refusal::InvalidHeartbeat(_) => "InvalidHeartbeat",
            Refusal::StaleSeq => "StaleSeq",
            Refusal::Fence(_) => "Fence",
            Refusal::Media(_) => "Media",
            Refusal::Claim(_) => "Claim",
            Refusal::StorageFull => "StorageFull",
            Refusal::InProgress => "InProgress",
            Refusal::Overloaded => "Overloaded",
            Refusal::RateLimited(_) => "RateLimited",
            Refusal::Pending(_) => "Pending",
            Refusal::Reassigned => "Reassigned",
            Refusal::DeliveryUnknown => "DeliveryUnknown",
            Refusal::Document(_) => "Document",
            Refusal::UnknownCall => "UnknownCall",
            Refusal::NoPolicy => "NoPolicy",
        }
    }

    #[test]
    fn every_lists_each_variant() {
        let listed: BTreeSet<_> = Refusal::every().iter().map(variant).collect();
        assert_eq!(listed.len(), 30, "{listed:?}");
    }

    #[test]
    fn a_body_is_its_code_and_fields() {
        assert_eq!(
            Refusal::Fence(FenceRefusal::NotOwner).body(),
            json!({"error": "not_owner", "granted": false, "reason": "not_owner"})
        );
        assert_eq!(
            Refusal::Claim(ClaimRefusal::CapacityExhausted).body(),
            json!({"error": "capacity_exhausted", "claimed": false, "reason": "capacity_exhausted"})
        );
        assert_eq!(
            Refusal::PayloadTooLarge(4096).body(),
            json!({"error": "payload_too_large", "limit_bytes": 4096})
        );
        assert_eq!(Refusal::NotFound.body(), json!({"error": "not_found"}));
    }

    #[test]
    fn a_wire_reason_is_its_refusal_code() {
        for r in Refusal::every() {
            if let Some(reason) = r.fields().get("reason") {
                assert_eq!(reason, r.code(), "{r:?}");
            }
        }
    }

    #[test]
    fn retry_after_only_where_the_caller_should_come_back() {
        for r in Refusal::every() {
            let soon = matches!(
                r,
                Refusal::Pending(_)
                    | Refusal::NoPolicy
                    | Refusal::Overloaded
                    | Refusal::RateLimited(_)
                    | Refusal::StorageFull
                    | Refusal::DispatcherUnavailable
            );
            assert_eq!(r.retry_after_s().is_some(), soon, "{r:?}");
        }
    }
}
