//! Media tokens (SPEC §8): the HMAC token handed out with an answer fence,
//! `v1.{kid}.{payload}.{mac}`, that a node presents when its media stream
//! (re)connects.
//!
//! `payload` is unpadded base64url of the JSON [`MediaClaims`]; `mac` is
//! unpadded base64url of HMAC-SHA256 with the media key `kid` over the ASCII
//! `v1.{kid}.{payload}`. The first configured key signs; every configured
//! key verifies, so a new key can be prepended without breaking live calls.
//! Whether the call, node, epoch and fence still match is the engine's
//! business; this module only proves the token is ours and unexpired.

use std::fmt;

use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::encoding::{b64_decode, b64url_decode, b64url_encode};
use crate::telnyx::KeyListError;

/// How long a media token lives after its fence grant, in milliseconds.
pub const MEDIA_TTL_MS: i64 = 4 * 3600 * 1000;

/// Longest token [`verify`] reads.
pub const MAX_TOKEN_BYTES: usize = 2048;

/// At most this many media keys.
pub const MAX_KEYS: usize = 8;

/// Shortest media key, in bytes.
pub const MIN_KEY_BYTES: usize = 32;

/// Longest media key, in bytes.
pub const MAX_KEY_BYTES: usize = 256;

/// Longest key-list text accepted from configuration.
pub const MAX_KEY_LIST_BYTES: usize = 8192;

/// Longest key id, in characters.
pub const MAX_KID_CHARS: usize = 32;

/// The scheme's version prefix.
const VERSION: &str = "v1";

/// Length of an HMAC-SHA256 tag.
const MAC_BYTES: usize = 32;

type HmacSha256 = Hmac<Sha256>;

/// The media keys (`MEDIA_TOKEN_KEYS`): the first signs, all verify.
/// `Debug` shows key ids only, never key bytes.
#[derive(Clone)]
pub struct MediaKeys {
    keys: Vec<(String, Vec<u8>)>,
}

impl fmt::Debug for MediaKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MediaKeys")
            .field("kids", &self.kids().collect::<Vec<_>>())
            .finish()
    }
}

/// True for a key id of 1 to 32 characters from `[A-Za-z0-9_-]`.
fn valid_kid(kid: &str) -> bool {
    !kid.is_empty()
        && kid.len() <= MAX_KID_CHARS
        && kid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl MediaKeys {
    /// Parses comma-separated `kid:base64key` entries (whitespace around
    /// entries allowed): kid `^[A-Za-z0-9_-]{1,32}$`, unique; key strict
    /// standard base64 of 32 to 256 bytes; 1 to [`MAX_KEYS`] entries.
    pub fn parse(csv: &str) -> Result<MediaKeys, KeyListError> {
        if csv.len() > MAX_KEY_LIST_BYTES {
            return Err(KeyListError::new("media key list is too long"));
        }
        let mut keys: Vec<(String, Vec<u8>)> = Vec::new();
        for (i, entry) in csv.split(',').enumerate() {
            let n = i + 1;
            if n > MAX_KEYS {
                return Err(KeyListError::new(format!(
                    "more than {MAX_KEYS} media keys"
                )));
            }
            let Some((kid, key)) = entry.trim().split_once(':') else {
                return Err(KeyListError::new(format!(
                    "media key {n} is not kid:base64key"
                )));
            };
            if !valid_kid(kid) {
                return Err(KeyListError::new(format!(
                    "media key {n} has an invalid kid (1 to 32 of A-Z a-z 0-9 _ -)"
                )));
            }
            if keys.iter().any(|(k, _)| k == kid) {
                return Err(KeyListError::new(format!(
                    "media key {n} repeats kid {kid}"
                )));
            }
            let bytes = b64_decode(key)
                .ok_or_else(|| KeyListError::new(format!("media key {n} is not strict base64")))?;
            if !(MIN_KEY_BYTES..=MAX_KEY_BYTES).contains(&bytes.len()) {
                return Err(KeyListError::new(format!(
                    "media key {n} must be {MIN_KEY_BYTES} to {MAX_KEY_BYTES} bytes"
                )));
            }
            keys.push((kid.to_string(), bytes));
        }
        Ok(MediaKeys { keys })
    }

    /// The key ids, signing key first.
    pub fn kids(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|(kid, _)| kid.as_str())
    }

    /// The signing key (the first).
    fn signing(&self) -> (&str, &[u8]) {
        self.keys
            .first()
            .map(|(kid, key)| (kid.as_str(), key.as_slice()))
            .unwrap_or(("", &[]))
    }

    /// The key named `kid`.
    fn key(&self, kid: &str) -> Option<&[u8]> {
        self.keys
            .iter()
            .find(|(k, _)| k == kid)
            .map(|(_, key)| key.as_slice())
    }
}

