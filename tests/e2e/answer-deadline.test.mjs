// The webhook answer deadline (SPEC §7.8, issue 18's overload tail): however
// slow the Dispatcher is, the Worker answers a webhook within
// FORWARD_TIMEOUT_MS + 300 ms of its arrival, with a 503 and Retry-After
// when the Dispatcher has not answered by then, and the event is neither
// lost nor delivered twice.
//
// The Dispatcher is made slow deterministically (CALLFENCE_TEST_SLOW_ANSWER_MS:
// it holds its answer 20 s after it forwarded the event and recorded the
// outcome), so no assertion depends on a wall-clock window the test cannot
// own: a Worker that waited for the Dispatcher would answer 200 after 20 s,
// one that keeps its deadline answers 503 long before.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { admin, callEvent, setupCluster, waitFor, webhook } from "./fixtures.mjs";

const SLOW_MS = 20_000;

describe("a Dispatcher slower than the answer deadline", () => {
  let cluster;
  before(async () => {
    cluster = await setupCluster({
      nodes: ["M1"],
      bindings: { FORWARD_TIMEOUT_MS: "1500", CALLFENCE_TEST_SLOW_ANSWER_MS: String(SLOW_MS) },
    });
  });
  after(() => cluster?.dispose());

  test("503 with Retry-After at the deadline, then the retry gets the one delivery", async () => {
    const { edge, nodes } = cluster;
    const event = callEvent("call.initiated", {
      session: "s-deadline",
      leg: "leg-deadline",
      from: "+14155550100",
      to: "+15102160079",
    });
    const sent = Date.now();
    const first = await webhook(edge, event);
    const took = Date.now() - sent;
    assert.equal(first.status, 503, JSON.stringify(first.body));
    assert.equal(first.body.error, "dispatcher_unavailable");
    assert.equal(first.headers.get("retry-after"), "1");
    assert.ok(took < SLOW_MS, `answered after ${took} ms: the Worker waited for the Dispatcher`);

    // The Dispatcher had taken it: it forwarded once and recorded delivery.
    await waitFor(() => nodes.M1.origin.requests.length >= 1, { what: "the forward" });
    await waitFor(
      async () => (await admin(edge, "/v1/calls/s-deadline")).body?.events?.[0]?.state === "delivered",
      { what: "the delivery recorded" },
    );

    // Telnyx retries the same event (a new signature, the same data.id):
    // the stored delivery is answered, nothing is forwarded again.
    const retry = await webhook(edge, event);
    assert.deepEqual(
      [retry.status, retry.body],
      [200, { delivered_to: "M1", epoch: retry.body.epoch, event_id: event.data.id }],
    );
    const call = await admin(edge, "/v1/calls/s-deadline");
    assert.deepEqual(
      call.body.events.map((e) => [e.event_id, e.state, e.attempts]),
      [[event.data.id, "delivered", 1]],
    );
    assert.equal(nodes.M1.origin.requests.length, 1, "delivered exactly once");
  });
});
