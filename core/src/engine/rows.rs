//! Sessions, legs and ledger events as rows: reading them back from SQL and
//! the small guarded writes every transition is built from.

use super::{Engine, EngineError};
use crate::store::{Row, Store, Value};

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
}

/// SQL list of the states that count toward the owner's capacity.
pub(crate) const OPEN_STATES: &str = "('assigned', 'answered')";

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

#[derive(Debug, Clone)]
pub(crate) struct EventRow {
    pub event_id: String,
    pub call_session_id: Option<String>,
    pub call_control_id: Option<String>,
    pub event_type: String,
    pub state: String,
    pub body: String,
    pub headers: Vec<(String, String)>,
    pub received_at_ms: i64,
    pub epoch: Option<u64>,
    pub attempts: u32,
    pub lease_until_ms: Option<i64>,
    pub redrives: u32,
    pub result_status: Option<u16>,
    pub node: Option<String>,
    pub pending_until_ms: Option<i64>,
}

pub(crate) const SESSION_COLUMNS: &str = "call_session_id, state, owner, epoch, origin_url, direction, caller, called, created_at, fence_node, fence_epoch, fence_at, command_id, ambiguous_epoch";

pub(crate) const EVENT_COLUMNS: &str = "event_id, call_session_id, call_control_id, event_type, state, body, headers, received_at, epoch, attempts, lease_until, redrives, result_status, node, pending_until";

fn text(row: &Row, i: usize) -> Option<String> {
    row.get(i).and_then(Value::as_text).map(str::to_owned)
}

fn int(row: &Row, i: usize) -> Option<i64> {
    row.get(i).and_then(Value::as_int)
}

fn corrupt(what: &str) -> EngineError {
    EngineError::Corrupt(what.to_owned())
}

pub(crate) fn session_from_row(row: &Row) -> Result<SessionRow, EngineError> {
    let fence = match (text(row, 9), int(row, 10), int(row, 11), text(row, 12)) {
        (Some(node), Some(epoch), Some(at_ms), Some(command_id)) => Some(FenceRow {
            node,
            epoch: epoch as u64,
            at_ms,
            command_id,
        }),
        _ => None,
    };
    Ok(SessionRow {
        id: text(row, 0).ok_or_else(|| corrupt("session id"))?,
        state: SessionState::parse(&text(row, 1).ok_or_else(|| corrupt("session state"))?),
        owner: text(row, 2),
        epoch: int(row, 3).map(|e| e as u64),
        origin_url: text(row, 4),
        direction: text(row, 5),
        caller: text(row, 6),
        called: text(row, 7),
        created_at_ms: int(row, 8).unwrap_or(0),
        fence,
        ambiguous_epoch: int(row, 13).map(|e| e as u64),
    })
}

pub(crate) fn event_from_row(row: &Row) -> Result<EventRow, EngineError> {
    let headers = text(row, 6)
        .and_then(|h| serde_json::from_str::<Vec<(String, String)>>(&h).ok())
        .ok_or_else(|| corrupt("event headers"))?;
    Ok(EventRow {
        event_id: text(row, 0).ok_or_else(|| corrupt("event id"))?,
        call_session_id: text(row, 1),
        call_control_id: text(row, 2),
        event_type: text(row, 3).unwrap_or_default(),
        state: text(row, 4).ok_or_else(|| corrupt("event state"))?,
        body: text(row, 5).ok_or_else(|| corrupt("event body"))?,
        headers,
        received_at_ms: int(row, 7).unwrap_or(0),
        epoch: int(row, 8).map(|e| e as u64),
        attempts: int(row, 9).unwrap_or(0) as u32,
        lease_until_ms: int(row, 10),
        redrives: int(row, 11).unwrap_or(0) as u32,
        result_status: int(row, 12).map(|s| s as u16),
        node: text(row, 13),
        pending_until_ms: int(row, 14),
    })
}

impl<S: Store> Engine<S> {
    pub(crate) fn load_session(&self, id: &str) -> Result<Option<SessionRow>, EngineError> {
        let sql = format!("SELECT {SESSION_COLUMNS} FROM sessions WHERE call_session_id = ?");
        self.exec(&sql, &[id.into()])?
            .first()
            .map(session_from_row)
            .transpose()
    }

    pub(crate) fn load_event(&self, id: &str) -> Result<Option<EventRow>, EngineError> {
        let sql = format!("SELECT {EVENT_COLUMNS} FROM events WHERE event_id = ?");
        self.exec(&sql, &[id.into()])?
            .first()
            .map(event_from_row)
            .transpose()
    }

    /// The session a leg belongs to, if the leg was seen before.
    pub(crate) fn session_of_leg(
        &self,
        call_control_id: &str,
    ) -> Result<Option<String>, EngineError> {
        let rows = self.exec(
            "SELECT call_session_id FROM legs WHERE call_control_id = ?",
            &[call_control_id.into()],
        )?;
        Ok(rows.first().and_then(|r| text(r, 0)))
    }

    /// Events of a session in one of `states`, oldest first.
    pub(crate) fn session_events(
        &self,
        session: &str,
        states: &[&str],
    ) -> Result<Vec<EventRow>, EngineError> {
        let placeholders = vec!["?"; states.len()].join(", ");
        let sql = format!(
            "SELECT {EVENT_COLUMNS} FROM events WHERE call_session_id = ? AND state IN ({placeholders}) ORDER BY seq"
        );
        let mut params: Vec<Value> = vec![session.into()];
        params.extend(states.iter().map(|s| Value::from(*s)));
        self.exec(&sql, &params)?
            .iter()
            .map(event_from_row)
            .collect()
    }

    pub(crate) fn set_event_state(
        &self,
        event_id: &str,
        state: &str,
        now_ms: i64,
    ) -> Result<(), EngineError> {
        self.exec(
            "UPDATE events SET state = ?, updated_at = ? WHERE event_id = ?",
            &[state.into(), Value::Int(now_ms), event_id.into()],
        )?;
        Ok(())
    }
}
