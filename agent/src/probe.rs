//! What the node observes about its surroundings: the voice app's status
//! endpoint and the end-to-end tunnel probe.
//!
//! # The app status contract
//!
//! The voice app serves, on loopback, `GET <app.status_url>` answering 200
//! with a JSON object:
//!
//! ```json
//! {"ready": true, "active_calls": 3, "max_calls": 10,
//!  "lines": {"property_management_ca": "+15102160079"},
//!  "calls": [{"call_control_id": "v3:...", "call_session_id": "..."}]}
//! ```
//!
//! - `ready` (bool, required): the app can take a new call now.
//! - `active_calls` (integer, required): every call the app holds, in any state.
//! - `max_calls` (integer, required): how many calls it can hold.
//! - `lines` (object, optional): line id → E.164 number, the numbers the app
//!   applied; reported in beats when `lines.source = "app"`.
//! - `calls` (list, optional): the legs it holds; `drain --shed` hangs these
//!   up (with those the ledger saw) when the deadline passes.
//! - `sha` (string, optional): the commit the app runs; when present, a
//!   deploy's local health check requires it to be the new release's.
//!
//! Any other answer (not 200, not this JSON, over 64 KiB, slower than
//! `timing.probe_timeout_ms`) means the app is down: `app_ready: false`.
//!
//! # The tunnel probe
//!
//! `GET <origin.probe_url>` (the public URL, through the tunnel) must reach
//! this agent's origin listener, which answers `GET .../health` with
//! `{"status":"ok","node":"<node id>"}`; `tunnel_up` is true only for a 200
//! naming this node.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::Url;
use serde::{Deserialize, Serialize};

use crate::net::{describe, read_limited};

/// The largest status document read.
pub const MAX_STATUS_BYTES: usize = 64 * 1024;

/// One call leg the app holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppCall {
    /// The leg's Telnyx `call_control_id`.
    pub call_control_id: String,
    /// Its session, when the app knows it.
    #[serde(default)]
    pub call_session_id: Option<String>,
}

/// The app's status document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppStatus {
    /// The app can take a new call.
    pub ready: bool,
    /// Calls held, any state.
    pub active_calls: u32,
    /// Capacity.
    pub max_calls: u32,
    /// Lines applied: line id → number.
    #[serde(default)]
    pub lines: BTreeMap<String, String>,
    /// The legs held (optional).
    #[serde(default)]
    pub calls: Vec<AppCall>,
    /// The commit the app runs, as it knows it (optional; a deploy's local
    /// health check requires it to be the new SHA when present).
    #[serde(default)]
    pub sha: Option<String>,
}

/// Parses and bounds a status document.
pub fn parse_status(body: &[u8]) -> Result<AppStatus, String> {
    let status: AppStatus = serde_json::from_slice(body)
        .map_err(|_| "status is not the contract's JSON".to_string())?;
    if status.lines.len() > 256 || status.calls.len() > 10_000 {
        return Err("status lists too many lines or calls".into());
    }
    for (id, number) in &status.lines {
        if id.len() > 64 || number.len() > 32 {
            return Err("status has an over-long line".into());
        }
    }
    if status.sha.as_ref().is_some_and(|s| s.len() > 64) {
        return Err("status has an over-long sha".into());
    }
    if status
        .calls
        .iter()
        .any(|c| c.call_control_id.is_empty() || c.call_control_id.len() > 256)
    {
        return Err("status has a bad call_control_id".into());
    }
    Ok(status)
}

/// Asks the app for its status.
pub async fn app_status(
    http: &reqwest::Client,
    url: &Url,
    timeout: Duration,
) -> Result<AppStatus, String> {
    let resp = http
        .get(url.clone())
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| describe(&e))?;
    if resp.status().as_u16() != 200 {
        return Err(format!(
            "status endpoint answered {}",
            resp.status().as_u16()
        ));
    }
    let body = tokio::time::timeout(timeout, read_limited(resp, MAX_STATUS_BYTES))
        .await
        .map_err(|_| "timeout".to_string())??;
    parse_status(&body)
}

/// Probes the public origin end to end: true only when this node answers.
pub async fn tunnel(http: &reqwest::Client, url: &Url, node: &str, timeout: Duration) -> bool {
    let Ok(resp) = http.get(url.clone()).timeout(timeout).send().await else {
        return false;
    };
    if resp.status().as_u16() != 200 {
        return false;
    }
    let Ok(Ok(body)) = tokio::time::timeout(timeout, read_limited(resp, 4096)).await else {
        return false;
    };
    serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .is_some_and(|v| v["node"] == node && v["status"] == "ok")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_contract_parses_with_optional_parts() {
        let s = parse_status(br#"{"ready":true,"active_calls":2,"max_calls":5}"#).unwrap();
        assert!(s.ready && s.lines.is_empty() && s.calls.is_empty());
        let s = parse_status(
            br#"{"ready":false,"active_calls":1,"max_calls":5,"lines":{"a":"+15102160079"},
                "calls":[{"call_control_id":"v3:x"}],"extra":1}"#,
        )
        .unwrap();
        assert_eq!(s.lines["a"], "+15102160079");
        assert_eq!(s.calls[0].call_control_id, "v3:x");
    }

    #[test]
    fn anything_else_is_refused() {
        assert!(parse_status(b"{}").is_err());
        assert!(parse_status(br#"{"ready":"yes","active_calls":1,"max_calls":1}"#).is_err());
        assert!(parse_status(br#"{"ready":true,"active_calls":-1,"max_calls":1}"#).is_err());
        assert!(parse_status(b"not json").is_err());
    }
}
