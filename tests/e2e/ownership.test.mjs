// Call ownership end to end: epochs, fences, media tokens, ambiguous and
// refused forwards, fallback, and persistence across a restart, with the real
// Worker + Dispatcher in Miniflare and verifying loopback origins (SPEC §5, §7, §8).

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { admin, callEvent, fence, heartbeat, nodePost, setupCluster, sleep, waitFor, webhook } from "./fixtures.mjs";

const OK = () => ({ status: 200, body: { ok: true } });

function assertVerified(node) {
  for (const r of node.origin.requests) {
    assert.equal(r.assertion.ok, true, `assertion at ${node.id}: ${r.assertion.why}`);
    assert.equal(r.telnyxValid, true, `Telnyx signature at ${node.id}`);
  }
}
const received = (node, eventId) => node.origin.requests.filter((r) => JSON.parse(r.body).data.id === eventId);
const forSession = (node, session) => node.origin.requests.filter((r) => JSON.parse(r.body).data.payload.call_session_id === session);
const callOf = (edge, session) => admin(edge, `/v1/calls/${session}`);

/** SPEC §8: the deterministic answer command id. */
function commandId(leg, epoch) {
  const b = createHash("sha256").update(`callfence-answer|${leg}|${epoch}`).digest().subarray(0, 16);
  b[6] = (b[6] & 0x0f) | 0x50;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = b.toString("hex");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

describe("fences and media tokens", () => {
  let cluster;
  let edge;
  let M1;
  let M2;
  before(async () => {
    cluster = await setupCluster();
    ({ edge } = cluster);
    ({ M1, M2 } = cluster.nodes);
  });
  after(() => cluster?.dispose());

  test("concurrent fences by the owner: one grant with first:true, the others the same grant", async () => {
    const init = await webhook(edge, callEvent("call.initiated", { session: "f-1", leg: "f-1-a" }));
    assert.deepEqual([init.status, init.body.delivered_to], [200, "M1"]);
    const { epoch } = init.body;
    const ask = { call_session_id: "f-1", call_control_id: "f-1-a", epoch };
    const answers = await Promise.all([0, 1, 2, 3, 4, 5].map(() => fence(edge, M1, ask)));
    for (const a of answers) assert.equal(a.status, 200, JSON.stringify(a.body));
    assert.equal(answers.filter((a) => a.body.first === true).length, 1);
    assert.equal(answers.filter((a) => a.body.first === false).length, 5);
    for (const a of answers) {
      assert.equal(a.body.granted, true);
      assert.equal(a.body.epoch, epoch);
      assert.equal(a.body.command_id, commandId("f-1-a", epoch));
      assert.equal(a.body.media_token, answers[0].body.media_token);
      assert.equal(a.body.granted_at, answers[0].body.granted_at);
    }
    const other = await fence(edge, M2, ask);
    assert.deepEqual([other.status, other.body.granted, other.body.reason], [409, false, "not_owner"]);
    const stale = await fence(edge, M1, { ...ask, epoch: epoch + 1 });
    assert.deepEqual([stale.status, stale.body.reason], [409, "stale_epoch"]);
    const unknown = await fence(edge, M1, { ...ask, call_session_id: "f-nope" });
    assert.deepEqual([unknown.status, unknown.body.reason], [409, "unknown_call"]);
    const call = await callOf(edge, "f-1");
    assert.equal(call.body.fence.command_id, commandId("f-1-a", epoch));
  });

  test("media tokens: valid for the owner, not_owner for another node, call_ended after every leg hangs up", async () => {
    const init = await webhook(edge, callEvent("call.initiated", { session: "m-1", leg: "m-1-a" }));
    const { epoch } = init.body;
    const leg2 = await webhook(edge, callEvent("call.initiated", { session: "m-1", leg: "m-1-b" }));
    assert.deepEqual([leg2.status, leg2.body.delivered_to, leg2.body.epoch], [200, "M1", epoch]);
    const grant = await fence(edge, M1, { call_session_id: "m-1", call_control_id: "m-1-a", epoch });
    assert.equal(grant.status, 200);
    const verify = (node, media_token = grant.body.media_token) => nodePost(edge, node, "/v1/media/verify", { media_token });

    const good = await verify(M1);
    assert.deepEqual([good.status, good.body], [200, { valid: true, call_session_id: "m-1", epoch }]);
    const other = await verify(M2);
    assert.deepEqual([other.status, other.body.valid, other.body.reason], [409, false, "not_owner"]);
    const [v, kid, payload, mac] = grant.body.media_token.split(".");
    const flipped = `${v}.${kid}.${payload}.${mac.startsWith("A") ? "B" : "A"}${mac.slice(1)}`;
    const bad = await verify(M1, flipped);
    assert.deepEqual([bad.status, bad.body.reason], [409, "bad_token"]);

    await webhook(edge, callEvent("call.hangup", { session: "m-1", leg: "m-1-a" }));
    const oneLeft = await verify(M1);
    assert.deepEqual([oneLeft.status, oneLeft.body.valid], [200, true], "one leg still lives");
    await webhook(edge, callEvent("call.hangup", { session: "m-1", leg: "m-1-b" }));
    const ended = await verify(M1);
    assert.deepEqual([ended.status, ended.body.valid, ended.body.reason], [409, false, "call_ended"]);
    assert.equal((await callOf(edge, "m-1")).body.state, "ended");
    assertVerified(M1);
  });
});

describe("ambiguous outcomes never move a call", () => {
  let cluster;
  let edge;
  let M1;
  let M2;
  before(async () => {
    cluster = await setupCluster({ bindings: { FORWARD_TIMEOUT_MS: "500" } });
    ({ edge } = cluster);
    ({ M1, M2 } = cluster.nodes);
  });
  after(() => cluster?.dispose());

  test("a timeout and a 500: 503 delivery_unknown, same owner and epoch even once ineligible", async () => {
    M1.origin.respond = async () => {
      await sleep(900);
      return OK();
    };
    M2.origin.respond = () => ({ status: 500, body: "oops" });
    const slow = callEvent("call.initiated", { session: "amb-1", leg: "amb-1-a" });
    const res1 = await webhook(edge, slow);
    assert.deepEqual([res1.status, res1.body.error], [503, "delivery_unknown"]);
    assert.equal(received(M1, slow.data.id).length, 1, "the origin got it (and may have acted)");
    const call1 = await callOf(edge, "amb-1");
    assert.equal(call1.body.owner, "M1");

    // The next new call avoids M1 (recent_forward_failure): M2, which answers 500.
    const err = callEvent("call.initiated", { session: "amb-2", leg: "amb-2-a" });
    const res2 = await webhook(edge, err);
    assert.deepEqual([res2.status, res2.body.error], [503, "delivery_unknown"]);
    const call2 = await callOf(edge, "amb-2");
    assert.equal(call2.body.owner, "M2");
    const [decision] = (await admin(edge, "/v1/decisions?call_session_id=amb-2")).body.decisions;
    assert.ok(decision.reasons.M1?.includes("recent_forward_failure"), JSON.stringify(decision.reasons));

    // Both owners become ineligible; nothing moves, and a carrier retry goes to the same owner.
    assert.equal((await heartbeat(edge, M1, { mode: "drained" })).body.eligible, false);
    assert.equal((await heartbeat(edge, M2, { dirty: true })).body.eligible, false);
    await sleep(1200);
    M2.origin.respond = OK;
    const retry = await webhook(edge, err);
    assert.ok([200, 503].includes(retry.status));
    if (retry.status === 200) assert.deepEqual([retry.body.delivered_to, retry.body.epoch], ["M2", call2.body.epoch]);
    for (const [session, owner, epoch] of [["amb-1", "M1", call1.body.epoch], ["amb-2", "M2", call2.body.epoch]]) {
      const now = await callOf(edge, session);
      assert.deepEqual([now.body.owner, now.body.epoch], [owner, epoch], session);
      const decisions = (await admin(edge, `/v1/decisions?call_session_id=${session}`)).body.decisions;
      assert.deepEqual(decisions.map((d) => d.outcome), ["assigned"], session);
    }
    assert.equal(forSession(M2, "amb-1").length, 0);
    assert.equal(forSession(M1, "amb-2").length, 0);
    for (const r of [...forSession(M1, "amb-1"), ...forSession(M2, "amb-2")]) {
      assert.equal(r.assertion.ok, true);
      assert.equal(r.assertion.claims.epoch, r.assertion.claims.node === "M1" ? call1.body.epoch : call2.body.epoch);
    }
    M1.origin.respond = OK;
  });
});

describe("not_admitted before a fence reassigns the call", () => {
  let cluster;
  before(async () => {
    cluster = await setupCluster();
  });
  after(() => cluster?.dispose());

  test("the next node gets a higher epoch; the old node's fence is refused", async () => {
    const { edge } = cluster;
    const { M1, M2 } = cluster.nodes;
    M1.origin.respond = () => ({ status: 503, body: { callfence: "not_admitted" } });
    const init = callEvent("call.initiated", { session: "re-1", leg: "re-1-a" });
    const res = await webhook(edge, init);
    if (res.status === 200) {
      assert.equal(res.body.delivered_to, "M2");
    } else {
      assert.deepEqual([res.status, res.body.error], [503, "reassigned"]);
    }
    await waitFor(() => received(M2, init.data.id).length === 1, { what: "delivery to the new owner" });
    const [first] = received(M1, init.data.id);
    const [second] = received(M2, init.data.id);
    assert.ok(second.assertion.ok && first.assertion.ok);
    const oldEpoch = first.assertion.claims.epoch;
    const newEpoch = second.assertion.claims.epoch;
    assert.ok(newEpoch > oldEpoch, `${newEpoch} > ${oldEpoch}`);
    if (res.status === 200) assert.equal(res.body.epoch, newEpoch);

    const call = await callOf(edge, "re-1");
    assert.deepEqual([call.body.owner, call.body.epoch], ["M2", newEpoch]);
    const outcomes = (await admin(edge, "/v1/decisions?call_session_id=re-1")).body.decisions.map((d) => [d.outcome, d.chosen]);
    assert.deepEqual(outcomes, [["reassigned", "M2"], ["assigned", "M1"]]);

    const stale = await fence(edge, M1, { call_session_id: "re-1", call_control_id: "re-1-a", epoch: oldEpoch });
    assert.equal(stale.status, 409);
    assert.ok(["stale_epoch", "not_owner"].includes(stale.body.reason), stale.body.reason);
    const grant = await fence(edge, M2, { call_session_id: "re-1", call_control_id: "re-1-a", epoch: newEpoch });
    assert.deepEqual([grant.status, grant.body.first, grant.body.command_id], [200, true, commandId("re-1-a", newEpoch)]);

    // A later event goes to the new owner only; a duplicate of the first gets the new delivery.
    const answered = callEvent("call.answered", { session: "re-1", leg: "re-1-a" });
    const later = await webhook(edge, answered);
    assert.deepEqual([later.status, later.body.delivered_to, later.body.epoch], [200, "M2", newEpoch]);
    assert.equal(received(M1, answered.data.id).length, 0);
    const dup = await webhook(edge, init);
    assert.deepEqual([dup.status, dup.body.delivered_to, dup.body.epoch], [200, "M2", newEpoch]);
    assert.equal(received(M1, init.data.id).length, 1);
    assert.equal(received(M2, init.data.id).length, 1);
    M1.origin.respond = OK;
  });
});

describe("not_admitted when the budget is spent", () => {
  let cluster;
  before(async () => {
    cluster = await setupCluster({ bindings: { FORWARD_TIMEOUT_MS: "1000" } });
  });
  after(() => cluster?.dispose());

  test("503 reassigned, then the alarm delivers the queued events in order to the new owner", async () => {
    const { edge } = cluster;
    const { M1, M2 } = cluster.nodes;
    // Answered 870 ms after the webhook was sent: within the 1000 ms budget,
    // but with less than 250 ms of it left. Timed from the send, not from
    // the forward's arrival, so a slow Dispatcher on a loaded machine moves
    // neither edge of the window.
    let sentAt = 0;
    M1.origin.respond = async () => {
      await sleep(Math.max(0, sentAt + 870 - Date.now()));
      return { status: 503, body: { callfence: "not_admitted" } };
    };
    const init = callEvent("call.initiated", { session: "late-1", leg: "late-1-a" });
    sentAt = Date.now();
    const res = await webhook(edge, init);
    assert.deepEqual([res.status, res.body.error], [503, "reassigned"]);
    const call = await waitFor(
      async () => {
        const c = await callOf(edge, "late-1");
        return c.body.events.every((e) => e.state === "delivered") && c;
      },
      { timeout: 5000, what: "the alarm's delivery" },
    );
    assert.equal(call.body.owner, "M2");
    const [delivered] = received(M2, init.data.id);
    assert.equal(delivered.assertion.ok, true);
    assert.equal(delivered.assertion.claims.epoch, call.body.epoch);
    assert.ok(call.body.epoch > received(M1, init.data.id)[0].assertion.claims.epoch);
    const dup = await webhook(edge, init);
    assert.deepEqual([dup.status, dup.body.delivered_to, dup.body.epoch], [200, "M2", call.body.epoch]);
    assert.equal(received(M1, init.data.id).length, 1);
    assert.equal(received(M2, init.data.id).length, 1);
  });
});

describe("refusals after a fence, and redirects", () => {
  let cluster;
  before(async () => {
    cluster = await setupCluster();
  });
  after(() => cluster?.dispose());

  test("not_admitted after a granted fence is unknown: the call does not move", async () => {
    const { edge } = cluster;
    const { M1, M2 } = cluster.nodes;
    const init = await webhook(edge, callEvent("call.initiated", { session: "nf-1", leg: "nf-1-a" }));
    assert.deepEqual([init.status, init.body.delivered_to], [200, "M1"]);
    const grant = await fence(edge, M1, { call_session_id: "nf-1", call_control_id: "nf-1-a", epoch: init.body.epoch });
    assert.equal(grant.status, 200);
    M1.origin.respond = () => ({ status: 503, body: { callfence: "not_admitted" } });
    try {
      const answered = callEvent("call.answered", { session: "nf-1", leg: "nf-1-a" });
      const res = await webhook(edge, answered);
      assert.deepEqual([res.status, res.body.error], [503, "delivery_unknown"]);
      await sleep(300);
      const call = await callOf(edge, "nf-1");
      assert.deepEqual([call.body.owner, call.body.epoch], ["M1", init.body.epoch]);
      assert.equal(forSession(M2, "nf-1").length, 0);
      const decisions = (await admin(edge, "/v1/decisions?call_session_id=nf-1")).body.decisions;
      assert.deepEqual(decisions.map((d) => d.outcome), ["assigned"]);
      // Once the agent admits it again, the alarm's re-drive delivers it to the same owner and epoch.
      M1.origin.respond = OK;
      await waitFor(
        async () => (await callOf(edge, "nf-1")).body.events.find((e) => e.event_id === answered.data.id)?.state === "delivered",
        { timeout: 6000, what: "the re-drive" },
      );
      assert.ok(received(M1, answered.data.id).every((r) => r.assertion.claims.epoch === init.body.epoch));
      const retry = await webhook(edge, answered);
      assert.deepEqual([retry.status, retry.body.delivered_to, retry.body.epoch], [200, "M1", init.body.epoch]);
    } finally {
      M1.origin.respond = OK;
    }
  });

  test("a 3xx is definitely not delivered: reassigned to the next node", async () => {
    const { edge } = cluster;
    const { M1, M2 } = cluster.nodes;
    // M2 becomes the default and answers every forward with a 302.
    M2.origin.respond = () => ({ status: 302, body: { moved: true } });
    const policy = await admin(edge, "/v1/policy");
    const put = await admin(edge, "/v1/policy", {
      method: "PUT",
      headers: { "if-match": `"${policy.body.revision}"`, "content-type": "application/json" },
      body: JSON.stringify({ ...policy.body, revision: undefined, default_node: "M2" }),
    });
    assert.equal(put.status, 200);
    try {
      const init = callEvent("call.initiated", { session: "rd-1", leg: "rd-1-a" });
      const res = await webhook(edge, init);
      assert.ok(
        (res.status === 200 && res.body.delivered_to === "M1") || (res.status === 503 && res.body.error === "reassigned"),
        JSON.stringify([res.status, res.body]),
      );
      await waitFor(() => received(M1, init.data.id).length === 1, { what: "delivery to M1" });
      assert.equal(received(M2, init.data.id).length, 1, "the redirect was not followed or retried");
      const [m1] = received(M1, init.data.id);
      assert.equal(m1.assertion.ok, true, m1.assertion.why);
      assert.ok(m1.assertion.claims.epoch > received(M2, init.data.id)[0].assertion.claims.epoch);
      assert.equal((await callOf(edge, "rd-1")).body.owner, "M1");
    } finally {
      M2.origin.respond = OK;
    }
  });
});

describe("fallback when the preferred origin is dead", () => {
  let cluster;
  before(async () => {
    cluster = await setupCluster();
  });
  after(() => cluster?.dispose());

  test("first call: 503 delivery_unknown and stays; the next call goes to the fallback", async () => {
    const { edge } = cluster;
    const { M1, M2 } = cluster.nodes;
    await M1.origin.close(); // the port is now closed
    const first = await webhook(edge, callEvent("call.initiated", { session: "dead-1", leg: "dead-1-a" }));
    assert.deepEqual([first.status, first.body.error], [503, "delivery_unknown"]);
    const call = await callOf(edge, "dead-1");
    assert.deepEqual([call.body.owner, call.body.state], ["M1", "assigned"]);

    const next = await webhook(edge, callEvent("call.initiated", { session: "dead-2", leg: "dead-2-a" }));
    assert.deepEqual([next.status, next.body.delivered_to], [200, "M2"]);
    const [decision] = (await admin(edge, "/v1/decisions?call_session_id=dead-2")).body.decisions;
    assert.equal(decision.prefers, "M1");
    assert.equal(decision.chosen, "M2");
    assert.ok(decision.reasons.M1.includes("recent_forward_failure"), JSON.stringify(decision.reasons));
    assert.equal((await callOf(edge, "dead-1")).body.owner, "M1");
    assertVerified(M2);
  });
});

describe("persistence across a restart", () => {
  let cluster;
  before(async () => {
    cluster = await setupCluster();
  });
  after(() => cluster?.dispose());

  test("owner, epoch and a delivered event's answer survive a restart on the same storage", async () => {
    const { edge } = cluster;
    const { M1 } = cluster.nodes;
    const init = callEvent("call.initiated", { session: "p-1", leg: "p-1-a" });
    const res = await webhook(edge, init);
    assert.equal(res.status, 200);
    const call = await callOf(edge, "p-1");
    await edge.restart();
    const again = await callOf(edge, "p-1");
    assert.equal(again.status, 200);
    assert.deepEqual([again.body.owner, again.body.epoch, again.body.origin_url], [call.body.owner, call.body.epoch, call.body.origin_url]);
    const dup = await webhook(edge, init);
    assert.deepEqual([dup.status, dup.body], [200, res.body]);
    assert.equal(received(M1, init.data.id).length, 1);
    // The epoch counter keeps rising after the restart.
    const next = await webhook(edge, callEvent("call.initiated", { session: "p-2", leg: "p-2-a" }));
    assert.equal(next.status, 200);
    assert.ok(next.body.epoch > res.body.epoch);
  });

  test("a parked event survives a restart and is delivered once a node is eligible", async () => {
    const { edge } = cluster;
    const { M1, M2 } = cluster.nodes;
    for (const node of [M1, M2]) assert.equal((await heartbeat(edge, node, { mode: "shadow" })).body.eligible, false);
    const parked = callEvent("call.initiated", { session: "p-3", leg: "p-3-a" });
    const res = await webhook(edge, parked);
    assert.deepEqual([res.status, res.body.error], [503, "no_eligible_node"]);
    await edge.restart();
    assert.equal((await admin(edge, "/v1/status")).body.counts.pending, 1);
    assert.equal((await heartbeat(edge, M2)).body.eligible, true);
    await waitFor(() => received(M2, parked.data.id).length === 1, { timeout: 3500, what: "the parked event" });
    assert.equal(received(M2, parked.data.id)[0].assertion.ok, true);
    assert.equal(received(M1, parked.data.id).length, 0);
    const call = await callOf(edge, "p-3");
    assert.equal(call.body.owner, "M2");
  });
});
