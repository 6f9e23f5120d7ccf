"use strict";
// The callfence panel (SPEC §15). Every stored string reaches the page as
// text (el() appends text nodes; no markup is ever parsed from data), the
// bearer lives in `session.token` only, and the only writes are PUT
// /v1/policy (the editor), PUT /v1/nodes (the admin_drained switch) and PUT
// /v1/shards (the shard map, admin only).

const REFRESH_MS = 5000;
const PREVIEW_DEBOUNCE_MS = 400;
const MAX_PREVIEWS = 120;
const MAX_OVERRIDE_MS = 24 * 3600 * 1000;
const POLICY_SCHEMA = "riff_node_routing_policy_v1";
// What editor.preview() answers besides a number of flags: nothing may be
// sent (local problems, no preview), or the server would refuse the draft
// (the save goes on, so its 400 shows each problem at its field), or a newer
// preview superseded this one.
const BLOCKED = -1;
const INVALID_DRAFT = -2;
const STALE_PREVIEW = -3;

const REASONS = {
  not_registered: "not in the node registry",
  admin_drained: "drained by an operator",
  no_heartbeat: "no heartbeat received yet",
  heartbeat_stale: "heartbeat is stale",
  clock_skew: "node clock is more than 10 s off",
  mode_shadow: "node is in shadow mode",
  mode_drained: "node has drained itself",
  dirty: "checkout has uncommitted changes",
  sha_invalid: "reported SHA is not a full commit",
  sha_not_allowed: "SHA is not in the registry's allowed list",
  app_down: "voice app is not ready",
  capacity_exhausted: "at capacity",
  tunnel_down: "public origin probe is failing",
  origin_mismatch: "origin URL differs from the registry",
  line_not_served: "does not serve this line",
  routing_hash_mismatch: "has another number for this line",
  recent_forward_failure: "a forward to it failed in the last 30 s",
  canary_not_go: "candidate without canary go",
  candidate_not_approved: "candidate not approved as a fallback",
};
const RULES = {
  caller_override: "caller override",
  line: "line",
  default: "default node",
  claim: "claim (a leg the node dialled)",
};

// ------------------------------------------------------------ helpers ----

const $ = (id) => document.getElementById(id);

/** An element; strings among `kids` become text nodes, never markup. */
function el(tag, props, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v == null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = String(v);
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const kid of kids.flat()) {
    if (kid == null || kid === false) continue;
    e.append(kid instanceof Node ? kid : String(kid));
  }
  return e;
}

/** Replaces `node`'s children; null and false among `kids` are skipped
 * (replaceChildren itself would write them as text). */
function setKids(node, ...kids) {
  node.replaceChildren(...kids.flat().filter((k) => k != null && k !== false));
}

/** Draws `kids` into `node` as setKids would, but keeps every element
 * already drawn the same: the 5 s refresh then replaces only what changed,
 * so a switch, link or decision the user is pressing stays in the page
 * (a redraw between mousedown and mouseup would lose the click). Kept
 * elements keep their listeners, which therefore read current data. */
function patchKids(node, ...kids) {
  const fresh = document.createElement(node.tagName);
  setKids(fresh, ...kids);
  reconcile(node, fresh);
}

function reconcile(live, fresh) {
  const next = [...fresh.childNodes];
  const old = [...live.childNodes];
  next.forEach((n, i) => {
    const o = old[i];
    if (!o) live.append(n);
    else if (o.isEqualNode(n)) return;
    else if (o.nodeType === Node.ELEMENT_NODE && n.nodeType === Node.ELEMENT_NODE && o.tagName === n.tagName && sameAttributes(o, n)) reconcile(o, n);
    else o.replaceWith(n);
  });
  for (const o of old.slice(next.length)) o.remove();
}

function sameAttributes(a, b) {
  return a.attributes.length === b.attributes.length && [...a.attributes].every(({ name, value }) => b.getAttribute(name) === value);
}

const chip = (text, kind) => el("span", { class: kind ? `chip ${kind}` : "chip" }, text);

/** "1 open call", "2 open calls". */
const plural = (n, word, words = `${word}s`) => `${n} ${n === 1 ? word : words}`;

/** A phone number, node, line or call id: never broken across lines (cut
 * with an ellipsis only where it is wider than its box; whole on hover). */
const id = (text, { tag = "span", mono = false } = {}) =>
  text == null ? el("span", { class: "muted" }, "—") : el(tag, { class: mono ? "id mono" : "id", title: text }, text);
const number = (text) => id(text, { mono: true });

