// The drills: each runs the whole stack (stack.mjs) under a load (load.mjs),
// checks the history (checker.mjs) and returns a report { drill, pass,
// figures, violations, ... }. `short` is the form `make test` runs (≤ 60 s).

import { CANARY_CALLER, PLAIN_CALLER, sleep, standardPolicy, waitFor } from "../e2e/agents-cluster.mjs";
import { answerCode, check, routedWhileMarked, tally, unansweredCalls, unavailability } from "./checker.mjs";
import { collect, prng, runLoad } from "./load.mjs";
import { stable, startStack, TIMINGS } from "./stack.mjs";
import { compareDecisions, exportEdge, parseReplay, player, replayFile } from "./replay.mjs";
import { rollback } from "./rollback.mjs";
import { deploy } from "./deploy.mjs";
import { bindingsFor, readPages, ROOT, startEdge, startOrigin, testKeys } from "../e2e/harness.mjs";
import { writeFileSync, mkdirSync } from "node:fs";
import { join } from "node:path";

/** Waits until no call of `sessions` is open (the sweep's chance), then reads the views. */
export async function settle(stack, sessions, timeout) {
  const isOpen = (c) => ["pending_assignment", "assigned", "answered"].includes(c.state);
  let open = sessions;
  await waitFor("every call settled", async () => {
    const { calls } = await collect(stack, open, { withDecisions: false });
    open = open.filter((s) => !calls[s] || isOpen(calls[s]));
    return open.length === 0;
  }, { timeout, every: 2_000 }).catch(() => {});
  return collect(stack, sessions);
}

function history(stack, load, views, extra = {}) {
  return { commands: stack.telnyx.log, acks: load.acks, calls: views.calls, decisions: views.decisions, ccids: load.ccids, twice: views.twice, ...extra };
}

// ---------------------------------------------------------- call shards ----

/** The call shards chaos and failover start on (SPEC §16). */
const DRILL_SHARDS = 4;
/** How long after a shard event its unavailability is counted. */
const SHARD_EVENT_WINDOW_MS = 2_000;

/** A map change to `n` call shards, as a window { label, kind, from, to }. */
async function changeMap(stack, n) {
  const from = Date.now();
  await stack.setShards(n);
  return { label: `map change to ${n} shards`, kind: "map_change", node: null, from, to: Date.now() + SHARD_EVENT_WINDOW_MS };
}

/** A restart of the Durable Object `name`, as a window { label, kind, from, to }. */
async function restartShard(stack, name) {
  const from = Date.now();
  await stack.restartShard(name);
  return { label: `restart ${name}`, kind: "shard_restart", node: null, from, to: Date.now() + SHARD_EVENT_WINDOW_MS };
}

/** Runs each of `steps` ([ms into the drill, async () => window]) at its time, unless `stopped()`. */
function scheduled(steps, stopped) {
  const started = Date.now();
  const windows = [];
  const done = (async () => {
    for (const [at, step] of steps) {
      const wait = started + at - Date.now();
      if (wait > 0) await sleep(wait);
      if (stopped()) break;
      windows.push(await step());
    }
  })();
  return { windows, done };
}

// ---------------------------------------------------------------- chaos ----

const FAULTS = ["edge_kill", "agent_kill", "app_kill", "latency", "reset", "blackhole", "slow", "dirty", "drained", "stale", "clock_skew"];
// A node's clock 30 s fast: past the edge's 10 s `clock_skew` bound, within
// the assertions' 60 s lifetime (the node still takes its own calls' events)
// and the 300 s bound on signed requests.
const CLOCK_SKEW_MS = 30_000;

/** One fault on a seeded pick; resolves with its window once healed. */
async function inject(stack, kind, node, hold) {
  const from = Date.now();
  switch (kind) {
    case "edge_kill":
      await stack.killEdge();
      break;
    case "agent_kill":
      await stack.nodes[node].killAgent();
      break;
    case "app_kill":
      await stack.nodes[node].killApp();
      break;
    case "latency":
      stack.proxies[node].set("latency", { ms: 700 });
      break;
    case "slow":
      stack.proxies[node].set("slow", { bytes: 8, ms: 40 });
      break;
    case "reset":
    case "blackhole":
      stack.proxies[node].set(kind);
      break;
    case "dirty":
      stack.dirty(node, true);
      break;
    case "drained":
      stack.mode(node, "drained");
      break;
    case "stale":
      stack.freezeAgent(node, true);
      break;
    case "clock_skew":
      await stack.skewClock(node, CLOCK_SKEW_MS);
      break;
  }
  // A skewed node must be marked before the hold counts: from then on, no
  // new call may be routed to it (checker.mjs, routedWhileMarked).
  const marked = kind === "clock_skew" ? await markedAt(stack, node, "clock_skew") : undefined;
  await sleep(kind === "stale" ? Math.max(hold, 4_000) : hold);
  const healing = Date.now();
  if (kind !== "edge_kill") await stack.heal(node);
  const mark = kind === "clock_skew" ? { reason: "clock_skew", marked_at: marked, until: healing } : {};
  return { label: `${kind}${kind === "edge_kill" ? "" : ` ${node}`}`, kind, node: kind === "edge_kill" ? null : node, from, to: Date.now(), ...mark };
}

