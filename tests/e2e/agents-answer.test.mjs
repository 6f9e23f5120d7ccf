// Answering and delivery through real agents: duplicate webhooks give one
// answer command at Telnyx, a stale epoch is fenced off before Telnyx, a
// dialled leg's events come back to the node that dialled it, and a webhook
// caught in mid-delivery by a SIGKILL is re-delivered after the restart.
// M1 (preferred for the line) and M2 (its fallback) run `callfence-agent run`
// in front of `callfence-demo-app`; Telnyx is a fake on loopback.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { nodeHeaders, read, telnyxHeaders } from "./harness.mjs";
import { commandId, event, LINE, newCall, sleep, startCluster, standardPolicy, waitFor } from "./agents-cluster.mjs";

describe("answering through real agents", () => {
  let c;
  before(async () => {
    c = await startCluster({ nodes: { M1: {}, M2: {} }, policy: standardPolicy });
  });
  after(() => c?.close());

  const initiated = (call) =>
    event({ id: call.eventId("init"), type: "call.initiated", session: call.session, ccid: call.ccid });

  test("five deliveries of one call.initiated, some concurrent, give exactly one answer command_id", async () => {
    const call = newCall("five");
    const body = initiated(call);
    // Three at once (the carrier's primary and failover racing), then two
    // retries later; every copy carries its own signature and timestamp.
    const first = await Promise.all([c.webhook(body), c.webhook(body), c.webhook(body)]);
    const delivered = first.filter((r) => r.status === 200);
    // A copy that meets another's live lease is told to retry, never forwarded.
    for (const r of first) {
      if (r.status !== 200) assert.deepEqual([r.status, r.body.error], [503, "in_progress"]);
    }
    await sleep(300);
    const later = [await c.deliver(body), await c.deliver(body)];
    for (const again of [...delivered, ...later]) {
      assert.equal(again.status, 200);
      assert.deepEqual(again.body, later[0].body, "every copy gets the same answer");
    }
    assert.equal(later[0].body.delivered_to, "M1");
    const { epoch } = later[0].body;
    await waitFor("the app's answer at Telnyx", async () => (await c.telnyx.answers(call.ccid)).length > 0);
    await sleep(1_000); // room for any second answer (resends come within 400 ms)
    const ids = new Set((await c.telnyx.answers(call.ccid)).map((r) => r.body.command_id));
    assert.deepEqual([...ids], [commandId(call.ccid, epoch)]);
    assert.equal((await c.nodes.M1.appEvents())[call.eventId("init")].count, 1, "the app was handed it once");
    assert.equal((await c.nodes.M2.appEvents())[call.eventId("init")], undefined);
    const view = await c.call(call.session);
    assert.equal(view.body.fence.command_id, commandId(call.ccid, epoch));
  });

  test("an answer attempt with an old epoch gets 409 and never reaches Telnyx", async () => {
    const call = newCall("stale");
    const res = await c.deliver(initiated(call));
    assert.equal(res.body.delivered_to, "M1", JSON.stringify(res.body));
    const { epoch } = res.body;
    await waitFor("the app's own answer", async () => (await c.telnyx.answers(call.ccid)).length > 0);
    await sleep(500);
    const before = (await c.telnyx.requests()).length;

    const stale = await c.nodes.M1.local("/local/answer", {
      call_control_id: call.ccid,
      call_session_id: call.session,
      // Not the session's epoch (epochs count per call shard: with several,
      // this may be its shard's first call, so the other side is asked).
      epoch: epoch > 1 ? epoch - 1 : epoch + 1,
    });
    assert.equal(stale.status, 409, JSON.stringify(stale.body));
    assert.deepEqual(stale.body, { answered: false, reason: "stale_epoch" });

    // Another node asking at the right epoch is not the owner.
    const other = await c.nodes.M2.local("/local/answer", {
      call_control_id: call.ccid,
      call_session_id: call.session,
      epoch,
    });
    assert.equal(other.status, 409, JSON.stringify(other.body));
    assert.deepEqual(other.body, { answered: false, reason: "not_owner" });

    await sleep(700);
    assert.equal((await c.telnyx.requests()).length, before, "Telnyx saw nothing from the refused attempts");

    // The owner at its epoch resumes the same grant (crash-resume), same command_id.
    const owner = await c.nodes.M1.local("/local/answer", {
      call_control_id: call.ccid,
      call_session_id: call.session,
      epoch,
    });
    assert.equal(owner.status, 200, JSON.stringify(owner.body));
    assert.equal(owner.body.first, false);
    assert.equal(owner.body.command_id, commandId(call.ccid, epoch));
  });

  test("a leg dialled through /local/dial has its events come back to the node that dialled it", async () => {
    const m2 = c.nodes.M2;
    const dial = await m2.local("/local/dial", { to: "+15105550199", from: LINE.number });
    assert.equal(dial.status, 200, JSON.stringify(dial.body));
    assert.equal(dial.body.claimed, true);
    const { call_control_id: ccid, call_session_id: session, epoch } = dial.body;
    const dialReq = (await c.telnyx.requests()).find((r) => r.action === "dial");
    assert.equal(dialReq.body.to, "+15105550199");
    assert.equal(dialReq.body.connection_id, "conn-e2e", "the agent's configured connection");

    // The session is M2's although the policy's line prefers M1.
    for (const type of ["call.initiated", "call.answered", "call.hangup"]) {
      const body = event({
        id: `ev-${type}-${session}`,
        type,
        session,
        ccid,
        from: LINE.number,
        to: "+15105550199",
        direction: "outgoing",
      });
      const res = await c.deliver(body);
      assert.equal(res.status, 200, `${type}: ${JSON.stringify(res.body)}`);
      assert.equal(res.body.delivered_to, "M2");
      assert.equal(res.body.epoch, epoch);
      assert.equal((await m2.appEvents())[`ev-${type}-${session}`]?.count, 1);
      assert.equal((await c.nodes.M1.appEvents())[`ev-${type}-${session}`], undefined);
    }
    const [decision] = await c.decisions(session);
    assert.equal(decision.rule, "claim");
    assert.equal(decision.chosen, "M2");
    assert.equal((await c.telnyx.answers(ccid)).length, 0, "an outgoing leg is not answered");

    // Another node cannot claim it.
    const claimBody = JSON.stringify({ call_control_id: ccid, call_session_id: session });
    const m1 = c.nodes.M1;
    const claim = await read(
      await c.edge.fetch("/v1/claims", {
        method: "POST",
        headers: nodeHeaders({
          url: new URL("/v1/claims", c.edge.url),
          body: claimBody,
          node: "M1",
          kid: m1.key.kid,
          privateKey: m1.key.privateKeyObject,
        }),
        body: claimBody,
      }),
    );
    assert.equal(claim.status, 409, JSON.stringify(claim.body));
    assert.equal(claim.body.reason, "already_owned");
    const view = await c.call(session);
    assert.equal(view.body.owner, "M2");
    assert.equal(view.body.state, "ended");
  });

  test("a SIGKILL while the app handles an event: re-delivered after restart, duplicates get the recorded answer", async () => {
    const m1 = c.nodes.M1;
    const call = newCall("crash");
    const init = await c.deliver(initiated(call));
    assert.equal(init.body.delivered_to, "M1");
    await waitFor("the answer", async () => (await c.telnyx.answers(call.ccid)).length > 0);

    // The app turns slow: it takes 3 s over each webhook.
    await m1.killApp();
    await m1.startApp(["--slow-ms", "3000"]);
    const id = call.eventId("call.answered");
    const body = event({ id, type: "call.answered", session: call.session, ccid: call.ccid });
    const pending = c.webhook(body);
    await waitFor("the app to be handed the event", async () => (await m1.appEvents())[id]?.count === 1, {
      timeout: 5_000,
      every: 50,
    });
    await m1.killAgent("SIGKILL");
    const cut = await pending;
    assert.equal(cut.status, 503, JSON.stringify(cut.body));
    assert.equal(cut.body.error, "delivery_unknown");

    await m1.startAgent();
    // The `received` entry goes to the app again and completes.
    await waitFor("the re-delivery", async () => (await m1.appEvents())[id]?.count === 2, { timeout: 5_000 });
    const completed = (line) => line.includes('"webhook_delivered"') && line.includes(id) && line.includes('"completed"');
    await waitFor("the completion", () => m1.logs().some(completed), { timeout: 6_000 });
    assert.ok(m1.logs().some((l) => l.includes('"ledger_resumed"')), "the restart resumed the ledger");

    // The carrier's retries now end in a delivery to M1, at the same epoch.
    const retried = await c.deliver(body, 20_000);
    assert.equal(retried.status, 200, JSON.stringify(retried.body));
    assert.deepEqual([retried.body.delivered_to, retried.body.epoch], ["M1", init.body.epoch]);

    // A later duplicate reaching the agent gets the recorded answer: the app is not called again.
    const replay = await read(
      await fetch(m1.originUrl, {
        method: "POST",
        headers: {
          ...telnyxHeaders(body, c.keys.telnyx.privateKeyObject),
          "callfence-assertion": c.assertion({
            node: "M1",
            body,
            session: call.session,
            ccid: call.ccid,
            eventId: id,
            epoch: init.body.epoch,
          }),
        },
        body,
      }),
    );
    assert.equal(replay.status, 200, JSON.stringify(replay.body));
    assert.deepEqual(replay.body, { ok: true });
    await sleep(300);
    assert.equal((await m1.appEvents())[id].count, 2, "handed over twice: before the crash and after the restart");
    const view = await c.call(call.session);
    assert.equal(view.body.events.find((e) => e.event_id === id)?.state, "delivered", JSON.stringify(view.body.events));
  });
});
