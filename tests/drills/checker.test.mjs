// The drills' checker fails when a property breaks: a clean recorded history
// passes, and each planted violation is found, with its kind and session.

import { test } from "node:test";
import assert from "node:assert/strict";
import { callsIntact, check, commandId, epochOf, routedWhileMarked, unansweredCalls, unavailability } from "./checker.mjs";

const SHA = "0123456789abcdef0123456789abcdef01234567";

/** Two calls: s1 answered by M1 at epoch 1, s2 moved to M2 at epoch 2 after a definite non-delivery. */
function clean() {
  return {
    ccids: { c1: "s1", c2: "s2" },
    commands: [
      { ccid: "c1", action: "answer", node: "M1", body: { command_id: commandId("c1", 1) } },
      { ccid: "c1", action: "answer", node: "M1", body: { command_id: commandId("c1", 1) } }, // a resend
      { ccid: "c2", action: "answer", node: "M2", body: { command_id: commandId("c2", 2) } },
    ],
    acks: [
      { session: "s1", event_id: "e1", status: 200, body: { delivered_to: "M1", epoch: 1 } },
      { session: "s2", event_id: "e2", status: 503, body: { error: "overloaded" } },
      { session: "s2", event_id: "e2", status: 200, body: { delivered_to: "M2", epoch: 2 } },
    ],
    calls: {
      s1: { owner: "M1", epoch: 1, state: "ended", events: [{ event_id: "e1", state: "delivered", node: "M1", epoch: 1 }] },
      s2: { owner: "M2", epoch: 2, state: "ended", events: [{ event_id: "e2", state: "delivered", node: "M2", epoch: 2 }] },
    },
    decisions: [
      { decision_id: 1, call_session_id: "s1", outcome: "assigned", policy_revision: 1, nodes_revision: 1, chosen: "M1", chosen_sha: SHA, chosen_clean: true },
      { decision_id: 2, call_session_id: "s2", outcome: "assigned", policy_revision: 1, nodes_revision: 1, chosen: "M1", chosen_sha: SHA, chosen_clean: true },
      { decision_id: 3, call_session_id: "s2", outcome: "reassigned", policy_revision: 1, nodes_revision: 1, chosen: "M2", chosen_sha: SHA, chosen_clean: true },
      { decision_id: 4, call_session_id: "s3", outcome: "rejected", policy_revision: 1, nodes_revision: 1, chosen: null, chosen_sha: null, chosen_clean: null },
    ],
  };
}

const kinds = (h) => check(h).violations.map((v) => `${v.kind}:${v.session}`).sort();

test("a session two call shards list is held twice", () => {
  const h = clean();
  h.twice = ["s1"];
  assert.deepEqual(kinds(h), ["held_by_two_shards:s1"]);
});

test("a clean history has no violation and counts what happened", () => {
  const { violations, figures } = check(clean());
  assert.deepEqual(violations, []);
  assert.equal(figures.calls, 2);
  assert.equal(figures.answered_calls, 2);
  assert.equal(figures.answer_commands, 3);
  assert.equal(figures.acks_200, 2);
});

test("command ids map back to their epoch", () => {
  assert.equal(epochOf("c2", commandId("c2", 2)), 2);
  assert.equal(epochOf("c2", commandId("c1", 2)), null);
});

test("a second answer for one call, by another node under a later epoch", () => {
  const h = clean();
  h.commands.push({ ccid: "c1", action: "answer", node: "M2", body: { command_id: commandId("c1", 2) } });
  assert.deepEqual(kinds(h), ["answer_superseded_epoch:s1", "answered_by_two_nodes:s1", "second_answer:s1"]);
});

test("an answer under a superseded epoch", () => {
  const h = clean();
  h.commands[2] = { ccid: "c2", action: "answer", node: "M1", body: { command_id: commandId("c2", 1) } };
  assert.deepEqual(kinds(h), ["answer_superseded_epoch:s2"]);
});

test("a webhook acknowledged 200 whose ownership is gone", () => {
  const h = clean();
  h.acks.push({ session: "s2", event_id: "e2b", status: 200, body: { delivered_to: "M1", epoch: 1 } });
  assert.deepEqual(kinds(h), ["ack_ownership_lost:s2"]);
});

test("a call moved after an ambiguous outcome", () => {
  const h = clean();
  h.calls.s2.events.push({ event_id: "e2x", state: "unknown", node: "M1", epoch: 1 });
  assert.deepEqual(kinds(h), ["moved_after_ambiguous:s2"]);
});

test("a decision without a clean SHA, and one without revisions", () => {
  const h = clean();
  h.decisions[0].chosen_clean = false;
  h.decisions[2].chosen_sha = null;
  h.decisions[1].nodes_revision = null;
  assert.deepEqual(kinds(h), ["decision_not_clean:s1", "decision_not_clean:s2", "decision_unattributed:s2"]);
});

test("a call left open past the sweep", () => {
  const h = clean();
  h.calls.s1.state = "answered";
  assert.deepEqual(kinds(h), ["open_past_sweep:s1"]);
  assert.deepEqual(check({ ...h, requireSettled: false }).violations, []);
});

