//! Serving HTTP/1 with bounds, for both listeners (SPEC §11): slow clients
//! on the public origin must not starve the local API, the ledger or the
//! heartbeats.
//!
//! - **Open connections**: each listener takes a connection only while it
//!   holds one of its slots ([`serve`]'s `max_connections`); past that,
//!   new connections wait in the kernel's backlog and cost the agent no
//!   descriptor.
//! - **Read time**: a request's headers must arrive within the read timeout
//!   (hyper's header timeout, which also closes an idle keep-alive
//!   connection), and then its whole body within the same time again
//!   ([`read_body_within`]: 408 `{"error":"request_timeout"}`, and the
//!   connection is closed). A body over the route's limit is 413
//!   `{"error":"body_too_large"}`.
//! - **Descriptors**: [`check_descriptor_budget`] refuses to start an agent
//!   whose open-file limit cannot hold the origin's connections, each with
//!   one connection to the app behind it, plus [`RESERVED_DESCRIPTORS`].

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use http_body_util::BodyExt as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use crate::AgentError;

/// The local API's bound on open connections (the voice app and probes).
pub const LOCAL_MAX_CONNECTIONS: usize = 64;

/// The metrics listener's bound on open connections (a Prometheus or two;
/// `listen.metrics_listen`).
pub const METRICS_MAX_CONNECTIONS: usize = 4;

/// Descriptors kept out of the origin's reach: the local API's
/// connections, the control socket, the ledger, the edge and Telnyx
/// clients, the listeners, the metrics listener's
/// [`METRICS_MAX_CONNECTIONS`] and the runtime's own.
pub const RESERVED_DESCRIPTORS: u64 = LOCAL_MAX_CONNECTIONS as u64 + 128;

/// Serves `router` on `listener` until `stop` turns true, with at most
/// `max_connections` open connections and `read_timeout` for each
/// request's headers; then lets the open connections finish their request.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    max_connections: usize,
    read_timeout: Duration,
    stop: watch::Receiver<bool>,
    what: &'static str,
) {
    let slots = Arc::new(Semaphore::new(max_connections));
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1
        .timer(TokioTimer::new())
        .header_read_timeout(read_timeout);
    let mut last_warned: Option<tokio::time::Instant> = None;
    loop {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
            _ = stopped(stop.clone()) => break,
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopped(stop.clone()) => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors despite the budget, or a connection
                // reset before it was taken: say so now and then, go on.
                if last_warned.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                    crate::log::warn(
                        "accept_failed",
                        json!({"listener": what, "error": e.to_string()}),
                    );
                    last_warned = Some(tokio::time::Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let conn = http1.serve_connection(
            TokioIo::new(stream),
            TowerToHyperService::new(router.clone()),
        );
        let stop = stop.clone();
        tokio::spawn(async move {
            let _slot = slot;
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => return,
                _ = stopped(stop) => conn.as_mut().graceful_shutdown(),
            }
            let _ = conn.await;
        });
    }
    // Every slot back: every connection has finished.
    let all = u32::try_from(max_connections).unwrap_or(u32::MAX);
    let _ = slots.acquire_many(all).await;
}

/// Resolves once `rx` turns true (or its sender is gone).
pub(crate) async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

fn refusal(status: StatusCode, code: &str) -> Response {
    let mut resp = (status, Json(json!({"error": code}))).into_response();
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// Reads each request's whole body (at most `limit` bytes) within
/// `timeout` before the routes of `router` see it.
pub fn read_body_within(router: Router, limit: usize, timeout: Duration) -> Router {
    router.layer(middleware::from_fn(move |req: Request, next: Next| {
        read_whole_body(req, next, limit, timeout)
    }))
}

async fn read_whole_body(req: Request, next: Next, limit: usize, timeout: Duration) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return refusal(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large");
    }
    let (parts, mut body) = req.into_parts();
    let read = async {
        let mut bytes = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|_| StatusCode::BAD_REQUEST)?;
            if let Some(data) = frame.data_ref() {
                if bytes.len() + data.len() > limit {
                    return Err(StatusCode::PAYLOAD_TOO_LARGE);
                }
                bytes.extend_from_slice(data);
            }
        }
        Ok(bytes)
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(Ok(bytes)) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Ok(Err(StatusCode::PAYLOAD_TOO_LARGE)) => {
            refusal(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large")
        }
        Ok(Err(status)) => refusal(status, "body_unreadable"),
        Err(_) => refusal(StatusCode::REQUEST_TIMEOUT, "request_timeout"),
    }
}

/// The soft limit on open files of this process (`/proc/self/limits`),
/// `u64::MAX` when unlimited.
pub fn open_file_limit() -> Result<u64, AgentError> {
    let text = std::fs::read_to_string("/proc/self/limits")
        .map_err(|e| AgentError::new(format!("cannot read /proc/self/limits: {e}")))?;
    parse_open_file_limit(&text)
        .ok_or_else(|| AgentError::new("/proc/self/limits has no readable \"Max open files\""))
}

fn parse_open_file_limit(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    match line["Max open files".len()..].split_whitespace().next()? {
        "unlimited" => Some(u64::MAX),
        soft => soft.parse().ok(),
    }
}

/// Refuses an origin bound that, with one app connection behind each of
/// its connections and [`RESERVED_DESCRIPTORS`], does not fit under the
/// open-file limit `soft`.
pub fn check_descriptor_budget(max_connections: usize, soft: u64) -> Result<(), AgentError> {
    let needed = (max_connections as u64)
        .saturating_mul(2)
        .saturating_add(RESERVED_DESCRIPTORS);
    if needed > soft {
        return Err(AgentError::new(format!(
            "listen.max_connections = {max_connections} needs {needed} open files (2 per origin connection + {RESERVED_DESCRIPTORS} reserved) but the limit is {soft}: raise LimitNOFILE= (ulimit -n) or lower max_connections to at most {}",
            soft.saturating_sub(RESERVED_DESCRIPTORS) / 2
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_open_file_limit_is_read() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max processes             63704                63704                processes \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(parse_open_file_limit(limits), Some(1024));
        let unlimited = limits.replace(
            "1024                 524288",
            "unlimited            unlimited",
        );
        assert_eq!(parse_open_file_limit(&unlimited), Some(u64::MAX));
        assert_eq!(parse_open_file_limit("Max processes 5\n"), None);
        assert!(open_file_limit().unwrap() > 0);
    }

    #[test]
    fn the_origin_bound_must_leave_the_reserve() {
        check_descriptor_budget(256, 1024).unwrap();
        check_descriptor_budget(416, 1024).unwrap();
        let e = check_descriptor_budget(417, 1024).unwrap_err();
        assert!(e.0.contains("at most 416"), "{e}");
        assert!(check_descriptor_budget(1, 100).is_err());
    }
}
