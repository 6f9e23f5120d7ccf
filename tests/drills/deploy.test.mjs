// The deploy drill's watchdog check fails when the watchdog would have
// starved: no READY=1, or a silence (after READY, between pings, after the
// last ping) as long as the timeout.

import { test } from "node:test";
import assert from "node:assert/strict";
import { watchdogGaps } from "./deploy.mjs";

const msg = (mono_ms, state) => ({ mono_ms, state });

test("pings every second after READY: the longest gap is a second", () => {
  const m = [msg(0, "READY=1\nSTATUS=serving"), msg(1_000, "WATCHDOG=1"), msg(2_000, "WATCHDOG=1"), msg(3_000, "WATCHDOG=1")];
  assert.deepEqual(watchdogGaps(m, 3_500), { ready: true, pings: 3, max_gap_ms: 1_000 });
});

test("a stall between pings, a silence after the last one, and no READY are all seen", () => {
  const stalled = [msg(0, "READY=1"), msg(1_000, "WATCHDOG=1"), msg(5_500, "WATCHDOG=1")];
  assert.equal(watchdogGaps(stalled, 6_000).max_gap_ms, 4_500);
  const silent = [msg(0, "READY=1"), msg(1_000, "WATCHDOG=1")];
  assert.equal(watchdogGaps(silent, 9_000).max_gap_ms, 8_000);
  assert.deepEqual(watchdogGaps([msg(0, "WATCHDOG=1")], 1_000), { ready: false, pings: 0, max_gap_ms: null });
});
