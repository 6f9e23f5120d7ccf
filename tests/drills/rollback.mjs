// The rollback drill: the previous release of the Worker and the current one
// take turns on the SAME Dispatcher storage (workerd restarted on the same
// persisted directory with the other build) while calls flow. It shows that
// migrations only add and that the protocol tolerates ±1 versions:
//
// - no call breaks (checker.mjs, callsIntact): at most one answer; every
//   call ends `ended`
//   (never `node_lost` or `max_duration`), its sends acknowledged 200; the
//   checker passes. A call whose fence was granted while workerd restarted
//   may go unanswered (the grant's reply is lost and the demo app asks
//   once): counted as `fenced_unanswered`, not a violation;
// - no decision is lost: every decision read at the end of a phase is read
//   again, unchanged, under both builds at the end;
// - both answer every route they know: after each swap, every operation its
//   own docs/openapi.yaml lists is asked of the live build (the table
//   below; a route missing from the table fails the drill), every node's
//   beats are accepted, and the phase's calls are answered through its fence.
//
// The previous release is the commit named in tests/drills/previous-release
// (or `--previous=<rev>`), built once by scripts/previous-release.sh into
// target/previous-release/<sha>/ with its own scripts/build.sh; the build is
// a preparation step, not part of the drill's time.

import { spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { LINE, PLAIN_CALLER, sleep, standardPolicy } from "../e2e/agents-cluster.mjs";
import { nodeHeaders, read, ROOT, telnyxHeaders, TESTING_BUILD } from "../e2e/harness.mjs";
import { callsIntact, check, unavailability } from "./checker.mjs";
import { collect, runLoad } from "./load.mjs";
import { stable, startStack, TIMINGS } from "./stack.mjs";
// drills.mjs imports this module too; `settle` is only called at run time.
import { settle } from "./drills.mjs";

/**
 * The previous release's build directory, built first when missing
 * (scripts/previous-release.sh); { rev, sha, build, root, built_seconds }.
 */
export function previousRelease(rev) {
  const args = rev ? [rev] : [];
  const r = spawnSync("bash", [join(ROOT, "scripts/previous-release.sh"), ...args], { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] });
  if (r.status !== 0) throw new Error(`scripts/previous-release.sh ${args.join(" ")} failed (status ${r.status})`);
  const build = r.stdout.trim().split("\n").pop();
  const root = join(build, "..");
  const [sha, seconds] = readFileSync(join(root, "..", "built"), "utf8").trim().split(" ");
  return { rev: rev ?? readFileSync(join(ROOT, "tests/drills/previous-release"), "utf8").trim(), sha, build, root, built_seconds: Number(seconds) };
}

/** The operations (`METHOD /path`) an openapi.yaml lists, in its order. */
export function operationsOf(openapiText) {
  const ops = [];
  let path = null;
  for (const line of openapiText.split("\n")) {
    const p = line.match(/^ {2}(\/\S*):\s*$/);
    if (p) path = p[1];
    const m = line.match(/^ {4}(get|put|post|delete|patch):\s*$/);
    if (m && path) ops.push(`${m[1].toUpperCase()} ${path}`);
    if (/^\S/.test(line) && !line.startsWith("paths:")) path = null;
  }
  return ops;
}

/**
 * One request per operation, made so it changes no call: reads, writes of
 * the same document, refusals of a malformed body (a build that did not know
 * the route would answer 404). Each returns { status, expect: [statuses] }.
 */
