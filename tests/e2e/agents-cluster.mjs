// A small callfence deployment for the agent end-to-end tests: the real Worker
// and Dispatcher in Miniflare (harness.mjs), one real `callfence-agent run`
// per node (its own TOML config, 0600 key file, state directory and a git
// checkout with one commit), a `callfence-demo-app` per node as the voice app,
// and the shared fake Telnyx API (`callfence-fake-telnyx`, scripts/fake-telnyx.mjs)
// on loopback, which records every command.
//
// The agent binaries are built in `agentBins()` with `cargo build -p
// callfence-agent --bins` in the repository's own target directory; set
// CALLFENCE_AGENT_BIN_DIR to a directory holding prebuilt binaries to skip the
// build. Every process started here is killed by `close()` (and, as a last
// resort, when the test process exits). CALLFENCE_E2E_VERBOSE=1 echoes the
// agents' and apps' logs.
//
// A node listed in `deploy` runs from a releases layout (SPEC §14): a bare
// remote with the app's history, `releases/<sha>` checkouts, `current` as the
// runtime checkout, and `restart.sh` as the supervisor command, which really
// stops the running demo app (pid file) and starts it again from `current`.
// A release's own files shape how its app behaves, as real code would:
// NOT_READY (never healthy), WRONG_SHA (reports another SHA), REFUSE_PROBES
// (answers L5 probes 503), BREAK_TUNNEL (the node's fake tunnel, which
// carries the public probe URL to the agent, answers 502).

import { spawn, spawnSync } from "node:child_process";
import { createHash, randomInt, sign as cryptoSign } from "node:crypto";
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { createServer as createNetServer } from "node:net";
import { join } from "node:path";
import { startFakeTelnyx } from "../../scripts/fake-telnyx.mjs";
import { bearer, durableScratchRoot, ed25519, nowSeconds, read, ROOT, sha256Hex, startEdge, telnyxHeaders } from "./harness.mjs";

export const LINE = { id: "main", number: "+15102160079" };
export const CANARY_CALLER = "+14155550100";
export const PLAIN_CALLER = "+14155550111";
const VERBOSE = process.env.CALLFENCE_E2E_VERBOSE === "1";

// Children still running, killed on exit whatever happens to the tests.
const live = new Set();
// Pid files of apps a supervisor script started (not our children).
const pidFiles = new Set();
function killPidFile(path) {
  try {
    process.kill(Number(readFileSync(path, "utf8").trim()), "SIGKILL");
  } catch {
    // gone already
  }
}
function killAll() {
  for (const path of pidFiles) killPidFile(path);
  for (const child of live) {
    try {
      child.kill("SIGKILL");
    } catch {
      // already gone
    }
  }
}
process.on("exit", killAll);
for (const signal of ["SIGINT", "SIGTERM"]) {
  process.once(signal, () => {
    killAll();
    process.exit(130);
  });
}

let bins;
/** The directory holding callfence-agent, callfence-demo-app and
 * callfence-fake-telnyx (built once). */