/** "12 s", "4 m", "1 h 58 m", "2 d 3 h". */
function span(ms) {
  const s = Math.max(0, Math.round(Math.abs(ms) / 1000));
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} m`;
  const h = Math.floor(m / 60);
  if (h < 48) return `${h} h ${m % 60} m`;
  return `${Math.floor(h / 24)} d ${h % 24} h`;
}

function relative(iso) {
  const delta = Date.parse(iso) - Date.now();
  return delta > 0 ? `in ${span(delta)}` : `${span(delta)} ago`;
}

/** A <time> showing "12 s ago" / "in 1 h 58 m", exact time on hover; the
 * tick keeps the words current. */
function when(iso, prefix = "") {
  if (!iso) return el("span", { class: "muted" }, "never");
  const exact = new Date(iso);
  const title = Number.isNaN(exact.getTime()) ? iso : `${iso} (${exact.toLocaleString()})`;
  return el("time", { datetime: iso, title, class: "rel", "data-prefix": prefix }, prefix + relative(iso));
}

function tickTimes() {
  for (const t of document.querySelectorAll("time.rel")) {
    t.textContent = t.getAttribute("data-prefix") + relative(t.getAttribute("datetime"));
  }
  document.querySelectorAll("[data-expires]").forEach((e) => {
    const at = Date.parse(e.getAttribute("data-expires"));
    e.textContent = at > Date.now() ? `time left: ${span(at - Date.now())}` : "expired";
  });
}

/** A reason code in words with the code beside it. */
const reasonEl = (code) => el("span", { class: "reason" }, REASONS[code] || code, " ", el("code", {}, code));

/** Node → reasons, as "M3 passed over: drained by an operator (admin_drained)". */
function passedOver(map) {
  const entries = Object.entries(map || {});
  if (!entries.length) return el("span", { class: "muted" }, "—");
  return el("div", {}, entries.map(([node, codes]) =>
    el("div", {}, id(node, { tag: "b" }), " passed over: ", codes.map(reasonEl))));
}

const shortSha = (sha) => (sha || "").slice(0, 12);

/** A SHA: short, the full one on hover, in a disclosure, and a copy button. */
function shaEl(sha, clean) {
  if (!sha) return el("span", { class: "muted" }, "—");
  const copy = el("button", { type: "button", class: "link small", "aria-label": `copy SHA ${sha}` }, "copy");
  copy.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(sha);
      copy.textContent = "copied";
    } catch {
      copy.textContent = "select it below";
    }
  });
  return el("div", {},
    el("code", { title: sha, class: "sha" }, shortSha(sha)), " ",
    clean === true ? chip("clean", "ok") : clean === false ? chip("dirty", "bad") : null, " ", copy,
    el("details", { class: "small" }, el("summary", {}, "full SHA"), el("code", { class: "full-sha" }, sha)));
}

// ---------------------------------------------------------------- API ----

const session = { token: null, kind: null, timer: null, tick: null };

/** A request with the bearer; answers {status, body, etag}, never throws. */
async function api(path, { method = "GET", body, headers = {} } = {}) {
  if (!session.token) return { status: 0, body: { error: "no_token" } };
  try {
    const res = await fetch(path, {
      method,
      headers: { Authorization: `Bearer ${session.token}`, ...(body ? { "Content-Type": "application/json" } : {}), ...headers },
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
    });
    const parsed = await res.json().catch(() => ({}));
    return { status: res.status, body: parsed, etag: res.headers.get("ETag") };
  } catch (e) {
    return { status: 0, body: { error: "network", detail: String(e) } };
  }
}

const describe = (r) => `${r.status || "no answer"} ${r.body?.error || ""}`.trim();

// --------------------------------------------------------------- token ----

function setMessage(text, cls = "muted") {
  $("message").className = cls;
  $("message").textContent = text;
}

async function loadToken(value) {
  session.token = value;
  const status = await api("/v1/status");
  if (status.status !== 200) {
    session.token = null;
    setMessage(status.status === 401 ? "That token was refused (401 unauthorized)." : `Could not load the status: ${describe(status)}.`, "bad");
    return;
  }
  const nodes = await api("/v1/nodes");
  session.kind = nodes.status === 403 ? "policy" : "admin";
  $("token-state").textContent = session.kind === "admin" ? "admin token loaded" : "policy token loaded";
  $("token-state").className = "chip ok";
  $("forget").classList.remove("hidden");
  $("auth").classList.add("hidden");
  $("app").classList.remove("hidden");
  setMessage("");
  view.status = status.body;
  await Promise.all([refreshPolicy(true), refreshDecisions(), refreshShards()]);
  renderStatus();
  markRefreshed();
  clearInterval(session.timer);
  session.timer = setInterval(refresh, REFRESH_MS);
}

function forget() {
  session.token = null;
  session.kind = null;
  clearInterval(session.timer);
  session.timer = null;
  Object.assign(view, { status: null, policy: null, decisions: [], shards: null });
  editor.reset(null, 0);
  for (const id of ["lines", "overrides", "nodes", "decisions", "summary", "engine-banner", "draft-preview", "edit-lines", "edit-overrides", "refreshed", "shards", "shards-result"]) $(id).replaceChildren();
  $("shards-form").classList.add("hidden");
  delete $("shards-count").dataset.revision;
  $("revision-view").classList.add("hidden");
  $("app").classList.add("hidden");
  $("forget").classList.add("hidden");
  $("auth").classList.remove("hidden");
  $("token-state").textContent = "no token";
  $("token-state").className = "chip";
  setMessage("Token forgotten. Enter a policy or admin token to see the routing.");
}

// ------------------------------------------------------------- refresh ----

const view = { status: null, policy: null, decisions: [], shards: null, refreshedAt: null, openDecisions: new Set() };

function markRefreshed(error) {
  view.refreshedAt = error ? view.refreshedAt : new Date().toISOString();
  setKids($("refreshed"), 
    error ? el("span", { class: "bad" }, `refresh failed (${error}); `) : "",
    view.refreshedAt ? when(view.refreshedAt, "refreshed ") : "");
}

async function refresh() {
  if (!session.token) return;
  const status = await api("/v1/status");
  if (!session.token) return;
  if (status.status !== 200) {
    markRefreshed(describe(status));
    return;
  }
  view.status = status.body;
  await Promise.all([refreshPolicy(false), refreshDecisions(), refreshShards()]);
  renderStatus();
  markRefreshed();
}

/** Loads the policy in force; the editor follows it only while it holds no
 * edits (`force` on token load). */
async function refreshPolicy(force) {
  const res = await api("/v1/policy");
  if (res.status === 200) view.policy = res.body;
  else if (res.status === 404) view.policy = null;
  else return;
  const revision = view.policy?.revision ?? 0;
  if (force || (!editor.dirty && revision !== editor.base)) editor.reset(view.policy, revision);
  editor.noteServer(revision);
}

// -------------------------------------------------------- routing guide ----

/** What no node serves now, in words ("2 of 3 lines have no eligible node:
 * their calls wait, then are rejected"), or null when every line (and, with
 * no lines, the default node's calls) has an eligible node. */
function unserved(s) {
  const down = s.lines.filter((l) => !l.next_call_target).length;
  if (down) {
    return `${down} of ${plural(s.lines.length, "line")} ${down === 1 ? "has" : "have"} no eligible node: their calls wait, then are rejected`;
  }
  if (!s.lines.length && s.nodes.length && !s.nodes.some((n) => n.eligible)) return "no node is eligible: every call waits, then is rejected";
  return null;
}

function renderStatus() {
  const s = view.status;
  if (!s) return;
  const banner = $("engine-banner");
  if (s.policy_revision == null || s.nodes_revision == null) {
    banner.className = "banner warn";
    banner.textContent = `Preview, not operative: ${s.nodes_revision == null ? "no node registry" : "no routing policy"} yet.`;
  } else if (!s.engine.operative) {
    banner.className = "banner warn";
    banner.textContent = "Preview, not operative: no webhook has reached this deployment yet, so where calls would go is a prediction."
      + (unserved(s) ? ` Now ${unserved(s)}.` : "");
  } else if (unserved(s)) {
    banner.className = "banner bad";
    setKids(banner, `Calls are arriving, but ${unserved(s)}. Last webhook `, when(s.engine.last_webhook_at), ".");
  } else {
    banner.className = "banner ok";
    setKids(banner, "Operative · last webhook ", when(s.engine.last_webhook_at));
  }
  const c = s.counts;
  setKids($("summary"), 
    el("span", {}, "policy revision ", el("b", {}, s.policy_revision ?? "none")),
    el("span", {}, "registry revision ", el("b", {}, s.nodes_revision ?? "none")),
    el("span", {}, "routing hash ", el("code", { title: s.routing_hash || "" }, shortSha(s.routing_hash) || "—")),
    el("span", {}, `${plural(c.open_calls, "open call")} · ${c.pending} pending · ${c.unroutable} unroutable · ${c.ignored} ignored`),
    view.policy ? el("span", {}, "other numbers prefer ", id(view.policy.default_node, { tag: "b" })) : null);
  renderLines(s);
  renderOverrides(s);
  renderNodes(s);
  renderShards(s);
}

function renderLines(s) {
  if (!s.lines.length) {
    patchKids($("lines"), el("p", { class: "muted" }, "No lines in the policy: every call prefers the default node."));
    return;
  }
  const rows = s.lines.map((l) => el("tr", { "data-line": l.line_id },
    el("td", { "data-label": "Line" }, id(l.line_id, { tag: "b" }), el("div", { class: "small" }, number(l.called_number))),
    el("td", { "data-label": "Policy" }, "prefers ", id(l.prefers, { tag: "b" })),
    el("td", { "data-label": "Next call", class: "target" }, nextCall(l)),
    el("td", { "data-label": "Configured fallback" }, l.fallback_node ? id(l.fallback_node, { tag: "b" }) : el("span", { class: "muted" }, "none (default node)")),
    el("td", { "data-label": "Why" }, l.fallback_in_use ? passedOver(l.reasons) : el("span", { class: "muted" }, "the preferred node is eligible"))));
  patchKids($("lines"), el("table", {},
    el("thead", {}, el("tr", {}, ["Line", "Policy", "Next call", "Configured fallback", "Why"].map((h) => el("th", {}, h)))),
    el("tbody", {}, rows)));
}

/** "next call goes to M1 (fallback)" for a line or one of an override's
 * next calls ({next_call_target, fallback_in_use}). */
function nextCall(n) {
  return n.next_call_target
    ? el("span", {}, "next call goes to ", id(n.next_call_target, { tag: "b" }), " ", n.fallback_in_use ? chip("fallback", "warn") : chip("preferred", "ok"))
    : el("span", { class: "bad" }, "no eligible node: calls wait, then are rejected");
}

/** Where an override's caller's next call goes: one answer when every line
 * (and every other number) agrees, else one per line. */
function overrideNextCalls(o) {
  if (o.expired) return [el("span", { class: "muted" }, "expired: the line's or the default node's routing applies"), null];
  if (!o.next_calls) return [el("span", { class: "muted" }, "not computed here (too many lines × overrides): preview it in the editor"), null];
  const key = (n) => JSON.stringify([n.next_call_target, n.reasons]);
  const all = o.next_calls;
  if (all.length && all.every((n) => key(n) === key(all[0]))) {
    const n = all[0];
    return [nextCall(n), n.fallback_in_use ? passedOver(n.reasons) : el("span", { class: "muted" }, "the preferred node is eligible")];
  }
  const to = (n) => (n.line_id == null ? "other numbers" : el("span", {}, "line ", id(n.line_id, { tag: "b" })));
  return [
    el("div", {}, all.map((n) => el("div", { "data-next-line": n.line_id ?? "" }, "to ", to(n), ": ", nextCall(n)))),
    el("div", {}, all.filter((n) => n.fallback_in_use).map((n) => el("div", {}, "to ", to(n), ": ", passedOver(n.reasons)))),
  ];
}

function renderOverrides(s) {
  if (!s.overrides.length) {
    patchKids($("overrides"), el("p", { class: "muted" }, "No caller overrides."));
    return;
  }
  const rows = s.overrides.map((o) => {
    const [next, why] = overrideNextCalls(o);
    return el("tr", { "data-caller": o.caller },
      el("td", { "data-label": "Caller" }, number(o.caller)),
      el("td", { "data-label": "Policy" }, "prefers ", id(o.prefers, { tag: "b" })),
      el("td", { "data-label": "Next call", class: "target" }, next),
      el("td", { "data-label": "Why" }, why),
      el("td", { "data-label": "Note", class: "note" }, o.note ?? el("span", { class: "muted" }, "—")),
      el("td", { "data-label": "Expires" }, o.expired ? chip("expired", "bad") : when(o.expires_at, "expires ")),
      el("td", { "data-label": "Created" }, when(o.created_at)));
  });
  patchKids($("overrides"), el("table", {},
    el("thead", {}, el("tr", {}, ["Caller", "Policy", "Next call", "Why", "Note", "Expires", "Created"].map((h) => el("th", {}, h)))),
    el("tbody", {}, rows)));
}

// ---------------------------------------------------------------- nodes ----

function renderNodes(s) {
  $("nodes-note").textContent = session.kind === "admin"
    ? "The operator drain writes the node registry by compare-and-set, after you confirm."
    : "A policy token sees the nodes' state but not the registry: draining needs an admin token.";
  patchKids($("nodes"), ...s.nodes.map((n) => {
    const never = n.heartbeat_age_s == null;
    const heartbeat = never
      ? el("span", { class: "muted" }, "no heartbeat yet")
      : n.stale
        ? el("div", {}, chip("stale", "bad"), " ", when(n.last_seen_at, "last seen "),
          n.capacity.open_calls > 0 ? el("div", { class: "bad" }, `still owns ${n.capacity.open_calls} open call${n.capacity.open_calls === 1 ? "" : "s"}`) : null)
        : when(n.last_seen_at);
    const reported = n.stale ? el("div", { class: "small" }, "as last reported") : null;
    // Beats refused for going backwards: another process signs with this
    // node's key, or its seq file was restored (docs/operations.md).
    const regressed = n.seq_regressions > 0
      ? el("div", { class: "bad small seq-regressions", title: "another signer may hold this node's key: rotate it" },
        `${n.seq_regressions} seq regression${n.seq_regressions === 1 ? "" : "s"}, last `, when(n.seq_regressed_at))
      : null;
    const drained = (n.reasons || []).includes("admin_drained");
    const sw = el("button", {
      type: "button", role: "switch", class: "switch", "aria-checked": String(drained), "data-node": n.node,
      disabled: session.kind !== "admin",
      title: session.kind === "admin" ? "drain or undrain (asks first)" : "needs an admin token",
    }, drained ? "Drained" : "Not drained");
    // The switch outlives refreshes that leave it unchanged: the dialog
    // reads the node as last refreshed.
    sw.addEventListener("click", () => askDrain(view.status.nodes.find((x) => x.node === n.node) ?? n, !drained));
    return el("tr", { class: n.stale ? "stale" : "", "data-node": n.node },
      el("td", { "data-label": "Node" }, id(n.node, { tag: "b" })),
      el("td", { "data-label": "Role · mode" }, `${n.role ?? "—"} · ${n.mode ?? "—"}`, reported),
      el("td", { "data-label": "SHA" }, shaEl(n.sha, n.clean)),
      el("td", { "data-label": "App · tunnel" }, never ? "—" : `app ${n.app_ready ? "ready" : "down"} · tunnel ${n.tunnel_up ? "up" : "down"}`),
      el("td", { "data-label": "Heartbeat" }, heartbeat, regressed),
      el("td", { "data-label": "Capacity" }, `${n.capacity.open_calls} open · ${n.capacity.active_calls ?? "—"} active · max ${n.capacity.max_calls ?? "—"}`),
      el("td", { "data-label": "Eligibility" }, n.eligible ? chip("eligible", "ok") : el("div", {}, chip("not eligible", "bad"), n.reasons.map(reasonEl))),
      el("td", { "data-label": "Operator drain" }, sw, session.kind === "admin" ? null : el("div", { class: "muted small" }, "admin token needed")));
  }));
}

/** Opens the dialog `${name}-dialog` (its title and body already set) and
 * resolves true on its Confirm, false on Cancel or Escape. */
function confirmed(name) {
  const dialog = $(`${name}-dialog`);
  return new Promise((resolve) => {
    const done = (v) => () => { dialog.close(); resolve(v); };
    $(`${name}-confirm`).onclick = done(true);
    $(`${name}-cancel`).onclick = done(false);
    dialog.oncancel = () => resolve(false);
    dialog.showModal();
  });
}

/** The admin_drained switch: reads the registry now, asks, then writes it at
 * that revision (If-Match), so a change made meanwhile is refused (412). */
async function askDrain(node, drain) {
  const result = $("drain-result");
  result.className = "small";
  result.textContent = "";
  const current = await api("/v1/nodes");
  if (current.status !== 200) {
    result.className = "small bad";
    result.textContent = current.status === 403 ? "Refused: draining a node needs an admin token (403 forbidden)." : `Could not read the registry: ${describe(current)}.`;
    return;
  }
  const registry = current.body;
  const revision = registry.revision;
  const open = node.capacity.open_calls;
  $("drain-title").textContent = `${drain ? "Drain" : "Undrain"} ${node.node}?`;
  $("drain-body").textContent = drain
    ? `${node.node} owns ${open} open call${open === 1 ? "" : "s"}; they continue. New calls will not go to ${node.node} until it is undrained. This writes registry revision ${revision + 1}.`
    : `${node.node} (${open} open call${open === 1 ? "" : "s"}) becomes eligible again once its heartbeat is healthy. This writes registry revision ${revision + 1}.`;
  if (!await confirmed("drain")) return;
  if (!registry.nodes?.[node.node]) {
    result.className = "small bad";
    result.textContent = `${node.node} is no longer in the registry.`;
    return;
  }
  delete registry.revision;
  registry.nodes[node.node].admin_drained = drain;
  const put = await api("/v1/nodes", { method: "PUT", body: registry, headers: { "If-Match": `"${revision}"` } });
  // The tables are redrawn first, so the answer shows beside what it changed.
  await refresh();
  if (put.status === 200) {
    result.className = "small ok";
    result.textContent = `${node.node} ${drain ? "drained" : "undrained"}: registry revision ${put.body.revision}.`;
  } else if (put.status === 412) {
    result.className = "small bad";
    result.textContent = `The registry changed meanwhile (now revision ${put.body.current_revision}); nothing was written. Look again and retry.`;
  } else {
    result.className = "small bad";
    result.textContent = `Not written: ${describe(put)}.`;
  }
}

// --------------------------------------------------------------- shards ----

/** The shard map and the rollback floor, as `GET /v1/health` states them
 * (admin tokens only; a policy token is answered 403). */
async function refreshShards() {
  if (session.kind !== "admin") return;
  const health = await api("/v1/health");
  const shards = health.body?.shards;
  if (health.status !== 200 || !shards) return;
  view.shards = { map: { call_shards: shards.call_shards, revision: shards.map_revision }, floor: health.body.rollback_floor, unreachable: shards.unreachable };
}

function renderShards(s) {
  const admin = session.kind === "admin";
  $("shards-form").classList.toggle("hidden", !admin || !view.shards);
  if (!admin || !view.shards) {
    patchKids($("shards"), el("span", { class: "muted" }, "The shard map needs an admin token."));
    return;
  }
  const { map, floor, unreachable } = view.shards;
  // The count follows the map only when its revision changes, so a refresh
  // never overwrites a count being typed in.
  const input = $("shards-count");
  if (input.dataset.revision !== String(map.revision)) {
    input.value = String(map.call_shards);
    input.dataset.revision = String(map.revision);
  }
  // Each shard's open calls, as status gives them (every shard the map's
  // history names; one that did not answer is named unreachable).
  const perShard = Object.entries(s.shard_open_calls ?? { 0: s.counts.open_calls })
    .sort((a, b) => Number(a[0]) - Number(b[0]))
    .map(([k, open]) => el("span", { "data-shard": k }, `${k === "0" ? "global" : `calls-${k}`} (shard ${k}): `, plural(open, "open call")));
  patchKids($("shards"),
    el("span", {}, "call shards ", el("b", {}, map.call_shards), " · map revision ", el("b", {}, map.revision)),
    ...perShard,
    el("span", {}, "rollback floor ", el("b", { title: "the oldest release this deployment can be rolled back to" }, floor ?? "unknown")),
    unreachable.length ? el("span", { class: "bad" }, `unreachable shards: ${unreachable.join(", ")}`) : null);
}

/** Changing the map: reads it now, says what the change does and does not
 * move, then writes it at that revision (If-Match). */
async function askShards(wanted) {
  const result = $("shards-result");
  result.className = "small";
  result.textContent = "";
  const current = await api("/v1/shards");
  if (current.status !== 200) {
    result.className = "small bad";
    result.textContent = `Could not read the shard map: ${describe(current)}.`;
    return;
  }
  const { revision, call_shards: now } = current.body;
  if (!Number.isInteger(wanted) || wanted < 1 || wanted > 32) {
    result.className = "small bad";
    result.textContent = "Call shards must be a whole number from 1 to 32.";
    return;
  }
  if (wanted === now) {
    result.textContent = `The map already has ${plural(now, "call shard")}; nothing to write.`;
    return;
  }
  $("shards-title").textContent = `Change the map from ${now} to ${plural(wanted, "call shard")}?`;
  $("shards-body").textContent = `New sessions are placed on ${plural(wanted, "shard")} from then on. `
    + "Nothing moves: every live session stays in the shard that holds it until it ends, and its events, fences and claims still reach it there. "
    + (wanted > 1
      ? "Once more than one shard has been in force, the Worker cannot be rolled back below v1.4 until 28 h (the longest call and the retention) after the map is back at one shard. "
      : "Sessions held by the other shards finish there, and the rollback floor stays v1.4 until 28 h (the longest call and the retention) after this change. ")
    + `This writes shard map revision ${revision + 1}.`;
  if (!await confirmed("shards")) return;
  const put = await api("/v1/shards", { method: "PUT", body: { schema: "callfence_shards_v1", call_shards: wanted }, headers: { "If-Match": `"${revision}"` } });
  await refresh();
  if (put.status === 200) {
    result.className = "small ok";
    result.textContent = `Shard map revision ${put.body.revision}: ${plural(wanted, "call shard")}.`;
  } else if (put.status === 412) {
    result.className = "small bad";
    result.textContent = `The shard map changed meanwhile (now revision ${put.body.current_revision}); nothing was written. Look again and retry.`;
  } else {
    result.className = "small bad";
    const why = put.body?.details?.map((d) => d.problem).join("; ");
    result.textContent = `Not written: ${describe(put)}${why ? `: ${why}` : ""}.`;
  }
}

// ------------------------------------------------------------ decisions ----

async function refreshDecisions() {
  const id = view.filter;
  const q = id ? `?limit=50&call_session_id=${encodeURIComponent(id)}` : "?limit=50";
  const res = await api(`/v1/decisions${q}`);
  if (res.status !== 200) return;
  view.decisions = res.body.decisions;
  renderDecisions();
}

function renderDecisions() {
  $("decisions-note").textContent = view.filter
    ? `Decisions for call ${view.filter}, newest first (${view.decisions.length}).`
    : `The latest ${view.decisions.length} decisions, newest first.`;
  if (!view.decisions.length) {
    patchKids($("decisions"), el("p", { class: "muted" }, "No decisions yet."));
    return;
  }
  patchKids($("decisions"), ...view.decisions.map((d) => {
    const fallback = d.chosen && d.prefers && d.chosen !== d.prefers;
    const details = el("details", { class: "decision", "data-decision": d.decision_id, open: view.openDecisions.has(d.decision_id) },
      el("summary", {}, when(d.at), " · ", id(d.call_session_id, { mono: true }), " · ",
        d.line_id ? el("span", {}, "line ", id(d.line_id)) : RULES[d.rule] || d.rule, " · prefers ", id(d.prefers, { tag: "b" }), " · ",
        d.chosen ? el("span", {}, "chose ", id(d.chosen, { tag: "b" })) : el("span", { class: "bad" }, "no node"), " ",
        fallback ? [chip("fallback", "warn"), " "] : null, chip(d.outcome, d.outcome === "rejected" ? "bad" : d.outcome === "pending" ? "warn" : "ok")),
      el("dl", { class: "evidence" },
        el("dt", {}, "Rule"), el("dd", {}, RULES[d.rule] || d.rule, " ", el("code", {}, d.rule)),
        el("dt", {}, "Line"), el("dd", {}, d.line_id ?? el("span", { class: "muted" }, "none")),
        el("dt", {}, "Prefers"), el("dd", {}, d.prefers ?? "—"),
        el("dt", {}, "Chosen"), el("dd", {}, d.chosen ?? "no eligible node", fallback ? ` — fallback: the preferred node ${d.prefers} was passed over` : ""),
        el("dt", {}, "Chosen SHA"), el("dd", {}, shaEl(d.chosen_sha, d.chosen_clean)),
        el("dt", {}, "Passed over"), el("dd", {}, passedOver(d.reasons)),
        el("dt", {}, "Epoch · outcome"), el("dd", {}, `${d.epoch ?? "—"} · ${d.outcome}`),
        el("dt", {}, "Call session"), el("dd", { class: "mono" }, d.call_session_id ?? "—"),
        el("dt", {}, "Event"), el("dd", { class: "mono" }, d.event_id ?? "—"),
        el("dt", {}, "Cites"), el("dd", {},
          revisionLink("policy", d.policy_revision, d), " · ", revisionLink("nodes", d.nodes_revision, d))));
    details.addEventListener("toggle", () => {
      if (details.open) view.openDecisions.add(d.decision_id);
      else view.openDecisions.delete(d.decision_id);
    });
    return details;
  }));
}

function revisionLink(kind, revision, decision) {
  if (revision == null) return el("span", { class: "muted" }, `no ${kind} revision`);
  const label = `${kind === "policy" ? "policy" : "registry"} revision ${revision}`;
  return el("a", {
    href: `#${kind}-revision-${revision}`, class: "revision-link", "data-kind": kind, "data-revision": revision,
    onclick: (e) => { e.preventDefault(); showRevision(kind, revision, decision); },
  }, label);
}

