// `make observe`: a local Prometheus (Debian's, installed by scripts/setup.sh)
// scraping the running `make dev` stack, the edge with its metrics token and
// each demo node's agent on its metrics listener, every 5 s, with the shipped
// alerting rules (ops/prometheus/rules.yml). It prints Prometheus's URL and
// how to see an alert fire; Ctrl-C stops it.
//
// It reads what `make dev` wrote in the dev directory (dev.json) and keeps
// Prometheus's configuration and storage in <dev>/prometheus.
// Environment: CALLFENCE_OBSERVE_PORT (Prometheus's port, default 9090),
// CALLFENCE_DEV_DIR (as for `make dev`).

import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { DEV, paths } from "./dev.mjs";
import { startPrometheus } from "./prometheus.mjs";

const PORT = Number(process.env.CALLFENCE_OBSERVE_PORT || 9090);
const AGENT = join(process.env.CALLFENCE_AGENT_BIN_DIR || "target/debug", "callfence-agent");

async function main() {
  if (!existsSync(paths.info)) throw new Error(`${paths.info} is missing: start \`make dev\` first (in another terminal)`);
  const info = JSON.parse(readFileSync(paths.info, "utf8"));
  if (!info.metrics || !Object.values(info.nodes).every((n) => n.metrics)) {
    throw new Error(`${paths.info} names no metrics URLs: restart \`make dev\` with this checkout`);
  }
  const prom = await startPrometheus({
    dir: join(DEV, "prometheus"),
    edge: { url: info.dispatcher, tokenFile: info.metrics_token_file },
    agents: Object.entries(info.nodes).map(([node, n]) => ({ node, url: n.metrics })),
    scrapeInterval: "5s",
    port: PORT,
  });
  const stop = async () => {
    await prom.close();
    process.exit(0);
  };
  process.once("SIGINT", stop);
  process.once("SIGTERM", stop);
  const drained = Object.keys(info.nodes)[1] ?? Object.keys(info.nodes)[0];
  process.stdout.write(`
Prometheus is scraping the dev stack with the shipped rules. Ctrl-C stops it.

  Prometheus   ${prom.url}            (config ${prom.config})
  targets      ${prom.url}/targets
  alerts       ${prom.url}/alerts
  rules        ops/prometheus/rules.yml (what each alert means: docs/operations.md, "Observe it")

  see a drain alert fire:
    ${AGENT} --config ${info.nodes[drained].config} mode set drained
    CallfenceNodeIneligible for ${drained} is pending at once and firing after 2 minutes
    (with its reason mode_drained); \`mode set active\` clears it.

`);
  prom.child.once("exit", (code) => {
    process.stderr.write(`observe: prometheus exited (${code}):\n${prom.logs.join("\n")}\n`);
    process.exit(1);
  });
}

main().catch((e) => {
  process.stderr.write(`observe: ${e.message}\n`);
  process.exit(1);
});