/** When the edge's status first shows `reason` on `node` (null if not within 15 s). */
async function markedAt(stack, node, reason) {
  return stack.cluster
    .waitNode(node, reason, (n) => n.reasons.includes(reason), 15_000)
    .then(() => Date.now())
    .catch(() => null);
}

export async function chaos({ short = false, seed = 7, calls, rate, faults, shards = DRILL_SHARDS } = {}) {
  calls ??= short ? 120 : 5_000;
  // 10 calls/s: the whole local stack (workerd, three agents, three demo
  // apps, the fake Telnyx and this load) takes about 15 calls/s cleanly on
  // 2 cores; at 25/s it is overloaded with no fault at all (59% of webhooks
  // 503 `overloaded` or `dispatcher_unavailable`, and the retries feed it),
  // which drills the machine's capacity, not the faults.
  rate ??= short ? 6 : 10;
  faults ??= short ? 6 : 50;
  const maxDuration = short ? 8_000 : 30_000;
  const stack = await startStack({
    nodes: { M1: stable, M2: stable, M3: stable },
    policy: standardPolicy,
    shards,
    bindings: { ...TIMINGS, CALLFENCE_TEST_MAX_DURATION_MS: String(maxDuration) },
  });
  try {
    const rand = prng(seed);
    const windows = [];
    let done = false;
    // Under live calls: the map doubles at a third of the load, and one call
    // shard (one that holds calls under both maps) restarts at two thirds.
    const planned = (calls * 1000) / rate;
    const sharding = scheduled(
      shards > 1
        ? [
            [planned / 3, () => changeMap(stack, shards * 2)],
            [(planned * 2) / 3, () => restartShard(stack, "calls-1")],
          ]
        : [],
      () => done,
    );
    const faulting = (async () => {
      while (!done && windows.length < faults) {
        await sleep(500 + rand() * 1_500);
        if (done) break;
        const kind = FAULTS[Math.floor(rand() * FAULTS.length)];
        const node = ["M1", "M2", "M3"][Math.floor(rand() * 3)];
        windows.push(await inject(stack, kind, node, 1_000 + rand() * 2_000));
      }
    })();
    const load = await runLoad(stack, {
      calls,
      rate,
      seed,
      tag: "chaos",
      more: () => windows.length < faults,
      duplicates: 0.15,
      caller: (i) => (i % 3 === 0 ? CANARY_CALLER : PLAIN_CALLER),
    });
    done = true;
    await faulting;
    await sharding.done;
    const views = await settle(stack, load.sessions, maxDuration + 20_000);
    const recorded = history(stack, load, views);
    const { violations, figures } = check(recorded);
    violations.push(...routedWhileMarked(views.decisions, windows));
    const unanswered = unansweredCalls(recorded, windows);
    const per = unavailability(load.acks, windows);
    const byKind = {};
    for (const w of per) {
      const k = (byKind[w.kind] ??= { faults: 0, webhooks: 0, failed: 0 });
      k.faults += 1;
      k.webhooks += w.webhooks;
      k.failed += w.failed;
    }
    for (const k of Object.values(byKind)) k.rate_503 = k.webhooks ? +(k.failed / k.webhooks).toFixed(4) : 0;
    const targets = {
      calls: figures.calls >= calls,
      faults: windows.length >= faults,
      shard_events: sharding.windows.length === (shards > 1 ? 2 : 0),
    };
    return {
      drill: "chaos",
      pass: violations.length === 0 && targets.calls && targets.faults && targets.shard_events,
      parameters: { short, seed, calls, rate, faults, max_duration_ms: maxDuration, shards },
      figures: {
        ...figures,
        faults_injected: windows.length,
        rate_503_overall: unavailability(load.acks, [{ from: 0, to: Infinity }])[0].rate_503,
        held_twice: views.twice.length,
      },
      shard_events: unavailability(load.acks, sharding.windows),
      rate_503_by_kind: byKind,
      not_200_by_answer: tally(load.acks.filter((a) => a.status !== 200), (a) => `${a.status} ${answerCode(a)}`),
      unanswered_by_cause: tally(unanswered, (u) => u.cause),
      unanswered,
      faults: per,
      targets,
      violations,
    };
  } finally {
    await stack.close();
  }
}

