-- callfence Dispatcher schema, release 4. Additions only (SPEC §10): the
-- previous release keeps working on this schema (it never reads this table).
--
-- node_seq_regressions: per node, how many heartbeats were refused
-- `stale_seq` without being a byte-identical re-send of the last accepted
-- one, and when the last was. The refused beat itself is never stored
-- (SPEC §6); this is a fact about the node: another process signs beats with
-- its key, or its seq file was restored from an older copy.
CREATE TABLE IF NOT EXISTS node_seq_regressions (
  node TEXT PRIMARY KEY,
  regressions INTEGER NOT NULL,
  last_at INTEGER NOT NULL
);
