// The baseline for `make bench`: a bare pass-through Worker. It forwards the
// webhook's body (with its content-type and Telnyx headers) to ORIGIN_URL,
// without following redirects, and answers with the origin's status and
// body. No verification, no Dispatcher, no assertion: the floor any Worker
// in front of the origin pays on local workerd.

const CARRIED = ["content-type", "telnyx-signature-ed25519", "telnyx-timestamp"];

export default {
  async fetch(request, env) {
    const headers = new Headers();
    for (const name of CARRIED) {
      const value = request.headers.get(name);
      if (value !== null) headers.set(name, value);
    }
    const body = await request.arrayBuffer();
    const answer = await fetch(env.ORIGIN_URL, { method: "POST", headers, body, redirect: "manual" });
    return new Response(await answer.text(), {
      status: answer.status,
      headers: { "content-type": "application/json" },
    });
  },
};