export function agentBins() {
  if (bins) return bins;
  if (process.env.CALLFENCE_AGENT_BIN_DIR) return (bins = process.env.CALLFENCE_AGENT_BIN_DIR);
  const build = spawnSync("cargo", ["build", "-p", "callfence-agent", "--bins"], {
    cwd: ROOT,
    encoding: "utf8",
    stdio: ["ignore", "ignore", "pipe"],
  });
  if (build.status !== 0) throw new Error(`cargo build -p callfence-agent --bins failed:\n${build.stderr}`);
  const meta = spawnSync("cargo", ["metadata", "--format-version", "1", "--no-deps"], {
    cwd: ROOT,
    encoding: "utf8",
    maxBuffer: 64 * 1024 * 1024,
  });
  if (meta.status !== 0) throw new Error(`cargo metadata failed:\n${meta.stderr}`);
  return (bins = join(JSON.parse(meta.stdout).target_directory, "debug"));
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Polls `fn` until it returns a truthy value; throws `what` at the deadline. */
export async function waitFor(what, fn, { timeout = 10_000, every = 100 } = {}) {
  const deadline = Date.now() + timeout;
  let last;
  for (;;) {
    try {
      last = await fn();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what} (last: ${describe(last)})`);
    await sleep(every);
  }
}

function describe(value) {
  if (value instanceof Error) return value.message;
  try {
    return JSON.stringify(value)?.slice(0, 400);
  } catch {
    return String(value);
  }
}

/**
 * A free loopback port (free when asked) below the kernel's ephemeral range.
 * A port the kernel hands out for `listen(0)` comes from the same range as
 * the source ports of outgoing connections, and a drill opens thousands of
 * those: one could take the port between this call and the process that
 * listens on it ("Address already in use"). Below the range, only another
 * listener can.
 */
export async function freePort() {
  const [low] = readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/).map(Number);
  const min = 10_000;
  const max = Number.isInteger(low) && low > min + 1_000 ? low - 1 : 0;
  for (let attempt = 0; max && attempt < 200; attempt += 1) {
    const port = min + randomInt(max - min + 1);
    if (await canListen(port)) return port;
  }
  // No room below the range on this machine: the kernel's pick.
  return canListen(0);
}

/** Listens on `port` (0: any) on loopback and closes; the port, or 0 when taken. */
async function canListen(port) {
  const server = createNetServer();
  const ok = await new Promise((resolve) => {
    server.once("error", () => resolve(false));
    server.listen(port, "127.0.0.1", () => resolve(true));
  });
  if (!ok) return 0;
  const bound = server.address().port;
  await new Promise((resolve) => server.close(resolve));
  return bound;
}

/** SPEC §8: the deterministic answer command_id. */
export function commandId(ccid, epoch) {
  const b = createHash("sha256").update(`callfence-answer|${ccid}|${epoch}`).digest().subarray(0, 16);
  b[6] = (b[6] & 0x0f) | 0x50;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = b.toString("hex");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

/** A Telnyx webhook body. */
export function event({ id, type, session, ccid, from = PLAIN_CALLER, to = LINE.number, direction = "incoming" }) {
  return JSON.stringify({
    data: {
      id,
      event_type: type,
      record_type: "event",
      occurred_at: new Date().toISOString(),
      payload: { call_control_id: ccid, call_session_id: session, call_leg_id: `leg-${ccid}`, from, to, direction },
    },
    meta: { attempt: 1, delivered_to: "callfence" },
  });
}

/** The shared fake Telnyx API (callfence-fake-telnyx) with the suites' helpers:
 * `requests()` is every recorded request, `answers(ccid)` the answer commands of
 * one leg (both asked of the fake), and `log` the same records as they happened,
 * with the node that sent each (a synchronous copy for the drills). */
async function startTelnyx(binDir, callers = {}) {
  // Every record, also kept here as it is printed, in the shape the drills'
  // checker reads: { ccid, action, command_id, node, at, body }.
  const requests = [];
  const fake = await startFakeTelnyx(binDir, {
    callers,
    onLine: (r) =>
      requests.push({
        ccid: r.call_control_id,
        action: r.action,
        command_id: r.command_id,
        node: r.caller,
        at: Date.parse(r.at),
        body: r.body,
      }),
  });
  live.add(fake.child);
  fake.child.once("exit", () => live.delete(fake.child));
  return {
    url: fake.url,
    log: requests,
    requests: () => fake.record(),
    answers: (ccid) => fake.record({ call_control_id: ccid, action: "answer" }),
    close: () => fake.close(),
  };
}

function git(dir, ...args) {
  const r = spawnSync("git", ["-C", dir, "-c", "user.name=e2e", "-c", "user.email=e2e@example.com", ...args], {
    encoding: "utf8",
  });
  if (r.status !== 0) throw new Error(`git ${args.join(" ")}: ${r.stderr}`);
  return r.stdout.trim();
}

function writeSecret(path, text) {
  writeFileSync(path, text, { mode: 0o600 });
  chmodSync(path, 0o600);
}

/** Starts a process (with `env` added to ours), keeping its output lines. */
function launch(name, bin, args, env = {}) {
  const child = spawn(bin, args, { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, ...env } });
  live.add(child);
  const lines = [];
  const keep = (chunk) => {
    for (const line of chunk.toString("utf8").split("\n")) {
      if (!line) continue;
      lines.push(line);
      if (VERBOSE) process.stderr.write(`[${name}] ${line}\n`);
    }
  };
  child.stdout.on("data", keep);
  child.stderr.on("data", keep);
  const exited = new Promise((resolve) => {
    child.on("exit", (code, signal) => resolve({ code, signal }));
    child.on("error", (e) => {
      lines.push(`spawn failed: ${e.message}`);
      resolve({ code: -1, signal: null });
    });
  });
  exited.then(() => live.delete(child));
  return { child, lines, exited };
}

async function stop(proc, signal = "SIGKILL") {
  if (!proc || proc.child.exitCode !== null || proc.child.signalCode !== null) return;
  proc.child.kill(signal);
  await proc.exited;
}

/**
 * Starts the deployment. `nodes` maps node id to registry fields
 * (`role`, `canary_go`, ...); `policy(nodeIds)` returns the routing policy.
 * Optional: `edge` (startEdge options: a fixed `port`, `bindings`),
 * `originFront(id, url)` returning the URL the edge should use for a node's
 * origin (a fault proxy in front of `url`; the agent still listens on `url`),
 * `edgeFront(url)` returning the edge URL the agents should use (a recorder
 * in front of the edge), `validForS` (each beat's validity, 3 s by default so
 * that staleness shows quickly; a suite that never tests staleness takes a
 * longer one, so a beat delayed by a loaded machine cannot make a node stale
 * between two of its steps), `appArgs` (extra arguments of every demo app,
 * such as `--max-calls`), `metrics` (true: each agent also serves its
 * metrics on a `listen.metrics_listen` of its own, at `node.metricsUrl`).
 */
export async function startCluster({ nodes, policy, deploy = [], edge: edgeOptions = {}, originFront, edgeFront, validForS = 3, appArgs = [], metrics = false }) {
  const binDir = agentBins();
  // Not under /tmp: the agent refuses a temporary state directory.
  const work = mkdtempSync(join(durableScratchRoot(), "e2e-agents-"));
  const edge = await startEdge(edgeOptions);
  // Each node has its own Telnyx API key, so the fake's record says which
  // node sent each command (the drills' checker needs it).
  const callers = {};
  for (const id of Object.keys(nodes)) {
    mkdirSync(join(work, id), { recursive: true });
    callers[id] = join(work, id, "telnyx-api-key");
    writeSecret(callers[id], `KEY_e2e_${id}\n`);
  }
  const telnyx = await startTelnyx(binDir, callers);
  const { keys } = edge;
  const cluster = { edge, telnyx, work, nodes: {}, keys };
  const agentsEdgeUrl = edgeFront ? await edgeFront(edge.url) : edge.url;

  const admin = bearer(keys.adminToken);
  const api = async (path, init = {}) =>
    read(await edge.fetch(path, { ...init, headers: { ...admin, ...(init.headers ?? {}) } }));

  /** Replaces a document (GET its revision, PUT with If-Match). */
  cluster.put = async (kind, doc) => {
    const current = await api(`/v1/${kind}`);
    const revision = current.status === 200 ? current.body.revision : 0;
    const res = await api(`/v1/${kind}`, {
      method: "PUT",
      headers: { "if-match": `"${revision}"`, "content-type": "application/json" },
      body: JSON.stringify(doc),
    });
    if (res.status !== 200) throw new Error(`PUT /v1/${kind}: ${res.status} ${JSON.stringify(res.body)}`);
    return res.body.revision;
  };
  cluster.registry = () => {
    const out = {};
    for (const [id, n] of Object.entries(cluster.nodes)) {
      out[id] = {
        role: "stable",
        fallback_approved: false,
        admin_drained: false,
        max_calls: 20,
        ...n.registryFields,
        origin_url: n.originUrl,
        keys: Object.fromEntries(n.registryKeys.map((k) => [k.kid, k.publicKey])),
      };
    }
    return { schema: "callfence_nodes_v1", nodes: out };
  };
  cluster.status = async () => {
    const res = await api("/v1/status");
    if (res.status !== 200) throw new Error(`status ${res.status}`);
    return res.body;
  };
  cluster.nodeStatus = async (id) => (await cluster.status()).nodes.find((n) => n.node === id);
  /** Waits until the edge's view of node `id` satisfies `pred`. */
  cluster.waitNode = (id, what, pred, timeout = 10_000) =>
    waitFor(`${id}: ${what}`, async () => {
      const n = await cluster.nodeStatus(id);
      return n && pred(n) ? n : false;
    }, { timeout });
  cluster.waitEligible = (id, timeout) => cluster.waitNode(id, "eligible", (n) => n.eligible === true, timeout);
  cluster.decisions = async (session) =>
    (await api(`/v1/decisions?call_session_id=${encodeURIComponent(session)}`)).body.decisions;
  cluster.call = async (session) => api(`/v1/calls/${encodeURIComponent(session)}`);

  /** Posts a Telnyx-signed webhook to the edge; returns { status, body }. */
  cluster.webhook = async (body) =>
    read(
      await edge.fetch("/v1/telnyx/webhook", {
        method: "POST",
        headers: telnyxHeaders(body, keys.telnyx.privateKeyObject),
        body,
      }),
    );
  /** Sends a webhook until the edge answers something other than 503 in_progress. */
  cluster.deliver = async (body, timeout = 8_000) =>
    waitFor("a settled answer from the edge", async () => {
      const res = await cluster.webhook(body);
      return ["in_progress", "delivery_unknown"].includes(res.body?.error) ? false : res;
    }, { timeout, every: 300 });

  /** An assertion as the edge mints it (SPEC §7), for forging tests. */
  cluster.assertion = ({ node, body, session, ccid, eventId, epoch = 1, privateKey = keys.edge.privateKeyObject, kid = keys.edgeKid }) => {
    const iat = nowSeconds();
    const claims = {
      iss: "callfence-edge",
      node,
      call_session_id: session,
      call_control_id: ccid,
      event_id: eventId,
      epoch,
      attempt: 1,
      body_sha256: sha256Hex(body),
      iat,
      exp: iat + 60,
    };
    const payload = Buffer.from(JSON.stringify(claims)).toString("base64url");
    const sig = cryptoSign(null, Buffer.from(`v1.${kid}.${payload}`), privateKey).toString("base64url");
    return `v1.${kid}.${payload}.${sig}`;
  };

  for (const [id, fields] of Object.entries(nodes)) {
    const dir = join(work, id);
    const checkout = join(dir, "checkout");
    mkdirSync(checkout, { recursive: true });
    git(checkout, "init", "-q");
    writeFileSync(join(checkout, "app.txt"), `voice app for ${id}\n`);
    git(checkout, "add", "app.txt");
    git(checkout, "commit", "-q", "-m", "voice app");
    const key = ed25519();
    const keyPath = join(dir, "k1.key");
    writeSecret(keyPath, `${key.seed}\n`);
    const telnyxKey = callers[id];
    const [origin, local, app] = [await freePort(), await freePort(), await freePort()];
    const metricsPort = metrics ? await freePort() : null;
    const deployable = deploy.includes(id);
    const node = {
      id,
      dir,
      checkout,
      sha: git(checkout, "rev-parse", "HEAD"),
      stateDir: join(dir, "state"),
      // Made by the agent when it first starts (SPEC §11).
      tokenPath: join(dir, "state", "local-api.token"),
      configPath: join(dir, "agent.toml"),
      registryFields: fields,
      registryKeys: [{ kid: "k1", publicKey: key.publicKey }],
      key: { kid: "k1", path: keyPath, ...key },
      nextKey: null,
      originUrl: `http://127.0.0.1:${origin}/callfence/telnyx`,
      listenOrigin: `http://127.0.0.1:${origin}/callfence/telnyx`,
      localUrl: `http://127.0.0.1:${local}`,
      metricsUrl: metricsPort ? `http://127.0.0.1:${metricsPort}/metrics` : null,
      appUrl: `http://127.0.0.1:${app}`,
      agent: null,
      app: null,
      appArgs: [],
      runtime: checkout,
      deployToml: "",
      probeUrl: null,
    };
    if (deployable) await makeDeployable(node, binDir, { app, origin });
    node.writeConfig = () => {
      const next = node.nextKey ? `[next_key]\nid = "${node.nextKey.kid}"\npath = "${node.nextKey.path}"\n` : "";
      writeFileSync(
        node.configPath,
        `node = "${id}"
state_dir = "${node.stateDir}"
runtime_checkout = "${node.runtime}"

[key]
id = "${node.key.kid}"
path = "${keyPath}"

${next}
[edge]
url = "${agentsEdgeUrl}"
[edge.public_keys]
${keys.edgeKid} = "${keys.edge.publicKey}"
${keys.edgeNextKid} = "${keys.edgeNext.publicKey}"

[telnyx]
public_keys = ["${keys.telnyx.publicKey}"]
api_base = "${telnyx.url}"
api_key_file = "${telnyxKey}"
connection_id = "conn-e2e"

[listen]
origin = "127.0.0.1:${origin}"
local = "127.0.0.1:${local}"
${metricsPort ? `metrics_listen = "127.0.0.1:${metricsPort}"` : ""}

[app]
webhook_url = "${node.appUrl}/telnyx/webhook"
status_url = "${node.appUrl}/callfence/status"

[origin]
url = "${node.originUrl}"
${node.probeUrl ? `probe_url = "${node.probeUrl}"` : ""}

[timing]
heartbeat_interval_ms = 500
valid_for_s = ${validForS}
# The agent's default: on a loaded machine a 300 ms budget read a slow
# tunnel or app probe as tunnel_down / not ready and moved calls to M2.
probe_timeout_ms = 2000
edge_timeout_ms = 1000
app_timeout_ms = 8000
telnyx_resend_ms = 400
telnyx_timeout_ms = 3000
duplicate_wait_ms = 5000
drain_poll_ms = 100
${node.deployToml}`,
      );
    };
    /** Runs a one-shot agent command (`mode set drained`, ...). */
    node.cli = (...args) =>
      spawnSync(join(binDir, "callfence-agent"), ["--config", node.configPath, ...args], { encoding: "utf8" });
    /** As `cli`, with `env` added to the command's environment. */
    node.cliWith = (env, ...args) =>
      spawnSync(join(binDir, "callfence-agent"), ["--config", node.configPath, ...args], { encoding: "utf8", env: { ...process.env, ...env } });
    /** Starts `callfence-agent run`; `env` is added to its environment (e.g. the test clock offset). */
    node.startAgent = async (env = {}) => {
      node.agent = launch(`agent ${id}`, join(binDir, "callfence-agent"), ["--config", node.configPath, "run"], env);
      const started = node.agent;
      await waitFor(`agent ${id} to serve`, async () => {
        if (started.child.exitCode !== null || started.lines.some((l) => l.startsWith("spawn failed"))) {
          throw new Error(`agent ${id} exited: ${started.lines.join("\n")}`);
        }
        return (await fetch(`${node.localUrl}/healthz`)).status === 200;
      });
    };
    node.killAgent = (signal = "SIGKILL") => stop(node.agent, signal);
    node.startApp = node.startApp ?? (async (extra = []) => {
      node.appArgs = extra;
      node.app = launch(`app ${id}`, join(binDir, "callfence-demo-app"), [
        "--listen",
        `127.0.0.1:${app}`,
        "--agent",
        node.localUrl,
        "--agent-token-file",
        node.tokenPath,
        "--line",
        `${LINE.id}=${LINE.number}`,
        ...extra,
      ]);
      await waitFor(`app ${id} to serve`, async () => (await fetch(`${node.appUrl}/callfence/status`)).ok);
    });
    node.killApp = node.killApp ?? (() => stop(node.app));
    /** What the demo app was handed: { event_id: { event_type, count } }. */
    node.appEvents = async () => {
      const res = await fetch(`${node.appUrl}/demo/events`);
      return Object.fromEntries((await res.json()).events.map((e) => [e.event_id, e]));
    };
    node.appStatus = async () => (await fetch(`${node.appUrl}/callfence/status`)).json();
    /** A local API request as the voice app sends it: JSON, with the agent's token. */
    node.local = async (path, body) =>
      read(
        await fetch(`${node.localUrl}${path}`, {
          method: body === undefined ? "GET" : "POST",
          headers: { "content-type": "application/json", authorization: `Bearer ${readFileSync(node.tokenPath, "utf8").trim()}` },
          body: body === undefined ? undefined : JSON.stringify(body),
        }),
      );
    /** The running agent's latest deploy job (`callfence-agent job`, over its control socket), or null. */
    node.job = () => {
      const r = node.cli("job");
      return r.status === 0 ? JSON.parse(r.stdout) : null;
    };
    node.logs = () => (node.agent ? node.agent.lines : []);
    if (originFront) node.originUrl = await originFront(id, node.listenOrigin);
    node.writeConfig();
    const set = node.cli("mode", "set", "active");
    if (set.status !== 0) throw new Error(`mode set active: ${set.stderr}`);
    cluster.nodes[id] = node;
  }

  cluster.close = async () => {
    for (const n of Object.values(cluster.nodes)) {
      await n.killAgent();
      await n.killApp();
    }
    await telnyx.close();
    for (const n of Object.values(cluster.nodes)) await n.closeTunnel?.();
    await edge.dispose();
    rmSync(work, { recursive: true, force: true });
  };

  try {
    await cluster.put("nodes", cluster.registry());
    await cluster.put("policy", policy(Object.keys(nodes)));
    for (const n of Object.values(cluster.nodes)) {
      await n.startApp(appArgs);
      await n.startAgent();
    }
    for (const id of Object.keys(nodes)) await cluster.waitEligible(id, 15_000);
  } catch (e) {
    await cluster.close();
    throw e;
  }
  return cluster;
}

