// The replay file (`callfence_replay_v1`, JSON Lines), how it is made from
// an edge's export, and its player.
//
// Line 1, the header:
//   {"schema":"callfence_replay_v1","started_at":"<ISO>","policy":{..},"nodes":{..}}
//   `policy` and `nodes` are the documents in force (the registry's
//   `origin_url`s are the recorded ones; the player maps them).
// Every further line, in the order the original Dispatcher applied them,
// `t_ms` counted from started_at by the Dispatcher's own clock:
//   {"t_ms":N,"kind":"webhook","body":"<the raw webhook body>"}
//   {"t_ms":N,"kind":"heartbeat","node":"M1","body":"<the raw accepted beat>"}
//   {"t_ms":N,"kind":"delivery","node":"M2","event_id":"<id>","attempt":K}
//   {"t_ms":N,"kind":"refusal","node":"M1","event_id":"<id>"}
// Webhooks come from the edge's export (GET /v1/events) and decisions (see
// replayFile); beats from a capture in front of the edge (the Dispatcher
// keeps only each node's last beat). A delivery line says when the node's
// origin took that event, a refusal line when it definitely did not (the
// original decisions show the call reassigned away from it): the player's
// origins hold each such forward until the player reaches its line, then
// answer 200 or 503 `{"callfence":"not_admitted"}`; a delivered event's
// forwards before its `attempt` (timeouts in the original, re-driven) get
// no answer; any other forward is accepted at once. The player sends the lines in order, each no sooner than its
// t_ms times the scale, and goes on only once the edge has taken the line
// (see player): the order is what decides. Signatures are not kept:
// the player signs webhooks with the target edge's Telnyx key and beats
// with the nodes' keys of the target registry, and rewrites a beat's
// `sent_at` to the replay time and its `origin_url` to the target's origin
// for that node.

import { bearer, nodeHeaders, read, readPages, telnyxHeaders } from "../e2e/harness.mjs";
import { sleep } from "../e2e/agents-cluster.mjs";

/**
 * Reads what a replay file is made from off an edge, through its admin
 * export: every webhook it received (`GET /v1/events`: the raw body of each
 * event's first delivery and when the Dispatcher took it) and every
 * decision (`GET /v1/decisions?after=0`), every call (`GET /v1/calls`:
 * how many attempts each event took), and the documents in force.
 */
export async function exportEdge(edge, adminToken) {
  const get = async (path) => {
    const { revision, ...doc } = (await read(await edge.fetch(path, { headers: bearer(adminToken) }))).body;
    return revision === undefined ? null : doc;
  };
  return {
    events: await readPages(edge, adminToken, "/v1/events", "events"),
    calls: await readPages(edge, adminToken, "/v1/calls", "calls"),
    decisions: await readPages(edge, adminToken, "/v1/decisions", "decisions", { after: 0, limit: 500 }),
    policy: await get("/v1/policy"),
    nodes: await get("/v1/nodes"),
  };
}

/**
 * The replay file's text, from `since` (ms): the documents, the exported
 * webhooks and decisions (see exportEdge) and the captured beats (the
 * Dispatcher keeps only each node's last beat). Every time is the
 * Dispatcher's own: a webhook line at its event's `received_at`, and again
 * at each later `assigned` decision of that event (a parked event placed
 * when Telnyx delivered it again; if the alarm placed it first, the
 * re-delivery is a duplicate that changes nothing); a beat at the
 * `edge_time` of its answer; a refusal at the reassignment that followed
 * it; a delivery when the event's delivery was recorded (`updated_at` of a
 * delivered event), with the attempt that delivered it.
 */
