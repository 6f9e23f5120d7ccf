//! HTTP replies: JSON bodies, the error shape `{"error":"<code>", ...}` with
//! its status, and request bodies read within a route's size limit.
//!
//! Every status the Worker answers with is chosen here or in the route
//! table, so the mapping from stable codes to HTTP lives in one place.

use crate::protocol::{strip_envelope, Refused, Reply, Unavailable, View};
use callfence_core::refusal::Refusal;
use futures_util::StreamExt;
use serde_json::{json, Value};
use worker::{Headers, Request, Response};

/// An error answer: one [`Refusal`], whose code, status, fields and
/// `Retry-After` core decides; [`Answer::refusal`] adds the headers only the
/// Worker's HTTP knows.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError(pub Refusal);

impl From<Refusal> for ApiError {
    fn from(refusal: Refusal) -> Self {
        Self(refusal)
    }
}

impl ApiError {
    /// 404 `not_found`.
    pub fn not_found() -> Self {
        Self(Refusal::NotFound)
    }

    /// 405 `method_not_allowed`, with the `Allow` header.
    pub fn method_not_allowed(allow: &[&'static str]) -> Self {
        Self(Refusal::MethodNotAllowed(allow.to_vec()))
    }

    /// 413 `payload_too_large`, naming the limit.
    pub fn payload_too_large(limit: usize) -> Self {
        Self(Refusal::PayloadTooLarge(limit))
    }

    /// 503 `misconfigured` for a capability.
    pub fn misconfigured(capability: &'static str) -> Self {
        Self(Refusal::Misconfigured(capability))
    }

    /// 503 `dispatcher_unavailable`: the Dispatcher did not give its own
    /// well-formed answer. Nothing was forwarded.
    pub fn dispatcher_unavailable() -> Self {
        Self(Refusal::DispatcherUnavailable)
    }

    /// 401 `unauthorized` (with `WWW-Authenticate: Bearer`) or 403 `forbidden`.
    pub fn auth(error: crate::auth::AuthError) -> Self {
        Self(match error {
            crate::auth::AuthError::Unauthorized => Refusal::Unauthorized,
            crate::auth::AuthError::Forbidden => Refusal::Forbidden,
        })
    }

    /// The stable code.
    pub fn code(&self) -> &'static str {
        self.0.code()
    }

    /// The HTTP response.
    pub fn into_response(self) -> worker::Result<Response> {
        Answer::refusal(&self.0).into_response()
    }
}

/// A JSON response with `status`, never cached.
pub fn json(status: u16, body: &Value) -> worker::Result<Response> {
    let headers = Headers::new();
    headers.set("Content-Type", "application/json")?;
    headers.set("Cache-Control", "no-store")?;
    Ok(Response::from_bytes(serde_json::to_vec(body)?)?
        .with_status(status)
        .with_headers(headers))
}

/// A successful or relayed answer: status, JSON body, extra headers.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// The JSON body.
    pub body: Value,
    /// Extra headers (`ETag`, `Retry-After`).
    pub headers: Vec<(&'static str, String)>,
}

impl Answer {
    /// 200 with `body`.
    pub fn ok(body: Value) -> Self {
        Self {
            status: 200,
            body,
            headers: Vec::new(),
        }
    }

    /// A refusal as HTTP: the one place a [`Refusal`] becomes a response.
    /// Core decides its status, body and `Retry-After`; the headers below
    /// are the Worker's. (`Refusal` is `#[non_exhaustive]`, so the `match`
    /// ends in a catch-all: every other refusal carries no header of its
    /// own.)
    pub fn refusal(refusal: &Refusal) -> Self {
        let mut answer = Self {
            status: refusal.status(),
            body: refusal.body(),
            headers: Vec::new(),
        };
        if let Some(seconds) = refusal.retry_after_s() {
            answer = answer.header("Retry-After", seconds.to_string());
        }
        match refusal {
            Refusal::Unauthorized => answer.header("WWW-Authenticate", "Bearer"),
            Refusal::MethodNotAllowed(allow) => answer.header("Allow", allow.join(", ")),
            _ => answer,
        }
    }

    /// A Dispatcher refusal as it chose it: status, body and `Retry-After`.
    pub fn refused(refused: Refused) -> Self {
        let answer = Self {
            status: refused.status,
            body: Value::Object(refused.body),
            headers: Vec::new(),
        };
        match refused.retry_after_s {
            Some(seconds) => answer.header("Retry-After", seconds.to_string()),
            None => answer,
        }
    }

