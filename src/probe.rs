//! `POST /v1/nodes/probe` (SPEC §14), after the node signature check: the
//! nonce is checked ([`callfence_core::probe::parse_request`]), the
//! Dispatcher admits the probe under the per-node rate limit and names the
//! node's registered `origin_url`, the probe goes out through the webhook
//! forward code ([`crate::forward::send_probe`]), and the origin's answer is
//! judged by [`callfence_core::probe::evaluate`]. Nothing about the probe is
//! stored: no call, event or decision.

use crate::config::{Capability, Config};
use crate::protocol::{self, ProbeTarget, Reply, Request};
use crate::reply::{Answer, ApiError};
use callfence_core::probe::{evaluate, parse_request};
use serde_json::Value;
use worker::Env;

/// The forward budget when the ingress capability (which holds
/// `FORWARD_TIMEOUT_MS`) is not configured.
const DEFAULT_BUDGET_MS: u32 = 1_500;

/// Runs one probe for `node` (signed with key `kid`).
pub async fn handle(env: &Env, node: &str, kid: &str, body: &[u8]) -> Result<Answer, ApiError> {
    let nonce = parse_request(body).map_err(|e| ApiError(e.into()))?;
    let config = Config::get(env);
    let edge = &config
        .node_routes
        .as_ref()
        .map_err(|_| ApiError::misconfigured(Capability::NodeRoutes.as_str()))?
        .edge;
    let budget = config
        .ingress
        .as_ref()
        .map_or(DEFAULT_BUDGET_MS, |i| i.forward_timeout_ms);
    let request = Request::Probe {
        node: node.to_owned(),
        kid: kid.to_owned(),
    };
    let origin_url = match protocol::call::<ProbeTarget>(env, &request, b"").await {
        Ok(Reply::Done(target)) => target.origin_url,
        Ok(Reply::Refused(refused)) => return Ok(Answer::refused(refused)),
        Err(_) => return Err(ApiError::dispatcher_unavailable()),
    };
    let sent_at = crate::clock::now_ms();
    let (answer, latency_ms) =
        crate::forward::send_probe(node, &origin_url, &nonce, edge, i64::from(budget), sent_at)
            .await;
    let verdict = evaluate(&nonce, &answer, latency_ms);
    Ok(Answer::ok(
        serde_json::to_value(verdict).unwrap_or(Value::Null),
    ))
}
