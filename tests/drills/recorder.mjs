// An HTTP front between the agents and the edge that records every accepted
// heartbeat (the replay drill's heartbeat history). Requests pass through
// unchanged, Host header included, so the nodes' signatures still verify.

import { createServer, request } from "node:http";

/**
 * Starts a front for `edgeUrl`; returns { url, beats: [{ at, sent_at, node, body }], close() }
 * (`at`: the edge_time of its answer, when the Dispatcher applied it;
 * `sent_at`: when the beat arrived).
 */
export async function startRecorder(edgeUrl) {
  const to = new URL(edgeUrl);
  const beats = [];
  const server = createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks);
      const at = Date.now();
      const up = request(
        { host: to.hostname, port: Number(to.port), method: req.method, path: req.url, headers: req.headers },
        (answer) => {
          const back = [];
          answer.on("data", (c) => back.push(c));
          answer.on("end", () => {
            if (req.url === "/v1/nodes/heartbeat" && answer.statusCode === 200) {
              // Stamped with the Dispatcher's clock when it applied the beat (edge_time).
              let applied = NaN;
              try {
                applied = Date.parse(JSON.parse(Buffer.concat(back).toString("utf8")).edge_time);
              } catch {
                // not JSON: fall back to the answer's arrival
              }
              beats.push({ at: Number.isFinite(applied) ? applied : Date.now(), sent_at: at, node: req.headers["callfence-node"], body: body.toString("utf8") });
            }
            res.writeHead(answer.statusCode, answer.headers);
            res.end(Buffer.concat(back));
          });
        },
      );
      up.on("error", () => {
        res.writeHead(502);
        res.end();
      });
      up.end(body);
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    beats,
    close: () => new Promise((resolve) => server.close(resolve)),
  };
}
