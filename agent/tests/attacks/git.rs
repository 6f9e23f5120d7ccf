//! The agent's git reads of the runtime checkout run no configured program
//! (SPEC §11). Observed before the fix: every beat ran
//! `git -c safe.directory=<checkout> status`, so a checkout's
//! `core.fsmonitor` hook ran as the agent every 5 s (and copied the node
//! key), and the beat still reported the checkout clean.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::common::*;

/// A clean checkout with one commit, and a node whose runtime checkout it
/// is.
fn checkout_node() -> (Node, PathBuf) {
    let keys = Keys::new();
    let n = node(&keys, "http://127.0.0.1:9", None);
    let repo = n.dir.join("app");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q"]);
    std::fs::write(repo.join("app.txt"), "the voice app\n").unwrap();
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-q", "-m", "app"]);
    let text = std::fs::read_to_string(&n.config).unwrap().replace(
        &format!("runtime_checkout = \"{}\"", n.dir.display()),
        &format!("runtime_checkout = \"{}\"", repo.display()),
    );
    std::fs::write(&n.config, text).unwrap();
    (n, repo)
}

/// `status --json` and `heartbeat --once` (the edge is unreachable; the
/// observation still runs git in the checkout): the status view.
fn observe(n: &Node) -> Value {
    let beat = n.cmd(&["heartbeat", "--once"]);
    assert!(!String::from_utf8_lossy(&beat.stderr).contains("panicked"));
    let out = n.cmd(&["status", "--json"]);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("status: {out:?}"))
}

/// A script that leaves `marker` (it could as well copy the node key),
/// then runs `then` (`cat` for a filter, which passes its input through).
fn hook(dir: &Path, marker: &Path, then: &str) -> PathBuf {
    let script = dir.join("hook.sh");
    std::fs::write(
        &script,
        format!("#!/bin/sh\ntouch '{}'\n{then}\n", marker.display()),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

/// Sets the checkout's `core.fsmonitor` to a hook; where its marker goes.
fn with_fsmonitor(n: &Node, repo: &Path) -> PathBuf {
    let marker = n.dir.join("fsmonitor-ran");
    let script = hook(&n.dir, &marker, "exit 0");
    git(
        repo,
        &["config", "core.fsmonitor", &script.display().to_string()],
    );
    marker
}

#[test]
fn a_checkouts_fsmonitor_hook_is_never_run() {
    let (n, repo) = checkout_node();
    let marker = with_fsmonitor(&n, &repo);
    let view = observe(&n);
    assert!(
        !marker.exists(),
        "the checkout's core.fsmonitor ran as the agent"
    );
    assert_eq!(view["clean"], true, "{view}");
    assert_eq!(view["sha"].as_str().map(str::len), Some(40), "{view}");
}

#[test]
fn a_gitattributes_filter_is_never_run() {
    let (n, repo) = checkout_node();
    let marker = n.dir.join("filter-ran");
    let script = hook(&n.dir, &marker, "cat");
    std::fs::write(repo.join(".gitattributes"), "* filter=x\n").unwrap();
    git(&repo, &["add", ".gitattributes"]);
    git(&repo, &["commit", "-q", "-m", "attributes"]);
    std::fs::remove_file(&marker).ok();
    git(
        &repo,
        &["config", "filter.x.clean", &script.display().to_string()],
    );
    git(
        &repo,
        &["config", "filter.x.smudge", &script.display().to_string()],
    );
    // A changed mtime makes status read the file again, through the filter.
    let touched = Command::new("touch")
        .args(["-d", "2001-01-01"])
        .arg(repo.join("app.txt"))
        .status()
        .unwrap();
    assert!(touched.success());
    let view = observe(&n);
    assert!(!marker.exists(), "the repository's filter ran as the agent");
    assert_eq!(view["clean"], true, "{view}");
}

#[test]
fn a_checkout_owned_by_another_user_is_dirty_and_says_why() {
    let (n, repo) = checkout_node();
    let marker = with_fsmonitor(&n, &repo);
    let chown = Command::new("chown")
        .args(["-R", "nobody"])
        .arg(&repo)
        .output()
        .unwrap();
    assert!(
        chown.status.success(),
        "this test hands the checkout to nobody and needs root (CI runs as root): {chown:?}"
    );
    let view = observe(&n);
    assert_eq!(view["clean"], false, "{view}");
    let why = view["git_error"].as_str().unwrap_or_default();
    assert!(why.contains("owned by uid 65534"), "{view}");
    assert!(!marker.exists(), "git ran in another user's checkout");
}
