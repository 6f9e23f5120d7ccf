// The replay file and its comparison, on recorded material: the file is
// built from an edge's export in the Dispatcher's order with every kind of
// line, parses back, and a decision that differs is listed with both
// evidences (a planted difference is found; a faithful replay has none).

import { test } from "node:test";
import assert from "node:assert/strict";
import { compareDecisions, parseReplay, replayFile } from "./replay.mjs";

const T = Date.parse("2026-12-01T10:00:00.000Z");
const at = (ms) => new Date(T + ms).toISOString();
const body = (id, session) => JSON.stringify({ data: { id, event_type: "call.initiated", payload: { call_session_id: session } } });

/** s1 assigned to M1 and delivered; s2 assigned to M1, refused, moved to M2; e3 parked, then placed when re-delivered. */
function exported() {
  return {
    policy: { schema: "riff_node_routing_policy_v1" },
    nodes: { schema: "callfence_nodes_v1", nodes: {} },
    events: [
      { seq: 1, event_id: "e1", call_session_id: "s1", state: "delivered", node: "M1", received_at: at(100), updated_at: at(130), body: body("e1", "s1") },
      { seq: 2, event_id: "e2", call_session_id: "s2", state: "delivered", node: "M2", received_at: at(200), updated_at: at(260), body: body("e2", "s2") },
      { seq: 3, event_id: "e3", call_session_id: "s3", state: "delivered", node: "M2", received_at: at(300), updated_at: at(2_350), body: body("e3", "s3") },
    ],
    decisions: [
      { decision_id: 1, at: at(100), call_session_id: "s1", event_id: "e1", outcome: "assigned", rule: "line", prefers: "M1", chosen: "M1", reasons: {} },
      { decision_id: 2, at: at(200), call_session_id: "s2", event_id: "e2", outcome: "assigned", rule: "line", prefers: "M1", chosen: "M1", reasons: {} },
      { decision_id: 3, at: at(240), call_session_id: "s2", event_id: "e2", outcome: "reassigned", rule: "line", prefers: "M1", chosen: "M2", reasons: { M1: ["recent_forward_failure"] } },
      { decision_id: 4, at: at(2_300), call_session_id: "s3", event_id: "e3", outcome: "assigned", rule: "line", prefers: "M1", chosen: "M2", reasons: { M1: ["recent_forward_failure"] } },
    ],
    calls: [{ call_session_id: "s3", events: [{ event_id: "e3", attempts: 3 }] }],
    beats: [{ at: T + 150, node: "M1", body: '{"seq":9}' }, { at: T - 5_000, node: "M1", body: '{"seq":1}' }],
  };
}

test("the replay file has every line in the Dispatcher's order, from `since`", () => {
  const text = replayFile({ ...exported(), since: T });
  const { header, lines } = parseReplay(text);
  assert.equal(header.schema, "callfence_replay_v1");
  assert.equal(header.started_at, at(0));
  assert.deepEqual(
    lines.map((l) => [l.t_ms, l.kind, l.node ?? null, l.event_id ?? JSON.parse(l.body ?? "{}").data?.id ?? null]),
    [
      [100, "webhook", null, "e1"],
      [130, "delivery", "M1", "e1"],
      [150, "heartbeat", "M1", null],
      [200, "webhook", null, "e2"],
      [240, "refusal", "M1", "e2"],
      [260, "delivery", "M2", "e2"],
      [300, "webhook", null, "e3"],
      [2_300, "webhook", null, "e3"], // the re-delivery that placed the parked event
      [2_350, "delivery", "M2", "e3"],
    ],
  );
  // The delivering attempt, from the call view (e3 timed out twice first).
  assert.deepEqual(lines.filter((l) => l.kind === "delivery").map((l) => l.attempt), [1, 1, 3]);
});

test("a file that is not callfence_replay_v1 or has a malformed line is refused", () => {
  assert.throws(() => parseReplay('{"schema":"other"}\n'), /not a callfence_replay_v1 file/);
  assert.throws(() => parseReplay('{"schema":"callfence_replay_v1"}\n{"t_ms":1,"kind":"delivery","node":"M1"}\n'), /replay line 2/);
  assert.throws(() => parseReplay('{"schema":"callfence_replay_v1"}\n{"kind":"webhook","body":"{}"}\n'), /replay line 2/);
});

test("a faithful replay has no difference; a planted one is listed with both evidences", () => {
  const original = exported().decisions;
  assert.deepEqual(compareDecisions(original, structuredClone(original)), { compared: 4, differences: [] });
  const replayed = structuredClone(original);
  replayed[3].chosen = "M1";
  replayed[3].reasons = {};
  const { compared, differences } = compareDecisions(original, replayed);
  assert.equal(compared, 4);
  assert.equal(differences.length, 1);
  assert.deepEqual([differences[0].session, differences[0].index], ["s3", 0]);
  assert.equal(differences[0].original.chosen, "M2");
  assert.equal(differences[0].replay.chosen, "M1");
  const missing = compareDecisions(original, original.slice(0, 3)).differences;
  assert.deepEqual(missing.map((d) => [d.session, d.replay]), [["s3", null]]);
});
