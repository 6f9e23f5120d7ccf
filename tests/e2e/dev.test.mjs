// Smoke tests of `make dev` + `make demo-call`, each on free ports (the OS
// picks them: CALLFENCE_DEV_PORT, CALLFENCE_DEV_TELNYX_PORT and
// CALLFENCE_DEV_NODE_PORTS set to 0), so they run beside a `make dev` on
// the usual ports and never skip:
//
// - scripts/dev.mjs in this checkout with a scratch dev directory (its own
//   secrets, state and agents): one demo call must reach M3 and be answered
//   through its agent, a deploy of the demo app's HEAD to M3 must go live;
// - `make dev` in a copy of this checkout under /tmp (the agents refuse a
//   state directory there): it must keep its state outside the copy, say
//   where in its banner, and `make demo-call` from the copy must succeed.
//
// The first also runs `make observe` (scripts/observe.mjs) against it: a
// real Prometheus must scrape the edge and the three agents.
//
// Then Ctrl-C or SIGTERM: every process the stack started must be gone.

import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, realpathSync, rmSync, statSync, symlinkSync } from "node:fs";
import { createHash } from "node:crypto";
import { basename, dirname, join } from "node:path";
import { test } from "node:test";
import { agentBins, freePort } from "./agents-cluster.mjs";
import { durableScratchRoot, ROOT } from "./harness.mjs";

const FREE_PORTS = { CALLFENCE_DEV_PORT: "0", CALLFENCE_DEV_TELNYX_PORT: "0", CALLFENCE_DEV_NODE_PORTS: "0" };

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
    const timer = setTimeout(() => child.kill("SIGKILL"), 30_000);
    child.once("exit", (status) => {
      clearTimeout(timer);
      resolve({ status, stdout, stderr });
    });
  });
}

/**
 * Starts the dev stack (`cmd args` in `cwd`, in its own process group as a
 * terminal would run it) and waits for its banner. `stop(signal)` signals
 * the group (SIGINT: Ctrl-C) or the process alone, waits for it to exit and
 * returns { exit, leftover }: the recorded processes still alive (killed).
 */
