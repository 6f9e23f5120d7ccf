// The panel as an operator reads it, in headless Chromium against the real
// Worker and Dispatcher: a banner that says when lines have no eligible
// node, numbers and ids that never wrap, where an override's caller's next
// call goes, node fields picked from the registry, previews only on an
// edit, and counts in words ("1 open call").

import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { admin, putDocument, waitFor } from "../e2e/fixtures.mjs";
import { browserSuite, enterToken, noHorizontalScroll, press, refreshed, shoot, showTab, text, waitText } from "./browser.mjs";
import { CALLER, SALES, SUPPORT, basePolicy, beat, call, cluster } from "./panel.mjs";

const HOUR = 3600e3;
const OTHER_CALLER = "+14155550123";

/** Writes the registry with `admin_drained` set as `drained` says per node. */
async function drain(c, drained) {
  const reg = (await admin(c.edge, "/v1/nodes")).body;
  delete reg.revision;
  for (const [node, value] of Object.entries(drained)) reg.nodes[node].admin_drained = value;
  const res = await putDocument(c.edge, "nodes", reg);
  assert.equal(res.status, 200, JSON.stringify(res.body));
}

/** Waits until the panel has refreshed `times` more times. */
async function refreshes(page, times) {
  for (let i = 0; i < times; i++) {
    const stamp = await refreshed(page);
    await waitFor(async () => (await refreshed(page)) !== stamp, { timeout: 15_000, what: "a refresh" });
  }
}

/** Every visible occurrence of each of `needles` in the page that is broken
 * across lines, or cut short by its box. */
function brokenNeedles(page, needles) {
  return page.evaluate((needles) => {
    const out = [];
    const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const parent = node.parentElement;
      if (!parent || !parent.getClientRects().length) continue;
      for (const needle of needles) {
        for (let at = node.data.indexOf(needle); at >= 0; at = node.data.indexOf(needle, at + 1)) {
          const range = document.createRange();
          range.setStart(node, at);
          range.setEnd(node, at + needle.length);
          const tops = new Set([...range.getClientRects()].filter((r) => r.width > 0).map((r) => Math.round(r.top)));
          if (tops.size > 1) out.push(`${needle} wraps over ${tops.size} lines in <${parent.tagName.toLowerCase()}>`);
          if (parent.scrollWidth > parent.clientWidth + 1 && getComputedStyle(parent).textOverflow === "ellipsis") {
            out.push(`${needle} is cut short in <${parent.tagName.toLowerCase()}>`);
          }
        }
      }
    }
    return out;
  }, needles);
}

