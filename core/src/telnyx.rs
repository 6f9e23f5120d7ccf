//! The carrier edge: Telnyx webhook signature verification (Ed25519 over
//! `{timestamp}|{raw body}`, SPEC §7.1) and the webhook envelope read from a
//! verified body (SPEC §7.2).
//!
//! Verification always comes first; [`parse_envelope`] is only meaningful on
//! a body whose signature [`verify`] accepted.

use std::fmt;

use ed25519_dalek::{Signature, VerifyingKey};
use serde_json::{Map, Value};

use crate::encoding::b64_decode;

/// At most this many keys in a configured key list (rotation needs two).
pub const MAX_KEYS: usize = 8;

/// Longest key-list text accepted from configuration.
pub const MAX_KEY_LIST_BYTES: usize = 4096;

/// Largest timestamp distance from now, either way, in seconds.
pub const MAX_SKEW_S: i64 = 300;

/// Largest body [`verify`] will hash; bigger bodies never verify.
pub const MAX_SIGNED_BODY_BYTES: usize = 1024 * 1024;

/// Largest body [`parse_envelope`] reads.
pub const MAX_ENVELOPE_BYTES: usize = 64 * 1024;

/// Longest string kept from an envelope field, in characters.
pub const MAX_FIELD_CHARS: usize = 256;

/// Length of standard base64 (with padding) of a 64-byte signature.
const SIGNATURE_B64_LEN: usize = 88;

/// Longest decimal timestamp accepted (enough for any plausible Unix second).
const MAX_TIMESTAMP_DIGITS: usize = 12;

/// A configured key list could not be read. The problem names the entry by
/// position and never echoes key material.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyListError {
    /// What is wrong, in a short sentence.
    pub problem: String,
}

impl KeyListError {
    /// Builds an error from a sentence.
    pub fn new(problem: impl Into<String>) -> Self {
        Self {
            problem: problem.into(),
        }
    }
}

impl fmt::Display for KeyListError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.problem)
    }
}

impl std::error::Error for KeyListError {}

/// The Telnyx account public keys this deployment accepts (one, or more
/// during a rotation). Any of them may sign a webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TelnyxKeys {
    keys: Vec<VerifyingKey>,
}

impl TelnyxKeys {
    /// Parses `TELNYX_PUBLIC_KEY`: comma-separated strict standard base64 of
    /// raw 32-byte Ed25519 public keys (whitespace around entries allowed),
    /// at least one and at most [`MAX_KEYS`], each a valid curve point.
    pub fn parse(csv: &str) -> Result<TelnyxKeys, KeyListError> {
        if csv.len() > MAX_KEY_LIST_BYTES {
            return Err(KeyListError::new("key list is too long"));
        }
        let mut keys = Vec::new();
        for (i, entry) in csv.split(',').enumerate() {
            let n = i + 1;
            if n > MAX_KEYS {
                return Err(KeyListError::new(format!(
                    "more than {MAX_KEYS} keys in the list"
                )));
            }
            let entry = entry.trim();
            if entry.is_empty() {
                return Err(KeyListError::new(format!("key {n} is empty")));
            }
            let bytes = b64_decode(entry)
                .ok_or_else(|| KeyListError::new(format!("key {n} is not strict base64")))?;
            let raw: [u8; 32] = bytes
                .as_slice()
                .try_into()
                .map_err(|_| KeyListError::new(format!("key {n} is not 32 bytes")))?;
            let key = VerifyingKey::from_bytes(&raw).map_err(|_| {
                KeyListError::new(format!("key {n} is not a valid Ed25519 public key"))
            })?;
            keys.push(key);
        }
        Ok(TelnyxKeys { keys })
    }

    /// Builds a key list from keys already decoded (at least one; extra keys
    /// beyond [`MAX_KEYS`] are refused).
    pub fn from_keys(keys: Vec<VerifyingKey>) -> Result<TelnyxKeys, KeyListError> {
        if keys.is_empty() {
            return Err(KeyListError::new("no keys"));
        }
        if keys.len() > MAX_KEYS {
            return Err(KeyListError::new(format!(
                "more than {MAX_KEYS} keys in the list"
            )));
        }
        Ok(TelnyxKeys { keys })
    }

