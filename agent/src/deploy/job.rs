//! What the control socket ([`crate::control`]) asks of the running
//! agent's deploy slot ([`super::slot`]): start a job, read the latest.
//! Never on the HTTP local API; the commands' side is [`super::client`].
//!
//! - `{"op":"deploy","sha","shed"?,"deadline"?}` and
//!   `{"op":"rollback","shed"?,"deadline"?}`: 202 `{"id","pid"}` once the job
//!   runs in the agent; 409 `deploy_in_progress` while one runs; 404
//!   `deploy_not_configured` without a `[deploy]` table.
//! - `{"op":"job"}`: the latest job: `{"pid","id","kind","steps":[...],"waiting":{"step","note"}|null,"result":Outcome|null}`,
//!   404 `no_deploy` before the first.
//!
//! The job runs in a task of the agent, not of the request: a client that
//! goes away (the command killed) changes nothing about it.

use std::sync::Arc;

use serde_json::{json, Value};

use super::journal;
use super::recorder::Recorder;
use super::steps::{self, Request};
use crate::context::Agent;

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
        let rec = Recorder::new(a.deploy.clone());
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
        let outcome = steps::recover(a.clone(), cfg, j, Recorder::new(a.deploy.clone())).await;
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
        Some(d) => Some(crate::duration::parse(d).map_err(|e| e.0)?),
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
