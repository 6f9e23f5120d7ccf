// The two versioned documents (SPEC §4) through the real Worker and Dispatcher:
// absence, compare-and-set, validation, history, limits, node_in_use, caller
// override stamping and expiry; bearer token scopes (§2, §3); the dashboard.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { bearer, ed25519, read, startEdge } from "./harness.mjs";
import { admin, callEvent, heartbeat, registryFor, setupCluster, webhook } from "./fixtures.mjs";

const json = (body) => JSON.stringify(body);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const iso = (ms) => new Date(ms).toISOString();
const HOUR = 3600 * 1000;

// ------------------------------------------------------------ local setup ----

function nodeEntry(key, origin, extra = {}) {
  return { role: "stable", origin_url: origin, keys: { k1: key.publicKey }, canary_go: false, fallback_approved: false, admin_drained: false, ...extra };
}

function putDoc(edge, path, doc, { ifMatch, token = edge.keys.adminToken } = {}) {
  const headers = { ...bearer(token), "content-type": "application/json" };
  if (ifMatch !== undefined) headers["if-match"] = ifMatch;
  return edge.fetch(path, { method: "PUT", headers, body: typeof doc === "string" ? doc : json(doc) }).then(read);
}

function getDoc(edge, path, token = edge.keys.adminToken) {
  return edge.fetch(path, { headers: bearer(token) }).then(read);
}

// ------------------------------------------------------------------ tests ----

