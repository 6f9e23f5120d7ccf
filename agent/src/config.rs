//! The agent's configuration: a TOML file (`--config`, default
//! `/etc/callfence/agent.toml`), parsed strictly (unknown fields are errors)
//! and validated before anything runs. `agent.example.toml` documents every
//! field.
//!
//! Loading refuses: a private key (or the Telnyx API key file) that group or
//! others can read, a state directory under `/tmp`, `/var/tmp` or `/dev/shm`
//! (state there does not survive a reboot, and the mode would silently come
//! back `drained` at best), a local API that does not listen on loopback,
//! and any key that does not decode.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use callfence_core::encoding::b64_decode;
use callfence_core::telnyx::TelnyxKeys;
use ed25519_dalek::VerifyingKey;
use reqwest::Url;
use serde::Deserialize;

use crate::files::check_private;
use crate::AgentError;

/// Where the default configuration lives.
pub const DEFAULT_PATH: &str = "/etc/callfence/agent.toml";

/// The largest configuration file read.
const MAX_CONFIG_BYTES: u64 = 256 * 1024;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    node: String,
    state_dir: PathBuf,
    runtime_checkout: PathBuf,
    key: KeyRef,
    next_key: Option<KeyRef>,
    edge: RawEdge,
    telnyx: RawTelnyx,
    listen: RawListen,
    app: RawApp,
    origin: RawOrigin,
    #[serde(default)]
    lines: RawLines,
    #[serde(default)]
    timing: Timing,
    deploy: Option<RawDeploy>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDeploy {
    remote: String,
    releases_dir: PathBuf,
    current: PathBuf,
    build: Option<String>,
    #[serde(default)]
    artifacts: Vec<String>,
    restart: Option<String>,
    unit: Option<String>,
    #[serde(default = "default_health_timeout")]
    health_timeout: String,
    #[serde(default = "default_drain_deadline")]
    drain_deadline: String,
    #[serde(default = "default_build_timeout")]
    build_timeout: String,
    #[serde(default = "default_keep")]
    keep: usize,
    #[serde(default = "default_branch")]
    branch: String,
    build_user: Option<String>,
    #[serde(default)]
    build_can_read_keys: bool,
}

fn default_health_timeout() -> String {
    "60s".into()
}
fn default_drain_deadline() -> String {
    "30m".into()
}
fn default_build_timeout() -> String {
    "10m".into()
}
fn default_keep() -> usize {
    3
}
fn default_branch() -> String {
    "main".into()
}

/// The `[deploy]` table (SPEC §14): where releases come from and live, how
/// they are built, restarted and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeployConfig {
    /// The app repository: any URL or path `git fetch` takes.
    pub remote: String,
    /// Where each release is checked out, as `<releases_dir>/<sha>`.
    pub releases_dir: PathBuf,
    /// The symlink the app runs through; `runtime_checkout` is this path.
    pub current: PathBuf,
    /// Run with `sh -c` in the new checkout, if set.
    pub build: Option<String>,
    /// Paths (relative to the checkout) the build must leave.
    pub artifacts: Vec<String>,
    /// Run with `sh -c` to restart the app (default `systemctl restart <unit>`).
    pub restart: String,
    /// How long the restarted app has to pass the local checks.
    pub health_timeout: std::time::Duration,
    /// How long the drain waits for active calls to reach 0.
    pub drain_deadline: std::time::Duration,
    /// How long the build may run.
    pub build_timeout: std::time::Duration,
    /// How many releases besides the current one are kept.
    pub keep: usize,
    /// The protected branch of `remote`: only commits reachable from it
    /// are deployed (default `main`).
    pub branch: String,
    /// The account that runs `build` and `restart`; it must not be able to
    /// read the agent's keys (see [`crate::deploy::build_user`]).
    pub build_user: Option<String>,
    /// Development only: deploy even when the build runs as an account
    /// that can read the keys (every such deploy logs a warning).
    pub build_can_read_keys: bool,
}

