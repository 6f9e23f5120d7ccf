-- callfence Dispatcher schema, release 2. Additions only (SPEC §10): the
-- previous release keeps working on this schema.
--
-- node_load: the open calls (sessions 'assigned' or 'answered') of each
-- owner, so that a routing decision reads one row per candidate instead of
-- counting sessions (a cost that grew with the open calls). The triggers
-- below keep it equal to that count on every write to sessions, whichever
-- release makes the write: the previous release (which knows nothing of
-- node_load) maintains it too, so a rollback and roll-forward cannot leave
-- it drifted. The backfill counts what is open when this migration runs.
-- Trigger bodies keep their inner statements on one line: the migration
-- runner splits statements at semicolons that end a line.
CREATE TABLE IF NOT EXISTS node_load (
  node TEXT PRIMARY KEY,
  open_calls INTEGER NOT NULL
);
DELETE FROM node_load;
INSERT INTO node_load (node, open_calls)
  SELECT owner, COUNT(*) FROM sessions
  WHERE owner IS NOT NULL AND state IN ('assigned', 'answered') GROUP BY owner;
CREATE TRIGGER IF NOT EXISTS node_load_insert AFTER INSERT ON sessions
  WHEN NEW.owner IS NOT NULL AND NEW.state IN ('assigned', 'answered')
  BEGIN INSERT INTO node_load (node, open_calls) VALUES (NEW.owner, 1) ON CONFLICT (node) DO UPDATE SET open_calls = open_calls + 1; END;
CREATE TRIGGER IF NOT EXISTS node_load_delete AFTER DELETE ON sessions
  WHEN OLD.owner IS NOT NULL AND OLD.state IN ('assigned', 'answered')
  BEGIN UPDATE node_load SET open_calls = open_calls - 1 WHERE node = OLD.owner; END;
CREATE TRIGGER IF NOT EXISTS node_load_update AFTER UPDATE OF owner, state ON sessions
  WHEN OLD.owner IS NOT NEW.owner OR OLD.state IS NOT NEW.state
  BEGIN UPDATE node_load SET open_calls = open_calls - 1 WHERE node = OLD.owner AND OLD.state IN ('assigned', 'answered'); INSERT INTO node_load (node, open_calls) SELECT NEW.owner, 1 WHERE NEW.owner IS NOT NULL AND NEW.state IN ('assigned', 'answered') ON CONFLICT (node) DO UPDATE SET open_calls = open_calls + 1; END;
