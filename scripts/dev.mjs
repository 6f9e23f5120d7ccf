// `make dev` (after scripts/dev.sh has set up and built): the dispatcher in
// local workerd (Miniflare, the prebuilt build/, state persisted in the dev
// directory's state/), the example documents from policy/, the shared fake
// Telnyx API (`callfence-fake-telnyx`) on loopback, and the three demo nodes
// of policy/README.md as real `callfence-agent run` processes in front of
// `callfence-demo-app`s.
//
// Everything it generates lives in the dev directory (below; secrets and
// keys on first run, mode 0600). Ctrl-C (SIGINT) or SIGTERM stops every child.
//
// Each node runs its demo app from a releases layout (SPEC §14):
// <dev>/nodes/<node>/releases/<sha> checkouts of the demo app repository
// <dev>/demo-app (seeded with two commits; the nodes start on the first) and
// <dev>/nodes/<node>/current, the runtime checkout. The agents' [deploy]
// restart command (scripts/dev-restart.mjs) asks this script's supervisor
// endpoint to stop the node's app and start it again from `current`, so
//   callfence-agent --config <dev>/nodes/M3/agent.toml deploy --sha $(git -C <dev>/demo-app rev-parse HEAD)
// works against the local stack (the banner prints it with the real paths).
//
// Where it keeps all that (the dev directory, printed in the banner):
// CALLFENCE_DEV_DIR when set; else <repo>/.dev; but when the checkout itself
// is on a volatile path (/tmp, /var/tmp, /dev/shm), where the agents refuse
// a state directory because a real node's state must survive a reboot,
// ${XDG_STATE_HOME:-~/.local/state}/callfence-dev/<checkout name>-<hash of
// its path>. The refusal itself is untouched: a dev directory that is still
// volatile stops the script before anything starts.
//
// Environment: CALLFENCE_DEV_DIR (above), CALLFENCE_DEV_PORT (dispatcher,
// default 8787), CALLFENCE_DEV_TELNYX_PORT (fake Telnyx API, default 8790),
// CALLFENCE_DEV_NODE_PORTS (the nodes' origin, local API, metrics and app
// ports: unset, those of policy/nodes.example.json, 8701-8703 and
// neighbours; `0`, free ports chosen on the first run in a dev directory and
// kept in its ports.json, the registry loaded with those origins); each `0` picks free
// ports, so tests never collide with a running `make dev`.
// CALLFENCE_AGENT_BIN_DIR (where callfence-agent, callfence-demo-app and
// callfence-fake-telnyx are; default target/debug).

