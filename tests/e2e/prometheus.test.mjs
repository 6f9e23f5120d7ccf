// A real Prometheus (Debian's, scripts/prometheus.mjs) scrapes the real
// edge in workerd (GET /v1/metrics with a METRICS_TOKENS token) and three
// real agents (each on its listen.metrics_listen) every second, with the
// shipped rules (ops/prometheus/rules.yml). A scripted story runs: calls
// delivered, a webhook with a bad Telnyx signature, a forward the agent
// refuses (a front in front of M3's origin drops the assertion once), a
// drained node, and a deploy whose build fails. Then, once Prometheus has
// scraped every target after the story, its HTTP query API must give the
// exact values; every Grafana panel's query must run and return a series;
// the rules must evaluate without error and the drain must show as a
// pending alert. Neither exposition carries a number, an id or a token.
//
// The line prefers M1 and falls back to M2; the canary caller prefers M3.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { join } from "node:path";
import { startPrometheus } from "../../scripts/prometheus.mjs";
import { ROOT, testKeys } from "./harness.mjs";
import {
  CANARY_CALLER,
  event,
  freePort,
  LINE,
  newCall,
  PLAIN_CALLER,
  startCluster,
  standardPolicy,
  waitFor,
} from "./agents-cluster.mjs";

/** One sample's value of `series` in an exposition, or null. */
function sampleIn(text, series) {
  const line = text.split("\n").find((l) => l.startsWith(`${series} `));
  return line ? Number(line.slice(series.length + 1)) : null;
}

/**
 * A front in front of a node's origin listener: it passes every request on,
 * except that while `dropAssertions` is above 0 it removes the
 * Callfence-Assertion header of that many webhooks (so the agent refuses
 * them 401 not_admitted, a forward failure the edge sees).
 */
