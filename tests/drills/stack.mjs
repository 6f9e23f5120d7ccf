// The drills' deployment: agents-cluster.mjs's stack (the built Worker in
// workerd with its SQLite Dispatcher, real agents with demo apps, the fake
// Telnyx) on a fixed edge port, so the edge can be killed with SIGKILL and
// restarted on the same storage while the agents keep its URL, with a TCP
// fault proxy in front of every node's origin, and the faults the drills
// inject.

import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { bindingsFor, putShardMap, testKeys, workerdPids } from "../e2e/harness.mjs";
import { freePort, startCluster, waitFor } from "../e2e/agents-cluster.mjs";
import { startFaultProxy } from "./faultproxy.mjs";
import { startRecorder } from "./recorder.mjs";

/** The drills' test-only timings: a 500 ms sweep, a node lost after 3 s. */
export const TIMINGS = { CALLFENCE_TEST_SWEEP_MS: "500", CALLFENCE_TEST_NODE_LOST_MS: "3000" };
/** A stable node's registry fields in the drills. */
export const stable = { role: "stable", max_calls: 1000 };

// What each demo app reports as its capacity: the drills' registries give
// their nodes max_calls 1000, and the app's default (10) would otherwise be
// the smaller limit, so a drill's load would measure the demo app's
// capacity (capacity_exhausted, 503, retries) instead of the edge's.
const APP_MAX_CALLS = 1000;

/**
 * Starts the stack. `nodes` and `policy` as for startCluster; `bindings` are
 * added to the Worker's configuration (the CALLFENCE_TEST_* timings);
 * `deploy` lists the nodes run from a releases layout (startCluster's);
 * `recordBeats` puts a recorder between the agents and the edge
 * (`stack.recorder.beats`); `build` is the Worker build directory to start
 * with (default: the harness's TESTING_BUILD, build-testing/); `shards` is
 * the map of call shards put in force before the nodes start (default: the
 * harness's, one shard unless CALLFENCE_E2E_SHARDS says more).
 */
export async function startStack({ nodes, policy, bindings = {}, recordBeats = false, build, deploy = [], shards }) {
  const keys = testKeys();
  const port = await freePort();
  const proxies = {};
  let recorder = null;
  const cluster = await startCluster({
    nodes,
    policy,
    deploy,
    edge: { keys, port, build, shards, bindings: { ...bindingsFor(keys), ...bindings } },
    appArgs: ["--max-calls", String(APP_MAX_CALLS)],
    originFront: async (id, url) => {
      proxies[id] = await startFaultProxy(url);
      return proxies[id].url;
    },
    edgeFront: recordBeats
      ? async (url) => {
          recorder = await startRecorder(url);
          return recorder.url;
        }
      : undefined,
  });
  const stack = { cluster, proxies, recorder, edge: cluster.edge, telnyx: cluster.telnyx, nodes: cluster.nodes };

  /** SIGKILL of workerd, then a new runtime on the same storage and port. */
  stack.killEdge = async () => {
    const pids = workerdPids();
    for (const pid of pids) process.kill(pid, "SIGKILL");
    await cluster.edge.restart();
    return pids.length;
  };
  /** Puts a map of `n` call shards in force (SPEC §16), as an operator would. */
  stack.setShards = (n) => putShardMap(cluster.edge, n, keys.adminToken);
  /**
   * Restarts one Durable Object, the call shard `name` ("calls-k", or
   * "global"): the testing build's `/restart` makes it reset itself just
   * after it answers (its in-memory state, its lease among it, is gone; its
   * storage stays), and the next request constructs it anew.
   */
  stack.restartShard = async (name) => {
    const stub = await cluster.edge.dispatcher(name);
    const res = await stub.fetch(`https://${name}/restart`, { method: "POST", body: '{"v":2,"op":"restart"}\n' });
    const text = await res.text();
    if (res.status !== 200) throw new Error(`${name}: restart answered ${res.status} ${text}`);
  };
  /** A graceful restart of workerd on the same storage and port, running the Worker build in `dir`. */
  stack.swapEdge = (dir) => cluster.edge.restart({ build: dir });
  /** Freezes a node's agent (its beat goes stale) or thaws it. */
  stack.freezeAgent = (id, frozen) => {
    const child = cluster.nodes[id].agent?.child;
    if (child && child.exitCode === null && child.signalCode === null) child.kill(frozen ? "SIGSTOP" : "SIGCONT");
  };
  /**
   * Restarts a node's agent with its clock `offsetMs` off (the agent's
   * test-only CALLFENCE_AGENT_TEST_CLOCK_OFFSET_MS); 0 restarts it plain.
   */
  stack.skewClock = async (id, offsetMs) => {
    const n = cluster.nodes[id];
    await n.killAgent("SIGTERM");
    await n.startAgent(offsetMs ? { CALLFENCE_AGENT_TEST_CLOCK_OFFSET_MS: String(offsetMs) } : {});
    n.clockOffsetMs = offsetMs;
  };
  /** Makes a node's checkout dirty (an uncommitted change) or clean again. */
  stack.dirty = (id, dirty) => {
    const file = join(cluster.nodes[id].checkout, "app.txt");
    writeFileSync(file, dirty ? `voice app for ${id}\nlocal edit\n` : `voice app for ${id}\n`);
  };
  /** The agent's mode: active, drained, ... */
  stack.mode = (id, mode) => {
    const r = cluster.nodes[id].cli("mode", "set", mode);
    if (r.status !== 0) throw new Error(`${id}: mode set ${mode}: ${r.stderr}`);
  };
  /** Restarts whatever of a node is down; resets its proxy and mode (three tries: a loaded machine may start an app late). */
  stack.heal = async (id) => {
    for (let attempt = 1; ; attempt += 1) {
      try {
        return await healOnce(id);
      } catch (error) {
        if (attempt >= 3) throw error;
        await new Promise((resolve) => setTimeout(resolve, 1_000));
      }
    }
  };
  const healOnce = async (id) => {
    const n = cluster.nodes[id];
    proxies[id].set("pass");
    stack.freezeAgent(id, false);
    stack.dirty(id, false);
    if (n.clockOffsetMs) await stack.skewClock(id, 0);
    if (n.app.child.exitCode !== null || n.app.child.signalCode !== null) await n.startApp(n.appArgs);
    if (n.agent.child.exitCode !== null || n.agent.child.signalCode !== null) await n.startAgent();
    stack.mode(id, "active");
  };
  stack.waitAllEligible = (timeout = 30_000) =>
    waitFor("every node eligible", async () => {
      const status = await cluster.status();
      return status.nodes.every((n) => n.eligible === true);
    }, { timeout, every: 250 });
  stack.close = async () => {
    for (const id of Object.keys(proxies)) stack.freezeAgent(id, false);
    await cluster.close();
    for (const p of Object.values(proxies)) await p.close();
    await recorder?.close();
  };
  return stack;
}
