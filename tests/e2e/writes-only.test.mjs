// The bench-only `writes_only` message (`make bench`'s writes-only
// baseline, core/src/engine/writes_only.rs) is served only under the
// test-only switch CALLFENCE_TEST_WRITES_ONLY=1: without it the Dispatcher
// answers unknown_op and stores nothing; with it the call's rows are real
// (an owned session and a delivered event), and the same id again is refused
// by the store with nothing of it kept (its writes are one atomic unit).

import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { bindingsFor, startEdge, testKeys } from "./harness.mjs";
import { admin } from "./fixtures.mjs";

async function writesOnly(edge, id) {
  const stub = await edge.dispatcher();
  const head = { v: 2, op: "writes_only", id, node: "M1", origin_url: "http://127.0.0.1:9/t" };
  const res = await stub.fetch("https://dispatcher/writes_only", { method: "POST", body: `${JSON.stringify(head)}\n{"data":{}}` });
  return { status: res.status, body: JSON.parse(await res.text()) };
}

describe("writes_only: bench-only, behind CALLFENCE_TEST_WRITES_ONLY", () => {
  test("without the switch it is an unknown op and stores nothing", async () => {
    const edge = await startEdge();
    try {
      const answer = await writesOnly(edge, "wo-off-1");
      assert.equal(answer.status, 400);
      assert.equal(answer.body.error, "unknown_op");
      const call = await admin(edge, "/v1/calls/wo-off-1");
      assert.equal(call.status, 404, JSON.stringify(call.body));
    } finally {
      await edge.dispose();
    }
  });

  test("with the switch it writes an assigned, delivered call in two commits", async () => {
    const keys = testKeys();
    const edge = await startEdge({ keys, bindings: { ...bindingsFor(keys), CALLFENCE_TEST_WRITES_ONLY: "1" } });
    try {
      const answer = await writesOnly(edge, "wo-on-1");
      assert.deepEqual([answer.status, answer.body.ok, answer.body.written], [200, true, true]);
      const call = await admin(edge, "/v1/calls/wo-on-1");
      assert.equal(call.status, 200, JSON.stringify(call.body));
      assert.equal(call.body.owner, "M1");
      assert.equal(call.body.epoch, 1);
      assert.deepEqual(call.body.events.map((e) => [e.event_id, e.state, e.node]), [["wo-on-1", "delivered", "M1"]]);
      const decisions = await admin(edge, "/v1/decisions?call_session_id=wo-on-1");
      assert.equal(decisions.body.decisions.length, 1, JSON.stringify(decisions.body));

      // The same id again: its first unit reaches the event insert after
      // bumping the epoch and writing a decision, the event's key refuses it,
      // and the whole unit rolls back: the Dispatcher throws the store's
      // error, and the call, its epoch and its decisions are as they were.
      await assert.rejects(writesOnly(edge, "wo-on-1"), /UNIQUE constraint failed: events\.event_id/);
      const after = await admin(edge, "/v1/calls/wo-on-1");
      assert.deepEqual(after.body, call.body, "the refused write changed the call");
      const decisionsAfter = await admin(edge, "/v1/decisions?call_session_id=wo-on-1");
      assert.deepEqual(decisionsAfter.body, decisions.body, "the refused write left a decision");
    } finally {
      await edge.dispose();
    }
  });
});
