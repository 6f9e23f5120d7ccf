// The replay file (`callfence_replay_v1`, JSON Lines) and its player.
//
// Line 1, the header:
//   {"schema":"callfence_replay_v1","started_at":"<ISO>","policy":{..},"nodes":{..}}
//   `policy` and `nodes` are the documents in force (the registry's
//   `origin_url`s are the recorded ones; the player maps them).
// Every further line, in the order received, `t_ms` counted from started_at:
//   {"t_ms":N,"kind":"webhook","body":"<the raw webhook body>"}
//   {"t_ms":N,"kind":"heartbeat","node":"M1","body":"<the raw accepted beat>"}
//   {"t_ms":N,"kind":"refusal","node":"M1","event_id":"<id>"}
// A refusal line says the node's origin definitely did not take that event
// (the original decisions show the call reassigned away from it); the
// player's origin for that node answers it 503 `{"callfence":"not_admitted"}` at the refusal's t_ms (times
// the scale), the others accept at once. Lines are in the order the
// original Dispatcher applied them (see exportReplay) and the player sends
// them one after another, each no sooner than its t_ms times the scale,
// waiting for each answer (but for a webhook some origin will refuse: that
// one runs on while later lines go out): the order is what decides.
// Every delivery of a webhook is a line of its own (Telnyx's duplicates and
// retries included). Signatures are not kept: the player signs webhooks with
// the target edge's Telnyx key and beats with the nodes' keys of the target
// registry, and rewrites a beat's `sent_at` to the replay time and its
// `origin_url` to the target's origin for that node.

import { nodeHeaders, read, telnyxHeaders } from "../e2e/harness.mjs";
import { sleep } from "../e2e/agents-cluster.mjs";

/**
 * The replay file's text, from `since` (ms): the documents, the recorded
 * beats, the webhook sends and, from the decisions, the refusals. Lines are
 * in the order the Dispatcher applied them: a beat when its answer came
 * back, a webhook's first delivery when its last decision was made (so a
 * refusal, answered at once by the player, lands when the original
 * reassignment did), every other send when it was sent.
 */
export function exportReplay({ policy, nodes, beats, wire, decisions, since }) {
  const decidedAt = new Map();
  const refusals = [];
  const owner = new Map();
  for (const d of [...decisions].sort((x, y) => x.decision_id - y.decision_id)) {
    if (d.event_id && !decidedAt.has(d.event_id)) decidedAt.set(d.event_id, Date.parse(d.at));
    if (d.outcome === "reassigned" && owner.has(d.call_session_id)) {
      refusals.push({ at: Date.parse(d.at), line: { kind: "refusal", node: owner.get(d.call_session_id), event_id: d.event_id } });
    }
    if (d.chosen) owner.set(d.call_session_id, d.chosen);
  }
  const seen = new Set();
  const sends = wire.map((w) => {
    const id = JSON.parse(w.body).data.id;
    const first = !seen.has(id);
    seen.add(id);
    return { at: first && decidedAt.has(id) ? Math.max(w.at, decidedAt.get(id)) : w.at, line: { kind: "webhook", body: w.body } };
  });
  const items = [
    ...refusals,
    ...beats.map((b) => ({ at: b.at, line: { kind: "heartbeat", node: b.node, body: b.body } })),
    ...sends,
  ]
    .filter((i) => i.at >= since)
    .sort((x, y) => x.at - y.at);
  const header = { schema: "callfence_replay_v1", started_at: new Date(since).toISOString(), policy, nodes };
  return [header, ...items.map((i) => ({ t_ms: i.at - since, ...i.line }))].map((l) => JSON.stringify(l)).join("\n") + "\n";
}