export function replayFile({ policy, nodes, beats, events, decisions, calls = [], since }) {
  const attempts = new Map(calls.flatMap((c) => (c.events ?? []).map((e) => [e.event_id, e.attempts])));
  const body = new Map(events.map((e) => [e.event_id, e.body]));
  const items = events.map((e) => ({ at: Date.parse(e.received_at), line: { kind: "webhook", body: e.body } }));
  const first = new Map(items.map((i, n) => [events[n].event_id, i.at]));
  const owner = new Map();
  for (const d of [...decisions].sort((x, y) => x.decision_id - y.decision_id)) {
    const at = Date.parse(d.at);
    if (d.outcome === "reassigned" && owner.has(d.call_session_id)) {
      items.push({ at, line: { kind: "refusal", node: owner.get(d.call_session_id), event_id: d.event_id } });
    }
    if (d.outcome === "assigned" && body.has(d.event_id) && at > first.get(d.event_id)) {
      items.push({ at, line: { kind: "webhook", body: body.get(d.event_id) } });
    }
    if (d.chosen) owner.set(d.call_session_id, d.chosen);
  }
  for (const e of events) {
    if (e.state === "delivered" && e.node) {
      items.push({ at: Date.parse(e.updated_at), line: { kind: "delivery", node: e.node, event_id: e.event_id, attempt: attempts.get(e.event_id) ?? 1 } });
    }
  }
  for (const b of beats) items.push({ at: b.at, line: { kind: "heartbeat", node: b.node, body: b.body } });
  const kept = items.filter((i) => i.at >= since).sort((x, y) => x.at - y.at);
  const header = { schema: "callfence_replay_v1", started_at: new Date(since).toISOString(), policy, nodes };
  return [header, ...kept.map((i) => ({ t_ms: i.at - since, ...i.line }))].map((l) => JSON.stringify(l)).join("\n") + "\n";
}

const OUTCOMES = { delivery: { status: 200, body: { ok: true } }, refusal: { status: 503, body: { callfence: "not_admitted" } } };

/** Parses a replay file; throws on anything but callfence_replay_v1. */
export function parseReplay(text) {
  const [head, ...rest] = text.split("\n").filter((l) => l.trim());
  const header = JSON.parse(head);
  if (header.schema !== "callfence_replay_v1") throw new Error(`not a callfence_replay_v1 file: ${header.schema}`);
  const lines = rest.map((l, i) => {
    const line = JSON.parse(l);
    const ok = OUTCOMES[line.kind] ? typeof line.event_id === "string" && typeof line.node === "string" : ["webhook", "heartbeat"].includes(line.kind) && typeof line.body === "string";
    if (!ok || !Number.isFinite(line.t_ms)) {
      throw new Error(`replay line ${i + 2}: want t_ms and kind webhook|heartbeat with a body, or delivery|refusal with node and event_id`);
    }
    return line;
  });
  return { header, lines };
}

/**
 * A player of `lines` into `edge`. Its `respond(node, eventId)` is the
 * stand-in origins' answer: an event with a delivery or refusal line for
 * that node is held until the player reaches that line, then answered 200
 * or 503 `not_admitted`; the forwards of an event before its delivered
 * `attempt` (whose outcome the original never learnt: a timeout, re-driven
 * later) are never answered, so the edge times them out again; any other is
 * accepted at once. `play(start)` sends
 * the lines no sooner than `t_ms` times `scale` after `start`, in order: a
 * webhook goes on once the edge has answered it or forwarded it to an
 * origin (its decision is made); a beat once answered; a delivery or
 * refusal once the edge has applied that outcome (the webhook answered, the
 * event forwarded elsewhere, or its call view changed). So decisions, beats
 * and outcomes reach the Dispatcher in the original's order, whatever the
 * replay's timing jitter.
 * signer: { telnyx: KeyObject, nodes: { [id]: { kid, privateKey } } }; originFor(id) the target origin URL.
 * `play` returns { sent, failed, unmatched } (a failed send is counted,
 * never retried: the file has the retries; `unmatched`: outcome lines whose
 * forward never came).
 */
