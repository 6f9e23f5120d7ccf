#!/usr/bin/env node
// Where the Worker's wasm goes: code bytes per crate (and the largest
// functions), read from the name section of the wasm that cargo builds
// before wasm-bindgen and wasm-opt (so names are still there; wasm-opt then
// shrinks everything by about the same factor).
//
//   node scripts/wasm-size.mjs [path.wasm] [--top N]
//
// Default path: the release build of the Worker crate for wasm32
// (`cargo build --release --target wasm32-unknown-unknown -p callfence`).
import { readFileSync } from "node:fs";
import { execFileSync } from "node:child_process";
import { join } from "node:path";

const args = process.argv.slice(2);
const top = Number(args[args.indexOf("--top") + 1]) || 25;
let file = args.find((a) => a.endsWith(".wasm"));
if (!file) {
  const meta = JSON.parse(execFileSync("cargo", ["metadata", "--format-version", "1", "--no-deps"], { encoding: "utf8" }));
  file = join(meta.target_directory, "wasm32-unknown-unknown/release/callfence.wasm");
}
const bytes = readFileSync(file);
let pos = 8;
const u32 = () => {
  let result = 0;
  let shift = 0;
  for (;;) {
    const b = bytes[pos++];
    result |= (b & 0x7f) << shift;
    if ((b & 0x80) === 0) return result >>> 0;
    shift += 7;
  }
};
const text = (n) => {
  const s = bytes.subarray(pos, pos + n).toString("utf8");
  pos += n;
  return s;
};
let imported = 0;
const bodies = [];
const names = new Map();
while (pos < bytes.length) {
  const id = bytes[pos++];
  const size = u32();
  const end = pos + size;
  if (id === 2) {
    const count = u32();
    for (let i = 0; i < count; i++) {
      text(u32());
      text(u32());
      const kind = bytes[pos++];
      if (kind === 0) {
        u32();
        imported++;
      } else if (kind === 1) {
        pos++;
        const flags = u32();
        u32();
        if (flags & 1) u32();
      } else if (kind === 2) {
        const flags = u32();
        u32();
        if (flags & 1) u32();
      } else {
        pos += 2;
      }
    }
  } else if (id === 10) {
    const count = u32();
    for (let i = 0; i < count; i++) {
      const len = u32();
      bodies.push(len);
      pos += len;
    }
  } else if (id === 0) {
    const name = text(u32());
    if (name === "name") {
      while (pos < end) {
        const sub = bytes[pos++];
        const subSize = u32();
        const subEnd = pos + subSize;
        if (sub === 1) {
          const count = u32();
          for (let i = 0; i < count; i++) {
            const index = u32();
            names.set(index, text(u32()));
          }
        }
        pos = subEnd;
      }
    }
  }
  pos = end;
}
const crateOf = (name) => {
  // Mangled Rust names (legacy `_ZN` or v0) and their demangled forms.
  const legacy = name.match(/^_ZN(?:\d+_)*?(\d+)([A-Za-z_][A-Za-z0-9_]*)/);
  let first = legacy ? legacy[2].slice(0, Number(legacy[1])) : name.split("::")[0].replace(/^<+/, "");
  if (first === "_" || first.startsWith("$LT$")) {
    const inner = name.match(/\$LT\$([a-z_][a-z0-9_]*)\.\.|<([a-z_][a-z0-9_]*)::/);
    first = inner ? inner[1] ?? inner[2] : "<impl>";
  }
  return first.replace(/\$u20\$.*/, "") || "?";
};
const byCrate = new Map();
const fns = [];
let total = 0;
bodies.forEach((size, i) => {
  const name = names.get(i + imported) ?? `func[${i + imported}]`;
  const crate = crateOf(name);
  byCrate.set(crate, (byCrate.get(crate) ?? 0) + size);
  fns.push([size, name]);
  total += size;
});
console.log(`${file}: ${bytes.length} bytes, code ${total} bytes in ${bodies.length} functions`);
console.log("\ncode bytes by crate (first path segment of each function's name):");
for (const [crate, size] of [...byCrate].sort((a, b) => b[1] - a[1]).slice(0, top)) {
  console.log(`  ${String(size).padStart(8)}  ${((100 * size) / total).toFixed(1).padStart(5)}%  ${crate}`);
}
console.log(`\nthe ${top} largest functions:`);
for (const [size, name] of fns.sort((a, b) => b[0] - a[0]).slice(0, top)) {
  console.log(`  ${String(size).padStart(8)}  ${name.slice(0, 150)}`);
}
