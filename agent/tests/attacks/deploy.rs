//! `deploy` is a trust boundary (SPEC §14, v1.4). Observed before the fix:
//! with no `allowed_shas` (the default), one deploy request built a commit
//! that existed only at the remote's `refs/pull/7/head`; its build ran as
//! the agent's user and copied the node's signing key.
//!
//! Each test runs the real agent (`run`) with a stand-in edge that accepts
//! beats (no `allowed_shas`), a bare remote made here with git, and asks it
//! with the real `deploy` command. The runtime is multi-threaded: the
//! command blocks the test's thread while the stand-in edge answers.

use std::process::Command;

use serde_json::Value;

use crate::common::deploy::{deployable, Deployable};
use crate::common::*;

/// `deploy --sha <sha> --json`: exit success and the outcome.
fn deploy(d: &Deployable, sha: &str) -> (bool, Value) {
    let out = d.node.cmd(&["deploy", "--sha", sha, "--json"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.trim().lines().last().unwrap_or_default();
    let outcome = serde_json::from_str(last)
        .unwrap_or_else(|_| panic!("deploy printed no outcome: {out:?}\n{}", d.node.log()));
    (out.status.success(), outcome)
}

fn step<'a>(outcome: &'a Value, name: &str) -> Option<&'a Value> {
    outcome["steps"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["step"] == name))
}

/// Nothing of `sha` was built or kept, and the key is where it was, alone.
fn nothing_built(d: &Deployable, sha: &str, key_before: &[u8]) {
    assert!(!d.stolen.exists(), "the build copied the node key");
    assert!(
        !d.releases.join(sha).exists(),
        "releases_dir has a release of {sha}"
    );
    let leftovers: Vec<_> = std::fs::read_dir(&d.releases)
        .map(|r| r.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(leftovers.is_empty(), "left in releases_dir: {leftovers:?}");
    assert_eq!(
        std::fs::read(&d.key).unwrap(),
        key_before,
        "the key changed"
    );
}

/// The name of the user the tests run as.
fn own_user_name() -> String {
    let out = Command::new("id").arg("-un").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_requests_commit_is_refused_and_nothing_is_built() {
    // The development opt-out, so that only the branch check stands
    // between the pull request and a build as the agent.
    let d = deployable("build_can_read_keys = true").await;
    let key = std::fs::read(&d.key).unwrap();
    let (ok, outcome) = deploy(&d, &d.pr_sha);
    assert!(!ok, "{outcome}");
    assert_eq!(outcome["step"], "branch", "{outcome}");
    let reason = outcome["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("not on the protected branch main"),
        "{outcome}"
    );
    assert_eq!(step(&outcome, "fetch").unwrap()["ok"], true, "{outcome}");
    assert!(step(&outcome, "checkout").is_none() && step(&outcome, "build").is_none());
    nothing_built(&d, &d.pr_sha, &key);
    assert!(
        d.node.log().contains("deploy_build_can_read_keys"),
        "the opt-out is logged"
    );

    // A commit that is on main passes the same checks and is built.
    let (_, outcome) = deploy(&d, &d.main_sha);
    for name in ["fetch", "branch", "checkout", "build"] {
        assert_eq!(step(&outcome, name).unwrap()["ok"], true, "{outcome}");
    }
    assert!(d.releases.join(&d.main_sha).join("build/uid").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_build_user_is_refused_before_fetching() {
    let d = deployable("").await;
    let key = std::fs::read(&d.key).unwrap();
    let (ok, outcome) = deploy(&d, &d.main_sha);
    assert!(!ok, "{outcome}");
    assert_eq!(outcome["step"], "build_user", "{outcome}");
    assert!(
        outcome["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("no deploy.build_user"),
        "{outcome}"
    );
    assert!(step(&outcome, "fetch").is_none(), "{outcome}");
    nothing_built(&d, &d.main_sha, &key);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_user_that_can_read_the_key_is_refused_before_fetching() {
    // The agent's own user (root in CI) can always read the agent's key.
    let me = own_user_name();
    let d = deployable(&format!("build_user = \"{me}\"")).await;
    let key = std::fs::read(&d.key).unwrap();
    let (ok, outcome) = deploy(&d, &d.main_sha);
    assert!(!ok, "{outcome}");
    assert_eq!(outcome["step"], "build_user", "{outcome}");
    let reason = outcome["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(&format!("build_user {me} can open"))
            && reason.contains(&d.key.display().to_string()),
        "{outcome}"
    );
    assert!(step(&outcome, "fetch").is_none(), "{outcome}");
    nothing_built(&d, &d.main_sha, &key);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_build_runs_as_the_build_user_who_cannot_read_the_key() {
    let d = deployable("build_user = \"nobody\"").await;
    let key = std::fs::read(&d.key).unwrap();
    let (_, outcome) = deploy(&d, &d.main_sha);
    if !am_root() {
        // Without root the agent needs `sudo -n -u nobody`; where sudo does
        // not allow it, the check cannot run as nobody and refuses.
        assert_eq!(outcome["step"], "build_user", "{outcome}");
        nothing_built(&d, &d.main_sha, &key);
        return;
    }
    assert_eq!(
        step(&outcome, "build_user").unwrap()["ok"],
        true,
        "{outcome}"
    );
    assert_eq!(step(&outcome, "build").unwrap()["ok"], true, "{outcome}");
    let release = d.releases.join(&d.main_sha);
    let uid = std::fs::read_to_string(release.join("build/uid")).unwrap();
    assert_eq!(uid.trim(), "65534", "the build ran as nobody");
    assert!(
        !release.join("build/key-copy").exists(),
        "nobody read the key"
    );
    // The release is the agent's again: nobody cannot change it after the checks.
    use std::os::unix::fs::MetadataExt;
    for p in [
        release.clone(),
        release.join("build"),
        release.join("build/uid"),
    ] {
        assert_eq!(std::fs::metadata(&p).unwrap().uid(), 0, "{}", p.display());
    }
}
