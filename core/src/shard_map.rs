//! The shard map (SPEC §16): how many call shards a deployment spreads its
//! calls over, as a versioned document (`GET/PUT /v1/shards`), and the
//! oldest release the deployment can be rolled back to.
//!
//! The map is written like the other documents (§4: compare-and-set,
//! history, `invalid_document`), with `call_shards` from 1 to
//! [`MAX_CALL_SHARDS`].

use crate::problem::{pointer_segment, Problem, Problems};
use serde_json::{json, Value};

/// The value of the map's `schema` field.
pub const SHARDS_SCHEMA: &str = "callfence_shards_v1";

/// The most call shards a map may name (SPEC §16).
pub const MAX_CALL_SHARDS: u64 = 32;

/// Largest accepted `PUT /v1/shards` body, in bytes.
pub const MAX_SHARDS_BODY: usize = 4 * 1024;

/// A valid shard map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardMap {
    /// How many call shards new sessions are placed on (1 to 32).
    pub call_shards: u64,
}

impl Default for ShardMap {
    /// The map before any PUT: one shard, `global`.
    fn default() -> Self {
        Self { call_shards: 1 }
    }
}

impl ShardMap {
    /// The canonical stored form (without its revision).
    pub fn to_json(&self) -> Value {
        json!({"schema": SHARDS_SCHEMA, "call_shards": self.call_shards})
    }

    /// A stored map (a valid one, or `None`).
    pub fn load(stored: &Value) -> Option<ShardMap> {
        let call_shards = stored.get("call_shards")?.as_u64()?;
        (1..=MAX_CALL_SHARDS)
            .contains(&call_shards)
            .then_some(ShardMap { call_shards })
    }
}

/// Checks a shard map document: `schema`, `call_shards` from 1 to 32, no
/// other field but `revision`. Returns every finding.
pub fn validate(doc: &Value) -> Result<ShardMap, Vec<Problem>> {
    let mut problems = Problems::new();
    let mut map = ShardMap::default();
    let Some(top) = doc.as_object() else {
        problems.push("", "the shard map must be a JSON object");
        return problems.into_result(map);
    };
    for key in top.keys() {
        if !matches!(key.as_str(), "schema" | "call_shards" | "revision") {
            problems.push(
                format!("/{}", pointer_segment(key)),
                "unknown field (a shard map has only schema, call_shards and revision)",
            );
        }
    }
    if top.get("schema").and_then(Value::as_str) != Some(SHARDS_SCHEMA) {
        problems.push("/schema", format!("must be \"{SHARDS_SCHEMA}\""));
    }
    match top.get("call_shards").and_then(Value::as_u64) {
        Some(n) if (1..=MAX_CALL_SHARDS).contains(&n) => map.call_shards = n,
        _ => problems.push(
            "/call_shards",
            format!("is required and must be an integer from 1 to {MAX_CALL_SHARDS}"),
        ),
    }
    problems.into_result(map)
}

/// The oldest release a deployment can be rolled back to (SPEC §16,
/// `GET /v1/health` `rollback_floor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RollbackFloor {
    /// The map never had more than one shard within the retention: v1.3
    /// finds every call in `global`.
    V1_3,
    /// A map of more than one shard was in force within the retention:
    /// an older release would strand the other shards' calls.
    V1_4,
}

impl RollbackFloor {
    /// `"v1.3"` or `"v1.4"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            RollbackFloor::V1_3 => "v1.3",
            RollbackFloor::V1_4 => "v1.4",
        }
    }
}

/// One kept revision of the map: its revision, shard count and write time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapRevision {
    /// The revision.
    pub revision: u64,
    /// Its `call_shards`.
    pub call_shards: u64,
    /// When it was written (Unix ms).
    pub written_at_ms: i64,
}

/// The shard counts in force at any time since `since`, from the map's kept
/// revisions, oldest first, as a mask (bit `n - 1` for `n` shards; a
/// revision is in force until the next one is written). `None` when
/// revisions older than the kept ones were replaced since `since`: what
/// they said is unknown.
pub fn in_force_since(kept: &[MapRevision], since: i64) -> Option<u32> {
    let truncated = kept
        .first()
        .is_some_and(|first| first.revision > 1 && first.written_at_ms > since);
    if truncated {
        return None;
    }
    let mut mask = match kept.first() {
        // The map before any PUT (one shard) was in force until the first.
        Some(first) if first.written_at_ms > since => 1,
        Some(_) => 0,
        None => 1,
    };
    for (i, rev) in kept.iter().enumerate() {
        let until = kept.get(i + 1).map_or(i64::MAX, |next| next.written_at_ms);
        if until > since && (1..=MAX_CALL_SHARDS).contains(&rev.call_shards) {
            mask |= 1 << (rev.call_shards - 1);
        }
    }
    Some(mask)
}

