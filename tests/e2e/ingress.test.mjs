// Carrier ingress end to end: the real Worker + Dispatcher in Miniflare and
// real loopback origins that verify the Callfence-Assertion and the Telnyx
// signature of everything they receive (SPEC §5, §7, §9).

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { E2E_SHARDS, ed25519, nowSeconds, telnyxHeaders } from "./harness.mjs";
import { admin, callEvent, heartbeat, setupCluster, sleep, waitFor, webhook } from "./fixtures.mjs";

const LINE = "+15102160079";
const CALLER = "+14155550100";

/** Every request an origin received carried a valid assertion and Telnyx signature. */
function assertVerified(node) {
  for (const r of node.origin.requests) {
    assert.equal(r.assertion.ok, true, `assertion at ${node.id}: ${r.assertion.why}`);
    assert.equal(r.telnyxValid, true, `Telnyx signature at ${node.id}`);
  }
}
const received = (node, eventId) => node.origin.requests.filter((r) => JSON.parse(r.body).data.id === eventId);
const callOf = (edge, session) => admin(edge, `/v1/calls/${session}`);
const eventState = (call, id) => call.body.events?.find((e) => e.event_id === id)?.state;

describe("ingress on a two-node cluster", () => {
  let cluster;
  let edge;
  let M1;
  let M2;
  before(async () => {
    cluster = await setupCluster({
      bindings: { FORWARD_TIMEOUT_MS: "1000" },
      policy: {
        schema: "riff_node_routing_policy_v1",
        default_node: "M1",
        by_line: { main_line: { called_number: LINE, preferred_node: "M2", fallback_node: "M1" } },
        by_caller: {},
      },
    });
    ({ edge } = cluster);
    ({ M1, M2 } = cluster.nodes);
  });
  after(() => cluster?.dispose());

  test("unsigned, forged, tampered, stale and future webhooks: 401 and no side effect", async () => {
    const event = callEvent("call.initiated", { session: "sec-1", leg: "sec-1-a", from: CALLER, to: LINE });
    const body = JSON.stringify(event);
    const post = (headers, payload = body) =>
      edge.fetch("/v1/telnyx/webhook", { method: "POST", headers, body: payload }).then(async (r) => ({
        status: r.status,
        body: await r.json(),
      }));
    const key = edge.keys.telnyx.privateKeyObject;

    const cases = [
      ["unsigned", { "content-type": "application/json" }, body, "missing_signature"],
      ["no timestamp", { ...telnyxHeaders(body, key), "telnyx-timestamp": "" }, body, "missing_signature"],
      ["forged", telnyxHeaders(body, ed25519().privateKeyObject), body, "bad_signature"],
      ["tampered", telnyxHeaders(body, key), body.replace(CALLER, "+14155550199"), "bad_signature"],
      ["stale", telnyxHeaders(body, key, nowSeconds() - 301), body, "stale_timestamp"],
      ["future", telnyxHeaders(body, key, nowSeconds() + 301), body, "stale_timestamp"],
    ];
    for (const [name, headers, payload, code] of cases) {
      if (name === "future") {
        // Telnyx timestamps are whole seconds and the edge compares in ms: send
        // early in a second so "+301 s" is more than 300 s ahead on arrival.
        while (Date.now() % 1000 > 300) await sleep(20);
        Object.assign(headers, telnyxHeaders(body, key, nowSeconds() + 301));
      }
      const res = await post(headers, payload);
      assert.equal(res.status, 401, name);
      assert.deepEqual(res.body, { error: code }, name);
    }

    const decisions = await admin(edge, "/v1/decisions");
    assert.equal(decisions.status, 200);
    assert.deepEqual(decisions.body.decisions, []);
    const call = await callOf(edge, "sec-1");
    assert.deepEqual([call.status, call.body.error], [404, "unknown_call"]);
    const status = await admin(edge, "/v1/status");
    assert.deepEqual(status.body.counts, {
      open_calls: 0,
      pending: 0,
      unroutable: 0,
      ignored: 0,
      sessions: 0,
      session_cap: 100000 * E2E_SHARDS, // each shard's table has its own
      storage_full: 0,
      claims_capacity_exhausted: 0,
      claims_rate_limited: 0,
    });
    assert.equal(status.body.engine.last_webhook_at, null);
    await sleep(300);
    assert.equal(M1.origin.requests.length + M2.origin.requests.length, 0, "no origin got anything");
  });

  test("duplicates, sequential and concurrent, reach the origin exactly once", async () => {
    const initiated = callEvent("call.initiated", { session: "dup-1", leg: "dup-1-a", from: CALLER, to: LINE });
    const answers = [];
    for (let i = 0; i < 5; i++) answers.push(await webhook(edge, initiated));
    const first = answers[0];
    assert.equal(first.status, 200);
    assert.deepEqual(first.body, { delivered_to: "M2", epoch: first.body.epoch, event_id: initiated.data.id });
    for (const a of answers) assert.deepEqual([a.status, a.body], [200, first.body]);
    assert.equal(received(M2, initiated.data.id).length, 1);

    // Retries differ in meta and timestamp: dedup is on data.id alone.
    const answered = callEvent("call.answered", { session: "dup-1", leg: "dup-1-a" });
    const retries = [0, 1, 2, 3, 4].map((i) => ({ ...answered, meta: { attempt: i + 1 } }));
    const concurrent = await Promise.all(retries.map((e) => webhook(edge, e)));
    const ok = concurrent.filter((a) => a.status === 200);
    assert.ok(ok.length >= 1, "one concurrent delivery succeeds");
    for (const a of concurrent) {
      if (a.status === 200) assert.deepEqual(a.body, { delivered_to: "M2", epoch: first.body.epoch, event_id: answered.data.id });
      else assert.deepEqual([a.status, a.body.error], [503, "in_progress"]);
    }
    const again = await webhook(edge, answered);
    assert.deepEqual([again.status, again.body], [200, ok[0].body]);
    assert.equal(received(M2, answered.data.id).length, 1);
    // The origin got one of the deliveries byte for byte, unchanged.
    assert.ok(retries.map((e) => JSON.stringify(e)).includes(received(M2, answered.data.id)[0].body));
    assert.equal(M1.origin.requests.length, 0);
    assertVerified(M2);

    const call = await callOf(edge, "dup-1");
    assert.equal(call.body.events.length, 2);
    for (const e of call.body.events) assert.deepEqual([e.state, e.attempts], ["delivered", 1]);
  });

  test("an app 4xx is delivered with error (no penalty); inbound Callfence-* headers are dropped", async () => {
    M2.origin.respond = (r) => (r.body.includes("app4xx-1") ? { status: 404, body: { error: "no such call" } } : { status: 200, body: { ok: true } });
    try {
      const event = callEvent("call.initiated", { session: "app4xx-1", leg: "app4xx-1-a", to: LINE });
      const body = JSON.stringify(event);
      const headers = {
        ...telnyxHeaders(body, edge.keys.telnyx.privateKeyObject),
        "callfence-assertion": "v1.evil.e30.AAAA",
        "callfence-epoch": "999",
        "callfence-call-session": "someone-else",
      };
      const res = await edge.fetch("/v1/telnyx/webhook", { method: "POST", headers, body });
      const answer = await res.json();
      assert.deepEqual([res.status, answer], [200, { delivered_to: "M2", epoch: answer.epoch, event_id: event.data.id }]);
      const [forward] = received(M2, event.data.id);
      assert.equal(forward.body, body, "the raw body is forwarded unchanged");
      assert.equal(forward.assertion.ok, true);
      assert.equal(forward.assertion.claims.call_session_id, "app4xx-1");
      assert.equal(forward.headers["callfence-epoch"], undefined);
      assert.equal(forward.headers["callfence-call-session"], undefined);
      assert.equal(forward.headers["content-type"], "application/json");
      const call = await callOf(edge, "app4xx-1");
      assert.equal(eventState(call, event.data.id), "delivered");
      const dup = await webhook(edge, event);
      assert.deepEqual([dup.status, dup.body], [200, answer]);
      await sleep(1800); // past the lease: an unknown outcome would be re-driven by now
      assert.equal(received(M2, event.data.id).length, 1, "terminal: not re-driven");
      // Not penalised: the next call on the line still goes to M2.
      const next = await webhook(edge, callEvent("call.initiated", { session: "app4xx-2", leg: "app4xx-2-a", to: LINE }));
      assert.deepEqual([next.status, next.body.delivered_to], [200, "M2"]);
    } finally {
      M2.origin.respond = () => ({ status: 200, body: { ok: true } });
    }
  });

  test("a duplicate while an attempt's lease is live gets 503 in_progress, not a second forward", async () => {
    const slow = callEvent("call.initiated", { session: "lease-1", leg: "lease-1-a", to: LINE });
    // The origin answers 750 ms after the webhook was sent: inside the
    // 1000 ms budget however long the Dispatcher took, and late enough that
    // the duplicate lands while the first attempt is still open.
    let sentAt = 0;
    M2.origin.respond = async (r) => {
      if (r.body.includes("lease-1")) await sleep(Math.max(0, sentAt + 750 - Date.now()));
      return { status: 200, body: { ok: true } };
    };
    try {
      sentAt = Date.now();
      const firstP = webhook(edge, slow);
      await waitFor(() => received(M2, slow.data.id).length === 1, { what: "the slow forward" });
      const dup = await webhook(edge, slow);
      assert.deepEqual([dup.status, dup.body.error], [503, "in_progress"]);
      const first = await firstP;
      assert.deepEqual([first.status, first.body.delivered_to], [200, "M2"]);
      const later = await webhook(edge, slow);
      assert.deepEqual([later.status, later.body], [200, first.body]);
      assert.equal(received(M2, slow.data.id).length, 1);
    } finally {
      M2.origin.respond = () => ({ status: 200, body: { ok: true } });
    }
  });

  test("an event without from/to resolves by default_node; later events follow the owner", async () => {
    const bare = callEvent("call.initiated", { session: "bare-1", leg: "bare-1-a" });
    const res = await webhook(edge, bare);
    assert.deepEqual([res.status, res.body.delivered_to], [200, "M1"]);
    const decisions = await admin(edge, "/v1/decisions?call_session_id=bare-1");
    assert.equal(decisions.body.decisions.length, 1);
    assert.deepEqual(
      [decisions.body.decisions[0].rule, decisions.body.decisions[0].chosen, decisions.body.decisions[0].outcome],
      ["default", "M1", "assigned"],
    );
    // A later event naming the line (preferred M2) still goes to the owner, unresolved.
    const later = await webhook(edge, callEvent("call.answered", { session: "bare-1", leg: "bare-1-a", to: LINE, from: CALLER }));
    assert.deepEqual([later.status, later.body.delivered_to, later.body.epoch], [200, "M1", res.body.epoch]);
    // Without call_session_id, a known call_control_id finds its session.
    const legOnly = await webhook(edge, callEvent("call.speak.ended", { leg: "bare-1-a" }));
    assert.deepEqual([legOnly.status, legOnly.body.delivered_to], [200, "M1"]);
    assert.equal((await admin(edge, "/v1/decisions?call_session_id=bare-1")).body.decisions.length, 1);
    assert.equal(M1.origin.requests.filter((r) => r.body.includes("bare-1")).length, 3);
    assertVerified(M1);
  });

  test("after call.hangup, a later event still goes to the recorded owner, even if ineligible", async () => {
    const init = await webhook(edge, callEvent("call.initiated", { session: "hang-1", leg: "hang-1-a", from: CALLER, to: LINE }));
    assert.deepEqual([init.status, init.body.delivered_to], [200, "M2"]);
    const hang = await webhook(edge, callEvent("call.hangup", { session: "hang-1", leg: "hang-1-a" }));
    assert.deepEqual([hang.status, hang.body.delivered_to], [200, "M2"]);
    assert.equal((await callOf(edge, "hang-1")).body.state, "ended");
    const beat = await heartbeat(edge, M2, { mode: "drained" });
    assert.equal(beat.body.eligible, false);
    try {
      const late = callEvent("call.recording.saved", { session: "hang-1", leg: "hang-1-a", from: CALLER, to: LINE });
      const res = await webhook(edge, late);
      assert.deepEqual([res.status, res.body.delivered_to, res.body.epoch], [200, "M2", init.body.epoch]);
      assert.equal(received(M2, late.data.id).length, 1);
      assert.equal(received(M1, late.data.id).length, 0);
    } finally {
      assert.equal((await heartbeat(edge, M2)).body.eligible, true);
    }
  });

  test("no session and an unknown call_control_id: 200, counted unroutable, not forwarded", async () => {
    const before = (await admin(edge, "/v1/status")).body.counts.unroutable;
    const lost = callEvent("call.dtmf.received", { leg: "never-seen-leg" });
    const counts = [M1.origin.requests.length, M2.origin.requests.length];
    const res = await webhook(edge, lost);
    assert.equal(res.status, 200);
    const dup = await webhook(edge, lost);
    assert.equal(dup.status, 200);
    assert.equal((await admin(edge, "/v1/status")).body.counts.unroutable, before + 1);
    await sleep(200);
    assert.deepEqual([M1.origin.requests.length, M2.origin.requests.length], counts);
  });

  test("the alarm re-drives an unknown outcome: 500 once, then delivered without a carrier retry", async () => {
    const event = callEvent("call.initiated", { session: "redrive-1", leg: "redrive-1-a", to: LINE });
    let calls = 0;
    M2.origin.respond = (r) => {
      if (!r.body.includes("redrive-1")) return { status: 200, body: { ok: true } };
      calls += 1;
      return calls === 1 ? { status: 500, body: "boom" } : { status: 200, body: { ok: "second" } };
    };
    try {
      const res = await webhook(edge, event);
      assert.deepEqual([res.status, res.body.error], [503, "delivery_unknown"]);
      const call = await waitFor(
        async () => {
          const c = await callOf(edge, "redrive-1");
          return eventState(c, event.data.id) === "delivered" && c;
        },
        { timeout: 6000, what: "the alarm's re-drive" },
      );
      assert.equal(call.body.owner, "M2");
      const forwards = received(M2, event.data.id);
      assert.equal(forwards.length, 2);
      assert.deepEqual(
        forwards.map((f) => f.assertion.claims.epoch),
        [call.body.epoch, call.body.epoch],
      );
      assert.ok(forwards[1].assertion.claims.attempt > forwards[0].assertion.claims.attempt);
      assert.equal(forwards[0].body, forwards[1].body);
      assertVerified(M2);
      const dup = await webhook(edge, event);
      assert.deepEqual([dup.status, dup.body.delivered_to, dup.body.epoch], [200, "M2", call.body.epoch]);
      assert.equal(received(M2, event.data.id).length, 2);
    } finally {
      M2.origin.respond = () => ({ status: 200, body: { ok: true } });
    }
  });
});

