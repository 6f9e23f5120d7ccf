//! The JSON Schemas in `policy/` and the validators in `core` agree: the
//! example documents pass both, every document in `policy/invalid/` is
//! refused by both, and anything the validators accept serialises to a
//! document the schemas accept. The validators never panic on arbitrary JSON.
//!
//! Files in `policy/invalid/` are named `<nodes|policy|shards>.<rule>.json`; the
//! prefix says which schema and validator apply. Each breaks one rule, so the
//! validator must report exactly one problem for it.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use boon::{Compiler, SchemaIndex, Schemas};
use callfence_core::policy::{self, RoutingPolicy};
use callfence_core::registry::{self, NodeRegistry};
use callfence_core::shard_map;
use callfence_core::time::parse_ms;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

/// A fixed "now" for the policy checks: 2026-11-30T06:00:00Z, so the
/// overrides in the fixtures (expiring 2026-11-30T12:00:00Z) are live and
/// within 24 h.
fn now_ms() -> i64 {
    parse_ms("2026-11-30T06:00:00.000Z").expect("fixed time")
}

fn policy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../policy")
}

fn load(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

struct Compiled {
    schemas: Schemas,
    nodes: SchemaIndex,
    policy: SchemaIndex,
    shards: SchemaIndex,
}

/// The schemas, compiled once, with `format` asserted (draft 2020-12 treats
/// it as an annotation unless asked).
fn compiled() -> &'static Compiled {
    static COMPILED: OnceLock<Compiled> = OnceLock::new();
    COMPILED.get_or_init(|| {
        let mut schemas = Schemas::new();
        let mut compiler = Compiler::new();
        compiler.enable_format_assertions();
        let mut index = |file: &str| {
            let doc = load(&policy_dir().join(file));
            let id = doc["$id"].as_str().expect("$id").to_string();
            compiler
                .add_resource(&id, doc)
                .unwrap_or_else(|e| panic!("{file}: {e}"));
            compiler
                .compile(&id, &mut schemas)
                .unwrap_or_else(|e| panic!("{file}: {e:#}"))
        };
        let nodes = index("nodes.schema.json");
        let policy = index("policy.schema.json");
        let shards = index("shards.schema.json");
        Compiled {
            schemas,
            nodes,
            policy,
            shards,
        }
    })
}

fn schema_errors(index: SchemaIndex, doc: &Value) -> Option<String> {
    compiled()
        .schemas
        .validate(doc, index)
        .err()
        .map(|e| format!("{e}"))
}

fn example_registry() -> NodeRegistry {
    registry::validate(&load(&policy_dir().join("nodes.example.json")), true)
        .unwrap_or_else(|p| panic!("nodes.example.json: {p:?}"))
}

#[test]
fn examples_pass_schema_and_validator() {
    let c = compiled();
    let nodes = load(&policy_dir().join("nodes.example.json"));
    assert_eq!(schema_errors(c.nodes, &nodes), None);
    let reg = registry::validate(&nodes, true).expect("registry example is valid");
    assert_eq!(reg.nodes.len(), 3);
    assert_eq!(reg.stable_ids().collect::<Vec<_>>(), ["M1", "M2"]);
    // Its plaintext origins are for local runs only.
    let refused = registry::validate(&nodes, false).expect_err("http needs allow_plaintext");
    assert_eq!(refused.len(), 3);
    assert!(refused.iter().all(|p| p.path.ends_with("/origin_url")));

    let doc = load(&policy_dir().join("policy.example.json"));
    assert_eq!(schema_errors(c.policy, &doc), None);
    let pol = policy::validate(&doc, &reg, None, now_ms()).expect("policy example is valid");
    assert_eq!(pol.default_node, "M1");
    assert_eq!(pol.by_line.len(), 2);
    assert!(pol.by_caller.is_empty());

    let doc = load(&policy_dir().join("shards.example.json"));
    assert_eq!(schema_errors(c.shards, &doc), None);
    let map = shard_map::validate(&doc).expect("shard map example is valid");
    assert_eq!(map.call_shards, 1);

    // The canonical forms the server stores and serves pass the schemas too.
    assert_eq!(schema_errors(c.nodes, &reg.to_json()), None);
    assert_eq!(schema_errors(c.policy, &pol.to_json()), None);
    assert_eq!(schema_errors(c.shards, &map.to_json()), None);
}

