// Clusters for the browser tests: the real Worker and Dispatcher with
// loopback origins per node (tests/e2e/fixtures.mjs), a routing policy, and
// signed heartbeats long enough to outlast a slow test.

import { callEvent, heartbeat, setupCluster, webhook } from "../e2e/fixtures.mjs";

export const SALES = "+15550001111";
export const SUPPORT = "+15550002222";
export const CALLER = "+14155550100";
export const SCHEMA = "riff_node_routing_policy_v1";

/** default M1; sales prefers `salesPrefers` (fallback M1); support prefers M2. */
export const basePolicy = ({ salesPrefers = "M2", byCaller = {} } = {}) => ({
  schema: SCHEMA,
  default_node: "M1",
  by_line: {
    sales: { called_number: SALES, preferred_node: salesPrefers, fallback_node: "M1" },
    support: { called_number: SUPPORT, preferred_node: "M2" },
  },
  by_caller: byCaller,
});

/** Fresh 30 s beats for `ids` (every node by default); `overrides` per id. */
export async function beat(cluster, ids = Object.keys(cluster.nodes), overrides = {}) {
  for (const id of ids) {
    const res = await heartbeat(cluster.edge, cluster.nodes[id], { valid_for_s: 30, ...(overrides[id] ?? {}) });
    if (res.status !== 200) throw new Error(`heartbeat ${id}: ${res.status} ${JSON.stringify(res.body)}`);
  }
}

/** M1..M3 (all stable), the base policy (or `policy`), fresh beats. */
export async function cluster({ nodes = ["M1", "M2", "M3"], perNode = {}, policy = basePolicy() } = {}) {
  const c = await setupCluster({ nodes, perNode, policy, beat: false });
  await beat(c);
  return c;
}

let calls = 0;

/** A new inbound call (call.initiated, left open) -> {session, res}. */
export async function call(c, to, from = "+14155550999") {
  const session = `sess-${++calls}-${Date.now()}`;
  const res = await webhook(c.edge, callEvent("call.initiated", { session, leg: `leg-${session}`, from, to }));
  if (res.status !== 200) throw new Error(`webhook: ${res.status} ${JSON.stringify(res.body)}`);
  return { session, res };
}
