#!/usr/bin/env node
// Copies a wasm file without its custom "name" section, every other byte
// as it was (so function N of the output is function N of the input, and
// the input keeps the names for `wasm-function[N]` in a stack trace).
//
//   node scripts/wasm-strip-names.mjs in.wasm out.wasm
import { readFileSync, writeFileSync } from "node:fs";
import { sections } from "./wasm-sections.mjs";

const [input, output] = process.argv.slice(2);
if (!input || !output) {
  console.error("usage: wasm-strip-names.mjs in.wasm out.wasm");
  process.exit(2);
}
const bytes = readFileSync(input);
const kept = [bytes.subarray(0, 8)];
for (const section of sections(bytes)) {
  if (section.name !== "name") kept.push(bytes.subarray(section.start, section.end));
}
writeFileSync(output, Buffer.concat(kept));
