//! The origin proxy's decisions, with no I/O ([`crate::proxy`] translates
//! HTTP, the ledger and the app to and from them):
//!
//! - [`admit`]: which kind of forward a request is and whether it is
//!   admitted: a probe ([`ProbeClaims`]) or a webhook ([`Claims`] and the
//!   Telnyx signature), else refused with the reason logged;
//! - [`on_entry`]: what the ledger's entry for an event says to do (answer
//!   again, resume, record a new event);
//! - [`admits_new_session`]: whether a node in this mode may take a new
//!   event of this session;
//! - [`app_verdict`]: whether the app's answer completes the event (the
//!   edge's own rule, [`callfence_core::outcome`]);
//! - [`Delivery`]: the result shared with the duplicates waiting on it.

use axum::http::HeaderMap;
use callfence_core::assertion::{self, Claims, ProbeClaims};
use callfence_core::outcome::{self, OriginAnswer};
use callfence_core::{probe, telnyx};

use crate::config::Config;
use crate::ledger::{Answer, Entry, Pending};
use crate::mode::NodeMode;

/// The result of delivering one event, shared with the duplicates waiting
/// on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// The app's answer (fresh or recorded).
    Answered(Answer),
    /// Refused before the app: drained or shadow, session never admitted.
    NotAdmitted,
    /// The app did not answer usably; the event stays `received`.
    AppFailed {
        /// The app's status, when it answered at all.
        app_status: Option<u16>,
        /// A short reason.
        reason: String,
    },
    /// The ledger could not be used; the app was not called.
    LedgerFailed,
    /// A duplicate waited too long for the first delivery.
    InProgress,
}

/// What a request to `POST /callfence/telnyx` is, once checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// A verified L5 probe for this node: hand it to the app as it is.
    Probe {
        /// The probe's nonce (`Callfence-Probe`).
        nonce: String,
    },
    /// A verified webhook, ready for the ledger and the app.
    Webhook(Pending),
    /// Not admitted: 401 `not_admitted`, the app is not called.
    Refused {
        /// The stable reason, for the log.
        reason: &'static str,
        /// The event, when the assertion named one.
        event_id: Option<String>,
    },
}

fn refused(reason: &'static str, event_id: Option<&str>) -> Admission {
    Admission::Refused {
        reason,
        event_id: event_id.map(str::to_string),
    }
}

/// Checks a forward: its assertion (probe or webhook, never one for the
/// other), the Telnyx signature of a webhook, and that the body's event is
/// the asserted one.
pub fn admit(cfg: &Config, headers: &HeaderMap, body: &[u8], now: i64) -> Admission {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let Some(header) = text(assertion::HEADER) else {
        return refused("missing_assertion", None);
    };
    if let Some(parsed) = probe::parse_body(body) {
        return match parsed {
            Ok(p) if p.node == cfg.node => match verify::<ProbeClaims>(cfg, header, body, now) {
                Ok(claims) if claims.event_id == p.nonce => Admission::Probe { nonce: p.nonce },
                Ok(_) => refused("probe_nonce_mismatch", None),
                Err(e) => refused(e.code(), None),
            },
            Ok(_) => refused("wrong_node", None),
            Err(e) => refused(e.code(), None),
        };
    }
    let claims = match verify::<Claims>(cfg, header, body, now) {
        Ok(c) => c,
        Err(e) => return refused(e.code(), None),
    };
    if let Err(e) = telnyx::verify(
        &cfg.telnyx_keys,
        text("telnyx-signature-ed25519"),
        text("telnyx-timestamp"),
        body,
        now,
    ) {
        return refused(e.code(), Some(&claims.event_id));
    }
    let envelope = telnyx::parse_envelope(body).ok();
    if envelope
        .as_ref()
        .is_some_and(|env| env.event_id != claims.event_id)
    {
        return refused("event_id_mismatch", Some(&claims.event_id));
    }
    Admission::Webhook(Pending {
        event_id: claims.event_id,
        call_session_id: claims.call_session_id,
        call_control_id: claims.call_control_id,
        epoch: claims.epoch,
        event_type: envelope.map(|e| e.event_type),
        body: body.to_vec(),
        headers: forwarded_headers(headers),
        attempts: 0,
    })
}

/// Verifies an assertion of kind `K` for this node and `body`.
fn verify<K: assertion::Kind>(
    cfg: &Config,
    header: &str,
    body: &[u8],
    now: i64,
) -> Result<K, assertion::AssertionError> {
    assertion::verify::<K>(
        header,
        &cfg.edge_keys,
        &cfg.node,
        body,
        now,
        cfg.timing.assertion_skew_s,
    )
}

/// The headers passed to the app: `content-type` and `telnyx-*` only.
pub fn forwarded_headers(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(name, _)| {
            let n = name.as_str();
            n == "content-type" || n.starts_with("telnyx-")
        })
        .filter_map(|(name, value)| {
            Some((name.as_str().to_string(), value.to_str().ok()?.to_string()))
        })
        .take(32)
        .collect()
}