#[test]
fn example_dev_keys_are_the_seeded_keys() {
    let reg = example_registry();
    for (node, seed) in [("M1", 1u8), ("M2", 2), ("M3", 3)] {
        let want = ed25519_dalek::SigningKey::from_bytes(&[seed; 32]).verifying_key();
        assert_eq!(reg.verifying_key(node, "dev1"), Some(want), "{node}");
    }
}

/// The caller override example documented in policy/README.md.
#[test]
fn readme_override_example_passes_both() {
    let mut doc = load(&policy_dir().join("policy.example.json"));
    doc["by_caller"] = json!({
        "+14155550100": {
            "preferred_node": "M3",
            "expires_at": "2026-11-30T12:00:00.000Z",
            "note": "canary: route the QA phone to M3 for today"
        }
    });
    assert_eq!(schema_errors(compiled().policy, &doc), None);
    let pol = policy::validate(&doc, &example_registry(), None, now_ms()).expect("valid");
    let stored = pol.to_json();
    assert_eq!(schema_errors(compiled().policy, &stored), None);
    assert_eq!(
        stored["by_caller"]["+14155550100"]["created_at"],
        "2026-11-30T06:00:00.000Z"
    );
    let r = pol.resolve(Some("+14155550100"), Some("+15102160079"), now_ms());
    assert_eq!(r.prefers, "M3");
    assert_eq!(r.line_fallback.as_deref(), Some("M1"));
}

#[test]
fn every_invalid_document_is_refused_by_schema_and_validator() {
    let reg = example_registry();
    let c = compiled();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(policy_dir().join("invalid"))
        .expect("policy/invalid exists")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    entries.sort();
    assert!(
        entries.len() >= 20,
        "expected the invalid corpus, found {}",
        entries.len()
    );
    let (mut nodes_seen, mut policy_seen, mut shards_seen) = (0, 0, 0);
    for path in entries {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .expect("utf-8 name")
            .to_string();
        let doc = load(&path);
        let (schema, problems) = if name.starts_with("nodes.") {
            nodes_seen += 1;
            (c.nodes, registry::validate(&doc, true).err())
        } else if name.starts_with("policy.") {
            policy_seen += 1;
            (c.policy, policy::validate(&doc, &reg, None, now_ms()).err())
        } else if name.starts_with("shards.") {
            shards_seen += 1;
            (c.shards, shard_map::validate(&doc).err())
        } else {
            panic!("{name}: name must start with nodes., policy. or shards.");
        };
        assert!(
            schema_errors(schema, &doc).is_some(),
            "{name}: the schema accepts it"
        );
        let problems = problems.unwrap_or_else(|| panic!("{name}: the validator accepts it"));
        assert_eq!(
            problems.len(),
            1,
            "{name}: breaks one rule, but the validator reports {problems:?}"
        );
        assert!(!problems[0].problem.is_empty(), "{name}");
    }
    assert!(nodes_seen > 0 && policy_seen > 0 && shards_seen > 0);
}

// ---- property tests -------------------------------------------------------

/// Strings that steer arbitrary documents toward the validators' deep paths.
fn interesting_string() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("callfence_nodes_v1".to_string()),
        Just("riff_node_routing_policy_v1".to_string()),
        Just("M1".to_string()),
        Just("M2".to_string()),
        Just("M3".to_string()),
        Just("stable".to_string()),
        Just("candidate".to_string()),
        Just("+15102160079".to_string()),
        Just("+14155550100".to_string()),
        Just("2026-11-30T12:00:00.000Z".to_string()),
        Just("2026-11-29T12:00:00.000Z".to_string()),
        Just("2026-12-30T12:00:00.000Z".to_string()),
        Just("https://m1.example.com/callfence/telnyx".to_string()),
        Just("http://[::1]:8701/callfence/telnyx".to_string()),
        Just("iojj3XQJ8ZX9UtstPLpdcspnCb8dlBIb83SIAbQPb1w=".to_string()),
        Just("AQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=".to_string()),
        Just("9b4082d0e2f1a3b4c5d6e7f8091a2b3c4d5e6f70".to_string()),
        "[a-zA-Z0-9_+:/.@#-]{0,24}",
        ".{0,40}",
    ]
}

