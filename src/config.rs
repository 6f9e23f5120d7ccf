//! Configuration: every SPEC §2 variable and secret, read once per isolate
//! into a typed [`Config`] whose capabilities fail closed one by one.
//!
//! A capability is either configured (its typed settings) or
//! [`Misconfigured`] (the names of the variables at fault, never their
//! values). A malformed variable disables only the capabilities that use it:
//!
//! | capability | needs |
//! |---|---|
//! | `ingress` | `TELNYX_PUBLIC_KEY`, `EDGE_SIGNING_KEY` + `EDGE_KEY_ID`, optional `TELNYX_CONNECTION_IDS`, `FORWARD_TIMEOUT_MS`, `SESSION_CAP` |
//! | `node_routes` | `EDGE_SIGNING_KEY` + `EDGE_KEY_ID`, `MEDIA_TOKEN_KEYS`, optional `EDGE_HOSTNAMES` |
//! | `admin` | `ADMIN_TOKENS`, optional `POLICY_TOKENS` and `METRICS_TOKENS`, `ORIGIN_ALLOW_PLAINTEXT` |
//! | `key_publication` (`GET /v1/keys`) | `EDGE_SIGNING_KEY` + `EDGE_KEY_ID`, optional `EDGE_NEXT_PUBLIC_KEYS` |
//!
//! The environment of a Worker is fixed for the life of an isolate, so
//! [`Config::get`] parses it on first use and hands out the same copy after.

use crate::auth::Tokens;
use callfence_core::edge_hosts::EdgeHosts;
use callfence_core::encoding::{b64_decode, b64_encode};
use callfence_core::engine::{EngineConfig, Timing, DEFAULT_SESSION_CAP};
use callfence_core::media::MediaKeys;
use callfence_core::registry::is_node_id;
use callfence_core::telnyx::TelnyxKeys;
use ed25519_dalek::{SigningKey, VerifyingKey};
use serde::Deserialize;
use std::cell::OnceCell;
use std::collections::BTreeSet;
use std::fmt;
use std::rc::Rc;

/// `FORWARD_TIMEOUT_MS` when unset.
pub const DEFAULT_FORWARD_TIMEOUT_MS: u32 = 1_500;
/// Accepted range of `FORWARD_TIMEOUT_MS`.
pub const FORWARD_TIMEOUT_RANGE_MS: std::ops::RangeInclusive<u32> = 100..=30_000;
/// Accepted range of `SESSION_CAP` (unset: the engine's default, 100,000).
pub const SESSION_CAP_RANGE: std::ops::RangeInclusive<i64> = 1..=1_000_000;
/// Most connection ids in `TELNYX_CONNECTION_IDS`.
pub const MAX_CONNECTION_IDS: usize = 64;
/// Longest connection id.
pub const MAX_CONNECTION_ID_CHARS: usize = 128;
/// Most keys in `EDGE_NEXT_PUBLIC_KEYS`.
pub const MAX_NEXT_KEYS: usize = 4;

/// A part of the Worker that is configured, or not, on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Capability {
    /// Carrier webhooks: Telnyx keys and the edge signing key.
    Ingress,
    /// Node-signed routes: the edge signing key and the media keys.
    NodeRoutes,
    /// Bearer-token routes: admin, policy and metrics tokens.
    Admin,
    /// `GET /v1/keys`: the active edge key and the keys published next.
    KeyPublication,
}

impl Capability {
    /// Every capability, in the order they are reported.
    pub const ALL: [Capability; 4] = [
        Capability::Ingress,
        Capability::NodeRoutes,
        Capability::Admin,
        Capability::KeyPublication,
    ];

    /// The name used in replies and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Capability::Ingress => "ingress",
            Capability::NodeRoutes => "node_routes",
            Capability::Admin => "admin",
            Capability::KeyPublication => "key_publication",
        }
    }
}

/// A capability that cannot run: the variables at fault, by name only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Misconfigured {
    /// The capability.
    pub capability: Capability,
    /// The variables that are missing or malformed (names, never values).
    pub variables: Vec<&'static str>,
}

/// The edge's Ed25519 signing key and its key id.
#[derive(Clone)]
pub struct EdgeKey {
    /// `EDGE_KEY_ID`.
    pub kid: String,
    /// The key from the `EDGE_SIGNING_KEY` seed.
    pub signing: SigningKey,
}

