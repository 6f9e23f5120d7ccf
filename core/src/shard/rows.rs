//! Sessions, legs and ledger events as the engine reads them back from SQL.
//! The statements that read and write them are in [`super::queries`]; the
//! transitions of a session's ownership are in [`super::ownership`].

use super::EngineError;
use crate::store::{Row, Value};

/// The states a session can be in. Unknown states written by a newer release
/// are kept as text and treated as owned-and-open where that is safe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SessionState {
    PendingAssignment,
    Assigned,
    Answered,
    Ended,
    NodeLost,
    MaxDuration,
    Other(String),
}

impl SessionState {
    pub(crate) fn parse(text: &str) -> Self {
        match text {
            "pending_assignment" => Self::PendingAssignment,
            "assigned" => Self::Assigned,
            "answered" => Self::Answered,
            "ended" => Self::Ended,
            "node_lost" => Self::NodeLost,
            "max_duration" => Self::MaxDuration,
            other => Self::Other(other.to_owned()),
        }
    }

    pub(crate) fn as_str(&self) -> &str {
        match self {
            Self::PendingAssignment => "pending_assignment",
            Self::Assigned => "assigned",
            Self::Answered => "answered",
            Self::Ended => "ended",
            Self::NodeLost => "node_lost",
            Self::MaxDuration => "max_duration",
            Self::Other(s) => s,
        }
    }

    /// Counts toward the owner's capacity (the SQL twin is
    /// `open_states!` in [`super::queries`]).
    pub(crate) fn is_open(&self) -> bool {
        matches!(self, Self::Assigned | Self::Answered)
    }
}

/// The fence of a session, once granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FenceRow {
    pub node: String,
    pub epoch: u64,
    pub at_ms: i64,
    pub command_id: String,
}

#[derive(Debug, Clone)]
pub(crate) struct SessionRow {
    pub id: String,
    pub state: SessionState,
    pub owner: Option<String>,
    pub epoch: Option<u64>,
    pub origin_url: Option<String>,
    pub direction: Option<String>,
    pub caller: Option<String>,
    pub called: Option<String>,
    pub created_at_ms: i64,
    pub fence: Option<FenceRow>,
    pub ambiguous_epoch: Option<u64>,
}

impl SessionRow {
    pub(crate) fn is_outgoing(&self) -> bool {
        self.direction.as_deref() == Some("outgoing")
    }

    /// True when this session counts toward `node`'s open calls.
    pub(crate) fn loads(&self, node: &str) -> bool {
        self.state.is_open() && self.owner.as_deref() == Some(node)
    }
}

/// Event states in the ledger.
pub(crate) mod event_state {
    pub const PENDING: &str = "pending_assignment";
    pub const QUEUED: &str = "queued";
    pub const FORWARDING: &str = "forwarding";
    pub const DELIVERED: &str = "delivered";
    pub const UNKNOWN: &str = "unknown";
    pub const UNROUTABLE: &str = "unroutable";
    pub const IGNORED: &str = "ignored";
    pub const REJECTED: &str = "rejected";
}

/// The stored raw body and Telnyx headers of an event: read only when the
/// event is (re-)forwarded.
#[derive(Debug, Clone)]
pub(crate) struct Payload {
    pub body: String,
    pub headers: Vec<(String, String)>,
}

#[derive(Debug, Clone)]
pub(crate) struct EventRow {
    pub event_id: String,
    pub call_session_id: Option<String>,
    pub call_control_id: Option<String>,
    pub event_type: String,
    pub state: String,
    pub received_at_ms: i64,
    pub epoch: Option<u64>,
    pub attempts: u32,
    pub lease_until_ms: Option<i64>,
    pub redrives: u32,
    pub result_status: Option<u16>,
    pub node: Option<String>,
    pub pending_until_ms: Option<i64>,
}

/// The columns [`event_at`] reads, in order.
pub(crate) const EVENT_COLUMNS: usize = 13;
/// The columns [`session_at`] reads, in order.
pub(crate) const SESSION_COLUMNS: usize = 14;

fn text(row: &Row, i: usize) -> Option<String> {
    row.get(i).and_then(Value::as_text).map(str::to_owned)
}

fn int(row: &Row, i: usize) -> Option<i64> {
    row.get(i).and_then(Value::as_int)
}

fn corrupt(what: &str) -> EngineError {
    EngineError::Corrupt(what.to_owned())
}

/// A session from the columns of [`super::queries`]' session list,
/// starting at column `at`.
pub(crate) fn session_at(row: &Row, at: usize) -> Result<SessionRow, EngineError> {
    let fence = match (
        text(row, at + 9),
        int(row, at + 10),
        int(row, at + 11),
        text(row, at + 12),
    ) {
        (Some(node), Some(epoch), Some(at_ms), Some(command_id)) => Some(FenceRow {
            node,
            epoch: epoch as u64,
            at_ms,
            command_id,
        }),
        _ => None,
    };
    Ok(SessionRow {
        id: text(row, at).ok_or_else(|| corrupt("session id"))?,
        state: SessionState::parse(&text(row, at + 1).ok_or_else(|| corrupt("session state"))?),
        owner: text(row, at + 2),
        epoch: int(row, at + 3).map(|e| e as u64),
        origin_url: text(row, at + 4),
        direction: text(row, at + 5),
        caller: text(row, at + 6),
        called: text(row, at + 7),
        created_at_ms: int(row, at + 8).unwrap_or(0),
        fence,
        ambiguous_epoch: int(row, at + 13).map(|e| e as u64),
    })
}

/// An event from the columns of [`super::queries`]' event list, starting at
/// column `at`.
pub(crate) fn event_at(row: &Row, at: usize) -> Result<EventRow, EngineError> {
    Ok(EventRow {
        event_id: text(row, at).ok_or_else(|| corrupt("event id"))?,
        call_session_id: text(row, at + 1),
        call_control_id: text(row, at + 2),
        event_type: text(row, at + 3).unwrap_or_default(),
        state: text(row, at + 4).ok_or_else(|| corrupt("event state"))?,
        received_at_ms: int(row, at + 5).unwrap_or(0),
        epoch: int(row, at + 6).map(|e| e as u64),
        attempts: int(row, at + 7).unwrap_or(0) as u32,
        lease_until_ms: int(row, at + 8),
        redrives: int(row, at + 9).unwrap_or(0) as u32,
        result_status: int(row, at + 10).map(|s| s as u16),
        node: text(row, at + 11),
        pending_until_ms: int(row, at + 12),
    })
}

/// A payload from two columns (body, headers JSON) starting at `at`.
pub(crate) fn payload_at(row: &Row, at: usize) -> Result<Payload, EngineError> {
    let headers = text(row, at + 1)
        .and_then(|h| serde_json::from_str::<Vec<(String, String)>>(&h).ok())
        .ok_or_else(|| corrupt("event headers"))?;
    Ok(Payload {
        body: text(row, at).ok_or_else(|| corrupt("event body"))?,
        headers,
    })
}