describe("no eligible node, then one appears", () => {
  let cluster;
  before(async () => {
    cluster = await setupCluster({ nodes: ["M1"], beat: false });
  });
  after(() => cluster?.dispose());

  test("503 no_eligible_node with Retry-After 1; the alarm delivers once a beat arrives", async () => {
    const { edge } = cluster;
    const { M1 } = cluster.nodes;
    const event = callEvent("call.initiated", { session: "park-1", leg: "park-1-a", from: CALLER, to: LINE });
    const res = await webhook(edge, event);
    assert.deepEqual([res.status, res.body.error], [503, "no_eligible_node"]);
    assert.equal(res.headers.get("retry-after"), "1");
    const parked = await callOf(edge, "park-1");
    assert.equal(eventState(parked, event.data.id), "pending_assignment");
    assert.equal((await admin(edge, "/v1/status")).body.counts.pending, 1);

    await sleep(1500);
    assert.equal(M1.origin.requests.length, 0);
    const beat = await heartbeat(edge, M1);
    assert.equal(beat.body.eligible, true);
    const t0 = Date.now();
    await waitFor(() => received(M1, event.data.id).length === 1, { timeout: 3500, what: "the parked event" });
    assert.ok(Date.now() - t0 < 3500);
    assertVerified(M1);

    const call = await waitFor(async () => {
      const c = await callOf(edge, "park-1");
      return eventState(c, event.data.id) === "delivered" && c;
    });
    assert.equal(call.body.owner, "M1");
    const outcomes = (await admin(edge, "/v1/decisions?call_session_id=park-1")).body.decisions.map((d) => d.outcome);
    assert.deepEqual(outcomes, ["assigned", "pending"]);
    assert.deepEqual((await admin(edge, "/v1/status")).body.counts, {
      open_calls: 1,
      pending: 0,
      unroutable: 0,
      ignored: 0,
      sessions: 1,
      session_cap: 100000 * E2E_SHARDS, // each shard's table has its own
      storage_full: 0,
      claims_capacity_exhausted: 0,
      claims_rate_limited: 0,
    });
    const dup = await webhook(edge, event);
    assert.deepEqual([dup.status, dup.body.delivered_to], [200, "M1"]);
    assert.equal(received(M1, event.data.id).length, 1);
  });
});

