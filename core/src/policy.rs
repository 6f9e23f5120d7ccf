//! The routing policy: which node a new inbound call prefers (SPEC §4, §5).
//!
//! [`validate`] turns the business panel's document into a [`RoutingPolicy`]
//! (or every problem found), checked against the current node registry and
//! stamped with each caller override's `created_at`. [`RoutingPolicy::resolve`]
//! is the first paragraph of SPEC §5: an unexpired caller override for
//! `from`, else the line whose `called_number` is `to`, else `default_node`.
//! Whether the preferred node may actually take the call is eligibility's
//! and selection's business, not this module's.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::problem::{pointer_segment, Problem, Problems};
use crate::registry::{is_node_id, matches_class, NodeRegistry, Role};
use crate::time::{format_ms, parse_ms};

/// The value of the policy's `schema` field.
pub const POLICY_SCHEMA: &str = "riff_node_routing_policy_v1";

/// At most this many lines.
pub const MAX_LINES: usize = 1000;
/// At most this many caller overrides.
pub const MAX_OVERRIDES: usize = 1000;
/// Longest override `note`, in characters.
pub const MAX_NOTE_CHARS: usize = 200;
/// An override expires at most this long after it was first stored.
pub const MAX_OVERRIDE_MS: i64 = 24 * 3600 * 1000;

/// One called number and the node it prefers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Line {
    /// Canonical E.164 number callers dial.
    pub called_number: String,
    /// The node this line prefers.
    pub preferred_node: String,
    /// The line's own first fallback, if any.
    pub fallback_node: Option<String>,
}

/// A temporary routing preference for one caller (routing only, never
/// privileges).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallerOverride {
    /// The node this caller's calls prefer.
    pub preferred_node: String,
    /// When the override stops applying (Unix ms; it applies while
    /// `now_ms < expires_at_ms`).
    pub expires_at_ms: i64,
    /// When the server first stored this override (Unix ms).
    pub created_at_ms: i64,
    /// The operator's note, at most 200 characters.
    pub note: Option<String>,
}

/// A validated routing policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutingPolicy {
    /// Preferred when neither an override nor a line applies; a stable node
    /// or a `fallback_approved` candidate.
    pub default_node: String,
    /// Line id → line.
    pub by_line: BTreeMap<String, Line>,
    /// Caller (canonical E.164) → override.
    pub by_caller: BTreeMap<String, CallerOverride>,
}

/// Which rule chose the preferred node of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// An unexpired caller override for `from`.
    CallerOverride,
    /// The line whose `called_number` is `to`.
    Line,
    /// The policy's `default_node`.
    Default,
    /// An outgoing session claimed by the node that dialled it.
    Claim,
}

impl Rule {
    /// The wire name: `caller_override`, `line`, `default` or `claim`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Rule::CallerOverride => "caller_override",
            Rule::Line => "line",
            Rule::Default => "default",
            Rule::Claim => "claim",
        }
    }
}

/// The outcome of resolution: who a call prefers, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resolution {
    /// The rule that matched.
    pub rule: Rule,
    /// The line `to` matched, if any (also under a caller override).
    pub line_id: Option<String>,
    /// The preferred node.
    pub prefers: String,
    /// The `fallback_node` of the line `to` matched, if any (also under a
    /// caller override): the first fallback in SPEC §5's order.
    pub line_fallback: Option<String>,
}

impl RoutingPolicy {
    /// The stored form of the policy: `schema`, `default_node`, `by_line`
    /// and `by_caller` with `created_at` and `expires_at` as RFC 3339 with
    /// milliseconds. [`validate`] accepts it back (`created_at` is ignored
    /// on input).
    pub fn to_json(&self) -> Value {
        let by_line: Map<String, Value> = self
            .by_line
            .iter()
            .map(|(id, line)| {
                let mut obj = Map::new();
                obj.insert(
                    "called_number".into(),
                    Value::from(line.called_number.clone()),
                );
                obj.insert(
                    "preferred_node".into(),
                    Value::from(line.preferred_node.clone()),
                );
                if let Some(fallback) = &line.fallback_node {
                    obj.insert("fallback_node".into(), Value::from(fallback.clone()));
                }
                (id.clone(), Value::Object(obj))
            })
            .collect();
        let by_caller: Map<String, Value> = self
            .by_caller
            .iter()
            .map(|(caller, o)| {
                let mut obj = Map::new();
                obj.insert(
                    "preferred_node".into(),
                    Value::from(o.preferred_node.clone()),
                );
                obj.insert("expires_at".into(), Value::from(format_ms(o.expires_at_ms)));
                obj.insert("created_at".into(), Value::from(format_ms(o.created_at_ms)));
                if let Some(note) = &o.note {
                    obj.insert("note".into(), Value::from(note.clone()));
                }
                (caller.clone(), Value::Object(obj))
            })
            .collect();
        let mut doc = Map::new();
        doc.insert("schema".into(), Value::from(POLICY_SCHEMA));
        doc.insert(
            "default_node".into(),
            Value::from(self.default_node.clone()),
        );
        doc.insert("by_line".into(), Value::Object(by_line));
        doc.insert("by_caller".into(), Value::Object(by_caller));
        Value::Object(doc)
    }

