//! The sequences: [`deploy`], [`rollback`] and [`recover`] (an agent that
//! starts with an unfinished journal). All three end in `go_live` or
//! `restore`, so the node only becomes active again on a release that
//! passed health, connector and L5 just now.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;

use super::build_user::{self, Runner};
use super::journal::{self, Journal};
use super::{checkout, is_full_sha, releases, verify, Failure, Outcome, StepRecord};
use crate::config::DeployConfig;
use crate::context::Agent;
use crate::mode::{self, NodeMode};

/// What the operator asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The release (deploy only).
    pub sha: Option<String>,
    /// Hang up calls still up at the drain deadline.
    pub shed: bool,
    /// The drain deadline (default `deploy.drain_deadline`).
    pub deadline: Option<Duration>,
}

/// Records each step with its duration, publishes it to the job slot and
/// logs it.
pub struct Recorder {
    agent: Arc<Agent>,
    steps: Vec<StepRecord>,
}

impl Recorder {
    /// A recorder publishing to `agent`'s job slot.
    pub fn new(agent: Arc<Agent>) -> Recorder {
        Recorder {
            agent,
            steps: Vec::new(),
        }
    }

    /// Marks the start of a step.
    pub fn start(&self) -> Instant {
        Instant::now()
    }

    fn push(&mut self, step: &str, ok: bool, started: Instant, detail: String) {
        let record = StepRecord {
            step: step.to_string(),
            ok,
            ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            detail,
        };
        crate::log::info(
            "deploy_step",
            json!({"step": record.step, "ok": ok, "ms": record.ms, "detail": record.detail}),
        );
        self.agent.deploy.push(record.clone());
        self.steps.push(record);
    }

    /// A step that succeeded.
    pub fn done(&mut self, step: &str, started: Instant, detail: String) {
        self.push(step, true, started, detail);
    }

    /// A step that failed.
    fn failed(&mut self, started: Instant, f: &Failure) {
        self.push(f.step, false, started, f.reason.clone());
    }
}

fn now_text() -> String {
    callfence_core::time::format_ms(crate::clock::now_ms())
}

/// Builds the outcome.
fn outcome(
    agent: &Agent,
    kind: &str,
    from: Option<String>,
    to: Option<String>,
    failure: Option<(Failure, bool)>,
    rec: Recorder,
) -> Outcome {
    let live = agent
        .config
        .deploy
        .as_ref()
        .and_then(|c| releases::current(c).ok().flatten());
    let (step, reason, restored) = match failure {
        None => (None, None, false),
        Some((f, restored)) => (Some(f.step.to_string()), Some(f.reason), restored),
    };
    Outcome {
        ok: step.is_none(),
        kind: kind.to_string(),
        from,
        to,
        live,
        step,
        reason,
        restored,
        mode: mode::read(&agent.config.state_dir).mode.to_string(),
        steps: rec.steps,
    }
}

/// `deploy --sha`: steps 1–9.
pub async fn deploy(
    agent: Arc<Agent>,
    cfg: DeployConfig,
    req: Request,
    mut rec: Recorder,
) -> Outcome {
    let sha = req.sha.clone().unwrap_or_default();
    let started = rec.start();
    let from = match validate(&agent, &cfg, &sha) {
        Ok(from) => from,
        Err(f) => {
            rec.failed(started, &f);
            return outcome(&agent, "deploy", None, Some(sha), Some((f, false)), rec);
        }
    };
    rec.done(
        "validate",
        started,
        format!("{sha} (current {})", from.as_deref().unwrap_or("none")),
    );
    let runner = match build_account(&agent, &cfg, &mut rec).await {
        Ok(r) => r,
        Err(f) => return outcome(&agent, "deploy", from, Some(sha), Some((f, false)), rec),
    };
    let started = rec.start();
    match allowed(&agent, &sha).await {
        Ok(detail) => rec.done("allowed_shas", started, detail),
        Err(f) => {
            rec.failed(started, &f);
            return outcome(&agent, "deploy", from, Some(sha), Some((f, false)), rec);
        }
    }
    let started = rec.start();
    if let Err(f) = checkout::prepare(&cfg, &runner, &sha, &mut rec).await {
        rec.failed(started, &f);
        return outcome(&agent, "deploy", from, Some(sha), Some((f, false)), rec);
    }
    go_live(agent, cfg, "deploy", from, sha, req, rec).await
}

