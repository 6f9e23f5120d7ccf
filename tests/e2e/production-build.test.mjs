// The deployed Worker (`make build`, build/) carries none of the test and
// bench scaffolding that the cargo feature `testing` adds to build-testing/
// (docs/testing.md): no CALLFENCE_TEST_* switch, no bench-only `writes_only`
// or `profile` message. Its wasm holds none of their names, its Dispatcher
// answers their messages `unknown_op` and stores nothing, and a
// CALLFENCE_TEST_* variable set on it changes nothing.

import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { bindingsFor, PRODUCTION_BUILD, ROOT, startEdge, TESTING_BUILD, testKeys } from "./harness.mjs";
import { admin, putDocument, registryFor } from "./fixtures.mjs";

/** The names only the scaffolding uses. */
const SCAFFOLDING = ["writes_only", "CALLFENCE_TEST_"];

/** The files of a build, with the named copy of its wasm scripts/build.sh keeps. */
function filesOf(build, named) {
  return [join(build, "index_bg.wasm"), join(build, "index.js"), named].map((path) => ({
    path,
    bytes: readFileSync(path),
  }));
}

/** A Dispatcher message straight to the Durable Object: its status and body. */
async function message(edge, head, payload) {
  const stub = await edge.dispatcher();
  const body = payload === undefined ? `${JSON.stringify(head)}\n` : `${JSON.stringify(head)}\n${payload}`;
  const res = await stub.fetch(`https://dispatcher/${head.op}`, { method: "POST", body });
  return { status: res.status, body: JSON.parse(await res.text()) };
}

describe("the production build has no test scaffolding", () => {
  test("its wasm and glue hold none of the scaffolding's names; the testing build's do", () => {
    for (const { path, bytes } of filesOf(PRODUCTION_BUILD, join(ROOT, "target/wasm-size/index_bg.named.wasm"))) {
      for (const name of SCAFFOLDING) assert.equal(bytes.indexOf(name), -1, `${path} holds ${name}`);
    }
    // The same search finds them where they are: it can fail.
    const testing = readFileSync(join(TESTING_BUILD, "index_bg.wasm"));
    for (const name of SCAFFOLDING) assert.notEqual(testing.indexOf(name), -1, `the testing build lacks ${name}`);
  });

  test("its Dispatcher answers writes_only and profile unknown_op, even with CALLFENCE_TEST_WRITES_ONLY=1", async () => {
    const keys = testKeys();
    const edge = await startEdge({
      keys,
      build: PRODUCTION_BUILD,
      bindings: { ...bindingsFor(keys), CALLFENCE_TEST_WRITES_ONLY: "1" },
    });
    try {
      const head = { v: 2, op: "writes_only", id: "prod-wo-1", node: "M1", origin_url: "http://127.0.0.1:9/t" };
      const written = await message(edge, head, '{"data":{}}');
      assert.deepEqual([written.status, written.body.error], [400, "unknown_op"]);
      const call = await admin(edge, "/v1/calls/prod-wo-1");
      assert.equal(call.status, 404, JSON.stringify(call.body));
      const decisions = await admin(edge, "/v1/decisions?call_session_id=prod-wo-1");
      assert.deepEqual(decisions.body.decisions, [], JSON.stringify(decisions.body));

      const profile = await message(edge, { v: 2, op: "profile" });
      assert.deepEqual([profile.status, profile.body.error], [400, "unknown_op"]);
    } finally {
      await edge.dispose();
    }
  });

  test("it ignores CALLFENCE_TEST_FAIL_UNIT_AFTER_WRITES: a document PUT is stored", async () => {
    const keys = testKeys();
    const edge = await startEdge({
      keys,
      build: PRODUCTION_BUILD,
      bindings: { ...bindingsFor(keys), CALLFENCE_TEST_FAIL_UNIT_AFTER_WRITES: "0" },
    });
    try {
      const doc = registryFor([{ id: "M1", kid: "k1", key: keys.edge, origin: { url: "http://127.0.0.1:9/t" } }]);
      // The testing build fails this unit at its first write (atomicity.test.mjs).
      const put = await putDocument(edge, "nodes", doc);
      assert.equal(put.status, 200, JSON.stringify(put.body));
      const got = await admin(edge, "/v1/nodes");
      assert.deepEqual([got.status, got.body.revision], [200, 1]);
    } finally {
      await edge.dispose();
    }
  });
});
