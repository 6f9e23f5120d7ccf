// An atomic unit of the Dispatcher that fails half-way leaves nothing behind
// on the Durable Object (its SQLite storage in workerd), as it does on
// rusqlite: the Dispatcher runs each unit inside ctx.storage.transactionSync.
//
// The test-only switch CALLFENCE_TEST_FAIL_UNIT_AFTER_WRITES=1 makes every
// unit fail at its second writing statement. A document PUT writes the new
// revision and then prunes old ones; a webhook records the time of the last
// webhook and then its event. Without the rollback, their first write would
// stay: revision 1 of the registry would exist, and the status view would
// call the engine operative.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { bindingsFor, read, startEdge, testKeys } from "./harness.mjs";
import { admin, callEvent, registryFor, setupCluster, webhook } from "./fixtures.mjs";

const FAULT = { CALLFENCE_TEST_FAIL_UNIT_AFTER_WRITES: "1" };

describe("atomicity: a failed unit leaves no trace on the Durable Object", () => {
  const dir = mkdtempSync(join(tmpdir(), "callfence-atomicity-"));
  const keys = testKeys();
  after(() => rmSync(dir, { recursive: true, force: true }));

  test("a document PUT that fails after its first write stores no revision", async () => {
    // Every unit fails, so no map can be put: one shard (the e2e matrix's
    // other files run the call path over four).
    const edge = await startEdge({ keys, dir, shards: 1, bindings: { ...bindingsFor(keys), ...FAULT } });
    try {
      const doc = registryFor([{ id: "M1", kid: "k1", key: keys.edge, origin: { url: "http://127.0.0.1:9/t" } }]);
      const put = () =>
        edge
          .fetch("/v1/nodes", {
            method: "PUT",
            headers: { authorization: `Bearer ${keys.adminToken}`, "if-match": '"0"', "content-type": "application/json" },
            body: JSON.stringify(doc),
          })
          .then(read);
      const first = await put();
      assert.deepEqual([first.status, first.body.error], [503, "dispatcher_unavailable"]);
      // Had revision 1 been kept, this would be 412 revision_conflict.
      const again = await put();
      assert.deepEqual([again.status, again.body.error], [503, "dispatcher_unavailable"]);
      const got = await admin(edge, "/v1/nodes");
      assert.deepEqual([got.status, got.body.error], [404, "no_nodes"]);
    } finally {
      await edge.dispose();
    }
  });

  describe("a webhook whose unit fails after its first write", () => {
    let cluster;
    const event = callEvent("call.initiated", {
      session: "atomic-1",
      leg: "atomic-leg-1",
      to: "+15551230001",
      from: "+15551239001",
    });

    let edge;
    const stateDir = mkdtempSync(join(tmpdir(), "callfence-atomicity-"));

    before(async () => {
      // Documents and heartbeats stored normally, then the same storage is
      // served with the fault switch on.
      cluster = await setupCluster({ keys, dir: stateDir });
      await cluster["edge"].dispose();
      edge = await startEdge({ keys, dir: stateDir, bindings: { ...bindingsFor(keys), ...FAULT } });
    });
    after(async () => {
      await edge?.dispose();
      await Promise.all(Object.values(cluster?.nodes ?? {}).map((n) => n.origin.close()));
      rmSync(stateDir, { recursive: true, force: true });
    });

    test("is 503 with nothing forwarded and nothing recorded", async () => {
      const res = await webhook(edge, event);
      assert.deepEqual([res.status, res.body.error], [503, "dispatcher_unavailable"]);
      assert.equal(cluster.nodes.M1.origin.requests.length, 0);
      // Reads run outside units, so the switch does not stop them.
      const status = await admin(edge, "/v1/status");
      assert.equal(status.status, 200, JSON.stringify(status.body));
      assert.deepEqual(status.body.engine, { operative: false, last_webhook_at: null });
      const call = await admin(edge, "/v1/calls/atomic-1");
      assert.deepEqual([call.status, call.body.error], [404, "unknown_call"]);
      const decisions = await admin(edge, "/v1/decisions?call_session_id=atomic-1");
      assert.deepEqual(decisions.body.decisions, []);
    });

    test("and the same webhook is taken afresh once the fault is gone", async () => {
      await edge.dispose();
      edge = await startEdge({ keys, dir: stateDir, bindings: bindingsFor(keys) });
      const res = await webhook(edge, event);
      assert.equal(res.status, 200, JSON.stringify(res.body));
      assert.equal(res.body.delivered_to, "M1");
      assert.equal(cluster.nodes.M1.origin.requests.length, 1);
      const status = await admin(edge, "/v1/status");
      assert.equal(status.body.engine.operative, true);
    });
  });
});
