// The harness's own helpers, checked without the Worker: the loopback origin
// and its assertion and Telnyx checks, so a later failure is the Worker's.

import { test } from "node:test";
import assert from "node:assert/strict";
import { sign } from "node:crypto";
import { ed25519, nowSeconds, sha256Hex, startOrigin, telnyxHeaders, verifyAssertion } from "./harness.mjs";

/** Mints an assertion as SPEC §7 describes it. */
function mint(kid, privateKey, claims) {
  const payload = Buffer.from(JSON.stringify(claims)).toString("base64url");
  const sig = sign(null, Buffer.from(`v1.${kid}.${payload}`), privateKey).toString("base64url");
  return `v1.${kid}.${payload}.${sig}`;
}

function claimsFor(node, body, iat = nowSeconds()) {
  return {
    iss: "callfence-edge",
    node,
    call_session_id: "s1",
    call_control_id: "c1",
    event_id: "e1",
    epoch: 1,
    attempt: 1,
    body_sha256: sha256Hex(body),
    iat,
    exp: iat + 60,
  };
}

test("verifyAssertion accepts the edge's assertion and names every refusal", () => {
  const edge = ed25519();
  const edgeKeys = [{ kid: "e1", public_key: edge.publicKey }];
  const body = '{"data":{}}';
  const good = mint("e1", edge.privateKeyObject, claimsFor("M1", body));
  assert.equal(verifyAssertion(good, { edgeKeys, node: "M1", body }).ok, true);
  const why = (header, node = "M1", payload = body) => verifyAssertion(header, { edgeKeys, node, body: payload }).why;
  assert.equal(why("nope"), "malformed");
  assert.equal(why(mint("e2", edge.privateKeyObject, claimsFor("M1", body))), "unknown_kid");
  assert.equal(why(mint("e1", ed25519().privateKeyObject, claimsFor("M1", body))), "bad_signature");
  assert.equal(why(good, "M3"), "wrong_node");
  assert.equal(why(good, "M1", body + " "), "body_mismatch");
  assert.equal(why(mint("e1", edge.privateKeyObject, claimsFor("M1", body, nowSeconds() - 600))), "expired");
});

test("the loopback origin records requests with their checks", async () => {
  const edge = ed25519();
  const telnyx = ed25519();
  const origin = await startOrigin({
    node: "M1",
    edgeKeys: [{ kid: "e1", public_key: edge.publicKey }],
    telnyxPublicKey: telnyx.publicKey,
  });
  try {
    const body = '{"data":{"id":"e1"}}';
    origin.respond = () => ({ status: 202, body: { took: true } });
    const res = await fetch(origin.url, {
      method: "POST",
      headers: {
        ...telnyxHeaders(body, telnyx.privateKeyObject),
        "callfence-assertion": mint("e1", edge.privateKeyObject, claimsFor("M1", body)),
      },
      body,
    });
    assert.equal(res.status, 202);
    assert.deepEqual(await res.json(), { took: true });
    assert.equal(origin.requests.length, 1);
    const [seen] = origin.requests;
    assert.equal(seen.path, "/callfence/telnyx");
    assert.equal(seen.body, body);
    assert.equal(seen.assertion.ok, true);
    assert.equal(seen.assertion.claims.epoch, 1);
    assert.equal(seen.telnyxValid, true);
  } finally {
    await origin.close();
  }
});
