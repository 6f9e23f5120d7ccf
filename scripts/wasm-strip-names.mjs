#!/usr/bin/env node
// Copies a wasm file without its custom "name" section, every other byte
// as it was (so function N of the output is function N of the input, and
// the input keeps the names for `wasm-function[N]` in a stack trace).
//
//   node scripts/wasm-strip-names.mjs in.wasm out.wasm
import { readFileSync, writeFileSync } from "node:fs";

const [input, output] = process.argv.slice(2);
if (!input || !output) {
  console.error("usage: wasm-strip-names.mjs in.wasm out.wasm");
  process.exit(2);
}
const bytes = readFileSync(input);
const kept = [bytes.subarray(0, 8)];
let pos = 8;
const u32 = () => {
  let result = 0;
  let shift = 0;
  for (;;) {
    const b = bytes[pos++];
    result += (b & 0x7f) * 2 ** shift;
    if ((b & 0x80) === 0) return result;
    shift += 7;
  }
};
while (pos < bytes.length) {
  const start = pos;
  const id = bytes[pos++];
  const size = u32();
  const end = pos + size;
  let name = null;
  if (id === 0) {
    const length = u32();
    name = bytes.subarray(pos, pos + length).toString("utf8");
  }
  if (name !== "name") kept.push(bytes.subarray(start, end));
  pos = end;
}
writeFileSync(output, Buffer.concat(kept));
