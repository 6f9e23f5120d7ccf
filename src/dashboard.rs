//! The panel at `GET /` (SPEC §15): one page whose script calls the bearer
//! routes (`/v1/status`, `/v1/policy`, `/v1/decisions`, `/v1/routing/preview`,
//! and with an admin token `/v1/nodes`) with a token the user types in. The
//! token is kept in memory only (never stored, never in a URL).
//!
//! The page is assembled from `dashboard.html`, `dashboard.css` and
//! `dashboard.js` once, and served with a content security policy that admits
//! exactly that style and that script by their SHA-256: no other script, no
//! inline handler, no third-party code, no images, no framing.

use base64::Engine as _;
use sha2::{Digest, Sha256};
use std::sync::OnceLock;
use worker::{Headers, Response};

const HTML: &str = include_str!("dashboard.html");
const STYLE: &str = include_str!("dashboard.css");
const SCRIPT: &str = include_str!("dashboard.js");

/// The assembled page and its content security policy.
struct Page {
    html: String,
    csp: String,
}

fn csp_hash(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    format!(
        "'sha256-{}'",
        base64::engine::general_purpose::STANDARD.encode(digest)
    )
}

fn assemble() -> Page {
    Page {
        html: HTML
            .replacen("/*STYLE*/", STYLE, 1)
            .replacen("/*SCRIPT*/", SCRIPT, 1),
        csp: format!(
            "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; \
             img-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
            csp_hash(SCRIPT),
            csp_hash(STYLE)
        ),
    }
}

fn assembled() -> &'static Page {
    static PAGE: OnceLock<Page> = OnceLock::new();
    PAGE.get_or_init(assemble)
}

/// The page, with its strict content security policy.
pub fn page() -> worker::Result<Response> {
    let page = assembled();
    let headers = Headers::new();
    headers.set("Content-Type", "text/html; charset=utf-8")?;
    headers.set("Cache-Control", "no-store")?;
    headers.set("Content-Security-Policy", &page.csp)?;
    headers.set("Referrer-Policy", "no-referrer")?;
    headers.set("X-Content-Type-Options", "nosniff")?;
    Ok(Response::ok(page.html.clone())?.with_headers(headers))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_admits_exactly_the_inline_style_and_script() {
        let page = assemble();
        assert!(!page.html.contains("/*STYLE*/") && !page.html.contains("/*SCRIPT*/"));
        assert!(page.html.contains(SCRIPT) && page.html.contains(STYLE));
        assert!(page.csp.contains(&csp_hash(SCRIPT)));
        assert!(page.csp.contains(&csp_hash(STYLE)));
        assert!(!page.csp.contains("unsafe-inline"));
    }

    #[test]
    fn the_script_never_writes_markup() {
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
        ] {
            assert!(!SCRIPT.contains(sink), "dashboard.js uses {sink}");
        }
    }
}
