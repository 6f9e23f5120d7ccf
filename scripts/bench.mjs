#!/usr/bin/env node
// `make bench`, the Worker half: end-to-end figures on local workerd
// (Miniflare's Node API on the prebuilt build-testing/, as tests/e2e/harness.mjs runs
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
//  7. the build's sizes;
//  8. per-webhook CPU with real resolution: /proc/<pid>/task/*/schedstat
//     (ns on CPU, every thread) read at each request's start, so each
//     sequential webhook gets its own reading and a median means something;
//  9. the Worker's own CPU per webhook: the real Worker in front of a
//     stand-in Dispatcher that answers at once, minus a JavaScript Worker
//     making the same hop to the same stand-in (each in its own workerd,
//     interleaved ABBA, schedstat per request);
// 10. the Dispatcher on its own, driven from a driver Worker in the same
//     workerd (CONCURRENCY in flight): full assignments (`webhook`), the
//     same assignments' SQL writes alone (`writes_only`, under the test-only
//     CALLFENCE_TEST_WRITES_ONLY: the same 8 writes in the same 2 commits,
//     no reads, no decision, no forward), and `ping`; and the ratios of the
//     assignment rates to the writes-only rate.
//
// 11. the floor under the Worker's own CPU: the per-webhook cryptography and
//     parsing alone in wasm (examples/wasm_crypto.rs, built by
//     scripts/bench.sh under the Worker's release profile into the file
//     BENCH_WASM_CRYPTO names, run in Node's V8): the Telnyx signature check
//     and envelope parse the Worker makes, and the assertion the Dispatcher
//     mints, per call.
// 12. the contract's floor: a JavaScript Worker and SQLite Durable Object
//     doing only the steps the contract requires (signature check, one
//     Durable Object round trip, ownership committed before the forward, a
//     signed assertion, the forward, the outcome committed before the
//     answer), the cheapest way the runtime offers (FLOOR below), in the
//     sequential loop beside callfence and the pass-through: its latency
//     and its CPU per webhook bound what any implementation can reach here.
// 13. call shards (SPEC §16, shardFigures): one call shard against eight,
//     two nodes of max_calls 50, whole calls (initiated, answered, hangup):
//     latency and CPU per call.initiated (ABBA), then a steady run on each
//     with every object's profile (requests and busy time per webhook, the
//     directory's apart), and the projection to 32 shards from those busy
//     times (project).
//
// BENCH_CROSSINGS=1 also counts the calls from the wasm into JavaScript
// (wasm-bindgen's imports: runtime APIs, the SQL helper, Date.now, glue)
// per sequential webhook, by import, on a counting copy of the build.
// BENCH_PERF=<file> also samples the callfence workerd with `perf record`
// (cpu-clock) over the sequential phase and prints its CPU by kind of code
// (JIT code, V8 runtime and compilers, SQLite, kernel, kj I/O, ...).
// BENCH_STORAGE=shm keeps the Durable Object's SQLite files on tmpfs, where
// fsync is free (the default is the disk, like the tests).
//
// The origin verifies nothing and answers 200 {"ok":true}. Every answer is
// checked (callfence: 200 with delivered_to; pass-through: 200), and the run
// fails if any is not, so a figure never describes error paths.
//
// Knobs (environment): BENCH_WARMUP (30), BENCH_CALLS (300),
// BENCH_THROUGHPUT_CALLS (1000), BENCH_CONCURRENCY (8),
// BENCH_FORWARD_TIMEOUT_MS (1500), BENCH_OVERLOAD_CALLS (600),
// BENCH_OVERLOAD_CONCURRENCY (32), BENCH_FLOOR_COMMITS (2),
// BENCH_FLOOR_EXTRA_SQL (0), BENCH_SHARDS_CONCURRENCY (16), BENCH_STEADY_CALLS
// (1500). BENCH_ONLY=shards runs the call-shard figures (13) alone. BENCH_ONLY=metrics measures what the edge's
// metrics cost (statements per webhook, a scrape's messages, statements and
// CPU; BENCH_SCRAPES, BENCH_BUILD). BENCH_ONLY=overload runs the overload phase
// alone (after BENCH_WARMUP sequential calls), for a machine others share;
// its figures include every answer's p99.9 and max, client side and from
// the Worker's log lines. BENCH_DOCS=1 also writes the figures
// into docs/performance.md between the bench markers; BENCH_JSON=1 prints, as the last
// line, one JSON object with every figure (p50_ratio, p99_ratio,
// assignments_per_s, worker_ms_median, cpu_ms_per_webhook, wasm_gzip_bytes,
// ...), so runs can be compared.

import { Miniflare } from "miniflare";
import { execFileSync, spawn, spawnSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import os from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { gzipSync } from "node:zlib";
import { crateOf, displayName, readWasm, sections } from "./wasm-sections.mjs";
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
// BENCH_FLOOR_COMMITS=1: the floor (FLOOR) leaves out the outcome's write,
// so its answer waits on one commit, not two: the latency a design that
// answers before the outcome is durable (the report deferred) could reach.
const FLOOR_COMMITS = process.env.BENCH_FLOOR_COMMITS === "1" ? 1 : 2;
// BENCH_FLOOR_EXTRA_SQL=N: the floor runs N more statements in its first
// unit (point reads and counter upserts, in turn), which prices a
// statement count alone: callfence makes 13 per new call, the floor 2.
const FLOOR_EXTRA_SQL = Number.parseInt(process.env.BENCH_FLOOR_EXTRA_SQL ?? "", 10) || 0;
// BENCH_STORAGE=shm: the Durable Object's SQLite directory on tmpfs
// (/dev/shm), where fsync costs nothing, instead of the disk (the default,
// as the e2e tests and `make dev` run it). Miniflare without a persist
// directory still keeps SQLite Durable Objects in files on disk.
const STORAGE = process.env.BENCH_STORAGE === "shm" ? "shm" : "disk";
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

/**
 * CPU time of every thread of `pid` so far, in ns, from the scheduler's
 * own accounting (/proc/<pid>/task/<tid>/schedstat: time on CPU in ns): a
 * per-request reading with real resolution, where utime/stime count 10 ms
 * ticks.
 */
function cpuNs(pid) {
  let total = 0;
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    try {
      total += Number(readFileSync(`/proc/${pid}/task/${tid}/schedstat`, "utf8").split(" ")[0]);
    } catch {
      // the thread ended meanwhile
    }
  }
  return total;
}

/**
 * Per-request CPU of a process: the CPU it spent from one request's start
 * to the next one's (so work left after an answer, a log line, a waitUntil,
 * counts too), in ms.
 */
class CpuPerRequest {
  constructor(pid) {
    this.pid = pid;
    this.samples = [];
    this.last = null;
  }
  /** Marks the start of a request (and so the end of the previous one). */
  mark(keep = true) {
    const now = cpuNs(this.pid);
    if (this.last !== null && this.keep) this.samples.push((now - this.last) / 1e6);
    this.last = now;
    this.keep = keep;
  }
}

// ------------------------------------------------------------------ perf ----

/**
 * BENCH_PERF=<file>: samples the callfence workerd process with `perf
 * record` (software cpu-clock, so it works in a VM without hardware
 * counters) over the sequential phase. Returns a stop function that
 * resolves to the samples grouped by where they ran.
 */
function startPerf(pid, file) {
  const child = spawn("perf", ["record", "-e", "cpu-clock", "-F", "4000", "-p", String(pid), "-o", file], { stdio: "ignore" });
  return async () => {
    child.kill("SIGINT");
    await new Promise((resolve) => child.on("exit", resolve));
    const report = execFileSync("perf", ["report", "-i", file, "--stdio", "--sort", "dso,sym", "--percent-limit", "0"], {
      encoding: "utf8",
      maxBuffer: 1 << 28,
      stdio: ["ignore", "pipe", "ignore"],
    });
    return perfGroups(report);
  };
}

/**
 * The wasm function names for `wasm-function[N]` in the perf map: the
 * named copy scripts/build.sh keeps (target/wasm-size/index_bg.named.wasm),
 * used only when its code is byte for byte the shipped build's; else null.
 */
function wasmNames() {
  const code = (bytes) => {
    for (const s of sections(bytes)) if (s.id === 10) return bytes.subarray(s.body, s.end);
    return null;
  };
  try {
    const named = readFileSync(join(ROOT, "target/wasm-size/index_bg.named.wasm"));
    const shipped = readFileSync(join(ROOT, "build/index_bg.wasm"));
    if (Buffer.compare(code(named), code(shipped)) !== 0) return null;
    return readWasm(named).names;
  } catch {
    return null;
  }
}

/** A wasm function's share goes to its crate's group. */
function wasmGroup(crate) {
  if (/^(curve25519_dalek|ed25519_dalek|ed25519|sha2|signature|digest|subtle|block_buffer)$/.test(crate)) return "wasm: Ed25519 and SHA-2 (verify, sign)";
  if (/^(callfence|callfence_core|js_sys)$/.test(crate)) return "wasm: callfence's own code (js_sys: its async bodies)";
  if (/^(serde|serde_core|serde_json|zmij|itoa|ryu)$/.test(crate)) return "wasm: serde and serde_json";
  if (/^(dlmalloc|__rustc|__rdl_alloc|__rdl_dealloc|__rdl_realloc)$/.test(crate)) return "wasm: allocator";
  return "wasm: Rust core/alloc/std, worker and wasm-bindgen glue";
}