import { spawn, execFileSync } from "node:child_process";
import { createHash, createPrivateKey, createPublicKey, generateKeyPairSync, randomBytes } from "node:crypto";
import {
  chmodSync,
  closeSync,
  existsSync,
  readlinkSync,
  symlinkSync,
  mkdirSync,
  readdirSync,
  openSync,
  readFileSync,
  realpathSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { createServer } from "node:http";
import { createConnection, createServer as createTcpServer } from "node:net";
import { homedir } from "node:os";
import { basename, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { startFakeTelnyx } from "./fake-telnyx.mjs";

export const ROOT = fileURLToPath(new URL("../", import.meta.url));

/** True for a path on a file system that does not survive a reboot. */
export function volatilePath(path) {
  return ["/tmp", "/var/tmp", "/dev/shm"].some((v) => path === v || path.startsWith(`${v}/`));
}

/** The dev directory (see the top of this file). */
function devDir() {
  if (process.env.CALLFENCE_DEV_DIR) return process.env.CALLFENCE_DEV_DIR;
  const checkout = realpathSync(ROOT);
  if (!volatilePath(ROOT) && !volatilePath(checkout)) return join(ROOT, ".dev");
  const base = process.env.XDG_STATE_HOME || join(homedir(), ".local", "state");
  const hash = createHash("sha256").update(checkout).digest("hex").slice(0, 12);
  return join(base, "callfence-dev", `${basename(checkout)}-${hash}`);
}

export const DEV = devDir();
const PORT = Number(process.env.CALLFENCE_DEV_PORT || 8787);
const TELNYX_PORT = Number(process.env.CALLFENCE_DEV_TELNYX_PORT || 8790);
const BIN_DIR = process.env.CALLFENCE_AGENT_BIN_DIR || join(ROOT, "target", "debug");
const EDGE_KID = "dev-edge";

// The demo nodes of policy/README.md: the registry's origins, the dev seeds,
// and the lines each demo app serves (policy.example.json: M3 preferred for
// property_management_ca, M2 for front_desk, M1 the fallback of both).
const LINES = { property_management_ca: "+15102160079", front_desk: "+15105550123" };
export const NODES = [
  { node: "M1", seedByte: 1, origin: 8701, local: 8711, metrics: 8721, app: 9001, lines: ["property_management_ca", "front_desk"] },
  { node: "M2", seedByte: 2, origin: 8702, local: 8712, metrics: 8722, app: 9002, lines: ["front_desk"] },
  { node: "M3", seedByte: 3, origin: 8703, local: 8713, metrics: 8723, app: 9003, lines: ["property_management_ca"] },
];
/** Where node `n`'s agent serves its metrics (listen.metrics_listen). */
export function metricsUrl(n) {
  return `http://127.0.0.1:${n.metrics}/metrics`;
}

/** The public origin URL of demo node `n` (its agent's origin proxy). */
function originUrl(n) {
  return `http://127.0.0.1:${n.origin}/callfence/telnyx`;
}

/** `count` distinct free loopback ports: every listener is held until all
 * are chosen, so the kernel cannot hand out one port twice. */
async function freePorts(count) {
  const servers = [];
  for (let i = 0; i < count; i++) {
    const server = createTcpServer();
    await new Promise((resolve, reject) => server.once("error", reject).listen(0, "127.0.0.1", resolve));
    servers.push(server);
  }
  const ports = servers.map((s) => s.address().port);
  await Promise.all(servers.map((s) => new Promise((resolve) => s.close(resolve))));
  return ports;
}

/** Gives NODES the ports of this dev directory: those kept in ports.json;
 * else, with CALLFENCE_DEV_NODE_PORTS=0, free ones (then kept there); else
 * the example registry's. */
async function assignNodePorts() {
  const wanted = process.env.CALLFENCE_DEV_NODE_PORTS ?? "";
  if (wanted !== "" && wanted !== "0") {
    throw new Error(`CALLFENCE_DEV_NODE_PORTS=${wanted}: want 0 (free ports) or unset (8701-8703 and neighbours)`);
  }
  let chosen = existsSync(paths.ports) ? JSON.parse(readFileSync(paths.ports, "utf8")) : null;
  if (!chosen && wanted === "0") {
    const ports = await freePorts(NODES.length * 4);
    chosen = Object.fromEntries(
      NODES.map((n, i) => [n.node, { origin: ports[4 * i], local: ports[4 * i + 1], app: ports[4 * i + 2], metrics: ports[4 * i + 3] }]),
    );
    writeFileSync(paths.ports, `${JSON.stringify(chosen)}\n`);
  }
  // A ports.json from before the agents' metrics listeners: free ones for them.
  const lacking = chosen ? NODES.filter((n) => chosen[n.node] && chosen[n.node].metrics === undefined) : [];
  if (lacking.length) {
    const ports = await freePorts(lacking.length);
    lacking.forEach((n, i) => (chosen[n.node].metrics = ports[i]));
    writeFileSync(paths.ports, `${JSON.stringify(chosen)}\n`);
  }
  for (const n of NODES) Object.assign(n, chosen?.[n.node] ?? {});
}

export const paths = {
  info: join(DEV, "dev.json"),
  keys: join(DEV, "keys"),
  telnyxSeed: join(DEV, "keys", "telnyx.seed"),
  edgeSeed: join(DEV, "keys", "edge.seed"),
  adminToken: join(DEV, "keys", "admin-token"),
  metricsToken: join(DEV, "keys", "metrics-token"),
  mediaKey: join(DEV, "keys", "media-key"),
  telnyxApiKey: join(DEV, "keys", "telnyx-api-key"),
  ports: join(DEV, "ports.json"),
  state: join(DEV, "state"),
  demoApp: join(DEV, "demo-app"),
  logs: join(DEV, "logs"),
  pids: join(DEV, "pids.json"),
};

// ------------------------------------------------------------------ keys ----

/** The Ed25519 private KeyObject of a 32-byte seed. */
export function keyFromSeed(seed) {
  const der = Buffer.concat([Buffer.from("302e020100300506032b657004220420", "hex"), seed]);
  return createPrivateKey({ key: der, format: "der", type: "pkcs8" });
}

function publicB64(privateKey) {
  const jwk = createPublicKey(privateKey).export({ format: "jwk" });
  return Buffer.from(jwk.x, "base64url").toString("base64");
}

function writeSecret(path, text) {
  writeFileSync(path, text, { mode: 0o600, flag: "wx" });
  chmodSync(path, 0o600);
}

function readSecret(path) {
  return readFileSync(path, "utf8").trim();
}

/** Creates the secrets on first run; returns them. */
function ensureSecrets() {
  mkdirSync(paths.keys, { recursive: true, mode: 0o700 });
  chmodSync(DEV, 0o700);
  const seed = () => {
    const { privateKey } = generateKeyPairSync("ed25519");
    return Buffer.from(privateKey.export({ format: "jwk" }).d, "base64url").toString("base64");
  };
  const wanted = [
    [paths.telnyxSeed, seed],
    [paths.edgeSeed, seed],
    [paths.adminToken, () => randomBytes(24).toString("hex")],
    [paths.metricsToken, () => randomBytes(24).toString("hex")],
    [paths.mediaKey, () => randomBytes(32).toString("base64")],
    [paths.telnyxApiKey, () => `KEYdev_${randomBytes(16).toString("hex")}`],
  ];
  let created = 0;
  for (const [path, make] of wanted) {
    if (!existsSync(path)) {
      writeSecret(path, `${make()}\n`);
      created += 1;
    }
  }
  if (created) say(`generated ${created} dev secret(s) in ${paths.keys}`);
  const telnyx = keyFromSeed(Buffer.from(readSecret(paths.telnyxSeed), "base64"));
  const edge = keyFromSeed(Buffer.from(readSecret(paths.edgeSeed), "base64"));
  return {
    telnyxPublic: publicB64(telnyx),
    edgeSeed: readSecret(paths.edgeSeed),
    edgePublic: publicB64(edge),
    adminToken: readSecret(paths.adminToken),
    metricsToken: readSecret(paths.metricsToken),
    mediaKey: readSecret(paths.mediaKey),
  };
}

// ----------------------------------------------------------------- nodes ----

function nodeDir(n) {
  return join(DEV, "nodes", n.node);
}

/** The registry's public key of node `n` (policy/nodes.example.json). */
function registryKey(n) {
  const registry = JSON.parse(readFileSync(join(ROOT, "policy", "nodes.example.json"), "utf8"));
  const [[kid, key]] = Object.entries(registry.nodes[n.node].keys);
  return { kid, key };
}

function git(dir, ...args) {
  return execFileSync(
    "git",
    ["-c", "user.name=callfence dev", "-c", "user.email=dev@localhost", "-c", "commit.gpgsign=false",
      "-c", "core.hooksPath=/dev/null", "-C", dir, ...args],
    { stdio: ["ignore", "pipe", "pipe"], encoding: "utf8" },
  ).trim();
}

/** The demo app repository every node deploys from: two commits at first. */
function ensureDemoAppRepo() {
  const repo = paths.demoApp;
  if (existsSync(join(repo, ".git"))) return git(repo, "rev-list", "--max-parents=0", "HEAD").split("\n")[0];
  rmSync(repo, { recursive: true, force: true });
  mkdirSync(repo, { recursive: true });
  git(repo, "init", "-q", "-b", "main");
  writeFileSync(join(repo, "README.md"), "The callfence demo voice app (callfence-demo-app runs from each release).\n");
  git(repo, "add", "README.md");
  git(repo, "commit", "-q", "--no-verify", "-m", "demo app, release 1");
  const first = git(repo, "rev-parse", "HEAD");
  writeFileSync(join(repo, "CHANGELOG.md"), "release 2: something to deploy\n");
  git(repo, "add", "CHANGELOG.md");
  git(repo, "commit", "-q", "--no-verify", "-m", "demo app, release 2");
  return first;
}

/** releases/<first sha> and `current` for node `n`, unless it has them. */
function ensureReleases(n, firstSha) {
  const dir = nodeDir(n);
  const current = join(dir, "current");
  const releases = join(dir, "releases");
  let linked = false;
  try {
    readlinkSync(current);
    linked = true;
  } catch {
    // no current yet
  }
  if (!linked) {
    const release = join(releases, firstSha);
    rmSync(release, { recursive: true, force: true });
    mkdirSync(release, { recursive: true });
    git(release, "init", "-q");
    git(release, "fetch", "-q", "--no-tags", paths.demoApp, firstSha);
    git(release, "checkout", "-q", "--detach", firstSha);
    rmSync(current, { force: true });
    symlinkSync(release, current);
  }
  return { current, releases };
}

/** Key file, runtime checkout, state dir and agent.toml of one demo node. */
function prepareNode(n, secrets, edgeUrl, telnyxUrl, supervisorUrl, firstSha) {
  const dir = nodeDir(n);
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const { kid, key } = registryKey(n);
  const keyPath = join(dir, "node.key");
  const seed = Buffer.alloc(32, n.seedByte);
  if (publicB64(keyFromSeed(seed)) !== key) {
    throw new Error(`policy/nodes.example.json: ${n.node}'s key is not the dev seed [${n.seedByte}; 32]`);
  }
  if (!existsSync(keyPath)) writeSecret(keyPath, `${seed.toString("base64")}\n`);

  // The runtime checkout: `current`, a symlink to a clean detached release.
  const { current: checkout, releases } = ensureReleases(n, firstSha);

  const state = join(dir, "state");
  const config = join(dir, "agent.toml");
  writeFileSync(
    config,
    `# Generated by scripts/dev.mjs on every start; edit the script, not this file.
node = "${n.node}"
state_dir = "${state}"
runtime_checkout = "${checkout}"

[key]
id = "${kid}"
path = "${keyPath}"

[edge]
url = "${edgeUrl}"
[edge.public_keys]
${EDGE_KID} = "${secrets.edgePublic}"

[telnyx]
public_keys = ["${secrets.telnyxPublic}"]
api_base = "${telnyxUrl}"
api_key_file = "${paths.telnyxApiKey}"

[listen]
origin = "127.0.0.1:${n.origin}"
local = "127.0.0.1:${n.local}"
metrics_listen = "127.0.0.1:${n.metrics}"

[app]
webhook_url = "http://127.0.0.1:${n.app}/telnyx/webhook"
status_url = "http://127.0.0.1:${n.app}/callfence/status"

[origin]
url = "${originUrl(n)}"

[lines]
source = "app"

[timing]
heartbeat_interval_ms = 2000
valid_for_s = 10
upkeep_interval_ms = 10000

[deploy]
remote = "${paths.demoApp}"
# Only commits on this branch of the remote are deployed.
branch = "${git(paths.demoApp, "symbolic-ref", "--short", "HEAD")}"
# Development only: restart runs as this agent's user, who can read its keys
# (every deploy logs a warning). A real node names a build_user instead.
build_can_read_keys = true
releases_dir = "${releases}"
current = "${checkout}"
restart = "node ${join(ROOT, "scripts", "dev-restart.mjs")} ${supervisorUrl}/restart/${n.node}"
health_timeout = "20s"
drain_deadline = "5m"
keep = 3
`,
    { mode: 0o600 },
  );
  // A node starts drained; the demo nodes are set active once, on first run.
  // Later runs keep whatever mode was set (`callfence-agent mode set ...`).
  if (!existsSync(join(state, "mode"))) {
    execFileSync(join(BIN_DIR, "callfence-agent"), ["--config", config, "mode", "set", "active"], {
      stdio: ["ignore", "ignore", "pipe"],
    });
  }
  return config;
}

// ------------------------------------------------------------- processes ----

const children = [];
let stopping = false;

function say(line) {
  process.stdout.write(`dev: ${line}\n`);
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function start(name, bin, args) {
  const log = join(paths.logs, `${name}.log`);
  const fd = openSync(log, "a");
  const child = spawn(bin, args, { stdio: ["ignore", fd, fd], cwd: DEV });
  closeSync(fd);
  child.devName = name;
  child.devLog = log;
  child.exited = new Promise((resolve) => child.once("exit", resolve));
  child.once("exit", (code, signal) => {
    if (!stopping) say(`${name} exited (${signal ?? `code ${code}`}); see ${log}`);
  });
  children.push(child);
  child.devBin = bin;
  recordPids();
  return child;
}

/** Workerd, started by Miniflare: our child process whose name is workerd. */
function workerdPids() {
  const found = [];
  for (const pid of readdirSync("/proc").filter((d) => /^\d+$/.test(d))) {
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
      const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
      const bin = readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0")[0];
      if (ppid === process.pid && bin.endsWith("/workerd")) found.push({ pid: Number(pid), bin });
    } catch {
      // gone
    }
  }
  return found;
}

/** Records this run's processes, for `reapLeftovers` after a SIGKILL. */
function recordPids() {
  const list = [...running.workerd, ...children.map((c) => ({ pid: c.pid, bin: c.devBin }))];
  writeFileSync(paths.pids, JSON.stringify({ owner: process.pid, children: list }));
}

/** Kills the children a previous run left behind when that run itself died
 * without cleaning up (SIGKILL); never those of a run that is still alive. */
function reapLeftovers() {
  if (!existsSync(paths.pids)) return;
  let recorded = { owner: 0, children: [] };
  try {
    recorded = JSON.parse(readFileSync(paths.pids, "utf8"));
  } catch {
    // unreadable: nothing to reap
  }
  const cmdline = (pid) => {
    try {
      return readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0");
    } catch {
      return [];
    }
  };
  if (cmdline(recorded.owner).some((arg) => arg.endsWith("dev.mjs"))) return;
  const killed = [];
  for (const { pid, bin } of recorded.children ?? []) {
    if (cmdline(pid)[0] === bin) {
      process.kill(pid, "SIGKILL");
      killed.push(pid);
      say(`killed pid ${pid} (${bin}) left by a previous run`);
    }
  }
  // Wait until they are gone (or zombies): their ports are free then.
  const alive = (pid) => {
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
      return stat.slice(stat.lastIndexOf(")") + 2)[0] !== "Z";
    } catch {
      return false;
    }
  };
  const until = Date.now() + 5000;
  while (killed.some(alive) && Date.now() < until) execFileSync("sleep", ["0.1"]);
  rmSync(paths.pids, { force: true });
}

function portFree(port) {
  return new Promise((resolve) => {
    const socket = createConnection({ host: "127.0.0.1", port });
    socket.once("connect", () => {
      socket.destroy();
      resolve(false);
    });
    socket.once("error", () => resolve(true));
  });
}

/** True while `child` has not exited. */
function alive(child) {
  return child.exitCode === null && child.signalCode === null;
}

async function waitFor(what, check, timeoutMs = 15000) {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const gone = children.find((c) => !alive(c));
    if (gone) throw new Error(`${gone.devName} exited while waiting for ${what}; see ${gone.devLog}`);
    try {
      if (await check()) return;
    } catch {
      // not yet
    }
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await sleep(100);
  }
}