/// What a media token grants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MediaClaims {
    /// The call session.
    pub call_session_id: String,
    /// The node the fence was granted to.
    pub node: String,
    /// The epoch of the grant.
    pub epoch: u64,
    /// Expiry, Unix seconds (the grant time plus 4 h).
    pub exp: i64,
}

impl MediaClaims {
    /// Claims for a fence granted at `granted_at_ms`: `exp` is
    /// [`MEDIA_TTL_MS`] later, in whole Unix seconds.
    pub fn for_grant(call_session_id: &str, node: &str, epoch: u64, granted_at_ms: i64) -> Self {
        MediaClaims {
            call_session_id: call_session_id.to_string(),
            node: node.to_string(),
            epoch,
            exp: granted_at_ms.saturating_add(MEDIA_TTL_MS).div_euclid(1000),
        }
    }
}

/// HMAC-SHA256 of `message` under `key`.
fn mac_of(key: &[u8], message: &[u8]) -> Option<HmacSha256> {
    let mut mac = HmacSha256::new_from_slice(key).ok()?;
    mac.update(message);
    Some(mac)
}

/// Mints a token for `claims` with the first (signing) key.
pub fn mint(keys: &MediaKeys, claims: &MediaClaims) -> String {
    let (kid, key) = keys.signing();
    // Serialising a struct of strings and integers cannot fail; an empty
    // payload would only make a token that never verifies (fail closed).
    let json = serde_json::to_vec(claims).unwrap_or_default();
    let signed = format!("{VERSION}.{kid}.{}", b64url_encode(&json));
    let tag = mac_of(key, signed.as_bytes())
        .map(|m| m.finalize().into_bytes().to_vec())
        .unwrap_or_default();
    format!("{signed}.{}", b64url_encode(&tag))
}

/// Why a media token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MediaError {
    /// Not a token of ours: shape, kid, mac or payload is wrong.
    BadToken,
    /// The token's `exp` has passed.
    Expired,
}

impl fmt::Display for MediaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MediaError::BadToken => "media token is not valid",
            MediaError::Expired => "media token has expired",
        })
    }
}

impl std::error::Error for MediaError {}