export function routeTable(stack, session) {
  const { cluster } = stack;
  const { keys } = cluster;
  const admin = { authorization: `Bearer ${keys.adminToken}` };
  // No sweep request may hang the drill: each gives up after 15 s (a failed route).
  const edgeFetch = (path, init = {}) => cluster.edge.fetch(path, { signal: AbortSignal.timeout(15_000), ...init });
  const get = async (path, headers = admin) => (await read(await edgeFetch(path, { headers }))).status;
  const signed = async (node, path, body) => {
    const n = stack.nodes[node];
    const url = new URL(path, cluster.edge.url).toString();
    const headers = nodeHeaders({ url, body, node, kid: n.key.kid, privateKey: n.key.privateKeyObject });
    return (await read(await edgeFetch(path, { method: "POST", headers, body }))).status;
  };
  // Writes the drill's own document again (a new revision, the same content).
  const putSame = async (kind) => {
    const cur = await read(await edgeFetch(`/v1/${kind}`, { headers: admin }));
    const doc = {
      nodes: () => cluster.registry(),
      policy: () => standardPolicy(Object.keys(stack.nodes)),
      shards: () => ({ schema: "callfence_shards_v1", call_shards: cur.body.call_shards }),
    }[kind]();
    const res = await read(await edgeFetch(`/v1/${kind}`, {
      method: "PUT",
      headers: { ...admin, "content-type": "application/json", "if-match": `"${cur.body.revision}"` },
      body: JSON.stringify(doc),
    }));
    return res.status;
  };
  return {
    "POST /v1/telnyx/webhook": async () => {
      const body = JSON.stringify({ data: { event_type: "call.initiated" } });
      const res = await read(await edgeFetch("/v1/telnyx/webhook", { method: "POST", headers: telnyxHeaders(body, keys.telnyx.privateKeyObject), body }));
      return { status: res.status, expect: [400] };
    },
    "POST /v1/nodes/heartbeat": async () => {
      await stack.waitAllEligible(20_000);
      return { status: 200, expect: [200], note: "every agent's beat accepted, every node eligible" };
    },
    "POST /v1/nodes/probe": async () => ({ status: await signed("M2", "/v1/nodes/probe", JSON.stringify({ nonce: randomBytes(18).toString("base64url") })), expect: [200, 429] }),
    "POST /v1/fence": async () => ({ status: await signed("M2", "/v1/fence", "{}"), expect: [400] }),
    "POST /v1/claims": async () => ({ status: await signed("M2", "/v1/claims", "{}"), expect: [400] }),
    "POST /v1/media/verify": async () => ({ status: await signed("M2", "/v1/media/verify", JSON.stringify({ media_token: "v1.m1.bm90LWEtdG9rZW4.AAAA" })), expect: [400, 409] }),
    "GET /v1/policy": async () => ({ status: await get("/v1/policy"), expect: [200] }),
    "PUT /v1/policy": async () => ({ status: await putSame("policy"), expect: [200] }),
    "GET /v1/nodes": async () => ({ status: await get("/v1/nodes"), expect: [200] }),
    "PUT /v1/nodes": async () => ({ status: await putSame("nodes"), expect: [200] }),
    "GET /v1/shards": async () => ({ status: await get("/v1/shards"), expect: [200] }),
    "PUT /v1/shards": async () => ({ status: await putSame("shards"), expect: [200] }),
    "POST /v1/routing/preview": async () => {
      const res = await read(await edgeFetch("/v1/routing/preview", { method: "POST", headers: { ...admin, "content-type": "application/json" }, body: JSON.stringify({ to: LINE.number, from: PLAIN_CALLER }) }));
      return { status: res.status, expect: [200] };
    },
    "GET /v1/status": async () => ({ status: await get("/v1/status"), expect: [200] }),
    "GET /v1/decisions": async () => ({ status: await get(`/v1/decisions?call_session_id=${encodeURIComponent(session())}`), expect: [200] }),
    "GET /v1/calls/{call_session_id}": async () => ({ status: await get(`/v1/calls/${encodeURIComponent(session())}`), expect: [200] }),
    "GET /v1/calls": async () => ({ status: await get("/v1/calls?limit=1"), expect: [200] }),
    "GET /v1/events": async () => ({ status: await get("/v1/events?limit=1"), expect: [200] }),
    "GET /v1/health": async () => ({ status: await get("/v1/health"), expect: [200] }),
    "GET /v1/metrics": async () => ({ status: await get("/v1/metrics"), expect: [200] }),
    "GET /v1/keys": async () => ({ status: await get("/v1/keys", {}), expect: [200] }),
    "GET /healthz": async () => ({ status: await get("/healthz", {}), expect: [200] }),
    "GET /": async () => ({ status: await get("/", {}), expect: [200] }),
  };
}

