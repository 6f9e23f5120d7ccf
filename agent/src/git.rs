//! The runtime checkout's identity: `sha` from `git rev-parse HEAD` and
//! `dirty` from `git status --porcelain --untracked-files=all` (any line,
//! untracked files included, means dirty). When git fails the checkout is
//! reported with an empty SHA and dirty, which the edge reads as ineligible.
//!
//! The configured directory must be the top level of its work tree: a
//! directory that merely sits inside some other checkout would otherwise
//! report that enclosing repository's SHA and cleanliness, which says
//! nothing about the code the node runs.
//!
//! # Git runs no configured program (SPEC §11)
//!
//! Every git command the agent runs, here and in the deploy, goes through
//! `run`, which keeps a repository's configuration from running anything
//! as the agent:
//! - the checkout and its `.git` must be owned by the agent's own user
//!   ([`owned_by_agent`]), and git's own ownership check stays on (no
//!   `safe.directory` override, CVE-2022-24765); otherwise the checkout is
//!   reported dirty with the reason, and git is not run at all;
//! - no system or global configuration (`GIT_CONFIG_NOSYSTEM`,
//!   `GIT_CONFIG_GLOBAL=/dev/null`) and a cleared environment (only `PATH`,
//!   `HOME` and `SSH_AUTH_SOCK` are kept, so no `GIT_DIR` or `GIT_*` setting
//!   of the agent's environment reaches git);
//! - the repository's own configuration is overridden wherever it names a
//!   program: `core.fsmonitor=false`, `core.hooksPath=/dev/null`, no
//!   `credential.helper`, the `ext::` transport off, and every
//!   `filter.<driver>.clean`, `.smudge` and `.process` the repository
//!   configures is emptied (a `.gitattributes` in the tree may name any
//!   driver, and `status` would run its `clean` command);
//! - `status` does not recurse into submodules (each submodule has a
//!   configuration of its own); a deployed release has none checked out.
//!
//! The overrides travel as `GIT_CONFIG_COUNT`/`GIT_CONFIG_KEY_n`/
//! `GIT_CONFIG_VALUE_n`, the command-line scope that wins over every file
//! and that git hands to the git processes it starts.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use tokio::process::Command;

use crate::identity;

/// What git says about the checkout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkout {
    /// `HEAD`'s SHA (empty when unknown).
    pub sha: String,
    /// Uncommitted or untracked changes (true when unknown).
    pub dirty: bool,
    /// Why git could not answer, if it could not.
    pub error: Option<String>,
}

/// Overrides for configuration that names a program, whatever the
/// repository says.
const SAFE_CONFIG: [(&str, &str); 5] = [
    ("core.fsmonitor", "false"),
    ("core.hooksPath", "/dev/null"),
    ("credential.helper", ""),
    ("protocol.ext.allow", "never"),
    ("submodule.recurse", "false"),
];

/// The filter driver settings that name a program.
const FILTER_PROGRAMS: &str = r"^filter\..*\.(clean|smudge|process)$";

/// Runs `git -C dir args...` within `timeout`; its stdout, or a short
/// reason (the first 200 characters of git's complaint).
pub(crate) async fn run(dir: &Path, args: &[&str], timeout: Duration) -> Result<String, String> {
    let config = overrides(dir, timeout).await?;
    run_with(dir, args, timeout, &config).await
}

/// [`run`] with the overrides already read.
async fn run_with(
    dir: &Path,
    args: &[&str],
    timeout: Duration,
    config: &[(String, String)],
) -> Result<String, String> {
    let out = spawn(dir, args, timeout, config).await?;
    if !out.status.success() {
        return Err(complaint(args, &out));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a git command that answers yes (exit 0) or no (exit 1), like
/// `merge-base --is-ancestor`; anything else is an error.
pub(crate) async fn ask(dir: &Path, args: &[&str], timeout: Duration) -> Result<bool, String> {
    let config = overrides(dir, timeout).await?;
    let out = spawn(dir, args, timeout, &config).await?;
    match out.status.code() {
        Some(0) => Ok(true),
        Some(1) => Ok(false),
        _ => Err(complaint(args, &out)),
    }
}

fn complaint(args: &[&str], out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    format!(
        "git {}: {}",
        args.first().copied().unwrap_or_default(),
        err.trim().chars().take(200).collect::<String>()
    )
}

/// [`SAFE_CONFIG`] plus an empty command for every filter driver the
/// repository at `dir` configures (reading configuration runs nothing).
async fn overrides(dir: &Path, timeout: Duration) -> Result<Vec<(String, String)>, String> {
    let mut list: Vec<(String, String)> = SAFE_CONFIG
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let args = [
        "config",
        "--includes",
        "--name-only",
        "--get-regexp",
        FILTER_PROGRAMS,
    ];
    let out = spawn(dir, &args, timeout, &list).await?;
    match out.status.code() {
        Some(0) => {
            for key in String::from_utf8_lossy(&out.stdout).lines() {
                list.push((key.to_string(), String::new()));
                if let Some(driver) = key.rsplit_once('.').map(|(d, _)| d) {
                    list.push((format!("{driver}.required"), "false".to_string()));
                }
            }
            Ok(list)
        }
        // No such key, or not a repository yet (`init`).
        Some(1) | Some(128) => Ok(list),
        _ => Err(complaint(&args, &out)),
    }
}

/// The one place git is started: cleared environment, no system or global
/// configuration, `config` as the command-line scope.
async fn spawn(
    dir: &Path,
    args: &[&str],
    timeout: Duration,
    config: &[(String, String)],
) -> Result<Output, String> {
    let mut cmd = Command::new("git");
    cmd.env_clear();
    for keep in ["PATH", "HOME", "SSH_AUTH_SOCK"] {
        if let Some(v) = std::env::var_os(keep) {
            cmd.env(keep, v);
        }
    }
    cmd.env("LC_ALL", "C")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_ATTR_NOSYSTEM", "1")
        .env("GIT_OPTIONAL_LOCKS", "0")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_PAGER", "cat")
        .env("GIT_CONFIG_COUNT", config.len().to_string());
    for (i, (k, v)) in config.iter().enumerate() {
        cmd.env(format!("GIT_CONFIG_KEY_{i}"), k)
            .env(format!("GIT_CONFIG_VALUE_{i}"), v);
    }
    cmd.arg("-C")
        .arg(dir)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    tokio::time::timeout(timeout, cmd.output())
        .await
        .map_err(|_| "git timed out".to_string())?
        .map_err(|e| format!("git: {e}"))
}

/// Refuses a checkout whose directory or `.git` is not a directory owned
/// by the agent's own user: its configuration could have been written by
/// someone else, and git would run what it names as the agent.
pub fn owned_by_agent(dir: &Path) -> Result<(), String> {
    let me = identity::own()?;
    let top = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let dot_git = dir.join(".git");
    let git = std::fs::symlink_metadata(&dot_git).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!(
            "{} is not the top level of a git checkout (it has no .git)",
            dir.display()
        ),
        _ => format!("{}: {e}", dot_git.display()),
    })?;
    if !git.is_dir() {
        return Err(format!(
            "{} is not a directory: the checkout must keep its own repository",
            dot_git.display()
        ));
    }
    for (path, meta) in [(dir, &top), (dot_git.as_path(), &git)] {
        if meta.uid() != me.uid {
            return Err(format!(
                "{} is owned by uid {}, not by the agent's user (uid {}): git is not run in it",
                path.display(),
                meta.uid(),
                me.uid
            ));
        }
    }
    Ok(())
}

