// Attacks on the edge's trust in what operators and nodes hand it (issue 18,
// findings 7-9), each reproduced as it was observed:
// - a node registry naming an origin inside the edge's network, in every
//   spelling a URL parser turns into an internal address (SPEC §4);
// - a node signature made for another edge's Host (staging), replayed here
//   while EDGE_HOSTNAMES is set (SPEC §6);
// - two signers beating with one node's key, their seqs interleaved: the
//   stale beats are refused and counted against the node in status.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { request as httpRequest } from "node:http";
import { bindingsFor, ed25519, nodeHeaders, startEdge, testKeys } from "./harness.mjs";
import { admin, heartbeatBody, nodePost, setupCluster } from "./fixtures.mjs";

/**
 * POSTs `body` to `path` of `edge` with `headers`, the Host header among
 * them sent as given (fetch always sends the URL's own host).
 */
function rawPost(edge, path, headers, body) {
  const url = new URL(path, edge.url);
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      { host: url.hostname, port: url.port, path: url.pathname, method: "POST", headers, setHost: false },
      (res) => {
        let text = "";
        res.setEncoding("utf8");
        res.on("data", (chunk) => (text += chunk));
        res.on("end", () => {
          let parsed = text;
          try {
            parsed = JSON.parse(text);
          } catch {
            // not JSON
          }
          resolve({ status: res.statusCode, body: parsed });
        });
      },
    );
    req.on("error", reject);
    req.end(body);
  });
}

describe("origin_url inside the edge's network (ORIGIN_ALLOW_PLAINTEXT false)", () => {
  let edge;
  const key = ed25519().publicKey;
  const registry = (originUrl) => ({
    schema: "callfence_nodes_v1",
    nodes: {
      M1: {
        role: "stable",
        origin_url: originUrl,
        keys: { k1: key },
        fallback_approved: false,
        admin_drained: false,
      },
    },
  });
  const put = (doc, revision) =>
    admin(edge, "/v1/nodes", {
      method: "PUT",
      headers: { "if-match": `"${revision}"`, "content-type": "application/json" },
      body: JSON.stringify(doc),
    });

  before(async () => {
    const keys = testKeys();
    edge = await startEdge({ keys, bindings: { ...bindingsFor(keys), ORIGIN_ALLOW_PLAINTEXT: "false" } });
    const first = await put(registry("https://m1.example.com/callfence/telnyx"), 0);
    assert.deepEqual([first.status, first.body], [200, { revision: 1 }]);
  });
  after(() => edge?.dispose());

  const internal = [
    "https://169.254.169.254/latest/meta-data/",
    "https://localhost/callfence/telnyx",
    "https://LOCALHOST/x",
    "https://localhost./x",
    "https://metadata.google.internal/computeMetadata/v1/",
    "https://printer.local/x",
    "https://127.0.0.1:8443/x",
    "https://2130706433/x",
    "https://0x7f.1/x",
    "https://0177.0.0.1/x",
    "https://127.1/x",
    "https://0.0.0.0/x",
    "https://10.0.0.1/x",
    "https://a@10.0.0.1/x",
    "https://172.16.0.1/x",
    "https://192.168.1.1/x",
    "https://100.64.0.1/x",
    "https://[::1]/x",
    "https://[::]/x",
    "https://[fe80::1]/x",
    "https://[fd00::1]/x",
    "https://[::ffff:127.0.0.1]/x",
    "https://[::ffff:7f00:1]/x",
  ];

  test("every spelling is refused 400 invalid_document at the node's origin_url, revision unchanged", async () => {
    for (const url of internal) {
      const res = await put(registry(url), 1);
      assert.equal(res.status, 400, `${url}: ${JSON.stringify(res.body)}`);
      assert.equal(res.body.error, "invalid_document", url);
      assert.deepEqual(
        res.body.details.map((d) => d.path),
        ["/nodes/M1/origin_url"],
        url,
      );
    }
    const current = await admin(edge, "/v1/nodes");
    assert.equal(current.status, 200);
    assert.equal(current.body.revision, 1);
    assert.equal(current.body.nodes.M1.origin_url, "https://m1.example.com/callfence/telnyx");
  });
});

