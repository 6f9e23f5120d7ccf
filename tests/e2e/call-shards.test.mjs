// Calls spread over call shards (SPEC §16) through the real Worker and
// real Durable Objects: `global` and `calls-1` … `calls-3`, each its own
// object with its own SQLite storage, the call shards deciding under
// leases from `global`.
//
// A session is placed on shard jump(h, N) (h: the first 8 bytes of
// SHA-256 of its id), computed here as the contract states it, so each
// test knows which object holds what.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { readPages, sha256Hex } from "./harness.mjs";
import { admin, callEvent, fence, heartbeat, setupCluster, waitFor, webhook } from "./fixtures.mjs";

const SCHEMA = "callfence_shards_v1";
const LINE = "+15102160079";
const MASK = (1n << 64n) - 1n;

/** Lamping and Veach's jump consistent hash of a 64-bit `key` into `n` buckets. */
function jump(key, n) {
  let b = -1n;
  let j = 0n;
  while (j < BigInt(n)) {
    b = j;
    key = (key * 2862933555777941757n + 1n) & MASK;
    j = BigInt(Math.floor(Number(b + 1n) * (2 ** 31 / Number((key >> 33n) + 1n))));
  }
  return Number(b < 0n ? 0n : b);
}

/** The shard a session is placed on: jump of its SHA-256's first 8 bytes. */
function home(session, shards) {
  return jump(BigInt(`0x${sha256Hex(session).slice(0, 16)}`), shards);
}

/** A session id (with `tag`) placed on shard `k` of `shards`. */
function sessionOn(k, shards, tag) {
  for (let i = 0; ; i++) {
    const id = `v3:${tag}-${i}`;
    if (home(id, shards) === k) return id;
  }
}

async function putMap(edge, callShards) {
  const current = (await admin(edge, "/v1/shards")).body.revision;
  return admin(edge, "/v1/shards", {
    method: "PUT",
    headers: { "content-type": "application/json", "if-match": `"${current}"` },
    body: JSON.stringify({ schema: SCHEMA, call_shards: callShards }),
  });
}

/**
 * One node, M1, and a map of four call shards in force. M1 beats
 * `max_calls` 100 unless `perNode` sets its registry's limit.
 */
async function fourShards(perNode = {}) {
  const cluster = await setupCluster({ nodes: ["M1"], perNode });
  const beat = await heartbeat(cluster.edge, cluster.nodes.M1, { capacity: { max_calls: 100, active_calls: 0 } });
  assert.equal(beat.status, 200, JSON.stringify(beat.body));
  const put = await putMap(cluster.edge, 4);
  assert.equal(put.status, 200, JSON.stringify(put.body));
  return cluster;
}

const initiated = (session) => callEvent("call.initiated", { session, leg: `leg-${session}`, from: "+12125550199", to: LINE });

