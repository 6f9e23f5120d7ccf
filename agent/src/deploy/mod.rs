//! Clean node deployment (SPEC §14): `deploy --sha`, `rollback`, `releases`.
//!
//! # Where a deploy runs, and why
//!
//! The steps run **inside the running agent** (`run`); the `deploy` and
//! `rollback` commands only ask it over the control socket and print its
//! progress as each step ends. So there is exactly one actor that ever changes the node's
//! release and mode:
//! - killing the `deploy` command (even `kill -9`) changes nothing: the
//!   agent carries the deploy through to a verified release or restores the
//!   previous one, and the node is never left drained by a vanished client;
//! - killing the agent leaves the journal (`deploy-journal.json` in the
//!   state directory, written before anything irreversible); the next agent
//!   finishes the restore from it before the node is `active` again (while
//!   it restores the mode stays `drained`, so no new session is admitted).
//!
//! # Steps
//!
//! 1. `validate` (40 lowercase hex only), `build_user` (who runs `build`
//!    and `restart`; refused when it can read the agent's keys, before
//!    anything is fetched), `allowed_shas` (a fresh beat tells the
//!    registry's list; a SHA outside it is refused), `fetch` (that one
//!    commit from `deploy.remote` into a fresh repository), `branch` (the
//!    commit must be reachable from the remote's protected `deploy.branch`);
//! 2. `checkout` (detached, `releases_dir/<sha>`), clean before and after
//!    `build`, every artifact present;
//! 3. `journal`; 4. `drain`; 5. `switch` (new symlink, rename over
//!    `current`); 6. `restart` and `health`; 7. `connector`; 8. `l5`;
//!    9. `mode`.
//!
//! A refusal in steps 1–2 leaves nothing behind (the new checkout is
//! removed). A failed drain (step 4) puts the mode back and stops: nothing
//! was switched, so nothing is restarted. A failure from step 5 on
//! restores: the previous release is switched back (when it was switched), restarted, checked again (health,
//! connector, L5), and the mode put back; the result names the step and the
//! reason. Without `--shed`, calls still up at the drain deadline fail the
//! deploy before the switch: the restart would cut them.
//!
//! # Layout
//! - [`journal`]: the durable record of a deploy in progress.
//! - [`releases`]: the release history, the `current` symlink, pruning.
//! - [`build_user`]: the account that builds and restarts, and the check
//!   that it cannot read the agent's keys.
//! - [`checkout`]: fetch, the protected-branch check, detached checkout,
//!   build, cleanliness, artifacts.
//! - [`verify`]: local health, the connector probe, the L5 probe.
//! - [`verdict`]: each step's verdict, with no I/O.
//! - [`steps`]: the deploy, rollback and restore sequences.
//! - [`recorder`]: each step recorded as it ends, into the job slot.
//! - [`slot`]: the running agent's one job slot, as the control socket
//!   shows it (steps so far, the wait in progress, the result).
//! - [`job`]: the control socket's requests: start a job, read the latest.
//! - [`report`]: the operator's lines: steps, progress, the final line.
//! - [`client`]: the `deploy`, `rollback` and `job` commands.

pub mod build_user;
pub mod checkout;
pub mod client;
pub mod job;
pub mod journal;
pub mod recorder;
pub mod releases;
pub mod report;
pub mod slot;
pub mod steps;
pub mod verdict;
pub mod verify;

use serde::{Deserialize, Serialize};

/// One step as it ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRecord {
    /// The step's name (`fetch`, `drain`, `restore_health`, ...).
    pub step: String,
    /// Whether it succeeded.
    pub ok: bool,
    /// How long it took.
    pub ms: u64,
    /// What it did, or why it failed.
    pub detail: String,
}

/// A failed step: its name and the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The step that failed.
    pub step: &'static str,
    /// Why.
    pub reason: String,
}

impl Failure {
    /// A failure of `step` for `reason`.
    pub fn new(step: &'static str, reason: impl Into<String>) -> Failure {
        Failure {
            step,
            reason: reason.into(),
        }
    }
}

/// The machine-readable result of a deploy, rollback or recovery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// True only when the requested release is live and verified.
    pub ok: bool,
    /// `deploy`, `rollback` or `recover`.
    pub kind: String,
    /// The release that was current before.
    pub from: Option<String>,
    /// The release asked for.
    pub to: Option<String>,
    /// The release current now.
    pub live: Option<String>,
    /// The step that failed.
    pub step: Option<String>,
    /// Why it failed.
    pub reason: Option<String>,
    /// True when the previous release was restored and verified (false
    /// when nothing was switched: nothing needed restoring).
    pub restored: bool,
    /// True when `current` was switched to the new release during the job
    /// (for a recovery: by the interrupted job).
    #[serde(default)]
    pub switched: bool,
    /// The mode the node is in now.
    pub mode: String,
    /// Every step, in order.
    pub steps: Vec<StepRecord>,
}

/// True for exactly 40 lowercase hex digits.
pub fn is_full_sha(text: &str) -> bool {
    text.len() == 40
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_full_lowercase_shas() {
        assert!(is_full_sha(&"a1".repeat(20)));
        for bad in [
            "main",
            "v1.2",
            "abc1234",
            &"A1".repeat(20),
            &"a1".repeat(21),
            &"g1".repeat(20),
        ] {
            assert!(!is_full_sha(bad), "{bad}");
        }
    }
}
