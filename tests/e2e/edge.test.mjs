// The Worker's edge behaviour in Miniflare: health, keys, routing errors,
// capability gating, bearer tokens, body limits, signature pre-checks, logs.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import {
  bearer,
  bindingsFor,
  ed25519,
  nodeHeaders,
  nowSeconds,
  read,
  startEdge,
  telnyxHeaders,
  testKeys,
} from "./harness.mjs";

const json = (body) => JSON.stringify(body);

/**
 * An HTTP client that keeps one connection alive and reuses it (Node's
 * keep-alive Agent, one socket, one request at a time), as undici, curl and
 * most carriers' clients do. `send` resolves to { status, body, reused } or
 * { error, reused }; `reused` is true when the request went over the
 * connection of an earlier one.
 */
function keepAliveClient(baseUrl) {
  const url = new URL(baseUrl);
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  const send = (method, path, { body, headers = {}, chunked = false } = {}) =>
    new Promise((resolve) => {
      const h = { ...headers };
      if (body !== undefined && !chunked) h["content-length"] = Buffer.byteLength(body);
      const req = http.request({ host: url.hostname, port: url.port, method, path, agent, headers: h }, (res) => {
        const chunks = [];
        res.on("data", (c) => chunks.push(c));
        res.on("end", () => {
          const text = Buffer.concat(chunks).toString("utf8");
          let parsed = text;
          try {
            parsed = JSON.parse(text);
          } catch {
            // not JSON
          }
          resolve({ status: res.statusCode, body: parsed, reused: req.reusedSocket });
        });
      });
      req.setTimeout(10_000, () => req.destroy(new Error("no answer within 10 s")));
      req.on("error", (e) => resolve({ error: e.code ?? e.message, reused: req.reusedSocket }));
      if (body !== undefined && chunked) {
        // Without a Content-Length: sent in 64 KiB chunks.
        for (let at = 0; at < body.length; at += 65536) req.write(body.slice(at, at + 65536));
      } else if (body !== undefined) {
        req.write(body);
      }
      req.end();
    });
  return { send, close: () => agent.destroy() };
}