/// Verifies a media token: shape, a configured kid, the mac (compared in
/// constant time before the payload is parsed), then the claims, valid up
/// to and including the second `exp`.
pub fn verify(keys: &MediaKeys, token: &str, now_ms: i64) -> Result<MediaClaims, MediaError> {
    let bad = MediaError::BadToken;
    if token.len() > MAX_TOKEN_BYTES {
        return Err(bad);
    }
    let Some([version, kid, payload, tag]) = crate::encoding::split_token(token) else {
        return Err(bad);
    };
    if version != VERSION || !valid_kid(kid) || payload.is_empty() {
        return Err(bad);
    }
    let key = keys.key(kid).ok_or(bad)?;
    let tag = b64url_decode(tag).ok_or(bad)?;
    if tag.len() != MAC_BYTES {
        return Err(bad);
    }
    // `v1.{kid}.{payload}`: everything before the last dot.
    let signed = &token[..VERSION.len() + kid.len() + payload.len() + 2];
    mac_of(key, signed.as_bytes())
        .ok_or(bad)?
        .verify_slice(&tag)
        .map_err(|_| bad)?;
    let json = b64url_decode(payload).ok_or(bad)?;
    let claims: MediaClaims = serde_json::from_slice(&json).map_err(|_| bad)?;
    if claims.exp < now_ms.div_euclid(1000) {
        return Err(MediaError::Expired);
    }
    Ok(claims)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encoding::b64_encode;
    use proptest::prelude::*;

    const GRANT_MS: i64 = 1_796_000_000_250;

    fn keys(spec: &[(&str, u8)]) -> MediaKeys {
        let csv: Vec<String> = spec
            .iter()
            .map(|(kid, fill)| format!("{kid}:{}", b64_encode(&[*fill; 32])))
            .collect();
        MediaKeys::parse(&csv.join(",")).unwrap()
    }

    fn claims() -> MediaClaims {
        MediaClaims::for_grant("s-1", "M3", 7, GRANT_MS)
    }

    #[test]
    fn claims_expire_four_hours_after_the_grant() {
        assert_eq!(claims().exp, 1_796_000_000 + 4 * 3600);
    }

    #[test]
    fn round_trip() {
        let k = keys(&[("m1", 1)]);
        let t = mint(&k, &claims());
        assert!(t.starts_with("v1.m1."));
        assert!(!t.contains('='));
        assert_eq!(verify(&k, &t, GRANT_MS), Ok(claims()));
    }

    #[test]
    fn mac_is_hmac_sha256_over_the_signed_prefix() {
        let k = keys(&[("m1", 1)]);
        let t = mint(&k, &claims());
        let (signed, tag) = t.rsplit_once('.').unwrap();
        let mut mac = HmacSha256::new_from_slice(&[1; 32]).unwrap();
        mac.update(signed.as_bytes());
        assert_eq!(
            b64url_decode(tag).unwrap(),
            mac.finalize().into_bytes().to_vec()
        );
    }

    #[test]
    fn tampered_mac_or_payload_is_bad() {
        let k = keys(&[("m1", 1)]);
        let t = mint(&k, &claims());
        let (signed, tag) = t.rsplit_once('.').unwrap();
        let mut raw = b64url_decode(tag).unwrap();
        raw[0] ^= 1;
        let tampered = format!("{signed}.{}", b64url_encode(&raw));
        assert_eq!(verify(&k, &tampered, GRANT_MS), Err(MediaError::BadToken));

        let mut c = claims();
        c.epoch = 8;
        let other = mint(&k, &c);
        let swapped = format!("v1.m1.{}.{tag}", other.split('.').nth(2).unwrap());
        assert_eq!(verify(&k, &swapped, GRANT_MS), Err(MediaError::BadToken));
        let short = format!("{signed}.{}", b64url_encode(&raw[..31]));
        assert_eq!(verify(&k, &short, GRANT_MS), Err(MediaError::BadToken));
    }

    #[test]
    fn expired_after_exp() {
        let k = keys(&[("m1", 1)]);
        let t = mint(&k, &claims());
        let exp_ms = claims().exp * 1000;
        assert!(verify(&k, &t, exp_ms + 999).is_ok());
        let got = verify(&k, &t, exp_ms + 1000);
        assert_eq!(got, Err(MediaError::Expired));
    }

    #[test]
    fn wrong_kid_is_bad() {
        let k = keys(&[("m1", 1)]);
        let other = keys(&[("m2", 1)]);
        let t = mint(&other, &claims());
        assert_eq!(verify(&k, &t, GRANT_MS), Err(MediaError::BadToken));
        // Same kid, different key bytes.
        let impostor = keys(&[("m1", 2)]);
        let t = mint(&impostor, &claims());
        assert_eq!(verify(&k, &t, GRANT_MS), Err(MediaError::BadToken));
    }

    #[test]
    fn rotation_keeps_old_tokens_valid() {
        let before = keys(&[("m1", 1)]);
        let t_old = mint(&before, &claims());
        let after = keys(&[("m2", 2), ("m1", 1)]);
        assert_eq!(verify(&after, &t_old, GRANT_MS), Ok(claims()));
        let t_new = mint(&after, &claims());
        assert!(t_new.starts_with("v1.m2."));
        assert_eq!(verify(&after, &t_new, GRANT_MS), Ok(claims()));
        assert_eq!(verify(&before, &t_new, GRANT_MS), Err(MediaError::BadToken));
    }

    #[test]
    fn key_list_rules() {
        let good = b64_encode(&[1; 32]);
        assert!(MediaKeys::parse(&format!("m1:{good}")).is_ok());
        assert!(MediaKeys::parse(&format!(" m1:{good} , m-2_x:{good}")).is_ok());
        for bad in [
            String::new(),
            good.clone(),
            format!(":{good}"),
            format!("m.1:{good}"),
            format!("{}:{good}", "k".repeat(33)),
            format!("m1:{}", b64_encode(&[1; 31])),
            format!("m1:{}", b64_encode(&[1; 257])),
            format!("m1:{}", good.trim_end_matches('=')),
            format!("m1:{good},m1:{good}"),
            format!("m1:{good},"),
            (0..9)
                .map(|i| format!("k{i}:{good}"))
                .collect::<Vec<_>>()
                .join(","),
        ] {
            let err = MediaKeys::parse(&bad).unwrap_err();
            assert!(!err.problem.contains(&good), "never echoes key material");
        }
        let k = keys(&[("m2", 2), ("m1", 1)]);
        assert_eq!(k.kids().collect::<Vec<_>>(), ["m2", "m1"]);
        assert!(!format!("{k:?}").contains("AQEB"), "Debug hides keys");
    }

    #[test]
    fn malformed_tokens_are_bad() {
        let k = keys(&[("m1", 1)]);
        let t = mint(&k, &claims());
        for bad in [
            String::new(),
            "v1.m1.x".to_string(),
            format!("{t}.x"),
            t.replacen("v1.", "v2.", 1),
            format!("{t}{}", "A".repeat(MAX_TOKEN_BYTES)),
        ] {
            assert_eq!(
                verify(&k, &bad, GRANT_MS),
                Err(MediaError::BadToken),
                "{bad:?}"
            );
        }
    }

    proptest! {
        #[test]
        fn verify_never_panics(token in ".{0,300}", now_ms in any::<i64>()) {
            let _ = verify(&keys(&[("m1", 1)]), &token, now_ms);
        }

        #[test]
        fn verify_never_panics_on_token_like_text(
            token in "v1\\.(m1|m2)\\.[A-Za-z0-9_-]{0,200}\\.[A-Za-z0-9_-]{0,60}",
            now_ms in any::<i64>(),
        ) {
            let _ = verify(&keys(&[("m1", 1)]), &token, now_ms);
        }
    }
}