/// The rollback floor from the map's kept revisions, oldest first: `V1_4`
/// when a revision of more than one shard was in force at any time since
/// `now_ms - window_ms`, or when what was in force then is unknown (the
/// safe side).
pub fn rollback_floor(kept: &[MapRevision], now_ms: i64, window_ms: i64) -> RollbackFloor {
    match in_force_since(kept, now_ms.saturating_sub(window_ms)) {
        Some(1) => RollbackFloor::V1_3,
        _ => RollbackFloor::V1_4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(doc: Value) -> Vec<(String, String)> {
        validate(&doc)
            .unwrap_err()
            .into_iter()
            .map(|p| (p.path, p.problem))
            .collect()
    }

    #[test]
    fn one_shard_is_valid_with_or_without_a_revision() {
        for doc in [
            json!({"schema": SHARDS_SCHEMA, "call_shards": 1}),
            json!({"schema": SHARDS_SCHEMA, "call_shards": 1, "revision": 4}),
        ] {
            assert_eq!(validate(&doc), Ok(ShardMap { call_shards: 1 }));
        }
        assert_eq!(
            ShardMap::default().to_json(),
            json!({"schema": SHARDS_SCHEMA, "call_shards": 1})
        );
        // A stored map is read as stored; nonsense is not.
        let wide = json!({"schema": SHARDS_SCHEMA, "call_shards": 8});
        assert_eq!(ShardMap::load(&wide), Some(ShardMap { call_shards: 8 }));
        assert_eq!(ShardMap::load(&json!({"call_shards": 0})), None);
        assert_eq!(ShardMap::load(&json!({})), None);
    }

    #[test]
    fn every_finding_is_named_by_its_path() {
        let found = problems(json!({"schema": "x", "call_shards": 0, "extra": true}));
        let paths: Vec<&str> = found.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(paths, ["/extra", "/schema", "/call_shards"]);
        for bad in [json!(33), json!(-1), json!(1.5), json!("2"), Value::Null] {
            let found = problems(json!({"schema": SHARDS_SCHEMA, "call_shards": bad}));
            assert_eq!(found.len(), 1, "{found:?}");
            assert!(found[0].1.contains("from 1 to 32"), "{found:?}");
        }
        assert_eq!(problems(json!([1]))[0].0, "");
    }

    #[test]
    fn every_count_from_one_to_thirty_two_is_valid() {
        for n in 1..=MAX_CALL_SHARDS {
            let doc = json!({"schema": SHARDS_SCHEMA, "call_shards": n});
            assert_eq!(validate(&doc), Ok(ShardMap { call_shards: n }));
        }
    }

    fn rev(revision: u64, call_shards: u64, written_at_ms: i64) -> MapRevision {
        MapRevision {
            revision,
            call_shards,
            written_at_ms,
        }
    }

    #[test]
    fn the_floor_follows_the_history_through_the_retention() {
        const DAY: i64 = 86_400_000;
        let now = 10 * DAY;
        let floor = |kept: &[MapRevision]| rollback_floor(kept, now, DAY);
        assert_eq!(floor(&[]), RollbackFloor::V1_3);
        assert_eq!(floor(&[rev(1, 1, 0), rev(2, 1, now)]), RollbackFloor::V1_3);
        // In force now.
        assert_eq!(floor(&[rev(1, 1, 0), rev(2, 4, 1)]), RollbackFloor::V1_4);
        // Shrunk an hour ago: still within the retention.
        let shrunk = [
            rev(1, 8, 0),
            rev(2, 2, now - 3_600_000),
            rev(3, 1, now - 60_000),
        ];
        assert_eq!(floor(&shrunk), RollbackFloor::V1_4);
        // Shrunk more than the retention ago.
        let long_ago = [rev(1, 8, 0), rev(2, 1, now - DAY - 1)];
        assert_eq!(floor(&long_ago), RollbackFloor::V1_3);
        // Older revisions were dropped and replaced within the retention.
        assert_eq!(floor(&[rev(7, 1, now - 1)]), RollbackFloor::V1_4);
        assert_eq!(floor(&[rev(7, 1, now - DAY - 1)]), RollbackFloor::V1_3);
    }

    #[test]
    fn the_counts_in_force_since_a_time_include_the_map_before_any_put() {
        assert_eq!(in_force_since(&[], 5), Some(0b1));
        let kept = [rev(1, 4, 10), rev(2, 8, 20), rev(3, 2, 30)];
        assert_eq!(in_force_since(&kept, 5), Some(0b1000_1011));
        assert_eq!(in_force_since(&kept, 15), Some(0b1000_1010));
        assert_eq!(in_force_since(&kept, 25), Some(0b1000_0010));
        assert_eq!(in_force_since(&kept, 35), Some(0b10));
        // Revision 1 is gone and revision 2 replaced it after `since`.
        assert_eq!(in_force_since(&kept[1..], 15), None);
        assert_eq!(in_force_since(&kept[1..], 25), Some(0b1000_0010));
    }
}
