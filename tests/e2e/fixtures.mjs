// Shared end-to-end fixtures on top of harness.mjs: nodes with real loopback
// origins, documents, node-signed heartbeats and requests, signed webhooks.
//
// The API (stable; add, never change signatures):
//
//   CLEAN_SHA                               a 40-hex SHA reported by default
//   edgeKeysOf(keys)                        [{kid, public_key}] an origin trusts
//   makeNode(edge, id, {role, respond})     a node: {id, kid, key, origin, lines?}
//                                           with a started origin (close it via
//                                           node.origin.close(); cluster.dispose does)
//   registryFor(nodes, perNode)             a callfence_nodes_v1 document
//   putDocument(edge, "nodes"|"policy", doc) compare-and-set PUT at the current
//                                           revision -> {status, headers, body}
//   putRegistry(edge, nodes, perNode)       putDocument of registryFor(...)
//   putPolicy(edge, policy)                 putDocument; remembers the lines so
//                                           heartbeats serve them by default
//   heartbeatBody(edge, node, overrides)    an eligible beat (overrides merged)
//   heartbeat(edge, node, overrides)        POSTs it signed -> {status, headers, body}
//   nodePost(edge, node, path, body, opts)  any node-signed POST -> read()
//   fence(edge, node, {call_session_id, call_control_id, epoch, purpose})
//   callEvent(type, {session, leg, id, from, to, direction, connection_id,
//                    payload})              a Telnyx event body (object)
//   webhook(edge, event, {timestamp, privateKey})  signed POST -> read()
//   admin(edge, path, init)                 bearer(admin) request -> read()
//   waitFor(fn, {timeout, interval, what})  polls until fn() is truthy, returns it
//   setupCluster({nodes, perNode, policy, bindings, keys, dir, beat})
//     -> {edge, keys, nodes: {id: node}, dispose()}; registry + policy put,
//        and (beat !== false) one eligible heartbeat per node.

import { randomUUID } from "node:crypto";
import {
  bearer,
  bindingsFor,
  nodeHeaders,
  nowSeconds,
  read,
  sha256Hex,
  startEdge,
  startOrigin,
  telnyxHeaders,
  testKeys,
  ed25519,
} from "./harness.mjs";

export const CLEAN_SHA = "9b4082d1c0ffee00112233445566778899aabbcc";

const policyLines = new WeakMap(); // edge -> {line_id: called_number}
const seqs = new WeakMap(); // node -> last seq

/** The edge keys an origin trusts (active, then next). */
export function edgeKeysOf(keys) {
  return [
    { kid: keys.edgeKid, public_key: keys.edge.publicKey },
    { kid: keys.edgeNextKid, public_key: keys.edgeNext.publicKey },
  ];
}

/**
 * A node with a fresh key (kid "k1") and a started loopback origin that
 * verifies the assertion and the Telnyx signature of every request
 * (origin.requests[i].assertion.ok / .telnyxValid). `respond(record)` may
 * be replaced at any time on node.origin.respond.
 */
export async function makeNode(edge, id, { role = "stable", respond } = {}) {
  const origin = await startOrigin({
    node: id,
    edgeKeys: edgeKeysOf(edge.keys),
    telnyxPublicKey: edge.keys.telnyx.publicKey,
  });
  if (respond) origin.respond = respond;
  return { id, role, kid: "k1", key: ed25519(), origin };
}

/** A node registry for `nodes`; `perNode[id]` is merged into each entry. */
export function registryFor(nodes, perNode = {}) {
  const doc = { schema: "callfence_nodes_v1", nodes: {} };
  for (const node of nodes) {
    doc.nodes[node.id] = {
      role: node.role ?? "stable",
      origin_url: node.origin.url,
      keys: { [node.kid]: node.key.publicKey },
      fallback_approved: false,
      admin_drained: false,
      ...(node.role === "candidate" ? { canary_go: true } : {}),
      ...(perNode[node.id] ?? {}),
    };
  }
  return doc;
}

/** PUT /v1/{kind} with If-Match at the current revision (admin token). */
export async function putDocument(edge, kind, doc) {
  const current = await admin(edge, `/v1/${kind}`);
  const revision = current.status === 200 ? current.body.revision : 0;
  const res = await read(
    await edge.fetch(`/v1/${kind}`, {
      method: "PUT",
      headers: { ...bearer(edge.keys.adminToken), "if-match": `"${revision}"`, "content-type": "application/json" },
      body: JSON.stringify(doc),
    }),
  );
  if (kind === "policy" && res.status === 200) {
    const lines = {};
    for (const [lineId, line] of Object.entries(doc.by_line ?? {})) lines[lineId] = line.called_number;
    policyLines.set(edge, lines);
  }
  return res;
}

export const putRegistry = (edge, nodes, perNode) => putDocument(edge, "nodes", registryFor(nodes, perNode));
export const putPolicy = (edge, policy) => putDocument(edge, "policy", policy);

function routingHash(lines) {
  const text = Object.keys(lines)
    .sort()
    .map((id) => `${id}=${lines[id]}\n`)
    .join("");
  return sha256Hex(text);
}

/** An eligible heartbeat body for `node`; `overrides` are merged on top. */
export function heartbeatBody(edge, node, overrides = {}) {
  const seq = Math.max((seqs.get(node) ?? 0) + 1, Date.now());
  seqs.set(node, seq);
  const lines = overrides.lines ?? node.lines ?? policyLines.get(edge) ?? {};
  return {
    schema: "callfence_heartbeat_v1",
    node: node.id,
    seq,
    sent_at: new Date().toISOString(),
    valid_for_s: 15,
    mode: "active",
    sha: CLEAN_SHA,
    dirty: false,
    app_ready: true,
    capacity: { max_calls: 10, active_calls: 0 },
    tunnel_up: true,
    origin_url: node.origin.url,
    lines,
    routing_hash: routingHash(lines),
    agent_version: "0.1.0-e2e",
    ...overrides,
  };
}

