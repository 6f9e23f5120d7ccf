// End-to-end harness: the prebuilt testing Worker (build-testing/index.js +
// build-testing/index_bg.wasm: the Worker with its test scaffolding, the
// CALLFENCE_TEST_* switches; docs/testing.md) in Miniflare 4 with its SQLite Dispatcher, test keys made with node:crypto,
// and helpers to sign what Telnyx and the nodes sign.
//
// Build first (`make build-testing`); the harness never builds. Every instance listens
// on a random loopback port (`port: 0`) with its Durable Object state in a
// temporary directory, so test files can run in parallel.

import { Miniflare } from "miniflare";
import {
  createHash,
  createPublicKey,
  generateKeyPairSync,
  randomBytes,
  sign as cryptoSign,
  verify as cryptoVerify,
} from "node:crypto";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, realpathSync, rmSync } from "node:fs";
import { createServer } from "node:http";
import { homedir, tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

export const ROOT = fileURLToPath(new URL("../../", import.meta.url));
// The deployed compatibility date, so tests run what production runs.
const COMPATIBILITY_DATE = readFileSync(join(ROOT, "wrangler.toml"), "utf8").match(
  /^compatibility_date\s*=\s*"([^"]+)"/m,
)[1];

// ---------------------------------------------------------------- keys ----

/** An Ed25519 key pair: `publicKey` as base64 of the raw 32 bytes, `seed` as
 * base64 of the 32-byte private seed, and the node:crypto KeyObjects. */
/**
 * A directory for state that must not be volatile (the agent refuses a state
 * dir under /tmp, /var/tmp or /dev/shm): the repository's target/, unless the
 * checkout itself lives on such a path; then ~/.cache/callfence-tests.
 */
export function durableScratchRoot() {
  const volatile = (p) => ["/tmp", "/var/tmp", "/dev/shm"].some((v) => p === v || p.startsWith(`${v}/`));
  const target = join(ROOT, "target");
  mkdirSync(target, { recursive: true });
  if (!volatile(target) && !volatile(realpathSync(target))) return target;
  const root = join(homedir(), ".cache", "callfence-tests");
  mkdirSync(root, { recursive: true });
  return root;
}

export function ed25519() {
  const { publicKey, privateKey } = generateKeyPairSync("ed25519");
  const jwk = privateKey.export({ format: "jwk" });
  return {
    publicKey: Buffer.from(jwk.x, "base64url").toString("base64"),
    seed: Buffer.from(jwk.d, "base64url").toString("base64"),
    publicKeyObject: publicKey,
    privateKeyObject: privateKey,
  };
}

/** A KeyObject for a base64 raw Ed25519 public key. */
export function publicKeyFromRaw(b64) {
  const x = Buffer.from(b64, "base64").toString("base64url");
  return createPublicKey({ key: { kty: "OKP", crv: "Ed25519", x }, format: "jwk" });
}

/** A bearer token of `length` hex characters (the Worker wants >= 32). */
export function token(length = 48) {
  return randomBytes(Math.ceil(length / 2)).toString("hex").slice(0, length);
}

/** Everything the Worker's configuration needs, freshly generated. */
export function testKeys() {
  const telnyx = ed25519();
  const edge = ed25519();
  const edgeNext = ed25519();
  return {
    telnyx,
    edge,
    edgeKid: "edge-test-a",
    edgeNext,
    edgeNextKid: "edge-test-b",
    adminToken: token(),
    policyToken: token(),
    metricsToken: token(),
    mediaKey: randomBytes(32).toString("base64"),
  };
}

/** The SPEC §2 bindings for `keys` (all set, plaintext origins allowed). */
export function bindingsFor(keys) {
  return {
    TELNYX_PUBLIC_KEY: keys.telnyx.publicKey,
    TELNYX_CONNECTION_IDS: "",
    EDGE_SIGNING_KEY: keys.edge.seed,
    EDGE_KEY_ID: keys.edgeKid,
    EDGE_NEXT_PUBLIC_KEYS: JSON.stringify([
      { kid: keys.edgeNextKid, public_key: keys.edgeNext.publicKey },
    ]),
    ADMIN_TOKENS: keys.adminToken,
    POLICY_TOKENS: keys.policyToken,
    METRICS_TOKENS: keys.metricsToken,
    MEDIA_TOKEN_KEYS: `m1:${keys.mediaKey}`,
    FORWARD_TIMEOUT_MS: "1500",
    ORIGIN_ALLOW_PLAINTEXT: "true",
  };
}

// ------------------------------------------------------------- workers ----

