// Lists a wasm module's imports and fails when any comes from a forbidden
// module: `node scripts/wasm-imports.mjs --forbid env path/to/module.wasm`.
// A pure-Rust crate built for wasm32-unknown-unknown imports nothing; an
// import from "env" means native-only code (libc, a C library) leaked in.
import { readFileSync } from "node:fs";

const args = process.argv.slice(2);
const forbidden = new Set();
const files = [];
for (let i = 0; i < args.length; i++) {
  if (args[i] === "--forbid") forbidden.add(args[++i]);
  else files.push(args[i]);
}
if (files.length === 0) {
  console.error("usage: wasm-imports.mjs [--forbid MODULE]... FILE.wasm...");
  process.exit(2);
}

let bad = 0;
for (const file of files) {
  const imports = WebAssembly.Module.imports(new WebAssembly.Module(readFileSync(file)));
  const offending = imports.filter((i) => forbidden.has(i.module));
  console.log(`${file}: ${imports.length} imports` +
    (imports.length ? ` (${[...new Set(imports.map((i) => i.module))].join(", ")})` : ""));
  for (const i of offending) {
    console.error(`  forbidden import ${i.module}.${i.name} (${i.kind})`);
  }
  bad += offending.length;
}
process.exit(bad ? 1 : 0);
