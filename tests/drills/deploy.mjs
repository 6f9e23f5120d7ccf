// The deploy drill (SPEC §14): while calls flow, node M1 (a releases layout
// with a bare git remote and a supervisor script, agents-cluster.mjs) takes a
// good deploy and then a failing one (a release that is never healthy),
// with its agent under a real notify socket and a watchdog timeout
// (`callfence-fake-notify` stands in for systemd's side). It shows:
//
// - no call cut: every call answered once, ended normally, its hangup
//   acknowledged 200, and the checker passes;
// - the good deploy goes live, and the failing one is restored by itself to
//   the release before it (verified again, M1 eligible on it);
// - the watchdog is never starved: from READY=1 to the end, no gap between
//   WATCHDOG=1 pings (nor after the last) reaches WATCHDOG_USEC.
//
// Figures: each deploy's step durations, the calls started during each and
// where they went, and the 503s.

import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { performance } from "node:perf_hooks";
import { readlinkSync } from "node:fs";
import { basename, join } from "node:path";
import { agentBins, sleep, standardPolicy, waitFor } from "../e2e/agents-cluster.mjs";
import { answerCode, callsIntact, check, tally } from "./checker.mjs";
import { runLoad } from "./load.mjs";
import { stable, startStack, TIMINGS } from "./stack.mjs";
// drills.mjs imports this module too; `settle` is only called at run time.
import { settle } from "./drills.mjs";

/**
 * Starts `callfence-fake-notify` on `path`; resolves to { path, messages:
 * [{ mono_ms, state }], now() (its clock, ms), close() }.
 */
export function startNotify(binDir, path) {
  const child = spawn(join(binDir, "callfence-fake-notify"), ["--socket", path], { stdio: ["ignore", "pipe", "pipe"] });
  const exited = new Promise((resolve) => child.once("exit", resolve));
  const messages = [];
  let errors = "";
  child.stderr.on("data", (c) => (errors += c));
  return new Promise((resolve, reject) => {
    let t0 = null;
    child.once("error", reject);
    child.once("exit", (code) => {
      if (t0 === null) reject(new Error(`callfence-fake-notify exited (${code}): ${errors}`));
    });
    createInterface({ input: child.stdout }).on("line", (line) => {
      if (t0 === null) {
        t0 = performance.now();
        resolve({
          path,
          messages,
          now: () => performance.now() - t0,
          close: async () => {
            if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM");
            await exited;
          },
        });
      } else {
        messages.push(JSON.parse(line));
      }
    });
  });
}

/**
 * The watchdog record: pings after READY=1 and the longest silence (between
 * READY and the first ping, between pings, after the last until `end`).
 * Pure, so the tests can plant a starved record.
 */
export function watchdogGaps(messages, end) {
  const ready = messages.find((m) => m.state.split("\n").includes("READY=1"));
  if (!ready) return { ready: false, pings: 0, max_gap_ms: null };
  const pings = messages.filter((m) => m.state === "WATCHDOG=1" && m.mono_ms >= ready.mono_ms).map((m) => m.mono_ms);
  const edges = [ready.mono_ms, ...pings, end];
  let max = 0;
  for (let i = 1; i < edges.length; i += 1) max = Math.max(max, edges[i] - edges[i - 1]);
  return { ready: true, pings: pings.length, max_gap_ms: Math.round(max) };
}

/** The 503 answers among `acks`, and how many of each error code. */
function answered503(acks) {
  const by = tally(acks.filter((a) => a.status === 503), answerCode);
  return { answered_503: Object.values(by).reduce((n, k) => n + k, 0), answered_503_by_code: by };
}

