//! `callfence-demo-app`: a tiny voice app for local development and the
//! end-to-end suite. It serves the status contract (see
//! `callfence_agent::probe`), takes webhooks from its agent on loopback, and
//! on `call.initiated` (incoming) asks the agent's `/local/answer` (again, for
//! about 2 s, while the agent is unreachable), with the
//! epoch from `Callfence-Epoch` and the bearer token read from
//! `--agent-token-file` (the agent's `state_dir/local-api.token`, read at
//! each answer: the agent makes it when it first starts). It counts a call from `call.initiated` to
//! `call.hangup`. `GET /demo/events` lists every webhook it was handed (event
//! id, type and how many times), and `--slow-ms` delays each webhook answer,
//! so the end-to-end suite can see re-deliveries and crash in mid-delivery.
//!
//! L5 probes (SPEC §14): a webhook carrying `Callfence-Probe: <nonce>` is
//! answered `{"probe":<nonce>,"sha":<its SHA>}` (503 with `--refuse-probes`)
//! and listed under `probes` in `/demo/events`. Its SHA is `--sha`, else the
//! HEAD of `--checkout` read once at start; it is also in the status.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Parser;
use serde_json::{json, Value};

/// A minimal voice app behind a callfence agent.
#[derive(Debug, Parser)]
#[command(name = "callfence-demo-app", version, about)]
struct Args {
    /// Loopback address to listen on (webhooks at /telnyx/webhook, status at /callfence/status).
    #[arg(long, default_value = "127.0.0.1:9000")]
    listen: SocketAddr,
    /// The agent's local API base URL: exactly its `listen.local` address
    /// (the agent refuses any other Host).
    #[arg(long, default_value = "http://127.0.0.1:8444")]
    agent: String,
    /// The agent's local API token file (`<state_dir>/local-api.token`).
    #[arg(long, value_name = "PATH")]
    agent_token_file: Option<std::path::PathBuf>,
    /// Capacity reported as max_calls.
    #[arg(long, default_value_t = 10)]
    max_calls: u32,
    /// A served line, `line_id=+E164` (repeatable).
    #[arg(long = "line", value_name = "ID=NUMBER")]
    lines: Vec<String>,
    /// Do not answer calls (only record them).
    #[arg(long)]
    no_answer: bool,
    /// Report ready = false.
    #[arg(long)]
    not_ready: bool,
    /// Wait this long before answering each webhook (a slow app).
    #[arg(long, default_value_t = 0)]
    slow_ms: u64,
    /// The commit this app reports (overrides --checkout).
    #[arg(long)]
    sha: Option<String>,
    /// The checkout the app runs from: its HEAD is the SHA it reports.
    #[arg(long, value_name = "DIR")]
    checkout: Option<std::path::PathBuf>,
    /// Answer L5 probes with 503 (a release that breaks the public path).
    #[arg(long)]
    refuse_probes: bool,
}

struct App {
    args: Args,
    lines: BTreeMap<String, String>,
    calls: Mutex<BTreeMap<String, String>>,
    /// Every webhook handed over, in arrival order: (event id, event type).
    events: Mutex<Vec<(String, String)>>,
    /// The nonce of every probe handed over.
    probes: Mutex<Vec<String>>,
    /// The SHA it reports, if known.
    sha: Option<String>,
    http: reqwest::Client,
}

/// `git rev-parse HEAD` of `dir`.
fn head_of(dir: &std::path::Path) -> Option<String> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), String> {
    let args = Args::parse();
    if !args.listen.ip().is_loopback() {
        return Err("--listen must be a loopback address: the app sits behind its agent".into());
    }
    let mut lines = BTreeMap::new();
    for l in &args.lines {
        let (id, number) = l.split_once('=').ok_or("--line takes ID=NUMBER")?;
        lines.insert(id.to_string(), number.to_string());
    }
    let listen = args.listen;
    let sha = args
        .sha
        .clone()
        .or_else(|| args.checkout.as_deref().and_then(head_of));
    let app = Arc::new(App {
        args,
        lines,
        calls: Mutex::new(BTreeMap::new()),
        events: Mutex::new(Vec::new()),
        probes: Mutex::new(Vec::new()),
        sha,
        http: reqwest::Client::new(),
    });
    let router = Router::new()
        .route("/callfence/status", get(status))
        .route("/telnyx/webhook", post(webhook))
        .route("/demo/events", get(events))
        .with_state(app);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| e.to_string())?;
    eprintln!("callfence-demo-app listening on {listen}");
    axum::serve(listener, router)
        .await
        .map_err(|e| e.to_string())
}