impl EdgeKey {
    /// Standard base64 of the raw public key.
    pub fn public_key_b64(&self) -> String {
        b64_encode(self.signing.verifying_key().as_bytes())
    }
}

impl fmt::Debug for EdgeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the seed.
        f.debug_struct("EdgeKey")
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

/// Settings of the `ingress` capability.
#[derive(Clone)]
pub struct Ingress {
    /// The Telnyx account keys.
    pub telnyx: TelnyxKeys,
    /// The key that signs origin assertions.
    pub edge: EdgeKey,
    /// `TELNYX_CONNECTION_IDS`, when set: only these connections are routed.
    pub connection_ids: Option<BTreeSet<String>>,
    /// The origin forward budget.
    pub forward_timeout_ms: u32,
    /// `SESSION_CAP`: the sessions table's row cap.
    pub session_cap: i64,
}

/// Settings of the `node_routes` capability.
#[derive(Clone)]
pub struct NodeRoutes {
    /// The key that signs what the edge hands to nodes.
    pub edge: EdgeKey,
    /// The media token keys (the first signs).
    pub media: MediaKeys,
    /// `EDGE_HOSTNAMES`, when set: the only hosts node signatures may name.
    pub edge_hosts: Option<EdgeHosts>,
}

/// Settings of the `admin` capability.
#[derive(Debug, Clone)]
pub struct Admin {
    /// The admin, policy and metrics bearer tokens.
    pub tokens: Tokens,
    /// `ORIGIN_ALLOW_PLAINTEXT`: registry origins may be `http://`.
    pub allow_plaintext: bool,
}

/// Whether a published key signs now or is published ahead of a rotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyState {
    /// The key that signs now.
    Active,
    /// A key published ahead of a rotation.
    Next,
}

impl KeyState {
    /// The name used in `GET /v1/keys`.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyState::Active => "active",
            KeyState::Next => "next",
        }
    }
}

/// One edge public key as `GET /v1/keys` publishes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedKey {
    /// The key id.
    pub kid: String,
    /// Standard base64 of the raw 32-byte Ed25519 public key.
    pub public_key: String,
    /// Active or next.
    pub state: KeyState,
}

/// The whole configuration, one result per capability.
#[derive(Clone)]
pub struct Config {
    /// Carrier webhooks.
    pub ingress: Result<Ingress, Misconfigured>,
    /// Node-signed routes.
    pub node_routes: Result<NodeRoutes, Misconfigured>,
    /// Bearer-token routes.
    pub admin: Result<Admin, Misconfigured>,
    /// The keys `GET /v1/keys` publishes, active first.
    pub published_keys: Result<Vec<PublishedKey>, Misconfigured>,
    /// The test-only switches (never set in a deployment).
    #[cfg(feature = "testing")]
    pub test: TestSwitches,
}

/// The `CALLFENCE_TEST_*` variables: shorter background timing and a fault
/// switch, for tests only (docs/operations.md, "Test-only timing variables"). Each is a
/// positive decimal; anything else is ignored. Only a `testing` build (the
/// cargo feature) reads them: the deployed Worker has none.
#[cfg(feature = "testing")]
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TestSwitches {
    /// `CALLFENCE_TEST_NODE_LOST_MS`.
    pub node_lost_ms: Option<i64>,
    /// `CALLFENCE_TEST_MAX_DURATION_MS`.
    pub max_duration_ms: Option<i64>,
    /// `CALLFENCE_TEST_RETENTION_MS`: how long an ended session's records
    /// are kept, and with the longest call how long a replaced shard map
    /// still counts for holder lookups (the bench's steady state).
    pub retention_ms: Option<i64>,
    /// `CALLFENCE_TEST_SWEEP_MS`.
    pub sweep_ms: Option<i64>,
    /// `CALLFENCE_TEST_FAIL_UNIT_AFTER_WRITES`: every atomic unit of the
    /// Dispatcher fails at its (N+1)-th write (N may be 0).
    pub fail_unit_after_writes: Option<u32>,
    /// `CALLFENCE_TEST_WRITES_ONLY=1`: the Dispatcher serves the bench-only
    /// `writes_only` message (an assignment's SQL writes alone).
    pub writes_only: bool,
    /// `CALLFENCE_TEST_UNREACHABLE_SHARD=k` (1 to 31): the object of call
    /// shard `k` fails every request, as an unreachable one does.
    pub unreachable_shard: Option<u32>,
    /// `CALLFENCE_TEST_SLOW_ANSWER_MS`: the Dispatcher holds its answer to a
    /// webhook it delivered this long, as a slow commit or a long queue
    /// would (the Worker's answer deadline is tested against it).
    pub slow_answer_ms: Option<i64>,
}

