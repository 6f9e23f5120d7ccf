//! The read-only dashboard at `GET /`: one static page whose scripts call
//! `/v1/status` and `/v1/decisions` with a bearer token the operator types
//! in. The token is kept in memory only (never stored, never in a URL).

use worker::{Headers, Response};

const PAGE: &str = include_str!("dashboard.html");

/// The page, with a strict content security policy: no third-party code, no
/// inline handlers beyond the page's own script.
pub fn page() -> worker::Result<Response> {
    let headers = Headers::new();
    headers.set("Content-Type", "text/html; charset=utf-8")?;
    headers.set("Cache-Control", "no-store")?;
    headers.set(
        "Content-Security-Policy",
        "default-src 'none'; script-src 'self' 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'",
    )?;
    headers.set("Referrer-Policy", "no-referrer")?;
    Ok(Response::ok(PAGE)?.with_headers(headers))
}