describe("a fully configured Worker", () => {
  let edge;
  before(async () => {
    edge = await startEdge();
  });
  after(() => edge?.dispose());

  test("GET /healthz is ok and names nothing", async () => {
    const res = await read(await edge.fetch("/healthz"));
    assert.equal(res.status, 200);
    assert.deepEqual(res.body, { status: "ok" });
    assert.equal(res.headers.get("cache-control"), "no-store");
  });

  test("GET /v1/keys publishes the active key, then the next", async () => {
    const { keys } = edge;
    const res = await read(await edge.fetch("/v1/keys"));
    assert.equal(res.status, 200);
    assert.deepEqual(res.body, {
      keys: [
        { kid: keys.edgeKid, public_key: keys.edge.publicKey, state: "active" },
        { kid: keys.edgeNextKid, public_key: keys.edgeNext.publicKey, state: "next" },
      ],
    });
  });

  test("unknown routes are 404, wrong methods 405 with Allow", async () => {
    for (const path of ["/nope", "/v1", "/v1/status/", "/v1/calls/", "/healthz/x"]) {
      const res = await read(await edge.fetch(path));
      assert.equal(res.status, 404, path);
      assert.deepEqual(res.body, { error: "not_found" });
    }
    const res = await read(await edge.fetch("/v1/policy", { method: "DELETE" }));
    assert.equal(res.status, 405);
    assert.deepEqual(res.body, { error: "method_not_allowed" });
    assert.equal(res.headers.get("allow"), "GET, PUT");
    assert.equal((await edge.fetch("/v1/telnyx/webhook")).status, 405);
    assert.equal((await edge.fetch("/healthz", { method: "POST" })).status, 405);
  });

  test("GET /v1/health wants an admin token: 401 without, 403 for a policy token", async () => {
    const none = await read(await edge.fetch("/v1/health"));
    assert.equal(none.status, 401);
    assert.deepEqual(none.body, { error: "unauthorized" });
    assert.equal(none.headers.get("www-authenticate"), "Bearer");

    const wrong = await edge.fetch("/v1/health", { headers: bearer("x".repeat(48)) });
    assert.equal(wrong.status, 401);
    const notBearer = await edge.fetch("/v1/health", {
      headers: { authorization: edge.keys.adminToken },
    });
    assert.equal(notBearer.status, 401);

    const policy = await read(await edge.fetch("/v1/health", { headers: bearer(edge.keys.policyToken) }));
    assert.equal(policy.status, 403);
    assert.deepEqual(policy.body, { error: "forbidden" });
  });

  test("GET /v1/health details capabilities, the Dispatcher, documents, the shard map and the rollback floor", async () => {
    const res = await read(await edge.fetch("/v1/health", { headers: bearer(edge.keys.adminToken) }));
    assert.equal(res.status, 200);
    assert.deepEqual(res.body, {
      status: "ok",
      capabilities: { ingress: "ok", node_routes: "ok", admin: "ok", key_publication: "ok" },
      dispatcher: "reachable",
      documents: { policy: false, nodes: false },
      shards: { call_shards: 1, map_revision: 0, unreachable: [] },
      rollback_floor: "v1.3",
    });
  });

  test("a policy token is accepted on a panel route (then the route runs)", async () => {
    const res = await edge.fetch("/v1/status", { headers: bearer(edge.keys.policyToken) });
    assert.notEqual(res.status, 401);
    assert.notEqual(res.status, 403);
  });

  test("bodies over the route's limit are 413", async () => {
    const heartbeat = await read(
      await edge.fetch("/v1/nodes/heartbeat", { method: "POST", body: "x".repeat(16 * 1024 + 1) }),
    );
    assert.equal(heartbeat.status, 413);
    assert.equal(heartbeat.body.error, "payload_too_large");

    const fence = await edge.fetch("/v1/fence", { method: "POST", body: "x".repeat(4 * 1024 + 1) });
    assert.equal(fence.status, 413);

    const webhook = await edge.fetch("/v1/telnyx/webhook", {
      method: "POST",
      body: "x".repeat(64 * 1024 + 1),
    });
    assert.equal(webhook.status, 413);

    const policy = await edge.fetch("/v1/policy", {
      method: "PUT",
      headers: bearer(edge.keys.adminToken),
      body: "x".repeat(256 * 1024 + 1),
    });
    assert.equal(policy.status, 413);

    // The token is checked before the body is read.
    const anonymous = await edge.fetch("/v1/policy", { method: "PUT", body: "x".repeat(256 * 1024 + 1) });
    assert.equal(anonymous.status, 401);
  });

  test("after a 413 the client's next request on the same connection is answered", async () => {
    // workerd resets a keep-alive connection whose request body was left
    // unread past 64 KiB; the Worker reads an oversized body to its end (up
    // to 2 MiB) before answering 413, so the connection stays usable.
    const client = keepAliveClient(edge.url);
    try {
      const warm = await client.send("GET", "/healthz");
      assert.equal(warm.status, 200);
      const admin = bearer(edge.keys.adminToken);
      const cases = [
        ["webhook, 64 KiB + 1", "POST", "/v1/telnyx/webhook", 64 * 1024 + 1, {}, false],
        ["webhook, 1 MiB", "POST", "/v1/telnyx/webhook", 1024 * 1024, {}, false],
        ["policy, 256 KiB + 1", "PUT", "/v1/policy", 256 * 1024 + 1, admin, false],
        ["heartbeat, 1 MiB without Content-Length", "POST", "/v1/nodes/heartbeat", 1024 * 1024, {}, true],
        ["webhook, 2 MiB without Content-Length", "POST", "/v1/telnyx/webhook", 2 * 1024 * 1024, {}, true],
      ];
      for (const [what, method, path, size, headers, chunked] of cases) {
        const big = await client.send(method, path, { body: "x".repeat(size), headers, chunked });
        assert.deepEqual([big.status, big.body?.error, big.reused], [413, "payload_too_large", true], `${what}: ${json(big)}`);
        const next = await client.send("GET", "/healthz");
        assert.deepEqual([next.status, next.reused, next.error], [200, true, undefined], `after ${what}: ${json(next)}`);
        const signed = await client.send("POST", "/v1/telnyx/webhook", { body: "{}", headers: { "content-type": "application/json" } });
        assert.deepEqual([signed.status, signed.body?.error, signed.reused], [401, "missing_signature", true], `after ${what}`);
      }
    } finally {
      client.close();
    }
  });

  test("webhook signatures: missing, bad, stale are 401; a signed non-event is 400", async () => {
    const body = json({ data: { id: "evt-1", event_type: "call.initiated", payload: {} } });
    const post = (headers, payload = body) =>
      edge.fetch("/v1/telnyx/webhook", { method: "POST", headers, body: payload }).then(read);

    const missing = await post({ "content-type": "application/json" });
    assert.deepEqual([missing.status, missing.body], [401, { error: "missing_signature" }]);

    const other = ed25519();
    const bad = await post(telnyxHeaders(body, other.privateKeyObject));
    assert.deepEqual([bad.status, bad.body], [401, { error: "bad_signature" }]);

    const stale = await post(telnyxHeaders(body, edge.keys.telnyx.privateKeyObject, nowSeconds() - 301));
    assert.deepEqual([stale.status, stale.body], [401, { error: "stale_timestamp" }]);

    const notEvent = json({ hello: "world" });
    const envelope = await post(telnyxHeaders(notEvent, edge.keys.telnyx.privateKeyObject), notEvent);
    assert.deepEqual([envelope.status, envelope.body], [400, { error: "bad_envelope" }]);
  });

  describe("node signatures on POST /v1/nodes/heartbeat", () => {
    const node = ed25519();
    const beat = json({ schema: "callfence_heartbeat_v1", node: "M1" });
    const post = (headers, body = beat) =>
      edge.fetch("/v1/nodes/heartbeat", { method: "POST", headers, body }).then(read);
    const signed = (overrides = {}) =>
      nodeHeaders({
        url: new URL("/v1/nodes/heartbeat", edge.url),
        body: beat,
        node: "M1",
        kid: "k1",
        privateKey: node.privateKeyObject,
        ...overrides,
      });

    test("no or malformed headers: bad_node_signature", async () => {
      const none = await post({ "content-type": "application/json" });
      assert.deepEqual([none.status, none.body], [401, { error: "bad_node_signature" }]);
      const short = await post({ ...signed(), "callfence-signature": "AAAA" });
      assert.deepEqual([short.status, short.body], [401, { error: "bad_node_signature" }]);
      const badTime = await post({ ...signed(), "callfence-timestamp": "soon" });
      assert.deepEqual([badTime.status, badTime.body], [401, { error: "bad_node_signature" }]);
    });

    test("a timestamp more than 300 s away: stale_timestamp", async () => {
      for (const timestamp of [nowSeconds() - 301, nowSeconds() + 301]) {
        const res = await post(signed({ timestamp }));
        assert.deepEqual([res.status, res.body], [401, { error: "stale_timestamp" }]);
      }
    });

    test("a node or key the registry does not have: unknown_node_key", async () => {
      const res = await post(signed({ node: "M9", kid: "nope" }));
      assert.deepEqual([res.status, res.body], [401, { error: "unknown_node_key" }]);
      // A forged signature for an unknown node is refused the same way.
      const forged = await post(signed({ node: "M9", privateKey: ed25519().privateKeyObject }));
      assert.deepEqual([forged.status, forged.body], [401, { error: "unknown_node_key" }]);
    });

    test("a registered node: forged signatures are refused, its own accepted", async () => {
      const registry = {
        schema: "callfence_nodes_v1",
        nodes: {
          M1: {
            role: "stable",
            origin_url: "http://127.0.0.1:9/callfence/telnyx",
            keys: { k1: node.publicKey },
            fallback_approved: false,
            admin_drained: false,
          },
        },
      };
      const put = await edge.fetch("/v1/nodes", {
        method: "PUT",
        headers: { ...bearer(edge.keys.adminToken), "if-match": '"0"', "content-type": "application/json" },
        body: json(registry),
      });
      // Any answer but 200 (a 501 included) is a failure, never a skip.
      assert.equal(put.status, 200, await put.text());
      // Within the key cache's refresh interval, then after it.
      await new Promise((resolve) => setTimeout(resolve, 1100));
      const forged = await post(signed({ privateKey: ed25519().privateKeyObject }));
      assert.deepEqual([forged.status, forged.body], [401, { error: "bad_node_signature" }]);
      const otherBody = await post(signed(), json({ schema: "callfence_heartbeat_v1", node: "M1", x: 1 }));
      assert.deepEqual([otherBody.status, otherBody.body], [401, { error: "bad_node_signature" }]);
      const wrongKid = await post(signed({ kid: "k2" }));
      assert.deepEqual([wrongKid.status, wrongKid.body], [401, { error: "unknown_node_key" }]);
      const good = await post(signed());
      assert.notEqual(good.status, 401);
    });
  });

  test("one JSON log line per request, without tokens, signatures or bodies", async () => {
    const secretBody = json({ data: { id: "evt-log", event_type: "call.initiated", payload: { to: "+15102160079" } } });
    const headers = telnyxHeaders(secretBody, edge.keys.telnyx.privateKeyObject);
    await edge.fetch("/v1/telnyx/webhook?q=secret-query", { method: "POST", headers, body: secretBody });
    await edge.fetch("/v1/health", { headers: bearer(edge.keys.adminToken) });
    await edge.fetch("/v1/health", { headers: bearer(edge.keys.policyToken) });
    await new Promise((resolve) => setTimeout(resolve, 200));

    const lines = edge.logs
      .map(({ message }) => {
        try {
          return JSON.parse(message);
        } catch {
          return null;
        }
      })
      .filter((line) => line && typeof line.path === "string");
    const webhook = lines.find((l) => l.path === "/v1/telnyx/webhook" && l.event_id === "evt-log");
    assert.ok(webhook, "the webhook was logged with its event id");
    assert.equal(webhook.method, "POST");
    assert.equal(typeof webhook.ms, "number");
    assert.equal(webhook.to, "+*******0079");
    assert.ok(lines.some((l) => l.path === "/v1/health" && l.status === 403 && l.error === "forbidden"));

    const everything = edge.logs.map(({ message }) => message).join("\n");
    for (const secret of [
      edge.keys.adminToken,
      edge.keys.policyToken,
      edge.keys.edge.seed,
      edge.keys.mediaKey,
      headers["telnyx-signature-ed25519"],
      "+15102160079",
      "secret-query",
      '"payload"',
    ]) {
      assert.ok(!everything.includes(secret), `logs must not contain ${secret}`);
    }
  });
});

