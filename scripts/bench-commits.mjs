#!/usr/bin/env node
// Storage commits of the Dispatcher, counted: 300 bench-only `writes_only`
// messages (an assignment's 9 SQL writes in its 2 commits; test-only switch
// CALLFENCE_TEST_WRITES_ONLY) with 8 in flight from a driver Worker, once
// with the Durable Object's SQLite on disk and once on tmpfs (/dev/shm),
// under `strace -f -c -w` of the workerd process (fsync and pwrite64 calls
// and their wall time). strace slows every syscall, so read the counts and
// the disk/tmpfs ratio, not the rates. Needs strace and build-testing/ (`make build-testing`).
// Usage: node scripts/bench-commits.mjs
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { startEdge, bindingsFor, testKeys, workerdPids } from "../tests/e2e/harness.mjs";
const DRIVER = `
export default { async fetch(request, env) {
  const { n, c, prefix } = await request.json();
  const stub = env.DISPATCHER.get(env.DISPATCHER.idFromName("global"));
  let next = 0, bad = 0;
  await Promise.all(Array.from({ length: c }, async () => { while (next < n) { const i = next++;
    const r = await stub.fetch("https://dispatcher/writes_only", { method: "POST", body: JSON.stringify({ v: 2, op: "writes_only", id: prefix + i, node: "M1", origin_url: "http://127.0.0.1:1/x" }) + "\\n{}" });
    const t = await r.text(); if (!t.includes('"ok":true')) bad++; } }));
  return Response.json({ bad });
} };`;
for (const where of ["disk", "shm"]) {
  const keys = testKeys();
  const dir = where === "shm" ? mkdtempSync("/dev/shm/callfence-commits-") : undefined;
  const before = new Set(workerdPids());
  const edge = await startEdge({ keys, bindings: { ...bindingsFor(keys), CALLFENCE_TEST_WRITES_ONLY: "1" }, driverScript: DRIVER, dir });
  const pid = workerdPids().find((p) => !before.has(p));
  const d = await edge.worker("driver");
  await (await d.fetch("http://d/", { method: "POST", body: JSON.stringify({ n: 50, c: 8, prefix: "warm" }) })).json();
  const st = spawn("strace", ["-f", "-c", "-w", "-e", "trace=fsync,fdatasync,pwrite64,write", "-p", String(pid)], { stdio: ["ignore", "ignore", "pipe"] });
  let out = ""; st.stderr.on("data", (b) => (out += b));
  await new Promise((r) => setTimeout(r, 500));
  const t0 = performance.now();
  const res = await (await d.fetch("http://d/", { method: "POST", body: JSON.stringify({ n: 300, c: 8, prefix: "m" }) })).json();
  const secs = (performance.now() - t0) / 1000;
  st.kill("SIGINT"); await new Promise((r) => st.on("exit", r));
  console.log(`${where}: 300 writes_only in ${secs.toFixed(2)} s = ${(300 / secs).toFixed(0)}/s, bad ${res.bad}\n${out}`);
  await edge.dispose();
  if (dir) rmSync(dir, { recursive: true, force: true });
}