describe("documents: /v1/nodes and /v1/policy", () => {
  let edge;
  const m1 = ed25519();
  const m2 = ed25519();
  const o1 = "http://127.0.0.1:9/callfence/telnyx";
  const registry = (extra = {}) => ({ schema: "callfence_nodes_v1", nodes: { M1: nodeEntry(m1, o1), ...extra } });
  const policy = (extra = {}) => ({ schema: "riff_node_routing_policy_v1", default_node: "M1", by_line: {}, by_caller: {}, ...extra });

  before(async () => {
    edge = await startEdge();
  });
  after(() => edge?.dispose());

  test("both documents start absent", async () => {
    const nodes = await getDoc(edge, "/v1/nodes");
    assert.deepEqual([nodes.status, nodes.body.error], [404, "no_nodes"]);
    const pol = await getDoc(edge, "/v1/policy");
    assert.deepEqual([pol.status, pol.body.error], [404, "no_policy"]);
  });

  test("a PUT with no precondition is 428 and stores nothing", async () => {
    for (const [path, doc] of [["/v1/nodes", registry()], ["/v1/policy", policy()]]) {
      const res = await putDoc(edge, path, doc);
      assert.equal(res.status, 428, `${path}: ${json(res.body)}`);
      assert.equal(typeof res.body.error, "string");
    }
    assert.equal((await getDoc(edge, "/v1/nodes")).status, 404);
  });

  test('If-Match "0" creates revision 1; GET answers it with its ETag', async () => {
    for (const [path, doc] of [["/v1/nodes", registry()], ["/v1/policy", policy()]]) {
      const res = await putDoc(edge, path, doc, { ifMatch: '"0"' });
      assert.equal(res.status, 200, `${path}: ${json(res.body)}`);
      assert.deepEqual(res.body, { revision: 1 });
      assert.equal(res.headers.get("etag"), '"1"');
      const got = await getDoc(edge, path);
      assert.equal(got.status, 200);
      assert.equal(got.headers.get("etag"), '"1"');
      assert.deepEqual(got.body, { ...doc, revision: 1 });
    }
  });

  test("a body revision works without If-Match; a stale one is 412 and changes nothing", async () => {
    const two = registry({ M2: nodeEntry(m2, "http://127.0.0.1:10/callfence/telnyx") });
    const res = await putDoc(edge, "/v1/nodes", { ...two, revision: 1 });
    assert.deepEqual([res.status, res.body], [200, { revision: 2 }]);
    assert.equal(res.headers.get("etag"), '"2"');

    const stale = await putDoc(edge, "/v1/nodes", registry(), { ifMatch: '"1"' });
    assert.deepEqual([stale.status, stale.body], [412, { error: "revision_conflict", current_revision: 2 }]);
    const staleBody = await putDoc(edge, "/v1/nodes", { ...registry(), revision: 0 });
    assert.deepEqual([staleBody.status, staleBody.body.current_revision], [412, 2]);
    const stalePolicy = await putDoc(edge, "/v1/policy", policy({ default_node: "M2" }), { ifMatch: '"7"' });
    assert.deepEqual([stalePolicy.status, stalePolicy.body], [412, { error: "revision_conflict", current_revision: 1 }]);

    // If-Match, when present, is the precondition; a body revision is then ignored.
    const both = await putDoc(edge, "/v1/nodes", { ...two, revision: 2 }, { ifMatch: '"1"' });
    assert.deepEqual([both.status, both.body.current_revision], [412, 2]);

    const got = await getDoc(edge, "/v1/nodes");
    assert.deepEqual(got.body, { ...two, revision: 2 });
    assert.equal((await getDoc(edge, "/v1/policy")).body.default_node, "M1");
  });

  test("?revision=N returns an older revision with its number", async () => {
    const old = await getDoc(edge, "/v1/nodes?revision=1");
    assert.equal(old.status, 200);
    assert.deepEqual(old.body, { ...registry(), revision: 1 });
    assert.equal((await getDoc(edge, "/v1/nodes?revision=99")).status, 404);
    const pol = await getDoc(edge, "/v1/policy?revision=1");
    assert.deepEqual([pol.status, pol.body.revision, pol.headers.get("etag")], [200, 1, '"1"']);
  });

  test("an invalid document is 400 with details; the revision in force stays", async () => {
    const bad = registry({ "bad id!": { ...nodeEntry(ed25519(), o1), role: "boss" } });
    const res = await putDoc(edge, "/v1/nodes", bad, { ifMatch: '"2"' });
    assert.equal(res.status, 400);
    assert.equal(res.body.error, "invalid_document");
    assert.ok(Array.isArray(res.body.details) && res.body.details.length >= 1);
    for (const d of res.body.details) {
      assert.equal(typeof d.path, "string");
      assert.equal(typeof d.problem, "string");
    }
    const pol = await putDoc(edge, "/v1/policy", policy({ default_node: "M7" }), { ifMatch: '"1"' });
    assert.deepEqual([pol.status, pol.body.error], [400, "invalid_document"]);
    assert.ok(pol.body.details.some((d) => d.path.includes("default_node")), json(pol.body));
    const line = policy({ by_line: { sales: { called_number: "+15550001111", preferred_node: "M9" } } });
    const lineRes = await putDoc(edge, "/v1/policy", line, { ifMatch: '"1"' });
    assert.equal(lineRes.status, 400);
    assert.ok(lineRes.body.details.some((d) => d.path.includes("sales")), json(lineRes.body));

    assert.equal((await getDoc(edge, "/v1/nodes")).body.revision, 2);
    assert.equal((await getDoc(edge, "/v1/policy")).body.revision, 1);
  });

  test("a body over 256 KiB is 413 for both documents", async () => {
    const big = json({ ...registry(), pad: "x".repeat(256 * 1024) });
    for (const path of ["/v1/nodes", "/v1/policy"]) {
      const res = await putDoc(edge, path, big, { ifMatch: '"1"' });
      assert.equal(res.status, 413, path);
    }
  });

  test("caller overrides: created_at is the server's, no renewal past created_at + 24 h", async () => {
    const caller = "+14155550100";
    const start = Date.now();
    const first = policy({
      by_caller: { [caller]: { preferred_node: "M2", expires_at: iso(start + 23 * HOUR), created_at: "2020-01-01T00:00:00.000Z" } },
    });
    const put1 = await putDoc(edge, "/v1/policy", first, { ifMatch: '"1"' });
    assert.deepEqual([put1.status, put1.body], [200, { revision: 2 }], json(put1.body));
    const got = await getDoc(edge, "/v1/policy");
    const createdAt = Date.parse(got.body.by_caller[caller].created_at);
    assert.ok(Math.abs(createdAt - start) < 5000, `created_at ${got.body.by_caller[caller].created_at} is the server's`);

    // A client created_at cannot buy a longer override.
    const forged = policy({
      by_caller: { "+14155550101": { preferred_node: "M2", expires_at: iso(start + 25 * HOUR), created_at: iso(start + 2 * HOUR) } },
    });
    assert.equal((await putDoc(edge, "/v1/policy", forged, { ifMatch: '"2"' })).status, 400);

    await sleep(2200);
    // Rewriting the same override with a later expiry is refused...
    const renewed = policy({ by_caller: { [caller]: { preferred_node: "M2", expires_at: iso(createdAt + 24 * HOUR + 1000) } } });
    const refused = await putDoc(edge, "/v1/policy", renewed, { ifMatch: '"2"' });
    assert.equal(refused.status, 400, json(refused.body));
    assert.equal(refused.body.error, "invalid_document");
    assert.ok(refused.body.details.some((d) => d.path.includes("by_caller")), json(refused.body));
    assert.equal((await getDoc(edge, "/v1/policy")).body.revision, 2);

    // ...but removing it and adding it again later restarts the clock.
    assert.equal((await putDoc(edge, "/v1/policy", policy(), { ifMatch: '"2"' })).status, 200);
    const again = await putDoc(edge, "/v1/policy", renewed, { ifMatch: '"3"' });
    assert.equal(again.status, 200, json(again.body));
    const restamped = Date.parse((await getDoc(edge, "/v1/policy")).body.by_caller[caller].created_at);
    assert.ok(restamped > createdAt + 2000);
  });

  test("an expired override is dropped on write: GET-then-PUT succeeds", async () => {
    const caller = "+14155550199";
    const current = (await getDoc(edge, "/v1/policy")).body;
    const soon = { ...current, by_caller: { ...current.by_caller, [caller]: { preferred_node: "M1", expires_at: iso(Date.now() + 3000) } } };
    const put = await putDoc(edge, "/v1/policy", soon);
    assert.equal(put.status, 200, json(put.body));
    assert.ok((await getDoc(edge, "/v1/policy")).body.by_caller[caller], "stored while unexpired");
    await sleep(3500);
    // Expired: shown as such, and it routes nothing.
    const status = (await getDoc(edge, "/v1/status")).body;
    const shown = status.overrides.find((o) => o.caller === caller);
    assert.deepEqual([shown?.expired, shown?.prefers], [true, "M1"], json(status.overrides));
    assert.equal(status.overrides.find((o) => o.caller === "+14155550100")?.expired, false);
    const preview = await edge
      .fetch("/v1/routing/preview", { method: "POST", headers: bearer(edge.keys.adminToken), body: json({ to: "+15550001111", from: caller }) })
      .then(read);
    assert.deepEqual([preview.status, preview.body.rule], [200, "default"], json(preview.body));
    const roundTrip = (await getDoc(edge, "/v1/policy")).body;
    const res = await putDoc(edge, "/v1/policy", roundTrip);
    assert.equal(res.status, 200, json(res.body));
    const stored = (await getDoc(edge, "/v1/policy")).body;
    assert.equal(stored.revision, res.body.revision);
    assert.equal(stored.by_caller[caller], undefined);
    assert.ok(stored.by_caller["+14155550100"], "the unexpired override stays");
  });
});

