#!/usr/bin/env node
// Where the Worker's wasm goes: the shipped file's size (raw and gzipped),
// its sections, and its code bytes by crate, by function family (one generic
// function's instances together, one trait method's impls together) and by
// function, read from the name section of the same wasm before its names
// were stripped.
//
//   node scripts/wasm-size.mjs [path.wasm] [--top N]
//
// Default path: target/wasm-size/index_bg.named.wasm, which scripts/build.sh
// keeps: the shipped build/index_bg.wasm as wasm-opt left it, names still
// in (so the figures are the shipped code, after wasm-bindgen and wasm-opt).
// Given the cargo output instead (target/wasm32-unknown-unknown/release/
// callfence.wasm), it shows the code before wasm-bindgen and wasm-opt.
import { existsSync, readFileSync } from "node:fs";
import { gzipSync } from "node:zlib";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { crateOf, displayName, familyOf, readWasm } from "./wasm-sections.mjs";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const args = process.argv.slice(2);
const topAt = args.indexOf("--top");
const top = (topAt >= 0 && Number(args[topAt + 1])) || 25;
const file = args.find((a) => a.endsWith(".wasm")) ?? join(root, "target/wasm-size/index_bg.named.wasm");
if (!existsSync(file)) {
  console.error(`wasm-size: ${file} does not exist: run scripts/build.sh (make build) first`);
  process.exit(1);
}
const gz = (b) => gzipSync(b, { level: 9 }).length;
const shipped = join(root, "build/index_bg.wasm");
if (existsSync(shipped)) {
  const b = readFileSync(shipped);
  console.log(`shipped: build/index_bg.wasm ${b.length} bytes raw, ${gz(b)} bytes gzipped (zlib level 9, within 1% of gzip -9)`);
}

const bytes = readFileSync(file);
const { sections, imported, bodies, names } = readWasm(bytes);

const byCrate = new Map();
const byFamily = new Map();
const fns = [];
let total = 0;
const add = (map, key, size) => {
  const entry = map.get(key) ?? [0, 0];
  entry[0] += size;
  entry[1]++;
  map.set(key, entry);
};
bodies.forEach((body, i) => {
  const raw = names.get(i + imported);
  const name = raw ? displayName(raw) : `func[${i + imported}]`;
  add(byCrate, raw ? crateOf(name) : "(unnamed)", body.length);
  add(byFamily, raw ? familyOf(name) : "(unnamed)", body.length);
  fns.push([body.length, name]);
  total += body.length;
});

const pct = (n, of) => `${((100 * n) / of).toFixed(1).padStart(5)}%`;
console.log(`\n${file}: ${bytes.length} bytes raw, ${gz(bytes)} gzipped; code ${total} bytes in ${bodies.length} functions`);
console.log("\nsections (bytes raw, gzipped alone):");
for (const [label, body] of sections.sort((a, b) => b[1].length - a[1].length)) {
  console.log(`  ${String(body.length).padStart(8)}  ${String(gz(body)).padStart(8)}  ${label}`);
}
const table = (title, map) => {
  console.log(`\n${title}`);
  for (const [key, [size, count]] of [...map].sort((a, b) => b[1][0] - a[1][0]).slice(0, top)) {
    console.log(`  ${String(size).padStart(8)}  ${pct(size, total)}  ${String(count).padStart(4)} fn  ${key.slice(0, 140)}`);
  }
};
table("code bytes by crate (of the type, for a trait impl; else the path's first segment):", byCrate);
table(`the ${top} largest function families (a generic function's instances, a trait method's impls):`, byFamily);
console.log(`\nthe ${top} largest functions:`);
for (const [size, name] of fns.sort((a, b) => b[0] - a[0]).slice(0, top)) {
  console.log(`  ${String(size).padStart(8)}  ${name.slice(0, 150)}`);
}
