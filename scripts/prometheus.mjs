// A real Prometheus (Debian's /usr/bin/prometheus, installed by
// scripts/setup.sh) scraping a callfence edge and its agents with the
// shipped rules (ops/prometheus/rules.yml): what `make observe` runs
// against `make dev` and what tests/e2e/prometheus.test.mjs runs against
// the end-to-end cluster.
//
// startPrometheus({ dir, edge: { url, tokenFile }, agents: [{ node, url }],
//   scrapeInterval, port }) writes dir/prometheus.yml (the same two jobs as
// ops/prometheus/prometheus.yml: `callfence-edge` with the bearer token
// file, `callfence-agent` with a `node` label per agent), starts Prometheus
// on loopback with its storage in dir/data, waits until it is ready and
// returns { url, config, query(expr), rules(), logs, close() }.

import { spawn } from "node:child_process";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = fileURLToPath(new URL("../", import.meta.url));
/** The shipped alerting rules. */
export const RULES = join(ROOT, "ops", "prometheus", "rules.yml");
const BIN = process.env.CALLFENCE_PROMETHEUS_BIN ?? "prometheus";

/** host:port and path of an http(s) URL. */
function target(url) {
  const u = new URL(url);
  return { scheme: u.protocol.replace(":", ""), host: u.host, path: u.pathname };
}

/** The Prometheus configuration (JSON, which YAML reads as it is). */
export function prometheusConfig({ edge, agents, scrapeInterval = "15s", rules = [RULES] }) {
  const e = target(edge.url);
  return {
    global: { scrape_interval: scrapeInterval, evaluation_interval: scrapeInterval },
    rule_files: rules,
    scrape_configs: [
      {
        job_name: "callfence-edge",
        scheme: e.scheme,
        metrics_path: "/v1/metrics",
        authorization: { type: "Bearer", credentials_file: edge.tokenFile },
        static_configs: [{ targets: [e.host] }],
      },
      {
        job_name: "callfence-agent",
        static_configs: agents.map((a) => ({ targets: [target(a.url).host], labels: { node: a.node } })),
      },
    ],
  };
}

/** Starts Prometheus; see the top of this file. */
export async function startPrometheus({ dir, edge, agents, scrapeInterval, port = 0, host = "127.0.0.1" }) {
  mkdirSync(join(dir, "data"), { recursive: true });
  const config = join(dir, "prometheus.yml");
  writeFileSync(config, `${JSON.stringify(prometheusConfig({ edge, agents, scrapeInterval }), null, 2)}\n`);
  const listen = `${host}:${port || (await freeLoopbackPort())}`;
  const child = spawn(
    BIN,
    [
      `--config.file=${config}`,
      `--storage.tsdb.path=${join(dir, "data")}`,
      `--web.listen-address=${listen}`,
      "--log.level=warn",
    ],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  const logs = [];
  const keep = (chunk) => logs.push(...chunk.toString("utf8").split("\n").filter(Boolean));
  child.stdout.on("data", keep);
  child.stderr.on("data", keep);
  const exited = new Promise((resolve) => {
    child.once("exit", resolve);
    child.once("error", (e) => {
      logs.push(`cannot start ${BIN}: ${e.message} (scripts/setup.sh installs Debian's prometheus)`);
      resolve();
    });
  });
  const url = `http://${listen}`;
  const prom = {
    url,
    config,
    logs,
    child,
    /** An instant query: the result vector, or throws Prometheus's error. */
    async query(expr) {
      const res = await fetch(`${url}/api/v1/query?${new URLSearchParams({ query: expr })}`);
      const body = await res.json();
      if (body.status !== "success") throw new Error(`${expr}: ${body.errorType}: ${body.error}`);
      return body.data.result;
    },
    /** The loaded rule groups with each rule's health. */
    async rules() {
      return (await (await fetch(`${url}/api/v1/rules`)).json()).data.groups;
    },
    async close() {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill("SIGTERM");
        await exited;
      }
    },
  };
  const deadline = Date.now() + 20_000;
  for (;;) {
    if (child.exitCode !== null || child.signalCode !== null || logs.some((l) => l.startsWith("cannot start"))) {
      throw new Error(`prometheus exited:\n${logs.join("\n")}`);
    }
    try {
      if ((await fetch(`${url}/-/ready`)).ok) return prom;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) {
      await prom.close();
      throw new Error(`prometheus not ready within 20 s:\n${logs.join("\n")}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

async function freeLoopbackPort() {
  const { createServer } = await import("node:net");
  const server = createServer();
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port;
}