describe("node_in_use: a node that owns an open call", () => {
  let cluster;
  before(async () => {
    // M2 is the default but never beats: the call falls back to M1.
    const policy = { schema: "riff_node_routing_policy_v1", default_node: "M2", by_line: {}, by_caller: {} };
    cluster = await setupCluster({ nodes: ["M1", "M2"], policy, beat: false });
  });
  after(() => cluster?.dispose());

  test("cannot be removed, nor lose its key, while the call is open", async () => {
    const { edge, nodes } = cluster;
    const beat = await heartbeat(edge, nodes.M1);
    assert.equal(beat.status, 200, json(beat.body));
    const delivered = await webhook(edge, callEvent("call.initiated", { session: "sess-inuse", leg: "leg-inuse", from: "+14155550111", to: "+15550001111" }));
    assert.deepEqual([delivered.status, delivered.body.delivered_to], [200, "M1"], json(delivered.body));
    assert.equal(nodes.M1.origin.requests.length, 1);

    const reg = registryFor([nodes.M1, nodes.M2]);
    const removed = await putDoc(edge, "/v1/nodes", registryFor([nodes.M2]), { ifMatch: '"1"' });
    assert.deepEqual([removed.status, removed.body.error], [409, "node_in_use"], json(removed.body));
    const rekeyed = { ...reg, nodes: { ...reg.nodes, M1: { ...reg.nodes.M1, keys: { k2: ed25519().publicKey } } } };
    const rekey = await putDoc(edge, "/v1/nodes", rekeyed, { ifMatch: '"1"' });
    assert.deepEqual([rekey.status, rekey.body.error], [409, "node_in_use"], json(rekey.body));
    assert.equal((await getDoc(edge, "/v1/nodes")).body.revision, 1);

    // Adding a key to M1, or removing M2 (no open calls), is fine.
    const added = { schema: "callfence_nodes_v1", nodes: { M1: { ...reg.nodes.M1, keys: { k1: nodes.M1.key.publicKey, k2: ed25519().publicKey } } } };
    const pol = await putDoc(edge, "/v1/policy", { schema: "riff_node_routing_policy_v1", default_node: "M1" }, { ifMatch: '"1"' });
    assert.equal(pol.status, 200, json(pol.body));
    const ok = await putDoc(edge, "/v1/nodes", added, { ifMatch: '"1"' });
    assert.deepEqual([ok.status, ok.body], [200, { revision: 2 }]);
  });
});

