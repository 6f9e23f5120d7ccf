// Each drill's short form (the `make test` one, at most 60 s each): the
// whole stack, a small load, the same checker and verdict as `make drill`.

import { test } from "node:test";
import assert from "node:assert/strict";
import { DRILLS } from "./drills.mjs";

for (const [name, drill] of Object.entries(DRILLS)) {
  test(`drill ${name} (short form) passes`, { timeout: 180_000 }, async () => {
    const report = await drill({ short: true });
    assert.deepEqual(report.violations, [], `${name}: violations`);
    assert.equal(report.pass, true, `${name}: ${JSON.stringify(report.figures)}`);
  });
}
