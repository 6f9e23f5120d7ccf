//! `POST /v1/nodes/probe` on the Dispatcher's side: the per-node rate limit
//! ([`crate::probe::rate_limit`]) and the node's registered `origin_url`.
//! The only state a probe leaves is the time of the node's last admitted
//! probe (counter `probe_at:<node>`): no call, event or decision.

use super::{Directory, EngineError};
use crate::probe;
use crate::store::Store;

/// What the Dispatcher says about a probe request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeAdmission {
    /// Send the probe to this origin (the registry's `origin_url`).
    Send {
        /// The node's registered origin URL.
        origin_url: String,
    },
    /// The node probed less than [`probe::INTERVAL_MS`] ago.
    RateLimited {
        /// Seconds until the next probe may go (`Retry-After`).
        retry_after_s: u32,
    },
    /// The node is not in the registry.
    UnknownNode,
}

impl<S: Store> Directory<S> {
    /// Admits one probe of `node` at `now_ms`, or refuses it under the rate
    /// limit. An admitted probe records its time; a refused one changes
    /// nothing.
    pub fn handle_probe(&self, node: &str, now_ms: i64) -> Result<ProbeAdmission, EngineError> {
        let Some((_, registry)) = self.registry()? else {
            return Ok(ProbeAdmission::UnknownNode);
        };
        let Some(entry) = registry.nodes.get(node) else {
            return Ok(ProbeAdmission::UnknownNode);
        };
        let name = format!("probe_at:{node}");
        self.unit(|| {
            let last = Some(self.q().counter(&name)?).filter(|at| *at > 0);
            if let Err(retry_after_s) = probe::rate_limit(last, now_ms) {
                return Ok(ProbeAdmission::RateLimited { retry_after_s });
            }
            self.q().set_counter(&name, now_ms)?;
            Ok(ProbeAdmission::Send {
                origin_url: entry.origin_url.clone(),
            })
        })
    }
}