async function showRevision(kind, revision, decision) {
  const res = await api(`/v1/${kind}?revision=${revision}`);
  const name = kind === "policy" ? "Policy" : "Node registry";
  $("revision-title").textContent = `${name} revision ${revision}, cited by decision ${decision.decision_id}`;
  $("revision-doc").textContent = res.status === 200
    ? JSON.stringify(res.body, null, 2)
    : res.status === 403
      ? "The node registry needs an admin token (403 forbidden)."
      : `Not available: ${describe(res)} (only the last 50 revisions are kept).`;
  $("revision-view").classList.remove("hidden");
  $("revision-view").focus();
}

// --------------------------------------------------------------- editor ----

const pointer = (...segments) => segments.map((s) => `/${String(s).replace(/~/g, "~0").replace(/\//g, "~1")}`).join("");
let rowKeys = 0;

/** The policy editor: a form over the draft, its base revision, the
 * per-line preview, and save by compare-and-set. */
const editor = {
  base: 0,
  baseDoc: null,
  dirty: false,
  draft: { default_node: "", lines: [], overrides: [] },
  previewTimer: null,
  previewSeq: 0,
  confirmFlags: false,
  problems: [],

  /** Starts editing `doc` (or an empty policy) at `revision`. */
  reset(doc, revision) {
    this.base = revision;
    this.baseDoc = doc;
    this.dirty = false;
    this.draft = rowsOf(doc);
    this.problems = [];
    $("editor-conflict").classList.add("hidden");
    clearTimeout(this.previewTimer);
    this.previewSeq++;
    setKids($("draft-preview"), el("span", { class: "muted" }, "No edits yet: the preview runs when you change the draft (the routing guide shows the policy in force)."));
    this.render();
  },

  noteServer(revision) {
    $("editor-base").textContent = this.dirty && revision !== this.base
      ? `Editing from revision ${this.base}; revision ${revision} has been saved since. Saving will show what changed.`
      : `Editing from revision ${this.base}${this.dirty ? " (unsaved edits)" : ""}.`;
  },

  changed() {
    this.dirty = true;
    this.confirmFlags = false;
    $("save-result").textContent = "";
    this.noteServer(view.policy?.revision ?? 0);
    this.schedulePreview();
  },

  /** Draws the form; previews only follow an edit (changed()), so merely
   * viewing the page sends none. */
  render() {
    const d = this.draft;
    const def = $("default-node");
    setKids(def, nodeOptions(d.default_node, "choose a node"));
    def.value = d.default_node;
    def.onchange = () => { d.default_node = def.value; this.changed(); };
    setKids($("edit-lines"), ...(d.lines.length ? d.lines.map((row) => this.lineRow(row)) : [el("p", { class: "muted" }, "No lines.")]));
    setKids($("edit-overrides"), ...(d.overrides.length ? d.overrides.map((row) => this.overrideRow(row)) : [el("p", { class: "muted" }, "No overrides.")]));
    this.noteServer(view.policy?.revision ?? this.base);
    this.showProblems();
    tickTimes();
  },

  input(row, key, label, attrs = {}) {
    const id = `f${row.key}-${key}`;
    const input = el("input", { id, value: row[key] ?? "", spellcheck: "false", ...attrs });
    input.addEventListener("input", () => { row[key] = input.value.trim(); this.changed(); this.markPaths(); });
    return el("div", {}, el("label", { for: id }, label), input);
  },

  /** A node field: a pick from the registry's nodes (`none` names the
   * empty choice of an optional field). */
  nodePick(row, key, label, none) {
    const id = `f${row.key}-${key}`;
    const select = el("select", { id, "data-field": key }, nodeOptions(row[key] ?? "", none));
    select.value = row[key] ?? "";
    select.addEventListener("change", () => { row[key] = select.value; this.changed(); this.markPaths(); });
    return el("div", {}, el("label", { for: id }, label), select);
  },

  lineRow(row) {
    const base = () => pointer("by_line", row.line_id);
    const wrap = el("div", { class: "editor-row", "data-row": row.key });
    const fields = [
      this.input(row, "line_id", "Line id", { maxlength: 64, "data-field": "line_id" }),
      this.input(row, "called_number", "Called number (E.164)", { maxlength: 16, "data-field": "called_number", inputmode: "tel" }),
      this.nodePick(row, "preferred_node", "Preferred node", "choose a node"),
      this.nodePick(row, "fallback_node", "Fallback node (optional)", "none (the default node)"),
    ];
    const remove = el("button", { type: "button", "aria-label": `remove line ${row.line_id}` }, "Remove");
    remove.addEventListener("click", () => { this.draft.lines = this.draft.lines.filter((r) => r !== row); this.changed(); this.render(); });
    wrap.append(...fields, el("div", {}, el("label", {}, "\u00a0"), remove));
    wrap.pathOf = (field) => (field ? `${base()}/${field}` : base());
    return wrap;
  },

  overrideRow(row) {
    const base = () => pointer("by_caller", row.caller);
    const wrap = el("div", { class: "editor-row", "data-row": row.key });
    const hours = el("input", { id: `f${row.key}-hours`, type: "number", min: 0, max: 24, step: 1, value: row.hours, "aria-label": "hours", "data-field": "expires_at" });
    const minutes = el("input", { id: `f${row.key}-minutes`, type: "number", min: 0, max: 59, step: 1, value: row.minutes, "aria-label": "minutes", "data-field": "expires_at" });
    for (const [input, key] of [[hours, "hours"], [minutes, "minutes"]]) {
      input.addEventListener("input", () => { row[key] = input.value; this.changed(); this.markPaths(); });
    }
    const left = row.expires_at
      ? el("span", { class: "small muted", "data-expires": row.expires_at, title: row.expires_at })
      : el("span", { class: "small muted" }, "new: enter how long it lasts");
    const remove = el("button", { type: "button", "aria-label": `remove override ${row.caller}` }, "Remove");
    remove.addEventListener("click", () => { this.draft.overrides = this.draft.overrides.filter((r) => r !== row); this.changed(); this.render(); });
    wrap.append(
      this.input(row, "caller", "Caller (E.164)", { maxlength: 16, "data-field": "caller", inputmode: "tel" }),
      this.nodePick(row, "preferred_node", "Preferred node", "choose a node"),
      el("div", {}, el("label", { for: hours.id }, row.expires_at ? "Renew for (h, m; at most 24 h after it was created)" : "Expires in (h, m; at most 24 h)"),
        el("div", { class: "duration" }, hours, "h", minutes, "m"), left),
      this.input(row, "note", "Note", { maxlength: 200, "data-field": "note" }),
      el("div", {}, el("label", {}, "\u00a0"), remove));
    wrap.pathOf = (field) => (field === "caller" ? base() : field ? `${base()}/${field}` : base());
    return wrap;
  },

  /** Gives every field its JSON pointer, so a problem finds its field. */
  markPaths() {
    for (const wrap of document.querySelectorAll("#edit-lines .editor-row, #edit-overrides .editor-row")) {
      wrap.setAttribute("data-path", wrap.pathOf(""));
      for (const input of wrap.querySelectorAll("[data-field]")) input.setAttribute("data-path", wrap.pathOf(input.getAttribute("data-field")));
    }
  },

  /** Problems found here before anything is sent. */
  localProblems() {
    const problems = [];
    const seen = new Map();
    for (const row of this.draft.lines) {
      if (seen.has(row.line_id)) problems.push({ path: pointer("by_line", row.line_id, "line_id"), problem: "another line has this id" });
      seen.set(row.line_id, row);
    }
    const callers = new Set();
    for (const row of this.draft.overrides) {
      if (callers.has(row.caller)) problems.push({ path: pointer("by_caller", row.caller), problem: "another override has this caller" });
      callers.add(row.caller);
      const ms = durationOf(row);
      if (ms === "bad") problems.push({ path: pointer("by_caller", row.caller, "expires_at"), problem: "enter whole hours (0 to 24) and minutes (0 to 59)" });
      else if (ms != null && ms > MAX_OVERRIDE_MS) problems.push({ path: pointer("by_caller", row.caller, "expires_at"), problem: "an override lasts at most 24 h" });
      else if (ms === 0) problems.push({ path: pointer("by_caller", row.caller, "expires_at"), problem: "enter a duration longer than 0" });
      else if (ms == null && !row.expires_at) problems.push({ path: pointer("by_caller", row.caller, "expires_at"), problem: "enter how long the override lasts (at most 24 h)" });
    }
    return problems;
  },

  /** Shows each problem at its field (or the nearest enclosing one). */
  showProblems(problems = this.problems) {
    this.problems = problems;
    this.markPaths();
    for (const e of document.querySelectorAll("#editor .err-msg")) e.remove();
    for (const e of document.querySelectorAll("#editor [aria-invalid]")) e.removeAttribute("aria-invalid");
    const box = $("editor-problems");
    setKids(box, );
    if (!problems.length) return;
    const targets = [...document.querySelectorAll("#editor [data-path]")];
    box.append(el("b", {}, `${problems.length} problem${problems.length === 1 ? "" : "s"}:`),
      el("ul", {}, problems.map((p) => el("li", {}, el("code", {}, p.path || "/"), " ", p.problem))));
    for (const p of problems) {
      let target = null;
      for (let path = p.path; !target; path = path.slice(0, Math.max(0, path.lastIndexOf("/")))) {
        target = targets.find((t) => t.getAttribute("data-path") === path) || null;
        if (!path) break;
      }
      if (!target) continue;
      target.setAttribute("aria-invalid", "true");
      const msg = el("span", { class: "err-msg", "data-problem-path": p.path }, p.problem);
      if (target.tagName === "INPUT" || target.tagName === "SELECT") (target.closest(".duration") || target).after(msg);
      else target.append(msg);
    }
  },

  schedulePreview() {
    clearTimeout(this.previewTimer);
    if (!session.token) return;
    this.previewTimer = setTimeout(() => this.preview(), PREVIEW_DEBOUNCE_MS);
  },

  /** Previews every line, and every override on every line, under the
   * draft (POST /v1/routing/preview with a one-line draft each, so each
   * stays within the preview's 4 KiB). Answers the number of flags, or
   * BLOCKED, INVALID_DRAFT or STALE_PREVIEW. */
  async preview() {
    const seq = ++this.previewSeq;
    const doc = docOf(this.draft);
    const box = $("draft-preview");
    const local = this.localProblems();
    if (local.length) {
      this.showProblems(local);
      setKids(box, el("span", { class: "bad" }, "Fix the problems above to preview."));
      return BLOCKED;
    }
    const part = (lineId, caller) => ({
      schema: POLICY_SCHEMA,
      default_node: doc.default_node,
      by_line: lineId == null ? {} : { [lineId]: doc.by_line[lineId] },
      by_caller: caller == null ? {} : { [caller]: doc.by_caller[caller] },
    });
    const jobs = [];
    for (const id of Object.keys(doc.by_line)) jobs.push({ line: id, body: { to: doc.by_line[id].called_number, policy: part(id, null) } });
    for (const caller of Object.keys(doc.by_caller)) {
      jobs.push({ caller, body: { from: caller, policy: part(null, caller) } });
      for (const id of Object.keys(doc.by_line)) jobs.push({ caller, line: id, body: { from: caller, to: doc.by_line[id].called_number, policy: part(id, caller) } });
    }
    const limited = jobs.length > MAX_PREVIEWS;
    const answers = await Promise.all(jobs.slice(0, MAX_PREVIEWS).map((job) => api("/v1/routing/preview", { method: "POST", body: job.body }).then((r) => ({ ...job, r }))));
    if (seq !== this.previewSeq) return STALE_PREVIEW;
    const problems = [];
    const seen = new Set();
    for (const a of answers) {
      for (const p of a.r.body?.draft_problems || []) {
        const k = `${p.path}\n${p.problem}`;
        if (!seen.has(k)) { seen.add(k); problems.push(p); }
      }
    }
    this.showProblems(problems);
    const failed = answers.find((a) => a.r.status !== 200);
    if (failed) {
      setKids(box, el("span", { class: "bad" }, `Preview unavailable: ${describe(failed.r)}.`));
      return BLOCKED;
    }
    if (problems.length) {
      setKids(box, el("span", { class: "bad" }, "The draft has problems (shown at their fields); saving would be refused."));
      return INVALID_DRAFT;
    }
    // What is counted: lines, and overrides, that would not reach their
    // preferred node (an override once, however many lines it misses).
    let lineFlags = 0;
    let overrideFlags = 0;
    const missed = new Set();
    const lineItems = answers.filter((a) => a.caller == null).map((a) => {
      const p = a.r.body;
      const flagged = p.chosen !== p.prefers;
      if (flagged) { lineFlags += 1; missed.add(p.prefers); }
      return el("li", { class: flagged ? "flag" : "", "data-preview-line": a.line },
        id(a.line, { tag: "b" }), " (", number(doc.by_line[a.line].called_number), ") prefers ", id(p.prefers, { tag: "b" }), ": next call would go to ",
        p.chosen ? id(p.chosen, { tag: "b" }) : el("b", {}, "no eligible node"), flagged ? el("div", { class: "warn" }, "⚠ ", passedOver(p.reasons)) : " ✓");
    });
    const byCaller = new Map();
    for (const a of answers.filter((x) => x.caller != null)) {
      if (!byCaller.has(a.caller)) byCaller.set(a.caller, []);
      byCaller.get(a.caller).push(a);
    }
    const overrideItems = [...byCaller].map(([caller, list]) => {
      const bad = list.filter((a) => a.r.body.chosen !== a.r.body.prefers);
      const prefers = list[0].r.body.prefers;
      if (bad.length) { overrideFlags += 1; missed.add(prefers); }
      return el("li", { class: bad.length ? "flag" : "", "data-preview-caller": caller },
        "calls from ", number(caller), " prefer ", id(prefers, { tag: "b" }),
        bad.length
          ? el("div", { class: "warn" }, bad.map((a) => el("div", {}, "⚠ ", a.line ? `to line ${a.line}` : "to other numbers", " they would go to ",
            el("b", {}, a.r.body.chosen ?? "no eligible node"), ": ", passedOver(a.r.body.reasons))))
          : ` and would go to ${prefers} on every line ✓`);
    });
    const flags = lineFlags + overrideFlags;
    const counted = [lineFlags && plural(lineFlags, "line"), overrideFlags && plural(overrideFlags, "override")].filter(Boolean).join(" and ");
    setKids(box,
      flags
        ? el("p", { class: "warn", id: "preview-flags" }, `⚠ Under this draft ${counted} would not reach ${flags === 1 ? "its preferred node" : "their preferred nodes"}: `,
          [...missed].sort().flatMap((n, i) => [i ? ", " : "", id(n, { tag: "b" })]), ` would be passed over.`)
        : el("p", { class: "ok", id: "preview-flags" }, "Every line and override would reach its preferred node."),
      lineItems.length ? el("ul", {}, lineItems) : el("p", { class: "muted" }, "No lines."),
      overrideItems.length ? el("ul", {}, overrideItems) : null,
      limited ? el("p", { class: "muted small" }, `Only the first ${MAX_PREVIEWS} previews were run.`) : null);
    return flags;
  },

  /** Save: preview first; a draft whose preferred nodes would be passed over
   * asks for a second click; then PUT with If-Match at the base revision. */
  async save() {
    const result = $("save-result");
    result.className = "";
    result.textContent = "Checking the draft…";
    clearTimeout(this.previewTimer);
    let flags;
    do flags = await this.preview(); while (flags === STALE_PREVIEW);
    if (flags === BLOCKED) {
      result.className = "bad";
      result.textContent = this.localProblems().length ? "Not saved: fix the problems above." : "Not saved: the preview is unavailable.";
      return;
    }
    if (flags > 0 && !this.confirmFlags) {
      this.confirmFlags = true;
      result.className = "warn";
      result.textContent = "Not saved yet: the preview flags passed-over nodes. Press Save again to save anyway.";
      return;
    }
    this.confirmFlags = false;
    const doc = docOf(this.draft);
    const put = await api("/v1/policy", { method: "PUT", body: doc, headers: { "If-Match": `"${this.base}"` } });
    if (put.status === 200) {
      await refresh();
      const current = await api("/v1/policy");
      this.reset(current.status === 200 ? current.body : null, current.status === 200 ? current.body.revision : put.body.revision);
      result.className = "ok";
      result.textContent = `Saved: revision ${put.body.revision}.`;
    } else if (put.status === 412) {
      result.className = "bad";
      result.textContent = `Not saved: revision ${put.body.current_revision} was saved meanwhile.`;
      await this.conflict(put.body.current_revision);
    } else if (put.status === 400 && put.body.error === "invalid_document") {
      this.showProblems(put.body.details || []);
      result.className = "bad";
      result.textContent = "Not saved: the policy has problems (shown at their fields).";
    } else {
      result.className = "bad";
      result.textContent = `Not saved: ${describe(put)}.`;
    }
  },

  /** A 412: shows what changed between the base and the current revision,
   * and offers to reapply the edits on top of the current one. */
  async conflict(revision) {
    const [current, base] = await Promise.all([api("/v1/policy"), this.base ? api(`/v1/policy?revision=${this.base}`) : Promise.resolve({ status: 404, body: null })]);
    if (current.status !== 200) return;
    const theirs = current.body;
    const baseDoc = base.status === 200 ? base.body : this.baseDoc;
    const changes = diffPolicies(baseDoc, theirs);
    const box = $("editor-conflict");
    const reapply = el("button", { type: "button", class: "primary", id: "reapply" }, `Reapply my edits on revision ${theirs.revision}`);
    reapply.addEventListener("click", () => {
      const merged = mergeDrafts(this.draft, baseDoc, theirs);
      this.base = theirs.revision;
      this.baseDoc = theirs;
      this.draft = merged.draft;
      this.dirty = true;
      setKids(box, el("p", {}, `Your edits are now on revision ${theirs.revision}`,
        merged.both.length ? ` (both of you changed ${merged.both.join(", ")}: your version is kept)` : "", ". Check the preview, then save."));
      this.render();
      this.schedulePreview();
      $("save-result").textContent = "";
    });
    setKids(box, 
      el("p", {}, el("b", {}, `Revision ${theirs.revision} was saved since you started from revision ${this.base}.`), " What changed meanwhile:"),
      el("ul", {}, changes.length ? changes.map((c) => el("li", {}, c)) : [el("li", {}, "nothing you can see in the form")]),
      reapply);
    box.classList.remove("hidden");
  },
};

