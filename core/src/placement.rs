//! Where a new session goes (SPEC §16): shard `jump(h, N)` of the map,
//! where `h` is the first 8 bytes, big-endian, of SHA-256 of the UTF-8
//! `call_session_id`, and `jump` is Lamping and Veach's jump consistent
//! hash ("A Fast, Minimal Memory, Consistent Hash Algorithm", 2014).
//!
//! Jump hash moves the fewest keys when the number of buckets changes:
//! growing from N to M shards moves a session's *placement* only to one of
//! the new shards, with probability `1 - N/M`. Placement only says where a
//! *new* session is created; a session already held stays with its holder
//! (see `shard::holder`).

use sha2::{Digest, Sha256};

/// The session's hash: the first 8 bytes of SHA-256 of its id, big-endian.
pub fn session_hash(call_session_id: &str) -> u64 {
    let digest = Sha256::digest(call_session_id.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// Lamping and Veach's jump consistent hash of `key` into `buckets`
/// buckets (0 when `buckets` is 0 or 1).
pub fn jump(mut key: u64, buckets: u32) -> u32 {
    let (mut b, mut j): (i64, i64) = (-1, 0);
    while j < i64::from(buckets) {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b.max(0) as u32
}

/// The shard a new session `call_session_id` is placed on under a map of
/// `call_shards` shards.
pub fn home(call_session_id: &str, call_shards: u32) -> u32 {
    jump(session_hash(call_session_id), call_shards)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jump_matches_the_reference_implementation() {
        // The first five are go-jump's test table; all nine agree with the
        // paper's C++ code (run in Python with 64-bit wrapping).
        let cases: [(u64, u32, u32); 9] = [
            (1, 1, 0),
            (42, 57, 43),
            (0xDEAD10CC, 1, 0),
            (0xDEAD10CC, 666, 361),
            (256, 1024, 520),
            (0, 100, 0),
            (u64::MAX, 1, 0),
            (u64::MAX, 10, 9),
            (u64::MAX, 100, 92),
        ];
        for (key, buckets, want) in cases {
            assert_eq!(jump(key, buckets), want, "jump({key}, {buckets})");
        }
    }

    #[test]
    fn the_session_hash_is_the_first_eight_bytes_of_sha256_big_endian() {
        // sha256("abc") = ba7816bf8f01cfea 414140de5dae2223 ...
        assert_eq!(session_hash("abc"), 0xba78_16bf_8f01_cfea);
    }

    #[test]
    fn one_shard_places_everything_on_global() {
        for i in 0..100 {
            assert_eq!(home(&format!("v3:{i}"), 1), 0);
        }
    }

    #[test]
    fn growing_moves_sessions_only_to_new_shards_and_spreads_them() {
        let mut counts = [0u32; 8];
        for i in 0..8_000 {
            let id = format!("v3:session-{i}");
            let (four, eight) = (home(&id, 4), home(&id, 8));
            assert!(four < 4 && eight < 8);
            assert!(eight == four || eight >= 4, "{id}: {four} -> {eight}");
            counts[eight as usize] += 1;
        }
        for (shard, count) in counts.iter().enumerate() {
            assert!((800..1_200).contains(count), "shard {shard} has {count}");
        }
    }
}