export function player(edge, lines, { scale = 1, signer, originFor, adminToken }) {
  const key = (node, eventId) => `${node}\n${eventId}`;
  const outcomes = new Map(lines.filter((l) => OUTCOMES[l.kind]).map((l) => [key(l.node, l.event_id), OUTCOMES[l.kind]]));
  const held = new Map(); // key -> release()
  const released = new Set();
  const waiters = new Map(); // event id -> [resolve] for its next forward
  const inflight = new Map(); // event id -> the webhook's send
  const sessionOf = new Map();
  const nextForward = (eventId) => new Promise((resolve) => waiters.set(eventId, [...(waiters.get(eventId) ?? []), resolve]));

  const delivered = new Map(lines.filter((l) => l.kind === "delivery").map((l) => [l.event_id, l.attempt ?? 1]));
  const arrivals = new Map(); // event id -> forwards so far
  const stalled = []; // answers of forwards the original never got an answer to

  function respond(node, eventId) {
    for (const resolve of waiters.get(eventId) ?? []) resolve();
    waiters.delete(eventId);
    const n = (arrivals.get(eventId) ?? 0) + 1;
    arrivals.set(eventId, n);
    const k = key(node, eventId);
    const outcome = outcomes.get(k);
    const early = outcome === OUTCOMES.delivery && n < delivered.get(eventId);
    if (early) return new Promise((resolve) => stalled.push(() => resolve({ status: 504, body: {} })));
    if (!outcome || released.has(k)) return outcome ?? OUTCOMES.delivery;
    return new Promise((resolve) => held.set(k, () => resolve(outcome)));
  }

  /** Resolves once the call view of `eventId`'s session shows the event out of `forwarding` (at most 5 s). */
  async function settled(eventId) {
    const session = sessionOf.get(eventId);
    for (let i = 0; session && i < 250; i += 1) {
      const res = await read(await edge.fetch(`/v1/calls/${encodeURIComponent(session)}`, { headers: bearer(adminToken) }));
      if (res.body.events?.find((e) => e.event_id === eventId)?.state !== "forwarding") return;
      await sleep(20);
    }
  }

  async function play(start = Date.now()) {
    let sent = 0;
    let failed = 0;
    let unmatched = 0;
    const count = (r) => (r.status === 200 ? null : (failed += 1));
    for (const line of lines) {
      const due = start + line.t_ms * scale;
      if (due > Date.now()) await sleep(due - Date.now());
      if (OUTCOMES[line.kind]) {
        const k = key(line.node, line.event_id);
        for (let i = 0; !held.has(k) && i < 500; i += 1) await sleep(20);
        const release = held.get(k);
        if (!release) {
          unmatched += 1;
          continue;
        }
        held.delete(k);
        released.add(k);
        const next = nextForward(line.event_id);
        release();
        await Promise.race([inflight.get(line.event_id) ?? settled(line.event_id), next]);
        continue;
      }
      sent += 1;
      if (line.kind === "heartbeat") {
        const beat = JSON.parse(line.body);
        beat.sent_at = new Date().toISOString();
        beat.origin_url = originFor(line.node);
        const body = JSON.stringify(beat);
        const path = "/v1/nodes/heartbeat";
        const k = signer.nodes[line.node];
        const headers = nodeHeaders({ url: new URL(path, edge.url).href, body, node: line.node, kid: k.kid, privateKey: k.privateKey });
        await edge.fetch(path, { method: "POST", headers, body }).then(read).then(count, () => (failed += 1));
        continue;
      }
      const { data } = JSON.parse(line.body);
      sessionOf.set(data.id, data.payload?.call_session_id);
      const forwarded = nextForward(data.id);
      const send = edge
        .fetch("/v1/telnyx/webhook", { method: "POST", headers: telnyxHeaders(line.body, signer.telnyx), body: line.body })
        .then(read)
        .then(count, () => (failed += 1));
      inflight.set(data.id, send);
      send.then(() => inflight.get(data.id) === send && inflight.delete(data.id));
      await Promise.race([send, forwarded]);
    }
    for (const release of [...held.values(), ...stalled]) release();
    await Promise.all(inflight.values());
    return { sent, failed, unmatched };
  }

  return { respond, play };
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