async function startFront(originUrl) {
  const origin = new URL(originUrl);
  const front = { dropAssertions: 0 };
  const server = createServer(async (req, res) => {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const headers = { ...req.headers };
    delete headers.host;
    delete headers["content-length"];
    if (req.method === "POST" && front.dropAssertions > 0) {
      front.dropAssertions -= 1;
      delete headers["callfence-assertion"];
    }
    try {
      const r = await fetch(new URL(req.url, origin), {
        method: req.method,
        headers,
        body: req.method === "POST" ? Buffer.concat(chunks) : undefined,
      });
      res.writeHead(r.status, { "content-type": r.headers.get("content-type") ?? "application/json" });
      res.end(Buffer.from(await r.arrayBuffer()));
    } catch {
      res.writeHead(502).end();
    }
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  front.url = `http://127.0.0.1:${server.address().port}${origin.pathname}`;
  front.close = () => new Promise((resolve) => server.close(resolve));
  return front;
}

describe("a real Prometheus scrapes the edge and the agents", () => {
  let c;
  let prom;
  let front;
  const keys = testKeys();
  const { metricsToken } = keys;
  // Everything the story sends that must never show in a metric.
  const secrets = [keys.adminToken, keys.policyToken, metricsToken, LINE.number, LINE.number.slice(1), PLAIN_CALLER, CANARY_CALLER];

  before(async () => {
    c = await startCluster({
      nodes: { M1: {}, M2: {}, M3: {} },
      policy: standardPolicy,
      deploy: ["M3"],
      metrics: true,
      // Staleness is not under test: a beat delayed by a loaded machine
      // must not move a call.
      validForS: 10,
      edge: { keys },
      originFront: async (id, url) => {
        if (id !== "M3") return url;
        front = await startFront(url);
        return front.url;
      },
    });
    const tokenFile = join(c.work, "metrics-token");
    writeFileSync(tokenFile, `${metricsToken}\n`, { mode: 0o600 });
    prom = await startPrometheus({
      dir: join(c.work, "prometheus"),
      edge: { url: c.edge.url, tokenFile },
      agents: Object.values(c.nodes).map((n) => ({ node: n.id, url: n.metricsUrl })),
      scrapeInterval: "1s",
      port: await freePort(),
    });
  });
  after(async () => {
    await prom?.close();
    await c?.close();
    await front?.close();
  });

  /** The one value of `expr` (0 when it has no series; throws on several). */
  async function value(expr) {
    const result = await prom.query(expr);
    assert.ok(result.length <= 1, `${expr}: ${JSON.stringify(result)}`);
    return result.length ? Number(result[0].value[1]) : 0;
  }

  /** The edge's exposition, read directly with the metrics token. */
  async function edgeExposition() {
    const res = await c.edge.fetch("/v1/metrics", { headers: { authorization: `Bearer ${metricsToken}` } });
    assert.equal(res.status, 200);
    return res.text();
  }

  /** Waits until Prometheus holds a sample of every target scraped after `at` (ms). */
  async function scrapedAfter(at) {
    await waitFor("a scrape of every target after the story", async () => {
      const up = await prom.query('up{job=~"callfence-.*"}');
      const stamps = await prom.query('timestamp(up{job=~"callfence-.*"})');
      return up.length === 4 && up.every((s) => s.value[1] === "1") && stamps.every((s) => Number(s.value[1]) * 1000 > at);
    }, { timeout: 30_000, every: 250 });
  }

  test("after the story Prometheus has the exact counts, the panels' series and the drain alert pending", async () => {
    // Every target is up before the story starts; the counters' baselines.
    await scrapedAfter(Date.now());
    const base = {
      delivered: await value('callfence_webhooks_total{outcome="delivered"}'),
      refused: await value('callfence_webhooks_total{outcome="refused"}'),
      reassigned: await value('callfence_webhooks_total{outcome="reassigned"}'),
      m1Forwards: await value('callfence_agent_forwards_total{node="M1",result="delivered"}'),
    };
    const sent = [];

    // 1. Two calls on the line, delivered to M1 and answered through the fence.
    for (const tag of ["first", "second"]) {
      const call = newCall(`prom-${tag}`);
      sent.push(call.session, call.ccid, call.eventId("init"));
      const res = await c.deliver(event({ id: call.eventId("init"), type: "call.initiated", session: call.session, ccid: call.ccid }));
      assert.equal(res.status, 200, JSON.stringify(res.body));
      assert.equal(res.body.delivered_to, "M1");
      await waitFor("the call answered", async () => (await c.telnyx.answers(call.ccid)).length === 1);
    }

    // 2. A webhook whose Telnyx signature is not Telnyx's: refused by the Worker.
    const forged = newCall("prom-forged");
    sent.push(forged.session, forged.ccid, forged.eventId("init"));
    const forgedBody = event({ id: forged.eventId("init"), type: "call.initiated", session: forged.session, ccid: forged.ccid });
    const refused = await c.edge.fetch("/v1/telnyx/webhook", {
      method: "POST",
      headers: { "content-type": "application/json", "telnyx-timestamp": String(Math.floor(Date.now() / 1000)), "telnyx-signature-ed25519": Buffer.alloc(64, 7).toString("base64") },
      body: forgedBody,
    });
    assert.equal(refused.status, 401);

    // 3. The canary caller's call to M3: its first forward loses the
    //    assertion, M3's agent refuses it, and the edge reassigns the call
    //    and delivers it to another node (in the same request, or by its
    //    alarm after answering 503 reassigned).
    front.dropAssertions = 1;
    const canary = newCall("prom-canary");
    sent.push(canary.session, canary.ccid, canary.eventId("init"));
    const moved = await c.webhook(event({ id: canary.eventId("init"), type: "call.initiated", session: canary.session, ccid: canary.ccid, from: CANARY_CALLER }));
    const answeredReassigned = moved.body?.error === "reassigned" ? 1 : 0;
    assert.ok(answeredReassigned || ["M1", "M2"].includes(moved.body?.delivered_to), JSON.stringify(moved));
    await waitFor("the reassigned call delivered", async () => {
      for (const id of ["M1", "M2"]) if ((await c.nodes[id].appEvents())[canary.eventId("init")]) return true;
      return false;
    }, { timeout: 20_000 });

    // 4. M2 drained: its next beat says so, and the edge finds it ineligible.
    const m2 = c.nodes.M2;
    assert.equal(m2.cli("mode", "set", "drained").status, 0);
    await c.waitNode("M2", "drained", (n) => n.eligible === false && n.reasons.includes("mode_drained"));
    await waitFor("M2's agent holding the edge's verdict", async () => {
      const text = await (await fetch(m2.metricsUrl)).text();
      return sampleIn(text, 'callfence_agent_ineligible_reason{reason="mode_drained"}') === 1;
    });

    // 5. A deploy on M3 whose build fails: refused before any drain.
    const m3 = c.nodes.M3;
    const broken = m3.commit("broken-build", { "build.sh": "exit 3\n" });
    const deploy = await m3.deployCli("deploy", "--sha", broken, "--json");
    assert.notEqual(deploy.code, 0);
    assert.equal(deploy.out?.step, "build", JSON.stringify(deploy.out));
    assert.equal(deploy.out?.restored, false);

    // The Worker reports its refusals to the directory at most once a
    // second: the edge shows them before Prometheus is asked.
    await waitFor("the refusal counted by the edge", async () =>
      sampleIn(await edgeExposition(), 'callfence_webhooks_total{outcome="refused"}') >= base.refused + 1,
    );
    await scrapedAfter(Date.now());

    // Exact values, through Prometheus's query API.
    const delivered = 2 + 1; // two on the line, the reassigned one
    assert.equal(await value('callfence_webhooks_total{outcome="delivered"}') - base.delivered, delivered);
    assert.equal(await value('callfence_webhooks_total{outcome="refused"}') - base.refused, 1);
    assert.equal(await value('callfence_webhooks_total{outcome="reassigned"}') - base.reassigned, answeredReassigned);
    assert.equal(await value('callfence_forward_failures_total{node="M3",class="not_admitted"}'), 1);
    assert.equal(await value('callfence_agent_forwards_refused_total{node="M3",reason="missing_assertion"}'), 1);
    assert.equal(await value('callfence_agent_forwards_total{node="M1",result="delivered"}') - base.m1Forwards >= 2, true);
    assert.equal(await value('callfence_agent_fence_requests_total{node="M1",result="granted"}') >= 2, true);
    assert.equal(await value('callfence_node_eligible{node="M2"}'), 0);
    assert.equal(await value('callfence_node_ineligible_reason{node="M2",reason="mode_drained"}'), 1);
    assert.equal(await value('callfence_node_eligible{node="M1"}'), 1);
    assert.equal(await value(`callfence_line_route{line="${LINE.id}",preferred="M1",target="M1"}`), 1);
    assert.equal(await value('callfence_agent_mode{node="M2",mode="drained"}'), 1);
    assert.equal(await value('callfence_agent_mode{node="M2",mode="active"}'), 0);
    assert.equal(await value('callfence_agent_eligible{node="M2"}'), 0);
    assert.equal(await value('callfence_agent_deploys_total{node="M3",kind="deploy",outcome="failed"}'), 1);
    assert.equal(await value('callfence_agent_deploys_total{node="M3",kind="deploy",outcome="restored"}'), 0);
    assert.equal(await value('callfence_agent_deploy_step_duration_seconds_count{node="M3",step="build",outcome="failed"}'), 1);
    assert.equal(await value('callfence_agent_info{node="M1",sha="' + c.nodes.M1.sha + '"}'), 1);
    assert.equal(await value('sum(callfence_agent_beats_total{result="refused"})'), 0);

    // The rules: loaded, evaluated without error; the drain is a pending
    // CallfenceNodeIneligible for M2 (it fires after 2 minutes), and the
    // failed deploy fires at once.
    const rules = (await prom.rules()).flatMap((g) => g.rules);
    assert.ok(rules.length >= 12, `${rules.length} rules`);
    for (const r of rules) assert.equal(r.health, "ok", `${r.name}: ${r.lastError}`);
    await waitFor("the drain alert pending and the deploy alert firing", async () =>
      (await value('ALERTS{alertname="CallfenceNodeIneligible",node="M2",alertstate="pending"}')) === 1 &&
      (await value('ALERTS{alertname="CallfenceDeployFailed",node="M3",kind="deploy",outcome="failed",alertstate="firing"}')) === 1,
    { timeout: 15_000, every: 250 });
    assert.equal(await value('ALERTS{alertname="CallfenceNodeIneligible",node="M1"}'), 0);

    // Every panel of the shipped dashboard: its queries run and return a series.
    const dashboard = JSON.parse(readFileSync(join(ROOT, "ops", "grafana", "callfence.json"), "utf8"));
    const queries = dashboard.panels.flatMap((p) => (p.targets ?? []).map((t) => ({ panel: p.title, expr: t.expr })));
    assert.ok(queries.length >= 10, `${queries.length} queries`);
    for (const { panel, expr } of queries) {
      await waitFor(`a series for "${panel}": ${expr}`, async () => (await prom.query(expr)).length > 0, { timeout: 20_000, every: 500 });
    }

    // Privacy: no number, id or token of the story in either exposition.
    const expositions = [await edgeExposition()];
    for (const n of Object.values(c.nodes)) {
      expositions.push(await (await fetch(n.metricsUrl)).text());
      secrets.push(readFileSync(n.tokenPath, "utf8").trim(), n.key.seed);
    }
    for (const text of expositions) {
      for (const s of [...secrets, ...sent]) assert.ok(!text.includes(s), `${s} in an exposition`);
    }
  });

  test("the metrics token reads metrics and nothing else; no token or a policy token reads nothing", async () => {
    const get = (path, t) => c.edge.fetch(path, { headers: t ? { authorization: `Bearer ${t}` } : {} });
    assert.equal((await get("/v1/metrics")).status, 401);
    assert.equal((await get("/v1/metrics", keys.policyToken)).status, 403);
    assert.equal((await get("/v1/nodes", metricsToken)).status, 403);
    assert.equal((await get("/v1/metrics", metricsToken)).status, 200);
    assert.equal((await get("/v1/metrics", keys.adminToken)).status, 200);
  });
});