// ------------------------------------------------------------ supervisor ----

const apps = {};

/** Starts node `n`'s demo app from its `current` release. */
function startApp(n) {
  const lineArgs = n.lines.flatMap((id) => ["--line", `${id}=${LINES[id]}`]);
  apps[n.node] = start(`${n.node}-app`, join(BIN_DIR, "callfence-demo-app"), [
    "--listen", `127.0.0.1:${n.app}`, "--agent", `http://127.0.0.1:${n.local}`,
    "--agent-token-file", join(nodeDir(n), "state", "local-api.token"),
    "--checkout", join(nodeDir(n), "current"), ...lineArgs,
  ]);
}

/** The agents' restart command (scripts/dev-restart.mjs) lands here:
 * `POST /restart/<node>` stops that node's app and starts it again from
 * `current`; 200 once the new one listens. */
function startSupervisor() {
  const server = createServer(async (req, res) => {
    const n = NODES.find((x) => req.method === "POST" && req.url === `/restart/${x.node}`);
    if (!n) {
      res.writeHead(404).end();
      return;
    }
    const old = apps[n.node];
    if (old && alive(old)) {
      old.kill("SIGTERM");
      await Promise.race([old.exited, sleep(5000)]);
      if (alive(old)) old.kill("SIGKILL");
      await old.exited;
    }
    const i = children.indexOf(old);
    if (i >= 0) children.splice(i, 1);
    startApp(n);
    say(`${n.node}: app restarted from ${readlinkSync(join(nodeDir(n), "current"))}`);
    try {
      await waitFor(`${n.node}'s app`, async () => (await fetch(`http://127.0.0.1:${n.app}/callfence/status`)).ok, 10000);
      res.writeHead(200).end("restarted\n");
    } catch (e) {
      res.writeHead(500).end(`${e.message}\n`);
    }
  });
  return new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(server)));
}

