// Clean node deployment (SPEC §14) through real processes: `callfence-agent
// deploy/rollback/releases` against a real agent whose voice app runs from a
// releases layout (a bare git remote with several commits, some broken), a
// supervisor script that really stops and starts `callfence-demo-app`, and
// the real edge in Miniflare for the heartbeats and the L5 probe.
//
// M1 is the deployable node; the line prefers M1 and falls back to M2.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readdirSync, readlinkSync } from "node:fs";
import { basename, join } from "node:path";
import { event, newCall, sleep, startCluster, standardPolicy, waitFor } from "./agents-cluster.mjs";

const currentSha = (n) => basename(readlinkSync(n.runtime));
const releaseDirs = (n) => readdirSync(n.releasesDir).filter((d) => /^[0-9a-f]{40}$/.test(d)).sort();
const journalExists = (n) => existsSync(join(n.stateDir, "deploy-journal.json"));

/** Opens a call on M1 (answered through the fence) and returns it. */
async function openCall(c) {
  const call = newCall("deploy");
  const body = event({ id: call.eventId("init"), type: "call.initiated", session: call.session, ccid: call.ccid });
  const res = await c.deliver(body);
  assert.equal(res.status, 200, JSON.stringify(res.body));
  if (res.body.delivered_to !== "M1") {
    assert.fail(`the call went to ${res.body.delivered_to}, not M1: ${JSON.stringify(await c.decisions(call.session))}`);
  }
  await waitFor("the call answered", async () => (await c.telnyx.answers(call.ccid)).length === 1);
  await waitFor("the app holds the call", async () => (await c.nodes.M1.appStatus()).active_calls === 1);
  return call;
}

async function hangUp(c, call) {
  const body = event({ id: call.eventId("hangup"), type: "call.hangup", session: call.session, ccid: call.ccid });
  return c.deliver(body);
}

/**
 * Watches the edge's view of M1 every 50 ms: each time it is eligible on
 * `sha` and `wrong()` holds, the view is recorded. `stop()` returns them.
 */
function watchEligible(c, sha, wrong) {
  let watching = true;
  const seen = [];
  const loop = (async () => {
    while (watching) {
      try {
        const n = await c.nodeStatus("M1");
        if (n.eligible && n.sha === sha && (await wrong())) seen.push(n);
      } catch {
        // the agent or app restarting
      }
      await sleep(50);
    }
  })();
  return {
    stop: async () => {
      watching = false;
      await loop;
      return seen;
    },
  };
}

/** Waits until M1 is back: live on `sha`, app reporting it, mode active, eligible. */
async function settledOn(c, sha) {
  const m1 = c.nodes.M1;
  assert.equal(currentSha(m1), sha);
  await waitFor("the app on the release", async () => (await m1.appStatus()).sha === sha);
  assert.equal(m1.cli("mode", "get").stdout.trim(), "active");
  assert.equal(journalExists(m1), false, "the journal is cleared");
  await c.waitNode("M1", `eligible on ${sha}`, (n) => n.eligible === true && n.sha === sha, 15_000);
}

