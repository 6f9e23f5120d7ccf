//! Bodies of the node and panel requests the engine answers, parsed with
//! limits. A body that fails here is a 400 `bad_request` and changes nothing.

use serde::Deserialize;

use crate::wire::parse_small;
pub use crate::wire::{BadRequest, ClaimRequest, FenceRequest, MediaVerifyRequest};

/// `POST /v1/routing/preview`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct PreviewRequest {
    /// The called number, in any form the normaliser accepts.
    pub to: Option<String>,
    /// The caller.
    pub from: Option<String>,
    /// A draft routing policy to resolve under instead of the one in force
    /// (the panel's preview before a save). Validated like a PUT; nothing is
    /// stored.
    #[serde(default)]
    pub policy: Option<serde_json::Value>,
}

impl PreviewRequest {
    /// Parses and checks a preview body.
    pub fn parse(body: &[u8]) -> Result<Self, BadRequest> {
        let req: Self = parse_small(body)?;
        for value in [&req.to, &req.from].into_iter().flatten() {
            if value.len() > 64 {
                return Err(BadRequest("numbers are at most 64 bytes".into()));
            }
        }
        Ok(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preview_bodies_are_checked() {
        assert!(PreviewRequest::parse(br#"{"to":"+15102160079"}"#).is_ok());
        assert!(PreviewRequest::parse(br#"{}"#).is_ok());
        let long = format!(r#"{{"to":"{}"}}"#, "1".repeat(65));
        assert!(PreviewRequest::parse(long.as_bytes()).is_err());
        assert!(PreviewRequest::parse(b"[]").is_err());
    }
}
