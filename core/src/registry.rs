//! The node registry: which phone nodes exist, where their origins are, which
//! keys sign for them and what the operator allows each one to do (SPEC §4).
//!
//! [`validate`] turns an untrusted JSON document into a [`NodeRegistry`], or
//! reports every problem it found with a JSON-pointer path. The registry is
//! the only source of node identity: node-signed requests are checked
//! against [`NodeRegistry::verifying_key`], and a policy may only name nodes
//! that are registered here.

use std::collections::{BTreeMap, BTreeSet};

use ed25519_dalek::VerifyingKey;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::encoding::b64_decode;
use crate::origin_host;
use crate::problem::{pointer_segment, Problem, Problems};

/// The value of the registry's `schema` field.
pub const NODES_SCHEMA: &str = "callfence_nodes_v1";

/// At most this many nodes in one registry.
pub const MAX_NODES: usize = 64;
/// Every node has at least one key and at most this many (rotation).
pub const MAX_KEYS_PER_NODE: usize = 4;
/// Longest `origin_url`, in bytes.
pub const MAX_ORIGIN_URL: usize = 2048;
/// Longest `allowed_shas` list.
pub const MAX_ALLOWED_SHAS: usize = 32;
/// Largest `max_calls`.
pub const MAX_MAX_CALLS: u64 = 10_000;

/// The fields a node entry may carry; anything else is a problem.
const NODE_FIELDS: [&str; 8] = [
    "role",
    "origin_url",
    "keys",
    "fallback_approved",
    "admin_drained",
    "max_calls",
    "canary_go",
    "allowed_shas",
];

/// What the operator lets a node do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A production node: may be the default and is a last-resort fallback.
    Stable,
    /// A canary: takes calls it is preferred for only with `canary_go`, and
    /// is reached as a fallback only when `fallback_approved`.
    Candidate,
}

impl Role {
    /// The wire name: `stable` or `candidate`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Role::Stable => "stable",
            Role::Candidate => "candidate",
        }
    }

    fn parse(text: &str) -> Option<Role> {
        match text {
            "stable" => Some(Role::Stable),
            "candidate" => Some(Role::Candidate),
            _ => None,
        }
    }
}

/// One registered node, as validated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeEntry {
    /// `stable` or `candidate`.
    pub role: Role,
    /// Where the edge forwards this node's webhooks (https, or http when the
    /// deployment allows plaintext origins). Compared as an exact string
    /// with the origin the node reports in its heartbeat.
    pub origin_url: String,
    /// Key id → standard base64 of a 32-byte Ed25519 public key (1 to 4).
    pub keys: BTreeMap<String, String>,
    /// A candidate may be reached as a fallback (and be `default_node`).
    pub fallback_approved: bool,
    /// The operator drains this node: it takes no new calls.
    pub admin_drained: bool,
    /// The operator's capacity cap (1 to 10000), if any.
    pub max_calls: Option<u32>,
    /// A candidate may take calls it is preferred for.
    pub canary_go: bool,
    /// When set, only these runtime SHAs (40 lowercase hex) are eligible.
    pub allowed_shas: Option<Vec<String>>,
}

/// The validated node registry: node id → entry, in byte order of the ids.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRegistry {
    /// Node id → entry.
    pub nodes: BTreeMap<String, NodeEntry>,
}

impl NodeRegistry {
    /// The registry as a document (with `schema`, without `revision`), in
    /// the form [`validate`] accepts.
    pub fn to_json(&self) -> Value {
        let mut nodes = Map::new();
        for (id, entry) in &self.nodes {
            let mut node = Map::new();
            node.insert("role".into(), Value::from(entry.role.as_str()));
            node.insert("origin_url".into(), Value::from(entry.origin_url.clone()));
            let keys: Map<String, Value> = entry
                .keys
                .iter()
                .map(|(kid, key)| (kid.clone(), Value::from(key.clone())))
                .collect();
            node.insert("keys".into(), Value::Object(keys));
            node.insert(
                "fallback_approved".into(),
                Value::from(entry.fallback_approved),
            );
            node.insert("admin_drained".into(), Value::from(entry.admin_drained));
            if let Some(max) = entry.max_calls {
                node.insert("max_calls".into(), Value::from(max));
            }
            node.insert("canary_go".into(), Value::from(entry.canary_go));
            if let Some(shas) = &entry.allowed_shas {
                node.insert("allowed_shas".into(), Value::from(shas.clone()));
            }
            nodes.insert(id.clone(), Value::Object(node));
        }
        let mut doc = Map::new();
        doc.insert("schema".into(), Value::from(NODES_SCHEMA));
        doc.insert("nodes".into(), Value::Object(nodes));
        Value::Object(doc)
    }