// ------------------------------------------------------------- failover ----

/** Measures one outage of M1 (`fault` applied at t0) under a steady load of new calls. */
async function outage(stack, { fault, window, rate, tag, meanwhile = async () => null }) {
  let t0 = 0;
  const loadP = runLoad(stack, {
    calls: Math.ceil(((window + 3_000) * rate) / 1000),
    rate,
    seed: 3,
    tag,
    duplicates: 0,
    retries: 2,
    holdMs: [200, 600],
  });
  await sleep(3_000);
  t0 = Date.now();
  await fault();
  await sleep(1_000);
  const event = await meanwhile();
  const load = await loadP;
  const firstOf = new Map();
  for (const a of load.acks) if (a.type === "call.initiated" && !firstOf.has(a.session)) firstOf.set(a.session, a);
  const after = [...firstOf.values()].filter((a) => a.at >= t0);
  const onFallback = load.acks.find((a) => a.at >= t0 && a.type === "call.initiated" && a.status === 200 && a.body?.delivered_to === "M2");
  const landed = onFallback ? onFallback.at : null;
  const failedMeanwhile = after.filter((a) => (landed === null || a.at < landed) && a.status !== 200).length;
  const finalByCall = new Map();
  for (const a of load.acks) if (a.type === "call.initiated") finalByCall.set(a.session, a);
  const neverDelivered = after.filter((a) => finalByCall.get(a.session).status !== 200).length;
  return {
    load,
    event,
    figures: {
      new_calls_after_fault: after.length,
      time_to_fallback_ms: landed === null ? null : landed - t0,
      failed_before_fallback: failedMeanwhile,
      never_delivered: neverDelivered,
      owned_by_dead_node_before: [...finalByCall.values()].filter((a) => a.at < t0 && a.body?.delivered_to === "M1").length,
    },
  };
}

export async function failover({ short = false, shards = DRILL_SHARDS } = {}) {
  const window = short ? 4_000 : 20_000;
  const rate = short ? 4 : 8;
  const stack = await startStack({
    nodes: { M1: stable, M2: stable },
    policy: standardPolicy,
    shards,
    bindings: { ...TIMINGS, CALLFENCE_TEST_MAX_DURATION_MS: short ? "8000" : "15000" },
  });
  try {
    // A second after each fault, with calls live: one call shard restarts
    // in the first outage, and the map halves in the second.
    const sharded = (event) => (shards > 1 ? event : undefined);
    const killed = await outage(stack, {
      fault: () => stack.nodes.M1.killAgent(),
      window,
      rate,
      tag: "fo-kill",
      meanwhile: sharded(() => restartShard(stack, "calls-1")),
    });
    await stack.heal("M1");
    await stack.waitAllEligible();
    const blackholed = await outage(stack, {
      fault: () => stack.proxies.M1.set("blackhole"),
      window,
      rate,
      tag: "fo-hole",
      meanwhile: sharded(() => changeMap(stack, Math.max(1, shards / 2))),
    });
    await stack.heal("M1");
    const sessions = [...killed.load.sessions, ...blackholed.load.sessions];
    const views = await settle(stack, sessions, 40_000);
    const merged = { acks: [...killed.load.acks, ...blackholed.load.acks], ccids: { ...killed.load.ccids, ...blackholed.load.ccids } };
    const { violations, figures } = check(history(stack, merged, views));
    const reached = (o) => o.figures.time_to_fallback_ms !== null;
    const events = [killed.event, blackholed.event].filter(Boolean);
    return {
      drill: "failover",
      pass: violations.length === 0 && reached(killed) && reached(blackholed) && events.length === (shards > 1 ? 2 : 0),
      parameters: { short, window_ms: window, rate, shards },
      figures: { ...figures, held_twice: views.twice.length, process_killed: killed.figures, tunnel_blackholed: blackholed.figures },
      shard_events: unavailability(merged.acks, events),
      violations,
    };
  } finally {
    await stack.close();
  }
}

