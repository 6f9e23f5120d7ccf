// Heartbeats (SPEC §6), eligibility and selection with the decisions that
// record why (§5, §9), preview (§9, §13) and the status shape (§13), through
// the real Worker + Dispatcher with loopback origins for every node.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { bearer, nowSeconds, read, sha256Hex } from "./harness.mjs";
import {
  CLEAN_SHA,
  admin,
  callEvent,
  heartbeat,
  heartbeatBody,
  nodePost,
  putRegistry,
  setupCluster,
  sleep,
  waitFor,
  webhook,
} from "./fixtures.mjs";

const json = (body) => JSON.stringify(body);
const SALES = "+15550001111"; // prefers M2, falls back to M1
const CANARY = "+15550002222"; // prefers M3 (candidate), falls back to M1
const BACKUP = "+15550003333"; // prefers M2, falls back to M3 (candidate)
const CALLER = "+14155550100"; // override: prefers M3
const LINES = { backup: BACKUP, canary: CANARY, sales: SALES };
const hashOf = (lines) => sha256Hex(Object.keys(lines).sort().map((id) => `${id}=${lines[id]}\n`).join(""));

describe("heartbeats, eligibility, preview and status", () => {
  let cluster;
  let edge;
  let M1;
  let M2;
  let M3;
  let policy;
  let perNode = { M1: { max_calls: 50 } };
  let calls = 0;
  const open = { M1: 0, M2: 0, M3: 0 }; // calls assigned (and still open) per node

  before(async () => {
    policy = {
      schema: "riff_node_routing_policy_v1",
      default_node: "M1",
      by_line: {
        sales: { called_number: SALES, preferred_node: "M2", fallback_node: "M1" },
        canary: { called_number: CANARY, preferred_node: "M3", fallback_node: "M1" },
        backup: { called_number: BACKUP, preferred_node: "M2", fallback_node: "M3" },
      },
      by_caller: { [CALLER]: { preferred_node: "M3", expires_at: new Date(Date.now() + 3600e3).toISOString() } },
    };
    cluster = await setupCluster({ nodes: ["M1", "M2", { id: "M3", role: "candidate" }], perNode, policy, beat: false });
    ({ edge } = cluster);
    ({ M1, M2, M3 } = cluster.nodes);
    for (const node of [M1, M2]) {
      const res = await heartbeat(edge, node, { capacity: { max_calls: 100, active_calls: 0 } });
      assert.equal(res.status, 200, json(res.body));
    }
  });
  after(() => cluster?.dispose());

  const status = async () => {
    const res = await admin(edge, "/v1/status");
    assert.equal(res.status, 200, json(res.body));
    return res.body;
  };
  const nodeStatus = async (id) => (await status()).nodes.find((n) => n.node === id);

  /** Fresh beats from M1 and M3 (the suite is slower than valid_for_s under load). */
  async function fresh() {
    for (const node of [M1, M3]) {
      const res = await heartbeat(edge, node, { valid_for_s: 30, capacity: { max_calls: 100, active_calls: 0 } });
      assert.equal(res.status, 200, json(res.body));
    }
  }

  /** A new inbound call to `to`; returns its one decision (asserting evidence). */
  async function newCall(to, { from = "+14155550999", chosen } = {}) {
    await fresh();
    const inForce = await status();
    const session = `sess-${++calls}-${Date.now()}`;
    const event = callEvent("call.initiated", { session, leg: `leg-${session}`, from, to });
    const res = await webhook(edge, event);
    assert.equal(res.status, 200, json(res.body));
    const listed = await admin(edge, `/v1/decisions?call_session_id=${encodeURIComponent(session)}`);
    assert.equal(listed.status, 200);
    assert.equal(listed.body.decisions.length, 1, json(listed.body));
    const d = listed.body.decisions[0];
    assert.equal(d.call_session_id, session);
    assert.equal(d.event_id, event.data.id);
    assert.match(d.at, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
    assert.equal(d.outcome, "assigned");
    assert.equal(res.body.delivered_to, d.chosen);
    if (chosen) assert.equal(d.chosen, chosen, json(d));
    // Evidence: what the decision was taken under.
    assert.deepEqual([d.policy_revision, d.nodes_revision], [inForce.policy_revision, inForce.nodes_revision]);
    assert.match(d.chosen_sha, /^[0-9a-f]{40}$/);
    assert.equal(d.chosen_clean, true);
    assert.equal(d.epoch, res.body.epoch);
    open[d.chosen] += 1;
    return d;
  }

  // --------------------------------------------------------- heartbeats ----

  test("a valid beat is accepted with the verdict and the line registry", async () => {
    const res = await heartbeat(edge, M2, { capacity: { max_calls: 100, active_calls: 0 } });
    assert.equal(res.status, 200, json(res.body));
    assert.equal(res.body.accepted, true);
    assert.equal(res.body.eligible, true);
    assert.deepEqual(res.body.reasons, []);
    assert.ok(Math.abs(Date.parse(res.body.edge_time) - Date.now()) < 5000, res.body.edge_time);
    assert.deepEqual(res.body.routing, { hash: hashOf(LINES), lines: LINES });
    const edgeStatus = await status();
    assert.equal(edgeStatus.routing_hash, hashOf(LINES));
  });

  test("forged, unknown-key and skewed beats are 401 and store nothing", async () => {
    const body = heartbeatBody(edge, M3);
    const cases = [
      [() => ({ privateKey: M2.key.privateKeyObject }), M3, "bad_node_signature"],
      [() => ({ retry: false }), { ...M3, kid: "nope" }, "unknown_node_key"],
      [() => ({ timestamp: nowSeconds() - 302 }), M3, "stale_timestamp"],
      [() => ({ timestamp: nowSeconds() + 302 }), M3, "stale_timestamp"],
    ];
    for (const [opts, who, code] of cases) {
      const res = await nodePost(edge, who, "/v1/nodes/heartbeat", body, opts());
      assert.deepEqual([res.status, res.body], [401, { error: code }], code);
    }
    const m3 = await nodeStatus("M3");
    assert.equal(m3.heartbeat_age_s, null, json(m3));
    assert.equal(m3.eligible, false);
    assert.ok(m3.reasons.includes("no_heartbeat"), json(m3));
    // The same body, signed by M3, is then accepted: it was not consumed.
    const ok = await nodePost(edge, M3, "/v1/nodes/heartbeat", body);
    assert.equal(ok.status, 200, json(ok.body));
    assert.equal((await nodeStatus("M3")).eligible, true);
  });

  test("seq must grow; a byte-identical re-send gets the stored answer", async () => {
    const body = JSON.stringify(heartbeatBody(edge, M2, { capacity: { max_calls: 100, active_calls: 0 } }));
    const first = await nodePost(edge, M2, "/v1/nodes/heartbeat", body);
    assert.equal(first.status, 200, json(first.body));
    await sleep(20);
    const again = await nodePost(edge, M2, "/v1/nodes/heartbeat", body);
    assert.deepEqual([again.status, again.body], [200, first.body]);
    const sameSeq = JSON.parse(body);
    sameSeq.sent_at = new Date().toISOString();
    const stale = await nodePost(edge, M2, "/v1/nodes/heartbeat", sameSeq);
    assert.deepEqual([stale.status, stale.body.error], [409, "stale_seq"]);
    const lower = await nodePost(edge, M2, "/v1/nodes/heartbeat", { ...sameSeq, seq: sameSeq.seq - 1 });
    assert.deepEqual([lower.status, lower.body.error], [409, "stale_seq"]);
  });

  test("a body naming another node than Callfence-Node is 400 invalid_heartbeat", async () => {
    const res = await nodePost(edge, M2, "/v1/nodes/heartbeat", heartbeatBody(edge, M1));
    assert.deepEqual([res.status, res.body.error], [400, "invalid_heartbeat"]);
  });

  test("a dirty node's beat is accepted, not eligible, reason dirty", async () => {
    const res = await heartbeat(edge, M2, { dirty: true, capacity: { max_calls: 100, active_calls: 0 } });
    assert.equal(res.status, 200, json(res.body));
    assert.deepEqual([res.body.accepted, res.body.eligible, res.body.reasons], [true, false, ["dirty"]]);
    const m2 = await nodeStatus("M2");
    assert.deepEqual([m2.clean, m2.eligible, m2.reasons], [false, false, ["dirty"]]);
  });

  // -------------------------------------------------------- eligibility ----

  test("an ineligible preferred node is never chosen; the decision says why", async () => {
    const healthy = { capacity: { max_calls: 100, active_calls: 0 } };
    const cases = [
      [{ dirty: true }, "dirty"],
      [{ mode: "drained" }, "mode_drained"],
      [{ mode: "shadow" }, "mode_shadow"],
      [{ capacity: { max_calls: 2, active_calls: 2 } }, "capacity_exhausted"],
      [{ lines: { ...LINES, sales: "+15550009999" } }, "routing_hash_mismatch"],
      [{ lines: { canary: CANARY } }, "line_not_served"],
      [{ app_ready: false }, "app_down"],
      [{ tunnel_up: false }, "tunnel_down"],
      [{ origin_url: "http://127.0.0.1:1/callfence/telnyx" }, "origin_mismatch"],
      [{ sha: "A".repeat(40) }, "sha_invalid"],
    ];
    for (const [state, code] of cases) {
      const beat = await heartbeat(edge, M2, { ...healthy, ...state });
      assert.equal(beat.status, 200, json(beat.body));
      const d = await newCall(SALES, { chosen: "M1" });
      assert.equal(d.rule, "line");
      assert.equal(d.line_id, "sales");
      assert.equal(d.prefers, "M2");
      assert.ok(d.reasons.M2?.includes(code), `${code}: ${json(d.reasons)}`);
    }
    // Healthy again: the preferred node takes the call.
    assert.equal((await heartbeat(edge, M2, healthy)).status, 200);
    const d = await newCall(SALES, { chosen: "M2" });
    assert.equal(d.chosen_sha, CLEAN_SHA);
    assert.equal(M2.origin.requests.at(-1).assertion.ok, true);
  });

  test("a stale beat (valid_for_s 1, then > 3 s) is heartbeat_stale", async () => {
    assert.equal((await heartbeat(edge, M2, { valid_for_s: 1, capacity: { max_calls: 100, active_calls: 0 } })).status, 200);
    await sleep(3300);
    const d = await newCall(SALES, { chosen: "M1" });
    assert.ok(d.reasons.M2?.includes("heartbeat_stale"), json(d.reasons));
    assert.equal((await heartbeat(edge, M2, { capacity: { max_calls: 100, active_calls: 0 } })).status, 200);
  });

  test("beat timing: the stale clock is min(receipt, timestamp + 2 s); > 10 s skew is clock_skew", async () => {
    const late = heartbeatBody(edge, M2, { valid_for_s: 5, capacity: { max_calls: 100, active_calls: 0 } });
    const stale = await nodePost(edge, M2, "/v1/nodes/heartbeat", late, { timestamp: nowSeconds() - 8 });
    assert.equal(stale.status, 200, json(stale.body));
    assert.equal(stale.body.eligible, false);
    assert.ok(stale.body.reasons.includes("heartbeat_stale"), json(stale.body));
    const skewed = heartbeatBody(edge, M2, { valid_for_s: 30, capacity: { max_calls: 100, active_calls: 0 } });
    const skew = await nodePost(edge, M2, "/v1/nodes/heartbeat", skewed, { timestamp: nowSeconds() - 12 });
    assert.deepEqual([skew.status, skew.body.eligible], [200, false], json(skew.body));
    assert.deepEqual(skew.body.reasons, ["clock_skew"]);
    const d = await newCall(SALES, { chosen: "M1" });
    assert.deepEqual(d.reasons.M2, ["clock_skew"]);
  });

  test("capacity counts the open calls the Dispatcher assigned; allowed_shas is enforced", async () => {
    const cap = open.M2 + 1;
    perNode = { ...perNode, M2: { max_calls: cap } };
    assert.equal((await putRegistry(edge, [M1, M2, M3], perNode)).status, 200);
    assert.equal((await heartbeat(edge, M2, { valid_for_s: 30, capacity: { max_calls: 100, active_calls: 0 } })).status, 200);
    await newCall(SALES, { chosen: "M2" }); // the call being decided does not count against itself
    const full = await newCall(SALES, { chosen: "M1" });
    assert.deepEqual(full.reasons.M2, ["capacity_exhausted"]);
    const m2 = await nodeStatus("M2");
    assert.deepEqual(m2.capacity, { max_calls: cap, active_calls: 0, open_calls: cap });

    perNode = { ...perNode, M2: { allowed_shas: ["b".repeat(40)] } };
    assert.equal((await putRegistry(edge, [M1, M2, M3], perNode)).status, 200);
    const d = await newCall(SALES, { chosen: "M1" });
    assert.deepEqual(d.reasons.M2, ["sha_not_allowed"]);
    perNode = { ...perNode, M2: {} };
    assert.equal((await putRegistry(edge, [M1, M2, M3], perNode)).status, 200);
    await newCall(SALES, { chosen: "M2" });
  });

  test("an admin-drained node is not chosen", async () => {
    perNode = { ...perNode, M2: { admin_drained: true } };
    assert.equal((await putRegistry(edge, [M1, M2, M3], perNode)).status, 200);
    const d = await newCall(SALES, { chosen: "M1" });
    assert.ok(d.reasons.M2?.includes("admin_drained"), json(d.reasons));
    perNode = { ...perNode, M2: { admin_drained: false } };
    assert.equal((await putRegistry(edge, [M1, M2, M3], perNode)).status, 200);
    await newCall(SALES, { chosen: "M2" });
  });

  test("a candidate takes calls as a canary with canary_go, and not without", async () => {
    assert.equal((await heartbeat(edge, M3)).status, 200);
    await newCall(CANARY, { chosen: "M3" });
    perNode = { ...perNode, M3: { canary_go: false } };
    assert.equal((await putRegistry(edge, [M1, M2, M3], perNode)).status, 200);
    const d = await newCall(CANARY, { chosen: "M1" });
    assert.equal(d.prefers, "M3");
    assert.ok(d.reasons.M3?.includes("canary_not_go"), json(d.reasons));
  });

  test("a candidate reached as a fallback needs fallback_approved", async () => {
    assert.equal((await heartbeat(edge, M2, { dirty: true, capacity: { max_calls: 100, active_calls: 0 } })).status, 200);
    const refused = await newCall(BACKUP, { chosen: "M1" });
    assert.ok(refused.reasons.M2?.includes("dirty"), json(refused.reasons));
    assert.ok(refused.reasons.M3?.includes("candidate_not_approved"), json(refused.reasons));
    perNode = { ...perNode, M3: { canary_go: false, fallback_approved: true } };
    assert.equal((await putRegistry(edge, [M1, M2, M3], perNode)).status, 200);
    const approved = await newCall(BACKUP, { chosen: "M3" });
    assert.ok(approved.reasons.M2?.includes("dirty"), json(approved.reasons));
    assert.equal(approved.reasons.M3, undefined, json(approved.reasons));
  });

  // ------------------------------------------------------------ preview ----

  async function previewAs(to, from) {
    const res = await read(
      await edge.fetch("/v1/routing/preview", {
        method: "POST",
        headers: { ...bearer(edge.keys.policyToken), "content-type": "application/json" },
        body: json({ to, from }),
      }),
    );
    assert.equal(res.status, 200, json(res.body));
    return res;
  }

  test("numbers are normalised; a line's rules bind its fallbacks too", async () => {
    for (const to of ["sip:+1 555-000-3333@pbx.example;user=phone", "tel:15550003333", "0015550003333", "(555) 000.3333"]) {
      const { body } = await previewAs(to, "sips:4155550100@pbx.example");
      assert.deepEqual([body.rule, body.line_id], ["caller_override", "backup"], `${to}: ${json(body)}`);
    }
    assert.equal((await previewAs("+0015550003333", "12")).body.rule, "default");
    // M1 stops serving the sales line: with M2 dirty, no node may take it.
    const lines = { backup: BACKUP, canary: CANARY };
    assert.equal((await heartbeat(edge, M1, { lines, capacity: { max_calls: 100, active_calls: 0 } })).status, 200);
    const none = (await previewAs(SALES, "+14155550999")).body;
    assert.equal(none.chosen, null, json(none));
    assert.ok(none.reasons.M1?.includes("line_not_served"), json(none));
    assert.ok(none.reasons.M2?.includes("dirty"), json(none));
    await fresh();
    assert.equal((await previewAs(SALES, "+14155550999")).body.chosen, "M1");
  });

  test("preview resolves override, line and default, and writes nothing", async () => {
    await fresh();
    const before = { decisions: (await admin(edge, "/v1/decisions?limit=500")).body.decisions, status: await status() };
    const preview = async (to, from) => {
      const res = await previewAs(to, from);
      for (const key of ["rule", "line_id", "prefers", "chosen", "reasons", "policy_revision", "nodes_revision"]) {
        assert.ok(key in res.body, `${key} in ${json(res.body)}`);
      }
      assert.equal(res.body.policy_revision, before.status.policy_revision);
      assert.equal(res.body.nodes_revision, before.status.nodes_revision);
      return res.body;
    };
    // M2 is dirty, M3 is not canary_go but fallback_approved.
    const override = await preview(SALES, CALLER);
    assert.deepEqual([override.rule, override.prefers], ["caller_override", "M3"]);
    assert.equal(override.chosen, "M1", json(override)); // the line's fallback
    assert.ok(override.reasons.M3?.includes("canary_not_go"), json(override));
    const line = await preview("1-555-000-3333", "+14155550999");
    assert.deepEqual([line.rule, line.line_id, line.prefers, line.chosen], ["line", "backup", "M2", "M3"]);
    assert.ok(line.reasons.M2.includes("dirty"));
    const dflt = await preview("+15559998888", "+14155550999");
    assert.deepEqual([dflt.rule, dflt.line_id, dflt.prefers, dflt.chosen], ["default", null, "M1", "M1"]);

    const afterDecisions = (await admin(edge, "/v1/decisions?limit=500")).body.decisions;
    assert.deepEqual(afterDecisions, before.decisions);
    const afterStatus = await status();
    assert.deepEqual(afterStatus.counts, before.status.counts);
    assert.deepEqual(afterStatus.recent_decisions, before.status.recent_decisions);
  });

  // ------------------------------------------------------------- status ----

  test("status has the §13 shape and counts what happened", async () => {
    await fresh();
    const s = await status();
    assert.equal(s.engine.operative, true);
    assert.ok(Date.now() - Date.parse(s.engine.last_webhook_at) < 60000, json(s.engine));
    assert.ok(Number.isInteger(s.policy_revision) && Number.isInteger(s.nodes_revision));

    const sales = s.lines.find((l) => l.line_id === "sales");
    assert.deepEqual(
      [sales.called_number, sales.prefers, sales.next_call_target, sales.fallback_in_use],
      [SALES, "M2", "M1", true],
    );
    assert.ok(sales.reasons.M2.includes("dirty"), json(sales));
    const backup = s.lines.find((l) => l.line_id === "backup");
    assert.deepEqual([backup.next_call_target, backup.fallback_in_use], ["M3", true]);
    const canary = s.lines.find((l) => l.line_id === "canary");
    assert.deepEqual([canary.prefers, canary.next_call_target], ["M3", "M1"]);
    assert.ok(canary.reasons.M3.includes("canary_not_go"), json(canary));

    const m1 = s.nodes.find((n) => n.node === "M1");
    assert.deepEqual(
      [m1.role, m1.mode, m1.sha, m1.clean, m1.app_ready, m1.tunnel_up, m1.eligible, m1.reasons],
      ["stable", "active", CLEAN_SHA, true, true, true, true, []],
    );
    assert.ok(typeof m1.heartbeat_age_s === "number" && m1.heartbeat_age_s >= 0, json(m1));
    // Effective max_calls: min(beat 100, registry 50); every call sent to M1 is open.
    assert.deepEqual(m1.capacity, { max_calls: 50, active_calls: 0, open_calls: open.M1 });
    const m2 = s.nodes.find((n) => n.node === "M2");
    assert.deepEqual([m2.clean, m2.eligible, m2.capacity.max_calls], [false, false, 100]);
    assert.equal(m2.capacity.open_calls, open.M2);
    const m3 = s.nodes.find((n) => n.node === "M3");
    assert.deepEqual([m3.role, m3.capacity.open_calls], ["candidate", open.M3]);

    assert.equal(s.overrides.length, 1);
    assert.deepEqual(
      [s.overrides[0].caller, s.overrides[0].prefers, s.overrides[0].expires_at, s.overrides[0].expired],
      [CALLER, "M3", policy.by_caller[CALLER].expires_at, false],
    );
    assert.equal(s.counts.open_calls, calls);
    assert.deepEqual([s.counts.pending, s.counts.unroutable, s.counts.ignored], [0, 0, 0]);
    assert.ok(s.recent_decisions.length >= 1 && s.recent_decisions.length <= calls);
    assert.ok(s.recent_decisions.every((d) => d.outcome === "assigned"));
  });
});

describe("recent_forward_failure", () => {
  test("a node whose forward failed is passed over until a delivery to it", async () => {
    const line = { called_number: SALES, preferred_node: "M2", fallback_node: "M1" };
    const policy = { schema: "riff_node_routing_policy_v1", default_node: "M1", by_line: { sales: line } };
    const cluster = await setupCluster({ nodes: ["M1", "M2"], policy });
    const { edge } = cluster;
    const { M2 } = cluster.nodes;
    const call = (session) => webhook(edge, callEvent("call.initiated", { session, leg: `leg-${session}`, from: CALLER, to: SALES }));
    const decision = async (session) => (await admin(edge, `/v1/decisions?call_session_id=${session}`)).body.decisions[0];
    try {
      M2.origin.respond = () => ({ status: 500, body: { error: "boom" } });
      const failed = await call("rff-1");
      assert.deepEqual([failed.status, failed.body.error], [503, "delivery_unknown"], json(failed.body));
      assert.equal((await decision("rff-1")).chosen, "M2");

      const second = await call("rff-2");
      assert.deepEqual([second.status, second.body.delivered_to], [200, "M1"], json(second.body));
      assert.deepEqual((await decision("rff-2")).reasons.M2, ["recent_forward_failure"]);

      // The alarm re-drives rff-1 to M2, which now answers: the mark clears.
      M2.origin.respond = () => ({ status: 200, body: { ok: true } });
      await waitFor(
        async () => (await admin(edge, "/v1/calls/rff-1")).body.events?.[0]?.state === "delivered",
        { timeout: 15000, interval: 250, what: "the re-drive of rff-1" },
      );
      assert.equal((await heartbeat(edge, M2)).status, 200);
      const third = await call("rff-3");
      assert.deepEqual([third.status, third.body.delivered_to], [200, "M2"], json(third.body));
    } finally {
      await cluster.dispose();
    }
  });
});
