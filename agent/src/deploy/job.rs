//! The running agent's one deploy slot, what the control socket
//! ([`crate::control`]) asks of it, and the client the `deploy`,
//! `rollback` and `job` commands use. Never on the HTTP local API.
//!
//! - `{"op":"deploy","sha","shed"?,"deadline"?}` and
//!   `{"op":"rollback","shed"?,"deadline"?}`: 202 `{"id","pid"}` once the job
//!   runs in the agent; 409 `deploy_in_progress` while one runs; 404
//!   `deploy_not_configured` without a `[deploy]` table.
//! - `{"op":"job"}`: the latest job: `{"pid","id","kind","steps":[...],"result":Outcome|null}`,
//!   404 `no_deploy` before the first.
//!
//! The job runs in a task of the agent, not of the request: a client that
//! goes away (the command killed) changes nothing about it.

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::steps::{self, Recorder, Request};
use super::{journal, Outcome, StepRecord};
use crate::context::Agent;
use crate::AgentError;

/// How long the client waits for an agent that stopped answering.
const CLIENT_PATIENCE: Duration = Duration::from_secs(5);

/// The latest job, as the local API shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobView {
    /// The agent process running it (a restarted agent has another).
    #[serde(default)]
    pub pid: u32,
    /// Increases with each job of this agent process.
    pub id: u64,
    /// `deploy`, `rollback` or `recover`.
    pub kind: String,
    /// The steps so far.
    pub steps: Vec<StepRecord>,
    /// The result, once finished.
    pub result: Option<Outcome>,
}

/// The one job slot.
#[derive(Debug, Default)]
pub struct Slot(Mutex<Option<JobView>>);

impl Slot {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<JobView>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the slot for a new job, unless one is running.
    fn begin(&self, kind: &str) -> Option<u64> {
        let mut slot = self.lock();
        if slot.as_ref().is_some_and(|j| j.result.is_none()) {
            return None;
        }
        let id = slot.as_ref().map_or(1, |j| j.id + 1);
        *slot = Some(JobView {
            pid: std::process::id(),
            id,
            kind: kind.to_string(),
            steps: Vec::new(),
            result: None,
        });
        Some(id)
    }

    /// Adds a finished step to the running job.
    pub fn push(&self, step: StepRecord) {
        crate::metrics::global().deploy_step(&step);
        if let Some(j) = self.lock().as_mut() {
            j.steps.push(step);
        }
    }

    fn finish(&self, outcome: Outcome) {
        crate::metrics::global().deploy_finished(&outcome);
        if let Some(j) = self.lock().as_mut() {
            j.result = Some(outcome);
        }
    }

    /// True while a job runs.
    pub fn busy(&self) -> bool {
        self.lock().as_ref().is_some_and(|j| j.result.is_none())
    }

