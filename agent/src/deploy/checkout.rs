//! Getting a release onto disk (steps 1–2): fetch exactly one commit from
//! `deploy.remote` into a fresh repository, refuse it unless it is
//! reachable from the remote's protected `deploy.branch`, check it out
//! detached, check it is clean, run the build (as the build user), check it
//! is still clean and that every artifact exists, and only then move it to
//! `releases_dir/<sha>`. Any refusal removes what was made, so a refused
//! deploy changes nothing.
//!
//! # Why the branch check
//!
//! A code host serves any commit it holds by its full SHA from the
//! upstream URL: a pull request's head (`refs/pull/N/head`) and commits of
//! the whole fork network included. So "the remote has this SHA" says
//! nothing about who wrote it. The tip of `refs/heads/<branch>` is fetched
//! explicitly (into the private ref `refs/callfence/protected`) and the commit must
//! be its ancestor (`git merge-base --is-ancestor`), before anything is
//! checked out or built.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::build_user::Runner;
use super::{releases, Failure};
use crate::config::DeployConfig;
use crate::git::{self, inspect};

/// Where the protected branch's tip is fetched to, in the new repository.
const PROTECTED_REF: &str = "refs/callfence/protected";

/// Longest part of a build's stderr quoted in a failure.
const MAX_QUOTE: usize = 200;

