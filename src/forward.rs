//! Forwarding one webhook to its owner's origin: the stored raw body and
//! Telnyx headers, a fresh `Callfence-Assertion`, no redirects followed,
//! within the forward budget. Used by the Dispatcher (each forward, and the
//! alarm's re-drives), by the Worker when a version 1 Dispatcher hands it
//! the forward, and for the L5 probe (SPEC §14: [`send_probe`], the same
//! request and exchange with a probe body and a probe assertion).

use crate::config::EdgeKey;
use crate::subrequest::{body_bytes, post, Redirects};
use callfence_core::assertion;
use callfence_core::engine::{Forward, ReportedAnswer};
use callfence_core::outcome::truncate_body;
use futures_util::future::{select, Either};
use std::time::Duration;
use worker::{AbortController, Delay, Fetch, Headers, Request};

/// The headers stored with an event that travel with it (lowercase).
pub const CARRIED_HEADERS: [&str; 3] = [
    "content-type",
    "telnyx-signature-ed25519",
    "telnyx-timestamp",
];

/// Sends `forward` and classifies nothing: it returns what the origin did
/// (an HTTP answer, a timeout, or a network error) for the engine to judge,
/// and the milliseconds spent awaiting the origin (its answer and body), as
/// opposed to building and signing the request.
pub async fn send_timed(
    forward: &Forward,
    edge: &EdgeKey,
    budget_ms: i64,
    now_ms: i64,
) -> (ReportedAnswer, i64) {
    let Ok(request) = build(forward, edge, now_ms) else {
        return (ReportedAnswer::NetworkError, 0);
    };
    exchange(request, budget_ms).await
}

/// Sends the L5 probe with `nonce` to `node`'s registered `origin_url`:
/// the probe body, `content-type: application/json` and a probe assertion,
/// through the same exchange as a webhook. Returns the origin's answer and
/// the milliseconds spent awaiting it.
pub async fn send_probe(
    node: &str,
    origin_url: &str,
    nonce: &str,
    edge: &EdgeKey,
    budget_ms: i64,
    now_ms: i64,
) -> (ReportedAnswer, i64) {
    let body = callfence_core::probe::body(node, nonce);
    let claims = assertion::probe_claims_for(node, nonce, body.as_bytes(), now_ms);
    let headers = [("content-type".to_string(), "application/json".to_string())];
    let token = assertion::mint(&edge.kid, &edge.signing, &claims);
    let Ok(request) = request(origin_url, &headers, body, &token) else {
        return (ReportedAnswer::NetworkError, 0);
    };
    exchange(request, budget_ms).await
}

/// Awaits the origin's answer (status and body) within `budget_ms`.
async fn exchange(request: Request, budget_ms: i64) -> (ReportedAnswer, i64) {
    let awaiting = crate::clock::now_ms();
    let controller = AbortController::default();
    let signal = controller.signal();
    let fetch = Fetch::Request(request);
    let sending = Box::pin(fetch.send_with_signal(&signal));
    let budget = Duration::from_millis(budget_ms.max(1) as u64);
    let deadline = Box::pin(Delay::from(budget));
    let answer = match select(sending, deadline).await {
        Either::Left((Ok(response), deadline)) => {
            let status = response.status_code();
            let text = async { String::from_utf8(body_bytes(response).await.ok()?).ok() };
            match select(Box::pin(text), deadline).await {
                Either::Left((Some(body), _)) => ReportedAnswer::Http {
                    status,
                    body: truncate_body(&body),
                },
                Either::Left((None, _)) => ReportedAnswer::Http {
                    status,
                    body: String::new(),
                },
                Either::Right(_) => {
                    controller.abort();
                    ReportedAnswer::Http {
                        status,
                        body: String::new(),
                    }
                }
            }
        }
        Either::Left((Err(_), _)) => ReportedAnswer::NetworkError,
        Either::Right(_) => {
            controller.abort();
            ReportedAnswer::Timeout
        }
    };
    (answer, crate::clock::now_ms() - awaiting)
}

fn build(forward: &Forward, edge: &EdgeKey, now_ms: i64) -> worker::Result<Request> {
    let claims = assertion::claims_for(
        &forward.node,
        &forward.call_session_id,
        forward.call_control_id.as_deref(),
        &forward.event_id,
        forward.epoch,
        forward.attempt,
        forward.body.as_bytes(),
        now_ms,
    );
    let token = assertion::mint(&edge.kid, &edge.signing, &claims);
    request(
        &forward.origin_url,
        &forward.headers,
        forward.body.clone(),
        &token,
    )
}

/// A POST of `body` to `url` with the carried `headers`, the assertion
/// `token`, and redirects not followed.
fn request(
    url: &str,
    headers: &[(String, String)],
    body: String,
    token: &str,
) -> worker::Result<Request> {
    let carried = Headers::new();
    for (name, value) in headers {
        if CARRIED_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
            carried.set(name, value)?;
        }
    }
    carried.set(assertion::HEADER, token)?;
    post(url, Some(&carried), &body.into(), Redirects::Manual)
}