#[cfg(feature = "testing")]
impl TestSwitches {
    /// The switches, from `var` (a lookup that already treats blank as unset).
    fn parse(var: impl Fn(&str) -> Option<String>) -> TestSwitches {
        let positive = |name: &str| {
            var(name)
                .and_then(|v| v.trim().parse::<i64>().ok())
                .filter(|v| *v > 0)
        };
        TestSwitches {
            node_lost_ms: positive("CALLFENCE_TEST_NODE_LOST_MS"),
            max_duration_ms: positive("CALLFENCE_TEST_MAX_DURATION_MS"),
            retention_ms: positive("CALLFENCE_TEST_RETENTION_MS"),
            sweep_ms: positive("CALLFENCE_TEST_SWEEP_MS"),
            fail_unit_after_writes: var("CALLFENCE_TEST_FAIL_UNIT_AFTER_WRITES")
                .and_then(|v| v.trim().parse::<u32>().ok()),
            writes_only: var("CALLFENCE_TEST_WRITES_ONLY").is_some_and(|v| v.trim() == "1"),
            slow_answer_ms: positive("CALLFENCE_TEST_SLOW_ANSWER_MS"),
            unreachable_shard: positive("CALLFENCE_TEST_UNREACHABLE_SHARD")
                .and_then(|k| u32::try_from(k).ok())
                .filter(|k| (1..32).contains(k)),
        }
    }
}

thread_local! {
    static CONFIG: OnceCell<Rc<Config>> = const { OnceCell::new() };
}

impl Config {
    /// The isolate's configuration, parsed from `env` on first use. The
    /// capabilities that are misconfigured are logged once, by variable name.
    pub fn get(env: &worker::Env) -> Rc<Config> {
        CONFIG.with(|cell| {
            cell.get_or_init(|| {
                let config = Rc::new(Config::parse(|name| read_var(env, name)));
                for problem in config.problems() {
                    crate::log::misconfigured(problem.capability.as_str(), &problem.variables);
                }
                if config
                    .node_routes
                    .as_ref()
                    .is_ok_and(|n| n.edge_hosts.is_none())
                {
                    crate::log::edge_hostnames_unset();
                }
                config
            })
            .clone()
        })
    }

