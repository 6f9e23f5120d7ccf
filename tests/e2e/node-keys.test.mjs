// The node-signature pre-check against registered keys, and how often it asks
// the Dispatcher. DISPATCHER is bound to a stand-in that speaks protocol v2
// (a head of JSON, "\n", the payload), serves a registry with one node key,
// and counts the operations it is asked. A second stand-in speaks only v1, as
// the previous release's Dispatcher does: the Worker falls back to v1 for it.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { ed25519, nodeHeaders, nowSeconds, read, startEdge } from "./harness.mjs";

function standIn(keys, version = 2) {
  return `
    const KEYS = ${JSON.stringify(keys)};
    const V = ${version};
    export class Dispatcher {
      constructor() { this.calls = {}; }
      async fetch(request) {
        const op = new URL(request.url).pathname.slice(1);
        if (op === "test/calls") return Response.json(this.calls);
        this.calls[op] = (this.calls[op] ?? 0) + 1;
        const text = await request.text();
        const newline = text.indexOf("\\n");
        let message = null;
        try {
          // v2 frames the payload after a newline; v1 is one JSON object.
          message = JSON.parse(V === 2 ? text.slice(0, newline) : text);
        } catch {}
        if ((V === 2 && newline < 0) || message?.v !== V || message?.op !== op) {
          return Response.json({ v: V, ok: false, error: "bad_message" }, { status: 400 });
        }
        if (op === "ping") return Response.json({ v: V, ok: true, documents: { policy: false, nodes: true } });
        if (op === "node_keys") return Response.json({ v: V, ok: true, revision: 7, keys: KEYS, future: 1 });
        // Any later op (the request got past the pre-check): a business refusal.
        return Response.json({ v: V, ok: false, status: 409, error: "stand_in_refusal" });
      }
    }
    export default { fetch() { return new Response("stand-in script"); } };`;
}

describe("node signatures against registered keys", () => {
  const node = ed25519();
  let edge;
  before(async () => {
    edge = await startEdge({
      dispatcherScript: standIn([{ node: "M1", kid: "k1", public_key: node.publicKey }]),
    });
  });
  after(() => edge?.dispose());

  const beat = JSON.stringify({ schema: "callfence_heartbeat_v1", node: "M1", seq: 1 });
  const url = () => new URL("/v1/nodes/heartbeat", edge.url);
  const post = (headers, body = beat) =>
    edge.fetch("/v1/nodes/heartbeat", { method: "POST", headers, body }).then(read);
  const signed = (overrides = {}) =>
    nodeHeaders({ url: url(), body: beat, node: "M1", kid: "k1", privateKey: node.privateKeyObject, ...overrides });
  const calls = async () => {
    const stub = await edge.dispatcher();
    return (await stub.fetch("https://dispatcher/test/calls")).json();
  };

  test("the node's own signature passes the pre-check", async () => {
    const res = await post(signed());
    assert.notEqual(res.status, 401, JSON.stringify(res.body));
    assert.ok(!["bad_node_signature", "unknown_node_key", "stale_timestamp"].includes(res.body?.error));
    assert.equal((await calls()).node_keys, 1, "the keys were fetched once");
  });

  test("a forged signature, a changed body or a changed path is bad_node_signature", async () => {
    const forged = await post(signed({ privateKey: ed25519().privateKeyObject }));
    assert.deepEqual([forged.status, forged.body], [401, { error: "bad_node_signature" }]);

    const changed = await post(signed(), beat.replace('"seq":1', '"seq":2'));
    assert.deepEqual([changed.status, changed.body], [401, { error: "bad_node_signature" }]);

    // Signed for /v1/fence, sent to the heartbeat.
    const elsewhere = await post(signed({ url: new URL("/v1/fence", edge.url) }));
    assert.deepEqual([elsewhere.status, elsewhere.body], [401, { error: "bad_node_signature" }]);

    const wrongMethod = await post(signed({ method: "PUT" }));
    assert.deepEqual([wrongMethod.status, wrongMethod.body], [401, { error: "bad_node_signature" }]);
  });

  test("an unknown key id or node is unknown_node_key", async () => {
    for (const who of [{ kid: "k2" }, { node: "M2" }]) {
      const res = await post(signed(who));
      assert.deepEqual([res.status, res.body], [401, { error: "unknown_node_key" }], JSON.stringify(who));
    }
  });

  test("a flood of forged requests barely reaches the Dispatcher", async () => {
    const before = (await calls()).node_keys ?? 0;
    const forged = [];
    for (let i = 0; i < 20; i++) {
      forged.push(post(signed({ node: `X${i}`, privateKey: ed25519().privateKeyObject })));
      forged.push(post(signed({ timestamp: nowSeconds() - 1000 })));
      forged.push(post({ "callfence-node": "M1" }));
    }
    const answers = await Promise.all(forged);
    assert.ok(answers.every((a) => a.status === 401));
    const asked = ((await calls()).node_keys ?? 0) - before;
    // At most one refresh per second for unknown keys, plus one expiry of the
    // cached copy (5 s): the 60 requests above take well under a second.
    assert.ok(asked <= 2, `the Dispatcher was asked for keys ${asked} times`);
  });
});

describe("a Dispatcher one protocol version behind (v1)", () => {
  const node = ed25519();
  let edge;
  before(async () => {
    edge = await startEdge({
      dispatcherScript: standIn([{ node: "M1", kid: "k1", public_key: node.publicKey }], 1),
    });
  });
  after(() => edge?.dispose());

  test("still serves node requests: the Worker resends in v1 after its bad_message", async () => {
    const beat = JSON.stringify({ schema: "callfence_heartbeat_v1", node: "M1", seq: 1 });
    const headers = nodeHeaders({ url: new URL("/v1/nodes/heartbeat", edge.url), body: beat, node: "M1", kid: "k1", privateKey: node.privateKeyObject });
    const res = await edge.fetch("/v1/nodes/heartbeat", { method: "POST", headers, body: beat }).then(read);
    // The stand-in's refusal of the heartbeat itself is relayed: the request
    // reached it in a form it reads, after the key fetch did too.
    assert.deepEqual([res.status, res.body], [409, { error: "stand_in_refusal" }]);
    const stub = await edge.dispatcher();
    const calls = await (await stub.fetch("https://dispatcher/test/calls")).json();
    // Each op was tried in v2 once, refused, and sent again in v1.
    assert.deepEqual([calls.node_keys, calls.heartbeat], [2, 2]);
  });
});