describe("call shards: four objects, one holder per session", () => {
  let cluster;
  let edge;
  before(async () => {
    cluster = await fourShards();
    edge = cluster.edge;
  });
  after(() => cluster?.dispose());

  test("the placement this test computes is the contract's", () => {
    // Values of the reference jump hash (Lamping and Veach; go-jump).
    assert.equal(jump(MASK, 10), 9);
    assert.equal(jump(MASK, 100), 92);
  });

  test("a session on each shard is forwarded, fenced and read back by its holder, once", async () => {
    const m1 = cluster.nodes.M1;
    for (let k = 0; k < 4; k++) {
      const session = sessionOn(k, 4, "each");
      const event = initiated(session);
      const before = m1.origin.requests.length;
      const got = await webhook(edge, event);
      assert.equal(got.status, 200, `shard ${k}: ${JSON.stringify(got.body)}`);
      assert.equal(got.body.delivered_to, "M1", `shard ${k}`);
      const epoch = got.body.epoch;
      // The same delivery again: deduplicated at the holder, not sent twice.
      const again = await webhook(edge, event);
      assert.deepEqual([again.status, again.body.epoch], [200, epoch], `shard ${k}`);
      assert.equal(m1.origin.requests.length, before + 1, `shard ${k}: one forward`);
      const granted = await fence(edge, m1, { call_session_id: session, call_control_id: `leg-${session}`, epoch });
      assert.equal(granted.status, 200, `shard ${k}: ${JSON.stringify(granted.body)}`);
      // Asked again, the holder gives the same grant; a stale epoch none.
      const twice = await fence(edge, m1, { call_session_id: session, call_control_id: `leg-${session}`, epoch });
      assert.deepEqual([twice.status, twice.body.command_id], [200, granted.body.command_id], `shard ${k}`);
      const stale = await fence(edge, m1, { call_session_id: session, call_control_id: `leg-${session}`, epoch: epoch + 1 });
      assert.equal(stale.status, 409, `shard ${k}: ${JSON.stringify(stale.body)}`);
      // Percent-encoded as a client library sends it: the same record.
      const record = await admin(edge, `/v1/calls/${encodeURIComponent(session)}`);
      assert.equal(record.status, 200, `shard ${k}: ${JSON.stringify(record.body)}`);
    }
  });

  test("an event that names no session reaches the holder of its leg, on any shard", async () => {
    const m1 = cluster.nodes.M1;
    for (let k = 0; k < 4; k++) {
      const session = sessionOn(k, 4, "legless");
      const first = await webhook(edge, initiated(session));
      assert.equal(first.status, 200, `shard ${k}: ${JSON.stringify(first.body)}`);
      const before = m1.origin.requests.length;
      const hangup = callEvent("call.hangup", { leg: `leg-${session}` });
      const got = await webhook(edge, hangup);
      assert.equal(got.status, 200, `shard ${k}: ${JSON.stringify(got.body)}`);
      assert.equal(got.body.unroutable, undefined, `shard ${k}: ${JSON.stringify(got.body)}`);
      assert.equal(got.body.delivered_to, "M1", `shard ${k}: ${JSON.stringify(got.body)}`);
      assert.equal(m1.origin.requests.length, before + 1, `shard ${k}: forwarded once, to the leg's owner`);
      const record = await admin(edge, `/v1/calls/${encodeURIComponent(session)}`);
      assert.ok(JSON.stringify(record.body).includes(hangup.data.id), `shard ${k}: ${JSON.stringify(record.body)}`);
    }
    const nobody = await webhook(edge, callEvent("call.hangup", { leg: "leg-of-no-call" }));
    assert.deepEqual([nobody.status, nobody.body.unroutable], [200, true], JSON.stringify(nobody.body));
  });

  test("status sums the open calls of every shard, and decisions merge them newest first", async () => {
    const open = async () => {
      const status = await admin(edge, "/v1/status");
      assert.equal(status.status, 200, JSON.stringify(status.body));
      assert.deepEqual(status.body.shards_unreachable, []);
      // Each shard's own open calls, which the panel shows, add up to the sum.
      assert.deepEqual(Object.keys(status.body.shard_open_calls), ["0", "1", "2", "3"]);
      const perShard = Object.values(status.body.shard_open_calls).reduce((a, b) => a + b, 0);
      assert.equal(perShard, status.body.counts.open_calls, JSON.stringify(status.body.shard_open_calls));
      const m1 = status.body.nodes.find((n) => n.node === "M1");
      assert.equal(m1.capacity.open_calls, status.body.counts.open_calls, JSON.stringify(m1));
      return status.body.counts.open_calls;
    };
    const before = await open();
    const sessions = [0, 1, 2, 3].map((k) => sessionOn(k, 4, "read"));
    for (const session of sessions) {
      const got = await webhook(edge, initiated(session));
      assert.equal(got.status, 200, JSON.stringify(got.body));
    }
    assert.equal(await open(), before + 4, "one more open call on each shard");
    // One scrape merges every shard: each names its open calls, and M1's sum them.
    const scrape = await admin(edge, "/v1/metrics");
    assert.equal(scrape.status, 200, String(scrape.body));
    const text = typeof scrape.body === "string" ? scrape.body : JSON.stringify(scrape.body);
    const sample = (series) => Number(text.split("\n").find((l) => l.startsWith(`${series} `))?.split(" ")[1]);
    const perShard = [0, 1, 2, 3].map((k) => sample(`callfence_open_calls{shard="${k}"}`));
    assert.ok(perShard.every((n) => n >= 1), text);
    assert.equal(sample('callfence_node_open_calls{node="M1"}'), perShard.reduce((a, b) => a + b, 0), text);
    const decisions = await admin(edge, "/v1/decisions?limit=3");
    assert.equal(decisions.status, 200, JSON.stringify(decisions.body));
    assert.deepEqual(decisions.body.shards_unreachable, []);
    assert.equal(decisions.body.decisions.length, 3);
    const newestFirst = decisions.body.decisions.map((d) => d.at);
    assert.deepEqual(newestFirst, [...newestFirst].sort().reverse());
    const all = await admin(edge, "/v1/decisions");
    const named = new Set(all.body.decisions.map((d) => d.call_session_id));
    for (const session of sessions) assert.ok(named.has(session), `${session} in the merged decisions`);
    // Ids are unique across shards, so pages of 2 from the start walk every
    // decision once, ascending.
    const ids = all.body.decisions.map((d) => d.decision_id);
    assert.equal(new Set(ids).size, ids.length, JSON.stringify(ids));
    const walked = [];
    let after = 0;
    for (let page = 0; page < 50 && after !== null; page++) {
      const got = await admin(edge, `/v1/decisions?after=${after}&limit=2`);
      assert.equal(got.status, 200, JSON.stringify(got.body));
      walked.push(...got.body.decisions.map((d) => d.decision_id));
      after = got.body.next;
    }
    assert.deepEqual(walked, [...ids].sort((a, b) => a - b));
    // Whole calls, paged 2 at a time over every shard: each once, ascending.
    const seen = [];
    let cursor = null;
    for (let page = 0; page < 50; page++) {
      const got = await admin(edge, `/v1/calls?limit=2${cursor ? `&after=${encodeURIComponent(cursor)}` : ""}`);
      assert.equal(got.status, 200, JSON.stringify(got.body));
      seen.push(...got.body.calls.map((c) => c.call_session_id));
      cursor = got.body.next;
      if (cursor === null) break;
    }
    assert.deepEqual(seen, [...new Set(seen)].sort(), "ascending, no repeat");
    for (const session of sessions) assert.ok(seen.includes(session), `${session} paged`);
    // The ledger export, paged 3 at a time: every shard's events once, by seq.
    const events = await readPages(edge, edge.keys.adminToken, "/v1/events", "events", { limit: 3 });
    const seqs = events.map((e) => e.seq);
    assert.deepEqual(seqs, [...new Set(seqs)].sort((a, b) => a - b), "ascending, no repeat");
    const exported = new Set(events.map((e) => e.call_session_id));
    for (const session of sessions) assert.ok(exported.has(session), `${session}'s events exported`);
  });

  test("a restarted object forgets its memory and keeps its calls: deduplicated, fenced and delivered as before", async () => {
    const m1 = cluster.nodes.M1;
    /** A message straight to the instance `name` (the testing build's). */
    const message = async (name, op) => {
      const stub = await edge.dispatcher(name);
      const res = await stub.fetch(`https://${name}/${op}`, { method: "POST", body: `{"v":2,"op":"${op}"}\n` });
      return { status: res.status, body: JSON.parse(await res.text()) };
    };
    const profiled = async () => Object.values((await message("global", "profile")).body.ops).reduce((n, op) => n + op.count, 0);
    for (let k = 0; k < 4; k++) {
      const name = k === 0 ? "global" : `calls-${k}`;
      const session = sessionOn(k, 4, "restart");
      const event = initiated(session);
      const first = await webhook(edge, event);
      assert.equal(first.status, 200, `${name}: ${JSON.stringify(first.body)}`);
      const sent = m1.origin.requests.length;
      const before = await profiled();
      assert.ok(before > 0, `${name}: global profiled nothing`);
      const restarted = await message(name, "restart");
      assert.deepEqual([restarted.status, restarted.body.restarting], [200, true], `${name}: ${JSON.stringify(restarted.body)}`);
      // The reset follows the answer: global's profile, kept in memory only, is gone.
      if (k === 0) await waitFor(async () => (await profiled()) < before, { timeout: 5_000, what: "global's reset" });
      const again = await webhook(edge, event);
      assert.deepEqual([again.status, again.body.epoch], [200, first.body.epoch], `${name}: ${JSON.stringify(again.body)}`);
      assert.equal(m1.origin.requests.length, sent, `${name}: the duplicate forwarded again after the restart`);
      const ids = { call_session_id: session, call_control_id: `leg-${session}`, epoch: first.body.epoch };
      const granted = await fence(edge, m1, ids);
      assert.equal(granted.status, 200, `${name}: ${JSON.stringify(granted.body)}`);
      const hangup = await webhook(edge, callEvent("call.hangup", { session, leg: `leg-${session}` }));
      assert.deepEqual([hangup.status, hangup.body.delivered_to], [200, "M1"], `${name}: ${JSON.stringify(hangup.body)}`);
    }
  });

  test("a shrink under live calls moves no session: their events still reach their holders", async () => {
    const m1 = cluster.nodes.M1;
    // Live calls on shards 2 and 3, then the map shrinks to 2 shards.
    const live = [sessionOn(2, 4, "live"), sessionOn(3, 4, "live")];
    const epochs = [];
    for (const session of live) {
      const got = await webhook(edge, initiated(session));
      assert.equal(got.status, 200, JSON.stringify(got.body));
      epochs.push(got.body.epoch);
    }
    const put = await putMap(edge, 2);
    assert.equal(put.status, 200, JSON.stringify(put.body));
    for (const [i, session] of live.entries()) {
      const before = m1.origin.requests.length;
      const answered = callEvent("call.answered", { session, leg: `leg-${session}`, from: "+12125550199", to: LINE });
      const got = await webhook(edge, answered);
      assert.equal(got.status, 200, JSON.stringify(got.body));
      assert.deepEqual([got.body.delivered_to, got.body.epoch], ["M1", epochs[i]], "the holder's owner and epoch");
      assert.equal(m1.origin.requests.length, before + 1);
      const granted = await fence(edge, m1, { call_session_id: session, call_control_id: `leg-${session}`, epoch: epochs[i] });
      assert.equal(granted.status, 200, JSON.stringify(granted.body));
    }
    // A new session now lands on one of the two shards left, once.
    const fresh = sessionOn(1, 2, "fresh");
    const got = await webhook(edge, initiated(fresh));
    assert.equal(got.status, 200, JSON.stringify(got.body));
    const record = await admin(edge, `/v1/calls/${fresh}`);
    assert.equal(record.status, 200, JSON.stringify(record.body));
  });

});

