// The alarm's sweep in real workerd: a session whose owner falls silent is
// settled `node_lost` and stops counting against its capacity; a session
// older than the maximum duration is settled `max_duration`. Both are
// bookkeeping only: the owner's fence still works while the call lives.
// Timing is shortened with the test-only CALLFENCE_TEST_* variables.

import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { admin, callEvent, fence, heartbeat, setupCluster, waitFor, webhook } from "./fixtures.mjs";

const callOf = (edge, id) => admin(edge, `/v1/calls/${encodeURIComponent(id)}`);
const nodeOf = async (edge, id) => (await admin(edge, "/v1/status")).body.nodes.find((n) => n.node === id);

describe("the alarm sweeps", () => {
  let cluster;
  before(async () => {
    cluster = await setupCluster({
      nodes: ["M1"],
      bindings: { CALLFENCE_TEST_NODE_LOST_MS: "1500", CALLFENCE_TEST_SWEEP_MS: "300", CALLFENCE_TEST_MAX_DURATION_MS: "600000" },
    });
  });
  after(() => cluster?.dispose());

  test("an owner whose beat goes stale: node_lost, capacity freed, fence still granted", async () => {
    const { edge } = cluster;
    const { M1 } = cluster.nodes;
    assert.equal((await heartbeat(edge, M1, { valid_for_s: 1 })).status, 200);
    const init = callEvent("call.initiated", { session: "lost-1", leg: "lost-1-a" });
    const res = await webhook(edge, init);
    assert.equal(res.status, 200);
    assert.equal((await nodeOf(edge, "M1")).capacity.open_calls, 1);
    // No more beats: stale after ~1 s, lost 1.5 s later, swept within 0.3 s.
    const call = await waitFor(
      async () => {
        const c = await callOf(edge, "lost-1");
        return c.body.state === "node_lost" && c.body;
      },
      { timeout: 8000, what: "node_lost" },
    );
    assert.deepEqual([call.owner, call.epoch], ["M1", res.body.epoch]);
    assert.equal((await nodeOf(edge, "M1")).capacity.open_calls, 0);
    const granted = await fence(edge, M1, { call_session_id: "lost-1", call_control_id: "lost-1-a", epoch: res.body.epoch });
    assert.equal(granted.status, 200);
    assert.equal(granted.body.granted, true);
  });
});

describe("the alarm settles calls past the maximum duration", () => {
  let cluster;
  before(async () => {
    cluster = await setupCluster({
      nodes: ["M1"],
      bindings: { CALLFENCE_TEST_MAX_DURATION_MS: "1200", CALLFENCE_TEST_SWEEP_MS: "300" },
    });
  });
  after(() => cluster?.dispose());

  test("an open call older than the maximum duration: max_duration", async () => {
    const { edge } = cluster;
    const { M1 } = cluster.nodes;
    const init = callEvent("call.initiated", { session: "long-1", leg: "long-1-a" });
    assert.equal((await webhook(edge, init)).status, 200);
    assert.equal((await callOf(edge, "long-1")).body.state, "assigned");
    const call = await waitFor(
      async () => {
        await heartbeat(edge, M1); // the owner stays alive: only the age settles it
        const c = await callOf(edge, "long-1");
        return c.body.state === "max_duration" && c.body;
      },
      { timeout: 8000, interval: 200, what: "max_duration" },
    );
    assert.equal(call.owner, "M1");
    assert.equal((await nodeOf(edge, "M1")).capacity.open_calls, 0);
  });
});
