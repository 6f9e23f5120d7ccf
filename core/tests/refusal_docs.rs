//! The refusals of [`Refusal::every`] and the error codes of
//! `docs/openapi.yaml` are the same pairs of (code, HTTP status): a code
//! added to the one and not the other fails here.
//!
//! The OpenAPI file is read by its structure, not parsed as YAML: under each
//! path's `'NNN':` response, an `error:` property's `const`/`enum`, an
//! example `{error: code}`, and the `$ref`s to `components/responses` and
//! `components/schemas`, followed.

use callfence_core::refusal::Refusal;
use std::collections::{BTreeMap, BTreeSet};

type Pairs = BTreeSet<(String, u16)>;

/// The file's lines as (indent, trimmed text), blank lines dropped.
fn lines(text: &str) -> Vec<(usize, &str)> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| (l.len() - l.trim_start().len(), l.trim()))
        .collect()
}

/// The lines below line `at` that are indented deeper than it.
fn block(lines: &[(usize, &str)], at: usize) -> std::ops::Range<usize> {
    let indent = lines[at].0;
    let end = (at + 1..lines.len())
        .find(|&i| lines[i].0 <= indent)
        .unwrap_or(lines.len());
    at + 1..end
}

/// Named blocks under `components:` → `<section>:` (name → line).
fn components(lines: &[(usize, &str)], section: &str) -> BTreeMap<String, usize> {
    let top = lines
        .iter()
        .position(|&(i, t)| i == 0 && t == "components:")
        .expect("components:");
    let at = block(lines, top)
        .find(|&i| lines[i].0 == 2 && lines[i].1 == format!("{section}:"))
        .unwrap_or_else(|| panic!("components/{section}"));
    block(lines, at)
        .filter(|&i| lines[i].0 == 4)
        .map(|i| (lines[i].1.trim_end_matches(':').to_owned(), i))
        .collect()
}

struct Doc<'a> {
    lines: Vec<(usize, &'a str)>,
    responses: BTreeMap<String, usize>,
    schemas: BTreeMap<String, usize>,
}

impl Doc<'_> {
    /// The error codes a block names, following its references.
    fn codes(&self, range: std::ops::Range<usize>, depth: usize) -> BTreeSet<String> {
        assert!(depth < 8, "references nest too deep");
        let mut out = BTreeSet::new();
        for i in range {
            let (indent, text) = self.lines[i];
            if let Some(rest) = text.split("{error: ").nth(1) {
                out.insert(rest.trim_end_matches('}').trim().to_owned());
            }
            if text == "error:" {
                if let Some(&(next_indent, next)) = self.lines.get(i + 1) {
                    if next_indent > indent {
                        if let Some(code) = next.strip_prefix("const: ") {
                            out.insert(code.trim().to_owned());
                        }
                        if let Some(list) = next.strip_prefix("enum: ") {
                            let list = list.trim().trim_start_matches('[').trim_end_matches(']');
                            out.extend(list.split(',').map(|c| c.trim().to_owned()));
                        }
                    }
                }
            }
            for (prefix, table) in [
                ("#/components/responses/", &self.responses),
                ("#/components/schemas/", &self.schemas),
            ] {
                if let Some(rest) = text.split(prefix).nth(1) {
                    let name = rest.trim_end_matches(['\'', '"']);
                    let at = table[name];
                    out.extend(self.codes(block(&self.lines, at), depth + 1));
                }
            }
        }
        out
    }

    /// Every (code, status) the paths document.
    fn pairs(&self) -> Pairs {
        let paths_end = self
            .lines
            .iter()
            .position(|&(i, t)| i == 0 && t == "components:")
            .unwrap();
        let mut out = Pairs::new();
        for i in 0..paths_end {
            let text = self.lines[i].1;
            let Some(status) = text
                .strip_prefix('\'')
                .and_then(|t| t.strip_suffix("':"))
                .and_then(|t| t.parse::<u16>().ok())
            else {
                continue;
            };
            for code in self.codes(block(&self.lines, i), 0) {
                out.insert((code, status));
            }
        }
        out
    }
}

fn documented() -> Pairs {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.yaml");
    let text = std::fs::read_to_string(path).expect("docs/openapi.yaml");
    let lines = lines(&text);
    let doc = Doc {
        responses: components(&lines, "responses"),
        schemas: components(&lines, "schemas"),
        lines,
    };
    doc.pairs()
}

fn refused() -> Pairs {
    Refusal::every()
        .iter()
        .map(|r| (r.code().to_owned(), r.status()))
        .collect()
}

#[test]
fn every_refusal_is_documented_at_its_status() {
    let documented = documented();
    let missing: Vec<_> = refused().difference(&documented).cloned().collect();
    assert!(
        missing.is_empty(),
        "refusals docs/openapi.yaml does not document (code, status): {missing:?}"
    );
}

#[test]
fn every_documented_error_is_a_refusal() {
    let refused = refused();
    let unknown: Vec<_> = documented().difference(&refused).cloned().collect();
    assert!(
        unknown.is_empty(),
        "docs/openapi.yaml documents (code, status) pairs no Refusal answers: {unknown:?}"
    );
}