/// Runs `sh -c script` in `dir` within `timeout`, as `runner`'s user; Err
/// with the exit status and the tail of stderr.
pub async fn shell(
    runner: &Runner,
    script: &str,
    dir: &Path,
    timeout: Duration,
    sha: &str,
) -> Result<(), String> {
    let mut cmd = runner.command("sh");
    cmd.arg("-c")
        .arg(script)
        .current_dir(dir)
        .env("CALLFENCE_RELEASE_SHA", sha)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(timeout, cmd.output())
        .await
        .map_err(|_| format!("did not finish within {} s", timeout.as_secs()))?
        .map_err(|e| format!("cannot run sh: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let tail: String = err
        .trim()
        .chars()
        .rev()
        .take(MAX_QUOTE)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    Err(format!("exited with {}: {tail}", out.status))
}

/// Removes a directory on drop unless disarmed: a refused release leaves
/// nothing behind.
struct Scratch(Option<PathBuf>);

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Fetches `sha` into a new repository under `releases_dir` (step 1).
/// Returns the scratch checkout, not yet checked out.
async fn fetch(cfg: &DeployConfig, sha: &str) -> Result<(PathBuf, Scratch), Failure> {
    let incoming = cfg.releases_dir.join(format!(".incoming-{sha}"));
    let _ = std::fs::remove_dir_all(&incoming);
    std::fs::create_dir_all(&incoming).map_err(|e| {
        Failure::new(
            "fetch",
            format!("cannot create {}: {e}", incoming.display()),
        )
    })?;
    let guard = Scratch(Some(incoming.clone()));
    let t = cfg.build_timeout;
    let step = |e: String| Failure::new("fetch", e);
    git::run(&incoming, &["init", "-q"], t)
        .await
        .map_err(step)?;
    git::run(
        &incoming,
        &["fetch", "-q", "--no-tags", "--", &cfg.remote, sha],
        t,
    )
    .await
    .map_err(|e| {
        Failure::new(
            "fetch",
            format!("commit {sha} not fetched from the remote: {e}"),
        )
    })?;
    let got = git::run(
        &incoming,
        &["rev-parse", "--verify", "FETCH_HEAD^{commit}"],
        t,
    )
    .await
    .map_err(step)?;
    if got.trim() != sha {
        return Err(Failure::new(
            "fetch",
            format!("the remote gave {} for {sha}", got.trim()),
        ));
    }
    Ok((incoming, guard))
}

/// Refuses `sha` unless the remote's protected branch reaches it.
async fn on_branch(cfg: &DeployConfig, repo: &Path, sha: &str) -> Result<(), Failure> {
    let t = cfg.build_timeout;
    let branch = &cfg.branch;
    let refspec = format!("+refs/heads/{branch}:{PROTECTED_REF}");
    git::run(
        repo,
        &["fetch", "-q", "--no-tags", "--", &cfg.remote, &refspec],
        t,
    )
    .await
    .map_err(|e| {
        Failure::new(
            "branch",
            format!("cannot fetch the protected branch {branch} from the remote: {e}"),
        )
    })?;
    let reached = git::ask(
        repo,
        &["merge-base", "--is-ancestor", sha, PROTECTED_REF],
        t,
    )
    .await
    .map_err(|e| Failure::new("branch", e))?;
    if !reached {
        return Err(Failure::new(
            "branch",
            format!(
                "{sha} is not on the protected branch {branch} of the remote: only commits reachable from {branch} are deployed (a pull request's head or a fork's commit never is)"
            ),
        ));
    }
    Ok(())
}

/// Steps 1–2: fetch, the protected branch, detached checkout, clean,
/// build, clean, artifacts, then the move into `releases_dir/<sha>`, each
/// recorded as a step.
pub async fn prepare(
    cfg: &DeployConfig,
    runner: &Runner,
    sha: &str,
    record: &mut super::recorder::Recorder,
) -> Result<(), Failure> {
    std::fs::create_dir_all(&cfg.releases_dir)
        .map_err(|e| Failure::new("fetch", format!("releases_dir: {e}")))?;
    let started = record.start();
    let (work, guard) = fetch(cfg, sha).await?;
    record.done("fetch", started, format!("{sha} from the remote"));
    let started = record.start();
    on_branch(cfg, &work, sha).await?;
    record.done(
        "branch",
        started,
        format!("reachable from {} of the remote", cfg.branch),
    );
    let started = record.start();
    git::run(
        &work,
        &["checkout", "-q", "--detach", sha],
        cfg.build_timeout,
    )
    .await
    .map_err(|e| Failure::new("checkout", e))?;
    clean(&work, sha, "checkout").await?;
    record.done("checkout", started, "detached, clean".to_string());
    let started = record.start();
    if let Some(build) = &cfg.build {
        let lent = runner
            .lend(&work)
            .map_err(|e| Failure::new("build", format!("cannot lend the checkout: {e}")))?;
        let built = shell(runner, build, &work, cfg.build_timeout, sha).await;
        if let Some(lent) = lent {
            lent.take_back(&work)
                .map_err(|e| Failure::new("build", format!("after the build: {e}")))?;
        }
        built.map_err(|e| Failure::new("build", format!("build {e}")))?;
    }
    clean(&work, sha, "build").await?;
    let missing: Vec<&str> = cfg
        .artifacts
        .iter()
        .filter(|a| !work.join(a).exists())
        .map(String::as_str)
        .collect();
    if !missing.is_empty() {
        return Err(Failure::new(
            "build",
            format!("missing artifacts: {}", missing.join(", ")),
        ));
    }
    let target = releases::dir(cfg, sha);
    let _ = std::fs::remove_dir_all(&target);
    std::fs::rename(&work, &target)
        .map_err(|e| Failure::new("build", format!("cannot move the release into place: {e}")))?;
    drop(guard);
    record.done(
        "build",
        started,
        format!(
            "{}clean, {} artifact(s) present",
            if cfg.build.is_some() {
                "built, "
            } else {
                "no build, "
            },
            cfg.artifacts.len()
        ),
    );
    Ok(())
}

/// The checkout at `dir` must be `sha` and clean (untracked files count).
async fn clean(dir: &Path, sha: &str, step: &'static str) -> Result<(), Failure> {
    let c = inspect(dir).await;
    if let Some(e) = c.error {
        return Err(Failure::new(step, e));
    }
    if c.sha != sha {
        return Err(Failure::new(
            step,
            format!("checkout is at {}, not {sha}", c.sha),
        ));
    }
    if c.dirty {
        return Err(Failure::new(
            step,
            format!("the checkout is dirty after {step}: the build must only write ignored files"),
        ));
    }
    Ok(())
}