/// What the ledger's entry for an event says to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnEntry {
    /// Completed before: the recorded answer, without calling the app.
    Replay(Answer),
    /// `received` and never completed: deliver the stored event again.
    Resume(Pending),
    /// Never seen, and fresh from the edge: admit, record, deliver.
    New,
    /// A resumed event the ledger no longer holds: nothing to deliver.
    Gone,
}

/// The step for an event whose ledger entry is `entry` (`fresh`: it came
/// from the edge just now, rather than from the ledger being resumed).
pub fn on_entry(entry: Entry, fresh: bool) -> OnEntry {
    match entry {
        Entry::Completed(answer) => OnEntry::Replay(answer),
        Entry::Received(stored) => OnEntry::Resume(stored),
        Entry::Absent if fresh => OnEntry::New,
        Entry::Absent => OnEntry::Gone,
    }
}

/// True when a node in `mode` may take a new event of a session:
/// `active` takes any; `drained` and `shadow` only sessions they admitted
/// before (`session_admitted`: the ledger's answer, `None` when it could
/// not say, which refuses).
pub fn admits_new_session(mode: NodeMode, session_admitted: Option<bool>) -> bool {
    mode == NodeMode::Active || session_admitted == Some(true)
}

/// True when recording `event` leaves its leg open (every event but
/// `call.hangup`).
pub fn leg_stays_open(event: &Pending) -> bool {
    event.event_type.as_deref() != Some("call.hangup")
}

/// True for the app answers that complete an event: exactly those the edge
/// classifies as delivered ([`outcome::classify`]), so the agent and the
/// Dispatcher apply one rule.
pub fn completes(status: u16, body: &[u8]) -> bool {
    outcome::classify(&OriginAnswer::http(status, body)).is_delivered()
}

