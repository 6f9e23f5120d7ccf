//! The sequences: [`deploy`], [`rollback`] and [`recover`] (an agent that
//! starts with an unfinished journal). All three end in `go_live` or
//! `restore`, so the node only becomes active again on a release that
//! passed health, connector and L5 just now.
//!
//! This module does the I/O and the ordering; what each step's result
//! means is decided in [`super::verdict`].

use std::sync::Arc;
use std::time::Duration;

use super::build_user::{self, Runner};
use super::journal::{self, Journal};
use super::recorder::Recorder;
use super::{checkout, releases, report, verdict, verify, Failure, Outcome};
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
    let switched = rec.steps().iter().any(|s| s.step == "switch" && s.ok);
    outcome_switched(agent, kind, from, to, failure, switched, rec)
}

/// [`outcome`] when whether `current` was switched is known otherwise (a
/// recovery: from the journal).
fn outcome_switched(
    agent: &Agent,
    kind: &str,
    from: Option<String>,
    to: Option<String>,
    failure: Option<(Failure, bool)>,
    switched: bool,
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
        switched,
        mode: mode::read(&agent.config.state_dir).mode.to_string(),
        steps: rec.into_steps(),
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
    let live = releases::current(&cfg);
    let from = live.as_ref().ok().cloned().flatten();
    let history = releases::history(&agent.config.state_dir);
    let target = verdict::rollback_target(&history, from.as_deref(), |sha| {
        releases::dir(&cfg, sha).is_dir()
    });
    let checked = live
        .map_err(|e| Failure::new("validate", e.0))
        .and_then(|_| target.clone())
        .and_then(|to| verdict::journal_free(journal::read(&agent.config.state_dir)).map(|_| to));
    let to = match checked {
        Ok(to) => to,
        Err(f) => {
            rec.failed(started, &f);
            return outcome(&agent, "rollback", from, target.ok(), Some((f, false)), rec);
        }
    };
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

fn validate(agent: &Agent, cfg: &DeployConfig, sha: &str) -> Result<Option<String>, Failure> {
    verdict::target(sha, None)?;
    let from = releases::current(cfg).map_err(|e| Failure::new("validate", e.0))?;
    verdict::target(sha, from.as_deref())?;
    verdict::journal_free(journal::read(&agent.config.state_dir))?;
    Ok(from)
}

/// Step 1's promotion check: a fresh beat tells this node's registry entry's
/// `allowed_shas`; fail closed when the edge does not say.
async fn allowed(agent: &Agent, sha: &str) -> Result<String, Failure> {
    let rec =
        crate::heartbeat::beat_once(&agent.config, &agent.http, &agent.keys, &agent.edge).await;
    agent.set_last_beat(rec.clone());
    verdict::allowed(
        &rec.outcome,
        rec.refused.as_deref(),
        rec.allowed_shas.as_ref(),
        sha,
    )
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
    let slot = rec.slot();
    let progress = move |calls: Option<u32>, left: Duration| {
        slot.wait("drain", report::drain_note(calls, left));
    };
    let report = crate::drain::drain(&agent.config, deadline, req.shed, progress).await;
    let drained = verdict::drained(report, req.shed, deadline);
    match drained {
        Ok(d) => rec.done("drain", started, d),
        Err(reason) => {
            let f = Failure::new("drain", reason);
            rec.failed(started, &f);
            // Nothing was switched: the release that ran all along stays,
            // with its mode; nothing needed restoring.
            let started = rec.start();
            match put_mode_back(&state, prior).and_then(|_| journal::clear(&state)) {
                Ok(()) => rec.done(
                    "restore_mode",
                    started,
                    format!("mode {prior}, release unchanged"),
                ),
                Err(e) => rec.failed(started, &Failure::new("restore_mode", e.0)),
            }
            return outcome(&agent, kind, from, Some(to), Some((f, false)), rec);
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
    let name = |check: &'static str| verdict::check_name(check, !prefix.is_empty());
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
            _ => {
                let slot = rec.slot();
                let waiting = |d| slot.wait(name(step), report::probe_limit_note(d));
                verify::l5(agent, sha, cfg.health_timeout, waiting).await
            }
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
    let plan = verdict::restore_plan(&from, current.as_deref(), switched);
    if plan.switch_back {
        if let Err(e) = releases::switch(cfg, &from) {
            let f = Failure::new("restore_switch", e.0);
            rec.failed(started, &f);
            return Err(f);
        }
    }
    rec.done("restore_switch", started, format!("current -> {from}"));
    let checked = if plan.restart {
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
    let slot = rec.slot();
    let waiting = |d| slot.wait("restore_l5", report::probe_limit_note(d));
    match verify::l5(agent, sha, cfg.health_timeout, waiting).await {
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
    let switched = verdict::journal_switched(&j);
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
    if switched {
        let _ = releases::record(&agent.config.state_dir, &j.to, "failed", &now_text());
    }
    outcome_switched(
        &agent,
        "recover",
        j.from.clone(),
        Some(j.to.clone()),
        failure,
        switched,
        rec,
    )
}