// --------------------------------------------------------------- canary ----

export async function canary({ short = false } = {}) {
  const perPhase = short ? 8 : 60;
  const rate = short ? 4 : 8;
  const stack = await startStack({
    nodes: { M1: stable, M3: { role: "candidate", canary_go: false, fallback_approved: false, max_calls: 1000 } },
    policy: (ids) => ({ ...standardPolicy(ids), by_line: { main: { ...standardPolicy(ids).by_line.main, fallback_node: "M3" } } }),
    bindings: { ...TIMINGS, CALLFENCE_TEST_MAX_DURATION_MS: short ? "8000" : "15000" },
  });
  const { cluster } = stack;
  const setM3 = async (fields) => {
    Object.assign(cluster.nodes.M3.registryFields, fields);
    await cluster.put("nodes", cluster.registry());
  };
  try {
    const phases = [];
    // A phase starts when its document change is written; a decision belongs
    // to the phase it was made in (the alarm may assign a parked call later).
    const run = async (name, allowed) => {
      const from = Date.now();
      const load = await runLoad(stack, { calls: perPhase, rate, seed: phases.length + 11, tag: `canary-${name}`, duplicates: 0, retries: short ? 2 : 6, holdMs: [100, 300], caller: (i) => (i % 2 ? CANARY_CALLER : PLAIN_CALLER) });
      phases.push({ name, allowed, load, from });
    };
    await run("before_canary_go", []);
    await setM3({ canary_go: true });
    await run("canary_go", ["caller_override"]);
    stack.mode("M1", "drained");
    await cluster.waitNode("M1", "drained", (n) => n.eligible === false, 15_000);
    await run("preferred_drained", ["caller_override"]);
    await setM3({ fallback_approved: true });
    await run("fallback_approved", ["caller_override", "line_fallback"]);
    stack.mode("M1", "active");
    const sessions = phases.flatMap((p) => p.load.sessions);
    const views = await settle(stack, sessions, 40_000);
    const merged = { acks: phases.flatMap((p) => p.load.acks), ccids: Object.assign({}, ...phases.map((p) => p.load.ccids)) };
    const { violations, figures } = check(history(stack, merged, views));
    const report = {};
    const phaseOf = (d) => [...phases].reverse().find((p) => Date.parse(d.at) >= p.from) ?? phases[0];
    for (const p of phases) {
      const counts = {};
      for (const d of views.decisions) {
        if (phaseOf(d) !== p || d.chosen !== "M3" || !["assigned", "reassigned"].includes(d.outcome)) continue;
        const rule = d.rule === "line" && d.prefers !== "M3" ? "line_fallback" : d.rule;
        counts[rule] = (counts[rule] ?? 0) + 1;
        if (!p.allowed.includes(rule)) violations.push({ kind: "candidate_reached_by_forbidden_rule", session: d.call_session_id, evidence: { phase: p.name, rule, decision_id: d.decision_id } });
      }
      report[p.name] = { calls: p.load.sessions.length, reached_candidate_by_rule: counts, allowed: p.allowed };
    }
    const reached = (name, rule) => (report[name].reached_candidate_by_rule[rule] ?? 0) > 0;
    const expected = reached("canary_go", "caller_override") && reached("fallback_approved", "line_fallback");
    return { drill: "canary", pass: violations.length === 0 && expected, parameters: { short, per_phase: perPhase, rate }, figures: { ...figures, phases: report }, violations };
  } finally {
    await stack.close();
  }
}

// --------------------------------------------------------------- replay ----