    /// The entry of a node, if registered.
    pub fn get(&self, node: &str) -> Option<&NodeEntry> {
        self.nodes.get(node)
    }

    /// The public key `kid` of `node`, if both are registered.
    pub fn verifying_key(&self, node: &str, kid: &str) -> Option<VerifyingKey> {
        let text = self.nodes.get(node)?.keys.get(kid)?;
        decode_key(text).ok()
    }

    /// The ids of the stable nodes, in byte order.
    pub fn stable_ids(&self) -> impl Iterator<Item = &str> {
        self.nodes
            .iter()
            .filter(|(_, entry)| entry.role == Role::Stable)
            .map(|(id, _)| id.as_str())
    }
}

/// True when `text` matches `^[A-Za-z0-9_-]{1,32}$`: the pattern of node ids
/// and of key ids.
pub fn is_node_id(text: &str) -> bool {
    matches_class(text, 1, 32, |b| {
        b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
    })
}

/// True when `text` is `min..=max` bytes, each accepted by `allowed`: a
/// regex-free `^[class]{min,max}$`.
pub(crate) fn matches_class(text: &str, min: usize, max: usize, allowed: fn(u8) -> bool) -> bool {
    let bytes = text.as_bytes();
    (min..=max).contains(&bytes.len()) && bytes.iter().all(|&b| allowed(b))
}

/// Validates a node registry document against every SPEC §4 rule.
///
/// `allow_plaintext` is the deployment's `ORIGIN_ALLOW_PLAINTEXT`: when
/// false, origins must be `https://`. A top-level `revision` is the
/// compare-and-set precondition and is ignored here; any other unknown field,
/// anywhere, is a problem. On failure, every problem found is returned.
pub fn validate(doc: &Value, allow_plaintext: bool) -> Result<NodeRegistry, Vec<Problem>> {
    let mut problems = Problems::new();
    let mut registry = NodeRegistry::default();
    let Some(top) = doc.as_object() else {
        problems.push("", "the node registry must be a JSON object");
        return problems.into_result(registry);
    };
    for key in top.keys() {
        if !matches!(key.as_str(), "schema" | "nodes" | "revision") {
            problems.push(
                format!("/{}", pointer_segment(key)),
                "unknown field (a node registry has only schema, nodes and revision)",
            );
        }
    }
    match top.get("schema") {
        Some(Value::String(s)) if s == NODES_SCHEMA => {}
        Some(_) => problems.push("/schema", format!("must be \"{NODES_SCHEMA}\"")),
        None => problems.push(
            "/schema",
            format!("is required and must be \"{NODES_SCHEMA}\""),
        ),
    }
    match top.get("nodes") {
        None => problems.push("/nodes", "is required: an object of node id to node"),
        Some(Value::Object(nodes)) => {
            if nodes.is_empty() {
                problems.push("/nodes", "must register at least one node");
            }
            if nodes.len() > MAX_NODES {
                problems.push(
                    "/nodes",
                    format!("has {} nodes; at most {MAX_NODES} are allowed", nodes.len()),
                );
            }
            // Public key (decoded bytes) → the node that registered it first.
            let mut key_owner: BTreeMap<[u8; 32], String> = BTreeMap::new();
            for (id, value) in nodes {
                let path = format!("/nodes/{}", pointer_segment(id));
                let id_ok = is_node_id(id);
                if !id_ok {
                    problems.push(
                        path.clone(),
                        "node id must be 1 to 32 characters of A-Z, a-z, 0-9, _ or -",
                    );
                }
                if let Some(entry) = node_entry(value, &path, allow_plaintext, &mut problems) {
                    check_key_reuse(id, &entry, &path, &mut key_owner, &mut problems);
                    if id_ok {
                        registry.nodes.insert(id.clone(), entry);
                    }
                }
            }
        }
        Some(_) => problems.push("/nodes", "must be an object of node id to node"),
    }
    problems.into_result(registry)
}

