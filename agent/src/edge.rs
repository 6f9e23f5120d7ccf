//! Node-signed requests to the edge (SPEC §6): `Callfence-Node`,
//! `Callfence-Key-Id`, `Callfence-Timestamp` and `Callfence-Signature` over
//! `callfence-node-v1\n{METHOD}\n{HOST}\n{PATH}\n{TIMESTAMP}\n{sha256(body)}`.
//!
//! The `Host` header is set explicitly to the value that was signed
//! (`host[:port]`, the port only when it is not the scheme's default), so the
//! signature never depends on how the HTTP stack spells it.

use std::time::Duration;

use callfence_core::node_auth;
use reqwest::header::{HeaderValue, CONTENT_TYPE, HOST};
use reqwest::Url;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::keys::NodeKey;
use crate::net::{describe, read_limited};
use crate::AgentError;

/// The largest edge answer read.
const MAX_REPLY_BYTES: usize = 64 * 1024;

/// An answer from the edge.
#[derive(Debug, Clone, PartialEq)]
pub struct EdgeReply {
    /// HTTP status.
    pub status: u16,
    /// The JSON body (`Null` when it was not JSON).
    pub body: Value,
    /// When the request was sent (Unix ms).
    pub sent_ms: i64,
    /// When the answer arrived (Unix ms).
    pub received_ms: i64,
}

impl EdgeReply {
    /// The stable error code of a refusal (`{"error": ..}`), if any.
    pub fn error_code(&self) -> Option<&str> {
        self.body.get("error").and_then(Value::as_str)
    }

    /// The body read as one of core's wire types
    /// ([`callfence_core::wire`]); `None` when it does not have that shape.
    pub fn decode<T: DeserializeOwned>(&self) -> Option<T> {
        T::deserialize(&self.body).ok()
    }
}

/// A client for the edge's node routes.
#[derive(Debug, Clone)]
pub struct EdgeClient {
    http: reqwest::Client,
    base: Url,
    node: String,
    timeout: Duration,
}

/// `host[:port]` as an HTTP client sends it for `url`, lowercase.
pub fn host_header(url: &Url) -> Option<String> {
    let host = url.host_str()?.to_ascii_lowercase();
    Some(match url.port() {
        Some(port) => format!("{host}:{port}"),
        None => host,
    })
}

impl EdgeClient {
    /// A client for the edge at `base`, signing as `node`.
    pub fn new(http: reqwest::Client, base: Url, node: String, timeout: Duration) -> EdgeClient {
        EdgeClient {
            http,
            base,
            node,
            timeout,
        }
    }

    /// The URL of an edge route.
    pub fn url(&self, path: &str) -> Result<Url, AgentError> {
        self.base
            .join(path)
            .map_err(|e| AgentError::new(format!("edge url: {e}")))
    }

    /// POSTs `body` (one of core's wire types) as JSON to `path`, signed with
    /// `key`; see [`EdgeClient::post_signed`].
    pub async fn post_json<T: Serialize>(
        &self,
        key: &NodeKey,
        path: &str,
        body: &T,
        now_ms: i64,
    ) -> Result<EdgeReply, String> {
        let bytes = serde_json::to_vec(body).map_err(|e| format!("encode: {e}"))?;
        self.post_signed(key, path, bytes, now_ms).await
    }

    /// POSTs `body` (JSON bytes) to `path`, signed with `key`. Transport
    /// failures are `Err` with a short reason; any HTTP answer is `Ok`.
    pub async fn post_signed(
        &self,
        key: &NodeKey,
        path: &str,
        body: Vec<u8>,
        now_ms: i64,
    ) -> Result<EdgeReply, String> {
        let url = self.url(path).map_err(|e| e.0)?;
        let host = host_header(&url).ok_or("edge url has no host")?;
        let timestamp = now_ms.div_euclid(1000).to_string();
        let signature = node_auth::sign(&key.signing, "POST", &host, url.path(), &timestamp, &body);
        let host_value = HeaderValue::from_str(&host).map_err(|_| "bad host")?;
        let resp = self
            .http
            .post(url)
            .timeout(self.timeout)
            .header(HOST, host_value)
            .header(CONTENT_TYPE, "application/json")
            .header(node_auth::HEADER_NODE, &self.node)
            .header(node_auth::HEADER_KEY_ID, &key.kid)
            .header(node_auth::HEADER_TIMESTAMP, &timestamp)
            .header(node_auth::HEADER_SIGNATURE, signature)
            .body(body)
            .send()
            .await
            .map_err(|e| describe(&e))?;
        let status = resp.status().as_u16();
        let bytes = tokio::time::timeout(self.timeout, read_limited(resp, MAX_REPLY_BYTES))
            .await
            .map_err(|_| "timeout".to_string())??;
        Ok(EdgeReply {
            status,
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            sent_ms: now_ms,
            received_ms: crate::clock::now_ms(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_header_keeps_only_non_default_ports() {
        let h = |u: &str| host_header(&Url::parse(u).unwrap()).unwrap();
        assert_eq!(h("https://Edge.Example.com/x"), "edge.example.com");
        assert_eq!(h("https://edge.example.com:443/x"), "edge.example.com");
        assert_eq!(h("http://127.0.0.1:8787"), "127.0.0.1:8787");
        assert_eq!(h("http://[::1]:9/"), "[::1]:9");
    }

    #[test]
    fn routes_join_onto_the_base() {
        let c = EdgeClient::new(
            reqwest::Client::new(),
            Url::parse("https://edge.example.com").unwrap(),
            "M1".into(),
            Duration::from_secs(1),
        );
        assert_eq!(
            c.url("/v1/fence").unwrap().as_str(),
            "https://edge.example.com/v1/fence"
        );
    }
}
