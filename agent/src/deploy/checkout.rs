//! Getting a release onto disk (steps 1–2): fetch exactly one commit from
//! `deploy.remote` into a fresh repository, check it out detached, check it
//! is clean, run the build, check it is still clean and that every artifact
//! exists, and only then move it to `releases_dir/<sha>`. Any refusal
//! removes what was made, so a refused deploy changes nothing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::Command;

use super::{releases, Failure};
use crate::config::DeployConfig;
use crate::git::{git_with, inspect};

/// Longest part of a build's stderr quoted in a failure.
const MAX_QUOTE: usize = 200;

/// Runs `sh -c script` in `dir` within `timeout`; Err with the exit status
/// and the tail of stderr.
pub async fn shell(script: &str, dir: &Path, timeout: Duration, sha: &str) -> Result<(), String> {
    let mut cmd = Command::new("sh");
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
    git_with(&incoming, &["init", "-q"], t)
        .await
        .map_err(step)?;
    git_with(
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
    let got = git_with(
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

/// Steps 1–2: fetch, detached checkout, clean, build, clean, artifacts,
/// then the move into `releases_dir/<sha>`, each recorded as a step.
pub async fn prepare(
    cfg: &DeployConfig,
    sha: &str,
    record: &mut super::steps::Recorder,
) -> Result<(), Failure> {
    std::fs::create_dir_all(&cfg.releases_dir)
        .map_err(|e| Failure::new("fetch", format!("releases_dir: {e}")))?;
    let started = record.start();
    let (work, guard) = fetch(cfg, sha).await?;
    record.done("fetch", started, format!("{sha} from the remote"));
    let started = record.start();
    git_with(
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
        shell(build, &work, cfg.build_timeout, sha)
            .await
            .map_err(|e| Failure::new("build", format!("build {e}")))?;
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
