//! Sessions (every ownership transition's guarded write) and legs.

use super::{text, Queries};
use crate::error::EngineError;
use crate::shard::rows::{session_at, SessionRow, SESSION_COLUMNS};
use crate::store::{Store, Value};

impl<S: Store> Queries<'_, S> {
    pub(crate) fn session(&self, id: &str) -> Result<Option<SessionRow>, EngineError> {
        let sql = concat!(
            "SELECT ",
            session_cols!(),
            " FROM sessions WHERE call_session_id = ?"
        );
        self.run(sql, &[id.into()])?
            .first()
            .map(|r| session_at(r, 0))
            .transpose()
    }

    /// Up to `limit` session ids after `after`, in id order (the paged read).
    pub(crate) fn session_ids_after(
        &self,
        after: &str,
        limit: u32,
    ) -> Result<Vec<String>, EngineError> {
        Ok(self
            .run(
                "SELECT call_session_id FROM sessions WHERE call_session_id > ? ORDER BY call_session_id LIMIT ?",
                &[after.into(), Value::Int(i64::from(limit))],
            )?
            .iter()
            .filter_map(|r| text(r, 0))
            .collect())
    }

    /// A session and the session its leg belongs to, in one read.
    pub(crate) fn session_with_leg(
        &self,
        id: &str,
        call_control_id: &str,
    ) -> Result<Option<(SessionRow, Option<String>)>, EngineError> {
        let sql = concat!("SELECT ", session_cols!(), ", (SELECT call_session_id FROM legs WHERE call_control_id = ?) FROM sessions WHERE call_session_id = ?");
        let rows = self.run(sql, &[call_control_id.into(), id.into()])?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        Ok(Some((session_at(row, 0)?, text(row, SESSION_COLUMNS))))
    }

    /// Reads back the session an ownership write changed: `None` when its
    /// guard (the `WHERE`) did not hold.
    fn write_session(
        &self,
        sql: &str,
        params: &[Value],
    ) -> Result<Option<SessionRow>, EngineError> {
        self.run(sql, params)?
            .first()
            .map(|r| session_at(r, 0))
            .transpose()
    }

    /// Gives a session an owner at `epoch`. From unowned (`from_epoch`
    /// `None`): guarded on no owner, no fence, not ended. From owned at
    /// `from_epoch` (a reassignment): guarded on that epoch, no fence, an
    /// inbound session and no ambiguous outcome at `from_epoch`.
    pub(crate) fn own_session(
        &self,
        id: &str,
        from_epoch: Option<u64>,
        node: &str,
        epoch: u64,
        origin: &str,
        now_ms: i64,
    ) -> Result<Option<SessionRow>, EngineError> {
        let sql = match from_epoch {
            None => concat!("UPDATE sessions SET state = 'assigned', owner = ?, epoch = ?, origin_url = ?, updated_at = ? \
             WHERE call_session_id = ? AND owner IS NULL AND fence_node IS NULL AND state != 'ended' RETURNING ", session_cols!()),
            Some(_) => concat!("UPDATE sessions SET state = 'assigned', owner = ?, epoch = ?, origin_url = ?, updated_at = ? \
             WHERE call_session_id = ? AND ", movable!(), " RETURNING ", session_cols!()),
        };
        let mut params = vec![
            node.into(),
            epoch.into(),
            origin.into(),
            Value::Int(now_ms),
            id.into(),
        ];
        params.extend(from_epoch.map(Value::from));
        self.write_session(sql, &params)
    }

    /// Owned at `from_epoch` back to unowned (no node is eligible): the same
    /// guard as a reassignment in [`Self::own_session`]; the epoch stays as evidence.
    pub(crate) fn release_session(
        &self,
        id: &str,
        from_epoch: u64,
        now_ms: i64,
    ) -> Result<Option<SessionRow>, EngineError> {
        let sql = concat!("UPDATE sessions SET state = 'pending_assignment', owner = NULL, origin_url = NULL, updated_at = ? \
             WHERE call_session_id = ? AND ", movable!(), " RETURNING ", session_cols!());
        self.write_session(sql, &[Value::Int(now_ms), id.into(), from_epoch.into()])
    }

    /// Grants the fence: guarded on no fence yet, the owner and epoch, and a
    /// session that has not ended.
    pub(crate) fn fence_session(
        &self,
        id: &str,
        node: &str,
        epoch: u64,
        command_id: &str,
        now_ms: i64,
    ) -> Result<Option<SessionRow>, EngineError> {
        let sql = concat!("UPDATE sessions SET fence_node = ?, fence_epoch = ?, fence_at = ?, command_id = ?, \
             state = CASE WHEN state = 'assigned' THEN 'answered' ELSE state END, updated_at = ? \
             WHERE call_session_id = ? AND fence_node IS NULL AND owner = ? AND epoch = ? AND state != 'ended' RETURNING ", session_cols!());
        self.write_session(
            sql,
            &[
                node.into(),
                epoch.into(),
                Value::Int(now_ms),
                command_id.into(),
                Value::Int(now_ms),
                id.into(),
                node.into(),
                epoch.into(),
            ],
        )
    }

    /// Settles an owned session as `ended` once every leg has hung up:
    /// guarded on an owner, not already ended, and no open leg.
    pub(crate) fn end_session(
        &self,
        id: &str,
        now_ms: i64,
    ) -> Result<Option<SessionRow>, EngineError> {
        let sql = concat!("UPDATE sessions SET state = 'ended', settled_at = ?2, updated_at = ?2 \
             WHERE call_session_id = ?1 AND owner IS NOT NULL AND state != 'ended' \
             AND NOT EXISTS (SELECT 1 FROM legs WHERE call_session_id = ?1 AND state != 'hungup') RETURNING ", session_cols!());
        self.write_session(sql, &[id.into(), Value::Int(now_ms)])
    }

    /// Records that an outcome at `epoch` was ambiguous: the session never
    /// moves at that epoch. Guarded on `epoch` being the current one.
    pub(crate) fn mark_session_ambiguous(&self, id: &str, epoch: u64) -> Result<(), EngineError> {
        self.run(
            "UPDATE sessions SET ambiguous_epoch = ? WHERE call_session_id = ? AND epoch = ?",
            &[epoch.into(), id.into(), epoch.into()],
        )?;
        Ok(())
    }

    /// Settles every open session created at or before `created_by` as
    /// `max_duration`.
    pub(crate) fn settle_expired(&self, created_by: i64, now_ms: i64) -> Result<(), EngineError> {
        self.run(
            concat!("UPDATE sessions SET state = 'max_duration', settled_at = ?, updated_at = ? WHERE state IN ", open_states!(), " AND created_at <= ?"),
            &[Value::Int(now_ms), Value::Int(now_ms), Value::Int(created_by)],
        )?;
        Ok(())
    }

    /// Settles every open session of a silent owner as `node_lost`.
    pub(crate) fn settle_lost(&self, owner: &str, now_ms: i64) -> Result<(), EngineError> {
        self.run(
            concat!("UPDATE sessions SET state = 'node_lost', settled_at = ?, updated_at = ? WHERE owner = ? AND state IN ", open_states!()),
            &[Value::Int(now_ms), Value::Int(now_ms), owner.into()],
        )?;
        Ok(())
    }

    /// Owners of open sessions.
    pub(crate) fn open_owners(&self) -> Result<Vec<String>, EngineError> {
        Ok(self
            .run("SELECT node FROM node_load WHERE open_calls > 0", &[])?
            .iter()
            .filter_map(|r| text(r, 0))
            .collect())
    }

    /// Deletes an unowned session once nothing of it is parked.
    pub(crate) fn forget_unowned(&self, session: &str) -> Result<(), EngineError> {
        self.run(
            "DELETE FROM sessions WHERE call_session_id = ? AND owner IS NULL",
            &[session.into()],
        )?;
        Ok(())
    }

    /// Open sessions (for the status counts).
    pub(crate) fn count_open_sessions(&self) -> Result<i64, EngineError> {
        Ok(self
            .first_int("SELECT COALESCE(SUM(open_calls), 0) FROM node_load", &[])?
            .unwrap_or(0))
    }

    // ---- legs --------------------------------------------------------------

    /// The session a leg belongs to, if the leg was seen before.
    pub(crate) fn leg_session(&self, call_control_id: &str) -> Result<Option<String>, EngineError> {
        Ok(self
            .run(
                "SELECT call_session_id FROM legs WHERE call_control_id = ?",
                &[call_control_id.into()],
            )?
            .first()
            .and_then(|r| text(r, 0)))
    }

    /// Records a leg, and its new lifecycle state (`answered`, `hungup`) if
    /// the event changes it; a hung-up leg stays hung up.
    pub(crate) fn track_leg(
        &self,
        call_control_id: &str,
        session: &str,
        state: Option<&str>,
        now_ms: i64,
    ) -> Result<(), EngineError> {
        self.run(
            "INSERT INTO legs (call_control_id, call_session_id, state, updated_at) VALUES (?, ?, ?, ?) \
             ON CONFLICT (call_control_id) DO UPDATE SET state = excluded.state, updated_at = excluded.updated_at \
             WHERE legs.state != 'hungup' AND excluded.state != 'open'",
            &[
                call_control_id.into(),
                session.into(),
                state.unwrap_or("open").into(),
                Value::Int(now_ms),
            ],
        )?;
        Ok(())
    }

    /// The legs of a session (for the call view).
    pub(crate) fn legs_of(&self, session: &str) -> Result<Vec<(String, String)>, EngineError> {
        Ok(self
            .run(
                "SELECT call_control_id, state FROM legs WHERE call_session_id = ? ORDER BY updated_at",
                &[session.into()],
            )?
            .iter()
            .map(|r| (text(r, 0).unwrap_or_default(), text(r, 1).unwrap_or_default()))
            .collect())
    }
}