/// `rollback`: back to the newest verified release other than the current.
pub async fn rollback(
    agent: Arc<Agent>,
    cfg: DeployConfig,
    req: Request,
    mut rec: Recorder,
) -> Outcome {
    let started = rec.start();
    let from = releases::current(&cfg);
    let target = releases::history(&agent.config.state_dir)
        .into_iter()
        .find(|r| {
            releases::trusted(&r.result)
                && from.as_ref().ok().and_then(|f| f.as_deref()) != Some(r.sha.as_str())
                && releases::dir(&cfg, &r.sha).is_dir()
        })
        .map(|r| r.sha);
    let failure = match (&from, &target) {
        (Err(e), _) => Some(Failure::new("validate", e.0.clone())),
        (_, None) => Some(Failure::new(
            "validate",
            "no earlier verified release is kept",
        )),
        _ => journal_busy(&agent),
    };
    let from = from.ok().flatten();
    if let Some(f) = failure {
        rec.failed(started, &f);
        return outcome(&agent, "rollback", from, target, Some((f, false)), rec);
    }
    let to = target.unwrap_or_default();
    rec.done("validate", started, format!("back to {to}"));
    if let Err(f) = build_account(&agent, &cfg, &mut rec).await {
        return outcome(&agent, "rollback", from, Some(to), Some((f, false)), rec);
    }
    go_live(agent, cfg, "rollback", from, to, req, rec).await
}

/// The `build_user` step, before anything is fetched or switched: who
/// runs `build` and `restart`, refused when that account can read the keys.
async fn build_account(
    agent: &Agent,
    cfg: &DeployConfig,
    rec: &mut Recorder,
) -> Result<Runner, Failure> {
    let started = rec.start();
    match build_user::resolve(&agent.config, cfg).await {
        Ok(runner) => {
            build_user::warn_if_opted_out(cfg);
            let detail = match (&runner, cfg.build_can_read_keys) {
                (Runner::Agent, _) => {
                    "the agent's own user (build_can_read_keys: development only)".to_string()
                }
                (Runner::As { account, .. }, true) => format!(
                    "{} (uid {}); build_can_read_keys: development only",
                    account.name, account.ids.uid
                ),
                (Runner::As { account, .. }, false) => format!(
                    "{} (uid {}) cannot open the agent's keys",
                    account.name, account.ids.uid
                ),
            };
            rec.done("build_user", started, detail);
            Ok(runner)
        }
        Err(e) => {
            let f = Failure::new("build_user", e);
            rec.failed(started, &f);
            Err(f)
        }
    }
}

fn journal_busy(agent: &Agent) -> Option<Failure> {
    match journal::read(&agent.config.state_dir) {
        Ok(None) => None,
        Ok(Some(_)) => Some(Failure::new(
            "validate",
            "an unfinished deploy is in the journal",
        )),
        Err(e) => Some(Failure::new("validate", e.0)),
    }
}

fn validate(agent: &Agent, cfg: &DeployConfig, sha: &str) -> Result<Option<String>, Failure> {
    if !is_full_sha(sha) {
        return Err(Failure::new(
            "validate",
            "a release is a full commit: 40 lowercase hex digits (no branch, tag or short SHA)",
        ));
    }
    let from = releases::current(cfg).map_err(|e| Failure::new("validate", e.0))?;
    if from.as_deref() == Some(sha) {
        return Err(Failure::new("validate", format!("{sha} is already live")));
    }
    if let Some(f) = journal_busy(agent) {
        return Err(f);
    }
    Ok(from)
}

