// Routing across real agents: the Worker and Dispatcher in Miniflare, three
// `callfence-agent run` processes (M1 and M2 stable, M3 a candidate with
// canary_go) each in front of a `callfence-demo-app`, and a fake Telnyx API.
// The line prefers M1 and falls back to M2; a caller override sends the
// canary caller to M3. Each test changes one thing about a node and checks
// where the next call goes, then puts the node back.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import {
  CANARY_CALLER,
  commandId,
  event,
  newCall,
  PLAIN_CALLER,
  startCluster,
  standardPolicy,
  waitFor,
} from "./agents-cluster.mjs";

describe("routing across real agents", () => {
  let c;
  before(async () => {
    c = await startCluster({
      nodes: { M1: {}, M2: {}, M3: { role: "candidate", canary_go: true } },
      policy: standardPolicy,
    });
  });
  after(() => c?.close());

  /** Sends a new inbound call's call.initiated; returns the call and the edge's answer. */
  async function newInbound(tag, from = PLAIN_CALLER) {
    const call = newCall(tag);
    const body = event({ id: call.eventId("init"), type: "call.initiated", session: call.session, ccid: call.ccid, from });
    const res = await c.deliver(body);
    return { ...call, res };
  }

  /** Waits until the node's app answered the call through the fence (the fake Telnyx saw it). */
  async function answeredAt(call, node) {
    const answers = await waitFor(`an answer for ${call.ccid}`, async () => {
      const a = await c.telnyx.answers(call.ccid);
      return a.length > 0 ? a : false;
    });
    assert.equal(answers[0].body.command_id, commandId(call.ccid, call.res.body.epoch));
    const events = await c.nodes[node].appEvents();
    assert.ok(events[call.eventId("init")], `${node}'s app got the call`);
    return answers;
  }

  test("a caller override sends the call to the candidate M3 as a canary", async () => {
    const call = await newInbound("canary", CANARY_CALLER);
    assert.equal(call.res.status, 200, JSON.stringify(call.res.body));
    assert.equal(call.res.body.delivered_to, "M3");
    const [decision] = await c.decisions(call.session);
    assert.equal(decision.rule, "caller_override");
    assert.equal(decision.prefers, "M3");
    assert.equal(decision.chosen, "M3");
    assert.equal(decision.chosen_sha, c.nodes.M3.sha);
    assert.equal(decision.chosen_clean, true);
    await answeredAt(call, "M3");
    for (const other of ["M1", "M2"]) {
      assert.equal((await c.nodes[other].appEvents())[call.eventId("init")], undefined, `${other} never saw it`);
    }
  });

  test("a dirty candidate checkout sends the next canary call to the stable node", async () => {
    const m3 = c.nodes.M3;
    const stray = join(m3.checkout, "hotfix.py");
    writeFileSync(stray, "print('edited on the box')\n");
    try {
      await c.waitNode("M3", "dirty", (n) => n.reasons.includes("dirty") && n.clean === false);
      const call = await newInbound("dirty", CANARY_CALLER);
      assert.equal(call.res.status, 200, JSON.stringify(call.res.body));
      assert.equal(call.res.body.delivered_to, "M2", "the line's stable fallback");
      const [decision] = await c.decisions(call.session);
      assert.equal(decision.prefers, "M3");
      assert.equal(decision.chosen, "M2");
      assert.ok(decision.reasons.M3.includes("dirty"), JSON.stringify(decision.reasons));
      await answeredAt(call, "M2");
      assert.equal((await m3.appEvents())[call.eventId("init")], undefined);
    } finally {
      rmSync(stray, { force: true });
    }
    await c.waitEligible("M3");
  });

  test("mode set drained stops new calls to M1 while its admitted call keeps working", async () => {
    const m1 = c.nodes.M1;
    const admitted = await newInbound("admitted");
    assert.equal(admitted.res.body.delivered_to, "M1", JSON.stringify(admitted.res.body));
    await answeredAt(admitted, "M1");

    const set = m1.cli("mode", "set", "drained");
    assert.equal(set.status, 0, set.stderr);
    assert.equal(m1.cli("mode", "get").stdout.trim(), "drained");
    await c.waitNode("M1", "mode_drained", (n) => n.mode === "drained" && n.reasons.includes("mode_drained"));

    const fresh = await newInbound("while-drained");
    assert.equal(fresh.res.status, 200, JSON.stringify(fresh.res.body));
    assert.equal(fresh.res.body.delivered_to, "M2");
    assert.ok((await c.decisions(fresh.session))[0].reasons.M1.includes("mode_drained"));
    assert.equal((await m1.appEvents())[fresh.eventId("init")], undefined, "M1's app never saw the new call");

    // The admitted call's later events still reach M1 at its epoch.
    for (const type of ["call.answered", "call.hangup"]) {
      const body = event({ id: admitted.eventId(type), type, session: admitted.session, ccid: admitted.ccid });
      const res = await c.deliver(body);
      assert.equal(res.status, 200, `${type}: ${JSON.stringify(res.body)}`);
      assert.equal(res.body.delivered_to, "M1");
      assert.equal(res.body.epoch, admitted.res.body.epoch);
      assert.equal((await m1.appEvents())[admitted.eventId(type)]?.count, 1, `${type} reached M1's app once`);
    }
    const view = await c.call(admitted.session);
    assert.equal(view.body.state, "ended");
    assert.equal(view.body.owner, "M1");
    assert.ok(!(await m1.appStatus()).calls.some((x) => x.call_control_id === admitted.ccid), "the app hung up");

    assert.equal(m1.cli("mode", "set", "active").status, 0);
    await c.waitEligible("M1");
  });

  test("an app that stops makes its node ineligible (app_down) and new calls go elsewhere", async () => {
    const m1 = c.nodes.M1;
    await m1.killApp();
    await c.waitNode("M1", "app_down", (n) => n.reasons.includes("app_down") && n.app_ready === false);
    const ready = await m1.local("/readyz");
    assert.equal(ready.status, 503);
    assert.equal(ready.body.app_reachable, false);

    const call = await newInbound("app-down");
    assert.equal(call.res.status, 200, JSON.stringify(call.res.body));
    assert.equal(call.res.body.delivered_to, "M2");
    assert.ok((await c.decisions(call.session))[0].reasons.M1.includes("app_down"));
    await answeredAt(call, "M2");

    await m1.startApp();
    await c.waitEligible("M1");
    const back = await newInbound("app-back");
    assert.equal(back.res.body.delivered_to, "M1", "the preferred node takes calls again");
  });

  test("a SIGKILLed agent's node gets no new calls once its beat is stale", async () => {
    const m1 = c.nodes.M1;
    await m1.killAgent("SIGKILL");
    const killedAt = Date.now();
    const stale = await c.waitNode("M1", "heartbeat_stale", (n) => n.reasons.includes("heartbeat_stale"), 8_000);
    assert.equal(stale.eligible, false);
    // valid_for_s is 3: stale within a few seconds of the last beat.
    assert.ok(Date.now() - killedAt < 7_000, `stale after ${Date.now() - killedAt} ms`);

    const call = await newInbound("after-kill");
    assert.equal(call.res.status, 200, JSON.stringify(call.res.body));
    assert.equal(call.res.body.delivered_to, "M2");
    const [decision] = await c.decisions(call.session);
    assert.equal(decision.prefers, "M1");
    assert.deepEqual(decision.reasons.M1, ["heartbeat_stale"]);
    await answeredAt(call, "M2");
    const view = await c.call(call.session);
    assert.equal(view.body.owner, "M2");
    assert.equal(view.body.fence?.command_id, commandId(call.ccid, call.res.body.epoch), "M2 holds the fence");
  });
});
