#!/usr/bin/env node
// `make bench`, the Worker half: end-to-end figures on local workerd
// (Miniflare's Node API on the prebuilt build/, as tests/e2e/harness.mjs runs
// it), printed with the conditions they were taken under.
//
// One run measures:
//  1. latency, webhook -> origin acknowledgement -> answer, for distinct new
//     calls sent one at a time after a warm-up: callfence (signed webhook ->
//     Worker -> Dispatcher -> loopback origin -> report -> answer) against a
//     bare pass-through Worker (bench/passthrough.mjs) in front of the same
//     origin. The two are interleaved request by request (ABBA order) so load
//     from other processes hits both alike;
//  2. distinct-call assignments per second sustained by the one Dispatcher:
//     a fixed number of new calls with a fixed number in flight;
//  3. the Worker's own time per webhook: `ms - wait_ms` from its JSON log
//     lines (see src/log.rs): wall time of the request inside the Worker
//     minus the time spent awaiting the Dispatcher and the origin. Local
//     workerd advances Date.now() during CPU work, so this approximates the
//     Worker's CPU time (1 ms resolution per reading);
//  4. CPU per webhook of the whole workerd process (Worker and Dispatcher
//     together) from /proc/<pid>/stat (utime + stime) over the sequential
//     phase, divided by the webhooks that process served, for callfence and
//     for the pass-through Worker;
//  5. where the Dispatcher's time goes per operation (the `profile` message,
//     src/dispatcher/profile.rs): per webhook, its decode, engine + encode,
//     SQL (and statements), and alarm arming, for the `webhook` and `report`
//     operations of the sequential phase;
//  6. overload: BENCH_OVERLOAD_CALLS new calls with BENCH_OVERLOAD_CONCURRENCY
//     in flight: how many the Dispatcher took and how many it shed (503
//     `overloaded`, core/src/admission.rs), and the latency of each;
//  7. the build's sizes.
//
// The origin verifies nothing and answers 200 {"ok":true}. Every answer is
// checked (callfence: 200 with delivered_to; pass-through: 200), and the run
// fails if any is not, so a figure never describes error paths.
//
// Knobs (environment): BENCH_WARMUP (30), BENCH_CALLS (300),
// BENCH_THROUGHPUT_CALLS (1000), BENCH_CONCURRENCY (8),
// BENCH_FORWARD_TIMEOUT_MS (1500), BENCH_OVERLOAD_CALLS (600),
// BENCH_OVERLOAD_CONCURRENCY (32). BENCH_README=1 also writes the figures
// into README.md between the bench markers; BENCH_JSON=1 prints, as the last
// line, one JSON object with every figure (p50_ratio, p99_ratio,
// assignments_per_s, worker_ms_median, cpu_ms_per_webhook, wasm_gzip_bytes,
// ...), so runs can be compared.

import { Miniflare } from "miniflare";
import { execFileSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { readFileSync, statSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import os from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { gzipSync } from "node:zlib";
import {
  ROOT,
  bearer,
  workerdPids,
  bindingsFor,
  nodeHeaders,
  read,
  sha256Hex,
  startEdge,
  telnyxHeaders,
  testKeys,
  ed25519,
} from "../tests/e2e/harness.mjs";

const int = (name, fallback) => {
  const value = Number.parseInt(process.env[name] ?? "", 10);
  return Number.isFinite(value) && value > 0 ? value : fallback;
};
const WARMUP = int("BENCH_WARMUP", 30);
const CALLS = int("BENCH_CALLS", 300);
const THROUGHPUT_CALLS = int("BENCH_THROUGHPUT_CALLS", 1000);
const CONCURRENCY = int("BENCH_CONCURRENCY", 8);
const FORWARD_TIMEOUT_MS = int("BENCH_FORWARD_TIMEOUT_MS", 1500);
const OVERLOAD_CALLS = int("BENCH_OVERLOAD_CALLS", 600);
const OVERLOAD_CONCURRENCY = int("BENCH_OVERLOAD_CONCURRENCY", 32);
const WEBHOOK = "/v1/telnyx/webhook";
const NODE = "M1";
const KID = "k1";
const RUN = randomUUID().slice(0, 8);

// ----------------------------------------------------------- statistics ----

function quantile(sorted, q) {
  if (sorted.length === 0) return NaN;
  const index = Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1));
  return sorted[index];
}
function summary(samples) {
  const sorted = [...samples].sort((a, b) => a - b);
  const mean = sorted.reduce((s, x) => s + x, 0) / sorted.length;
  return { n: sorted.length, p50: quantile(sorted, 0.5), p90: quantile(sorted, 0.9), p99: quantile(sorted, 0.99), mean, max: sorted.at(-1) };
}
const ms = (x, digits = 2) => `${x.toFixed(digits)} ms`;