    /// The keys, in configured order.
    pub fn keys(&self) -> &[VerifyingKey] {
        &self.keys
    }

    /// True when any key verifies `signature` over `message` under the
    /// strict rules (canonical `s`, no small-order components).
    pub fn verify_raw(&self, message: &[u8], signature: &[u8; 64]) -> bool {
        let signature = Signature::from_bytes(signature);
        self.keys
            .iter()
            .any(|key| key.verify_strict(message, &signature).is_ok())
    }
}

/// Why a webhook's signature was refused (each answered 401).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SignatureError {
    /// `telnyx-signature-ed25519` or `telnyx-timestamp` is absent or empty.
    MissingSignature,
    /// The signature is not strict base64 of 64 bytes, or no configured key
    /// verifies it.
    BadSignature,
    /// The timestamp is not decimal Unix seconds, or is more than
    /// [`MAX_SKEW_S`] from now either way.
    StaleTimestamp,
}

impl fmt::Display for SignatureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SignatureError::MissingSignature => "Telnyx signature or timestamp header missing",
            SignatureError::BadSignature => "Telnyx signature does not verify",
            SignatureError::StaleTimestamp => "Telnyx timestamp too far from now",
        })
    }
}

impl std::error::Error for SignatureError {}

/// Parses a decimal Unix-seconds timestamp and checks it is within `max_skew_s`
/// of `now_ms` either way, inclusive. `None` when it is not plain ASCII digits
/// or is out of range.
///
/// The timestamp has whole seconds, so the comparison is in whole seconds
/// too: `now_ms` is truncated to its second first. (Comparing at millisecond
/// precision made the window lopsided: in the middle of a second, a
/// timestamp exactly `max_skew_s` old was refused while one `max_skew_s` in
/// the future was accepted.)
pub(crate) fn timestamp_within(timestamp: &str, now_ms: i64, max_skew_s: i64) -> Option<i64> {
    if timestamp.is_empty()
        || timestamp.len() > MAX_TIMESTAMP_DIGITS
        || !timestamp.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let seconds: i64 = timestamp.parse().ok()?;
    let distance = seconds.abs_diff(now_ms.div_euclid(1000));
    (distance <= max_skew_s.unsigned_abs()).then_some(seconds)
}

/// Verifies a Telnyx webhook: the `telnyx-signature-ed25519` header (strict
/// base64 of 64 bytes) over `{timestamp}|{body}` with any configured key,
/// and the `telnyx-timestamp` header within [`MAX_SKEW_S`] of `now_ms`.
///
/// Checks run cheapest first: presence, timestamp, signature shape, then
/// the cryptography.
pub fn verify(
    keys: &TelnyxKeys,
    signature_b64: Option<&str>,
    timestamp: Option<&str>,
    body: &[u8],
    now_ms: i64,
) -> Result<(), SignatureError> {
    let (Some(signature_b64), Some(timestamp)) = (signature_b64, timestamp) else {
        return Err(SignatureError::MissingSignature);
    };
    if signature_b64.is_empty() || timestamp.is_empty() {
        return Err(SignatureError::MissingSignature);
    }
    timestamp_within(timestamp, now_ms, MAX_SKEW_S).ok_or(SignatureError::StaleTimestamp)?;
    if signature_b64.len() != SIGNATURE_B64_LEN || body.len() > MAX_SIGNED_BODY_BYTES {
        return Err(SignatureError::BadSignature);
    }
    let raw = b64_decode(signature_b64).ok_or(SignatureError::BadSignature)?;
    let raw: [u8; 64] = raw
        .as_slice()
        .try_into()
        .map_err(|_| SignatureError::BadSignature)?;
    let mut message = Vec::with_capacity(timestamp.len() + 1 + body.len());
    message.extend_from_slice(timestamp.as_bytes());
    message.push(b'|');
    message.extend_from_slice(body);
    if keys.verify_raw(&message, &raw) {
        Ok(())
    } else {
        Err(SignatureError::BadSignature)
    }
}