/// A node key: its id in the node registry and the file holding its seed.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct KeyRef {
    /// The key id (`Callfence-Key-Id`), as listed under the node's `keys` in the registry.
    pub id: String,
    /// The private key file written by `keygen` (mode 0600).
    pub path: PathBuf,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEdge {
    url: String,
    public_keys: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTelnyx {
    public_keys: Vec<String>,
    api_base: Option<String>,
    api_key_file: Option<PathBuf>,
    #[serde(default)]
    already_answered_codes: Vec<String>,
    connection_id: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawListen {
    origin: SocketAddr,
    local: SocketAddr,
    #[serde(default = "default_max_connections")]
    max_connections: usize,
    #[serde(default)]
    metrics_listen: Option<SocketAddr>,
}

fn default_max_connections() -> usize {
    256
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawApp {
    webhook_url: String,
    status_url: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOrigin {
    url: String,
    probe_url: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLines {
    #[serde(default)]
    source: LinesSourceKind,
    #[serde(default)]
    served: BTreeMap<String, String>,
}

#[derive(Debug, Default, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum LinesSourceKind {
    #[default]
    App,
    Config,
}

/// Where the `lines` of each heartbeat come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinesSource {
    /// The `lines` object of the voice app's status endpoint (the numbers the
    /// app really applied; the default).
    App,
    /// A fixed table in the configuration.
    Config(BTreeMap<String, String>),
}

/// Intervals and budgets. The defaults are the production values; tests and
/// local runs shrink them.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Timing {
    /// Time between heartbeats (SPEC: 5 s).
    pub heartbeat_interval_ms: u64,
    /// `valid_for_s` of each beat, 1 to 30 (SPEC: 15).
    pub valid_for_s: u32,
    /// Clock skew allowed when checking an assertion's `iat`/`exp` (SPEC: 10 s).
    pub assertion_skew_s: i64,
    /// Budget for one delivery of a webhook to the voice app.
    pub app_timeout_ms: u64,
    /// Budget for the app status and tunnel probes.
    pub probe_timeout_ms: u64,
    /// Budget for one request to the edge.
    pub edge_timeout_ms: u64,
    /// Resend a Telnyx command when no HTTP answer came within this (SPEC: 500 ms).
    pub telnyx_resend_ms: u64,
    /// Budget for one Telnyx request.
    pub telnyx_timeout_ms: u64,
    /// How long a duplicate webhook waits for the first delivery in flight.
    pub duplicate_wait_ms: u64,
    /// Ledger entries older than this are pruned.
    pub ledger_retention_s: u64,
    /// How often the ledger is pruned and stuck `received` entries re-delivered.
    pub upkeep_interval_ms: u64,
    /// How often `drain` polls the app's active calls.
    pub drain_poll_ms: u64,
    /// Both listeners: a request's headers, and then its body, must arrive
    /// within this (SPEC: 5 s); a slower client is answered 408 or cut off.
    pub request_read_timeout_ms: u64,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            heartbeat_interval_ms: 5_000,
            valid_for_s: 15,
            assertion_skew_s: 10,
            app_timeout_ms: 10_000,
            probe_timeout_ms: 2_000,
            edge_timeout_ms: 3_000,
            telnyx_resend_ms: 500,
            telnyx_timeout_ms: 10_000,
            duplicate_wait_ms: 15_000,
            ledger_retention_s: 24 * 3600,
            upkeep_interval_ms: 30_000,
            drain_poll_ms: 1_000,
            request_read_timeout_ms: 5_000,
        }
    }
}

