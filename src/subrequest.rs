//! The Worker's outgoing `POST` requests (a forward, a probe, a message to
//! the Dispatcher), built on the runtime's `RequestInit` directly.
//!
//! `worker::Request::new_with_init` converts its own `RequestInit`, whose
//! Cloudflare `cf` options (image resizing, caching, ...) bring their
//! serialiser into the wasm even when none is set: about 12 KB of code and
//! its strings for a request callfence never gives a `cf` option.

use worker::wasm_bindgen::JsValue;
use worker::{web_sys, Headers, Request};

/// Whether a redirect answer is followed or returned as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redirects {
    /// Followed (the runtime's default).
    Follow,
    /// Returned to the caller as the answer (a forward never follows one).
    Manual,
}

/// A `POST` of `body` to `url`, with `headers` when given.
pub fn post(
    url: &str,
    headers: Option<&Headers>,
    body: &JsValue,
    redirects: Redirects,
) -> worker::Result<Request> {
    let init = web_sys::RequestInit::new();
    init.set_method("POST");
    if let Some(headers) = headers {
        init.set_headers(&headers.0);
    }
    init.set_body(body);
    init.set_redirect(match redirects {
        Redirects::Follow => web_sys::RequestRedirect::Follow,
        Redirects::Manual => web_sys::RequestRedirect::Manual,
    });
    web_sys::Request::new_with_str_and_init(url, &init)
        .map(Request::from)
        .map_err(|e| {
            worker::Error::JsError(
                e.as_string()
                    .unwrap_or_else(|| "invalid URL or options for Request".to_owned()),
            )
        })
}
