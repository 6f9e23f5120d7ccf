// Starts `callfence-fake-telnyx` (agent/src/bin/callfence-fake-telnyx.rs), the
// one fake Telnyx Call Control API that `make dev`, the end-to-end cluster and
// the agent's tests share, and reads its record over HTTP (GET /__record).

import { spawn } from "node:child_process";
import { join } from "node:path";

/**
 * Starts the fake from `binDir` on `port` (0: a free one).
 *
 * options.apiKeyFile: requests must carry this key as a bearer token.
 * options.callers: { label: keyFile } more accepted keys; each request is
 *   recorded with the `caller` label of the key it carried.
 * options.onLine(record): called with each recorded request (parsed).
 *
 * Resolves to { url, child, record(filter), close() }; `record` fetches the
 * requests recorded so far, oldest first, optionally filtered by
 * `call_control_id`, `action` or `command_id`.
 */
export function startFakeTelnyx(binDir, { port = 0, apiKeyFile, callers = {}, onLine } = {}) {
  const args = ["--listen", `127.0.0.1:${port}`];
  if (apiKeyFile) args.push("--api-key-file", apiKeyFile);
  for (const [label, file] of Object.entries(callers)) args.push("--caller", `${label}=${file}`);
  const child = spawn(join(binDir, "callfence-fake-telnyx"), args, { stdio: ["ignore", "pipe", "pipe"] });
  const exited = new Promise((resolve) => child.once("exit", resolve));
  let errors = "";
  child.stderr.on("data", (c) => (errors += c));
  return new Promise((resolve, reject) => {
    let pending = "";
    let url = null;
    child.once("error", reject);
    child.once("exit", (code, signal) => {
      if (url === null) reject(new Error(`callfence-fake-telnyx exited (${signal ?? code}): ${errors}`));
    });
    child.stdout.on("data", (chunk) => {
      pending += chunk.toString("utf8");
      let newline;
      while ((newline = pending.indexOf("\n")) >= 0) {
        const line = pending.slice(0, newline);
        pending = pending.slice(newline + 1);
        if (url === null) {
          const m = line.match(/^listening (http:\/\/\S+)$/);
          if (!m) return reject(new Error(`callfence-fake-telnyx said: ${line}`));
          url = m[1];
          resolve({
            url,
            child,
            async record(filter = {}) {
              const query = new URLSearchParams(filter).toString();
              const res = await fetch(`${url}/__record${query ? `?${query}` : ""}`);
              if (!res.ok) throw new Error(`GET /__record: ${res.status}`);
              return (await res.json()).commands;
            },
            async close() {
              if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM");
              await exited;
            },
          });
        } else if (onLine) {
          try {
            onLine(JSON.parse(line));
          } catch {
            // not a record: ignore
          }
        }
      }
    });
  });
}
