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

import { commandId } from "../e2e/agents-cluster.mjs";

export { commandId };

/** The epoch a command_id was minted for (1..limit), or null. */
export function epochOf(ccid, id, limit = 64) {
  for (let e = 1; e <= limit; e += 1) if (commandId(ccid, e) === id) return e;
  return null;
}

const OPEN = new Set(["pending_assignment", "assigned", "answered"]);
const ASSIGNING = new Set(["assigned", "reassigned"]);

/** Checks a history; returns { violations, figures }. */
export function check({ commands, acks, calls, decisions, ccids, requireSettled = true }) {
  const violations = [];
  const flag = (kind, session, evidence) => violations.push({ kind, session, evidence });

  const answersBySession = new Map();
  for (const c of commands) {
    if (c.action !== "answer") continue;
    const session = ccids[c.ccid];
    if (!answersBySession.has(session)) answersBySession.set(session, []);
    answersBySession.get(session).push(c);
  }
  for (const [session, answers] of answersBySession) {
    const call = calls[session];
    const ids = new Set(answers.map((a) => a.body?.command_id ?? a.command_id));
    const nodes = new Set(answers.map((a) => a.node));
    if (ids.size > 1) flag("second_answer", session, { command_ids: [...ids] });
    if (nodes.size > 1) flag("answered_by_two_nodes", session, { nodes: [...nodes] });
    for (const a of answers) {
      const id = a.body?.command_id ?? a.command_id;
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

  const answered = [...answersBySession.values()].filter((a) => a.length > 0).length;
  return {
    violations,
    figures: {
      calls: Object.keys(calls).length,
      answered_calls: answered,
      answer_commands: commands.filter((c) => c.action === "answer").length,
      webhooks: acks.length,
      acks_200: acks.filter((a) => a.status === 200).length,
      decisions: decisions.length,
    },
  };
}

/** Per window [{ label, from, to }]: webhooks sent in it and the share answered 503 (or not at all). */
export function unavailability(acks, windows) {
  return windows.map((w) => {
    const inside = acks.filter((a) => a.at >= w.from && a.at < w.to);
    const failed = inside.filter((a) => a.status === 503 || a.status === 0).length;
    return { ...w, webhooks: inside.length, failed, rate_503: inside.length ? +(failed / inside.length).toFixed(4) : 0 };
  });
}