describe("callfence-agent deploy", () => {
  let c;
  before(async () => {
    // Staleness is not under test here: beats valid for 10 s, so a loaded
    // machine delaying one beat cannot send a call meant for M1 to M2.
    c = await startCluster({ nodes: { M1: {}, M2: {} }, policy: standardPolicy, deploy: ["M1"], validForS: 10 });
  });
  after(() => c?.close());

  test("a good deploy drains without cutting a call, and M1 is eligible on the new SHA only after L5", async () => {
    const m1 = c.nodes.M1;
    const before = currentSha(m1);
    const good = m1.commit("good-1", { "app.txt": "release 2\n" });
    const call = await openCall(c);

    // Eligible on the new SHA must imply that the (new) app already answered a probe.
    const watch = watchEligible(c, good, async () => (await (await fetch(`${m1.appUrl}/demo/events`)).json()).probes.length === 0);

    const running = m1.deployCli("deploy", "--sha", good, "--json");
    await c.waitNode("M1", "drained for the deploy", (n) => n.mode === "drained");
    await sleep(500);
    assert.equal(currentSha(m1), before, "nothing switches while a call is up");
    assert.equal(journalExists(m1), true, "journalled before the drain");
    // A new call meanwhile goes to the fallback.
    const other = newCall("during");
    const routed = await c.deliver(event({ id: other.eventId("init"), type: "call.initiated", session: other.session, ccid: other.ccid }));
    assert.equal(routed.body.delivered_to, "M2", JSON.stringify(routed.body));
    // The call in progress ends normally, on the old release.
    const hung = await hangUp(c, call);
    assert.equal(hung.status, 200, JSON.stringify(hung.body));
    assert.equal(hung.body.delivered_to, "M1");

    const { code, out, stderr } = await running;
    const violations = await watch.stop();
    assert.equal(code, 0, `${stderr} ${JSON.stringify(out)}`);
    assert.equal(out.ok, true);
    assert.equal(out.live, good);
    assert.equal(out.from, before);
    const names = out.steps.map((s) => s.step);
    for (const step of ["validate", "build_user", "allowed_shas", "fetch", "branch", "checkout", "build", "journal", "drain", "switch", "restart", "health", "connector", "l5", "mode"]) {
      assert.ok(names.includes(step), `${step} in ${names}`);
    }
    assert.ok(out.steps.every((s) => s.ok && Number.isInteger(s.ms)), JSON.stringify(out.steps));
    assert.deepEqual(violations, [], "never eligible on the new SHA before its L5 probe");
    assert.equal((await c.telnyx.answers(call.ccid)).length, 1, "the old call was answered once");
    await settledOn(c, good);
    const probes = (await (await fetch(`${m1.appUrl}/demo/events`)).json()).probes;
    assert.ok(probes.length >= 1, "the new app answered the L5 probe");
  });

  test("refusals change nothing: short SHA, branch, unknown SHA, a pull request's head, outside allowed_shas, dirtying build, missing artifact", async () => {
    const m1 = c.nodes.M1;
    const live = currentSha(m1);
    const dirs = releaseDirs(m1);
    const dirty = m1.commit("dirty-build", { "build.sh": "mkdir -p build && cp app.txt build/app.out && touch stray.txt\n" });
    const noArtifact = m1.commit("no-artifact", { "build.sh": "true\n" });
    const fine = m1.commit("fine", { "app.txt": "release fine\n" });
    // Served by the remote at refs/pull/7/head only: never on main.
    const prBuilt = join(m1.dir, "pull-request-built");
    const pullRequest = m1.pullRequest(7, { "build.sh": `touch '${prBuilt}' && mkdir -p build && cp app.txt build/app.out\n` });
    const cases = [
      [live.slice(0, 7), "validate"],
      ["main", "validate"],
      ["0123456789abcdef0123456789abcdef01234567", "fetch"],
      [pullRequest, "branch"],
      [dirty, "build"],
      [noArtifact, "build"],
    ];
    for (const [sha, step] of cases) {
      const { code, out } = await m1.deployCli("deploy", "--sha", sha, "--json");
      assert.notEqual(code, 0, sha);
      assert.equal(out.ok, false);
      assert.equal(out.step, step, `${sha}: ${JSON.stringify(out)}`);
      assert.equal(out.live, live);
      assert.equal(out.restored, false);
    }
    // Promotion: with allowed_shas listing only the live SHA, another SHA is refused.
    m1.registryFields = { ...m1.registryFields, allowed_shas: [live] };
    await c.put("nodes", c.registry());
    const refused = await m1.deployCli("deploy", "--sha", fine, "--json");
    assert.notEqual(refused.code, 0);
    assert.equal(refused.out.step, "allowed_shas", JSON.stringify(refused.out));
    assert.match(refused.out.reason, /not in this node's allowed_shas/);
    delete m1.registryFields.allowed_shas;
    await c.put("nodes", c.registry());

    assert.ok(!existsSync(prBuilt), "the pull request's build never ran");
    assert.deepEqual(releaseDirs(m1), dirs, "no release directory left behind");
    assert.equal(readdirSync(m1.releasesDir).filter((d) => d.startsWith(".incoming")).length, 0);
    await settledOn(c, live);
  });

  test("automatic restore: never healthy, wrong SHA, tunnel down, app refusing probes", async () => {
    const m1 = c.nodes.M1;
    const cases = [
      ["not-ready", { NOT_READY: "1\n" }, "health"],
      ["wrong-sha", { WRONG_SHA: "1\n" }, "health"],
      ["tunnel-down", { BREAK_TUNNEL: "1\n" }, "connector"],
      ["refuses-probes", { REFUSE_PROBES: "1\n" }, "l5"],
    ];
    for (const [name, files, step] of cases) {
      const live = currentSha(m1);
      const bad = m1.commit(name, files);
      const { code, out } = await m1.deployCli("deploy", "--sha", bad, "--json");
      assert.notEqual(code, 0, name);
      assert.equal(out.step, step, `${name}: ${JSON.stringify(out)}`);
      assert.equal(out.restored, true, `${name}: ${JSON.stringify(out)}`);
      assert.equal(out.live, live);
      const names = out.steps.map((s) => s.step);
      for (const s of ["restore_switch", "restore_restart", "restore_health", "restore_connector", "restore_l5", "restore_mode"]) {
        assert.ok(names.includes(s), `${name}: ${s} in ${names}`);
      }
      await settledOn(c, live);
    }
    const history = JSON.parse(m1.cli("releases", "--json").stdout);
    assert.ok(history.releases.every((r) => r.current === (r.sha === currentSha(m1))));
  });

  test("kill -9 of the deploy command: the agent still carries the deploy to a verified release", async () => {
    const m1 = c.nodes.M1;
    const target = m1.commit("survives-client", { "app.txt": "release client-killed\n" });
    const call = await openCall(c);
    const running = m1.deployCli("deploy", "--sha", target, "--json");
    await c.waitNode("M1", "drained", (n) => n.mode === "drained");
    m1.lastCli.kill("SIGKILL");
    await running;
    await hangUp(c, call);
    await waitFor("the deploy finished in the agent", async () => m1.job()?.result, { timeout: 40_000 });
    const job = m1.job();
    assert.equal(job.result.ok, true, JSON.stringify(job.result));
    await settledOn(c, target);
  });

  test("kill -9 of the agent after the switch: the next agent restores the previous release before M1 is active", async () => {
    const m1 = c.nodes.M1;
    const live = currentSha(m1);
    const target = m1.commit("agent-killed", { "app.txt": "release agent-killed\n" });
    const call = await openCall(c);
    const running = m1.deployCli("deploy", "--sha", target, "--json");
    await c.waitNode("M1", "drained", (n) => n.mode === "drained");
    await hangUp(c, call);
    await waitFor("the switch", () => currentSha(m1) === target, { timeout: 20_000, every: 10 });
    await m1.killAgent("SIGKILL");
    const client = await running;
    assert.notEqual(client.code, 0, "the client does not claim success");
    assert.equal(journalExists(m1), true, "the journal survives the crash");
    assert.equal(m1.cli("mode", "get").stdout.trim(), "drained");

    const watch = watchEligible(c, target, async () => true);
    await m1.startAgent();
    await waitFor("the recovery", async () => m1.job()?.result, { timeout: 40_000 });
    const bad = await watch.stop();
    const job = m1.job();
    assert.equal(job.kind, "recover");
    assert.equal(job.result.restored, true, JSON.stringify(job.result));
    assert.deepEqual(bad, [], "never eligible on the unverified release");
    await settledOn(c, live);
  });

  test("rollback after a good deploy; releases lists both; old releases are pruned to keep", async () => {
    const m1 = c.nodes.M1;
    const previous = currentSha(m1);
    const next = m1.commit("good-2", { "app.txt": "release good-2\n" });
    const deployed = await m1.deployCli("deploy", "--sha", next, "--json");
    assert.equal(deployed.code, 0, JSON.stringify(deployed.out));
    await settledOn(c, next);
    const listed = JSON.parse(m1.cli("releases", "--json").stdout);
    const shas = listed.releases.map((r) => r.sha);
    assert.ok(shas.includes(previous) && shas.includes(next), JSON.stringify(listed));
    assert.equal(listed.current, next);
    // keep = 2: the current release and two others at most.
    assert.ok(releaseDirs(m1).length <= 3, `${releaseDirs(m1)}`);

    const back = await m1.deployCli("rollback", "--json");
    assert.equal(back.code, 0, JSON.stringify(back.out));
    assert.equal(back.out.kind, "rollback");
    assert.equal(back.out.live, previous);
    await settledOn(c, previous);
    const text = m1.cli("releases");
    assert.match(text.stdout, new RegExp(`\\* ${previous}`));
  });
});
