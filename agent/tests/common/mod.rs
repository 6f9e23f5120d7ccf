//! Shared harness for the integration tests: they run the real
//! `callfence-agent` binary as a process, against a demo voice app (a tiny
//! axum server counting calls) and, where needed, a fake Telnyx API. No test
//! talks to an edge: the edge URL points at a closed loopback port.

#![allow(dead_code)]

pub mod deploy;

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::{get, post};
use axum::{Json, Router};
use callfence_core::assertion;
use callfence_core::encoding::b64_encode;
use ed25519_dalek::{Signer, SigningKey};
use serde_json::{json, Value};

pub const BIN: &str = env!("CARGO_BIN_EXE_callfence-agent");
pub const NODE: &str = "M1";
pub const EDGE_KID: &str = "edge1";
/// The `[telnyx] connection_id` of a node with a Telnyx API.
pub const CONNECTION_ID: &str = "conn-configured";

pub fn now_ms() -> i64 {
    callfence_agent::clock::now_ms()
}

/// Where test state may live: the target's tmp dir, unless the checkout
/// itself sits on a volatile path (`/tmp`, `/var/tmp`, `/dev/shm`), which the
/// agent refuses for a state directory, or (as root) behind a directory that
/// other users cannot search, such as a clone in `/root`: the attack tests
/// run the agent's CLI and a deploy's build as `nobody`, who must reach the
/// state and release directories to meet the checks under test. Then
/// `/var/lib/callfence-tests` as root, `~/.cache/callfence-tests` otherwise.
pub fn durable_root() -> PathBuf {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let resolved = std::fs::canonicalize(target).unwrap_or_else(|_| target.to_path_buf());
    let volatile = ["/tmp", "/var/tmp", "/dev/shm"]
        .iter()
        .any(|v| target.starts_with(v) || resolved.starts_with(v));
    let root = am_root();
    if !volatile && (!root || others_can_search(&resolved)) {
        return target.to_path_buf();
    }
    if root {
        return PathBuf::from("/var/lib/callfence-tests");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"));
    home.join(".cache").join("callfence-tests")
}

/// True when this process runs as root.
pub fn am_root() -> bool {
    callfence_agent::identity::own().is_ok_and(|me| me.is_root())
}

/// True when every directory from `/` down to `dir` lets other users search
/// it (the `o+x` bit).
fn others_can_search(dir: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    dir.ancestors().all(|a| {
        std::fs::metadata(a)
            .map(|m| m.permissions().mode() & 0o001 != 0)
            .unwrap_or(false)
    })
}

/// A fresh directory under [`durable_root`].
pub fn scratch(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = durable_root().join(format!(
        "{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `N` distinct free loopback ports. All N listeners are held until every
/// port is chosen, so the kernel cannot hand the same port out twice (one
/// bound and dropped at a time, two calls in a row can get the same one).
pub fn free_ports<const N: usize>() -> [u16; N] {
    let listeners: Vec<TcpListener> = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    std::array::from_fn(|i| listeners[i].local_addr().unwrap().port())
}

/// The test's keys: the pinned edge key, an unpinned one, Telnyx's.
pub struct Keys {
    pub edge: SigningKey,
    pub rogue: SigningKey,
    pub telnyx: SigningKey,
}

impl Keys {
    pub fn new() -> Keys {
        Keys {
            edge: SigningKey::from_bytes(&[7u8; 32]),
            rogue: SigningKey::from_bytes(&[8u8; 32]),
            telnyx: SigningKey::from_bytes(&[9u8; 32]),
        }
    }
}

pub struct Node {
    pub dir: PathBuf,
    pub config: PathBuf,
    pub origin: SocketAddr,
    pub local: SocketAddr,
    /// The loopback port the config names as the edge (nothing listens on
    /// it unless the test starts a stand-in there).
    pub edge_port: u16,
    pub child: Option<Child>,
}

/// Writes a node (key file, config) whose app is `app_url` and whose
/// Telnyx API, if any, is `telnyx_api`.
pub fn node(keys: &Keys, app_url: &str, telnyx_api: Option<&str>) -> Node {
    let dir = scratch("node");
    let key = dir.join("node.key");
    let out = Command::new(BIN)
        .args(["keygen", "--out"])
        .arg(&key)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let [origin_port, local_port, edge_port] = free_ports();
    let origin: SocketAddr = format!("127.0.0.1:{origin_port}").parse().unwrap();
    let local: SocketAddr = format!("127.0.0.1:{local_port}").parse().unwrap();
    let api = match telnyx_api {
        Some(base) => {
            let f = dir.join("telnyx.key");
            std::fs::write(&f, "KEY_test_secret\n").unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
            format!(
                "api_base = \"{base}\"\napi_key_file = \"{}\"\nconnection_id = \"{CONNECTION_ID}\"\n",
                f.display()
            )
        }
        None => String::new(),
    };
    let text = format!(
        r#"node = "{NODE}"
state_dir = "{state}"
runtime_checkout = "{dir}"

[key]
id = "k1"
path = "{key}"

[edge]
url = "http://127.0.0.1:{edge_port}"
[edge.public_keys]
{EDGE_KID} = "{edge_pub}"

[telnyx]
public_keys = ["{telnyx_pub}"]
{api}
[listen]
origin = "{origin}"
local = "{local}"

[app]
webhook_url = "{app_url}/telnyx/webhook"
status_url = "{app_url}/callfence/status"

[origin]
url = "http://{origin}/callfence/telnyx"

[timing]
heartbeat_interval_ms = 1000
valid_for_s = 2
app_timeout_ms = 8000
probe_timeout_ms = 300
edge_timeout_ms = 500
telnyx_resend_ms = 100
upkeep_interval_ms = 600000
drain_poll_ms = 100
"#,
        state = dir.join("state").display(),
        dir = dir.display(),
        key = key.display(),
        edge_pub = b64_encode(keys.edge.verifying_key().as_bytes()),
        telnyx_pub = b64_encode(keys.telnyx.verifying_key().as_bytes()),
    );
    let config = dir.join("agent.toml");
    std::fs::write(&config, text).unwrap();
    Node {
        dir,
        config,
        origin,
        local,
        edge_port,
        child: None,
    }
}

impl Node {
    pub fn cmd(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .output()
            .unwrap()
    }

    pub fn set_mode(&self, mode: &str) {
        let out = self.cmd(&["mode", "set", mode]);
        assert!(out.status.success(), "{out:?}");
    }

    /// Starts `run` and waits for its local API.
    pub async fn start(&mut self) {
        self.start_under(&[]).await
    }

    /// Starts `run` under `wrapper` (e.g. `prlimit --nofile=256:256`),
    /// and waits for its local API.
    pub async fn start_under(&mut self, wrapper: &[&str]) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("agent.log"))
            .unwrap();
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        let child = command
            .arg("--config")
            .arg(&self.config)
            .arg("run")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let url = format!("http://{}/healthz", self.local);
        for _ in 0..200 {
            if let Ok(r) = reqwest::get(&url).await {
                if r.status() == 200 {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("agent did not start: {}", self.log());
    }

    /// SIGKILL, no goodbye.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("agent.log")).unwrap_or_default()
    }

    pub fn webhook_url(&self) -> String {
        format!("http://{}/callfence/telnyx", self.origin)
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }

    /// The local API token the running agent made (`state/local-api.token`;
    /// empty when there is none, so that a test run against an agent
    /// without tokens fails on what that agent does, not here).
    pub fn token(&self) -> String {
        std::fs::read_to_string(self.state_dir().join("local-api.token"))
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    /// A local API request as the voice app sends it: the token, JSON.
    pub async fn local(&self, path: &str, body: Option<&Value>) -> (u16, Value) {
        let url = format!("http://{}{path}", self.local);
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let req = match body {
            Some(b) => http.post(url).json(b),
            None => http.get(url),
        };
        let resp = req
            .bearer_auth(self.token())
            .send()
            .await
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.unwrap();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    /// Replaces `from` with `to` in the config file (before `start`).
    pub fn edit_config(&self, from: &str, to: &str) {
        let text = std::fs::read_to_string(&self.config).unwrap();
        assert!(text.contains(from), "{from:?} not in the config");
        std::fs::write(&self.config, text.replacen(from, to, 1)).unwrap();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Sends `request` as raw bytes on a new connection to `addr` (a browser's
/// request, with exactly the headers given) and reads the answer to the
/// end: its status (0 when none) and JSON body (`Null` when not JSON).
pub fn raw_http(addr: SocketAddr, request: &str) -> (u16, Value) {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    conn.write_all(request.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let _ = conn.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// A Telnyx webhook body.
pub fn event(event_id: &str, event_type: &str, session: &str, ccid: &str) -> Vec<u8> {
    json!({"data": {"id": event_id, "event_type": event_type, "record_type": "event",
           "payload": {"call_control_id": ccid, "call_session_id": session, "from": "+14155550100",
                       "to": "+15102160079", "direction": "incoming"}},
           "meta": {"attempt": 1}})
    .to_string()
    .into_bytes()
}

pub struct Webhook {
    pub body: Vec<u8>,
    pub assertion: Option<String>,
    pub telnyx_ts: String,
    pub telnyx_sig: String,
    pub extra: Vec<(String, String)>,
}

/// A webhook as the edge forwards it: Telnyx-signed, with an assertion
/// minted by `key` under `kid` for `node` over `assert_body`.
pub fn webhook(
    keys: &Keys,
    body: &[u8],
    kid: &str,
    key: &SigningKey,
    node: &str,
    assert_body: &[u8],
    epoch: u64,
) -> Webhook {
    let v: Value = serde_json::from_slice(body).unwrap();
    let now = now_ms();
    let claims = assertion::claims_for(
        node,
        v["data"]["payload"]["call_session_id"].as_str().unwrap(),
        v["data"]["payload"]["call_control_id"].as_str(),
        v["data"]["id"].as_str().unwrap(),
        epoch,
        1,
        assert_body,
        now,
    );
    let ts = (now / 1000).to_string();
    let mut msg = ts.as_bytes().to_vec();
    msg.push(b'|');
    msg.extend_from_slice(body);
    Webhook {
        body: body.to_vec(),
        assertion: Some(assertion::mint(kid, key, &claims)),
        telnyx_sig: b64_encode(&keys.telnyx.sign(&msg).to_bytes()),
        telnyx_ts: ts,
        extra: Vec::new(),
    }
}

/// The valid webhook for `body`.
pub fn good(keys: &Keys, body: &[u8], epoch: u64) -> Webhook {
    webhook(keys, body, EDGE_KID, &keys.edge, NODE, body, epoch)
}

pub async fn send(url: &str, w: &Webhook) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("telnyx-timestamp", &w.telnyx_ts)
        .header("telnyx-signature-ed25519", &w.telnyx_sig);
    if let Some(a) = &w.assertion {
        req = req.header("Callfence-Assertion", a);
    }
    for (k, v) in &w.extra {
        req = req.header(k.as_str(), v.as_str());
    }
    let resp = req.body(w.body.clone()).send().await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.bytes().await.unwrap();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// What the demo app saw.
#[derive(Default)]
pub struct AppSeen {
    pub calls: AtomicUsize,
    pub requests: Mutex<Vec<(HeaderMap, Vec<u8>)>>,
    /// Milliseconds to wait before answering call number i (0-based).
    pub delays: Mutex<Vec<u64>>,
    /// The calls the app says it holds (its status's `active_calls`).
    pub active_calls: AtomicU32,
}

/// The demo voice app: answers `{"ok":true,"n":<call number>}` and the
/// status contract.
pub async fn demo_app() -> (String, Arc<AppSeen>) {
    async fn hook(State(s): State<Arc<AppSeen>>, headers: HeaderMap, body: Bytes) -> Json<Value> {
        let n = s.calls.fetch_add(1, Ordering::SeqCst);
        s.requests.lock().unwrap().push((headers, body.to_vec()));
        let delay = s.delays.lock().unwrap().get(n).copied().unwrap_or(0);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        Json(json!({"ok": true, "n": n + 1}))
    }
    async fn status(State(s): State<Arc<AppSeen>>) -> Json<Value> {
        let active = s.active_calls.load(Ordering::SeqCst);
        Json(
            json!({"ready": true, "active_calls": active, "max_calls": 4, "lines": {"property_management_ca": "+15102160079"}}),
        )
    }
    let seen = Arc::new(AppSeen::default());
    let app = Router::new()
        .route("/telnyx/webhook", post(hook))
        .route("/callfence/status", get(status))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), seen)
}

pub const FAKE_TELNYX_BIN: &str = env!("CARGO_BIN_EXE_callfence-fake-telnyx");

/// The shared fake Telnyx API (`callfence-fake-telnyx`, the one `make dev`
/// and the end-to-end cluster use too), as a process on a free port.
pub struct FakeTelnyx {
    pub url: String,
    child: Child,
}

impl FakeTelnyx {
    /// Starts it and reads its URL from its first line.
    pub fn start() -> FakeTelnyx {
        use std::io::BufRead;
        let mut child = Command::new(FAKE_TELNYX_BIN)
            .args(["--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut first = String::new();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        out.read_line(&mut first).unwrap();
        let url = first
            .trim()
            .strip_prefix("listening ")
            .unwrap_or_else(|| panic!("callfence-fake-telnyx said {first:?}"))
            .to_string();
        // Keep draining its per-request lines so it never blocks on a full pipe.
        std::thread::spawn(move || for _ in out.lines() {});
        FakeTelnyx { url, child }
    }

    /// Every request it recorded (`GET /__record`).
    pub async fn record(&self) -> Vec<Value> {
        let v: Value = reqwest::get(format!("{}/__record", self.url))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["commands"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for FakeTelnyx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An edge stand-in on `port` whose `/v1/fence` answers 503
/// `dispatcher_unavailable` to the first `failures` requests and then a
/// grant; it counts the fence requests. Every other route is 404.
pub async fn flaky_edge(port: u16, failures: usize) -> Arc<AtomicUsize> {
    use axum::http::StatusCode;
    use axum::routing::post;
    let asked = Arc::new(AtomicUsize::new(0));
    let count = asked.clone();
    let app = axum::Router::new().route(
        "/v1/fence",
        post(move || {
            let count = count.clone();
            async move {
                let n = count.fetch_add(1, Ordering::SeqCst);
                if n < failures {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        axum::Json(json!({"error": "dispatcher_unavailable"})),
                    )
                } else {
                    (
                        StatusCode::OK,
                        axum::Json(json!({
                            "granted": true, "first": n == failures, "epoch": 3,
                            "command_id": "5b3e2a2e-8f0c-5d1e-9a3b-0c1d2e3f4a5b",
                            "media_token": "v1.m1.x.y", "granted_at": "2026-12-02T12:00:00.000Z"
                        })),
                    )
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    asked
}

/// `git -C dir args...` as a test author would type it (user config for
/// commits), its trimmed stdout; panics when git fails.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@t"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