/// One node entry; `None` when any of its fields is wrong (the problems are
/// recorded).
fn node_entry(
    value: &Value,
    path: &str,
    allow_plaintext: bool,
    problems: &mut Problems,
) -> Option<NodeEntry> {
    let Some(obj) = value.as_object() else {
        problems.push(path, "a node must be a JSON object");
        return None;
    };
    let mut ok = true;
    let mut fail = |problems: &mut Problems, field: &str, problem: String| {
        problems.push(format!("{path}/{}", pointer_segment(field)), problem);
        ok = false;
    };
    for key in obj.keys() {
        if !NODE_FIELDS.contains(&key.as_str()) {
            fail(problems, key, "unknown field".into());
        }
    }

    let role = match obj.get("role") {
        None => {
            fail(
                problems,
                "role",
                "is required: \"stable\" or \"candidate\"".into(),
            );
            None
        }
        Some(v) => {
            let role = v.as_str().and_then(Role::parse);
            if role.is_none() {
                fail(
                    problems,
                    "role",
                    "must be \"stable\" or \"candidate\"".into(),
                );
            }
            role
        }
    };

    let origin_url = match obj.get("origin_url") {
        None => {
            fail(problems, "origin_url", "is required".into());
            None
        }
        Some(Value::String(url)) => match check_origin_url(url, allow_plaintext) {
            Ok(()) => Some(url.clone()),
            Err(problem) => {
                fail(problems, "origin_url", problem);
                None
            }
        },
        Some(_) => {
            fail(problems, "origin_url", "must be a string (a URL)".into());
            None
        }
    };

    let keys = node_keys(obj.get("keys"), &format!("{path}/keys"), problems);
    if keys.is_none() {
        ok = false;
    }

    let mut flag = |field: &str, required: bool, problems: &mut Problems| -> bool {
        match obj.get(field) {
            Some(Value::Bool(b)) => *b,
            None if !required => false,
            None => {
                problems.push(
                    format!("{path}/{field}"),
                    "is required: true or false".to_string(),
                );
                ok = false;
                false
            }
            Some(_) => {
                problems.push(
                    format!("{path}/{field}"),
                    "must be true or false".to_string(),
                );
                ok = false;
                false
            }
        }
    };
    let fallback_approved = flag("fallback_approved", true, problems);
    let admin_drained = flag("admin_drained", true, problems);
    let canary_go = flag("canary_go", false, problems);

    let max_calls = match obj.get("max_calls") {
        None => None,
        Some(v) => match v.as_u64() {
            Some(n) if (1..=MAX_MAX_CALLS).contains(&n) => u32::try_from(n).ok(),
            _ => {
                problems.push(
                    format!("{path}/max_calls"),
                    format!("must be a whole number from 1 to {MAX_MAX_CALLS}"),
                );
                ok = false;
                None
            }
        },
    };

    let allowed_shas = match obj.get("allowed_shas") {
        None => None,
        Some(v) => {
            let shas = allowed_shas(v, &format!("{path}/allowed_shas"), problems);
            if shas.is_none() {
                ok = false;
            }
            shas
        }
    };

    match (ok, role, origin_url, keys) {
        (true, Some(role), Some(origin_url), Some(keys)) => Some(NodeEntry {
            role,
            origin_url,
            keys,
            fallback_approved,
            admin_drained,
            max_calls,
            canary_go,
            allowed_shas,
        }),
        _ => None,
    }
}

/// The `keys` object of a node: 1 to 4 key id → valid Ed25519 public key.
fn node_keys(
    value: Option<&Value>,
    path: &str,
    problems: &mut Problems,
) -> Option<BTreeMap<String, String>> {
    let keys = match value {
        None => {
            problems.push(
                path,
                "is required: an object of key id to base64 Ed25519 public key",
            );
            return None;
        }
        Some(Value::Object(keys)) => keys,
        Some(_) => {
            problems.push(
                path,
                "must be an object of key id to base64 Ed25519 public key",
            );
            return None;
        }
    };
    let mut ok = true;
    if keys.is_empty() || keys.len() > MAX_KEYS_PER_NODE {
        problems.push(
            path,
            format!(
                "has {} keys; a node has 1 to {MAX_KEYS_PER_NODE} keys",
                keys.len()
            ),
        );
        ok = false;
    }
    let mut out = BTreeMap::new();
    for (kid, key) in keys {
        let key_path = format!("{path}/{}", pointer_segment(kid));
        if !is_node_id(kid) {
            problems.push(
                key_path.clone(),
                "key id must be 1 to 32 characters of A-Z, a-z, 0-9, _ or -",
            );
            ok = false;
        }
        match key.as_str().map(decode_key) {
            Some(Ok(_)) => {
                out.insert(kid.clone(), key.as_str().unwrap_or_default().to_string());
            }
            Some(Err(problem)) => {
                problems.push(key_path, problem);
                ok = false;
            }
            None => {
                problems.push(
                    key_path,
                    "must be a string: base64 of a 32-byte Ed25519 public key",
                );
                ok = false;
            }
        }
    }
    ok.then_some(out)
}

/// Decodes a registry key: strict standard base64 of 32 bytes that is a
/// valid, not small-order, Ed25519 point.
fn decode_key(text: &str) -> Result<VerifyingKey, String> {
    let bytes = (text.len() <= 64)
        .then(|| b64_decode(text))
        .flatten()
        .ok_or("must be standard base64 (with padding) of a 32-byte Ed25519 public key")?;
    let bytes: [u8; 32] = bytes
        .try_into()
        .map_err(|_| "must decode to exactly 32 bytes (an Ed25519 public key)")?;
    let key = VerifyingKey::from_bytes(&bytes).map_err(|_| "is not a valid Ed25519 public key")?;
    if key.is_weak() {
        return Err("is a weak (small-order) Ed25519 key, which anyone could sign for".into());
    }
    Ok(key)
}