/** perf report lines -> percent per kind of code, and the top symbols. */
function perfGroups(report) {
  const names = wasmNames();
  const groups = new Map();
  const top = [];
  let liftoff = 0;
  for (const line of report.split("\n")) {
    const m = line.match(/^\s+([\d.]+)%\s+(\[JIT\] tid \d+|\S+)\s+\[(.)\]\s+(.*)$/);
    if (!m) continue;
    const [, pct, dso, kind, rawSym] = m;
    let sym = rawSym;
    const p = Number(pct);
    const wasm = sym.match(/wasm-function\[(\d+)\]-\d+-(\w+)/);
    let group;
    if (wasm && names) {
      const name = displayName(names.get(Number(wasm[1])) ?? `func[${wasm[1]}]`);
      if (wasm[2] === "liftoff") liftoff += p;
      group = wasmGroup(crateOf(name));
      sym = `wasm ${wasm[2]} ${name}`;
    } else if (wasm) group = "wasm (no names: target/wasm-size is not this build)";
    else if (kind === "k") group = "kernel (syscalls: sockets, files, scheduling)";
    else if (/^(sqlite3|pcache|btree|vdbe|wal|pager|unixSync|unixWrite|unixRead)/i.test(sym)) group = "SQLite";
    else if (/tcmalloc|^TCMalloc|^operator (new|delete)/.test(sym)) group = "malloc (tcmalloc)";
    else if (dso.startsWith("[JIT]") && /^JS:/.test(sym)) group = "JIT code (JavaScript: glue, helpers, Miniflare's)";
    else if (dso.startsWith("[JIT]") || dso === "[unknown]" || /^perf-\d+\.map$/.test(dso)) group = "JIT code (unnamed)";
    else if (/^Builtins_/.test(sym)) group = "V8 builtins (JS/wasm runtime stubs, JSON, strings)";
    else if (/v8::internal::(Heap|Scavenger|MarkCompact|Mark|Sweeper|Concurrent|Minor|GC)|cppgc/.test(sym)) group = "V8 garbage collection";
    else if (/v8::internal::(compiler|wasm::|maglev|baseline|Turbo|Liftoff)/.test(sym) || /Compile/.test(sym)) group = "V8 compilers";
    else if (/v8::|Runtime_|v8_inspector/.test(sym)) group = "V8 runtime (other)";
    else if (/^(kj|capnp)::/.test(sym)) group = "kj/capnp (I/O, RPC)";
    else if (/^workerd::/.test(sym)) group = "workerd (bindings, HTTP, actors)";
    else if (dso.startsWith("libc") || dso.startsWith("ld-")) group = "libc (memcpy, memset, locks)";
    else group = "other native";
    groups.set(group, (groups.get(group) ?? 0) + p);
    top.push({ p, where: (wasm && names ? sym : `${dso} ${sym}`).slice(0, 120) });
  }
  top.sort((a, b) => b.p - a.p);
  return { groups: [...groups.entries()].sort((a, b) => b[1] - a[1]), top: top.slice(0, 15), liftoff, named: names !== null };
}

/**
 * BENCH_PERF needs V8's perf map to name JIT code: the first run starts
 * itself again with scripts/v8-flags.cjs preloaded and
 * `--perf-basic-prof` for workerd, removes the maps afterwards, and exits
 * with the child's status; otherwise (no BENCH_PERF, or already the child)
 * it returns and this process runs the bench.
 */
function profiledRun() {
  if (!process.env.BENCH_PERF || process.env.CALLFENCE_V8_FLAGS) return;
  const maps = () => new Set(readdirSync("/tmp").filter((f) => /^perf-\d+\.map$/.test(f)));
  const before = maps();
  const child = spawnSync(process.execPath, ["--require", join(ROOT, "scripts/v8-flags.cjs"), ...process.argv.slice(1)], {
    stdio: "inherit",
    env: { ...process.env, CALLFENCE_V8_FLAGS: "--perf-basic-prof" },
  });
  // The maps this run's workerd processes wrote (about 1 MB each).
  for (const f of maps()) if (!before.has(f)) rmSync(join("/tmp", f), { force: true });
  process.exit(child.status ?? 1);
}

// -------------------------------------------------------------- profile ----

