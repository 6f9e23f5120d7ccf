// The paged admin reads end to end (real Worker and Dispatcher in
// Miniflare): GET /v1/calls (whole calls, the shape of GET /v1/calls/{id}),
// GET /v1/decisions?after= (oldest first) and GET /v1/events (the ledger's
// raw webhooks, the replay export): cursors, limits, guards, bad input.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { bearer, E2E_SHARDS, read, readPages } from "./harness.mjs";
import { admin, callEvent, setupCluster, webhook } from "./fixtures.mjs";

const LINE = "+15102160079";
const MARKER = "paged-views-marker-7f3a";

describe("paged admin reads", () => {
  let cluster;
  let edge;
  const sent = []; // raw bodies, in the order the edge received them
  const sessions = [];
  before(async () => {
    cluster = await setupCluster({ nodes: ["M1"] });
    ({ edge } = cluster);
    for (let i = 0; i < 7; i += 1) {
      const session = `pv-${String(6 - i).padStart(2, "0")}`; // sent out of id order
      sessions.push(session);
      for (const type of ["call.initiated", "call.hangup"]) {
        const body = JSON.stringify(callEvent(type, { session, leg: `${session}-a`, from: "+14155550100", to: LINE, payload: { client_state: MARKER } }));
        const res = await webhook(edge, body);
        assert.equal(res.status, 200, `${type} ${session}: ${JSON.stringify(res.body)}`);
        sent.push(body);
      }
    }
    sessions.sort();
  });
  after(() => cluster?.dispose());

  test("GET /v1/calls pages through every call in id order, each as GET /v1/calls/{id} shows it", async () => {
    const first = await admin(edge, "/v1/calls?limit=3");
    assert.equal(first.status, 200);
    assert.deepEqual(first.body.calls.map((c) => c.call_session_id), sessions.slice(0, 3));
    assert.equal(first.body.next, sessions[2]);
    const all = await readPages(edge, edge.keys.adminToken, "/v1/calls", "calls", { limit: 3 });
    assert.deepEqual(all.map((c) => c.call_session_id), sessions);
    for (const call of all) {
      const one = await admin(edge, `/v1/calls/${call.call_session_id}`);
      assert.deepEqual(call, one.body);
    }
    const last = await admin(edge, `/v1/calls?after=${sessions[6]}`);
    assert.deepEqual(last.body, { calls: [], next: null, shards_unreachable: [] });
    const middle = await admin(edge, `/v1/calls?after=${sessions[4]}&limit=100`);
    assert.deepEqual([middle.body.calls.length, middle.body.next], [2, null]);
    const policy = await read(await edge.fetch("/v1/calls?limit=1", { headers: bearer(edge.keys.policyToken) }));
    assert.deepEqual([policy.status, policy.body.calls.length], [200, 1]);
  });

  test("GET /v1/decisions?after= pages by decision_id through the newest-first list's decisions", async () => {
    const newest = (await admin(edge, "/v1/decisions?limit=500")).body.decisions;
    assert.ok(newest.length >= 7);
    const all = await readPages(edge, edge.keys.adminToken, "/v1/decisions", "decisions", { after: 0, limit: 2 });
    const byId = (list) => [...list].sort((a, b) => a.decision_id - b.decision_id);
    assert.deepEqual(all, byId(newest), "ascending by decision_id, each once");
    // One shard's ids are its own order: oldest first, the newest list reversed
    // (across shards, ids carry their shard above bit 40: docs/sharding.md).
    if (E2E_SHARDS === 1) assert.deepEqual(all, [...newest].reverse());
    const one = await admin(edge, `/v1/decisions?after=0&limit=1&call_session_id=${sessions[3]}`);
    assert.deepEqual(one.body.decisions.map((d) => d.call_session_id), [sessions[3]]);
    assert.equal(one.body.next, one.body.decisions[0].decision_id);
  });

  test("GET /v1/events exports every webhook's raw body, in arrival order per shard, for the admin only", async () => {
    const events = await readPages(edge, edge.keys.adminToken, "/v1/events", "events", { limit: 4 });
    if (E2E_SHARDS === 1) {
      assert.deepEqual(events.map((e) => e.body), sent);
    } else {
      // Ascending by seq, which carries the shard above bit 40: every body
      // once, and each session's in the order sent.
      assert.deepEqual(events.map((e) => e.body).sort(), [...sent].sort());
      for (const session of sessions) {
        const mine = (list) => list.filter((b) => JSON.parse(b).data.payload.call_session_id === session);
        assert.deepEqual(mine(events.map((e) => e.body)), mine(sent), session);
      }
    }
    assert.deepEqual(events.map((e) => e.event_id), events.map((e) => JSON.parse(e.body).data.id));
    for (let i = 1; i < events.length; i += 1) assert.ok(events[i].seq > events[i - 1].seq);
    for (const e of events) {
      assert.match(e.received_at, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
      assert.equal(e.call_session_id, JSON.parse(e.body).data.payload.call_session_id);
      assert.equal(e.event_type, JSON.parse(e.body).data.event_type);
    }
    const tail = await admin(edge, `/v1/events?after=${events[events.length - 2].seq}`);
    assert.deepEqual([tail.body.events.length, tail.body.next], [1, null]);
    const policy = await read(await edge.fetch("/v1/events", { headers: bearer(edge.keys.policyToken) }));
    assert.deepEqual([policy.status, policy.body.error], [403, "forbidden"]);
    const anonymous = await read(await edge.fetch("/v1/events"));
    assert.equal(anonymous.status, 401);
    assert.ok(!edge.logs.some((l) => l.message.includes(MARKER)), "a raw body reached a log");
  });

  test("limits are clamped, bad cursors are 400 bad_request naming the parameter, other methods 405", async () => {
    assert.equal((await admin(edge, "/v1/calls?limit=0")).body.calls.length, 1);
    assert.equal((await admin(edge, "/v1/events?limit=0")).body.events.length, 1);
    assert.equal((await admin(edge, "/v1/events?limit=99999999999")).body.events.length, sent.length);
    for (const [path, parameter] of [
      ["/v1/calls?limit=-1", "limit"],
      ["/v1/calls?limit=ten", "limit"],
      ["/v1/calls?after=a%2Fb", "after"],
      ["/v1/calls?after=", "after"],
      [`/v1/calls?after=${"x".repeat(257)}`, "after"],
      ["/v1/events?after=-1", "after"],
      ["/v1/events?after=1.5", "after"],
      ["/v1/decisions?after=first", "after"],
    ]) {
      const res = await admin(edge, path);
      assert.deepEqual([res.status, res.body], [400, { error: "bad_request", parameter }], path);
    }
    for (const path of ["/v1/calls", "/v1/events"]) {
      const res = await admin(edge, path, { method: "POST" });
      assert.deepEqual([res.status, res.headers.get("allow")], [405, "GET"], path);
    }
  });
});
