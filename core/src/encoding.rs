//! Byte encodings used on the wire: strict standard base64 (Telnyx, keys,
//! node signatures), unpadded base64url (assertions, media tokens), lowercase
//! SHA-256 hex, and constant-time comparison for secrets.

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use sha2::{Digest, Sha256};

/// Decodes canonical standard base64 (with padding). Rejects whitespace,
/// the URL alphabet and non-canonical trailing bits.
pub fn b64_decode(text: &str) -> Option<Vec<u8>> {
    STANDARD.decode(text.as_bytes()).ok()
}

/// Encodes standard base64 with padding.
pub fn b64_encode(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

/// Decodes unpadded base64url; padding or the standard alphabet is refused.
pub fn b64url_decode(text: &str) -> Option<Vec<u8>> {
    URL_SAFE_NO_PAD.decode(text.as_bytes()).ok()
}

/// Encodes unpadded base64url.
pub fn b64url_encode(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// Lowercase hex of the SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Lowercase hex of any bytes.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 0x0f) as usize] as char);
    }
    out
}

/// Splits a `{version}.{kid}.{payload}.{signature}` token (assertions, media
/// tokens) into its four parts; `None` unless there are exactly four.
pub fn split_token(token: &str) -> Option<[&str; 4]> {
    let mut parts = token.split('.');
    let split = [parts.next()?, parts.next()?, parts.next()?, parts.next()?];
    parts.next().is_none().then_some(split)
}

/// Compares two byte strings in time that depends only on their lengths.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_of_empty_is_the_known_digest() {
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn strict_base64_refuses_loose_forms() {
        assert_eq!(b64_decode("aGk="), Some(b"hi".to_vec()));
        assert_eq!(b64_decode("aGk"), None, "missing padding");
        assert_eq!(b64_decode(" aGk="), None, "whitespace");
        assert_eq!(b64url_decode("aGk="), None, "padding in base64url");
        assert_eq!(b64url_decode("aGk"), Some(b"hi".to_vec()));
    }

    #[test]
    fn tokens_split_into_exactly_four_parts() {
        assert_eq!(split_token("v1.k.p.s"), Some(["v1", "k", "p", "s"]));
        assert_eq!(split_token("v1.k.p"), None);
        assert_eq!(split_token("v1.k.p.s.x"), None);
        assert_eq!(split_token("..."), Some(["", "", "", ""]));
    }

    #[test]
    fn constant_time_compare_is_a_compare() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
    }
}
