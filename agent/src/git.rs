//! The runtime checkout's identity: `sha` from `git rev-parse HEAD` and
//! `dirty` from `git status --porcelain --untracked-files=all` (any line,
//! untracked files included, means dirty). When git fails the checkout is
//! reported with an empty SHA and dirty, which the edge reads as ineligible.
//!
//! The configured directory must be the top level of its work tree: a
//! directory that merely sits inside some other checkout would otherwise
//! report that enclosing repository's SHA and cleanliness, which says
//! nothing about the code the node runs.

use std::path::Path;
use std::time::Duration;

use tokio::process::Command;

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

async fn git(dir: &Path, args: &[&str]) -> Result<String, String> {
    git_with(dir, args, Duration::from_secs(10)).await
}

/// Runs `git -C dir args...` within `timeout`; its stdout, or a short
/// reason (the first 200 characters of git's complaint).
pub(crate) async fn git_with(
    dir: &Path,
    args: &[&str],
    timeout: Duration,
) -> Result<String, String> {
    let mut cmd = Command::new("git");
    cmd.arg("-c")
        .arg(format!("safe.directory={}", dir.display()))
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_OPTIONAL_LOCKS", "0")
        .kill_on_drop(true);
    let out = tokio::time::timeout(timeout, cmd.output())
        .await
        .map_err(|_| "git timed out".to_string())?
        .map_err(|e| format!("git: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "git {}: {}",
            args[0],
            err.trim().chars().take(200).collect::<String>()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Inspects the checkout at `dir`.
pub async fn inspect(dir: &Path) -> Checkout {
    let sha = match git(dir, &["rev-parse", "--show-toplevel", "HEAD"])
        .await
        .and_then(|text| head_of_top_level(dir, &text))
    {
        Ok(sha) => sha,
        Err(e) => {
            return Checkout {
                sha: String::new(),
                dirty: true,
                error: Some(e),
            };
        }
    };
    match git(dir, &["status", "--porcelain", "--untracked-files=all"]).await {
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
