// GET /v1/metrics (SPEC §17) through the real Worker and its SQLite
// Dispatcher: who may read it, the exposition's format (a strict parser
// below), exact deltas after a scripted story, privacy of the labels, and
// that a scrape writes nothing.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { bearer, E2E_SHARDS, ed25519, read, token } from "./harness.mjs";
import { admin, callEvent, fence, heartbeat, heartbeatBody, nodePost, setupCluster, waitFor, webhook } from "./fixtures.mjs";

const SALES = "+15550001111"; // the line `sales`: prefers M1, falls back to M2
const CALLER = "+14155550123";
const FAMILIES = [
  "callfence_webhooks_total",
  "callfence_decisions_total",
  "callfence_forward_failures_total",
  "callfence_fence_requests_total",
  "callfence_claims_refused_total",
  "callfence_storage_full_total",
  "callfence_heartbeats_total",
  "callfence_heartbeat_seq_regressions_total",
  "callfence_node_eligible",
  "callfence_node_ineligible_reason",
  "callfence_node_heartbeat_age_seconds",
  "callfence_node_open_calls",
  "callfence_node_max_calls",
  "callfence_line_fallback_in_use",
  "callfence_line_route",
  "callfence_pending_events",
  "callfence_open_calls",
  "callfence_policy_revision",
  "callfence_nodes_revision",
  "callfence_shard_map_revision",
];

