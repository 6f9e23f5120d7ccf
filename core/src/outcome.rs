//! Forward outcomes: how the origin's answer to a forwarded webhook is
//! classified (SPEC §7.7). Only a definite non-delivery may move a call.
//!
//! The one rule for both ends: the Dispatcher classifies what the node's
//! agent answered, and the agent completes its ledger entry exactly when the
//! app's answer classifies as delivered ([`OutcomeClass::is_delivered`]).

/// What came back from the origin for one forward attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OriginAnswer {
    /// An HTTP answer: status and (at most 4 KiB of) its body.
    Http {
        /// The status code.
        status: u16,
        /// The body, truncated to [`MAX_RECORDED_BODY`] bytes.
        body: String,
    },
    /// No answer within the forward budget.
    Timeout,
    /// The connection failed or was reset.
    NetworkError,
}

impl OriginAnswer {
    /// An HTTP answer, its body truncated to [`MAX_RECORDED_BODY`] bytes as
    /// it is recorded and classified.
    pub fn http(status: u16, body: &[u8]) -> Self {
        OriginAnswer::Http {
            status,
            body: truncate_body(&String::from_utf8_lossy(body)),
        }
    }
}

/// The largest origin body recorded with an outcome.
pub const MAX_RECORDED_BODY: usize = 4096;

/// The class of an outcome, which decides its effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutcomeClass {
    /// 2xx: the node has the event.
    Delivered,
    /// A 4xx from the app (not 408/429): terminal, not the node's fault.
    DeliveredWithError,
    /// The agent's `not_admitted`, or a 3xx: the node certainly did not act.
    NotDelivered,
    /// Timeout, reset, 408, 429, 5xx: the node may have acted.
    Unknown,
}

impl OutcomeClass {
    /// True for both delivered classes.
    pub fn is_delivered(self) -> bool {
        matches!(
            self,
            OutcomeClass::Delivered | OutcomeClass::DeliveredWithError
        )
    }
}

/// What the edge may tell the carrier as soon as the origin has answered,
/// before the Dispatcher has the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EarlyAnswer {
    /// 200 `{"delivered_to","epoch","event_id"}`: the owner has the event,
    /// whatever the report later records (a lost report lapses the lease and
    /// the alarm re-drives to the same owner, whose ledger answers it).
    Delivered,
    /// 503 `delivery_unknown`: the claim is kept whatever the report does.
    Unknown,
    /// Only the report says: the call may move to a new owner, to be
    /// forwarded at once.
    AwaitReport,
}

impl OutcomeClass {
    /// The carrier's answer that need not wait for the report.
    pub fn early_answer(self) -> EarlyAnswer {
        match self {
            OutcomeClass::Delivered | OutcomeClass::DeliveredWithError => EarlyAnswer::Delivered,
            OutcomeClass::Unknown => EarlyAnswer::Unknown,
            OutcomeClass::NotDelivered => EarlyAnswer::AwaitReport,
        }
    }
}

/// Classifies an origin's answer.
pub fn classify(answer: &OriginAnswer) -> OutcomeClass {
    match answer {
        OriginAnswer::Timeout | OriginAnswer::NetworkError => OutcomeClass::Unknown,
        OriginAnswer::Http { status, body } => match status {
            200..=299 => OutcomeClass::Delivered,
            _ if is_not_admitted(body) => OutcomeClass::NotDelivered,
            300..=399 => OutcomeClass::NotDelivered,
            408 | 429 => OutcomeClass::Unknown,
            400..=499 => OutcomeClass::DeliveredWithError,
            _ => OutcomeClass::Unknown,
        },
    }
}

/// True when the body is the agent's `{"callfence":"not_admitted"}`.
fn is_not_admitted(body: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            v.get("callfence")
                .and_then(|c| c.as_str())
                .map(|c| c == "not_admitted")
        })
        .unwrap_or(false)
}

/// Truncates an origin body to [`MAX_RECORDED_BODY`] bytes on a character
/// boundary.
pub fn truncate_body(body: &str) -> String {
    if body.len() <= MAX_RECORDED_BODY {
        return body.to_owned();
    }
    let mut end = MAX_RECORDED_BODY;
    while !body.is_char_boundary(end) {
        end -= 1;
    }
    body[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(status: u16, body: &str) -> OriginAnswer {
        OriginAnswer::Http {
            status,
            body: body.into(),
        }
    }

    #[test]
    fn the_contract_table() {
        use OutcomeClass::*;
        let cases = [
            (http(200, ""), Delivered),
            (http(204, ""), Delivered),
            (http(400, "{}"), DeliveredWithError),
            (http(404, ""), DeliveredWithError),
            (http(401, r#"{"callfence":"not_admitted"}"#), NotDelivered),
            (http(503, r#"{"callfence":"not_admitted"}"#), NotDelivered),
            (http(301, ""), NotDelivered),
            (http(307, ""), NotDelivered),
            (http(408, ""), Unknown),
            (http(429, ""), Unknown),
            (http(500, ""), Unknown),
            (http(503, "busy"), Unknown),
            (http(401, "no"), DeliveredWithError),
            (OriginAnswer::Timeout, Unknown),
            (OriginAnswer::NetworkError, Unknown),
        ];
        for (answer, class) in cases {
            assert_eq!(classify(&answer), class, "{answer:?}");
        }
    }

    #[test]
    fn a_2xx_is_delivered_even_if_it_says_not_admitted() {
        assert_eq!(
            classify(&http(200, r#"{"callfence":"not_admitted"}"#)),
            OutcomeClass::Delivered
        );
    }

    #[test]
    fn only_a_definite_non_delivery_waits_for_the_report() {
        use EarlyAnswer::*;
        for (answer, early) in [
            (http(200, ""), Delivered),
            (http(404, ""), Delivered),
            (http(500, ""), Unknown),
            (OriginAnswer::Timeout, Unknown),
            (http(503, r#"{"callfence":"not_admitted"}"#), AwaitReport),
            (http(302, ""), AwaitReport),
        ] {
            assert_eq!(classify(&answer).early_answer(), early, "{answer:?}");
        }
    }

    #[test]
    fn http_answers_are_classified_on_their_recorded_body() {
        assert_eq!(
            OriginAnswer::http(409, br#"{"callfence":"not_admitted"}"#),
            http(409, r#"{"callfence":"not_admitted"}"#)
        );
        let long = OriginAnswer::http(200, &vec![b'x'; MAX_RECORDED_BODY + 10]);
        assert_eq!(long, http(200, &"x".repeat(MAX_RECORDED_BODY)));
        // Bytes that are not UTF-8 are replaced, never a panic.
        assert_eq!(
            classify(&OriginAnswer::http(404, &[0xff, 0xfe])),
            OutcomeClass::DeliveredWithError
        );
    }

    #[test]
    fn truncation_respects_utf8() {
        let body = "é".repeat(3000);
        let cut = truncate_body(&body);
        assert!(cut.len() <= MAX_RECORDED_BODY);
        assert!(cut.chars().all(|c| c == 'é'));
    }
}
