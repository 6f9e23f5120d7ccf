// The L5 probe route `POST /v1/nodes/probe` (SPEC §14) against real agents
// and demo apps: it goes through the public path to the app and back, one per
// node per 5 s, a drained node admits it, a forged probe sent straight to an
// agent never reaches its app, and the edge stores nothing for it.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { sign as cryptoSign } from "node:crypto";
import { nodeHeaders, nowSeconds, read, sha256Hex } from "./harness.mjs";
import { startCluster, standardPolicy } from "./agents-cluster.mjs";

describe("the L5 probe", () => {
  let c;
  before(async () => {
    c = await startCluster({ nodes: { M1: {}, M2: {}, M3: {} }, policy: standardPolicy });
  });
  after(() => c?.close());

  const probe = async (id, nonce) => {
    const n = c.nodes[id];
    const body = JSON.stringify({ nonce });
    const url = new URL("/v1/nodes/probe", c.edge.url).toString();
    const headers = nodeHeaders({ url, body, node: id, kid: n.key.kid, privateKey: n.key.privateKeyObject });
    return read(await c.edge.fetch("/v1/nodes/probe", { method: "POST", headers, body }));
  };
  const appProbes = async (id) => (await (await fetch(`${c.nodes[id].appUrl}/demo/events`)).json()).probes;

  test("a probe reaches the app through the public path; a second within 5 s is 429 with Retry-After", async () => {
    const nonce = `first-probe-${Date.now()}`;
    const res = await probe("M1", nonce);
    assert.equal(res.status, 200, JSON.stringify(res.body));
    assert.equal(res.body.ok, true, JSON.stringify(res.body));
    assert.equal(res.body.status, 200);
    assert.equal(res.body.reason, "ok");
    assert.ok(Number.isInteger(res.body.latency_ms));
    assert.ok((await appProbes("M1")).includes(nonce), "the app saw Callfence-Probe");

    const again = await probe("M1", `second-probe-${Date.now()}`);
    assert.equal(again.status, 429, JSON.stringify(again.body));
    assert.equal(again.body.error, "rate_limited");
    const retry = Number(again.headers.get("retry-after"));
    assert.ok(retry >= 1 && retry <= 5, `Retry-After ${retry}`);
    assert.equal((await appProbes("M1")).length, 1, "the refused probe was not sent");
  });

  test("a bad nonce is 400 and sends nothing", async () => {
    for (const nonce of ["short", "x".repeat(65), "has spaces in it here", 7]) {
      const res = await probe("M2", nonce);
      assert.equal(res.status, 400, JSON.stringify(res.body));
    }
    assert.deepEqual(await appProbes("M2"), []);
  });

  test("a drained node admits a probe", async () => {
    assert.equal(c.nodes.M2.cli("mode", "set", "drained").status, 0);
    await c.waitNode("M2", "drained", (n) => n.mode === "drained");
    const nonce = `drained-probe-${Date.now()}`;
    const res = await probe("M2", nonce);
    assert.equal(res.body.ok, true, JSON.stringify(res.body));
    assert.ok((await appProbes("M2")).includes(nonce));
    assert.equal(c.nodes.M2.cli("mode", "set", "active").status, 0);
    await c.waitEligible("M2");
  });

  test("a forged probe sent straight to the agent never reaches the app", async () => {
    const m3 = c.nodes.M3;
    const nonce = `forged-probe-${Date.now()}`;
    const body = JSON.stringify({ data: { event_type: "callfence.probe", id: nonce, payload: { node: "M3" } } });
    const mint = (claims, privateKey = c.keys.edge.privateKeyObject, kid = c.keys.edgeKid) => {
      const payload = Buffer.from(JSON.stringify(claims)).toString("base64url");
      const sig = cryptoSign(null, Buffer.from(`v1.${kid}.${payload}`), privateKey).toString("base64url");
      return `v1.${kid}.${payload}.${sig}`;
    };
    const iat = nowSeconds();
    const probeClaims = { iss: "callfence-edge", node: "M3", probe: true, event_id: nonce, body_sha256: sha256Hex(body), iat, exp: iat + 60 };
    const forgeries = {
      "no assertion": null,
      "a webhook assertion over the probe body": c.assertion({ node: "M3", body, session: "s-forged", ccid: "c-forged", eventId: nonce }),
      "signed by an unpinned key": mint(probeClaims, (await import("./harness.mjs")).ed25519().privateKeyObject),
      "another node's probe": mint({ ...probeClaims, node: "M1" }),
      "another nonce": mint({ ...probeClaims, event_id: `other-${nonce}` }),
    };
    for (const [what, assertion] of Object.entries(forgeries)) {
      const headers = { "content-type": "application/json" };
      if (assertion) headers["callfence-assertion"] = assertion;
      const res = await read(await fetch(m3.originUrl, { method: "POST", headers, body }));
      assert.equal(res.status, 401, `${what}: ${JSON.stringify(res.body)}`);
      assert.deepEqual(res.body, { callfence: "not_admitted" }, what);
    }
    // A probe assertion never admits a call event either.
    const call = JSON.stringify({ data: { event_type: "call.initiated", id: nonce, payload: { call_session_id: "s-x", call_control_id: "c-x" } } });
    const asWebhook = await read(
      await fetch(m3.originUrl, {
        method: "POST",
        headers: { "content-type": "application/json", "callfence-assertion": mint({ ...probeClaims, body_sha256: sha256Hex(call) }) },
        body: call,
      }),
    );
    assert.equal(asWebhook.status, 401);
    assert.deepEqual(await appProbes("M3"), [], "no forged probe reached the app");
    assert.equal((await (await fetch(`${m3.appUrl}/demo/events`)).json()).events.length, 0);
    // The genuine article, by contrast, gets through.
    const res = await probe("M3", `genuine-probe-${Date.now()}`);
    assert.equal(res.body.ok, true, JSON.stringify(res.body));
  });

  test("the edge stores no call, event or decision for a probe", async () => {
    const before = await c.status();
    const nonce = `stored-nothing-${Date.now()}`;
    // M1 probed at least 5 s ago by now, or wait out the rate limit.
    let res;
    for (let i = 0; i < 12; i += 1) {
      res = await probe("M1", nonce);
      if (res.status !== 429) break;
      await new Promise((r) => setTimeout(r, 1_000));
    }
    assert.equal(res.body.ok, true, JSON.stringify(res.body));
    assert.equal((await c.call(nonce)).status, 404);
    const decisions = (await c.edge.fetch("/v1/decisions?limit=500", { headers: { authorization: `Bearer ${c.keys.adminToken}` } }).then(read)).body.decisions;
    assert.ok(!JSON.stringify(decisions).includes(nonce), "no decision names the probe");
    const after = await c.status();
    assert.deepEqual(after.counts, before.counts);
    assert.equal(after.engine.last_webhook_at, before.engine.last_webhook_at);
  });
});
