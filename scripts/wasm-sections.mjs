// Reading a wasm file's sections (shared by wasm-size.mjs and
// wasm-strip-names.mjs).

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