describe("the panel as an operator reads it", () => {
  const suite = browserSuite();
  const setup = async (t, options, pageOptions) => suite.open(t, await cluster(options), pageOptions);

  test("the banner says so when calls arrive but lines have no eligible node, and counts read in words", async (t) => {
    const { c, page, errors } = await setup(t);
    await call(c, SUPPORT);
    await enterToken(page, c.keys.adminToken);
    await waitText(page, "#engine-banner", /^Operative · last webhook \d+ s ago$/);
    assert.ok(await page.$("#engine-banner.ok"));

    await drain(c, { M1: true, M2: true, M3: true });
    const banner = await waitText(page, "#engine-banner", /lines have no eligible node/, 15_000);
    assert.match(banner, /^Calls are arriving, but 2 of 2 lines have no eligible node: their calls wait, then are rejected\. Last webhook \d+ s ago\.$/);
    assert.doesNotMatch(banner, /Operative/);
    assert.ok(await page.$("#engine-banner.bad"), "the banner is not green");
    await shoot(page, "banner-no-eligible-node");
    const counts = await page.$$eval("#summary > span", (xs) => xs.map((x) => x.textContent).find((x) => x.includes("open call")));
    assert.match(counts, /^1 open call · 0 pending/);

    await drain(c, { M1: false });
    await waitText(page, "#engine-banner", /^Operative · last webhook \d+ s ago$/, 15_000);
    assert.deepEqual(errors, []);
  });

  test("phone numbers and ids never wrap at 1280 px, however long the other columns are", async (t) => {
    const longLine = "customer_support_emea_escalations";
    const note = "a long note that an operator left for the next shift, ".repeat(3).trim();
    const expires = new Date(Date.now() + HOUR).toISOString();
    const policy = basePolicy({ salesPrefers: "M3", byCaller: { [CALLER]: { preferred_node: "M3", expires_at: expires, note } } });
    policy.by_line[longLine] = { called_number: "+15105550103", preferred_node: "M3", fallback_node: "M2" };
    const { c, page, errors } = await setup(t, { policy, perNode: { M3: { admin_drained: true } } }, { width: 1280, height: 900 });
    await beat(c, ["M2"], { M2: { app_ready: false } });
    await call(c, SALES, CALLER);
    await enterToken(page, c.keys.adminToken);
    await waitText(page, `#lines tr[data-line="${longLine}"]`, /passed over/);
    await waitText(page, `#overrides tr[data-caller="${CALLER}"]`, /expires in/);
    const needles = [SALES, SUPPORT, CALLER, "+15105550103", longLine];
    assert.deepEqual(await brokenNeedles(page, needles), []);
    await shoot(page, "guide-long-why");
    await showTab(page, "decisions");
    await page.waitForSelector("#decisions > details");
    await press(page, "#decisions > details > summary");
    const session = await page.$eval("#decisions > details summary .mono", (e) => e.textContent);
    assert.deepEqual(await brokenNeedles(page, [session]), []);
    await showTab(page, "editor");
    assert.deepEqual(await brokenNeedles(page, needles), []);
    // And at 420 px nothing scrolls sideways, and no number wraps.
    await page.setViewport({ width: 420, height: 860 });
    await showTab(page, "guide");
    await noHorizontalScroll(page);
    assert.deepEqual(await brokenNeedles(page, [SALES, SUPPORT, CALLER, "+15105550103"]), []);
    assert.deepEqual(errors, []);
  });

  test("a caller override says where that caller's next call goes, on each line, and why", async (t) => {
    const expires = new Date(Date.now() + HOUR).toISOString();
    const policy = basePolicy({
      byCaller: {
        [CALLER]: { preferred_node: "M3", expires_at: expires },
        [OTHER_CALLER]: { preferred_node: "M2", expires_at: expires },
      },
    });
    const { c, page, errors } = await setup(t, { policy });
    await beat(c, ["M3"], { M3: { lines: {} } }); // M3 serves no line
    await enterToken(page, c.keys.policyToken);
    const row = `#overrides tr[data-caller="${CALLER}"]`;
    const shown = await waitText(page, row, /line_not_served/);
    assert.match(shown, /prefers M3/);
    const next = await text(page, `${row} td[data-label="Next call"]`);
    // An override's fallback is the default node (M1), not the line's.
    assert.match(next, /to line sales: next call goes to M1 fallback/);
    assert.match(next, /to line support: next call goes to M1 fallback/);
    assert.match(next, /to other numbers: next call goes to M3 preferred/);
    assert.match(await text(page, `${row} td[data-label="Why"]`), /to line sales: M3 passed over: does not serve this line line_not_served/);
    const other = `#overrides tr[data-caller="${OTHER_CALLER}"]`;
    assert.match(await text(page, `${other} td[data-label="Next call"]`), /^next call goes to M2 preferred$/);
    assert.match(await text(page, `${other} td[data-label="Why"]`), /the preferred node is eligible/);
    // The API says the same.
    const status = (await admin(c.edge, "/v1/status")).body;
    const o = status.overrides.find((x) => x.caller === CALLER);
    assert.deepEqual(
      o.next_calls.map((n) => [n.line_id, n.next_call_target, n.fallback_in_use]),
      [["sales", "M1", true], ["support", "M1", true], [null, "M3", false]],
    );
    assert.deepEqual(o.next_calls[0].reasons.M3, ["line_not_served"]);
    await shoot(page, "guide-overrides");
    assert.deepEqual(errors, []);
  });

  test("node fields in the editor are picks from the registry's nodes", async (t) => {
    const { c, page, errors } = await setup(t);
    await enterToken(page, c.keys.policyToken);
    await showTab(page, "editor");
    const typed = await page.$$eval('#editor input[data-field$="_node"], #editor input#default-node', (xs) => xs.length);
    assert.equal(typed, 0, "no node field is free text");
    const options = (sel) => page.$eval(sel, (s) => [s.tagName, s.value, [...s.options].map((o) => [o.value, o.textContent])]);
    assert.deepEqual(await options("#default-node"), ["SELECT", "M1", [["", "choose a node"], ["M1", "M1"], ["M2", "M2"], ["M3", "M3"]]]);
    const field = (line, f) => `#edit-lines [data-path="/by_line/${line}/${f}"]`;
    assert.deepEqual(await options(field("sales", "preferred_node")), ["SELECT", "M2", [["", "choose a node"], ["M1", "M1"], ["M2", "M2"], ["M3", "M3"]]]);
    assert.deepEqual((await options(field("support", "fallback_node"))).slice(0, 2), ["SELECT", ""]);
    assert.equal((await options(field("support", "fallback_node")))[2][0][1], "none (the default node)");
    await page.select(field("sales", "preferred_node"), "M3");
    await waitText(page, '#draft-preview li[data-preview-line="sales"]', /prefers M3: next call would go to M3/);
    await page.click("#save");
    await waitText(page, "#save-result", /^Saved: revision \d+\.$/);
    assert.equal((await admin(c.edge, "/v1/policy")).body.by_line.sales.preferred_node, "M3");
    assert.deepEqual(errors, []);
  });

  test("viewing the page sends no draft previews; an edit sends one round, once", async (t) => {
    const policy = basePolicy({ byCaller: { [CALLER]: { preferred_node: "M1", expires_at: new Date(Date.now() + HOUR).toISOString() } } });
    const { c, page, errors } = await setup(t, { policy });
    const previews = [];
    page.on("request", (r) => {
      if (new URL(r.url()).pathname === "/v1/routing/preview") previews.push(r.method());
    });
    await enterToken(page, c.keys.adminToken);
    await refreshes(page, 2);
    await showTab(page, "editor");
    await refreshes(page, 1);
    await showTab(page, "guide");
    await showTab(page, "editor");
    await new Promise((resolve) => setTimeout(resolve, 1000)); // past the debounce
    assert.deepEqual(previews, [], "merely viewing sent previews");
    assert.match(await text(page, "#draft-preview"), /No edits yet/);

    // One edit: one round (2 lines, and the override alone and on each line).
    await page.select('#edit-lines [data-path="/by_line/sales/preferred_node"]', "M1");
    await waitText(page, '#draft-preview li[data-preview-line="sales"]', /prefers M1/);
    assert.equal(previews.length, 5);
    await refreshes(page, 1);
    await new Promise((resolve) => setTimeout(resolve, 1000));
    assert.equal(previews.length, 5, "a refresh previewed again");
    assert.deepEqual(errors, []);
  });
});