    fn view(&self) -> Option<JobView> {
        self.lock().clone()
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Deploy,
    Rollback,
}

/// Starts a job in the agent; the id, or why not (status and code).
fn start(agent: &Arc<Agent>, kind: Kind, req: Request) -> Result<u64, (u16, &'static str)> {
    let Some(cfg) = agent.config.deploy.clone() else {
        return Err((404, "deploy_not_configured"));
    };
    let name = match kind {
        Kind::Deploy => "deploy",
        Kind::Rollback => "rollback",
    };
    let id = agent
        .deploy
        .begin(name)
        .ok_or((409, "deploy_in_progress"))?;
    let a = agent.clone();
    tokio::spawn(async move {
        let rec = Recorder::new(a.clone());
        let outcome = match kind {
            Kind::Deploy => steps::deploy(a.clone(), cfg, req, rec).await,
            Kind::Rollback => steps::rollback(a.clone(), cfg, req, rec).await,
        };
        crate::log::info(
            "deploy_finished",
            json!({"kind": outcome.kind, "ok": outcome.ok, "to": outcome.to, "live": outcome.live,
                   "step": outcome.step, "reason": outcome.reason, "restored": outcome.restored}),
        );
        a.deploy.finish(outcome);
    });
    Ok(id)
}

/// At start: an unfinished journal is restored before the node is active
/// again (the mode is set `drained` at once). Returns true when a recovery
/// was started.
pub fn recover_at_start(agent: &Arc<Agent>) -> bool {
    let Some(cfg) = agent.config.deploy.clone() else {
        return false;
    };
    let j = match journal::read(&agent.config.state_dir) {
        Ok(Some(j)) => j,
        Ok(None) => return false,
        Err(e) => {
            let _ = crate::mode::write(&agent.config.state_dir, crate::mode::NodeMode::Drained);
            crate::log::error(
                "deploy_journal_unusable",
                json!({"error": e.0, "mode": "drained"}),
            );
            return false;
        }
    };
    let _ = crate::mode::write(&agent.config.state_dir, crate::mode::NodeMode::Drained);
    if agent.deploy.begin("recover").is_none() {
        return false;
    }
    crate::log::warn(
        "deploy_recovering",
        json!({"from": j.from, "to": j.to, "step": j.step}),
    );
    let a = agent.clone();
    tokio::spawn(async move {
        let outcome = steps::recover(a.clone(), cfg, j, Recorder::new(a.clone())).await;
        crate::log::info(
            "deploy_finished",
            json!({"kind": "recover", "ok": outcome.ok, "live": outcome.live, "restored": outcome.restored, "mode": outcome.mode}),
        );
        a.deploy.finish(outcome);
    });
    true
}

fn request(body: &Value, with_sha: bool) -> Result<Request, String> {
    let sha = if with_sha {
        Some(
            body.get("sha")
                .and_then(Value::as_str)
                .filter(|s| s.len() <= 256)
                .ok_or("sha must be a string")?
                .to_string(),
        )
    } else {
        None
    };
    let shed = body.get("shed").and_then(Value::as_bool).unwrap_or(false);
    let deadline = match body.get("deadline").and_then(Value::as_str) {
        Some(d) => Some(crate::drain::parse_duration(d).map_err(|e| e.0)?),
        None => None,
    };
    Ok(Request {
        sha,
        shed,
        deadline,
    })
}

/// A control socket request to start a deploy (`with_sha`) or a rollback:
/// 202 `{"id","pid"}`, or the refusal.
pub fn start_from(agent: &Arc<Agent>, with_sha: bool, body: &Value) -> (u16, Value) {
    let kind = if with_sha {
        Kind::Deploy
    } else {
        Kind::Rollback
    };
    let req = match request(body, with_sha) {
        Ok(r) => r,
        Err(problem) => return (400, json!({"error": "bad_request", "problem": problem})),
    };
    match start(agent, kind, req) {
        Ok(id) => (202, json!({"id": id, "pid": std::process::id()})),
        Err((status, code)) => (status, json!({"error": code})),
    }
}

/// The latest job, for the control socket.
pub fn latest(agent: &Agent) -> (u16, Value) {
    match agent.deploy.view() {
        Some(v) => (200, json!(v)),
        None => (404, json!({"error": "no_deploy"})),
    }
}

/// The `job` command: the running agent's latest job, as JSON.
pub async fn show(state_dir: &std::path::Path) -> Result<Value, AgentError> {
    match crate::control::ask(state_dir, &json!({"op": "job"})).await? {
        (200, view) => Ok(view),
        (status, body) => Err(AgentError::new(format!(
            "the agent answered {status} {}",
            body.get("error").and_then(Value::as_str).unwrap_or("?")
        ))),
    }
}

/// The `deploy` and `rollback` commands: ask the running agent over the
/// control socket of `state_dir` (`request` carries the `op`), print each
/// step as it finishes (or, with `json`, only the final [`Outcome`]), and
/// exit 0 only when the release is live and verified.
pub async fn client(
    state_dir: &std::path::Path,
    request: Value,
    json_out: bool,
) -> Result<ExitCode, AgentError> {
    let (status, started) = crate::control::ask(state_dir, &request)
        .await
        .map_err(|e| {
            AgentError::new(format!(
                "{e}: deploy runs inside `callfence-agent run`, so that a crash of either side is recovered from the journal"
            ))
        })?;
    if status != 202 {
        return Err(AgentError::new(format!(
            "the agent refused: {} {}",
            status,
            started.get("error").and_then(Value::as_str).unwrap_or("?")
        )));
    }
    let id = started["id"].as_u64().unwrap_or(0);
    let pid = started["pid"].as_u64().unwrap_or(0);
    let lost = || {
        AgentError::new(
            "lost the agent mid-deploy: it finishes the restore from the journal when it starts again; see `releases` and `status`",
        )
    };
    let mut printed = 0;
    let mut silent_since = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let view = match crate::control::ask(state_dir, &json!({"op": "job"})).await {
            Ok((200, v)) => serde_json::from_value::<JobView>(v).ok(),
            _ => None,
        };
        let Some(view) = view else {
            if silent_since.elapsed() > CLIENT_PATIENCE {
                return Err(lost());
            }
            continue;
        };
        silent_since = tokio::time::Instant::now();
        if view.id != id || u64::from(view.pid) != pid {
            return Err(lost());
        }
        if !json_out {
            for s in view.steps.iter().skip(printed) {
                println!(
                    "{:<18} {:<6} {:>7} ms  {}",
                    s.step,
                    if s.ok { "ok" } else { "FAILED" },
                    s.ms,
                    s.detail
                );
            }
        }
        printed = view.steps.len();
        if let Some(out) = view.result {
            if json_out {
                println!("{}", serde_json::to_string(&out).unwrap_or_default());
            } else if out.ok {
                println!(
                    "{} {} is live and verified (mode {})",
                    out.kind,
                    out.live.as_deref().unwrap_or("?"),
                    out.mode
                );
            } else {
                println!(
                    "{} failed at {}: {}; {} (live {}, mode {})",
                    out.kind,
                    out.step.as_deref().unwrap_or("?"),
                    out.reason.as_deref().unwrap_or("?"),
                    if out.restored {
                        "the previous release is restored and verified"
                    } else {
                        "nothing was restored"
                    },
                    out.live.as_deref().unwrap_or("none"),
                    out.mode
                );
            }
            return Ok(if out.ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            });
        }
    }
}