/** The registry's nodes as <option>s, `current` selected; a current value
 * the registry lacks stays shown (and is refused on save as before). */
function nodeOptions(current, none) {
  const nodes = (view.status?.nodes ?? []).map((n) => n.node);
  return [
    el("option", { value: "" }, none),
    ...nodes.map((n) => el("option", { value: n }, n)),
    current && !nodes.includes(current) ? el("option", { value: current }, `${current} (not in the registry)`) : null,
  ];
}

/** The form's rows for a policy document (or an empty draft). */
function rowsOf(doc) {
  return {
    default_node: doc?.default_node ?? "",
    lines: Object.entries(doc?.by_line ?? {}).map(([id, l]) => lineRowOf(id, l)),
    overrides: Object.entries(doc?.by_caller ?? {}).map(([caller, o]) => overrideRowOf(caller, o)),
  };
}
const lineRowOf = (id, l) => ({ key: ++rowKeys, line_id: id, called_number: l.called_number, preferred_node: l.preferred_node, fallback_node: l.fallback_node ?? "" });
const overrideRowOf = (caller, o) => ({ key: ++rowKeys, caller, preferred_node: o.preferred_node, note: o.note ?? "", expires_at: o.expires_at, hours: "", minutes: "" });

/** The duration typed for an override, in ms: null when none, "bad" when
 * not whole hours and minutes. */
