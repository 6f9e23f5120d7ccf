//! Node-signed requests (SPEC §6): the `Callfence-*` headers a node agent
//! sends, the canonical string it signs, and the edge's check of them.
//!
//! The canonical string is
//! `callfence-node-v1\n{METHOD}\n{HOST}\n{PATH}\n{TIMESTAMP}\n{hex sha256(body)}`
//! with HOST lowercased and PATH exactly as sent, without the query.

use std::fmt;

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};

use crate::encoding::{b64_decode, b64_encode, sha256_hex};
use crate::telnyx::timestamp_within;

/// Header naming the node.
pub const HEADER_NODE: &str = "Callfence-Node";
/// Header naming the node's key id in the registry.
pub const HEADER_KEY_ID: &str = "Callfence-Key-Id";
/// Header carrying the Unix-seconds timestamp.
pub const HEADER_TIMESTAMP: &str = "Callfence-Timestamp";
/// Header carrying the standard-base64 Ed25519 signature.
pub const HEADER_SIGNATURE: &str = "Callfence-Signature";

/// Largest timestamp distance from the edge's clock, either way, in seconds.
pub const MAX_SKEW_S: i64 = 300;

/// Longest node id or key id accepted in a header, in bytes.
pub const MAX_ID_BYTES: usize = 64;
/// Longest `Host` accepted, in bytes.
pub const MAX_HOST_BYTES: usize = 255;
/// Longest request path accepted, in bytes.
pub const MAX_PATH_BYTES: usize = 2048;

/// First line of every canonical string: the scheme's version.
const SCHEME: &str = "callfence-node-v1";

/// Length of standard base64 (with padding) of a 64-byte signature.
const SIGNATURE_B64_LEN: usize = 88;

/// Longest decimal timestamp accepted.
const MAX_TIMESTAMP_DIGITS: usize = 12;

/// The string a node signs for one request. `host` is lowercased here;
/// `method`, `path` and `timestamp` are used exactly as given.
pub fn canonical(method: &str, host: &str, path: &str, timestamp: &str, body: &[u8]) -> String {
    format!(
        "{SCHEME}\n{method}\n{host}\n{path}\n{timestamp}\n{digest}",
        host = host.to_ascii_lowercase(),
        digest = sha256_hex(body),
    )
}

/// Signs a request as a node does: standard base64 of the Ed25519 signature
/// over [`canonical`].
pub fn sign(
    key: &SigningKey,
    method: &str,
    host: &str,
    path: &str,
    timestamp: &str,
    body: &[u8],
) -> String {
    let text = canonical(method, host, path, timestamp, body);
    b64_encode(&key.sign(text.as_bytes()).to_bytes())
}

/// The `Callfence-*` header values of one request, as received (`None` when
/// absent).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeHeaders<'a> {
    /// `Callfence-Node`.
    pub node: Option<&'a str>,
    /// `Callfence-Key-Id`.
    pub key_id: Option<&'a str>,
    /// `Callfence-Timestamp` (Unix seconds).
    pub timestamp: Option<&'a str>,
    /// `Callfence-Signature`.
    pub signature: Option<&'a str>,
}

/// Why a node-signed request was refused (each answered 401, nothing stored).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeAuthError {
    /// A header is missing or malformed, or the signature does not verify.
    BadNodeSignature,
    /// The node, or that key id of the node, is not in the registry.
    UnknownNodeKey,
    /// The timestamp is more than [`MAX_SKEW_S`] from the edge's clock.
    StaleTimestamp,
}

impl fmt::Display for NodeAuthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NodeAuthError::BadNodeSignature => "node signature missing, malformed or wrong",
            NodeAuthError::UnknownNodeKey => "node or key id not in the registry",
            NodeAuthError::StaleTimestamp => "node timestamp too far from the edge clock",
        })
    }
}

impl std::error::Error for NodeAuthError {}

/// A non-empty id of at most [`MAX_ID_BYTES`] visible ASCII characters.
fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_ID_BYTES && id.bytes().all(|b| b.is_ascii_graphic())
}

