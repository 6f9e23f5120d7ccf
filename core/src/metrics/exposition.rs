//! The Prometheus text exposition format, version 0.0.4: one `# HELP` and
//! one `# TYPE` line for every family the edge serves (even one with no
//! sample yet), then its samples sorted by their labels.
//!
//! Samples of unknown families (from a newer Dispatcher during a rolling
//! deploy), with labels other than their family's, or with a label value
//! that is not an id or a code ([`is_label_value`]) are left out.

use super::{is_label_value, Sample, FAMILIES};
use std::fmt::Write;

/// The `Content-Type` of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The exposition of `samples`. Samples of one family with the same
/// labels (from several objects) are added up.
pub fn render(samples: &[Sample]) -> String {
    let mut out = String::new();
    for family in FAMILIES {
        // The help texts are constants with no backslash or newline (the
        // catalogue's test), and label values are ids and codes
        // (`is_label_value`): nothing the format escapes ever occurs.
        let _ = writeln!(out, "# HELP {} {}", family.name, family.help);
        let _ = writeln!(out, "# TYPE {} {}", family.name, family.kind.as_str());
        let mut lines: Vec<(Vec<&str>, u64)> = Vec::new();
        for sample in samples.iter().filter(|s| s.name == family.name) {
            let values: Option<Vec<&str>> = family
                .labels
                .iter()
                .map(|name| sample.labels.get(*name).map(String::as_str))
                .collect();
            let Some(values) = values else { continue };
            if sample.labels.len() != family.labels.len()
                || !values.iter().all(|v| is_label_value(v))
            {
                continue;
            }
            match lines.iter_mut().find(|(v, _)| *v == values) {
                Some((_, sum)) => *sum = sum.saturating_add(sample.value),
                None => lines.push((values, sample.value)),
            }
        }
        lines.sort_by(|a, b| a.0.cmp(&b.0));
        for (values, value) in lines {
            out.push_str(family.name);
            if !values.is_empty() {
                out.push('{');
                for (i, (name, value)) in family.labels.iter().zip(&values).enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    let _ = write!(out, "{name}=\"{value}\"");
                }
                out.push('}');
            }
            let _ = writeln!(out, " {value}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::WEBHOOKS;

    /// Parses an exposition strictly: every line is a comment of a known
    /// form or a sample of a family whose HELP and TYPE came first.
    fn parse(text: &str) -> Vec<(String, String, u64)> {
        let mut helped = Vec::new();
        let mut typed = Vec::new();
        let mut samples = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                helped.push(rest.split(' ').next().unwrap().to_owned());
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(["counter", "gauge"].contains(&kind), "{line}");
                typed.push(name.to_owned());
            } else {
                let (series, value) = line.rsplit_once(' ').unwrap();
                let name = series.split('{').next().unwrap();
                assert!(helped.iter().any(|h| h == name), "no HELP: {line}");
                assert!(typed.iter().any(|t| t == name), "no TYPE: {line}");
                let labels = series[name.len()..].to_owned();
                samples.push((name.to_owned(), labels, value.parse().unwrap()));
            }
        }
        samples
    }

    #[test]
    fn every_family_has_help_and_type_even_without_samples() {
        let text = render(&[]);
        for family in FAMILIES {
            assert!(text.contains(&format!("# HELP {} ", family.name)));
            let kind = family.kind.as_str();
            assert!(text.contains(&format!("# TYPE {} {kind}\n", family.name)));
        }
        assert!(parse(&text).is_empty());
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn samples_are_written_sorted_and_summed_across_objects() {
        let samples = [
            Sample::new(WEBHOOKS, &[("outcome", "refused")], 2),
            Sample::new(WEBHOOKS, &[("outcome", "delivered")], 3),
            Sample::new(WEBHOOKS, &[("outcome", "delivered")], 4),
            Sample::new(
                "callfence_node_heartbeat_age_seconds",
                &[("node", "M1")],
                15,
            ),
            Sample::new("callfence_policy_revision", &[], 7),
        ];
        let text = render(&samples);
        assert!(text.contains(
            "callfence_webhooks_total{outcome=\"delivered\"} 7\ncallfence_webhooks_total{outcome=\"refused\"} 2\n"
        ));
        assert!(text.contains("callfence_node_heartbeat_age_seconds{node=\"M1\"} 15\n"));
        assert!(text.contains("\ncallfence_policy_revision 7\n"));
        assert_eq!(parse(&text).len(), 4);
    }

    #[test]
    fn samples_that_do_not_fit_their_family_are_left_out() {
        let samples = [
            Sample::new("callfence_unknown_total", &[], 1),
            Sample::new(WEBHOOKS, &[], 1),
            Sample::new(WEBHOOKS, &[("outcome", "x"), ("node", "M1")], 1),
            Sample::new(WEBHOOKS, &[("outcome", "+15551230000")], 1),
            Sample::new(WEBHOOKS, &[("outcome", "a\"b")], 1),
        ];
        assert!(parse(&render(&samples)).is_empty());
    }
}