/**
 * The call shards the e2e matrix runs the call-path files with (SPEC §16):
 * `CALLFENCE_E2E_SHARDS`, default 1. Above one, every edge `startEdge`
 * starts on the real Dispatcher puts a map of that many shards in force
 * before a test gets it (`options.shards` overrides it: 1 opts out).
 */
export const E2E_SHARDS = Math.max(1, Math.trunc(Number(process.env.CALLFENCE_E2E_SHARDS ?? 1)) || 1);

/** Puts a map of `n` call shards in force with the admin token `token`, unless it is. */
export async function putShardMap(edge, n, token) {
  const auth = { authorization: `Bearer ${token}` };
  const got = await read(await edge.fetch("/v1/shards", { headers: auth }));
  if (got.body?.call_shards === n) return;
  const put = await read(
    await edge.fetch("/v1/shards", {
      method: "PUT",
      headers: { ...auth, "content-type": "application/json", "if-match": `"${got.body?.revision}"` },
      body: JSON.stringify({ schema: "callfence_shards_v1", call_shards: n }),
    }),
  );
  if (put.status !== 200) throw new Error(`PUT /v1/shards ${n}: ${put.status} ${JSON.stringify(put.body)}`);
}

/** The testing build of the Worker (build-testing/, `make build-testing`). */
export const TESTING_BUILD = join(ROOT, "build-testing");

/** The production build of the Worker (build/, `make build`): no test scaffolding. */
export const PRODUCTION_BUILD = join(ROOT, "build");

/** The prebuilt Worker in `build` (a directory under ROOT) as a Miniflare worker definition. */
function edgeWorker(bindings, dispatcher, build = TESTING_BUILD) {
  for (const file of ["index.js", "index_bg.wasm"]) {
    if (!existsSync(join(build, file))) {
      const make = build === PRODUCTION_BUILD ? "make build" : "make build-testing";
      throw new Error(`${join(build, file)} is missing: run \`${make}\` before the end-to-end tests`);
    }
  }
  return {
    name: "callfence",
    modulesRoot: ROOT,
    modules: [
      { type: "ESModule", path: join(build, "index.js") },
      { type: "CompiledWasm", path: join(build, "index_bg.wasm") },
    ],
    compatibilityDate: COMPATIBILITY_DATE,
    bindings,
    durableObjects: { DISPATCHER: dispatcher },
  };
}

/**
 * Starts the Worker and its Dispatcher.
 *
 * options.bindings: replaces the configuration (default: all of `keys`).
 * options.keys: the test keys (default: fresh ones).
 * options.dir: the Durable Object storage directory (default: a new temp dir,
 *   removed by `dispose()`).
 * options.port: the loopback port to listen on (default: a free one), kept
 *   across `restart()` so clients keep the same URL.
 * options.build: the directory of the Worker build to run (default:
 *   TESTING_BUILD; PRODUCTION_BUILD, or another under ROOT, e.g. a previous
 *   release's).
 * options.dispatcherScript: source of a module Worker exporting a stand-in
 *   `Dispatcher` class (a faulty one, or a fake speaking the protocol);
 *   DISPATCHER is then bound to it instead of the real one.
 * options.shards: the call shards to put in force (default: the e2e
 *   matrix's CALLFENCE_E2E_SHARDS; 1 keeps the map of one shard, for a test
 *   of the map itself).
 * options.driverScript: source of a module Worker (named "driver") bound to
 *   the same DISPATCHER, reached with `worker("driver")`: `make bench` drives
 *   the Durable Object from inside workerd with it.
 *
 * Returns { url, keys, dir, fetch(path, init), dispatcher(), worker(name), logs,
 * restart(), dispose() }; `dispatcher(name)` is a stub of the Dispatcher
 * instance `name` ("global" by default, or a call shard's "calls-k"),
 * straight from Node.
 * `logs` collects every line the runtime logged; `restart()` disposes and
 * starts again on the same storage directory (`restart({ build })`: with
 * another Worker build).
 */
