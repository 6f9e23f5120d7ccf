//! Attacks on the node agent, each reproduced as it was observed against
//! the real `callfence-agent` binary (issue 18).
//!
//! - [`deploy`]: a pull request's commit deployed by SHA, and builds that
//!   run as an account able to read the node's keys (SPEC §14).
//! - [`git`]: a checkout's own git configuration run as the agent on every
//!   beat (SPEC §11).

#[path = "../common/mod.rs"]
mod common;
mod deploy;
mod git;

use std::path::Path;
use std::process::Command;

/// `git -C dir args...` as a test author would type it (user config for
/// commits), its trimmed stdout; panics when git fails.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@t"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
