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

/// Step 8: the L5 probe through the edge, within `budget`; waits out the
/// edge's rate limit (429 `Retry-After`) when it must.
pub async fn l5(agent: &Agent, sha: &str, budget: Duration) -> Result<String, String> {
    let until = Instant::now() + budget;
    loop {
        let nonce = nonce()?;
        let body = serde_json::to_vec(&json!({ "nonce": nonce })).unwrap_or_default();
        let reply = agent
            .edge
            .post_signed(agent.keys.current(), "/v1/nodes/probe", body, now_ms())
            .await;
        let wait = match reply {
            Err(e) => Err(format!("edge unreachable: {e}")),
            Ok(r) if r.status == 429 => {
                let s = r.body["retry_after_s"].as_u64().unwrap_or(1).clamp(1, 10);
                Ok(Duration::from_secs(s))
            }
            Ok(r) if r.status == 200 => {
                let answer = &r.body;
                let got = answer["sha"].as_str().unwrap_or_default();
                if answer["ok"] == Value::Bool(true) && got == sha {
                    return Ok(format!(
                        "the edge reached the app ({} ms), sha {sha}",
                        answer["latency_ms"]
                    ));
                }
                return Err(if answer["ok"] == Value::Bool(true) {
                    format!("the app answered the probe with sha {got:?}")
                } else {
                    format!(
                        "probe failed: {} (origin status {})",
                        answer["reason"].as_str().unwrap_or("?"),
                        answer["status"]
                    )
                });
            }
            Ok(r) => Err(format!(
                "the edge refused the probe: {} {}",
                r.status,
                r.error_code().unwrap_or("?")
            )),
        };
        match wait {
            Ok(d) if Instant::now() + d < until => tokio::time::sleep(d).await,
            Ok(_) => return Err("the edge's probe rate limit outlasted the budget".into()),
            Err(e) => return Err(e),
        }
    }
}
