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
import { leb } from "./wasm-sections.mjs";

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
let pos = 8;
const u32 = () => {
  const [value, next] = leb(bytes, pos);
  pos = next;
  return value;
};
const text = (n) => {
  const s = bytes.subarray(pos, pos + n).toString("utf8");
  pos += n;
  return s;
};
const SECTIONS = ["custom", "type", "import", "function", "table", "memory", "global", "export", "start", "element", "code", "data", "datacount", "tag"];
const sections = [];
let imported = 0;
const bodies = [];
const names = new Map();
while (pos < bytes.length) {
  const id = bytes[pos++];
  const size = u32();
  const start = pos;
  const end = pos + size;
  let label = SECTIONS[id] ?? `section ${id}`;
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
      } else if (kind === 3) {
        pos += 2;
      } else {
        pos++;
        u32();
      }
    }
  } else if (id === 10) {
    const count = u32();
    for (let i = 0; i < count; i++) {
      const len = u32();
      bodies.push(bytes.subarray(pos, pos + len));
      pos += len;
    }
  } else if (id === 0) {
    const name = text(u32());
    label = `custom "${name}"`;
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
  sections.push([label, bytes.subarray(start, end)]);
  pos = end;
}

// Legacy Rust mangling (`_ZN...E`), as in the cargo output; the wasm-bindgen
// output is already demangled.
const demangle = (name) => {
  if (!name.startsWith("_ZN")) return name;
  const parts = [];
  let at = 3;
  while (at < name.length && name[at] !== "E") {
    const len = name.slice(at).match(/^\d+/);
    if (!len) return name;
    at += len[0].length;
    parts.push(name.slice(at, at + Number(len[0])));
    at += Number(len[0]);
  }
  if (/^h[0-9a-f]{16}$/.test(parts.at(-1) ?? "")) parts.pop();
  const escapes = { SP: "@", BP: "*", RF: "&", LT: "<", GT: ">", LP: "(", RP: ")", C: "," };
  return parts
    .map((p) =>
      p
        .replace(/^_\$/, "$")
        .replace(/\$([A-Z]{1,2}|u[0-9a-f]+)\$/g, (m, e) => escapes[e] ?? (e[0] === "u" ? String.fromCodePoint(parseInt(e.slice(1), 16)) : m))
        .replace(/\.\./g, "::"),
    )
    .join("::");
};
// Drops the hash (`::h0123...`), a crate's disambiguator (`core[0123...]`)
// and wasm-opt's suffix on a duplicated name (`[7]`).
const stripHash = (name) =>
  name
    .replace(/\[[0-9a-f]{16}\]/g, "")
    .replace(/(::h[0-9a-f]{16})?(\[\d+\])?$/, "");
// Removes every `<...>` that follows a path segment (generic arguments),
// keeping the leading `<T as Trait>` form.
const dropGenerics = (s) => {
  let out = "";
  let depth = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s[i];
    if (c === "<" && depth === 0 && i > 0 && /[A-Za-z0-9_]/.test(s[i - 1])) depth = 1;
    else if (depth > 0) {
      if (c === "<") depth++;
      else if (c === ">" && s[i - 1] !== "-") depth--;
    } else out += c;
  }
  return out;
};
// `<A as B>::rest`: splits at the ` as ` of the outermost angle brackets.
const qualified = (name) => {
  if (!name.startsWith("<")) return null;
  let depth = 0;
  let as = -1;
  for (let i = 0; i < name.length; i++) {
    const c = name[i];
    if (c === "<") depth++;
    else if (c === ">" && name[i - 1] !== "-") {
      depth--;
      if (depth === 0) {
        if (as < 0) return { self: name.slice(1, i), trait: null, rest: name.slice(i + 1) };
        return { self: name.slice(1, as), trait: name.slice(as + 4, i), rest: name.slice(i + 1) };
      }
    } else if (depth === 1 && name.startsWith(" as ", i)) as = i;
  }
  return null;
};
const firstCrate = (path) => {
  const m = path.replace(/^[&*\s(\[]+|^(mut|const|dyn)\s+/g, "").match(/^([A-Za-z_][A-Za-z0-9_]*)(::|$)/);
  return m ? m[1] : "?";
};
// The crate whose code it is: for `<T as Trait>::f`, the crate of T (a
// derive's impl is the type's crate's cost); otherwise the first segment.
const crateOf = (name) => {
  const q = qualified(name);
  return q ? firstCrate(q.self) : firstCrate(name);
};
// One family per generic function (`serde_json::de::from_trait`) and per
// trait method (`<_ as serde::ser::Serialize>::serialize`).
const familyOf = (name) => {
  const q = qualified(name);
  if (q && q.trait) return `<_ as ${dropGenerics(q.trait)}>${dropGenerics(q.rest)}`;
  if (q) return `<${dropGenerics(q.self)}>${dropGenerics(q.rest)}`;
  return dropGenerics(name);
};

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
  const name = raw ? stripHash(demangle(raw)) : `func[${i + imported}]`;
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