/// Step 1's promotion check: a fresh beat tells this node's registry entry's
/// `allowed_shas`; fail closed when the edge does not say.
async fn allowed(agent: &Agent, sha: &str) -> Result<String, Failure> {
    let rec =
        crate::heartbeat::beat_once(&agent.config, &agent.http, &agent.keys, &agent.edge).await;
    agent.set_last_beat(rec.clone());
    let fail = |why: String| Failure::new("allowed_shas", why);
    if rec.outcome != "accepted" {
        return Err(fail(format!(
            "cannot read the registry's allowed_shas: the beat was {} ({})",
            rec.outcome,
            rec.refused.unwrap_or_default()
        )));
    }
    match rec.allowed_shas {
        None => Err(fail("the edge did not report allowed_shas".into())),
        Some(Value::Null) => Ok("the registry lists no allowed_shas for this node".into()),
        Some(Value::Array(list)) if list.iter().any(|v| v.as_str() == Some(sha)) => {
            Ok(format!("{sha} is in allowed_shas"))
        }
        Some(Value::Array(_)) => Err(fail(format!(
            "{sha} is not in this node's allowed_shas: promote it in the registry first"
        ))),
        Some(_) => Err(fail("the edge reported a malformed allowed_shas".into())),
    }
}

/// Steps 3–9, restoring on any failure from the switch on.
async fn go_live(
    agent: Arc<Agent>,
    cfg: DeployConfig,
    kind: &str,
    from: Option<String>,
    to: String,
    req: Request,
    mut rec: Recorder,
) -> Outcome {
    let state = agent.config.state_dir.clone();
    let prior = mode::read(&state).mode;
    let mut j = Journal {
        kind: kind.to_string(),
        from: from.clone(),
        to: to.clone(),
        prior_mode: prior.to_string(),
        step: "drain".into(),
        started_at: now_text(),
    };
    let started = rec.start();
    let adopted = match &from {
        Some(f) => releases::adopt(&state, f),
        None => Ok(()),
    };
    if let Err(e) = adopted.and_then(|_| journal::write(&state, &j)) {
        let f = Failure::new("journal", e.0);
        rec.failed(started, &f);
        return outcome(&agent, kind, from, Some(to), Some((f, false)), rec);
    }
    rec.done(
        "journal",
        started,
        format!(
            "{} -> {to}, mode was {prior}",
            from.as_deref().unwrap_or("none")
        ),
    );

    let started = rec.start();
    let deadline = req.deadline.unwrap_or(cfg.drain_deadline);
    let drained = match crate::drain::drain(&agent.config, deadline, req.shed).await {
        Ok(r) if r.drained => Ok("no call left".to_string()),
        Ok(r) if req.shed && r.shed.iter().all(|s| s.result.starts_with('2')) => {
            Ok(format!("{} call(s) shed at the deadline", r.shed.len()))
        }
        Ok(r) => Err(format!(
            "{} call(s) still up after {} s (use --shed to hang them up)",
            r.remaining.len().max(r.active_calls.unwrap_or(0) as usize),
            deadline.as_secs()
        )),
        Err(e) => Err(e.0),
    };
    match drained {
        Ok(d) => rec.done("drain", started, d),
        Err(reason) => {
            let f = Failure::new("drain", reason);
            rec.failed(started, &f);
            let started = rec.start();
            let restored = put_mode_back(&state, prior).is_ok() && journal::clear(&state).is_ok();
            rec.done(
                "restore_mode",
                started,
                format!("mode {prior}, release unchanged"),
            );
            return outcome(&agent, kind, from, Some(to), Some((f, restored)), rec);
        }
    }

    let result = switch_and_verify(&agent, &cfg, &mut j, &mut rec).await;
    match result {
        Ok(()) => {
            let started = rec.start();
            let settled = put_mode_back(&state, prior)
                .and_then(|_| journal::clear(&state))
                .and_then(|_| releases::record(&state, &to, "verified", &now_text()));
            match settled {
                Ok(()) => rec.done("mode", started, format!("mode {prior}")),
                Err(e) => rec.failed(started, &Failure::new("mode", e.0)),
            }
            let started = rec.start();
            match releases::prune(&cfg, &state) {
                Ok(gone) => rec.done(
                    "prune",
                    started,
                    format!("{} old release(s) removed", gone.len()),
                ),
                Err(e) => rec.failed(started, &Failure::new("prune", e.0)),
            }
            outcome(&agent, kind, from, Some(to), None, rec)
        }
        Err(f) => {
            let _ = releases::record(&state, &to, "failed", &now_text());
            let restored = restore(&agent, &cfg, &j, true, &mut rec).await.is_ok();
            outcome(&agent, kind, from, Some(to), Some((f, restored)), rec)
        }
    }
}

