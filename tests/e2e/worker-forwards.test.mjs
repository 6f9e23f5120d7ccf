// A Dispatcher that answers a webhook with a forward for the Worker to make
// (as a version 1 Dispatcher does): the Worker drives core's delivery driver
// itself. It sends each forward once, reports each answer with its hop and
// the carrier's budget left, follows the call to the next owner a report
// names, and stops after the hop limit (3 forwards) with 503 `reassigned`,
// leaving the rest to the Dispatcher's alarm.

import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { startEdge, startOrigin, testKeys } from "./harness.mjs";
import { callEvent, edgeKeysOf, webhook } from "./fixtures.mjs";

/**
 * A stand-in Dispatcher: a webhook gets a forward to the first origin; each
 * report gets a forward to the next origin, whose body is the report it
 * answers (so the origin sees what the Worker reported).
 */
function standIn(origins) {
  return `
const ORIGINS = ${JSON.stringify(origins)};
const forward = (i, body) => ({
  event_id: "wf-1", call_session_id: "wf-s1", call_control_id: null,
  node: "M" + (i + 1), origin_url: ORIGINS[i % ORIGINS.length],
  epoch: i + 1, attempt: 1, body, headers: [["content-type", "application/json"]],
});
export class Dispatcher {
  async fetch(request) {
    const bytes = new Uint8Array(await request.arrayBuffer());
    const nl = bytes.indexOf(10);
    const head = JSON.parse(new TextDecoder().decode(nl < 0 ? bytes : bytes.subarray(0, nl)));
    const next = head.op === "webhook" ? forward(0, "{}") : forward(head.report.hop, JSON.stringify(head.report));
    return new Response(JSON.stringify({ v: 2, ok: true, forward: next }));
  }
}
export default { fetch() { return new Response("stand-in"); } };`;
}

describe("a Dispatcher that asks the Worker to forward", () => {
  test("each forward is sent once, reported with its hop, and the call is followed for 3 forwards", async () => {
    const keys = testKeys();
    const edgeKeys = edgeKeysOf(keys);
    const origins = [];
    for (const node of ["M1", "M2", "M3"]) {
      const origin = await startOrigin({ node, edgeKeys, telnyxPublicKey: keys.telnyx.publicKey });
      origin.respond = () => ({ status: 503, body: { callfence: "not_admitted" } });
      origins.push(origin);
    }
    const edge = await startEdge({ keys, dispatcherScript: standIn(origins.map((o) => o.url)) });
    try {
      const res = await webhook(edge, callEvent("call.initiated", { session: "wf-s1", leg: "wf-l1" }));
      assert.deepEqual([res.status, res.body.error], [503, "reassigned"], JSON.stringify(res.body));
      assert.deepEqual(
        origins.map((o) => o.requests.length),
        [1, 1, 1],
        "one send to each owner, none after the third",
      );
      // The second and third sends carry the reports of the first and second.
      const reports = origins.slice(1).map((o) => JSON.parse(o.requests[0].body));
      assert.deepEqual(
        reports.map((r) => [r.event_id, r.epoch, r.hop]),
        [
          ["wf-1", 1, 1],
          ["wf-1", 2, 2],
        ],
      );
      for (const r of reports) {
        assert.equal(r.answer.kind, "http");
        assert.ok(r.budget_left_ms > 0 && r.budget_left_ms <= 1500, JSON.stringify(r));
      }
      for (const [i, o] of origins.entries()) assert.ok(o.requests[0].assertion.ok, `M${i + 1}'s assertion`);
    } finally {
      await edge.dispose();
      await Promise.all(origins.map((o) => o.close()));
    }
  });
});