// ------------------------------------------------------------ fake Telnyx ----

/** The shared fake Telnyx API (`callfence-fake-telnyx`), wanting the dev API
 * key: prints every command and logs it to <dev>/logs/fake-telnyx.log; its
 * record is GET /__record[?call_control_id=]. */
async function startTelnyx(apiKeyFile) {
  const log = join(paths.logs, "fake-telnyx.log");
  const fake = await startFakeTelnyx(BIN_DIR, {
    port: TELNYX_PORT,
    apiKeyFile,
    onLine: (entry) => {
      writeFileSync(log, `${JSON.stringify(entry)}\n`, { flag: "a" });
      if (entry.action === "dial") {
        say(`fake Telnyx: dial to ${entry.body?.to ?? "?"} (${entry.status})`);
      } else {
        say(`fake Telnyx: ${entry.action} ${entry.call_control_id} command_id=${entry.command_id} (${entry.status})`);
      }
    },
  });
  const child = fake.child;
  child.devName = "fake-telnyx";
  child.devLog = log;
  child.devBin = join(BIN_DIR, "callfence-fake-telnyx");
  child.exited = new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) resolve();
    else child.once("exit", resolve);
  });
  child.once("exit", (code, signal) => {
    if (!stopping) say(`fake-telnyx exited (${signal ?? `code ${code}`}); see ${log}`);
  });
  children.push(child);
  recordPids();
  return fake;
}

