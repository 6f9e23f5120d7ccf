// Clock skew on a node, through real processes: the agent's test-only clock
// offset (CALLFENCE_AGENT_TEST_CLOCK_OFFSET_MS, agent/src/clock.rs) shifts
// every timestamp it signs. The real edge in Miniflare marks a node whose
// beats are more than 10 s off `clock_skew` (SPEC §5) and routes new calls
// elsewhere; beyond 300 s it refuses the node's signed requests outright
// (`stale_timestamp`, SPEC §6). A call M1 answered before the skew is still
// answered once and hung up normally.
//
// The line prefers M1 and falls back to M2.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { commandId, event, newCall, startCluster, standardPolicy, waitFor } from "./agents-cluster.mjs";

const OFFSET = "CALLFENCE_AGENT_TEST_CLOCK_OFFSET_MS";

describe("clock skew on a node (the agent's test clock offset)", () => {
  let c;
  before(async () => {
    c = await startCluster({ nodes: { M1: {}, M2: {} }, policy: standardPolicy });
  });
  after(() => c?.close());

  async function newInbound(tag) {
    const call = newCall(tag);
    const body = event({ id: call.eventId("init"), type: "call.initiated", session: call.session, ccid: call.ccid });
    return { ...call, res: await c.deliver(body) };
  }

  /** One beat from a `heartbeat --once --json` run with `offset` ms on the agent's clock. */
  function beatWith(offset) {
    const r = c.nodes.M1.cliWith({ [OFFSET]: String(offset) }, "heartbeat", "--once", "--json");
    return { code: r.status, rec: JSON.parse(r.stdout), stderr: r.stderr };
  }

  test("the offset shifts the signed timestamp: 30 s is accepted but clock_skew, 400 s is refused stale_timestamp", () => {
    const sentAt = Date.now();
    const skewed = beatWith(30_000);
    assert.equal(skewed.code, 0, skewed.stderr);
    assert.equal(skewed.rec.outcome, "accepted");
    assert.deepEqual(skewed.rec.reasons, ["clock_skew"], JSON.stringify(skewed.rec));
    assert.equal(skewed.rec.eligible, false);
    // The beat says when it was sent: 30 s ahead of this (unshifted) process.
    const ahead = Date.parse(skewed.rec.at) - sentAt;
    assert.ok(ahead >= 29_000 && ahead < 40_000, `at ${skewed.rec.at} is ${ahead} ms ahead`);
    // The agent measures the edge's clock against its own: about -30 s.
    assert.ok(Math.abs(skewed.rec.clock_skew_ms + 30_000) < 5_000, `clock_skew_ms ${skewed.rec.clock_skew_ms}`);
    assert.match(skewed.stderr, /test_clock_offset/, "the process says its clock is shifted");

    const refused = beatWith(-400_000);
    assert.equal(refused.code, 2, JSON.stringify(refused.rec));
    assert.equal(refused.rec.http_status, 401);
    assert.equal(refused.rec.refused, "stale_timestamp", JSON.stringify(refused.rec));

    const bad = c.nodes.M1.cliWith({ [OFFSET]: "30s" }, "mode", "get");
    assert.notEqual(bad.status, 0, "a malformed offset is refused");
    assert.match(bad.stderr, new RegExp(OFFSET));
  });

  test("a running agent 30 s ahead: M1 is marked clock_skew, new calls go to M2, M1's open call ends normally", async () => {
    const m1 = c.nodes.M1;
    await c.waitEligible("M1", 15_000);
    const before = await newInbound("before-skew");
    assert.equal(before.res.body.delivered_to, "M1", JSON.stringify(before.res.body));
    await waitFor("the call answered", async () => (await c.telnyx.answers(before.ccid)).length === 1);

    await m1.killAgent("SIGTERM");
    await m1.startAgent({ [OFFSET]: "30000" });
    try {
      const marked = await c.waitNode("M1", "clock_skew", (n) => n.reasons.includes("clock_skew"), 15_000);
      assert.equal(marked.eligible, false);
      const during = await newInbound("during-skew");
      assert.equal(during.res.status, 200, JSON.stringify(during.res.body));
      assert.equal(during.res.body.delivered_to, "M2");
      const [decision] = await c.decisions(during.session);
      assert.equal(decision.prefers, "M1");
      assert.deepEqual(decision.reasons.M1, ["clock_skew"]);
      await waitFor("M2 answered", async () => (await c.telnyx.answers(during.ccid)).length === 1);
      const status = JSON.parse(m1.cli("status", "--json").stdout);
      assert.deepEqual(status.edge_verdict.reasons, ["clock_skew"], JSON.stringify(status));

      // The call M1 answered before still reaches M1 (its assertion is 60 s
      // valid, 30 s is within it) and ends normally, answered once.
      const hang = event({ id: before.eventId("hangup"), type: "call.hangup", session: before.session, ccid: before.ccid });
      const hung = await c.deliver(hang);
      assert.equal(hung.status, 200, JSON.stringify(hung.body));
      assert.equal(hung.body.delivered_to, "M1");
      const answers = await c.telnyx.answers(before.ccid);
      assert.deepEqual(answers.map((a) => a.body.command_id), [commandId(before.ccid, before.res.body.epoch)]);
    } finally {
      await m1.killAgent("SIGTERM");
      await m1.startAgent();
    }
    await c.waitEligible("M1", 15_000);
    const after = await newInbound("after-skew");
    assert.equal(after.res.body.delivered_to, "M1", "healed: the preferred node takes calls again");
  });
});
