//! The durable webhook ledger (`ledger.sqlite3` in the state directory).
//!
//! An event is written `received` (with its raw body and Telnyx headers)
//! before the voice app is called, and `completed` (with the app's status and
//! answer; the body is then dropped) only when the app answered 2xx or 4xx
//! other than 408/429. `received` entries are re-delivered after a restart.
//! The ledger also remembers which sessions this node admitted (a drained or
//! shadow node keeps serving those) and which legs are open (for
//! `drain --shed`). Rows are pruned by age.
//!
//! The schema is versioned with SQLite's `user_version` ([`SCHEMA_VERSION`]):
//! opening an older ledger migrates it step by step; a ledger from a newer
//! agent is refused, so the agent does not start on state it cannot read.
//!
//! # Invariants
//!
//! 1. An event reaches `completed` at most once, and a completed event is
//!    never delivered to the app again.
//! 2. No event is delivered to the app before its `received` row is durable
//!    (WAL, `synchronous = FULL`).

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension};

use crate::AgentError;

/// The file name inside the state directory.
pub const FILE: &str = "ledger.sqlite3";

/// The schema, one step per version: step `i` takes a ledger from version
/// `i` to `i + 1` (SQLite's `user_version`). Version 0 is a new file, or a
/// ledger written before the schema was versioned, whose tables are those of
/// version 1 (hence `IF NOT EXISTS`). Steps are only ever appended.
const MIGRATIONS: &[&str] = &["CREATE TABLE IF NOT EXISTS events (
        event_id TEXT PRIMARY KEY,
        call_session_id TEXT NOT NULL,
        call_control_id TEXT,
        epoch INTEGER NOT NULL,
        event_type TEXT,
        state TEXT NOT NULL CHECK (state IN ('received', 'completed')),
        body BLOB NOT NULL,
        headers TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        status INTEGER,
        content_type TEXT,
        response BLOB,
        received_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
    );
    CREATE INDEX IF NOT EXISTS events_by_state ON events (state, updated_at);
    CREATE TABLE IF NOT EXISTS sessions (
        call_session_id TEXT PRIMARY KEY,
        epoch INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
    );
    CREATE TABLE IF NOT EXISTS legs (
        call_control_id TEXT PRIMARY KEY,
        call_session_id TEXT,
        open INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
    );"];

/// The schema version this agent writes and reads.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// Brings the ledger at `path` to [`SCHEMA_VERSION`], each step in a
/// transaction of its own with its version, and refuses a ledger written by
/// a newer agent (it could not read it safely, and must not change it).
fn migrate(conn: &mut Connection, path: &Path) -> Result<(), AgentError> {
    let found: u32 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(sql_err)?;
    if found > SCHEMA_VERSION {
        return Err(AgentError::new(format!(
            "ledger {} has schema version {found}, newer than this agent's {SCHEMA_VERSION}: \
             it was written by a newer callfence-agent; run that version (or move the file \
             aside, losing its unfinished deliveries)",
            path.display()
        )));
    }
    for (from, step) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        let tx = conn.transaction().map_err(sql_err)?;
        tx.execute_batch(step).map_err(sql_err)?;
        tx.pragma_update(None, "user_version", from as u32 + 1)
            .map_err(sql_err)?;
        tx.commit().map_err(sql_err)?;
    }
    Ok(())
}

/// Completed rows kept at most (the oldest beyond are pruned).
const MAX_COMPLETED_ROWS: i64 = 100_000;

/// A recorded answer of the app.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// `content-type`, if any.
    pub content_type: Option<String>,
    /// Body (bounded by the proxy).
    pub body: Vec<u8>,
}

/// An event waiting for (re-)delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// Event id.
    pub event_id: String,
    /// Session.
    pub call_session_id: String,
    /// Leg, if the assertion named one.
    pub call_control_id: Option<String>,
    /// Epoch from the assertion.
    pub epoch: u64,
    /// `data.event_type`, when the body had one.
    pub event_type: Option<String>,
    /// Raw body.
    pub body: Vec<u8>,
    /// Forwarded Telnyx headers `(name, value)`.
    pub headers: Vec<(String, String)>,
    /// Deliveries attempted so far.
    pub attempts: u32,
}

/// What the ledger knows about one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// Never seen.
    Absent,
    /// Written, not yet answered by the app.
    Received(Pending),
    /// Answered; the recorded answer.
    Completed(Answer),
}

/// The ledger. Methods block on SQLite; async callers use `spawn_blocking`.
#[derive(Debug)]
pub struct Ledger {
    conn: Mutex<Connection>,
}