// ------------------------------------------------------------ dispatcher ----

async function startDispatcher(secrets) {
  const { Miniflare } = await import("miniflare");
  const compatibilityDate = readFileSync(join(ROOT, "wrangler.toml"), "utf8").match(
    /^compatibility_date\s*=\s*"([^"]+)"/m,
  )[1];
  const log = join(paths.logs, "dispatcher.log");
  const mf = new Miniflare({
    host: "127.0.0.1",
    port: PORT,
    cf: false,
    durableObjectsPersist: paths.state,
    structuredWorkerdLogs: true,
    handleStructuredLogs: ({ level, message }) => {
      writeFileSync(log, `${level}: ${message}\n`, { flag: "a" });
    },
    workers: [
      {
        name: "callfence",
        modulesRoot: ROOT,
        modules: [
          { type: "ESModule", path: join(ROOT, "build/index.js") },
          { type: "CompiledWasm", path: join(ROOT, "build/index_bg.wasm") },
        ],
        compatibilityDate,
        bindings: {
          TELNYX_PUBLIC_KEY: secrets.telnyxPublic,
          TELNYX_CONNECTION_IDS: "",
          EDGE_SIGNING_KEY: secrets.edgeSeed,
          EDGE_KEY_ID: EDGE_KID,
          EDGE_NEXT_PUBLIC_KEYS: "[]",
          ADMIN_TOKENS: secrets.adminToken,
          METRICS_TOKENS: secrets.metricsToken,
          MEDIA_TOKEN_KEYS: `dev:${secrets.mediaKey}`,
          FORWARD_TIMEOUT_MS: "1500",
          ORIGIN_ALLOW_PLAINTEXT: "true",
        },
        durableObjects: { DISPATCHER: { className: "Dispatcher", useSQLite: true } },
      },
    ],
  });
  const url = await mf.ready;
  return { mf, url: url.origin };
}