/** Asks the live build every operation it lists; returns [{ op, status, ok }]. */
export async function sweep(table, ops) {
  const out = [];
  for (const op of ops) {
    const ask = table[op];
    if (!ask) {
      out.push({ op, status: null, ok: false, why: "not in the rollback drill's route table" });
      continue;
    }
    try {
      const r = await ask();
      out.push({ op, status: r.status, ok: r.expect.includes(r.status) });
    } catch (e) {
      out.push({ op, status: null, ok: false, why: e.message });
    }
  }
  return out;
}

/**
 * Decisions by id, read for `sessions`, 2 at a time while the load runs; a
 * read that fails on the connection (workerd resets some under a loaded
 * machine) is asked again, up to 6 times, and counted in `retries.n`.
 */
async function decisionsOf(stack, sessions, retries) {
  const out = new Map();
  const queue = [...sessions];
  const once = async (s) => {
    for (let attempt = 1; ; attempt += 1) {
      try {
        return await stack.cluster.decisions(s);
      } catch (e) {
        if (attempt >= 6) throw e;
        retries.n += 1;
        await sleep(500 * attempt);
      }
    }
  };
  const worker = async () => {
    while (queue.length) for (const d of await once(queue.shift())) out.set(d.decision_id, d);
  };
  await Promise.all(Array.from({ length: 2 }, worker));
  return out;
}

/**
 * Checks the rollback properties on top of the checker's (and
 * callsIntact's): every earlier snapshot's decision is in each final read,
 * unchanged; both final reads agree; every route answered; every phase
 * answered calls. Pure, so the tests can plant violations.
 */
export function checkRollback({ snapshots, finals, sweeps, phases }) {
  const violations = [];
  const flag = (kind, session, evidence) => violations.push({ kind, session, evidence });
  for (const snap of snapshots) {
    for (const [id, d] of snap.decisions) {
      for (const f of finals) {
        const later = f.decisions.get(id);
        if (!later) flag("decision_lost", d.call_session_id, { decision_id: id, read_under: snap.build, missing_under: f.build });
        else if (JSON.stringify(later) !== JSON.stringify(d)) flag("decision_changed", d.call_session_id, { decision_id: id, before: d, after: later, read_under: f.build });
      }
    }
  }
  if (finals.length === 2) {
    const [a, b] = finals;
    for (const [id, d] of a.decisions) if (!b.decisions.has(id)) flag("decision_lost", d.call_session_id, { decision_id: id, missing_under: b.build });
    for (const [id, d] of b.decisions) if (!a.decisions.has(id)) flag("decision_lost", d.call_session_id, { decision_id: id, missing_under: a.build });
  }
  for (const s of sweeps) for (const r of s.routes) if (!r.ok) flag("route_not_answered", null, { build: s.build, phase: s.phase, ...r });
  for (const p of phases) if (p.answers === 0) flag("phase_without_answers", null, { phase: p.index, build: p.build });
  return violations;
}

