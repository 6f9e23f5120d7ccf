//! Who may call the local API (SPEC §11, v1.4). A loopback port is not a
//! boundary: a web page in a browser on the node, or any local process,
//! can reach it. So every request passes [`guard`]:
//!
//! 1. a request carrying an `Origin` header (a browser's cross-origin
//!    request), one whose `Host` is not exactly the listener's own address
//!    and port (a DNS-rebinding page names its own host), or a POST whose
//!    `Content-Type` is not `application/json` (a browser's "simple"
//!    request needs no preflight for `text/plain`) is refused with 403
//!    `{"error":"forbidden"}` before anything is done;
//! 2. every path but `/healthz` and `/readyz` (unknown paths included, so
//!    nothing about the routes shows without it) needs `Authorization:
//!    Bearer <token>`, compared in constant time, else 401
//!    `{"error":"unauthorized"}`.
//!
//! The token lives in `state_dir/local-api.token` ([`TOKEN_FILE`]): one
//! line, mode 0600, made by the agent at start from the OS's random source
//! when missing ([`LocalToken::load_or_create`]). The voice app is given
//! that path. The token is never logged.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use subtle::ConstantTimeEq as _;

use crate::files::{check_private, write_atomic};
use crate::AgentError;

/// The token file's name in the state directory.
pub const TOKEN_FILE: &str = "local-api.token";

/// The paths anyone on the machine may read without the token.
const OPEN_PATHS: [&str; 2] = ["/healthz", "/readyz"];

/// The local API's bearer token.
#[derive(Clone)]
pub struct LocalToken(String);

impl fmt::Debug for LocalToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LocalToken(..)")
    }
}

/// Where the token of the agent whose state directory is `state_dir` lives.
pub fn token_path(state_dir: &Path) -> PathBuf {
    state_dir.join(TOKEN_FILE)
}

impl LocalToken {
    /// Reads the token file, or writes a new random token (0600) when
    /// there is none. Refuses a file that group or others can read, or
    /// that does not hold one token.
    pub fn load_or_create(state_dir: &Path) -> Result<LocalToken, AgentError> {
        let path = token_path(state_dir);
        if !path.exists() {
            let mut seed = [0u8; 32];
            getrandom::fill(&mut seed)
                .map_err(|e| AgentError::new(format!("no random source for the token: {e}")))?;
            let token: String = seed.iter().map(|b| format!("{b:02x}")).collect();
            write_atomic(&path, format!("{token}\n").as_bytes(), 0o600)
                .map_err(|e| AgentError::new(format!("{}: {e}", path.display())))?;
            crate::log::info(
                "local_api_token_created",
                json!({"path": path.display().to_string()}),
            );
        }
        check_private(&path, "local API token file")?;
        let text = std::fs::read_to_string(&path)
            .map_err(|e| AgentError::new(format!("{}: {e}", path.display())))?;
        let token = text.trim();
        if !(16..=256).contains(&token.len()) || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(AgentError::new(format!(
                "{} must hold one token of 16 to 256 printable characters (delete it to get a new one)",
                path.display()
            )));
        }
        Ok(LocalToken(token.to_string()))
    }

    /// True when `presented` is the token (constant time in its content).
    pub fn matches(&self, presented: &str) -> bool {
        bool::from(self.0.as_bytes().ct_eq(presented.as_bytes()))
    }
}

/// What [`guard`] checks requests against.
#[derive(Debug, Clone)]
pub struct Gate {
    /// The listener's bound address: the only `Host` accepted.
    pub host: String,
    /// The bearer token.
    pub token: LocalToken,
}

impl Gate {
    /// A gate for the listener bound to `bound`.
    pub fn new(bound: SocketAddr, token: LocalToken) -> Gate {
        Gate {
            host: bound.to_string(),
            token,
        }
    }

    /// Why `req` is refused, if it is: the status and code.
    fn refusal(&self, req: &Request) -> Option<(StatusCode, &'static str)> {
        let headers = req.headers();
        let forbidden = Some((StatusCode::FORBIDDEN, "forbidden"));
        if headers.contains_key(header::ORIGIN) {
            return forbidden;
        }
        let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
        if host != Some(self.host.as_str()) {
            return forbidden;
        }
        if req.method() == Method::POST {
            let json = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.split(';').next())
                .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
            if !json {
                return forbidden;
            }
        }
        if OPEN_PATHS.contains(&req.uri().path()) {
            return None;
        }
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match presented {
            Some(t) if self.token.matches(t) => None,
            _ => Some((StatusCode::UNAUTHORIZED, "unauthorized")),
        }
    }
}

/// The middleware: refuses what [`Gate`] refuses, before the route runs.
pub async fn guard(State(gate): State<Arc<Gate>>, req: Request, next: Next) -> Response {
    match gate.refusal(&req) {
        None => next.run(req).await,
        Some((status, code)) => {
            crate::log::warn(
                "local_api_refused",
                json!({"code": code, "method": req.method().as_str(), "path": req.uri().path()}),
            );
            (status, Json(json!({"error": code}))).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_token_is_made_once_private_and_kept() {
        let dir = crate::files::test_dir("token");
        let a = LocalToken::load_or_create(&dir).unwrap();
        let path = token_path(&dir);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.len(), 65, "64 hex digits and a newline");
        let b = LocalToken::load_or_create(&dir).unwrap();
        assert!(b.matches(text.trim()) && a.matches(text.trim()));
        assert!(!a.matches("") && !a.matches(&text.trim()[1..]));
        assert_eq!(format!("{a:?}"), "LocalToken(..)", "never printed");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(
            LocalToken::load_or_create(&dir).is_err(),
            "a readable token is refused"
        );
    }
}