describe("call shards: capacity is exact across shards", () => {
  let cluster;
  let edge;
  before(async () => {
    cluster = await fourShards({ M1: { max_calls: 2 } });
    edge = cluster.edge;
  });
  after(() => cluster?.dispose());

  test("a node of max_calls 2 gets two calls over four shards, and a third only after a hangup", async () => {
    // One new call on each shard: leases from global cap what each may give M1.
    const sessions = [0, 1, 2, 3].map((k) => sessionOn(k, 4, "cap"));
    const answers = [];
    for (const session of sessions) answers.push(await webhook(edge, initiated(session)));
    const delivered = answers.filter((a) => a.status === 200 && a.body.delivered_to === "M1");
    assert.equal(delivered.length, 2, JSON.stringify(answers.map((a) => [a.status, a.body])));
    for (const a of answers.filter((a) => a.status !== 200)) {
      assert.deepEqual([a.status, a.body.error], [503, "no_eligible_node"], JSON.stringify(a.body));
    }
    // Carrier retries while the node is full: still never a third call.
    const parked = sessions.filter((_, i) => answers[i].status !== 200);
    for (const session of parked) {
      const again = await webhook(edge, initiated(session));
      assert.notEqual(again.status, 200, JSON.stringify(again.body));
    }
    // The call held by a shard other than global hangs up: global learns it
    // only when it asks that shard to report (its room reclaimed), and one
    // parked call, on whichever shard asks first, then gets M1.
    const ended = sessions.find((s, i) => answers[i].status === 200 && home(s, 4) !== 0);
    assert.ok(ended, "a call held outside global");
    const hangup = await webhook(edge, callEvent("call.hangup", { session: ended, leg: `leg-${ended}` }));
    assert.equal(hangup.status, 200, JSON.stringify(hangup.body));
    const owners = async () => {
      const records = await Promise.all(parked.map((id) => admin(edge, `/v1/calls/${id}`)));
      return records.map((r) => r.body?.owner ?? null);
    };
    const placed = await waitFor(
      async () => {
        const now = await owners();
        return now.includes("M1") ? now : null;
      },
      { timeout: 15000, interval: 200, what: "a parked call assigned once room is back" },
    );
    // Exactly one: M1 is at its limit again.
    assert.deepEqual(placed.filter((o) => o === "M1").length, 1, JSON.stringify(placed));
  });
});