describe("TELNYX_CONNECTION_IDS", () => {
  let cluster;
  before(async () => {
    cluster = await setupCluster({ nodes: ["M1"], bindings: { TELNYX_CONNECTION_IDS: "conn-a, conn-b" } });
  });
  after(() => cluster?.dispose());

  test("events of another connection, or of none, are 200 and ignored; ours are delivered", async () => {
    const { edge } = cluster;
    const { M1 } = cluster.nodes;
    const other = callEvent("call.initiated", { session: "conn-1", leg: "conn-1-a", to: LINE, connection_id: "conn-z" });
    const none = callEvent("call.initiated", { session: "conn-2", leg: "conn-2-a", to: LINE });
    for (const e of [other, none]) {
      const res = await webhook(edge, e);
      assert.equal(res.status, 200, e.data.payload.call_session_id);
      assert.equal(res.body.delivered_to, undefined);
    }
    assert.equal((await webhook(edge, other)).status, 200, "a duplicate of an ignored event");
    const status = await admin(edge, "/v1/status");
    assert.equal(status.body.counts.ignored, 2);
    assert.equal(status.body.counts.open_calls, 0);
    assert.deepEqual((await admin(edge, "/v1/decisions")).body.decisions, []);

    const ours = callEvent("call.initiated", { session: "conn-3", leg: "conn-3-a", to: LINE, connection_id: "conn-b" });
    const res = await webhook(edge, ours);
    assert.deepEqual([res.status, res.body.delivered_to], [200, "M1"]);
    assert.deepEqual(
      M1.origin.requests.map((r) => JSON.parse(r.body).data.id),
      [ours.data.id],
    );
    assertVerified(M1);
  });
});