export async function startEdge(options = {}) {
  const keys = options.keys ?? testKeys();
  const bindings = options.bindings ?? bindingsFor(keys);
  const ownsDir = options.dir === undefined;
  const dir = options.dir ?? mkdtempSync(join(tmpdir(), "callfence-e2e-"));
  const logs = [];
  let build = options.build;

  const make = () => {
    const workers = options.dispatcherScript
      ? [
          edgeWorker(bindings, { className: "Dispatcher", scriptName: "stand-in", useSQLite: true }, build),
          {
            name: "stand-in",
            modules: true,
            script: options.dispatcherScript,
            compatibilityDate: COMPATIBILITY_DATE,
          },
        ]
      : [edgeWorker(bindings, { className: "Dispatcher", useSQLite: true }, build)];
    if (options.driverScript) {
      workers.push({
        name: "driver",
        modules: true,
        script: options.driverScript,
        compatibilityDate: COMPATIBILITY_DATE,
        durableObjects: { DISPATCHER: { className: "Dispatcher", scriptName: "callfence", useSQLite: true } },
      });
    }
    return new Miniflare({
      host: "127.0.0.1",
      port: options.port ?? 0,
      cf: false,
      durableObjectsPersist: dir,
      structuredWorkerdLogs: true,
      handleStructuredLogs: ({ level, message }) => {
        logs.push({ level, message });
      },
      workers,
    });
  };

  let mf = make();
  let url = await mf.ready;
  const edge = {
    keys,
    dir,
    logs,
    get url() {
      return url;
    },
    /** fetch against the Worker; `path` may carry a query. */
    fetch(path, init = {}) {
      return fetch(new URL(path, url), { redirect: "manual", ...init });
    },
    async dispatcher(name = "global") {
      const namespace = await mf.getDurableObjectNamespace("DISPATCHER", "callfence");
      return namespace.get(namespace.idFromName(name));
    },
    /** A Fetcher for the worker `name` (see options.driverScript). */
    worker(name) {
      return mf.getWorker(name);
    },
    async restart(next = {}) {
      await mf.dispose();
      if (next.build !== undefined) build = next.build;
      mf = make();
      url = await mf.ready;
    },
    async dispose() {
      await mf.dispose();
      if (ownsDir) rmSync(dir, { recursive: true, force: true });
    },
  };
  const token = bindings.ADMIN_TOKENS?.split(",")[0]?.trim();
  const shards = options.shards ?? E2E_SHARDS;
  if (shards > 1 && !options.dispatcherScript && token) {
    try {
      await putShardMap(edge, shards, token);
    } catch (error) {
      await edge.dispose();
      throw error;
    }
  }
  return edge;
}

/** The pids of this process's workerd children (Miniflare's runtimes). */
export function workerdPids() {
  const pids = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, "utf8");
      const comm = stat.slice(stat.indexOf("(") + 1, stat.lastIndexOf(")"));
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      if (comm === "workerd" && Number(fields[1]) === process.pid) pids.push(Number(entry));
    } catch {
      // gone meanwhile
    }
  }
  return pids;
}

/** Reads a response as { status, headers, body (parsed JSON or text) }. */
export async function read(response) {
  const text = await response.text();
  let body = text;
  try {
    body = JSON.parse(text);
  } catch {
    // not JSON: keep the text
  }
  return { status: response.status, headers: response.headers, body };
}

// ------------------------------------------------------------- signing ----

export function sha256Hex(data) {
  return createHash("sha256").update(data).digest("hex");
}

export function nowSeconds() {
  return Math.floor(Date.now() / 1000);
}

/** Telnyx webhook headers: Ed25519 over `{timestamp}|{body}`. */
export function telnyxHeaders(body, privateKey, timestamp = nowSeconds()) {
  const signature = cryptoSign(null, Buffer.from(`${timestamp}|${body}`), privateKey);
  return {
    "content-type": "application/json",
    "telnyx-signature-ed25519": signature.toString("base64"),
    "telnyx-timestamp": String(timestamp),
  };
}

/** The SPEC §6 canonical string of a node-signed request. */
export function nodeCanonical({ method, host, path, timestamp, body }) {
  return [
    "callfence-node-v1",
    method,
    host.toLowerCase(),
    path,
    String(timestamp),
    sha256Hex(body),
  ].join("\n");
}

/**
 * Headers of a node-signed request to `url` (the Host is the URL's host, as
 * fetch sends it). `signature` may be replaced to forge one.
 */
export function nodeHeaders({ url, method = "POST", body = "", node, kid, privateKey, timestamp = nowSeconds() }) {
  const target = new URL(url);
  const canonical = nodeCanonical({ method, host: target.host, path: target.pathname, timestamp, body });
  const signature = cryptoSign(null, Buffer.from(canonical), privateKey).toString("base64");
  return {
    "content-type": "application/json",
    "callfence-node": node,
    "callfence-key-id": kid,
    "callfence-timestamp": String(timestamp),
    "callfence-signature": signature,
  };
}

/** `Authorization: Bearer <token>`. */
export function bearer(tokenValue) {
  return { authorization: `Bearer ${tokenValue}` };
}

// ------------------------------------------------------------- origins ----

/**
 * Verifies a `Callfence-Assertion` (SPEC §7): `v1.{kid}.{payload}.{sig}`,
 * signed by one of `edgeKeys` ([{kid, public_key}]), for `node`, over `body`.
 * Returns { ok: true, claims } or { ok: false, why }.
 */