const NAME = "[a-zA-Z_:][a-zA-Z0-9_:]*";
const HELP = new RegExp(`^# HELP (${NAME}) (.*)$`);
const TYPE = new RegExp(`^# TYPE (${NAME}) (counter|gauge|histogram|summary|untyped)$`);
const SAMPLE = new RegExp(`^(${NAME})(?:\\{(.*)\\})? (\\S+)$`);
const LABEL = /^([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"(,|$)/;

/**
 * Parses a text exposition (0.0.4) strictly: every line is a HELP, a TYPE
 * or a sample; each family has one HELP and one TYPE before its samples,
 * which are contiguous; labels are well formed and no series repeats;
 * every value is a number. Returns { families: Map(name -> {help, type}),
 * samples: Map("name{a="x",b="y"}" (labels sorted) -> value) }.
 */
function parseExposition(text) {
  assert.ok(text.endsWith("\n"), "the exposition ends with a newline");
  const families = new Map();
  const samples = new Map();
  const closed = new Set();
  let current = null;
  for (const line of text.slice(0, -1).split("\n")) {
    let m;
    if ((m = HELP.exec(line))) {
      assert.ok(!families.get(m[1])?.help, `a second HELP for ${m[1]}`);
      families.set(m[1], { ...families.get(m[1]), help: m[2] });
      continue;
    }
    if ((m = TYPE.exec(line))) {
      assert.ok(!families.get(m[1])?.type, `a second TYPE for ${m[1]}`);
      assert.ok(!closed.has(m[1]) && current !== m[1], `TYPE after the samples of ${m[1]}`);
      families.set(m[1], { ...families.get(m[1]), type: m[2] });
      continue;
    }
    m = SAMPLE.exec(line);
    assert.ok(m, `not a HELP, TYPE or sample line: ${JSON.stringify(line)}`);
    const [, name, labelText = "", valueText] = m;
    const family = families.get(name);
    assert.ok(family?.help !== undefined && family?.type, `sample of ${name} without HELP and TYPE before it`);
    if (current !== name) {
      assert.ok(!closed.has(name), `samples of ${name} are not contiguous`);
      if (current) closed.add(current);
      current = name;
    }
    const labels = [];
    let rest = labelText;
    while (rest.length > 0) {
      const l = LABEL.exec(rest);
      assert.ok(l, `bad labels in ${line}`);
      labels.push([l[1], l[2]]);
      rest = rest.slice(l[0].length);
    }
    assert.equal(new Set(labels.map(([k]) => k)).size, labels.length, `a label repeats in ${line}`);
    const value = ["NaN", "+Inf", "-Inf"].includes(valueText) ? valueText : Number(valueText);
    assert.ok(typeof value === "string" || Number.isFinite(value), `value of ${line}`);
    const key = seriesKey(name, Object.fromEntries(labels));
    assert.ok(!samples.has(key), `series ${key} twice`);
    samples.set(key, value);
  }
  return { families, samples };
}

function seriesKey(name, labels = {}) {
  const parts = Object.keys(labels)
    .sort()
    .map((k) => `${k}="${labels[k]}"`);
  return parts.length ? `${name}{${parts.join(",")}}` : name;
}

/** GET /v1/metrics with `tokenValue` -> {status, headers, text}. */
async function getMetrics(edge, tokenValue) {
  const headers = tokenValue ? bearer(tokenValue) : {};
  const res = await edge.fetch("/v1/metrics", { headers });
  return { status: res.status, headers: res.headers, text: await res.text() };
}

/** A scrape with the metrics token, parsed; `value(name, labels)` is 0 for an absent series. */
async function scrape(edge) {
  const res = await getMetrics(edge, edge.keys.metricsToken);
  assert.equal(res.status, 200, res.text);
  const parsed = parseExposition(res.text);
  return {
    ...parsed,
    text: res.text,
    has: (name, labels) => parsed.samples.has(seriesKey(name, labels)),
    value: (name, labels) => parsed.samples.get(seriesKey(name, labels)) ?? 0,
  };
}

/** The changes of the given series between two scrapes. */
function delta(a, b, series) {
  return Object.fromEntries(series.map(([name, labels]) => [seriesKey(name, labels), b.value(name, labels) - a.value(name, labels)]));
}

async function metricsCluster() {
  const policy = {
    schema: "riff_node_routing_policy_v1",
    default_node: "M1",
    by_line: { sales: { called_number: SALES, preferred_node: "M1", fallback_node: "M2" } },
    by_caller: {},
  };
  return setupCluster({ policy });
}

let calls = 0;
/** A new inbound call to the sales line -> {event, res}. */
async function newCall(edge, extra = {}) {
  calls += 1;
  const event = callEvent("call.initiated", { session: `metrics-s${calls}-${Date.now()}`, leg: `v3:metrics-l${calls}-${Date.now()}`, from: CALLER, to: SALES, ...extra });
  return { event, res: await webhook(edge, event) };
}

describe("GET /v1/metrics: access and format", () => {
  let cluster;
  before(async () => {
    cluster = await metricsCluster();
  });
  after(() => cluster?.dispose());

  test("no token 401, a policy token 403, a metrics token elsewhere 403, metrics and admin tokens 200", async () => {
    const { edge } = cluster;
    const none = await getMetrics(edge);
    assert.deepEqual([none.status, JSON.parse(none.text)], [401, { error: "unauthorized" }]);
    const wrong = await getMetrics(edge, token());
    assert.deepEqual([wrong.status, JSON.parse(wrong.text)], [401, { error: "unauthorized" }]);
    const policy = await getMetrics(edge, edge.keys.policyToken);
    assert.deepEqual([policy.status, JSON.parse(policy.text)], [403, { error: "forbidden" }]);
    for (const path of ["/v1/nodes", "/v1/status", "/v1/policy", "/v1/health", "/v1/decisions"]) {
      const res = await read(await edge.fetch(path, { headers: bearer(edge.keys.metricsToken) }));
      assert.deepEqual([res.status, res.body], [403, { error: "forbidden" }], path);
    }
    for (const tokenValue of [edge.keys.metricsToken, edge.keys.adminToken]) {
      const res = await getMetrics(edge, tokenValue);
      assert.equal(res.status, 200, res.text);
      assert.match(res.headers.get("content-type"), /^text\/plain; version=0\.0\.4/);
      parseExposition(res.text);
    }
    const post = await read(await edge.fetch("/v1/metrics", { method: "POST", headers: bearer(edge.keys.adminToken) }));
    assert.equal(post.status, 405);
  });

  test("every family of the contract, with HELP and TYPE, and the fixed label sets from the first scrape", async () => {
    const m = await scrape(cluster.edge);
    assert.deepEqual([...m.families.keys()], FAMILIES);
    for (const [name, family] of m.families) {
      assert.ok(family.help.length > 10, `HELP of ${name}`);
      assert.equal(family.type, name.endsWith("_total") ? "counter" : "gauge", name);
    }
    for (const outcome of ["delivered", "delivered_error", "duplicate", "in_progress", "pending", "delivery_unknown", "reassigned", "rejected", "unroutable", "ignored", "refused"]) {
      assert.ok(m.has("callfence_webhooks_total", { outcome }), outcome);
    }
    for (const result of ["granted", "regranted", "stale_epoch", "not_owner", "call_ended", "unknown_call"]) {
      assert.ok(m.has("callfence_fence_requests_total", { result }), result);
    }
    assert.equal(m.value("callfence_policy_revision"), 1);
    assert.equal(m.value("callfence_nodes_revision"), 1);
    assert.equal(m.value("callfence_shard_map_revision"), E2E_SHARDS > 1 ? 1 : 0);
    assert.ok(m.has("callfence_pending_events", { shard: "0" }));
    assert.ok(m.has("callfence_open_calls", { shard: "0" }));
    for (const node of ["M1", "M2"]) {
      assert.equal(m.value("callfence_node_eligible", { node }), 1, node);
      assert.equal(m.value("callfence_node_max_calls", { node }), 10, node);
      assert.ok(m.value("callfence_node_heartbeat_age_seconds", { node }) >= 0, node);
    }
    assert.equal(m.value("callfence_line_fallback_in_use", { line: "sales" }), 0);
    assert.equal(m.value("callfence_line_route", { line: "sales", preferred: "M1", target: "M1" }), 1);
  });
});

describe("GET /v1/metrics: exact deltas after a story", () => {
  let cluster;
  before(async () => {
    cluster = await metricsCluster();
  });
  after(() => cluster?.dispose());

  test("a delivered call, its duplicate, and its fence requests", async () => {
    const { edge, nodes } = cluster;
    const series = [
      ["callfence_webhooks_total", { outcome: "delivered" }],
      ["callfence_webhooks_total", { outcome: "duplicate" }],
      ["callfence_decisions_total", { rule: "line", outcome: "assigned" }],
      ["callfence_fence_requests_total", { result: "granted" }],
      ["callfence_fence_requests_total", { result: "regranted" }],
      ["callfence_fence_requests_total", { result: "not_owner" }],
      ["callfence_fence_requests_total", { result: "stale_epoch" }],
      ["callfence_fence_requests_total", { result: "unknown_call" }],
      ["callfence_node_open_calls", { node: "M1" }],
    ];
    // Each shard's own gauge: the call is open in the one that holds it.
    const open = (m) => Array.from({ length: E2E_SHARDS }, (_, k) => m.value("callfence_open_calls", { shard: String(k) })).reduce((x, y) => x + y, 0);
    const a = await scrape(edge);
    const { event, res } = await newCall(edge);
    assert.equal(res.status, 200, JSON.stringify(res.body));
    assert.equal(res.body.delivered_to, "M1");
    assert.equal((await webhook(edge, event)).status, 200, "the duplicate");
    const call = { call_session_id: event.data.payload.call_session_id, call_control_id: event.data.payload.call_control_id, epoch: res.body.epoch };
    assert.equal((await fence(edge, nodes.M1, call)).status, 200);
    assert.equal((await fence(edge, nodes.M1, call)).status, 200);
    assert.equal((await fence(edge, nodes.M2, call)).body.reason, "not_owner");
    assert.equal((await fence(edge, nodes.M1, { ...call, epoch: call.epoch + 7 })).body.reason, "stale_epoch");
    assert.equal((await fence(edge, nodes.M1, { ...call, call_session_id: "metrics-nobody" })).body.reason, "unknown_call");
    const b = await scrape(edge);
    assert.deepEqual(delta(a, b, series), {
      'callfence_webhooks_total{outcome="delivered"}': 1,
      'callfence_webhooks_total{outcome="duplicate"}': 1,
      'callfence_decisions_total{outcome="assigned",rule="line"}': 1,
      'callfence_fence_requests_total{result="granted"}': 1,
      'callfence_fence_requests_total{result="regranted"}': 1,
      'callfence_fence_requests_total{result="not_owner"}': 1,
      'callfence_fence_requests_total{result="stale_epoch"}': 1,
      'callfence_fence_requests_total{result="unknown_call"}': 1,
      'callfence_node_open_calls{node="M1"}': 1,
    });
    assert.equal(open(b) - open(a), 1);
  });

  test("a webhook with a bad signature is counted refused, through the isolate's batch", async () => {
    const { edge } = cluster;
    const a = await scrape(edge);
    const forged = await webhook(edge, callEvent("call.initiated", { session: "metrics-forged", to: SALES }), { privateKey: ed25519().privateKeyObject });
    assert.deepEqual([forged.status, forged.body.error], [401, "bad_signature"]);
    const b = await scrape(edge);
    assert.equal(b.value("callfence_webhooks_total", { outcome: "refused" }) - a.value("callfence_webhooks_total", { outcome: "refused" }), 1);
    // Nothing else moved: the refusal never reached the Dispatcher.
    const c = await scrape(edge);
    assert.equal(c.value("callfence_webhooks_total", { outcome: "refused" }), b.value("callfence_webhooks_total", { outcome: "refused" }));
  });

  test("an isolate reports its refusals itself, on its first request a second after its last report", async () => {
    const { edge } = cluster;
    // Asked straight from the Dispatcher, so no scrape carries the isolate's count.
    const refusedAtDispatcher = async () => {
      const stub = await edge.dispatcher();
      const res = await stub.fetch("https://dispatcher/metrics", { method: "POST", body: '{"v":2,"op":"metrics","refused":0}\n' });
      const body = await res.json();
      assert.equal(body.ok, true, JSON.stringify(body));
      return body.samples.find((s) => s.name === "callfence_webhooks_total" && s.labels.outcome === "refused").value;
    };
    // Miniflare's first stub of a Durable Object gives the Worker a fresh
    // isolate (its report clock starts afresh, as seen here): take it first.
    await refusedAtDispatcher();
    await scrape(edge); // reports whatever was pending: the interval starts now
    const before = await refusedAtDispatcher();
    const forged = await webhook(edge, callEvent("call.initiated", { session: "metrics-forged-2", to: SALES }), { privateKey: ed25519().privateKeyObject });
    assert.equal(forged.status, 401);
    assert.equal(await refusedAtDispatcher(), before, "within the second, the count waits in the isolate");
    await new Promise((r) => setTimeout(r, 1100));
    assert.equal((await read(await edge.fetch("/healthz"))).status, 200);
    await waitFor(async () => (await refusedAtDispatcher()) === before + 1, { what: "the isolate's batch" });
  });

  test("a node drained by its own beat: eligible 0 with reason mode_drained, then back", async () => {
    const { edge, nodes } = cluster;
    const drained = await heartbeat(edge, nodes.M2, { mode: "drained" });
    assert.equal(drained.status, 200, JSON.stringify(drained.body));
    let m = await scrape(edge);
    assert.equal(m.value("callfence_node_eligible", { node: "M2" }), 0);
    assert.equal(m.value("callfence_node_ineligible_reason", { node: "M2", reason: "mode_drained" }), 1);
    assert.equal(m.value("callfence_node_eligible", { node: "M1" }), 1);
    assert.ok(!m.has("callfence_node_ineligible_reason", { node: "M1", reason: "mode_drained" }));
    assert.ok((await heartbeat(edge, nodes.M2)).status === 200);
    m = await scrape(edge);
    assert.equal(m.value("callfence_node_eligible", { node: "M2" }), 1);
    assert.ok(!m.has("callfence_node_ineligible_reason", { node: "M2", reason: "mode_drained" }));
  });

  test("a beat whose seq went backwards: a seq regression and a refused beat against the node", async () => {
    const { edge, nodes } = cluster;
    const series = [
      ["callfence_heartbeat_seq_regressions_total", { node: "M2" }],
      ["callfence_heartbeats_total", { node: "M2", result: "stale_seq" }],
      ["callfence_heartbeats_total", { node: "M2", result: "accepted" }],
    ];
    const a = await scrape(edge);
    assert.equal((await heartbeat(edge, nodes.M2)).status, 200);
    const old = heartbeatBody(edge, nodes.M2, { seq: 1000 });
    const res = await nodePost(edge, nodes.M2, "/v1/nodes/heartbeat", old);
    assert.deepEqual([res.status, res.body.error], [409, "stale_seq"]);
    const b = await scrape(edge);
    assert.deepEqual(Object.values(delta(a, b, series)), [1, 1, 1]);
  });

  test("claims refused under a limit are counted per node and reason", async () => {
    const { edge, nodes } = cluster;
    const a = await scrape(edge);
    const answers = await Promise.all(
      Array.from({ length: 16 }, (_, i) =>
        nodePost(edge, nodes.M2, "/v1/claims", { call_control_id: `v3:metrics-claim-${i}`, call_session_id: `metrics-claim-${i}` }),
      ),
    );
    const codes = { capacity_exhausted: 0, rate_limited: 0 };
    for (const res of answers) if (res.body?.error in codes) codes[res.body.error] += 1;
    assert.ok(codes.capacity_exhausted + codes.rate_limited > 0, JSON.stringify(answers.map((r) => r.status)));
    const b = await scrape(edge);
    const d = delta(a, b, [
      ["callfence_claims_refused_total", { node: "M2", reason: "capacity" }],
      ["callfence_claims_refused_total", { node: "M2", reason: "rate" }],
    ]);
    assert.deepEqual(Object.values(d), [codes.capacity_exhausted, codes.rate_limited]);
  });

  test("labels carry no number, call or event id, or token", async () => {
    const { edge, nodes } = cluster;
    const { event } = await newCall(edge);
    const m = await scrape(edge);
    const secrets = [
      SALES,
      CALLER,
      SALES.slice(1),
      CALLER.slice(1),
      event.data.id,
      event.data.payload.call_session_id,
      event.data.payload.call_control_id,
      edge.keys.adminToken,
      edge.keys.policyToken,
      edge.keys.metricsToken,
      nodes.M1.key.publicKey,
      nodes.M1.origin.url,
      "metrics-s",
      "metrics-claim",
      "metrics-forged",
    ];
    for (const secret of secrets) assert.ok(!m.text.includes(secret), `the exposition holds ${secret}`);
    for (const key of m.samples.keys()) {
      for (const [, value] of key.matchAll(/="([^"]*)"/g)) assert.match(value, /^[A-Za-z0-9_-]{1,64}$/, key);
    }
  });
});

describe("GET /v1/metrics: forward failures and pending events", () => {
  let cluster;
  before(async () => {
    cluster = await metricsCluster();
  });
  after(() => cluster?.dispose());

  test("an unknown outcome counts a forward failure and delivery_unknown, and the line falls back", async () => {
    const { edge, nodes } = cluster;
    const series = [
      ["callfence_forward_failures_total", { node: "M1", class: "unknown" }],
      ["callfence_webhooks_total", { outcome: "delivery_unknown" }],
    ];
    const a = await scrape(edge);
    assert.equal(a.value("callfence_line_fallback_in_use", { line: "sales" }), 0);
    nodes.M1.origin.respond = () => ({ status: 500, body: "oops" });
    const { res } = await newCall(edge);
    assert.deepEqual([res.status, res.body.error], [503, "delivery_unknown"]);
    const b = await scrape(edge);
    assert.deepEqual(Object.values(delta(a, b, series)), [1, 1]);
    assert.equal(b.value("callfence_node_ineligible_reason", { node: "M1", reason: "recent_forward_failure" }), 1);
    assert.equal(b.value("callfence_line_fallback_in_use", { line: "sales" }), 1);
    assert.equal(b.value("callfence_line_route", { line: "sales", preferred: "M1", target: "M2" }), 1);
  });

  test("the alarm's re-drive that delivers the event counts one delivered", async () => {
    const { edge, nodes } = cluster;
    const a = await scrape(edge);
    nodes.M1.origin.respond = () => ({ status: 200, body: { ok: true } });
    // The unknown event is re-driven to M1 once its lease lapses (SPEC §7.7).
    const b = await waitFor(
      async () => {
        const m = await scrape(edge);
        return m.value("callfence_webhooks_total", { outcome: "delivered" }) > a.value("callfence_webhooks_total", { outcome: "delivered" }) && m;
      },
      { timeout: 8000, interval: 200, what: "the alarm's delivery" },
    );
    const series = [
      ["callfence_webhooks_total", { outcome: "delivered" }],
      ["callfence_webhooks_total", { outcome: "delivery_unknown" }],
      ["callfence_forward_failures_total", { node: "M1", class: "unknown" }],
    ];
    assert.deepEqual(Object.values(delta(a, b, series)), [1, 0, 0]);
    assert.equal(b.value("callfence_node_eligible", { node: "M1" }), 1, "a delivery clears the failure");
  });

  test("not_admitted moves the call: a not_admitted failure, a reassigned decision, and the new owner delivers", async () => {
    const { edge, nodes } = cluster;
    nodes.M1.origin.respond = () => ({ status: 503, body: { callfence: "not_admitted" } });
    const series = [
      ["callfence_forward_failures_total", { node: "M1", class: "not_admitted" }],
      ["callfence_decisions_total", { rule: "line", outcome: "reassigned" }],
      ["callfence_webhooks_total", { outcome: "delivered" }],
    ];
    const a = await scrape(edge);
    const { res } = await newCall(edge);
    assert.deepEqual([res.status, res.body.delivered_to], [200, "M2"], JSON.stringify(res.body));
    const b = await scrape(edge);
    assert.deepEqual(Object.values(delta(a, b, series)), [1, 1, 1]);
  });

  test("no eligible node: the webhook is pending and the event is counted parked", async () => {
    const { edge, nodes } = cluster;
    assert.equal((await heartbeat(edge, nodes.M2, { mode: "drained" })).status, 200);
    const series = [
      ["callfence_webhooks_total", { outcome: "pending" }],
      ["callfence_decisions_total", { rule: "line", outcome: "pending" }],
    ];
    // Pending events summed over the shards (one per shard under the matrix).
    const pending = (m) => Array.from({ length: E2E_SHARDS }, (_, k) => m.value("callfence_pending_events", { shard: String(k) })).reduce((x, y) => x + y, 0);
    const a = await scrape(edge);
    assert.equal(pending(a), 0);
    const { res } = await newCall(edge);
    assert.deepEqual([res.status, res.body.error], [503, "no_eligible_node"]);
    const b = await scrape(edge);
    assert.deepEqual(Object.values(delta(a, b, series)), [1, 1]);
    assert.equal(pending(b), 1);
    assert.equal(b.value("callfence_line_fallback_in_use", { line: "sales" }), 1);
  });
});

describe("GET /v1/metrics: a scrape writes nothing", () => {
  let cluster;
  before(async () => {
    cluster = await metricsCluster();
  });
  after(() => cluster?.dispose());

  /** SHA-256 of every byte of the Durable Object's SQLite database and WAL. */
  function storedState(dir) {
    const hash = createHash("sha256");
    const walk = (d) => {
      for (const entry of readdirSync(d, { withFileTypes: true }).sort((x, y) => x.name.localeCompare(y.name))) {
        const path = join(d, entry.name);
        if (entry.isDirectory()) walk(path);
        else if (/\.sqlite(-wal)?$/.test(entry.name)) hash.update(path).update(readFileSync(path));
      }
    };
    walk(dir);
    return hash.digest("hex");
  }

  test("the stored bytes are the same before and after scrapes", async () => {
    const { edge } = cluster;
    const { res } = await newCall(edge);
    assert.equal(res.status, 200);
    const status = await admin(edge, "/v1/status");
    assert.equal(status.status, 200);
    await waitFor(async () => {
      const s1 = storedState(edge.dir);
      await new Promise((r) => setTimeout(r, 200));
      return s1 === storedState(edge.dir);
    }, { what: "quiet storage" });
    const before = storedState(edge.dir);
    for (let i = 0; i < 3; i += 1) await scrape(edge);
    assert.equal(storedState(edge.dir), before);
    assert.notEqual(before, createHash("sha256").digest("hex"), "the database files were found");
  });
});
