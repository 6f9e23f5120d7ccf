//! The counters an object keeps in memory (SPEC §17): they start at 0 when
//! the object starts, which Prometheus reads as a reset, and counting
//! writes nothing to storage.
//!
//! What is counted inside one of the engine's atomic units is *staged*
//! ([`Counters::stage`]) and only counted when the unit commits
//! ([`Counters::commit`]); a unit that rolls back discards its stage
//! ([`Counters::discard`]), so a decision that was never stored is never
//! counted. What is counted after a unit (an answer's class) is counted at
//! once ([`Counters::count`]).

use super::{
    Sample, CLAIMS_REFUSED, DECISIONS, FENCE_REQUESTS, FORWARD_FAILURES, HEARTBEATS,
    MAX_SERIES_PER_FAMILY, WEBHOOKS,
};
use std::cell::RefCell;
use std::collections::BTreeMap;

/// The class of a webhook's answer, the `outcome` label of
/// `callfence_webhooks_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum WebhookOutcome {
    /// Forwarded and delivered (2xx), or delivered later by the alarm.
    Delivered,
    /// Forwarded and answered 4xx by the app (terminal, 200).
    DeliveredError,
    /// A duplicate of a delivered event: its recorded 200 again.
    Duplicate,
    /// An attempt's lease is live: 503 `in_progress`.
    InProgress,
    /// Parked: 503 `no_policy` or `no_eligible_node`.
    Pending,
    /// The forward's outcome is unknown: 503 `delivery_unknown`.
    DeliveryUnknown,
    /// Moved to a new owner, which the alarm delivers to: 503 `reassigned`.
    Reassigned,
    /// Its parking window closed with no node (answered, or by the alarm).
    Rejected,
    /// No session could be found: 200 `unroutable`.
    Unroutable,
    /// Another connection's event: 200 `ignored`.
    Ignored,
    /// Refused by the Worker before the Dispatcher (SPEC §7.1): a missing,
    /// bad or stale signature, a body that is not an event, one too large.
    Refused,
    /// A new session at `SESSION_CAP` with only live sessions: 503
    /// `storage_full`.
    StorageFull,
    /// Shed by the Dispatcher's admission: 503 `overloaded`.
    Overloaded,
}

impl WebhookOutcome {
    /// Every outcome, each written from the first scrape on (at 0).
    pub const ALL: [WebhookOutcome; 13] = [
        WebhookOutcome::Delivered,
        WebhookOutcome::DeliveredError,
        WebhookOutcome::Duplicate,
        WebhookOutcome::InProgress,
        WebhookOutcome::Pending,
        WebhookOutcome::DeliveryUnknown,
        WebhookOutcome::Reassigned,
        WebhookOutcome::Rejected,
        WebhookOutcome::Unroutable,
        WebhookOutcome::Ignored,
        WebhookOutcome::Refused,
        WebhookOutcome::StorageFull,
        WebhookOutcome::Overloaded,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            WebhookOutcome::Delivered => "delivered",
            WebhookOutcome::DeliveredError => "delivered_error",
            WebhookOutcome::Duplicate => "duplicate",
            WebhookOutcome::InProgress => "in_progress",
            WebhookOutcome::Pending => "pending",
            WebhookOutcome::DeliveryUnknown => "delivery_unknown",
            WebhookOutcome::Reassigned => "reassigned",
            WebhookOutcome::Rejected => "rejected",
            WebhookOutcome::Unroutable => "unroutable",
            WebhookOutcome::Ignored => "ignored",
            WebhookOutcome::Refused => "refused",
            WebhookOutcome::StorageFull => "storage_full",
            WebhookOutcome::Overloaded => "overloaded",
        }
    }
}

/// Which limit refused a claim: the `reason` label of
/// `callfence_claims_refused_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimLimit {
    /// `capacity_exhausted`.
    Capacity,
    /// `rate_limited`.
    Rate,
}

