// A small callfence deployment for the agent end-to-end tests: the real Worker
// and Dispatcher in Miniflare (harness.mjs), one real `callfence-agent run`
// per node (its own TOML config, 0600 key file, state directory and a git
// checkout with one commit), a `callfence-demo-app` per node as the voice app,
// and a fake Telnyx API on loopback that records every command.
//
// The agent binaries are built in `agentBins()` with `cargo build -p
// callfence-agent --bins` in the repository's own target directory; set
// CALLFENCE_AGENT_BIN_DIR to a directory holding prebuilt binaries to skip the
// build. Every process started here is killed by `close()` (and, as a last
// resort, when the test process exits). CALLFENCE_E2E_VERBOSE=1 echoes the
// agents' and apps' logs.

import { spawn, spawnSync } from "node:child_process";
import { createHash, sign as cryptoSign } from "node:crypto";
import { chmodSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { createServer as createNetServer } from "node:net";
import { join } from "node:path";
import { bearer, durableScratchRoot, ed25519, nowSeconds, read, ROOT, sha256Hex, startEdge, telnyxHeaders } from "./harness.mjs";

export const LINE = { id: "main", number: "+15102160079" };
export const CANARY_CALLER = "+14155550100";
export const PLAIN_CALLER = "+14155550111";
const VERBOSE = process.env.CALLFENCE_E2E_VERBOSE === "1";

// Children still running, killed on exit whatever happens to the tests.
const live = new Set();
function killAll() {
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
/** The directory holding callfence-agent and callfence-demo-app (built once). */
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

/** A free loopback port (free when asked). */
export async function freePort() {
  const server = createNetServer();
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port;
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

/**
 * A fake Telnyx Call Control API: records every command (with the node whose
 * API key sent it, each node having its own); `POST /v2/calls` dials.
 */
export async function startFakeTelnyx() {
  const requests = [];
  let dials = 0;
  const server = createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const text = Buffer.concat(chunks).toString("utf8");
      let body = null;
      try {
        body = JSON.parse(text);
      } catch {
        // recorded as null
      }
      const path = req.url;
      const action = path.match(/^\/v2\/calls\/([^/]+)\/actions\/([a-z_]+)$/);
      const record = {
        method: req.method,
        path,
        ccid: action ? decodeURIComponent(action[1]) : null,
        action: action ? action[2] : path === "/v2/calls" ? "dial" : null,
        body,
        authorization: req.headers.authorization,
        node: (req.headers.authorization ?? "").match(/^Bearer KEY_e2e_(\S+)$/)?.[1] ?? null,
        at: Date.now(),
      };
      requests.push(record);
      res.writeHead(200, { "content-type": "application/json" });
      if (record.action === "dial") {
        dials += 1;
        res.end(
          JSON.stringify({
            data: {
              call_control_id: `dial-ccid-${dials}`,
              call_session_id: `dial-session-${dials}-${Date.now()}`,
              call_leg_id: `dial-leg-${dials}`,
              record_type: "call",
              is_alive: false,
            },
          }),
        );
      } else {
        res.end(JSON.stringify({ data: { result: "ok" } }));
      }
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    requests,
    answers: (ccid) => requests.filter((r) => r.action === "answer" && r.ccid === ccid),
    close: () => new Promise((resolve) => server.close(resolve)),
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

/** Starts a process, keeping its output lines; resolves once `ready()` holds. */
function launch(name, bin, args) {
  const child = spawn(bin, args, { stdio: ["ignore", "pipe", "pipe"] });
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
 * in front of the edge).
 */
export async function startCluster({ nodes, policy, edge: edgeOptions = {}, originFront, edgeFront }) {
  const binDir = agentBins();
  // Not under /tmp: the agent refuses a temporary state directory.
  const work = mkdtempSync(join(durableScratchRoot(), "e2e-agents-"));
  const edge = await startEdge(edgeOptions);
  const telnyx = await startFakeTelnyx();
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
    const telnyxKey = join(dir, "telnyx-api-key");
    writeSecret(telnyxKey, `KEY_e2e_${id}\n`);
    const [origin, local, app] = [await freePort(), await freePort(), await freePort()];
    const node = {
      id,
      dir,
      checkout,
      sha: git(checkout, "rev-parse", "HEAD"),
      stateDir: join(dir, "state"),
      configPath: join(dir, "agent.toml"),
      registryFields: fields,
      registryKeys: [{ kid: "k1", publicKey: key.publicKey }],
      key: { kid: "k1", path: keyPath, ...key },
      nextKey: null,
      originUrl: `http://127.0.0.1:${origin}/callfence/telnyx`,
      listenOrigin: `http://127.0.0.1:${origin}/callfence/telnyx`,
      localUrl: `http://127.0.0.1:${local}`,
      appUrl: `http://127.0.0.1:${app}`,
      agent: null,
      app: null,
      appArgs: [],
    };
    node.writeConfig = () => {
      const next = node.nextKey ? `[next_key]\nid = "${node.nextKey.kid}"\npath = "${node.nextKey.path}"\n` : "";
      writeFileSync(
        node.configPath,
        `node = "${id}"
state_dir = "${node.stateDir}"
runtime_checkout = "${checkout}"

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

[listen]
origin = "127.0.0.1:${origin}"
local = "127.0.0.1:${local}"

[app]
webhook_url = "${node.appUrl}/telnyx/webhook"
status_url = "${node.appUrl}/callfence/status"

[origin]
url = "${node.originUrl}"

[timing]
heartbeat_interval_ms = 500
valid_for_s = 3
probe_timeout_ms = 300
edge_timeout_ms = 1000
app_timeout_ms = 8000
telnyx_resend_ms = 400
telnyx_timeout_ms = 3000
duplicate_wait_ms = 5000
`,
      );
    };
    /** Runs a one-shot agent command (`mode set drained`, ...). */
    node.cli = (...args) =>
      spawnSync(join(binDir, "callfence-agent"), ["--config", node.configPath, ...args], { encoding: "utf8" });
    node.startAgent = async () => {
      node.agent = launch(`agent ${id}`, join(binDir, "callfence-agent"), ["--config", node.configPath, "run"]);
      const started = node.agent;
      await waitFor(`agent ${id} to serve`, async () => {
        if (started.child.exitCode !== null || started.lines.some((l) => l.startsWith("spawn failed"))) {
          throw new Error(`agent ${id} exited: ${started.lines.join("\n")}`);
        }
        return (await fetch(`${node.localUrl}/healthz`)).status === 200;
      });
    };
    node.killAgent = (signal = "SIGKILL") => stop(node.agent, signal);
    node.startApp = async (extra = []) => {
      node.appArgs = extra;
      node.app = launch(`app ${id}`, join(binDir, "callfence-demo-app"), [
        "--listen",
        `127.0.0.1:${app}`,
        "--agent",
        node.localUrl,
        "--line",
        `${LINE.id}=${LINE.number}`,
        ...extra,
      ]);
      await waitFor(`app ${id} to serve`, async () => (await fetch(`${node.appUrl}/callfence/status`)).ok);
    };
    node.killApp = () => stop(node.app);
    /** What the demo app was handed: { event_id: { event_type, count } }. */
    node.appEvents = async () => {
      const res = await fetch(`${node.appUrl}/demo/events`);
      return Object.fromEntries((await res.json()).events.map((e) => [e.event_id, e]));
    };
    node.appStatus = async () => (await fetch(`${node.appUrl}/callfence/status`)).json();
    node.local = async (path, body) =>
      read(
        await fetch(`${node.localUrl}${path}`, {
          method: body === undefined ? "GET" : "POST",
          headers: { "content-type": "application/json" },
          body: body === undefined ? undefined : JSON.stringify(body),
        }),
      );
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
    await edge.dispose();
    rmSync(work, { recursive: true, force: true });
  };

  try {
    await cluster.put("nodes", cluster.registry());
    await cluster.put("policy", policy(Object.keys(nodes)));
    for (const n of Object.values(cluster.nodes)) {
      await n.startApp();
      await n.startAgent();
    }
    for (const id of Object.keys(nodes)) await cluster.waitEligible(id, 15_000);
  } catch (e) {
    await cluster.close();
    throw e;
  }
  return cluster;
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
