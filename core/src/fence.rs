//! The answer fence's `command_id` (SPEC §8): a UUID derived
//! deterministically from the leg and the epoch, so that a re-sent Telnyx
//! `answer` for the same grant carries the same `command_id` and Telnyx
//! ignores the repeat.
//!
//! Derivation: the first 16 bytes of SHA-256 of the ASCII
//! `callfence-answer|{call_control_id}|{epoch}`, byte 6 set to
//! `(b & 0x0f) | 0x50` (version 5 nibble), byte 8 set to `(b & 0x3f) | 0x80`
//! (RFC 4122 variant), written as a lowercase 8-4-4-4-12 UUID.

use sha2::{Digest, Sha256};

use crate::encoding::hex;

/// The deterministic `command_id` for answering leg `call_control_id` under
/// `epoch`.
pub fn command_id(call_control_id: &str, epoch: u64) -> String {
    let digest = Sha256::digest(format!("callfence-answer|{call_control_id}|{epoch}").as_bytes());
    let mut b = [0u8; 16];
    b.copy_from_slice(&digest[..16]);
    b[6] = (b[6] & 0x0f) | 0x50;
    b[8] = (b[8] & 0x3f) | 0x80;
    format!(
        "{}-{}-{}-{}-{}",
        hex(&b[0..4]),
        hex(&b[4..6]),
        hex(&b[6..8]),
        hex(&b[8..10]),
        hex(&b[10..16])
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same derivation written another way: the digest as one u128,
    /// fields masked in place, then dashes inserted into its hex.
    fn independent(call_control_id: &str, epoch: u64) -> String {
        let mut hasher = Sha256::new();
        hasher.update(b"callfence-answer|");
        hasher.update(call_control_id.as_bytes());
        hasher.update(b"|");
        hasher.update(epoch.to_string().as_bytes());
        let digest = hasher.finalize();
        let mut first = [0u8; 16];
        for (i, byte) in digest.iter().take(16).enumerate() {
            first[i] = *byte;
        }
        let mut x = u128::from_be_bytes(first);
        // Byte 6 is bits 79..72 (counting from the low end); its high nibble
        // is bits 79..76. Byte 8 is bits 63..56; its top two bits are 63..62.
        x = (x & !(0xf_u128 << 76)) | (0x5_u128 << 76);
        x = (x & !(0x3_u128 << 62)) | (0x2_u128 << 62);
        let s = format!("{x:032x}");
        [&s[0..8], &s[8..12], &s[12..16], &s[16..20], &s[20..32]].join("-")
    }

    #[test]
    fn known_value() {
        // Computed outside Rust (Python hashlib + uuid.UUID(bytes=...)).
        assert_eq!(
            command_id("v3:abc", 7),
            "c4e07f5c-f5f3-5972-b761-62c67d5200bc"
        );
    }

    #[test]
    fn matches_an_independent_derivation() {
        for (ccid, epoch) in [
            ("v3:abc", 7),
            ("v3:Uxq0Vd7bZr5nYQZ0-long-control-id", 1),
            ("", 0),
            ("ü|weird|", (1 << 53) - 1),
        ] {
            assert_eq!(command_id(ccid, epoch), independent(ccid, epoch));
        }
    }

    #[test]
    fn format_is_a_lowercase_version_5_variant_10_uuid() {
        for epoch in 0..64 {
            let id = command_id("v3:abc", epoch);
            let groups: Vec<&str> = id.split('-').collect();
            assert_eq!(
                groups.iter().map(|g| g.len()).collect::<Vec<_>>(),
                [8, 4, 4, 4, 12]
            );
            assert!(id
                .chars()
                .all(|c| c == '-' || c.is_ascii_digit() || ('a'..='f').contains(&c)));
            assert!(groups[2].starts_with('5'), "{id}");
            let variant = u8::from_str_radix(&groups[3][..1], 16).unwrap();
            assert_eq!(variant & 0b1100, 0b1000, "{id}");
        }
    }

    #[test]
    fn deterministic_and_distinct_per_epoch_and_leg() {
        assert_eq!(command_id("v3:abc", 7), command_id("v3:abc", 7));
        assert_ne!(command_id("v3:abc", 7), command_id("v3:abc", 8));
        assert_ne!(command_id("v3:abc", 7), command_id("v3:abd", 7));
    }
}
