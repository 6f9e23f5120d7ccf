-- callfence Dispatcher schema, release 4. Additions only (SPEC §10): the
-- previous release keeps working on this schema.
--
-- table_rows: the sessions table's row count, so that a new session is
-- checked against SESSION_CAP (SPEC §9) in the statement that inserts it
-- instead of counting the table. The triggers keep it equal to the count on
-- every insert and delete, whichever release makes the write; the backfill
-- counts what is stored when this migration runs.
-- Trigger bodies keep their inner statements on one line: the migration
-- runner splits statements at semicolons that end a line.
CREATE TABLE IF NOT EXISTS table_rows (
  name TEXT PRIMARY KEY,
  rows INTEGER NOT NULL
);
DELETE FROM table_rows;
INSERT INTO table_rows (name, rows) SELECT 'sessions', COUNT(*) FROM sessions;
CREATE TRIGGER IF NOT EXISTS sessions_rows_insert AFTER INSERT ON sessions
  BEGIN UPDATE table_rows SET rows = rows + 1 WHERE name = 'sessions'; END;
CREATE TRIGGER IF NOT EXISTS sessions_rows_delete AFTER DELETE ON sessions
  BEGIN UPDATE table_rows SET rows = rows - 1 WHERE name = 'sessions'; END;
-- sessions_settled: the sessions the row cap may evict (ended, or settled
-- node_lost / max_duration without a fence), oldest first: a new session at
-- the cap finds the oldest one in one seek however many live rows there are.
-- The WHERE is the engine's `settled!` clause, word for word, so that SQLite
-- uses this partial index for it.
CREATE INDEX IF NOT EXISTS sessions_settled ON sessions (updated_at)
  WHERE (state = 'ended' OR (state IN ('node_lost', 'max_duration') AND fence_node IS NULL));