/** PUTs an example document unless one is already stored. */
async function loadDocument(base, token, route, file) {
  const auth = { authorization: `Bearer ${token}` };
  const current = await fetch(`${base}${route}`, { headers: auth });
  if (current.status === 200) {
    const { revision } = await current.json();
    return `already loaded (revision ${revision})`;
  }
  let body = readFileSync(join(ROOT, "policy", file), "utf8");
  if (route === "/v1/nodes") {
    // The origins the demo nodes listen on (the file's, unless
    // CALLFENCE_DEV_NODE_PORTS chose others).
    const registry = JSON.parse(body);
    for (const n of NODES) registry.nodes[n.node].origin_url = originUrl(n);
    body = JSON.stringify(registry);
  }
  const put = await fetch(`${base}${route}`, {
    method: "PUT",
    headers: { ...auth, "content-type": "application/json", "if-match": '"0"' },
    body,
  });
  const text = await put.text();
  if (put.status !== 200 && put.status !== 201) {
    throw new Error(`PUT ${route} (${file}) answered ${put.status}: ${text}`);
  }
  return `loaded policy/${file} (revision ${JSON.parse(text).revision ?? "?"})`;
}

// ------------------------------------------------------------------ main ----

async function shutdown(code) {
  if (stopping) return;
  stopping = true;
  const started = children.length > 0 || running.mf !== undefined;
  if (started) say("stopping...");
  // Timers keep the event loop alive while handles close, and bound it.
  setTimeout(() => process.exit(code), 15000);
  const keepAlive = setInterval(() => {}, 1000);
  for (const c of children) if (alive(c)) c.kill("SIGTERM");
  await Promise.race([Promise.all(children.map((c) => c.exited)), sleep(6000)]);
  for (const c of children) if (alive(c)) c.kill("SIGKILL");
  await Promise.all(children.map((c) => c.exited));
  running.supervisor?.closeAllConnections();
  running.supervisor?.close();
  // workerd may already be gone (Ctrl-C reaches the whole process group).
  await Promise.race([running.mf?.dispose().catch(() => {}), sleep(5000)]);
  if (started) rmSync(paths.pids, { force: true });
  clearInterval(keepAlive);
  if (started) say("stopped");
  process.exit(code);
}

