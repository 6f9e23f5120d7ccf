// Every relative link in the README and the docs resolves: the file (or
// directory) exists, and an `#anchor` into a markdown file names one of its
// headings (GitHub's heading ids). Links inside code are not links; links
// with a scheme (https:, mailto:) are not checked (no network here).

import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));

/** The markdown files checked: README.md, docs/*.md and the crates' and
 * policy's READMEs. */
export function markdownFiles(root = ROOT) {
  const docs = readdirSync(join(root, "docs")).filter((f) => f.endsWith(".md")).map((f) => join(root, "docs", f));
  return [join(root, "README.md"), ...docs, ...["agent/README.md", "policy/README.md"].map((f) => join(root, f))].filter(existsSync);
}

/** `text` without fenced code blocks and inline code spans. */
function withoutCode(text) {
  return text.replace(/^(```|~~~)[^\n]*\n[\s\S]*?^\1[^\n]*$/gm, "").replace(/(`+)[\s\S]*?\1/g, "");
}

/** The link targets of a markdown text: inline links and images, and
 * reference definitions. */
export function links(text) {
  const prose = withoutCode(text);
  const found = [];
  for (const m of prose.matchAll(/!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)) found.push(m[1]);
  for (const m of prose.matchAll(/^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)/gm)) found.push(m[1]);
  return found;
}

/** GitHub's id of each heading of a markdown text, duplicates numbered. */
export function anchors(text) {
  const seen = new Map();
  const ids = new Set();
  const plain = text.replace(/^(```|~~~)[^\n]*\n[\s\S]*?^\1[^\n]*$/gm, "");
  for (const m of plain.matchAll(/^#{1,6}\s+(.+?)\s*#*\s*$/gm)) {
    const base = m[1]
      .replace(/!?\[([^\]]*)\]\([^)]*\)/g, "$1")
      .toLowerCase()
      .replace(/[^\p{L}\p{N}\s_-]/gu, "")
      .replace(/\s/g, "-");
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    ids.add(n ? `${base}-${n}` : base);
  }
  for (const m of text.matchAll(/<a\s+(?:name|id)="([^"]+)"/g)) ids.add(m[1]);
  return ids;
}

/** Every broken relative link of `files`, as "file: target (why)". */
export function brokenLinks(files, root = ROOT) {
  const broken = [];
  for (const file of files) {
    const text = readFileSync(file, "utf8");
    for (const target of links(text)) {
      if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // https:, mailto:
      const [path, anchor] = target.split("#", 2);
      const resolved = path ? join(dirname(file), decodeURIComponent(path)) : file;
      const where = `${relative(root, file)}: ${target}`;
      if (!existsSync(resolved)) {
        broken.push(`${where} (no file ${relative(root, resolved)})`);
      } else if (anchor && resolved.endsWith(".md") && !anchors(readFileSync(resolved, "utf8")).has(anchor)) {
        broken.push(`${where} (no heading #${anchor} in ${relative(root, resolved)})`);
      }
    }
  }
  return broken;
}

test("every relative link in the README and docs/ resolves, anchors included", () => {
  const files = markdownFiles();
  assert.ok(files.length >= 5, `markdown files found: ${files.map((f) => relative(ROOT, f))}`);
  assert.ok(files.some((f) => links(readFileSync(f, "utf8")).length > 0), "the files have links to check");
  assert.deepEqual(brokenLinks(files), []);
});

test("a missing file, a missing heading and a heading with code are told apart", () => {
  const dir = mkdtempSync(join(tmpdir(), "callfence-links-"));
  try {
    writeFileSync(join(dir, "b.md"), "# Run it `make dev`, locally!\n\n## Run it `make dev`, locally!\n");
    const a = join(dir, "a.md");
    writeFileSync(
      a,
      [
        "[ok](b.md#run-it-make-dev-locally) [second](b.md#run-it-make-dev-locally-1) [self](#top)",
        "# Top",
        "[gone](c.md) [no heading](b.md#nowhere) ![img](missing.png) [web](https://example.com/x.md)",
        "`[in code](nope.md)`",
        "```",
        "[in a block](nope.md)",
        "```",
        "[ref]: d.md",
      ].join("\n"),
    );
    assert.deepEqual(brokenLinks([a], dir), [
      "a.md: c.md (no file c.md)",
      "a.md: b.md#nowhere (no heading #nowhere in b.md)",
      "a.md: missing.png (no file missing.png)",
      "a.md: d.md (no file d.md)",
    ]);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
