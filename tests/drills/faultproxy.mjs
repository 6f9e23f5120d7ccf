// A TCP fault proxy on loopback, put between the edge and a node's origin.
// `mode` applies to connections accepted while it is set (and `blackhole`
// also stalls the ones already open):
//   pass        bytes flow both ways
//   latency     every chunk each way is held `ms` before it is written
//   reset       the connection is destroyed as soon as it is accepted (RST)
//   blackhole   nothing is forwarded and nothing is answered
//   slow        the origin's reply is written `bytes` at a time every `ms`

import { createConnection, createServer } from "node:net";

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Starts a proxy to `target` ("http://127.0.0.1:P/path"); returns { url, set(mode, opts), close() }. */
export async function startFaultProxy(target) {
  const to = new URL(target);
  const sockets = new Set();
  let fault = { mode: "pass" };
  const server = createServer((client) => {
    sockets.add(client);
    client.on("close", () => sockets.delete(client));
    client.on("error", () => {});
    const mode = fault;
    if (mode.mode === "reset") {
      client.resetAndDestroy();
      return;
    }
    if (mode.mode === "blackhole") {
      client.on("data", () => {}); // swallowed
      return;
    }
    const upstream = createConnection({ host: to.hostname, port: Number(to.port) });
    sockets.add(upstream);
    upstream.on("close", () => {
      sockets.delete(upstream);
      client.destroy();
    });
    upstream.on("error", () => client.destroy());
    client.on("close", () => upstream.destroy());
    pipe(client, upstream, mode, false);
    pipe(upstream, client, mode, true);
  });
  // A chain per direction keeps the bytes in order whatever the delays.
  function pipe(from, into, mode, reply) {
    let chain = Promise.resolve();
    from.on("data", (chunk) => {
      from.pause();
      chain = chain.then(async () => {
        if (fault.mode === "blackhole") return; // a blackhole also stalls open connections
        if (mode.mode === "latency") await sleep(mode.ms);
        if (mode.mode === "slow" && reply) {
          for (let i = 0; i < chunk.length; i += mode.bytes) {
            if (into.destroyed) return;
            into.write(chunk.subarray(i, i + mode.bytes));
            await sleep(mode.ms);
          }
        } else if (!into.destroyed) {
          into.write(chunk);
        }
        from.resume();
      });
    });
  }
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}${to.pathname}`,
    get mode() {
      return fault.mode;
    },
    /** Sets the fault for new connections: ("latency", {ms}), ("slow", {bytes, ms}), ... */
    set(mode, opts = {}) {
      fault = { mode, ...opts };
      if (mode === "pass") return;
      // Open keep-alive connections would otherwise dodge a reset.
      if (mode === "reset") for (const s of sockets) s.resetAndDestroy?.() ?? s.destroy();
    },
    close() {
      for (const s of sockets) s.destroy();
      return new Promise((resolve) => server.close(resolve));
    },
  };
}