test("the 503 rate of a window counts 503s and unanswered sends", () => {
  const acks = [
    { at: 10, status: 200 },
    { at: 11, status: 503 },
    { at: 12, status: 0 },
    { at: 13, status: 409 },
    { at: 50, status: 503 },
  ];
  assert.deepEqual(unavailability(acks, [{ label: "f", from: 10, to: 20 }]), [{ label: "f", from: 10, to: 20, webhooks: 4, failed: 2, rate_503: 0.5 }]);
});

test("a call routed to a node while it was marked clock_skew, and a mark that never came", () => {
  const decisions = clean().decisions.map((d, i) => ({ ...d, at: new Date(1_000 + i * 1_000).toISOString() }));
  // s1 (M1 at 1 s) before the mark; s2's reassignment to M2 (at 3 s) inside M2's window.
  const marked = [{ node: "M2", reason: "clock_skew", marked_at: 2_500, until: 5_000 }];
  assert.deepEqual(routedWhileMarked(decisions, marked).map((v) => `${v.kind}:${v.session}`), ["routed_to_marked_node:s2"]);
  assert.deepEqual(routedWhileMarked(decisions, [{ ...marked[0], marked_at: 3_500 }]), [], "before the mark is allowed");
  assert.deepEqual(routedWhileMarked(decisions, [{ ...marked[0], until: 3_000 }]), [], "after the heal began is allowed");
  assert.deepEqual(routedWhileMarked(decisions, [{ ...marked[0], marked_at: null }]).map((v) => v.kind), ["never_marked"]);
  assert.deepEqual(routedWhileMarked(decisions, [{ node: "M2", from: 0, to: 9_000 }]), [], "a window without a mark is not checked");
});

test("a broken call: answered twice, fenced but never answered, lost, or a send not acknowledged", () => {
  const h = clean();
  h.calls.s1.fence = { node: "M1", epoch: 1, command_id: commandId("c1", 1) };
  h.calls.s2.fence = { node: "M2", epoch: 2, command_id: commandId("c2", 2) };
  h.acks = h.acks.map((a) => ({ ...a, type: "call.initiated" }));
  h.acks.push({ session: "s1", event_id: "h1", type: "call.hangup", status: 200 }, { session: "s2", event_id: "h2", type: "call.hangup", status: 200 });
  const broken = (x) => callsIntact(x).map((v) => `${v.kind}:${v.session}`);
  assert.deepEqual(broken(h), []);
  const twice = structuredClone(h);
  twice.commands.push({ ccid: "c1", action: "answer", node: "M2", body: { command_id: commandId("c1", 2) } });
  assert.deepEqual(broken(twice), ["call_broken:s1"]);
  const never = structuredClone(h);
  never.commands = never.commands.filter((c) => c.ccid !== "c2");
  assert.deepEqual(broken(never), ["call_broken:s2"]);
  const aside = [];
  assert.deepEqual(callsIntact(never, aside), [], "set aside when asked");
  assert.deepEqual(aside, ["s2"]);
  delete never.calls.s2.fence;
  assert.deepEqual(broken(never), [], "hung up before the app took the fence");
  const lost = structuredClone(h);
  lost.calls.s2.state = "node_lost";
  assert.deepEqual(broken(lost), ["call_broken:s2"]);
  const cut = structuredClone(h);
  cut.acks.push({ session: "s1", event_id: "h1", type: "call.hangup", status: 503 });
  assert.deepEqual(broken(cut), ["call_broken:s1"]);
  const undelivered = structuredClone(h);
  undelivered.acks.push({ session: "s2", event_id: "e2", type: "call.initiated", status: 503 });
  assert.deepEqual(broken(undelivered), ["call_broken:s2"]);
});

test("unanswered calls are listed with their webhooks and the faults over their life", () => {
  const h = clean();
  // s3: delivered, hung up before the app took the fence; s4: never delivered.
  h.ccids.c3 = "s3";
  h.ccids.c4 = "s4";
  h.acks.push(
    { session: "s3", type: "call.initiated", status: 200, body: { delivered_to: "M1", epoch: 1 }, at: 1_000 },
    { session: "s3", type: "call.hangup", status: 200, body: { delivered_to: "M1", epoch: 1 }, at: 1_400 },
    { session: "s4", type: "call.initiated", status: 503, body: { error: "no_eligible_node" }, at: 5_000 },
    { session: "s4", type: "call.initiated", status: 503, body: { error: "no_eligible_node" }, at: 5_500 },
  );
  h.calls.s3 = { owner: "M1", epoch: 1, state: "ended" };
  h.calls.s4 = { owner: null, epoch: 0, state: "ended", fence: null };
  const windows = [
    { label: "blackhole M1", from: 0, to: 1_200 },
    { label: "drained M2", from: 5_400, to: 9_000 },
    { label: "stale M3", from: 2_000, to: 3_000 },
  ];
  assert.deepEqual(unansweredCalls(h, windows), [
    { session: "s3", state: "ended", owner: "M1", fenced: false, cause: "delivered, no fence taken", webhooks: ["+0 ms call.initiated 200 M1", "+400 ms call.hangup 200 M1"], faults: ["blackhole M1"] },
    { session: "s4", state: "ended", owner: null, fenced: false, cause: "call.initiated never delivered", webhooks: ["+0 ms call.initiated 503 no_eligible_node", "+500 ms call.initiated 503 no_eligible_node"], faults: ["drained M2"] },
  ]);
  // The answered calls are not listed.
  assert.deepEqual(unansweredCalls(clean(), windows), []);
});
