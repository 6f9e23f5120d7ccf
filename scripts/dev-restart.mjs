// The `[deploy] restart` command of the `make dev` nodes: asks scripts/dev.mjs's
// supervisor endpoint (the URL given as the only argument, .../restart/<node>)
// to stop the node's demo app and start it again from its `current` release.
// Exits 0 only when the new app listens.
const url = process.argv[2];
if (!url) {
  process.stderr.write("usage: node scripts/dev-restart.mjs <supervisor url>/restart/<node>\n");
  process.exit(2);
}
try {
  const res = await fetch(url, { method: "POST", signal: AbortSignal.timeout(20_000) });
  const text = await res.text();
  if (!res.ok) process.stderr.write(`restart refused: ${res.status} ${text}`);
  process.exit(res.ok ? 0 : 1);
} catch (e) {
  process.stderr.write(`restart failed: ${e.message}\n`);
  process.exit(1);
}
