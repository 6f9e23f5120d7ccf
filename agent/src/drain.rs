//! The `drain` command: set the mode to `drained` (the running agent stops
//! admitting new sessions at once, and its next beat tells the edge), wait
//! until the app holds no call or the deadline passes, and report what
//! remained. With `--shed`, the legs that remain at the deadline (those the
//! app lists in `calls` and those the ledger saw open) are hung up through
//! Telnyx with deterministic `command_id`s.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::config::Config;
use crate::ledger::Ledger;
use crate::mode::{self, NodeMode};
use crate::telnyx_api::TelnyxApi;
use crate::{net, probe, AgentError};

/// One hangup sent while shedding.
#[derive(Debug, Clone, Serialize)]
pub struct Shed {
    /// The leg.
    pub call_control_id: String,
    /// Telnyx's status, or the transport failure.
    pub result: String,
}

/// What `drain` reports.
#[derive(Debug, Clone, Serialize)]
pub struct DrainReport {
    /// True when the app reported no active call before the deadline.
    pub drained: bool,
    /// The app's last count (None when it never answered).
    pub active_calls: Option<u32>,
    /// Legs known to remain at the deadline.
    pub remaining: Vec<String>,
    /// Hangups sent (`--shed`).
    pub shed: Vec<Shed>,
    /// Seconds waited.
    pub waited_s: u64,
}

/// Runs the drain; `progress` hears, after each look at the app while it
/// waits, how many calls the app holds (`None`: it did not say) and the
/// time left before the deadline.
pub async fn drain(
    config: &Config,
    deadline: Duration,
    shed: bool,
    progress: impl Fn(Option<u32>, Duration),
) -> Result<DrainReport, AgentError> {
    let http = net::client()?;
    let telnyx = if shed {
        let api = config.telnyx_api.as_ref().ok_or_else(|| {
            AgentError::new("--shed needs telnyx.api_base and telnyx.api_key_file")
        })?;
        Some(TelnyxApi::from_config(
            http.clone(),
            api,
            Duration::from_millis(config.timing.telnyx_resend_ms),
            Duration::from_millis(config.timing.telnyx_timeout_ms),
        )?)
    } else {
        None
    };
    mode::write(&config.state_dir, NodeMode::Drained)?;
    crate::log::info(
        "drain_started",
        serde_json::json!({"deadline_s": deadline.as_secs(), "shed": shed}),
    );
    let started = Instant::now();
    let until = started + deadline;
    let poll = Duration::from_millis(config.timing.drain_poll_ms);
    let timeout = Duration::from_millis(config.timing.probe_timeout_ms);
    let mut last = None;
    loop {
        match probe::app_status(&http, &config.app_status_url, timeout).await {
            Ok(s) => {
                if s.active_calls == 0 {
                    return Ok(DrainReport {
                        drained: true,
                        active_calls: Some(0),
                        remaining: Vec::new(),
                        shed: Vec::new(),
                        waited_s: started.elapsed().as_secs(),
                    });
                }
                last = Some(s);
            }
            Err(e) => crate::log::warn("drain_app_unreachable", serde_json::json!({"reason": e})),
        }
        if Instant::now() + poll > until {
            break;
        }
        progress(
            last.as_ref().map(|s| s.active_calls),
            until.saturating_duration_since(Instant::now()),
        );
        tokio::time::sleep(poll).await;
    }
    let mut remaining: BTreeSet<String> = last
        .as_ref()
        .map(|s| s.calls.iter().map(|c| c.call_control_id.clone()).collect())
        .unwrap_or_default();
    let state_dir = config.state_dir.clone();
    let legs =
        tokio::task::spawn_blocking(move || Ledger::open(&state_dir).and_then(|l| l.open_legs()))
            .await
            .map_err(|_| AgentError::new("ledger task failed"))??;
    remaining.extend(legs.into_iter().map(|(ccid, _)| ccid));
    let mut shed_results = Vec::new();
    if let Some(api) = &telnyx {
        for ccid in &remaining {
            let result = match api.hangup(ccid).await {
                Ok(r) => r.status.to_string(),
                Err(e) => e,
            };
            crate::log::info(
                "call_shed",
                serde_json::json!({"call_control_id": ccid, "result": result}),
            );
            shed_results.push(Shed {
                call_control_id: ccid.clone(),
                result,
            });
        }
    }
    Ok(DrainReport {
        drained: false,
        active_calls: last.map(|s| s.active_calls),
        remaining: remaining.into_iter().collect(),
        shed: shed_results,
        waited_s: started.elapsed().as_secs(),
    })
}
