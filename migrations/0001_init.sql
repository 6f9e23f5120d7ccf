-- callfence Dispatcher schema, release 1.
-- Expand-only: later migrations add tables, columns and indexes; none drops or
-- renames, so the previous release keeps working against a newer schema.
-- Times are Unix milliseconds; epochs and revisions stay below 2^53.

-- Versioned documents (kind 'policy' or 'nodes'); the newest 50 revisions of
-- each kind are kept. body is the canonical JSON without its revision field.
CREATE TABLE IF NOT EXISTS documents (
  kind TEXT NOT NULL,
  revision INTEGER NOT NULL,
  body TEXT NOT NULL,
  written_at INTEGER NOT NULL,
  writer_fp TEXT NOT NULL,
  PRIMARY KEY (kind, revision)
);

-- Named integers: 'epoch' (the one global epoch counter), 'decision' (the
-- decision id counter), 'event_seq' (arrival order), 'last_webhook_at'.
CREATE TABLE IF NOT EXISTS counters (
  name TEXT PRIMARY KEY,
  value INTEGER NOT NULL
);

-- The last accepted heartbeat of each node, with its stored answer so that a
-- byte-identical re-send gets the same reply.
CREATE TABLE IF NOT EXISTS heartbeats (
  node TEXT PRIMARY KEY,
  seq INTEGER NOT NULL,
  body TEXT NOT NULL,
  body_sha256 TEXT NOT NULL,
  received_at INTEGER NOT NULL,
  signed_at INTEGER NOT NULL,
  answer TEXT NOT NULL
);

-- Forward health per node: recent_forward_failure is a failure within 30 s
-- with no delivery since.
CREATE TABLE IF NOT EXISTS node_health (
  node TEXT PRIMARY KEY,
  last_failure_at INTEGER,
  last_delivery_at INTEGER
);

-- Call sessions and their ownership. state: pending_assignment, assigned,
-- answered, ended, node_lost, max_duration. caller and called are the
-- normalised from/to of the first event, kept to re-resolve on reassignment.
-- ambiguous_epoch is the epoch at which an outcome was ever unknown: the
-- session never moves at that epoch.
CREATE TABLE IF NOT EXISTS sessions (
  call_session_id TEXT PRIMARY KEY,
  state TEXT NOT NULL,
  owner TEXT,
  epoch INTEGER,
  origin_url TEXT,
  direction TEXT,
  caller TEXT,
  called TEXT,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  fence_node TEXT,
  fence_epoch INTEGER,
  fence_at INTEGER,
  command_id TEXT,
  settled_at INTEGER,
  ambiguous_epoch INTEGER
);
CREATE INDEX IF NOT EXISTS sessions_by_owner ON sessions (owner, state);
CREATE INDEX IF NOT EXISTS sessions_by_age ON sessions (updated_at);

-- Legs (call_control_id) seen for each session. state: open, answered, hungup.
CREATE TABLE IF NOT EXISTS legs (
  call_control_id TEXT PRIMARY KEY,
  call_session_id TEXT NOT NULL,
  state TEXT NOT NULL,
  updated_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS legs_by_session ON legs (call_session_id);

-- The event ledger, deduplicated on Telnyx's data.id. state: pending_assignment,
-- queued, forwarding, delivered, unknown, unroutable, ignored, rejected.
-- body and headers are the first delivery's raw body and Telnyx headers; node
-- and epoch are those of the latest attempt; pending_until closes the parking
-- window of a pending_assignment event.
CREATE TABLE IF NOT EXISTS events (
  event_id TEXT PRIMARY KEY,
  seq INTEGER NOT NULL,
  call_session_id TEXT,
  call_control_id TEXT,
  event_type TEXT NOT NULL,
  state TEXT NOT NULL,
  body TEXT NOT NULL,
  headers TEXT NOT NULL,
  received_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  node TEXT,
  epoch INTEGER,
  attempts INTEGER NOT NULL DEFAULT 0,
  pending_until INTEGER,
  lease_until INTEGER,
  next_try_at INTEGER,
  redrives INTEGER NOT NULL DEFAULT 0,
  result_status INTEGER,
  result_body TEXT
);
CREATE INDEX IF NOT EXISTS events_by_session ON events (call_session_id, seq);
CREATE INDEX IF NOT EXISTS events_by_due ON events (state, next_try_at);
CREATE INDEX IF NOT EXISTS events_by_age ON events (updated_at);

-- Routing decisions with their evidence (JSON), newest 10,000 kept.
CREATE TABLE IF NOT EXISTS decisions (
  decision_id INTEGER PRIMARY KEY,
  at INTEGER NOT NULL,
  call_session_id TEXT,
  event_id TEXT,
  body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS decisions_by_session ON decisions (call_session_id, decision_id);