const running = { workerd: [] };

/** Makes Ctrl-C and SIGTERM run `shutdown` alone: Miniflare installs its own
 * handlers, which exit at once, before the agents have stopped. */
function ownSignals() {
  for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"]) {
    process.removeAllListeners(sig);
    process.on(sig, () => shutdown(0));
  }
}

async function main() {
  ownSignals();
  process.on("exit", () => {
    for (const c of children) if (alive(c)) c.kill("SIGKILL");
  });
  for (const file of ["build/index.js", "build/index_bg.wasm"]) {
    if (!existsSync(join(ROOT, file))) throw new Error(`${file} is missing: run \`make build\``);
  }
  for (const bin of ["callfence-agent", "callfence-demo-app", "callfence-fake-telnyx"]) {
    if (!existsSync(join(BIN_DIR, bin))) {
      throw new Error(`${join(BIN_DIR, bin)} is missing: cargo build -p callfence-agent --bins`);
    }
  }
  if (volatilePath(DEV) || (existsSync(DEV) && volatilePath(realpathSync(DEV)))) {
    throw new Error(
      `the dev directory ${DEV} is under a volatile path, where the agents refuse their state: ` +
        "set CALLFENCE_DEV_DIR (or XDG_STATE_HOME) to a directory that survives a reboot",
    );
  }
  mkdirSync(paths.logs, { recursive: true, mode: 0o700 });
  reapLeftovers();
  await assignNodePorts();
  const busy = [];
  for (const port of [PORT, TELNYX_PORT, ...NODES.flatMap((n) => [n.origin, n.local, n.app])]) {
    if (port !== 0 && !(await portFree(port))) busy.push(port);
  }
  if (busy.length) {
    throw new Error(`port(s) ${busy.join(", ")} on 127.0.0.1 already in use (is another \`make dev\` running?)`);
  }
  const secrets = ensureSecrets();

  const { mf, url } = await startDispatcher(secrets);
  running.mf = mf;
  running.workerd = workerdPids();
  recordPids();
  ownSignals();
  const telnyxUrl = (await startTelnyx(paths.telnyxApiKey)).url;
  say(`dispatcher on ${url} (state in ${paths.state})`);
  say(`node registry: ${await loadDocument(url, secrets.adminToken, "/v1/nodes", "nodes.example.json")}`);
  say(`routing policy: ${await loadDocument(url, secrets.adminToken, "/v1/policy", "policy.example.json")}`);

  running.supervisor = await startSupervisor();
  const supervisorUrl = `http://127.0.0.1:${running.supervisor.address().port}`;
  const firstSha = ensureDemoAppRepo();
  for (const n of NODES) {
    const config = prepareNode(n, secrets, url, telnyxUrl, supervisorUrl, firstSha);
    startApp(n);
    start(`${n.node}-agent`, join(BIN_DIR, "callfence-agent"), ["--config", config, "run"]);
  }
  for (const n of NODES) {
    await waitFor(`${n.node}'s agent`, async () => {
      return (await fetch(`http://127.0.0.1:${n.local}/healthz`)).ok;
    });
  }
  writeFileSync(
    paths.info,
    JSON.stringify(
      {
        dispatcher: url,
        panel: `${url}/`,
        admin_token_file: paths.adminToken,
        metrics: `${url}/v1/metrics`,
        metrics_token_file: paths.metricsToken,
        telnyx_seed_file: paths.telnyxSeed,
        fake_telnyx: telnyxUrl,
        logs: paths.logs,
        nodes: Object.fromEntries(
          NODES.map((n) => [n.node, {
            origin_url: originUrl(n),
            local_api: `http://127.0.0.1:${n.local}`,
            metrics: metricsUrl(n),
            app: `http://127.0.0.1:${n.app}`,
            config: join(nodeDir(n), "agent.toml"),
          }]),
        ),
      },
      null,
      2,
    ),
  );

  // The first beats: wait until the dispatcher has heard from every node.
  let status = null;
  try {
    await waitFor("the first heartbeats", async () => {
      const r = await fetch(`${url}/v1/status`, { headers: { authorization: `Bearer ${secrets.adminToken}` } });
      status = await r.json();
      return status.nodes?.length === NODES.length && status.nodes.every((s) => s.eligible);
    }, 12000);
  } catch {
    say("not every node is eligible yet (see the reasons below and the logs)");
  }

  const rows = (status?.nodes ?? []).map(
    (s) =>
      `    ${s.node}  ${s.role.padEnd(9)} mode ${String(s.mode).padEnd(7)} ` +
      `${s.eligible ? "eligible" : `NOT eligible: ${JSON.stringify(s.reasons)}`}`,
  );
  const lines = (status?.lines ?? []).map(
    (l) => `    ${l.line_id.padEnd(22)} ${l.called_number}  prefers ${l.prefers}, next call -> ${l.next_call_target ?? "nobody"}`,
  );
  process.stdout.write(`
callfence dev is running. Ctrl-C stops everything.

  dev directory  ${DEV}  (secrets, state, logs; delete it to start afresh)
  dispatcher     ${url.padEnd(24)} workerd, state in ${paths.state}
  panel          ${`${url}/`.padEnd(24)} bearer: the admin token in ${paths.adminToken}
  edge metrics   ${`${url}/v1/metrics`.padEnd(24)} bearer: the metrics token in ${paths.metricsToken}
  fake Telnyx    ${telnyxUrl.padEnd(24)} prints the commands it gets; GET ${telnyxUrl}/__record
  logs           ${paths.logs}/
  nodes (callfence-agent -> callfence-demo-app):
${NODES.map((n) => `    ${n.node}  origin ${originUrl(n)}  local API http://127.0.0.1:${n.local}  app http://127.0.0.1:${n.app}  config ${join(nodeDir(n), "agent.toml")}`).join("\n")}
  local API      bearer: <node>/state/local-api.token; deploy/rollback/job: the CLI, over <node>/state/control.sock
  agent metrics  no token (each agent's listen.metrics_listen):
${NODES.map((n) => `                 ${n.node} ${metricsUrl(n)}`).join("\n")}
                 \`make observe\` scrapes them and the edge with Prometheus and the shipped alerting rules
  node status:
${rows.join("\n") || "    (no status yet)"}
  lines:
${lines.join("\n") || "    (no status yet)"}

  try:  make demo-call             (a signed call.initiated for +15102160079)
        ${join(BIN_DIR, "callfence-agent")} --config ${join(nodeDir(NODES[2]), "agent.toml")} deploy --sha $(git -C ${paths.demoApp} rev-parse HEAD)
        curl -H "Authorization: Bearer $(cat ${paths.adminToken})" ${url}/v1/status
        curl -H "Authorization: Bearer $(cat ${paths.metricsToken})" ${url}/v1/metrics
        curl -H "Authorization: Bearer $(cat ${join(nodeDir(NODES[0]), "state", "local-api.token")})" http://127.0.0.1:${NODES[0].local}/local/status

`);
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  main().catch(async (e) => {
    process.stderr.write(`dev: ${e.message}\n`);
    await shutdown(1);
  });
}