function durationOf(row) {
  if (row.hours === "" && row.minutes === "") return null;
  const h = row.hours === "" ? 0 : Number(row.hours);
  const m = row.minutes === "" ? 0 : Number(row.minutes);
  if (!Number.isInteger(h) || !Number.isInteger(m) || h < 0 || m < 0 || m > 59) return "bad";
  return (h * 60 + m) * 60 * 1000;
}

const lineOf = (row) => ({ called_number: row.called_number, preferred_node: row.preferred_node, ...(row.fallback_node ? { fallback_node: row.fallback_node } : {}) });
function overrideOf(row) {
  const ms = durationOf(row);
  const expires = typeof ms === "number" ? new Date(Date.now() + ms).toISOString() : row.expires_at;
  return { preferred_node: row.preferred_node, ...(expires ? { expires_at: expires } : {}), ...(row.note ? { note: row.note } : {}) };
}

/** The policy document the form describes. */
function docOf(draft) {
  const doc = { schema: POLICY_SCHEMA, default_node: draft.default_node, by_line: {}, by_caller: {} };
  for (const row of draft.lines) doc.by_line[row.line_id] = lineOf(row);
  for (const row of draft.overrides) doc.by_caller[row.caller] = overrideOf(row);
  return doc;
}

const sameLine = (a, b) => JSON.stringify(a && lineOf({ fallback_node: "", ...a })) === JSON.stringify(b && lineOf({ fallback_node: "", ...b }));
const sameOverride = (a, b) => (!a && !b) || (a && b && a.preferred_node === b.preferred_node && (a.note ?? "") === (b.note ?? "") && a.expires_at === b.expires_at);

