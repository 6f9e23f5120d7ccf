// Browser-test harness: the panel served by the built Worker in Miniflare
// (tests/e2e/harness.mjs, fixtures.mjs) and opened in the distribution's
// headless Chromium, driven by puppeteer-core (which never downloads a
// browser: it is pointed at /usr/bin/chromium, or $CHROMIUM_BIN).
//
//   launch()                        one browser per test file
//   browserSuite()                  launches one in before(), closes it in
//                                   after(); answers open(t, c, opts): a
//                                   panel page on cluster c, closed (with c)
//                                   when test t ends
//   openPanel(browser, edge, opts)  a fresh incognito page on the panel:
//                                   {page, errors, close()} (errors: page
//                                   errors and console errors); opts.width,
//                                   opts.height, opts.scheme ("dark"|"light")
//   enterToken(page, token)         types the token and waits for the views
//   showTab(page, name)             "guide" | "nodes" | "decisions" | "editor"
//   waitText(page, selector, re)    until the element's text matches
//   press(page, selector)           clicks an element of a view the panel
//                                   redraws every 5 s (see press)
//   refreshed(page)                 the datetime of the last refresh
//   shoot(page, name, {fullPage})   .screenshots/<name>.png (full page by default)
//   noHorizontalScroll(page)        asserts the page is no wider than the window

import assert from "node:assert/strict";
import { existsSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import puppeteer from "puppeteer-core";
import { after, before } from "node:test";
import { ROOT } from "../e2e/harness.mjs";

export const CHROMIUM = process.env.CHROMIUM_BIN || "/usr/bin/chromium";
export const SCREENSHOTS = join(ROOT, ".screenshots");
const TIMEOUT = 20_000;

export async function launch() {
  if (!existsSync(CHROMIUM)) {
    throw new Error(`${CHROMIUM} is missing: run scripts/setup.sh (it installs Debian's chromium)`);
  }
  return puppeteer.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check", "--disable-extensions"],
  });
}

export function browserSuite() {
  let browser;
  before(async () => {
    browser = await launch();
  });
  after(() => browser?.close());
  return {
    async open(t, c, pageOptions) {
      const panel = await openPanel(browser, c.edge, pageOptions);
      t.after(async () => {
        await panel.close();
        await c.dispose();
      });
      return { c, ...panel };
    },
    openPanel: (edge, pageOptions) => openPanel(browser, edge, pageOptions),
  };
}

export async function openPanel(browser, edge, { width = 1280, height = 900, scheme = "light" } = {}) {
  const context = await browser.createBrowserContext();
  const page = await context.newPage();
  page.setDefaultTimeout(TIMEOUT);
  const errors = [];
  page.on("pageerror", (e) => errors.push(`pageerror: ${e.message}`));
  page.on("console", (m) => {
    // A 4xx the page asked for is logged by Chromium; the tests assert those
    // answers themselves. Anything else (a script error, a CSP refusal) counts.
    if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) errors.push(`console: ${m.text()}`);
  });
  await page.setViewport({ width, height });
  await page.emulateMediaFeatures([{ name: "prefers-color-scheme", value: scheme }]);
  const res = await page.goto(edge.url, { waitUntil: "domcontentloaded" });
  assert.equal(res.status(), 200);
  return { page, errors, close: () => context.close() };
}

export async function enterToken(page, token) {
  await page.type("#token", token);
  await page.click("#auth button[type=submit]");
  await page.waitForSelector("#app:not(.hidden)");
  await page.waitForFunction(() => document.querySelector("#refreshed time"));
}

export async function showTab(page, name) {
  await page.click(`#tab-${name}`);
  await page.waitForSelector(`#view-${name}:not(.hidden)`);
}

export async function waitText(page, selector, re, timeout = TIMEOUT) {
  try {
    await page.waitForFunction(
      (sel, source, flags) => {
        const e = document.querySelector(sel);
        return e && new RegExp(source, flags).test(e.textContent);
      },
      { timeout, polling: 100 },
      selector,
      re.source,
      re.flags,
    );
  } catch (error) {
    const text = await page.$eval(selector, (e) => e.textContent).catch(() => "(no such element)");
    throw new Error(`${selector} never matched ${re}: ${text.slice(0, 600)}`, { cause: error });
  }
  return page.$eval(selector, (e) => e.textContent);
}

/** Clicks `selector` inside a view the panel refreshes every 5 s (nodes,
 * decisions). The refresh keeps an element that did not change, but one
 * whose data changed is replaced: if that happens between puppeteer's
 * lookup and its click, puppeteer throws before any mouse event is sent,
 * and the click is made again on the element that replaced it. */
export async function press(page, selector) {
  for (let attempt = 1; ; attempt++) {
    try {
      await page.click(selector);
      return;
    } catch (error) {
      if (attempt >= 5 || !/detached|not clickable/i.test(String(error?.message))) throw error;
      await page.waitForSelector(selector);
    }
  }
}

export const text = (page, selector) => page.$eval(selector, (e) => e.textContent);

export const refreshed = (page) => page.$eval("#refreshed time", (t) => t.getAttribute("datetime"));

export async function shoot(page, name, { fullPage = true } = {}) {
  mkdirSync(SCREENSHOTS, { recursive: true });
  await page.screenshot({ path: join(SCREENSHOTS, `${name}.png`), fullPage });
}

export async function noHorizontalScroll(page) {
  const { scroll, inner } = await page.evaluate(() => ({
    scroll: Math.max(document.documentElement.scrollWidth, document.body.scrollWidth),
    inner: window.innerWidth,
  }));
  assert.ok(scroll <= inner, `the page is ${scroll} px wide in a ${inner} px window`);
}
