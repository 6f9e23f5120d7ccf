//! HTTP replies: JSON bodies, the error shape `{"error":"<code>", ...}` with
//! its status, and request bodies read within a route's size limit.
//!
//! Every status the Worker answers with is chosen here or in the route
//! table, so the mapping from stable codes to HTTP lives in one place.

use crate::protocol::{strip_envelope, Refused, Reply, Unavailable, View};
use futures_util::StreamExt;
use serde_json::{json, Map, Value};
use worker::{Headers, Request, Response};

/// An error answer: status, stable code, extra fields and headers.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: u16,
    /// The stable code, sent as `error`.
    pub code: &'static str,
    /// More fields of the body (for example `capability`).
    pub fields: Map<String, Value>,
    /// Extra response headers (`Retry-After`, `Allow`, `WWW-Authenticate`).
    pub headers: Vec<(&'static str, String)>,
}

impl ApiError {
    /// An error with `status` and `code` and nothing else.
    pub fn new(status: u16, code: &'static str) -> Self {
        Self {
            status,
            code,
            fields: Map::new(),
            headers: Vec::new(),
        }
    }

    /// Adds a body field.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.fields.insert(key.to_owned(), value.into());
        self
    }

    /// Adds a response header.
    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    /// Adds `Retry-After` (seconds).
    pub fn retry_after(self, seconds: u32) -> Self {
        self.header("Retry-After", seconds.to_string())
    }

    /// 404 `not_found`.
    pub fn not_found() -> Self {
        Self::new(404, "not_found")
    }

    /// 405 `method_not_allowed`, with the `Allow` header.
    pub fn method_not_allowed(allow: &[&str]) -> Self {
        Self::new(405, "method_not_allowed").header("Allow", allow.join(", "))
    }

    /// 413 `payload_too_large`, naming the limit.
    pub fn payload_too_large(limit: usize) -> Self {
        Self::new(413, "payload_too_large").with("limit_bytes", limit)
    }

    /// 503 `misconfigured` for a capability.
    pub fn misconfigured(capability: &'static str) -> Self {
        Self::new(503, "misconfigured").with("capability", capability)
    }

    /// 503 `dispatcher_unavailable`: the Dispatcher did not give its own
    /// well-formed answer. Nothing was forwarded.
    pub fn dispatcher_unavailable() -> Self {
        Self::new(503, "dispatcher_unavailable").retry_after(1)
    }

    /// 401 `unauthorized` (with `WWW-Authenticate: Bearer`) or 403 `forbidden`.
    pub fn auth(error: crate::auth::AuthError) -> Self {
        match error {
            crate::auth::AuthError::Unauthorized => {
                Self::new(401, error.code()).header("WWW-Authenticate", "Bearer")
            }
            crate::auth::AuthError::Forbidden => Self::new(403, error.code()),
        }
    }

    /// The body: `{"error": code, ...fields}`.
    pub fn body(&self) -> Value {
        let mut body = Map::with_capacity(self.fields.len() + 1);
        body.insert("error".into(), Value::from(self.code));
        body.extend(self.fields.clone());
        Value::Object(body)
    }

    /// The HTTP response.
    pub fn into_response(self) -> worker::Result<Response> {
        let response = json(self.status, &self.body())?;
        for (name, value) in &self.headers {
            response.headers().set(name, value)?;
        }
        Ok(response)
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

    /// A refusal the Worker gives on the Dispatcher's behalf.
    pub fn refusal(refusal: &crate::refusal::Refusal) -> Self {
        let answer = Self {
            status: refusal.status(),
            body: refusal.body(),
            headers: Vec::new(),
        };
        match refusal.retry_after_s() {
            Some(seconds) => answer.header("Retry-After", seconds.to_string()),
            None => answer,
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
        let body = req
            .bytes()
            .await
            .map_err(|_| ApiError::new(400, "bad_body"))?;
        check_length(Some(body.len() as u64), limit)?;
        return Ok(body);
    }
    if declared.is_some_and(|n| n > MAX_DRAIN_BYTES) || req.inner().body().is_none() {
        check_length(declared, limit)?;
        return Ok(Vec::new());
    }
    let mut stream = req.stream().map_err(|_| ApiError::new(400, "bad_body"))?;
    let mut body = Vec::new();
    let mut seen: u64 = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| ApiError::new(400, "bad_body"))?;
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
    fn error_bodies_carry_the_code_first_then_fields() {
        let error = ApiError::misconfigured("ingress");
        assert_eq!(error.status, 503);
        assert_eq!(
            error.body(),
            json!({"error": "misconfigured", "capability": "ingress"})
        );
        assert_eq!(
            ApiError::payload_too_large(4096).body(),
            json!({"error": "payload_too_large", "limit_bytes": 4096})
        );
    }

    #[test]
    fn helpers_set_their_headers() {
        assert_eq!(
            ApiError::method_not_allowed(&["GET", "PUT"]).headers,
            [("Allow", "GET, PUT".to_owned())]
        );
        assert_eq!(
            ApiError::dispatcher_unavailable().headers,
            [("Retry-After", "1".to_owned())]
        );
        let unauthorized = ApiError::auth(crate::auth::AuthError::Unauthorized);
        assert_eq!(
            (unauthorized.status, unauthorized.code),
            (401, "unauthorized")
        );
        let forbidden = ApiError::auth(crate::auth::AuthError::Forbidden);
        assert_eq!((forbidden.status, forbidden.code), (403, "forbidden"));
    }

    #[test]
    fn lengths_over_the_limit_are_refused() {
        assert!(check_length(None, 10).is_ok());
        assert!(check_length(Some(10), 10).is_ok());
        assert_eq!(check_length(Some(11), 10).unwrap_err().status, 413);
    }

    #[test]
    fn health_status_bodies() {
        assert_eq!(status_body(true), json!({"status": "ok"}));
        assert_eq!(status_body(false), json!({"status": "degraded"}));
    }
}
