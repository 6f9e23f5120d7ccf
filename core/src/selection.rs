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