    /// The line whose `called_number` equals `to` (already normalised).
    pub fn line_for(&self, to: &str) -> Option<(&str, &Line)> {
        self.by_line
            .iter()
            .find(|(_, line)| line.called_number == to)
            .map(|(id, line)| (id.as_str(), line))
    }

    /// Line id → called number: what every node should serve, and the input
    /// of the routing hash.
    pub fn routing_lines(&self) -> BTreeMap<String, String> {
        self.by_line
            .iter()
            .map(|(id, line)| (id.clone(), line.called_number.clone()))
            .collect()
    }

    /// SPEC §5 resolution for a new inbound session. `from` and `to` arrive
    /// normalised (or absent); an override applies while
    /// `now_ms < expires_at_ms`.
    pub fn resolve(&self, from: Option<&str>, to: Option<&str>, now_ms: i64) -> Resolution {
        let line = to.and_then(|to| self.line_for(to));
        let line_id = line.map(|(id, _)| id.to_string());
        let line_fallback = line.and_then(|(_, l)| l.fallback_node.clone());
        let active = from
            .and_then(|from| self.by_caller.get(from))
            .filter(|o| o.expires_at_ms > now_ms);
        let (rule, prefers) = match (active, line) {
            (Some(o), _) => (Rule::CallerOverride, o.preferred_node.clone()),
            (None, Some((_, l))) => (Rule::Line, l.preferred_node.clone()),
            (None, None) => (Rule::Default, self.default_node.clone()),
        };
        Resolution {
            rule,
            line_id,
            prefers,
            line_fallback,
        }
    }

    /// Every node the policy names (default, lines, fallbacks, overrides).
    pub fn named_nodes(&self) -> BTreeSet<&str> {
        let mut out = BTreeSet::new();
        out.insert(self.default_node.as_str());
        for line in self.by_line.values() {
            out.insert(line.preferred_node.as_str());
            if let Some(fallback) = &line.fallback_node {
                out.insert(fallback.as_str());
            }
        }
        for o in self.by_caller.values() {
            out.insert(o.preferred_node.as_str());
        }
        out
    }
}

/// True when `text` matches `^[a-z0-9_]{1,64}$` (a line id).
pub fn is_line_id(text: &str) -> bool {
    matches_class(text, 1, 64, |b| {
        b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'
    })
}

/// True when `text` is canonical E.164, `^\+[1-9][0-9]{1,14}$`. Documents
/// must carry this exact form; nothing is normalised.
pub fn is_canonical_e164(text: &str) -> bool {
    match text.strip_prefix('+') {
        Some(digits) => {
            matches_class(digits, 2, 15, |b| b.is_ascii_digit()) && !digits.starts_with('0')
        }
        None => false,
    }
}