describe("call shards: one shard unreachable", () => {
  let cluster;
  let edge;
  before(async () => {
    // The testing build's switch: the object of calls-2 fails every request.
    cluster = await setupCluster({ nodes: ["M1"], shards: 4, bindings: { CALLFENCE_TEST_UNREACHABLE_SHARD: "2" } });
    edge = cluster.edge;
    const beat = await heartbeat(edge, cluster.nodes.M1, { capacity: { max_calls: 100, active_calls: 0 } });
    assert.equal(beat.status, 200, JSON.stringify(beat.body));
  });
  after(() => cluster?.dispose());

  test("its sessions fail closed with 503, the other shards serve theirs, and the reads that span shards name it", async () => {
    const down = await webhook(edge, initiated(sessionOn(2, 4, "down")));
    assert.deepEqual([down.status, down.body.error], [503, "dispatcher_unavailable"], JSON.stringify(down.body));
    const up = [0, 1, 3].map((k) => sessionOn(k, 4, "up"));
    for (const session of up) {
      const got = await webhook(edge, initiated(session));
      assert.deepEqual([got.status, got.body.delivered_to], [200, "M1"], `${session}: ${JSON.stringify(got.body)}`);
    }
    const status = await admin(edge, "/v1/status");
    assert.equal(status.status, 200, JSON.stringify(status.body));
    assert.deepEqual(status.body.shards_unreachable, [2]);
    assert.equal(status.body.counts.open_calls, up.length, JSON.stringify(status.body.counts));
    const decisions = await admin(edge, "/v1/decisions");
    assert.equal(decisions.status, 200, JSON.stringify(decisions.body));
    assert.deepEqual(decisions.body.shards_unreachable, [2]);
    const decided = new Set(decisions.body.decisions.map((d) => d.call_session_id));
    for (const session of up) assert.ok(decided.has(session), `no decision of ${session}`);
    // A scrape fails rather than sum without the shard's counters (which
    // would read as a counter reset).
    const scrape = await edge.fetch("/v1/metrics", { headers: { authorization: `Bearer ${edge.keys.metricsToken}` } });
    await scrape.text();
    assert.equal(scrape.status, 503);
  });
});