/// What callfence reads from a verified webhook body.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Envelope {
    /// `data.id`: the event id, the deduplication key.
    pub event_id: String,
    /// `data.event_type`, such as `call.initiated`.
    pub event_type: String,
    /// `data.payload.call_session_id`.
    pub call_session_id: Option<String>,
    /// `data.payload.creator_call_session_id`.
    pub creator_call_session_id: Option<String>,
    /// `data.payload.call_control_id`: the leg.
    pub call_control_id: Option<String>,
    /// `data.payload.from`, raw (normalise with [`crate::number::normalise`]).
    pub from: Option<String>,
    /// `data.payload.to`, raw.
    pub to: Option<String>,
    /// `data.payload.direction` (`incoming` or `outgoing`).
    pub direction: Option<String>,
    /// `data.payload.connection_id`.
    pub connection_id: Option<String>,
}

impl Envelope {
    /// The session key found in the event itself: `call_session_id`, else
    /// `creator_call_session_id`. (The Dispatcher may still know the session
    /// through `call_control_id`.)
    pub fn session_hint(&self) -> Option<&str> {
        self.call_session_id
            .as_deref()
            .or(self.creator_call_session_id.as_deref())
    }
}

/// A verified body that is not a readable Telnyx event (answered 400
/// `bad_envelope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum EnvelopeError {
    /// The body is larger than [`MAX_ENVELOPE_BYTES`].
    TooLarge,
    /// The body is not a JSON object.
    NotJson,
    /// `data` is absent or not an object.
    MissingData,
    /// `data.id` is absent, not a string, empty or too long.
    BadEventId,
    /// `data.event_type` is absent, not a string, empty or too long.
    BadEventType,
}

impl fmt::Display for EnvelopeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EnvelopeError::TooLarge => "webhook body over 64 KiB",
            EnvelopeError::NotJson => "webhook body is not a JSON object",
            EnvelopeError::MissingData => "webhook body has no data object",
            EnvelopeError::BadEventId => "data.id must be a string of 1 to 256 characters",
            EnvelopeError::BadEventType => {
                "data.event_type must be a string of 1 to 256 characters"
            }
        })
    }
}

impl std::error::Error for EnvelopeError {}

/// A string of 1 to [`MAX_FIELD_CHARS`] characters at `key`, else `None`.
fn bounded_str(object: &Map<String, Value>, key: &str) -> Option<String> {
    match object.get(key) {
        Some(Value::String(s)) if !s.is_empty() && s.chars().count() <= MAX_FIELD_CHARS => {
            Some(s.clone())
        }
        _ => None,
    }
}

