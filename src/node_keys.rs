//! The node-signature pre-check (SPEC §6) against a per-isolate copy of the
//! registry's node keys, so forged node requests never reach the Dispatcher.
//!
//! # Cache
//!
//! The keys come from the Dispatcher's `node_keys` operation and are kept
//! for [`MAX_AGE_MS`]. A request signed with a key the copy does not know
//! refreshes it once, then is judged against the fresh copy. Fetches start
//! at most once every [`MIN_REFRESH_MS`] (while one is in flight, concurrent
//! requests use the copy they have, even if it just expired). Checks that need no key run first: a request
//! with malformed headers or a stale timestamp is refused without any
//! Dispatcher call, whatever the state of the copy. So a flood of forged
//! requests costs the Dispatcher at most one call per isolate per
//! [`MIN_REFRESH_MS`]. A `Host` outside `EDGE_HOSTNAMES` is refused before
//! anything else.
//!
//! The copy may lag a registry change by up to [`MAX_AGE_MS`]: the
//! Dispatcher must re-check the key against its current registry before it
//! acts on a node request.

use crate::clock::now_ms;
use crate::protocol::{self, Reply};
use crate::reply::ApiError;
use callfence_core::edge_hosts::EdgeHosts;
use callfence_core::encoding::b64_decode;
use callfence_core::node_auth::{self, NodeAuthError, NodeHeaders};
use callfence_core::refusal::Refusal;
use ed25519_dalek::VerifyingKey;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use worker::{Env, Request};

/// How long a copy of the keys is used before it is fetched again.
pub const MAX_AGE_MS: i64 = 5_000;
/// The shortest interval between two fetches prompted by unknown keys.
pub const MIN_REFRESH_MS: i64 = 1_000;

/// The registry's node keys: node → key id → key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeKeys {
    /// The registry revision they come from (0: no registry).
    pub revision: u64,
    keys: BTreeMap<String, BTreeMap<String, VerifyingKey>>,
}

impl NodeKeys {
    /// Reads a `node_keys` answer. Entries that do not decode to a valid
    /// Ed25519 key are left out (the node cannot sign with them).
    pub fn from_reply(reply: protocol::NodeKeys) -> NodeKeys {
        let mut keys: BTreeMap<String, BTreeMap<String, VerifyingKey>> = BTreeMap::new();
        for entry in reply.keys {
            let key = b64_decode(&entry.public_key)
                .and_then(|bytes| <[u8; 32]>::try_from(bytes.as_slice()).ok())
                .and_then(|raw| VerifyingKey::from_bytes(&raw).ok());
            if let Some(key) = key {
                keys.entry(entry.node).or_default().insert(entry.kid, key);
            }
        }
        NodeKeys {
            revision: reply.revision,
            keys,
        }
    }

    /// The key `kid` of `node`, if registered.
    pub fn key(&self, node: &str, kid: &str) -> Option<VerifyingKey> {
        self.keys.get(node)?.get(kid).copied()
    }
}

/// The isolate's copy, when it was fetched, and when a fetch last started.
#[derive(Default)]
struct Cache {
    copy: Option<(i64, Rc<NodeKeys>)>,
    last_attempt_ms: Option<i64>,
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache::default());
}

/// What a node-signed request carries, borrowed from it.
pub struct Signed<'a> {
    /// The `Callfence-*` headers.
    pub headers: NodeHeaders<'a>,
    /// The method.
    pub method: &'a str,
    /// The `Host` header as sent.
    pub host: &'a str,
    /// The path as sent, without the query.
    pub path: &'a str,
    /// The raw body.
    pub body: &'a [u8],
}

/// The owned header values of a request (to borrow [`Signed`] from).
pub struct SignedHeaders {
    node: Option<String>,
    key_id: Option<String>,
    timestamp: Option<String>,
    signature: Option<String>,
    host: String,
}

impl SignedHeaders {
    /// Reads the node headers and the host of `req`.
    pub fn of(req: &Request) -> SignedHeaders {
        let header = |name: &str| req.headers().get(name).ok().flatten();
        let host = header("Host")
            .or_else(|| crate::request_url::host(&req.inner().url()).map(str::to_owned))
            .unwrap_or_default();
        SignedHeaders {
            node: header(node_auth::HEADER_NODE),
            key_id: header(node_auth::HEADER_KEY_ID),
            timestamp: header(node_auth::HEADER_TIMESTAMP),
            signature: header(node_auth::HEADER_SIGNATURE),
            host,
        }
    }

    /// The request as [`verify`] reads it.
    pub fn signed<'a>(&'a self, method: &'a str, path: &'a str, body: &'a [u8]) -> Signed<'a> {
        Signed {
            headers: NodeHeaders {
                node: self.node.as_deref(),
                key_id: self.key_id.as_deref(),
                timestamp: self.timestamp.as_deref(),
                signature: self.signature.as_deref(),
            },
            method,
            host: &self.host,
            path,
            body,
        }
    }
}