/// The Telnyx REST API, needed by `/local/answer`, `/local/dial` and `drain --shed`.
#[derive(Debug, Clone)]
pub struct TelnyxApiConfig {
    /// Base URL, e.g. `https://api.telnyx.com` (the agent appends `/v2/...`).
    pub base: Url,
    /// File holding the API key (never group/world readable).
    pub key_file: PathBuf,
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The node id, as in the node registry.
    pub node: String,
    /// Durable state: mode, seq, ledger, last beat. Never under /tmp.
    pub state_dir: PathBuf,
    /// The git checkout the voice app runs from (its top level); its SHA is
    /// reported.
    pub runtime_checkout: PathBuf,
    /// The active node key.
    pub key: KeyRef,
    /// The key to rotate to, once the edge accepts a beat signed with it.
    pub next_key: Option<KeyRef>,
    /// The edge's base URL (the Worker).
    pub edge_url: Url,
    /// Pinned edge assertion keys, `(kid, key)`.
    pub edge_keys: Vec<(String, VerifyingKey)>,
    /// Telnyx webhook signing keys.
    pub telnyx_keys: TelnyxKeys,
    /// The Telnyx REST API, if this node answers or dials.
    pub telnyx_api: Option<TelnyxApiConfig>,
    /// Telnyx error codes that mean "this call is already answered".
    pub already_answered_codes: Vec<String>,
    /// The Telnyx connection every dial uses (`[telnyx] connection_id`);
    /// a caller of `/local/dial` cannot choose another.
    pub telnyx_connection_id: Option<String>,
    /// Where the origin proxy listens (the tunnel's target).
    pub listen_origin: SocketAddr,
    /// Where the local API listens (loopback only).
    pub listen_local: SocketAddr,
    /// The origin listener's bound on open connections (`listen.max_connections`).
    pub max_connections: usize,
    /// Where `GET /metrics` is also served, without the local API's token
    /// and with no other route (`listen.metrics_listen`), for a Prometheus on
    /// another host; `None` serves metrics on the local API only.
    pub listen_metrics: Option<SocketAddr>,
    /// The voice app's webhook route (loopback).
    pub app_webhook_url: Url,
    /// The voice app's status endpoint (see [`crate::probe`]).
    pub app_status_url: Url,
    /// This node's public origin URL, exactly as in the registry.
    pub origin_url: String,
    /// The public URL probed end to end for `tunnel_up`.
    pub probe_url: Url,
    /// Where heartbeat lines come from.
    pub lines: LinesSource,
    /// Intervals and budgets.
    pub timing: Timing,
    /// Deployment (`deploy`, `rollback`, `releases`), when configured.
    pub deploy: Option<DeployConfig>,
}

fn err(message: impl Into<String>) -> AgentError {
    AgentError::new(message)
}

/// `^[A-Za-z0-9_-]{1,32}$`: node ids and key ids.
pub fn is_id(text: &str) -> bool {
    (1..=32).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn read_raw(path: &Path) -> Result<RawConfig, AgentError> {
    let meta =
        std::fs::metadata(path).map_err(|e| err(format!("config {}: {e}", path.display())))?;
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(err(format!(
            "config {} is larger than 256 KiB",
            path.display()
        )));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| err(format!("config {}: {e}", path.display())))?;
    parse_raw(&text).map_err(|e| err(format!("config {}: {e}", path.display())))
}

fn parse_raw(text: &str) -> Result<RawConfig, String> {
    toml::from_str(text).map_err(|e| e.to_string())
}

/// Refuses a state directory that is relative or lives in a temporary file
/// system.
pub fn check_state_dir(dir: &Path) -> Result<(), AgentError> {
    check_durable(dir, "state_dir")
}

/// Refuses a directory (`what`) that is relative or lives in a temporary
/// file system: what it holds must survive a reboot.
fn check_durable(dir: &Path, what: &str) -> Result<(), AgentError> {
    if !dir.is_absolute() {
        return Err(err(format!(
            "{what} {} must be an absolute path",
            dir.display()
        )));
    }
    let resolved = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    for temp in ["/tmp", "/var/tmp", "/dev/shm"] {
        if dir.starts_with(temp) || resolved.starts_with(temp) {
            return Err(err(format!(
                "{what} {} is under {temp}: it must survive a reboot",
                dir.display()
            )));
        }
    }
    Ok(())
}

