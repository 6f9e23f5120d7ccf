// A node's own safety through real agents: a corrupt mode file boots the
// node drained (and /readyz says so), a key rotation loses no heartbeat, and
// requests forged straight to an agent's origin proxy never reach its app.
// M1 and M2 run `callfence-agent run` in front of `callfence-demo-app`,
// against the Worker and Dispatcher in Miniflare.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { ed25519, read, telnyxHeaders } from "./harness.mjs";
import { commandId, event, newCall, sleep, startCluster, standardPolicy, waitFor } from "./agents-cluster.mjs";

describe("node safety through real agents", () => {
  let c;
  before(async () => {
    c = await startCluster({ nodes: { M1: {}, M2: {} }, policy: standardPolicy });
  });
  after(() => c?.close());

  test("a corrupt mode file boots the node drained and /readyz answers 503", async () => {
    const m2 = c.nodes.M2;
    assert.equal((await m2.local("/readyz")).status, 200, "ready before");
    await m2.killAgent("SIGTERM");
    writeFileSync(join(m2.stateDir, "mode"), "actve\u0000\n");
    await m2.startAgent();

    const ready = await m2.local("/readyz");
    assert.equal(ready.status, 503, JSON.stringify(ready.body));
    assert.equal(ready.body.ready, false);
    assert.equal(ready.body.mode, "drained");
    assert.match(ready.body.mode_note, /invalid/);
    const get = m2.cli("mode", "get");
    assert.equal(get.stdout.trim(), "drained");
    assert.match(get.stderr, /invalid/);
    assert.ok(m2.logs().some((l) => l.includes('"mode_fallback"')), "the agent said why at boot");
    await c.waitNode("M2", "mode_drained", (n) => n.mode === "drained" && n.reasons.includes("mode_drained"));
    // Still drained after a few beats: the agent never "repairs" the file on its own.
    await sleep(1_200);
    assert.equal((await m2.local("/readyz")).status, 503);

    assert.equal(m2.cli("mode", "set", "active").status, 0);
    await c.waitEligible("M2");
    await waitFor("M2 ready", async () => (await m2.local("/readyz")).status === 200);
  });

  test("a key rotation loses no beat: the next key takes over and every beat is accepted", async () => {
    const m1 = c.nodes.M1;
    const next = ed25519();
    const nextPath = join(m1.dir, "k2.key");
    writeFileSync(nextPath, `${next.seed}\n`, { mode: 0o600 });
    m1.nextKey = { kid: "k2", path: nextPath };
    m1.writeConfig();

    // Watch every beat the agent records, from its restart on.
    const seen = [];
    const edgeVerdicts = [];
    let watching = true;
    let restarted = false; // the edge's verdicts count from the restarted agent's first beat
    const watcher = (async () => {
      while (watching) {
        try {
          const n = await c.nodeStatus("M1");
          if (restarted) edgeVerdicts.push({ eligible: n.eligible, reasons: n.reasons });
          const s = await m1.local("/local/status");
          const b = s.body.last_beat;
          if (b && !seen.some((x) => x.seq === b.seq)) seen.push({ seq: b.seq, outcome: b.outcome, key_id: b.key_id, signing: s.body.signing_key_id });
        } catch {
          // restarting
        }
        await sleep(80);
      }
    })();
    try {
      await m1.killAgent("SIGTERM");
      await m1.startAgent();
      // The registry does not know k2 yet: each beat falls back to k1 at once.
      const firstSeq = (await m1.local("/local/status")).body.last_beat?.seq ?? 0;
      await waitFor("the restarted agent's first beat", () => seen.some((b) => b.seq > firstSeq));
      restarted = true;
      await waitFor("beats signed with k1", () => seen.filter((b) => b.key_id === "k1").length >= 3);
      assert.equal((await m1.local("/local/status")).body.signing_key_id, "k1");
      assert.ok(
        m1.logs().some((l) => l.includes('"beat_key_refused"') && l.includes('"k2"')),
        "k2 was tried first and refused by the edge",
      );

      // The operator publishes k2 next to k1: the next beat switches.
      m1.registryKeys.push({ kid: "k2", publicKey: next.publicKey });
      await c.put("nodes", c.registry());
      await waitFor("a beat signed with k2", () => seen.some((b) => b.key_id === "k2"), { timeout: 10_000 });
      await waitFor("three more", () => seen.filter((b) => b.key_id === "k2").length >= 3);
      assert.equal((await m1.local("/local/status")).body.signing_key_id, "k2");

      // Then k1 leaves the registry; k2 carries on alone.
      m1.registryKeys = m1.registryKeys.filter((k) => k.kid !== "k1");
      await c.put("nodes", c.registry());
      await sleep(1_500);
    } finally {
      watching = false;
      await watcher;
    }
    const refused = seen.filter((b) => b.outcome !== "accepted");
    assert.deepEqual(refused, [], "every recorded beat was accepted");
    const firstK2 = seen.findIndex((b) => b.key_id === "k2");
    assert.ok(seen.slice(firstK2).every((b) => b.key_id === "k2"), JSON.stringify(seen));
    for (let i = 1; i < seen.length; i++) assert.ok(seen[i].seq > seen[i - 1].seq, "seq only grows");
    assert.ok(edgeVerdicts.length > 5, `watched the edge ${edgeVerdicts.length} times`);
    assert.deepEqual(edgeVerdicts.filter((v) => !v.eligible), [], "the edge kept M1 eligible across the switch");
    const node = await c.nodeStatus("M1");
    assert.equal(node.eligible, true, JSON.stringify(node));
    assert.ok(node.heartbeat_age_s <= 2, JSON.stringify(node));

    // Fence requests now sign with k2 too: a call is answered.
    const call = newCall("rotated");
    const res = await c.deliver(event({ id: call.eventId("init"), type: "call.initiated", session: call.session, ccid: call.ccid }));
    assert.equal(res.body.delivered_to, "M1", JSON.stringify(res.body));
    const answers = await waitFor("the answer", async () => {
      const a = await c.telnyx.answers(call.ccid);
      return a.length > 0 ? a : false;
    });
    assert.equal(answers[0].body.command_id, commandId(call.ccid, res.body.epoch));
    assert.ok(m1.logs().some((l) => l.includes('"key_rotated"')), "the agent logged the switch");
  });

  test("forged requests straight to an origin proxy get 401 and never reach the app", async () => {
    const m2 = c.nodes.M2;
    const call = newCall("forged");
    const post = async (body, headers) =>
      read(await fetch(m2.originUrl, { method: "POST", headers: { ...telnyxHeaders(body, c.keys.telnyx.privateKeyObject), ...headers }, body }));
    const forge = (tag, fields = {}) => {
      const id = call.eventId(tag);
      const body = event({ id, type: "call.initiated", session: call.session, ccid: call.ccid });
      const claims = { node: "M2", body, session: call.session, ccid: call.ccid, eventId: id, ...fields };
      return { id, body, claims };
    };

    const none = forge("none");
    const noAssertion = await post(none.body, {});
    const other = forge("other", { node: "M1" });
    const otherNode = await post(other.body, { "callfence-assertion": c.assertion(other.claims) });
    const rogue = forge("rogue");
    const rogueKey = await post(rogue.body, {
      "callfence-assertion": c.assertion({ ...rogue.claims, privateKey: ed25519().privateKeyObject }),
    });
    // The edge's header smuggled in by hand, with the session's epoch claimed.
    const smuggled = forge("smuggled");
    const smuggledRes = await post(smuggled.body, { "callfence-epoch": "7", "callfence-call-session": call.session });
    for (const [name, res] of [["no assertion", noAssertion], ["another node's", otherNode], ["unpinned key", rogueKey], ["smuggled", smuggledRes]]) {
      assert.equal(res.status, 401, `${name}: ${JSON.stringify(res.body)}`);
      assert.deepEqual(res.body, { callfence: "not_admitted" }, name);
    }

    // The control: the same request with a genuine assertion for M2 goes through.
    const good = forge("good");
    const ok = await post(good.body, { "callfence-assertion": c.assertion(good.claims) });
    assert.equal(ok.status, 200, JSON.stringify(ok.body));
    const events = await m2.appEvents();
    assert.equal(events[good.id]?.count, 1);
    for (const forged of [none, other, rogue, smuggled]) assert.equal(events[forged.id], undefined, forged.id);
  });
});