/// Reads the envelope of a verified webhook body. Only `data.id` and
/// `data.event_type` are required; every optional field that is absent, of
/// the wrong type, empty or too long is treated as absent, never an error.
pub fn parse_envelope(body: &[u8]) -> Result<Envelope, EnvelopeError> {
    if body.len() > MAX_ENVELOPE_BYTES {
        return Err(EnvelopeError::TooLarge);
    }
    let value: Value = serde_json::from_slice(body).map_err(|_| EnvelopeError::NotJson)?;
    let Value::Object(root) = value else {
        return Err(EnvelopeError::NotJson);
    };
    let Some(Value::Object(data)) = root.get("data") else {
        return Err(EnvelopeError::MissingData);
    };
    let event_id = bounded_str(data, "id").ok_or(EnvelopeError::BadEventId)?;
    let event_type = bounded_str(data, "event_type").ok_or(EnvelopeError::BadEventType)?;
    let empty = Map::new();
    let payload = match data.get("payload") {
        Some(Value::Object(p)) => p,
        _ => &empty,
    };
    Ok(Envelope {
        event_id,
        event_type,
        call_session_id: bounded_str(payload, "call_session_id"),
        creator_call_session_id: bounded_str(payload, "creator_call_session_id"),
        call_control_id: bounded_str(payload, "call_control_id"),
        from: bounded_str(payload, "from"),
        to: bounded_str(payload, "to"),
        direction: bounded_str(payload, "direction"),
        connection_id: bounded_str(payload, "connection_id"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encoding::b64_encode;
    use ed25519_dalek::{Signer, SigningKey};
    use proptest::prelude::*;

    const NOW_S: i64 = 1_796_000_000;
    const NOW_MS: i64 = NOW_S * 1000;

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn key(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32])
    }

    fn keys_of(signers: &[&SigningKey]) -> TelnyxKeys {
        let csv: Vec<String> = signers
            .iter()
            .map(|k| b64_encode(k.verifying_key().as_bytes()))
            .collect();
        TelnyxKeys::parse(&csv.join(",")).unwrap()
    }

    fn sign(key: &SigningKey, timestamp: &str, body: &[u8]) -> String {
        let mut msg = format!("{timestamp}|").into_bytes();
        msg.extend_from_slice(body);
        b64_encode(&key.sign(&msg).to_bytes())
    }

    const BODY: &[u8] = br#"{"data":{"id":"ev-1","event_type":"call.initiated","payload":{"call_session_id":"s-1"}}}"#;

    /// RFC 8032 §7.1 TEST 1, 2 and 3: (secret, public, message, signature).
    const RFC8032: [(&str, &str, &str, &str); 3] = [
        (
            "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
            "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
            "",
            "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b",
        ),
        (
            "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
            "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c",
            "72",
            "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00",
        ),
        (
            "c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7",
            "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025",
            "af82",
            "6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28dc027beceea1ec40a",
        ),
    ];

    #[test]
    fn rfc8032_vectors_verify_through_the_key_list() {
        for (i, (secret, public, message, signature)) in RFC8032.iter().enumerate() {
            let keys = TelnyxKeys::parse(&b64_encode(&unhex(public))).unwrap();
            let sig: [u8; 64] = unhex(signature).try_into().unwrap();
            let msg = unhex(message);
            assert!(keys.verify_raw(&msg, &sig), "TEST {}", i + 1);

            // The seed derives the same key and the same (deterministic) signature.
            let seed: [u8; 32] = unhex(secret).try_into().unwrap();
            let signer = SigningKey::from_bytes(&seed);
            assert_eq!(signer.verifying_key().as_bytes().to_vec(), unhex(public));
            assert_eq!(signer.sign(&msg).to_bytes(), sig, "TEST {}", i + 1);

            // One flipped bit in the message or the signature fails.
            let mut other = msg.clone();
            other.push(0);
            assert!(!keys.verify_raw(&other, &sig));
            let mut bad = sig;
            bad[0] ^= 1;
            assert!(!keys.verify_raw(&msg, &bad));
        }
    }

    #[test]
    fn key_list_parsing() {
        let a = b64_encode(key(1).verifying_key().as_bytes());
        let b = b64_encode(key(2).verifying_key().as_bytes());
        assert_eq!(TelnyxKeys::parse(&a).unwrap().keys().len(), 1);
        assert_eq!(
            TelnyxKeys::parse(&format!("{a}, {b}"))
                .unwrap()
                .keys()
                .len(),
            2
        );
        assert!(TelnyxKeys::parse("").is_err());
        assert!(TelnyxKeys::parse(&format!("{a},")).is_err());
        assert!(TelnyxKeys::parse("not base64").is_err());
        assert!(TelnyxKeys::parse(&b64_encode(&[7u8; 31])).is_err());
        assert!(TelnyxKeys::parse(&a[..a.len() - 1]).is_err(), "no padding");
        let nine = vec![a.clone(); 9].join(",");
        assert!(TelnyxKeys::parse(&nine).is_err());
        assert!(TelnyxKeys::parse(&vec![a; 8].join(",")).is_ok());
        // y = 2 is not on the curve: decompression fails.
        let mut off_curve = [0u8; 32];
        off_curve[0] = 2;
        assert!(TelnyxKeys::parse(&b64_encode(&off_curve)).is_err());
        assert!(TelnyxKeys::from_keys(vec![]).is_err());
    }

    #[test]
    fn accepts_a_webhook_signed_by_the_configured_key() {
        let k = key(1);
        let ts = NOW_S.to_string();
        let sig = sign(&k, &ts, BODY);
        assert_eq!(
            verify(&keys_of(&[&k]), Some(&sig), Some(&ts), BODY, NOW_MS),
            Ok(())
        );
    }

    #[test]
    fn refuses_a_tampered_body() {
        let k = key(1);
        let ts = NOW_S.to_string();
        let sig = sign(&k, &ts, BODY);
        let mut body = BODY.to_vec();
        body[10] ^= 1;
        assert_eq!(
            verify(&keys_of(&[&k]), Some(&sig), Some(&ts), &body, NOW_MS),
            Err(SignatureError::BadSignature)
        );
        // The timestamp is part of the signed message too.
        let other_ts = (NOW_S + 1).to_string();
        assert_eq!(
            verify(&keys_of(&[&k]), Some(&sig), Some(&other_ts), BODY, NOW_MS),
            Err(SignatureError::BadSignature)
        );
    }

    #[test]
    fn refuses_a_wrong_key_and_accepts_any_key_of_a_rotation_list() {
        let old = key(1);
        let new = key(2);
        let stranger = key(3);
        let ts = NOW_S.to_string();
        let sig = sign(&new, &ts, BODY);
        assert_eq!(
            verify(&keys_of(&[&stranger]), Some(&sig), Some(&ts), BODY, NOW_MS),
            Err(SignatureError::BadSignature)
        );
        assert_eq!(
            verify(&keys_of(&[&old, &new]), Some(&sig), Some(&ts), BODY, NOW_MS),
            Ok(())
        );
    }

    #[test]
    fn timestamp_window_is_300_seconds_inclusive_either_way() {
        let k = key(1);
        let keys = keys_of(&[&k]);
        // Wherever in its second the edge's clock is, 300 s either way is
        // accepted and 301 s either way is stale: the window is symmetric.
        for into_second_ms in [0, 1, 500, 999] {
            let now_ms = NOW_MS + into_second_ms;
            for (offset, want) in [
                (-301, Err(SignatureError::StaleTimestamp)),
                (301, Err(SignatureError::StaleTimestamp)),
                (-300, Ok(())),
                (300, Ok(())),
                (0, Ok(())),
            ] {
                let ts = (NOW_S + offset).to_string();
                let sig = sign(&k, &ts, BODY);
                assert_eq!(
                    verify(&keys, Some(&sig), Some(&ts), BODY, now_ms),
                    want,
                    "offset {offset} s at {into_second_ms} ms into the second"
                );
            }
        }
    }

    #[test]
    fn timestamp_window_compares_whole_seconds() {
        assert_eq!(timestamp_within("1000", 1_300_999, 300), Some(1000));
        assert_eq!(timestamp_within("1000", 1_301_000, 300), None);
        assert_eq!(timestamp_within("1300", 1_000_000, 300), Some(1300));
        assert_eq!(timestamp_within("1301", 1_000_999, 300), None);
        // Before the epoch the second is floored, not rounded toward zero.
        assert_eq!(timestamp_within("0", -1, 0), None);
        assert_eq!(timestamp_within("0", -1, 1), Some(0));
    }

    #[test]
    fn refuses_malformed_timestamps_as_stale() {
        let k = key(1);
        let keys = keys_of(&[&k]);
        for ts in [
            "+1796000000",
            "-1",
            "1796000000.5",
            " 1796000000",
            "1e9",
            "99999999999999999999",
        ] {
            let sig = sign(&k, ts, BODY);
            assert_eq!(
                verify(&keys, Some(&sig), Some(ts), BODY, NOW_MS),
                Err(SignatureError::StaleTimestamp),
                "{ts:?}"
            );
        }
    }

    #[test]
    fn missing_headers() {
        let k = key(1);
        let keys = keys_of(&[&k]);
        let ts = NOW_S.to_string();
        let sig = sign(&k, &ts, BODY);
        let missing = Err(SignatureError::MissingSignature);
        assert_eq!(verify(&keys, None, Some(&ts), BODY, NOW_MS), missing);
        assert_eq!(verify(&keys, Some(&sig), None, BODY, NOW_MS), missing);
        assert_eq!(verify(&keys, None, None, BODY, NOW_MS), missing);
        assert_eq!(verify(&keys, Some(""), Some(&ts), BODY, NOW_MS), missing);
    }

    #[test]
    fn refuses_non_canonical_base64_and_wrong_lengths() {
        let k = key(1);
        let keys = keys_of(&[&k]);
        let ts = NOW_S.to_string();
        let sig = sign(&k, &ts, BODY);
        let bad = Err(SignatureError::BadSignature);

        // 64 bytes leave 2 spare bits in the last symbol before "==": setting
        // them gives a non-canonical encoding of the same bytes.
        let chars: Vec<char> = sig.chars().collect();
        assert!(sig.ends_with("=="));
        let last = chars[85];
        const ALPHABET: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let idx = ALPHABET.find(last).unwrap();
        let tweaked = ALPHABET.as_bytes()[idx | 0x0f] as char;
        let mut non_canonical: String = chars[..85].iter().collect();
        non_canonical.push(tweaked);
        non_canonical.push_str("==");
        if tweaked != last {
            assert_eq!(
                verify(&keys, Some(&non_canonical), Some(&ts), BODY, NOW_MS),
                bad
            );
        }
        // URL alphabet, missing padding, whitespace.
        let url = sig.replace('+', "-").replace('/', "_");
        if url != sig {
            assert_eq!(verify(&keys, Some(&url), Some(&ts), BODY, NOW_MS), bad);
        }
        assert_eq!(
            verify(
                &keys,
                Some(sig.trim_end_matches('=')),
                Some(&ts),
                BODY,
                NOW_MS
            ),
            bad
        );
        assert_eq!(
            verify(&keys, Some(&format!(" {sig}")), Some(&ts), BODY, NOW_MS),
            bad
        );
        // A 63-byte signature (canonical base64 of 63 bytes).
        let raw = k.sign(format!("{ts}|").as_bytes()).to_bytes();
        let short = b64_encode(&raw[..63]);
        assert_eq!(verify(&keys, Some(&short), Some(&ts), BODY, NOW_MS), bad);
        // 65 bytes.
        let long = b64_encode(&[raw.as_slice(), &[0]].concat());
        assert_eq!(verify(&keys, Some(&long), Some(&ts), BODY, NOW_MS), bad);
    }

    #[test]
    fn envelope_reads_ids_and_optional_fields() {
        let body = br#"{"data":{"id":"ev-1","event_type":"call.initiated","record_type":"event",
            "payload":{"call_session_id":"s-1","creator_call_session_id":"s-0",
            "call_control_id":"v3:abc","from":"+15105550100","to":"+15102160079",
            "direction":"incoming","connection_id":"c-9"}},"meta":{"attempt":1}}"#;
        let env = parse_envelope(body).unwrap();
        assert_eq!(env.event_id, "ev-1");
        assert_eq!(env.event_type, "call.initiated");
        assert_eq!(env.call_session_id.as_deref(), Some("s-1"));
        assert_eq!(env.creator_call_session_id.as_deref(), Some("s-0"));
        assert_eq!(env.call_control_id.as_deref(), Some("v3:abc"));
        assert_eq!(env.from.as_deref(), Some("+15105550100"));
        assert_eq!(env.to.as_deref(), Some("+15102160079"));
        assert_eq!(env.direction.as_deref(), Some("incoming"));
        assert_eq!(env.connection_id.as_deref(), Some("c-9"));
        assert_eq!(env.session_hint(), Some("s-1"));
    }

    #[test]
    fn session_hint_falls_back_to_the_creator_session() {
        let body = br#"{"data":{"id":"e","event_type":"call.initiated",
            "payload":{"creator_call_session_id":"s-0"}}}"#;
        let env = parse_envelope(body).unwrap();
        assert_eq!(env.call_session_id, None);
        assert_eq!(env.session_hint(), Some("s-0"));

        let body = br#"{"data":{"id":"e","event_type":"call.hangup","payload":{"call_control_id":"v3:x"}}}"#;
        assert_eq!(parse_envelope(body).unwrap().session_hint(), None);
        let body = br#"{"data":{"id":"e","event_type":"call.hangup"}}"#;
        assert_eq!(parse_envelope(body).unwrap().session_hint(), None);
    }

    #[test]
    fn optional_fields_of_the_wrong_type_are_absent() {
        let long = "x".repeat(MAX_FIELD_CHARS + 1);
        let body = format!(
            r#"{{"data":{{"id":"e","event_type":"t","payload":{{"call_session_id":7,
            "creator_call_session_id":"","call_control_id":null,"from":["+1"],
            "to":{{"n":1}},"direction":true,"connection_id":"{long}"}}}}}}"#
        );
        let env = parse_envelope(body.as_bytes()).unwrap();
        assert_eq!(
            env,
            Envelope {
                event_id: "e".into(),
                event_type: "t".into(),
                ..Envelope::default()
            }
        );
        // A payload that is not an object is absent as a whole.
        let body = br#"{"data":{"id":"e","event_type":"t","payload":"nope"}}"#;
        assert_eq!(parse_envelope(body).unwrap().session_hint(), None);
        // 256 characters (multi-byte) still fit.
        let fits = "é".repeat(MAX_FIELD_CHARS);
        let body =
            format!(r#"{{"data":{{"id":"e","event_type":"t","payload":{{"to":"{fits}"}}}}}}"#);
        assert_eq!(
            parse_envelope(body.as_bytes()).unwrap().to.as_deref(),
            Some(fits.as_str())
        );
    }

    #[test]
    fn envelope_errors_are_bad_envelope() {
        let cases: &[(&[u8], EnvelopeError)] = &[
            (b"not json", EnvelopeError::NotJson),
            (b"", EnvelopeError::NotJson),
            (b"[1,2]", EnvelopeError::NotJson),
            (b"{}", EnvelopeError::MissingData),
            (br#"{"data":[]}"#, EnvelopeError::MissingData),
            (br#"{"data":{"event_type":"t"}}"#, EnvelopeError::BadEventId),
            (
                br#"{"data":{"id":"","event_type":"t"}}"#,
                EnvelopeError::BadEventId,
            ),
            (
                br#"{"data":{"id":5,"event_type":"t"}}"#,
                EnvelopeError::BadEventId,
            ),
            (br#"{"data":{"id":"e"}}"#, EnvelopeError::BadEventType),
            (
                br#"{"data":{"id":"e","event_type":null}}"#,
                EnvelopeError::BadEventType,
            ),
        ];
        for (body, want) in cases {
            let got = parse_envelope(body).unwrap_err();
            assert_eq!(got, *want, "{}", String::from_utf8_lossy(body));
        }
        let long_id = format!(
            r#"{{"data":{{"id":"{}","event_type":"t"}}}}"#,
            "i".repeat(MAX_FIELD_CHARS + 1)
        );
        assert_eq!(
            parse_envelope(long_id.as_bytes()),
            Err(EnvelopeError::BadEventId)
        );
        let mut big = br#"{"data":{"id":"e","event_type":"t","pad":""#.to_vec();
        big.resize(MAX_ENVELOPE_BYTES, b'a');
        big.extend_from_slice(br#""}}"#);
        assert_eq!(parse_envelope(&big), Err(EnvelopeError::TooLarge));
    }

    proptest! {
        #[test]
        fn parse_envelope_never_panics(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse_envelope(&body);
        }

        #[test]
        fn parse_envelope_never_panics_on_json_like_text(
            body in r#"\{"data":\{("id":("e"|1|null),)?("event_type":"t",)?"payload":\{"(to|from|call_session_id)":("x"|[0-9]{1,3}|\[\]|\{\})\}\}\}"#
        ) {
            let _ = parse_envelope(body.as_bytes());
        }

        #[test]
        fn verify_never_panics(
            sig in proptest::option::of(".{0,100}"),
            ts in proptest::option::of("[0-9+-]{0,25}"),
            body in proptest::collection::vec(any::<u8>(), 0..64),
            now_ms in any::<i64>(),
        ) {
            let keys = keys_of(&[&key(1)]);
            let _ = verify(&keys, sig.as_deref(), ts.as_deref(), &body, now_ms);
        }
    }
}