fn field_name() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "schema", "revision", "nodes", "role", "origin_url", "keys", "fallback_approved",
            "admin_drained", "max_calls", "canary_go", "allowed_shas", "default_node",
            "by_line", "by_caller", "called_number", "preferred_node", "fallback_node",
            "expires_at", "created_at", "note", "M1", "M3", "dev1", "front_desk",
            "+14155550100", "", "a/b~c",
        ])
        .prop_map(String::from),
        1 => interesting_string(),
    ]
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (0i64..20_000).prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        interesting_string().prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            prop::collection::btree_map(field_name(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<String, Value>>())),
        ]
    })
}

/// Every JSON pointer into `doc`, the root included.
fn pointers(doc: &Value, at: String, out: &mut Vec<String>) {
    out.push(at.clone());
    match doc {
        Value::Object(m) => {
            for (k, v) in m {
                pointers(
                    v,
                    format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")),
                    out,
                );
            }
        }
        Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                pointers(v, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

/// An example document with one value replaced by arbitrary JSON.
fn mutated(file: &'static str) -> impl Strategy<Value = Value> {
    let doc = load(&policy_dir().join(file));
    let mut all = Vec::new();
    pointers(&doc, String::new(), &mut all);
    (prop::sample::select(all), arb_json()).prop_map(move |(pointer, value)| {
        let mut out = doc.clone();
        if let Some(slot) = out.pointer_mut(&pointer) {
            *slot = value;
        }
        out
    })
}

/// Whatever a validator accepts round-trips through its canonical form, and
/// that form satisfies the schema.
fn check_registry(doc: &Value) -> Result<(), TestCaseError> {
    for plaintext in [false, true] {
        if let Ok(reg) = registry::validate(doc, plaintext) {
            let stored = reg.to_json();
            prop_assert_eq!(registry::validate(&stored, plaintext).ok(), Some(reg));
            prop_assert_eq!(schema_errors(compiled().nodes, &stored), None);
        }
    }
    Ok(())
}

fn check_policy(
    doc: &Value,
    reg: &NodeRegistry,
    previous: Option<&RoutingPolicy>,
) -> Result<(), TestCaseError> {
    if let Ok(pol) = policy::validate(doc, reg, previous, now_ms()) {
        let stored = pol.to_json();
        let again = policy::validate(&stored, reg, Some(&pol), now_ms());
        prop_assert_eq!(again.ok(), Some(pol.clone()));
        prop_assert_eq!(schema_errors(compiled().policy, &stored), None);
        let r = pol.resolve(Some("+14155550100"), Some("+15102160079"), now_ms());
        prop_assert!(reg.get(&r.prefers).is_some());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn validators_never_panic_on_arbitrary_json(doc in arb_json()) {
        let reg = example_registry();
        check_registry(&doc)?;
        check_policy(&doc, &reg, None)?;
        let _ = callfence_core::document::expected_revision(None, &doc);
    }

    #[test]
    fn validators_never_panic_on_mutated_registries(doc in mutated("nodes.example.json")) {
        check_registry(&doc)?;
    }

    #[test]
    fn validators_never_panic_on_mutated_policies(doc in mutated("policy.example.json")) {
        let reg = example_registry();
        let previous = policy::validate(&load(&policy_dir().join("policy.example.json")), &reg, None, now_ms()).ok();
        check_policy(&doc, &reg, previous.as_ref())?;
    }
}
