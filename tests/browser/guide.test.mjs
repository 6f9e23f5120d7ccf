// The panel's read side in headless Chromium against the real Worker and
// Dispatcher: the token, the routing guide, the operative label, the nodes
// (stale ones, the admin_drained switch), the shard map, what a policy token
// may not see, stored strings rendered as text, and the 420 px layout.

import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { nowSeconds } from "../e2e/harness.mjs";
import { admin, heartbeatBody, nodePost, putDocument, waitFor } from "../e2e/fixtures.mjs";
import { browserSuite, enterToken, noHorizontalScroll, press, refreshed, shoot, showTab, text, waitText } from "./browser.mjs";
import { CALLER, SALES, SUPPORT, basePolicy, call, cluster } from "./panel.mjs";

const HOUR = 3600e3;

describe("the panel: token, routing guide and nodes", () => {
  const suite = browserSuite();
  /** A cluster and a panel page on it; both closed when the test ends. */
  const setup = async (t, options, pageOptions) => suite.open(t, await cluster(options), pageOptions);

  test("a token is typed in (by keyboard), kept in memory only, and can be forgotten", async (t) => {
    const { c, page, errors } = await setup(t);
    assert.equal(await text(page, "#token-state"), "no token");
    assert.match(await text(page, "#message"), /Enter a policy or admin token/);

    await page.type("#token", "x".repeat(40));
    await page.keyboard.press("Enter");
    await waitText(page, "#message", /refused \(401 unauthorized\)/);
    assert.equal(await text(page, "#token-state"), "no token");

    // Keyboard only: Tab to the field, type, Enter.
    await page.evaluate(() => document.activeElement?.blur());
    for (let i = 0; i < 10 && (await page.evaluate(() => document.activeElement?.id)) !== "token"; i++) {
      await page.keyboard.press("Tab");
    }
    assert.equal(await page.evaluate(() => document.activeElement?.id), "token");
    await page.keyboard.type(c.keys.adminToken);
    await page.keyboard.press("Enter");
    await waitText(page, "#token-state", /^admin token loaded$/);
    await page.waitForSelector("#app:not(.hidden)");
    const kept = await page.evaluate(() => ({
      field: document.getElementById("token").value,
      local: localStorage.length,
      session: sessionStorage.length,
      cookie: document.cookie,
      url: location.href,
      html: document.documentElement.outerHTML,
    }));
    assert.equal(kept.field, "");
    assert.deepEqual([kept.local, kept.session, kept.cookie], [0, 0, ""]);
    assert.ok(!kept.url.includes(c.keys.adminToken) && !kept.html.includes(c.keys.adminToken));
    await waitText(page, "#refreshed", /refreshed \d+ s ago/);

    // Tabs answer the arrow keys.
    await page.focus("#tab-guide");
    await page.keyboard.press("ArrowRight");
    await page.waitForSelector("#view-nodes:not(.hidden)");
    assert.equal(await page.evaluate(() => document.activeElement?.id), "tab-nodes");

    // Forget: the views go, and no later request carries the token. The
    // requests made before the click (a refresh, a preview) are let finish
    // first: puppeteer reports a request after the page has sent it, so one
    // sent just before the click could otherwise be counted after it.
    await page.click("#forget");
    assert.equal(await text(page, "#token-state"), "no token");
    assert.ok(await page.$("#app.hidden"));
    assert.match(await text(page, "#message"), /Token forgotten/);
    await page.waitForNetworkIdle({ idleTime: 300 });
    const sent = [];
    page.on("request", (r) => {
      if (r.headers().authorization) sent.push(r.url());
    });
    await new Promise((resolve) => setTimeout(resolve, 6500)); // past one refresh period
    assert.deepEqual(sent, []);
    assert.deepEqual(errors, []);
  });

  test("the routing guide says a line prefers a drained M3 and its next call goes to M1, and why", async (t) => {
    const { c, page, errors } = await setup(t, { perNode: { M3: { admin_drained: true } }, policy: basePolicy({ salesPrefers: "M3" }) });
    await enterToken(page, c.keys.adminToken);
    const row = '#lines tr[data-line="sales"]';
    const line = await waitText(page, row, /next call goes to M1/);
    assert.match(line, /prefers M3/);
    assert.match(line, /fallback/);
    assert.match(line, /M3 passed over: drained by an operator admin_drained/);
    assert.match(await text(page, `${row} td[data-label="Configured fallback"]`), /^M1$/);
    assert.match(await text(page, `${row} td[data-label="Line"]`), new RegExp(`sales\\${SALES}`));
    const support = await text(page, '#lines tr[data-line="support"]');
    assert.match(support, /prefers M2/);
    assert.match(support, /next call goes to M2 preferred/);
    assert.doesNotMatch(support, /passed over/);
    // The API says the same.
    const status = (await admin(c.edge, "/v1/status")).body;
    const sales = status.lines.find((l) => l.line_id === "sales");
    assert.deepEqual([sales.prefers, sales.next_call_target, sales.reasons.M3], ["M3", "M1", ["admin_drained"]]);
    await shoot(page, "guide-desktop");
    await page.setViewport({ width: 1040, height: 505 });
    await shoot(page, "readme-guide", { fullPage: false }); // docs/panel.png

    const dark = await suite.openPanel(c.edge, { scheme: "dark" });
    t.after(() => dark.close());
    await enterToken(dark.page, c.keys.adminToken);
    await waitText(dark.page, row, /next call goes to M1/);
    const bg = await dark.page.evaluate(() => getComputedStyle(document.body).backgroundColor);
    assert.equal(bg, "rgb(17, 20, 24)", "the dark scheme applies");
    await shoot(dark.page, "guide-dark");
    assert.deepEqual([...errors, ...dark.errors], []);
  });

  test("before the first webhook the guide is labelled a preview, not operative", async (t) => {
    const { c, page, errors } = await setup(t);
    await enterToken(page, c.keys.policyToken);
    await waitText(page, "#engine-banner", /^Preview, not operative: no webhook has reached this deployment yet/);
    assert.equal((await admin(c.edge, "/v1/status")).body.engine.operative, false);
    await call(c, SUPPORT);
    assert.equal((await admin(c.edge, "/v1/status")).body.engine.operative, true);
    const banner = await waitText(page, "#engine-banner", /^Operative · last webhook \d+ s ago$/);
    assert.doesNotMatch(banner, /not operative/);
    assert.deepEqual(errors, []);
  });

  test("a policy token sees no registry and its admin_drained switch is refused", async (t) => {
    const { c, page, errors } = await setup(t);
    const nodesAnswers = [];
    page.on("response", (r) => {
      if (new URL(r.url()).pathname === "/v1/nodes") nodesAnswers.push(r.status());
    });
    await call(c, SUPPORT);
    await enterToken(page, c.keys.policyToken);
    await waitText(page, "#token-state", /^policy token loaded$/);
    await showTab(page, "nodes");
    assert.match(await text(page, "#nodes-note"), /draining needs an admin token/);
    const switches = await page.$$eval("#nodes button[role=switch]", (b) => b.map((x) => [x.dataset.node, x.disabled]));
    assert.deepEqual(switches, [["M1", true], ["M2", true], ["M3", true]]);
    // Forced anyway, the write is refused by the Worker (403) and nothing changes.
    const before = (await admin(c.edge, "/v1/nodes")).body;
    await page.$eval('#nodes button[role=switch][data-node="M2"]', (b) => {
      b.disabled = false;
      b.click();
    });
    await waitText(page, "#drain-result", /Refused: draining a node needs an admin token \(403 forbidden\)/);
    assert.deepEqual((await admin(c.edge, "/v1/nodes")).body, before);
    // A decision's registry revision is not shown to a policy token.
    await showTab(page, "decisions");
    await page.waitForSelector("#decisions > details");
    await press(page, "#decisions > details > summary");
    await press(page, '#decisions a.revision-link[data-kind="nodes"]');
    await waitText(page, "#revision-doc", /needs an admin token \(403 forbidden\)/);
    assert.ok(nodesAnswers.length >= 2 && nodesAnswers.every((s) => s === 403), JSON.stringify(nodesAnswers));
    assert.deepEqual(errors, []);
  });

  test("a note holding markup is shown as text and runs nothing", async (t) => {
    const note = `<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>`;
    const policy = basePolicy({ byCaller: { [CALLER]: { preferred_node: "M1", expires_at: new Date(Date.now() + HOUR).toISOString(), note } } });
    const { c, page, errors } = await setup(t, { policy });
    await enterToken(page, c.keys.adminToken);
    const cell = `#overrides tr[data-caller="${CALLER}"] td.note`;
    await page.waitForSelector(cell);
    assert.equal(await text(page, cell), note);
    assert.match(await text(page, `#overrides tr[data-caller="${CALLER}"]`), /expires in (59 m|1 h 0 m)/);
    await showTab(page, "editor");
    const input = await page.$eval('#edit-overrides input[data-field="note"]', (i) => i.value);
    assert.equal(input, note);
    const dom = await page.evaluate(() => ({ imgs: document.querySelectorAll("img").length, scripts: document.scripts.length, xss: typeof window.__xss }));
    assert.deepEqual(dom, { imgs: 0, scripts: 1, xss: "undefined" });
    assert.deepEqual(errors, []);
  });

  test("a stale node looks stale, with its last-seen time and the open calls it still owns", async (t) => {
    const { c, page, errors } = await setup(t);
    const { res } = await call(c, SUPPORT);
    assert.equal(res.body.delivered_to, "M2");
    // M2's last beat: valid for 1 s, signed 5 s ago, so stale on arrival.
    const body = heartbeatBody(c.edge, c.nodes.M2, { valid_for_s: 1 });
    const beatRes = await nodePost(c.edge, c.nodes.M2, "/v1/nodes/heartbeat", body, { timestamp: nowSeconds() - 5 });
    assert.equal(beatRes.status, 200, JSON.stringify(beatRes.body));
    const m2 = await waitFor(async () => {
      const n = (await admin(c.edge, "/v1/status")).body.nodes.find((x) => x.node === "M2");
      return n.stale && n;
    }, { timeout: 10_000, what: "M2 stale" });
    assert.ok(m2.reasons.includes("heartbeat_stale") && m2.last_seen_at, JSON.stringify(m2));
    await enterToken(page, c.keys.adminToken);
    await showTab(page, "nodes");
    const row = '#nodes tr[data-node="M2"]';
    const shown = await waitText(page, row, /still owns 1 open call/);
    assert.match(shown, /stale/);
    assert.match(shown, /last seen \d+ s ago/);
    assert.match(shown, /as last reported/);
    assert.match(shown, /heartbeat is stale heartbeat_stale/);
    assert.ok(await page.$(`${row}.stale`), "the row is greyed");
    assert.equal(await page.$(`#nodes tr[data-node="M1"].stale`), null);
    const title = await page.$eval(`${row} time`, (t) => t.getAttribute("title"));
    assert.ok(title.startsWith(m2.last_seen_at), title);
    // The SHA: short, clean said in words, the full one on hover and inside.
    const sha = await page.$eval(`${row} code.sha`, (e) => [e.textContent, e.title]);
    assert.deepEqual(sha, [m2.sha.slice(0, 12), m2.sha]);
    assert.equal(await text(page, `${row} code.full-sha`), m2.sha);
    assert.match(await text(page, `${row} td[data-label="SHA"]`), /clean/);
    const support = await text(page, '#lines tr[data-line="support"]');
    assert.match(support, /next call goes to M1 fallback/);
    await shoot(page, "nodes-desktop");
    assert.deepEqual(errors, []);
  });

  test("a node whose beats went backwards says so on its row", async (t) => {
    const { c, page, errors } = await setup(t);
    // A second signer with M3's key, its seq an hour behind: refused, counted.
    const behind = { ...heartbeatBody(c.edge, c.nodes.M3), seq: Date.now() - HOUR };
    const refused = await nodePost(c.edge, c.nodes.M3, "/v1/nodes/heartbeat", behind);
    assert.deepEqual([refused.status, refused.body.error], [409, "stale_seq"]);
    await enterToken(page, c.keys.adminToken);
    await showTab(page, "nodes");
    const shown = await waitText(page, '#nodes tr[data-node="M3"] .seq-regressions', /^1 seq regression, last .*ago$/);
    assert.ok(shown);
    assert.equal(await page.$('#nodes tr[data-node="M1"] .seq-regressions'), null);
    assert.deepEqual(errors, []);
  });

  test("the admin_drained switch asks first, writes by compare-and-set, and refuses a stale registry", async (t) => {
    const { c, page, errors } = await setup(t);
    await call(c, SUPPORT); // M2 owns one open call
    await enterToken(page, c.keys.adminToken);
    await showTab(page, "nodes");
    const sw = '#nodes button[role=switch][data-node="M2"]';
    await page.waitForSelector(`${sw}[aria-checked="false"]:not([disabled])`);

    // A refresh keeps the switch it did not change in the page, so a press
    // that straddles the redraw is not lost.
    const kept = await page.$(sw);
    const before = await refreshed(page);
    await page.waitForFunction((b) => document.querySelector("#refreshed time")?.getAttribute("datetime") !== b, { timeout: 15_000 }, before);
    assert.equal(await kept.evaluate((e) => e.isConnected), true, "the refresh replaced an unchanged switch");

    // Another writer changes the registry while the dialog is open: refused.
    await press(page, sw);
    await page.waitForSelector("#drain-dialog[open]");
    assert.match(await text(page, "#drain-body"), /M2 owns 1 open call; they continue/);
    await shoot(page, "drain-dialog");
    const reg = (await admin(c.edge, "/v1/nodes")).body;
    const revision = reg.revision;
    delete reg.revision;
    reg.nodes.M1.max_calls = 40;
    assert.equal((await putDocument(c.edge, "nodes", reg)).status, 200);
    await page.click("#drain-confirm");
    await waitText(page, "#drain-result", new RegExp(`registry changed meanwhile \\(now revision ${revision + 1}\\); nothing was written`));
    let now = (await admin(c.edge, "/v1/nodes")).body;
    assert.deepEqual([now.revision, now.nodes.M2.admin_drained], [revision + 1, false]);

    // Cancel writes nothing.
    await press(page, sw);
    await page.waitForSelector("#drain-dialog[open]");
    await page.click("#drain-cancel");
    assert.equal((await admin(c.edge, "/v1/nodes")).body.revision, revision + 1);

    // Confirmed on a fresh read: written at that revision, the other change kept.
    await press(page, sw);
    await page.waitForSelector("#drain-dialog[open]");
    await page.click("#drain-confirm");
    await waitText(page, "#drain-result", new RegExp(`M2 drained: registry revision ${revision + 2}`));
    now = (await admin(c.edge, "/v1/nodes")).body;
    assert.deepEqual([now.revision, now.nodes.M2.admin_drained, now.nodes.M1.max_calls], [revision + 2, true, 40]);
    await page.waitForSelector(`${sw}[aria-checked="true"]`);
    assert.match(await text(page, '#nodes tr[data-node="M2"]'), /drained by an operator admin_drained/);

    // And back.
    await press(page, sw);
    await page.waitForSelector("#drain-dialog[open]");
    assert.match(await text(page, "#drain-title"), /Undrain M2/);
    await page.click("#drain-confirm");
    await waitText(page, "#drain-result", /M2 undrained/);
    assert.equal((await admin(c.edge, "/v1/nodes")).body.nodes.M2.admin_drained, false);
    assert.deepEqual(errors, []);
  });

  test("the shard map shows its shards, open calls and floor; a change asks first, says nothing moves, and a refusal is shown", async (t) => {
    const { c, page, errors } = await setup(t);
    await call(c, SUPPORT);
    // A policy token sees no map and no form.
    await enterToken(page, c.keys.policyToken);
    await showTab(page, "nodes");
    await waitText(page, "#shards", /needs an admin token/);
    assert.equal(await page.$eval("#shards-form", (f) => f.classList.contains("hidden")), true);
    await press(page, "#forget");

    await enterToken(page, c.keys.adminToken);
    await showTab(page, "nodes");
    const facts = await waitText(page, "#shards", /call shards 1 · map revision 0/);
    assert.match(facts, /global \(shard 0\): 1 open call/);
    assert.match(facts, /rollback floor v1\.3/);
    const map = async () => (await admin(c.edge, "/v1/shards")).body;
    const setCount = (n) => page.$eval("#shards-count", (i, v) => { i.value = v; }, String(n));

    // The same count writes nothing and asks nothing.
    await setCount(1);
    await press(page, '#shards-form button[type="submit"]');
    await waitText(page, "#shards-result", /already has 1 call shard; nothing to write/);

    // A refresh leaves a count being typed in as it is.
    await setCount(4);
    const stamp = await refreshed(page);
    await page.waitForFunction((b) => document.querySelector("#refreshed time")?.getAttribute("datetime") !== b, { timeout: 15_000 }, stamp);
    assert.equal(await page.$eval("#shards-count", (i) => i.value), "4");

    // Cancel writes nothing; the dialog says what a change does not move.
    await press(page, '#shards-form button[type="submit"]');
    await page.waitForSelector("#shards-dialog[open]");
    assert.match(await text(page, "#shards-title"), /from 1 to 4 call shards/);
    assert.match(await text(page, "#shards-body"), /Nothing moves: every live session stays in the shard that holds it/);
    assert.match(await text(page, "#shards-body"), /rolled back below v1\.4/);
    await shoot(page, "shards-dialog");
    await page.click("#shards-cancel");
    assert.equal((await map()).revision, 0);

    // Confirmed: written; the map, its floor and each shard's open calls follow.
    await setCount(4);
    await press(page, '#shards-form button[type="submit"]');
    await page.waitForSelector("#shards-dialog[open]");
    await page.click("#shards-confirm");
    await waitText(page, "#shards-result", /Shard map revision 1: 4 call shards/);
    assert.deepEqual(await map(), { schema: "callfence_shards_v1", call_shards: 4, revision: 1 });
    const grown = await waitText(page, "#shards", /call shards 4 · map revision 1[\s\S]*calls-3 \(shard 3\): 0 open calls/);
    assert.match(grown, /global \(shard 0\): 1 open call/);
    assert.match(grown, /rollback floor v1\.4/);

    // Another writer changes the map while the dialog is open: refused (412).
    await setCount(2);
    await press(page, '#shards-form button[type="submit"]');
    await page.waitForSelector("#shards-dialog[open]");
    assert.equal((await putDocument(c.edge, "shards", { schema: "callfence_shards_v1", call_shards: 1 })).status, 200);
    await page.click("#shards-confirm");
    await waitText(page, "#shards-result", /shard map changed meanwhile \(now revision 2\); nothing was written/);
    await waitText(page, "#shards", /map revision 2/);
    assert.deepEqual(errors, []);
  });

  test("at 420 px every view fits with no horizontal scroll", async (t) => {
    const policy = basePolicy({ byCaller: { [CALLER]: { preferred_node: "M2", expires_at: new Date(Date.now() + 2 * HOUR).toISOString(), note: "a fairly long note that has to wrap on a phone screen" } } });
    const { c, page, errors } = await setup(t, { policy, perNode: { M3: { admin_drained: true } } }, { width: 420, height: 860 });
    await call(c, SALES, "+14155550777");
    await call(c, SUPPORT);
    await enterToken(page, c.keys.adminToken);
    await waitText(page, "#engine-banner", /^Operative/);
    await noHorizontalScroll(page);
    await shoot(page, "guide-420");
    await showTab(page, "nodes");
    await noHorizontalScroll(page);
    await shoot(page, "nodes-420");
    await showTab(page, "decisions");
    await page.waitForSelector("#decisions > details");
    await press(page, "#decisions > details > summary");
    await noHorizontalScroll(page);
    await shoot(page, "decisions-420");
    await showTab(page, "editor");
    await page.select('#edit-lines [data-path="/by_line/sales/preferred_node"]', "M1");
    await page.waitForSelector("#draft-preview ul");
    await noHorizontalScroll(page);
    await shoot(page, "editor-420");
    const stamp = await refreshed(page);
    await waitFor(async () => (await refreshed(page)) !== stamp, { timeout: 15_000, what: "a live refresh" });
    await noHorizontalScroll(page);
    assert.deepEqual(errors, []);
  });
});