async fn status(State(app): State<Arc<App>>) -> Json<Value> {
    let calls = app.calls.lock().unwrap_or_else(|p| p.into_inner()).clone();
    Json(json!({
        "ready": !app.args.not_ready,
        "active_calls": calls.len(),
        "max_calls": app.args.max_calls,
        "lines": app.lines,
        "sha": app.sha,
        "calls": calls.iter().map(|(ccid, s)| json!({"call_control_id": ccid, "call_session_id": s})).collect::<Vec<_>>(),
    }))
}

async fn events(State(app): State<Arc<App>>) -> Json<Value> {
    let events = app.events.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut counts: BTreeMap<String, (String, u32)> = BTreeMap::new();
    for (id, kind) in events {
        counts.entry(id).or_insert((kind, 0)).1 += 1;
    }
    let probes = app.probes.lock().unwrap_or_else(|p| p.into_inner()).clone();
    Json(
        json!({"events": counts.iter().map(|(id, (kind, n))| json!({"event_id": id, "event_type": kind, "count": n})).collect::<Vec<_>>(),
               "probes": probes}),
    )
}

async fn webhook(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(nonce) = headers.get("callfence-probe").and_then(|v| v.to_str().ok()) {
        app.probes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(nonce.to_string());
        if app.args.refuse_probes {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({"refused": true})),
            )
                .into_response();
        }
        return Json(json!({"probe": nonce, "sha": app.sha})).into_response();
    }
    call_event(app, headers, body).await.into_response()
}

async fn call_event(app: Arc<App>, headers: HeaderMap, body: Bytes) -> Json<Value> {
    let event: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let kind = event["data"]["event_type"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let event_id = event["data"]["id"].as_str().unwrap_or("").to_string();
    app.events
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((event_id, kind.clone()));
    if app.args.slow_ms > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(app.args.slow_ms)).await;
    }
    let payload = &event["data"]["payload"];
    let ccid = payload["call_control_id"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let session = headers
        .get("callfence-call-session")
        .and_then(|v| v.to_str().ok())
        .or(payload["call_session_id"].as_str())
        .unwrap_or("")
        .to_string();
    let epoch: u64 = headers
        .get("callfence-epoch")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    match kind.as_str() {
        "call.initiated" if !ccid.is_empty() => {
            app.calls
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(ccid.clone(), session.clone());
            let incoming = payload["direction"].as_str() != Some("outgoing");
            if incoming && !app.args.no_answer {
                let app = app.clone();
                tokio::spawn(async move {
                    let url = format!("{}/local/answer", app.args.agent.trim_end_matches('/'));
                    let req = json!({"call_control_id": ccid, "call_session_id": session, "epoch": epoch});
                    let token = app
                        .args
                        .agent_token_file
                        .as_deref()
                        .and_then(|p| std::fs::read_to_string(p).ok())
                        .map(|t| t.trim().to_string())
                        .unwrap_or_default();
                    // The agent may be restarting: ask again while it is
                    // unreachable (an answer at the same epoch is
                    // idempotent; the agent itself retries the edge).
                    let answered = callfence_agent::net::retried(
                        std::time::Duration::MAX,
                        || app.http.post(&url).bearer_auth(&token).json(&req).send(),
                        |r| r.is_err(),
                    )
                    .await;
                    match answered {
                        Ok(r) => eprintln!("answer {} -> {}", ccid, r.status()),
                        Err(e) => eprintln!("answer {ccid} failed: {e}"),
                    }
                });
            }
        }
        "call.hangup" => {
            app.calls
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&ccid);
        }
        _ => {}
    }
    Json(json!({"ok": true}))
}
