-- callfence Dispatcher schema, release 5. Additions only (SPEC §10): the
-- previous release keeps working on this schema.
--
-- shard_leases: in the directory (`global`), per call shard k >= 1, the
-- newest ask it answered and the lease it granted (SPEC §16): the ask's
-- sequence number, when the lease lapses, the open calls per node the
-- shard reported and the caps per node it was given (JSON objects).
-- Capacity across shards is counted from these rows, so they survive a
-- restart of the directory. Empty while the map has one shard.
CREATE TABLE IF NOT EXISTS shard_leases (
  shard INTEGER PRIMARY KEY,
  seq INTEGER NOT NULL,
  until_ms INTEGER NOT NULL,
  open TEXT NOT NULL,
  caps TEXT NOT NULL
);