export async function deploy({ short = false, rate, watchdog_ms: watchdogMs } = {}) {
  rate ??= short ? 4 : 6;
  watchdogMs ??= 4_000;
  const settleGap = short ? 2_000 : 10_000;
  const stack = await startStack({
    nodes: { M1: stable, M2: stable },
    policy: standardPolicy,
    deploy: ["M1"],
    bindings: { ...TIMINGS, CALLFENCE_TEST_MAX_DURATION_MS: "60000" },
  });
  const m1 = stack.nodes.M1;
  const live = () => basename(readlinkSync(m1.runtime));
  const notify = await startNotify(agentBins(), join(m1.dir, "notify.sock"));
  try {
    // The never-healthy release fails its health step after this long.
    m1.deployToml = m1.deployToml.replace(/health_timeout = "[^"]*"/, `health_timeout = "${short ? 5 : 10}s"`);
    m1.writeConfig();
    await m1.killAgent("SIGTERM");
    await m1.startAgent({ NOTIFY_SOCKET: notify.path, WATCHDOG_USEC: String(watchdogMs * 1000) });
    await waitFor("READY=1 on the notify socket", () => notify.messages.some((m) => m.state.split("\n").includes("READY=1")), { timeout: 15_000 });
    await stack.cluster.waitEligible("M1", 15_000);
    const first = live();
    const good = m1.commit("drill-good", { "app.txt": "voice app for M1, release 2\n" });
    const bad = m1.commit("drill-never-healthy", { NOT_READY: "1\n" });

    let done = false;
    const loadP = runLoad(stack, { calls: 1, more: () => !done, rate, seed: 23, tag: "deploy", duplicates: 0.1, holdMs: [1000, 2500] });
    await sleep(settleGap);
    const runs = [];
    for (const [name, sha] of [["good", good], ["never_healthy", bad]]) {
      const from = Date.now();
      const r = await m1.deployCli("deploy", "--sha", sha, "--json");
      const to = Date.now();
      // Back in service on the release that should be live (good, both times).
      const back = await stack.cluster
        .waitNode("M1", `eligible on ${good}`, (n) => n.eligible === true && n.sha === good, 30_000)
        .then(() => Date.now() - to)
        .catch(() => null);
      runs.push({ name, sha, from, to, code: r.code, out: r.out, stderr: r.code === 0 ? "" : r.stderr.slice(-2000), eligible_after_ms: back });
      await sleep(settleGap);
    }
    done = true;
    const load = await loadP;
    const views = await settle(stack, load.sessions, 60_000);
    const wd = watchdogGaps(notify.messages, notify.now());

    const history = { commands: stack.telnyx.log, acks: load.acks, calls: views.calls, decisions: views.decisions, ccids: load.ccids };
    const { violations, figures } = check(history);
    violations.push(...callsIntact(history));
    const expect = (ok, kind, evidence) => ok || violations.push({ kind, session: null, evidence });
    const [g, b] = runs;
    expect(g.code === 0 && g.out?.ok === true && g.out?.live === good, "good_deploy_failed", { code: g.code, out: g.out, stderr: g.stderr });
    expect(b.code !== 0 && b.out?.restored === true && b.out?.live === good && b.out?.step === "health", "failing_deploy_not_restored", { code: b.code, out: b.out });
    expect(live() === good, "wrong_release_live", { live: live(), want: good });
    for (const r of runs) expect(r.eligible_after_ms !== null, "not_eligible_after_deploy", { deploy: r.name });
    expect(wd.ready && wd.max_gap_ms < watchdogMs, "watchdog_starved", { ...wd, watchdog_ms: watchdogMs });

    const firstInit = new Map();
    for (const a of load.acks) if (a.type === "call.initiated" && !firstInit.has(a.session)) firstInit.set(a.session, a);
    const finalInit = new Map();
    for (const a of load.acks) if (a.type === "call.initiated") finalInit.set(a.session, a);
    const during = (r) => {
      const started = [...firstInit.values()].filter((a) => a.at >= r.from && a.at < r.to);
      const to = {};
      for (const a of started) {
        const node = finalInit.get(a.session).body?.delivered_to ?? `status ${finalInit.get(a.session).status}`;
        to[node] = (to[node] ?? 0) + 1;
      }
      const acks = load.acks.filter((a) => a.at >= r.from && a.at < r.to);
      return { calls_started: started.length, delivered_to: to, webhooks: acks.length, ...answered503(acks), unanswered: acks.filter((a) => a.status === 0).length };
    };
    return {
      drill: "deploy",
      pass: violations.length === 0 && figures.calls > 0,
      parameters: { short, rate, watchdog_usec: watchdogMs * 1000, health_timeout_s: short ? 5 : 10, releases: { first, good, never_healthy: bad } },
      figures: {
        ...figures,
        ...answered503(load.acks),
        watchdog: wd,
        deploys: runs.map((r) => ({
          name: r.name,
          ms: r.to - r.from,
          ok: r.out?.ok ?? null,
          failed_step: r.out?.step ?? null,
          restored: r.out?.restored ?? null,
          live_after: r.out?.live ?? null,
          eligible_after_ms: r.eligible_after_ms,
          steps: Object.fromEntries((r.out?.steps ?? []).map((s) => [s.step, s.ms])),
          ...during(r),
        })),
      },
      violations,
    };
  } finally {
    await stack.close();
    await notify.close();
  }
}