/// Checks a node-signed request and returns the node it comes from. Refusals
/// are 401 with `bad_node_signature`, `unknown_node_key` or
/// `stale_timestamp`; a Dispatcher that cannot be asked for keys gives 503
/// `dispatcher_unavailable`. With `edge_hosts` (`EDGE_HOSTNAMES`), a
/// request whose `Host` is not one of them is refused first
/// (`bad_node_signature`): its signature names another edge.
pub async fn verify(
    env: &Env,
    request: &Signed<'_>,
    edge_hosts: Option<&EdgeHosts>,
) -> Result<String, ApiError> {
    if edge_hosts.is_some_and(|hosts| !hosts.allows(request.host)) {
        return Err(ApiError(Refusal::NodeAuth(NodeAuthError::BadNodeSignature)));
    }
    let now = now_ms();
    let check = |keys: &NodeKeys| {
        node_auth::verify(
            &request.headers,
            request.method,
            request.host,
            request.path,
            request.body,
            now,
            |node, kid| keys.key(node, kid),
        )
    };
    let refused = |error: NodeAuthError| ApiError(Refusal::NodeAuth(error));

    let (copy, since_attempt_ms) = current(now);
    // A fetch started less than MIN_REFRESH_MS ago (perhaps still in flight
    // for a concurrent request) is not repeated: the copy is used as it is.
    let may_fetch = since_attempt_ms >= MIN_REFRESH_MS;
    let copy = copy.filter(|(age_ms, _)| *age_ms < MAX_AGE_MS || !may_fetch);
    let verdict = match copy {
        Some((_, keys)) => match check(&keys) {
            Err(NodeAuthError::UnknownNodeKey) if may_fetch => None,
            verdict => Some(verdict),
        },
        // No usable copy: only a request that gets as far as the key lookup
        // is worth a fetch.
        None => match check(&NodeKeys::default()) {
            Err(NodeAuthError::UnknownNodeKey) => None,
            verdict => Some(verdict),
        },
    };
    let verdict = match verdict {
        Some(verdict) => verdict,
        None => check(&*refresh(env, now).await?),
    };
    verdict.map_err(refused)
}

/// The isolate's copy with its age, and the time since a fetch last started
/// (`i64::MAX` when never).
fn current(now: i64) -> (Option<(i64, Rc<NodeKeys>)>, i64) {
    CACHE.with(|cache| {
        let cache = cache.borrow();
        let copy = cache
            .copy
            .as_ref()
            .map(|(fetched_at, keys)| (now - fetched_at, keys.clone()));
        let since_attempt = cache.last_attempt_ms.map_or(i64::MAX, |at| now - at);
        (copy, since_attempt)
    })
}

/// Fetches the keys from the Dispatcher and replaces the copy.
async fn refresh(env: &Env, now: i64) -> Result<Rc<NodeKeys>, ApiError> {
    CACHE.with(|cache| cache.borrow_mut().last_attempt_ms = Some(now));
    let keys = match protocol::call(env, &protocol::Request::NodeKeys, b"").await {
        Ok(Reply::Done(reply)) => Some(NodeKeys::from_reply(reply)),
        Ok(Reply::Refused(_)) | Err(_) => None,
    }
    .map(Rc::new)
    .ok_or_else(ApiError::dispatcher_unavailable)?;
    CACHE.with(|cache| cache.borrow_mut().copy = Some((now, keys.clone())));
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;
    use callfence_core::encoding::b64_encode;
    use ed25519_dalek::SigningKey;
    use serde_json::json;

    #[test]
    fn an_answer_becomes_a_lookup_and_bad_keys_are_dropped() {
        let good = b64_encode(SigningKey::from_bytes(&[7; 32]).verifying_key().as_bytes());
        let reply = json!({"revision": 3, "keys": [
            {"node": "M1", "kid": "k1", "public_key": good},
            {"node": "M1", "kid": "short", "public_key": "AAAA"},
            {"node": "M3", "kid": "k1", "public_key": good, "future": 1}
        ]});
        let keys = NodeKeys::from_reply(serde_json::from_value(reply).unwrap());
        assert_eq!(keys.revision, 3);
        assert!(keys.key("M1", "k1").is_some());
        assert!(keys.key("M3", "k1").is_some());
        assert!(keys.key("M1", "short").is_none());
        assert!(keys.key("M2", "k1").is_none());
    }

    #[test]
    fn a_malformed_answer_is_not_a_lookup() {
        for reply in [
            json!({"v": 2, "ok": true}),
            json!({"v": 2, "ok": true, "revision": 1}),
            json!({"v": 2, "ok": true, "revision": -1, "keys": []}),
            json!({"v": 2, "ok": true, "revision": 1, "keys": [{"node": "M1"}]}),
        ] {
            let body = reply.to_string();
            assert!(
                protocol::decode_reply::<protocol::NodeKeys>(200, body.as_bytes()).is_err(),
                "{reply}"
            );
        }
    }
}
