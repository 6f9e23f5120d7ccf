// The panel's policy editor and decision viewer in headless Chromium against
// the real Worker and Dispatcher: an override with a 2-hour expiry, the draft
// preview's flags, a stale save (412) reapplied, a 400 at its field, and
// decisions filtered to one call with the revisions they cite.

import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { admin, putDocument, waitFor } from "../e2e/fixtures.mjs";
import { browserSuite, enterToken, press, refreshed, shoot, showTab, text, waitText } from "./browser.mjs";
import { CALLER, SALES, beat, call, cluster } from "./panel.mjs";

const HOUR = 3600e3;

describe("the panel: policy editor and decision viewer", () => {
  const suite = browserSuite();

  /** A cluster and the panel on its editor, with `token` loaded. */
  async function setup(t, options, token = "policyToken") {
    const panel = await suite.open(t, await cluster(options));
    const { c } = panel;
    await enterToken(panel.page, c.keys[token]);
    await showTab(panel.page, "editor");
    await waitText(panel.page, "#draft-preview", /No edits yet/);
    return panel;
  }

  /** Replaces the value of an editor input. */
  async function fill(page, selector, value) {
    await page.click(selector, { clickCount: 3 });
    await page.$eval(selector, (i) => {
      i.value = "";
    });
    await page.type(selector, value);
  }

  const lineField = (line, field) => `#edit-lines [data-path="/by_line/${line}/${field}"]`;
  /** Adds an override row and types into it (`hours`/`minutes` as text). */
  async function addOverride(page, { caller, node, hours, minutes, note }) {
    await page.click("#add-override");
    const row = "#edit-overrides .editor-row:last-child";
    await page.type(`${row} input[data-field="caller"]`, caller);
    await page.select(`${row} select[data-field="preferred_node"]`, node);
    if (hours) await page.type(`${row} input[aria-label="hours"]`, hours);
    if (minutes) await page.type(`${row} input[aria-label="minutes"]`, minutes);
    if (note) await page.type(`${row} input[data-field="note"]`, note);
  }

  const policyNow = async (c) => (await admin(c.edge, "/v1/policy")).body;

  test("an override added with a 2-hour expiry is saved and shown with its time left", async (t) => {
    const { c, page, errors } = await setup(t);
    const base = (await policyNow(c)).revision;
    await addOverride(page, { caller: CALLER, node: "M1", hours: "2", note: "VIP during the migration" });
    await waitText(page, `#draft-preview li[data-preview-caller="${CALLER}"]`, /prefer M1 and would go to M1 on every line/);
    const before = Date.now();
    await page.click("#save");
    await waitText(page, "#save-result", new RegExp(`^Saved: revision ${base + 1}\\.$`));
    const after = Date.now();
    const stored = (await policyNow(c)).by_caller[CALLER];
    assert.equal(stored.preferred_node, "M1");
    assert.equal(stored.note, "VIP during the migration");
    const expires = Date.parse(stored.expires_at);
    assert.ok(expires >= before + 2 * HOUR - 1000 && expires <= after + 2 * HOUR, stored.expires_at);
    assert.ok(Date.parse(stored.created_at) >= before - 5000, stored.created_at);
    // The editor follows the saved revision and shows the time left.
    assert.match(await text(page, "#editor-base"), new RegExp(`Editing from revision ${base + 1}\\.`));
    await waitText(page, `#edit-overrides [data-expires]`, /^time left: (1 h 59 m|2 h 0 m)$/);
    await showTab(page, "guide");
    const shown = await waitText(page, `#overrides tr[data-caller="${CALLER}"]`, /expires in (1 h 59 m|2 h 0 m)/);
    assert.match(shown, /prefers M1/);
    assert.match(shown, /VIP during the migration/);
    assert.match(shown, /\d+ s ago/); // created
    await showTab(page, "editor");
    await shoot(page, "editor-desktop");
    assert.deepEqual(errors, []);
  });

  test("the draft preview flags a preferred node that would be passed over, before saving", async (t) => {
    // M3 serves no line: an override preferring it is passed over on every line.
    const { c, page, errors } = await setup(t);
    await beat(c, ["M3"], { M3: { lines: {} } });
    const base = (await policyNow(c)).revision;
    await addOverride(page, { caller: CALLER, node: "M3", minutes: "30" });
    const flagged = await waitText(page, `#draft-preview li[data-preview-caller="${CALLER}"]`, /to line sales they would go to/);
    assert.match(flagged, /M3 passed over: does not serve this line line_not_served/);
    assert.match(flagged, /to line support they would go to M1/);
    assert.doesNotMatch(flagged, /to other numbers/);
    // Counted once: one override (on two lines) misses one node.
    assert.equal(await text(page, "#preview-flags"), "⚠ Under this draft 1 override would not reach its preferred node: M3 would be passed over.");
    // A line the draft points at M3 is flagged too.
    await page.select(lineField("support", "preferred_node"), "M3");
    await waitText(page, '#draft-preview li[data-preview-line="support"]', /next call would go to M1.*M3 passed over: does not serve this line/);
    assert.equal(await text(page, "#preview-flags"), "⚠ Under this draft 1 line and 1 override would not reach their preferred nodes: M3 would be passed over.");
    // Saving asks for a second press, and writes nothing before it.
    await page.click("#save");
    await waitText(page, "#save-result", /Press Save again to save anyway/);
    assert.equal((await policyNow(c)).revision, base);
    await page.click("#save");
    await waitText(page, "#save-result", new RegExp(`^Saved: revision ${base + 1}\\.$`));
    assert.equal((await policyNow(c)).by_line.support.preferred_node, "M3");
    assert.deepEqual(errors, []);
  });

  test("a stale save shows what changed meanwhile, keeps the edits through refreshes, and succeeds when reapplied", async (t) => {
    const { c, page, errors } = await setup(t);
    const base = (await policyNow(c)).revision;
    await page.select(lineField("sales", "preferred_node"), "M1");
    // Another writer adds a line in between.
    const theirs = await policyNow(c);
    delete theirs.revision;
    theirs.by_line.billing = { called_number: "+15550003333", preferred_node: "M2" };
    assert.equal((await putDocument(c.edge, "policy", theirs)).status, 200);
    await beat(c); // the nodes now serve billing too
    // The live refresh sees the new revision and leaves the edit alone.
    await waitText(page, "#summary", new RegExp(`policy revision ${base + 1}`), 15_000);
    const stamp = await refreshed(page);
    await waitFor(async () => (await refreshed(page)) !== stamp, { timeout: 15_000, what: "another refresh" });
    assert.equal(await page.$eval(lineField("sales", "preferred_node"), (i) => i.value), "M1");
    assert.match(await text(page, "#editor-base"), new RegExp(`revision ${base + 1} has been saved since`));

    await page.click("#save");
    await waitText(page, "#save-result", new RegExp(`Not saved: revision ${base + 1} was saved meanwhile`));
    const conflict = await waitText(page, "#editor-conflict", /What changed meanwhile/);
    assert.match(conflict, new RegExp(`Revision ${base + 1} was saved since you started from revision ${base}`));
    assert.match(conflict, /line billing added: \+15550003333 prefers M2/);
    assert.equal((await policyNow(c)).by_line.sales.preferred_node, "M2", "nothing of the draft was written");
    await shoot(page, "editor-conflict");

    await beat(c); // fresh beats for the preview the save runs, however slow the machine
    await page.click("#reapply");
    await page.waitForSelector(lineField("billing", "called_number"));
    assert.equal(await page.$eval(lineField("sales", "preferred_node"), (i) => i.value), "M1");
    await page.click("#save");
    await waitText(page, "#save-result", new RegExp(`^Saved: revision ${base + 2}\\.$`));
    const now = await policyNow(c);
    assert.equal(now.by_line.sales.preferred_node, "M1");
    assert.equal(now.by_line.billing.called_number, "+15550003333");
    assert.deepEqual(errors, []);
  });

  test("a 400 is shown at the field it names, and nothing is written", async (t) => {
    const { c, page, errors } = await setup(t);
    const base = (await policyNow(c)).revision;
    const puts = [];
    page.on("response", (r) => {
      if (r.request().method() === "PUT" && new URL(r.url()).pathname === "/v1/policy") puts.push(r.status());
    });
    const field = lineField("sales", "called_number");
    await fill(page, field, "5550001111");
    await page.click("#save");
    await waitText(page, "#save-result", /Not saved: the policy has problems/);
    assert.deepEqual(puts, [400]);
    const msg = await page.$eval(field, (input) => {
      const next = input.nextElementSibling;
      return [input.getAttribute("aria-invalid"), next?.className, next?.getAttribute("data-problem-path"), next?.textContent];
    });
    assert.deepEqual(msg.slice(0, 3), ["true", "err-msg", "/by_line/sales/called_number"]);
    assert.match(msg[3], /canonical E\.164/);
    assert.match(await text(page, "#editor-problems"), /\/by_line\/sales\/called_number/);
    assert.equal((await policyNow(c)).revision, base);
    // Fixing the field clears the problem on the next save. The nodes still
    // serve sales with its old number, which the preview flags first.
    await fill(page, field, "+15550001112");
    await waitText(page, '#draft-preview li[data-preview-line="sales"]', /has another number for this line routing_hash_mismatch/);
    await page.click("#save");
    await waitText(page, "#save-result", /Press Save again/);
    await page.click("#save");
    await waitText(page, "#save-result", new RegExp(`^Saved: revision ${base + 1}\\.$`));
    assert.equal(await page.$(`#editor [aria-invalid="true"]`), null);
    assert.deepEqual(errors, []);
  });

  test("the decision viewer filters to one call and opens the revisions it cites", async (t) => {
    const { c, page, errors } = await setup(t, {}, "adminToken");
    const first = await call(c, SALES); // to M2, preferred
    // Drain M2: the next sales call falls back to M1 under registry revision 2.
    const reg = (await admin(c.edge, "/v1/nodes")).body;
    delete reg.revision;
    reg.nodes.M2.admin_drained = true;
    assert.equal((await putDocument(c.edge, "nodes", reg)).status, 200);
    await beat(c, ["M1"]);
    const second = await call(c, SALES);
    assert.equal(second.res.body.delivered_to, "M1");
    // Then the policy moves on, so the cited revision is not the current one.
    const next = await policyNow(c);
    delete next.revision;
    next.default_node = "M3";
    assert.equal((await putDocument(c.edge, "policy", next)).status, 200);
    const decisions = (await admin(c.edge, "/v1/decisions")).body.decisions;
    const [d2, d1] = decisions;
    assert.deepEqual([d1.call_session_id, d2.call_session_id], [first.session, second.session]);

    await showTab(page, "decisions");
    await waitFor(async () => (await page.$$("#decisions > details")).length === 2, { timeout: 15_000, what: "two decisions" });
    const order = await page.$$eval("#decisions > details", (ds) => ds.map((d) => d.getAttribute("data-decision")));
    assert.deepEqual(order, [String(d2.decision_id), String(d1.decision_id)], "newest first");
    const fallbackSummary = await text(page, `#decisions details[data-decision="${d2.decision_id}"] summary`);
    assert.match(fallbackSummary, /line sales · prefers M2 · chose M1 fallback assigned/);

    await page.type("#filter-session", first.session);
    await page.keyboard.press("Enter");
    await waitFor(async () => (await page.$$("#decisions > details")).length === 1, { what: "one decision" });
    assert.match(await text(page, "#decisions-note"), new RegExp(`Decisions for call ${first.session}`));
    const one = `#decisions details[data-decision="${d1.decision_id}"]`;
    await press(page, `${one} summary`);
    const evidence = await text(page, `${one} dl`);
    assert.match(evidence, /Rule\s*line line/);
    assert.match(evidence, /Prefers\s*M2/);
    assert.match(evidence, /Chosen\s*M2/);
    assert.match(evidence, new RegExp(`Chosen SHA${d1.chosen_sha.slice(0, 12)} clean`));
    assert.match(evidence, new RegExp(`Cites\\s*policy revision ${d1.policy_revision} · registry revision ${d1.nodes_revision}`));
    assert.match(evidence, new RegExp(first.session));

    await press(page, `${one} a.revision-link[data-kind="policy"]`);
    await waitText(page, "#revision-title", new RegExp(`^Policy revision ${d1.policy_revision}, cited by decision ${d1.decision_id}$`));
    const cited = (await admin(c.edge, `/v1/policy?revision=${d1.policy_revision}`)).body;
    assert.deepEqual(JSON.parse(await text(page, "#revision-doc")), cited);
    assert.equal(cited.default_node, "M1");
    await shoot(page, "decisions-desktop");
    await press(page, `${one} a.revision-link[data-kind="nodes"]`);
    await waitText(page, "#revision-title", new RegExp(`^Node registry revision ${d1.nodes_revision}`));
    const registry = (await admin(c.edge, `/v1/nodes?revision=${d1.nodes_revision}`)).body;
    assert.deepEqual(JSON.parse(await text(page, "#revision-doc")), registry);
    assert.equal(registry.nodes.M2.admin_drained, false);

    // A live refresh keeps the filter and the open decision.
    const stamp = await refreshed(page);
    await waitFor(async () => (await refreshed(page)) !== stamp, { timeout: 15_000, what: "a refresh" });
    assert.equal((await page.$$("#decisions > details")).length, 1);
    assert.ok(await page.$(`${one}[open]`));
    assert.deepEqual(errors, []);
  });
});
