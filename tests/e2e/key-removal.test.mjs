// A node key removed from the registry stops working at once, although the
// Worker's cached copy of the keys may still know it for a few seconds: the
// Dispatcher re-checks (node, kid) against its current registry.

import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { ed25519 } from "./harness.mjs";
import { heartbeat, heartbeatBody, nodePost, putDocument, registryFor, setupCluster } from "./fixtures.mjs";

describe("a removed node key", () => {
  let cluster;
  before(async () => {
    cluster = await setupCluster({ nodes: ["M1"] });
  });
  after(() => cluster?.dispose());

  test("is refused by the Dispatcher while the Worker's cache still has it", async () => {
    const { edge } = cluster;
    const { M1 } = cluster.nodes;
    // The Worker's cache knows k1 now (setupCluster's beat went through it).
    assert.equal((await heartbeat(edge, M1)).status, 200);
    // Rotate: the registry keeps M1 with a new key k2 only.
    const next = { ...M1, kid: "k2", key: ed25519() };
    const doc = registryFor([next]);
    assert.equal((await putDocument(edge, "nodes", doc)).status, 200);
    // Signed with the removed k1, right away (within the cache's lifetime).
    const stale = await nodePost(edge, M1, "/v1/nodes/heartbeat", heartbeatBody(edge, M1), { retry: false });
    assert.deepEqual([stale.status, stale.body.error], [401, "unknown_node_key"]);
    const fenced = await nodePost(
      edge,
      M1,
      "/v1/fence",
      { call_session_id: "s", call_control_id: "c", epoch: 1, purpose: "answer" },
      { retry: false },
    );
    assert.deepEqual([fenced.status, fenced.body.error], [401, "unknown_node_key"]);
    // The new key works (retrying while the Worker's cache catches up).
    assert.equal((await heartbeat(edge, next)).status, 200);
  });
});