/** Parses a replay file; throws on anything but callfence_replay_v1. */
export function parseReplay(text) {
  const [head, ...rest] = text.split("\n").filter((l) => l.trim());
  const header = JSON.parse(head);
  if (header.schema !== "callfence_replay_v1") throw new Error(`not a callfence_replay_v1 file: ${header.schema}`);
  const lines = rest.map((l, i) => {
    const line = JSON.parse(l);
    const ok = line.kind === "refusal" ? typeof line.event_id === "string" && typeof line.node === "string" : ["webhook", "heartbeat"].includes(line.kind) && typeof line.body === "string";
    if (!ok || !Number.isFinite(line.t_ms)) {
      throw new Error(`replay line ${i + 2}: want t_ms and kind webhook|heartbeat with a body, or refusal with node and event_id`);
    }
    return line;
  });
  return { header, lines };
}

/**
 * Plays `lines` into `edge` with their spacing times `scale`.
 * signer: { telnyx: KeyObject, nodes: { [id]: { kid, privateKey } } }; originFor(id) the target origin URL.
 * Returns { sent, failed } (a failed send is counted, never retried: the file has the retries).
 * The refusal lines are for the origins: see `refuses`.
 */
export async function play(edge, lines, { scale = 1, start = Date.now(), signer, originFor }) {
  const held = new Set(lines.filter((l) => l.kind === "refusal").map((l) => l.event_id));
  const running = [];
  let sent = 0;
  let failed = 0;
  for (const line of lines.filter((l) => l.kind !== "refusal")) {
    const due = start + line.t_ms * scale;
    if (due > Date.now()) await sleep(due - Date.now());
    let path;
    let body;
    let headers;
    if (line.kind === "heartbeat") {
      const beat = JSON.parse(line.body);
      beat.sent_at = new Date().toISOString();
      beat.origin_url = originFor(line.node);
      body = JSON.stringify(beat);
      path = "/v1/nodes/heartbeat";
      const key = signer.nodes[line.node];
      headers = nodeHeaders({ url: new URL(path, edge.url).href, body, node: line.node, kid: key.kid, privateKey: key.privateKey });
    } else {
      body = line.body;
      path = "/v1/telnyx/webhook";
      headers = telnyxHeaders(body, signer.telnyx);
    }
    const send = edge.fetch(path, { method: "POST", headers, body }).then(read).then(
      (r) => (r.status === 200 ? null : (failed += 1)),
      () => (failed += 1),
    );
    sent += 1;
    if (line.kind === "webhook" && held.has(JSON.parse(body).data.id)) running.push(send);
    else await send;
  }
  await Promise.all(running);
  return { sent, failed };
}

/**
 * The refusal lines as (node, event_id) => when to refuse it (ms after the
 * replay's start, scaled), or null to accept.
 */
export function refuses(lines, scale = 1) {
  const map = new Map(lines.filter((l) => l.kind === "refusal").map((l) => [`${l.node}\n${l.event_id}`, l.t_ms * scale]));
  return (node, eventId) => map.get(`${node}\n${eventId}`) ?? null;
}

const FIELDS = ["rule", "prefers", "chosen", "reasons", "outcome"];
const pick = (d) => Object.fromEntries(FIELDS.map((f) => [f, d[f]]));

/** Per session, the decisions (oldest first) compared field by field; returns the differences with both evidences. */
export function compareDecisions(original, replayed) {
  const bySession = (list) => {
    const m = new Map();
    for (const d of [...list].sort((a, b) => a.decision_id - b.decision_id)) {
      if (!m.has(d.call_session_id)) m.set(d.call_session_id, []);
      m.get(d.call_session_id).push(d);
    }
    return m;
  };
  const a = bySession(original);
  const b = bySession(replayed);
  const differences = [];
  let compared = 0;
  for (const session of new Set([...a.keys(), ...b.keys()])) {
    const x = a.get(session) ?? [];
    const y = b.get(session) ?? [];
    for (let i = 0; i < Math.max(x.length, y.length); i += 1) {
      compared += 1;
      const left = x[i] ? pick(x[i]) : null;
      const right = y[i] ? pick(y[i]) : null;
      if (JSON.stringify(left) !== JSON.stringify(right)) differences.push({ session, index: i, original: x[i] ?? null, replay: y[i] ?? null });
    }
  }
  return { compared, differences };
}