/// Checks a node-signed request and returns the node id it was signed by.
///
/// Order: every header present and well formed (else
/// [`NodeAuthError::BadNodeSignature`]), timestamp within [`MAX_SKEW_S`]
/// of `now_ms` (else [`NodeAuthError::StaleTimestamp`]), `key_of(node,
/// key_id)` knows the key (else [`NodeAuthError::UnknownNodeKey`]), and only
/// then the signature itself.
pub fn verify(
    headers: &NodeHeaders,
    method: &str,
    host: &str,
    path: &str,
    body: &[u8],
    now_ms: i64,
    key_of: impl Fn(&str, &str) -> Option<VerifyingKey>,
) -> Result<String, NodeAuthError> {
    let bad = NodeAuthError::BadNodeSignature;
    let (Some(node), Some(key_id), Some(timestamp), Some(signature)) = (
        headers.node,
        headers.key_id,
        headers.timestamp,
        headers.signature,
    ) else {
        return Err(bad);
    };
    if !valid_id(node)
        || !valid_id(key_id)
        || timestamp.is_empty()
        || timestamp.len() > MAX_TIMESTAMP_DIGITS
        || !timestamp.bytes().all(|b| b.is_ascii_digit())
        || signature.len() != SIGNATURE_B64_LEN
        || method.is_empty()
        || method.len() > 16
        || host.len() > MAX_HOST_BYTES
        || path.len() > MAX_PATH_BYTES
    {
        return Err(bad);
    }
    let raw = b64_decode(signature).ok_or(bad)?;
    let raw: [u8; 64] = raw.as_slice().try_into().map_err(|_| bad)?;
    timestamp_within(timestamp, now_ms, MAX_SKEW_S).ok_or(NodeAuthError::StaleTimestamp)?;
    let key = key_of(node, key_id).ok_or(NodeAuthError::UnknownNodeKey)?;
    let text = canonical(method, host, path, timestamp, body);
    key.verify_strict(text.as_bytes(), &Signature::from_bytes(&raw))
        .map_err(|_| bad)?;
    Ok(node.to_string())
}