    /// Parses the configuration from a lookup of variables by name. Unset
    /// and empty (or all-whitespace) values are the same: absent.
    pub fn parse(lookup: impl Fn(&str) -> Option<String>) -> Config {
        let var = |name: &str| lookup(name).filter(|value| !value.trim().is_empty());

        let edge = parse_edge_key(var("EDGE_SIGNING_KEY"), var("EDGE_KEY_ID"));
        let telnyx = var("TELNYX_PUBLIC_KEY")
            .and_then(|csv| TelnyxKeys::parse(&csv).ok())
            .ok_or("TELNYX_PUBLIC_KEY");
        let connection_ids = parse_connection_ids(var("TELNYX_CONNECTION_IDS").as_deref());
        let forward_timeout_ms = parse_forward_timeout(var("FORWARD_TIMEOUT_MS").as_deref());
        let session_cap = parse_session_cap(var("SESSION_CAP").as_deref());
        let media = var("MEDIA_TOKEN_KEYS")
            .and_then(|csv| MediaKeys::parse(&csv).ok())
            .ok_or("MEDIA_TOKEN_KEYS");
        let metrics_tokens = var("METRICS_TOKENS");
        let tokens = Tokens::parse(
            var("ADMIN_TOKENS").as_deref(),
            var("POLICY_TOKENS").as_deref(),
        )
        .and_then(|mut tokens| {
            tokens
                .add_metrics(metrics_tokens.as_deref())
                .map_err(|name| vec![name])?;
            Ok(tokens)
        });
        let allow_plaintext =
            parse_bool(var("ORIGIN_ALLOW_PLAINTEXT").as_deref()).ok_or("ORIGIN_ALLOW_PLAINTEXT");
        let next_keys = parse_next_keys(var("EDGE_NEXT_PUBLIC_KEYS").as_deref());
        let edge_hosts = var("EDGE_HOSTNAMES")
            .map(|csv| EdgeHosts::parse(&csv).map_err(|_| "EDGE_HOSTNAMES"))
            .transpose();

        let ingress = match (
            &telnyx,
            &edge,
            &connection_ids,
            &forward_timeout_ms,
            &session_cap,
        ) {
            (Ok(telnyx), Ok(edge), Ok(connection_ids), Ok(forward_timeout_ms), Ok(session_cap)) => {
                Ok(Ingress {
                    telnyx: telnyx.clone(),
                    edge: edge.clone(),
                    connection_ids: connection_ids.clone(),
                    forward_timeout_ms: *forward_timeout_ms,
                    session_cap: *session_cap,
                })
            }
            _ => Err(Misconfigured {
                capability: Capability::Ingress,
                variables: faults(&[
                    telnyx.as_ref().err().copied(),
                    edge.as_ref().err().copied(),
                    connection_ids.as_ref().err().copied(),
                    forward_timeout_ms.as_ref().err().copied(),
                    session_cap.as_ref().err().copied(),
                ]),
            }),
        };
        let node_routes = match (&edge, &media, edge_hosts) {
            (Ok(edge), Ok(media), Ok(edge_hosts)) => Ok(NodeRoutes {
                edge: edge.clone(),
                media: media.clone(),
                edge_hosts,
            }),
            (_, _, edge_hosts) => Err(Misconfigured {
                capability: Capability::NodeRoutes,
                variables: faults(&[
                    edge.as_ref().err().copied(),
                    media.as_ref().err().copied(),
                    edge_hosts.err(),
                ]),
            }),
        };
        let admin = match (tokens, allow_plaintext) {
            (Ok(tokens), Ok(allow_plaintext)) => Ok(Admin {
                tokens,
                allow_plaintext,
            }),
            (tokens, allow_plaintext) => Err(Misconfigured {
                capability: Capability::Admin,
                variables: tokens
                    .err()
                    .unwrap_or_default()
                    .into_iter()
                    .chain(allow_plaintext.err())
                    .collect(),
            }),
        };
        let published_keys = match (&edge, next_keys) {
            (Ok(edge), Ok(next)) if next.iter().all(|key| key.kid != edge.kid) => {
                let active = PublishedKey {
                    kid: edge.kid.clone(),
                    public_key: edge.public_key_b64(),
                    state: KeyState::Active,
                };
                Ok(std::iter::once(active).chain(next).collect())
            }
            (edge, next) => Err(Misconfigured {
                capability: Capability::KeyPublication,
                variables: faults(&[
                    edge.as_ref().err().copied(),
                    Some("EDGE_NEXT_PUBLIC_KEYS").filter(|_| edge.is_ok() || next.is_err()),
                ]),
            }),
        };

        Config {
            ingress,
            node_routes,
            admin,
            published_keys,
            #[cfg(feature = "testing")]
            test: TestSwitches::parse(var),
        }
    }

    /// The Dispatcher engine's configuration, from the values parsed above
    /// (a capability that is misconfigured contributes the defaults: its
    /// routes are refused anyway; claims then run under the default
    /// `SESSION_CAP`).
    pub fn engine(&self) -> EngineConfig {
        let ingress = self.ingress.as_ref().ok();
        EngineConfig {
            forward_timeout_ms: i64::from(
                ingress.map_or(DEFAULT_FORWARD_TIMEOUT_MS, |i| i.forward_timeout_ms),
            ),
            connection_ids: ingress
                .and_then(|i| i.connection_ids.as_ref())
                .map(|ids| ids.iter().cloned().collect()),
            allow_plaintext: self.admin.as_ref().is_ok_and(|a| a.allow_plaintext),
            session_cap: ingress.map_or(DEFAULT_SESSION_CAP, |i| i.session_cap),
            timing: self.timing(),
        }
    }

    /// The background timing: the defaults, with a `testing` build's
    /// `CALLFENCE_TEST_*` timings over them.
    fn timing(&self) -> Timing {
        let defaults = Timing::default();
        #[cfg(feature = "testing")]
        let defaults = {
            let test = &self.test;
            Timing {
                node_lost_after_ms: test.node_lost_ms.unwrap_or(defaults.node_lost_after_ms),
                max_duration_ms: test.max_duration_ms.unwrap_or(defaults.max_duration_ms),
                retention_ms: test.retention_ms.unwrap_or(defaults.retention_ms),
                sweep_interval_ms: test.sweep_ms.unwrap_or(defaults.sweep_interval_ms),
                ..defaults
            }
        };
        defaults
    }

