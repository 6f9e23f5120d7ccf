//! Selection: the preferred node if eligible, else the fallback order.
//!
//! Order: the policy's preferred node (as [`Candidacy::Preferred`]), then the
//! `fallback_node` of the line `to` matched (also under a caller override),
//! then `default_node`, then every other stable node in byte order of its id
//! (all as [`Candidacy::Fallback`]). Each node is considered once.

use crate::eligibility::{Candidacy, Reason};
use crate::policy::Resolution;
use crate::registry::{NodeRegistry, Role};
use std::collections::BTreeMap;

/// The outcome of a selection: the chosen node, and why each node considered
/// before it was passed over.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selection {
    /// The first eligible node in order, if any.
    pub chosen: Option<String>,
    /// Node → reason codes, for every node passed over.
    pub reasons: BTreeMap<String, Vec<Reason>>,
}

/// The nodes to try, in order, with how each is reached.
pub fn candidates<'a>(
    resolution: &'a Resolution,
    default_node: &'a str,
    registry: &'a NodeRegistry,
) -> Vec<(&'a str, Candidacy)> {
    let mut order: Vec<(&str, Candidacy)> =
        vec![(resolution.prefers.as_str(), Candidacy::Preferred)];
    let fallbacks = resolution
        .line_fallback
        .as_deref()
        .into_iter()
        .chain(std::iter::once(default_node))
        .chain(
            registry
                .nodes
                .iter()
                .filter(|(_, e)| e.role == Role::Stable)
                .map(|(id, _)| id.as_str()),
        );
    for node in fallbacks {
        if !order.iter().any(|(n, _)| *n == node) {
            order.push((node, Candidacy::Fallback));
        }
    }
    order
}