/** What changed from `a` to `b`, in words. */
function diffPolicies(a, b) {
  const out = [];
  if ((a?.default_node ?? "") !== b.default_node) out.push(`default node: ${a?.default_node ?? "none"} → ${b.default_node}`);
  const lines = new Set([...Object.keys(a?.by_line ?? {}), ...Object.keys(b.by_line)]);
  for (const id of [...lines].sort()) {
    const x = a?.by_line?.[id];
    const y = b.by_line[id];
    if (!x) out.push(`line ${id} added: ${y.called_number} prefers ${y.preferred_node}`);
    else if (!y) out.push(`line ${id} removed`);
    else if (!sameLine(x, y)) {
      out.push(`line ${id} changed: ${x.called_number} prefers ${x.preferred_node}${x.fallback_node ? `, fallback ${x.fallback_node}` : ""} → ${y.called_number} prefers ${y.preferred_node}${y.fallback_node ? `, fallback ${y.fallback_node}` : ""}`);
    }
  }
  const callers = new Set([...Object.keys(a?.by_caller ?? {}), ...Object.keys(b.by_caller)]);
  for (const c of [...callers].sort()) {
    const x = a?.by_caller?.[c];
    const y = b.by_caller[c];
    if (!x) out.push(`override for ${c} added: prefers ${y.preferred_node}`);
    else if (!y) out.push(`override for ${c} removed (or expired)`);
    else if (!sameOverride(x, y)) out.push(`override for ${c} changed: prefers ${x.preferred_node} → ${y.preferred_node}`);
  }
  return out;
}

