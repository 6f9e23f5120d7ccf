//! HTTP client plumbing shared by every outgoing request: one client that
//! never follows redirects (a 3xx is an answer, not an instruction), and body
//! reads bounded in size.

use std::time::Duration;

use crate::AgentError;

/// The one client of the process (rustls, no redirects, no proxies from the
/// environment).
pub fn client() -> Result<reqwest::Client, AgentError> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .connect_timeout(Duration::from_secs(5))
        .user_agent(concat!("callfence-agent/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| AgentError::new(format!("http client: {e}")))
}

/// Reads at most `limit` bytes of a response body; a longer body is an error.
pub async fn read_limited(mut resp: reqwest::Response, limit: usize) -> Result<Vec<u8>, String> {
    if resp.content_length().is_some_and(|n| n > limit as u64) {
        return Err(format!("response body over {limit} bytes"));
    }
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| describe(&e))? {
        if out.len() + chunk.len() > limit {
            return Err(format!("response body over {limit} bytes"));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// A short description of a transport failure that names no URL query or
/// header (a reqwest error's Display can include the URL).
pub fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timeout".into()
    } else if e.is_connect() {
        "connect_failed".into()
    } else if e.is_body() || e.is_decode() {
        "bad_body".into()
    } else if e.is_request() {
        "request_failed".into()
    } else {
        "transport_error".into()
    }
}