export async function rollback({ short = false, previous, swaps, rate } = {}) {
  swaps ??= short ? 3 : 12;
  rate ??= short ? 3 : 6;
  const hold = short ? 4_000 : 10_000;
  const prev = previousRelease(previous);
  const builds = {
    previous: { name: "previous", sha: prev.sha, dir: prev.build, ops: operationsOf(readFileSync(join(prev.root, "docs/openapi.yaml"), "utf8")) },
    current: { name: "current", sha: spawnSync("git", ["-C", ROOT, "rev-parse", "HEAD"], { encoding: "utf8" }).stdout.trim(), dir: TESTING_BUILD, ops: operationsOf(readFileSync(join(ROOT, "docs/openapi.yaml"), "utf8")) },
  };
  // The previous release runs first (the production state), then they alternate.
  const order = Array.from({ length: swaps + 1 }, (_, i) => (i % 2 === 0 ? builds.previous : builds.current));
  const stack = await startStack({
    nodes: { M1: stable, M2: stable, M3: stable },
    policy: standardPolicy,
    bindings: { ...TIMINGS, CALLFENCE_TEST_MAX_DURATION_MS: "60000" },
    build: order[0].dir,
  });
  try {
    let done = false;
    const started = [];
    let snapped = 0;
    const loadP = runLoad(stack, { calls: 1, rate, seed: 17, tag: "rollback", more: () => !done, duplicates: 0.1, holdMs: [1000, 2500], onCall: (call) => started.push(call.session) });
    const phases = [];
    const snapshots = [];
    const sweeps = [];
    let firstSession = null;
    const retries = { n: 0 };
    const table = routeTable(stack, () => firstSession);
    for (let i = 0; i < order.length; i += 1) {
      const b = order[i];
      const from = Date.now();
      let swapMs = 0;
      if (i > 0) {
        await stack.swapEdge(b.dir);
        swapMs = Date.now() - from;
      }
      console.error(`rollback: phase ${i} on the ${b.name} build${i > 0 ? ` (swapped in ${swapMs} ms)` : ""}`);
      await sleep(hold);
      firstSession ??= started[0];
      const routes = await sweep(table, b.ops);
      sweeps.push({ phase: i, build: b.name, routes });
      const fresh = started.slice(snapped);
      snapped = started.length;
      snapshots.push({ build: b.name, phase: i, decisions: await decisionsOf(stack, fresh, retries) });
      phases.push({ index: i, build: b.name, sha: b.sha, from, to: Date.now(), swap_ms: swapMs, new_calls: fresh.length });
    }
    done = true;
    console.error("rollback: load stopping; settling");
    const load = await loadP;
    const last = order.at(-1);
    const other = last === builds.current ? builds.previous : builds.current;
    // Settled under the last build, then read under each.
    const views = await settle(stack, load.sessions, 60_000);
    const finals = [{ build: last.name, decisions: new Map(views.decisions.map((d) => [d.decision_id, d])) }];
    await stack.swapEdge(other.dir);
    await stack.waitAllEligible(20_000);
    const again = await collect(stack, load.sessions);
    finals.push({ build: other.name, decisions: new Map(again.decisions.map((d) => [d.decision_id, d])) });
    const finalSweep = await sweep(table, other.ops);
    sweeps.push({ phase: "final", build: other.name, routes: finalSweep });

    const { violations, figures } = check({ commands: stack.telnyx.log, acks: load.acks, calls: views.calls, decisions: views.decisions, ccids: load.ccids });
    for (const p of phases) {
      p.answers = stack.telnyx.log.filter((c) => c.action === "answer" && c.at >= p.from && c.at < p.to).length;
      const acks = load.acks.filter((a) => a.at >= p.from && a.at < p.to);
      p.webhooks = acks.length;
      p.not_200 = acks.filter((a) => a.status !== 200).length;
      p.rate_503 = unavailability(acks, [{ from: -Infinity, to: Infinity }])[0].rate_503;
    }
    const fencedUnanswered = [];
    violations.push(...callsIntact({ calls: views.calls, commands: stack.telnyx.log, ccids: load.ccids, acks: load.acks }, fencedUnanswered));
    violations.push(...checkRollback({ snapshots, finals, sweeps, phases }));
    const routesAsked = sweeps.reduce((n, s) => n + s.routes.length, 0);
    return {
      drill: "rollback",
      pass: violations.length === 0 && figures.calls > 0,
      parameters: { short, swaps, rate, hold_ms: hold, previous: { rev: prev.rev, sha: prev.sha, build: prev.build }, current: { sha: builds.current.sha } },
      figures: {
        ...figures,
        build_swaps: swaps + 1, // workerd restarted with the other build, the final read included
        previous_release_build_s: prev.built_seconds,
        decisions_compared: snapshots.reduce((n, s) => n + s.decisions.size, 0),
        routes_asked: routesAsked,
        view_read_retries: retries.n,
        fenced_unanswered: fencedUnanswered.length,
        operations: { previous: builds.previous.ops.length, current: builds.current.ops.length },
        phases: phases.map(({ index, build, swap_ms, new_calls, answers: a, webhooks, not_200, rate_503 }) => ({ index, build, swap_ms, new_calls, answers: a, webhooks, not_200, rate_503 })),
      },
      violations,
    };
  } finally {
    await stack.close();
  }
}