/// Inspects the checkout at `dir`.
pub async fn inspect(dir: &Path) -> Checkout {
    let unknown = |e: String| Checkout {
        sha: String::new(),
        dirty: true,
        error: Some(e),
    };
    if let Err(e) = owned_by_agent(dir) {
        return unknown(e);
    }
    let t = Duration::from_secs(10);
    let config = match overrides(dir, t).await {
        Ok(c) => c,
        Err(e) => return unknown(e),
    };
    let sha = match run_with(dir, &["rev-parse", "--show-toplevel", "HEAD"], t, &config)
        .await
        .and_then(|text| head_of_top_level(dir, &text))
    {
        Ok(sha) => sha,
        Err(e) => return unknown(e),
    };
    let status = [
        "status",
        "--porcelain",
        "--untracked-files=all",
        "--ignore-submodules=all",
    ];
    match run_with(dir, &status, t, &config).await {
        Ok(text) => Checkout {
            sha,
            dirty: !text.trim().is_empty(),
            error: None,
        },
        Err(e) => Checkout {
            sha,
            dirty: true,
            error: Some(e),
        },
    }
}

/// Reads `rev-parse --show-toplevel HEAD` output: the SHA, provided the
/// work tree's top level is `dir` itself.
fn head_of_top_level(dir: &Path, text: &str) -> Result<String, String> {
    let mut lines = text.lines();
    let top = lines.next().unwrap_or_default().trim();
    let sha = lines.next().unwrap_or_default().trim();
    let same = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    if same(Path::new(top)) != same(dir) {
        return Err(format!(
            "{} is not the top level of a git checkout (the enclosing one is {top})",
            dir.display()
        ));
    }
    if sha.is_empty() {
        return Err("git rev-parse printed no HEAD".to_string());
    }
    Ok(sha.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::test_dir;

    fn run(dir: &Path, args: &[&str]) {
        let ok = std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .unwrap();
        assert!(ok.status.success(), "{:?}", ok);
    }

    /// Commits what is staged (possibly nothing).
    fn commit(dir: &Path) {
        run(
            dir,
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "commit",
                "-q",
                "--allow-empty",
                "-m",
                "x",
            ],
        );
    }

    #[tokio::test]
    async fn untracked_files_make_a_checkout_dirty() {
        let dir = test_dir("git");
        run(&dir, &["init", "-q"]);
        commit(&dir);
        let c = inspect(&dir).await;
        assert_eq!(c.sha.len(), 40, "{c:?}");
        assert!(!c.dirty);
        std::fs::write(dir.join("new.txt"), "x").unwrap();
        assert!(inspect(&dir).await.dirty);
    }

    #[tokio::test]
    async fn a_directory_inside_a_clean_checkout_is_not_that_checkout() {
        let dir = test_dir("git-nested");
        run(&dir, &["init", "-q"]);
        let inner = dir.join("app");
        std::fs::create_dir_all(&inner).unwrap();
        std::fs::write(dir.join(".gitignore"), "app/\n").unwrap();
        run(&dir, &["add", ".gitignore"]);
        commit(&dir);
        assert!(!inspect(&dir).await.dirty, "the outer checkout is clean");
        let c = inspect(&inner).await;
        assert!(c.dirty && c.sha.is_empty(), "{c:?}");
        assert!(c.error.unwrap().contains("top level"));
    }

    #[tokio::test]
    async fn not_a_checkout_is_dirty_without_a_sha() {
        let dir = test_dir("nogit");
        let c = inspect(&dir.join("missing")).await;
        assert!(c.dirty && c.sha.is_empty() && c.error.is_some());
    }
}
