//! Every business refusal the Dispatcher answers, and the one place where
//! each becomes an HTTP status, a stable code, a `Retry-After` and its body
//! fields: exhaustive `match`es, with no catch-all arm and no status chosen
//! by comparing code strings. The Dispatcher encodes a [`Refusal`] on the
//! wire; the Worker relays it, and uses the same type for the answers it
//! gives on the Dispatcher's behalf (an early `delivery_unknown`, a call
//! still moving after the hop limit).

use crate::protocol;
use callfence_core::document::DocKind;
use callfence_core::engine::{DocError, EngineError, FenceRefusal, MediaRefusal, PendingReason};
use callfence_core::problem::Problem;
use callfence_core::wire::{ClaimRefusal, ClaimRefused, FenceRefused, MediaInvalid};
use serde_json::{json, Value as Json};

/// Every business refusal of the Dispatcher.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// The (node, key id) is not in the current registry (401 `unknown_node_key`).
    UnknownNodeKey,
    /// A heartbeat's `seq` is not greater than the last accepted (409 `stale_seq`).
    StaleSeq,
    /// A malformed heartbeat (400 `invalid_heartbeat`).
    InvalidHeartbeat(String),
    /// A node or preview body that does not parse (400 `bad_request`).
    BadRequest(String),
    /// The media keys are not configured (503 `misconfigured`, `node_routes`).
    MediaKeysMissing,
    /// A fence refused (409 `{"granted":false,"reason"}`).
    Fence(FenceRefusal),
    /// A media token refused (409 `{"valid":false,"reason"}`).
    Media(MediaRefusal),
    /// A claim refused (409 `{"claimed":false,"reason"}`: `already_owned`,
    /// `capacity_exhausted`).
    Claim(ClaimRefusal),
    /// A new session at `SESSION_CAP` with only live sessions stored (503
    /// `storage_full`, `Retry-After`).
    StorageFull,
    /// A webhook body that is not a Telnyx event (400 `bad_envelope`).
    BadEnvelope,
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

/// `Retry-After` of `storage_full`: room comes back as calls end and
/// settle, not within the second.
pub const STORAGE_FULL_RETRY_S: u32 = 5;

/// A document refusal (every [`DocError`] but the engine's own failure).
#[derive(Debug, Clone, PartialEq)]
pub enum DocumentRefusal {
    /// 428 `precondition_required`.
    PreconditionRequired,
    /// 400 `bad_precondition`.
    BadPrecondition,
    /// 412 `revision_conflict`.
    RevisionConflict(u64),
    /// 400 `invalid_document`: the body is not a JSON object.
    InvalidJson,
    /// 400 `invalid_document` with every problem.
    InvalidDocument(Vec<Problem>),
    /// 409 `node_in_use`.
    NodeInUse(String),
    /// 404 `no_policy` / `no_nodes`.
    Absent(DocKind),
    /// 404 `unknown_revision`.
    UnknownRevision,
}

impl Refusal {
    /// The HTTP status.
    pub fn status(&self) -> u16 {
        match self {
            Refusal::UnknownNodeKey => 401,
            Refusal::StaleSeq | Refusal::Fence(_) | Refusal::Media(_) | Refusal::Claim(_) => 409,
            Refusal::InvalidHeartbeat(_) | Refusal::BadRequest(_) | Refusal::BadEnvelope => 400,
            Refusal::MediaKeysMissing
            | Refusal::InProgress
            | Refusal::Overloaded
            | Refusal::Pending(_)
            | Refusal::Reassigned
            | Refusal::DeliveryUnknown
            | Refusal::StorageFull => 503,
            Refusal::UnknownCall | Refusal::NoPolicy => 404,
            Refusal::RateLimited(_) => 429,
            Refusal::Document(d) => match d {
                DocumentRefusal::PreconditionRequired => 428,
                DocumentRefusal::BadPrecondition
                | DocumentRefusal::InvalidJson
                | DocumentRefusal::InvalidDocument(_) => 400,
                DocumentRefusal::RevisionConflict(_) => 412,
                DocumentRefusal::NodeInUse(_) => 409,
                DocumentRefusal::Absent(_) | DocumentRefusal::UnknownRevision => 404,
            },
        }
    }

