// The rollback drill's own checks fail when a property breaks: a clean
// record passes, and each planted violation (a decision gone or changed
// under one build, a route a build does not answer, a phase without
// answers) is found. Broken calls: checker.test.mjs (callsIntact).

import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { ROOT } from "../e2e/harness.mjs";
import { checkRollback, operationsOf } from "./rollback.mjs";

const d = (id, session, chosen = "M1") => [id, { decision_id: id, call_session_id: session, outcome: "assigned", chosen }];

function clean() {
  return {
    snapshots: [
      { build: "previous", phase: 0, decisions: new Map([d(1, "s1")]) },
      { build: "current", phase: 1, decisions: new Map([d(2, "s2")]) },
    ],
    finals: [
      { build: "current", decisions: new Map([d(1, "s1"), d(2, "s2")]) },
      { build: "previous", decisions: new Map([d(1, "s1"), d(2, "s2")]) },
    ],
    sweeps: [{ phase: 0, build: "previous", routes: [{ op: "GET /v1/status", status: 200, ok: true }] }],
    phases: [{ index: 0, build: "previous", answers: 1 }, { index: 1, build: "current", answers: 1 }],
  };
}

const kinds = (r) => checkRollback(r).map((v) => `${v.kind}:${v.session}`).sort();

test("a clean rollback record has no violation", () => {
  assert.deepEqual(checkRollback(clean()), []);
});

test("a decision lost under one build, or changed", () => {
  const lost = clean();
  lost.finals[1].decisions.delete(1);
  assert.deepEqual(kinds(lost), ["decision_lost:s1", "decision_lost:s1"]);
  const changed = clean();
  changed.finals[0].decisions.set(2, { ...changed.finals[0].decisions.get(2), chosen: "M2" });
  assert.deepEqual(kinds(changed), ["decision_changed:s2"]);
});

test("a route a build does not answer, and a phase with no answer", () => {
  const r = clean();
  r.sweeps[0].routes.push({ op: "GET /v1/keys", status: 404, ok: false });
  r.phases[1].answers = 0;
  assert.deepEqual(checkRollback(r).map((v) => v.kind).sort(), ["phase_without_answers", "route_not_answered"]);
});

test("the operations of docs/openapi.yaml are read with their methods", () => {
  const ops = operationsOf(readFileSync(join(ROOT, "docs/openapi.yaml"), "utf8"));
  for (const op of ["POST /v1/telnyx/webhook", "GET /v1/policy", "PUT /v1/policy", "GET /v1/calls/{call_session_id}", "GET /"]) {
    assert.ok(ops.includes(op), `${op} in ${ops}`);
  }
  assert.equal(new Set(ops).size, ops.length);
});
