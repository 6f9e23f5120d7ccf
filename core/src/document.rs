//! Versioned documents: the compare-and-set precondition of a PUT (SPEC §4).
//!
//! The documents (the routing policy, the node registry and the shard map)
//! are written by compare-and-set on their revision. The expected revision comes from a
//! strong `If-Match: "N"` header, or, when that header is absent, from a
//! `revision` field in the body (the panel's habit). [`expected_revision`]
//! reads it; comparing it with the stored revision is the engine's job.

use serde_json::Value;

use crate::MAX_SAFE_INTEGER;

/// Largest PUT body for the policy and the registry, in bytes (256 KiB).
pub const MAX_DOCUMENT_BODY: usize = 256 * 1024;

/// Which versioned document.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum DocKind {
    /// The routing policy (`/v1/policy`).
    Policy,
    /// The node registry (`/v1/nodes`).
    Nodes,
    /// The shard map (`/v1/shards`, SPEC §16).
    Shards,
}

impl DocKind {
    /// The document's name: `policy`, `nodes` or `shards`.
    pub fn as_str(&self) -> &'static str {
        match self {
            DocKind::Policy => "policy",
            DocKind::Nodes => "nodes",
            DocKind::Shards => "shards",
        }
    }

    /// Largest accepted PUT body, in bytes (256 KiB for the policy and the
    /// registry, 4 KiB for the shard map).
    pub fn max_body(&self) -> usize {
        match self {
            DocKind::Policy | DocKind::Nodes => MAX_DOCUMENT_BODY,
            DocKind::Shards => crate::shard_map::MAX_SHARDS_BODY,
        }
    }

    /// The value the document's `schema` field must have.
    pub fn schema(&self) -> &'static str {
        match self {
            DocKind::Policy => crate::policy::POLICY_SCHEMA,
            DocKind::Nodes => crate::registry::NODES_SCHEMA,
            DocKind::Shards => crate::shard_map::SHARDS_SCHEMA,
        }
    }
}

/// Why a PUT carries no usable precondition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreconditionError {
    /// Neither `If-Match` nor a body `revision` (HTTP 428).
    Missing,
    /// `If-Match` is not one strong quoted decimal (`"N"`), or the body's
    /// `revision` is not a non-negative integer (HTTP 400).
    Malformed,
}

impl std::fmt::Display for PreconditionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PreconditionError::Missing => {
                "a write needs If-Match: \"<current revision>\" or a revision field in the body"
            }
            PreconditionError::Malformed => {
                "If-Match must be one strong quoted revision such as \"3\", and a body revision a non-negative integer"
            }
        })
    }
}

impl std::error::Error for PreconditionError {}

/// The revision a PUT expects to replace. A present `If-Match` wins and must
/// be exactly one strong quoted decimal (`"0"` creates the first revision;
/// no `W/`, no `*`, no lists, no leading zeros); surrounding spaces and tabs
/// are ignored. Without it, the body's top-level `revision` must be a
/// non-negative JSON integer. Both are at most 2^53 − 1.
pub fn expected_revision(if_match: Option<&str>, body: &Value) -> Result<u64, PreconditionError> {
    if let Some(header) = if_match {
        let inner = header
            .trim_matches([' ', '\t'])
            .strip_prefix('"')
            .and_then(|h| h.strip_suffix('"'))
            .ok_or(PreconditionError::Malformed)?;
        return parse_decimal(inner).ok_or(PreconditionError::Malformed);
    }
    match body.get("revision") {
        None => Err(PreconditionError::Missing),
        Some(v) => v
            .as_u64()
            .filter(|n| *n <= MAX_SAFE_INTEGER)
            .ok_or(PreconditionError::Malformed),
    }
}

/// `0` or `[1-9][0-9]*`, at most 2^53 − 1.
fn parse_decimal(text: &str) -> Option<u64> {
    let canonical = !text.is_empty()
        && text.len() <= 16
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    if !canonical {
        return None;
    }
    text.parse::<u64>().ok().filter(|n| *n <= MAX_SAFE_INTEGER)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kinds() {
        assert_eq!(DocKind::Policy.as_str(), "policy");
        assert_eq!(DocKind::Nodes.as_str(), "nodes");
        assert_eq!(DocKind::Policy.max_body(), 262_144);
        assert_eq!(DocKind::Nodes.max_body(), 262_144);
        assert_eq!(DocKind::Shards.max_body(), 4096);
        assert_eq!(DocKind::Policy.schema(), "riff_node_routing_policy_v1");
        assert_eq!(DocKind::Nodes.schema(), "callfence_nodes_v1");
    }

    #[test]
    fn if_match_wins_over_the_body() {
        let body = json!({"revision": 9});
        assert_eq!(expected_revision(Some("\"3\""), &body), Ok(3));
        assert_eq!(expected_revision(Some("\"0\""), &json!({})), Ok(0));
        assert_eq!(expected_revision(Some(" \"12\"\t"), &body), Ok(12));
        assert_eq!(
            expected_revision(Some("\"9007199254740991\""), &body),
            Ok(MAX_SAFE_INTEGER)
        );
    }

    #[test]
    fn malformed_if_match() {
        let body = json!({"revision": 9});
        for bad in [
            "3",
            "W/\"3\"",
            "*",
            "\"3\", \"4\"",
            "\"\"",
            "\"-1\"",
            "\"03\"",
            "\"3.0\"",
            "\"abc\"",
            "\"9007199254740992\"",
            "\"99999999999999999999\"",
            "",
            "\"",
            "\"3",
        ] {
            assert_eq!(
                expected_revision(Some(bad), &body),
                Err(PreconditionError::Malformed),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn body_revision_when_no_header() {
        assert_eq!(expected_revision(None, &json!({"revision": 0})), Ok(0));
        assert_eq!(expected_revision(None, &json!({"revision": 41})), Ok(41));
        for bad in [
            json!(-1),
            json!(1.5),
            json!("3"),
            json!(null),
            json!(9007199254740992u64),
        ] {
            assert_eq!(
                expected_revision(None, &json!({"revision": bad})),
                Err(PreconditionError::Malformed),
                "{bad}"
            );
        }
    }

    #[test]
    fn neither_is_missing() {
        assert_eq!(
            expected_revision(None, &json!({})),
            Err(PreconditionError::Missing)
        );
        assert_eq!(
            expected_revision(None, &json!([1])),
            Err(PreconditionError::Missing)
        );
        assert!(!PreconditionError::Missing.to_string().is_empty());
    }
}