/// What the app's answer means for the ledger: `Ok` completes the event
/// with this answer; `Err` leaves it `received`, with the app's status (if
/// it answered) and a short reason. `body` is the bounded read of the
/// answer.
pub fn app_verdict(
    status: u16,
    content_type: Option<String>,
    body: Result<Vec<u8>, String>,
) -> Result<Answer, (Option<u16>, String)> {
    match body {
        Ok(body) if completes(status, &body) => Ok(Answer {
            status,
            content_type,
            body,
        }),
        Ok(_) => Err((Some(status), "app_status".to_string())),
        Err(e) => Err((Some(status), e.chars().take(64).collect())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use callfence_core::encoding::b64_encode;
    use ed25519_dalek::{Signer, SigningKey};

    /// RFC 8032's first test key: its public half is the example
    /// configuration's edge and Telnyx key.
    fn key() -> SigningKey {
        let mut secret = [0u8; 32];
        let hex = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
        for (i, byte) in secret.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
        }
        SigningKey::from_bytes(&secret)
    }

    fn config() -> Config {
        crate::config::from_toml(&crate::config::example_toml("/var/lib/cf")).unwrap()
    }

    const NOW: i64 = 1_800_000_000_000;

    fn event(id: &str, event_type: &str) -> Vec<u8> {
        serde_json::to_vec(
            &serde_json::json!({"data": {"id": id, "event_type": event_type,
            "payload": {"call_session_id": "s1", "call_control_id": "c1"}}}),
        )
        .unwrap()
    }

    /// A webhook for `body` as the edge forwards it, asserted for `event_id`.
    fn signed(body: &[u8], event_id: &str, telnyx_signed: bool) -> HeaderMap {
        let claims = assertion::claims_for("M3", "s1", Some("c1"), event_id, 7, 1, body, NOW);
        let mut h = HeaderMap::new();
        let header = assertion::mint("e1", &key(), &claims);
        h.insert(assertion::HEADER, HeaderValue::from_str(&header).unwrap());
        let ts = (NOW / 1000).to_string();
        let mut msg = ts.as_bytes().to_vec();
        msg.push(b'|');
        msg.extend_from_slice(body);
        let sig = if telnyx_signed {
            b64_encode(&key().sign(&msg).to_bytes())
        } else {
            b64_encode(&[0u8; 64])
        };
        h.insert(
            "telnyx-signature-ed25519",
            HeaderValue::from_str(&sig).unwrap(),
        );
        h.insert("telnyx-timestamp", HeaderValue::from_str(&ts).unwrap());
        h.insert("callfence-epoch", HeaderValue::from_static("999"));
        h
    }

    #[test]
    fn a_signed_and_asserted_webhook_is_admitted_with_the_asserted_epoch() {
        let body = event("ev1", "call.initiated");
        match admit(&config(), &signed(&body, "ev1", true), &body, NOW) {
            Admission::Webhook(p) => {
                assert_eq!((p.event_id.as_str(), p.epoch), ("ev1", 7));
                assert_eq!(p.event_type.as_deref(), Some("call.initiated"));
                assert!(p.headers.iter().all(|(n, _)| n.starts_with("telnyx-")));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_missing_assertion_a_bad_telnyx_signature_or_another_event_is_refused() {
        let body = event("ev1", "call.initiated");
        let cfg = config();
        let verdict = |h: &HeaderMap| match admit(&cfg, h, &body, NOW) {
            Admission::Refused { reason, .. } => reason,
            other => panic!("{other:?}"),
        };
        assert_eq!(verdict(&HeaderMap::new()), "missing_assertion");
        assert_eq!(
            verdict(&signed(&body, "ev1", false)),
            telnyx::SignatureError::BadSignature.code()
        );
        assert_eq!(verdict(&signed(&body, "ev2", true)), "event_id_mismatch");
    }

    #[test]
    fn a_webhook_assertion_never_admits_a_probe_body() {
        let body = serde_json::to_vec(
            &serde_json::json!({"data": {"event_type": "callfence.probe",
            "id": "n".repeat(32), "payload": {"node": "M3"}}}),
        )
        .unwrap();
        let h = signed(&body, &"n".repeat(32), true);
        assert!(matches!(
            admit(&config(), &h, &body, NOW),
            Admission::Refused { .. }
        ));
        let claims = assertion::probe_claims_for("M3", &"n".repeat(32), &body, NOW);
        let mut h = HeaderMap::new();
        let header = assertion::mint("e1", &key(), &claims);
        h.insert(assertion::HEADER, HeaderValue::from_str(&header).unwrap());
        assert_eq!(
            admit(&config(), &h, &body, NOW),
            Admission::Probe {
                nonce: "n".repeat(32)
            }
        );
    }

    #[test]
    fn only_content_type_and_telnyx_headers_pass() {
        let mut h = HeaderMap::new();
        h.insert("content-type", HeaderValue::from_static("application/json"));
        h.insert("telnyx-timestamp", HeaderValue::from_static("1"));
        h.insert("telnyx-signature-ed25519", HeaderValue::from_static("sig"));
        h.insert("callfence-epoch", HeaderValue::from_static("999"));
        h.insert("callfence-assertion", HeaderValue::from_static("v1.x"));
        h.insert("authorization", HeaderValue::from_static("Bearer x"));
        let mut names: Vec<_> = forwarded_headers(&h).into_iter().map(|(n, _)| n).collect();
        names.sort();
        assert_eq!(
            names,
            [
                "content-type",
                "telnyx-signature-ed25519",
                "telnyx-timestamp"
            ]
        );
    }

    #[test]
    fn the_ledger_entry_decides_replay_resume_or_new() {
        let answer = Answer {
            status: 200,
            content_type: None,
            body: b"{}".to_vec(),
        };
        assert_eq!(
            on_entry(Entry::Completed(answer.clone()), true),
            OnEntry::Replay(answer)
        );
        assert_eq!(on_entry(Entry::Absent, true), OnEntry::New);
        assert_eq!(on_entry(Entry::Absent, false), OnEntry::Gone);
    }

    #[test]
    fn only_an_active_node_takes_a_session_it_never_admitted() {
        assert!(admits_new_session(NodeMode::Active, None));
        for mode in [NodeMode::Drained, NodeMode::Shadow] {
            assert!(admits_new_session(mode, Some(true)));
            assert!(!admits_new_session(mode, Some(false)));
            assert!(!admits_new_session(mode, None), "unknown refuses");
        }
    }

    #[test]
    fn only_2xx_and_plain_4xx_complete() {
        for s in [200, 204, 400, 404, 422] {
            assert!(completes(s, b"{}"), "{s}");
        }
        for s in [301, 408, 429, 500, 503] {
            assert!(!completes(s, b"{}"), "{s}");
        }
    }

    #[test]
    fn an_app_4xx_saying_not_admitted_does_not_complete() {
        // The edge would take it for a definite non-delivery and move the
        // call, so the entry must not be completed here either.
        let not_admitted = br#"{"callfence":"not_admitted"}"#;
        assert!(!completes(409, not_admitted));
        assert!(!completes(401, not_admitted));
        assert!(completes(200, not_admitted));
    }

    #[test]
    fn the_app_verdict_keeps_the_answer_or_says_why_not() {
        let ok = app_verdict(200, Some("application/json".into()), Ok(b"{}".to_vec()));
        assert_eq!(
            ok.unwrap().content_type.as_deref(),
            Some("application/json")
        );
        assert_eq!(
            app_verdict(503, None, Ok(b"{}".to_vec())),
            Err((Some(503), "app_status".into()))
        );
        let long = "x".repeat(100);
        assert_eq!(
            app_verdict(200, None, Err(long)).unwrap_err().1.len(),
            64,
            "a read failure's reason is bounded"
        );
    }
}
