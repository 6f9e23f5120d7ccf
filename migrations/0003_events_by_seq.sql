-- callfence Dispatcher schema, release 3. Additions only (SPEC §10): the
-- previous release keeps working on this schema.
--
-- events_by_seq: the event ledger in arrival order, for the paged export
-- (`GET /v1/events?after=<seq>`), so that each page reads its rows from the
-- index instead of sorting the whole ledger.
CREATE INDEX IF NOT EXISTS events_by_seq ON events (seq);
