// Smoke test of `make dev` + `make demo-call`: scripts/dev.mjs in a scratch
// directory (its own secrets, state and agents; dispatcher and fake Telnyx
// on free ports), one demo call that must reach M3 and be answered through
// its agent, then SIGTERM: every process it started must be gone.
//
// The demo nodes listen on the example registry's fixed ports (8701-8703 and
// neighbours), so the test is skipped while a `make dev` is running.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync } from "node:fs";
import { createConnection } from "node:net";
import { join } from "node:path";
import { test } from "node:test";
import { agentBins } from "./agents-cluster.mjs";
import { durableScratchRoot, ROOT } from "./harness.mjs";

const NODE_PORTS = [8701, 8702, 8703, 8711, 8712, 8713, 9001, 9002, 9003];

function portBusy(port) {
  return new Promise((resolve) => {
    const socket = createConnection({ host: "127.0.0.1", port });
    socket.once("connect", () => {
      socket.destroy();
      resolve(true);
    });
    socket.once("error", () => resolve(false));
  });
}

function alive(pid) {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2)[0] !== "Z";
  } catch {
    return false;
  }
}

/** Runs a command to its end without blocking the event loop. */
function run(cmd, args, options) {
  return new Promise((resolve) => {
    const child = spawn(cmd, args, { ...options, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (c) => (stdout += c));
    child.stderr.on("data", (c) => (stderr += c));
    const timer = setTimeout(() => child.kill("SIGKILL"), 20_000);
    child.once("exit", (status) => {
      clearTimeout(timer);
      resolve({ status, stdout, stderr });
    });
  });
}

const busy = (await Promise.all(NODE_PORTS.map(portBusy))).some(Boolean);

test("make dev runs the demo nodes, a demo call is answered, and stopping leaves nothing", {
  skip: busy && "the demo node ports are in use (is `make dev` running?)",
  timeout: 60_000,
}, async () => {
  const bins = agentBins();
  // Not under /tmp: the agents refuse a temporary state directory.
  const dir = mkdtempSync(join(durableScratchRoot(), "e2e-dev-"));
  const env = {
    ...process.env,
    CALLFENCE_DEV_DIR: dir,
    CALLFENCE_DEV_PORT: "0",
    CALLFENCE_DEV_TELNYX_PORT: "0",
    CALLFENCE_AGENT_BIN_DIR: bins,
  };
  const dev = spawn("node", [join(ROOT, "scripts/dev.mjs")], { cwd: ROOT, env, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  dev.stdout.on("data", (c) => (out += c));
  dev.stderr.on("data", (c) => (out += c));
  const exited = new Promise((resolve) => dev.once("exit", (code, signal) => resolve({ code, signal })));
  let pids = [];
  let leftover = [];
  try {
    const until = Date.now() + 40_000;
    while (!out.includes("callfence dev is running")) {
      assert.equal(dev.exitCode, null, `dev.mjs exited early:\n${out}`);
      assert.ok(Date.now() < until, `dev.mjs did not start:\n${out}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    for (const node of ["M1", "M2", "M3"]) assert.match(out, new RegExp(`${node} .* eligible`), out);
    pids = JSON.parse(readFileSync(join(dir, "pids.json"), "utf8")).children.map((c) => c.pid);
    assert.equal(pids.length, 8, "workerd, the fake Telnyx API, and an agent and an app per node");
    const recorded = () => JSON.parse(readFileSync(join(dir, "pids.json"), "utf8")).children.map((c) => c.pid);
    for (const file of ["keys/telnyx.seed", "keys/admin-token", "nodes/M1/node.key"]) {
      assert.equal(statSync(join(dir, file)).mode & 0o777, 0o600, file);
    }

    const call = await run("node", [join(ROOT, "scripts/demo-call.mjs")], { cwd: ROOT, env });
    assert.equal(call.status, 0, `${call.stdout}\n${call.stderr}`);
    assert.match(call.stdout, /webhook answer: 200/);
    assert.match(call.stdout, /"delivered_to":"M3"/);
    assert.match(call.stdout, /assigned: rule line \(line property_management_ca\), prefers M3, chosen M3/);
    assert.match(call.stdout, /answer v3:demo-\S+ command_id=[0-9a-f-]{36}/);
    assert.match(call.stdout, /owner M3 at epoch \d+, state answered, fence granted/);
    assert.match(call.stdout, /call\.hangup: 200 .*the call is now ended/);
    assert.match(out, /fake Telnyx: answer v3:demo-/);

    // The README's deploy: M3 runs from releases/current; deploy the demo app repo's HEAD.
    const head = (await run("git", ["-C", join(dir, "demo-app"), "rev-parse", "HEAD"])).stdout.trim();
    const deployed = await run(join(bins, "callfence-agent"), ["--config", join(dir, "nodes/M3/agent.toml"), "deploy", "--sha", head, "--json"], { env });
    assert.equal(deployed.status, 0, `${deployed.stdout}\n${deployed.stderr}`);
    const result = JSON.parse(deployed.stdout.trim());
    assert.equal(result.live, head, deployed.stdout);
    assert.equal(result.mode, "active");
    // The restarted app is a new process: it must be gone at the end too.
    pids = [...new Set([...pids, ...recorded()])];
  } finally {
    if (dev.exitCode === null) dev.kill("SIGTERM");
    let timer;
    const result = await Promise.race([exited, new Promise((r) => (timer = setTimeout(() => r(null), 20_000)))]);
    clearTimeout(timer);
    if (result === null) dev.kill("SIGKILL");
    leftover = pids.filter(alive);
    for (const pid of leftover) process.kill(pid, "SIGKILL");
    rmSync(dir, { recursive: true, force: true });
    assert.deepEqual(result, { code: 0, signal: null }, out);
  }
  assert.deepEqual(leftover, [], "every process dev.mjs started is gone");
  assert.ok(!existsSync(dir));
});