describe("bearer token scopes and the dashboard", () => {
  let edge;
  before(async () => {
    edge = await startEdge();
    const reg = { schema: "callfence_nodes_v1", nodes: { M1: nodeEntry(ed25519(), "http://127.0.0.1:9/callfence/telnyx") } };
    await putDoc(edge, "/v1/nodes", reg, { ifMatch: '"0"' });
  });
  after(() => edge?.dispose());

  const call = (method, path, token, body) =>
    edge
      .fetch(path, {
        method,
        headers: { ...(token ? bearer(token) : {}), "content-type": "application/json" },
        body: body === undefined ? undefined : json(body),
      })
      .then(read);

  test("a policy token reaches the panel routes", async () => {
    const t = edge.keys.policyToken;
    const pol = { schema: "riff_node_routing_policy_v1", default_node: "M1", by_line: {}, by_caller: {} };
    const put = await call("PUT", "/v1/policy", t, { ...pol, revision: 0 });
    assert.deepEqual([put.status, put.body], [200, { revision: 1 }]);
    assert.equal((await call("GET", "/v1/policy", t)).body.revision, 1);
    const preview = await call("POST", "/v1/routing/preview", t, { to: "+15550001111", from: "+14155550100" });
    assert.equal(preview.status, 200, json(preview.body));
    assert.equal(preview.body.prefers, "M1");
    assert.equal((await call("GET", "/v1/status", t)).status, 200);
    const decisions = await call("GET", "/v1/decisions", t);
    assert.deepEqual([decisions.status, decisions.body], [200, { decisions: [], shards_unreachable: [] }]);
    const unknown = await call("GET", "/v1/calls/nope", t);
    assert.deepEqual([unknown.status, unknown.body.error], [404, "unknown_call"]);
  });

  test("a policy token is forbidden on the node registry and health", async () => {
    const t = edge.keys.policyToken;
    for (const [method, path, body] of [["GET", "/v1/nodes"], ["PUT", "/v1/nodes", { revision: 1 }], ["GET", "/v1/health"]]) {
      const res = await call(method, path, t, body);
      assert.deepEqual([res.status, res.body], [403, { error: "forbidden" }], `${method} ${path}`);
    }
    assert.equal((await call("GET", "/v1/nodes", edge.keys.adminToken)).body.revision, 1);
  });

  test("no token or a wrong one is 401 on every bearer route", async () => {
    const routes = [
      ["GET", "/v1/policy"], ["PUT", "/v1/policy", {}], ["GET", "/v1/nodes"], ["PUT", "/v1/nodes", {}],
      ["POST", "/v1/routing/preview", { to: "+15550001111" }], ["GET", "/v1/status"], ["GET", "/v1/decisions"],
      ["GET", "/v1/calls/x"], ["GET", "/v1/health"],
    ];
    for (const [method, path, body] of routes) {
      for (const t of [undefined, "f".repeat(48), `${edge.keys.policyToken}x`]) {
        const res = await call(method, path, t, body);
        assert.deepEqual([res.status, res.body], [401, { error: "unauthorized" }], `${method} ${path}`);
      }
    }
  });

  test("GET / serves the dashboard without a token, with a CSP", async () => {
    const res = await edge.fetch("/");
    assert.equal(res.status, 200);
    assert.match(res.headers.get("content-type"), /^text\/html/);
    const csp = res.headers.get("content-security-policy") ?? "";
    assert.match(csp, /default-src 'none'/, csp);
    assert.match(csp, /connect-src 'self'/, csp);
    assert.equal(res.headers.get("cache-control"), "no-store");
    const page = await res.text();
    assert.match(page, /<html/i);
    // The token is typed in and kept in memory only.
    assert.doesNotMatch(page, /localStorage|sessionStorage|document\.cookie/);
  });
});

describe("status before anything happened", () => {
  test("the engine is not operative and nodes without beats say no_heartbeat", async () => {
    const cluster = await setupCluster({ nodes: ["M1"], beat: false });
    try {
      const s = (await admin(cluster.edge, "/v1/status")).body;
      assert.deepEqual(s.engine, { operative: false, last_webhook_at: null });
      const m1 = s.nodes[0];
      assert.deepEqual([m1.node, m1.heartbeat_age_s, m1.eligible, m1.capacity.max_calls], ["M1", null, false, null]);
      assert.ok(m1.reasons.includes("no_heartbeat"));
      assert.deepEqual(s.recent_decisions, []);
      const denied = await read(await cluster.edge.fetch("/v1/status", { headers: bearer(ed25519().seed) }));
      assert.equal(denied.status, 401);
    } finally {
      await cluster.dispose();
    }
  });
});