/// Reads only what the `mode` commands need (the node id and state
/// directory), so that an operator can always drain a node whose keys are
/// broken.
pub fn load_state_dir(path: &Path) -> Result<PathBuf, AgentError> {
    let raw = read_raw(path)?;
    check_state_dir(&raw.state_dir)?;
    Ok(raw.state_dir)
}

fn http_url(text: &str, what: &str) -> Result<Url, AgentError> {
    let url = Url::parse(text).map_err(|e| err(format!("{what}: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(err(format!("{what} must be an http(s) URL with a host")));
    }
    if !url.username().is_empty() || url.password().is_some() || url.fragment().is_some() {
        return Err(err(format!(
            "{what} must not carry credentials or a fragment"
        )));
    }
    Ok(url)
}

fn verifying_key(b64: &str, what: &str) -> Result<VerifyingKey, AgentError> {
    let bytes =
        b64_decode(b64.trim()).ok_or_else(|| err(format!("{what}: not standard base64")))?;
    let arr: [u8; 32] = bytes
        .as_slice()
        .try_into()
        .map_err(|_| err(format!("{what}: not 32 bytes")))?;
    VerifyingKey::from_bytes(&arr).map_err(|_| err(format!("{what}: not an Ed25519 public key")))
}

/// Loads and validates the configuration at `path`, including the
/// permissions of the key files it names.
pub fn load(path: &Path) -> Result<Config, AgentError> {
    let raw = read_raw(path)?;
    let config = validate(raw)?;
    check_private(&config.key.path, "key file")?;
    if let Some(next) = &config.next_key {
        check_private(&next.path, "next key file")?;
    }
    if let Some(api) = &config.telnyx_api {
        check_private(&api.key_file, "telnyx api_key_file")?;
    }
    Ok(config)
}

/// Parses and validates configuration text without touching the file
/// system (except to resolve the state directory).
pub fn from_toml(text: &str) -> Result<Config, AgentError> {
    validate(parse_raw(text).map_err(err)?)
}

fn validate(raw: RawConfig) -> Result<Config, AgentError> {
    if !is_id(&raw.node) {
        return Err(err("node must match ^[A-Za-z0-9_-]{1,32}$"));
    }
    check_state_dir(&raw.state_dir)?;
    if !is_id(&raw.key.id) {
        return Err(err("key.id must match ^[A-Za-z0-9_-]{1,32}$"));
    }
    if let Some(next) = &raw.next_key {
        if !is_id(&next.id) {
            return Err(err("next_key.id must match ^[A-Za-z0-9_-]{1,32}$"));
        }
        if next.id == raw.key.id {
            return Err(err("next_key.id must differ from key.id"));
        }
    }
    let edge_url = http_url(&raw.edge.url, "edge.url")?;
    if raw.edge.public_keys.is_empty() || raw.edge.public_keys.len() > 8 {
        return Err(err("edge.public_keys must pin 1 to 8 keys"));
    }
    let mut edge_keys = Vec::new();
    for (kid, b64) in &raw.edge.public_keys {
        if !is_id(kid) {
            return Err(err(format!(
                "edge.public_keys: key id {kid:?} is not a valid id"
            )));
        }
        edge_keys.push((
            kid.clone(),
            verifying_key(b64, &format!("edge.public_keys.{kid}"))?,
        ));
    }
    let joined = raw
        .telnyx
        .public_keys
        .iter()
        .map(|k| k.trim())
        .collect::<Vec<_>>()
        .join(",");
    let telnyx_keys = TelnyxKeys::parse(&joined)
        .map_err(|e| err(format!("telnyx.public_keys: {}", e.problem)))?;
    let telnyx_api = match (&raw.telnyx.api_base, &raw.telnyx.api_key_file) {
        (Some(base), Some(key_file)) => Some(TelnyxApiConfig {
            base: http_url(base, "telnyx.api_base")?,
            key_file: key_file.clone(),
        }),
        (None, None) => None,
        _ => return Err(err("telnyx.api_base and telnyx.api_key_file go together")),
    };
    if !raw.listen.local.ip().is_loopback() {
        return Err(err(
            "listen.local must be a loopback address (the local API is for this machine only)",
        ));
    }
    if !(1..=65_536).contains(&raw.listen.max_connections) {
        return Err(err("listen.max_connections must be 1 to 65536"));
    }
    if let Some(id) = &raw.telnyx.connection_id {
        if id.is_empty() || id.len() > 128 || !id.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(err(
                "telnyx.connection_id must be 1 to 128 printable characters",
            ));
        }
    }
    let app_webhook_url = http_url(&raw.app.webhook_url, "app.webhook_url")?;
    let app_status_url = http_url(&raw.app.status_url, "app.status_url")?;
    let origin = http_url(&raw.origin.url, "origin.url")?;
    let probe_url = match &raw.origin.probe_url {
        Some(p) => http_url(p, "origin.probe_url")?,
        None => default_probe_url(&origin)?,
    };
    let lines = match raw.lines.source {
        LinesSourceKind::App => {
            if !raw.lines.served.is_empty() {
                return Err(err(
                    "lines.served is only read with lines.source = \"config\"",
                ));
            }
            LinesSource::App
        }
        LinesSourceKind::Config => {
            for (id, number) in &raw.lines.served {
                let id_ok = (1..=64).contains(&id.len())
                    && id
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
                if !id_ok || !callfence_core::number::is_e164(number) {
                    return Err(err(format!(
                        "lines.served: {id:?} must be ^[a-z0-9_]{{1,64}}$ = an E.164 number"
                    )));
                }
            }
            if raw.lines.served.len() > 256 {
                return Err(err("lines.served: at most 256 lines"));
            }
            LinesSource::Config(raw.lines.served.clone())
        }
    };
    let t = &raw.timing;
    if !(1..=30).contains(&t.valid_for_s) {
        return Err(err("timing.valid_for_s must be 1 to 30"));
    }
    if t.heartbeat_interval_ms < 50 || t.heartbeat_interval_ms >= u64::from(t.valid_for_s) * 1000 {
        return Err(err(
            "timing.heartbeat_interval_ms must be at least 50 and below valid_for_s",
        ));
    }
    for (name, v) in [
        ("app_timeout_ms", t.app_timeout_ms),
        ("probe_timeout_ms", t.probe_timeout_ms),
        ("edge_timeout_ms", t.edge_timeout_ms),
        ("telnyx_resend_ms", t.telnyx_resend_ms),
        ("telnyx_timeout_ms", t.telnyx_timeout_ms),
        ("duplicate_wait_ms", t.duplicate_wait_ms),
        ("upkeep_interval_ms", t.upkeep_interval_ms),
        ("drain_poll_ms", t.drain_poll_ms),
        ("request_read_timeout_ms", t.request_read_timeout_ms),
    ] {
        if !(10..=600_000).contains(&v) {
            return Err(err(format!("timing.{name} must be 10 to 600000")));
        }
    }
    if !(0..=60).contains(&t.assertion_skew_s) {
        return Err(err("timing.assertion_skew_s must be 0 to 60"));
    }
    if t.ledger_retention_s < 60 {
        return Err(err("timing.ledger_retention_s must be at least 60"));
    }
    let deploy = raw
        .deploy
        .map(|d| validate_deploy(d, &raw.runtime_checkout))
        .transpose()?;
    Ok(Config {
        node: raw.node,
        state_dir: raw.state_dir,
        runtime_checkout: raw.runtime_checkout,
        key: raw.key,
        next_key: raw.next_key,
        edge_url,
        edge_keys,
        telnyx_keys,
        telnyx_api,
        already_answered_codes: raw.telnyx.already_answered_codes,
        telnyx_connection_id: raw.telnyx.connection_id,
        listen_origin: raw.listen.origin,
        listen_local: raw.listen.local,
        max_connections: raw.listen.max_connections,
        listen_metrics: raw.listen.metrics_listen,
        app_webhook_url,
        app_status_url,
        origin_url: raw.origin.url,
        probe_url,
        deploy,
        lines,
        timing: raw.timing,
    })
}

fn validate_deploy(d: RawDeploy, runtime_checkout: &Path) -> Result<DeployConfig, AgentError> {
    let remote = d.remote.trim().to_string();
    if remote.is_empty() || remote.starts_with('-') || remote.len() > 1024 {
        return Err(err("deploy.remote must be a git URL or path"));
    }
    if let Some((_, rest)) = remote.split_once("://") {
        let authority = rest.split('/').next().unwrap_or_default();
        if authority.contains('@')
            && authority
                .split('@')
                .next()
                .unwrap_or_default()
                .contains(':')
        {
            return Err(err(
                "deploy.remote must not carry a password: use an SSH key (git runs without system or global configuration, so no credential helper)",
            ));
        }
    }
    check_durable(&d.releases_dir, "deploy.releases_dir")?;
    if !d.current.is_absolute() {
        return Err(err("deploy.current must be an absolute path"));
    }
    if d.current != runtime_checkout {
        return Err(err(
            "runtime_checkout must be deploy.current: the node reports the release it runs",
        ));
    }
    if d.current.starts_with(&d.releases_dir) {
        return Err(err("deploy.current must not be inside deploy.releases_dir"));
    }
    for a in &d.artifacts {
        let p = Path::new(a);
        if a.is_empty()
            || p.is_absolute()
            || p.components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            return Err(err(format!(
                "deploy.artifacts: {a:?} must be a relative path inside the checkout"
            )));
        }
    }
    if d.artifacts.len() > 64 {
        return Err(err("deploy.artifacts: at most 64"));
    }
    let restart =
        match (d.restart, d.unit) {
            (Some(r), None) if !r.trim().is_empty() => r,
            (None, Some(u)) if is_unit(&u) => format!("systemctl restart {u}"),
            (None, None) => {
                return Err(err(
                    "deploy needs restart = \"...\" or unit = \"<app unit>\"",
                ))
            }
            _ => return Err(err(
                "deploy: give either restart or a valid unit name (^[A-Za-z0-9@._-]+$), not both",
            )),
        };
    if !(1..=50).contains(&d.keep) {
        return Err(err("deploy.keep must be 1 to 50"));
    }
    if !is_branch(&d.branch) {
        return Err(err(
            "deploy.branch must be a branch name (letters, digits, ._/-; no \"..\")",
        ));
    }
    if let Some(user) = &d.build_user {
        if !crate::identity::is_user_name(user) {
            return Err(err(
                "deploy.build_user must be a user name (^[a-z_][a-z0-9_-]{0,31}$)",
            ));
        }
    }
    let duration = |text: &str, what: &str| {
        crate::duration::parse(text)
            .map_err(|e| err(format!("deploy.{what}: {e}")))
            .and_then(|v| {
                if v.is_zero() {
                    Err(err(format!("deploy.{what} must be above 0")))
                } else {
                    Ok(v)
                }
            })
    };
    Ok(DeployConfig {
        remote,
        releases_dir: d.releases_dir,
        current: d.current,
        build: d.build.filter(|b| !b.trim().is_empty()),
        artifacts: d.artifacts,
        restart,
        health_timeout: duration(&d.health_timeout, "health_timeout")?,
        drain_deadline: duration(&d.drain_deadline, "drain_deadline")?,
        build_timeout: duration(&d.build_timeout, "build_timeout")?,
        keep: d.keep,
        branch: d.branch,
        build_user: d.build_user,
        build_can_read_keys: d.build_can_read_keys,
    })
}