    /// The problem of `capability`, if it is misconfigured.
    pub fn problem(&self, capability: Capability) -> Option<&Misconfigured> {
        match capability {
            Capability::Ingress => self.ingress.as_ref().err(),
            Capability::NodeRoutes => self.node_routes.as_ref().err(),
            Capability::Admin => self.admin.as_ref().err(),
            Capability::KeyPublication => self.published_keys.as_ref().err(),
        }
    }

    /// Every misconfigured capability.
    pub fn problems(&self) -> impl Iterator<Item = &Misconfigured> {
        Capability::ALL.into_iter().filter_map(|c| self.problem(c))
    }

    /// True when every capability is configured.
    pub fn all_ok(&self) -> bool {
        self.problems().next().is_none()
    }
}

/// Reads one variable or secret as a string. A JSON (non-string) `[vars]`
/// value, which wrangler allows, is turned back into its JSON text.
fn read_var(env: &worker::Env, name: &str) -> Option<String> {
    match env.var(name) {
        Ok(value) => Some(value.to_string()),
        // The runtime's JSON.stringify rather than `Env::object_var`, whose
        // serde_wasm_bindgen deserialiser is otherwise unused (about 10 KB
        // of the wasm). Equal text but for an object's key order, which no
        // variable's parser depends on.
        Err(_) => {
            use worker::wasm_bindgen::JsValue;
            let value = worker::js_sys::Reflect::get(env, &JsValue::from_str(name)).ok()?;
            if value.is_undefined() {
                return None;
            }
            worker::js_sys::JSON::stringify(&value).ok()?.as_string()
        }
    }
}

/// The distinct variable names among `faults`, in order.
fn faults(faults: &[Option<&'static str>]) -> Vec<&'static str> {
    let mut names = Vec::new();
    for name in faults.iter().flatten() {
        if !names.contains(name) {
            names.push(*name);
        }
    }
    names
}

/// `EDGE_SIGNING_KEY` (base64 of a 32-byte seed) and `EDGE_KEY_ID` (node-id
/// pattern). The error names the faulty variable.
fn parse_edge_key(seed: Option<String>, kid: Option<String>) -> Result<EdgeKey, &'static str> {
    let seed = seed
        .as_deref()
        .map(str::trim)
        .and_then(b64_decode)
        .and_then(|bytes| <[u8; 32]>::try_from(bytes.as_slice()).ok())
        .ok_or("EDGE_SIGNING_KEY")?;
    let kid = kid
        .map(|kid| kid.trim().to_owned())
        .filter(|kid| is_node_id(kid))
        .ok_or("EDGE_KEY_ID")?;
    Ok(EdgeKey {
        kid,
        signing: SigningKey::from_bytes(&seed),
    })
}

/// `TELNYX_CONNECTION_IDS`: absent means every connection; otherwise
/// comma-separated non-empty ids without whitespace.
fn parse_connection_ids(csv: Option<&str>) -> Result<Option<BTreeSet<String>>, &'static str> {
    const NAME: &str = "TELNYX_CONNECTION_IDS";
    let Some(csv) = csv else {
        return Ok(None);
    };
    let mut ids = BTreeSet::new();
    for id in csv.split(',').map(str::trim) {
        let valid = !id.is_empty()
            && id.chars().count() <= MAX_CONNECTION_ID_CHARS
            && id.chars().all(|c| c.is_ascii_graphic());
        if !valid {
            return Err(NAME);
        }
        ids.insert(id.to_owned());
    }
    if ids.len() > MAX_CONNECTION_IDS {
        return Err(NAME);
    }
    Ok(Some(ids))
}

/// `FORWARD_TIMEOUT_MS`: decimal milliseconds within
/// [`FORWARD_TIMEOUT_RANGE_MS`], [`DEFAULT_FORWARD_TIMEOUT_MS`] when unset.
fn parse_forward_timeout(text: Option<&str>) -> Result<u32, &'static str> {
    let Some(text) = text.map(str::trim) else {
        return Ok(DEFAULT_FORWARD_TIMEOUT_MS);
    };
    text.parse::<u32>()
        .ok()
        .filter(|ms| {
            text.bytes().all(|b| b.is_ascii_digit()) && FORWARD_TIMEOUT_RANGE_MS.contains(ms)
        })
        .ok_or("FORWARD_TIMEOUT_MS")
}

