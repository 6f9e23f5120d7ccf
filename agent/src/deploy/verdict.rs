//! Each deploy step's verdict, with no I/O: [`super::steps`] gathers what
//! the node, the edge and git say, and asks these functions what it means
//! (go on with this detail, or fail the step with this reason).

use std::time::Duration;

use serde_json::Value;

use super::journal::Journal;
use super::releases::{self, Release};
use super::{is_full_sha, Failure};
use crate::drain::DrainReport;
use crate::AgentError;

/// `validate` for a deploy of `sha` while `live` is current: a full commit,
/// not already live.
pub fn target(sha: &str, live: Option<&str>) -> Result<(), Failure> {
    if !is_full_sha(sha) {
        return Err(Failure::new(
            "validate",
            "a release is a full commit: 40 lowercase hex digits (no branch, tag or short SHA)",
        ));
    }
    if live == Some(sha) {
        return Err(Failure::new("validate", format!("{sha} is already live")));
    }
    Ok(())
}

/// `validate`: a journal left by an unfinished deploy (or one that cannot
/// be read) refuses a new one.
pub fn journal_free(read: Result<Option<Journal>, AgentError>) -> Result<(), Failure> {
    match read {
        Ok(None) => Ok(()),
        Ok(Some(_)) => Err(Failure::new(
            "validate",
            "an unfinished deploy is in the journal",
        )),
        Err(e) => Err(Failure::new("validate", e.0)),
    }
}

/// `validate` of a rollback: the newest trusted release, other than `live`,
/// still kept on disk (`kept`).
pub fn rollback_target(
    history: &[Release],
    live: Option<&str>,
    kept: impl Fn(&str) -> bool,
) -> Result<String, Failure> {
    history
        .iter()
        .find(|r| releases::trusted(&r.result) && live != Some(r.sha.as_str()) && kept(&r.sha))
        .map(|r| r.sha.clone())
        .ok_or_else(|| Failure::new("validate", "no earlier verified release is kept"))
}

