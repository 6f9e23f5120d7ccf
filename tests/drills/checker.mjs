// The drills' checker: pure functions over a recorded history, so the tests
// can feed it histories with a planted violation.
//
// A history is
//   commands:  what the fake Telnyx received, [{ ccid, action, command_id, node, at }]
//              (`node` from the API key that sent it, each node having its own)
//   acks:      every webhook the drill sent and its answer,
//              [{ session, ccid, event_id, type, status, body, at }]
//   calls:     { [call_session_id]: the edge's GET /v1/calls/{id} view } after the run
//   decisions: the edge's GET /v1/decisions rows for those sessions
//   ccids:     { [call_control_id]: call_session_id }
//   twice:     sessions the edge's paged GET /v1/calls listed more than once (optional)
//
// Violations (each { kind, session, evidence }):
//   second_answer            one call answered under two command_ids (two epochs)
//   answered_by_two_nodes    one call answered by two nodes
//   answer_superseded_epoch  an answer whose epoch or node is not the call's owner at its current epoch
//   ack_ownership_lost       a webhook acknowledged 200 (delivered_to, epoch) whose call is now owned otherwise
//   moved_after_ambiguous    an event left `unknown` at (node, epoch) on a call now owned otherwise
//   decision_unattributed    an assignment without policy and registry revisions
//   decision_not_clean       an assignment citing no SHA or an unclean one
//   open_past_sweep          a call still open after the sweep had its chance
//   held_by_two_shards       a session listed by two call shards (SPEC §16: one holder each)

import { commandId } from "../e2e/agents-cluster.mjs";

export { commandId };

/** The epoch a command_id was minted for (1..limit), or null. */
export function epochOf(ccid, id, limit = 64) {
  for (let e = 1; e <= limit; e += 1) if (commandId(ccid, e) === id) return e;
  return null;
}

const OPEN = new Set(["pending_assignment", "assigned", "answered"]);
const ASSIGNING = new Set(["assigned", "reassigned"]);

/** The `answer` commands Telnyx received, by call session. */
function answersBySession(commands, ccids) {
  const out = new Map();
  for (const c of commands) {
    if (c.action !== "answer") continue;
    const session = ccids[c.ccid];
    if (!out.has(session)) out.set(session, []);
    out.get(session).push(c);
  }
  return out;
}

/** A command's id (the fake records it in the body or beside it). */
const idOf = (c) => c.body?.command_id ?? c.command_id;

/** Checks a history; returns { violations, figures }. */
export function check({ commands, acks, calls, decisions, ccids, twice = [], requireSettled = true }) {
  const violations = [];
  const flag = (kind, session, evidence) => violations.push({ kind, session, evidence });
  for (const session of twice) flag("held_by_two_shards", session, {});

  const answered = answersBySession(commands, ccids);
  for (const [session, answers] of answered) {
    const call = calls[session];
    const ids = new Set(answers.map(idOf));
    const nodes = new Set(answers.map((a) => a.node));
    if (ids.size > 1) flag("second_answer", session, { command_ids: [...ids] });
    if (nodes.size > 1) flag("answered_by_two_nodes", session, { nodes: [...nodes] });
    for (const a of answers) {
      const id = idOf(a);
      const epoch = epochOf(a.ccid, id, Math.max(64, (call?.epoch ?? 0) + 8));
      if (!call || epoch !== call.epoch || a.node !== call.owner) {
        flag("answer_superseded_epoch", session, {
          answer: { node: a.node, command_id: id, epoch },
          call: call ? { owner: call.owner, epoch: call.epoch } : null,
        });
      }
    }
  }

  for (const ack of acks) {
    if (ack.status !== 200 || !ack.body?.delivered_to) continue;
    const call = calls[ack.session];
    if (!call || call.owner !== ack.body.delivered_to || call.epoch !== ack.body.epoch) {
      flag("ack_ownership_lost", ack.session, {
        ack: { event_id: ack.event_id, delivered_to: ack.body.delivered_to, epoch: ack.body.epoch },
        call: call ? { owner: call.owner, epoch: call.epoch } : null,
      });
    }
  }

  for (const [session, call] of Object.entries(calls)) {
    for (const ev of call.events ?? []) {
      if (ev.state === "unknown" && ev.node && (ev.node !== call.owner || ev.epoch !== call.epoch)) {
        flag("moved_after_ambiguous", session, { event: ev, call: { owner: call.owner, epoch: call.epoch } });
      }
    }
    if (requireSettled && OPEN.has(call.state)) flag("open_past_sweep", session, { state: call.state, owner: call.owner });
  }

  for (const d of decisions) {
    if (!ASSIGNING.has(d.outcome)) continue;
    if (d.policy_revision == null || d.nodes_revision == null) {
      flag("decision_unattributed", d.call_session_id, { decision_id: d.decision_id, policy_revision: d.policy_revision, nodes_revision: d.nodes_revision });
    }
    if (!d.chosen_sha || d.chosen_clean !== true) {
      flag("decision_not_clean", d.call_session_id, { decision_id: d.decision_id, chosen: d.chosen, chosen_sha: d.chosen_sha, chosen_clean: d.chosen_clean });
    }
  }

  return {
    violations,
    figures: {
      calls: Object.keys(calls).length,
      answered_calls: answered.size,
      answer_commands: commands.filter((c) => c.action === "answer").length,
      webhooks: acks.length,
      acks_200: acks.filter((a) => a.status === 200).length,
      decisions: decisions.length,
    },
  };
}