/// Validates a routing policy document against every SPEC §4 rule.
///
/// Nodes are checked against `registry`. Each caller override is stamped
/// with `created_at`: the one `previous` (the policy in force) holds for the
/// same caller, else `now_ms`; a `created_at` in the document is ignored.
/// Overrides already expired at `now_ms` are dropped silently. A top-level
/// `revision` is the compare-and-set precondition and is ignored here; any
/// other unknown field is a problem. On failure, every problem is returned.
pub fn validate(
    doc: &Value,
    registry: &NodeRegistry,
    previous: Option<&RoutingPolicy>,
    now_ms: i64,
) -> Result<RoutingPolicy, Vec<Problem>> {
    let mut problems = Problems::new();
    let mut policy = RoutingPolicy {
        default_node: String::new(),
        by_line: BTreeMap::new(),
        by_caller: BTreeMap::new(),
    };
    let Some(top) = doc.as_object() else {
        problems.push("", "the routing policy must be a JSON object");
        return problems.into_result(policy);
    };
    for key in top.keys() {
        if !matches!(
            key.as_str(),
            "schema" | "default_node" | "by_line" | "by_caller" | "revision"
        ) {
            problems.push(
                format!("/{}", pointer_segment(key)),
                "unknown field (a policy has schema, default_node, by_line, by_caller and revision)",
            );
        }
    }
    match top.get("schema") {
        Some(Value::String(s)) if s == POLICY_SCHEMA => {}
        Some(_) => problems.push("/schema", format!("must be \"{POLICY_SCHEMA}\"")),
        None => problems.push(
            "/schema",
            format!("is required and must be \"{POLICY_SCHEMA}\""),
        ),
    }

    match top.get("default_node") {
        None => problems.push(
            "/default_node",
            "is required: the node that takes calls no other rule matches",
        ),
        Some(v) => {
            if let Some(id) = named_node(v, "/default_node", registry, &mut problems) {
                let entry = registry.get(&id);
                if entry.is_some_and(|e| e.role == Role::Candidate && !e.fallback_approved) {
                    problems.push(
                        "/default_node",
                        format!("{id} is a candidate without fallback_approved; the default must be a stable node or a fallback_approved candidate"),
                    );
                }
                policy.default_node = id;
            }
        }
    }

    match top.get("by_line") {
        None => {}
        Some(Value::Object(lines)) => {
            policy.by_line = by_line(lines, registry, &mut problems);
        }
        Some(_) => problems.push("/by_line", "must be an object of line id to line"),
    }

    match top.get("by_caller") {
        None => {}
        Some(Value::Object(callers)) => {
            policy.by_caller = by_caller(callers, registry, previous, now_ms, &mut problems);
        }
        Some(_) => problems.push(
            "/by_caller",
            "must be an object of caller number to override",
        ),
    }

    problems.into_result(policy)
}

/// A field that names a node: a string, a valid node id, registered.
fn named_node(
    value: &Value,
    path: &str,
    registry: &NodeRegistry,
    problems: &mut Problems,
) -> Option<String> {
    let Some(id) = value.as_str() else {
        problems.push(path, "must be a string naming a node of the registry");
        return None;
    };
    if !is_node_id(id) {
        problems.push(
            path,
            "is not a node id (1 to 32 characters of A-Z, a-z, 0-9, _ or -)",
        );
        return None;
    }
    if registry.get(id).is_none() {
        problems.push(
            path,
            format!("names node {id}, which is not in the node registry"),
        );
        return None;
    }
    Some(id.to_string())
}

/// An optional string field, where `null` is the same as absent.
fn optional<'a>(obj: &'a Map<String, Value>, field: &str) -> Option<&'a Value> {
    obj.get(field).filter(|v| !v.is_null())
}

fn by_line(
    lines: &Map<String, Value>,
    registry: &NodeRegistry,
    problems: &mut Problems,
) -> BTreeMap<String, Line> {
    if lines.len() > MAX_LINES {
        problems.push(
            "/by_line",
            format!("has {} lines; at most {MAX_LINES} are allowed", lines.len()),
        );
    }
    let mut out = BTreeMap::new();
    // Called number → the line that has it.
    let mut numbers: BTreeMap<&str, &str> = BTreeMap::new();
    for (id, value) in lines {
        let path = format!("/by_line/{}", pointer_segment(id));
        let mut ok = is_line_id(id);
        if !ok {
            problems.push(
                path.clone(),
                "line id must be 1 to 64 characters of a-z, 0-9 or _",
            );
        }
        let Some(obj) = value.as_object() else {
            problems.push(path, "a line must be a JSON object");
            continue;
        };
        for key in obj.keys() {
            if !matches!(
                key.as_str(),
                "called_number" | "preferred_node" | "fallback_node"
            ) {
                problems.push(format!("{path}/{}", pointer_segment(key)), "unknown field");
                ok = false;
            }
        }
        let called_number = match obj.get("called_number") {
            None => {
                problems.push(format!("{path}/called_number"), "is required");
                None
            }
            Some(Value::String(n)) if is_canonical_e164(n) => {
                if let Some(other) = numbers.get(n.as_str()) {
                    problems.push(
                        format!("{path}/called_number"),
                        format!("{n} is already the called number of line {other}; each number belongs to one line"),
                    );
                    ok = false;
                } else {
                    numbers.insert(n.as_str(), id.as_str());
                }
                Some(n.clone())
            }
            Some(_) => {
                problems.push(
                    format!("{path}/called_number"),
                    "must be a canonical E.164 number (+ then 2 to 15 digits, no leading 0, no spaces)",
                );
                None
            }
        };
        let preferred_node = match obj.get("preferred_node") {
            None => {
                problems.push(format!("{path}/preferred_node"), "is required");
                None
            }
            Some(v) => named_node(v, &format!("{path}/preferred_node"), registry, problems),
        };
        let fallback_node = match optional(obj, "fallback_node") {
            None => Some(None),
            Some(v) => {
                named_node(v, &format!("{path}/fallback_node"), registry, problems).map(Some)
            }
        };
        if let (true, Some(called_number), Some(preferred_node), Some(fallback_node)) =
            (ok, called_number, preferred_node, fallback_node)
        {
            out.insert(
                id.clone(),
                Line {
                    called_number,
                    preferred_node,
                    fallback_node,
                },
            );
        }
    }
    out
}