fn put_mode_back(state: &std::path::Path, prior: NodeMode) -> Result<(), crate::AgentError> {
    mode::write(state, prior)
}

/// Steps 5–8 for `j.to`.
async fn switch_and_verify(
    agent: &Agent,
    cfg: &DeployConfig,
    j: &mut Journal,
    rec: &mut Recorder,
) -> Result<(), Failure> {
    let state = &agent.config.state_dir;
    let started = rec.start();
    j.step = "switch".into();
    let switched = journal::write(state, j)
        .and_then(|_| releases::record(state, &j.to, "in_progress", &now_text()))
        .and_then(|_| releases::switch(cfg, &j.to));
    if let Err(e) = switched {
        let f = Failure::new("switch", e.0);
        rec.failed(started, &f);
        return Err(f);
    }
    rec.done(
        "switch",
        started,
        format!("current -> {}", releases::dir(cfg, &j.to).display()),
    );
    check(agent, cfg, &j.to, rec, "").await
}

/// Restart, health, connector and L5 for `sha`; step names get `prefix`.
async fn check(
    agent: &Agent,
    cfg: &DeployConfig,
    sha: &str,
    rec: &mut Recorder,
    prefix: &str,
) -> Result<(), Failure> {
    let name = |s: &'static str| -> &'static str {
        if prefix.is_empty() {
            s
        } else {
            match s {
                "restart" => "restore_restart",
                "health" => "restore_health",
                "connector" => "restore_connector",
                _ => "restore_l5",
            }
        }
    };
    let started = rec.start();
    let dir = releases::dir(cfg, sha);
    let restarted = match build_user::resolve(&agent.config, cfg).await {
        Ok(runner) => checkout::shell(&runner, &cfg.restart, &dir, cfg.health_timeout, sha)
            .await
            .map_err(|e| format!("the restart command {e}")),
        Err(e) => Err(format!("not restarted: {e}")),
    };
    if let Err(reason) = restarted {
        let f = Failure::new(name("restart"), reason);
        rec.failed(started, &f);
        return Err(f);
    }
    rec.done(name("restart"), started, cfg.restart.clone());
    let checks: [(&'static str, _); 3] = [("health", 0), ("connector", 1), ("l5", 2)];
    for (step, which) in checks {
        let started = rec.start();
        let result = match which {
            0 => verify::health(agent, sha, cfg.health_timeout).await,
            1 => verify::connector(agent, cfg.health_timeout).await,
            _ => verify::l5(agent, sha, cfg.health_timeout).await,
        };
        match result {
            Ok(detail) => rec.done(name(step), started, detail),
            Err(reason) => {
                let f = Failure::new(name(step), reason);
                rec.failed(started, &f);
                return Err(f);
            }
        }
    }
    Ok(())
}

/// Puts `j.from` back (switch when `current` is elsewhere, restart when it
/// was switched), checks it like a new release, restores the mode and
/// clears the journal. When it cannot, the node stays `drained`.
async fn restore(
    agent: &Agent,
    cfg: &DeployConfig,
    j: &Journal,
    switched: bool,
    rec: &mut Recorder,
) -> Result<(), Failure> {
    let state = &agent.config.state_dir;
    let started = rec.start();
    let Some(from) = j.from.clone() else {
        let f = Failure::new(
            "restore_switch",
            "no previous release to restore: the node stays drained",
        );
        rec.failed(started, &f);
        let _ = journal::clear(state);
        return Err(f);
    };
    let current = releases::current(cfg).ok().flatten();
    let must_restart = switched || current.as_deref() != Some(from.as_str());
    if current.as_deref() != Some(from.as_str()) {
        if let Err(e) = releases::switch(cfg, &from) {
            let f = Failure::new("restore_switch", e.0);
            rec.failed(started, &f);
            return Err(f);
        }
    }
    rec.done("restore_switch", started, format!("current -> {from}"));
    let checked = if must_restart {
        check(agent, cfg, &from, rec, "restore_").await
    } else {
        verify_only(agent, cfg, &from, rec).await
    };
    let started = rec.start();
    if let Err(f) = checked {
        let _ = journal::clear(state);
        rec.done(
            "restore_mode",
            started,
            "mode drained: the restored release did not verify".into(),
        );
        return Err(f);
    }
    let prior: NodeMode = j.prior_mode.parse().unwrap_or(NodeMode::Drained);
    let settled = put_mode_back(state, prior)
        .and_then(|_| journal::clear(state))
        .and_then(|_| releases::record(state, &from, "verified", &now_text()));
    match settled {
        Ok(()) => {
            rec.done("restore_mode", started, format!("mode {prior}"));
            Ok(())
        }
        Err(e) => {
            let f = Failure::new("restore_mode", e.0);
            rec.failed(started, &f);
            Err(f)
        }
    }
}

/// Health, connector and L5 without a restart (a crash before the switch:
/// the app kept running the old release, and its calls must not be cut).
async fn verify_only(
    agent: &Agent,
    cfg: &DeployConfig,
    sha: &str,
    rec: &mut Recorder,
) -> Result<(), Failure> {
    let started = rec.start();
    if verify::health(agent, sha, cfg.health_timeout)
        .await
        .is_err()
    {
        // The app is down anyway: restarting it cuts nothing.
        rec.done("restore_health", started, "not healthy: restarting".into());
        return check(agent, cfg, sha, rec, "restore_").await;
    }
    rec.done("restore_health", started, format!("{sha} healthy"));
    let started = rec.start();
    match verify::connector(agent, cfg.health_timeout).await {
        Ok(d) => rec.done("restore_connector", started, d),
        Err(e) => {
            let f = Failure::new("restore_connector", e);
            rec.failed(started, &f);
            return Err(f);
        }
    }
    let started = rec.start();
    match verify::l5(agent, sha, cfg.health_timeout).await {
        Ok(d) => {
            rec.done("restore_l5", started, d);
            Ok(())
        }
        Err(e) => {
            let f = Failure::new("restore_l5", e);
            rec.failed(started, &f);
            Err(f)
        }
    }
}

/// An agent that starts with an unfinished journal: finish the restore.
pub async fn recover(
    agent: Arc<Agent>,
    cfg: DeployConfig,
    j: Journal,
    mut rec: Recorder,
) -> Outcome {
    let started = rec.start();
    // Whatever the mode file says, the node takes nothing new meanwhile.
    let _ = mode::write(&agent.config.state_dir, NodeMode::Drained);
    rec.done(
        "recover",
        started,
        format!(
            "unfinished {} {} -> {} (at {})",
            j.kind,
            j.from.as_deref().unwrap_or("none"),
            j.to,
            j.step
        ),
    );
    let switched = j.step != "drain";
    let failure = restore(&agent, &cfg, &j, switched, &mut rec)
        .await
        .err()
        .map(|f| (f, false));
    let failure = failure.or_else(|| {
        Some((
            Failure::new(
                "recover",
                format!(
                    "the {} to {} was interrupted; the previous release is restored",
                    j.kind, j.to
                ),
            ),
            true,
        ))
    });
    if j.step != "drain" {
        let _ = releases::record(&agent.config.state_dir, &j.to, "failed", &now_text());
    }
    outcome(
        &agent,
        "recover",
        j.from.clone(),
        Some(j.to.clone()),
        failure,
        rec,
    )
}