// ------------------------------------------------------------------- cpu ----


/** The one workerd child started by `start()`. */
async function newWorkerd(start) {
  const before = new Set(workerdPids());
  const result = await start();
  const fresh = workerdPids().filter((pid) => !before.has(pid));
  if (fresh.length !== 1) throw new Error(`expected one new workerd process, found ${fresh.length}`);
  return { result, pid: fresh[0] };
}

const CLOCK_TICKS = (() => {
  try {
    return Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim()) || 100;
  } catch {
    return 100;
  }
})();

/** CPU time (user + system) of `pid` so far, in ms. */
function cpuMs(pid) {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  // fields[0] is field 3 (state): utime is field 14, stime field 15.
  return ((Number(fields[11]) + Number(fields[12])) * 1000) / CLOCK_TICKS;
}

// -------------------------------------------------------------- profile ----

/** The Dispatcher's profile (src/dispatcher/profile.rs), straight from the DO. */
async function dispatcherProfile(edge) {
  const stub = await edge.dispatcher();
  const res = await stub.fetch("https://dispatcher/profile", { method: "POST", body: '{"v":2,"op":"profile"}\n' });
  const text = await res.text();
  try {
    const body = JSON.parse(text);
    // A build that predates the profile answers bad_message: no figures.
    return body.ok ? body.ops : {};
  } catch {
    return {};
  }
}

/** Per-request means of `after - before` for one operation. */
function profileDelta(before, after, op) {
  const a = after[op] ?? {};
  const b = before[op] ?? {};
  const count = (a.count ?? 0) - (b.count ?? 0);
  const mean = (field) => (count > 0 ? ((a[field] ?? 0) - (b[field] ?? 0)) / count : 0);
  return {
    count,
    total_ms: mean("total_ms"),
    decode_ms: mean("decode_ms"),
    serve_ms: mean("serve_ms"),
    origin_ms: mean("origin_ms"),
    sql_ms: mean("sql_ms"),
    statements: mean("statements"),
    arm_ms: mean("arm_ms"),
    alarm_api_calls: mean("alarm_api_calls"),
  };
}

// ---------------------------------------------------------------- origin ----

