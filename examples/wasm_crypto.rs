//! The per-webhook cryptography and parsing of the Worker and the
//! Dispatcher, as a bare wasm module for `make bench` (scripts/bench.mjs):
//! built with `cargo build --example wasm_crypto --release
//! --target wasm32-unknown-unknown`, so under the Worker's own release
//! profile (size-first, the Ed25519 and SHA-2 crates at `opt-level = 3`),
//! and run in Node's V8 to put a floor under the Worker's own CPU per
//! webhook: the figures are what these steps cost in wasm, outside any
//! runtime crossing.
//!
//! One export, `run(step, n) -> u32`, repeats one step `n` times and
//! returns how many succeeded (the caller checks that all did, so a step
//! that fails cannot pass for a fast one):
//! - 0: [`telnyx::verify`] of a signed `call.initiated` webhook (strict
//!   Ed25519 over `{timestamp}|{body}`), as the Worker does per webhook;
//! - 1: [`assertion::mint`] of a forward's claims (SHA-256 of the body,
//!   JSON, base64url, Ed25519 signature), as the Dispatcher does per
//!   forward;
//! - 2: [`telnyx::parse_envelope`] of the same body, as the Worker does.
//!
//! Natively it only builds (`cargo clippy --all-targets`); its unit test
//! checks that every step succeeds.

use callfence_core::assertion;
use callfence_core::telnyx::{self, TelnyxKeys};
use ed25519_dalek::{Signer, SigningKey};

/// A `call.initiated` webhook of the size Telnyx sends (about 900 bytes).
const BODY: &str = r#"{"data":{"event_type":"call.initiated","id":"0ccc7b54-4df3-4bca-a65a-3da1ecc777f0","occurred_at":"2026-12-02T10:00:00.000000Z","payload":{"call_control_id":"v3:MdI91X4lWFEs7IgbBEOT9M4AigoY08M0WWZFISt1Yw2axZ_IiE4pqg","call_leg_id":"2dc6fc34-f9e0-11ea-b68e-02420a0f7768","call_session_id":"2dc1b3c8-f9e0-11ea-bc5a-02420a0f7768","caller_id_name":"+35319605860","client_state":null,"connection_id":"1684641123236054244","direction":"incoming","from":"+35319605860","start_time":"2026-12-02T10:00:00.000000Z","state":"parked","to":"+13129457420","custom_headers":[{"name":"X-Header-1","value":"Value 1"}],"sip_headers":[{"name":"User-to-User","value":"value"}]},"record_type":"event"},"meta":{"attempt":1,"delivered_to":"https://example.com/webhooks"}}"#;

/// The signed webhook's timestamp (Unix seconds), and "now" for the check.
const TIMESTAMP: &str = "1796205600";
const NOW_MS: i64 = 1_796_205_600_000;

struct Fixture {
    keys: TelnyxKeys,
    signature: String,
    edge: SigningKey,
}

fn fixture() -> Fixture {
    use base64::Engine as _;
    let telnyx = SigningKey::from_bytes(&[7; 32]);
    let message = format!("{TIMESTAMP}|{BODY}");
    let signature = base64::engine::general_purpose::STANDARD
        .encode(telnyx.sign(message.as_bytes()).to_bytes());
    Fixture {
        keys: TelnyxKeys::from_keys(vec![telnyx.verifying_key()]).expect("one key"),
        signature,
        edge: SigningKey::from_bytes(&[9; 32]),
    }
}

fn step(f: &Fixture, which: u32) -> bool {
    match which {
        0 => telnyx::verify(
            &f.keys,
            Some(&f.signature),
            Some(TIMESTAMP),
            BODY.as_bytes(),
            NOW_MS,
        )
        .is_ok(),
        1 => {
            let claims = assertion::claims_for(
                "M1",
                "2dc1b3c8-f9e0-11ea-bc5a-02420a0f7768",
                Some("v3:MdI91X4lWFEs7IgbBEOT9M4AigoY08M0WWZFISt1Yw2axZ_IiE4pqg"),
                "0ccc7b54-4df3-4bca-a65a-3da1ecc777f0",
                1,
                1,
                BODY.as_bytes(),
                NOW_MS,
            );
            !assertion::mint("e1", &f.edge, &claims).is_empty()
        }
        2 => telnyx::parse_envelope(BODY.as_bytes()).is_ok(),
        _ => false,
    }
}

/// Runs step `which` `n` times; returns how many succeeded.
#[no_mangle]
pub extern "C" fn run(which: u32, n: u32) -> u32 {
    let f = fixture();
    (0..n).map(|_| u32::from(step(&f, which))).sum()
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_step_succeeds_and_an_unknown_one_does_not() {
        for which in 0..3 {
            assert_eq!(super::run(which, 2), 2, "step {which}");
        }
        assert_eq!(super::run(3, 1), 0);
    }
}