fn by_caller(
    callers: &Map<String, Value>,
    registry: &NodeRegistry,
    previous: Option<&RoutingPolicy>,
    now_ms: i64,
    problems: &mut Problems,
) -> BTreeMap<String, CallerOverride> {
    if callers.len() > MAX_OVERRIDES {
        problems.push(
            "/by_caller",
            format!(
                "has {} caller overrides; at most {MAX_OVERRIDES} are allowed",
                callers.len()
            ),
        );
    }
    let mut out = BTreeMap::new();
    for (caller, value) in callers {
        let path = format!("/by_caller/{}", pointer_segment(caller));
        let mut ok = is_canonical_e164(caller);
        if !ok {
            problems.push(
                path.clone(),
                "caller must be a canonical E.164 number (+ then 2 to 15 digits, no leading 0, no spaces)",
            );
        }
        let Some(obj) = value.as_object() else {
            problems.push(path, "an override must be a JSON object");
            continue;
        };
        let expires_at_ms = match obj.get("expires_at") {
            None => {
                problems.push(
                    format!("{path}/expires_at"),
                    "is required: an RFC 3339 time at most 24 h after the override is first stored",
                );
                None
            }
            Some(v) => {
                let ms = v.as_str().and_then(parse_ms);
                if ms.is_none() {
                    problems.push(
                        format!("{path}/expires_at"),
                        "must be an RFC 3339 time such as 2026-11-30T12:00:00.000Z",
                    );
                }
                ms
            }
        };
        if expires_at_ms.is_some_and(|ms| ms <= now_ms) {
            // Already expired: dropped from the stored document, never a
            // problem, so a GET-then-PUT round trip cannot fail on it.
            continue;
        }
        for key in obj.keys() {
            if !matches!(
                key.as_str(),
                "preferred_node" | "expires_at" | "note" | "created_at"
            ) {
                problems.push(format!("{path}/{}", pointer_segment(key)), "unknown field");
                ok = false;
            }
        }
        let preferred_node = match obj.get("preferred_node") {
            None => {
                problems.push(format!("{path}/preferred_node"), "is required");
                None
            }
            Some(v) => named_node(v, &format!("{path}/preferred_node"), registry, problems),
        };
        let note = match optional(obj, "note") {
            None => Some(None),
            Some(Value::String(note)) if note.chars().count() <= MAX_NOTE_CHARS => {
                Some(Some(note.clone()))
            }
            Some(_) => {
                problems.push(
                    format!("{path}/note"),
                    format!("must be a string of at most {MAX_NOTE_CHARS} characters"),
                );
                None
            }
        };
        let created_at_ms = previous
            .and_then(|p| p.by_caller.get(caller))
            .map_or(now_ms, |o| o.created_at_ms);
        if let Some(expires) = expires_at_ms {
            if expires > created_at_ms.saturating_add(MAX_OVERRIDE_MS) {
                problems.push(
                    format!("{path}/expires_at"),
                    format!(
                        "must be at most 24 h after the override was first stored ({}), that is no later than {}; to renew it, remove it in one write and add it again in a later one",
                        format_ms(created_at_ms),
                        format_ms(created_at_ms.saturating_add(MAX_OVERRIDE_MS)),
                    ),
                );
                ok = false;
            }
        }
        if let (true, Some(expires_at_ms), Some(preferred_node), Some(note)) =
            (ok, expires_at_ms, preferred_node, note)
        {
            out.insert(
                caller.clone(),
                CallerOverride {
                    preferred_node,
                    expires_at_ms,
                    created_at_ms,
                    note,
                },
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry;
    use serde_json::json;

    const NOW: i64 = 1_796_000_000_000; // 2026-11-30T00:53:20.000Z
    const HOUR: i64 = 3600 * 1000;

    fn key(seed: u8) -> String {
        crate::encoding::b64_encode(
            ed25519_dalek::SigningKey::from_bytes(&[seed; 32])
                .verifying_key()
                .as_bytes(),
        )
    }

    fn reg() -> NodeRegistry {
        let node = |role: &str, seed: u8, approved: bool| {
            json!({"role": role, "origin_url": format!("https://n{seed}.example/callfence/telnyx"),
                   "keys": {"k": key(seed)}, "fallback_approved": approved, "admin_drained": false})
        };
        registry::validate(
            &json!({"schema": registry::NODES_SCHEMA, "nodes": {
                "M1": node("stable", 1, false),
                "M2": node("stable", 2, false),
                "M3": node("candidate", 3, false),
                "M4": node("candidate", 4, true),
            }}),
            false,
        )
        .expect("registry fixture")
    }

    fn at(ms: i64) -> String {
        format_ms(ms)
    }

    fn good() -> Value {
        json!({
            "schema": POLICY_SCHEMA,
            "revision": 3,
            "default_node": "M1",
            "by_line": {
                "property_management_ca": {"called_number": "+15102160079", "preferred_node": "M3", "fallback_node": "M1"},
                "front_desk": {"called_number": "+15105550123", "preferred_node": "M2"}
            },
            "by_caller": {
                "+14155550100": {"preferred_node": "M3", "expires_at": at(NOW + 2 * HOUR), "note": "canary"}
            }
        })
    }

    fn check(doc: &Value) -> Result<RoutingPolicy, Vec<Problem>> {
        validate(doc, &reg(), None, NOW)
    }

    fn paths(doc: &Value) -> Vec<String> {
        match check(doc) {
            Ok(_) => vec![],
            Err(problems) => problems.into_iter().map(|p| p.path).collect(),
        }
    }

    fn with(path: &str, value: Value) -> Value {
        let mut doc = good();
        *doc.pointer_mut(path).expect("path exists in the fixture") = value;
        doc
    }

    fn without(parent: &str, field: &str) -> Value {
        let mut doc = good();
        doc.pointer_mut(parent)
            .and_then(Value::as_object_mut)
            .expect("object")
            .remove(field);
        doc
    }

    #[test]
    fn accepts_the_spec_shape() {
        let p = check(&good()).expect("valid");
        assert_eq!(p.default_node, "M1");
        assert_eq!(p.by_line.len(), 2);
        assert_eq!(p.by_line["front_desk"].fallback_node, None);
        let o = &p.by_caller["+14155550100"];
        assert_eq!(o.created_at_ms, NOW);
        assert_eq!(o.expires_at_ms, NOW + 2 * HOUR);
        assert_eq!(o.note.as_deref(), Some("canary"));
    }

    #[test]
    fn to_json_round_trips_with_created_at() {
        let p = check(&good()).expect("valid");
        let doc = p.to_json();
        assert_eq!(doc["schema"], POLICY_SCHEMA);
        assert_eq!(doc["by_caller"]["+14155550100"]["created_at"], at(NOW));
        assert!(doc.get("revision").is_none());
        let again = validate(&doc, &reg(), Some(&p), NOW + HOUR).expect("round trip");
        assert_eq!(again, p);
    }

    #[test]
    fn document_shape_schema_and_unknown_fields() {
        assert_eq!(paths(&json!("policy")), [""]);
        assert_eq!(
            paths(&with("/schema", json!("callfence_nodes_v1"))),
            ["/schema"]
        );
        assert_eq!(paths(&without("", "schema")), ["/schema"]);
        let mut doc = good();
        doc["extra"] = json!(true);
        doc["by_line"]["front_desk"]["colour"] = json!("red");
        doc["by_caller"]["+14155550100"]["priority"] = json!(1);
        assert_eq!(
            paths(&doc),
            [
                "/extra",
                "/by_line/front_desk/colour",
                "/by_caller/+14155550100/priority"
            ]
        );
    }

    #[test]
    fn revision_and_client_created_at_are_ignored() {
        let mut doc = good();
        doc["revision"] = json!("whatever");
        doc["by_caller"]["+14155550100"]["created_at"] = json!("1999-01-01T00:00:00Z");
        let p = check(&doc).expect("valid");
        assert_eq!(p.by_caller["+14155550100"].created_at_ms, NOW);
    }

    #[test]
    fn by_line_and_by_caller_may_be_absent() {
        let doc = json!({"schema": POLICY_SCHEMA, "default_node": "M2"});
        let p = check(&doc).expect("valid");
        assert!(p.by_line.is_empty() && p.by_caller.is_empty());
        assert_eq!(paths(&with("/by_line", json!([]))), ["/by_line"]);
        assert_eq!(paths(&with("/by_caller", json!(null))), ["/by_caller"]);
    }

    #[test]
    fn default_node_is_registered_and_stable_or_approved() {
        assert_eq!(paths(&without("", "default_node")), ["/default_node"]);
        assert_eq!(
            paths(&with("/default_node", json!("M9"))),
            ["/default_node"]
        );
        assert_eq!(
            paths(&with("/default_node", json!("bad id"))),
            ["/default_node"]
        );
        assert_eq!(paths(&with("/default_node", json!(1))), ["/default_node"]);
        assert_eq!(
            paths(&with("/default_node", json!("M3"))),
            ["/default_node"]
        );
        assert!(check(&with("/default_node", json!("M4"))).is_ok());
        assert!(check(&with("/default_node", json!("M2"))).is_ok());
    }

    #[test]
    fn line_ids_follow_the_pattern() {
        for bad in ["Front", "front-desk", "", "a b", &"a".repeat(65)] {
            let mut doc = good();
            doc["by_line"][bad] = json!({"called_number": "+15550001111", "preferred_node": "M1"});
            assert_eq!(
                paths(&doc),
                [format!("/by_line/{}", pointer_segment(bad))],
                "{bad:?}"
            );
        }
        assert!(is_line_id(&"a".repeat(64)));
        assert!(is_line_id("line_9"));
    }

    #[test]
    fn called_numbers_are_canonical_and_unique() {
        for bad in [
            "15102160079",
            "+05102160079",
            "+1 510 216 0079",
            "+1",
            "+1234567890123456",
            "tel:+15102160079",
        ] {
            assert_eq!(
                paths(&with("/by_line/front_desk/called_number", json!(bad))),
                ["/by_line/front_desk/called_number"],
                "{bad}"
            );
        }
        assert_eq!(
            paths(&with(
                "/by_line/front_desk/called_number",
                json!(15105550123u64)
            )),
            ["/by_line/front_desk/called_number"]
        );
        assert_eq!(
            paths(&without("/by_line/front_desk", "called_number")),
            ["/by_line/front_desk/called_number"]
        );
        // The line seen second is the one refused.
        let dup = paths(&with(
            "/by_line/front_desk/called_number",
            json!("+15102160079"),
        ));
        assert_eq!(dup.len(), 1);
        assert!(dup[0].ends_with("/called_number"), "{dup:?}");
        assert!(is_canonical_e164("+12"));
        assert!(is_canonical_e164("+123456789012345"));
    }

    #[test]
    fn line_nodes_must_exist() {
        assert_eq!(
            paths(&with("/by_line/front_desk/preferred_node", json!("M9"))),
            ["/by_line/front_desk/preferred_node"]
        );
        assert_eq!(
            paths(&without("/by_line/front_desk", "preferred_node")),
            ["/by_line/front_desk/preferred_node"]
        );
        assert_eq!(
            paths(&with(
                "/by_line/property_management_ca/fallback_node",
                json!("M9")
            )),
            ["/by_line/property_management_ca/fallback_node"]
        );
        // A candidate may be preferred by a line (that is the canary).
        assert!(check(&with("/by_line/front_desk/preferred_node", json!("M3"))).is_ok());
        // fallback_node is optional; null is the same as absent.
        let p = check(&with(
            "/by_line/property_management_ca/fallback_node",
            json!(null),
        ))
        .expect("valid");
        assert_eq!(p.by_line["property_management_ca"].fallback_node, None);
    }

    #[test]
    fn at_most_1000_lines_and_1000_overrides() {
        let lines = |n: usize| -> Value {
            (0..n)
                .map(|i| {
                    (
                        format!("l{i}"),
                        json!({"called_number": format!("+1555{i:07}"), "preferred_node": "M1"}),
                    )
                })
                .collect::<Map<String, Value>>()
                .into()
        };
        assert!(check(&with("/by_line", lines(1000))).is_ok());
        assert_eq!(paths(&with("/by_line", lines(1001))), ["/by_line"]);
        let callers = |n: usize| -> Value {
            (0..n)
                .map(|i| {
                    (
                        format!("+1444{i:07}"),
                        json!({"preferred_node": "M2", "expires_at": at(NOW + HOUR)}),
                    )
                })
                .collect::<Map<String, Value>>()
                .into()
        };
        assert!(check(&with("/by_caller", callers(1000))).is_ok());
        assert_eq!(paths(&with("/by_caller", callers(1001))), ["/by_caller"]);
    }

    #[test]
    fn caller_keys_are_canonical_e164() {
        for bad in ["14155550100", "+1 415 555 0100", "anonymous", "+0123"] {
            let mut doc = good();
            doc["by_caller"][bad] = json!({"preferred_node": "M1", "expires_at": at(NOW + HOUR)});
            assert_eq!(paths(&doc), [format!("/by_caller/{bad}")], "{bad}");
        }
    }

    #[test]
    fn override_fields() {
        let base = "/by_caller/+14155550100";
        assert_eq!(
            paths(&with(&format!("{base}/preferred_node"), json!("M9"))),
            [format!("{base}/preferred_node")]
        );
        assert_eq!(
            paths(&without(base, "preferred_node")),
            [format!("{base}/preferred_node")]
        );
        assert_eq!(
            paths(&without(base, "expires_at")),
            [format!("{base}/expires_at")]
        );
        for bad in [
            json!("tomorrow"),
            json!("2026-11-30"),
            json!(1796000000000u64),
        ] {
            assert_eq!(
                paths(&with(&format!("{base}/expires_at"), bad)),
                [format!("{base}/expires_at")]
            );
        }
        assert_eq!(paths(&with(base, json!("M1"))), [base.to_string()]);
        // An override may prefer any registered node, even a candidate.
        assert!(check(&with(&format!("{base}/preferred_node"), json!("M3"))).is_ok());
    }

    #[test]
    fn note_at_most_200_characters() {
        let base = "/by_caller/+14155550100/note";
        assert!(check(&with(base, json!("é".repeat(200)))).is_ok());
        assert!(check(&with(base, json!(null))).is_ok());
        assert_eq!(paths(&with(base, json!("x".repeat(201)))), [base]);
        assert_eq!(paths(&with(base, json!(5))), [base]);
    }

    #[test]
    fn expires_at_at_most_24h_after_created_at() {
        let base = "/by_caller/+14155550100/expires_at";
        assert!(check(&with(base, json!(at(NOW + 24 * HOUR)))).is_ok());
        assert_eq!(paths(&with(base, json!(at(NOW + 24 * HOUR + 1)))), [base]);
        // Offsets are accepted and compared as instants.
        assert!(check(&with(base, json!("2026-11-30T10:00:00.000+01:00"))).is_ok());
    }

    #[test]
    fn created_at_is_kept_from_previous_so_overrides_cannot_be_renewed() {
        let first = check(&good()).expect("valid");
        let later = NOW + 20 * HOUR;
        // Rewriting with a new expiry 23 h from now is 43 h after created_at.
        let doc = with(
            "/by_caller/+14155550100/expires_at",
            json!(at(later + 23 * HOUR)),
        );
        let problems = validate(&doc, &reg(), Some(&first), later).expect_err("renewal refused");
        assert_eq!(problems[0].path, "/by_caller/+14155550100/expires_at");
        assert!(problems[0].problem.contains("24 h"));
        // Within the original window it is fine and keeps created_at.
        let doc = with(
            "/by_caller/+14155550100/expires_at",
            json!(at(NOW + 24 * HOUR)),
        );
        let p = validate(&doc, &reg(), Some(&first), later).expect("valid");
        assert_eq!(p.by_caller["+14155550100"].created_at_ms, NOW);
        // A caller the previous policy does not have is stamped now.
        let mut doc = good();
        doc["by_caller"]["+14155550199"] =
            json!({"preferred_node": "M2", "expires_at": at(later + 23 * HOUR)});
        doc["by_caller"]["+14155550100"]["expires_at"] = json!(at(NOW + 24 * HOUR));
        let p = validate(&doc, &reg(), Some(&first), later).expect("valid");
        assert_eq!(p.by_caller["+14155550199"].created_at_ms, later);
    }

    #[test]
    fn expired_overrides_are_dropped_silently() {
        let mut doc = good();
        doc["by_caller"]["+14155550111"] =
            json!({"preferred_node": "M9", "expires_at": at(NOW), "junk": 1});
        doc["by_caller"]["+14155550122"] =
            json!({"preferred_node": "M2", "expires_at": at(NOW - HOUR)});
        let p = check(&doc).expect("valid");
        assert_eq!(p.by_caller.keys().collect::<Vec<_>>(), ["+14155550100"]);
        // A stored override that has since expired survives a GET-then-PUT.
        let stored = check(&good()).expect("valid");
        let p = validate(&stored.to_json(), &reg(), Some(&stored), NOW + 3 * HOUR).expect("valid");
        assert!(p.by_caller.is_empty());
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let doc = json!({
            "schema": "x", "default_node": "M3", "more": 1,
            "by_line": {"Bad": {"called_number": "123", "preferred_node": "M9", "fallback_node": 3, "x": 1}},
            "by_caller": {"123": {"preferred_node": "M9", "expires_at": "soon", "note": 1}}
        });
        let problems = check(&doc).expect_err("invalid");
        let got: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
        for want in [
            "/more",
            "/schema",
            "/default_node",
            "/by_line/Bad",
            "/by_line/Bad/x",
            "/by_line/Bad/called_number",
            "/by_line/Bad/preferred_node",
            "/by_line/Bad/fallback_node",
            "/by_caller/123",
            "/by_caller/123/expires_at",
            "/by_caller/123/preferred_node",
            "/by_caller/123/note",
        ] {
            assert!(got.contains(&want), "missing {want} in {got:?}");
        }
    }

    fn policy() -> RoutingPolicy {
        check(&good()).expect("valid")
    }

    #[test]
    fn resolve_caller_override_first_with_the_line_context() {
        let r = policy().resolve(Some("+14155550100"), Some("+15105550123"), NOW);
        assert_eq!(r.rule, Rule::CallerOverride);
        assert_eq!(r.prefers, "M3");
        assert_eq!(r.line_id.as_deref(), Some("front_desk"));
        assert_eq!(r.line_fallback, None);
        let r = policy().resolve(Some("+14155550100"), Some("+15102160079"), NOW);
        assert_eq!(r.rule, Rule::CallerOverride);
        assert_eq!(r.line_id.as_deref(), Some("property_management_ca"));
        assert_eq!(r.line_fallback.as_deref(), Some("M1"));
        let r = policy().resolve(Some("+14155550100"), None, NOW);
        assert_eq!(
            (r.rule, r.prefers.as_str(), r.line_id),
            (Rule::CallerOverride, "M3", None)
        );
    }

    #[test]
    fn resolve_ignores_an_expired_override() {
        let expires = NOW + 2 * HOUR;
        let r = policy().resolve(Some("+14155550100"), Some("+15105550123"), expires - 1);
        assert_eq!(r.rule, Rule::CallerOverride);
        let r = policy().resolve(Some("+14155550100"), Some("+15105550123"), expires);
        assert_eq!(r.rule, Rule::Line);
        assert_eq!(r.prefers, "M2");
    }

    #[test]
    fn resolve_line_then_default() {
        let r = policy().resolve(Some("+14155559999"), Some("+15102160079"), NOW);
        assert_eq!(
            r,
            Resolution {
                rule: Rule::Line,
                line_id: Some("property_management_ca".into()),
                prefers: "M3".into(),
                line_fallback: Some("M1".into()),
            }
        );
        let r = policy().resolve(None, Some("+15550000000"), NOW);
        assert_eq!(
            r,
            Resolution {
                rule: Rule::Default,
                line_id: None,
                prefers: "M1".into(),
                line_fallback: None,
            }
        );
        assert_eq!(policy().resolve(None, None, NOW).rule, Rule::Default);
    }

    #[test]
    fn helpers() {
        let p = policy();
        assert_eq!(
            p.line_for("+15105550123").map(|(id, _)| id),
            Some("front_desk")
        );
        assert!(p.line_for("+15550000000").is_none());
        let lines = p.routing_lines();
        assert_eq!(lines["property_management_ca"], "+15102160079");
        assert_eq!(lines.len(), 2);
        assert_eq!(
            p.named_nodes().into_iter().collect::<Vec<_>>(),
            ["M1", "M2", "M3"]
        );
        assert_eq!(Rule::CallerOverride.as_str(), "caller_override");
        assert_eq!(
            serde_json::to_value(Rule::CallerOverride).ok(),
            Some(json!("caller_override"))
        );
        for rule in [Rule::Line, Rule::Default, Rule::Claim] {
            assert_eq!(serde_json::to_value(rule).ok(), Some(json!(rule.as_str())));
        }
    }
}