describe("node signatures pinned to EDGE_HOSTNAMES", () => {
  const STAGING = "staging-callfence.example.net";
  let cluster;
  before(async () => {
    // The tests reach the edge at 127.0.0.1:<port>: that is its host name here.
    cluster = await setupCluster({ nodes: ["M1"], bindings: { EDGE_HOSTNAMES: "callfence.example.net,127.0.0.1" } });
  });
  after(() => cluster?.dispose());

  /** A node-signed POST as M1, signed for and sent with Host `host`. */
  const asStaging = (path, body) => {
    const { edge, nodes } = cluster;
    const text = JSON.stringify(body);
    const url = new URL(path, `http://${STAGING}`);
    const headers = nodeHeaders({ url, body: text, node: "M1", kid: "k1", privateKey: nodes.M1.key.privateKeyObject });
    return rawPost(edge, path, { ...headers, host: STAGING }, text);
  };

  test("a claim signed for the staging host is refused and nothing is stored", async () => {
    const { edge } = cluster;
    const claim = { call_control_id: "leg-staging", call_session_id: "s-staging" };
    const res = await asStaging("/v1/claims", claim);
    assert.deepEqual([res.status, res.body], [401, { error: "bad_node_signature" }]);
    const call = await admin(edge, "/v1/calls/s-staging");
    assert.deepEqual([call.status, call.body.error], [404, "unknown_call"]);
  });

  test("a heartbeat signed for the staging host is refused and nothing is stored", async () => {
    const { edge, nodes } = cluster;
    const before = (await admin(edge, "/v1/status")).body.nodes.find((n) => n.node === "M1");
    const res = await asStaging("/v1/nodes/heartbeat", heartbeatBody(edge, nodes.M1, { mode: "drained" }));
    assert.deepEqual([res.status, res.body], [401, { error: "bad_node_signature" }]);
    const now = (await admin(edge, "/v1/status")).body.nodes.find((n) => n.node === "M1");
    assert.equal(now.mode, "active");
    assert.equal(now.last_seen_at, before.last_seen_at);
  });

  test("the edge's own host still passes, with its port", async () => {
    const { edge, nodes } = cluster;
    const text = JSON.stringify(heartbeatBody(edge, nodes.M1));
    const url = new URL("/v1/nodes/heartbeat", edge.url);
    const host = `127.0.0.1:${url.port}`;
    const headers = nodeHeaders({ url, body: text, node: "M1", kid: "k1", privateKey: nodes.M1.key.privateKeyObject });
    const res = await rawPost(edge, "/v1/nodes/heartbeat", { ...headers, host }, text);
    assert.equal(res.status, 200, JSON.stringify(res.body));
  });
});

describe("two signers beating with one node's key", () => {
  let cluster;
  before(async () => {
    cluster = await setupCluster({ nodes: ["M1"] });
  });
  after(() => cluster?.dispose());

  const m1 = async () => (await admin(cluster.edge, "/v1/status")).body.nodes.find((n) => n.node === "M1");

  test("interleaved seqs are refused stale_seq, counted in status, and the count survives a restart", async () => {
    const { edge, nodes } = cluster;
    assert.deepEqual([(await m1()).seq_regressions, (await m1()).seq_regressed_at], [0, null]);
    // The legitimate agent's seqs are Unix ms; the second signer's (a copy
    // with a restored seq file) run an hour behind. They alternate.
    const base = Date.now();
    const thief = base - 3_600_000;
    const answers = [];
    for (let i = 0; i < 3; i += 1) {
      const own = { ...heartbeatBody(edge, nodes.M1), seq: base + 1_000 + i };
      answers.push((await nodePost(edge, nodes.M1, "/v1/nodes/heartbeat", own)).status);
      const other = { ...heartbeatBody(edge, nodes.M1), seq: thief + i, agent_version: "thief" };
      const refused = await nodePost(edge, nodes.M1, "/v1/nodes/heartbeat", other);
      assert.deepEqual([refused.status, refused.body.error], [409, "stale_seq"]);
    }
    assert.deepEqual(answers, [200, 200, 200]);
    const flagged = await m1();
    assert.equal(flagged.seq_regressions, 3);
    assert.ok(Date.parse(flagged.seq_regressed_at) >= base - 1_000, flagged.seq_regressed_at);
    // The refused beats stored nothing: the node is still the agent's.
    assert.equal(flagged.mode, "active");

    await edge.restart();
    const restarted = await m1();
    assert.deepEqual(
      [restarted.seq_regressions, restarted.seq_regressed_at],
      [flagged.seq_regressions, flagged.seq_regressed_at],
    );
  });
});