async function startDev(cmd, args, { cwd, env, devDir }) {
  const dev = spawn(cmd, args, { cwd, env, detached: true, stdio: ["ignore", "pipe", "pipe"] });
  const log = { out: "" };
  dev.stdout.on("data", (c) => (log.out += c));
  dev.stderr.on("data", (c) => (log.out += c));
  // "close": exited and its output read to the end.
  const exited = new Promise((resolve) => dev.once("close", (code, signal) => resolve({ code, signal })));
  let pids = [];
  const recorded = () => JSON.parse(readFileSync(join(devDir, "pids.json"), "utf8")).children.map((c) => c.pid);
  const stop = async (signal, group) => {
    if (existsSync(join(devDir, "pids.json"))) pids = [...new Set([...pids, ...recorded()])];
    if (dev.exitCode === null && dev.signalCode === null) process.kill(group ? -dev.pid : dev.pid, signal);
    let timer;
    const exit = await Promise.race([exited, new Promise((r) => (timer = setTimeout(() => r(null), 25_000)))]);
    clearTimeout(timer);
    if (exit === null) process.kill(-dev.pid, "SIGKILL");
    const leftover = pids.filter(alive);
    for (const pid of leftover) process.kill(pid, "SIGKILL");
    return { exit, leftover };
  };
  try {
    const until = Date.now() + 90_000;
    while (!log.out.includes("callfence dev is running")) {
      assert.equal(dev.exitCode, null, `the dev stack exited early:\n${log.out}`);
      assert.ok(Date.now() < until, `the dev stack did not start:\n${log.out}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    pids = recorded();
  } catch (error) {
    await stop("SIGKILL", true);
    throw error;
  }
  return { log, stop, pids: () => pids, track: () => (pids = [...new Set([...pids, ...recorded()])]) };
}

test("make dev runs the demo nodes, a demo call is answered, a deploy goes live, and stopping leaves nothing", {
  timeout: 180_000,
}, async () => {
  const bins = agentBins();
  const dir = mkdtempSync(join(durableScratchRoot(), "e2e-dev-"));
  const env = { ...process.env, ...FREE_PORTS, CALLFENCE_DEV_DIR: dir, CALLFENCE_AGENT_BIN_DIR: bins };
  const dev = await startDev("node", [join(ROOT, "scripts/dev.mjs")], { cwd: ROOT, env, devDir: dir });
  let stopped;
  try {
    const { out } = dev.log;
    for (const node of ["M1", "M2", "M3"]) assert.match(out, new RegExp(`${node} .* eligible`), out);
    assert.ok(out.includes(`dev directory  ${dir}`), out);
    // Free ports, not the example registry's 8701-8703.
    assert.doesNotMatch(out, /127\.0\.0\.1:87\d\d|127\.0\.0\.1:8787 /, out);
    assert.equal(dev.pids().length, 8, "workerd, the fake Telnyx API, and an agent and an app per node");
    for (const file of ["keys/telnyx.seed", "keys/admin-token", "keys/metrics-token", "nodes/M1/node.key"]) {
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
    assert.match(dev.log.out, /fake Telnyx: answer v3:demo-/);

    // The edge's metrics, at the URL the banner prints, with the dev metrics token.
    const info = JSON.parse(readFileSync(join(dir, "dev.json"), "utf8"));
    assert.ok(out.includes(`edge metrics   ${info.metrics}`), out);
    const metricsToken = readFileSync(info.metrics_token_file, "utf8").trim();
    const scraped = await fetch(info.metrics, { headers: { authorization: `Bearer ${metricsToken}` } });
    assert.equal(scraped.status, 200);
    assert.match(await scraped.text(), /^callfence_webhooks_total\{outcome="delivered"\} [1-9]\d*$/m);

    // The metrics: the banner names each agent's metrics URL, and `make
    // observe` (scripts/observe.mjs) has a real Prometheus scrape them all
    // and the edge with the dev metrics token.
    for (const [node, n] of Object.entries(info.nodes)) {
      assert.ok(out.includes(`${node} ${n.metrics}`), out);
      assert.match(await (await fetch(n.metrics)).text(), /^callfence_agent_info\{/m, node);
    }
    const observePort = String(await freePort());
    const observe = spawn("node", [join(ROOT, "scripts/observe.mjs")], { cwd: ROOT, env: { ...env, CALLFENCE_OBSERVE_PORT: observePort }, stdio: ["ignore", "pipe", "pipe"] });
    let observed = "";
    observe.stdout.on("data", (c) => (observed += c));
    observe.stderr.on("data", (c) => (observed += c));
    try {
      const until = Date.now() + 60_000;
      for (;;) {
        assert.ok(Date.now() < until, `make observe: no scrape of the edge and the three agents:\n${observed}`);
        if (observed.includes(`http://127.0.0.1:${observePort}`)) {
          const up = await (await fetch(`http://127.0.0.1:${observePort}/api/v1/query?query=up`)).json();
          if (up.data.result.length === 4 && up.data.result.every((r) => r.value[1] === "1")) break;
        }
        await new Promise((r) => setTimeout(r, 250));
      }
    } finally {
      observe.kill("SIGTERM");
      await new Promise((r) => (observe.exitCode === null ? observe.once("exit", r) : r()));
    }

    // The README's deploy: M3 runs from releases/current; deploy the demo app repo's HEAD.
    const head = (await run("git", ["-C", join(dir, "demo-app"), "rev-parse", "HEAD"])).stdout.trim();
    const deployed = await run(join(bins, "callfence-agent"), ["--config", join(dir, "nodes/M3/agent.toml"), "deploy", "--sha", head, "--json"], { env });
    assert.equal(deployed.status, 0, `${deployed.stdout}\n${deployed.stderr}`);
    const result = JSON.parse(deployed.stdout.trim());
    assert.equal(result.live, head, deployed.stdout);
    assert.equal(result.mode, "active");
    // The restarted app is a new process: it must be gone at the end too.
    dev.track();
  } finally {
    stopped = await dev.stop("SIGTERM", false);
    rmSync(dir, { recursive: true, force: true });
  }
  assert.deepEqual(stopped.exit, { code: 0, signal: null }, dev.log.out);
  assert.deepEqual(stopped.leftover, [], "every process dev.mjs started is gone");
  assert.ok(!existsSync(dir));
});

/** A copy of this checkout's files (tracked and new, as they are on disk,
 * so uncommitted work is what runs) under /tmp, with build/ and
 * node_modules linked to this checkout's: nothing is built again. */
function checkoutUnderTmp() {
  const copy = mkdtempSync("/tmp/callfence-checkout-");
  const files = execFileSync("git", ["-C", ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"], { encoding: "utf8" })
    .split("\0")
    .filter((f) => f && existsSync(join(ROOT, f)));
  for (const file of files) {
    mkdirSync(dirname(join(copy, file)), { recursive: true });
    copyFileSync(join(ROOT, file), join(copy, file));
  }
  for (const shared of ["build", "node_modules"]) symlinkSync(realpathSync(join(ROOT, shared)), join(copy, shared));
  return copy;
}

test("make dev and make demo-call work from a checkout under /tmp, with the agents' state outside it", {
  timeout: 180_000,
}, async () => {
  const copy = checkoutUnderTmp();
  // The dev directory goes under XDG_STATE_HOME (here a scratch directory,
  // so the test leaves nothing in ~/.local/state).
  const stateHome = mkdtempSync(join(durableScratchRoot(), "e2e-dev-xdg-"));
  const env = { ...process.env, ...FREE_PORTS, XDG_STATE_HOME: stateHome, CALLFENCE_DEV_NO_BUILD: "1", CALLFENCE_AGENT_BIN_DIR: agentBins() };
  delete env.CALLFENCE_DEV_DIR;
  delete env.MAKEFLAGS;
  delete env.MAKELEVEL;
  // Where dev.mjs must put it: <XDG_STATE_HOME>/callfence-dev/<name>-<hash of the real path>.
  const real = realpathSync(copy);
  const devDir = join(stateHome, "callfence-dev", `${basename(real)}-${createHash("sha256").update(real).digest("hex").slice(0, 12)}`);
  let dev;
  let stopped;
  try {
    dev = await startDev("make", ["--no-print-directory", "dev"], { cwd: copy, env, devDir });
    const { out } = dev.log;
    assert.ok(out.includes(`dev directory  ${devDir}`), out);
    assert.ok(!existsSync(join(copy, ".dev")), "nothing is kept in the checkout under /tmp");
    for (const node of ["M1", "M2", "M3"]) {
      assert.ok(existsSync(join(devDir, "nodes", node, "state", "mode")), `${node}'s agent state is in the dev directory`);
      assert.match(out, new RegExp(`${node} .* eligible`), out);
    }

    const call = await run("make", ["--no-print-directory", "demo-call"], { cwd: copy, env });
    assert.equal(call.status, 0, `${call.stdout}\n${call.stderr}`);
    assert.match(call.stdout, /webhook answer: 200/);
    assert.match(call.stdout, /"delivered_to":"M3"/);
    assert.match(call.stdout, /owner M3 at epoch \d+, state answered, fence granted/);
  } finally {
    stopped = await dev?.stop("SIGINT", true);
    rmSync(copy, { recursive: true, force: true });
    rmSync(stateHome, { recursive: true, force: true });
  }
  assert.match(dev.log.out, /dev: stopped/, dev.log.out);
  assert.deepEqual(stopped.leftover, [], "every process the dev stack started is gone");
});