export async function replay({ short = false, scale = 1 } = {}) {
  const calls = short ? 40 : 300;
  const rate = short ? 4 : 8;
  const timings = { ...TIMINGS, CALLFENCE_TEST_MAX_DURATION_MS: "15000" };
  const stack = await startStack({
    nodes: { M1: stable, M2: stable, M3: stable },
    policy: standardPolicy,
    bindings: timings,
    recordBeats: true,
  });
  let text;
  let original;
  let sessions;
  let signer;
  try {
    const since = Date.now() - 2_000;
    // Both forms change the routing while calls flow, so the replay must
    // reproduce decisions that depend on the beats' order: M1 (the line's
    // preferred node) drains for 30% of the load's span (3 s of the short
    // form's 10 s, 11 s of the full form's), then the full form also dirties
    // M3's checkout.
    const span = (calls / rate) * 1000;
    const script = (async () => {
      await sleep(span * 0.3);
      stack.mode("M1", "drained");
      await sleep(span * 0.3);
      stack.mode("M1", "active");
      if (short) return;
      stack.dirty("M3", true);
      await sleep(span * 0.2);
      stack.dirty("M3", false);
    })();
    const load = await runLoad(stack, { calls, rate, seed: 5, tag: "replay", duplicates: 0.1, holdMs: [200, 800], caller: (i) => (i % 3 === 0 ? CANARY_CALLER : PLAIN_CALLER) });
    await script;
    sessions = load.sessions;
    original = await collect(stack, sessions);
    const exported = await exportEdge(stack.edge, stack.cluster.keys.adminToken);
    text = replayFile({ ...exported, beats: stack.recorder.beats, since });
    signer = { nodes: Object.fromEntries(Object.values(stack.nodes).map((n) => [n.id, { kid: n.key.kid, privateKey: n.key.privateKeyObject }])) };
  } finally {
    await stack.close();
  }
  mkdirSync(join(ROOT, ".drills"), { recursive: true });
  const file = join(ROOT, ".drills", "replay-input.jsonl");
  writeFileSync(file, text);

  // A fresh edge with the same documents and timings, its origins
  // stand-ins that answer as the file says (see replay.mjs, player).
  const { header, lines } = parseReplay(text);
  const keys = testKeys();
  const edge = await startEdge({ keys, bindings: { ...bindingsFor(keys), ...timings } });
  const origins = {};
  const replaying = player(edge, lines, {
    scale,
    signer: { ...signer, telnyx: keys.telnyx.privateKeyObject },
    originFor: (id) => origins[id].url,
    adminToken: keys.adminToken,
  });
  try {
    for (const id of Object.keys(header.nodes.nodes)) {
      origins[id] = await startOrigin({ node: id, edgeKeys: [{ kid: keys.edgeKid, public_key: keys.edge.publicKey }], telnyxPublicKey: keys.telnyx.publicKey });
      origins[id].respond = (req) => replaying.respond(id, JSON.parse(req.body).data.id);
    }
    const admin = { authorization: `Bearer ${keys.adminToken}`, "content-type": "application/json", "if-match": '"0"' };
    const registry = structuredClone(header.nodes);
    for (const [id, n] of Object.entries(registry.nodes)) n.origin_url = origins[id].url;
    for (const [kind, doc] of [["nodes", registry], ["policy", header.policy]]) {
      const res = await edge.fetch(`/v1/${kind}`, { method: "PUT", headers: admin, body: JSON.stringify(doc) });
      if (res.status !== 200) throw new Error(`replay edge: PUT /v1/${kind}: ${res.status} ${await res.text()}`);
    }
    const played = await replaying.play(Date.now());
    const replayed = await readPages(edge, keys.adminToken, "/v1/decisions", "decisions", { after: 0, limit: 500 });
    const { compared, differences } = compareDecisions(original.decisions, replayed);
    const rules = {};
    for (const d of original.decisions) rules[`${d.rule}->${d.chosen}`] = (rules[`${d.rule}->${d.chosen}`] ?? 0) + 1;
    // The drain must have shown in the original's decisions, or the replay
    // proved nothing about a routing change.
    const drained = original.decisions.filter((d) => (d.reasons?.M1 ?? []).includes("mode_drained")).length;
    return {
      drill: "replay",
      pass: differences.length === 0 && compared > 0 && drained > 0,
      parameters: { short, calls, rate, scale, replay_file: file },
      figures: {
        calls: sessions.length,
        lines: lines.length,
        webhooks: lines.filter((l) => l.kind === "webhook").length,
        heartbeats: lines.filter((l) => l.kind === "heartbeat").length,
        sends_refused: played.failed,
        outcomes_unmatched: played.unmatched,
        decisions_original: original.decisions.length,
        decisions_replayed: replayed.length,
        decisions_compared: compared,
        differences: differences.length,
        decisions_m1_drained: drained,
        original_rule_chosen: rules,
      },
      differences,
      violations: differences.map((d) => ({ kind: "decision_not_reproduced", session: d.session, evidence: d })),
    };
  } finally {
    await edge.dispose();
    for (const o of Object.values(origins)) await o.close();
  }
}

export const DRILLS = { chaos, failover, canary, replay, rollback, deploy };