export function verifyAssertion(header, { edgeKeys, node, body, now = nowSeconds(), skew = 10 }) {
  const parts = (header ?? "").split(".");
  if (parts.length !== 4 || parts[0] !== "v1") return { ok: false, why: "malformed" };
  const [, kid, payload, sig] = parts;
  const key = edgeKeys.find((k) => k.kid === kid);
  if (!key) return { ok: false, why: "unknown_kid" };
  const signed = Buffer.from(`v1.${kid}.${payload}`);
  if (!cryptoVerify(null, signed, publicKeyFromRaw(key.public_key), Buffer.from(sig, "base64url"))) {
    return { ok: false, why: "bad_signature" };
  }
  let claims;
  try {
    claims = JSON.parse(Buffer.from(payload, "base64url").toString("utf8"));
  } catch {
    return { ok: false, why: "malformed" };
  }
  if (claims.iss !== "callfence-edge") return { ok: false, why: "wrong_issuer" };
  if (claims.node !== node) return { ok: false, why: "wrong_node" };
  if (claims.body_sha256 !== sha256Hex(body)) return { ok: false, why: "body_mismatch" };
  if (claims.exp + skew < now || claims.iat - skew > now) return { ok: false, why: "expired" };
  return { ok: true, claims };
}

/** True when the Telnyx headers of a forwarded request verify over `body`. */
export function verifyTelnyx(headers, body, telnyxPublicKey) {
  const signature = headers["telnyx-signature-ed25519"];
  const timestamp = headers["telnyx-timestamp"];
  if (!signature || !timestamp) return false;
  return cryptoVerify(
    null,
    Buffer.from(`${timestamp}|${body}`),
    publicKeyFromRaw(telnyxPublicKey),
    Buffer.from(signature, "base64"),
  );
}

/**
 * A loopback origin standing in for a node's agent. Records every request
 * with its assertion and Telnyx signature checked, and answers with
 * `respond(request)` (default: 200 `{"ok":true}`).
 *
 * Returns { url, requests, respond, close() }; `url` is the origin URL to put
 * in the node registry.
 */
export async function startOrigin({ node, edgeKeys, telnyxPublicKey, path = "/callfence/telnyx" }) {
  const requests = [];
  const origin = {
    requests,
    respond: () => ({ status: 200, body: { ok: true } }),
  };
  const server = createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", async () => {
      const body = Buffer.concat(chunks).toString("utf8");
      const record = {
        method: req.method,
        path: req.url,
        headers: req.headers,
        body,
        assertion: verifyAssertion(req.headers["callfence-assertion"], { edgeKeys, node, body }),
        telnyxValid: verifyTelnyx(req.headers, body, telnyxPublicKey),
      };
      requests.push(record);
      const answer = await origin.respond(record);
      res.writeHead(answer.status, { "content-type": "application/json" });
      res.end(typeof answer.body === "string" ? answer.body : JSON.stringify(answer.body));
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  origin.url = `http://127.0.0.1:${server.address().port}${path}`;
  origin.close = () => new Promise((resolve) => server.close(resolve));
  return origin;
}

/**
 * Every item of a paged admin read (`GET /v1/calls`, `/v1/events`,
 * `/v1/decisions?after=`): follows `next` from `after` (omitted when
 * undefined) until it is null. `key` names the list in each page; a page
 * answered other than 200, or not at all, is retried up to 5 times, then
 * throws. A 404 (a release without the paged read) throws at once, with
 * `status` 404 on the error.
 */
export async function readPages(edge, tokenValue, path, key, { after, limit = 100 } = {}) {
  const items = [];
  let cursor = after;
  for (;;) {
    const query = `limit=${limit}${cursor === undefined ? "" : `&after=${encodeURIComponent(cursor)}`}`;
    let page;
    for (let attempt = 1; ; attempt += 1) {
      page = await edge
        .fetch(`${path}?${query}`, { headers: bearer(tokenValue) })
        .then(read, (e) => ({ status: 0, body: `network: ${e.cause?.code ?? e.name}` }));
      if (page.status === 200) break;
      if (page.status === 404 || attempt >= 5) {
        throw Object.assign(new Error(`GET ${path}?${query}: ${page.status} ${JSON.stringify(page.body)}`), { status: page.status });
      }
      await new Promise((resolve) => setTimeout(resolve, 200 * attempt));
    }
    items.push(...page.body[key]);
    if (page.body.next === null || page.body.next === undefined) return items;
    cursor = page.body.next;
  }
}