/** A loopback origin that verifies nothing: reads the body, answers 200. */
async function startPlainOrigin() {
  const origin = { received: 0 };
  const server = createServer((req, res) => {
    req.on("data", () => {});
    req.on("end", () => {
      origin.received += 1;
      res.writeHead(200, { "content-type": "application/json" });
      res.end('{"ok":true}');
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  origin.url = `http://127.0.0.1:${server.address().port}/callfence/telnyx`;
  origin.close = () => {
    server.closeAllConnections?.();
    return new Promise((resolve) => server.close(resolve));
  };
  return origin;
}

// ------------------------------------------------------------- callfence ----

/** Registry (one stable node at the origin), policy, and an eligible beat. */
async function setUpCallfence(edge, origin, node) {
  const put = async (kind, doc) => {
    const res = await read(
      await edge.fetch(`/v1/${kind}`, {
        method: "PUT",
        headers: { ...bearer(edge.keys.adminToken), "if-match": '"0"', "content-type": "application/json" },
        body: JSON.stringify(doc),
      }),
    );
    if (res.status !== 200) throw new Error(`PUT /v1/${kind}: ${res.status} ${JSON.stringify(res.body)}`);
  };
  await put("nodes", {
    schema: "callfence_nodes_v1",
    nodes: {
      [NODE]: {
        role: "stable",
        origin_url: origin.url,
        keys: { [KID]: node.publicKey },
        fallback_approved: false,
        admin_drained: false,
        max_calls: 10000,
      },
    },
  });
  await put("policy", { schema: "riff_node_routing_policy_v1", default_node: NODE, by_line: {}, by_caller: {} });

  let seq = 0;
  const beat = async () => {
    seq = Math.max(seq + 1, Date.now());
    const body = JSON.stringify({
      schema: "callfence_heartbeat_v1",
      node: NODE,
      seq,
      sent_at: new Date().toISOString(),
      valid_for_s: 30,
      mode: "active",
      sha: "9b4082d1c0ffee00112233445566778899aabbcc",
      dirty: false,
      app_ready: true,
      capacity: { max_calls: 10000, active_calls: 0 },
      tunnel_up: true,
      origin_url: origin.url,
      lines: {},
      routing_hash: sha256Hex(""),
      agent_version: "bench",
    });
    const url = new URL("/v1/nodes/heartbeat", edge.url);
    const headers = nodeHeaders({ url, body, node: NODE, kid: KID, privateKey: node.privateKeyObject });
    return read(await edge.fetch(url.pathname, { method: "POST", headers, body }));
  };
  // The Worker's key copy refreshes on an unknown key at most once a second.
  const deadline = Date.now() + 10_000;
  for (;;) {
    const res = await beat();
    if (res.status === 200 && res.body.eligible === true) break;
    if (Date.now() > deadline) throw new Error(`heartbeat: ${res.status} ${JSON.stringify(res.body)}`);
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
  // valid_for_s is at most 30: keep the node eligible through the run.
  const timer = setInterval(() => beat().catch(() => {}), 10_000);
  timer.unref();
  return () => clearInterval(timer);
}

/** A signed call.initiated webhook for a new, distinct inbound call. */
function newCall(keys, tag, i) {
  const session = `bench-${RUN}-${tag}-${i}`;
  const id = randomUUID();
  const body = JSON.stringify({
    data: {
      record_type: "event",
      id,
      event_type: "call.initiated",
      occurred_at: new Date().toISOString(),
      payload: {
        call_control_id: `v3:${session}`,
        call_leg_id: `leg-${session}`,
        call_session_id: session,
        connection_id: "bench",
        from: "+14155550100",
        to: "+14155550199",
        direction: "incoming",
        state: "parked",
      },
    },
    meta: { attempt: 1, delivered_to: "https://callfence.example/v1/telnyx/webhook" },
  });
  return { id, body, headers: telnyxHeaders(body, keys.telnyx.privateKeyObject) };
}

/** POSTs a prepared webhook to `base`; returns the round trip in ms. */
async function timed(base, call, check) {
  const started = performance.now();
  const res = await fetch(new URL(WEBHOOK, base), { method: "POST", headers: call.headers, body: call.body, redirect: "manual" });
  const text = await res.text();
  const elapsed = performance.now() - started;
  check(res.status, text, call);
  return elapsed;
}

const failures = [];
function checkCallfence(status, text, call) {
  let body = null;
  try {
    body = JSON.parse(text);
  } catch {
    // reported below
  }
  if (status !== 200 || body?.delivered_to !== NODE || body?.event_id !== call.id) {
    failures.push(`callfence: ${status} ${text.slice(0, 200)}`);
  }
}
function checkPassthrough(status, text) {
  if (status !== 200 || text !== '{"ok":true}') failures.push(`pass-through: ${status} ${text.slice(0, 200)}`);
}

// ------------------------------------------------------------ conditions ----

function conditions() {
  const wasm = readFileSync(join(ROOT, "build/index_bg.wasm"));
  const js = readFileSync(join(ROOT, "build/index.js"));
  const git = (...args) => {
    try {
      return execFileSync("git", args, { cwd: ROOT, encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] }).trim();
    } catch {
      return "";
    }
  };
  const dirty = git("status", "--porcelain", "--", "src", "core", "Cargo.toml", "Cargo.lock") ? " (+ uncommitted changes in src/core)" : "";
  const version = (pkg) => JSON.parse(readFileSync(join(ROOT, "node_modules", pkg, "package.json"), "utf8")).version;
  return {
    machine: `${os.cpus().length} cores (${os.cpus()[0]?.model?.trim() ?? "unknown"}), ${Math.round(os.totalmem() / 2 ** 30)} GiB, ${os.type()} ${os.release()} ${os.arch()}`,
    load: os.loadavg().map((x) => x.toFixed(2)).join(" "),
    node: process.version,
    rustc: (() => {
      try {
        return execFileSync("rustc", ["--version"], { encoding: "utf8" }).trim();
      } catch {
        return "rustc unknown";
      }
    })(),
    miniflare: version("miniflare"),
    workerd: version("workerd"),
    compatibilityDate: readFileSync(join(ROOT, "wrangler.toml"), "utf8").match(/^compatibility_date\s*=\s*"([^"]+)"/m)[1],
    commit: `${git("rev-parse", "--short", "HEAD") || "unknown"}${dirty}`,
    build: {
      wasmRaw: wasm.length,
      wasmGzip: gzipSync(wasm, { level: 9 }).length,
      jsRaw: js.length,
      builtAt: statSync(join(ROOT, "build/index_bg.wasm")).mtime.toISOString(),
    },
  };
}

// -------------------------------------------------------------- the run ----

async function main() {
  const before = conditions();
  const origin = await startPlainOrigin();
  const keys = testKeys();
  const node = ed25519();
  const { result: edge, pid: edgePid } = await newWorkerd(() =>
    startEdge({ keys, bindings: { ...bindingsFor(keys), FORWARD_TIMEOUT_MS: String(FORWARD_TIMEOUT_MS) } }),
  );
  let passthrough;
  const { result: passthroughUrl, pid: passthroughPid } = await newWorkerd(() => {
    passthrough = new Miniflare({
      host: "127.0.0.1",
      port: 0,
      cf: false,
      modules: true,
      scriptPath: join(ROOT, "bench/passthrough.mjs"),
      compatibilityDate: before.compatibilityDate,
      bindings: { ORIGIN_URL: origin.url },
    });
    return passthrough.ready;
  });
  let stopBeating = () => {};
  try {
    stopBeating = await setUpCallfence(edge, origin, node);

    // 1. Sequential latency, interleaved ABBA.
    const phase = new Map(); // event id -> "latency" | "throughput"
    const cf = [];
    const pt = [];
    const total = WARMUP + CALLS;
    const started1 = performance.now();
    let cpu0 = null;
    let profile0 = null;
    for (let i = 0; i < total; i += 1) {
      if (i === WARMUP) {
        profile0 = await dispatcherProfile(edge);
        cpu0 = { edge: cpuMs(edgePid), passthrough: cpuMs(passthroughPid) };
      }
      const a = newCall(keys, "seq", i);
      const b = newCall(keys, "pt", i);
      const runCf = () => timed(edge.url, a, checkCallfence);
      const runPt = () => timed(passthroughUrl, b, checkPassthrough);
      let tCf;
      let tPt;
      if (i % 2 === 0) {
        tCf = await runCf();
        tPt = await runPt();
      } else {
        tPt = await runPt();
        tCf = await runCf();
      }
      if (i >= WARMUP) {
        cf.push(tCf);
        pt.push(tPt);
        phase.set(a.id, "latency");
      }
    }
    const latencySeconds = (performance.now() - started1) / 1000;
    const cpu = {
      callfence: (cpuMs(edgePid) - cpu0.edge) / CALLS,
      passthrough: (cpuMs(passthroughPid) - cpu0.passthrough) / CALLS,
    };
    const profile1 = await dispatcherProfile(edge);
    const profile = {
      webhook: profileDelta(profile0, profile1, "webhook"),
      report: profileDelta(profile0, profile1, "report"),
    };

    // 2. Throughput: THROUGHPUT_CALLS distinct new calls, CONCURRENCY in flight.
    const calls = Array.from({ length: THROUGHPUT_CALLS }, (_, i) => newCall(keys, "tput", i));
    for (const call of calls) phase.set(call.id, "throughput");
    const concurrent = [];
    const finished = [];
    let next = 0;
    const started2 = performance.now();
    await Promise.all(
      Array.from({ length: CONCURRENCY }, async () => {
        while (next < calls.length) {
          const call = calls[next];
          next += 1;
          concurrent.push(await timed(edge.url, call, checkCallfence));
          finished.push(performance.now());
        }
      }),
    );
    const throughputSeconds = (performance.now() - started2) / 1000;

    // Overload: OVERLOAD_CONCURRENCY in flight; every answer must be a
    // delivery or a shed (503 overloaded), nothing else.
    const overload = { taken: [], shed: [], other: [] };
    const overloadCalls = Array.from({ length: OVERLOAD_CALLS }, (_, i) => newCall(keys, "over", i));
    let nextOver = 0;
    const started3 = performance.now();
    await Promise.all(
      Array.from({ length: OVERLOAD_CONCURRENCY }, async () => {
        while (nextOver < overloadCalls.length) {
          const call = overloadCalls[nextOver];
          nextOver += 1;
          const t0 = performance.now();
          const res = await fetch(new URL(WEBHOOK, edge.url), { method: "POST", headers: call.headers, body: call.body, redirect: "manual" });
          const text = await res.text();
          const elapsed = performance.now() - t0;
          let body = null;
          try {
            body = JSON.parse(text);
          } catch {
            // counted as other
          }
          if (res.status === 200 && body?.delivered_to === NODE) overload.taken.push(elapsed);
          else if (res.status === 503 && body?.error === "overloaded" && res.headers.get("retry-after") === "1") overload.shed.push(elapsed);
          else overload.other.push(`${res.status} ${text.slice(0, 120)}`);
        }
      }),
    );
    const overloadSeconds = (performance.now() - started3) / 1000;
    if (overload.other.length > 0) {
      throw new Error(`${overload.other.length} overload answers were neither deliveries nor sheds, first: ${overload.other[0]}`);
    }

    // 3. The Worker's own time, from its log lines.
    const expected = CALLS + THROUGHPUT_CALLS;
    // (The overload phase's lines are not read: its sheds never forward.)
    const deadline = Date.now() + 5000;
    let lines = [];
    for (;;) {
      lines = edge.logs
        .map(({ message }) => {
          try {
            return JSON.parse(message);
          } catch {
            return null;
          }
        })
        .filter((l) => l && l.path === WEBHOOK && phase.has(l.event_id));
      if (lines.length >= expected || Date.now() > deadline) break;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    const own = { latency: [], throughput: [] };
    const wall = { latency: [], throughput: [] };
    const waits = { latency: [], throughput: [] };
    let missingWait = 0;
    for (const l of lines) {
      if (typeof l.wait_ms !== "number") {
        missingWait += 1;
        continue;
      }
      const p = phase.get(l.event_id);
      own[p].push(l.ms - l.wait_ms);
      wall[p].push(l.ms);
      waits[p].push(l.wait_ms);
    }

    if (failures.length > 0) {
      throw new Error(`${failures.length} answers were not deliveries, first: ${failures[0]}`);
    }

    const after = os.loadavg().map((x) => x.toFixed(2)).join(" ");
    const c = summary(cf);
    const p = summary(pt);
    const t = summary(concurrent);
    const o = own.latency.length ? summary(own.latency) : null;
    const oT = own.throughput.length ? summary(own.throughput) : null;
    const w = wall.latency.length ? summary(wall.latency) : null;
    const wt = waits.latency.length ? summary(waits.latency) : null;
    const b = before.build;
    const rate = THROUGHPUT_CALLS / throughputSeconds;
    // Rate over the first and the last quarter of completions: a falling
    // rate means the Dispatcher's cost grows with the calls it holds open.
    const quarter = Math.floor(finished.length / 4);
    const rateOf = (from, to) => (to - from) / ((finished[to] - finished[from]) / 1000);
    const firstQuarter = rateOf(0, quarter);
    const lastQuarter = rateOf(finished.length - 1 - quarter, finished.length - 1);

    const conditionLines = [
      `machine: ${before.machine}; load average (1/5/15 min) ${before.load} before, ${after} after`,
      `runtime: local workerd ${before.workerd} via Miniflare ${before.miniflare} (Node API), node ${before.node}, compatibility_date ${before.compatibilityDate}; ${before.rustc} (core bench)`,
      `build: build/index_bg.wasm ${b.wasmRaw} bytes raw, ${b.wasmGzip} gzipped (-9); build/index.js ${b.jsRaw} bytes; built ${b.builtAt}; commit ${before.commit}`,
      `config: FORWARD_TIMEOUT_MS=${FORWARD_TIMEOUT_MS}, one stable node, one Dispatcher, loopback origin answering 200 without verifying; client: Node fetch on loopback`,
    ];
    const figureLines = [
      `latency, sequential, ${CALLS} distinct new calls each after ${WARMUP} warm-up, interleaved ABBA (${latencySeconds.toFixed(1)} s):`,
      `  callfence     p50 ${ms(c.p50)}  p99 ${ms(c.p99)}  (mean ${ms(c.mean)}, max ${ms(c.max)})`,
      `  pass-through  p50 ${ms(p.p50)}  p99 ${ms(p.p99)}  (mean ${ms(p.mean)}, max ${ms(p.max)})`,
      `  ratio         p50 ${(c.p50 / p.p50).toFixed(2)}x  p99 ${(c.p99 / p.p99).toFixed(2)}x; callfence adds ${ms(c.p50 - p.p50)} at p50`,
      `throughput: ${THROUGHPUT_CALLS} distinct new calls, ${CONCURRENCY} in flight, one Dispatcher: ${rate.toFixed(0)} assignments/s (${throughputSeconds.toFixed(2)} s; latency p50 ${ms(t.p50)}, p99 ${ms(t.p99)}); ${CALLS + WARMUP} calls already open; first quarter ${firstQuarter.toFixed(0)}/s, last quarter ${lastQuarter.toFixed(0)}/s`,
      o
        ? `Worker's own time per webhook (ms - wait_ms from its log lines, ${o.n} sequential webhooks): median ${o.p50} ms, mean ${o.mean.toFixed(2)} ms, p90 ${o.p90} ms, p99 ${o.p99} ms` +
          ` (its wall time median ${w.p50} ms, of which awaiting Dispatcher + origin median ${wt.p50} ms)` +
          (oT ? `; under ${CONCURRENCY} in flight: median ${oT.p50} ms, mean ${oT.mean.toFixed(2)} ms` : "")
        : `Worker's own time per webhook: no log line carried wait_ms (${missingWait} without): the build predates it, run make build`,
      `  includes: route, config, body read, Telnyx Ed25519 verify, envelope parse, JSON to/from the Dispatcher, assertion minting (Ed25519 sign), building the forward and the answer; excludes: the Dispatcher's own work and storage, the origin, the HTTP hop from the client. 1 ms clock resolution per reading.`,
      `CPU per webhook, whole workerd process (utime+stime from /proc, ${CALLS} sequential webhooks, ${CLOCK_TICKS} ticks/s): callfence ${ms(cpu.callfence)}, pass-through ${ms(cpu.passthrough)} (ratio ${(cpu.callfence / cpu.passthrough).toFixed(2)}x)`,
      `Dispatcher time per webhook (its profile, sequential phase; ms sums of Date.now, so means over ${profile.webhook.count} requests):`,
      ...["webhook", "report"]
        .filter((op) => profile[op].count > 0)
        .map((op) => {
          const x = profile[op];
          return `  ${op.padEnd(8)} total ${ms(x.total_ms, 3)} = decode ${ms(x.decode_ms, 3)} + engine, forward building and encode ${ms(x.serve_ms, 3)} (of which SQL ${ms(x.sql_ms, 3)} in ${x.statements.toFixed(1)} statements) + awaiting the origin ${ms(x.origin_ms, 3)} + alarm ${ms(x.arm_ms, 3)} (${x.alarm_api_calls.toFixed(2)} alarm API calls)`;
        }),
      `overload: ${OVERLOAD_CALLS} new calls, ${OVERLOAD_CONCURRENCY} in flight (${overloadSeconds.toFixed(2)} s): ${overload.taken.length} taken (p50 ${ms(summary(overload.taken).p50)}, p99 ${ms(summary(overload.taken).p99)}), ${overload.shed.length} shed with 503 overloaded${overload.shed.length ? ` (p50 ${ms(summary(overload.shed).p50)}, p99 ${ms(summary(overload.shed).p99)})` : ""}`,
      `size: build/index_bg.wasm ${b.wasmRaw} bytes raw (${(b.wasmRaw / 1024).toFixed(0)} KiB), ${b.wasmGzip} bytes gzipped (${(b.wasmGzip / 1024).toFixed(0)} KiB)`,
    ];
    console.log("\n== bench: Worker end to end (local workerd)");
    for (const line of [...conditionLines, "", ...figureLines]) console.log(line);
    if (lines.length < expected) console.log(`note: ${lines.length} of ${expected} log lines were captured`);
    const forwarded = 2 * (WARMUP + CALLS) + THROUGHPUT_CALLS + overload.taken.length;
    if (origin.received < forwarded) {
      throw new Error(`the origin received ${origin.received} requests, expected ${forwarded}`);
    }

    if (process.env.BENCH_README === "1") writeReadme(conditionLines, figureLines);
    if (process.env.BENCH_JSON === "1") {
      const taken = summary(overload.taken);
      console.log(
        JSON.stringify({
          commit: before.commit,
          load_before: before.load,
          load_after: after,
          p50_ms: c.p50,
          p99_ms: c.p99,
          passthrough_p50_ms: p.p50,
          passthrough_p99_ms: p.p99,
          p50_ratio: c.p50 / p.p50,
          p99_ratio: c.p99 / p.p99,
          assignments_per_s: rate,
          worker_ms_median: o ? o.p50 : null,
          worker_ms_mean: o ? o.mean : null,
          cpu_ms_per_webhook: cpu.callfence,
          passthrough_cpu_ms_per_webhook: cpu.passthrough,
          dispatcher: profile,
          overload: {
            calls: OVERLOAD_CALLS,
            concurrency: OVERLOAD_CONCURRENCY,
            taken: overload.taken.length,
            shed: overload.shed.length,
            taken_p50_ms: taken.p50,
            taken_p99_ms: taken.p99,
          },
          wasm_raw_bytes: b.wasmRaw,
          wasm_gzip_bytes: b.wasmGzip,
        }),
      );
    }
  } finally {
    stopBeating();
    await passthrough.dispose();
    await edge.dispose();
    await origin.close();
  }
}

/** Replaces the block between the bench markers in README.md. */
function writeReadme(conditionLines, figureLines) {
  const path = join(ROOT, "README.md");
  const core = process.env.BENCH_CORE_OUTPUT;
  const coreLines = core
    ? readFileSync(core, "utf8")
        .split("\n")
        .map((l) => l.trimEnd())
        .filter((l) => l && !/^\s*(Compiling|Finished|Running|warning)/.test(l))
    : [];
  const text = readFileSync(path, "utf8");
  const start = "<!-- bench:start -->";
  const end = "<!-- bench:end -->";
  const from = text.indexOf(start);
  const to = text.indexOf(end);
  if (from < 0 || to < from) {
    console.log("README.md has no bench markers: not written");
    return;
  }
  const block = [
    start,
    `Latest figures (\`BENCH_README=1 make bench\`, ${new Date().toISOString().slice(0, 10)}):`,
    "",
    "```text",
    ...conditionLines,
    "",
    ...figureLines,
    "```",
    "",
    ...(coreLines.length
      ? ["Core engine, native (`cargo bench -p callfence-core --bench engine`, same run):", "", "```text", ...coreLines, "```", ""]
      : []),
  ].join("\n");
  writeFileSync(path, text.slice(0, from) + block + text.slice(to));
  console.log("README.md: figures written");
}

await main();