/// Walks the order and stops at the first eligible node. `reasons_of` is
/// asked only for the nodes actually considered, so the cost is bounded by the
/// number of nodes (and is usually one).
pub fn select<E>(
    resolution: &Resolution,
    default_node: &str,
    registry: &NodeRegistry,
    mut reasons_of: impl FnMut(&str, Candidacy) -> Result<Vec<Reason>, E>,
) -> Result<Selection, E> {
    let mut selection = Selection::default();
    for (node, candidacy) in candidates(resolution, default_node, registry) {
        let reasons = reasons_of(node, candidacy)?;
        if reasons.is_empty() {
            selection.chosen = Some(node.to_owned());
            break;
        }
        selection.reasons.insert(node.to_owned(), reasons);
    }
    Ok(selection)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Rule;
    use crate::registry::NodeEntry;
    use std::convert::Infallible;

    fn entry(role: Role) -> NodeEntry {
        NodeEntry::bare(role, "https://node.example.com/callfence/telnyx")
    }

    /// A registry of `(id, role)`, inserted in the given (not sorted) order.
    fn registry(nodes: &[(&str, Role)]) -> NodeRegistry {
        NodeRegistry {
            nodes: nodes
                .iter()
                .map(|(id, role)| (id.to_string(), entry(*role)))
                .collect(),
        }
    }

    fn resolution(prefers: &str, line_fallback: Option<&str>) -> Resolution {
        Resolution {
            rule: if line_fallback.is_some() {
                Rule::Line
            } else {
                Rule::Default
            },
            line_id: line_fallback.map(|_| "sales".to_string()),
            prefers: prefers.into(),
            line_fallback: line_fallback.map(str::to_string),
        }
    }

    fn order(
        resolution: &Resolution,
        default_node: &str,
        registry: &NodeRegistry,
    ) -> Vec<(String, Candidacy)> {
        candidates(resolution, default_node, registry)
            .into_iter()
            .map(|(n, c)| (n.to_string(), c))
            .collect()
    }

    fn named(list: &[(&str, Candidacy)]) -> Vec<(String, Candidacy)> {
        list.iter().map(|(n, c)| (n.to_string(), *c)).collect()
    }

    #[test]
    fn preferred_then_line_fallback_then_default_then_stable_nodes_by_id() {
        use Candidacy::{Fallback, Preferred};
        let reg = registry(&[
            ("M9", Role::Stable),
            ("M1", Role::Stable),
            ("C1", Role::Candidate),
            ("M10", Role::Stable),
            ("M3", Role::Stable),
        ]);
        assert_eq!(
            order(&resolution("M3", Some("M9")), "M1", &reg),
            // The rest in byte order of the id: "M10" sorts before "M9".
            named(&[
                ("M3", Preferred),
                ("M9", Fallback),
                ("M1", Fallback),
                ("M10", Fallback)
            ])
        );
    }

    #[test]
    fn each_node_is_considered_once() {
        use Candidacy::{Fallback, Preferred};
        let reg = registry(&[("M1", Role::Stable), ("M2", Role::Stable)]);
        // The line's fallback and the default are the preferred node itself.
        assert_eq!(
            order(&resolution("M1", Some("M1")), "M1", &reg),
            named(&[("M1", Preferred), ("M2", Fallback)])
        );
        // The line's fallback is also the default.
        assert_eq!(
            order(&resolution("M2", Some("M1")), "M1", &reg),
            named(&[("M2", Preferred), ("M1", Fallback)])
        );
    }

    #[test]
    fn candidates_are_reached_only_when_named() {
        use Candidacy::{Fallback, Preferred};
        let reg = registry(&[
            ("C1", Role::Candidate),
            ("C2", Role::Candidate),
            ("M1", Role::Stable),
        ]);
        // A candidate named as line fallback or default is in the order
        // (eligibility then judges `fallback_approved`); an unnamed one is not.
        assert_eq!(
            order(&resolution("M1", Some("C1")), "C2", &reg),
            named(&[("M1", Preferred), ("C1", Fallback), ("C2", Fallback)])
        );
        assert_eq!(
            order(&resolution("C1", None), "M1", &reg),
            named(&[("C1", Preferred), ("M1", Fallback)])
        );
    }

    #[test]
    fn nodes_the_registry_lacks_stay_in_the_order() {
        use Candidacy::{Fallback, Preferred};
        // The policy may name a node the registry does not have: it is
        // considered (and refused as `not_registered`), never skipped silently.
        let reg = registry(&[("M1", Role::Stable)]);
        assert_eq!(
            order(&resolution("M7", Some("M8")), "M1", &reg),
            named(&[("M7", Preferred), ("M8", Fallback), ("M1", Fallback)])
        );
    }

    #[test]
    fn select_stops_at_the_first_eligible_node_and_asks_no_further() {
        let reg = registry(&[
            ("M1", Role::Stable),
            ("M2", Role::Stable),
            ("M3", Role::Stable),
        ]);
        let res = resolution("M3", None);
        let mut asked = Vec::new();
        let selection = select(&res, "M1", &reg, |node, candidacy| {
            asked.push((node.to_string(), candidacy));
            Ok::<_, Infallible>(match node {
                "M3" => vec![Reason::AppDown],
                "M1" => vec![Reason::Dirty, Reason::TunnelDown],
                _ => vec![],
            })
        })
        .unwrap();
        assert_eq!(selection.chosen.as_deref(), Some("M2"));
        assert_eq!(
            selection.reasons,
            BTreeMap::from([
                ("M1".to_string(), vec![Reason::Dirty, Reason::TunnelDown]),
                ("M3".to_string(), vec![Reason::AppDown]),
            ])
        );
        assert_eq!(
            asked,
            named(&[
                ("M3", Candidacy::Preferred),
                ("M1", Candidacy::Fallback),
                ("M2", Candidacy::Fallback)
            ])
        );
    }

    #[test]
    fn select_with_nobody_eligible_chooses_none_and_names_every_reason() {
        let reg = registry(&[("M1", Role::Stable), ("M2", Role::Stable)]);
        let selection = select(&resolution("M1", None), "M1", &reg, |_, _| {
            Ok::<_, Infallible>(vec![Reason::HeartbeatStale])
        })
        .unwrap();
        assert_eq!(selection.chosen, None);
        assert_eq!(selection.reasons.keys().collect::<Vec<_>>(), ["M1", "M2"]);
    }

    #[test]
    fn select_passes_on_the_first_error_and_stops() {
        let reg = registry(&[("M1", Role::Stable), ("M2", Role::Stable)]);
        let mut calls = 0;
        let got = select(&resolution("M1", None), "M1", &reg, |_, _| {
            calls += 1;
            Err::<Vec<Reason>, _>("store failed")
        });
        assert_eq!(got, Err("store failed"));
        assert_eq!(calls, 1);
    }
}