    /// Adds a header.
    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    /// The HTTP response.
    pub fn into_response(self) -> worker::Result<Response> {
        let response = json(self.status, &self.body)?;
        for (name, value) in &self.headers {
            response.headers().set(name, value)?;
        }
        Ok(response)
    }
}

/// The Worker's answer for a relayed Dispatcher reply: its result with 200,
/// its refusal with the status it chose, or 503 `dispatcher_unavailable`.
pub fn relay(reply: Result<Reply<View>, Unavailable>) -> Result<Answer, ApiError> {
    match reply {
        Ok(Reply::Done(view)) => Ok(Answer::ok(Value::Object(strip_envelope(view)))),
        Ok(Reply::Refused(refused)) => Ok(Answer::refused(refused)),
        Err(_) => Err(ApiError::dispatcher_unavailable()),
    }
}

/// The most bytes read (and dropped) from a body over its route's limit
/// before answering 413. workerd resets a keep-alive connection whose request
/// body was left unread past 64 KiB, so the client's next request on it would
/// fail; a connection whose body was read to its end stays usable. A body
/// longer than this is refused without being read further (its connection is
/// then lost: no honest client sends one).
pub const MAX_DRAIN_BYTES: u64 = 2 * 1024 * 1024;

/// Reads a request body of at most `limit` bytes. A body over the limit
/// (declared by `Content-Length` or found while reading) is 413
/// `payload_too_large`, after the rest of it is read and dropped up to
/// [`MAX_DRAIN_BYTES`] so the connection can carry the client's next request.
/// A body within its declared length is read whole; one without a declared
/// length is read in chunks and never held beyond the limit.
pub async fn read_body(req: &mut Request, limit: usize) -> Result<Vec<u8>, ApiError> {
    let declared = req
        .headers()
        .get("Content-Length")
        .ok()
        .flatten()
        .and_then(|text| text.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n <= limit as u64) {
        let body = req.bytes().await.map_err(|_| ApiError(Refusal::BadBody))?;
        check_length(Some(body.len() as u64), limit)?;
        return Ok(body);
    }
    if declared.is_some_and(|n| n > MAX_DRAIN_BYTES) || req.inner().body().is_none() {
        check_length(declared, limit)?;
        return Ok(Vec::new());
    }
    let mut stream = req.stream().map_err(|_| ApiError(Refusal::BadBody))?;
    let mut body = Vec::new();
    let mut seen: u64 = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| ApiError(Refusal::BadBody))?;
        seen = seen.saturating_add(chunk.len() as u64);
        if seen <= limit as u64 {
            body.extend_from_slice(&chunk);
        } else if seen > MAX_DRAIN_BYTES {
            break;
        }
    }
    check_length(Some(seen), limit)?;
    Ok(body)
}

/// 413 when `length` is known and over `limit`.
fn check_length(length: Option<u64>, limit: usize) -> Result<(), ApiError> {
    match length {
        Some(length) if length > limit as u64 => Err(ApiError::payload_too_large(limit)),
        _ => Ok(()),
    }
}

/// `{"status": ...}` of the health probes.
pub fn status_body(ok: bool) -> Value {
    json!({ "status": if ok { "ok" } else { "degraded" } })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_answers_its_status_body_and_headers() {
        let answer = Answer::refusal(&Refusal::Misconfigured("ingress"));
        assert_eq!(answer.status, 503);
        assert_eq!(
            answer.body,
            json!({"error": "misconfigured", "capability": "ingress"})
        );
        assert_eq!(
            Answer::refusal(&Refusal::MethodNotAllowed(vec!["GET", "PUT"])).headers,
            [("Allow", "GET, PUT".to_owned())]
        );
        assert_eq!(
            Answer::refusal(&Refusal::DispatcherUnavailable).headers,
            [("Retry-After", "1".to_owned())]
        );
        let unauthorized = Answer::refusal(&Refusal::Unauthorized);
        assert_eq!(
            (unauthorized.status, unauthorized.headers),
            (401, vec![("WWW-Authenticate", "Bearer".to_owned())])
        );
        assert_eq!(Answer::refusal(&Refusal::Forbidden).status, 403);
    }

    #[test]
    fn lengths_over_the_limit_are_refused() {
        assert!(check_length(None, 10).is_ok());
        assert!(check_length(Some(10), 10).is_ok());
        assert_eq!(check_length(Some(11), 10).unwrap_err().0.status(), 413);
    }

    #[test]
    fn health_status_bodies() {
        assert_eq!(status_body(true), json!({"status": "ok"}));
        assert_eq!(status_body(false), json!({"status": "degraded"}));
    }
}