/** Three-way merge of the form over `base` onto `theirs`: an entry the
 * editor changed keeps the editor's version; every other entry follows
 * `theirs`. `both` names the entries both sides changed. */
function mergeDrafts(draft, base, theirs) {
  const lines = mergeEntries({
    mine: new Map(draft.lines.map((r) => [r.line_id, r])), base: base?.by_line, theirs: theirs.by_line,
    same: sameLine, docOf: lineOf, rowOf: lineRowOf, label: (id) => `line ${id}`, keep: (mine) => mine,
  });
  const overrides = mergeEntries({
    mine: new Map(draft.overrides.map((r) => [r.caller, r])), base: base?.by_caller, theirs: theirs.by_caller,
    same: sameOverride, docOf: overrideOf, rowOf: overrideRowOf, label: (c) => `the override for ${c}`,
    // An override whose expiry was not retyped keeps the one in force.
    keep: (mine, t) => (t && !durationOf(mine) ? { ...mine, expires_at: t.expires_at } : mine),
  });
  const both = [...lines.both, ...overrides.both];
  let defaultNode = theirs.default_node;
  if (draft.default_node !== (base?.default_node ?? "")) {
    if ((base?.default_node ?? "") !== theirs.default_node) both.push("the default node");
    defaultNode = draft.default_node;
  }
  return { draft: { default_node: defaultNode, lines: lines.rows, overrides: overrides.rows }, both };
}