/** The Dispatcher's profile (src/dispatcher/profile.rs), straight from the DO. */
async function dispatcherProfile(edge, name = "global") {
  const stub = await edge.dispatcher(name);
  const res = await stub.fetch(`https://${name}/profile`, { method: "POST", body: '{"v":2,"op":"profile"}\n' });
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
async function setUpCallfence(edge, origin, node, { more = [], maxCalls = 10000 } = {}) {
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
  const nodes = [[NODE, node], ...more];
  const entry = (keypair) => ({
    role: "stable",
    origin_url: origin.url,
    keys: { [KID]: keypair.publicKey },
    fallback_approved: false,
    admin_drained: false,
    max_calls: maxCalls,
  });
  await put("nodes", { schema: "callfence_nodes_v1", nodes: Object.fromEntries(nodes.map(([id, keypair]) => [id, entry(keypair)])) });
  // Every node but the default prefers the line LINES names for it.
  const byLine = Object.fromEntries(more.map(([id]) => [`line_${id.toLowerCase()}`, { called_number: LINES[id], preferred_node: id, fallback_node: NODE }]));
  await put("policy", { schema: "riff_node_routing_policy_v1", default_node: NODE, by_line: byLine, by_caller: {} });
  // Each node serves the policy's lines, as its agent would report them.
  const lines = Object.fromEntries(Object.entries(byLine).map(([id, line]) => [id, line.called_number]));
  const routingHash = sha256Hex(Object.keys(lines).sort().map((id) => `${id}=${lines[id]}\n`).join(""));

  let seq = 0;
  const beat = async ([id, keypair]) => {
    seq = Math.max(seq + 1, Date.now());
    const body = JSON.stringify({
      schema: "callfence_heartbeat_v1",
      node: id,
      seq,
      sent_at: new Date().toISOString(),
      valid_for_s: 30,
      mode: "active",
      sha: "9b4082d1c0ffee00112233445566778899aabbcc",
      dirty: false,
      app_ready: true,
      capacity: { max_calls: maxCalls, active_calls: 0 },
      tunnel_up: true,
      origin_url: origin.url,
      lines,
      routing_hash: routingHash,
      agent_version: "bench",
    });
    const url = new URL("/v1/nodes/heartbeat", edge.url);
    const headers = nodeHeaders({ url, body, node: id, kid: KID, privateKey: keypair.privateKeyObject });
    return read(await edge.fetch(url.pathname, { method: "POST", headers, body }));
  };
  // The Worker's key copy refreshes on an unknown key at most once a second.
  const deadline = Date.now() + 10_000;
  for (const n of nodes) {
    for (;;) {
      const res = await beat(n);
      if (res.status === 200 && res.body.eligible === true) break;
      if (Date.now() > deadline) throw new Error(`heartbeat ${n[0]}: ${res.status} ${JSON.stringify(res.body)}`);
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
  }
  // valid_for_s is at most 30: keep the nodes eligible through the run.
  const timer = setInterval(() => nodes.forEach((n) => beat(n).catch(() => {})), 10_000);
  timer.unref();
  return () => clearInterval(timer);
}

/** The called number of each node's line, for the nodes beside NODE (the default). */
const LINES = { M2: "+14155550188" };

/** A signed call.initiated webhook for a new, distinct inbound call. */
function newCall(keys, tag, i) {
  return callEvent(keys, `bench-${RUN}-${tag}-${i}`);
}

/** A signed webhook of `type` for the inbound call `session`, to the number `to`. */
function callEvent(keys, session, type = "call.initiated", to = "+14155550199") {
  const id = randomUUID();
  const body = JSON.stringify({
    data: {
      record_type: "event",
      id,
      event_type: type,
      occurred_at: new Date().toISOString(),
      payload: {
        call_control_id: `v3:${session}`,
        call_leg_id: `leg-${session}`,
        call_session_id: session,
        connection_id: "bench",
        from: "+14155550100",
        to,
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
/** An answer check for `who`: 200 with this call's delivery to NODE. */
function deliveredBy(who) {
  return (status, text, call) => {
    let body = null;
    try {
      body = JSON.parse(text);
    } catch {
      // reported below
    }
    if (status !== 200 || body?.delivered_to !== NODE || body?.event_id !== call.id) {
      failures.push(`${who}: ${status} ${text.slice(0, 200)}`);
    }
  };
}
const checkCallfence = deliveredBy("callfence");
const checkFloor = deliveredBy("floor");
function checkPassthrough(status, text) {
  if (status !== 200 || text !== '{"ok":true}') failures.push(`pass-through: ${status} ${text.slice(0, 200)}`);
}

// ---------------------------------------------------------- worker only ----

// A stand-in Dispatcher that does nothing: it reads the message's head and
// answers "delivered" at once (no storage, no forward).
const STAND_IN = `
export class Dispatcher {
  async fetch(request) {
    const bytes = new Uint8Array(await request.arrayBuffer());
    const nl = bytes.indexOf(10);
    const head = JSON.parse(new TextDecoder().decode(nl < 0 ? bytes : bytes.subarray(0, nl)));
    const event_id = head.envelope ? head.envelope.event_id : "";
    return new Response(JSON.stringify({ v: 2, ok: true, answer: { delivered_to: "${NODE}", epoch: 1, event_id } }));
  }
}
export default { fetch() { return new Response("stand-in"); } };
`;

// A JavaScript Worker that makes the same hop with none of the Worker's own
// work: it reads the body, sends the stand-in a message of the same shape
// (head line with the envelope fields, then the raw body) and relays its
// answer. Its CPU per webhook is the floor under the real Worker's in front
// of the same stand-in: the difference is the real Worker's own code.
const HOP_ONLY = `
const CARRIED = ["content-type", "telnyx-signature-ed25519", "telnyx-timestamp"];
export default {
  async fetch(request, env) {
    const received_at_ms = Date.now();
    const body = await request.text();
    const data = JSON.parse(body).data;
    const p = data.payload;
    const headers = CARRIED.map((n) => [n, request.headers.get(n)]).filter(([, v]) => v !== null);
    const envelope = { event_id: data.id, event_type: data.event_type, call_session_id: p.call_session_id, creator_call_session_id: null,
      call_control_id: p.call_control_id, from: p.from, to: p.to, direction: p.direction, connection_id: p.connection_id };
    const head = JSON.stringify({ v: 2, op: "webhook", envelope, headers, received_at_ms });
    const stub = env.DISPATCHER.get(env.DISPATCHER.idFromName("global"));
    const answer = await stub.fetch("https://dispatcher/webhook", { method: "POST", body: head + "\\n" + body });
    const reply = await answer.json();
    return new Response(JSON.stringify(reply.answer), { status: 200, headers: { "content-type": "application/json" } });
  },
};
`;

/**
 * The Worker's own CPU per webhook: the real Worker in front of the
 * stand-in Dispatcher against the hop-only JavaScript Worker in front of
 * the same stand-in, each in its own workerd, interleaved ABBA, CPU per
 * request from schedstat. Returns both sample lists (ms).
 */
async function workerOnly(keys, compatibilityDate) {
  const { result: worker, pid: workerPid } = await newWorkerd(() =>
    startEdge({ keys, bindings: { ...bindingsFor(keys), FORWARD_TIMEOUT_MS: String(FORWARD_TIMEOUT_MS) }, dispatcherScript: STAND_IN }),
  );
  let hop;
  const { result: hopUrl, pid: hopPid } = await newWorkerd(() => {
    hop = new Miniflare({
      host: "127.0.0.1",
      port: 0,
      cf: false,
      workers: [
        {
          name: "hop-only",
          modules: true,
          script: HOP_ONLY,
          compatibilityDate,
          durableObjects: { DISPATCHER: { className: "Dispatcher", scriptName: "stand-in" } },
        },
        { name: "stand-in", modules: true, script: STAND_IN, compatibilityDate },
      ],
    });
    return hop.ready;
  });
  try {
    const real = new CpuPerRequest(workerPid);
    const floor = new CpuPerRequest(hopPid);
    const check = (who) => (status, text, call) => {
      let body = null;
      try {
        body = JSON.parse(text);
      } catch {
        // reported below
      }
      if (status !== 200 || body?.event_id !== call.id) failures.push(`${who}: ${status} ${text.slice(0, 200)}`);
    };
    for (let i = 0; i < WARMUP + CALLS; i += 1) {
      const measured = i >= WARMUP;
      const a = newCall(keys, "wo", i);
      const b = newCall(keys, "hop", i);
      const runReal = () => {
        real.mark(measured);
        return timed(worker.url, a, check("worker only"));
      };
      const runFloor = () => {
        floor.mark(measured);
        return timed(hopUrl, b, check("hop only"));
      };
      if (i % 2 === 0) {
        await runReal();
        await runFloor();
      } else {
        await runFloor();
        await runReal();
      }
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
    real.mark(false);
    floor.mark(false);
    return { real: real.samples, floor: floor.samples };
  } finally {
    await hop.dispose();
    await worker.dispose();
  }
}

// The contract's floor in the runtime's own terms: a JavaScript Worker and
// a JavaScript SQLite Durable Object doing the steps callfence's contract
// requires and nothing else, each the cheapest way the runtime offers. The
// Worker checks the Telnyx signature (WebCrypto Ed25519, native code) and
// the timestamp, parses the envelope and makes one Durable Object round
// trip with the head line and the raw body; the Durable Object makes the
// ownership durable before the forward (one INSERT, committed: the forward
// waits on the output gate), signs an assertion (SHA-256 of the body,
// WebCrypto Ed25519), forwards the body to the origin, makes the outcome
// durable before the answer (one UPDATE; left out with
// BENCH_FLOOR_COMMITS=1) and answers. No policy, no
// registry, no heartbeat, no fence, no dedup beyond the primary key, no
// alarm, no log line: a lower bound for any implementation of the
// contract on this runtime, measured beside callfence in the same loop.
const FLOOR = `
const encoder = new TextEncoder();
const decoder = new TextDecoder();
const b64 = (s) => Uint8Array.from(atob(s), (c) => c.charCodeAt(0));
const hex = (buf) => [...new Uint8Array(buf)].map((x) => x.toString(16).padStart(2, "0")).join("");
let telnyxKey = null;
let signingKey = null;
export class Dispatcher {
  constructor(state, env) {
    this.storage = state.storage;
    this.env = env;
    this.storage.sql.exec("CREATE TABLE IF NOT EXISTS calls (session TEXT PRIMARY KEY, event_id TEXT NOT NULL, node TEXT NOT NULL, epoch INTEGER NOT NULL, state TEXT NOT NULL, status INTEGER)");
    this.storage.sql.exec("CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)");
    this.extra = Number(env.EXTRA_SQL);
  }
  async fetch(request) {
    const bytes = new Uint8Array(await request.arrayBuffer());
    const nl = bytes.indexOf(10);
    const head = JSON.parse(decoder.decode(bytes.subarray(0, nl)));
    const body = bytes.subarray(nl + 1);
    const e = head.envelope;
    const epoch = this.storage.transactionSync(() => {
      for (let i = 0; i < this.extra; i++) {
        if (i % 2) this.storage.sql.exec("SELECT epoch FROM calls WHERE session = ?", e.call_session_id).toArray();
        else this.storage.sql.exec("INSERT INTO counters (name, value) VALUES (?, 1) ON CONFLICT (name) DO UPDATE SET value = value + 1 RETURNING value", "c" + i).one();
      }
      return this.storage.sql.exec("INSERT INTO calls (session, event_id, node, epoch, state) VALUES (?, ?, ?, 1, 'assigned') RETURNING epoch",
        e.call_session_id, e.event_id, "${NODE}").one().epoch;
    });
    signingKey ??= (await crypto.subtle.generateKey({ name: "Ed25519" }, false, ["sign", "verify"])).privateKey;
    const digest = hex(await crypto.subtle.digest("SHA-256", body));
    const assertion = JSON.stringify({ node: "${NODE}", call_session_id: e.call_session_id, event_id: e.event_id, epoch, body_sha256: digest, iat: Date.now() });
    const signature = btoa(String.fromCharCode(...new Uint8Array(await crypto.subtle.sign("Ed25519", signingKey, encoder.encode(assertion)))));
    const res = await fetch(this.env.ORIGIN_URL, { method: "POST", body, redirect: "manual",
      headers: { "content-type": "application/json", "x-assertion": btoa(assertion), "x-assertion-signature": signature } });
    await res.text();
    if (this.env.COMMITS !== "1") this.storage.sql.exec("UPDATE calls SET state = 'delivered', status = ? WHERE session = ?", res.status, e.call_session_id);
    return new Response(JSON.stringify({ v: 2, ok: true, answer: { delivered_to: "${NODE}", epoch, event_id: e.event_id } }));
  }
}
export default {
  async fetch(request, env) {
    const received_at_ms = Date.now();
    const body = new Uint8Array(await request.arrayBuffer());
    const timestamp = request.headers.get("telnyx-timestamp") ?? "";
    const signature = request.headers.get("telnyx-signature-ed25519") ?? "";
    if (Math.abs(received_at_ms / 1000 - Number(timestamp)) > 300) return new Response("stale", { status: 401 });
    telnyxKey ??= await crypto.subtle.importKey("raw", b64(env.TELNYX_PUBLIC_KEY), { name: "Ed25519" }, false, ["verify"]);
    const signed = new Uint8Array([...encoder.encode(timestamp + "|"), ...body]);
    if (!(await crypto.subtle.verify("Ed25519", telnyxKey, b64(signature), signed))) return new Response("bad signature", { status: 401 });
    const data = JSON.parse(decoder.decode(body)).data;
    const p = data.payload;
    const envelope = { event_id: data.id, event_type: data.event_type, call_session_id: p.call_session_id, call_control_id: p.call_control_id,
      from: p.from, to: p.to, direction: p.direction, connection_id: p.connection_id };
    const head = encoder.encode(JSON.stringify({ v: 2, op: "webhook", envelope, received_at_ms }) + "\\n");
    const message = new Uint8Array(head.length + body.length);
    message.set(head);
    message.set(body, head.length);
    const stub = env.DISPATCHER.get(env.DISPATCHER.idFromName("global"));
    const answer = await (await stub.fetch("https://dispatcher/webhook", { method: "POST", body: message })).json();
    return new Response(JSON.stringify(answer.answer), { status: 200, headers: { "content-type": "application/json" } });
  },
};
`;

/** The contract's floor (FLOOR) in its own workerd, storage on `dir`. */
function startFloor(keys, origin, compatibilityDate, dir) {
  const floor = new Miniflare({
    host: "127.0.0.1",
    port: 0,
    cf: false,
    modules: true,
    script: FLOOR,
    compatibilityDate,
    bindings: { ORIGIN_URL: origin.url, TELNYX_PUBLIC_KEY: keys.telnyx.publicKey, COMMITS: String(FLOOR_COMMITS), EXTRA_SQL: String(FLOOR_EXTRA_SQL) },
    durableObjects: { DISPATCHER: { className: "Dispatcher", useSQLite: true } },
    durableObjectsPersist: dir,
  });
  return floor.ready.then((url) => ({ url, dispose: () => floor.dispose() }));
}

// A driver Worker beside the real one, bound to the same Dispatcher: it
// sends the Dispatcher `n` protocol messages with `c` in flight from inside
// workerd (a Durable Object stub from Node costs more than the Dispatcher's
// own work) and answers how many were not `ok`.
const DRIVER = `
export default {
  async fetch(request, env) {
    const { op, n, c, prefix, node, origin_url, body } = await request.json();
    const stub = env.DISPATCHER.get(env.DISPATCHER.idFromName("global"));
    const message = (i) => {
      const id = prefix + "-" + i;
      if (op === "writes_only") return JSON.stringify({ v: 2, op, id, node, origin_url }) + "\\n" + body;
      if (op === "webhook") {
        const text = body.replaceAll("SESSION", id);
        const envelope = { event_id: id, event_type: "call.initiated", call_session_id: id, creator_call_session_id: null,
          call_control_id: "v3:" + id, from: "+14155550100", to: "+14155550199", direction: "incoming", connection_id: "bench" };
        return JSON.stringify({ v: 2, op, envelope, headers: [["content-type", "application/json"]], received_at_ms: Date.now() }) + "\\n" + text;
      }
      return JSON.stringify({ v: 2, op }) + "\\n";
    };
    let next = 0;
    let shed = 0;
    const bad = [];
    await Promise.all(Array.from({ length: c }, async () => {
      while (next < n) {
        const i = next;
        next += 1;
        const res = await stub.fetch("https://dispatcher/" + op, { method: "POST", body: message(i) });
        const text = await res.text();
        if (text.includes('"error":"overloaded"')) shed += 1;
        else if (res.status !== 200 || !text.includes('"ok":true')) bad.push(res.status + " " + text.slice(0, 160));
      }
    }));
    return Response.json({ failed: bad.length, first: bad[0] ?? null, shed });
  },
};
`;

/**
 * The Dispatcher on its own, THROUGHPUT_CALLS messages each with
 * CONCURRENCY in flight from the driver Worker: full assignments (the
 * `webhook` message: decision, forward to the origin, report), the same
 * assignments' writes only (the bench-only `writes_only` message,
 * core/src/shard/writes_only.rs), and `ping` (the request hop alone).
 * Returns each rate per second (null for writes_only on a build without it).
 */
async function dispatcherOnly(edge, origin) {
  const driver = await edge.worker("driver");
  const body = newCall(edge.keys, "x", 0).body.replace(/bench-[^"]*-x-0/g, "SESSION");
  const rate = async (op) => {
    const started = performance.now();
    const res = await driver.fetch("http://driver/", {
      method: "POST",
      body: JSON.stringify({ op, n: THROUGHPUT_CALLS, c: CONCURRENCY, prefix: `bench-${RUN}-${op}`, node: NODE, origin_url: origin.url, body }),
    });
    const seconds = (performance.now() - started) / 1000;
    const result = await res.json();
    // A build that predates writes_only answers unknown_op: no figure.
    if (op === "writes_only" && result.failed > 0 && String(result.first).includes("unknown_op")) return null;
    if (result.failed > 0) failures.push(`driver ${op}: ${result.failed} not ok, first: ${result.first}`);
    shedByDriver[op] = result.shed;
    return (THROUGHPUT_CALLS - result.shed) / seconds;
  };
  const shedByDriver = {};
  const webhook = await rate("webhook");
  const writes = await rate("writes_only");
  const ping = await rate("ping");
  return { webhook, writes, ping, shed: shedByDriver.webhook };
}

// ------------------------------------------------------------ crossings ----

// The import object worker-build's index.js hands the wasm, and the
// Worker's fetch entry: a counting copy wraps the first and answers the
// counts at `/__crossings` from the second. Both are matched exactly, so a
// worker-build whose output differs fails here instead of counting nothing.
const IMPORTS = "new WebAssembly.Instance(ee,re())";
const ENTRY = "L.prototype.fetch=function(e){return ne.call(this,e,this.env,this.ctx)}";
const COUNTING = `
globalThis.__crossings = { total: 0, by: {} };
function __countImports(object) {
  const imports = object["./index_bg.js"];
  for (const name of Object.keys(imports)) {
    const f = imports[name];
    if (typeof f !== "function") continue;
    const key = name.replace(/_[0-9a-f]{16}$/, "");
    imports[name] = function (...args) {
      const c = globalThis.__crossings;
      c.total += 1;
      c.by[key] = (c.by[key] ?? 0) + 1;
      return f.apply(this, args);
    };
  }
  return object;
}
`;

/** A copy of build-testing/ (what the bench runs) whose wasm imports count their calls; its directory. */
function countingBuild() {
  const dir = join(ROOT, "target/bench-crossings");
  mkdirSync(dir, { recursive: true });
  copyFileSync(join(ROOT, "build-testing/index_bg.wasm"), join(dir, "index_bg.wasm"));
  let js = readFileSync(join(ROOT, "build-testing/index.js"), "utf8");
  for (const needle of [IMPORTS, ENTRY]) {
    if (!js.includes(needle)) throw new Error(`BENCH_CROSSINGS: build-testing/index.js has no \`${needle}\` (worker-build's output changed)`);
  }
  js = js.replaceAll(IMPORTS, "new WebAssembly.Instance(ee,__countImports(re()))");
  js = js.replace(
    ENTRY,
    "L.prototype.fetch=function(e){if(new URL(e.url).pathname==='/__crossings'){const r=Response.json(globalThis.__crossings);globalThis.__crossings={total:0,by:{}};return r}return ne.call(this,e,this.env,this.ctx)}",
  );
  writeFileSync(join(dir, "index.js"), `${COUNTING}\n${js}`);
  return dir;
}

/**
 * BENCH_CROSSINGS=1: the counting copy in its own workerd, set up like the
 * bench's, WARMUP then CALLS sequential new calls; the calls from the wasm
 * into JavaScript per webhook (Worker and Dispatcher together), by import.
 */
async function crossings(keys, origin) {
  const edge = await startEdge({ keys, bindings: { ...bindingsFor(keys), FORWARD_TIMEOUT_MS: String(FORWARD_TIMEOUT_MS) }, build: countingBuild() });
  const stopBeating = await setUpCallfence(edge, origin, ed25519());
  const counts = async () => (await fetch(new URL("/__crossings", edge.url))).json();
  try {
    for (let i = 0; i < WARMUP; i += 1) await timed(edge.url, newCall(keys, "xw", i), checkCallfence);
    await counts();
    for (let i = 0; i < CALLS; i += 1) await timed(edge.url, newCall(keys, "x", i), checkCallfence);
    const { total, by } = await counts();
    return { perWebhook: total / CALLS, by: Object.entries(by).map(([name, n]) => [name, n / CALLS]).sort((a, b) => b[1] - a[1]) };
  } finally {
    stopBeating();
    await edge.dispose();
  }
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

// ------------------------------------------------------------ wasm floor ----

/**
 * Microseconds per step of examples/wasm_crypto.rs (0 verify, 1 mint, 2
 * parse): the median of 15 batches of 100 after 300 warm-up calls; null
 * without BENCH_WASM_CRYPTO. Every call must succeed, so a step that fails
 * cannot pass for a fast one.
 */
function wasmFloor() {
  const file = process.env.BENCH_WASM_CRYPTO;
  if (!file) return null;
  const module = new WebAssembly.Module(readFileSync(file));
  // The module links wasm-bindgen's imports without calling them.
  const imports = {};
  for (const { module: from, name } of WebAssembly.Module.imports(module)) {
    (imports[from] ??= {})[name] = () => {
      throw new Error(`wasm_crypto called ${from}.${name}`);
    };
  }
  const { run } = new WebAssembly.Instance(module, imports).exports;
  const micros = (step) => {
    if (run(step, 300) !== 300) throw new Error(`wasm_crypto step ${step} failed`);
    const batches = [];
    for (let i = 0; i < 15; i++) {
      const t = process.hrtime.bigint();
      if (run(step, 100) !== 100) throw new Error(`wasm_crypto step ${step} failed`);
      batches.push(Number(process.hrtime.bigint() - t) / 100 / 1000);
    }
    return batches.sort((a, b) => a - b)[7];
  };
  return { verify: micros(0), mint: micros(1), parse: micros(2), v8: process.versions.v8 };
}

// -------------------------------------------------------------- the run ----

async function main() {
  const before = conditions();
  const floor = wasmFloor();
  const origin = await startPlainOrigin();
  const keys = testKeys();
  const node = ed25519();
  const shmDir = STORAGE === "shm" ? mkdtempSync("/dev/shm/callfence-bench-") : undefined;
  const { result: edge, pid: edgePid } = await newWorkerd(() =>
    startEdge({
      keys,
      // CALLFENCE_TEST_WRITES_ONLY: the bench-only writes_only message (test-only, never in a deployment).
      bindings: { ...bindingsFor(keys), FORWARD_TIMEOUT_MS: String(FORWARD_TIMEOUT_MS), CALLFENCE_TEST_WRITES_ONLY: "1" },
      driverScript: DRIVER,
      dir: shmDir,
    }),
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
  const floorDir = mkdtempSync(join(shmDir ? "/dev/shm" : os.tmpdir(), "callfence-floor-"));
  const { result: floorRun, pid: floorPid } = await newWorkerd(() => startFloor(keys, origin, before.compatibilityDate, floorDir));
  let stopBeating = () => {};
  try {
    stopBeating = await setUpCallfence(edge, origin, node);

    // 1. Sequential latency, interleaved ABBA.
    const phase = new Map(); // event id -> "latency" | "throughput"
    const cf = [];
    const pt = [];
    const fl = [];
    const total = WARMUP + CALLS;
    const cfCpu = new CpuPerRequest(edgePid);
    const ptCpu = new CpuPerRequest(passthroughPid);
    const flCpu = new CpuPerRequest(floorPid);
    const started1 = performance.now();
    let cpu0 = null;
    let stopPerf = null;
    let profile0 = null;
    for (let i = 0; i < total; i += 1) {
      if (i === WARMUP) {
        profile0 = await dispatcherProfile(edge);
        cpu0 = { edge: cpuMs(edgePid), passthrough: cpuMs(passthroughPid), floor: cpuMs(floorPid) };
        if (process.env.BENCH_PERF) stopPerf = startPerf(edgePid, process.env.BENCH_PERF);
      }
      const a = newCall(keys, "seq", i);
      const b = newCall(keys, "pt", i);
      const f = newCall(keys, "fl", i);
      const measured = i >= WARMUP;
      const runCf = () => {
        cfCpu.mark(measured);
        return timed(edge.url, a, checkCallfence);
      };
      const runPt = () => {
        ptCpu.mark(measured);
        return timed(passthroughUrl, b, checkPassthrough);
      };
      const runFl = () => {
        flCpu.mark(measured);
        return timed(floorRun.url, f, checkFloor);
      };
      // ABC then CBA, so load from other processes hits the three alike.
      let tCf;
      let tPt;
      let tFl;
      if (i % 2 === 0) {
        tCf = await runCf();
        tPt = await runPt();
        tFl = await runFl();
      } else {
        tFl = await runFl();
        tPt = await runPt();
        tCf = await runCf();
      }
      if (i >= WARMUP) {
        cf.push(tCf);
        pt.push(tPt);
        fl.push(tFl);
        phase.set(a.id, "latency");
      }
    }
    const latencySeconds = (performance.now() - started1) / 1000;
    const perf = stopPerf ? await stopPerf() : null;
    await new Promise((resolve) => setTimeout(resolve, 50));
    cfCpu.mark(false);
    ptCpu.mark(false);
    flCpu.mark(false);
    const cpu = {
      callfence: (cpuMs(edgePid) - cpu0.edge) / CALLS,
      passthrough: (cpuMs(passthroughPid) - cpu0.passthrough) / CALLS,
      floor: (cpuMs(floorPid) - cpu0.floor) / CALLS,
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

    const overload = await runOverload(edge, keys);

    // The same Dispatcher doing only its writes, and doing nothing.
    const alone = await dispatcherOnly(edge, origin);
    // The call shards' figures, on two workerds of their own.
    const shards = await shardFigures(alone.webhook);
    // The Worker's own CPU, against a stand-in Dispatcher (two more workerd).
    const only = await workerOnly(keys, before.compatibilityDate);
    const crossed = process.env.BENCH_CROSSINGS === "1" ? await crossings(keys, origin) : null;

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
    const cfC = summary(cfCpu.samples);
    const ptC = summary(ptCpu.samples);
    const flC = summary(flCpu.samples);
    const l = summary(fl);
    const woReal = summary(only.real);
    const woFloor = summary(only.floor);
    const workerOwnMedian = woReal.p50 - woFloor.p50;
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
      `config: FORWARD_TIMEOUT_MS=${FORWARD_TIMEOUT_MS}, one stable node, one Dispatcher (SQLite files ${STORAGE === "shm" ? "on tmpfs, /dev/shm: fsync is free" : "on disk (ext4): every commit fsyncs"}), loopback origin answering 200 without verifying; client: Node fetch on loopback`,
    ];
    const figureLines = [
      `latency, sequential, ${CALLS} distinct new calls each after ${WARMUP} warm-up, interleaved ABBA (${latencySeconds.toFixed(1)} s):`,
      `  callfence     p50 ${ms(c.p50)}  p99 ${ms(c.p99)}  (mean ${ms(c.mean)}, max ${ms(c.max)})`,
      `  pass-through  p50 ${ms(p.p50)}  p99 ${ms(p.p99)}  (mean ${ms(p.mean)}, max ${ms(p.max)})`,
      `  ratio         p50 ${(c.p50 / p.p50).toFixed(2)}x  p99 ${(c.p99 / p.p99).toFixed(2)}x; callfence adds ${ms(c.p50 - p.p50)} at p50`,
      `  floor         p50 ${ms(l.p50)}  p99 ${ms(l.p99)}  (mean ${ms(l.mean)}, max ${ms(l.max)}): the contract's steps in JavaScript, nothing else, answer after ${FLOOR_COMMITS} commit${FLOOR_COMMITS === 2 ? "s" : ""} (FLOOR in scripts/bench.mjs)`,
      `  floor ratio   p50 ${(l.p50 / p.p50).toFixed(2)}x  p99 ${(l.p99 / p.p99).toFixed(2)}x to the pass-through; callfence to the floor p50 ${(c.p50 / l.p50).toFixed(2)}x  p99 ${(c.p99 / l.p99).toFixed(2)}x`,
      `throughput: ${THROUGHPUT_CALLS} distinct new calls, ${CONCURRENCY} in flight, one Dispatcher: ${rate.toFixed(0)} assignments/s (${throughputSeconds.toFixed(2)} s; latency p50 ${ms(t.p50)}, p99 ${ms(t.p99)}); ${CALLS + WARMUP} calls already open; first quarter ${firstQuarter.toFixed(0)}/s, last quarter ${lastQuarter.toFixed(0)}/s`,
      o
        ? `Worker's own time per webhook (ms - wait_ms from its log lines, ${o.n} sequential webhooks): median ${o.p50} ms, mean ${o.mean.toFixed(2)} ms, p90 ${o.p90} ms, p99 ${o.p99} ms` +
          ` (its wall time median ${w.p50} ms, of which awaiting Dispatcher + origin median ${wt.p50} ms)` +
          (oT ? `; under ${CONCURRENCY} in flight: median ${oT.p50} ms, mean ${oT.mean.toFixed(2)} ms` : "")
        : `Worker's own time per webhook: no log line carried wait_ms (${missingWait} without): the build predates it, run make build`,
      `  includes: route, config, body read, Telnyx Ed25519 verify, envelope parse, JSON to/from the Dispatcher, assertion minting (Ed25519 sign), building the forward and the answer; excludes: the Dispatcher's own work and storage, the origin, the HTTP hop from the client. 1 ms clock resolution per reading.`,
      `CPU per webhook, whole workerd process (utime+stime from /proc, ${CALLS} sequential webhooks, ${CLOCK_TICKS} ticks/s): callfence ${ms(cpu.callfence)}, pass-through ${ms(cpu.passthrough)} (ratio ${(cpu.callfence / cpu.passthrough).toFixed(2)}x)`,
      `  per webhook from schedstat (ns, every thread, request start to next request start): callfence median ${ms(cfC.p50, 3)} (mean ${ms(cfC.mean, 3)}, p90 ${ms(cfC.p90, 3)}), pass-through median ${ms(ptC.p50, 3)} (mean ${ms(ptC.mean, 3)}, p90 ${ms(ptC.p90, 3)})`,
      `  the contract's floor (FLOOR: JavaScript Worker and SQLite Durable Object, WebCrypto Ed25519, ${FLOOR_COMMITS === 2 ? "one INSERT and one UPDATE in two commits" : "one INSERT in one commit (BENCH_FLOOR_COMMITS=1)"}, one forward${FLOOR_EXTRA_SQL ? `, ${FLOOR_EXTRA_SQL} more statements (BENCH_FLOOR_EXTRA_SQL)` : ""}): ${ms(cpu.floor)} from /proc, median ${ms(flC.p50, 3)} (mean ${ms(flC.mean, 3)}) from schedstat; callfence to the floor ${(cpu.callfence / cpu.floor).toFixed(2)}x (median ${(cfC.p50 / flC.p50).toFixed(2)}x)`,
      `Worker's own CPU per webhook (schedstat, ${woReal.n} webhooks each, interleaved ABBA): the Worker in front of a stand-in Dispatcher that answers at once median ${ms(woReal.p50, 3)} (mean ${ms(woReal.mean, 3)}) - a JavaScript Worker making the same hop to the same stand-in median ${ms(woFloor.p50, 3)} (mean ${ms(woFloor.mean, 3)}) = median ${ms(workerOwnMedian, 3)} (mean ${ms(woReal.mean - woFloor.mean, 3)})`,
      floor
        ? `  of which the wasm alone does (examples/wasm_crypto.rs, release profile, Node's V8 ${floor.v8}, median of 15 x 100): Telnyx signature check ${floor.verify.toFixed(0)} us, envelope parse ${floor.parse.toFixed(0)} us; and in the Dispatcher, minting the assertion ${floor.mint.toFixed(0)} us`
        : "  (the wasm floor needs BENCH_WASM_CRYPTO: run make bench)",
      `Dispatcher alone (${THROUGHPUT_CALLS} messages each, ${CONCURRENCY} in flight, from a driver Worker in the same workerd): full assignments (webhook message: decision, forward, report) ${alone.webhook.toFixed(0)}/s (${alone.shed} shed as overloaded, not counted); the same assignments' writes only (writes_only: the same 8 writes in the same 2 commits; no reads, no decision, no forward, no alarm) ${alone.writes === null ? "(not in this build)" : `${alone.writes.toFixed(0)}/s`}; ping (the request hop alone) ${alone.ping.toFixed(0)}/s`,
      `  ratio to the writes-only rate: assignments through the Worker ${alone.writes === null ? "?" : (rate / alone.writes).toFixed(2)}x, assignments sent to the Dispatcher directly ${alone.writes === null ? "?" : (alone.webhook / alone.writes).toFixed(2)}x`,
      `Dispatcher time per webhook (its profile, sequential phase; ms sums of Date.now, so means over ${profile.webhook.count} requests):`,
      ...["webhook", "report"]
        .filter((op) => profile[op].count > 0)
        .map((op) => {
          const x = profile[op];
          return `  ${op.padEnd(8)} total ${ms(x.total_ms, 3)} = decode ${ms(x.decode_ms, 3)} + engine, forward building and encode ${ms(x.serve_ms, 3)} (of which SQL ${ms(x.sql_ms, 3)} in ${x.statements.toFixed(1)} statements) + awaiting the origin ${ms(x.origin_ms, 3)} + alarm ${ms(x.arm_ms, 3)} (${x.alarm_api_calls.toFixed(2)} alarm API calls)`;
        }),
      overloadLine(overload),
      ...shardLines(shards),
      `size: build/index_bg.wasm ${b.wasmRaw} bytes raw (${(b.wasmRaw / 1024).toFixed(0)} KiB), ${b.wasmGzip} bytes gzipped (${(b.wasmGzip / 1024).toFixed(0)} KiB)`,
    ];
    if (crossed) {
      figureLines.push(`crossings from the wasm into JavaScript per sequential webhook (BENCH_CROSSINGS, Worker and Dispatcher together, ${CALLS} webhooks): ${crossed.perWebhook.toFixed(1)}, by import:`);
      for (const [name, n] of crossed.by) figureLines.push(`  ${n.toFixed(2).padStart(7)}  ${name}`);
    }
    if (perf) {
      figureLines.push(`perf (BENCH_PERF: perf record -e cpu-clock of the callfence workerd over the sequential phase), share of its CPU:`);
      for (const [group, p] of perf.groups) figureLines.push(`  ${p.toFixed(1).padStart(5)}%  ${group}`);
      if (perf.named) figureLines.push(`  (of the wasm, ${perf.liftoff.toFixed(1)}% of the process ran in V8's baseline tier, Liftoff)`);
      figureLines.push("  top symbols:");
      for (const { p, where } of perf.top) figureLines.push(`  ${p.toFixed(2).padStart(6)}%  ${where}`);
    }
    console.log("\n== bench: Worker end to end (local workerd)");
    for (const line of [...conditionLines, "", ...figureLines]) console.log(line);
    if (lines.length < expected) console.log(`note: ${lines.length} of ${expected} log lines were captured`);
    const forwarded = (crossed ? 4 : 3) * (WARMUP + CALLS) + THROUGHPUT_CALLS + overload.taken.length;
    if (origin.received < forwarded) {
      throw new Error(`the origin received ${origin.received} requests, expected ${forwarded}`);
    }

    if (process.env.BENCH_DOCS === "1") writeFigures(conditionLines, figureLines);
    if (process.env.BENCH_JSON === "1") {
      console.log(
        JSON.stringify({
          commit: before.commit,
          storage: STORAGE,
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
          cpu_ms_per_webhook_median: cfC.p50,
          cpu_ms_per_webhook_mean_schedstat: cfC.mean,
          passthrough_cpu_ms_per_webhook_median: ptC.p50,
          // The contract's floor (FLOOR), and callfence's ratios to it.
          floor: {
            commits: FLOOR_COMMITS,
            extra_statements: FLOOR_EXTRA_SQL,
            p50_ms: l.p50,
            p99_ms: l.p99,
            cpu_ms_per_webhook: cpu.floor,
            cpu_ms_per_webhook_median: flC.p50,
            callfence_p50_ratio: c.p50 / l.p50,
            callfence_cpu_ratio: cpu.callfence / cpu.floor,
          },
          // The issue's name for it: workerd CPU per webhook (from /proc), callfence to the floor, at one shard.
          cpu_floor_ratio: cpu.callfence / cpu.floor,
          cpu_floor_ratio_median: cfC.p50 / flC.p50,
          worker_cpu_ms_median: workerOwnMedian,
          worker_cpu_ms_mean: woReal.mean - woFloor.mean,
          worker_only_cpu_ms_median: woReal.p50,
          hop_only_cpu_ms_median: woFloor.p50,
          wasm_verify_us: floor ? floor.verify : null,
          wasm_parse_us: floor ? floor.parse : null,
          wasm_mint_us: floor ? floor.mint : null,
          dispatcher_assignments_per_s: alone.webhook,
          dispatcher_assignments_to_writes_only_ratio: alone.writes === null ? null : alone.webhook / alone.writes,
          writes_only_per_s: alone.writes,
          ping_per_s: alone.ping,
          assignments_to_writes_only_ratio: alone.writes === null ? null : rate / alone.writes,
          dispatcher: profile,
          overload: overloadJson(overload),
          wasm_raw_bytes: b.wasmRaw,
          wasm_gzip_bytes: b.wasmGzip,
          ...shardJson(shards),
        }),
      );
    }
  } finally {
    stopBeating();
    await passthrough.dispose();
    await floorRun.dispose();
    rmSync(floorDir, { recursive: true, force: true });
    await edge.dispose();
    if (shmDir) rmSync(shmDir, { recursive: true, force: true });
    await origin.close();
  }
}

/** Replaces the block between the bench markers in docs/performance.md. */
function writeFigures(conditionLines, figureLines) {
  const path = join(ROOT, "docs", "performance.md");
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
    console.log("docs/performance.md has no bench markers: not written");
    return;
  }
  const block = [
    start,
    `Latest figures (\`BENCH_DOCS=1 make bench\`, ${new Date().toISOString().slice(0, 10)}):`,
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
  console.log("docs/performance.md: figures written");
}

// ------------------------------------------------------------- overload ----

/**
 * The overload phase: OVERLOAD_CALLS new calls, OVERLOAD_CONCURRENCY in
 * flight. Every answer must be a delivery or a shed with Retry-After: 1
 * (503 overloaded from the Dispatcher, or 503 dispatcher_unavailable from
 * the Worker when its answer deadline passed first), nothing else. Returns the answer times (client side, from
 * sending to the last byte) of both, the seconds it took, and the Worker's
 * own time per answer (`ms` of its log lines: from its fetch handler's start
 * to its answer), so that a tail can be told apart from queueing before the
 * Worker ran.
 */
async function runOverload(edge, keys) {
  const overload = { taken: [], shed: [], late: [], other: [], edge: [] };
  const overloadCalls = Array.from({ length: OVERLOAD_CALLS }, (_, i) => newCall(keys, "over", i));
  const ids = new Set(overloadCalls.map((call) => call.id));
  const logged = edge.logs.length;
  let nextOver = 0;
  const started = performance.now();
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
        const retry = res.status === 503 && res.headers.get("retry-after") === "1";
        if (res.status === 200 && body?.delivered_to === NODE) overload.taken.push(elapsed);
        else if (retry && body?.error === "overloaded") overload.shed.push(elapsed);
        // The Worker's answer deadline (FORWARD_TIMEOUT_MS + 300 ms) passed
        // before the Dispatcher answered: shed too, by the Worker.
        else if (retry && body?.error === "dispatcher_unavailable") overload.late.push(elapsed);
        else overload.other.push(`${res.status} ${text.slice(0, 120)}`);
      }
    }),
  );
  overload.seconds = (performance.now() - started) / 1000;
  if (overload.other.length > 0) {
    throw new Error(`${overload.other.length} overload answers were neither deliveries nor sheds, first: ${overload.other[0]}`);
  }
  for (const { message } of edge.logs.slice(logged)) {
    try {
      const line = JSON.parse(message);
      if (line.path === WEBHOOK && ids.has(line.event_id) && typeof line.ms === "number") overload.edge.push(line.ms);
    } catch {
      // not a request line
    }
  }
  return overload;
}

/** The tail of every overload answer, taken or shed: max and p99.9. */
function overloadTail(overload) {
  const all = [...overload.taken, ...overload.shed, ...overload.late].sort((a, b) => a - b);
  const edgeSide = [...overload.edge].sort((a, b) => a - b);
  return {
    max: all.at(-1) ?? NaN,
    p999: quantile(all, 0.999),
    edgeMax: edgeSide.at(-1) ?? NaN,
    edgeP999: quantile(edgeSide, 0.999),
  };
}

function overloadLine(overload) {
  const taken = summary(overload.taken);
  const shed = summary(overload.shed);
  const tail = overloadTail(overload);
  return (
    `overload: ${OVERLOAD_CALLS} new calls, ${OVERLOAD_CONCURRENCY} in flight (${overload.seconds.toFixed(2)} s): ${overload.taken.length} taken (p50 ${ms(taken.p50)}, p99 ${ms(taken.p99)}), ${overload.shed.length} shed with 503 overloaded${overload.shed.length ? ` (p50 ${ms(shed.p50)}, p99 ${ms(shed.p99)})` : ""}, ${overload.late.length} answered 503 dispatcher_unavailable at the Worker's deadline; ` +
    `every answer: p99.9 ${ms(tail.p999)}, max ${ms(tail.max)} (bound FORWARD_TIMEOUT_MS + 300 = ${FORWARD_TIMEOUT_MS + 300} ms from the Worker's start; its own log: p99.9 ${ms(tail.edgeP999)}, max ${ms(tail.edgeMax)}, ${overload.edge.length} lines)`
  );
}

function overloadJson(overload) {
  const taken = summary(overload.taken);
  const tail = overloadTail(overload);
  return {
    calls: OVERLOAD_CALLS,
    concurrency: OVERLOAD_CONCURRENCY,
    taken: overload.taken.length,
    shed: overload.shed.length,
    deadline_shed: overload.late.length,
    taken_p50_ms: taken.p50,
    taken_p99_ms: taken.p99,
    answer_p999_ms: tail.p999,
    answer_max_ms: tail.max,
    edge_answer_p999_ms: tail.edgeP999,
    edge_answer_max_ms: tail.edgeMax,
  };
}

/**
 * BENCH_ONLY=overload: the overload phase alone, on its own edge and
 * origin after WARMUP sequential calls (for a shared machine: a minute, not
 * the whole bench).
 */
async function overloadOnly() {
  const before = conditions();
  const origin = await startPlainOrigin();
  const keys = testKeys();
  const node = ed25519();
  const shmDir = STORAGE === "shm" ? mkdtempSync("/dev/shm/callfence-bench-") : undefined;
  const edge = await startEdge({ keys, bindings: { ...bindingsFor(keys), FORWARD_TIMEOUT_MS: String(FORWARD_TIMEOUT_MS) }, dir: shmDir });
  let stopBeating = () => {};
  try {
    stopBeating = await setUpCallfence(edge, origin, node);
    for (let i = 0; i < WARMUP; i += 1) await timed(edge.url, newCall(keys, "warm", i), checkCallfence);
    const overload = await runOverload(edge, keys);
    const after = os.loadavg().map((x) => x.toFixed(2)).join(" ");
    console.log("\n== bench: overload only (BENCH_ONLY=overload)");
    console.log(`machine: ${before.machine}; load average (1/5/15 min) ${before.load} before, ${after} after; commit ${before.commit}; FORWARD_TIMEOUT_MS=${FORWARD_TIMEOUT_MS}; SQLite files ${STORAGE === "shm" ? "on tmpfs" : "on disk"}`);
    console.log(overloadLine(overload));
    if (process.env.BENCH_JSON === "1") {
      console.log(JSON.stringify({ commit: before.commit, storage: STORAGE, load_before: before.load, load_after: after, overload: overloadJson(overload) }));
    }
  } finally {
    stopBeating();
    await edge.dispose();
    if (shmDir) rmSync(shmDir, { recursive: true, force: true });
    await origin.close();
  }
}

/** Every SQLite database file under `dir` but the runtime's namespace
 * metadata: one per Durable Object instance. */
function objectFiles(dir) {
  const found = [];
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) found.push(...objectFiles(path));
    else if (entry.name.endsWith(".sqlite") && entry.name !== "metadata.sqlite") found.push(path);
  }
  return found;
}

/**
 * BENCH_ONLY=metrics: what the edge's metrics cost (docs/metrics.md). On
 * its own edge (after `make build`; BENCH_BUILD=<a build directory under the
 * checkout> runs another build, e.g. the commit before metrics), after
 * BENCH_WARMUP calls: the Dispatcher's SQL statements per webhook over
 * BENCH_CALLS sequential calls (its profile), then BENCH_SCRAPES (200)
 * sequential scrapes of GET /v1/metrics: Dispatcher messages and SQL
 * statements per scrape, the Durable Object instances that exist (their
 * SQLite files), the edge workerd's CPU per scrape (/proc, user + system)
 * and the scrape's latency. A build without the route says so and measures
 * the webhooks only.
 */
async function metricsOnly() {
  const before = conditions();
  const scrapes = int("BENCH_SCRAPES", 200);
  const origin = await startPlainOrigin();
  const keys = testKeys();
  const node = ed25519();
  const metricsToken = randomUUID().replaceAll("-", "");
  const build = process.env.BENCH_BUILD ? join(ROOT, process.env.BENCH_BUILD) : undefined;
  const bindings = { ...bindingsFor(keys), FORWARD_TIMEOUT_MS: String(FORWARD_TIMEOUT_MS), METRICS_TOKENS: metricsToken };
  const { result: edge, pid } = await newWorkerd(() => startEdge({ keys, bindings, build }));
  let stopBeating = () => {};
  try {
    stopBeating = await setUpCallfence(edge, origin, node);
    for (let i = 0; i < WARMUP; i += 1) await timed(edge.url, newCall(keys, "warm", i), checkCallfence);
    const p0 = await dispatcherProfile(edge);
    const c0 = cpuMs(pid);
    for (let i = 0; i < CALLS; i += 1) await timed(edge.url, newCall(keys, "seq", i), checkCallfence);
    const webhookCpu = (cpuMs(pid) - c0) / CALLS;
    const p1 = await dispatcherProfile(edge);
    const webhook = profileDelta(p0, p1, "webhook");
    console.log(`\n== bench: metrics (BENCH_ONLY=metrics${process.env.BENCH_BUILD ? `, BENCH_BUILD=${process.env.BENCH_BUILD}` : ""})`);
    console.log(`machine: ${before.machine}; load average ${before.load}; commit ${before.commit}`);
    console.log(`webhooks: ${CALLS} sequential new calls after ${WARMUP} warm-up: ${webhook.statements.toFixed(2)} SQL statements per webhook (Dispatcher profile, ${webhook.count} webhooks); edge workerd CPU ${webhookCpu.toFixed(2)} ms per webhook`);
    const scrape = () => edge.fetch("/v1/metrics", { headers: bearer(metricsToken) });
    const first = await scrape();
    await first.text();
    if (first.status === 404) {
      console.log("scrapes: this build has no GET /v1/metrics");
      return;
    }
    if (first.status !== 200) throw new Error(`GET /v1/metrics: ${first.status}`);
    for (let i = 0; i < 20; i += 1) await (await scrape()).text();
    const q0 = await dispatcherProfile(edge);
    const d0 = cpuMs(pid);
    const latency = [];
    let bytes = 0;
    for (let i = 0; i < scrapes; i += 1) {
      const started = performance.now();
      const res = await scrape();
      const text = await res.text();
      latency.push(performance.now() - started);
      if (res.status !== 200) throw new Error(`GET /v1/metrics: ${res.status} ${text}`);
      bytes = text.length;
    }
    const scrapeCpu = (cpuMs(pid) - d0) / scrapes;
    const q1 = await dispatcherProfile(edge);
    const metrics = profileDelta(q0, q1, "metrics");
    const messages = profileSum({ global: q0 }, { global: q1 }, ["global"], () => true, "count") / scrapes;
    const objects = objectFiles(edge.dir).length;
    const lat = summary(latency);
    console.log(`scrapes: ${scrapes} sequential GET /v1/metrics (${bytes} bytes each): ${messages.toFixed(2)} Dispatcher messages per scrape (profile, every op; heartbeats included), ${metrics.statements.toFixed(2)} SQL statements per scrape, ${objects} Durable Object instance(s) in storage; edge workerd CPU ${scrapeCpu.toFixed(2)} ms per scrape; latency p50 ${lat.p50.toFixed(2)} ms, p99 ${lat.p99.toFixed(2)} ms`);
  } finally {
    stopBeating();
    await edge.dispose();
    await origin.close();
  }
}

// --------------------------------------------------------------- shards ----

/** The operations of a call's path, served by its holder; whatever else `global` serves is the directory's. */
const CALL_PATH_OPS = new Set(["webhook", "report", "fence", "claim", "media_verify", "holds", "leg", "call"]);
/** The operations that reach an object on a webhook's way to its holder (its report goes to the same one). */
const REACHING_OPS = ["webhook", "holds", "leg"];
const SHARDS_CONCURRENCY = int("BENCH_SHARDS_CONCURRENCY", 16);
const STEADY_CALLS = int("BENCH_STEADY_CALLS", 1500);
const SHARDS = 8;
const PROJECTED_SHARDS = 32;
// The holding horizon (the longest call and the retention, test-only
// switches) made short, so that the one-shard map the eight-shard map
// replaces stops counting for holder lookups within the run: it counts for
// the horizon plus REPLACED_MAP_USE_MS (9 s) after the change, and a lease
// (renewed every 2 s) carries the narrower history to each shard. A
// deployment's horizon is 28 h: for that long after a change, a new session
// whose home moved costs one Holds question to its old home.
const SHARD_TIMINGS = { CALLFENCE_TEST_MAX_DURATION_MS: "4000", CALLFENCE_TEST_RETENTION_MS: "1000" };
const NARROWED_AFTER_MS = 4_000 + 1_000 + 9_000 + 2 * 2_000;

/** The instances of a map of `n` call shards. */
const instances = (n) => ["global", ...Array.from({ length: n - 1 }, (_, k) => `calls-${k + 1}`)];

/** Every instance's profile. */
async function profiles(edge, n) {
  return Object.fromEntries(await Promise.all(instances(n).map(async (name) => [name, await dispatcherProfile(edge, name)])));
}

/** CPU ns of each thread of `pid` so far. */
function threadsNs(pid) {
  const out = {};
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    try {
      out[tid] = Number(readFileSync(`/proc/${pid}/task/${tid}/schedstat`, "utf8").split(" ")[0]);
    } catch {
      // the thread ended meanwhile
    }
  }
  return out;
}

/**
 * The sum of `field` ("count", or "busy": ms inside the object, awaiting an
 * origin excluded) over the operations `pick(instance, op)` takes, after
 * minus before.
 */
function profileSum(before, after, names, pick, field) {
  const value = (x) => (x ? (field === "busy" ? x.total_ms - x.origin_ms : x.count) : 0);
  let total = 0;
  for (const name of names) {
    for (const [op, x] of Object.entries(after[name])) if (pick(name, op)) total += value(x) - value(before[name][op]);
  }
  return total;
}

/** An answer check for a call's events: 200, delivered to one of the nodes. */
function deliveredToANode(status, text) {
  let body = null;
  try {
    body = JSON.parse(text);
  } catch {
    // not JSON: reported below
  }
  if (status !== 200 || !["M1", "M2"].includes(body?.delivered_to)) {
    failures.push(`shards: ${status} ${text.slice(0, 200)}`);
    throw new Error(`a call's event was not delivered: ${status} ${text.slice(0, 200)}`);
  }
}

/** One whole call on `edge` (initiated, answered, hangup); `mark(i)` runs before each. Returns the initiated's round trip. */
async function wholeCall(edge, keys, session, to, mark = () => {}) {
  mark(0);
  const t = await timed(edge.url, callEvent(keys, session, "call.initiated", to), deliveredToANode);
  mark(1);
  await timed(edge.url, callEvent(keys, session, "call.answered", to), deliveredToANode);
  await timed(edge.url, callEvent(keys, session, "call.hangup", to), deliveredToANode);
  return t;
}

/** The call's line: every other call is M2's. */
const lineOf = (i) => (i % 2 === 0 ? "+14155550199" : LINES.M2);

/**
 * Requests `global` serves for the directory: not its own shard's call
 * path, not its alarm (no request), not heartbeats (they come per node
 * and second, not per webhook), not the bench's own profile reads.
 */
const isDirectory = (name, op) => name === "global" && !CALL_PATH_OPS.has(op) && !["alarm", "heartbeat", "profile"].includes(op);

/**
 * What `webhooks` webhooks in `seconds` cost the instances of a map of `n`
 * shards, from their profiles before (p0) and after (p1): the requests
 * reaching an object on the way to the holder and the directory's
 * requests per webhook (by operation), and the busy time per webhook (ms
 * inside an object, awaiting an origin excluded; a wall-clock reading, so
 * it holds only when requests do not overlap) of the call path and of the
 * directory, and the lease asks per call shard per second.
 */
function usage(p0, p1, n, webhooks, seconds) {
  const field = (f, pick) => profileSum(p0, p1, instances(n), pick, f);
  const directoryOps = {};
  for (const [op, after] of Object.entries(p1.global)) {
    const d = after.count - (p0.global[op]?.count ?? 0);
    if (isDirectory("global", op) && d > 0) directoryOps[op] = d;
  }
  const leaseAsks = directoryOps.lease_ask ?? 0;
  const leaseBusy = field("busy", (name, op) => name === "global" && op === "lease_ask");
  return {
    webhooks,
    seconds,
    rate: webhooks / seconds,
    reaching_per_webhook: field("count", (_, op) => REACHING_OPS.includes(op)) / webhooks,
    directory_per_webhook: field("count", isDirectory) / webhooks,
    directory_ops: directoryOps,
    call_busy_ms_per_webhook: field("busy", (_, op) => CALL_PATH_OPS.has(op)) / webhooks,
    directory_busy_ms_per_webhook: field("busy", isDirectory) / webhooks,
    lease_busy_ms_per_webhook: leaseBusy / webhooks,
    lease_asks_per_shard_s: n > 1 ? leaseAsks / seconds / (n - 1) : 0,
    busy_ms_per_lease_ask: leaseAsks ? leaseBusy / leaseAsks : null,
  };
}

/**
 * STEADY_CALLS whole calls, SHARDS_CONCURRENCY in flight, on `edge` (a map
 * of `n` shards, workerd `pid`): its {@link usage}, the workerd CPU per
 * webhook and the busiest thread's share of it.
 */
async function steady(edge, pid, keys, n, tag) {
  const p0 = await profiles(edge, n);
  const t0 = threadsNs(pid);
  const started = performance.now();
  let next = 0;
  await Promise.all(
    Array.from({ length: SHARDS_CONCURRENCY }, async () => {
      for (let i = next++; i < STEADY_CALLS; i = next++) await wholeCall(edge, keys, `bench-${RUN}-${tag}-${i}`, lineOf(i));
    }),
  );
  const seconds = (performance.now() - started) / 1000;
  const t1 = threadsNs(pid);
  const p1 = await profiles(edge, n);
  const webhooks = 3 * STEADY_CALLS;
  const deltas = Object.keys(t1).map((tid) => t1[tid] - (t0[tid] ?? 0));
  const cpu = deltas.reduce((a, b) => a + b, 0);
  return {
    ...usage(p0, p1, n, webhooks, seconds),
    cpu_ms_per_webhook: cpu / 1e6 / webhooks,
    busiest_thread_share: cpu ? Math.max(...deltas) / cpu : 0,
  };
}

/**
 * The throughput of `n` call shards over one object's, in units of one
 * object's capacity X1 (webhooks/s at one shard: `measuredOneObject`, the
 * Dispatcher alone driven from inside workerd, else the one-shard steady
 * rate). Measured inputs: k, the workerd CPU per webhook at eight shards
 * over one (the steady runs: what a webhook costs its shard, the
 * directory's share included; at least 1, since a ratio below it is the
 * runs' noise, not a saving); the directory's requests per webhook d_w
 * beyond lease renewals and the renewals r per call shard per second (the
 * eight-shard steady run); c, a directory request's cost in webhooks (the
 * profile's busy time per lease ask over the call path's per webhook, at
 * least 1). Bounds on the webhook rate R: each call shard R/n·k ≤ X1;
 * `global` R/n·k + R·d_w·c + (n−1)·r·c ≤ X1; the directory's own part
 * R·d_w·c + (n−1)·r·c ≤ X1/2 (under half busy).
 */
function project(seq, run, x1, n = PROJECTED_SHARDS) {
  const k = Math.max(1, run.eight.cpu_ms_per_webhook / run.one.cpu_ms_per_webhook);
  const r = run.eight.lease_asks_per_shard_s;
  const dw = Math.max(0, run.eight.directory_per_webhook - (r * (SHARDS - 1)) / run.eight.rate);
  const perLease = seq.eight.busy_ms_per_lease_ask;
  const c = Math.max(1, perLease === null ? 1 : perLease / seq.eight.call_busy_ms_per_webhook);
  const fixed = (n - 1) * r * c;
  const bounds = {
    "the call shards": (n * x1) / k,
    "global, fully busy": (x1 - fixed) / (k / n + dw * c),
    "the directory at half busy": dw > 0 ? (x1 / 2 - fixed) / (dw * c) : Infinity,
  };
  const [limited_by, rate] = Object.entries(bounds).sort((a, b) => a[1] - b[1])[0];
  return {
    inputs: { x1_per_s: x1, k, dw, r, c },
    shards_per_s: rate,
    limited_by,
    global_busy: ((rate / n) * k + rate * dw * c + fixed) / x1,
    directory_busy: (rate * dw * c + fixed) / x1,
    speedup: rate / x1,
    // The measured point: on one thread, throughput × CPU per webhook is
    // the core's share the objects and the Worker got.
    core_share: { one: run.one.rate * run.one.cpu_ms_per_webhook / 1000, eight: run.eight.rate * run.eight.cpu_ms_per_webhook / 1000 },
  };
}

/**
 * The call-shard figures (SPEC §16): one edge with one call shard and one
 * with eight, two nodes of max_calls 50, whole calls (initiated, answered,
 * hangup). After the eight-shard map's history has narrowed: the initiated
 * webhook's latency and workerd CPU (schedstat, median) on each, interleaved
 * ABBA, sequential; then a steady run on each ({@link steady}); then the
 * projection to 32 shards ({@link project}), against `measuredOneObject`
 * (the Dispatcher-alone rate main measured, when given).
 */
async function shardFigures(measuredOneObject = null) {
  const origin = await startPlainOrigin();
  const keys = testKeys();
  const [m1, m2] = [ed25519(), ed25519()];
  const dir8 = mkdtempSync(join(os.tmpdir(), "callfence-shards-"));
  const base = { ...bindingsFor(keys), FORWARD_TIMEOUT_MS: String(FORWARD_TIMEOUT_MS), ...SHARD_TIMINGS };
  const { result: one, pid: onePid } = await newWorkerd(() => startEdge({ keys, bindings: base, shards: 1 }));
  const { result: eight, pid: eightPid } = await newWorkerd(() => startEdge({ keys, bindings: base, dir: dir8, shards: 1 }));
  const stops = [];
  try {
    for (const edge of [one, eight]) stops.push(await setUpCallfence(edge, origin, m1, { more: [["M2", m2]], maxCalls: 50 }));
    const put = await read(
      await eight.fetch("/v1/shards", {
        method: "PUT",
        headers: { ...bearer(keys.adminToken), "if-match": '"0"', "content-type": "application/json" },
        body: JSON.stringify({ schema: "callfence_shards_v1", call_shards: SHARDS }),
      }),
    );
    if (put.status !== 200) throw new Error(`PUT /v1/shards: ${put.status} ${JSON.stringify(put.body)}`);
    const narrowedAt = Date.now() + NARROWED_AFTER_MS;
    for (let i = 0; i < WARMUP || Date.now() < narrowedAt; i += 1) {
      for (const edge of [one, eight]) await wholeCall(edge, keys, `bench-${RUN}-shw-${i}`, lineOf(i));
    }
    const arms = { one: [one, new CpuPerRequest(onePid), []], eight: [eight, new CpuPerRequest(eightPid), []] };
    const before = { one: await profiles(one, 1), eight: await profiles(eight, SHARDS) };
    const started = performance.now();
    for (let i = 0; i < CALLS; i += 1) {
      for (const name of i % 2 === 0 ? ["one", "eight"] : ["eight", "one"]) {
        const [edge, cpu, latency] = arms[name];
        latency.push(await wholeCall(edge, keys, `bench-${RUN}-shl-${name}-${i}`, lineOf(i), (step) => cpu.mark(step === 0)));
      }
    }
    for (const [, cpu] of Object.values(arms)) cpu.mark(false);
    const fig = (name) => ({ p50: summary(arms[name][2]).p50, cpu: summary(arms[name][1].samples).p50 });
    const latency = { one: fig("one"), eight: fig("eight") };
    // Both edges took turns: each one's webhooks came one at a time.
    const seconds = (performance.now() - started) / 1000;
    const seq = {
      one: usage(before.one, await profiles(one, 1), 1, 3 * CALLS, seconds),
      eight: usage(before.eight, await profiles(eight, SHARDS), SHARDS, 3 * CALLS, seconds),
    };
    const runs = { one: await steady(one, onePid, keys, 1, "sh1"), eight: await steady(eight, eightPid, keys, SHARDS, "sh8") };
    const projection = project(seq, runs, measuredOneObject ?? runs.one.rate);
    return { latency, seq, runs, projection, measuredOneObject, objects: objectFiles(dir8).length };
  } finally {
    for (const stop of stops) stop();
    await one.dispose();
    await eight.dispose();
    rmSync(dir8, { recursive: true, force: true });
    await origin.close();
  }
}

/** The call-shard figures as lines for the report. */
function shardLines(f) {
  const { latency: l, seq, runs: r, projection: p } = f;
  const ops = (o) => Object.entries(o).map(([op, n]) => `${op} ${n}`).join(", ") || "none";
  const run = (name, x) =>
    `  ${name}: ${x.rate.toFixed(0)} webhooks/s; objects per webhook ${(x.reaching_per_webhook + x.directory_per_webhook).toFixed(3)} (on the way to the holder ${x.reaching_per_webhook.toFixed(3)}, directory ${x.directory_per_webhook.toFixed(4)}: ${ops(x.directory_ops)}); workerd CPU per webhook ${ms(x.cpu_ms_per_webhook, 3)}, its busiest thread ${(100 * x.busiest_thread_share).toFixed(0)}% of it`;
  const busy = (name, x) => `  ${name}: call path ${ms(x.call_busy_ms_per_webhook, 3)}, directory ${ms(x.directory_busy_ms_per_webhook, 3)} (${ops(x.directory_ops)})`;
  return [
    `call shards (SPEC §16; two nodes of max_calls 50, whole calls: initiated, answered, hangup; the 8-shard map's history narrowed first, test-only horizon ${SHARD_TIMINGS.CALLFENCE_TEST_MAX_DURATION_MS} + ${SHARD_TIMINGS.CALLFENCE_TEST_RETENTION_MS} ms):`,
    `  latency of call.initiated, ${CALLS} sequential calls per edge interleaved ABBA: 1 shard p50 ${ms(l.one.p50)}, 8 shards p50 ${ms(l.eight.p50)}: shards_p50_ratio ${(l.eight.p50 / l.one.p50).toFixed(2)}`,
    `  workerd CPU per call.initiated (schedstat, median): 1 shard ${ms(l.one.cpu, 3)}, 8 shards ${ms(l.eight.cpu, 3)}: ratio ${(l.eight.cpu / l.one.cpu).toFixed(2)}`,
    `  busy time per webhook inside the objects (their profiles, the sequential calls):`,
    busy("1 shard ", seq.one),
    busy("8 shards", seq.eight),
    `  steady run, ${STEADY_CALLS} whole calls per edge, ${SHARDS_CONCURRENCY} in flight:`,
    run("1 shard ", r.one),
    run("8 shards", r.eight),
    `  local workerd runs every object on one thread (its busiest thread had ${(100 * r.eight.busiest_thread_share).toFixed(0)}% of the CPU at 8 shards); there, rate x CPU per webhook = ${p.core_share.one.toFixed(2)} of a core at 1 shard, ${p.core_share.eight.toFixed(2)} at 8: throughput is the inverse of the cost per webhook, as the projection assumes per object`,
    `  projection to ${PROJECTED_SHARDS} shards (docs/performance.md, "Call shards"): one object X1 = ${p.inputs.x1_per_s.toFixed(0)} webhooks/s (${f.measuredOneObject ? "the Dispatcher alone, measured above" : "the 1-shard steady rate"}); cost at 8 shards over 1 k = ${p.inputs.k.toFixed(3)}; directory requests beyond renewals ${p.inputs.dw.toFixed(4)} per webhook, renewals ${p.inputs.r.toFixed(2)} per shard per s, each costing ${p.inputs.c.toFixed(2)} webhooks: ${PROJECTED_SHARDS} shards ${p.shards_per_s.toFixed(0)} webhooks/s, limited by ${p.limited_by}; global ${(100 * p.global_busy).toFixed(0)}% busy, its directory part ${(100 * p.directory_busy).toFixed(0)}%: projected_speedup_32 ${p.speedup.toFixed(1)}`,
  ];
}

/** The call-shard figures for the JSON line. */
function shardJson(f) {
  const { latency: l, runs: r, projection: p } = f;
  return {
    shards_p50_ratio: l.eight.p50 / l.one.p50,
    directory_requests_per_webhook: r.eight.directory_per_webhook,
    objects_per_webhook: r.eight.reaching_per_webhook + r.eight.directory_per_webhook,
    objects_per_webhook_1: r.one.reaching_per_webhook + r.one.directory_per_webhook,
    cpu_ms_per_webhook_1: l.one.cpu,
    cpu_ms_per_webhook_8: l.eight.cpu,
    cpu_8_to_1_ratio: l.eight.cpu / l.one.cpu,
    projected_speedup_32: p.speedup,
    shards: { latency: l, sequential: f.seq, runs: r, projection: p, objects_8: f.objects },
  };
}

/** BENCH_ONLY=shards: the call-shard figures alone. */
async function shardsOnly() {
  const before = conditions();
  const figures = await shardFigures();
  console.log("\n== bench: call shards (BENCH_ONLY=shards)");
  console.log(`machine: ${before.machine}; load average (1/5/15 min) ${before.load} before; commit ${before.commit}`);
  for (const line of shardLines(figures)) console.log(line);
  if (process.env.BENCH_JSON === "1") console.log(JSON.stringify({ commit: before.commit, ...shardJson(figures) }));
}

if (process.env.BENCH_ONLY === "overload") {
  await overloadOnly();
} else if (process.env.BENCH_ONLY === "shards") {
  await shardsOnly();
} else if (process.env.BENCH_ONLY === "metrics") {
  await metricsOnly();
} else {
  profiledRun();
  await main();
}