/// The node a node-signed request comes from, and the key id it was signed
/// with (`Callfence-Node`, `Callfence-Key-Id`), already verified by the
/// Worker against its key cache. Every node operation re-checks the pair
/// against the current registry in its own unit: the cache may lag a
/// registry change, and a removed key is refused (`unknown_node_key`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller<'a> {
    /// The node id.
    pub node: &'a str,
    /// The key id.
    pub kid: &'a str,
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW_S: i64 = 1_796_000_000;
    const NOW_MS: i64 = NOW_S * 1000;
    const BODY: &[u8] = br#"{"schema":"callfence_heartbeat_v1"}"#;
    const HOST: &str = "edge.example.com";
    const PATH: &str = "/v1/nodes/heartbeat";

    fn m3_key() -> SigningKey {
        SigningKey::from_bytes(&[3; 32])
    }

    fn registry(node: &str, kid: &str) -> Option<VerifyingKey> {
        (node == "M3" && kid == "k1").then(|| m3_key().verifying_key())
    }

    fn signed(ts: &str) -> (String, String) {
        (
            ts.to_string(),
            sign(&m3_key(), "POST", "Edge.Example.COM", PATH, ts, BODY),
        )
    }

    fn headers<'a>(ts: &'a str, sig: &'a str) -> NodeHeaders<'a> {
        NodeHeaders {
            node: Some("M3"),
            key_id: Some("k1"),
            timestamp: Some(ts),
            signature: Some(sig),
        }
    }

    #[test]
    fn canonical_string_has_the_exact_format() {
        assert_eq!(
            canonical("POST", "Edge.Example.COM", "/v1/fence", "1796000000", b""),
            "callfence-node-v1\nPOST\nedge.example.com\n/v1/fence\n1796000000\n\
             e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            canonical("GET", "h", "/p", "1", b"abc"),
            "callfence-node-v1\nGET\nh\n/p\n1\n\
             ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn sign_verify_round_trip() {
        let (ts, sig) = signed(&NOW_S.to_string());
        let node = verify(
            &headers(&ts, &sig),
            "POST",
            HOST,
            PATH,
            BODY,
            NOW_MS,
            registry,
        );
        assert_eq!(node.as_deref(), Ok("M3"));
    }

    #[test]
    fn wrong_host_path_method_or_body_fail() {
        let (ts, sig) = signed(&NOW_S.to_string());
        let h = headers(&ts, &sig);
        let bad = Err(NodeAuthError::BadNodeSignature);
        assert_eq!(
            verify(
                &h,
                "POST",
                "other.example.com",
                PATH,
                BODY,
                NOW_MS,
                registry
            ),
            bad
        );
        assert_eq!(
            verify(&h, "POST", HOST, "/v1/fence", BODY, NOW_MS, registry),
            bad
        );
        assert_eq!(verify(&h, "PUT", HOST, PATH, BODY, NOW_MS, registry), bad);
        assert_eq!(verify(&h, "POST", HOST, PATH, b"{}", NOW_MS, registry), bad);
    }

    #[test]
    fn unknown_node_or_kid() {
        let (ts, sig) = signed(&NOW_S.to_string());
        let unknown = Err(NodeAuthError::UnknownNodeKey);
        let mut h = headers(&ts, &sig);
        h.key_id = Some("k2");
        assert_eq!(
            verify(&h, "POST", HOST, PATH, BODY, NOW_MS, registry),
            unknown
        );
        let mut h = headers(&ts, &sig);
        h.node = Some("M9");
        assert_eq!(
            verify(&h, "POST", HOST, PATH, BODY, NOW_MS, registry),
            unknown
        );
    }

    #[test]
    fn another_nodes_key_does_not_verify() {
        let (ts, sig) = signed(&NOW_S.to_string());
        let other = |_: &str, _: &str| Some(SigningKey::from_bytes(&[4; 32]).verifying_key());
        assert_eq!(
            verify(&headers(&ts, &sig), "POST", HOST, PATH, BODY, NOW_MS, other),
            Err(NodeAuthError::BadNodeSignature)
        );
    }

    #[test]
    fn skew_of_301_seconds_is_stale_and_300_is_accepted() {
        // Symmetric wherever in its second the edge's clock is.
        for into_second_ms in [0, 1, 500, 999] {
            for (offset, ok) in [(-301, false), (301, false), (-300, true), (300, true)] {
                let (ts, sig) = signed(&(NOW_S + offset).to_string());
                let got = verify(
                    &headers(&ts, &sig),
                    "POST",
                    HOST,
                    PATH,
                    BODY,
                    NOW_MS + into_second_ms,
                    registry,
                );
                let at = format!("offset {offset} s at {into_second_ms} ms into the second");
                if ok {
                    assert_eq!(got.as_deref(), Ok("M3"), "{at}");
                } else {
                    assert_eq!(got, Err(NodeAuthError::StaleTimestamp), "{at}");
                }
            }
        }
    }

    #[test]
    fn skew_is_checked_before_the_key_lookup() {
        let (ts, sig) = signed(&(NOW_S - 1000).to_string());
        let never = |_: &str, _: &str| -> Option<VerifyingKey> { panic!("looked up a key") };
        assert_eq!(
            verify(&headers(&ts, &sig), "POST", HOST, PATH, BODY, NOW_MS, never),
            Err(NodeAuthError::StaleTimestamp)
        );
    }

    #[test]
    fn missing_or_malformed_headers() {
        let (ts, sig) = signed(&NOW_S.to_string());
        let bad = Err(NodeAuthError::BadNodeSignature);
        let full = headers(&ts, &sig);
        let not_base64 = "!".repeat(88);
        let variants = [
            NodeHeaders { node: None, ..full },
            NodeHeaders {
                key_id: None,
                ..full
            },
            NodeHeaders {
                timestamp: None,
                ..full
            },
            NodeHeaders {
                signature: None,
                ..full
            },
            NodeHeaders {
                node: Some(""),
                ..full
            },
            NodeHeaders {
                node: Some("M 3"),
                ..full
            },
            NodeHeaders {
                timestamp: Some("+1796000000"),
                ..full
            },
            NodeHeaders {
                timestamp: Some("1796000000.0"),
                ..full
            },
            NodeHeaders {
                signature: Some(&sig[..87]),
                ..full
            },
            NodeHeaders {
                signature: Some(&not_base64),
                ..full
            },
        ];
        for h in variants {
            assert_eq!(
                verify(&h, "POST", HOST, PATH, BODY, NOW_MS, registry),
                bad,
                "{h:?}"
            );
        }
        let long = "x".repeat(MAX_ID_BYTES + 1);
        let h = NodeHeaders {
            key_id: Some(&long),
            ..full
        };
        assert_eq!(verify(&h, "POST", HOST, PATH, BODY, NOW_MS, registry), bad);
    }
}