/**
 * The calls no answer command reached, each with what explains it: the
 * call's final state, whether a fence was granted, every webhook sent for
 * it with its answer, and the fault windows ({ label, from, to }) that
 * overlapped its life (its first send to its last). Not violations: a
 * caller can hang up before the app answers, and a chaos fault can keep
 * every retry of a call.initiated from being delivered.
 */
export function unansweredCalls({ commands, acks, calls, ccids }, windows = []) {
  const answered = answersBySession(commands, ccids);
  const sent = new Map();
  for (const a of acks) {
    if (!sent.has(a.session)) sent.set(a.session, []);
    sent.get(a.session).push(a);
  }
  return Object.entries(calls)
    .filter(([session]) => !answered.has(session))
    .map(([session, call]) => {
      const own = sent.get(session) ?? [];
      const from = Math.min(...own.map((a) => a.at));
      const to = Math.max(...own.map((a) => a.at));
      const fenced = Boolean(call.fence);
      const delivered = own.some((a) => a.type === "call.initiated" && a.status === 200);
      return {
        session,
        state: call.state,
        owner: call.owner ?? null,
        fenced,
        cause: fenced ? "fenced, no answer" : delivered ? "delivered, no fence taken" : "call.initiated never delivered",
        webhooks: own.map((a) => `+${a.at - from} ms ${a.type} ${a.status} ${a.status === 200 ? (a.body?.delivered_to ?? "") : answerCode(a)}`),
        faults: windows.filter((w) => w.from <= to && w.to >= from).map((w) => w.label),
      };
    });
}

/** What an answer said: its error code (or the fake's `callfence` field, a short text, `?`). */
export const answerCode = (a) => a.body?.error ?? a.body?.callfence ?? (typeof a.body === "string" ? a.body.slice(0, 40) : "?");

/** How many of `items` give each `key(item)`. */
export function tally(items, key) {
  const out = {};
  for (const item of items) out[key(item)] = (out[key(item)] ?? 0) + 1;
  return out;
}

/** Per window [{ label, from, to }]: webhooks sent in it and the share answered 503 (or not at all). */
export function unavailability(acks, windows) {
  return windows.map((w) => {
    const inside = acks.filter((a) => a.at >= w.from && a.at < w.to);
    const failed = inside.filter((a) => a.status === 503 || a.status === 0).length;
    return { ...w, webhooks: inside.length, failed, rate_503: inside.length ? +(failed / inside.length).toFixed(4) : 0 };
  });
}

/**
 * Windows in which a node was marked ineligible on purpose ({ node, reason,
 * marked_at, until }, times in ms; a null `marked_at` means it never was):
 * a violation for each call assigned to that node while marked, and one for
 * a mark that never came.
 */
export function routedWhileMarked(decisions, windows) {
  const violations = [];
  for (const w of windows) {
    if (!w.reason) continue;
    if (w.marked_at == null) {
      violations.push({ kind: "never_marked", session: null, evidence: { node: w.node, reason: w.reason, from: w.from } });
      continue;
    }
    for (const d of decisions) {
      const at = Date.parse(d.at);
      if (d.chosen === w.node && ASSIGNING.has(d.outcome) && at >= w.marked_at && at < w.until) {
        violations.push({ kind: "routed_to_marked_node", session: d.call_session_id, evidence: { node: w.node, reason: w.reason, decision_id: d.decision_id, at: d.at, rule: d.rule } });
      }
    }
  }
  return violations;
}

/**
 * Calls that broke (each a `call_broken` violation): not ended normally
 * (`node_lost`, `max_duration`, still open); answered under two command_ids;
 * a fence granted but no answer reaching Telnyx (a caller who hangs up
 * before the app answers takes no fence, and is not a break); the last send
 * of its call.initiated or of its hangup not acknowledged 200. `acks`,
 * `commands` and `ccids` as for check(), `calls` the final call views.
 * With `fencedUnanswered` (an array), a fenced call without an answer is
 * pushed there instead: across an edge restart the grant's reply can be
 * lost, and the demo app asks for the fence once (never two answers, but
 * none).
 */
export function callsIntact({ calls, commands, ccids, acks }, fencedUnanswered = null) {
  const answered = answersBySession(commands, ccids);
  const last = new Map();
  for (const a of acks) last.set(`${a.session} ${a.type}`, a.status);
  const violations = [];
  for (const [session, call] of Object.entries(calls)) {
    const answers = new Set((answered.get(session) ?? []).map(idOf)).size;
    const init = last.get(`${session} call.initiated`);
    const hung = last.get(`${session} call.hangup`);
    const unanswered = Boolean(call.fence) && answers === 0;
    if (unanswered && fencedUnanswered) fencedUnanswered.push(session);
    const broken =
      call.state !== "ended" ||
      answers > 1 ||
      (unanswered && !fencedUnanswered) ||
      (init !== undefined && init !== 200) ||
      (hung !== undefined && hung !== 200);
    if (broken) {
      violations.push({ kind: "call_broken", session, evidence: { state: call.state, owner: call.owner, fence: call.fence ?? null, answers, initiated_status: init ?? null, hangup_status: hung ?? null } });
    }
  }
  return violations;
}
