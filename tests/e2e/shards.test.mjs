// The shard map (SPEC §16) through the real Worker and Dispatcher: its
// initial value, compare-and-set, history, validation, the admin-only guard,
// and what GET /v1/health and the metrics say of it (the calls spread over
// the shards are call-shards.test.mjs's).

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { bearer, read, startEdge } from "./harness.mjs";

const SCHEMA = "callfence_shards_v1";
const json = (body) => JSON.stringify(body);

describe("the shard map: /v1/shards", () => {
  let edge;
  before(async () => {
    edge = await startEdge({ shards: 1 });
  });
  after(() => edge?.dispose());

  const call = (method, path, { body, ifMatch, token = edge.keys.adminToken } = {}) => {
    const headers = { ...bearer(token), "content-type": "application/json" };
    if (ifMatch !== undefined) headers["if-match"] = ifMatch;
    return edge
      .fetch(path, { method, headers, body: body === undefined ? undefined : typeof body === "string" ? body : json(body) })
      .then(read);
  };
  const health = async () => (await call("GET", "/v1/health")).body;

  test("before any PUT it is one shard at revision 0, and the floor is v1.3", async () => {
    const got = await call("GET", "/v1/shards");
    assert.equal(got.status, 200, json(got.body));
    assert.deepEqual(got.body, { schema: SCHEMA, call_shards: 1, revision: 0 });
    assert.equal(got.headers.get("etag"), '"0"');
    assert.deepEqual((await call("GET", "/v1/shards?revision=0")).body, got.body);
    const missing = await call("GET", "/v1/shards?revision=3");
    assert.deepEqual([missing.status, missing.body.error], [404, "unknown_revision"]);
    const h = await health();
    assert.deepEqual([h.shards, h.rollback_floor], [{ call_shards: 1, map_revision: 0, unreachable: [] }, "v1.3"]);
  });

  test("a policy token is forbidden and a missing one unauthorized, both ways", async () => {
    for (const method of ["GET", "PUT"]) {
      const body = method === "PUT" ? { schema: SCHEMA, call_shards: 1, revision: 0 } : undefined;
      const policy = await call(method, "/v1/shards", { body, token: edge.keys.policyToken });
      assert.deepEqual([policy.status, policy.body], [403, { error: "forbidden" }], method);
      const none = await read(await edge.fetch("/v1/shards", { method, body: body && json(body) }));
      assert.deepEqual([none.status, none.body], [401, { error: "unauthorized" }], method);
    }
    assert.equal((await call("GET", "/v1/shards")).body.revision, 0);
  });

  test("a write needs a precondition (428), a current one (412), and stores revision N+1 with its history", async () => {
    const map = { schema: SCHEMA, call_shards: 1 };
    const none = await call("PUT", "/v1/shards", { body: map });
    assert.deepEqual([none.status, none.body.error], [428, "precondition_required"]);
    const first = await call("PUT", "/v1/shards", { body: map, ifMatch: '"0"' });
    assert.deepEqual([first.status, first.body], [200, { revision: 1 }]);
    assert.equal(first.headers.get("etag"), '"1"');
    const stale = await call("PUT", "/v1/shards", { body: map, ifMatch: '"0"' });
    assert.deepEqual([stale.status, stale.body], [412, { error: "revision_conflict", current_revision: 1 }]);
    const second = await call("PUT", "/v1/shards", { body: { ...map, revision: 1 } });
    assert.deepEqual([second.status, second.body], [200, { revision: 2 }]);
    assert.deepEqual((await call("GET", "/v1/shards")).body, { ...map, revision: 2 });
    assert.deepEqual((await call("GET", "/v1/shards?revision=1")).body, { ...map, revision: 1 });
    const h = await health();
    assert.deepEqual([h.shards, h.rollback_floor], [{ call_shards: 1, map_revision: 2, unreachable: [] }, "v1.3"]);
    const metrics = await edge.fetch("/v1/metrics", { headers: bearer(edge.keys.adminToken) });
    assert.match(await metrics.text(), /^callfence_shard_map_revision 2$/m);
  });

  test("an invalid map is 400 invalid_document with each finding, and changes nothing", async () => {
    const before = (await call("GET", "/v1/shards")).body;
    const cases = [
      [{ schema: SCHEMA, call_shards: 0 }, ["/call_shards"]],
      [{ schema: SCHEMA, call_shards: 33 }, ["/call_shards"]],
      [{ schema: SCHEMA, call_shards: "4" }, ["/call_shards"]],
      [{ schema: SCHEMA }, ["/call_shards"]],
      [{ schema: "callfence_nodes_v1", call_shards: 1, extra: 1 }, ["/extra", "/schema"]],
    ];
    for (const [body, paths] of cases) {
      const res = await call("PUT", "/v1/shards", { body, ifMatch: `"${before.revision}"` });
      assert.equal(res.status, 400, json(body));
      assert.equal(res.body.error, "invalid_document");
      assert.deepEqual(res.body.details.map((d) => d.path), paths, json(res.body));
    }
    const notJson = await call("PUT", "/v1/shards", { body: "{", ifMatch: `"${before.revision}"` });
    assert.deepEqual([notJson.status, notJson.body.error], [400, "invalid_document"]);
    assert.deepEqual((await call("GET", "/v1/shards")).body, before);
  });

  test("grown to 4 shards, health names them and the floor is v1.4, and stays so after a shrink to 1", async () => {
    const before = (await call("GET", "/v1/shards")).body;
    const grown = await call("PUT", "/v1/shards", { body: { schema: SCHEMA, call_shards: 4 }, ifMatch: `"${before.revision}"` });
    assert.deepEqual([grown.status, grown.body], [200, { revision: before.revision + 1 }], json(grown.body));
    let h = await health();
    assert.deepEqual([h.shards, h.rollback_floor], [{ call_shards: 4, map_revision: before.revision + 1, unreachable: [] }, "v1.4"]);
    const shrunk = await call("PUT", "/v1/shards", { body: { schema: SCHEMA, call_shards: 1 }, ifMatch: `"${before.revision + 1}"` });
    assert.equal(shrunk.status, 200, json(shrunk.body));
    h = await health();
    assert.deepEqual([h.shards.call_shards, h.rollback_floor], [1, "v1.4"], "calls may still be held outside global");
  });

  test("a body over 4 KiB is 413", async () => {
    const body = json({ schema: SCHEMA, call_shards: 1, pad: "x".repeat(5000) });
    const res = await call("PUT", "/v1/shards", { body, ifMatch: '"0"' });
    assert.equal(res.status, 413);
  });
});