/// `allowed_shas`: what a fresh beat (its `outcome`, the edge's refusal and
/// the `allowed_shas` it reported) says about `sha`. Fails closed when the
/// edge does not say.
pub fn allowed(
    outcome: &str,
    refused: Option<&str>,
    allowed_shas: Option<&Value>,
    sha: &str,
) -> Result<String, Failure> {
    let fail = |why: String| Failure::new("allowed_shas", why);
    if outcome != "accepted" {
        return Err(fail(format!(
            "cannot read the registry's allowed_shas: the beat was {outcome} ({})",
            refused.unwrap_or_default()
        )));
    }
    match allowed_shas {
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

/// `drain`: no call left, or every remaining call shed (with `shed`);
/// otherwise the calls still up would be cut by the restart, so the deploy
/// stops before the switch.
pub fn drained(
    report: Result<DrainReport, AgentError>,
    shed: bool,
    deadline: Duration,
) -> Result<String, String> {
    match report {
        Ok(r) if r.drained => Ok("no call left".to_string()),
        Ok(r) if shed && r.shed.iter().all(|s| s.result.starts_with('2')) => {
            Ok(format!("{} call(s) shed at the deadline", r.shed.len()))
        }
        Ok(r) => Err(format!(
            "{} call(s) still up after {} s (use --shed to hang them up)",
            r.remaining.len().max(r.active_calls.unwrap_or(0) as usize),
            deadline.as_secs()
        )),
        Err(e) => Err(e.0),
    }
}

/// How a restore puts `from` back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestorePlan {
    /// `current` points elsewhere: switch it back.
    pub switch_back: bool,
    /// Restart the app (it runs, or may run, another release); otherwise
    /// only verify, so the calls of the release that never stopped go on.
    pub restart: bool,
}

/// The restore of `from` when `current` is `live` and the job had
/// `switched` (a recovery knows from its journal's step).
pub fn restore_plan(from: &str, live: Option<&str>, switched: bool) -> RestorePlan {
    let elsewhere = live != Some(from);
    RestorePlan {
        switch_back: elsewhere,
        restart: switched || elsewhere,
    }
}

/// True when a recovered journal's deploy had reached the switch (its
/// release may be running).
pub fn journal_switched(j: &Journal) -> bool {
    j.step != "drain"
}

/// The name of a check (`restart`, `health`, `connector`, `l5`), prefixed
/// `restore_` when it checks the release being restored.
pub fn check_name(check: &'static str, restoring: bool) -> &'static str {
    match (restoring, check) {
        (false, name) => name,
        (true, "restart") => "restore_restart",
        (true, "health") => "restore_health",
        (true, "connector") => "restore_connector",
        (true, _) => "restore_l5",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drain::Shed;
    use serde_json::json;

    const A: &str = "a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1";
    const B: &str = "b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2";

    fn release(sha: &str, result: &str) -> Release {
        Release {
            sha: sha.into(),
            deployed_at: String::new(),
            result: result.into(),
        }
    }

    fn journal(step: &str) -> Journal {
        Journal {
            kind: "deploy".into(),
            from: Some(A.into()),
            to: B.into(),
            prior_mode: "active".into(),
            step: step.into(),
            started_at: String::new(),
        }
    }

    fn report(drained: bool, active: Option<u32>, shed: &[&str]) -> DrainReport {
        DrainReport {
            drained,
            active_calls: active,
            remaining: Vec::new(),
            shed: shed
                .iter()
                .map(|r| Shed {
                    call_control_id: "c".into(),
                    result: (*r).into(),
                })
                .collect(),
            waited_s: 0,
        }
    }

    #[test]
    fn only_a_full_commit_that_is_not_live_is_a_target() {
        assert!(target(B, Some(A)).is_ok());
        assert!(target(B, None).is_ok());
        for (sha, live) in [("main", None), (&A[..7], None), (A, Some(A))] {
            assert_eq!(target(sha, live).unwrap_err().step, "validate", "{sha}");
        }
    }

    #[test]
    fn a_journal_left_behind_refuses_a_new_deploy() {
        assert!(journal_free(Ok(None)).is_ok());
        assert!(journal_free(Ok(Some(journal("drain")))).is_err());
        assert!(journal_free(Err(AgentError::new("unreadable"))).is_err());
    }

    #[test]
    fn rollback_goes_to_the_newest_trusted_kept_release_other_than_the_live_one() {
        let history = [
            release(B, "verified"),
            release("c".repeat(40).as_str(), "failed"),
            release(A, "verified"),
        ];
        assert_eq!(rollback_target(&history, Some(B), |_| true).unwrap(), A);
        assert!(
            rollback_target(&history, Some(B), |sha| sha != A).is_err(),
            "A pruned"
        );
        assert_eq!(rollback_target(&history, Some(A), |_| true).unwrap(), B);
    }

    #[test]
    fn allowed_shas_fails_closed_unless_the_edge_lists_the_sha_or_none() {
        assert!(allowed("accepted", None, Some(&Value::Null), A).is_ok());
        assert!(allowed("accepted", None, Some(&json!([A])), A).is_ok());
        for (outcome, list) in [
            ("accepted", Some(json!([B]))),
            ("accepted", None),
            ("accepted", Some(json!("x"))),
            ("unreachable", Some(Value::Null)),
        ] {
            let f = allowed(outcome, None, list.as_ref(), A).unwrap_err();
            assert_eq!(f.step, "allowed_shas", "{outcome} {list:?}");
        }
    }

    #[test]
    fn a_drain_passes_only_with_no_call_left_or_every_call_shed() {
        let deadline = Duration::from_secs(5);
        assert!(drained(Ok(report(true, Some(0), &[])), false, deadline).is_ok());
        assert!(drained(Ok(report(false, Some(2), &["200", "200"])), true, deadline).is_ok());
        assert!(drained(Ok(report(false, Some(1), &["500"])), true, deadline).is_err());
        assert_eq!(
            drained(Ok(report(false, Some(1), &[])), false, deadline).unwrap_err(),
            "1 call(s) still up after 5 s (use --shed to hang them up)"
        );
        assert!(drained(Err(AgentError::new("no telnyx")), true, deadline).is_err());
    }

    #[test]
    fn a_restore_restarts_only_what_was_switched_or_is_elsewhere() {
        let same = restore_plan(A, Some(A), false);
        assert_eq!(
            (same.switch_back, same.restart),
            (false, false),
            "verify only"
        );
        let after_switch = restore_plan(A, Some(B), true);
        assert_eq!(
            (after_switch.switch_back, after_switch.restart),
            (true, true)
        );
        let switched_back_already = restore_plan(A, Some(A), true);
        assert_eq!(
            (
                switched_back_already.switch_back,
                switched_back_already.restart
            ),
            (false, true)
        );
        assert!(!journal_switched(&journal("drain")));
        assert!(journal_switched(&journal("switch")));
    }

    #[test]
    fn checks_of_a_restored_release_are_named_restore() {
        assert_eq!(check_name("health", false), "health");
        assert_eq!(check_name("restart", true), "restore_restart");
        assert_eq!(check_name("l5", true), "restore_l5");
    }
}
