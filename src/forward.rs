//! Forwarding one webhook to its owner's origin: the stored raw body and
//! Telnyx headers, a fresh `Callfence-Assertion`, no redirects followed,
//! within the forward budget. Used by the Worker (first attempts) and by
//! the Dispatcher's alarm (re-drives).

use crate::config::EdgeKey;
use callfence_core::assertion;
use callfence_core::engine::{Forward, ReportedAnswer};
use callfence_core::outcome::truncate_body;
use futures_util::future::{select, Either};
use std::time::Duration;
use worker::{
    AbortController, Delay, Fetch, Headers, Method, Request, RequestInit, RequestRedirect,
};

/// The headers stored with an event that travel with it (lowercase).
pub const CARRIED_HEADERS: [&str; 3] = [
    "content-type",
    "telnyx-signature-ed25519",
    "telnyx-timestamp",
];

/// Sends `forward` and classifies nothing: it returns what the origin did
/// (an HTTP answer, a timeout, or a network error) for the engine to judge.
pub async fn send(
    forward: &Forward,
    edge: &EdgeKey,
    budget_ms: i64,
    now_ms: i64,
) -> ReportedAnswer {
    send_timed(forward, edge, budget_ms, now_ms).await.0
}

/// [`send`], also returning the milliseconds spent awaiting the origin (its
/// answer and body), as opposed to building and signing the request.
pub async fn send_timed(
    forward: &Forward,
    edge: &EdgeKey,
    budget_ms: i64,
    now_ms: i64,
) -> (ReportedAnswer, i64) {
    let Ok(request) = build(forward, edge, now_ms) else {
        return (ReportedAnswer::NetworkError, 0);
    };
    let awaiting = crate::clock::now_ms();
    let controller = AbortController::default();
    let signal = controller.signal();
    let fetch = Fetch::Request(request);
    let sending = Box::pin(fetch.send_with_signal(&signal));
    let budget = Duration::from_millis(budget_ms.max(1) as u64);
    let deadline = Box::pin(Delay::from(budget));
    let answer = match select(sending, deadline).await {
        Either::Left((Ok(mut response), deadline)) => {
            let status = response.status_code();
            match select(Box::pin(response.text()), deadline).await {
                Either::Left((Ok(body), _)) => ReportedAnswer::Http {
                    status,
                    body: truncate_body(&body),
                },
                Either::Left((Err(_), _)) => ReportedAnswer::Http {
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
    let headers = Headers::new();
    for (name, value) in &forward.headers {
        if CARRIED_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
            headers.set(name, value)?;
        }
    }
    headers.set(
        "Callfence-Assertion",
        &assertion::mint(&edge.kid, &edge.signing, &claims),
    )?;
    let mut init = RequestInit::new();
    init.with_method(Method::Post)
        .with_headers(headers)
        .with_body(Some(forward.body.clone().into()))
        .with_redirect(RequestRedirect::Manual);
    Request::new_with_init(&forward.origin_url, &init)
}