/** One side of mergeDrafts: the form's rows `mine` (by key) over the
 * entries `base`, onto `theirs`. */
function mergeEntries({ mine, base, theirs, same, docOf, rowOf, label, keep }) {
  const rows = [];
  const both = [];
  for (const key of new Set([...mine.keys(), ...Object.keys(base ?? {}), ...Object.keys(theirs)])) {
    const m = mine.get(key);
    const b = base?.[key];
    const t = theirs[key];
    if (!same(m && docOf(m), b)) {
      if (!same(b, t)) both.push(label(key));
      if (m) rows.push(keep(m, t));
    } else if (t) rows.push(rowOf(key, t));
  }
  return { rows, both };
}

// ---------------------------------------------------------------- wiring ----

function selectTab(tab) {
  for (const t of document.querySelectorAll('[role="tab"]')) {
    const on = t === tab;
    t.setAttribute("aria-selected", String(on));
    t.tabIndex = on ? 0 : -1;
    $(t.getAttribute("aria-controls")).classList.toggle("hidden", !on);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("auth").addEventListener("submit", (e) => {
    e.preventDefault();
    const value = $("token").value.trim();
    $("token").value = "";
    if (value) loadToken(value);
  });
  $("forget").addEventListener("click", forget);
  const tabs = [...document.querySelectorAll('[role="tab"]')];
  tabs.forEach((tab, i) => {
    tab.addEventListener("click", () => selectTab(tab));
    tab.addEventListener("keydown", (e) => {
      const step = { ArrowRight: 1, ArrowLeft: -1 }[e.key];
      if (!step) return;
      const next = tabs[(i + step + tabs.length) % tabs.length];
      selectTab(next);
      next.focus();
    });
  });
  $("filter").addEventListener("submit", (e) => {
    e.preventDefault();
    view.filter = $("filter-session").value.trim() || null;
    refreshDecisions();
  });
  $("filter-clear").addEventListener("click", () => {
    $("filter-session").value = "";
    view.filter = null;
    refreshDecisions();
  });
  $("revision-close").addEventListener("click", () => $("revision-view").classList.add("hidden"));
  $("editor").addEventListener("submit", (e) => { e.preventDefault(); editor.save(); });
  $("shards-form").addEventListener("submit", (e) => { e.preventDefault(); askShards(Number($("shards-count").value)); });
  $("add-line").addEventListener("click", () => {
    editor.draft.lines.push({ key: ++rowKeys, line_id: "", called_number: "", preferred_node: "", fallback_node: "" });
    editor.changed();
    editor.render();
    document.querySelector("#edit-lines .editor-row:last-child input")?.focus();
  });
  $("add-override").addEventListener("click", () => {
    editor.draft.overrides.push({ key: ++rowKeys, caller: "", preferred_node: "", note: "", expires_at: null, hours: "", minutes: "" });
    editor.changed();
    editor.render();
    document.querySelector("#edit-overrides .editor-row:last-child input")?.focus();
  });
  $("discard").addEventListener("click", () => editor.reset(view.policy, view.policy?.revision ?? 0));
  session.tick = setInterval(tickTimes, 1000);
});