/**
 * Gives `node` a releases layout: a bare remote whose first commit is
 * checked out (and built) as the current release, the supervisor script,
 * and a fake tunnel in front of the agent's public probe URL. Adds
 * `node.commit(name, files)` (a branch off the first commit in the remote,
 * merged into `main` with the "ours" strategy so that it is reachable from
 * the protected branch without changing main's tree; a file whose content
 * is null is deleted) returning the new SHA, and `node.pullRequest(n, files)`
 * (the same commit, served only at `refs/pull/<n>/head`, as a code host
 * serves a pull request).
 */
async function makeDeployable(node, binDir, { app, origin }) {
  const { dir, id } = node;
  const src = join(dir, "src");
  const remote = join(dir, "remote.git");
  mkdirSync(src, { recursive: true });
  spawnSync("git", ["init", "-q", "--bare", remote]);
  git(src, "init", "-q", "-b", "main");
  writeFileSync(join(src, "app.txt"), `voice app for ${id}, release 1\n`);
  writeFileSync(join(src, "build.sh"), "mkdir -p build && cp app.txt build/app.out\n");
  writeFileSync(join(src, ".gitignore"), "build/\n");
  git(src, "add", ".");
  git(src, "commit", "-q", "-m", "release 1");
  git(src, "push", "-q", remote, "HEAD:refs/heads/main");
  const first = git(src, "rev-parse", "HEAD");
  node.remote = remote;
  node.firstSha = first;
  const branchOff = (name, files) => {
    git(src, "checkout", "-q", "-B", name, first);
    for (const [path, content] of Object.entries(files)) {
      if (content === null) rmSync(join(src, path), { force: true });
      else writeFileSync(join(src, path), content);
    }
    git(src, "add", "-A");
    git(src, "commit", "-q", "--allow-empty", "-m", name);
    return git(src, "rev-parse", "HEAD");
  };
  // The git commands run synchronously in this process, which also serves
  // the node's tunnel: each blocks the tunnel's answers, so the merge into
  // main is plumbing (no checkout) and both refs go in the one push.
  node.commit = (name, files) => {
    const sha = branchOff(name, files);
    const merge = git(src, "commit-tree", "main^{tree}", "-p", "main", "-p", sha, "-m", `merge ${name}`);
    git(src, "update-ref", "refs/heads/main", merge);
    git(src, "push", "-q", "-f", remote, `${name}:refs/heads/${name}`, "main:refs/heads/main");
    return sha;
  };
  node.pullRequest = (n, files) => {
    const sha = branchOff(`pr-${n}`, files);
    git(src, "push", "-q", "-f", remote, `HEAD:refs/pull/${n}/head`);
    return sha;
  };
  const releases = join(dir, "releases");
  const release = join(releases, first);
  mkdirSync(release, { recursive: true });
  git(release, "init", "-q");
  git(release, "fetch", "-q", remote, first);
  git(release, "checkout", "-q", "--detach", first);
  spawnSync("sh", ["build.sh"], { cwd: release });
  const current = join(dir, "current");
  symlinkSync(release, current);
  node.runtime = current;
  node.sha = first;
  node.releasesDir = releases;

  const pidFile = join(dir, "app.pid");
  pidFiles.add(pidFile);
  const broken = join(dir, "tunnel-broken");
  const script = join(dir, "restart.sh");
  writeFileSync(
    script,
    `#!/bin/sh
# The supervisor: stop the app, start it again from current.
pidfile='${pidFile}'
if [ -f "$pidfile" ]; then
  pid=$(cat "$pidfile")
  kill "$pid" 2>/dev/null
  i=0
  while kill -0 "$pid" 2>/dev/null && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done
fi
cur=$(readlink -f '${current}')
flags=""
[ -f "$cur/NOT_READY" ] && flags="$flags --not-ready"
[ -f "$cur/WRONG_SHA" ] && flags="$flags --sha 0000000000000000000000000000000000000000"
[ -f "$cur/REFUSE_PROBES" ] && flags="$flags --refuse-probes"
if [ -f "$cur/BREAK_TUNNEL" ]; then touch '${broken}'; else rm -f '${broken}'; fi
'${join(binDir, "callfence-demo-app")}' --listen 127.0.0.1:${app} --agent '${node.localUrl}' --agent-token-file '${node.tokenPath}' --line '${LINE.id}=${LINE.number}' --checkout "$cur" $flags >> '${join(dir, "app.log")}' 2>&1 < /dev/null &
echo $! > "$pidfile"
`,
  );
  // The node's "tunnel": carries the public probe URL to the agent's origin listener.
  const tunnel = createServer(async (req, res) => {
    if (existsSync(broken)) {
      res.writeHead(502).end("tunnel down");
      return;
    }
    try {
      const r = await fetch(`http://127.0.0.1:${origin}/callfence/health`);
      res.writeHead(r.status, { "content-type": "application/json" }).end(await r.text());
    } catch {
      res.writeHead(502).end("agent unreachable");
    }
  });
  await new Promise((resolve) => tunnel.listen(0, "127.0.0.1", resolve));
  node.probeUrl = `http://127.0.0.1:${tunnel.address().port}/callfence/health`;
  node.closeTunnel = () => new Promise((resolve) => tunnel.close(resolve));
  node.deployToml = `
[deploy]
remote = "${remote}"
branch = "main"
# The supervisor script restarts an app this test (root in CI) started, so
# restart runs as the agent: the named development opt-out. The attack
# tests (agent/tests/attacks/deploy.rs) cover a real build_user.
build_can_read_keys = true
releases_dir = "${releases}"
current = "${current}"
build = "sh build.sh"
artifacts = ["build/app.out"]
restart = "sh ${script}"
health_timeout = "10s"
drain_deadline = "30s"
keep = 2
`;
  node.startApp = async () => {
    const r = spawnSync("sh", [script], { encoding: "utf8" });
    if (r.status !== 0) throw new Error(`restart.sh: ${r.stderr}`);
    await waitFor(`app ${id} to serve`, async () => (await fetch(`${node.appUrl}/callfence/status`)).ok);
  };
  node.killApp = async () => killPidFile(pidFile);
  /** Runs `deploy`/`rollback`/`releases` with --json; { code, out, stderr }. */
  node.deployCli = (...args) =>
    new Promise((resolve) => {
      const child = spawn(join(binDir, "callfence-agent"), ["--config", node.configPath, ...args], { stdio: ["ignore", "pipe", "pipe"] });
      live.add(child);
      let stdout = "";
      let stderr = "";
      child.stdout.on("data", (c) => (stdout += c));
      child.stderr.on("data", (c) => (stderr += c));
      child.on("exit", (code) => {
        live.delete(child);
        let out = null;
        try {
          out = JSON.parse(stdout.trim().split("\n").pop());
        } catch {
          // not JSON
        }
        resolve({ code, out, stdout, stderr, child });
      });
      node.lastCli = child;
    });
}

/** The routing policy used by the suites: the line prefers M1 and falls back to M2; the canary caller prefers M3. */
export function standardPolicy(ids) {
  const policy = {
    schema: "riff_node_routing_policy_v1",
    default_node: "M1",
    by_line: { [LINE.id]: { called_number: LINE.number, preferred_node: "M1", fallback_node: "M2" } },
    by_caller: {},
  };
  if (ids.includes("M3")) {
    policy.by_caller[CANARY_CALLER] = {
      preferred_node: "M3",
      expires_at: new Date(Date.now() + 3_600_000).toISOString(),
      note: "canary",
    };
  }
  return policy;
}

let counter = 0;
/** A fresh call: session, leg and an event id maker. */
export function newCall(tag) {
  counter += 1;
  const n = `${tag}-${process.pid}-${counter}-${Date.now()}`;
  return { session: `sess-${n}`, ccid: `ccid-${n}`, eventId: (type) => `ev-${type}-${n}` };
}