/**
 * A node-signed POST. `body` is an object (serialised) or a string. Retries
 * for up to 2 s while the Worker's key cache does not know the node yet
 * (401 unknown_node_key right after a registry PUT), unless opts.retry is false.
 */
export async function nodePost(edge, node, path, body, { retry = true, timestamp, privateKey } = {}) {
  const text = typeof body === "string" ? body : JSON.stringify(body);
  const deadline = Date.now() + 2500;
  for (;;) {
    const url = new URL(path, edge.url);
    const headers = nodeHeaders({
      url,
      body: text,
      node: node.id,
      kid: node.kid,
      privateKey: privateKey ?? node.key.privateKeyObject,
      timestamp: timestamp ?? nowSeconds(),
    });
    const res = await read(await edge.fetch(path, { method: "POST", headers, body: text }));
    if (retry && res.status === 401 && res.body?.error === "unknown_node_key" && Date.now() < deadline) {
      await sleep(250);
      continue;
    }
    return res;
  }
}

/** Sends a signed heartbeat describing `node` (eligible unless overridden). */
export function heartbeat(edge, node, overrides = {}) {
  return nodePost(edge, node, "/v1/nodes/heartbeat", heartbeatBody(edge, node, overrides));
}

/** POST /v1/fence as `node`. */
export function fence(edge, node, { call_session_id, call_control_id, epoch, purpose = "answer" }) {
  return nodePost(edge, node, "/v1/fence", { call_session_id, call_control_id, epoch, purpose });
}

/**
 * A Telnyx Call Control event body. `session` and `leg` become
 * call_session_id / call_control_id (omitted when null); `from`/`to` too.
 */
export function callEvent(
  type,
  { session, leg, id = randomUUID(), from, to, direction = "incoming", connection_id, payload = {} } = {},
) {
  const p = { ...payload };
  if (session != null) p.call_session_id = session;
  if (leg != null) p.call_control_id = leg;
  if (from != null) p.from = from;
  if (to != null) p.to = to;
  if (direction != null) p.direction = direction;
  if (connection_id != null) p.connection_id = connection_id;
  return {
    data: { record_type: "event", id, event_type: type, occurred_at: new Date().toISOString(), payload: p },
    meta: { attempt: 1, delivered_to: "https://edge.invalid/v1/telnyx/webhook" },
  };
}

/** POSTs `event` (object or raw string) signed as Telnyx -> read(). */
export async function webhook(edge, event, { timestamp = nowSeconds(), privateKey } = {}) {
  const body = typeof event === "string" ? event : JSON.stringify(event);
  const headers = telnyxHeaders(body, privateKey ?? edge.keys.telnyx.privateKeyObject, timestamp);
  return read(await edge.fetch("/v1/telnyx/webhook", { method: "POST", headers, body }));
}

/** A request with the admin bearer -> read(). */
export async function admin(edge, path, init = {}) {
  return read(await edge.fetch(path, { ...init, headers: { ...bearer(edge.keys.adminToken), ...(init.headers ?? {}) } }));
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Polls `fn` until it returns a truthy value (returned); throws on timeout. */
export async function waitFor(fn, { timeout = 5000, interval = 50, what = "condition" } = {}) {
  const deadline = Date.now() + timeout;
  for (;;) {
    const value = await fn();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeout} ms waiting for ${what}`);
    await sleep(interval);
  }
}

/**
 * An edge with nodes, their registry and a policy in force.
 * nodes: ids, or {id, role} objects (default ["M1", "M2"]).
 * perNode: registry overrides per node id. policy: the policy document
 * (default {default_node: first node}). bindings: merged over bindingsFor.
 * beat: false to send no heartbeat. shards: 1 keeps one call shard under the
 * e2e matrix (startEdge's option).
 */
export async function setupCluster({ nodes = ["M1", "M2"], perNode = {}, policy, bindings = {}, keys, dir, beat = true, shards } = {}) {
  keys = keys ?? testKeys();
  const edge = await startEdge({ keys, dir, shards, bindings: { ...bindingsFor(keys), ...bindings } });
  const made = [];
  try {
    for (const spec of nodes) {
      const { id, role } = typeof spec === "string" ? { id: spec } : spec;
      made.push(await makeNode(edge, id, { role }));
    }
    const reg = await putRegistry(edge, made, perNode);
    if (reg.status !== 200) throw new Error(`PUT /v1/nodes: ${reg.status} ${JSON.stringify(reg.body)}`);
    const doc = policy ?? { schema: "riff_node_routing_policy_v1", default_node: made[0].id, by_line: {}, by_caller: {} };
    const pol = await putPolicy(edge, doc);
    if (pol.status !== 200) throw new Error(`PUT /v1/policy: ${pol.status} ${JSON.stringify(pol.body)}`);
    if (beat) {
      for (const node of made) {
        const res = await heartbeat(edge, node);
        if (res.status !== 200) throw new Error(`heartbeat ${node.id}: ${res.status} ${JSON.stringify(res.body)}`);
      }
    }
  } catch (error) {
    await Promise.all(made.map((n) => n.origin.close()));
    await edge.dispose();
    throw error;
  }
  return {
    edge,
    keys,
    nodes: Object.fromEntries(made.map((n) => [n.id, n])),
    async dispose() {
      await edge.dispose();
      await Promise.all(made.map((n) => n.origin.close().catch(() => {})));
    },
  };
}