/// A branch name git takes as `refs/heads/<name>` without surprises.
fn is_branch(name: &str) -> bool {
    (1..=200).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._/-".contains(&b))
        && !name.starts_with(['-', '/', '.'])
        && !name.ends_with(['/', '.'])
        && !name.ends_with(".lock")
        && !name.contains("..")
        && !name.contains("//")
        && !name.contains("/.")
}

fn is_unit(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"@._-".contains(&b))
}

/// The default tunnel probe: the origin URL with its last path segment
/// replaced by `health` (`.../callfence/telnyx` → `.../callfence/health`),
/// which the origin proxy answers with its node id.
pub fn default_probe_url(origin: &Url) -> Result<Url, AgentError> {
    origin
        .join("health")
        .map_err(|e| err(format!("origin.url: cannot derive the probe URL: {e}")))
}

#[cfg(test)]
pub(crate) fn example_toml(state_dir: &str) -> String {
    format!(
        r#"
node = "M3"
state_dir = "{state_dir}"
runtime_checkout = "/srv/voice-app"
[key]
id = "k2026a"
path = "/etc/callfence/node.key"
[edge]
url = "https://edge.example.com"
[edge.public_keys]
e1 = "11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo="
[telnyx]
public_keys = ["11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo="]
[listen]
origin = "0.0.0.0:8443"
local = "127.0.0.1:8444"
[app]
webhook_url = "http://127.0.0.1:9000/telnyx/webhook"
status_url = "http://127.0.0.1:9000/callfence/status"
[origin]
url = "https://m3.example.com/callfence/telnyx"
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minimal_config_gets_the_production_timing() {
        let c = from_toml(&example_toml("/var/lib/callfence")).unwrap();
        assert_eq!(c.node, "M3");
        assert_eq!(c.timing, Timing::default());
        assert_eq!(
            c.probe_url.as_str(),
            "https://m3.example.com/callfence/health"
        );
        assert_eq!(c.lines, LinesSource::App);
        assert!(c.telnyx_api.is_none());
    }

    #[test]
    fn the_state_dir_may_not_be_temporary() {
        for dir in ["/tmp/cf", "/var/tmp/x", "/dev/shm/x", "relative/dir"] {
            let e = from_toml(&example_toml(dir)).unwrap_err();
            assert!(e.0.contains("state_dir"), "{dir}: {e}");
        }
    }

    #[test]
    fn the_local_api_must_be_loopback_and_unknown_fields_are_refused() {
        let text = example_toml("/var/lib/cf").replace("127.0.0.1:8444", "0.0.0.0:8444");
        assert!(from_toml(&text).unwrap_err().0.contains("loopback"));
        let text = example_toml("/var/lib/cf").replace("[edge]", "surprise = 1\n[edge]");
        assert!(from_toml(&text).is_err());
    }

    #[test]
    fn bad_keys_and_ids_are_refused() {
        let text = example_toml("/var/lib/cf").replace("node = \"M3\"", "node = \"M 3\"");
        assert!(from_toml(&text).is_err());
        let text = example_toml("/var/lib/cf").replace("e1 = \"11qY", "e1 = \"!!qY");
        assert!(from_toml(&text)
            .unwrap_err()
            .0
            .contains("edge.public_keys.e1"));
    }

    #[test]
    fn lines_from_config_are_checked() {
        let text = example_toml("/var/lib/cf")
            + "[lines]\nsource = \"config\"\n[lines.served]\nproperty_management_ca = \"+15102160079\"\n";
        let c = from_toml(&text).unwrap();
        assert!(matches!(c.lines, LinesSource::Config(ref m) if m.len() == 1));
        let text = example_toml("/var/lib/cf")
            + "[lines]\nsource = \"config\"\n[lines.served]\nBad = \"5102160079\"\n";
        assert!(from_toml(&text).is_err());
    }

    #[test]
    fn the_annotated_example_is_valid() {
        let c = from_toml(include_str!("../agent.example.toml")).unwrap();
        assert_eq!(
            c.timing,
            Timing::default(),
            "the example shows the defaults"
        );
        assert_eq!(c.edge_keys.len(), 1);
    }

    #[test]
    fn the_deploy_table_is_checked() {
        let base = example_toml("/var/lib/cf").replace(
            "runtime_checkout = \"/srv/voice-app\"",
            "runtime_checkout = \"/srv/app/current\"",
        );
        let with = |table: &str| format!("{base}[deploy]\n{table}\n");
        let ok = "remote = \"/srv/git/app.git\"\nreleases_dir = \"/srv/app/releases\"\ncurrent = \"/srv/app/current\"\nunit = \"voice-app.service\"";
        let d = from_toml(&with(ok)).unwrap().deploy.unwrap();
        assert_eq!(d.restart, "systemctl restart voice-app.service");
        assert_eq!((d.keep, d.health_timeout.as_secs()), (3, 60));
        assert_eq!((d.branch.as_str(), d.build_user.as_deref()), ("main", None));
        assert!(!d.build_can_read_keys, "the opt-out is never the default");
        let d = from_toml(&with(&format!(
            "{ok}\nbranch = \"release/2026\"\nbuild_user = \"callfence-build\""
        )))
        .unwrap()
        .deploy
        .unwrap();
        assert_eq!(d.branch, "release/2026");
        for bad in [
            ok.replace("/srv/app/releases", "/tmp/releases"),
            ok.replace("current = \"/srv/app/current\"", "current = \"/srv/other\""),
            ok.replace("unit = \"voice-app.service\"", "unit = \"a b\""),
            ok.replace("unit = \"voice-app.service\"", ""),
            format!("{ok}\nartifacts = [\"../x\"]"),
            format!("{ok}\nkeep = 0"),
            ok.replace(
                "/srv/git/app.git",
                "https://bot:s3cret@git.example.com/app.git",
            ),
            format!("{ok}\nhealth_timeout = \"soon\""),
            format!("{ok}\nbranch = \"-main\""),
            format!("{ok}\nbranch = \"main..x\""),
            format!("{ok}\nbranch = \"refs/heads/../x\""),
            format!("{ok}\nbuild_user = \"-u root\""),
        ] {
            assert!(from_toml(&with(&bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_origin_bound_and_the_dial_connection_are_checked() {
        let c = from_toml(&example_toml("/var/lib/cf")).unwrap();
        assert_eq!((c.max_connections, c.telnyx_connection_id), (256, None));
        assert_eq!(c.timing.request_read_timeout_ms, 5_000);
        assert_eq!(c.listen_metrics, None, "metrics on the local API only");
        let with = |listen: &str, telnyx: &str| {
            example_toml("/var/lib/cf")
                .replace("[listen]\n", &format!("[listen]\n{listen}\n"))
                .replace("[telnyx]\n", &format!("[telnyx]\n{telnyx}\n"))
        };
        let c = from_toml(&with("metrics_listen = \"0.0.0.0:9464\"", "")).unwrap();
        assert_eq!(c.listen_metrics, Some("0.0.0.0:9464".parse().unwrap()));
        let c = from_toml(&with("max_connections = 32", "connection_id = \"c-1\"")).unwrap();
        assert_eq!(
            (c.max_connections, c.telnyx_connection_id.as_deref()),
            (32, Some("c-1"))
        );
        for (listen, telnyx) in [
            ("max_connections = 0", ""),
            ("max_connections = 65537", ""),
            ("", "connection_id = \"\""),
            ("", "connection_id = \"a b\""),
            ("metrics_listen = \"localhost\"", ""),
        ] {
            assert!(
                from_toml(&with(listen, telnyx)).is_err(),
                "{listen} {telnyx}"
            );
        }
    }

    #[test]
    fn timing_is_bounded() {
        let text = example_toml("/var/lib/cf") + "[timing]\nvalid_for_s = 31\n";
        assert!(from_toml(&text).is_err());
        let text = example_toml("/var/lib/cf")
            + "[timing]\nheartbeat_interval_ms = 200\nvalid_for_s = 2\n";
        assert_eq!(from_toml(&text).unwrap().timing.heartbeat_interval_ms, 200);
    }
}
