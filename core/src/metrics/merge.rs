//! One scrape over several objects (SPEC §16, §17): every call shard's
//! samples merged into the deployment's. `global` (shard 0) gives the base:
//! the directory's gauges (eligibility, beats, revisions, lines) are its
//! alone. From the other shards come their counters, summed with the
//! base's by family and labels (a counter has no `shard` label), each
//! node's open calls, summed, and their own `shard`-labelled gauges.

use super::{Kind, Sample, FAMILIES};
use std::collections::BTreeMap;

/// The gauge whose value a node's calls in every shard add up to.
const NODE_OPEN_CALLS: &str = "callfence_node_open_calls";

/// Merges `scrapes`, one per shard as `(shard, samples)`, into the
/// deployment's samples (see the module documentation). Shard 0's
/// directory gauges are kept as they are; samples of a family the edge
/// does not serve are dropped.
pub fn merge_scrapes(scrapes: &[(u32, Vec<Sample>)]) -> Vec<Sample> {
    let mut merged: BTreeMap<(String, BTreeMap<String, String>), u64> = BTreeMap::new();
    for (shard, samples) in scrapes {
        for sample in samples {
            let Some(family) = FAMILIES.iter().find(|f| f.name == sample.name) else {
                continue;
            };
            let summed = family.kind == Kind::Counter || family.name == NODE_OPEN_CALLS;
            let own = family.labels.contains(&"shard");
            if *shard != 0 && !summed && !own {
                continue;
            }
            let key = (sample.name.clone(), sample.labels.clone());
            let value = merged.entry(key).or_insert(0);
            *value = if summed {
                value.saturating_add(sample.value)
            } else {
                sample.value
            };
        }
    }
    merged
        .into_iter()
        .map(|((name, labels), value)| Sample {
            name,
            labels,
            value,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(name: &str, labels: &[(&str, &str)], value: u64) -> Sample {
        Sample::new(name, labels, value)
    }

    fn value(merged: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<u64> {
        let want = s(name, labels, 0).labels;
        merged
            .iter()
            .find(|m| m.name == name && m.labels == want)
            .map(|m| m.value)
    }

    #[test]
    fn counters_and_node_open_calls_sum_and_the_directory_s_gauges_are_global_s() {
        let global = vec![
            s("callfence_webhooks_total", &[("outcome", "delivered")], 5),
            s("callfence_node_open_calls", &[("node", "M1")], 1),
            s("callfence_node_eligible", &[("node", "M1")], 1),
            s("callfence_open_calls", &[("shard", "0")], 1),
            s("callfence_policy_revision", &[], 3),
        ];
        let calls1 = vec![
            s("callfence_webhooks_total", &[("outcome", "delivered")], 2),
            s("callfence_node_open_calls", &[("node", "M1")], 2),
            s("callfence_node_eligible", &[("node", "M1")], 0),
            s("callfence_open_calls", &[("shard", "1")], 2),
            s("callfence_policy_revision", &[], 2),
            s("not_a_family", &[], 9),
        ];
        let merged = merge_scrapes(&[(0, global), (1, calls1)]);
        let delivered = [("outcome", "delivered")];
        assert_eq!(
            value(&merged, "callfence_webhooks_total", &delivered),
            Some(7)
        );
        assert_eq!(value(&merged, NODE_OPEN_CALLS, &[("node", "M1")]), Some(3));
        assert_eq!(
            value(&merged, "callfence_node_eligible", &[("node", "M1")]),
            Some(1)
        );
        assert_eq!(
            value(&merged, "callfence_open_calls", &[("shard", "0")]),
            Some(1)
        );
        assert_eq!(
            value(&merged, "callfence_open_calls", &[("shard", "1")]),
            Some(2)
        );
        assert_eq!(value(&merged, "callfence_policy_revision", &[]), Some(3));
        assert_eq!(value(&merged, "not_a_family", &[]), None);
    }
}
