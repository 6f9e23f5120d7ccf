// `make demo-call`: sends one signed Telnyx `call.initiated` (an incoming call
// to +15102160079 from a random number) to the running `make dev`
// dispatcher, then shows where the call went and why: the webhook's answer,
// the routing decision (GET /v1/decisions?call_session_id=...), the call
// (GET /v1/calls/{id}) and the answer command the demo app sent through its
// agent to the fake Telnyx API.
//
// At the end it hangs the call up (a signed call.hangup), so demo calls do
// not use up the nodes' capacity; --keep leaves the call open.
//
//   node scripts/demo-call.mjs [--to +E164] [--from +E164] [--keep]

import { randomInt, randomUUID, sign } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { keyFromSeed, paths } from "./dev.mjs";

const { values: args } = parseArgs({
  options: {
    to: { type: "string", default: "+15102160079" },
    from: { type: "string" },
    keep: { type: "boolean", default: false },
  },
});

function fail(message) {
  process.stderr.write(`demo-call: ${message}\n`);
  process.exit(1);
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const show = (value) => JSON.stringify(value, null, 2).replace(/^/gm, "    ");

if (!existsSync(paths.info)) fail(`no ${paths.info}: start \`make dev\` first`);
const info = JSON.parse(readFileSync(paths.info, "utf8"));
const admin = { authorization: `Bearer ${readFileSync(info.admin_token_file, "utf8").trim()}` };
const telnyxKey = keyFromSeed(Buffer.from(readFileSync(info.telnyx_seed_file, "utf8").trim(), "base64"));

async function get(url, headers = admin) {
  const r = await fetch(url, { headers });
  const text = await r.text();
  try {
    return { status: r.status, body: JSON.parse(text) };
  } catch {
    return { status: r.status, body: text };
  }
}

try {
  await fetch(`${info.dispatcher}/healthz`);
} catch {
  fail(`the dispatcher at ${info.dispatcher} does not answer: start \`make dev\` first`);
}

const from = args.from ?? `+1415555${String(randomInt(0, 10000)).padStart(4, "0")}`;
const session = randomUUID();
const ccid = `v3:demo-${randomUUID()}`;
const event = {
  data: {
    record_type: "event",
    event_type: "call.initiated",
    id: randomUUID(),
    occurred_at: new Date().toISOString(),
    payload: {
      call_control_id: ccid,
      call_leg_id: randomUUID(),
      call_session_id: session,
      connection_id: "dev-connection",
      from,
      to: args.to,
      direction: "incoming",
      state: "parked",
      client_state: null,
    },
  },
  meta: { attempt: 1, delivered_to: `${info.dispatcher}/v1/telnyx/webhook` },
};
/** POSTs `event` to the webhook, signed as Telnyx signs. */
function sendWebhook(event) {
  const body = JSON.stringify(event);
  const timestamp = Math.floor(Date.now() / 1000);
  const signature = sign(null, Buffer.from(`${timestamp}|${body}`), telnyxKey).toString("base64");
  return fetch(`${info.dispatcher}/v1/telnyx/webhook`, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      "telnyx-signature-ed25519": signature,
      "telnyx-timestamp": String(timestamp),
    },
    body,
  });
}

console.log(`call.initiated  ${from} -> ${args.to}`);
console.log(`  call_session_id ${session}`);
console.log(`  call_control_id ${ccid}\n`);

const started = Date.now();
const webhook = await sendWebhook(event);
const answerText = await webhook.text();
console.log(`1. webhook answer: ${webhook.status} in ${Date.now() - started} ms`);
console.log(`    ${answerText}\n`);

const decisions = await get(`${info.dispatcher}/v1/decisions?call_session_id=${encodeURIComponent(session)}`);
console.log(`2. GET /v1/decisions?call_session_id=...: ${decisions.status}`);
for (const d of [...(decisions.body.decisions ?? [])].reverse()) {
  const passed = Object.entries(d.reasons ?? {})
    .map(([node, codes]) => `${node}: ${codes.join(", ")}`)
    .join("; ");
  console.log(
    `    ${d.outcome}: rule ${d.rule}${d.line_id ? ` (line ${d.line_id})` : ""}, prefers ${d.prefers}, ` +
      `chosen ${d.chosen ?? "nobody"} at epoch ${d.epoch ?? "-"}` +
      `${d.chosen_sha ? ` running ${d.chosen_sha.slice(0, 12)}${d.chosen_clean ? " (clean)" : " (dirty)"}` : ""}` +
      `; policy r${d.policy_revision}, registry r${d.nodes_revision}` +
      `${passed ? `; passed over: ${passed}` : ""}`,
  );
}
console.log(show(decisions.body));

// The demo app answers through its agent (fence, then Telnyx) right after
// the webhook: wait a little for the command to reach the fake Telnyx API.
let commands = [];
for (let i = 0; i < 50 && commands.length === 0; i++) {
  const r = await get(`${info.fake_telnyx}/__record?call_control_id=${encodeURIComponent(ccid)}`, {});
  commands = r.body.commands ?? [];
  if (commands.length === 0) await sleep(100);
}
console.log(`\n3. fake Telnyx (${info.fake_telnyx}) received:`);
if (commands.length === 0) {
  console.log("    no command for this call (the app did not answer; see the node's logs in " + `${info.logs})`);
}
for (const c of commands) {
  console.log(`    ${c.action} ${c.call_control_id} command_id=${c.command_id} at ${c.at}`);
}

const call = await get(`${info.dispatcher}/v1/calls/${encodeURIComponent(session)}`);
console.log(`\n4. GET /v1/calls/{call_session_id}: ${call.status}`);
if (call.status === 200) {
  const c = call.body;
  console.log(
    `    owner ${c.owner} at epoch ${c.epoch}, state ${c.state}, ` +
      `${c.fence ? `fence granted at ${c.fence.granted_at} with command_id ${c.fence.command_id}` : "no fence granted"}`,
  );
}
console.log(show(call.body));

if (!args.keep) {
  const hangup = await sendWebhook({
    data: {
      record_type: "event",
      event_type: "call.hangup",
      id: randomUUID(),
      occurred_at: new Date().toISOString(),
      payload: {
        call_control_id: ccid,
        call_session_id: session,
        connection_id: "dev-connection",
        from,
        to: args.to,
        direction: "incoming",
        hangup_cause: "normal_clearing",
      },
    },
    meta: { attempt: 1 },
  });
  const after = await get(`${info.dispatcher}/v1/calls/${encodeURIComponent(session)}`);
  console.log(
    `\n5. call.hangup: ${hangup.status} ${await hangup.text()}; the call is now ${after.body.state ?? after.status}` +
      " (--keep leaves it open)",
  );
}

const answered = commands.some((c) => c.action === "answer");
process.exit(webhook.status === 200 && answered ? 0 : 2);
