// The drills' call load: new calls at a rate, a share of duplicate
// deliveries, Telnyx's retry after 2 s of anything but a settled answer, and
// a hangup after a short hold. Every webhook sent is recorded with its answer.

import { request } from "node:http";
import { readPages, telnyxHeaders } from "../e2e/harness.mjs";
import { event, LINE, PLAIN_CALLER, sleep } from "../e2e/agents-cluster.mjs";

/** A seeded PRNG (mulberry32): returns () => [0, 1). */
export function prng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const RETRY_MS = 2_000;
// Answers after which Telnyx would not retry: 200, and refusals that a retry cannot change.
const settled = (status) => status !== 0 && status !== 503 && status < 500;

/**
 * POSTs `body` on a connection of its own, closed when answered or after
 * `timeout` ms: a load that outruns a slow or killed edge then leaves no
 * half-closed sockets behind (fetch's pool kept thousands in CLOSE-WAIT
 * across workerd kills until the process ran out of descriptors).
 * Resolves { status, text }; rejects on a network error or the timeout.
 */
function post(url, headers, body, timeout) {
  return new Promise((resolve, reject) => {
    const req = request(url, { method: "POST", headers: { ...headers, "content-length": Buffer.byteLength(body) }, agent: false, timeout }, (res) => {
      const chunks = [];
      res.on("data", (c) => chunks.push(c));
      res.on("end", () => resolve({ status: res.statusCode, text: Buffer.concat(chunks).toString("utf8") }));
      res.on("error", reject);
    });
    req.on("timeout", () => req.destroy(Object.assign(new Error("timeout"), { code: "TIMEOUT" })));
    req.on("error", reject);
    req.end(body);
  });
}

/**
 * Runs a load against `stack` until `calls` calls have started, and on
 * while `more()` holds.
 * opts: { calls, rate (calls/s), seed, duplicates (share), holdMs: [min, max],
 *   retries, caller(i) => number, tag, more() => bool, onCall({ session, ccid }) as each call starts }
 * Returns { acks, ccids, sessions, sent } (see checker.mjs for acks).
 */
export async function runLoad(stack, opts) {
  const rand = prng(opts.seed ?? 1);
  const acks = [];
  const ccids = {};
  const sessions = [];
  const { cluster } = stack;
  const tag = opts.tag ?? "drill";

  async function send(call, type, id, body) {
    for (let attempt = 1; ; attempt += 1) {
      const at = Date.now();
      const headers = telnyxHeaders(body, cluster.keys.telnyx.privateKeyObject);
      let status = 0;
      let answer = null;
      try {
        const res = await post(new URL("/v1/telnyx/webhook", cluster.edge.url), headers, body, 10_000);
        status = res.status;
        try {
          answer = JSON.parse(res.text);
        } catch {
          answer = res.text;
        }
      } catch (e) {
        answer = { error: `network: ${e.code ?? e.name}` };
      }
      acks.push({ session: call.session, ccid: call.ccid, event_id: id, type, status, body: answer, at, attempt });
      if (settled(status) || attempt > (opts.retries ?? 6)) return status;
      await sleep(RETRY_MS);
    }
  }

  async function oneCall(i) {
    const n = `${tag}-${opts.seed ?? 1}-${i}-${Date.now()}`;
    const call = { session: `sess-${n}`, ccid: `ccid-${n}` };
    ccids[call.ccid] = call.session;
    sessions.push(call.session);
    opts.onCall?.(call);
    const from = opts.caller ? opts.caller(i, rand) : PLAIN_CALLER;
    const init = event({ id: `ev-init-${n}`, type: "call.initiated", session: call.session, ccid: call.ccid, from, to: LINE.number });
    const first = send(call, "call.initiated", `ev-init-${n}`, init);
    const dups = rand() < (opts.duplicates ?? 0.1) ? [sleep(rand() * 300).then(() => send(call, "call.initiated", `ev-init-${n}`, init))] : [];
    await Promise.all([first, ...dups]);
    const [lo, hi] = opts.holdMs ?? [200, 1500];
    await sleep(lo + rand() * (hi - lo));
    const hang = event({ id: `ev-hangup-${n}`, type: "call.hangup", session: call.session, ccid: call.ccid, from, to: LINE.number });
    await send(call, "call.hangup", `ev-hangup-${n}`, hang);
  }

  const running = new Set();
  const started = Date.now();
  for (let i = 0; i < opts.calls || opts.more?.(); i += 1) {
    const due = started + (i * 1000) / opts.rate;
    if (due > Date.now()) await sleep(due - Date.now());
    const p = oneCall(i).finally(() => running.delete(p));
    running.add(p);
  }
  await Promise.all(running);
  return { acks, ccids, sessions };
}

/**
 * Reads the edge's views of `sessions` through the paged admin reads: every
 * call (`GET /v1/calls`, the `GET /v1/calls/{id}` shape) and, unless
 * `withDecisions` is false, every decision (`GET /v1/decisions?after=`).
 * A release without the paged reads (the rollback drill's previous one
 * answers 404) is read call by call instead. `twice` lists the sessions
 * the paged read listed more than once.
 */
export async function collect(stack, sessions, { withDecisions = true } = {}) {
  const want = new Set(sessions);
  const { edge, keys } = stack.cluster;
  const calls = {};
  let paged;
  try {
    paged = await readPages(edge, keys.adminToken, "/v1/calls", "calls");
  } catch (e) {
    if (e.status !== 404) throw e;
    return collectOneByOne(stack, sessions, withDecisions);
  }
  // A session listed twice is held by two call shards (SPEC §16: one holder each).
  const twice = [];
  for (const call of paged) {
    if (!want.has(call.call_session_id)) continue;
    if (calls[call.call_session_id]) twice.push(call.call_session_id);
    calls[call.call_session_id] = call;
  }
  const decisions = withDecisions
    ? (await readPages(edge, keys.adminToken, "/v1/decisions", "decisions", { after: 0, limit: 500 })).filter((d) => want.has(d.call_session_id))
    : [];
  return { calls, decisions, twice };
}

/** `collect` with `GET /v1/calls/{id}` and `/v1/decisions?call_session_id=` per call, 6 at a time. */
async function collectOneByOne(stack, sessions, withDecisions) {
  const calls = {};
  const decisions = [];
  const queue = [...sessions];
  async function worker() {
    while (queue.length) {
      const s = queue.shift();
      const view = await stack.cluster.call(s);
      if (view.status === 200) calls[s] = view.body;
      if (withDecisions) decisions.push(...(await stack.cluster.decisions(s)));
    }
  }
  await Promise.all(Array.from({ length: 6 }, worker));
  return { calls, decisions, twice: [] };
}