describe("configuration fails closed per capability", () => {
  test("bad media keys: node routes answer 503 misconfigured first, the rest works", async () => {
    const keys = testKeys();
    const edge = await startEdge({ keys, bindings: { ...bindingsFor(keys), MEDIA_TOKEN_KEYS: "m1:c2hvcnQ=" } });
    try {
      const healthz = await read(await edge.fetch("/healthz"));
      assert.deepEqual([healthz.status, healthz.body], [503, { status: "degraded" }]);

      for (const path of ["/v1/nodes/heartbeat", "/v1/fence", "/v1/claims", "/v1/media/verify"]) {
        // No signature and an oversized body: still misconfigured first.
        const res = await read(await edge.fetch(path, { method: "POST", body: "x".repeat(20000) }));
        assert.equal(res.status, 503, path);
        assert.deepEqual(res.body, { error: "misconfigured", capability: "node_routes" });
      }

      const webhook = await read(await edge.fetch("/v1/telnyx/webhook", { method: "POST", body: "{}" }));
      assert.deepEqual([webhook.status, webhook.body], [401, { error: "missing_signature" }]);
      assert.equal((await edge.fetch("/v1/keys")).status, 200);

      const health = await read(await edge.fetch("/v1/health", { headers: bearer(keys.adminToken) }));
      assert.equal(health.status, 200);
      assert.equal(health.body.status, "degraded");
      assert.deepEqual(health.body.capabilities, {
        ingress: "ok",
        node_routes: "misconfigured",
        admin: "ok",
        key_publication: "ok",
      });
      assert.equal(health.body.dispatcher, "reachable");
    } finally {
      await edge.dispose();
    }
  });

  test("no admin tokens: admin routes answer 503 before 401; ingress and nodes unaffected", async () => {
    const keys = testKeys();
    const bindings = bindingsFor(keys);
    delete bindings.ADMIN_TOKENS;
    const edge = await startEdge({ keys, bindings });
    try {
      for (const [method, path] of [["GET", "/v1/health"], ["GET", "/v1/status"], ["PUT", "/v1/nodes"]]) {
        const res = await read(await edge.fetch(path, { method, headers: bearer(keys.policyToken) }));
        assert.equal(res.status, 503, path);
        assert.deepEqual(res.body, { error: "misconfigured", capability: "admin" });
      }
      const heartbeat = await read(await edge.fetch("/v1/nodes/heartbeat", { method: "POST", body: "{}" }));
      assert.deepEqual([heartbeat.status, heartbeat.body], [401, { error: "bad_node_signature" }]);
      assert.equal((await edge.fetch("/healthz")).status, 503);
    } finally {
      await edge.dispose();
    }
  });

  test("a bad Telnyx key disables ingress only; a bad next-key list only /v1/keys", async () => {
    const keys = testKeys();
    const edge = await startEdge({
      keys,
      bindings: { ...bindingsFor(keys), TELNYX_PUBLIC_KEY: "bm90IGEga2V5", EDGE_NEXT_PUBLIC_KEYS: "[{}]" },
    });
    try {
      const webhook = await read(await edge.fetch("/v1/telnyx/webhook", { method: "POST", body: "{}" }));
      assert.deepEqual([webhook.status, webhook.body], [503, { error: "misconfigured", capability: "ingress" }]);
      const published = await read(await edge.fetch("/v1/keys"));
      assert.deepEqual(
        [published.status, published.body],
        [503, { error: "misconfigured", capability: "key_publication" }],
      );
      const health = await read(await edge.fetch("/v1/health", { headers: bearer(keys.adminToken) }));
      assert.deepEqual(health.body.capabilities, {
        ingress: "misconfigured",
        node_routes: "ok",
        admin: "ok",
        key_publication: "misconfigured",
      });
    } finally {
      await edge.dispose();
    }
  });
});

describe("restart", () => {
  test("the Dispatcher comes back on the same storage (migrations are idempotent)", async () => {
    const edge = await startEdge();
    try {
      const ask = () => edge.fetch("/v1/health", { headers: bearer(edge.keys.adminToken) }).then(read);
      assert.equal((await ask()).body.dispatcher, "reachable");
      await edge.restart();
      const after = await ask();
      assert.equal(after.status, 200);
      assert.equal(after.body.dispatcher, "reachable");
      assert.deepEqual(after.body.documents, { policy: false, nodes: false });
    } finally {
      await edge.dispose();
    }
  });
});