fn sql_err(e: rusqlite::Error) -> AgentError {
    AgentError::new(format!("ledger: {e}"))
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Ledger {
    /// Opens (creating if needed) the ledger in `state_dir`.
    pub fn open(state_dir: &Path) -> Result<Ledger, AgentError> {
        Self::open_path(&state_dir.join(FILE))
    }

    /// Opens a ledger file.
    pub fn open_path(path: &Path) -> Result<Ledger, AgentError> {
        let mut conn = Connection::open(path).map_err(sql_err)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(sql_err)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(sql_err)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(sql_err)?;
        migrate(&mut conn, path)?;
        Ok(Ledger {
            conn: Mutex::new(conn),
        })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Looks an event up.
    pub fn lookup(&self, event_id: &str) -> Result<Entry, AgentError> {
        let conn = self.conn();
        let row = conn
            .query_row(
                "SELECT state, call_session_id, call_control_id, epoch, event_type, body, headers,
                        attempts, status, content_type, response
                 FROM events WHERE event_id = ?1",
                params![event_id],
                |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, Option<String>>(2)?,
                        r.get::<_, i64>(3)?,
                        r.get::<_, Option<String>>(4)?,
                        r.get::<_, Vec<u8>>(5)?,
                        r.get::<_, String>(6)?,
                        r.get::<_, i64>(7)?,
                        r.get::<_, Option<i64>>(8)?,
                        r.get::<_, Option<String>>(9)?,
                        r.get::<_, Option<Vec<u8>>>(10)?,
                    ))
                },
            )
            .optional()
            .map_err(sql_err)?;
        let Some((
            state,
            session,
            ccid,
            epoch,
            event_type,
            body,
            headers,
            attempts,
            status,
            ctype,
            response,
        )) = row
        else {
            return Ok(Entry::Absent);
        };
        if state == "completed" {
            return Ok(Entry::Completed(Answer {
                status: status.and_then(|s| u16::try_from(s).ok()).unwrap_or(200),
                content_type: ctype,
                body: response.unwrap_or_default(),
            }));
        }
        Ok(Entry::Received(Pending {
            event_id: event_id.to_string(),
            call_session_id: session,
            call_control_id: ccid,
            epoch: u64::try_from(epoch).unwrap_or(0),
            event_type,
            body,
            headers: serde_json::from_str(&headers).unwrap_or_default(),
            attempts: u32::try_from(attempts).unwrap_or(u32::MAX),
        }))
    }

    /// Writes a new `received` event and admits its session, in one
    /// transaction. Returns false when the event already existed.
    pub fn insert_received(&self, p: &Pending, now_ms: i64) -> Result<bool, AgentError> {
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(sql_err)?;
        let headers = serde_json::to_string(&p.headers).unwrap_or_else(|_| "[]".into());
        let inserted = tx
            .execute(
                "INSERT OR IGNORE INTO events (event_id, call_session_id, call_control_id, epoch,
                     event_type, state, body, headers, attempts, received_at, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, 'received', ?6, ?7, 0, ?8, ?8)",
                params![
                    p.event_id,
                    p.call_session_id,
                    p.call_control_id,
                    to_i64(p.epoch),
                    p.event_type,
                    p.body,
                    headers,
                    now_ms
                ],
            )
            .map_err(sql_err)?;
        tx.execute(
            "INSERT INTO sessions (call_session_id, epoch, updated_at) VALUES (?1, ?2, ?3)
             ON CONFLICT (call_session_id) DO UPDATE SET epoch = max(epoch, excluded.epoch), updated_at = excluded.updated_at",
            params![p.call_session_id, to_i64(p.epoch), now_ms],
        )
        .map_err(sql_err)?;
        tx.commit().map_err(sql_err)?;
        Ok(inserted == 1)
    }

    /// True when this node admitted the session before.
    pub fn is_admitted(&self, call_session_id: &str) -> Result<bool, AgentError> {
        self.conn()
            .query_row(
                "SELECT 1 FROM sessions WHERE call_session_id = ?1",
                params![call_session_id],
                |_| Ok(()),
            )
            .optional()
            .map(|r| r.is_some())
            .map_err(sql_err)
    }

    /// How many events are `received` and how many `completed` (the
    /// ledger's depth, for [`crate::metrics`]).
    pub fn depth(&self) -> Result<(u64, u64), AgentError> {
        self.conn()
            .query_row(
                "SELECT COALESCE(SUM(state = 'received'), 0), COALESCE(SUM(state = 'completed'), 0) FROM events",
                [],
                |row| Ok((row.get::<_, i64>(0)?, row.get::<_, i64>(1)?)),
            )
            .map(|(r, c)| (r.unsigned_abs(), c.unsigned_abs()))
            .map_err(sql_err)
    }

    /// Counts one delivery attempt.
    pub fn count_attempt(&self, event_id: &str, now_ms: i64) -> Result<(), AgentError> {
        self.conn()
            .execute(
                "UPDATE events SET attempts = attempts + 1, updated_at = ?2 WHERE event_id = ?1 AND state = 'received'",
                params![event_id, now_ms],
            )
            .map(|_| ())
            .map_err(sql_err)
    }

    /// Records the app's answer; the raw body is dropped. Returns false when
    /// the event was not `received` (already completed or pruned).
    pub fn complete(
        &self,
        event_id: &str,
        answer: &Answer,
        now_ms: i64,
    ) -> Result<bool, AgentError> {
        self.conn()
            .execute(
                "UPDATE events SET state = 'completed', status = ?2, content_type = ?3, response = ?4,
                     body = x'', updated_at = ?5
                 WHERE event_id = ?1 AND state = 'received'",
                params![event_id, i64::from(answer.status), answer.content_type, answer.body, now_ms],
            )
            .map(|n| n == 1)
            .map_err(sql_err)
    }

    /// Every `received` event, oldest first.
    pub fn pending(&self) -> Result<Vec<Pending>, AgentError> {
        let ids: Vec<String> = {
            let conn = self.conn();
            let mut stmt = conn
                .prepare("SELECT event_id FROM events WHERE state = 'received' ORDER BY received_at, event_id LIMIT 10000")
                .map_err(sql_err)?;
            let rows = stmt
                .query_map([], |r| r.get::<_, String>(0))
                .map_err(sql_err)?;
            rows.collect::<Result<_, _>>().map_err(sql_err)?
        };
        let mut out = Vec::new();
        for id in ids {
            if let Entry::Received(p) = self.lookup(&id)? {
                out.push(p);
            }
        }
        Ok(out)
    }

    /// Records a leg as open (`open = true`) or ended.
    pub fn note_leg(
        &self,
        call_control_id: &str,
        call_session_id: Option<&str>,
        open: bool,
        now_ms: i64,
    ) -> Result<(), AgentError> {
        self.conn()
            .execute(
                "INSERT INTO legs (call_control_id, call_session_id, open, updated_at) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (call_control_id) DO UPDATE SET
                     call_session_id = coalesce(excluded.call_session_id, call_session_id),
                     open = CASE WHEN legs.open = 0 THEN 0 ELSE excluded.open END,
                     updated_at = excluded.updated_at",
                params![call_control_id, call_session_id, open, now_ms],
            )
            .map(|_| ())
            .map_err(sql_err)
    }

    /// Legs seen and not hung up: `(call_control_id, call_session_id)`.
    pub fn open_legs(&self) -> Result<Vec<(String, Option<String>)>, AgentError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare("SELECT call_control_id, call_session_id FROM legs WHERE open = 1 ORDER BY updated_at LIMIT 10000")
            .map_err(sql_err)?;
        let rows = stmt
            .query_map([], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?))
            })
            .map_err(sql_err)?;
        rows.collect::<Result<_, _>>().map_err(sql_err)
    }

    /// Deletes rows not changed for `retention_ms`, and completed rows beyond
    /// the cap. Returns how many events went.
    pub fn prune(&self, now_ms: i64, retention_ms: i64) -> Result<usize, AgentError> {
        let cutoff = now_ms.saturating_sub(retention_ms);
        let conn = self.conn();
        let mut n = conn
            .execute("DELETE FROM events WHERE updated_at < ?1", params![cutoff])
            .map_err(sql_err)?;
        n += conn
            .execute(
                "DELETE FROM events WHERE event_id IN (SELECT event_id FROM events WHERE state = 'completed'
                     ORDER BY updated_at DESC LIMIT -1 OFFSET ?1)",
                params![MAX_COMPLETED_ROWS],
            )
            .map_err(sql_err)?;
        conn.execute(
            "DELETE FROM sessions WHERE updated_at < ?1",
            params![cutoff],
        )
        .map_err(sql_err)?;
        conn.execute("DELETE FROM legs WHERE updated_at < ?1", params![cutoff])
            .map_err(sql_err)?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::test_dir;

    fn pending(id: &str) -> Pending {
        Pending {
            event_id: id.into(),
            call_session_id: "s1".into(),
            call_control_id: Some("v3:c1".into()),
            epoch: 4,
            event_type: Some("call.initiated".into()),
            body: b"{\"data\":{}}".to_vec(),
            headers: vec![("telnyx-timestamp".into(), "1".into())],
            attempts: 0,
        }
    }

    #[test]
    fn received_then_completed_and_never_twice() {
        let dir = test_dir("ledger");
        let l = Ledger::open(&dir).unwrap();
        assert_eq!(l.lookup("e1").unwrap(), Entry::Absent);
        assert!(!l.is_admitted("s1").unwrap());
        assert_eq!(l.depth().unwrap(), (0, 0));
        assert!(l.insert_received(&pending("e1"), 10).unwrap());
        assert!(!l.insert_received(&pending("e1"), 11).unwrap());
        assert!(l.is_admitted("s1").unwrap());
        assert_eq!(l.depth().unwrap(), (1, 0));
        l.count_attempt("e1", 12).unwrap();
        match l.lookup("e1").unwrap() {
            Entry::Received(p) => {
                assert_eq!(p.attempts, 1);
                assert_eq!(p.headers, pending("e1").headers);
            }
            other => panic!("{other:?}"),
        }
        let ans = Answer {
            status: 200,
            content_type: Some("application/json".into()),
            body: b"{}".to_vec(),
        };
        assert!(l.complete("e1", &ans, 13).unwrap());
        assert!(!l.complete("e1", &ans, 14).unwrap());
        assert_eq!(l.depth().unwrap(), (0, 1));
        assert_eq!(l.lookup("e1").unwrap(), Entry::Completed(ans));
        assert!(l.pending().unwrap().is_empty());
    }

    #[test]
    fn received_entries_survive_reopen_and_prune_by_age() {
        let dir = test_dir("ledger2");
        {
            let l = Ledger::open(&dir).unwrap();
            l.insert_received(&pending("e1"), 10).unwrap();
            l.insert_received(&pending("e2"), 1_000).unwrap();
        }
        let l = Ledger::open(&dir).unwrap();
        let ids: Vec<_> = l
            .pending()
            .unwrap()
            .into_iter()
            .map(|p| p.event_id)
            .collect();
        assert_eq!(ids, ["e1", "e2"]);
        assert_eq!(l.prune(1_010, 500).unwrap(), 1);
        assert_eq!(l.lookup("e1").unwrap(), Entry::Absent);
    }

    fn user_version(path: &Path) -> u32 {
        Connection::open(path)
            .unwrap()
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap()
    }

    #[test]
    fn a_new_ledger_has_the_current_version_and_reopening_keeps_it() {
        let dir = test_dir("ledger-version");
        drop(Ledger::open(&dir).unwrap());
        assert_eq!(SCHEMA_VERSION, 1);
        assert_eq!(user_version(&dir.join(FILE)), SCHEMA_VERSION);
        let l = Ledger::open(&dir).unwrap();
        l.insert_received(&pending("e1"), 10).unwrap();
        drop(l);
        assert_eq!(user_version(&dir.join(FILE)), SCHEMA_VERSION);
    }

    #[test]
    fn an_unversioned_ledger_migrates_and_keeps_its_entries() {
        // The file as agents wrote it before the schema had a version.
        let dir = test_dir("ledger-v0");
        let path = dir.join(FILE);
        {
            let old = Connection::open(&path).unwrap();
            old.execute_batch(MIGRATIONS[0]).unwrap();
            old.execute(
                "INSERT INTO events (event_id, call_session_id, epoch, state, body, headers, received_at, updated_at)
                 VALUES ('e-old', 's-old', 3, 'received', x'7b7d', '[]', 5, 5)",
                [],
            )
            .unwrap();
            old.execute(
                "INSERT INTO sessions (call_session_id, epoch, updated_at) VALUES ('s-old', 3, 5)",
                [],
            )
            .unwrap();
        }
        assert_eq!(user_version(&path), 0);
        let l = Ledger::open(&dir).unwrap();
        assert_eq!(user_version(&path), SCHEMA_VERSION);
        assert!(l.is_admitted("s-old").unwrap());
        let pending = l.pending().unwrap();
        assert_eq!(pending.len(), 1);
        assert_eq!(
            (pending[0].event_id.as_str(), pending[0].epoch),
            ("e-old", 3)
        );
    }

    #[test]
    fn a_ledger_from_a_newer_agent_is_refused_and_left_alone() {
        let dir = test_dir("ledger-newer");
        let path = dir.join(FILE);
        drop(Ledger::open(&dir).unwrap());
        Connection::open(&path)
            .unwrap()
            .pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
        let err = Ledger::open(&dir).unwrap_err();
        assert!(
            err.0
                .contains(&format!("schema version {}", SCHEMA_VERSION + 1))
                && err.0.contains("newer callfence-agent"),
            "{err}"
        );
        assert_eq!(user_version(&path), SCHEMA_VERSION + 1);
    }

    #[test]
    fn legs_close_for_good() {
        let dir = test_dir("ledger3");
        let l = Ledger::open(&dir).unwrap();
        l.note_leg("c1", Some("s1"), true, 1).unwrap();
        l.note_leg("c2", None, true, 1).unwrap();
        l.note_leg("c2", None, false, 2).unwrap();
        l.note_leg("c2", None, true, 3).unwrap();
        assert_eq!(
            l.open_legs().unwrap(),
            vec![("c1".to_string(), Some("s1".to_string()))]
        );
    }
}