impl ClaimLimit {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimLimit::Capacity => "capacity",
            ClaimLimit::Rate => "rate",
        }
    }
}

/// The fence results written from the first scrape on (at 0).
pub const FENCE_RESULTS: [&str; 6] = [
    "granted",
    "regranted",
    "stale_epoch",
    "not_owner",
    "call_ended",
    "unknown_call",
];

/// One series: a family and its label values in the family's label order.
type Series = (&'static str, Vec<String>);

/// Counts by series.
#[derive(Debug, Clone, Default)]
struct Tally(BTreeMap<Series, u64>);

impl Tally {
    fn add(&mut self, family: &'static str, labels: &[&str], n: u64) {
        let key = (family, labels.iter().map(|l| (*l).to_owned()).collect());
        if let Some(count) = self.0.get_mut(&key) {
            *count = count.saturating_add(n);
            return;
        }
        let kept = self.0.keys().filter(|(f, _)| *f == family).count();
        if kept < MAX_SERIES_PER_FAMILY {
            self.0.insert(key, n);
        }
    }
}

/// One event to count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count<'a> {
    /// A webhook answered, or an event delivered or rejected by the alarm.
    Webhook(WebhookOutcome),
    /// A decision recorded: its rule (`none` when no rule resolved) and
    /// outcome codes.
    Decision(&'a str, &'a str),
    /// A forward to `node` not delivered: `not_admitted` or `unknown`.
    ForwardFailure(&'a str, &'a str),
    /// A fence request's result.
    Fence(&'a str),
    /// A claim of `node` refused under a limit.
    ClaimRefused(&'a str, ClaimLimit),
    /// A heartbeat of `node`: `accepted` or the refusal's code.
    Heartbeat(&'a str, &'a str),
}

impl Count<'_> {
    fn add_to(self, tally: &mut Tally, n: u64) {
        match self {
            Count::Webhook(outcome) => tally.add(WEBHOOKS, &[outcome.as_str()], n),
            Count::Decision(rule, outcome) => tally.add(DECISIONS, &[rule, outcome], n),
            Count::ForwardFailure(node, class) => tally.add(FORWARD_FAILURES, &[node, class], n),
            Count::Fence(result) => tally.add(FENCE_REQUESTS, &[result], n),
            Count::ClaimRefused(node, limit) => {
                tally.add(CLAIMS_REFUSED, &[node, limit.as_str()], n)
            }
            Count::Heartbeat(node, result) => tally.add(HEARTBEATS, &[node, result], n),
        }
    }
}

/// An object's counters (see the module doc).
#[derive(Debug, Default)]
pub struct Counters {
    counted: RefCell<Tally>,
    staged: RefCell<Tally>,
}

impl Counters {
    /// Counts `count` once, now.
    pub fn count(&self, count: Count<'_>) {
        self.count_n(count, 1);
    }

    /// Counts `count` `n` times, now (a batch reported by a Worker).
    pub fn count_n(&self, count: Count<'_>, n: u64) {
        count.add_to(&mut self.counted.borrow_mut(), n);
    }

    /// Stages `count` until the current unit commits or rolls back.
    pub fn stage(&self, count: Count<'_>) {
        count.add_to(&mut self.staged.borrow_mut(), 1);
    }

    /// The unit committed: what it staged is counted.
    pub fn commit(&self) {
        let staged = std::mem::take(&mut *self.staged.borrow_mut());
        let mut counted = self.counted.borrow_mut();
        for ((family, labels), n) in staged.0 {
            let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
            counted.add(family, &labels, n);
        }
    }

    /// The unit rolled back: what it staged is forgotten.
    pub fn discard(&self) {
        self.staged.borrow_mut().0.clear();
    }

    /// The counters as samples: every webhook outcome and fence result
    /// from the first scrape on, the rest once counted.
    pub fn samples(&self) -> Vec<Sample> {
        let mut tally = self.counted.borrow().clone();
        for outcome in WebhookOutcome::ALL {
            Count::Webhook(outcome).add_to(&mut tally, 0);
        }
        for result in FENCE_RESULTS {
            Count::Fence(result).add_to(&mut tally, 0);
        }
        tally
            .0
            .into_iter()
            .map(|((family, values), n)| {
                let labels = super::family(family)
                    .map(|f| f.labels)
                    .unwrap_or_default()
                    .iter()
                    .zip(values)
                    .map(|(name, value)| ((*name).to_owned(), value))
                    .collect();
                Sample {
                    name: family.to_owned(),
                    labels,
                    value: n,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<u64> {
        let want = Sample::new(name, labels, 0).labels;
        samples
            .iter()
            .find(|s| s.name == name && s.labels == want)
            .map(|s| s.value)
    }

    #[test]
    fn fixed_label_sets_start_at_zero_and_the_rest_appear_when_counted() {
        let counters = Counters::default();
        let samples = counters.samples();
        for outcome in WebhookOutcome::ALL {
            let labels = [("outcome", outcome.as_str())];
            assert_eq!(value(&samples, WEBHOOKS, &labels), Some(0));
        }
        assert_eq!(
            value(&samples, FENCE_REQUESTS, &[("result", "granted")]),
            Some(0)
        );
        assert!(samples.iter().all(|s| s.name != FORWARD_FAILURES));

        counters.count(Count::Webhook(WebhookOutcome::Delivered));
        counters.count_n(Count::Webhook(WebhookOutcome::Refused), 3);
        counters.count(Count::ForwardFailure("M1", "unknown"));
        counters.count(Count::ClaimRefused("M2", ClaimLimit::Rate));
        counters.count(Count::Heartbeat("M2", "accepted"));
        let samples = counters.samples();
        assert_eq!(
            value(&samples, WEBHOOKS, &[("outcome", "delivered")]),
            Some(1)
        );
        assert_eq!(
            value(&samples, WEBHOOKS, &[("outcome", "refused")]),
            Some(3)
        );
        let failure = [("node", "M1"), ("class", "unknown")];
        assert_eq!(value(&samples, FORWARD_FAILURES, &failure), Some(1));
        let refused = [("node", "M2"), ("reason", "rate")];
        assert_eq!(value(&samples, CLAIMS_REFUSED, &refused), Some(1));
        let beat = [("node", "M2"), ("result", "accepted")];
        assert_eq!(value(&samples, HEARTBEATS, &beat), Some(1));
    }

    #[test]
    fn staged_counts_count_only_when_their_unit_commits() {
        let counters = Counters::default();
        let assigned = [("rule", "line"), ("outcome", "assigned")];
        counters.stage(Count::Decision("line", "assigned"));
        counters.discard();
        assert_eq!(value(&counters.samples(), DECISIONS, &assigned), None);
        counters.stage(Count::Decision("line", "assigned"));
        counters.stage(Count::Decision("line", "assigned"));
        assert_eq!(value(&counters.samples(), DECISIONS, &assigned), None);
        counters.commit();
        assert_eq!(value(&counters.samples(), DECISIONS, &assigned), Some(2));
        counters.commit();
        assert_eq!(value(&counters.samples(), DECISIONS, &assigned), Some(2));
    }

    #[test]
    fn a_family_keeps_a_bounded_number_of_series() {
        let counters = Counters::default();
        for i in 0..MAX_SERIES_PER_FAMILY + 10 {
            counters.count(Count::Heartbeat(&format!("N{i}"), "accepted"));
        }
        counters.count(Count::Heartbeat("N0", "accepted"));
        let samples = counters.samples();
        let beats: Vec<&Sample> = samples.iter().filter(|s| s.name == HEARTBEATS).collect();
        assert_eq!(beats.len(), MAX_SERIES_PER_FAMILY);
        let first = [("node", "N0"), ("result", "accepted")];
        assert_eq!(value(&samples, HEARTBEATS, &first), Some(2));
    }
}