/// Refuses the same public key under two nodes: a node's key must identify
/// that node alone.
fn check_key_reuse(
    id: &str,
    entry: &NodeEntry,
    path: &str,
    key_owner: &mut BTreeMap<[u8; 32], String>,
    problems: &mut Problems,
) {
    for (kid, key) in &entry.keys {
        let Ok(key) = decode_key(key) else { continue };
        match key_owner.get(key.as_bytes()) {
            Some(owner) if owner != id => problems.push(
                format!("{path}/keys/{}", pointer_segment(kid)),
                format!("is already a key of node {owner}; every node needs its own keys"),
            ),
            Some(_) => {}
            None => {
                key_owner.insert(key.to_bytes(), id.to_string());
            }
        }
    }
}

/// `allowed_shas`: 1 to 32 distinct 40-character lowercase hex SHAs.
fn allowed_shas(value: &Value, path: &str, problems: &mut Problems) -> Option<Vec<String>> {
    let Some(list) = value.as_array() else {
        problems.push(
            path,
            "must be a list of 40-character lowercase hex commit SHAs",
        );
        return None;
    };
    let mut ok = true;
    if list.is_empty() || list.len() > MAX_ALLOWED_SHAS {
        problems.push(
            path,
            format!(
                "has {} entries; list 1 to {MAX_ALLOWED_SHAS} SHAs, or leave the field out to allow any",
                list.len()
            ),
        );
        ok = false;
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::with_capacity(list.len().min(MAX_ALLOWED_SHAS));
    for (i, sha) in list.iter().enumerate() {
        match sha.as_str() {
            Some(s) if is_sha(s) => {
                if !seen.insert(s) {
                    problems.push(format!("{path}/{i}"), "is listed twice");
                    ok = false;
                }
                out.push(s.to_string());
            }
            _ => {
                problems.push(
                    format!("{path}/{i}"),
                    "must be a 40-character lowercase hex commit SHA",
                );
                ok = false;
            }
        }
    }
    ok.then_some(out)
}

/// `^[0-9a-f]{40}$`.
fn is_sha(text: &str) -> bool {
    matches_class(text, 40, 40, |b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// An origin URL: `https://host[:port][/path][?query]` (or `http://` when
/// plaintext is allowed), printable ASCII, no user info, no fragment. Unless
/// plaintext is allowed, its host, as the runtime's URL parser reads it,
/// must not be inside the edge's network ([`crate::origin_host`]).
fn check_origin_url(url: &str, allow_plaintext: bool) -> Result<(), String> {
    if url.len() > MAX_ORIGIN_URL {
        return Err(format!("is longer than {MAX_ORIGIN_URL} bytes"));
    }
    if !url.bytes().all(|b| (0x21..=0x7e).contains(&b)) || url.contains('\\') {
        return Err("must be printable ASCII without spaces or backslashes".into());
    }
    let rest = if let Some(rest) = url.strip_prefix("https://") {
        rest
    } else if let Some(rest) = url.strip_prefix("http://") {
        if !allow_plaintext {
            return Err("must be an https:// URL (http:// is accepted only when ORIGIN_ALLOW_PLAINTEXT is true)".into());
        }
        rest
    } else if allow_plaintext {
        return Err("must be an https:// or http:// URL".into());
    } else {
        return Err("must be an https:// URL".into());
    };
    if url.contains('#') {
        return Err("must not have a fragment (#...)".into());
    }
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..end];
    if authority.contains('@') {
        return Err("must not carry user info (user:password@)".into());
    }
    let (host, port) = split_port(authority)?;
    if !is_host(host) {
        return Err(
            "must name a host (letters, digits, dots and hyphens, or a [bracketed] IPv6 address)"
                .into(),
        );
    }
    // Only on a PUT's check: a stored registry is re-read with plaintext
    // allowed, so one written before this rule still loads.
    if !allow_plaintext {
        let parsed = origin_host::parse(host)
            .ok_or("has a host that is not a valid address or name (as a URL parser reads it)")?;
        if let Some(what) = origin_host::internal(&parsed) {
            return Err(format!(
                "names {what}, inside the edge's own network (accepted only when ORIGIN_ALLOW_PLAINTEXT is true)"
            ));
        }
    }
    if let Some(port) = port {
        let valid = matches_class(port, 1, 5, |b| b.is_ascii_digit())
            && !port.starts_with('0')
            && port.parse::<u32>().is_ok_and(|p| p <= 65_535);
        if !valid {
            return Err("has a port that is not a number from 1 to 65535".into());
        }
    }
    Ok(())
}

/// Splits `host[:port]`, minding `[v6]:port`.
fn split_port(authority: &str) -> Result<(&str, Option<&str>), String> {
    if authority.starts_with('[') {
        let close = authority.find(']').ok_or("has an unclosed [ in its host")?;
        let (host, after) = authority.split_at(close + 1);
        return match after {
            "" => Ok((host, None)),
            _ => match after.strip_prefix(':') {
                Some(port) => Ok((host, Some(port))),
                None => Err("has text after its [IPv6] host".into()),
            },
        };
    }
    Ok(match authority.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (authority, None),
    })
}

/// A DNS name or IPv4 address (dot-separated labels of 1 to 63 letters,
/// digits and inner hyphens, at most 253 bytes), or a bracketed IPv6
/// address.
fn is_host(host: &str) -> bool {
    if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return v6.contains(':')
            && matches_class(v6, 2, 45, |b| {
                b.is_ascii_hexdigit() || b == b':' || b == b'.'
            });
    }
    host.len() <= 253
        && host.split('.').all(|label| {
            matches_class(label, 1, 63, |b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

#[cfg(test)]
impl NodeEntry {
    /// A registered node of `role` at `origin_url` with no keys and every
    /// flag and limit off: the starting point of other modules' tests.
    pub(crate) fn bare(role: Role, origin_url: &str) -> Self {
        NodeEntry {
            role,
            origin_url: origin_url.into(),
            keys: BTreeMap::new(),
            fallback_approved: false,
            admin_drained: false,
            max_calls: None,
            canary_go: false,
            allowed_shas: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::SigningKey;
    use serde_json::json;

    fn pubkey(seed: u8) -> String {
        crate::encoding::b64_encode(
            SigningKey::from_bytes(&[seed; 32])
                .verifying_key()
                .as_bytes(),
        )
    }

    fn node(role: &str, origin: &str, seed: u8) -> Value {
        json!({"role": role, "origin_url": origin, "keys": {"k1": pubkey(seed)},
               "fallback_approved": false, "admin_drained": false})
    }

    fn good() -> Value {
        json!({
            "schema": NODES_SCHEMA,
            "revision": 7,
            "nodes": {
                "M1": node("stable", "https://m1.example.com/callfence/telnyx", 1),
                "M2": node("stable", "https://m2.example.com:8443/callfence/telnyx", 2),
                "M3": {"role": "candidate", "origin_url": "https://m3.example.com/callfence/telnyx",
                       "keys": {"k2026a": pubkey(3), "k2026b": pubkey(4)}, "canary_go": true,
                       "fallback_approved": true, "admin_drained": false, "max_calls": 20,
                       "allowed_shas": ["9b4082d0e2f1a3b4c5d6e7f8091a2b3c4d5e6f70"]}
            }
        })
    }

    /// Validates `doc` and returns the problem paths.
    fn paths(doc: &Value, plaintext: bool) -> Vec<String> {
        match validate(doc, plaintext) {
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
    fn accepts_the_spec_shape_and_reads_every_field() {
        let reg = validate(&good(), false).expect("valid");
        assert_eq!(reg.nodes.len(), 3);
        let m3 = reg.get("M3").expect("M3");
        assert_eq!(m3.role, Role::Candidate);
        assert!(m3.canary_go && m3.fallback_approved && !m3.admin_drained);
        assert_eq!(m3.max_calls, Some(20));
        assert_eq!(m3.allowed_shas.as_ref().map(Vec::len), Some(1));
        let m1 = reg.get("M1").expect("M1");
        assert!(!m1.canary_go);
        assert_eq!(m1.max_calls, None);
        assert_eq!(m1.allowed_shas, None);
    }

    #[test]
    fn to_json_round_trips_and_has_no_revision() {
        let reg = validate(&good(), false).expect("valid");
        let doc = reg.to_json();
        assert_eq!(doc["schema"], NODES_SCHEMA);
        assert!(doc.get("revision").is_none());
        assert_eq!(validate(&doc, false).expect("round trip"), reg);
    }

    #[test]
    fn verifying_key_and_stable_ids() {
        let reg = validate(&good(), false).expect("valid");
        let key = reg.verifying_key("M3", "k2026b").expect("key");
        assert_eq!(key, SigningKey::from_bytes(&[4; 32]).verifying_key());
        assert!(reg.verifying_key("M3", "nope").is_none());
        assert!(reg.verifying_key("M9", "k1").is_none());
        assert_eq!(reg.stable_ids().collect::<Vec<_>>(), ["M1", "M2"]);
    }

    #[test]
    fn stable_ids_are_in_byte_order() {
        let doc = json!({"schema": NODES_SCHEMA, "nodes": {
            "b": node("stable", "https://b.example", 1),
            "B": node("stable", "https://bb.example", 2),
            "_": node("stable", "https://u.example", 3),
            "a": node("candidate", "https://a.example", 4)}});
        let reg = validate(&doc, false).expect("valid");
        assert_eq!(reg.stable_ids().collect::<Vec<_>>(), ["B", "_", "b"]);
    }

    #[test]
    fn document_must_be_an_object_with_the_schema() {
        assert_eq!(paths(&json!([]), false), [""]);
        assert_eq!(
            paths(&with("/schema", json!("callfence_nodes_v2")), false),
            ["/schema"]
        );
        assert_eq!(paths(&with("/schema", json!(1)), false), ["/schema"]);
        assert_eq!(paths(&without("", "schema"), false), ["/schema"]);
        assert_eq!(paths(&without("", "nodes"), false), ["/nodes"]);
        assert_eq!(paths(&with("/nodes", json!([])), false), ["/nodes"]);
        assert_eq!(paths(&with("/nodes", json!({})), false), ["/nodes"]);
    }

    #[test]
    fn unknown_fields_are_problems_except_top_level_revision() {
        let mut doc = good();
        doc["extra"] = json!(1);
        doc["nodes"]["M1"]["colour"] = json!("red");
        assert_eq!(paths(&doc, false), ["/extra", "/nodes/M1/colour"]);
        let mut doc = good();
        doc["revision"] = json!("anything");
        assert!(validate(&doc, false).is_ok());
    }

    #[test]
    fn node_ids_follow_the_pattern() {
        for bad in ["", "a b", "M/1", "é", &"x".repeat(33)] {
            let mut doc = good();
            doc["nodes"][bad] = node("stable", "https://x.example", 9);
            assert_eq!(
                paths(&doc, false),
                [format!("/nodes/{}", pointer_segment(bad))],
                "{bad:?}"
            );
        }
        assert!(is_node_id(&"x".repeat(32)));
        assert!(is_node_id("a-Z_9"));
    }

    #[test]
    fn at_most_64_nodes() {
        let mut nodes = Map::new();
        for i in 0..65u8 {
            nodes.insert(format!("N{i}"), node("stable", "https://n.example", i));
        }
        let doc = json!({"schema": NODES_SCHEMA, "nodes": Value::Object(nodes.clone())});
        assert_eq!(paths(&doc, false), ["/nodes"]);
        nodes.remove("N0");
        let doc = json!({"schema": NODES_SCHEMA, "nodes": Value::Object(nodes)});
        assert!(validate(&doc, false).is_ok());
    }

    #[test]
    fn role_is_stable_or_candidate() {
        assert_eq!(
            paths(&with("/nodes/M1/role", json!("primary")), false),
            ["/nodes/M1/role"]
        );
        assert_eq!(
            paths(&with("/nodes/M1/role", json!("Stable")), false),
            ["/nodes/M1/role"]
        );
        assert_eq!(
            paths(&without("/nodes/M1", "role"), false),
            ["/nodes/M1/role"]
        );
    }

    #[test]
    fn required_flags_and_optional_fields() {
        assert_eq!(
            paths(&without("/nodes/M1", "fallback_approved"), false),
            ["/nodes/M1/fallback_approved"]
        );
        assert_eq!(
            paths(&without("/nodes/M1", "admin_drained"), false),
            ["/nodes/M1/admin_drained"]
        );
        assert_eq!(
            paths(&with("/nodes/M1/admin_drained", json!("false")), false),
            ["/nodes/M1/admin_drained"]
        );
        assert_eq!(
            paths(&with("/nodes/M3/canary_go", json!(1)), false),
            ["/nodes/M3/canary_go"]
        );
        for field in ["canary_go", "max_calls", "allowed_shas"] {
            assert!(
                validate(&without("/nodes/M3", field), false).is_ok(),
                "{field}"
            );
        }
    }

    #[test]
    fn keys_one_to_four_with_valid_ids_and_points() {
        assert_eq!(
            paths(&with("/nodes/M1/keys", json!({})), false),
            ["/nodes/M1/keys"]
        );
        assert_eq!(
            paths(&without("/nodes/M1", "keys"), false),
            ["/nodes/M1/keys"]
        );
        assert_eq!(
            paths(&with("/nodes/M1/keys", json!("k")), false),
            ["/nodes/M1/keys"]
        );
        let five: Map<String, Value> = (10..15u8)
            .map(|i| (format!("k{i}"), Value::from(pubkey(i))))
            .collect();
        assert_eq!(
            paths(&with("/nodes/M1/keys", Value::Object(five)), false),
            ["/nodes/M1/keys"]
        );
        let four: Map<String, Value> = (10..14u8)
            .map(|i| (format!("k{i}"), Value::from(pubkey(i))))
            .collect();
        assert!(validate(&with("/nodes/M1/keys", Value::Object(four)), false).is_ok());
        assert_eq!(
            paths(
                &with("/nodes/M1/keys", json!({"bad kid": pubkey(1)})),
                false
            ),
            ["/nodes/M1/keys/bad kid"]
        );
        let thirty_one = crate::encoding::b64_encode(&[7; 31]);
        let not_a_point = crate::encoding::b64_encode(&{
            // y = 2 is not on the curve.
            let mut b = [0u8; 32];
            b[0] = 2;
            b
        });
        let small_order = crate::encoding::b64_encode(&{
            // The identity point (y = 1) has order 1.
            let mut b = [0u8; 32];
            b[0] = 1;
            b
        });
        let unpadded = pubkey(1).trim_end_matches('=').to_string();
        for bad in [
            json!(thirty_one),
            json!(not_a_point),
            json!(small_order),
            json!(unpadded),
            json!(5),
            json!(""),
        ] {
            assert_eq!(
                paths(&with("/nodes/M1/keys", json!({"k1": bad})), false),
                ["/nodes/M1/keys/k1"],
                "{bad}"
            );
        }
    }

    #[test]
    fn a_public_key_belongs_to_one_node() {
        let doc = with("/nodes/M2/keys", json!({"k9": pubkey(1)}));
        assert_eq!(paths(&doc, false), ["/nodes/M2/keys/k9"]);
    }

    #[test]
    fn origin_url_rules() {
        let ok = [
            "https://m1.example.com/callfence/telnyx",
            "https://m1.example.com",
            "https://203.0.113.7:8443/x?y=z",
            "https://[2001:db8::1]:8443/callfence/telnyx",
        ];
        for url in ok {
            assert!(
                validate(&with("/nodes/M1/origin_url", json!(url)), false).is_ok(),
                "{url}"
            );
        }
        let bad = [
            "http://m1.example.com/x",
            "ftp://m1.example.com/x",
            "HTTPS://m1.example.com/x",
            "https://user:pw@m1.example.com/x",
            "https://m1.example.com/x#frag",
            "https://m1.example.com/a b",
            "https://m1.example.com\\@evil/",
            "https:///x",
            "https://m1.example.com:0/x",
            "https://m1.example.com:99999/x",
            "https://m1.example.com:/x",
            "https://[::1/x",
            "https://.example.com/",
            "https://exa_mple.com/",
            "https://example..com/",
            "https://-example.com/",
            "https://example-.com/",
            "https://example.com./",
            "https://m1.example.com:08443/x",
            "https://ex\u{e4}mple.com/",
        ];
        for url in bad {
            assert_eq!(
                paths(&with("/nodes/M1/origin_url", json!(url)), false),
                ["/nodes/M1/origin_url"],
                "{url}"
            );
        }
        let long = format!("https://m1.example.com/{}", "a".repeat(MAX_ORIGIN_URL));
        assert_eq!(
            paths(&with("/nodes/M1/origin_url", json!(long)), false),
            ["/nodes/M1/origin_url"]
        );
        assert_eq!(
            paths(&with("/nodes/M1/origin_url", json!(42)), false),
            ["/nodes/M1/origin_url"]
        );
        assert_eq!(
            paths(&without("/nodes/M1", "origin_url"), false),
            ["/nodes/M1/origin_url"]
        );
    }

    #[test]
    fn internal_origins_are_refused_in_every_spelling_unless_plaintext_is_allowed() {
        let internal = [
            "https://localhost/x",
            "https://LOCALHOST:8443/x",
            "https://api.localhost/x",
            "https://metadata.google.internal/computeMetadata/v1/",
            "https://printer.local/x",
            "https://169.254.169.254/latest/meta-data/",
            "https://127.0.0.1/x",
            "https://2130706433/x",
            "https://0x7f.1/x",
            "https://127.1/x",
            "https://0177.0.0.1/x",
            "https://0.0.0.0/x",
            "https://10.0.0.1:8443/x?y=z",
            "https://172.16.0.1/x",
            "https://192.168.0.1/x",
            "https://100.64.0.1/x",
            "https://[::1]:8443/x",
            "https://[::]/x",
            "https://[fe80::1]/x",
            "https://[fd00::1]/x",
            "https://[::ffff:127.0.0.1]/x",
            "https://[::ffff:7f00:1]/x",
            "https://[::FFFF:A9FE:A9FE]/x",
        ];
        for url in internal {
            let doc = with("/nodes/M1/origin_url", json!(url));
            let problems = validate(&doc, false).unwrap_err();
            assert_eq!(problems.len(), 1, "{url}");
            assert_eq!(problems[0].path, "/nodes/M1/origin_url", "{url}");
            assert!(
                problems[0].problem.contains("ORIGIN_ALLOW_PLAINTEXT"),
                "{url}"
            );
            assert!(validate(&doc, true).is_ok(), "{url} with plaintext allowed");
        }
        // Refused before the host is looked at: user info, a trailing dot,
        // and numbers no URL parser reads as an address.
        for url in [
            "https://a@10.0.0.1/",
            "https://localhost./x",
            "https://256.0.0.1/x",
            "https://09.1/x",
        ] {
            let doc = with("/nodes/M1/origin_url", json!(url));
            assert_eq!(paths(&doc, false), ["/nodes/M1/origin_url"], "{url}");
        }
    }

    #[test]
    fn plaintext_origins_only_when_allowed() {
        let doc = with(
            "/nodes/M1/origin_url",
            json!("http://127.0.0.1:8701/callfence/telnyx"),
        );
        assert_eq!(paths(&doc, false), ["/nodes/M1/origin_url"]);
        assert!(validate(&doc, true).is_ok());
        let doc = with("/nodes/M1/origin_url", json!("ws://127.0.0.1:8701/"));
        assert_eq!(paths(&doc, true), ["/nodes/M1/origin_url"]);
    }

    #[test]
    fn max_calls_bounds() {
        for n in [json!(1), json!(10_000)] {
            assert!(validate(&with("/nodes/M3/max_calls", n), false).is_ok());
        }
        for n in [
            json!(0),
            json!(10_001),
            json!(-1),
            json!(2.5),
            json!("5"),
            json!(null),
        ] {
            assert_eq!(
                paths(&with("/nodes/M3/max_calls", n.clone()), false),
                ["/nodes/M3/max_calls"],
                "{n}"
            );
        }
    }

    #[test]
    fn allowed_shas_rules() {
        let sha = |i: usize| format!("{i:040x}");
        let ok: Vec<String> = (0..32).map(sha).collect();
        assert!(validate(&with("/nodes/M3/allowed_shas", json!(ok)), false).is_ok());
        let too_many: Vec<String> = (0..33).map(sha).collect();
        assert_eq!(
            paths(&with("/nodes/M3/allowed_shas", json!(too_many)), false),
            ["/nodes/M3/allowed_shas"]
        );
        assert_eq!(
            paths(&with("/nodes/M3/allowed_shas", json!([])), false),
            ["/nodes/M3/allowed_shas"]
        );
        assert_eq!(
            paths(&with("/nodes/M3/allowed_shas", json!("abc")), false),
            ["/nodes/M3/allowed_shas"]
        );
        let upper = "9B4082D0E2F1A3B4C5D6E7F8091A2B3C4D5E6F70";
        assert_eq!(
            paths(
                &with("/nodes/M3/allowed_shas", json!([sha(1), upper, "9b40", 7])),
                false
            ),
            [
                "/nodes/M3/allowed_shas/1",
                "/nodes/M3/allowed_shas/2",
                "/nodes/M3/allowed_shas/3"
            ]
        );
        assert_eq!(
            paths(
                &with("/nodes/M3/allowed_shas", json!([sha(1), sha(1)])),
                false
            ),
            ["/nodes/M3/allowed_shas/1"]
        );
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let doc = json!({
            "schema": "x",
            "nodes": {
                "bad id": {"role": "boss", "origin_url": "http://x", "keys": {},
                           "fallback_approved": 1, "admin_drained": false, "max_calls": 0,
                           "allowed_shas": ["zz"], "what": true}
            },
            "more": 1
        });
        let problems = validate(&doc, false).expect_err("invalid");
        let got: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
        for want in [
            "/more",
            "/schema",
            "/nodes/bad id",
            "/nodes/bad id/what",
            "/nodes/bad id/role",
            "/nodes/bad id/origin_url",
            "/nodes/bad id/keys",
            "/nodes/bad id/fallback_approved",
            "/nodes/bad id/max_calls",
            "/nodes/bad id/allowed_shas/0",
        ] {
            assert!(got.contains(&want), "missing {want} in {got:?}");
        }
        assert!(problems.iter().all(|p| !p.problem.is_empty()));
    }

    #[test]
    fn paths_escape_pointer_characters() {
        let mut doc = good();
        doc["nodes"]["a/b~c"] = node("stable", "https://x.example", 9);
        assert_eq!(paths(&doc, false), ["/nodes/a~1b~0c"]);
    }

    #[test]
    fn role_wire_names() {
        assert_eq!(Role::Stable.as_str(), "stable");
        assert_eq!(
            serde_json::to_value(Role::Candidate).ok(),
            Some(json!("candidate"))
        );
    }
}
