// `make drill [NAME=<name>] [SHORT=1] [ARGS="--calls=N --rate=R --faults=F --seed=S --scale=X --swaps=N --previous=REV"]`:
// runs the drills (tests/drills/drills.mjs), prints a summary of each and
// writes its report to .drills/<name>.json. The options go to every drill
// that takes them (chaos: calls, rate, faults, seed; replay: scale;
// rollback: swaps, rate, previous, the commit of the previous release).
// Exits non-zero unless every drill run passed. Build the Worker first
// (`make drill` does).

import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { ROOT } from "../tests/e2e/harness.mjs";
import { DRILLS } from "../tests/drills/drills.mjs";

const args = process.argv.slice(2);
const short = args.includes("--short");
const names = args.filter((a) => !a.startsWith("--"));
const params = {};
for (const a of args.filter((x) => x.startsWith("--") && x !== "--short")) {
  const rev = a.match(/^--previous=([0-9a-f]{7,40})$/);
  if (rev) {
    params.previous = rev[1];
    continue;
  }
  const m = a.match(/^--(calls|rate|faults|seed|scale|swaps)=(\d+(?:\.\d+)?)$/);
  if (!m) {
    console.error(`drill: unknown option ${JSON.stringify(a)} (want --short, --calls=N, --rate=R, --faults=F, --seed=S, --scale=X, --swaps=N, --previous=REV)`);
    process.exit(2);
  }
  params[m[1]] = Number(m[2]);
}
for (const n of names) {
  if (!DRILLS[n]) {
    console.error(`drill: unknown drill ${JSON.stringify(n)} (known: ${Object.keys(DRILLS).join(", ")})`);
    process.exit(2);
  }
}
const dir = join(ROOT, ".drills");
mkdirSync(dir, { recursive: true });
let ok = true;
for (const name of names.length ? names : Object.keys(DRILLS)) {
  const started = Date.now();
  console.log(`== drill ${name}${short ? " (short)" : ""}`);
  const report = await DRILLS[name]({ short, ...params });
  report.seconds = Math.round((Date.now() - started) / 100) / 10;
  report.finished_at = new Date().toISOString();
  const file = join(dir, `${name}.json`);
  writeFileSync(file, `${JSON.stringify(report, null, 2)}\n`);
  console.log(JSON.stringify(report.figures, null, 2));
  console.log(`violations: ${report.violations.length}${report.violations.length ? ` (first: ${JSON.stringify(report.violations[0])})` : ""}`);
  console.log(`${report.pass ? "PASS" : "FAIL"} ${name} in ${report.seconds} s; report: ${file}`);
  ok &&= report.pass;
}
process.exit(ok ? 0 : 1);
