// Issue 18, finding 4, in real workerd: one node key against the others.
// A node's claims count against its capacity and pass a token bucket
// (SPEC §7.4), and a flood of them cannot evict another node's live call at
// the row cap: new sessions are refused 503 storage_full instead (§9).

import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { admin, callEvent, fence, nodePost, setupCluster, webhook } from "./fixtures.mjs";

const claim = (edge, node, i) =>
  nodePost(edge, node, "/v1/claims", { call_control_id: `v3:flood-leg-${i}`, call_session_id: `flood-${i}` });

/** `count` claims of fresh sessions by `node`, `batch` at a time. */
async function flood(edge, node, count, batch = 20) {
  const answers = [];
  for (let i = 0; i < count; i += batch) {
    const ids = Array.from({ length: Math.min(batch, count - i) }, (_, k) => i + k);
    answers.push(...(await Promise.all(ids.map((id) => claim(edge, node, id)))));
  }
  return answers;
}

const byCode = (answers) => {
  const codes = {};
  for (const a of answers) {
    const code = a.status === 200 ? "claimed" : a.body.error;
    codes[code] = (codes[code] ?? 0) + 1;
  }
  return codes;
};

describe("a node's claims are bounded by its capacity and rate", () => {
  let cluster;
  before(async () => {
    cluster = await setupCluster({ nodes: ["M1", "M2"], perNode: { M2: { max_calls: 5 } } });
  });
  after(() => cluster?.dispose());

  test("400 claims from one node with max_calls 5: 5 claimed, the rest refused, nothing stored for them", async () => {
    const { edge } = cluster;
    const { M2 } = cluster.nodes;
    const answers = await flood(edge, M2, 400);
    const codes = byCode(answers);
    assert.equal(codes.claimed, 5, JSON.stringify(codes));
    assert.deepEqual(Object.keys(codes).sort(), ["capacity_exhausted", "claimed", "rate_limited"], JSON.stringify(codes));
    for (const a of answers.filter((a) => a.status !== 200)) {
      if (a.body.error === "capacity_exhausted") {
        assert.equal(a.status, 409);
        assert.deepEqual([a.body.claimed, a.body.reason], [false, "capacity_exhausted"]);
      } else {
        assert.equal(a.status, 429);
        assert.ok(Number(a.headers.get("retry-after")) >= 1, "Retry-After");
      }
    }
    const status = await admin(edge, "/v1/status");
    const m2 = status.body.nodes.find((n) => n.node === "M2");
    assert.equal(m2.capacity.open_calls, 5);
    assert.equal(status.body.counts.sessions, 5);
    assert.equal(
      status.body.counts.claims_capacity_exhausted + status.body.counts.claims_rate_limited,
      395,
      JSON.stringify(status.body.counts),
    );
    // A refused claim stored no session.
    const refused = answers.findIndex((a) => a.status !== 200);
    assert.equal((await admin(edge, `/v1/calls/flood-${refused}`)).status, 404);
  });
});

describe("a claim flood against a small SESSION_CAP cannot evict a live call", () => {
  let cluster;
  before(async () => {
    // SESSION_CAP caps each shard's own sessions table; this test counts
    // one table, so it keeps one shard under the e2e matrix.
    cluster = await setupCluster({ nodes: ["M1", "M2"], bindings: { SESSION_CAP: "3" }, shards: 1 });
  });
  after(() => cluster?.dispose());

  test("M1's fenced call keeps its owner, epoch and fence; new sessions get 503 storage_full", async () => {
    const { edge } = cluster;
    const { M1, M2 } = cluster.nodes;
    const init = await webhook(edge, callEvent("call.initiated", { session: "live-1", leg: "live-1-a" }));
    assert.equal(init.status, 200, JSON.stringify(init.body));
    assert.equal(init.body.delivered_to, "M1");
    const epoch = init.body.epoch;
    const grant = await fence(edge, M1, { call_session_id: "live-1", call_control_id: "live-1-a", epoch });
    assert.equal(grant.status, 200, JSON.stringify(grant.body));
    const answered = await webhook(edge, callEvent("call.answered", { session: "live-1", leg: "live-1-a" }));
    assert.equal(answered.status, 200);

    const answers = await flood(edge, M2, 60, 10);
    const codes = byCode(answers);
    assert.equal(codes.claimed, 2, JSON.stringify(codes)); // the cap: live-1 and two claims
    assert.ok(codes.storage_full >= 1, JSON.stringify(codes));
    for (const a of answers.filter((a) => a.body.error === "storage_full")) {
      assert.equal(a.status, 503);
      assert.ok(Number(a.headers.get("retry-after")) >= 1, "Retry-After");
    }

    // A new inbound session is refused, stored nowhere; Telnyx retries it.
    const fresh = await webhook(edge, callEvent("call.initiated", { session: "fresh-1", leg: "fresh-1-a" }));
    assert.equal(fresh.status, 503, JSON.stringify(fresh.body));
    assert.equal(fresh.body.error, "storage_full");
    assert.ok(Number(fresh.headers.get("retry-after")) >= 1);
    assert.equal((await admin(edge, "/v1/calls/fresh-1")).status, 404);

    // The live call is intact and its next event still goes to M1 at its epoch.
    const call = await admin(edge, "/v1/calls/live-1");
    assert.equal(call.status, 200);
    assert.deepEqual([call.body.owner, call.body.epoch, call.body.fence?.command_id], ["M1", epoch, grant.body.command_id]);
    assert.equal(call.body.events.length, 2);
    const next = await webhook(edge, callEvent("call.playback.started", { session: "live-1", leg: "live-1-a" }));
    assert.equal(next.status, 200, JSON.stringify(next.body));
    assert.deepEqual([next.body.delivered_to, next.body.epoch], ["M1", epoch]);
    const second = await fence(edge, M2, { call_session_id: "live-1", call_control_id: "live-1-a", epoch });
    assert.equal(second.status, 409);
    const regrant = await fence(edge, M1, { call_session_id: "live-1", call_control_id: "live-1-a", epoch });
    assert.equal(regrant.status, 200);
    assert.deepEqual([regrant.body.first, regrant.body.command_id], [false, grant.body.command_id]);
    const media = await nodePost(edge, M1, "/v1/media/verify", { media_token: grant.body.media_token });
    assert.equal(media.status, 200, JSON.stringify(media.body));
    assert.equal(media.body.epoch, epoch);

    const counts = (await admin(edge, "/v1/status")).body.counts;
    assert.equal(counts.sessions, 3);
    assert.equal(counts.session_cap, 3);
    assert.ok(counts.storage_full >= 2, JSON.stringify(counts));
  });

  test("a misconfigured SESSION_CAP names itself and fails ingress closed", async () => {
    const bad = await setupCluster({ nodes: ["M1"], bindings: { SESSION_CAP: "100k" }, beat: false });
    try {
      const health = await admin(bad.edge, "/v1/health");
      assert.equal(health.body.capabilities.ingress, "misconfigured");
      const res = await webhook(bad.edge, callEvent("call.initiated", { session: "x-1", leg: "x-1-a" }));
      assert.equal(res.status, 503);
      assert.deepEqual([res.body.error, res.body.capability], ["misconfigured", "ingress"]);
    } finally {
      await bad.dispose();
    }
  });
});