    /// The stable error code.
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::UnknownNodeKey => "unknown_node_key",
            Refusal::StaleSeq => "stale_seq",
            Refusal::InvalidHeartbeat(_) => "invalid_heartbeat",
            Refusal::BadRequest(_) => "bad_request",
            Refusal::MediaKeysMissing => "misconfigured",
            Refusal::Fence(r) => r.code(),
            Refusal::Media(r) => r.code(),
            Refusal::Claim(r) => r.code(),
            Refusal::StorageFull => "storage_full",
            Refusal::BadEnvelope => "bad_envelope",
            Refusal::InProgress => "in_progress",
            Refusal::Overloaded => "overloaded",
            Refusal::RateLimited(_) => "rate_limited",
            Refusal::Pending(reason) => reason.code(),
            Refusal::Reassigned => "reassigned",
            Refusal::DeliveryUnknown => "delivery_unknown",
            Refusal::UnknownCall => "unknown_call",
            Refusal::NoPolicy => "no_policy",
            Refusal::Document(d) => match d {
                DocumentRefusal::PreconditionRequired => "precondition_required",
                DocumentRefusal::BadPrecondition => "bad_precondition",
                DocumentRefusal::RevisionConflict(_) => "revision_conflict",
                DocumentRefusal::InvalidJson | DocumentRefusal::InvalidDocument(_) => {
                    "invalid_document"
                }
                DocumentRefusal::NodeInUse(_) => "node_in_use",
                DocumentRefusal::Absent(kind) => kind.absent_code(),
                DocumentRefusal::UnknownRevision => "unknown_revision",
            },
        }
    }

    /// `Retry-After` in seconds: the carrier or panel should come back soon.
    pub fn retry_after_s(&self) -> Option<u32> {
        match self {
            Refusal::Pending(PendingReason::NoPolicy | PendingReason::NoEligibleNode)
            | Refusal::NoPolicy
            | Refusal::Overloaded => Some(1),
            Refusal::RateLimited(seconds) => Some(*seconds),
            Refusal::StorageFull => Some(STORAGE_FULL_RETRY_S),
            Refusal::UnknownNodeKey
            | Refusal::StaleSeq
            | Refusal::InvalidHeartbeat(_)
            | Refusal::BadRequest(_)
            | Refusal::MediaKeysMissing
            | Refusal::Fence(_)
            | Refusal::Media(_)
            | Refusal::Claim(_)
            | Refusal::BadEnvelope
            | Refusal::InProgress
            | Refusal::Reassigned
            | Refusal::DeliveryUnknown
            | Refusal::Document(_)
            | Refusal::UnknownCall => None,
        }
    }

    /// The body's fields besides `error`.
    fn fields(&self) -> Json {
        match self {
            Refusal::InvalidHeartbeat(detail) | Refusal::BadRequest(detail) => {
                json!({"detail": detail})
            }
            Refusal::MediaKeysMissing => json!({"capability": "node_routes"}),
            Refusal::Fence(r) => json!(FenceRefused::from(*r)),
            Refusal::Media(r) => json!(MediaInvalid::from(*r)),
            Refusal::Claim(r) => json!(ClaimRefused::from(*r)),
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
            Refusal::RateLimited(seconds) => json!({"retry_after_s": seconds}),
            _ => Json::Null,
        }
    }

    /// The refusal on the wire.
    pub fn encode(&self) -> String {
        protocol::encode_refused(
            self.status(),
            self.code(),
            self.retry_after_s(),
            self.fields(),
        )
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
    use crate::protocol::{decode_reply, Reply, View};

    #[test]
    fn every_refusal_has_a_status_its_code_and_retry_only_when_parked() {
        let all = [
            Refusal::UnknownNodeKey,
            Refusal::StaleSeq,
            Refusal::InvalidHeartbeat("x".into()),
            Refusal::BadRequest("x".into()),
            Refusal::MediaKeysMissing,
            Refusal::Fence(FenceRefusal::StaleEpoch),
            Refusal::Media(MediaRefusal::Expired),
            Refusal::Claim(ClaimRefusal::AlreadyOwned),
            Refusal::Claim(ClaimRefusal::CapacityExhausted),
            Refusal::StorageFull,
            Refusal::BadEnvelope,
            Refusal::InProgress,
            Refusal::Overloaded,
            Refusal::RateLimited(4),
            Refusal::Pending(PendingReason::NoEligibleNode),
            Refusal::Reassigned,
            Refusal::DeliveryUnknown,
            Refusal::Document(DocumentRefusal::RevisionConflict(3)),
            Refusal::UnknownCall,
            Refusal::NoPolicy,
        ];
        for refusal in all {
            let reply = decode_reply::<View>(200, refusal.encode().as_bytes()).unwrap();
            let Reply::Refused(r) = reply else {
                panic!("{refusal:?}")
            };
            assert_eq!(r.status, refusal.status());
            assert_eq!(r.body["error"], refusal.code());
            let parked = matches!(
                refusal,
                Refusal::Pending(_)
                    | Refusal::NoPolicy
                    | Refusal::Overloaded
                    | Refusal::RateLimited(_)
                    | Refusal::StorageFull
            );
            assert_eq!(r.retry_after_s.is_some(), parked, "{refusal:?}");
        }
        assert_eq!(
            Refusal::Fence(FenceRefusal::NotOwner).body(),
            json!({"error": "not_owner", "granted": false, "reason": "not_owner"})
        );
        assert_eq!(
            Refusal::Claim(ClaimRefusal::CapacityExhausted).body(),
            json!({"error": "capacity_exhausted", "claimed": false, "reason": "capacity_exhausted"})
        );
    }
}
