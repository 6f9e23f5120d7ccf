// Reading a wasm file's sections, code and function names (shared by
// wasm-size.mjs, wasm-strip-names.mjs and bench.mjs's perf profile).

/** The unsigned LEB128 number at `pos`: [value, position after it]. */
export function leb(bytes, pos) {
  let result = 0;
  let shift = 0;
  for (;;) {
    const b = bytes[pos++];
    result += (b & 0x7f) * 2 ** shift;
    if ((b & 0x80) === 0) return [result, pos];
    shift += 7;
  }
}

/**
 * Each section of a wasm file: its id, where it starts (`start`, its id
 * byte), where its contents start (`body`) and end (`end`), and for a custom
 * section its name.
 */
export function* sections(bytes) {
  let pos = 8;
  while (pos < bytes.length) {
    const start = pos;
    const id = bytes[pos];
    const [size, body] = leb(bytes, pos + 1);
    let name = null;
    if (id === 0) {
      const [length, at] = leb(bytes, body);
      name = bytes.subarray(at, at + length).toString("utf8");
    }
    yield { id, start, body, end: body + size, name };
    pos = body + size;
  }
}

/**
 * A wasm file's sections (label and contents), its number of imported
 * functions, its code bodies (function index = imported + position) and
 * the function names of its name section (by function index).
 */
export function readWasm(bytes) {
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
  return { sections, imported, bodies, names };
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
export const crateOf = (name) => {
  const q = qualified(name);
  return q ? firstCrate(q.self) : firstCrate(name);
};
// One family per generic function (`serde_json::de::from_trait`) and per
// trait method (`<_ as serde::ser::Serialize>::serialize`).
export const familyOf = (name) => {
  const q = qualified(name);
  if (q && q.trait) return `<_ as ${dropGenerics(q.trait)}>${dropGenerics(q.rest)}`;
  if (q) return `<${dropGenerics(q.self)}>${dropGenerics(q.rest)}`;
  return dropGenerics(name);
};

/** A name-section entry as one readable name (demangled, no hashes). */
export const displayName = (raw) => stripHash(demangle(raw));
