// A Dispatcher that fails for real: DISPATCHER is bound to a Durable Object
// class in another script that throws, answers the runtime's plain-text 500,
// speaks a protocol version the Worker does not accept, or never answers.
// The Worker must treat each as `dispatcher_unavailable` (a signed webhook
// included: 503, never a direct forward), and keep serving what does not
// need the Dispatcher.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { bearer, ed25519, nodeHeaders, nowSeconds, read, startEdge } from "./harness.mjs";
import { callEvent, webhook } from "./fixtures.mjs";

const faults = {
  "throws from fetch": `
    export class Dispatcher {
      async fetch() { throw new Error("dispatcher exploded"); }
    }
    export default { fetch() { return new Response("stand-in script"); } };`,
  "throws from its constructor": `
    export class Dispatcher {
      constructor() { throw new Error("cannot start"); }
      async fetch() { return new Response("unreachable"); }
    }
    export default { fetch() { return new Response("stand-in script"); } };`,
  "answers a plain-text 500": `
    export class Dispatcher {
      async fetch() { return new Response("Internal Server Error", { status: 500 }); }
    }
    export default { fetch() { return new Response("stand-in script"); } };`,
  "speaks an unknown protocol version": `
    export class Dispatcher {
      async fetch() {
        return Response.json({ v: 9, ok: true, documents: { policy: true, nodes: true },
                               revision: 1, keys: [] });
      }
    }
    export default { fetch() { return new Response("stand-in script"); } };`,
  "never answers": `
    export class Dispatcher {
      async fetch() {
        await new Promise((resolve) => setTimeout(resolve, 60_000));
        return new Response("too late");
      }
    }
    export default { fetch() { return new Response("stand-in script"); } };`,
};

for (const [name, script] of Object.entries(faults)) {
  describe(`a Dispatcher that ${name}`, () => {
    let edge;
    before(async () => {
      edge = await startEdge({ dispatcherScript: script });
    });
    after(() => edge?.dispose());

    test("GET /v1/health: 200, dispatcher unreachable, documents, map and floor null, degraded", async () => {
      const res = await read(await edge.fetch("/v1/health", { headers: bearer(edge.keys.adminToken) }));
      assert.equal(res.status, 200);
      assert.deepEqual(res.body, {
        status: "degraded",
        capabilities: { ingress: "ok", node_routes: "ok", admin: "ok", key_publication: "ok" },
        dispatcher: "unreachable",
        documents: null,
        shards: null,
        rollback_floor: null,
      });
    });

    test("a signed webhook: 503 dispatcher_unavailable with Retry-After, before Telnyx's 2 s timeout", async () => {
      const event = callEvent("call.initiated", { session: "s-fault", leg: "l-fault", from: "+14155550100", to: "+12025550133" });
      const started = Date.now();
      const res = await webhook(edge, event);
      const took = Date.now() - started;
      assert.deepEqual([res.status, res.body], [503, { error: "dispatcher_unavailable" }]);
      assert.equal(res.headers.get("retry-after"), "1");
      assert.ok(took < 2000, `answered after ${took} ms`);
    });

    test("GET /healthz never asks it: still ok", async () => {
      const res = await read(await edge.fetch("/healthz"));
      assert.deepEqual([res.status, res.body], [200, { status: "ok" }]);
    });

    test("a node request that needs the registry keys: 503 dispatcher_unavailable", async () => {
      const body = JSON.stringify({ schema: "callfence_heartbeat_v1", node: "M1" });
      const headers = nodeHeaders({
        url: new URL("/v1/nodes/heartbeat", edge.url),
        body,
        node: "M1",
        kid: "k1",
        privateKey: ed25519().privateKeyObject,
      });
      const res = await read(await edge.fetch("/v1/nodes/heartbeat", { method: "POST", headers, body }));
      assert.equal(res.status, 503);
      assert.deepEqual(res.body, { error: "dispatcher_unavailable" });
      assert.equal(res.headers.get("retry-after"), "1");
    });

    test("malformed or stale node requests are refused without it", async () => {
      const body = "{}";
      const none = await read(await edge.fetch("/v1/nodes/heartbeat", { method: "POST", body }));
      assert.deepEqual([none.status, none.body], [401, { error: "bad_node_signature" }]);
      const headers = nodeHeaders({
        url: new URL("/v1/fence", edge.url),
        body,
        node: "M1",
        kid: "k1",
        privateKey: ed25519().privateKeyObject,
        timestamp: nowSeconds() - 3600,
      });
      const stale = await read(await edge.fetch("/v1/fence", { method: "POST", headers, body }));
      assert.deepEqual([stale.status, stale.body], [401, { error: "stale_timestamp" }]);
    });
  });
}
