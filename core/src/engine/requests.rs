//! Bodies of the node and panel requests the engine answers, parsed with
//! limits. A body that fails here is a 400 `bad_request` and changes nothing.

use serde::Deserialize;

/// The largest fence, claim or media-verify body (4 KiB).
pub const MAX_SMALL_BODY: usize = 4096;
/// The longest id (session, leg) accepted.
pub const MAX_ID_LEN: usize = 256;

/// A request body that does not parse or breaks a limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRequest(pub String);

impl BadRequest {
    /// The stable error code.
    pub fn code(&self) -> &'static str {
        "bad_request"
    }
}

impl std::fmt::Display for BadRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// `POST /v1/fence`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct FenceRequest {
    /// The session to answer.
    pub call_session_id: String,
    /// The leg to answer.
    pub call_control_id: String,
    /// The epoch the node was given in its assertion.
    pub epoch: u64,
    /// Always `answer`.
    pub purpose: String,
}

/// `POST /v1/claims`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ClaimRequest {
    /// The leg the node dialled.
    pub call_control_id: String,
    /// Its session.
    pub call_session_id: String,
}

/// `POST /v1/media/verify`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct MediaVerifyRequest {
    /// The token from the fence grant.
    pub media_token: String,
}

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

fn parse<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, BadRequest> {
    if body.len() > MAX_SMALL_BODY {
        return Err(BadRequest("body over 4 KiB".into()));
    }
    serde_json::from_slice(body).map_err(|e| BadRequest(format!("invalid body: {e}")))
}

fn check_id(name: &str, value: &str) -> Result<(), BadRequest> {
    if value.is_empty() || value.len() > MAX_ID_LEN {
        return Err(BadRequest(format!(
            "{name} must be 1 to {MAX_ID_LEN} bytes"
        )));
    }
    Ok(())
}

impl FenceRequest {
    /// Parses and checks a fence body.
    pub fn parse(body: &[u8]) -> Result<Self, BadRequest> {
        let req: Self = parse(body)?;
        check_id("call_session_id", &req.call_session_id)?;
        check_id("call_control_id", &req.call_control_id)?;
        if req.purpose != "answer" {
            return Err(BadRequest("purpose must be \"answer\"".into()));
        }
        if req.epoch == 0 || req.epoch > crate::MAX_SAFE_INTEGER {
            return Err(BadRequest("epoch out of range".into()));
        }
        Ok(req)
    }
}

impl ClaimRequest {
    /// Parses and checks a claim body.
    pub fn parse(body: &[u8]) -> Result<Self, BadRequest> {
        let req: Self = parse(body)?;
        check_id("call_session_id", &req.call_session_id)?;
        check_id("call_control_id", &req.call_control_id)?;
        Ok(req)
    }
}

impl MediaVerifyRequest {
    /// Parses and checks a media-verify body.
    pub fn parse(body: &[u8]) -> Result<Self, BadRequest> {
        let req: Self = parse(body)?;
        if req.media_token.is_empty() || req.media_token.len() > 2048 {
            return Err(BadRequest("media_token must be 1 to 2048 bytes".into()));
        }
        Ok(req)
    }
}

impl PreviewRequest {
    /// Parses and checks a preview body.
    pub fn parse(body: &[u8]) -> Result<Self, BadRequest> {
        let req: Self = parse(body)?;
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
    fn fence_bodies_are_checked() {
        let ok = br#"{"call_session_id":"s","call_control_id":"c","epoch":3,"purpose":"answer"}"#;
        assert_eq!(FenceRequest::parse(ok).unwrap().epoch, 3);
        for bad in [
            &br#"{"call_session_id":"s","call_control_id":"c","epoch":3,"purpose":"hangup"}"#[..],
            br#"{"call_session_id":"","call_control_id":"c","epoch":3,"purpose":"answer"}"#,
            br#"{"call_session_id":"s","call_control_id":"c","epoch":0,"purpose":"answer"}"#,
            br#"{"call_session_id":"s","call_control_id":"c","epoch":-1,"purpose":"answer"}"#,
            br#"{"call_session_id":"s"}"#,
            b"not json",
        ] {
            assert!(
                FenceRequest::parse(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(FenceRequest::parse(&vec![b' '; 5000]).is_err());
    }

    #[test]
    fn claim_media_and_preview_bodies_are_checked() {
        assert!(ClaimRequest::parse(br#"{"call_control_id":"c","call_session_id":"s"}"#).is_ok());
        assert!(ClaimRequest::parse(br#"{"call_control_id":"c"}"#).is_err());
        assert!(MediaVerifyRequest::parse(br#"{"media_token":""}"#).is_err());
        assert!(PreviewRequest::parse(br#"{"to":"+15102160079"}"#).is_ok());
        let long = format!(r#"{{"to":"{}"}}"#, "1".repeat(65));
        assert!(PreviewRequest::parse(long.as_bytes()).is_err());
    }
}
