// Each drill's short form (the `make test` one, at most 60 s each): the
// whole stack, a small load, the same checker and verdict as `make drill`.

import { before, test } from "node:test";
import assert from "node:assert/strict";
import { DRILLS } from "./drills.mjs";
import { previousRelease } from "./rollback.mjs";

// The rollback drill's previous release is built once (minutes on a cold
// target/), before and outside the drills' own time.
before(() => previousRelease(), { timeout: 1_800_000 });

for (const [name, drill] of Object.entries(DRILLS)) {
  test(`drill ${name} (short form) passes`, { timeout: 180_000 }, async () => {
    const report = await drill({ short: true });
    assert.deepEqual(report.violations, [], `${name}: violations`);
    assert.equal(report.pass, true, `${name}: ${JSON.stringify(report.figures)}`);
  });
}