/// `SESSION_CAP`: a decimal row count within [`SESSION_CAP_RANGE`],
/// [`DEFAULT_SESSION_CAP`] when unset. Anything else (a sign, a unit, `1e5`,
/// `100,000`) is misconfiguration, never guessed at.
fn parse_session_cap(text: Option<&str>) -> Result<i64, &'static str> {
    let Some(text) = text.map(str::trim) else {
        return Ok(DEFAULT_SESSION_CAP);
    };
    text.parse::<i64>()
        .ok()
        .filter(|cap| text.bytes().all(|b| b.is_ascii_digit()) && SESSION_CAP_RANGE.contains(cap))
        .ok_or("SESSION_CAP")
}

/// `"true"` or `"false"` (absent: false). Anything else is not guessed at.
fn parse_bool(text: Option<&str>) -> Option<bool> {
    match text.map(str::trim) {
        None | Some("false") => Some(false),
        Some("true") => Some(true),
        Some(_) => None,
    }
}

/// One entry of `EDGE_NEXT_PUBLIC_KEYS`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NextKey {
    kid: String,
    public_key: String,
}

/// `EDGE_NEXT_PUBLIC_KEYS`: a JSON list of `{"kid","public_key"}` with
/// distinct key ids and valid Ed25519 public keys (absent: none).
fn parse_next_keys(json: Option<&str>) -> Result<Vec<PublishedKey>, &'static str> {
    const NAME: &str = "EDGE_NEXT_PUBLIC_KEYS";
    let Some(json) = json else {
        return Ok(Vec::new());
    };
    let entries: Vec<NextKey> = serde_json::from_str(json).map_err(|_| NAME)?;
    if entries.len() > MAX_NEXT_KEYS {
        return Err(NAME);
    }
    let mut keys: Vec<PublishedKey> = Vec::with_capacity(entries.len());
    for entry in entries {
        let point = b64_decode(&entry.public_key)
            .and_then(|bytes| <[u8; 32]>::try_from(bytes.as_slice()).ok())
            .and_then(|raw| VerifyingKey::from_bytes(&raw).ok());
        if point.is_none() || !is_node_id(&entry.kid) || keys.iter().any(|k| k.kid == entry.kid) {
            return Err(NAME);
        }
        keys.push(PublishedKey {
            kid: entry.kid,
            public_key: entry.public_key,
            state: KeyState::Next,
        });
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    const ADMIN: &str = "admin-token-0123456789abcdefghijklmnop";
    const POLICY: &str = "policy-token-0123456789abcdefghijklmno";

    fn public_b64(seed: u8) -> String {
        b64_encode(
            SigningKey::from_bytes(&[seed; 32])
                .verifying_key()
                .as_bytes(),
        )
    }

    fn complete() -> BTreeMap<&'static str, String> {
        BTreeMap::from([
            ("TELNYX_PUBLIC_KEY", public_b64(1)),
            ("EDGE_SIGNING_KEY", b64_encode(&[2; 32])),
            ("EDGE_KEY_ID", "edge2026a".to_owned()),
            ("ADMIN_TOKENS", ADMIN.to_owned()),
            ("POLICY_TOKENS", POLICY.to_owned()),
            ("MEDIA_TOKEN_KEYS", format!("m1:{}", b64_encode(&[3; 32]))),
        ])
    }

    fn parse(vars: &BTreeMap<&'static str, String>) -> Config {
        Config::parse(|name| vars.get(name).cloned())
    }

    fn faulty(config: &Config, capability: Capability) -> Vec<&'static str> {
        config
            .problem(capability)
            .map(|p| p.variables.clone())
            .unwrap_or_default()
    }

    #[test]
    fn a_complete_configuration_enables_everything_with_defaults() {
        let config = parse(&complete());
        assert!(config.all_ok());
        let ingress = config.ingress.as_ref().ok().unwrap();
        assert_eq!(ingress.forward_timeout_ms, 1_500);
        assert!(ingress.connection_ids.is_none());
        assert!(!config.admin.as_ref().unwrap().allow_plaintext);
        let keys = config.published_keys.as_ref().unwrap();
        assert_eq!(keys.len(), 1);
        assert_eq!(keys[0].kid, "edge2026a");
        assert_eq!(keys[0].public_key, public_b64(2));
        assert_eq!(keys[0].state, KeyState::Active);
    }

    #[test]
    fn nothing_set_disables_every_capability_and_names_the_variables() {
        let config = parse(&BTreeMap::new());
        assert_eq!(
            faulty(&config, Capability::Ingress),
            ["TELNYX_PUBLIC_KEY", "EDGE_SIGNING_KEY"]
        );
        assert_eq!(
            faulty(&config, Capability::NodeRoutes),
            ["EDGE_SIGNING_KEY", "MEDIA_TOKEN_KEYS"]
        );
        assert_eq!(faulty(&config, Capability::Admin), ["ADMIN_TOKENS"]);
        assert_eq!(
            faulty(&config, Capability::KeyPublication),
            ["EDGE_SIGNING_KEY"]
        );
    }

    #[test]
    fn a_bad_telnyx_key_disables_ingress_only() {
        let mut vars = complete();
        vars.insert("TELNYX_PUBLIC_KEY", "not-base64!".into());
        let config = parse(&vars);
        assert_eq!(faulty(&config, Capability::Ingress), ["TELNYX_PUBLIC_KEY"]);
        assert!(config.node_routes.is_ok() && config.admin.is_ok());
        assert!(config.published_keys.is_ok());
    }

    #[test]
    fn a_bad_edge_key_disables_what_signs_with_it_but_not_admin() {
        for (name, value) in [
            ("EDGE_SIGNING_KEY", b64_encode(&[1; 31])),
            ("EDGE_KEY_ID", "bad kid".into()),
        ] {
            let mut vars = complete();
            vars.insert(name, value);
            let config = parse(&vars);
            assert_eq!(faulty(&config, Capability::Ingress), [name]);
            assert_eq!(faulty(&config, Capability::NodeRoutes), [name]);
            assert_eq!(faulty(&config, Capability::KeyPublication), [name]);
            assert!(config.admin.is_ok());
        }
    }

    #[test]
    fn bad_media_keys_disable_node_routes_only() {
        let mut vars = complete();
        vars.insert("MEDIA_TOKEN_KEYS", format!("m1:{}", b64_encode(&[3; 16])));
        let config = parse(&vars);
        assert_eq!(
            faulty(&config, Capability::NodeRoutes),
            ["MEDIA_TOKEN_KEYS"]
        );
        assert!(config.ingress.is_ok() && config.admin.is_ok());
    }

    #[test]
    fn edge_hostnames_are_optional_and_a_bad_list_disables_node_routes_only() {
        let config = parse(&complete());
        assert!(config
            .node_routes
            .as_ref()
            .ok()
            .unwrap()
            .edge_hosts
            .is_none());
        let mut vars = complete();
        vars.insert("EDGE_HOSTNAMES", "callfence.example.net, 127.0.0.1".into());
        let config = parse(&vars);
        let hosts = config
            .node_routes
            .as_ref()
            .ok()
            .unwrap()
            .edge_hosts
            .as_ref();
        assert!(hosts.unwrap().allows("127.0.0.1:8787"));
        vars.insert("EDGE_HOSTNAMES", "callfence.example.net:443".into());
        let config = parse(&vars);
        assert_eq!(faulty(&config, Capability::NodeRoutes), ["EDGE_HOSTNAMES"]);
        assert!(config.ingress.is_ok() && config.admin.is_ok());
    }

    #[test]
    fn short_tokens_disable_admin_only() {
        for name in ["ADMIN_TOKENS", "POLICY_TOKENS"] {
            let mut vars = complete();
            vars.insert(name, "short".into());
            let config = parse(&vars);
            assert_eq!(faulty(&config, Capability::Admin), [name]);
            assert!(config.ingress.is_ok() && config.node_routes.is_ok());
        }
    }

    #[test]
    fn metrics_tokens_are_optional_and_a_bad_list_disables_admin_only() {
        let mut vars = complete();
        vars.insert(
            "METRICS_TOKENS",
            "metrics-token-0123456789abcdefghijklmn".into(),
        );
        assert!(parse(&vars).all_ok());
        for bad in ["short", ADMIN, POLICY] {
            vars.insert("METRICS_TOKENS", bad.into());
            let config = parse(&vars);
            assert_eq!(
                faulty(&config, Capability::Admin),
                ["METRICS_TOKENS"],
                "{bad}"
            );
            assert!(config.ingress.is_ok() && config.node_routes.is_ok());
        }
    }

    #[test]
    fn forward_timeout_and_plaintext_are_strict() {
        let mut vars = complete();
        vars.insert("FORWARD_TIMEOUT_MS", "900".into());
        vars.insert("ORIGIN_ALLOW_PLAINTEXT", "true".into());
        let config = parse(&vars);
        assert_eq!(
            config.ingress.as_ref().ok().unwrap().forward_timeout_ms,
            900
        );
        assert!(config.admin.as_ref().unwrap().allow_plaintext);
        for bad in ["", "-1", "+900", "1e3", "50", "999999"] {
            let mut vars = complete();
            vars.insert("FORWARD_TIMEOUT_MS", bad.into());
            let config = parse(&vars);
            // Empty means unset; the others are malformed or out of range.
            assert_eq!(config.ingress.is_ok(), bad.is_empty(), "{bad:?}");
        }
        vars.insert("ORIGIN_ALLOW_PLAINTEXT", "yes".into());
        assert_eq!(
            faulty(&parse(&vars), Capability::Admin),
            ["ORIGIN_ALLOW_PLAINTEXT"]
        );
    }

    #[test]
    fn session_cap_is_a_row_count_in_range_and_reaches_the_engine() {
        let config = parse(&complete());
        assert_eq!(config.engine().session_cap, DEFAULT_SESSION_CAP);
        let mut vars = complete();
        vars.insert("SESSION_CAP", " 2500 ".into());
        let config = parse(&vars);
        assert_eq!(config.ingress.as_ref().ok().unwrap().session_cap, 2_500);
        assert_eq!(config.engine().session_cap, 2_500);
        for bad in ["0", "-5", "+5", "1e5", "100,000", "100k", "1000001", "x"] {
            vars.insert("SESSION_CAP", bad.into());
            let config = parse(&vars);
            assert_eq!(
                faulty(&config, Capability::Ingress),
                ["SESSION_CAP"],
                "{bad}"
            );
            assert!(config.node_routes.is_ok() && config.admin.is_ok(), "{bad}");
            assert_eq!(config.engine().session_cap, DEFAULT_SESSION_CAP, "{bad}");
        }
    }

    #[test]
    fn connection_ids_are_a_set_of_visible_ids() {
        let mut vars = complete();
        vars.insert("TELNYX_CONNECTION_IDS", " 123, 456 ".into());
        let config = parse(&vars);
        let ids = config
            .ingress
            .as_ref()
            .ok()
            .unwrap()
            .connection_ids
            .clone()
            .unwrap();
        assert_eq!(ids.into_iter().collect::<Vec<_>>(), ["123", "456"]);
        vars.insert("TELNYX_CONNECTION_IDS", "123,,456".into());
        assert_eq!(
            faulty(&parse(&vars), Capability::Ingress),
            ["TELNYX_CONNECTION_IDS"]
        );
    }

    #[test]
    fn next_keys_are_published_after_the_active_one() {
        let mut vars = complete();
        vars.insert(
            "EDGE_NEXT_PUBLIC_KEYS",
            format!(
                r#"[{{"kid":"edge2026b","public_key":"{}"}}]"#,
                public_b64(9)
            ),
        );
        let config = parse(&vars);
        let keys = config.published_keys.as_ref().unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!(
            (keys[1].kid.as_str(), keys[1].state),
            ("edge2026b", KeyState::Next)
        );
    }

    #[test]
    fn malformed_next_keys_disable_key_publication_only() {
        let bad = [
            "{}".to_owned(),
            r#"[{"kid":"x","public_key":"AAAA"}]"#.to_owned(),
            format!(
                r#"[{{"kid":"edge2026a","public_key":"{}"}}]"#,
                public_b64(9)
            ),
            format!(
                r#"[{{"kid":"n","public_key":"{}","extra":1}}]"#,
                public_b64(9)
            ),
        ];
        for json in bad {
            let mut vars = complete();
            vars.insert("EDGE_NEXT_PUBLIC_KEYS", json.clone());
            let config = parse(&vars);
            assert_eq!(
                faulty(&config, Capability::KeyPublication),
                ["EDGE_NEXT_PUBLIC_KEYS"],
                "{json}"
            );
            assert!(config.ingress.is_ok() && config.node_routes.is_ok() && config.admin.is_ok());
        }
    }

    #[test]
    fn the_seed_is_never_printed() {
        let config = parse(&complete());
        let edge = &config.node_routes.as_ref().ok().unwrap().edge;
        let printed = format!("{edge:?}");
        assert!(printed.contains("edge2026a"));
        assert!(!printed.contains(&b64_encode(&[2; 32])));
        assert!(!printed.contains("signing"));
    }
}
