//! The commands' side of a deploy: `deploy`, `rollback` and `job` ask the
//! running agent over its control socket ([`crate::control`]) and print
//! what it does, as [`super::report`] words it.
//!
//! The client asks for the job every 200 ms: each step's line is printed
//! as soon as the agent has recorded it, and a wait in progress every
//! [`super::report::PROGRESS_EVERY`]. With `--json`, only the final
//! [`super::Outcome`] is printed, as one line (the last line of stdout).

use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;

use super::report::{self, Printer};
use super::slot::JobView;
use crate::AgentError;

/// How often the client asks the agent for the job.
const POLL: Duration = Duration::from_millis(200);

/// How long the client waits for an agent that stopped answering.
const CLIENT_PATIENCE: Duration = Duration::from_secs(5);

/// The `job` command: the running agent's latest job, as JSON.
pub async fn show(state_dir: &Path) -> Result<Value, AgentError> {
    match crate::control::ask(state_dir, &json!({"op": "job"})).await? {
        (200, view) => Ok(view),
        (status, body) => Err(AgentError::new(format!(
            "the agent answered {status} {}",
            body.get("error").and_then(Value::as_str).unwrap_or("?")
        ))),
    }
}

fn print(lines: &[String]) {
    let mut out = std::io::stdout().lock();
    for line in lines {
        let _ = writeln!(out, "{line}");
    }
    let _ = out.flush();
}

/// The `deploy` and `rollback` commands: ask the running agent over the
/// control socket of `state_dir` (`request` carries the `op`), print each
/// step as it ends (or, with `json_out`, only the final outcome), and exit
/// 0 only when the release is live and verified.
pub async fn run(state_dir: &Path, request: Value, json_out: bool) -> Result<ExitCode, AgentError> {
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
    let job = json!({"op": "job"});
    let began = Instant::now();
    let mut printer = Printer::default();
    let mut silent_since = Instant::now();
    loop {
        tokio::time::sleep(POLL).await;
        let asked = crate::control::ask(state_dir, &job);
        let view = match tokio::time::timeout(CLIENT_PATIENCE, asked).await {
            Ok(Ok((200, v))) => serde_json::from_value::<JobView>(v).ok(),
            _ => None,
        };
        let Some(view) = view else {
            if silent_since.elapsed() > CLIENT_PATIENCE {
                return Err(lost());
            }
            continue;
        };
        silent_since = Instant::now();
        if view.id != id || u64::from(view.pid) != pid {
            return Err(lost());
        }
        if !json_out {
            print(&printer.lines(&view, began.elapsed()));
        }
        if let Some(out) = view.result {
            print(&[if json_out {
                serde_json::to_string(&out).unwrap_or_default()
            } else {
                report::final_line(&out)
            }]);
            return Ok(if out.ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            });
        }
    }
}
