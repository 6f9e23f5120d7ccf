//! The checks a release must pass before the node may be active on it
//! (steps 6–8): local health (the app is ready, reports the release's SHA
//! when it reports one, and the checkout through `current` is that SHA and
//! clean), the connector (the public origin probe reaches this agent), and
//! the public L5 probe (`POST /v1/nodes/probe`: the edge reaches the app
//! through the whole public path and the app answers with the SHA).
//!
//! Each check polls until it holds or its budget ends; the failure names
//! what was last seen.

use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;

use crate::clock::now_ms;
use crate::context::Agent;
use crate::git::inspect;
use crate::probe::{app_status, tunnel};

/// A fresh probe nonce: 24 random bytes, base64url (32 characters).
fn nonce() -> Result<String, String> {
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness: {e}"))?;
    Ok(callfence_core::encoding::b64url_encode(&bytes))
}

/// How often a check is retried.
const POLL: Duration = Duration::from_millis(250);

/// Step 6's local health, within `budget`.
pub async fn health(agent: &Agent, sha: &str, budget: Duration) -> Result<String, String> {
    let cfg = &agent.config;
    let until = Instant::now() + budget;
    let timeout = Duration::from_millis(cfg.timing.probe_timeout_ms);
    loop {
        let seen = match app_status(&agent.http, &cfg.app_status_url, timeout).await {
            Err(e) => format!("app status: {e}"),
            Ok(s) if !s.ready => "the app is not ready".to_string(),
            Ok(s) if s.sha.as_deref().is_some_and(|a| a != sha) => {
                format!("the app reports sha {}", s.sha.unwrap_or_default())
            }
            Ok(_) => {
                let c = inspect(&cfg.runtime_checkout).await;
                if c.sha != sha {
                    format!("the checkout reports {:?}", c.sha)
                } else if c.dirty {
                    "the checkout is dirty".to_string()
                } else {
                    return Ok(format!("app ready, checkout at {sha}, clean"));
                }
            }
        };
        if Instant::now() + POLL > until {
            return Err(format!("not healthy within {} s: {seen}", budget.as_secs()));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Step 7: the public origin probe reaches this agent, within `budget`.
pub async fn connector(agent: &Agent, budget: Duration) -> Result<String, String> {
    let cfg = &agent.config;
    let until = Instant::now() + budget;
    let timeout = Duration::from_millis(cfg.timing.probe_timeout_ms);
    loop {
        if tunnel(&agent.http, &cfg.probe_url, &cfg.node, timeout).await {
            return Ok(format!("{} answers as {}", cfg.probe_url, cfg.node));
        }
        if Instant::now() + POLL > until {
            return Err(format!(
                "{} did not answer as {} within {} s",
                cfg.probe_url,
                cfg.node,
                budget.as_secs()
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Step 8: the L5 probe through the edge, within `budget`. It waits out
/// the edge's rate limit (429 `Retry-After`) and tries again after a
/// failure of the path itself (the edge unreachable, or the edge's request
/// to the origin timed out or met a network error, as a connection closed
/// under it can); an answer of the app's own (a status, a body, a nonce or
/// a SHA that is not the release's) is its verdict and ends the step.
/// `waiting` hears how long a wait for the rate limit will be, first.
pub async fn l5(
    agent: &Agent,
    sha: &str,
    budget: Duration,
    waiting: impl Fn(Duration),
) -> Result<String, String> {
    let until = Instant::now() + budget;
    loop {
        let nonce = nonce()?;
        let body = serde_json::to_vec(&json!({ "nonce": nonce })).unwrap_or_default();
        let reply = agent
            .edge
            .post_signed(agent.keys.current(), "/v1/nodes/probe", body, now_ms())
            .await
            .map(|r| (r.status, r.body));
        let verdict = judge_l5(reply, sha);
        let limited = matches!(verdict, L5::RateLimited(_));
        let (wait, seen) = match verdict {
            L5::Passed(detail) => return Ok(detail),
            L5::Failed(e) => return Err(e),
            L5::RateLimited(wait) => (
                wait,
                "the edge's probe rate limit outlasted the budget".to_string(),
            ),
            L5::PathFailed(e) => (POLL, e),
        };
        if Instant::now() + wait >= until {
            return Err(seen);
        }
        if limited {
            waiting(wait);
        }
        tokio::time::sleep(wait).await;
    }
}

/// What one L5 attempt says.
#[derive(Debug, PartialEq, Eq)]
enum L5 {
    /// The edge reached the app on the release's SHA.
    Passed(String),
    /// The edge asks to wait this long first (429).
    RateLimited(Duration),
    /// The path failed on the way (worth another attempt within the budget).
    PathFailed(String),
    /// The app or the edge gave its verdict: the step fails.
    Failed(String),
}

/// Judges one answer of `POST /v1/nodes/probe` (status and body), or the
/// reason the edge could not be reached, for a release at `sha`.
fn judge_l5(reply: Result<(u16, Value), String>, sha: &str) -> L5 {
    let (status, answer) = match reply {
        Err(e) => return L5::PathFailed(format!("edge unreachable: {e}")),
        Ok(r) => r,
    };
    match status {
        429 => {
            let s = answer["retry_after_s"].as_u64().unwrap_or(1).clamp(1, 10);
            return L5::RateLimited(Duration::from_secs(s));
        }
        200 => {}
        _ => {
            return L5::Failed(format!(
                "the edge refused the probe: {status} {}",
                answer["error"].as_str().unwrap_or("?")
            ))
        }
    }
    let got = answer["sha"].as_str().unwrap_or_default();
    let ok = answer["ok"] == Value::Bool(true);
    let reason = answer["reason"].as_str().unwrap_or("?");
    if ok && got == sha {
        L5::Passed(format!(
            "the edge reached the app ({} ms), sha {sha}",
            answer["latency_ms"]
        ))
    } else if ok {
        L5::Failed(format!("the app answered the probe with sha {got:?}"))
    } else {
        let seen = format!(
            "probe failed: {reason} (origin status {})",
            answer["status"]
        );
        if matches!(reason, "network_error" | "timeout") {
            L5::PathFailed(seen)
        } else {
            L5::Failed(seen)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "383337773b51ccc3cf2e19625e0a7c4a235cc033";

    fn edge(status: u16, body: Value) -> Result<(u16, Value), String> {
        Ok((status, body))
    }

    #[test]
    fn the_release_answering_through_the_edge_passes() {
        let a = edge(
            200,
            json!({"ok": true, "status": 200, "latency_ms": 20, "sha": SHA, "reason": "ok"}),
        );
        assert!(matches!(judge_l5(a, SHA), L5::Passed(d) if d.contains("20 ms")));
    }

    #[test]
    fn a_failure_of_the_path_is_tried_again() {
        for reason in ["network_error", "timeout"] {
            let a = edge(200, json!({"ok": false, "status": null, "reason": reason}));
            assert!(matches!(judge_l5(a, SHA), L5::PathFailed(d) if d.contains(reason)));
        }
        assert!(matches!(
            judge_l5(Err("connection refused".into()), SHA),
            L5::PathFailed(d) if d.contains("edge unreachable")
        ));
    }

    #[test]
    fn the_apps_own_answer_is_its_verdict() {
        for reason in ["http_status", "not_json", "nonce_mismatch"] {
            let a = edge(200, json!({"ok": false, "status": 503, "reason": reason}));
            assert!(matches!(judge_l5(a, SHA), L5::Failed(d) if d.contains(reason)));
        }
        let wrong = edge(
            200,
            json!({"ok": true, "status": 200, "sha": "0000", "reason": "ok"}),
        );
        assert!(matches!(judge_l5(wrong, SHA), L5::Failed(d) if d.contains("\"0000\"")));
    }

    #[test]
    fn the_edge_refusing_fails_and_its_rate_limit_is_waited_out() {
        let refused = edge(401, json!({"error": "unknown_key"}));
        assert!(matches!(judge_l5(refused, SHA), L5::Failed(d) if d.contains("401 unknown_key")));
        let limited = edge(429, json!({"error": "rate_limited", "retry_after_s": 4}));
        assert_eq!(
            judge_l5(limited, SHA),
            L5::RateLimited(Duration::from_secs(4))
        );
        let wild = edge(429, json!({"retry_after_s": 3600}));
        assert_eq!(
            judge_l5(wild, SHA),
            L5::RateLimited(Duration::from_secs(10))
        );
    }
}
