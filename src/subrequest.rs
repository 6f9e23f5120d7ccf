//! The Worker's outgoing `POST` requests (a forward, a probe, a message to
//! the Dispatcher), built on the runtime's `RequestInit` directly, and the
//! reading of their answers' bodies.
//!
//! `worker::Request::new_with_init` converts its own `RequestInit`, whose
//! Cloudflare `cf` options (image resizing, caching, ...) bring their
//! serialiser into the wasm even when none is set: about 12 KB of code and
//! its strings for a request callfence never gives a `cf` option.
//!
//! An answer's body is read with the runtime's own `arrayBuffer()`
//! ([`body_bytes`]): one promise, the reading done in the runtime.
//! `worker::Response::bytes` reads it in the wasm instead, through a stream
//! reader, with a promise and a crossing per chunk and one more for the end.

use worker::wasm_bindgen::JsValue;
use worker::wasm_bindgen_futures::JsFuture;
use worker::{js_sys, web_sys, Headers, Request, Response};

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
        .map_err(|e| js_error(e, "invalid URL or options for Request"))
}

/// The whole body of `response`, read by the runtime.
pub async fn body_bytes(response: Response) -> worker::Result<Vec<u8>> {
    let raw = web_sys::Response::from(response);
    let unreadable = |e| js_error(e, "the body could not be read");
    let buffer = JsFuture::from(raw.array_buffer().map_err(unreadable)?)
        .await
        .map_err(unreadable)?;
    Ok(js_sys::Uint8Array::new(&buffer).to_vec())
}

/// The runtime's error as a `worker::Error`: its message when it is a
/// string, else `fallback`.
fn js_error(e: JsValue, fallback: &str) -> worker::Error {
    worker::Error::JsError(e.as_string().unwrap_or_else(|| fallback.to_owned()))
}
